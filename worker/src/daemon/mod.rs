//! The node daemon of a multi-process cluster (DESIGN §3, §5): it hosts elastic workers that
//! run one task at a time, loads function blocks (test block of one attribute, or the match
//! block) from the coordinator's versioned data images, caches test results until a match
//! worker collects them, hands matches to delivery on the node that took the write, and
//! regulates its own worker count from the node's CPU utilisation.
//!
//! Objects this node stores go to the coordinator in batches (`Cluster.Arrived`). The outbox
//! is the safety net: an object whose outbox record is still there after `resend_after` is
//! sent again, and all of them are sent again when a new coordinator appears (new nonce), so a
//! lost message, a dead worker or a dead coordinator delays an object but never loses it.
//! Delivery records are keyed by (subscription, object), so a repeated match is stored once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blocks::MatchIndex;
use blocks::shard::TestOutput;
use proto::v1;
use proto::v1::cluster_client::ClusterClient;
use proto::v1::daemon_client::DaemonClient;

use roaring::RoaringBitmap;
use runtime::cluster_secret::Internal;
use runtime::link::ToCoordinator;
use storage::{ObjectId, Store};
use tokio::sync::{Mutex as AsyncMutex, Notify, mpsc};

use tonic::{Request, Response, Status};

use crate::lanes::Lanes;
use crate::regulate::{CpuSampler, Regulation, RegulatorConfig, WorkerView, regulate};
use runtime::cluster_shard_config;
use runtime::config::Limits;
use runtime::error::ServiceError;
use runtime::validate;
use runtime::{lock, now_ms};

mod config;
mod fence;
mod forward;
mod forwarding;
mod images;
mod matched;
mod membership;
mod outbox;
mod ownership;
#[cfg(test)]
mod ownsim;
mod placement;
mod presence;
mod reclaim;
mod relay;
mod repair;
mod replicate;
mod resize;
mod service;
mod stop;
mod subcopies;
mod takeover;
mod tasks;
mod unsent;
mod workers;

pub use config::{DaemonConfig, GpuUse};
pub use forwarding::LinkLedger;
pub use workers::lane_switch;

// what the parts share with each other (each part takes the whole module with `use super::*`)
use images::Loaded;
use tasks::{CachedResults, priority};
use workers::{Changes, Slot};

/// Counters for the admin API.
#[derive(Debug, Default)]
pub struct DaemonCounters {
    pub matches_handed: AtomicU64,
    pub matches_repeated: AtomicU64,
    pub tasks_run: AtomicU64,
    pub loads: AtomicU64,
    pub workers_started: AtomicU64,
    pub workers_terminated: AtomicU64,
    /// Objects of dead nodes adopted by takeovers.
    pub taken_over: AtomicU64,
    /// This node's objects taken back from an adopter lost before it finished them.
    pub taken_back: AtomicU64,
    /// Object and subscription copies pulled from other nodes at catch-ups.
    pub copies_pulled: AtomicU64,
    /// Image versions compiled, and versions served by an image compiled before (the same
    /// subscriptions).
    pub images_compiled: AtomicU64,
    pub images_kept: AtomicU64,
    /// Image versions loaded as the change from a version held (no compile of the base),
    /// and bases compacted in the background.
    pub images_applied: AtomicU64,
    pub images_compacted: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    cfg: DaemonConfig,
    store: Store,
    limits: Limits,
    coord: ToCoordinator,
    /// The nonce of the coordinator this node registered with (0: not registered).
    nonce: AtomicU64,
    /// The catch-up after the last registration is done (the outbox resend waits for it).
    caught_up: std::sync::atomic::AtomicBool,
    /// Registrations so far (each starts a catch-up).
    registrations: AtomicU64,
    /// Registrations and lease lapses so far, and the count at which the subscription
    /// copies this position must hold were last pulled in full: equal, the node's copies
    /// are whole (`SubscriptionCopiesResponse.whole`). A lapse counts: taken for dead while
    /// it ran on, the node missed what changed meanwhile, though it did not register again.
    subs_gen: AtomicU64,
    subs_pulled_at: AtomicU64,
    /// The clock of the stall watch ([`Daemon::stall_watch`]): a process paused past its
    /// lease finds the gap before any answer comes.
    stall: Arc<subcopies::StallClock>,
    /// Where each peer's change feed stood at this node's last pull from it, and for
    /// which placers: the next catch-up from that peer takes only what changed since.
    sub_cursors: Mutex<std::collections::HashMap<u32, subcopies::PeerCursor>>,
    /// When this node last registered (`None`: not yet).
    registered_at: Mutex<Option<Instant>>,
    /// The resume of the unfinished delivery records began (it runs once).
    resuming: std::sync::atomic::AtomicBool,
    /// Unfinished delivery records were resumed (after the first catch-up): from now on the
    /// deliverer holds them open in memory. Set only once they are (until then they are
    /// open on disk only, and every reader looks there).
    resumed: std::sync::atomic::AtomicBool,
    reregister: Notify,
    workers: Mutex<BTreeMap<u64, Slot>>,
    changes: Mutex<Changes>,
    results: Mutex<HashMap<(u64, u64), CachedResults>>,
    images: AsyncMutex<BTreeMap<u64, Arc<Loaded>>>,
    /// The newest image version compiled here, and the newest one asked for ahead of use.
    image_loaded: AtomicU64,
    image_prefetch: AtomicU64,
    /// A compaction of the base runs in the background (one at a time).
    compacting: std::sync::atomic::AtomicBool,
    /// When the last compaction ended, and how long it took (the next waits twice that).
    last_compaction: Mutex<Option<(Instant, Duration)>>,
    peers: Mutex<HashMap<(String, bool), DaemonClient<Internal>>>,
    /// When each outbox object was last sent to the coordinator.
    sent: Mutex<HashMap<ObjectId, Instant>>,
    forward: mpsc::Sender<v1::ArrivedObject>,
    id_prefix: u64,
    next_worker: AtomicU64,
    counters: DaemonCounters,
    cpu: Mutex<f64>,
    forward_rx: Mutex<Option<mpsc::Receiver<v1::ArrivedObject>>>,
    deliverer: crate::deliver::Deliverer,
    lanes: Lanes,
    /// The node's write path for puts: its waiting puts count as backlog for the lanes.
    admission: crate::admission::Admission,
    /// The cluster as the last heartbeat answer described it (quorum replication).
    view: Mutex<replicate::View>,
    /// Each peer's queue of copies and finished marks.
    peer_queues: Mutex<HashMap<u32, mpsc::UnboundedSender<replicate::PeerMsg>>>,
    /// Ends of copies a peer did not take, sent again while it lives.
    unsent: Mutex<unsent::Unsent>,
    /// The origins whose objects this node took over.
    ownership: Mutex<ownership::Ownership>,
    /// What delivery finished, for the finisher (`forwarding`).
    finished: Arc<crate::deliver::FinishedQueue>,
    /// The node's federation links (`forwarding`), and where they report what they
    /// acknowledged.
    links: Mutex<Option<Arc<dyn LinkLedger>>>,
    links_acked: mpsc::UnboundedSender<ObjectId>,
    links_acked_rx: Mutex<Option<mpsc::UnboundedReceiver<ObjectId>>>,
    /// The lease fence: whether this node surely holds its lease.
    lease: Mutex<fence::Fence<Instant>>,
    /// Objects another node took over from this one and disseminates now: their queued
    /// pushes here are dropped.
    handed: Mutex<HashSet<ObjectId>>,
    /// This node's objects another node adopted: their closure here ends no copy.
    adopted_away: Mutex<HashSet<ObjectId>>,
    /// Draining (puts refused): asked by `dissem node drain`, or leaving the grid.
    drain: Arc<crate::drain::Drain>,
    /// This node's part in an online grid resize.
    resize: Mutex<resize::NodeResize>,
}

/// A node daemon (cheap to clone).
#[derive(Debug, Clone)]
pub struct Daemon {
    inner: Arc<Inner>,
}

impl Daemon {
    /// The link to the coordinator `cfg` names: the leader etcd elects (with `cfg.etcd`),
    /// else the one at `cfg.coordinator`, over gRPC.
    pub fn link(cfg: &DaemonConfig) -> Result<ToCoordinator, ServiceError> {
        if let Some(etcd) = &cfg.etcd {
            let leader =
                runtime::election::LeaderWatch::start(etcd.clone(), cfg.cluster_secret.clone());
            return Ok(ToCoordinator::Elected(Arc::new(
                runtime::link::Elected::new(leader, cfg.cluster_secret.stamp()),
            )));
        }
        let coord = ClusterClient::with_interceptor(
            runtime::channel(&cfg.coordinator)?,
            cfg.cluster_secret.stamp(),
        )
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(64 << 20);
        Ok(ToCoordinator::Grpc(coord))
    }

    /// A daemon that reaches its coordinator over `coord`, started ([`Daemon::new`] then
    /// [`Daemon::spawn`]).
    pub fn start(
        cfg: DaemonConfig,
        store: Store,
        limits: Limits,
        coord: ToCoordinator,
    ) -> Result<Daemon, ServiceError> {
        let d = Daemon::new(cfg, store, limits, coord)?;
        d.spawn();
        Ok(d)
    }

    /// Creates the daemon (nothing runs yet); fails on bad delivery settings (a webhook CA
    /// that does not parse).
    pub fn new(
        cfg: DaemonConfig,
        store: Store,
        limits: Limits,
        coord: ToCoordinator,
    ) -> Result<Daemon, ServiceError> {
        let (tx, rx) = mpsc::channel(65_536);
        let lanes = Lanes::new(cfg.bulk_lane);
        let admission = crate::admission::Admission::new(
            cfg.write_slots,
            cfg.urgent_write_slots,
            crate::admission::DEFAULT_MAX_WAITING,
        );
        let deliverer = crate::deliver::Deliverer::new(
            cfg.delivery.clone(),
            store.clone(),
            Arc::new(coord.clone()),
            lanes.clone(),
        )?;
        if let Some(e) = &cfg.otlp_endpoint {
            deliverer.set_tracer(crate::trace::Tracer::start(e, cfg.node)?);
        }
        let finished = Arc::new(crate::deliver::FinishedQueue::default());
        deliverer.on_finished(finished.clone());
        let (links_acked, links_acked_rx) = mpsc::unbounded_channel();
        let d = Daemon {
            inner: Arc::new(Inner {
                coord,
                nonce: AtomicU64::new(0),
                caught_up: std::sync::atomic::AtomicBool::new(false),
                registrations: AtomicU64::new(0),
                subs_gen: AtomicU64::new(0),
                subs_pulled_at: AtomicU64::new(u64::MAX),
                stall: Arc::new(subcopies::StallClock::new()),
                sub_cursors: Mutex::default(),
                resuming: std::sync::atomic::AtomicBool::new(false),
                resumed: std::sync::atomic::AtomicBool::new(false),
                registered_at: Mutex::new(None),
                reregister: Notify::new(),
                workers: Mutex::new(BTreeMap::new()),
                changes: Mutex::new(Changes::default()),
                results: Mutex::new(HashMap::new()),
                images: AsyncMutex::new(BTreeMap::new()),
                image_loaded: AtomicU64::new(0),
                image_prefetch: AtomicU64::new(0),
                compacting: std::sync::atomic::AtomicBool::new(false),
                last_compaction: Mutex::new(None),
                peers: Mutex::new(HashMap::new()),
                sent: Mutex::new(HashMap::new()),
                forward: tx,
                id_prefix: ((cfg.node as u64 & 0xffff) << 48)
                    | ((runtime::random_u64() & 0xffff) << 32),
                next_worker: AtomicU64::new(1),
                counters: DaemonCounters::default(),
                cpu: Mutex::new(0.0),
                cfg,
                store,
                limits,
                forward_rx: Mutex::new(Some(rx)),
                deliverer,
                lanes,
                admission,
                view: Mutex::new(replicate::View::default()),
                peer_queues: Mutex::new(HashMap::new()),
                unsent: Mutex::new(unsent::Unsent::default()),
                ownership: Mutex::new(ownership::Ownership::default()),
                finished,
                links: Mutex::new(None),
                links_acked,
                links_acked_rx: Mutex::new(Some(links_acked_rx)),
                lease: Mutex::new(fence::Fence::default()),
                handed: Mutex::new(HashSet::new()),
                adopted_away: Mutex::new(HashSet::new()),
                drain: Arc::default(),
                resize: Mutex::default(),
            }),
        };
        d.inner
            .deliverer
            .on_received(Arc::new(replicate::QuorumPhases(Arc::downgrade(&d.inner))));
        Ok(d)
    }

    /// Starts the initial workers and the background loops (registration and heartbeats,
    /// forwarding, outbox resends, load regulation). They run until the runtime stops.
    pub fn spawn(&self) {
        let Some(rx) = lock(&self.inner.forward_rx).take() else {
            return; // already running
        };
        for _ in 0..self.inner.cfg.initial_workers {
            self.start_worker(false);
        }
        for _ in 0..self.inner.cfg.urgent_workers {
            self.start_worker(true);
        }
        tokio::spawn(self.clone().forwarder(rx));
        tokio::spawn(self.clone().membership());
        if let ToCoordinator::Elected(e) = &self.inner.coord {
            tokio::spawn(self.clone().follow_leader(e.leader().changes()));
        }
        if let Some(etcd) = self.inner.cfg.etcd.clone() {
            tokio::spawn(self.clone().presence(etcd));
        }
        tokio::spawn(self.clone().resender());
        tokio::spawn(self.clone().auditor());
        tokio::spawn(self.clone().regulator());
        tokio::spawn(self.clone().relays());
        tokio::spawn(self.clone().follow_peers());
        self.stall_watch();
        if let Some(acked) = lock(&self.inner.links_acked_rx).take() {
            tokio::spawn(self.clone().finisher(acked));
        }
        if self.inner.cfg.bulk_lane {
            tokio::spawn(self.clone().lane_switch());
        }
        // unfinished deliveries resume after the first catch-up with the coordinator and the
        // quorums (`catch_up`): some may have been taken over while this node was down
    }

    /// The node's delivery loop.
    pub fn deliverer(&self) -> &crate::deliver::Deliverer {
        &self.inner.deliverer
    }

    /// Counters for the admin API.
    pub fn counters(&self) -> &DaemonCounters {
        &self.inner.counters
    }

    /// The node's drain state (its services refuse puts while it drains).
    pub fn drain(&self) -> &Arc<crate::drain::Drain> {
        &self.inner.drain
    }

    /// The node's write path for puts (its services enter it; the bulk lane's switch
    /// counts the puts waiting there as backlog).
    pub fn admission(&self) -> &crate::admission::Admission {
        &self.inner.admission
    }
}
