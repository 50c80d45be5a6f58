//! The faults of `dissem bench chaos` and the schedule each seed draws: the cluster's faults
//! from the seed's own stream, and the link and disk faults from streams of their own, so a
//! kind added later leaves every earlier seed's cluster faults as they were (a replayed seed
//! still finds what it found).

use serde::Serialize;

use runtime::rng::Rng;

/// One fault of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL node `node`, restart it after `down_ms`.
    NodeKill { node: u32, down_ms: u64 },
    /// SIGKILL node `node`, delete its data directory (a lost disk), start it again there.
    NodeWiped { node: u32 },
    /// SIGSTOP node `node` past its lease, then SIGCONT.
    NodePause { node: u32 },
    /// SIGKILL the leading coordinator; it comes back as a standby.
    LeaderKill,
    /// SIGKILL etcd and start it again.
    EtcdRestart,
    /// Node `node` down while a subscription is deleted, a canary updated and one created.
    SubsWhileDown { node: u32 },
    /// The subscribers down for `down_ms`: with an even `down_ms` every one crashed (each
    /// connection to the gRPC and webhook endpoints broken mid-call and new ones closed, as
    /// when their process is killed, and the stream's client gone with its stream; what
    /// they received they keep, as a QoS 2 receiver does on its disk), with an odd one the
    /// gRPC ones refusing every delivery (UNAVAILABLE). Deliveries stay owed and are retried.
    SubscriberDown { down_ms: u64 },
    /// The link to the peer cluster cut (the relay refuses every connection) until the
    /// schedule's last fault is over.
    LinkCut,
    /// The peer cluster SIGKILLed, and started again once the schedule's last fault is over.
    PeerDown,
    /// SIGKILL node `node`, flip a byte in each of the last records of its object log (as a
    /// failing disk would), start it again.
    LogDamaged { node: u32 },
    /// The link to the peer cluster slow and lossy (`delay_ms` each way, `loss_permille`
    /// of the segments retransmitted) until the schedule's last fault is over.
    LinkSlow { delay_ms: u64, loss_permille: u32 },
    /// Node `node`'s disk filled to the last byte while it runs, freed after `hold_ms`.
    DiskFull { node: u32, hold_ms: u64 },
}

impl Fault {
    /// The kind and its target, as the progress lines print it (`node_wiped 3`).
    pub fn label(&self) -> String {
        match self {
            Fault::NodeKill { node, .. }
            | Fault::NodeWiped { node }
            | Fault::NodePause { node }
            | Fault::SubsWhileDown { node }
            | Fault::LogDamaged { node }
            | Fault::DiskFull { node, .. } => format!("{} {node}", self.kind()),
            _ => self.kind().to_string(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Fault::NodeKill { .. } => "node_kill",
            Fault::NodeWiped { .. } => "node_wiped",
            Fault::NodePause { .. } => "node_pause",
            Fault::LeaderKill => "leader_kill",
            Fault::EtcdRestart => "etcd_restart",
            Fault::SubsWhileDown { .. } => "subs_while_down",
            Fault::SubscriberDown { .. } => "subscriber_down",
            Fault::LinkCut => "link_cut",
            Fault::PeerDown => "peer_down",
            Fault::LogDamaged { .. } => "log_damaged",
            Fault::LinkSlow { .. } => "link_slow",
            Fault::DiskFull { .. } => "disk_full",
        }
    }
}

/// The faults of the schedule of `seed` on a grid of `nodes` nodes: in about a third of the
/// schedules first one of the federation link (healed after the last fault), in about a
/// third a slow link, then `faults` of the cluster with, in about a quarter, a full disk
/// among them, then in about a quarter a damaged object log. The link and disk faults are
/// drawn from streams of their own, so a seed's cluster faults are those it had before.
pub fn schedule(seed: u64, faults: usize, nodes: u32) -> Vec<Fault> {
    let mut fed = Rng::new(seed ^ 0x5eed_0000_0000_0fed);
    let mut plan = Vec::new();
    if fed.below(3) == 0 {
        plan.push(if fed.below(2) == 0 {
            Fault::LinkCut
        } else {
            Fault::PeerDown
        });
    }
    let mut slow = Rng::new(seed ^ 0x5100_0000_0000_0000);
    if slow.below(3) == 0 {
        plan.push(Fault::LinkSlow {
            delay_ms: 50 + slow.below(151),
            loss_permille: 10,
        });
    }
    let mut cluster = cluster_faults(seed, faults, nodes);
    let mut full = Rng::new(seed ^ 0xf011_0000_0000_0000);
    if full.below(4) == 0 {
        let at = full.below(cluster.len() as u64 + 1) as usize;
        let f = Fault::DiskFull {
            node: full.below(u64::from(nodes)) as u32,
            hold_ms: 1000 + full.below(3000),
        };
        cluster.insert(at, f);
    }
    plan.extend(cluster);
    let mut disk = Rng::new(seed ^ 0xd15c_0000_0000_0000);
    if disk.below(4) == 0 {
        plan.push(Fault::LogDamaged {
            node: disk.below(u64::from(nodes)) as u32,
        });
    }
    plan
}

fn cluster_faults(seed: u64, faults: usize, nodes: u32) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    (0..faults)
        .map(|_| {
            let node = rng.below(u64::from(nodes)) as u32;
            match rng.below(100) {
                0..=21 => Fault::NodeKill {
                    node,
                    down_ms: 200 + rng.below(2500),
                },
                22..=29 => Fault::NodeWiped { node },
                30..=44 => Fault::NodePause { node },
                45..=64 => Fault::LeaderKill,
                65..=74 => Fault::EtcdRestart,
                75..=84 => Fault::SubscriberDown {
                    down_ms: 500 + rng.below(2500),
                },
                _ => Fault::SubsWhileDown { node },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_drawn_from_its_seed_alone() {
        assert_eq!(schedule(7, 5, 9), schedule(7, 5, 9));
        let kinds: std::collections::BTreeSet<&str> = (0..200)
            .flat_map(|s| schedule(s, 4, 9))
            .map(|f| f.kind())
            .collect();
        assert_eq!(kinds.len(), 12, "every kind is drawn: {kinds:?}");
        // a seed's cluster faults are those it had before link and disk faults were drawn
        for seed in 0..200 {
            let plan: Vec<Fault> = schedule(seed, 4, 9)
                .into_iter()
                .filter(|f| !matches!(f, Fault::LinkCut | Fault::PeerDown | Fault::LinkSlow { .. }))
                .filter(|f| !matches!(f, Fault::LogDamaged { .. } | Fault::DiskFull { .. }))
                .collect();
            assert_eq!(plan, cluster_faults(seed, 4, 9));
        }
        assert!((0..200).flat_map(|s| schedule(s, 4, 9)).all(|f| match f {
            Fault::NodeKill { node, .. }
            | Fault::NodePause { node }
            | Fault::LogDamaged { node }
            | Fault::DiskFull { node, .. }
            | Fault::SubsWhileDown { node } => node < 9,
            Fault::LinkSlow {
                delay_ms,
                loss_permille,
            } => (50..=200).contains(&delay_ms) && loss_permille == 10,
            _ => true,
        }));
    }
}
