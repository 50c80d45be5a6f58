//! Spillover (federation, DESIGN §7): a delivery that dead-letters here is handed to the peer
//! clusters of the node's spillover links ([`Spill`]), and deliveries that peers spilled over
//! to this node are delivered here to the subscriptions of the same tenant and name
//! ([`Deliverer::deliver_spilled`]), each until its deadline. A spilled-in delivery that
//! dead-letters here is never spilled again (no bounce back, no second spill).

use super::*;

/// Where a dead-lettering delivery is handed over (the node's federation).
pub trait Spill: Send + Sync + 'static {
    /// Whether any dead letter goes anywhere now (a spillover link exists).
    fn wants(&self) -> bool;

    /// The delivery of `obj` to subscription `sub` (`s`) dead-letters for `reason`: owes it
    /// to the spillover links whose filter the object passes (durable with the store's next
    /// commit, which the dead-letter record shares); `ttl_ms` is the subscription's delivery
    /// TTL. Returns the links it went to (none: it stays a dead letter only).
    fn spill(
        &self,
        sub: u64,
        s: &v1::Subscription,
        obj: &storage::StoredObject,
        reason: &str,
        ttl_ms: u64,
    ) -> Vec<String>;
}

/// How long a spilled-in delivery is remembered after its deadline (a repeat of it from
/// the sender within this is stored once).
const REMEMBER_MS: u64 = 10 * 60 * 1000;

impl Deliverer {
    /// Dead-letters go to `spill` from now on.
    pub fn on_dead_letter(&self, spill: Arc<dyn Spill>) {
        *lock(&self.inner.spill) = Some(spill);
    }

    /// The deadline of deliveries of `obj` when peers spilled it over to this node.
    pub(super) fn spill_deadline(&self, obj: ObjectId) -> Option<u64> {
        self.inner.ledger.deadline(obj)
    }

    /// `reason`, saying where the dead-lettering delivery of `obj` to `sub` was spilled over
    /// to (unchanged when it was not: no spillover link, no name, or it was spilled in).
    pub(super) fn spill_over(
        &self,
        sub: u64,
        s: Option<&v1::Subscription>,
        obj: ObjectId,
        reason: String,
    ) -> String {
        let Some(spill) = lock(&self.inner.spill).clone().filter(|s| s.wants()) else {
            return reason;
        };
        let Some(s) = s.filter(|s| !s.name.is_empty()) else {
            return reason;
        };
        if self.spill_deadline(obj).is_some() {
            return format!("{reason} (spilled in from a peer cluster: not spilled again)");
        }
        match self.object(obj) {
            Ok(Some(o)) => {
                let to = spill.spill(sub, s, &o.stored, &reason, retry::ttl_ms(Some(s)));
                if to.is_empty() {
                    reason
                } else {
                    format!("{reason}; spilled over to {}", to.join(", "))
                }
            }
            // nothing left to hand over
            _ => reason,
        }
    }

    /// Delivers `obj`, stored here for deliveries spilled in from a peer cluster
    /// ([`storage::Store::write_targeted`]), to `subs`, each given up at `deadline_unix_ms`.
    /// The pending records are written unflushed: the caller commits before it answers the
    /// peer.
    pub async fn deliver_spilled(
        &self,
        obj: ObjectId,
        subs: &[u64],
        deadline_unix_ms: u64,
    ) -> Result<(), storage::StorageError> {
        self.inner.ledger.spilled_in(obj, deadline_unix_ms);
        let pairs: Vec<(u64, ObjectId)> = subs.iter().map(|s| (*s, obj)).collect();
        let added = self
            .inner
            .store
            .add_pending_deliveries_unflushed(&pairs)
            .await?;
        for (s, id) in added {
            self.opened(s, id);
            self.enqueue_new(s, id);
        }
        Ok(())
    }

    /// The ids of subscriptions of `tenant` named `name`, through the node's subscription
    /// source (cached like subscriptions).
    pub async fn named_subscriptions(&self, tenant: &str, name: &str) -> Result<Vec<u64>, Status> {
        let key = (tenant.to_string(), name.to_string());
        if let Some((at, ids)) = lock(&self.inner.named).get(&key)
            && at.elapsed() < SUB_CACHE
        {
            return Ok(ids.clone());
        }
        let ids = self.inner.subs.named(tenant, name).await?;
        let mut named = lock(&self.inner.named);
        if named.len() >= 4096 {
            named.clear();
        }
        named.insert(key, (Instant::now(), ids.clone()));
        Ok(ids)
    }

    /// Forgets spilled-in deliveries [`REMEMBER_MS`] past their deadline, every minute,
    /// until the process ends.
    pub async fn forget_spilled(self) {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            let cutoff = self.now_ms().saturating_sub(REMEMBER_MS);
            self.inner.ledger.forget_deadlines_before(cutoff);
            if let Err(e) = self.inner.store.spill_forget_before(cutoff) {
                tracing::warn!("forgetting spilled deliveries: {e}");
            }
        }
    }
}
