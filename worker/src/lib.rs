//! The storage node and its node daemon. [`run`] serves a single node's public gRPC API
//! (ingestion, objects, subscriptions, admin, server reflection) and matches in-process;
//! [`run_node`] serves a cluster node: the same public API plus the internal `Daemon` service,
//! with elastic workers loading function blocks on the coordinator's orders (`daemon`).
//!
//! What the node shares with the coordinator (errors, limits, validation, the listener and
//! server assembly, authentication, metrics, the links between the roles) is the `runtime`
//! crate; this crate knows the coordinator only through `runtime::link::ToCoordinator`.

pub mod admission;
pub mod client;
pub mod daemon;
pub mod deliver;
pub mod disseminate;
pub mod drain;
pub mod federation;
pub mod lanes;
pub mod proxy;
pub mod push_http;
pub mod receiver;
pub mod regulate;
pub mod s3events;
pub mod services;
pub mod subscriber;
pub mod trace;

use std::sync::Arc;

use proto::v1::admin_server::AdminServer;
use proto::v1::ingest_server::IngestServer;
use proto::v1::objects_server::ObjectsServer;
use proto::v1::subscriptions_server::SubscriptionsServer;
use runtime::listen::Listener;
use runtime::metrics::MetricsSource;
use runtime::serve::{internal, serve};
use runtime::subscriptions::Subscriptions;
use runtime::{PUBLIC_SERVICES, STREAM_SERVICE, max_message, now_ms};
use storage::Store;
use tokio::net::TcpListener;

pub use runtime::{Limits, ServiceError};

/// Serves the node API on `listener` until `shutdown` resolves.
pub async fn run(
    listener: Listener,
    store: Store,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let dissem = disseminate::Disseminator::load(store.clone(), &limits)?;
    // objects acknowledged before a restart but not yet matched
    let replayed = dissem.replay().await?;
    if replayed > 0 {
        tracing::info!("replayed {replayed} outbox records");
    }
    let subs = Subscriptions::new(store.clone(), limits, Arc::new(dissem.clone()));
    let node = services::Node::new(store, limits, services::Sink::Embedded(dissem));
    let max = max_message(&limits);
    serve(
        listener,
        PUBLIC_SERVICES,
        None,
        |r| {
            r.add_service(IngestServer::new(node.clone()).max_decoding_message_size(max))
                .add_service(
                    proto::v1::federation_server::FederationServer::new(node.clone())
                        .max_decoding_message_size(max_federate(&limits)),
                )
                .add_service(ObjectsServer::new(node.clone()).max_encoding_message_size(max))
                .add_service(SubscriptionsServer::new(subs))
                .add_service(AdminServer::new(node))
        },
        shutdown,
    )
    .await
}

/// The largest `Federation.Replicate` request: a sender's batch bound plus one object of the
/// largest size (a batch closes once past the bound).
pub fn max_federate(limits: &Limits) -> usize {
    federation::BATCH_BYTES + max_message(limits)
}

/// A node's own `/metrics` families: its deliveries', and its federation links'.
#[derive(Debug)]
pub struct NodeFamilies {
    pub deliverer: deliver::Deliverer,
    pub federation: Option<federation::Federation>,
}

impl runtime::metrics::Families for NodeFamilies {
    fn write_metrics(&self, out: &mut String, scrape: &runtime::metrics::Scrape) {
        self.deliverer.write_metrics(out, scrape);
        if let Some(f) = &self.federation {
            f.write_metrics(out);
        }
    }
}

/// What a node may serve beside its gRPC API: plain HTTP listeners, and links to peer
/// clusters.
#[derive(Debug, Default)]
pub struct NodeExtras {
    /// `/metrics`, `/healthz`, `/readyz`.
    pub metrics: Option<TcpListener>,
    /// S3 event notifications ([`s3events`]), over TLS with an acceptor.
    pub s3_events: Option<s3events::Endpoint>,
    /// This cluster's name and its links to peer clusters ([`federation`]).
    pub federation: Option<federation::FederationConfig>,
}

/// Serves a cluster node on `listener` until `shutdown` resolves: the public API (objects go
/// to the coordinator for matching, subscription calls are forwarded to it) and the internal
/// `Daemon` service of its workers.
pub async fn run_node(
    listener: Listener,
    store: Store,
    limits: Limits,
    cfg: daemon::DaemonConfig,
    http: NodeExtras,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let link = daemon::Daemon::link(&cfg)?;
    let coordinator = match &link {
        runtime::link::ToCoordinator::Elected(e) => proxy::Coordinator::Elected(e.clone()),
        _ => proxy::Coordinator::Fixed(runtime::channel(&cfg.coordinator)?),
    };
    let cluster_auth = cfg.cluster_secret.check();
    let secret = cfg.cluster_secret.clone();
    // before the daemon disseminates the outbox: a standby leaves some of it to its peer
    let fed = http
        .federation
        .map(|cfg| federation::Federation::new(cfg, store.clone()))
        .transpose()?;
    let daemon = daemon::Daemon::new(cfg, store.clone(), limits, link)?;
    let mut node = services::Node::new(
        store.clone(),
        limits,
        services::Sink::Cluster(daemon.clone()),
    );
    if let Some(f) = &fed {
        node = node.with_federation(f.clone());
    }
    // before the daemon runs: its first catch-up resumes deliveries, and one that
    // dead-letters then must find the spillover links (else it stays here unspilled)
    node.start_federation();
    daemon.spawn();
    if let Some(e) = http.s3_events {
        tokio::spawn(s3events::serve(e, node.clone(), listener.auth()));
    }
    let metrics = http.metrics.map(|l| {
        (
            l,
            MetricsSource {
                admin: Arc::new(node.clone()),
                families: Some(Arc::new(NodeFamilies {
                    deliverer: daemon.deliverer().clone(),
                    federation: fed,
                })),
                match_latency: None,
            },
        )
    });
    let max = max_message(&limits);
    // a drained node asked to exit stops serving as on SIGTERM
    let exit = node.drain().clone().exit_requested();
    let grace = listener.shutdown_grace();
    let stopping = daemon.clone();
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = exit => {}
        }
        stopping.begin_stop(grace);
    };
    let stopped = daemon.clone();
    serve(
        listener,
        &[PUBLIC_SERVICES, &[STREAM_SERVICE]].concat(),
        metrics,
        |r| {
            r.add_service(IngestServer::new(node.clone()).max_decoding_message_size(max))
                .add_service(
                    proto::v1::federation_server::FederationServer::new(node.clone())
                        .max_decoding_message_size(max_federate(&limits)),
                )
                .add_service(ObjectsServer::new(node.clone()).max_encoding_message_size(max))
                .add_service(SubscriptionsServer::new(
                    proxy::SubscriptionsProxy::with_placement(coordinator, daemon.clone(), &secret),
                ))
                .add_service(AdminServer::new(node))
                .add_service(proto::v1::stream_server::StreamServer::new(
                    daemon.deliverer().clone(),
                ))
                .add_service(internal(
                    proto::v1::daemon_server::DaemonServer::new(daemon)
                        .max_decoding_message_size(1 << 30)
                        .max_encoding_message_size(1 << 30),
                    cluster_auth,
                ))
        },
        shutdown,
    )
    .await?;
    stopped.finish_stop(grace).await?;
    Ok(())
}

/// How long a node keeps the tombstone of a deleted subscription: a node down for longer
/// than this must rejoin with a fresh disk (docs/reference.md, the subscription copies).
pub const TOMBSTONE_KEEP: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Retention: every `every`, deletes objects whose dissemination is finished (outbox record
/// retired) and that are older than `keep`, acknowledged deliveries and dead letters older than
/// `keep`, (with `max_objects`) the oldest finished objects beyond that count, and the
/// tombstones of subscriptions deleted over [`TOMBSTONE_KEEP`] ago. Pending objects and
/// deliveries are never deleted. Runs until the task is dropped.
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
            let tombstones_from = now_ms().saturating_sub(TOMBSTONE_KEEP.as_millis() as u64);
            s.prune_subscription_tombstones(tombstones_from)?;
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
