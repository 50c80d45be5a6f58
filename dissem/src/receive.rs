//! `dissem receive`: runs the journaled gRPC push subscriber (`worker::receiver`) on a
//! loopback port, the endpoint a gRPC subscription's `target` names. Every delivery is on
//! its disk before it is acknowledged, and exactly-once subscriptions' deliveries are shown
//! once, across kills. The first line on stdout names the address; each delivery shown
//! follows as a line, as `dissem sub` prints them.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};

#[derive(clap::Args, Debug)]
pub(super) struct ReceiveArgs {
    /// Where to serve `dissem.v1.Subscriber` (the subscription's target is
    /// `http://ADDRESS`); port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:50070")]
    listen: SocketAddr,
    /// The journal: every delivery as a JSON line (`"event": "shown"` or `"received"`, and
    /// `"journaled_unix_ms"`: when it was appended), durable before it is acknowledged;
    /// read back at start.
    #[arg(long)]
    journal: PathBuf,
    /// A QoS 2 subscription's id (repeat, or separate with commas): its deliveries are held
    /// between the two phases and shown at release, once.
    #[arg(long, value_delimiter = ',')]
    exactly_once: Vec<u64>,
    /// Serve an address other than loopback. Pushes carry no credentials, so anyone who
    /// reaches the port can put lines in the journal.
    #[arg(long)]
    insecure: bool,
}

pub(super) fn receive(a: ReceiveArgs) -> anyhow::Result<bool> {
    if !a.listen.ip().is_loopback() && !a.insecure {
        bail!(
            "refusing to receive on {}: pushes carry no credentials; listen on 127.0.0.1, or \
             pass --insecure to take deliveries from anyone",
            a.listen
        );
    }
    let (journal, opened) = worker::receiver::Journal::open(&a.journal, &a.exactly_once)?;
    if opened.torn_bytes > 0 {
        eprintln!(
            "the journal's last line was torn (killed mid-write): {} bytes cut; its node sends \
             that delivery again",
            opened.torn_bytes
        );
    }
    if !opened.unreadable.is_empty() {
        eprintln!(
            "the journal has {} lines that are not journal lines (skipped), e.g. line {}",
            opened.unreadable.len(),
            opened.unreadable[0]
        );
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let (tcp, addr) = runtime::bind(a.listen)
            .await
            .with_context(|| format!("listening on {}", a.listen))?;
        let listener =
            runtime::listen::Listener::new(tcp, runtime::listen::ListenConfig::default());
        let receiver = worker::receiver::Receiver::new(journal, |line| {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}").and_then(|()| out.flush());
        });
        crate::serve::announce(format!(
            "dissem receive listening on {addr} (journal {}: {} lines, {} held awaiting \
             release)",
            a.journal.display(),
            opened.lines,
            opened.held
        ))?;
        runtime::serve::serve(
            listener,
            &["dissem.v1.Subscriber"],
            None,
            |r| {
                r.add_service(proto::v1::subscriber_server::SubscriberServer::new(
                    receiver,
                ))
            },
            crate::serve::shutdown(),
        )
        .await?;
        anyhow::Ok(())
    })?;
    Ok(true)
}
