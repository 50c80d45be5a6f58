//! The coordinator process: the gRPC `Cluster` service for node daemons, the public
//! `Subscriptions` service over the cluster's registry, and `Admin`. One driver task owns the
//! sans-I/O [`Protocol`]: gRPC handlers send it messages, a ticker closes batches and finds
//! overdue tasks, and its actions become `Daemon` calls to the nodes.
//!
//! The driver decides nothing about the protocol: every decision (nonces, resends, attribute
//! filtering, late reports, retries) is the sans-I/O [`Protocol`]'s. The driver owns the links
//! to the nodes, feeds in what arrives (with the registry's newest published version), and
//! sends what comes out.

use std::collections::HashMap;
use std::sync::Arc;
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

use crate::protocol::{Call, Output, Protocol};

mod admin;
mod resize;
mod stats;
use crate::{Config, TaskId, WorkerId};

/// Settings of the coordinator process.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub sched: Config,
    /// How often batches are checked for their deadline and tasks for being overdue.
    pub tick: Duration,
    /// An object whose test results went missing this many times is left to its node's
    /// outbox resend.
    pub max_attempts: u32,
    /// What the internal `Cluster` service demands and calls to nodes carry.
    pub cluster_secret: runtime::cluster_secret::ClusterSecret,
    /// The grid of quorum replication (`--grid TxW`): node ids are its positions. `None`:
    /// objects live on the node that took them.
    pub grid: Option<runtime::grid::Grid>,
    /// The grid an online resize under way moves to (etcd's record, for a new leader).
    pub resizing: Option<runtime::grid::Grid>,
    /// An elected leader (`--etcd`): it acts only while its fence holds.
    pub elected: Option<ElectedRole>,
}

/// What an elected coordinator leads with.
#[derive(Debug, Clone)]
pub struct ElectedRole {
    /// Holds while this coordinator surely leads: nothing goes out to nodes, and no node is
    /// answered as if this one led, once it does not.
    pub fence: runtime::election::Fence,
    /// The leadership's epoch: image versions and subscription ids start at `epoch << 32`.
    pub epoch: u64,
    /// This coordinator's name in the leader key.
    pub name: String,
    /// Where node records go when nodes register.
    pub etcd: runtime::etcd::Etcd,
    /// The nodes etcd says are up: taken as registered (no workers yet) from the start.
    pub live: Vec<crate::rebuild::NodeRecord>,
    /// The registry is the one kept while standing by (`crate::tail`), not a rebuild.
    pub registry_kept: bool,
    /// Milliseconds from winning the election to the registry being ready.
    pub registry_ready_ms: u64,
}

impl ElectedRole {
    /// The first number this leadership hands out (versions, subscription ids).
    pub fn floor(&self) -> u64 {
        self.epoch << 32
    }
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            sched: Config::default(),
            tick: Duration::from_millis(2),
            max_attempts: 5,
            cluster_secret: runtime::cluster_secret::ClusterSecret::default(),
            grid: None,
            resizing: None,
            elected: None,
        }
    }
}

pub use crate::protocol::{block_name, parse_block};

enum Msg {
    /// Answered with the nonce and membership, or why the registration is refused (a live
    /// node holds the position already, or it is outside the grid).
    Register(
        v1::RegisterRequest,
        oneshot::Sender<Result<(u64, v1::Membership), Status>>,
    ),
    Heartbeat(v1::HeartbeatRequest, oneshot::Sender<(u64, v1::Membership)>),
    Arrived(v1::ArrivedRequest, oneshot::Sender<u32>),
    Done(v1::DoneRequest),
    AssignFailed {
        worker: WorkerId,
        task: TaskId,
    },
    Stats(oneshot::Sender<v1::ClusterStats>),
    /// The grid, the nodes' liveness and this leader, for `Admin.Stats`.
    View(oneshot::Sender<v1::ClusterView>),
    Workers(oneshot::Sender<Vec<v1::WorkerInfo>>),
    /// The node daemon sharing this process (embedded mode).
    Local(Arc<runtime::link::LocalDaemon>),
    /// An online resize: checked, started, asked where it stands (`server::resize`).
    Resize(resize::Ask),
}

/// How the driver reaches one registered node.
struct NodeInfo {
    endpoint: String,
    client: ToNode,
}

/// The driver: owns the [`Protocol`], feeds it what arrives, sends what it asks for. It
/// decides nothing about the protocol itself.
struct Driver {
    cfg: ServerConfig,
    protocol: Protocol,
    t0: Instant,
    registry: Registry,
    nodes: HashMap<u32, NodeInfo>,
    tx: mpsc::Sender<Msg>,
    local: Option<Arc<runtime::link::LocalDaemon>>,
    /// Put -> matched latencies (ms) of the last matched objects, a ring.
    latencies: Vec<u32>,
    latency_next: usize,
    /// The same latencies since the start, for `/metrics`.
    match_latency: Arc<runtime::histogram::Histogram>,
    /// An elected leader unsure of its lease (since then): the protocol's clock stands
    /// still and what it asks to send waits in `held_back`.
    suspended: Option<Instant>,
    /// Time spent suspended before, left out of the protocol's clock.
    paused: Duration,
    held_back: Vec<Output>,
    /// A resize's commit is being recorded in etcd.
    committing: bool,
}

/// Outputs held back while unsure of the lease, at most (beyond: dropped; the protocol's
/// timeouts and the nodes' outbox resends make up for them).
const HELD_BACK_LIMIT: usize = 1 << 20;

const LATENCY_SAMPLES: usize = 100_000;

impl Driver {
    /// The protocol's clock: it stands still while this leader is unsure of its lease, so
    /// no lease or timeout of the protocol runs out because etcd was away.
    fn now(&self) -> u64 {
        let end = self.suspended.unwrap_or_else(Instant::now);
        end.saturating_duration_since(self.t0)
            .saturating_sub(self.paused)
            .as_millis() as u64
    }

    /// Whether this coordinator surely leads (always, unless elected); notes a suspension
    /// beginning, and at its end sends what was held back.
    fn leading(&mut self) -> bool {
        let Some(e) = &self.cfg.elected else {
            return true;
        };
        let held = e.fence.held();
        match (held, self.suspended) {
            (false, None) => {
                tracing::warn!("unsure of the leader lease: sending nothing until etcd answers");
                self.suspended = Some(Instant::now());
            }
            (true, Some(at)) => {
                self.paused += at.elapsed();
                self.suspended = None;
                let out = std::mem::take(&mut self.held_back);
                tracing::info!(
                    "the lease held: leading on after {} ms, sending {} held-back messages",
                    at.elapsed().as_millis(),
                    out.len()
                );
                self.send(out);
            }
            _ => {}
        }
        held
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
                _ = tick.tick() => {
                    if self.leading() {
                        let out = self.protocol.tick(self.now());
                        self.send(out);
                    }
                }
            }
        }
    }

    /// A link to a registering node (in this process, or a lazily connected channel); `None`
    /// when its endpoint is no good (it is not registered).
    fn link(&self, r: &v1::RegisterRequest) -> Option<ToNode> {
        if let Some(n) = self.nodes.get(&r.node)
            && n.endpoint == r.endpoint
        {
            return Some(n.client.clone());
        }
        if r.endpoint == runtime::link::LOCAL_ENDPOINT {
            let local = self.local.clone();
            if local.is_none() {
                tracing::warn!("node {} claims to share this process", r.node);
            }
            return local.map(ToNode::Local);
        }
        match runtime::channel(&r.endpoint) {
            Ok(ch) => Some(ToNode::Grpc(
                DaemonClient::with_interceptor(ch, self.cfg.cluster_secret.stamp())
                    .max_decoding_message_size(1 << 30)
                    .max_encoding_message_size(1 << 30),
            )),
            Err(e) => {
                tracing::warn!("node {} registered a bad endpoint: {e}", r.node);
                None
            }
        }
    }

    fn handle(&mut self, m: Msg) {
        let now = self.now();
        match m {
            Msg::Register(r, reply) => {
                if let Some(g) = self.protocol.layout()
                    && !g.contains(r.node)
                {
                    let why = format!(
                        "{} is outside the {g} grid (positions 0..{})",
                        r.node,
                        g.len()
                    );
                    let _ = reply.send(Err(ServiceError::invalid("node", why).into()));
                    return;
                }
                if let Some(holder) = self.protocol.position_held(now, r.node, &r.endpoint) {
                    let _ = reply.send(Err(Status::already_exists(format!(
                        "node: grid position {} is held by a live node at {holder}; start \
                         this one at a free position, or wait until that one's lease runs out",
                        r.node
                    ))));
                    return;
                }
                let Some(client) = self.link(&r) else {
                    let _ = reply.send(Ok((self.protocol.nonce(), self.protocol.membership(now))));
                    return;
                };
                self.nodes.insert(
                    r.node,
                    NodeInfo {
                        endpoint: r.endpoint.clone(),
                        client,
                    },
                );
                tracing::info!(
                    "node {} registered at {} with {} workers",
                    r.node,
                    r.endpoint,
                    r.workers.len()
                );
                if let Some(e) = &self.cfg.elected {
                    let etcd = e.etcd.clone();
                    let rec = crate::rebuild::NodeRecord {
                        node: r.node,
                        endpoint: r.endpoint.clone(),
                        owns_from: r.owns_from,
                        sig: String::new(),
                    };
                    let secret = self.cfg.cluster_secret.clone();
                    tokio::spawn(async move {
                        if let Err(e) = crate::rebuild::record_node(&etcd, &rec, &secret).await {
                            tracing::warn!("recording node {} in etcd: {e}", rec.node);
                        }
                    });
                }
                let (nonce, out) = self.protocol.register(now, &r);
                let _ = reply.send(Ok((nonce, self.protocol.membership(now))));
                self.send(out);
            }
            Msg::Heartbeat(h, reply) => {
                let (nonce, out) = self.protocol.heartbeat(now, &h);
                self.advance_resize(now);
                let _ = reply.send((nonce, self.protocol.membership(now)));
                self.send(out);
            }
            Msg::Resize(ask) => self.resize(now, ask),
            Msg::Arrived(a, reply) => {
                let published = self.registry.published();
                let (accepted, out) = self.protocol.arrived(now, a, &published);
                let _ = reply.send(accepted);
                self.send(out);
            }
            Msg::Done(d) => {
                let published = self.registry.published();
                let out = self.protocol.done(now, &d, &published);
                self.send(out);
            }
            Msg::AssignFailed { worker, task } => {
                tracing::info!("worker {worker:x} did not take task {task}");
                let out = self.protocol.assign_failed(now, worker, task);
                self.send(out);
            }
            Msg::Local(d) => self.local = Some(d),
            Msg::Stats(reply) => {
                let _ = reply.send(self.stats());
            }
            Msg::View(reply) => {
                let now = self.now();
                let mut v = runtime::console::view_of(&self.protocol.membership(now));
                v.leader_nonce = self.protocol.nonce();
                if let Some(e) = &self.cfg.elected {
                    v.leader_epoch = e.epoch;
                    v.leader_name = e.name.clone();
                }
                let _ = reply.send(v);
            }
            Msg::Workers(reply) => {
                let list = self
                    .protocol
                    .scheduler()
                    .worker_list()
                    .into_iter()
                    .map(|w| v1::WorkerInfo {
                        id: format!("{:x}", w.id),
                        block: block_name(&w.block),
                        state: if w.busy { "busy" } else { "idle" }.into(),
                        node: w.node,
                        urgent: w.urgent,
                    })
                    .collect();
                let _ = reply.send(list);
            }
        }
    }

    /// Carries out what the protocol asked for: calls to nodes (an assignment that fails
    /// comes back as [`Msg::AssignFailed`]) and latency samples.
    fn send(&mut self, out: Vec<Output>) {
        if !self.leading() {
            // unsure of the lease: not one message goes out until it is known to hold
            let room = HELD_BACK_LIMIT.saturating_sub(self.held_back.len());
            if out.len() > room {
                tracing::warn!("{} held-back messages dropped", out.len() - room);
            }
            self.held_back.extend(out.into_iter().take(room));
            return;
        }
        for o in out {
            match o {
                Output::Send { node, call } => {
                    let Some(n) = self.nodes.get(&node) else {
                        continue; // the protocol sends only to registered nodes
                    };
                    let client = n.client.clone();
                    let tx = self.tx.clone();
                    tokio::spawn(async move {
                        match call {
                            Call::Assign(req) => {
                                let (worker, task) = (req.worker, req.task);
                                if let Err(e) = client.assign(req).await {
                                    tracing::debug!("assigning task {task} to {worker:x}: {e}");
                                    let _ = tx.send(Msg::AssignFailed { worker, task }).await;
                                }
                            }
                            Call::Hello(h) => {
                                let _ = client.hello(h).await;
                            }
                        }
                    });
                }
                Output::Matched { received_unix_ms } => {
                    let ms = runtime::now_ms().saturating_sub(received_unix_ms) as u32;
                    self.match_latency
                        .observe(Duration::from_millis(u64::from(ms)));
                    if self.latencies.len() < LATENCY_SAMPLES {
                        self.latencies.push(ms);
                    } else {
                        self.latencies[self.latency_next % LATENCY_SAMPLES] = ms;
                    }
                    self.latency_next += 1;
                }
            }
        }
    }
}

/// The `Cluster` and `Admin` services: they hand everything to the driver.
#[derive(Debug, Clone)]
struct Handle {
    tx: mpsc::Sender<Msg>,
    registry: Registry,
    store: Store,
    fence: Option<runtime::election::Fence>,
    /// Where an elected leader records a resize.
    etcd: Option<runtime::etcd::Etcd>,
    /// An elected leader: whether its registry was kept while standing by, and how long it
    /// took from winning to having it ready (`StatsResponse.registry_kept`).
    registry_ready: Option<(bool, u64)>,
}

impl Handle {
    /// Refuses what only the leader may answer, once this coordinator does not surely lead.
    fn leading(&self) -> Result<(), Status> {
        match &self.fence {
            Some(f) if !f.held() => Err(Status::unavailable(
                "this coordinator is not sure it leads (no answer from etcd within its lease); \
                 try again shortly, or the coordinator the etcd leader key names",
            )),
            _ => Ok(()),
        }
    }

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
        self.leading()?;
        let r = request.into_inner();
        if r.endpoint.is_empty() {
            return Err(ServiceError::invalid("endpoint", "required").into());
        }
        let (nonce, membership) = self.ask(|tx| Msg::Register(r, tx)).await??;
        Ok(Response::new(v1::RegisterResponse {
            nonce,
            membership: Some(membership),
            image_version: self.registry.newest_version(),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        self.leading()?;
        let r = request.into_inner();
        let (nonce, membership) = self.ask(|tx| Msg::Heartbeat(r, tx)).await?;
        Ok(Response::new(v1::HeartbeatResponse {
            nonce,
            membership: Some(membership),
            image_version: self.registry.newest_version(),
        }))
    }

    async fn arrived(
        &self,
        request: Request<v1::ArrivedRequest>,
    ) -> Result<Response<v1::ArrivedResponse>, Status> {
        self.leading()?;
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

    async fn subscription_records(
        &self,
        request: Request<v1::SubscriptionRecordsRequest>,
    ) -> Result<Response<v1::SubscriptionRecordsResponse>, Status> {
        let ids = request.into_inner().ids;
        let most = runtime::subscriptions::MAX_CREATE_MANY;
        if ids.len() > most {
            return Err(ServiceError::invalid(
                "ids",
                format!("{} given, at most {most}", ids.len()),
            )
            .into());
        }
        let mut subscriptions = Vec::with_capacity(ids.len());
        for id in ids {
            match runtime::subscriptions::stored_subscription(&self.store, id) {
                Ok(s) => subscriptions.push(s),
                Err(ServiceError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Response::new(v1::SubscriptionRecordsResponse {
            subscriptions,
        }))
    }

    async fn named(
        &self,
        request: Request<v1::NamedSubscriptionsRequest>,
    ) -> Result<Response<v1::NamedSubscriptionsResponse>, Status> {
        let r = request.into_inner();
        let ids = runtime::subscriptions::named_subscriptions(&self.store, &r.tenant, &r.name)?;
        Ok(Response::new(v1::NamedSubscriptionsResponse { ids }))
    }

    async fn image(
        &self,
        request: Request<v1::ImageRequest>,
    ) -> Result<Response<v1::ImageResponse>, Status> {
        let r = request.into_inner();
        let have_digest = <[u8; 16]>::try_from(r.have_digest.as_slice())
            .ok()
            .map(u128::from_le_bytes);
        match self.registry.serve(r.version, r.have_version, have_digest) {
            // an empty image and delta: the node compiled these subscriptions already (under
            // another version: an earlier leader's, or one before a change that was undone)
            Some(s) => Ok(Response::new(v1::ImageResponse {
                version: s.version,
                image: s.image,
                digest: s.digest.to_le_bytes().to_vec(),
                delta: s.delta,
            })),
            None => Err(ServiceError::NotFound(format!("image version {}", r.version)).into()),
        }
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
    nonce: u64,
    match_latency: Arc<runtime::histogram::Histogram>,
}

impl Started {
    /// Put -> matched latencies, for `/metrics`.
    pub fn match_latency(&self) -> Arc<runtime::histogram::Histogram> {
        self.match_latency.clone()
    }

    /// This coordinator's nonce.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// The `Cluster` service, for a node daemon in the same process.
    pub fn link(&self) -> ToCoordinator {
        ToCoordinator::Local(Arc::new(self.handle.clone()))
    }

    /// Tells the coordinator about the node daemon in the same process (before it registers
    /// with [`runtime::link::LOCAL_ENDPOINT`]).
    pub async fn set_local(&self, d: Arc<runtime::link::LocalDaemon>) {
        let _ = self.handle.tx.send(Msg::Local(d)).await;
    }

    /// The public `Subscriptions` service over the registry.
    pub fn subscriptions(&self) -> Subscriptions {
        let s = Subscriptions::new(
            self.store.clone(),
            self.limits,
            Arc::new(self.registry.clone()),
        );
        if self.handle.fence.is_some() {
            // elected: the next leader knows only the subscriptions the nodes hold copies of
            return s.changes_only_through_nodes(self.cluster_secret.clone());
        }
        s
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
    start_preloaded(store, limits, cfg, None).await
}

/// [`start`], with the registry a standby kept parsed (`crate::tail`).
pub async fn start_preloaded(
    store: Store,
    limits: Limits,
    cfg: ServerConfig,
    preloaded: Option<crate::tail::Preloaded>,
) -> Result<Started, ServiceError> {
    let floor = cfg.elected.as_ref().map_or(0, ElectedRole::floor);
    store.raise_subscription_ids(floor);
    if cfg.elected.is_some() {
        // what this leadership writes to the registry is journaled: the standby's tail
        // that resumes after it sets those ids to the nodes' copies (`crate::tail`)
        store.journal_registry_writes()?;
    }
    let registry = Registry::load_preloaded(store.clone(), &limits, floor, preloaded).await?;
    let publisher = tokio::spawn(registry.clone().publisher());
    let nonce = runtime::random_u64() | 1;
    tracing::info!("coordinator nonce {nonce:016x}");
    let (tx, rx) = mpsc::channel(8192);
    let sched = cfg.sched;
    let cluster_secret = cfg.cluster_secret.clone();
    let grid = cfg.grid;
    let resizing = cfg.resizing;
    let fence = cfg.elected.as_ref().map(|e| e.fence.clone());
    let cfg_etcd = cfg.elected.as_ref().map(|e| e.etcd.clone());
    let registry_ready = cfg
        .elected
        .as_ref()
        .map(|e| (e.registry_kept, e.registry_ready_ms));
    let live = cfg
        .elected
        .as_ref()
        .map(|e| e.live.clone())
        .unwrap_or_default();
    let mut protocol = Protocol::new(sched, nonce, cfg.max_attempts, 0);
    protocol.set_grid(grid);
    protocol.resume_resize(resizing);
    let match_latency = Arc::new(runtime::histogram::Histogram::default());
    let driver = Driver {
        match_latency: match_latency.clone(),
        protocol,
        cfg,
        t0: Instant::now(),
        registry: registry.clone(),
        nodes: HashMap::new(),
        tx: tx.clone(),
        local: None,
        latencies: Vec::new(),
        latency_next: 0,
        suspended: None,
        paused: Duration::ZERO,
        held_back: Vec::new(),
        committing: false,
    };
    let driver = tokio::spawn(driver.run(rx));
    for n in live {
        let (reply, _) = oneshot::channel();
        let r = v1::RegisterRequest {
            node: n.node,
            endpoint: n.endpoint,
            workers: Vec::new(),
            owns_from: n.owns_from,
        };
        let _ = tx.send(Msg::Register(r, reply)).await;
    }
    Ok(Started {
        handle: Handle {
            tx,
            etcd: cfg_etcd,
            registry: registry.clone(),
            store: store.clone(),
            fence,
            registry_ready,
        },
        registry,
        store,
        limits,
        cluster_secret,
        tasks: vec![publisher, driver],
        nonce,
        match_latency,
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
    serve_started(started, listener, metrics, shutdown).await
}

/// Serves a started coordinator's gRPC services on `listener` until `shutdown` resolves.
pub async fn serve_started(
    started: Started,
    listener: runtime::listen::Listener,
    metrics: Option<TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let metrics = metrics.map(|l| {
        (
            l,
            MetricsSource {
                admin: Arc::new(started.handle.clone()),
                families: None,
                match_latency: Some(started.match_latency()),
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
