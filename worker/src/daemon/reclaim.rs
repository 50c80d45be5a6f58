//! Handing over and taking back (DESIGN §7). A node back from the dead learns which of its
//! objects its heir adopted meanwhile; they stay in its outbox, handed to that adopter
//! ([`storage::Store::hand`]): answered as held to a holder catching up, not pushed here,
//! until the adopter's finished mark (or a holder's tombstone) retires them. If the adopter
//! is lost first ([`ownership::Adopter::lost`]: dead past its lease, or back on a fresh
//! disk), the origin takes them back: what a live holder knows finished leaves its outbox,
//! the rest it disseminates itself, with its subscribers' "received" marks pulled from the
//! holders (a subscriber the adopter brought an object to is owed only its release).
//! Before, a handed object left the origin's outbox at once, and an adopter's disk lost
//! before it delivered the backlog lost the backlog (found by the ownership simulation,
//! `daemon/ownsim`). An adopter only paused past its lease is fenced when it continues; its
//! relearn finds the objects finished by the origin, or the origin's relearn (a member of
//! its quorum alive again) hands them to it once more: one owner each.

use super::*;
use ownership::Adopter;

/// Between two tries while a live member of the quorum does not answer.
const RETRY: Duration = Duration::from_millis(500);

impl Daemon {
    /// Hands this node's object `id` to `adopter` (learnt adopted there). `open`: its
    /// delivery records here were still open (it left the outbox when they were written),
    /// so it enters the outbox again, held for the holders.
    pub(super) fn hand(&self, id: ObjectId, adopter: Adopter, open: bool) {
        let store = &self.inner.store;
        let priority = if open && !store.in_outbox(id) {
            match store.get(id) {
                Ok(Some(o)) => Some(o.priority),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!("reading object {}:{}: {e}", id.node, id.seq);
                    None
                }
            }
        } else {
            None
        };
        if let Err(e) = store.hand(id.seq, priority, (adopter.node, adopter.owns_from)) {
            tracing::warn!("handing {}:{} over: {e}", id.node, id.seq);
        }
    }

    /// This node's handed objects with their adopters (the store's marks).
    pub(super) fn handings(&self) -> Vec<(u64, Adopter)> {
        match self.inner.store.handings() {
            Ok(h) => h
                .into_iter()
                .map(|(seq, node, owns_from)| (seq, Adopter { node, owns_from }))
                .collect(),
            Err(e) => {
                tracing::warn!("reading the handed objects: {e}");
                Vec::new()
            }
        }
    }

    /// Takes back what this node handed to `adopter`, which its view shows lost.
    pub(super) async fn reclaim(self, adopter: Adopter) {
        let me = self.inner.cfg.node;
        loop {
            let view = self.view();
            if !adopter.lost(&view) {
                return; // back meanwhile, on its disk: still its
            }
            let Some(g) = view.grid else { return };
            // in order (the store's)
            let seqs: Vec<u64> = self
                .handings()
                .into_iter()
                .filter(|(_, a)| *a == adopter)
                .map(|(s, _)| s)
                .collect();
            let Some(&first) = seqs.first() else { return };
            let after = first.saturating_sub(1);
            // every live member of the quorum answers, or nothing is taken back this time
            let mut whole = true;
            let mut finished = HashSet::new();
            let mut elsewhere = HashMap::new();
            for (member, ep) in view.live_endpoints(g.xs_quorum(me), &[me, adopter.node]) {
                for set in [
                    v1::ReplicaSet::Finished,
                    v1::ReplicaSet::Forwarding,
                    v1::ReplicaSet::Adopted,
                ] {
                    let (got, answered) = self.replica_seqs(&ep, me, set, after).await;
                    whole &= answered;
                    if set == v1::ReplicaSet::Adopted {
                        let a = Adopter::in_view(member, &view);
                        elsewhere.extend(got.into_iter().map(|s| (s, a)));
                    } else {
                        finished.extend(got);
                    }
                }
                whole &= self.pull_marks(&ep, after).await;
            }
            if !whole {
                tracing::debug!(
                    "taking back from node {}: a member of the quorum did not answer",
                    adopter.node
                );
                tokio::time::sleep(RETRY).await;
                continue;
            }
            if !adopter.lost(&self.view()) {
                return;
            }
            let mut back = HashSet::new();
            let store = &self.inner.store;
            for seq in seqs {
                let id = ObjectId { node: me, seq };
                let r = if finished.contains(&seq) {
                    store.retire(id).map(|_| ())
                } else if let Some(a) = elsewhere.get(&seq) {
                    // another member has it now
                    store.hand(seq, None, (a.node, a.owns_from)).map(|_| ())
                } else {
                    back.insert(id);
                    Ok(())
                };
                if let Err(e) = r {
                    tracing::warn!("taking {}:{} back: {e}", id.node, id.seq);
                }
            }
            return self.take_back(adopter, back).await;
        }
    }

    /// Pulls the "received" marks the holder at `ep` has of this node's objects after
    /// `after` (stored here); whether it answered in full.
    async fn pull_marks(&self, ep: &str, after: u64) -> bool {
        let me = self.inner.cfg.node;
        let mut after = after;
        loop {
            match self.pull(ep, me, after).await {
                Ok(p) => match p.page.last() {
                    Some(l) if p.more && l.id.seq > after => after = l.id.seq,
                    _ => return true,
                },
                Err(e) => {
                    tracing::debug!("pulling received marks from {ep}: {e}");
                    return false;
                }
            }
        }
    }

    /// Disseminates the handed objects `back` here again: their closed records go, then
    /// they are matched afresh with this node as their owner.
    async fn take_back(&self, adopter: Adopter, back: HashSet<ObjectId>) {
        if back.is_empty() {
            return;
        }
        let n = back.len();
        let ids: Vec<ObjectId> = back.iter().copied().collect();
        let records = match self.inner.deliverer.reclaim(back).await {
            Ok(r) => r,
            Err(e) => {
                // the objects stay handed: a later view change tries again
                tracing::warn!("taking back {n} objects: {e}");
                return;
            }
        };
        let store = &self.inner.store;
        if let Err(e) = store.commit().await {
            tracing::warn!("taking back {n} objects: {e}");
        }
        for id in &ids {
            if let Err(e) = store.take_back(id.seq) {
                tracing::warn!("taking {}:{} back: {e}", id.node, id.seq);
            }
            lock(&self.inner.handed).remove(id);
            lock(&self.inner.adopted_away).remove(id);
        }
        self.inner
            .counters
            .taken_back
            .fetch_add(n as u64, Ordering::Relaxed);
        tracing::info!(
            "node {} is lost with {n} of this node's objects it had adopted: taken back \
             ({records} closed delivery records reopened)",
            adopter.node
        );
        for id in ids {
            match store.get(id) {
                Ok(Some(o)) => self.arrived(id, o.priority, &o.metadata),
                Ok(None) => tracing::warn!("object {}:{} taken back is not here", id.node, id.seq),
                Err(e) => tracing::warn!("reading object {}:{}: {e}", id.node, id.seq),
            }
        }
    }
}
