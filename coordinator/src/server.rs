//! The coordinator process: the gRPC `Cluster` service for node daemons, the public
//! `Subscriptions` service over the cluster's registry, and `Admin`. One driver task owns the
//! sans-I/O [`Coordinator`]: gRPC handlers send it messages, a ticker closes batches and finds
//! overdue tasks, and its actions become `Daemon` calls to the nodes.
//!
//! The driver also keeps what the state machine does not need to decide but the workers need
//! to run: each in-flight object's values (test tasks carry them), the image version it is
//! matched against, and where its test results are cached (match tasks carry that). A match
//! worker that cannot collect an object's results reports it, and the object is tested again.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::registry::Registry;
use proto::v1;
use proto::v1::daemon_client::DaemonClient;
use runtime::link::{ToCoordinator, ToNode};
use runtime::metrics::MetricsSource;
use runtime::serve::internal;
use runtime::subscriptions::Subscriptions;
use runtime::{Limits, ServiceError};
use storage::Store;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::{Action, Block, Config, Coordinator, Event, ObjectKey, TaskId, WorkerId};

/// Settings of the coordinator process.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub sched: Config,
    /// How often batches are checked for their deadline and tasks for being overdue.
    pub tick: Duration,
    /// Subscription changes are published as a new image version once none came for
    /// `publish_quiet`, or `publish_max_delay` after the first at the latest.
    pub publish_quiet: Duration,
    pub publish_max_delay: Duration,
    /// An object whose test results went missing this many times is left to its node's
    /// outbox resend.
    pub max_attempts: u32,
    /// What the internal `Cluster` service demands and calls to nodes carry.
    pub cluster_secret: runtime::cluster_secret::ClusterSecret,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            sched: Config::default(),
            tick: Duration::from_millis(2),
            publish_quiet: Duration::from_millis(50),
            publish_max_delay: Duration::from_millis(1000),
            max_attempts: 5,
            cluster_secret: runtime::cluster_secret::ClusterSecret::default(),
        }
    }
}

/// A block as the wire spells it.
pub fn block_name(b: &Block) -> String {
    match b {
        Block::Empty => "empty".into(),
        Block::Test(a) => format!("test:{a}"),
        Block::Match => "match".into(),
    }
}

/// Parses a block name; unknown names are empty workers.
pub fn parse_block(s: &str) -> Block {
    match s {
        "match" => Block::Match,
        _ => match s.strip_prefix("test:") {
            Some(a) => Block::Test(a.to_string()),
            None => Block::Empty,
        },
    }
}

enum Msg {
    Register(v1::RegisterRequest, oneshot::Sender<u64>),
    Heartbeat(v1::HeartbeatRequest, oneshot::Sender<u64>),
    Arrived(v1::ArrivedRequest, oneshot::Sender<u32>),
    Done(v1::DoneRequest),
    AssignFailed {
        worker: WorkerId,
        task: TaskId,
    },
    Stats(oneshot::Sender<v1::ClusterStats>),
    Workers(oneshot::Sender<Vec<v1::WorkerInfo>>),
    /// The node daemon sharing this process (embedded mode).
    Local(Arc<dyn v1::daemon_server::Daemon>),
}

#[derive(Debug)]
struct Obj {
    id: v1::ObjectId,
    priority: u8,
    attrs: Vec<(String, v1::Value)>,
    version: u64,
    /// (test task, worker) that hold this object's test results.
    sources: Vec<(TaskId, WorkerId)>,
    attempts: u32,
    received_unix_ms: u64,
}

struct NodeInfo {
    endpoint: String,
    client: ToNode,
}

#[derive(Debug, Default)]
struct Counters {
    messages: AtomicU64,
    arrived: AtomicU64,
    matched: AtomicU64,
    loads: AtomicU64,
}

struct Driver {
    cfg: ServerConfig,
    sched: Coordinator,
    nonce: u64,
    t0: Instant,
    registry: Registry,
    nodes: HashMap<u32, NodeInfo>,
    worker_node: HashMap<WorkerId, u32>,
    objects: HashMap<ObjectKey, Obj>,
    by_id: HashMap<(u32, u64), ObjectKey>,
    running: HashMap<TaskId, (WorkerId, Block, Vec<ObjectKey>)>,
    next_key: ObjectKey,
    counters: Arc<Counters>,
    tx: mpsc::Sender<Msg>,
    local: Option<Arc<dyn v1::daemon_server::Daemon>>,
    /// Put -> matched latencies (ms) of the last matched objects, a ring.
    latencies: Vec<u32>,
    latency_next: usize,
}

const LATENCY_SAMPLES: usize = 100_000;

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64
}

impl Driver {
    fn now(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut tick = tokio::time::interval(self.cfg.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => self.handle(m),
                    None => return,
                },
                _ = tick.tick() => self.step(Event::Tick),
            }
        }
    }

    fn step(&mut self, e: Event) {
        let now = self.now();
        let actions = self.sched.step(now, e);
        for a in actions {
            self.act(a);
        }
    }

    fn join(&mut self, node: u32, w: &v1::WorkerState) {
        self.worker_node.insert(w.worker, node);
        self.step(Event::WorkerJoined {
            worker: w.worker,
            node,
            block: parse_block(&w.block),
        });
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Register(r, reply) => {
                self.counters.messages.fetch_add(1, Ordering::Relaxed);
                let known = self.nodes.get(&r.node).map(|n| n.endpoint.as_str());
                if r.endpoint == runtime::link::LOCAL_ENDPOINT {
                    let Some(local) = self.local.clone() else {
                        tracing::warn!("node {} claims to share this process", r.node);
                        let _ = reply.send(self.nonce);
                        return;
                    };
                    self.nodes.insert(
                        r.node,
                        NodeInfo {
                            endpoint: r.endpoint.clone(),
                            client: ToNode::Local(local),
                        },
                    );
                } else if known != Some(r.endpoint.as_str()) {
                    match runtime::channel(&r.endpoint) {
                        Ok(ch) => {
                            let client = ToNode::Grpc(
                                DaemonClient::with_interceptor(ch, self.cfg.cluster_secret.stamp())
                                    .max_decoding_message_size(1 << 30)
                                    .max_encoding_message_size(1 << 30),
                            );
                            self.nodes.insert(
                                r.node,
                                NodeInfo {
                                    endpoint: r.endpoint.clone(),
                                    client,
                                },
                            );
                        }
                        Err(e) => {
                            tracing::warn!("node {} registered a bad endpoint: {e}", r.node);
                            let _ = reply.send(self.nonce);
                            return;
                        }
                    }
                }
                tracing::info!(
                    "node {} registered at {} with {} workers",
                    r.node,
                    r.endpoint,
                    r.workers.len()
                );
                for w in &r.workers {
                    self.join(r.node, w);
                }
                let _ = reply.send(self.nonce);
            }
            Msg::Heartbeat(h, reply) => {
                self.counters.messages.fetch_add(1, Ordering::Relaxed);
                if h.nonce == self.nonce && self.nodes.contains_key(&h.node) {
                    for w in &h.started {
                        if !self.sched.has_worker(w.worker) {
                            self.join(h.node, w);
                        }
                    }
                    for &w in &h.terminated {
                        self.step(Event::WorkerLeft { worker: w });
                        self.worker_node.remove(&w);
                    }
                    for w in &h.workers {
                        if self.sched.has_worker(w.worker) {
                            self.step(Event::Heartbeat { worker: w.worker });
                        } else if !self.sched.is_dead(w.worker) && !h.terminated.contains(&w.worker)
                        {
                            self.join(h.node, w);
                        }
                    }
                    let _ = reply.send(self.nonce);
                } else {
                    // a node of an earlier coordinator (or unknown): it registers again
                    let _ = reply.send(self.nonce);
                }
            }
            Msg::Arrived(a, reply) => {
                self.counters.messages.fetch_add(1, Ordering::Relaxed);
                let published = self.registry.published();
                let mut accepted = 0;
                for o in a.objects {
                    let Some(id) = o.id else { continue };
                    if self.by_id.contains_key(&(id.node, id.seq)) {
                        continue; // in flight already (a resend)
                    }
                    let attrs: Vec<(String, v1::Value)> = o
                        .metadata
                        .into_iter()
                        .filter(|at| published.attributes.contains(&at.name))
                        .filter_map(|at| at.value.map(|v| (at.name, v)))
                        .collect();
                    accepted += 1;
                    self.admit(Obj {
                        id,
                        priority: o.priority.min(7) as u8,
                        attrs,
                        version: published.version,
                        sources: Vec::new(),
                        attempts: 0,
                        received_unix_ms: o.received_unix_ms,
                    });
                }
                self.counters
                    .arrived
                    .fetch_add(accepted as u64, Ordering::Relaxed);
                let _ = reply.send(accepted);
            }
            Msg::Done(d) => {
                self.counters.messages.fetch_add(1, Ordering::Relaxed);
                if d.nonce != self.nonce {
                    return; // a task of an earlier coordinator
                }
                // a late report from a worker whose task was reassigned records nothing
                if self.running.get(&d.task).is_some_and(|r| r.0 == d.worker)
                    && let Some((w, block, keys)) = self.running.remove(&d.task)
                {
                    self.task_finished(d.task, w, &block, keys, &d.failed);
                }
                self.step(Event::TaskDone {
                    worker: d.worker,
                    task: d.task,
                    block: parse_block(&d.block),
                });
            }
            Msg::AssignFailed { worker, task } => {
                if self.running.get(&task).is_some_and(|r| r.0 == worker) {
                    tracing::info!("worker {worker:x} did not take task {task}: leaves");
                    self.step(Event::WorkerLeft { worker });
                }
            }
            Msg::Local(d) => self.local = Some(d),
            Msg::Stats(reply) => {
                let _ = reply.send(self.stats());
            }
            Msg::Workers(reply) => {
                let list = self
                    .sched
                    .worker_list()
                    .into_iter()
                    .map(|(id, node, block, busy)| v1::WorkerInfo {
                        id: format!("{id:x}"),
                        block: block_name(&block),
                        state: if busy { "busy" } else { "idle" }.into(),
                        node,
                    })
                    .collect();
                let _ = reply.send(list);
            }
        }
    }

    /// Records what a finished task produced: where test results are cached, or which
    /// objects are matched (and which must be tested again).
    fn task_finished(
        &mut self,
        task: TaskId,
        worker: WorkerId,
        block: &Block,
        keys: Vec<ObjectKey>,
        failed: &[ObjectKey],
    ) {
        if *block != Block::Match {
            for k in keys {
                if let Some(o) = self.objects.get_mut(&k) {
                    o.sources.push((task, worker));
                }
            }
            return;
        }
        for k in keys {
            if failed.contains(&k) {
                self.retry(k);
            } else if let Some(o) = self.objects.remove(&k) {
                self.by_id.remove(&(o.id.node, o.id.seq));
                self.counters.matched.fetch_add(1, Ordering::Relaxed);
                let ms = runtime::now_ms().saturating_sub(o.received_unix_ms) as u32;
                if self.latencies.len() < LATENCY_SAMPLES {
                    self.latencies.push(ms);
                } else {
                    self.latencies[self.latency_next % LATENCY_SAMPLES] = ms;
                }
                self.latency_next += 1;
            }
        }
    }

    fn admit(&mut self, o: Obj) {
        let key = self.next_key;
        self.next_key += 1;
        let attrs = o.attrs.iter().map(|(n, _)| n.clone()).collect();
        let priority = o.priority;
        self.by_id.insert((o.id.node, o.id.seq), key);
        self.objects.insert(key, o);
        self.step(Event::ObjectArrived {
            object: key,
            priority,
            attrs,
        });
    }

    /// Tests an object again (its results went missing), against the newest version.
    fn retry(&mut self, key: ObjectKey) {
        let Some(mut o) = self.objects.remove(&key) else {
            return;
        };
        self.by_id.remove(&(o.id.node, o.id.seq));
        o.attempts += 1;
        if o.attempts >= self.cfg.max_attempts {
            tracing::warn!(
                "object {}:{} failed {} times; left to its node's outbox resend",
                o.id.node,
                o.id.seq,
                o.attempts
            );
            return;
        }
        let published = self.registry.published();
        o.version = published.version;
        o.attrs.retain(|(n, _)| published.attributes.contains(n));
        o.sources.clear();
        self.admit(o);
    }

    fn act(&mut self, a: Action) {
        match a {
            Action::Assign {
                worker,
                task,
                block,
                objects,
                load,
                priority,
            } => {
                let Some(node) = self
                    .worker_node
                    .get(&worker)
                    .and_then(|n| self.nodes.get(n))
                else {
                    let _ = self.tx.try_send(Msg::AssignFailed { worker, task });
                    self.running.insert(task, (worker, block, objects));
                    return;
                };
                let mut req = v1::AssignRequest {
                    nonce: self.nonce,
                    worker,
                    task,
                    block: block_name(&block),
                    load: load.is_some(),
                    tests: Vec::new(),
                    matches: Vec::new(),
                    priority: u32::from(priority),
                };
                match &block {
                    Block::Test(attr) => {
                        for k in &objects {
                            if let Some(o) = self.objects.get(k)
                                && let Some((_, v)) = o.attrs.iter().find(|(n, _)| n == attr)
                            {
                                req.tests.push(v1::TestItem {
                                    key: *k,
                                    value: Some(v.clone()),
                                    version: o.version,
                                });
                            }
                        }
                    }
                    Block::Match => {
                        for k in &objects {
                            let Some(o) = self.objects.get(k) else {
                                continue;
                            };
                            let endpoint = |w: &WorkerId| {
                                self.worker_node
                                    .get(w)
                                    .and_then(|n| self.nodes.get(n))
                                    .map(|n| n.endpoint.clone())
                                    .unwrap_or_default()
                            };
                            req.matches.push(v1::MatchItem {
                                key: *k,
                                id: Some(o.id),
                                origin: self
                                    .nodes
                                    .get(&o.id.node)
                                    .map(|n| n.endpoint.clone())
                                    .unwrap_or_default(),
                                version: o.version,
                                sources: o
                                    .sources
                                    .iter()
                                    .map(|(t, w)| v1::Source {
                                        task: *t,
                                        endpoint: endpoint(w),
                                    })
                                    .collect(),
                            });
                        }
                    }
                    Block::Empty => {}
                }
                if load.is_some() {
                    self.counters.loads.fetch_add(1, Ordering::Relaxed);
                }
                self.counters.messages.fetch_add(1, Ordering::Relaxed);
                let client = node.client.clone();
                let tx = self.tx.clone();
                self.running.insert(task, (worker, block, objects));
                tokio::spawn(async move {
                    if let Err(e) = client.assign(req).await {
                        tracing::debug!("assigning task {task} to {worker:x}: {e}");
                        let _ = tx.send(Msg::AssignFailed { worker, task }).await;
                    }
                });
            }
            Action::Hello { nonce } => {
                for n in self.nodes.values() {
                    self.counters.messages.fetch_add(1, Ordering::Relaxed);
                    let c = n.client.clone();
                    tokio::spawn(async move {
                        let _ = c.hello(v1::HelloRequest { nonce }).await;
                    });
                }
            }
            Action::Reassigned { task, from } => {
                tracing::info!("task {task} taken back from worker {from:x}");
            }
            Action::WorkerDead { worker } => {
                tracing::info!("worker {worker:x} judged dead");
                self.worker_node.remove(&worker);
            }
        }
    }

    fn stats(&self) -> v1::ClusterStats {
        let snap = self.sched.snapshot();
        let published = self.registry.published();
        let mut workers = HashMap::new();
        for (b, n) in &snap.idle {
            workers.insert(format!("idle {}", block_name(b)), *n as u64);
        }
        for (b, n) in &snap.busy {
            workers.insert(format!("busy {}", block_name(b)), *n as u64);
        }
        let mut lat = self.latencies.clone();
        lat.sort_unstable();
        v1::ClusterStats {
            match_latency_p50_ms: percentile(&lat, 0.5),
            match_latency_p99_ms: percentile(&lat, 0.99),
            nonce: self.nonce,
            image_version: published.version,
            image_subscriptions: published.subscriptions as u64,
            nodes: self.nodes.len() as u32,
            waiting_tasks: snap.waiting_tasks as u64,
            open_batches: snap.open_batches as u64,
            mean_test_ms: snap.mean_test_ms,
            mean_match_ms: snap.mean_match_ms,
            reassignments: snap.reassignments,
            dead_workers: snap.dead_workers,
            objects_arrived: self.counters.arrived.load(Ordering::Relaxed),
            objects_matched: self.counters.matched.load(Ordering::Relaxed),
            objects_in_flight: self.objects.len() as u64,
            messages: self.counters.messages.load(Ordering::Relaxed),
            loads: self.counters.loads.load(Ordering::Relaxed),
            workers,
        }
    }
}

/// The `Cluster` and `Admin` services: they hand everything to the driver.
#[derive(Debug, Clone)]
struct Handle {
    tx: mpsc::Sender<Msg>,
    registry: Registry,
    store: Store,
}

impl Handle {
    async fn ask<T>(&self, m: impl FnOnce(oneshot::Sender<T>) -> Msg) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(m(tx))
            .await
            .map_err(|_| Status::unavailable("the coordinator is shutting down"))?;
        rx.await
            .map_err(|_| Status::unavailable("the coordinator is shutting down"))
    }
}

#[tonic::async_trait]
impl v1::cluster_server::Cluster for Handle {
    async fn register(
        &self,
        request: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::RegisterResponse>, Status> {
        let r = request.into_inner();
        if r.endpoint.is_empty() {
            return Err(ServiceError::invalid("endpoint", "required").into());
        }
        let nonce = self.ask(|tx| Msg::Register(r, tx)).await?;
        Ok(Response::new(v1::RegisterResponse { nonce }))
    }

    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        let r = request.into_inner();
        let nonce = self.ask(|tx| Msg::Heartbeat(r, tx)).await?;
        Ok(Response::new(v1::HeartbeatResponse { nonce }))
    }

    async fn arrived(
        &self,
        request: Request<v1::ArrivedRequest>,
    ) -> Result<Response<v1::ArrivedResponse>, Status> {
        let r = request.into_inner();
        let accepted = self.ask(|tx| Msg::Arrived(r, tx)).await?;
        Ok(Response::new(v1::ArrivedResponse { accepted }))
    }

    async fn done(
        &self,
        request: Request<v1::DoneRequest>,
    ) -> Result<Response<v1::DoneResponse>, Status> {
        self.tx
            .send(Msg::Done(request.into_inner()))
            .await
            .map_err(|_| Status::unavailable("the coordinator is shutting down"))?;
        Ok(Response::new(v1::DoneResponse {}))
    }

    async fn subscription(
        &self,
        request: Request<v1::SubscriptionRecordRequest>,
    ) -> Result<Response<v1::Subscription>, Status> {
        let s = runtime::subscriptions::stored_subscription(&self.store, request.into_inner().id)?;
        Ok(Response::new(s))
    }

    async fn image(
        &self,
        request: Request<v1::ImageRequest>,
    ) -> Result<Response<v1::ImageResponse>, Status> {
        let v = request.into_inner().version;
        let reg = self.registry.clone();
        let img = tokio::task::spawn_blocking(move || reg.image(v))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        match img {
            Some((version, image)) => Ok(Response::new(v1::ImageResponse { version, image })),
            None => Err(ServiceError::NotFound(format!("image version {v}")).into()),
        }
    }
}

#[tonic::async_trait]
impl v1::admin_server::Admin for Handle {
    async fn dead_letters(
        &self,
        _request: Request<v1::DeadLettersRequest>,
    ) -> Result<Response<v1::DeadLettersResponse>, Status> {
        Err(Status::failed_precondition(
            "the coordinator holds no deliveries: ask the nodes (dead letters live on the node \
             that took the write)",
        ))
    }

    async fn redrive(
        &self,
        _request: Request<v1::RedriveRequest>,
    ) -> Result<Response<v1::RedriveResponse>, Status> {
        Err(Status::failed_precondition(
            "the coordinator holds no deliveries: ask the nodes (dead letters live on the node \
             that took the write)",
        ))
    }

    async fn stats(
        &self,
        _request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        let cluster = self.ask(Msg::Stats).await?;
        Ok(Response::new(v1::StatsResponse {
            node: 0,
            role: "coordinator".into(),
            subscriptions: self.store.subscription_count() as u64,
            cluster: Some(cluster),
            ..v1::StatsResponse::default()
        }))
    }

    async fn workers(
        &self,
        _request: Request<v1::WorkersRequest>,
    ) -> Result<Response<v1::WorkersResponse>, Status> {
        let workers = self.ask(Msg::Workers).await?;
        Ok(Response::new(v1::WorkersResponse { workers }))
    }
}

/// The coordinator's running parts: the driver and publisher tasks and the services.
#[derive(Debug)]
pub struct Started {
    handle: Handle,
    registry: Registry,
    store: Store,
    limits: Limits,
    cluster_secret: runtime::cluster_secret::ClusterSecret,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Started {
    /// The `Cluster` service, for a node daemon in the same process.
    pub fn link(&self) -> ToCoordinator {
        ToCoordinator::Local(Arc::new(self.handle.clone()))
    }

    /// Tells the coordinator about the node daemon in the same process (before it registers
    /// with [`runtime::link::LOCAL_ENDPOINT`]).
    pub async fn set_local(&self, d: Arc<dyn v1::daemon_server::Daemon>) {
        let _ = self.handle.tx.send(Msg::Local(d)).await;
    }

    /// The public `Subscriptions` service over the registry.
    pub fn subscriptions(&self) -> Subscriptions {
        Subscriptions::new(
            self.store.clone(),
            self.limits,
            Arc::new(self.registry.clone()),
        )
    }

    /// Cluster counters for the admin API.
    pub async fn cluster_stats(&self) -> Result<v1::ClusterStats, Status> {
        self.handle.ask(Msg::Stats).await
    }

    /// Every worker of the cluster.
    pub async fn workers(&self) -> Result<Vec<v1::WorkerInfo>, Status> {
        self.handle.ask(Msg::Workers).await
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts the coordinator over `store`: loads the registry (subscriptions and their images),
/// spawns the publisher and the driver.
pub async fn start(
    store: Store,
    limits: Limits,
    cfg: ServerConfig,
) -> Result<Started, ServiceError> {
    let registry = Registry::load(store.clone(), &limits).await?;
    let publisher = tokio::spawn(
        registry
            .clone()
            .publisher(cfg.publish_quiet, cfg.publish_max_delay),
    );
    let nonce = runtime::random_u64() | 1;
    tracing::info!("coordinator nonce {nonce:016x}");
    let (tx, rx) = mpsc::channel(8192);
    let sched = cfg.sched;
    let cluster_secret = cfg.cluster_secret.clone();
    let driver = Driver {
        cfg,
        sched: Coordinator::new(sched, nonce, 0),
        nonce,
        t0: Instant::now(),
        registry: registry.clone(),
        nodes: HashMap::new(),
        worker_node: HashMap::new(),
        objects: HashMap::new(),
        by_id: HashMap::new(),
        running: HashMap::new(),
        next_key: 1,
        counters: Arc::new(Counters::default()),
        tx: tx.clone(),
        local: None,
        latencies: Vec::new(),
        latency_next: 0,
    };
    let driver = tokio::spawn(driver.run(rx));
    Ok(Started {
        handle: Handle {
            tx,
            registry: registry.clone(),
            store: store.clone(),
        },
        registry,
        store,
        limits,
        cluster_secret,
        tasks: vec![publisher, driver],
    })
}

/// Runs the coordinator on `listener` until `shutdown` resolves: the registry over `store`
/// (subscriptions and their images), the driver, and the gRPC services.
pub async fn serve(
    listener: runtime::listen::Listener,
    store: Store,
    limits: Limits,
    cfg: ServerConfig,
    metrics: Option<TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let started = start(store, limits, cfg).await?;
    let metrics = metrics.map(|l| {
        (
            l,
            MetricsSource {
                admin: Arc::new(started.handle.clone()),
                deliveries: None,
            },
        )
    });
    let check = started.cluster_secret.check();
    runtime::serve::serve(
        listener,
        runtime::COORDINATOR_SERVICES,
        metrics,
        |r| {
            r.add_service(internal(
                v1::cluster_server::ClusterServer::new(started.handle.clone())
                    .max_decoding_message_size(1 << 30)
                    .max_encoding_message_size(1 << 30),
                check,
            ))
            .add_service(v1::subscriptions_server::SubscriptionsServer::new(
                started.subscriptions(),
            ))
            .add_service(v1::admin_server::AdminServer::new(started.handle.clone()))
        },
        shutdown,
    )
    .await
}
