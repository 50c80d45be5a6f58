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
//! its quorum alive again) hands them to it once more: one owner each. An adopter alive can
//! give objects up too (to another claimant, at its relearn); the origin's audit
//! ([`Daemon::auditor`]) finds what a live adopter no longer claims and settles it the same
//! way.

use super::*;
use ownership::Adopter;

/// Between two tries while a live member of the quorum does not answer.
const RETRY: Duration = Duration::from_millis(500);

/// Between two looks at what live adopters still claim ([`Daemon::auditor`]).
const AUDIT_EVERY: Duration = Duration::from_secs(2);

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
        loop {
            let view = self.view();
            if !adopter.lost(&view) || view.grid.is_none() {
                return; // back meanwhile, on its disk: still its (or no grid: no quorum)
            }
            // in order (the store's)
            let seqs: Vec<u64> = self
                .handings()
                .into_iter()
                .filter(|(_, a)| *a == adopter)
                .map(|(s, _)| s)
                .collect();
            if seqs.is_empty() {
                return;
            }
            match self.settle_handed(adopter, seqs, true).await {
                Some(back) => return self.take_back(adopter, back).await,
                None => tokio::time::sleep(RETRY).await,
            }
        }
    }

    /// Where the handed objects `seqs` (in order) go, once the adopter they were handed to
    /// no longer has them (lost, or `lost` false: it gave them up): asked of every live
    /// member of the quorum (the adopter only when not lost), what one knows delivered
    /// leaves the outbox, what one adopted is handed to it, and the rest is the answer, to
    /// take back. `None` when a member did not answer (or a lost adopter is back).
    async fn settle_handed(
        &self,
        adopter: Adopter,
        seqs: Vec<u64>,
        lost: bool,
    ) -> Option<HashSet<ObjectId>> {
        let me = self.inner.cfg.node;
        let view = self.view();
        let g = view.grid?;
        let after = seqs.first()?.saturating_sub(1);
        let skip: &[u32] = if lost { &[me, adopter.node] } else { &[me] };
        let mut finished = HashSet::new();
        let mut elsewhere = HashMap::new();
        for (member, ep) in view.live_endpoints(g.xs_quorum(me), skip) {
            for set in [
                v1::ReplicaSet::Finished,
                v1::ReplicaSet::Forwarding,
                v1::ReplicaSet::Adopted,
            ] {
                let (got, answered) = self.replica_seqs(&ep, me, set, after).await;
                if !answered {
                    tracing::debug!(
                        "settling what node {} had: node {member} did not answer",
                        adopter.node
                    );
                    return None;
                }
                if set == v1::ReplicaSet::Adopted {
                    let a = Adopter::in_view(member, &view);
                    elsewhere.extend(got.into_iter().map(|s| (s, a)));
                } else {
                    finished.extend(got);
                }
            }
            if !self.pull_marks(&ep, after).await {
                return None;
            }
        }
        if lost && !adopter.lost(&self.view()) {
            return None;
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
                tracing::warn!("settling {}:{}: {e}", id.node, id.seq);
            }
        }
        Some(back)
    }

    /// Every [`AUDIT_EVERY`]: what this node handed to live adopters that no longer claim it
    /// (gave it up to another claimant, which may since be lost) goes to whoever has it now,
    /// or is taken back. An object is settled only when its adopter did not claim it at two
    /// audits in a row: between its last delivery and its copies' end an adopter claims it
    /// neither adopted nor finished for a moment. Before, an origin that had handed an
    /// object to one of two claimants kept it handed there after that one gave it up, and
    /// lost it when the other's disk was lost (`daemon/ownsim`, seed 2028786).
    pub(super) async fn auditor(self) {
        let mut tick = tokio::time::interval(AUDIT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut suspects: HashSet<u64> = HashSet::new();
        loop {
            tick.tick().await;
            if !self.inner.caught_up.load(Ordering::Acquire) {
                continue;
            }
            suspects = self.audit_handed(&suspects).await;
        }
    }

    /// One audit: the handed objects their live adopters do not claim now (the answer); those
    /// among `suspects` (not claimed at the last audit either) are settled.
    async fn audit_handed(&self, suspects: &HashSet<u64>) -> HashSet<u64> {
        let me = self.inner.cfg.node;
        let view = self.view();
        let mut by_adopter: BTreeMap<Adopter, Vec<u64>> = BTreeMap::new();
        for (seq, a) in self.handings() {
            if !a.lost(&view) {
                by_adopter.entry(a).or_default().push(seq);
            }
        }
        let mut unclaimed = HashSet::new();
        for (adopter, seqs) in by_adopter {
            let Some(ep) = view.live_endpoints([adopter.node], &[]).into_iter().next() else {
                continue;
            };
            let after = seqs.first().map_or(0, |s| s.saturating_sub(1));
            let mut claimed = HashSet::new();
            let mut whole = true;
            for set in [
                v1::ReplicaSet::Adopted,
                v1::ReplicaSet::Finished,
                v1::ReplicaSet::Forwarding,
            ] {
                let (got, answered) = self.replica_seqs(&ep.1, me, set, after).await;
                whole &= answered;
                claimed.extend(got);
            }
            if !whole {
                continue;
            }
            let dropped: Vec<u64> = seqs.into_iter().filter(|s| !claimed.contains(s)).collect();
            let settle: Vec<u64> = dropped
                .iter()
                .copied()
                .filter(|s| suspects.contains(s))
                .collect();
            unclaimed.extend(dropped);
            if settle.is_empty() {
                continue;
            }
            tracing::info!(
                "node {} no longer has {} objects this node handed it: settling them",
                adopter.node,
                settle.len()
            );
            if let Some(back) = self.settle_handed(adopter, settle.clone(), false).await {
                for s in &settle {
                    unclaimed.remove(s);
                }
                self.take_back(adopter, back).await;
            }
        }
        unclaimed
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
            "node {} no longer has {n} of this node's objects it had adopted (lost, or gave \
             them up): taken back ({records} closed delivery records reopened)",
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
