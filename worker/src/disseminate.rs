//! Embedded dissemination on one node: every durably stored object is matched against the
//! registered subscriptions and one pending delivery record is written per matched
//! subscription; then the object's outbox record is retired. The outbox is durable, so an
//! object acknowledged just before a crash is matched when the node restarts ([`replay`]).
//!
//! This is the single-node path (no coordinator, no remote workers): the cluster issue puts
//! the coordinator, test workers and match workers in between. Pushing the deliveries to
//! subscribers is the delivery issue's.

use std::sync::{Arc, RwLock};

use blocks::{Event, MatchIndex, ShardConfig};
use storage::{ObjectId, StorageError, Store};

use runtime::config::Limits;
use runtime::error::ServiceError;
use runtime::validate;

/// The node's subscription index, kept in step with the registry.
#[derive(Debug, Clone)]
pub struct Disseminator {
    store: Store,
    index: Arc<RwLock<MatchIndex>>,
}

#[tonic::async_trait]
impl runtime::subscriptions::SubscriptionIndex for Disseminator {
    fn upsert(&self, id: u64, dnf: blocks::Dnf) {
        Disseminator::upsert(self, id, dnf)
    }

    fn remove(&self, id: u64) {
        Disseminator::remove(self, id)
    }

    /// The index changes in place: a change is in force when it is told.
    async fn in_force(&self) -> Result<(), ServiceError> {
        Ok(())
    }
}

impl Disseminator {
    /// Builds the index from every stored subscription.
    pub fn load(store: Store, limits: &Limits) -> Result<Disseminator, ServiceError> {
        let subs = validate::stored_subscriptions(&store, limits)?;
        let cfg = ShardConfig {
            bloom_tables: false,
            test_ids: false,
            ..ShardConfig::default()
        };
        let index =
            MatchIndex::build(cfg, subs).map_err(|e| ServiceError::Startup(e.to_string()))?;
        Ok(Disseminator {
            store,
            index: Arc::new(RwLock::new(index)),
        })
    }

    /// A subscription was created or replaced.
    pub fn upsert(&self, id: u64, dnf: blocks::Dnf) {
        let mut g = self.index.write().unwrap_or_else(|p| p.into_inner());
        let mut next = match g.upsert(id, dnf) {
            Ok(next) => next,
            Err(e) => {
                tracing::error!("subscription {id} could not be compiled: {e}");
                return;
            }
        };
        if next.needs_compaction()
            && let Ok(c) = next.compact()
        {
            next = c;
        }
        *g = next;
    }

    /// A subscription was deleted.
    pub fn remove(&self, id: u64) {
        let mut g = self.index.write().unwrap_or_else(|p| p.into_inner());
        if let Ok(next) = g.remove(id) {
            *g = next;
        }
    }

    /// Matches one stored object, records a pending delivery per matched subscription (one
    /// that exists is left as it is) and retires the object from the outbox. Returns the
    /// matched subscriptions.
    pub async fn disseminate(&self, id: ObjectId) -> Result<Vec<u64>, StorageError> {
        let Some(obj) = self.store.get(id)? else {
            // expired or never stored: nothing is owed
            self.store.retire(id)?;
            return Ok(Vec::new());
        };
        let event = Event {
            attrs: obj.metadata,
        };
        let snapshot = self.index.read().unwrap_or_else(|p| p.into_inner()).clone();
        let mut ctx = snapshot.base().new_ctx();
        let subs = snapshot.match_event(&event, &mut ctx);
        // deliveries first (durably), then the object leaves the outbox: a crash in between
        // re-matches the object and finds the same records, left as they stand
        let pairs: Vec<(u64, ObjectId)> = subs.iter().map(|&s| (s, id)).collect();
        self.store.add_pending_deliveries(&pairs).await?;
        self.store.retire(id)?;
        Ok(subs)
    }

    /// Matches every object still in the outbox (after a restart).
    pub async fn replay(&self) -> Result<usize, StorageError> {
        let pending = self.store.outbox_pending()?;
        for (id, _) in &pending {
            self.disseminate(*id).await?;
        }
        Ok(pending.len())
    }
}
