//! Subscription copies for a node that joins or returns (DESIGN §7): a subscription is
//! stored on the column quorum C(j) of the node that took its Create, and a node that was
//! not there then (a fresh disk at a free position, or a node that was down) pulls, at its
//! catch-up, the copies its position must hold: those placed by every node whose column
//! quorum contains it. Node 0 and node n-1 hold every subscription, so one of them answers
//! all of it; without either, every live node answers what it holds. Tombstones of
//! deleted subscriptions come with the copies, and what the node takes follows
//! `storage::replaces`: the newest revision wins and a deletion is final, so a node that
//! was down while a subscription changed or went drops the old version at its catch-up.

use super::*;
use replicate::View;

/// Copies per `Daemon.SubscriptionCopies` page.
const PAGE: u32 = 512;

/// How often the stall watch notes that this process runs ([`Daemon::stall_watch`]).
const STALL_TICK: Duration = Duration::from_millis(100);

/// How often a whole node takes what changed in its peers' feeds ([`Daemon::follow_peers`]).
const FOLLOW_PEERS_EVERY: Duration = Duration::from_secs(5);

impl Daemon {
    /// Answers `Daemon.SubscriptionCopies`: the copies held here that the nodes asked for
    /// placed.
    pub(super) fn copies_placed_by(
        &self,
        r: v1::SubscriptionCopiesRequest,
    ) -> Result<v1::SubscriptionCopiesResponse, ServiceError> {
        if r.placed_by.len() > runtime::grid::MAX_POSITIONS as usize {
            return Err(ServiceError::invalid(
                "placed_by",
                format!(
                    "at most {} nodes (the grid's positions)",
                    runtime::grid::MAX_POSITIONS
                ),
            ));
        }
        let limit = r.limit.clamp(1, 1024) as usize;
        let want: HashSet<u32> = r.placed_by.into_iter().collect();
        let store = &self.inner.store;
        let store_id = store.store_id();
        if r.by_change {
            let page = store.subscription_changes(r.after_change, limit, &want, r.changed_only)?;
            return Ok(v1::SubscriptionCopiesResponse {
                copies: page.copies.into_iter().map(copy_proto).collect(),
                more: page.more,
                whole: self.subscriptions_whole(),
                store_id,
                last_change: page.last,
            });
        }
        // read before the page: a tail from it sees every change made during the walk
        let last_change = store.last_subscription_change();
        let mut v = store.subscription_copies(r.after_id, limit + 1, &want, r.changed_only)?;
        let more = v.len() > limit;
        v.truncate(limit);
        Ok(v1::SubscriptionCopiesResponse {
            copies: v.into_iter().map(copy_proto).collect(),
            more,
            whole: self.subscriptions_whole(),
            store_id,
            last_change,
        })
    }

    /// This node pulled the copies its position must hold since it last registered and
    /// since its lease last lapsed (until then it may lack changes made while it was down,
    /// paused or cut off).
    pub(crate) fn subscriptions_whole(&self) -> bool {
        let at = self.inner.subs_pulled_at.load(Ordering::Acquire);
        at == self.inner.subs_gen.load(Ordering::Acquire) && !self.inner.stall.stalled()
    }

    /// Starts the stall watch: an OS thread of its own notes every [`STALL_TICK`] that the
    /// process runs (a busy async runtime does not hold it up, so only a process that was
    /// not run at all, paused or frozen, shows a gap), and a task here turns a gap of two
    /// thirds of a lease (the fence's margin) into a lapse for the subscription copies
    /// ([`Daemon::subscriptions_lapsed`]). The thread ends with the daemon.
    pub(super) fn stall_watch(&self) {
        let clock = self.inner.stall.clone();
        let started = std::thread::Builder::new()
            .name("stall-watch".into())
            .spawn(move || {
                // the daemon holds the other reference: gone, the watch ends
                while Arc::strong_count(&clock) > 1 {
                    std::thread::sleep(STALL_TICK);
                    clock.tick();
                }
            });
        if let Err(e) = started {
            tracing::warn!("starting the stall watch: {e}; a pause is found at heartbeats only");
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(STALL_TICK).await;
                let limit = me
                    .fence_lease()
                    .map_or(0, |l| (l * 2 / 3).as_millis() as u64);
                me.inner.stall.limit_ms.store(limit, Ordering::Release);
                if let Some(gap) = me.inner.stall.take_seen() {
                    tracing::warn!(
                        "this process did not run for {gap:?} (paused?): it may have been \
                         taken for dead, so its subscription copies are not whole until it \
                         pulled them again"
                    );
                    me.subscriptions_lapsed();
                }
            }
        });
    }

    /// This node's lease lapsed while it ran on (paused past it, cut off): taken for dead,
    /// it missed the creates, updates and deletes made meanwhile, and it did not register
    /// again, so the catch-up of its registration no longer vouches for its copies. Not
    /// whole (a rebuild or a standby's tail trusting it lost a subscription created
    /// meanwhile: `bench chaos` seed 56146) until it pulled them again.
    pub(super) fn subscriptions_lapsed(&self) {
        self.inner.subs_gen.fetch_add(1, Ordering::AcqRel);
        self.pull_subscriptions_until_whole();
    }

    /// Pulls the subscription copies this node's position must hold, and the tombstones;
    /// the answer is how many copies it took or dropped. From node 0 or node n-1 alone
    /// when one of them is whole; else from every live node, and then this node is whole
    /// only if every other position answered. Whole, it stays so until it registers again
    /// or its lease lapses (`coordinator/src/sim/copies.rs` checks these rules over random
    /// schedules).
    pub(super) async fn catch_up_subscriptions(&self, view: &View) -> usize {
        let Some(g) = view.grid else { return 0 };
        let generation = self.inner.subs_gen.load(Ordering::Acquire);
        let me = self.inner.cfg.node;
        let placers = g.placers_held_by(me);
        let full: Vec<u32> = [0, g.len() - 1]
            .into_iter()
            .filter(|&n| n != me && view.alive(n))
            .collect();
        let mut stored = 0;
        // a whole holder answers for everyone; one that is not whole yet (just back
        // itself) may lack what changed while it was down
        for (node, ep) in view.live_endpoints(full, &[me]) {
            match self.pull_subscriptions(node, &ep, &placers).await {
                Ok((n, whole)) => {
                    stored += n;
                    if whole {
                        self.inner
                            .subs_pulled_at
                            .store(generation, Ordering::Release);
                        return stored;
                    }
                    tracing::debug!("node {node} is catching up its subscriptions too");
                }
                Err(e) => tracing::debug!("subscription copies from node {node}: {e}"),
            }
        }
        // the union is whole only with every position in it: a create made while node 0
        // and node n-1 were both down is held by the rest of its column alone
        let mut answered = 0;
        for (node, ep) in view.live_endpoints(0..g.len(), &[me]) {
            match self.pull_subscriptions(node, &ep, &placers).await {
                Ok((n, _)) => {
                    stored += n;
                    answered += 1;
                }
                Err(e) => tracing::debug!("subscription copies from node {node}: {e}"),
            }
        }
        if answered + 1 == g.len() as usize {
            self.inner
                .subs_pulled_at
                .store(generation, Ordering::Release);
        }
        stored
    }

    /// Until this node's copies are whole, pulls them again every few heartbeats (a
    /// position that was down at the catch-up may be back), for as long as the node keeps
    /// the registration it caught up for.
    pub(super) fn pull_subscriptions_until_whole(&self) {
        self.every_few_heartbeats_until(Daemon::subscriptions_whole, |me| async move {
            let n = me.catch_up_subscriptions(&me.view()).await;
            me.inner
                .counters
                .copies_pulled
                .fetch_add(n as u64, Ordering::Relaxed);
            if n > 0 {
                tracing::info!("caught up: {n} more subscription copies this position holds");
            }
        });
    }

    /// Keeps this node's place in its peers' change feeds current while it is whole: every
    /// few seconds, what changed at each live peer it pulled from before (with the same
    /// placers). A copy placed here directly is no news (the revision rule), and one whose
    /// placement missed this node is taken now instead of at the next catch-up. Above all,
    /// the catch-up after an election is then a few pages: it used to take every change
    /// made since the last catch-up, and after a million creates every node stayed not
    /// whole for 30 s, so a second election in that window found no whole holder to vouch
    /// for a standby's registry and rebuilt in full.
    pub(super) async fn follow_peers(self) {
        loop {
            tokio::time::sleep(FOLLOW_PEERS_EVERY).await;
            if !self.subscriptions_whole() {
                continue; // the catch-up's own loop pulls until it is
            }
            let view = self.view();
            let Some(g) = view.grid else { continue };
            let me = self.inner.cfg.node;
            let placers = g.placers_held_by(me);
            let known: Vec<u32> = self
                .inner
                .sub_cursors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(_, c)| c.placers == placers)
                .map(|(n, _)| *n)
                .collect();
            for (node, ep) in view.live_endpoints(known, &[me]) {
                match self.pull_subscriptions(node, &ep, &placers).await {
                    Ok((n, _)) if n > 0 => {
                        tracing::debug!(
                            "{n} subscription copies node {node} had and this one lacked"
                        )
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!("following node {node}'s subscription copies: {e}"),
                }
            }
        }
    }

    /// The copies placed by `placers` that node `node` (at `ep`) holds and this one lacks,
    /// stored here; with whether that node's copies are whole. After a first pull from a
    /// node, only what changed there since (its change feed), as long as its store and the
    /// placers are the same: every copy it held then was taken then, so the catch-up
    /// after an election at a million subscriptions is a few pages, not every copy.
    async fn pull_subscriptions(
        &self,
        node: u32,
        ep: &str,
        placers: &[u32],
    ) -> Result<(usize, bool), ServiceError> {
        let known = self
            .inner
            .sub_cursors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)
            .filter(|c| c.placers == placers)
            .map(|c| (c.store_id, c.change));
        if let Some((store_id, change)) = known {
            match self
                .pull_subscription_pages(node, ep, placers, Some((store_id, change)))
                .await?
            {
                Some(r) => return Ok(r),
                None => tracing::info!(
                    "node {node} answered from another store (a new disk): all its copies"
                ),
            }
        }
        self.pull_subscription_pages(node, ep, placers, None)
            .await
            .map(Option::unwrap_or_default)
    }

    /// Pages of [`Daemon::pull_subscriptions`]: every copy (`from` none), or what changed
    /// after a change of the store `from` names (`None` back if the node answers from
    /// another store). Where the node's feed stands is noted for the next pull.
    async fn pull_subscription_pages(
        &self,
        node: u32,
        ep: &str,
        placers: &[u32],
        from: Option<(u64, u64)>,
    ) -> Result<Option<(usize, bool)>, ServiceError> {
        let store = &self.inner.store;
        let mut after = 0;
        let mut after_change = from.map_or(0, |f| f.1);
        let mut stored = 0;
        let mut whole = true;
        let mut cursor: Option<(u64, u64)> = None;
        let (started, mut listed) = (Instant::now(), 0usize);
        loop {
            let r = self
                .peer(ep)?
                .subscription_copies(v1::SubscriptionCopiesRequest {
                    after_id: after,
                    limit: PAGE,
                    placed_by: placers.to_vec(),
                    changed_only: false,
                    by_change: from.is_some(),
                    after_change,
                })
                .await?
                .into_inner();
            if from.is_some_and(|f| f.0 != r.store_id) {
                return Ok(None);
            }
            // by id, the feed as the first page found it; by change, the last page's
            if from.is_some() || cursor.is_none() {
                cursor = Some((r.store_id, r.last_change));
            }
            whole &= r.whole;
            listed += r.copies.len();
            let before = stored;
            for c in &r.copies {
                if c.record.len() > self.inner.limits.max_object_bytes {
                    return Err(ServiceError::invalid(
                        "copies.record",
                        "larger than the object limit",
                    ));
                }
                if c.deleted {
                    if !store.subscription_deleted(c.id)? {
                        store.remove_subscription_unflushed(c.id)?;
                        stored += 1;
                    }
                } else if store.apply_subscription_copy_unflushed(
                    c.id,
                    &c.record,
                    c.revision,
                    Some(c.placed_by),
                    false,
                )? {
                    stored += 1;
                }
            }
            if stored > before {
                store.commit().await?;
            }
            let more = if from.is_some() {
                let more = r.more && r.last_change > after_change;
                after_change = r.last_change;
                more
            } else {
                match r.copies.last() {
                    Some(last) if r.more => {
                        after = last.id;
                        true
                    }
                    _ => false,
                }
            };
            if !more {
                if let Some((store_id, change)) = cursor {
                    self.inner
                        .sub_cursors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(
                            node,
                            PeerCursor {
                                placers: placers.to_vec(),
                                store_id,
                                change,
                            },
                        );
                }
                tracing::debug!(
                    "node {node}'s subscription copies: {listed} listed, {stored} taken, in {} \
                     ms ({})",
                    started.elapsed().as_millis(),
                    if from.is_some() { "its changes" } else { "all" }
                );
                return Ok(Some((stored, whole)));
            }
        }
    }
}

/// The stall watch's clock, shared by its thread and the daemon: when the thread last ran
/// (ms since `started`), the gap that counts as a stall (0: none yet, no lease known), and
/// a stall seen and not yet taken.
#[derive(Debug)]
pub(super) struct StallClock {
    started: Instant,
    ticked_ms: AtomicU64,
    pub(super) limit_ms: AtomicU64,
    seen_ms: AtomicU64,
}

impl StallClock {
    pub(super) fn new() -> StallClock {
        StallClock {
            started: Instant::now(),
            ticked_ms: AtomicU64::new(0),
            limit_ms: AtomicU64::new(0),
            seen_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The gap since the last tick, when it is over the limit.
    fn gap(&self, now: u64) -> Option<u64> {
        let limit = self.limit_ms.load(Ordering::Acquire);
        let gap = now.saturating_sub(self.ticked_ms.load(Ordering::Acquire));
        (limit > 0 && gap > limit).then_some(gap)
    }

    /// The thread ran: a gap over the limit is noted as a stall.
    fn tick(&self) {
        let now = self.now_ms();
        if let Some(gap) = self.gap(now) {
            self.seen_ms.fetch_max(gap, Ordering::AcqRel);
        }
        self.ticked_ms.store(now, Ordering::Release);
    }

    /// A stall not yet taken, or one under way (the thread has not run since: a process
    /// continued answers before its thread ran again).
    fn stalled(&self) -> bool {
        self.seen_ms.load(Ordering::Acquire) > 0 || self.gap(self.now_ms()).is_some()
    }

    /// The stall seen since the last call, if any.
    fn take_seen(&self) -> Option<Duration> {
        match self.seen_ms.swap(0, Ordering::AcqRel) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

/// Where a peer's change feed stood at this node's last complete pull from it.
#[derive(Debug, Clone)]
pub(super) struct PeerCursor {
    placers: Vec<u32>,
    store_id: u64,
    change: u64,
}

/// A listed copy (or tombstone) as `Daemon.SubscriptionCopies` sends it.
pub(crate) fn copy_proto(c: storage::SubCopy) -> v1::SubscriptionCopy {
    v1::SubscriptionCopy {
        id: c.id,
        deleted: c.record.is_none(),
        record: c.record.unwrap_or_default(),
        only_if_held: false,
        placed_by: c.placed_by.unwrap_or(0),
        revision: c.revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_over_the_limit_is_a_stall_until_taken_and_none_without_a_lease() {
        let c = StallClock::new();
        c.tick();
        assert!(!c.stalled(), "no limit yet (no lease known)");
        // no lease: a gap is no stall
        c.ticked_ms.store(0, Ordering::Release);
        std::thread::sleep(Duration::from_millis(30));
        c.tick();
        assert!(!c.stalled() && c.take_seen().is_none());
        c.limit_ms.store(20, Ordering::Release);
        c.tick();
        assert!(!c.stalled(), "ticked just now");
        // the process not run for a while: seen before the thread runs, and after it
        std::thread::sleep(Duration::from_millis(40));
        assert!(c.stalled(), "a gap under way");
        c.tick();
        assert!(c.stalled(), "a gap seen and not taken");
        let gap = c.take_seen().expect("the gap");
        assert!(gap >= Duration::from_millis(40), "{gap:?}");
        assert!(!c.stalled() && c.take_seen().is_none(), "taken");
    }
}
