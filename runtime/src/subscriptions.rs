//! The public `Subscriptions` service: create, get, list, update and delete, each scoped to
//! the caller's tenant (another tenant's subscription is not found; admins see all), under
//! the tenant's subscription quota. Subscriptions are stored durably in the role's store and
//! each change goes to a [`SubscriptionIndex`]: the coordinator's registry in a cluster, the
//! in-process matcher of a single node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prost::Message;
use proto::v1;
use storage::Store;
use tonic::{Request, Response, Status};

use crate::auth::{self, Caller};
use crate::config::Limits;
use crate::error::ServiceError;
use crate::validate;

/// Where subscription changes go once they are stored.
#[tonic::async_trait]
pub trait SubscriptionIndex: Send + Sync + std::fmt::Debug {
    /// Subscription `id` now matches `dnf` (new or changed).
    fn upsert(&self, id: u64, dnf: blocks::Dnf);
    /// Subscription `id` is gone.
    fn remove(&self, id: u64);
    /// Returns once every change told so far applies to every later put (the service
    /// answers a change only then: read-your-writes).
    async fn in_force(&self) -> Result<(), ServiceError>;
}

/// The metadata key a NOT_FOUND answer to a Delete carries when the subscription was deleted
/// before (not never created): the node the Delete came through spreads its tombstone again.
pub const DELETED: &str = "x-dissem-deleted";

/// The service over one store and index.
#[derive(Debug, Clone)]
pub struct Subscriptions {
    store: Store,
    limits: Limits,
    index: Arc<dyn SubscriptionIndex>,
    /// Subscriptions per tenant, counted once on the first create under a quota.
    tenant_subs: Arc<Mutex<Option<HashMap<String, u64>>>>,
    /// Changes only from members of the cluster (an elected coordinator: a node forwards
    /// them and places the copies the next leader rebuilds the registry from).
    changes_from: Option<crate::cluster_secret::ClusterSecret>,
    /// Changes to stored records, one at a time: a revision drawn, its record stored and
    /// the index told in that order, so a later revision is never overwritten by an
    /// earlier one and an update racing a delete cannot store the deleted record again.
    writes: Arc<tokio::sync::Mutex<()>>,
}

impl Subscriptions {
    /// The service over `store`, telling `index` of every change.
    pub fn new(store: Store, limits: Limits, index: Arc<dyn SubscriptionIndex>) -> Subscriptions {
        Subscriptions {
            store,
            limits,
            index,
            tenant_subs: Arc::default(),
            changes_from: None,
            writes: Arc::default(),
        }
    }

    /// Takes Create, Update and Delete only from members of the cluster (calls carrying
    /// `secret`): the nodes, which place the copies a new leader rebuilds from.
    pub fn changes_only_through_nodes(
        mut self,
        secret: crate::cluster_secret::ClusterSecret,
    ) -> Subscriptions {
        self.changes_from = Some(secret);
        self
    }

    /// Refuses a change that did not come through a node, where one is required.
    fn through_node<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match &self.changes_from {
            Some(secret) if !secret.presented_in(request.metadata()) => {
                Err(Status::failed_precondition(
                    "this coordinator is elected (--etcd): create, update and delete \
                     subscriptions through a node, whose copies are what the next leader \
                     rebuilds the registry from",
                ))
            }
            _ => Ok(()),
        }
    }

    /// Stores a validated subscription durably, puts it in the match index, and returns it
    /// without its write-only secret.
    async fn save_subscription(
        &self,
        mut s: v1::Subscription,
        dnf: blocks::Dnf,
    ) -> Result<v1::Subscription, ServiceError> {
        {
            let _w = self.writes.lock().await;
            s.revision = match s.revision {
                0 => self.store.next_subscription_revision()?,
                r => r,
            };
            if !self
                .store
                .put_subscription(s.id, s.encode_to_vec(), s.revision)
                .await?
            {
                return Err(ServiceError::NotFound(format!("subscription {}", s.id)));
            }
            self.index.upsert(s.id, dnf);
        }
        self.index.in_force().await?;
        without_secrets(&mut s);
        Ok(s)
    }

    /// Stores new validated subscriptions durably with one write, ids assigned in order,
    /// puts them in the match index and returns them (in order) without their write-only
    /// secrets once the index has them in force.
    async fn save_new(
        &self,
        subs: Vec<(v1::Subscription, blocks::Dnf)>,
    ) -> Result<Vec<v1::Subscription>, ServiceError> {
        let mut out = Vec::with_capacity(subs.len());
        {
            let _w = self.writes.lock().await;
            let mut records = Vec::with_capacity(subs.len());
            let mut dnfs = Vec::with_capacity(subs.len());
            for (mut s, dnf) in subs {
                let id = self.store.next_subscription_id()?;
                s.id = id;
                s.revision = id; // drawn from the revisions' counter: the first version's
                records.push((id, s.encode_to_vec(), id));
                dnfs.push((id, dnf));
                out.push(s);
            }
            // new ids: no tombstone can name them, so every record is stored
            self.store.put_subscriptions(&records).await?;
            for (id, dnf) in dnfs {
                self.index.upsert(id, dnf);
            }
        }
        self.index.in_force().await?;
        out.iter_mut().for_each(without_secrets);
        Ok(out)
    }

    /// Creates validated subscriptions of `caller`'s tenant under its quota (all or none).
    async fn create_checked(
        &self,
        caller: &Caller,
        checked: Vec<(v1::Subscription, blocks::Dnf)>,
    ) -> Result<Vec<v1::Subscription>, ServiceError> {
        let n = checked.len() as u64;
        self.reserve_subscriptions(caller, n)?;
        let saved = self.save_new(checked).await;
        if saved.is_err() {
            self.release_subscriptions(caller.tenant(), n);
        }
        saved
    }

    /// Validates the subscriptions of a [`CreateMany`](v1::subscriptions_server::Subscriptions::create_many)
    /// as Create would each (a refusal names `subscriptions[i]`), each target address once.
    async fn checked_many(
        &self,
        caller: &Caller,
        subs: Vec<v1::Subscription>,
    ) -> Result<Vec<(v1::Subscription, blocks::Dnf)>, ServiceError> {
        if subs.is_empty() || subs.len() > MAX_CREATE_MANY {
            return Err(ServiceError::invalid(
                "subscriptions",
                format!("{} given: 1 to {MAX_CREATE_MANY} per request", subs.len()),
            ));
        }
        let mut checked = Vec::with_capacity(subs.len());
        let mut targets = std::collections::HashSet::new();
        for (i, mut s) in subs.into_iter().enumerate() {
            let named = |e| in_batch(i, e);
            let dnf = validate::subscription(&s, &self.limits).map_err(named)?;
            // a thousand subscriptions of one endpoint resolve its name once
            let target = s.target.as_ref().map(|t| t.encode_to_vec());
            if targets.insert(target) {
                validate::target_address(&s, &self.limits)
                    .await
                    .map_err(named)?;
            }
            s.qos = validate::qos(&s) as i32;
            s.tenant = caller.tenant().to_string();
            checked.push((s, dnf));
        }
        Ok(checked)
    }

    /// The stored subscription `id` if `caller` may see it (another tenant's is not found).
    fn owned_subscription(
        &self,
        caller: &Caller,
        id: u64,
    ) -> Result<v1::Subscription, ServiceError> {
        let s = stored_subscription(&self.store, id)?;
        if caller.sees(&s.tenant) {
            Ok(s)
        } else {
            Err(ServiceError::NotFound(format!("subscription {id}")))
        }
    }

    /// Reserves room for `more` subscriptions of `caller`'s tenant under its quota.
    fn reserve_subscriptions(&self, caller: &Caller, more: u64) -> Result<(), ServiceError> {
        let Some(max) = caller.tenant.quota.max_subscriptions else {
            return Ok(());
        };
        let mut counts = crate::lock(&self.tenant_subs);
        if counts.is_none() {
            let mut m = HashMap::new();
            let mut after = 0;
            loop {
                let page = self.store.list_subscriptions(after, 1000)?;
                let Some(last) = page.last().map(|p| p.0) else {
                    break;
                };
                for (id, b) in &page {
                    *m.entry(decode_stored(*id, b)?.tenant).or_insert(0u64) += 1;
                }
                after = last;
            }
            *counts = Some(m);
        }
        let n = counts
            .as_mut()
            .map(|m| m.entry(caller.tenant().to_string()).or_insert(0))
            .ok_or_else(|| ServiceError::Unavailable("subscription counts".into()))?;
        if n.saturating_add(more) > max {
            return Err(ServiceError::Quota(format!(
                "tenant {:?} has {n} subscriptions of its quota of {max}: {more} more do not fit",
                caller.tenant()
            )));
        }
        *n += more;
        Ok(())
    }

    /// Gives back what [`Subscriptions::reserve_subscriptions`] took (a failed create, a
    /// delete).
    fn release_subscriptions(&self, tenant: &str, fewer: u64) {
        if let Some(m) = crate::lock(&self.tenant_subs).as_mut()
            && let Some(n) = m.get_mut(tenant)
        {
            *n = n.saturating_sub(fewer);
        }
    }
}

/// Most subscriptions one `CreateMany` registers.
pub const MAX_CREATE_MANY: usize = 1000;

/// A refusal of one subscription of a `CreateMany`, its field named under `subscriptions[i]`.
fn in_batch(i: usize, e: ServiceError) -> ServiceError {
    match e {
        ServiceError::InvalidArgument { field, reason } => ServiceError::InvalidArgument {
            field: match field.strip_prefix("subscription") {
                Some(rest) => format!("subscriptions[{i}]{rest}"),
                None => format!("subscriptions[{i}].{field}"),
            },
            reason,
        },
        e => e,
    }
}

/// Removes what is write-only (the webhook secret and headers) from what goes to a client.
fn without_secrets(s: &mut v1::Subscription) {
    s.webhook_secret.clear();
    s.webhook_headers.clear();
}

/// A stored subscription as it is returned to clients: the write-only secret removed.
fn decode_sub(id: u64, bytes: &[u8]) -> Result<v1::Subscription, ServiceError> {
    let mut s = decode_stored(id, bytes)?;
    without_secrets(&mut s);
    Ok(s)
}

pub fn decode_stored(id: u64, bytes: &[u8]) -> Result<v1::Subscription, ServiceError> {
    v1::Subscription::decode(bytes).map_err(|e| {
        tracing::error!("stored subscription {id} does not decode: {e}");
        ServiceError::Storage(storage::StorageError::Corrupt {
            tree: "subscriptions",
            source: storage::CodecError::Truncated,
        })
    })
}

/// A stored subscription with its webhook secret, for delivery inside the cluster.
pub fn stored_subscription(store: &Store, id: u64) -> Result<v1::Subscription, ServiceError> {
    let bytes = store
        .get_subscription(id)?
        .ok_or_else(|| ServiceError::NotFound(format!("subscription {id}")))?;
    decode_stored(id, &bytes)
}

/// The ids of the stored subscriptions of `tenant` named `name` (at most 1,000, in id
/// order): a spilled delivery's receivers. A scan of the registry, so one lookup costs in
/// proportion to the subscriptions stored (nodes cache the answer).
pub fn named_subscriptions(
    store: &Store,
    tenant: &str,
    name: &str,
) -> Result<Vec<u64>, ServiceError> {
    let mut ids = Vec::new();
    if name.is_empty() {
        return Ok(ids);
    }
    let mut after = 0;
    loop {
        let page = store.list_subscriptions(after, 1000)?;
        let Some(last) = page.last().map(|p| p.0) else {
            break;
        };
        for (id, b) in &page {
            let s = decode_stored(*id, b)?;
            if s.name == name && s.tenant == tenant {
                ids.push(*id);
                if ids.len() >= 1000 {
                    return Ok(ids);
                }
            }
        }
        after = last;
    }
    Ok(ids)
}

#[tonic::async_trait]
impl v1::subscriptions_server::Subscriptions for Subscriptions {
    async fn create(
        &self,
        request: Request<v1::CreateSubscriptionRequest>,
    ) -> Result<Response<v1::Subscription>, Status> {
        self.through_node(&request)?;
        let caller = auth::caller(&request);
        let mut s = request
            .into_inner()
            .subscription
            .ok_or_else(|| ServiceError::invalid("subscription", "required"))?;
        let dnf = validate::subscription(&s, &self.limits)?;
        validate::target_address(&s, &self.limits).await?;
        s.qos = validate::qos(&s) as i32; // stored with its level, never unset
        s.tenant = caller.tenant().to_string();
        let created = self.create_checked(&caller, vec![(s, dnf)]).await?;
        let s = created
            .into_iter()
            .next()
            .ok_or_else(|| ServiceError::Unavailable("the subscription was not stored".into()))?;
        Ok(Response::new(s))
    }

    async fn create_many(
        &self,
        request: Request<v1::CreateSubscriptionsRequest>,
    ) -> Result<Response<v1::CreateSubscriptionsResponse>, Status> {
        self.through_node(&request)?;
        let caller = auth::caller(&request);
        let subs = request.into_inner().subscriptions;
        let checked = self.checked_many(&caller, subs).await?;
        Ok(Response::new(v1::CreateSubscriptionsResponse {
            subscriptions: self.create_checked(&caller, checked).await?,
        }))
    }

    async fn get(
        &self,
        request: Request<v1::GetSubscriptionRequest>,
    ) -> Result<Response<v1::Subscription>, Status> {
        let caller = auth::caller(&request);
        let mut s = self.owned_subscription(&caller, request.into_inner().id)?;
        without_secrets(&mut s);
        Ok(Response::new(s))
    }

    async fn list(
        &self,
        request: Request<v1::ListSubscriptionsRequest>,
    ) -> Result<Response<v1::ListSubscriptionsResponse>, Status> {
        let caller = auth::caller(&request);
        let r = request.into_inner();
        let limit = match r.limit {
            0 => 100,
            l if l > 1000 => {
                return Err(ServiceError::invalid("limit", format!("{l} exceeds 1000")).into());
            }
            l => l as usize,
        };
        // pages of the store, keeping the caller's own, until a page of them is full or the
        // store ends (a tenant sees only its own; admins see all)
        let mut subs = Vec::with_capacity(limit);
        let mut after = r.after_id;
        let mut next = 0;
        loop {
            let page = self
                .store
                .list_subscriptions(after, limit)
                .map_err(ServiceError::from)?;
            let full_page = page.len() == limit;
            for (id, b) in page {
                after = id;
                let s = decode_sub(id, &b)?;
                if caller.sees(&s.tenant) {
                    subs.push(s);
                    if subs.len() == limit {
                        break;
                    }
                }
            }
            if subs.len() == limit {
                next = after;
                break;
            }
            if !full_page {
                break;
            }
        }
        Ok(Response::new(v1::ListSubscriptionsResponse {
            subscriptions: subs,
            next_after_id: next,
        }))
    }

    async fn update(
        &self,
        request: Request<v1::Subscription>,
    ) -> Result<Response<v1::Subscription>, Status> {
        self.through_node(&request)?;
        let caller = auth::caller(&request);
        let mut s = request.into_inner();
        if s.id == 0 {
            return Err(ServiceError::invalid("subscription.id", "required for an update").into());
        }
        let dnf = validate::subscription(&s, &self.limits)?;
        validate::target_address(&s, &self.limits).await?;
        s.qos = validate::qos(&s) as i32;
        // the owner stays: an update never moves a subscription between tenants
        s.tenant = self.owned_subscription(&caller, s.id)?.tenant;
        s.revision = 0; // drawn when it is stored
        Ok(Response::new(self.save_subscription(s, dnf).await?))
    }

    /// A Delete of a subscription deleted before answers NOT_FOUND with [`DELETED`] set.
    async fn delete(
        &self,
        request: Request<v1::DeleteSubscriptionRequest>,
    ) -> Result<Response<v1::DeleteSubscriptionResponse>, Status> {
        self.through_node(&request)?;
        let caller = auth::caller(&request);
        let id = request.into_inner().id;
        let owner = match self.owned_subscription(&caller, id) {
            Ok(s) => s.tenant,
            Err(e) => {
                let mut status: Status = e.into();
                // a delete tried again after its answer was lost: the node it came through
                // spreads the tombstone again (the first try may have died before it did)
                if self.store.subscription_deleted(id).unwrap_or(false) {
                    status
                        .metadata_mut()
                        .insert(DELETED, tonic::metadata::MetadataValue::from_static("1"));
                }
                return Err(status);
            }
        };
        {
            let _w = self.writes.lock().await;
            if !self
                .store
                .delete_subscription(id)
                .await
                .map_err(ServiceError::from)?
            {
                return Err(ServiceError::NotFound(format!("subscription {id}")).into());
            }
            self.index.remove(id);
        }
        self.release_subscriptions(&owner, 1);
        self.index.in_force().await?;
        Ok(Response::new(v1::DeleteSubscriptionResponse {}))
    }
}
