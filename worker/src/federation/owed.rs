//! The federation's side of keeping copies for the links (`daemon::forwarding`): it tells
//! the node daemon whether an all-active link still owes an object, which of this node's
//! objects are owed, owes a taken-over copy to its own links, and reports every object an
//! all-active link acknowledged (the daemon then ends the object's copies, once nothing
//! owes it).
//!
//! Only all-active links take part: an active-passive standby keeps copies of its own (by the
//! primary's watermark), and a spillover link carries dead letters, not objects.

use crate::daemon::LinkLedger;
use runtime::lock;
use storage::StoredObject;

use super::*;

impl Federation {
    /// A stored object as it goes to a peer cluster (under its origin id here), expiring
    /// there at `expires_unix_ms` (0: never).
    pub(super) fn federated(&self, o: &StoredObject, expires_unix_ms: u64) -> v1::FederatedObject {
        v1::FederatedObject {
            origin_cluster: self.inner.cfg.cluster.clone(),
            origin_id: Some(v1::ObjectId {
                node: o.id.node,
                seq: o.id.seq,
            }),
            message_id: o.message_id.clone(),
            data: o.data.clone(),
            metadata: runtime::validate::attributes_to_proto(&o.metadata),
            priority: u32::from(o.priority),
            external_id: o.external_id.clone(),
            received_unix_ms: o.received_unix_ms,
            expires_unix_ms,
        }
    }

    /// The all-active links now.
    fn all_active(&self) -> Vec<Arc<Link>> {
        self.current()
            .into_iter()
            .filter(|l| l.cfg.mode == LinkMode::AllActive)
            .collect()
    }

    /// Sends the objects an all-active link acknowledged to the daemon's finisher.
    pub(super) fn report_acked(&self, objects: impl IntoIterator<Item = ObjectId>) {
        if let Some(tx) = lock(&self.inner.acked_to).as_ref() {
            for id in objects {
                let _ = tx.send(id);
            }
        }
    }

    /// Hands `daemon` this federation's ledger, and takes where acknowledgements go.
    pub fn keep_copies_for_links(&self, daemon: &crate::daemon::Daemon) {
        let tx = daemon.set_links(Arc::new(self.clone()));
        *lock(&self.inner.acked_to) = Some(tx);
    }
}

impl LinkLedger for Federation {
    fn owes(&self, id: ObjectId) -> bool {
        let store = &self.inner.store;
        let owed = if id.node == store.node() {
            self.all_active().iter().try_fold(false, |any, l| {
                Ok::<_, storage::StorageError>(any || store.link_owes_own(&l.cfg.name, id.seq)?)
            })
        } else {
            store.link_owes_foreign(id)
        };
        // unreadable: owed (a copy kept too long costs space; one ended too early, data)
        owed.unwrap_or_else(|e| {
            tracing::error!("reading what the links owe: {e}");
            true
        })
    }

    fn owed_own_after(&self, after: u64, limit: usize) -> Vec<u64> {
        let mut seqs = std::collections::BTreeSet::new();
        for l in self.all_active() {
            match self
                .inner
                .store
                .link_owed_own_after(&l.cfg.name, after, limit)
            {
                Ok(v) => seqs.extend(v),
                Err(e) => tracing::error!("link {}: reading what is owed: {e}", l.cfg.name),
            }
        }
        seqs.into_iter().take(limit).collect()
    }

    fn owed_total(&self) -> u64 {
        self.links().links.iter().map(|l| l.owed).sum()
    }

    fn owe_copy(&self, o: &StoredObject) -> Result<(), ServiceError> {
        let event = Event {
            attrs: o.metadata.clone(),
        };
        let mut bytes = None;
        for link in self.all_active() {
            let l = &link.cfg;
            if l.filter.as_ref().is_some_and(|f| !f.eval(&event)) {
                continue;
            }
            let b = bytes.get_or_insert_with(|| self.federated(o, 0).encode_to_vec());
            self.inner.store.link_owe_foreign(&l.name, o.id, b)?;
        }
        if bytes.is_some() {
            self.wake();
        }
        Ok(())
    }
}
