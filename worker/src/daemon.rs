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

/// Set once `GpuUse::Hardware` found no hardware adapter: later images do not probe again.
static NO_HARDWARE_GPU: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

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
    pub regulator: RegulatorConfig,
    /// How often load regulation samples the CPU.
    pub regulate_every: Duration,
    pub heartbeat_every: Duration,
    /// An outbox record older than this is sent to the coordinator again.
    pub resend_after: Duration,
    /// Cached test results are dropped after this long.
    pub result_ttl: Duration,
    /// Objects per `Arrived` message at most, and the least time between two messages: an
    /// object that arrives after a quiet spell is sent at once, while under a steady stream
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
}

impl DaemonConfig {
    /// Defaults for a node that serves `Daemon` at `endpoint`.
    pub fn new(node: u32, coordinator: String, endpoint: String) -> DaemonConfig {
        DaemonConfig {
            node,
            coordinator,
            endpoint,
            initial_workers: 4,
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
        }
    }
}

/// A compiled image version: the shard plus the test outputs of absent attributes.
#[derive(Debug)]
struct Loaded {
    index: MatchIndex,
    absent: Vec<(String, TestOutput)>,
    /// The resident subset matcher of match blocks: the GPU when an adapter opens, else the
    /// CPU twin; `None` when the node runs match blocks on the CPU scan of `blocks`.
    subset: Option<Mutex<gpu::SubsetMatcher>>,
}

/// A test task's results: when they were computed, and one per object.
type CachedResults = (Instant, Vec<Arc<v1::TestResult>>);

/// One object of a match task: its index in the task, and its test results.
type ObjectResults = (usize, Vec<Arc<v1::TestResult>>);

#[derive(Debug)]
struct Slot {
    block: String,
    busy: bool,
    last_task_ms: u64,
    tx: mpsc::Sender<v1::AssignRequest>,
}

#[derive(Debug, Default)]
struct Changes {
    started: Vec<v1::WorkerState>,
    terminated: Vec<u64>,
}

/// Counters for the admin API.
#[derive(Debug, Default)]
pub struct DaemonCounters {
    pub matches_handed: AtomicU64,
    pub matches_repeated: AtomicU64,
    pub tasks_run: AtomicU64,
    pub loads: AtomicU64,
    pub workers_started: AtomicU64,
    pub workers_terminated: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    cfg: DaemonConfig,
    store: Store,
    limits: Limits,
    coord: ToCoordinator,
    /// The nonce of the coordinator this node registered with (0: not registered).
    nonce: AtomicU64,
    reregister: Notify,
    workers: Mutex<BTreeMap<u64, Slot>>,
    changes: Mutex<Changes>,
    results: Mutex<HashMap<(u64, u64), CachedResults>>,
    images: AsyncMutex<BTreeMap<u64, Arc<Loaded>>>,
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
}

/// A node daemon (cheap to clone).
#[derive(Debug, Clone)]
pub struct Daemon {
    inner: Arc<Inner>,
}

impl Daemon {
    /// A daemon that reaches its coordinator over gRPC at `cfg.coordinator`, started
    /// ([`Daemon::new`] then [`Daemon::spawn`]).
    pub fn start(cfg: DaemonConfig, store: Store, limits: Limits) -> Result<Daemon, ServiceError> {
        let coord = ClusterClient::with_interceptor(
            runtime::channel(&cfg.coordinator)?,
            cfg.cluster_secret.stamp(),
        )
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(64 << 20);
        let d = Daemon::new(cfg, store, limits, ToCoordinator::Grpc(coord))?;
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
        let deliverer = crate::deliver::Deliverer::new(
            cfg.delivery.clone(),
            store.clone(),
            coord.clone(),
            lanes.clone(),
        )?;
        Ok(Daemon {
            inner: Arc::new(Inner {
                coord,
                nonce: AtomicU64::new(0),
                reregister: Notify::new(),
                workers: Mutex::new(BTreeMap::new()),
                changes: Mutex::new(Changes::default()),
                results: Mutex::new(HashMap::new()),
                images: AsyncMutex::new(BTreeMap::new()),
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
            }),
        })
    }

    /// Starts the initial workers and the background loops (registration and heartbeats,
    /// forwarding, outbox resends, load regulation). They run until the runtime stops.
    pub fn spawn(&self) {
        let Some(rx) = lock(&self.inner.forward_rx).take() else {
            return; // already running
        };
        for _ in 0..self.inner.cfg.initial_workers {
            self.start_worker();
        }
        tokio::spawn(self.clone().forwarder(rx));
        tokio::spawn(self.clone().membership());
        tokio::spawn(self.clone().resender());
        tokio::spawn(self.clone().regulator());
        if self.inner.cfg.bulk_lane {
            tokio::spawn(self.clone().lane_switch());
        }
        match self.inner.deliverer.resume() {
            Ok(n) if n > 0 => tracing::info!("resuming {n} unfinished deliveries"),
            Ok(_) => {}
            Err(e) => tracing::warn!("reading unfinished deliveries: {e}"),
        }
    }

    /// The node's delivery loop.
    pub fn deliverer(&self) -> &crate::deliver::Deliverer {
        &self.inner.deliverer
    }

    /// Counters for the admin API.
    pub fn counters(&self) -> &DaemonCounters {
        &self.inner.counters
    }

    /// The node's workers: (id, block, busy).
    pub fn workers(&self) -> Vec<(u64, String, bool)> {
        lock(&self.inner.workers)
            .iter()
            .map(|(id, s)| (*id, s.block.clone(), s.busy))
            .collect()
    }

    /// The last CPU utilisation sample (0..=1).
    pub fn cpu(&self) -> f64 {
        *lock(&self.inner.cpu)
    }

    /// A stored object (still in the outbox) to be matched: queued for the coordinator.
    pub fn arrived(&self, id: ObjectId, priority: u8, metadata: &[(String, blocks::Value)]) {
        let obj = v1::ArrivedObject {
            id: Some(v1::ObjectId {
                node: id.node,
                seq: id.seq,
            }),
            priority: priority as u32,
            metadata: validate::attributes_to_proto(metadata),
            received_unix_ms: now_ms(),
        };
        lock(&self.inner.sent).insert(id, Instant::now());
        // a full queue drops it here; the outbox resend picks it up
        let _ = self.inner.forward.try_send(obj);
    }

    fn start_worker(&self) -> u64 {
        let id = self.inner.id_prefix | self.inner.next_worker.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(8);
        lock(&self.inner.workers).insert(
            id,
            Slot {
                block: "empty".into(),
                busy: false,
                last_task_ms: now_ms(),
                tx,
            },
        );
        lock(&self.inner.changes).started.push(v1::WorkerState {
            worker: id,
            block: "empty".into(),
        });
        self.inner
            .counters
            .workers_started
            .fetch_add(1, Ordering::Relaxed);
        tokio::spawn(self.clone().worker(id, rx));
        id
    }

    /// Terminates an idle worker; false when it is busy or gone.
    fn terminate_worker(&self, id: u64) -> bool {
        let mut ws = lock(&self.inner.workers);
        if ws.get(&id).is_some_and(|s| !s.busy) {
            ws.remove(&id); // dropping the sender ends the worker's loop
            drop(ws);
            lock(&self.inner.changes).terminated.push(id);
            self.inner
                .counters
                .workers_terminated
                .fetch_add(1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    // --- background loops ---------------------------------------------------------------------

    async fn forwarder(self, mut rx: mpsc::Receiver<v1::ArrivedObject>) {
        let cfg = &self.inner.cfg;
        let mut last: Option<tokio::time::Instant> = None;
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            let due = last.map(|t| t + cfg.forward_gap);
            while batch.len() < cfg.forward_batch {
                let next = match due {
                    Some(due) if tokio::time::Instant::now() < due => {
                        tokio::time::timeout_at(due, rx.recv()).await.ok().flatten()
                    }
                    _ => rx.try_recv().ok(),
                };
                match next {
                    Some(o) => batch.push(o),
                    None => break,
                }
            }
            last = Some(tokio::time::Instant::now());
            self.send_arrived(batch).await;
        }
    }

    async fn send_arrived(&self, objects: Vec<v1::ArrivedObject>) {
        let n = objects.len();
        let req = v1::ArrivedRequest {
            node: self.inner.cfg.node,
            objects,
        };
        if let Err(e) = self.inner.coord.arrived(req).await {
            tracing::debug!("sending {n} objects to the coordinator failed (resent later): {e}");
        }
    }

    fn worker_states(&self) -> Vec<v1::WorkerState> {
        lock(&self.inner.workers)
            .iter()
            .map(|(id, s)| v1::WorkerState {
                worker: *id,
                block: s.block.clone(),
            })
            .collect()
    }

    /// Registration and heartbeats; registers again when the coordinator's nonce changes.
    async fn membership(self) {
        let mut tick = tokio::time::interval(self.inner.cfg.heartbeat_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.inner.reregister.notified() => {
                    self.inner.nonce.store(0, Ordering::Release);
                }
            }
            let known = self.inner.nonce.load(Ordering::Acquire);
            if known == 0 {
                let req = v1::RegisterRequest {
                    node: self.inner.cfg.node,
                    endpoint: self.inner.cfg.endpoint.clone(),
                    workers: self.worker_states(),
                };
                *lock(&self.inner.changes) = Changes::default();
                match self.inner.coord.register(req).await {
                    Ok(r) => {
                        let nonce = r.nonce;
                        tracing::info!("registered with coordinator {nonce:016x}");
                        self.inner.nonce.store(nonce, Ordering::Release);
                        // whatever was in flight with an earlier coordinator is sent again
                        lock(&self.inner.sent).clear();
                        let me = self.clone();
                        tokio::spawn(async move { me.resend(Duration::ZERO).await });
                    }
                    Err(e) => tracing::debug!("registering with the coordinator: {e}"),
                }
                continue;
            }
            let changes = std::mem::take(&mut *lock(&self.inner.changes));
            let req = v1::HeartbeatRequest {
                node: self.inner.cfg.node,
                nonce: known,
                workers: self.worker_states(),
                started: changes.started.clone(),
                terminated: changes.terminated.clone(),
            };
            match self.inner.coord.heartbeat(req).await {
                Ok(r) if r.nonce == known => {}
                Ok(r) => {
                    tracing::info!(
                        "coordinator changed ({known:016x} -> {:016x}): registering again",
                        r.nonce
                    );
                    self.inner.nonce.store(0, Ordering::Release);
                    self.inner.reregister.notify_one();
                }
                Err(e) => {
                    // keep the changes for the next heartbeat
                    let mut c = lock(&self.inner.changes);
                    c.started.extend(changes.started);
                    c.terminated.extend(changes.terminated);
                    tracing::debug!("heartbeat: {e}");
                }
            }
        }
    }

    /// Sends again every outbox object not sent within `after`.
    async fn resend(&self, after: Duration) {
        let pending = match self.inner.store.outbox_pending() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("reading the outbox: {e}");
                return;
            }
        };
        let now = Instant::now();
        let due: Vec<ObjectId> = {
            let sent = lock(&self.inner.sent);
            pending
                .iter()
                .map(|(id, _)| *id)
                .filter(|id| sent.get(id).is_none_or(|t| now.duration_since(*t) >= after))
                // handed off, its pushes in memory: nothing to send
                .filter(|id| !self.inner.deliverer.owes(*id))
                .collect()
        };
        let mut batch = Vec::new();
        for id in due {
            match self.inner.store.get(id) {
                Ok(Some(o)) => {
                    lock(&self.inner.sent).insert(id, now);
                    batch.push(v1::ArrivedObject {
                        id: Some(v1::ObjectId {
                            node: id.node,
                            seq: id.seq,
                        }),
                        priority: o.priority as u32,
                        metadata: validate::attributes_to_proto(&o.metadata),
                        received_unix_ms: o.received_unix_ms,
                    });
                }
                // a put still being written (the outbox takes an object in when its id is
                // handed out): the next round sends it
                Ok(None) => {}
                Err(e) => tracing::warn!("reading object {}:{}: {e}", id.node, id.seq),
            }
            if batch.len() >= self.inner.cfg.forward_batch {
                self.send_arrived(std::mem::take(&mut batch)).await;
            }
        }
        if !batch.is_empty() {
            self.send_arrived(batch).await;
        }
    }

    async fn resender(self) {
        let every = (self.inner.cfg.resend_after / 2).max(Duration::from_millis(50));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            if self.inner.nonce.load(Ordering::Acquire) != 0 {
                self.resend(self.inner.cfg.resend_after).await;
            }
            let ttl = self.inner.cfg.result_ttl;
            lock(&self.inner.results).retain(|_, (t, _)| t.elapsed() < ttl);
        }
    }

    async fn regulator(self) {
        let mut sampler = CpuSampler::default();
        let mut tick = tokio::time::interval(self.inner.cfg.regulate_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let Some(cpu) = sampler.sample() else {
                continue;
            };
            *lock(&self.inner.cpu) = cpu;
            let views: Vec<WorkerView> = lock(&self.inner.workers)
                .iter()
                .map(|(id, s)| WorkerView {
                    id: *id,
                    idle: !s.busy,
                    last_task_ms: s.last_task_ms,
                })
                .collect();
            for r in regulate(&self.inner.cfg.regulator, now_ms(), cpu, &views) {
                match r {
                    Regulation::Start => {
                        let id = self.start_worker();
                        tracing::debug!("cpu {cpu:.2}: started empty worker {id:x}");
                    }
                    Regulation::Terminate(id) => {
                        if self.terminate_worker(id) {
                            tracing::debug!("cpu {cpu:.2}: terminated idle worker {id:x}");
                        }
                    }
                }
            }
        }
    }

    /// Drives the bulk lane from the outbox backlog ([`lane_switch`]).
    async fn lane_switch(self) {
        let mut calm = 0u32;
        let mut tick = tokio::time::interval(LANE_SAMPLE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let backlog = self.inner.store.outbox_len();
            let lanes = &self.inner.lanes;
            let was = lanes.overloaded();
            let now = lane_switch(was, backlog, &mut calm);
            if now != was {
                tracing::debug!(
                    "{backlog} objects in the outbox: bulk lane {}",
                    if now { "on" } else { "off" }
                );
                lanes.set_overloaded(now);
            }
        }
    }

    // --- workers and blocks -------------------------------------------------------------------

    async fn worker(self, id: u64, mut rx: mpsc::Receiver<v1::AssignRequest>) {
        while let Some(req) = rx.recv().await {
            let task = req.task;
            let nonce = req.nonce;
            let block = req.block.clone();
            if req.load {
                self.inner.counters.loads.fetch_add(1, Ordering::Relaxed);
            }
            // the task runs on the lane of its priority: fetching results, matching and the
            // hand-off of a backlog never take the CPU from writes and urgent objects
            let p = priority(&req);
            let run = if self.inner.lanes.urgent(p) {
                Ok(self.run_task(req).await) // this runtime: no hop
            } else {
                let me = self.clone();
                let bulk = self
                    .inner
                    .lanes
                    .spawn(p, async move { me.run_task(req).await });
                bulk.await
            };
            let failed = match run {
                Ok(Ok(f)) => f,
                Ok(Err(e)) => {
                    tracing::warn!("worker {id:x}, task {task}: {e}");
                    Vec::new()
                }
                Err(e) => {
                    tracing::warn!("worker {id:x}, task {task} did not finish: {e}");
                    Vec::new()
                }
            };
            self.inner
                .counters
                .tasks_run
                .fetch_add(1, Ordering::Relaxed);
            {
                let mut ws = lock(&self.inner.workers);
                if let Some(s) = ws.get_mut(&id) {
                    s.busy = false;
                    s.block = block.clone();
                    s.last_task_ms = now_ms();
                }
            }
            let done = v1::DoneRequest {
                nonce,
                worker: id,
                task,
                block,
                failed,
            };
            if let Err(e) = self.inner.coord.done(done).await {
                tracing::debug!("reporting task {task} done: {e}");
            }
        }
    }

    /// The compiled image `version`, fetched from the coordinator on first use.
    async fn image(&self, version: u64) -> Result<Arc<Loaded>, ServiceError> {
        let mut images = self.inner.images.lock().await;
        if let Some(l) = images.get(&version) {
            return Ok(l.clone());
        }
        let resp = self
            .inner
            .coord
            .image(v1::ImageRequest { version })
            .await
            .map_err(|e| ServiceError::Unavailable(format!("fetching image {version}: {e}")))?;
        let use_gpu = self.inner.cfg.gpu;
        let loaded = tokio::task::spawn_blocking(move || {
            let index = MatchIndex::from_image(cluster_shard_config(), &resp.image)?;
            let base = index.base();
            let absent = base
                .attribute_names()
                .iter()
                .filter_map(|a| {
                    base.test_attribute(a, None)
                        .filter(|o| !o.ids.is_empty())
                        .map(|o| (a.clone(), o))
                })
                .collect();
            let probe = use_gpu == GpuUse::Any
                || (use_gpu == GpuUse::Hardware && !NO_HARDWARE_GPU.load(Ordering::Relaxed));
            let subset = if probe && base.bloom_ready() && base.conjunctions() > 0 {
                match gpu::SubsetMatcher::new(
                    base.filters(),
                    base.conjunctions(),
                    base.filter_words(),
                    gpu::GpuOptions::default(),
                ) {
                    Ok(gpu::SubsetMatcher::Gpu(g))
                        if use_gpu == GpuUse::Any || g.info().device_type != "Cpu" =>
                    {
                        tracing::info!(
                            "image {version}: match block on the GPU ({}, {})",
                            g.info().name,
                            g.info().device_type
                        );
                        Some(Mutex::new(gpu::SubsetMatcher::Gpu(g)))
                    }
                    Ok(_) => {
                        // no hardware GPU: the CPU scan of `blocks`, and no more probing
                        NO_HARDWARE_GPU.store(true, Ordering::Relaxed);
                        None
                    }
                    Err(e) => {
                        tracing::warn!("match block on the CPU scan: {e}");
                        None
                    }
                }
            } else {
                None
            };
            Ok::<_, blocks::index::IndexError>(Loaded {
                index,
                absent,
                subset,
            })
        })
        .await
        .map_err(|e| ServiceError::Unavailable(format!("image build task: {e}")))?
        .map_err(|e| ServiceError::Unavailable(format!("image {version}: {e}")))?;
        let loaded = Arc::new(loaded);
        images.insert(version, loaded.clone());
        while images.len() > 3 {
            images.pop_first();
        }
        Ok(loaded)
    }

    /// Takes the cached test results of `tasks` for the objects `keys` out of the cache (an
    /// object's results serve one match; a match that runs again finds them gone and fails
    /// the object back to the coordinator, which tests it again), and names the tasks with
    /// none. Results nobody fetched expire after `result_ttl`.
    fn take_results(
        &self,
        nonce: u64,
        tasks: &[u64],
        keys: &HashSet<u64>,
    ) -> (Vec<Arc<v1::TestResult>>, Vec<u64>) {
        let mut cache = lock(&self.inner.results);
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for &t in tasks {
            let Some((_, rs)) = cache.get_mut(&(nonce, t)) else {
                missing.push(t);
                continue;
            };
            rs.retain(|r| {
                let take = keys.contains(&r.key);
                if take {
                    found.push(r.clone());
                }
                !take
            });
            if rs.is_empty() {
                cache.remove(&(nonce, t));
            }
        }
        (found, missing)
    }

    /// A client of a peer node's daemon, one per lane (a connection is driven by the runtime
    /// that opened it).
    fn peer(&self, endpoint: &str) -> Result<DaemonClient<Internal>, ServiceError> {
        let key = (endpoint.to_string(), crate::lanes::on_bulk());
        let mut peers = lock(&self.inner.peers);
        if let Some(c) = peers.get(&key) {
            return Ok(c.clone());
        }
        let c = DaemonClient::with_interceptor(
            runtime::channel(endpoint)?,
            self.inner.cfg.cluster_secret.stamp(),
        )
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30);
        peers.insert(key, c.clone());
        Ok(c)
    }

    /// Runs one task; returns the objects of a match task whose results were missing.
    async fn run_task(&self, req: v1::AssignRequest) -> Result<Vec<u64>, ServiceError> {
        if let Some(attr) = req.block.strip_prefix("test:") {
            self.run_test(&req, attr).await?;
            Ok(Vec::new())
        } else if req.block == "match" {
            self.run_match(req).await
        } else {
            Err(ServiceError::invalid(
                "block",
                format!("{:?} is no block", req.block),
            ))
        }
    }

    async fn run_test(&self, req: &v1::AssignRequest, attr: &str) -> Result<(), ServiceError> {
        let mut by_version: BTreeMap<u64, Vec<(u64, blocks::Value)>> = BTreeMap::new();
        for (i, t) in req.tests.iter().enumerate() {
            let v = validate::value(
                t.value.as_ref(),
                &format!("tests[{i}].value"),
                &self.inner.limits,
            )?;
            by_version.entry(t.version).or_default().push((t.key, v));
        }
        let mut results = Vec::with_capacity(req.tests.len());
        for (version, items) in by_version {
            let loaded = self.image(version).await?;
            let attr = attr.to_string();
            let task = req.task;
            let test = move || {
                let base = loaded.index.base();
                let mut ctx = base.new_ctx();
                items
                    .into_iter()
                    .filter_map(|(key, v)| {
                        let o = base.test_attribute_with(&attr, Some(&v), &mut ctx)?;
                        let mut ids = Vec::with_capacity(o.ids.serialized_size());
                        o.ids.serialize_into(&mut ids).ok()?;
                        Some(v1::TestResult {
                            task,
                            key,
                            attribute: attr.clone(),
                            version,
                            filter: o.filter,
                            ids,
                        })
                    })
                    .collect::<Vec<_>>()
            };
            let out = if req.tests.len() <= INLINE_OBJECTS {
                test() // cheaper than a hand-off to a blocking thread and back
            } else {
                self.inner
                    .lanes
                    .spawn_blocking(priority(req), test)
                    .await
                    .map_err(|e| ServiceError::Unavailable(format!("test task: {e}")))?
            };
            results.extend(out);
        }
        let results = results.into_iter().map(Arc::new).collect();
        lock(&self.inner.results).insert((req.nonce, req.task), (Instant::now(), results));
        Ok(())
    }

    async fn run_match(&self, req: v1::AssignRequest) -> Result<Vec<u64>, ServiceError> {
        // collect the test results from the test workers' nodes, one call per node
        let mut per_node: HashMap<String, (HashSet<u64>, Vec<u64>)> = HashMap::new();
        for m in &req.matches {
            for s in &m.sources {
                let e = per_node.entry(s.endpoint.clone()).or_default();
                e.0.insert(s.task);
                e.1.push(m.key);
            }
        }
        let mut got: HashMap<(u64, u64), Arc<v1::TestResult>> =
            HashMap::with_capacity(req.matches.iter().map(|m| m.sources.len()).sum());
        let mut calls = tokio::task::JoinSet::new();
        for (endpoint, (tasks, mut keys)) in per_node {
            keys.sort_unstable();
            keys.dedup();
            let fetch = v1::FetchRequest {
                nonce: req.nonce,
                tasks: tasks.into_iter().collect(),
                keys,
            };
            if endpoint == self.inner.cfg.endpoint {
                // this node's own cache: no call, no copies
                let keys: HashSet<u64> = fetch.keys.iter().copied().collect();
                let (rs, _) = self.take_results(fetch.nonce, &fetch.tasks, &keys);
                for t in rs {
                    got.insert((t.task, t.key), t);
                }
                continue;
            }
            let me = self.clone();
            calls.spawn(async move {
                let mut c = me.peer(&endpoint).ok()?;
                c.fetch(fetch).await.map(|r| r.into_inner()).ok()
            });
        }
        while let Some(r) = calls.join_next().await {
            if let Ok(Some(r)) = r {
                for t in r.results {
                    got.insert((t.task, t.key), Arc::new(t));
                }
            }
        }
        // assemble each object's filter and predicate ids; missing results fail the object
        let mut failed = Vec::new();
        let mut by_version: BTreeMap<u64, Vec<ObjectResults>> = BTreeMap::new();
        for (i, m) in req.matches.iter().enumerate() {
            let mut rs = Vec::with_capacity(m.sources.len());
            for s in &m.sources {
                match got.remove(&(s.task, m.key)) {
                    Some(r) if r.version == m.version => rs.push(r),
                    _ => break,
                }
            }
            if rs.len() == m.sources.len() {
                by_version.entry(m.version).or_default().push((i, rs));
            } else {
                failed.push(m.key);
            }
        }
        let mut matched: Vec<(usize, Vec<u64>)> = Vec::new();
        for (version, objs) in by_version {
            let loaded = match self.image(version).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!("match task {}: {e}", req.task);
                    failed.extend(objs.iter().map(|(i, _)| req.matches[*i].key));
                    continue;
                }
            };
            let out = if objs.len() <= INLINE_OBJECTS && loaded.subset.is_none() {
                match_objects(&loaded, objs) // cheaper than a hand-off to a blocking thread
            } else {
                self.inner
                    .lanes
                    .spawn_blocking(priority(&req), move || match_objects(&loaded, objs))
                    .await
                    .map_err(|e| ServiceError::Unavailable(format!("match task: {e}")))?
            };
            matched.extend(out);
        }
        // hand the matches to delivery on each object's origin node
        let mut per_origin: HashMap<String, Vec<v1::ObjectMatches>> = HashMap::new();
        for (i, subs) in matched {
            let m = &req.matches[i];
            per_origin
                .entry(m.origin.clone())
                .or_default()
                .push(v1::ObjectMatches {
                    id: m.id,
                    subscriptions: subs,
                });
        }
        let mut calls = tokio::task::JoinSet::new();
        for (origin, objects) in per_origin {
            let me = self.clone();
            calls.spawn(async move {
                let req = v1::MatchedRequest { objects };
                let res = if origin == me.inner.cfg.endpoint {
                    me.handoff(req).await
                } else {
                    match me.peer(&origin) {
                        Ok(mut c) => c
                            .matched(req)
                            .await
                            .map(|_| ())
                            .map_err(|e| ServiceError::Unavailable(e.to_string())),
                        Err(e) => Err(e),
                    }
                };
                if let Err(e) = res {
                    // the origin's outbox still holds these objects: they come back
                    tracing::debug!("handing matches to {origin}: {e}");
                }
            });
        }
        while calls.join_next().await.is_some() {}
        Ok(failed)
    }

    /// Delivery hand-off on the origin node. A match to a QoS 1 subscription (or one not
    /// seen yet, looked up first) is pushed at once without a record: the object's outbox
    /// record stands for it until it is acknowledged (a crash before that matches the object
    /// again at the next start); a failed attempt writes its record. Every other match gets a pending record, pushed
    /// while the records are flushed. The object leaves the outbox once its records are
    /// flushed and its in-memory deliveries settled. A hand-off of an object that left the
    /// outbox, or whose in-memory deliveries run, is a repeat and changes nothing.
    pub async fn handoff(&self, req: v1::MatchedRequest) -> Result<(), ServiceError> {
        let mut objects = Vec::with_capacity(req.objects.len());
        for o in req.objects {
            let id =
                o.id.ok_or_else(|| ServiceError::invalid("objects.id", "required"))?;
            let id = ObjectId {
                node: id.node,
                seq: id.seq,
            };
            if id.node != self.inner.cfg.node {
                return Err(ServiceError::invalid(
                    "objects.id.node",
                    format!(
                        "object of node {} sent to node {}",
                        id.node, self.inner.cfg.node
                    ),
                ));
            }
            objects.push((id, o.subscriptions));
        }
        let deliverer = &self.inner.deliverer;
        let (mut handed, mut repeated) = (0u64, 0u64);
        let mut pairs = Vec::new();
        let mut held = Vec::new();
        let mut plain = Vec::new();
        for (id, subs) in objects {
            handed += subs.len() as u64;
            if !self.inner.store.in_outbox(id) || deliverer.owes(id) {
                repeated += subs.len() as u64;
                continue;
            }
            let n = subs.len() as u64;
            let Some(h) = deliverer.hand_off(id, subs) else {
                repeated += n; // a concurrent hand-off of the object has its pushes in memory
                continue;
            };
            pairs.extend(h.to_record.into_iter().map(|s| (s, id)));
            if h.held {
                held.push(id);
            } else {
                plain.push(id);
            }
        }
        // the pushes start while the records are flushed: the objects stay in the outbox
        // until the flush, so a crash before it matches them again (QoS 1 may repeat a
        // push, and QoS 2's delivery id absorbs it; the durable "received" phase is
        // flushed on its own)
        let recorded = async {
            let added = self
                .inner
                .store
                .add_pending_deliveries_unflushed(&pairs)
                .await?;
            repeated += (pairs.len() - added.len()) as u64;
            let any = !added.is_empty();
            for (s, id) in added {
                deliverer.enqueue_new(s, id);
            }
            if any {
                self.inner.store.commit().await?;
            }
            Ok::<_, storage::StorageError>(())
        }
        .await;
        let c = &self.inner.counters;
        c.matches_handed.fetch_add(handed, Ordering::Relaxed);
        c.matches_repeated.fetch_add(repeated, Ordering::Relaxed);
        if let Err(e) = recorded {
            // the records may be missing: the objects stay in the outbox, and once their
            // in-memory pushes settle the resend matches them again
            for id in held {
                deliverer.abandon(id);
            }
            return Err(e.into());
        }
        {
            let mut sent = lock(&self.inner.sent);
            for id in plain.iter().chain(&held) {
                sent.remove(id);
            }
        }
        for id in plain {
            // a concurrent hand-off of the same object may have pushes in memory: the last
            // of them retires it
            if !deliverer.owes(id) {
                self.inner.store.retire(id)?;
            }
        }
        for id in held {
            deliverer.release(id);
        }
        Ok(())
    }
}

/// Matches objects from their test results: OR of the filters (plus the outputs of absent
/// attributes), Bloom subset scan, exact verification by predicate ids.
/// Test and match tasks of at most this many objects run on the task's own thread; larger
/// ones (and GPU matches, which wait on the device) on a blocking thread of their lane.
const INLINE_OBJECTS: usize = 16;

/// How often the bulk lane's switch looks at the outbox.
const LANE_SAMPLE: Duration = Duration::from_millis(20);

/// Whether the bulk lane should be on, given whether it is (`on`) and the objects in the
/// outbox (put, not yet matched and delivered), sampled every 20 ms. On once a backlog built
/// up (300 objects: the node is not keeping up, and the order in which the CPU serves work
/// decides who waits); off only after 200 ms of calm (10 samples under 100 objects), so it
/// does not flap inside an overload. A busy CPU alone is no reason: without a backlog
/// nothing waits for long, and while off every object runs at one priority, so niced
/// threads never lengthen the tail of a load the node keeps up with.
pub fn lane_switch(on: bool, backlog: usize, calm: &mut u32) -> bool {
    if backlog >= 300 {
        *calm = 0;
        return true;
    }
    if backlog < 100 {
        *calm = calm.saturating_add(1);
    } else {
        *calm = 0;
    }
    on && *calm < 10
}

/// A task's priority as the coordinator handed it out (0..=7).
fn priority(req: &v1::AssignRequest) -> u8 {
    req.priority.min(7) as u8
}

fn match_objects(loaded: &Loaded, objs: Vec<ObjectResults>) -> Vec<(usize, Vec<u64>)> {
    let base = loaded.index.base();
    let w = base.filter_words();
    let mut filters = vec![0u64; w * objs.len()];
    let mut ids: Vec<RoaringBitmap> = Vec::with_capacity(objs.len());
    for (o, (_, rs)) in objs.iter().enumerate() {
        let f = &mut filters[o * w..o * w + w];
        let mut set = RoaringBitmap::new();
        for r in rs {
            for (x, y) in f.iter_mut().zip(&r.filter) {
                *x |= y;
            }
            if let Ok(b) = RoaringBitmap::deserialize_from(r.ids.as_slice()) {
                set |= b;
            }
        }
        for (attr, out) in &loaded.absent {
            if !rs.iter().any(|r| r.attribute == *attr) {
                for (x, y) in f.iter_mut().zip(&out.filter) {
                    *x |= y;
                }
                set |= &out.ids;
            }
        }
        ids.push(set);
    }
    let mut cands: Vec<Vec<u32>> = vec![Vec::new(); objs.len()];
    match &loaded.subset {
        Some(m) => {
            let mut m = lock(m);
            for batch in m.candidates(&[&filters]) {
                for (o, rec) in batch {
                    cands[o as usize].push(rec);
                }
            }
        }
        // no GPU: the records whose access predicate the tests satisfied (a CPU Bloom scan
        // visits every conjunction for every object)
        None => {
            let mut by_ids = true;
            for (c, set) in cands.iter_mut().zip(&ids) {
                if !base.id_candidates(set, c) {
                    by_ids = false; // built without test ids: nothing was added
                    break;
                }
            }
            if !by_ids {
                base.bloom_candidates(&filters, |o, rec| cands[o].push(rec));
            }
        }
    }
    objs.iter()
        .enumerate()
        .map(|(o, (i, _))| {
            let subs = base
                .verified_subscriptions(&cands[o], &ids[o])
                .unwrap_or_default();
            (*i, subs)
        })
        .collect()
}

#[tonic::async_trait]
impl v1::daemon_server::Daemon for Daemon {
    async fn hello(
        &self,
        request: Request<v1::HelloRequest>,
    ) -> Result<Response<v1::HelloResponse>, Status> {
        let theirs = request.into_inner().nonce;
        let ours = self.inner.nonce.load(Ordering::Acquire);
        if theirs != ours {
            self.inner.reregister.notify_one();
        }
        Ok(Response::new(v1::HelloResponse { nonce: ours }))
    }

    async fn assign(
        &self,
        request: Request<v1::AssignRequest>,
    ) -> Result<Response<v1::AssignResponse>, Status> {
        let req = request.into_inner();
        let tx = {
            let mut ws = lock(&self.inner.workers);
            let slot = ws
                .get_mut(&req.worker)
                .ok_or_else(|| ServiceError::NotFound(format!("worker {:x}", req.worker)))?;
            slot.busy = true;
            slot.tx.clone()
        };
        let worker = req.worker;
        if let Err(e) = tx.try_send(req) {
            // not taken: the worker stays idle (the coordinator treats it as gone)
            if let Some(slot) = lock(&self.inner.workers).get_mut(&worker) {
                slot.busy = false;
            }
            return Err(Status::resource_exhausted(format!("worker queue: {e}")));
        }
        Ok(Response::new(v1::AssignResponse {}))
    }

    async fn fetch(
        &self,
        request: Request<v1::FetchRequest>,
    ) -> Result<Response<v1::FetchResponse>, Status> {
        let req = request.into_inner();
        let keys: HashSet<u64> = req.keys.iter().copied().collect();
        let (rs, missing) = self.take_results(req.nonce, &req.tasks, &keys);
        Ok(Response::new(v1::FetchResponse {
            results: rs.iter().map(|r| (**r).clone()).collect(),
            missing,
        }))
    }

    async fn matched(
        &self,
        request: Request<v1::MatchedRequest>,
    ) -> Result<Response<v1::MatchedResponse>, Status> {
        self.handoff(request.into_inner()).await?;
        Ok(Response::new(v1::MatchedResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::lane_switch;

    #[test]
    fn the_bulk_lane_turns_on_with_a_backlog_and_off_after_200_ms_of_calm() {
        let mut calm = 0;
        assert!(!lane_switch(false, 10, &mut calm), "no backlog");
        assert!(!lane_switch(false, 200, &mut calm), "below the threshold");
        assert!(lane_switch(false, 5_000, &mut calm), "a backlog");
        // a dip inside an overload does not turn it off
        let mut on = true;
        for _ in 0..9 {
            on = lane_switch(on, 10, &mut calm);
            assert!(on);
        }
        on = lane_switch(on, 200, &mut calm);
        assert!(on, "between the thresholds: calm starts over");
        for _ in 0..9 {
            on = lane_switch(on, 10, &mut calm);
            assert!(on);
        }
        assert!(!lane_switch(on, 10, &mut calm), "200 ms of calm");
    }
}
