//! The storage node and its node daemon. [`run`] serves a single node's public gRPC API
//! (ingestion, objects, subscriptions, admin, server reflection) and matches in-process;
//! [`run_node`] serves a cluster node: the same public API plus the internal `Daemon` service,
//! with elastic workers loading function blocks on the coordinator's orders (`daemon`).
//!
//! Layout follows mini-redis: `config` (limits, validated), `validate` (proto -> domain, every
//! error naming its field), `error` (the one mapping to `tonic::Status`), `services` (thin
//! adapters), `registry` (the coordinator's subscription registry and image publisher),
//! `proxy` (a cluster node forwards subscription calls to the coordinator).

pub mod auth;
pub mod client;
pub mod cluster_secret;
pub mod config;
pub mod daemon;
pub mod deliver;
pub mod disseminate;
pub mod error;
pub mod lanes;
pub mod listen;
pub mod metrics;
pub mod proxy;
pub mod push_http;
pub mod rate;
pub mod registry;
pub mod regulate;
pub mod services;
pub mod target_guard;
pub mod tls;
pub mod validate;

use std::net::SocketAddr;

use proto::v1::admin_server::AdminServer;
use proto::v1::ingest_server::IngestServer;
use proto::v1::objects_server::ObjectsServer;
use proto::v1::subscriptions_server::SubscriptionsServer;
use storage::Store;
use tokio::net::TcpListener;

pub use config::Limits;
pub use error::NodeError;

/// Wall-clock time in unix milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Locks a mutex, carrying on past a poisoned one (its data stays consistent here: every
/// critical section is a plain update).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves the node API on `listener` until `shutdown` resolves.
pub async fn run(
    listener: listen::Listener,
    store: Store,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let dissem = disseminate::Disseminator::load(store.clone(), &limits)?;
    // objects acknowledged before a restart but not yet matched
    let replayed = dissem.replay().await?;
    if replayed > 0 {
        tracing::info!("replayed {replayed} outbox records");
    }
    let node = services::Node::new(store, limits, services::Sink::Embedded(dissem));
    let max = max_message(&limits);
    listener
        .server()?
        .add_service(reflection(PUBLIC_SERVICES)?)
        .add_service(IngestServer::new(node.clone()).max_decoding_message_size(max))
        .add_service(ObjectsServer::new(node.clone()).max_encoding_message_size(max))
        .add_service(SubscriptionsServer::new(node.clone()))
        .add_service(AdminServer::new(node))
        .serve_with_incoming_shutdown(listener.incoming(), shutdown)
        .await
        .map_err(|e| NodeError::Startup(e.to_string()))
}

/// Serves a cluster node on `listener` until `shutdown` resolves: the public API (objects go
/// to the coordinator for matching, subscription calls are forwarded to it) and the internal
/// `Daemon` service of its workers.
pub async fn run_node(
    listener: listen::Listener,
    store: Store,
    limits: Limits,
    cfg: daemon::DaemonConfig,
    metrics: Option<TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let coordinator = daemon::channel(&cfg.coordinator)?;
    let cluster_auth = cfg.cluster_secret.check();
    let daemon = daemon::Daemon::start(cfg, store.clone(), limits)?;
    let node = services::Node::new(store, limits, services::Sink::Cluster(daemon.clone()));
    if let Some(l) = metrics {
        tokio::spawn(metrics::serve(
            l,
            metrics::MetricsSource {
                admin: std::sync::Arc::new(node.clone()),
                deliverer: Some(daemon.deliverer().clone()),
            },
        ));
    }
    let max = max_message(&limits);
    listener
        .server()?
        .add_service(reflection(&[PUBLIC_SERVICES, &[STREAM_SERVICE]].concat())?)
        .add_service(IngestServer::new(node.clone()).max_decoding_message_size(max))
        .add_service(ObjectsServer::new(node.clone()).max_encoding_message_size(max))
        .add_service(SubscriptionsServer::new(proxy::SubscriptionsProxy::new(
            coordinator,
        )))
        .add_service(AdminServer::new(node))
        .add_service(proto::v1::stream_server::StreamServer::new(
            daemon.deliverer().clone(),
        ))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            proto::v1::daemon_server::DaemonServer::new(daemon)
                .max_decoding_message_size(1 << 30)
                .max_encoding_message_size(1 << 30),
            cluster_auth,
        ))
        .serve_with_incoming_shutdown(listener.incoming(), shutdown)
        .await
        .map_err(|e| NodeError::Startup(e.to_string()))
}

/// The public services a node serves (and server reflection describes).
pub const PUBLIC_SERVICES: &[&str] = &[
    "dissem.v1.Ingest",
    "dissem.v1.Objects",
    "dissem.v1.Subscriptions",
    "dissem.v1.Admin",
];
/// The stream-subscriber service (a node with delivery serves it).
pub const STREAM_SERVICE: &str = "dissem.v1.Stream";

/// gRPC server reflection over the `dissem.v1` files, advertising exactly `services` (the
/// public ones a port serves; internal services are never advertised).
pub fn reflection(
    services: &[&str],
) -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    NodeError,
> {
    let mut b = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET);
    for s in services {
        b = b.with_service_name(*s);
    }
    b.build_v1().map_err(|e| NodeError::Startup(e.to_string()))
}

/// The largest request the public API accepts under `limits`.
pub fn max_message(limits: &Limits) -> usize {
    limits.max_object_bytes + 64 * 1024 + limits.max_attributes * (limits.max_string_bytes + 256)
}

/// Binds `addr` (port 0 picks a free one) and returns the listener and its address.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), NodeError> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| NodeError::Startup(format!("binding {addr}: {e}")))?;
    let a = l
        .local_addr()
        .map_err(|e| NodeError::Startup(e.to_string()))?;
    Ok((l, a))
}

/// Retention: every `every`, deletes objects whose dissemination is finished (outbox record
/// retired) and that are older than `keep`, acknowledged deliveries and dead letters older than
/// `keep`, and (with `max_objects`) the oldest finished objects beyond that count. Pending
/// objects and deliveries are never deleted. Runs until the task is dropped.
pub async fn retain(
    store: Store,
    keep: std::time::Duration,
    max_objects: Option<usize>,
    every: std::time::Duration,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let cutoff = now_ms().saturating_sub(keep.as_millis() as u64);
        let s = store.clone();
        let run = move || -> Result<(usize, usize), storage::StorageError> {
            let mut objects = if keep.is_zero() {
                0
            } else {
                s.expire_before(cutoff)?
            };
            let deliveries = if keep.is_zero() {
                0
            } else {
                s.expire_deliveries_before(cutoff)?
            };
            if let Some(max) = max_objects {
                objects += s.expire_to_count(max)?;
            }
            Ok((objects, deliveries))
        };
        match tokio::task::spawn_blocking(run).await {
            Ok(Ok((o, d))) if o + d > 0 => {
                tracing::info!("retention: expired {o} objects, {d} delivery records")
            }
            Ok(Err(e)) => tracing::warn!("retention: {e}"),
            _ => {}
        }
    }
}
