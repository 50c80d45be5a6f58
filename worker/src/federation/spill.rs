//! Spillover links: a delivery that dead-letters on this node is owed to each spillover link
//! (the [`Spill`] the node's delivery calls), and a peer's spilled deliveries are taken here
//! ([`Node::take_spilled`]): stored once each (by sending cluster, object and subscription),
//! their object kept as a copy that is never matched, and delivered to this cluster's
//! subscriptions of the same tenant and name until the delivery's deadline.

use super::*;
use crate::deliver::Spill;
use crate::services::{Node, Sink};

impl Spill for Federation {
    fn wants(&self) -> bool {
        self.spills()
    }

    fn spill(
        &self,
        sub: u64,
        s: &v1::Subscription,
        obj: &storage::StoredObject,
        reason: &str,
        ttl_ms: u64,
    ) -> Vec<String> {
        let event = Event {
            attrs: obj.metadata.clone(),
        };
        let now = runtime::now_ms();
        let mut to = Vec::new();
        for link in self.current() {
            let l = &link.cfg;
            let LinkMode::Spillover { ttl } = l.mode else {
                continue;
            };
            if l.filter.as_ref().is_some_and(|f| !f.eval(&event)) {
                continue;
            }
            // by default the peer has half the subscription's delivery TTL
            let ttl = ttl.map_or(ttl_ms / 2, |t| t.as_millis() as u64).max(1);
            let d = v1::SpilledDelivery {
                object: Some(self.federated(obj, now.saturating_add(ttl))),
                subscription_id: sub,
                tenant: s.tenant.clone(),
                name: s.name.clone(),
                reason: reason.chars().take(1024).collect(),
            };
            let owed = self
                .inner
                .store
                .next_link_entry()
                .and_then(|k| self.inner.store.link_owe(&l.name, k, &d.encode_to_vec()));
            match owed {
                Ok(()) => to.push(l.name.clone()),
                Err(e) => tracing::error!(
                    "link {}: owing the dead letter of subscription {sub}: {e}",
                    l.name
                ),
            }
        }
        if !to.is_empty() {
            self.wake();
        }
        to
    }
}

impl Federation {
    /// Whether any link is a spillover link.
    pub fn spills(&self) -> bool {
        self.current()
            .iter()
            .any(|l| matches!(l.cfg.mode, LinkMode::Spillover { .. }))
    }
}

/// The message id a spilled object's copy is stored under here: one copy per object of the
/// sending cluster, however many of its deliveries spill.
fn spill_message_id(from: &str, id: v1::ObjectId, max: usize) -> String {
    bounded_id(
        "spill:",
        format!("spill:{from}:{}:{}", id.node, id.seq),
        max,
    )
}

impl Node {
    /// A peer's spilled deliveries: each stored once (a repeat counts as a duplicate), and
    /// delivered to this cluster's subscriptions of its tenant and name (none: counted
    /// `unclaimed`); durable before the answer.
    pub(crate) async fn take_spilled(
        &self,
        from: &str,
        spilled: Vec<v1::SpilledDelivery>,
    ) -> Result<v1::FederateResponse, ServiceError> {
        self.federation_settings()?;
        let Sink::Cluster(daemon) = &self.sink else {
            return Err(ServiceError::FailedPrecondition(
                "this node does not deliver (no node daemon)".into(),
            ));
        };
        let deliverer = daemon.deliverer();
        // everything is checked before anything is kept
        let mut checked = Vec::with_capacity(spilled.len());
        for (i, d) in spilled.into_iter().enumerate() {
            let field = |f: &str| format!("spilled[{i}].{f}");
            let Some(o) = d.object else {
                return Err(ServiceError::invalid(field("object"), "required"));
            };
            if o.origin_cluster != from {
                return Err(ServiceError::invalid(
                    field("object.origin_cluster"),
                    "a spilled delivery comes from the cluster it dead-lettered in",
                ));
            }
            let id = o.origin_id.unwrap_or_default();
            if d.name.is_empty() || !runtime::validate::subscription_name_ok(&d.name) {
                return Err(ServiceError::invalid(
                    field("name"),
                    "a subscription name (1 to 128 letters, digits, `_ . - /`)",
                ));
            }
            if d.tenant.len() > MAX_TENANT_BYTES {
                return Err(ServiceError::invalid(
                    field("tenant"),
                    format!("over {MAX_TENANT_BYTES} bytes"),
                ));
            }
            if o.expires_unix_ms == 0 {
                return Err(ServiceError::invalid(
                    field("object.expires_unix_ms"),
                    "required on a spillover link",
                ));
            }
            let expires = o.expires_unix_ms;
            let mut obj = self.replicated_object(o).map_err(|e| match e {
                ServiceError::InvalidArgument { field: f, reason } => {
                    ServiceError::invalid(field(&format!("object.{f}")), reason)
                }
                e => e,
            })?;
            obj.message_id = spill_message_id(from, id, self.limits.max_message_id_bytes);
            checked.push((id, d.subscription_id, d.tenant, d.name, expires, obj));
        }
        let store = &self.store;
        let now = runtime::now_ms();
        let mut r = v1::FederateResponse::default();
        for (id, sub, tenant, name, expires, obj) in checked {
            let key = storage::SpillKey {
                cluster: from,
                origin: ObjectId {
                    node: id.node,
                    seq: id.seq,
                },
                subscription: sub,
            };
            if store.spill_seen(&key)? {
                r.duplicates += 1;
                continue;
            }
            let expires = expires.min(now.saturating_add(MAX_LINK_TTL.as_millis() as u64));
            let subs = deliverer
                .named_subscriptions(&tenant, &name)
                .await
                .map_err(ServiceError::from)?;
            if subs.is_empty() || expires <= now {
                tracing::warn!(
                    "a delivery spilled over from {from} for {tenant:?}/{name:?}: {}",
                    if subs.is_empty() {
                        "no subscription here has that tenant and name"
                    } else {
                        "its deadline passed before it arrived"
                    }
                );
                store.spill_taken(&key, expires, None)?;
                r.unclaimed += 1;
                continue;
            }
            let put = store.write_targeted(obj)?;
            store.spill_taken(&key, expires, Some(put.id))?;
            deliverer.deliver_spilled(put.id, &subs, expires).await?;
            r.stored += 1;
        }
        store.commit().await?;
        Ok(r)
    }
}

/// The longest tenant name a spilled delivery may carry.
const MAX_TENANT_BYTES: usize = 256;
