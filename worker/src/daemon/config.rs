//! The node daemon's settings, and where match blocks run their subset scan.

use super::*;

/// Where match blocks run their subset scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuUse {
    /// A hardware GPU when one opens; software adapters (Mesa's lavapipe) are slower than
    /// the CPU scan, so they are not used.
    Hardware,
    /// Any adapter that opens, software ones included (tests exercise the path this way).
    Any,
    /// Always the CPU scan.
    Off,
}

/// Settings of a node daemon.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub node: u32,
    /// The coordinator's URL, e.g. `http://127.0.0.1:7000`.
    pub coordinator: String,
    /// Where this daemon serves `Daemon` (told to the coordinator and other nodes).
    pub endpoint: String,
    /// Empty workers started at once (load regulation adds and removes later).
    pub initial_workers: usize,
    /// Workers kept for priority-7 tasks only (the urgent reserve): never terminated by
    /// load regulation, and the coordinator hands them no other task, so an urgent object
    /// never waits for a worker that a backlog holds.
    pub urgent_workers: usize,
    /// Puts written at once before the rest wait in priority order, and of those the slots
    /// kept for priority 7 ([`crate::admission`]).
    pub write_slots: usize,
    pub urgent_write_slots: usize,
    pub regulator: RegulatorConfig,
    /// How often load regulation samples the CPU.
    pub regulate_every: Duration,
    pub heartbeat_every: Duration,
    /// An outbox record older than this is sent to the coordinator again.
    pub resend_after: Duration,
    /// Cached test results are dropped after this long.
    pub result_ttl: Duration,
    /// Objects per `Arrived` message at most, and the least time between two messages that
    /// carry more than one object: an object that arrives after a quiet spell, or while
    /// objects come one at a time, is sent at once, while under a stream that gathers more
    /// the objects of one gap go together (few messages per object).
    pub forward_batch: usize,
    pub forward_gap: Duration,
    /// Where match blocks run their subset scan.
    pub gpu: GpuUse,
    /// Match and push objects below the urgent priority on the lower-priority bulk lane
    /// ([`crate::lanes`]); off: everything on the node's runtime.
    pub bulk_lane: bool,
    /// Pushing matches to subscribers.
    pub delivery: crate::deliver::DeliveryConfig,
    /// What internal calls to and from this daemon carry (the coordinator's secret).
    pub cluster_secret: runtime::cluster_secret::ClusterSecret,
    /// Quorum replication (with a grid): a put is acknowledged once this many nodes of its
    /// quorum hold it durably, this one included (at most the whole quorum).
    pub write_copies: usize,
    /// Objects of this priority or more are replicated on R(i) ∪ C(j), not R(i) alone.
    pub critical_priority: u8,
    /// How long a put waits for its copies before it is answered `UNAVAILABLE`.
    pub replicate_timeout: Duration,
    /// Follow the coordinator that etcd elects (the leader key) instead of `coordinator`.
    pub etcd: Option<runtime::etcd::Etcd>,
    /// Export spans of traced objects (puts with a sampled `traceparent`) to this OTLP/HTTP
    /// collector (`crate::trace`).
    pub otlp_endpoint: Option<String>,
}

impl DaemonConfig {
    /// Defaults for a node that serves `Daemon` at `endpoint`.
    pub fn new(node: u32, coordinator: String, endpoint: String) -> DaemonConfig {
        DaemonConfig {
            node,
            coordinator,
            endpoint,
            initial_workers: 4,
            urgent_workers: 1,
            write_slots: crate::admission::DEFAULT_SLOTS,
            urgent_write_slots: crate::admission::DEFAULT_RESERVE,
            regulator: RegulatorConfig {
                min_workers: 2,
                max_workers: 16,
                ..RegulatorConfig::default()
            },
            regulate_every: Duration::from_millis(1000),
            heartbeat_every: Duration::from_millis(500),
            resend_after: Duration::from_secs(5),
            result_ttl: Duration::from_secs(60),
            forward_batch: 512,
            forward_gap: Duration::from_millis(2),
            gpu: GpuUse::Hardware,
            bulk_lane: true,
            delivery: crate::deliver::DeliveryConfig::default(),
            cluster_secret: runtime::cluster_secret::ClusterSecret::default(),
            write_copies: 3,
            critical_priority: 6,
            replicate_timeout: Duration::from_secs(5),
            etcd: None,
            otlp_endpoint: None,
        }
    }
}
