//! The federated side of `dissem bench chaos`: a peer cluster (`us`, one `dissem up`) that
//! every node of the chaos cluster (`eu`) links to, all-active, through a TCP relay the
//! schedules cut, slow and heal (`bench::cut`); a QoS 1 subscriber there for every object; and the
//! oracle's question for it: did every acknowledged object reach the peer? (What a put owes a
//! link must survive kills, lost disks and cuts of either side.)

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::cut::Cut;
use crate::procs::{self, Proc, try_wait_for};
use crate::recorder::Recorder;

/// The name the chaos cluster's objects carry to the peer.
pub const CLUSTER: &str = "eu";
/// The `pub` attribute of the chaos traffic's objects (`recorder::numbered_key`).
pub const PUBLISHER: &str = "chaos";

/// The peer cluster, its relay and its subscriber.
#[derive(Debug)]
pub struct Peer {
    proc: Proc,
    pub cut: Cut,
    rec: Recorder,
    /// SIGKILLed, to start again at [`Peer::heal`].
    stopped: bool,
}

impl Peer {
    /// Starts the peer in `dir/us` on a free port, the relay in front of it, and its
    /// subscriber (every object, QoS 1, to a recorder of its own).
    pub async fn start(bin: &Path, dir: &Path) -> anyhow::Result<Peer> {
        let addr = procs::free_port();
        let extra = vec!["--allow-private-targets".to_string()];
        let proc = procs::cluster_up(bin, dir, "us", &addr.to_string(), &extra);
        let cut = Cut::start(addr).await.context("the relay to the peer")?;
        let (rec, target) = Recorder::start().await?;
        let s = procs::grpc_subscription("n >= 0", &target);
        procs::create_subscription(&proc.url(), s)
            .await
            .context("the peer's subscription")?;
        Ok(Peer {
            proc,
            cut,
            rec,
            stopped: false,
        })
    }

    /// The flags that link a node of the chaos cluster to the peer (through the relay).
    pub fn link_flags(&self) -> Vec<String> {
        vec![
            "--cluster-name".into(),
            CLUSTER.into(),
            "--link".into(),
            format!("us=http://{}", self.cut.addr),
        ]
    }

    /// The peer SIGKILLed (until [`Peer::heal`]).
    pub fn stop(&mut self) {
        self.proc.kill();
        self.stopped = true;
    }

    /// The link whole again: the relay lets connections through at full speed, and a
    /// stopped peer starts again (same port, same disk).
    pub fn heal(&mut self) {
        self.cut.set_down(false);
        self.cut.set_impaired(None);
        if std::mem::take(&mut self.stopped) {
            self.proc.restart();
        }
    }

    /// Which of the numbers `want` the peer's subscriber was not shown within `limit`.
    pub async fn missing(&self, want: &BTreeSet<usize>, limit: Duration) -> Vec<usize> {
        let missing = || -> Vec<usize> {
            let shown = self.rec.numbered();
            want.iter()
                .copied()
                .filter(|&n| !shown.contains_key(&(PUBLISHER.to_string(), n as i64)))
                .collect()
        };
        try_wait_for(limit, || {
            let m = missing();
            async move { m.is_empty().then_some(()) }
        })
        .await;
        missing()
    }
}
