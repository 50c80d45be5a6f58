//! A cluster node's `Subscriptions` service: subscriptions live in the coordinator's registry
//! (one shard for the whole cluster), so a node forwards every call there unchanged, status
//! codes included, with the caller's token. Subscribers can use any node.

use proto::v1;
use proto::v1::subscriptions_client::SubscriptionsClient;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Forwards to the coordinator.
#[derive(Debug, Clone)]
pub struct SubscriptionsProxy {
    client: SubscriptionsClient<Channel>,
}

impl SubscriptionsProxy {
    /// A proxy over a (lazily connected) channel to the coordinator.
    pub fn new(channel: Channel) -> SubscriptionsProxy {
        SubscriptionsProxy {
            client: SubscriptionsClient::new(channel),
        }
    }
}

/// The forwarded request: the message and the caller's credentials (the coordinator checks
/// the same token again), nothing else of the incoming metadata.
fn forward<T>(request: Request<T>) -> Request<T> {
    let auth = request.metadata().get("authorization").cloned();
    let mut out = Request::new(request.into_inner());
    if let Some(v) = auth {
        out.metadata_mut().insert("authorization", v);
    }
    out
}

#[tonic::async_trait]
impl v1::subscriptions_server::Subscriptions for SubscriptionsProxy {
    async fn create(
        &self,
        request: Request<v1::CreateSubscriptionRequest>,
    ) -> Result<Response<v1::Subscription>, Status> {
        self.client.clone().create(forward(request)).await
    }

    async fn get(
        &self,
        request: Request<v1::GetSubscriptionRequest>,
    ) -> Result<Response<v1::Subscription>, Status> {
        self.client.clone().get(forward(request)).await
    }

    async fn list(
        &self,
        request: Request<v1::ListSubscriptionsRequest>,
    ) -> Result<Response<v1::ListSubscriptionsResponse>, Status> {
        self.client.clone().list(forward(request)).await
    }

    async fn update(
        &self,
        request: Request<v1::Subscription>,
    ) -> Result<Response<v1::Subscription>, Status> {
        self.client.clone().update(forward(request)).await
    }

    async fn delete(
        &self,
        request: Request<v1::DeleteSubscriptionRequest>,
    ) -> Result<Response<v1::DeleteSubscriptionResponse>, Status> {
        self.client.clone().delete(forward(request)).await
    }
}
