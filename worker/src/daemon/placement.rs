//! Placing subscription copies (DESIGN §7): the node that takes a Create stores the new
//! subscription on every live member of its column quorum C(j), itself included, before the
//! Create is answered (what the next leader rebuilds the registry from); an update replaces
//! the copies wherever they are held, and a delete leaves a tombstone on every live node.
//! Copies travel in the peers' replication queues, so a `CreateMany`'s thousand copies reach
//! each peer in a few calls, not one each.

use tokio::sync::mpsc::unbounded_channel;

use super::*;
use replicate::{PeerMsg, View, gather_acks};

/// Heartbeats after registration during which a replication waits for the view to know its
/// targets.
const VIEW_SETTLE_HEARTBEATS: u32 = 4;

impl Daemon {
    /// Stores subscription `id` (as the coordinator's registry has it) on every live member
    /// of this node's column quorum C(j), this node included, before the caller answers its
    /// Create; with `update`, replaces it on every live node that holds a copy instead. The
    /// answer is how many of how many live targets stored it.
    pub async fn place_subscription(&self, id: u64, update: bool) -> (usize, usize) {
        if !self.in_grid() {
            return (0, 0);
        }
        match self
            .inner
            .coord
            .subscription(v1::SubscriptionRecordRequest { id })
            .await
        {
            Ok(s) => self.place_records(&[s], update).await,
            Err(e) => {
                tracing::warn!("reading subscription {id} to place it: {e}");
                (0, 1)
            }
        }
    }

    /// [`Daemon::place_subscription`] of the subscriptions a `CreateMany` created: their
    /// records read in one call, stored here with one durable write, and queued for each
    /// peer together. The answer counts copies: how many of how many asked were stored.
    pub async fn place_subscriptions(&self, ids: &[u64]) -> (usize, usize) {
        if !self.in_grid() || ids.is_empty() {
            return (0, 0);
        }
        let req = v1::SubscriptionRecordsRequest { ids: ids.to_vec() };
        match self.inner.coord.subscription_records(req).await {
            Ok(r) => self.place_records(&r.subscriptions, false).await,
            Err(e) => {
                tracing::warn!("reading {} new subscriptions to place them: {e}", ids.len());
                (0, ids.len())
            }
        }
    }

    fn in_grid(&self) -> bool {
        let me = self.inner.cfg.node;
        self.grid().is_some_and(|g| g.contains(me))
    }

    /// Stores `records` on their targets (see [`Daemon::place_subscription`]).
    async fn place_records(&self, records: &[v1::Subscription], update: bool) -> (usize, usize) {
        let me = self.inner.cfg.node;
        let Some(g) = self.grid().filter(|g| g.contains(me)) else {
            return (0, 0);
        };
        let view = self.known_view(&g.subscription_quorum(me)).await;
        let targets: Vec<u32> = if update {
            (0..g.len()).filter(|&n| view.alive(n) || n == me).collect()
        } else {
            g.subscription_quorum(me)
        };
        let encoded: Vec<Vec<u8>> = records.iter().map(prost::Message::encode_to_vec).collect();
        let (tx, rx) = unbounded_channel();
        let mut asked = 0;
        let mut stored = 0;
        for n in targets {
            if n == me {
                let store = &self.inner.store;
                let placed_by = (!update).then_some(me);
                let mut here = 0;
                for (s, record) in records.iter().zip(&encoded) {
                    // an update replaces copies, never adds one; an older version than the
                    // one held (a later change placed first) is no news, and counts as stored
                    let applied = store.apply_subscription_copy_unflushed(
                        s.id, record, s.revision, placed_by, update,
                    );
                    match applied {
                        Ok(_)
                            if update && store.get_subscription(s.id).ok().flatten().is_none() => {}
                        Ok(_) => here += 1,
                        Err(e) => {
                            asked += 1;
                            tracing::warn!("storing subscription {}: {e}", s.id);
                        }
                    }
                }
                if here > 0 {
                    asked += here;
                    if store.commit().await.is_ok() {
                        stored += here;
                    }
                }
                continue;
            }
            if view.dead(n) || !view.members.contains_key(&n) {
                continue;
            }
            for (s, record) in records.iter().zip(&encoded) {
                asked += 1;
                let copy = v1::SubscriptionCopy {
                    id: s.id,
                    record: record.clone(),
                    only_if_held: update,
                    placed_by: me,
                    revision: s.revision,
                    deleted: false,
                };
                self.to_peer(n, PeerMsg::Subscription(copy, Some(tx.clone())));
            }
        }
        drop(tx);
        stored += gather_acks(rx, usize::MAX, self.replicate_deadline()).await;
        (stored, asked)
    }

    /// The view, once it knows every node of `targets` (alive or dead). Only just after
    /// this node registered (for [`VIEW_SETTLE_HEARTBEATS`] heartbeats) is it waited for:
    /// nodes that register after this one appear with the next heartbeats. Later a target
    /// the view does not know is a grid position no node holds.
    async fn known_view(&self, targets: &[u32]) -> View {
        let every = self.inner.cfg.heartbeat_every;
        let settle = every * VIEW_SETTLE_HEARTBEATS;
        let since = lock(&self.inner.registered_at).map(|t| t.elapsed());
        if since.is_some_and(|s| s >= settle) {
            return self.view();
        }
        let deadline = tokio::time::Instant::now() + settle.min(self.inner.cfg.replicate_timeout);
        loop {
            let view = self.view();
            if targets.iter().all(|n| view.members.contains_key(n))
                || tokio::time::Instant::now() >= deadline
            {
                return view;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes subscription `id` on every live node, leaving its tombstone (a copy that a
    /// node down now still holds is dropped when it catches up, and never wins a rebuild).
    /// The answer is how many of how many live nodes stored the tombstone before the
    /// replication deadline.
    pub async fn drop_subscription(&self, id: u64) -> (usize, usize) {
        let view = self.view();
        let me = self.inner.cfg.node;
        let Some(g) = view.grid else { return (0, 0) };
        let mut stored = 0;
        if self.inner.store.remove_subscription_unflushed(id).is_ok()
            && self.inner.store.commit().await.is_ok()
        {
            stored += 1;
        }
        let (tx, rx) = unbounded_channel();
        let mut asked = 1;
        for n in 0..g.len() {
            if n != me && view.alive(n) {
                asked += 1;
                self.to_peer(n, PeerMsg::DropSubscription(id, Some(tx.clone())));
            }
        }
        drop(tx);
        stored += gather_acks(rx, usize::MAX, self.replicate_deadline()).await;
        (stored, asked)
    }
}
