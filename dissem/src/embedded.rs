//! Embedded mode (`dissem up`): storage, the coordinator and one node daemon in one process,
//! talking through in-process calls (no gRPC to itself), sharing one store, and serving the
//! public API on one listener. The same code paths as a multi-process cluster, minus sockets.
//! The binary wires the two role crates together here, from above: each sees the other only
//! through `runtime::link`.

use std::sync::Arc;

use coordinator::server::{ServerConfig, Started};
use proto::v1;
use runtime::link::LOCAL_ENDPOINT;
use runtime::metrics::MetricsSource;
use runtime::serve::serve;
use runtime::{Limits, PUBLIC_SERVICES, STREAM_SERVICE, ServiceError, max_message};
use storage::Store;
use tonic::{Request, Response, Status};
use worker::daemon::{Daemon, DaemonConfig};
use worker::services::{Node, Sink};

/// Admin of an embedded cluster: the node's counters plus the coordinator's.
#[derive(Debug, Clone)]
struct EmbeddedAdmin {
    node: Node,
    coordinator: Arc<Started>,
}

#[tonic::async_trait]
impl v1::admin_server::Admin for EmbeddedAdmin {
    async fn stats(
        &self,
        request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        let mut s = v1::admin_server::Admin::stats(&self.node, request)
            .await?
            .into_inner();
        s.role = "embedded".into();
        s.cluster = Some(self.coordinator.cluster_stats().await?);
        Ok(Response::new(s))
    }

    async fn workers(
        &self,
        _request: Request<v1::WorkersRequest>,
    ) -> Result<Response<v1::WorkersResponse>, Status> {
        Ok(Response::new(v1::WorkersResponse {
            workers: self.coordinator.workers().await?,
        }))
    }

    async fn dead_letters(
        &self,
        request: Request<v1::DeadLettersRequest>,
    ) -> Result<Response<v1::DeadLettersResponse>, Status> {
        v1::admin_server::Admin::dead_letters(&self.node, request).await
    }

    async fn redrive(
        &self,
        request: Request<v1::RedriveRequest>,
    ) -> Result<Response<v1::RedriveResponse>, Status> {
        v1::admin_server::Admin::redrive(&self.node, request).await
    }

    async fn drain(
        &self,
        _request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        Err(Status::failed_precondition(
            "a single-node cluster (dissem up) has no other node to take its puts: stop it \
             with SIGTERM (what it owes is on its disk)",
        ))
    }

    async fn resize_grid(
        &self,
        _request: Request<v1::ResizeGridRequest>,
    ) -> Result<Response<v1::ResizeGridResponse>, Status> {
        Err(Status::failed_precondition(
            "a single-node cluster (dissem up) has no grid to resize: run coordinators with \
             --grid and nodes (dissem coordinator, dissem node)",
        ))
    }
}

/// How long the embedded node waits for its first view before it serves anyway.
const VIEW_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs the embedded cluster on `listener` until `shutdown` resolves. Objects still in the
/// outbox from an earlier run are matched once the node daemon has registered.
pub async fn run(
    listener: runtime::listen::Listener,
    store: Store,
    limits: Limits,
    cfg: ServerConfig,
    mut daemon_cfg: DaemonConfig,
    http: worker::NodeExtras,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    // before the daemon disseminates the outbox: a standby leaves some of it to its peer
    let fed = http
        .federation
        .map(|cfg| worker::federation::Federation::new(cfg, store.clone()))
        .transpose()?;
    let coordinator = Arc::new(coordinator::server::start(store.clone(), limits, cfg).await?);
    daemon_cfg.endpoint = LOCAL_ENDPOINT.into();
    let daemon = Daemon::new(daemon_cfg, store.clone(), limits, coordinator.link())?;
    coordinator.set_local(Arc::new(daemon.clone())).await;
    let deliverer = daemon.deliverer().clone();
    let mut node = Node::new(store.clone(), limits, Sink::Cluster(daemon.clone()));
    if let Some(f) = &fed {
        node = node.with_federation(f.clone());
    }
    // before the daemon runs: its first catch-up resumes deliveries, and one that
    // dead-letters then must find the spillover links (else it stays here unspilled; seen
    // as a spillover test that timed out on a loaded machine)
    node.start_federation();
    daemon.spawn();
    // the first puts come as soon as the address is out: until the daemon has its first
    // view from the coordinator (in this process, a few milliseconds) a put is refused
    // UNAVAILABLE, so the services start only then (seen as a failed first put in a test)
    let started = std::time::Instant::now();
    while !daemon.has_view() && started.elapsed() < VIEW_WAIT {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    if !daemon.has_view() {
        tracing::warn!(
            "no view from the coordinator after {VIEW_WAIT:?}: serving anyway (puts are \
             refused until it comes)"
        );
    }
    let stream = v1::stream_server::StreamServer::new(daemon.deliverer().clone());
    if let Some(e) = http.s3_events {
        tokio::spawn(worker::s3events::serve(e, node.clone(), listener.auth()));
    }
    let admin = EmbeddedAdmin {
        node: node.clone(),
        coordinator: coordinator.clone(),
    };
    let metrics = http.metrics.map(|l| {
        (
            l,
            MetricsSource {
                admin: Arc::new(admin.clone()),
                families: Some(Arc::new(worker::NodeFamilies {
                    deliverer,
                    federation: fed,
                })),
                match_latency: Some(coordinator.match_latency()),
            },
        )
    });
    let max = max_message(&limits);
    let subscriptions = coordinator.subscriptions();
    let grace = listener.shutdown_grace();
    let stopping = daemon.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.begin_stop(grace);
    };
    serve(
        listener,
        &[PUBLIC_SERVICES, &[STREAM_SERVICE]].concat(),
        metrics,
        |r| {
            r.add_service(
                v1::ingest_server::IngestServer::new(node.clone()).max_decoding_message_size(max),
            )
            .add_service(
                v1::federation_server::FederationServer::new(node.clone())
                    .max_decoding_message_size(worker::max_federate(&limits)),
            )
            .add_service(
                v1::objects_server::ObjectsServer::new(node).max_encoding_message_size(max),
            )
            .add_service(v1::subscriptions_server::SubscriptionsServer::new(
                subscriptions,
            ))
            .add_service(stream)
            .add_service(v1::admin_server::AdminServer::new(admin))
        },
        shutdown,
    )
    .await?;
    daemon.finish_stop(grace).await?;
    Ok(())
}
