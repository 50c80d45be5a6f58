//! What delivery keeps in memory between attempts: subscriptions, looked up through the
//! node's subscription source and kept for `SUB_CACHE`, and recently delivered objects with
//! the parts of their deliveries that every subscriber shares.

use super::*;

/// What every delivery of one object shares, built once: the stored object, its attributes
/// as gRPC sends them, and (on the first delivery that needs them) the
/// subscription-independent parts of its CloudEvent and its batched gRPC fields.
#[derive(Debug)]
pub(super) struct CachedObject {
    pub(super) stored: Arc<storage::StoredObject>,
    pub(super) metadata: Vec<v1::Attribute>,
    event: std::sync::OnceLock<EventParts>,
    grpc_shared: std::sync::OnceLock<Bytes>,
    /// Whether the data goes with the deliveries (it is within `max_data_bytes`).
    with_data: bool,
}

impl CachedObject {
    fn data(&self) -> &[u8] {
        if self.with_data {
            &self.stored.data
        } else {
            &[]
        }
    }

    /// The CloudEvent parts every webhook delivery of the object shares.
    pub(super) fn event(&self) -> &EventParts {
        self.event.get_or_init(|| {
            EventParts::new(&self.metadata, self.data(), self.stored.received_unix_ms)
        })
    }

    /// A `Delivery`'s object fields (metadata and data) as protobuf bytes, encoded once and
    /// appended to each batched delivery of the object ([`BatchOut`]).
    pub(super) fn grpc_shared(&self) -> Bytes {
        self.grpc_shared
            .get_or_init(|| {
                Bytes::from(prost::Message::encode_to_vec(&v1::Delivery {
                    metadata: self.metadata.clone(),
                    data: self.data().to_vec(),
                    ..v1::Delivery::default()
                }))
            })
            .clone()
    }
}

/// Recently delivered objects, oldest evicted first.
#[derive(Default)]
pub(super) struct ObjectCache {
    pub(super) map: blocks::hash::FastMap<ObjectId, Arc<CachedObject>>,
    pub(super) order: std::collections::VecDeque<ObjectId>,
}

/// Where delivery looks subscriptions up, with their write-only webhook secrets: the only
/// thing delivery needs of the rest of the cluster.
#[tonic::async_trait]
pub trait SubscriptionSource: Send + Sync + 'static {
    /// Subscription `id` (`None`: there is no such subscription).
    async fn subscription(&self, id: u64) -> Result<Option<v1::Subscription>, Status>;

    /// The ids of the subscriptions of `tenant` named `name` (spilled deliveries' receivers).
    async fn named(&self, _tenant: &str, _name: &str) -> Result<Vec<u64>, Status> {
        Err(Status::unimplemented(
            "this subscription source does not look names up",
        ))
    }
}

/// A cluster node's source: the coordinator's registry, over the node's link to it.
#[tonic::async_trait]
impl SubscriptionSource for ToCoordinator {
    async fn subscription(&self, id: u64) -> Result<Option<v1::Subscription>, Status> {
        match ToCoordinator::subscription(self, v1::SubscriptionRecordRequest { id }).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.code() == tonic::Code::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn named(&self, tenant: &str, name: &str) -> Result<Vec<u64>, Status> {
        let r = v1::NamedSubscriptionsRequest {
            tenant: tenant.into(),
            name: name.into(),
        };
        Ok(ToCoordinator::named(self, r).await?.ids)
    }
}

pub(super) type CachedSub = (Instant, Option<Arc<Sub>>);

impl Deliverer {
    /// A subscription looked up less than `SUB_CACHE` ago (`Some(None)`: it was not found).
    pub(super) fn cached_subscription(&self, id: u64) -> Option<Option<Arc<Sub>>> {
        live(lock(&self.inner.cache).get(&id))
    }

    /// The tenant owning subscription `id` (`None`: no such subscription).
    pub async fn subscription_tenant(&self, id: u64) -> Result<Option<String>, Status> {
        Ok(self.subscription(id).await?.map(|s| s.tenant.clone()))
    }

    pub(super) async fn subscription(&self, id: u64) -> Result<Option<Arc<Sub>>, Status> {
        if let Some(s) = self.cached_subscription(id) {
            return Ok(s);
        }
        let s = self
            .inner
            .subs
            .subscription(id)
            .await?
            .map(|s| Arc::new(Sub::new(s)));
        lock(&self.inner.cache).insert(id, (Instant::now(), s.clone()));
        Ok(s)
    }

    /// An object to deliver, read once for all its deliveries.
    pub(super) fn object(
        &self,
        id: ObjectId,
    ) -> Result<Option<Arc<CachedObject>>, storage::StorageError> {
        if let Some(o) = lock(&self.inner.objects).map.get(&id) {
            return Ok(Some(o.clone()));
        }
        let Some(stored) = self.inner.store.get_shared(id)? else {
            return Ok(None);
        };
        let metadata = validate::attributes_to_proto(&stored.metadata);
        let o = Arc::new(CachedObject {
            with_data: stored.data.len() <= self.inner.cfg.max_data_bytes,
            stored,
            metadata,
            event: std::sync::OnceLock::new(),
            grpc_shared: std::sync::OnceLock::new(),
        });
        let mut c = lock(&self.inner.objects);
        if c.map.insert(id, o.clone()).is_none() {
            c.order.push_back(id);
            if c.order.len() > OBJECT_CACHE
                && let Some(old) = c.order.pop_front()
            {
                c.map.remove(&old);
            }
        }
        Ok(Some(o))
    }
}

/// A subscription cache entry younger than `SUB_CACHE` (`Some(None)`: it was not found).
pub(super) fn live(entry: Option<&CachedSub>) -> Option<Option<Arc<Sub>>> {
    entry
        .filter(|(at, _)| at.elapsed() < SUB_CACHE)
        .map(|(_, s)| s.clone())
}
