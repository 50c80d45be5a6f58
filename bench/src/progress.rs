//! Progress output for long benchmark phases: bars on a terminal, plain lines otherwise.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Where progress goes (standard error).
#[derive(Debug, Clone, Default)]
pub struct Progress;

impl Progress {
    /// Progress to standard error.
    pub fn new() -> Progress {
        Progress
    }

    /// A bar of `len` steps with a message; hidden when stderr is not a terminal.
    pub fn bar(&self, len: u64, msg: &str) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{msg:32} [{bar:30}] {pos}/{len} {elapsed}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(msg.to_string());
        if bar.is_hidden() {
            eprintln!("{msg} ({len})");
        }
        bar
    }

    /// A one-line phase message.
    pub fn line(&self, msg: &str) {
        eprintln!("{msg}");
    }
}
