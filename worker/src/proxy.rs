//! A cluster node's `Subscriptions` service: subscriptions live in the coordinator's registry
//! (one shard for the whole cluster), so a node forwards every call there unchanged, status
//! codes included, with the caller's token. Subscribers can use any node. With a grid
//! (quorum replication) a created subscription is also stored on every live member of the
//! node's column quorum before Create returns; an update replaces those copies and a delete
//! drops them. With an elected coordinator (`--etcd`), calls go to the leader etcd names.

use proto::v1;
use proto::v1::subscriptions_client::SubscriptionsClient;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Where the coordinator is.
#[derive(Debug, Clone)]
pub enum Coordinator {
    /// A (lazily connected) channel to the one coordinator.
    Fixed(Channel),
    /// Whichever coordinator etcd names as leader.
    Elected(std::sync::Arc<runtime::link::Elected>),
}

/// Forwards to the coordinator.
#[derive(Debug, Clone)]
pub struct SubscriptionsProxy {
    coordinator: Coordinator,
    /// Changes carry the cluster secret to an elected coordinator (it takes them only from
    /// nodes, which place the copies).
    stamp: Option<runtime::cluster_secret::Stamp>,
    /// Places the copies of subscriptions (a node with a grid).
    placement: Option<crate::daemon::Daemon>,
}

impl SubscriptionsProxy {
    /// A proxy over a (lazily connected) channel to the coordinator.
    pub fn new(channel: Channel) -> SubscriptionsProxy {
        SubscriptionsProxy {
            coordinator: Coordinator::Fixed(channel),
            stamp: None,
            placement: None,
        }
    }

    /// The same, placing copies of the subscriptions through `daemon` (with a grid).
    pub fn with_placement(
        coordinator: Coordinator,
        daemon: crate::daemon::Daemon,
        secret: &runtime::cluster_secret::ClusterSecret,
    ) -> SubscriptionsProxy {
        SubscriptionsProxy {
            coordinator,
            stamp: Some(secret.stamp()),
            placement: Some(daemon),
        }
    }

    /// A change to forward: the caller's credentials and, to say it comes from a node, the
    /// cluster secret.
    fn change<T>(&self, request: Request<T>) -> Result<Request<T>, Status> {
        use tonic::service::Interceptor;
        let out = forward(request);
        match &self.stamp {
            Some(stamp) => {
                let (meta, ext, msg) = out.into_parts();
                let stamped = stamp.clone().call(Request::from_parts(meta, ext, ()))?;
                let (meta, ext, ()) = stamped.into_parts();
                Ok(Request::from_parts(meta, ext, msg))
            }
            None => Ok(out),
        }
    }

    fn client(&self) -> Result<SubscriptionsClient<Channel>, Status> {
        // an answer is a little larger than its request (ids, tenant): a CreateMany just
        // under the request limit must not be created at the coordinator and then refused
        // here, its copies never placed
        Ok(SubscriptionsClient::new(match &self.coordinator {
            Coordinator::Fixed(ch) => ch.clone(),
            Coordinator::Elected(e) => e.channel()?,
        })
        .max_decoding_message_size(64 << 20))
    }

    async fn place(&self, id: u64, update: bool) {
        if let Some(d) = &self.placement {
            let (stored, asked) = d.place_subscription(id, update).await;
            if stored < asked {
                tracing::warn!(
                    "subscription {id} reached {stored} of the {asked} live nodes it belongs \
                     on (the registry has it; the others lack a copy)"
                );
            }
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
        let r = self.client()?.create(self.change(request)?).await?;
        self.place(r.get_ref().id, false).await;
        Ok(r)
    }

    async fn create_many(
        &self,
        request: Request<v1::CreateSubscriptionsRequest>,
    ) -> Result<Response<v1::CreateSubscriptionsResponse>, Status> {
        let r = self.client()?.create_many(self.change(request)?).await?;
        if let Some(d) = &self.placement {
            let ids: Vec<u64> = r.get_ref().subscriptions.iter().map(|s| s.id).collect();
            let (stored, asked) = d.place_subscriptions(&ids).await;
            if stored < asked {
                tracing::warn!(
                    "{} new subscriptions: {stored} of {asked} copies reached the live nodes \
                     they belong on (the registry has them; the others lack a copy)",
                    ids.len()
                );
            }
        }
        Ok(r)
    }

    async fn get(
        &self,
        request: Request<v1::GetSubscriptionRequest>,
    ) -> Result<Response<v1::Subscription>, Status> {
        self.client()?.get(forward(request)).await
    }

    async fn list(
        &self,
        request: Request<v1::ListSubscriptionsRequest>,
    ) -> Result<Response<v1::ListSubscriptionsResponse>, Status> {
        self.client()?.list(forward(request)).await
    }

    async fn update(
        &self,
        request: Request<v1::Subscription>,
    ) -> Result<Response<v1::Subscription>, Status> {
        let r = self.client()?.update(self.change(request)?).await?;
        self.place(r.get_ref().id, true).await;
        Ok(r)
    }

    async fn delete(
        &self,
        request: Request<v1::DeleteSubscriptionRequest>,
    ) -> Result<Response<v1::DeleteSubscriptionResponse>, Status> {
        let id = request.get_ref().id;
        let r = match self.client()?.delete(self.change(request)?).await {
            Ok(r) => r,
            // deleted before: its tombstone is spread again (the delete tried first may have
            // reached the registry and died before its tombstone reached the nodes; a new
            // leader would rebuild the subscription from their copies; found by `bench chaos`)
            Err(s) if s.metadata().get(runtime::subscriptions::DELETED).is_some() => {
                if let Some(d) = &self.placement {
                    d.drop_subscription(id).await;
                }
                return Err(s);
            }
            Err(s) => return Err(s),
        };
        if let Some(d) = &self.placement {
            let (stored, asked) = d.drop_subscription(id).await;
            if stored < asked {
                tracing::warn!(
                    "deleted subscription {id}: its tombstone reached {stored} of the {asked} \
                     live nodes (the registry has the deletion, and a rebuild takes every \
                     node's tombstones)"
                );
            }
        }
        Ok(r)
    }
}
