//! The node daemon. Today it serves a storage node's public gRPC API (ingestion, objects,
//! subscriptions, admin, server reflection) over the durable store; the elastic workers,
//! function blocks and delivery of the cluster and delivery issues come next.
//!
//! Layout follows mini-redis: `config` (limits, validated), `validate` (proto -> domain, every
//! error naming its field), `error` (the one mapping to `tonic::Status`), `services` (thin
//! adapters), and [`run`] which serves a bound listener until shutdown.

pub mod client;
pub mod config;
pub mod disseminate;
pub mod error;
pub mod rate;
pub mod regulate;
pub mod services;
pub mod validate;

use std::net::SocketAddr;

use proto::v1::admin_server::AdminServer;
use proto::v1::ingest_server::IngestServer;
use proto::v1::objects_server::ObjectsServer;
use proto::v1::subscriptions_server::SubscriptionsServer;
use storage::Store;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;

pub use config::Limits;
pub use error::NodeError;

/// Serves the node API on `listener` until `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
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
    let node = services::Node::new(store, limits, dissem);
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| NodeError::Startup(e.to_string()))?;
    let max = limits.max_object_bytes
        + 64 * 1024
        + limits.max_attributes * (limits.max_string_bytes + 256);
    // small request/response exchanges: no Nagle delay on accepted connections
    let incoming = TcpListenerStream::new(listener).map(|s| {
        if let Ok(s) = &s {
            let _ = s.set_nodelay(true);
        }
        s
    });
    tonic::transport::Server::builder()
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .add_service(reflection)
        .add_service(IngestServer::new(node.clone()).max_decoding_message_size(max))
        .add_service(ObjectsServer::new(node.clone()).max_encoding_message_size(max))
        .add_service(SubscriptionsServer::new(node.clone()))
        .add_service(AdminServer::new(node))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| NodeError::Startup(e.to_string()))
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
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let cutoff = now.saturating_sub(keep.as_millis() as u64);
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
