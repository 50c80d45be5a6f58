//! A node whose disk lost some of its own objects (a record that did not check out at open:
//! `storage::repair`) takes them back from their copies: its row quorum got each object
//! before the put was acknowledged. This runs first in every catch-up, before the node
//! answers what it holds or resumes anything, so no holder takes the lost objects for
//! finished and no delivery waits on bytes that are gone: until the repair is done (or given
//! up), a holder asking this node for its own objects is answered unavailable, and a link's
//! acknowledgement of a lost object does not end its copies. A repair a silent holder left
//! unsettled is tried again every few heartbeats.

use super::*;

/// Copies asked per page.
const PAGE: u32 = 512;

impl Daemon {
    /// Restores this node's lost objects from the copies the live members of its quorum hold;
    /// what no holder has once all of them answered is given up (named in the log).
    pub(super) async fn repair_own(&self, view: &replicate::View) {
        let store = &self.inner.store;
        let want: HashSet<u64> = store.to_repair().into_iter().collect();
        let Some(g) = view.grid else { return };
        if want.is_empty() {
            return;
        }
        let me = self.inner.cfg.node;
        let first = want.iter().min().copied().unwrap_or(0);
        let mut restored = 0;
        let mut all_answered = true;
        for (holder, ep) in view.live_endpoints(g.xs_quorum(me), &[me]) {
            if store.to_repair().is_empty() {
                break;
            }
            match self
                .copies_of_own(&ep, first.saturating_sub(1), &want)
                .await
            {
                Ok(copies) => match store.restore_own(&copies) {
                    Ok(n) => restored += n,
                    Err(e) => tracing::error!("restoring this node's objects: {e}"),
                },
                Err(e) => {
                    tracing::warn!("asking node {holder} for copies of lost objects: {e}");
                    all_answered = false;
                }
            }
        }
        let left = store.to_repair();
        if all_answered && !left.is_empty() {
            tracing::warn!(
                "no holder has a copy of {} object(s) this node lost at open (puts a crash cut \
                 off before their answer, or objects already delivered): {left:?}",
                left.len()
            );
            if let Err(e) = store.give_up_repair(&left) {
                tracing::error!("{e}");
            }
        }
        if let Err(e) = store.commit().await {
            tracing::error!("storing the restored objects: {e}");
            return;
        }
        if restored > 0 {
            tracing::info!(
                "restored {restored} object(s) this node lost at open from their copies"
            );
        }
    }

    /// Asks again, every few heartbeats while this registration lasts, for the copies of
    /// the objects lost at open that a catch-up could not settle (a holder did not answer):
    /// until then they are not disseminated, and holders' catch-ups with this node wait.
    pub(super) fn repair_until_done(&self) {
        self.every_few_heartbeats_until(
            |me| me.inner.store.to_repair().is_empty(),
            |me| async move { me.repair_own(&me.view()).await },
        );
    }

    /// Gives up the objects this node lost at open when nothing can hold copies of them
    /// (`why`): without a grid an object lives on its node alone. (Kept, they would hold the
    /// outbox floor, and every start would match again what came after them.)
    pub(super) fn give_up_lost(&self, why: &str) {
        let store = &self.inner.store;
        let lost = store.to_repair();
        if lost.is_empty() {
            return;
        }
        tracing::warn!(
            "{} object(s) this node lost at open cannot be restored ({why}): {lost:?}",
            lost.len()
        );
        if let Err(e) = store.give_up_repair(&lost) {
            tracing::error!("{e}");
        }
    }

    /// The copies of this node's objects after `after` that the node at `ep` holds, of those
    /// in `want`.
    async fn copies_of_own(
        &self,
        ep: &str,
        after: u64,
        want: &HashSet<u64>,
    ) -> Result<Vec<storage::StoredObject>, ServiceError> {
        let me = self.inner.cfg.node;
        let mut c = self.peer(ep)?;
        let mut out = Vec::new();
        let mut after = after;
        loop {
            let r = c
                .replicas(v1::ReplicasRequest {
                    origin: me,
                    after_seq: after,
                    limit: PAGE,
                    set: v1::ReplicaSet::Unfinished as i32,
                })
                .await?
                .into_inner();
            let before = after;
            for o in r.objects {
                let o = replicate::replica_from_proto(o, &self.inner.limits)?;
                after = after.max(o.id.seq);
                if o.id.node == me && want.contains(&o.id.seq) {
                    out.push(o);
                }
            }
            if !r.more || after == before {
                return Ok(out);
            }
        }
    }
}
