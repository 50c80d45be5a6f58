//! `dissem bench resize`: the flags of the online grid resize benchmark, and its run (the
//! benchmark itself is `bench::resizebench`).

use std::path::PathBuf;

use anyhow::bail;

#[derive(clap::Args, Debug)]
pub(crate) struct ResizeArgs {
    /// The grid the cluster starts on and shrinks back to.
    #[arg(long, default_value = "2x3")]
    pub(super) grid: runtime::grid::Grid,
    /// The grid it grows to first (more positions; other columns move positions).
    #[arg(long, default_value = "3x3")]
    pub(super) to: runtime::grid::Grid,
    /// Puts per second throughout.
    #[arg(long, default_value_t = 40)]
    pub(super) rate: u32,
    /// Subscriptions besides the two that check every object (their copies move too).
    #[arg(long, default_value_t = 200)]
    pub(super) subs: usize,
    /// Seconds of load before, between and after the two moves.
    #[arg(long, default_value_t = 5.0)]
    pub(super) settle_s: f64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(crate) fn bench_resize(a: ResizeArgs) -> anyhow::Result<bool> {
    if a.rate == 0 {
        bail!("--rate must be at least 1");
    }
    if a.to.len() <= a.grid.len() || a.grid.len() < 3 {
        bail!(
            "--to ({}) must have more positions than --grid ({}), which needs at least 3",
            a.to,
            a.grid
        );
    }
    if !(a.settle_s.is_finite() && a.settle_s >= 0.0) {
        bail!("--settle-s must be a number of seconds, 0 or more");
    }
    let report = bench::resizebench::run(&bench::resizebench::ResizeOptions {
        bin: std::env::current_exe()?,
        from: a.grid,
        to: a.to,
        rate: a.rate,
        subs: a.subs,
        settle: std::time::Duration::from_secs_f64(a.settle_s),
    })?;
    bench::resizebench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    if !report.pass {
        bail!("the resize benchmark failed: objects lost or QoS 2 duplicates");
    }
    Ok(true)
}
