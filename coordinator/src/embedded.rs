//! Embedded mode (`dissem up`): storage, the coordinator and one node daemon in one process,
//! talking through in-process calls (no gRPC to itself), sharing one store, and serving the
//! public API on one listener. The same code paths as a multi-process cluster, minus sockets.

use std::sync::Arc;

use proto::v1;
use storage::Store;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};
use worker::daemon::{Daemon, DaemonConfig, LOCAL_ENDPOINT};
use worker::services::{Node, Sink};
use worker::{Limits, NodeError};

use crate::server::{ServerConfig, Started};

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
}

/// Runs the embedded cluster on `listener` until `shutdown` resolves. Objects still in the
/// outbox from an earlier run are matched once the node daemon has registered.
pub async fn run(
    listener: worker::listen::Listener,
    store: Store,
    limits: Limits,
    cfg: ServerConfig,
    mut daemon_cfg: DaemonConfig,
    metrics: Option<TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let coordinator = Arc::new(crate::server::start(store.clone(), limits, cfg).await?);
    daemon_cfg.endpoint = LOCAL_ENDPOINT.into();
    let daemon = Daemon::new(daemon_cfg, store.clone(), limits, coordinator.link())?;
    coordinator.set_local(Arc::new(daemon.clone())).await;
    daemon.spawn();
    let stream = v1::stream_server::StreamServer::new(daemon.deliverer().clone());
    let deliverer = daemon.deliverer().clone();
    let node = Node::new(store, limits, Sink::Cluster(daemon));
    let admin = EmbeddedAdmin {
        node: node.clone(),
        coordinator: coordinator.clone(),
    };
    if let Some(l) = metrics {
        tokio::spawn(worker::metrics::serve(
            l,
            worker::metrics::MetricsSource {
                admin: Arc::new(admin.clone()),
                deliverer: Some(deliverer),
            },
        ));
    }
    let max = worker::max_message(&limits);
    listener
        .server()?
        .add_service(worker::reflection(
            &[worker::PUBLIC_SERVICES, &[worker::STREAM_SERVICE]].concat(),
        )?)
        .add_service(
            v1::ingest_server::IngestServer::new(node.clone()).max_decoding_message_size(max),
        )
        .add_service(
            v1::objects_server::ObjectsServer::new(node.clone()).max_encoding_message_size(max),
        )
        .add_service(v1::subscriptions_server::SubscriptionsServer::new(
            coordinator.subscriptions(),
        ))
        .add_service(stream)
        .add_service(v1::admin_server::AdminServer::new(admin))
        .serve_with_incoming_shutdown(listener.incoming(), shutdown)
        .await
        .map_err(|e| NodeError::Startup(e.to_string()))
}
