//! The coordinator's `Admin` service: the cluster's figures and its grid as the driver
//! sees them, and online resizes of the grid; what lives on nodes (dead letters, drains) is
//! refused with where to ask.

use proto::v1;
use tonic::{Request, Response, Status};

use super::{Handle, Msg};

/// Why the coordinator refuses the calls about deliveries.
const NO_DELIVERIES: &str = "the coordinator holds no deliveries: ask the nodes (dead letters \
                             live on the node that took the write)";

#[tonic::async_trait]
impl v1::admin_server::Admin for Handle {
    async fn dead_letters(
        &self,
        _request: Request<v1::DeadLettersRequest>,
    ) -> Result<Response<v1::DeadLettersResponse>, Status> {
        Err(Status::failed_precondition(NO_DELIVERIES))
    }

    async fn redrive(
        &self,
        _request: Request<v1::RedriveRequest>,
    ) -> Result<Response<v1::RedriveResponse>, Status> {
        Err(Status::failed_precondition(NO_DELIVERIES))
    }

    async fn drain(
        &self,
        _request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        Err(Status::failed_precondition(
            "a coordinator is not drained: stop it (SIGTERM) and a standby leads; drain the \
             nodes (dissem node drain --node URL)",
        ))
    }

    async fn resize_grid(
        &self,
        request: Request<v1::ResizeGridRequest>,
    ) -> Result<Response<v1::ResizeGridResponse>, Status> {
        Ok(Response::new(self.resize_grid(request.into_inner()).await?))
    }

    async fn stats(
        &self,
        _request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        let cluster = self.ask(Msg::Stats).await?;
        let view = self.ask(Msg::View).await?;
        Ok(Response::new(v1::StatsResponse {
            node: 0,
            role: "coordinator".into(),
            subscriptions: self.store.subscription_count() as u64,
            cluster: Some(cluster),
            view: Some(view),
            registry_kept: self.registry_ready.is_some_and(|r| r.0),
            registry_ready_ms: self.registry_ready.map_or(0, |r| r.1),
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
