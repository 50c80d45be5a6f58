//! One owner per object, and catching up (DESIGN §7). An object is disseminated by its
//! origin while the origin is alive; when the origin's lease expires, the first live member
//! of its xS quorum in [`runtime::grid::Grid::successor`]'s order (its row quorum first)
//! takes over: it pulls the copies it lacks from the other live holders, adopts every
//! unfinished copy into its outbox and sends them to the coordinator as their owner (the
//! matches come to it, and delivery ids are per (subscription, object), so a repeat is
//! stored once). When the origin is alive again ownership does not move back for what the
//! successor adopted: it disseminates those until they are finished (moving them back would
//! race its deliveries in progress and show a QoS 2 subscriber a delivery twice). The
//! origin, which keeps its own outbox on its disk, first leaves out of it what was finished
//! meanwhile (its holders' tombstones) and what its successor adopted, then resends the rest
//! and owns its new objects again. A node that was down catches up on start: it pulls, by
//! sequence ranges, the unfinished objects of every origin whose quorum it belongs to, and
//! drops the copies their origins finished meanwhile, never those below the origin's first
//! sequence number: they belong to an earlier node at that position (a lost disk), which the
//! origin never held, and are its heir's to take over.

use super::*;
use ownership::{Adopter, TakeOver, adopters_lost, claims, quorum_back};
use replicate::{View, replica_from_proto};

/// Objects per `Daemon.Replicas` page.
const PAGE: u32 = 512;

/// Rounds a takeover tries a holder that does not answer (500 ms apart).
const PULL_ROUNDS: u32 = 8;

impl Daemon {
    /// Reacts to a changed view: takes over dead origins this node succeeds, gives back
    /// origins that came back (the rules: [`ownership::Ownership::view_changed`]).
    pub(super) fn membership_changed(&self, old: &View, new: &View) {
        let me = self.inner.cfg.node;
        let takeovers = lock(&self.inner.ownership).view_changed(me, old, new);
        for TakeOver { origin, below } in takeovers {
            let me = self.clone();
            tokio::spawn(async move { me.take_over(origin, below).await });
        }
        let back = quorum_back(me, old, new);
        if !back.is_empty() {
            self.members_back(&back);
        }
        // what this node handed to an adopter that is lost now, it takes back
        let adopters = self.handings().into_iter().map(|(_, a)| a);
        for adopter in adopters_lost(adopters, old, new) {
            let me = self.clone();
            tokio::spawn(async move { me.reclaim(adopter).await });
        }
    }

    /// Pulls `origin`'s unfinished objects from `from` after `after`, one page (their received
    /// marks are stored here).
    pub(super) async fn pull(
        &self,
        from: &str,
        origin: u32,
        after: u64,
    ) -> Result<Pulled, ServiceError> {
        let mut c = self.peer(from)?;
        let r = c
            .replicas(v1::ReplicasRequest {
                origin,
                after_seq: after,
                limit: PAGE,
                set: v1::ReplicaSet::Unfinished as i32,
            })
            .await?
            .into_inner();
        let mut page = Vec::with_capacity(r.objects.len());
        for o in r.objects {
            let o = replica_from_proto(o, &self.inner.limits)?;
            if o.id.node == origin {
                page.push(o);
            }
        }
        let marks: Vec<(ObjectId, u64)> = replicate::marks_from_proto(&r.received)
            .into_iter()
            .filter(|(id, _)| id.node == origin)
            .collect();
        tracing::debug!(
            "pulled {} objects and {} received marks of node {origin} from {from}",
            page.len(),
            marks.len()
        );
        self.inner.store.mark_received_unflushed(&marks)?;
        Ok(Pulled {
            page,
            more: r.more,
            owns_from: r.owns_from,
            next_seq: r.next_seq,
            forwarding: r.forwarding,
        })
    }

    /// Every unfinished object of `origin` that `from` holds, stored as copies here; the
    /// answer is the sequence numbers `from` holds unfinished, and (when `from` is the
    /// origin) its store's range: the first sequence number it handed out and the next.
    async fn pull_all(
        &self,
        from: &str,
        origin: u32,
    ) -> Result<(Vec<u64>, SeqRange), ServiceError> {
        let mut after = 0;
        let mut seen = Vec::new();
        let mut range = SeqRange::default();
        loop {
            let Pulled {
                page,
                more,
                owns_from,
                next_seq,
                forwarding,
            } = self.pull(from, origin, after).await?;
            range.owns_from = range.owns_from.max(owns_from);
            // the first page's (or a lower one, short of an unwritten put): an object handed
            // out after it may belong to a page already answered
            if next_seq > 0 {
                range.next_seq = match range.next_seq {
                    0 => next_seq,
                    n => n.min(next_seq),
                };
            }
            if let Some(last) = page.last() {
                after = last.id.seq;
            }
            seen.extend(page.iter().map(|o| o.id.seq));
            if !page.is_empty() {
                let store = &self.inner.store;
                store.put_replicas_unflushed(&page)?;
                // a copy this node adopted stays unfinished: only it knows whether the
                // object was delivered (an origin that handed it over still owes it to its
                // links, and answered it forwarding: the adopted copy then read as gone and
                // was never sent for matching; 21 objects lost, `bench chaos` seed 18188)
                let forwarding: Vec<ObjectId> = forwarding
                    .into_iter()
                    .map(|seq| ObjectId { node: origin, seq })
                    .filter(|id| !store.in_outbox(*id))
                    .collect();
                store.forward_replicas(&forwarding)?;
                store.commit().await?;
            }
            if !more || page.is_empty() {
                return Ok((seen, range));
            }
        }
    }

    /// Whether a takeover of `origin`'s objects below `below` still stands.
    fn still_taking(&self, origin: u32, below: u64) -> bool {
        lock(&self.inner.ownership).still_taking(origin, below)
    }

    /// Takes over the objects of `origin` with sequence numbers below `below` (all of them,
    /// `u64::MAX`, when it is dead; those of an earlier node at its position, else): gathers
    /// the copies the other live holders have, adopts every unfinished one and sends them to
    /// the coordinator as their owner.
    async fn take_over(self, origin: u32, below: u64) {
        let Some(g) = self.grid() else { return };
        let me = self.inner.cfg.node;
        // a holder that fails is tried again while the view says it lives (nodes that died
        // together expire one after the other)
        let mut todo: Vec<u32> = g
            .xs_quorum(origin)
            .into_iter()
            .filter(|&h| h != me && h != origin)
            .collect();
        // what each holder answered unfinished (their ends may have been lost)
        let mut held_at = Vec::new();
        for round in 0..PULL_ROUNDS {
            let mut failed = Vec::new();
            for (holder, ep) in self.view().live_endpoints(todo, &[]) {
                match self.pull_all(&ep, origin).await {
                    Ok((seqs, _)) => held_at.push((holder, seqs)),
                    Err(e) => {
                        tracing::debug!("pulling node {origin}'s objects from node {holder}: {e}");
                        failed.push(holder);
                    }
                }
            }
            if failed.is_empty() {
                break;
            }
            if round + 1 == PULL_ROUNDS {
                tracing::warn!(
                    "took node {origin}'s objects over without the copies of nodes {failed:?} \
                     (unreachable, though not yet known dead)"
                );
            }
            todo = failed;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // what a live node adopted already stays with it: one owner per object
        let (taken, _) = self.adopted_in_quorum(origin).await;
        // and what a live holder knows delivered is not disseminated again (a copy here can
        // have missed its end: pulled from a holder just before it learned it); what a link
        // still owes stays, as forwarding
        let (finished, forwarding) = self.finished_elsewhere(origin).await;
        let ids = |seqs: &HashSet<u64>| -> Vec<ObjectId> {
            seqs.iter()
                .map(|&seq| ObjectId { node: origin, seq })
                .collect()
        };
        let store = &self.inner.store;
        let ended = store
            .forward_replicas(&ids(&forwarding))
            .and_then(|()| store.finish_replicas(&ids(&finished)));
        if let Err(e) = ended {
            tracing::warn!("ending node {origin}'s finished copies: {e}");
        }
        let finished: HashSet<u64> = finished.union(&forwarding).copied().collect();
        let mut after = 0;
        let mut adopted = Vec::new();
        loop {
            if !self.still_taking(origin, below) {
                return; // it came back meanwhile, or another node succeeds it now
            }
            let page = match self
                .inner
                .store
                .unfinished_replicas(origin, after, PAGE as usize)
            {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("reading node {origin}'s copies: {e}");
                    return;
                }
            };
            let Some(last) = page.last() else { break };
            after = last.id.seq;
            let claimed: Vec<storage::StoredObject> = page
                .into_iter()
                .filter(|o| claims(o.id.seq, below, &taken, &finished))
                .filter(|o| matches!(store.adopt(o.id), Ok(true)))
                .collect();
            if claimed.is_empty() {
                continue;
            }
            // durable before anyone learns of them (the origin, back, closes what it hears
            // adopted), and before they are sent for matching
            if let Err(e) = store.commit().await {
                tracing::error!("storing the adoption of node {origin}'s objects: {e}");
                return;
            }
            let ids: Vec<(ObjectId, u8)> = claimed.iter().map(|o| (o.id, o.priority)).collect();
            store.adopted(&ids);
            for o in claimed {
                // given up to another claimant once, perhaps: its own delivery ends copies
                lock(&self.inner.adopted_away).remove(&o.id);
                self.arrived(o.id, o.priority, &o.metadata);
                adopted.push(o);
            }
        }
        self.inner
            .counters
            .taken_over
            .fetch_add(adopted.len() as u64, Ordering::Relaxed);
        tracing::info!(
            "took over {} unfinished objects of node {origin}",
            adopted.len()
        );
        // what the origin owed its federation links, this node owes them now
        self.owe_taken_over(origin, below, &adopted).await;
        self.end_holders_delivered(origin, below, &held_at).await;
    }

    /// Sequence numbers of `origin`'s objects, from the oldest unfinished copy here on, that
    /// other live members of its quorum know finished, and (apart) those they know delivered
    /// but still owed to a federation link (forwarding).
    pub(super) async fn finished_elsewhere(&self, origin: u32) -> (HashSet<u64>, HashSet<u64>) {
        let mut done = HashSet::new();
        let mut forwarding = HashSet::new();
        let oldest = match self.inner.store.unfinished_replicas(origin, 0, 1) {
            Ok(v) => v.first().map(|o| o.id.seq),
            Err(e) => {
                tracing::warn!("reading node {origin}'s copies: {e}");
                None
            }
        };
        let view = self.view();
        let (Some(oldest), Some(g)) = (oldest, view.grid) else {
            return (done, forwarding);
        };
        let skip = [self.inner.cfg.node, origin];
        for (_, ep) in view.live_endpoints(g.xs_quorum(origin), &skip) {
            let delivered = self
                .seqs_of(&ep, origin, v1::ReplicaSet::Finished, oldest - 1)
                .await;
            let owed: HashSet<u64> = self
                .seqs_of(&ep, origin, v1::ReplicaSet::Forwarding, oldest - 1)
                .await
                .into_iter()
                .collect();
            for seq in delivered {
                if owed.contains(&seq) {
                    forwarding.insert(seq);
                } else {
                    done.insert(seq); // finished: every link had it
                }
            }
        }
        forwarding.retain(|s| !done.contains(s));
        (done, forwarding)
    }

    /// Sequence numbers of `origin`'s objects that other live members of its quorum (this
    /// node and the origin aside) adopted, and whether every one of them answered in full.
    pub(super) async fn adopted_in_quorum(&self, origin: u32) -> (HashSet<u64>, bool) {
        let mut taken = HashSet::new();
        let view = self.view();
        let Some(g) = view.grid else {
            return (taken, false);
        };
        let mut full = true;
        let skip = [self.inner.cfg.node, origin];
        for (_, ep) in view.live_endpoints(g.xs_quorum(origin), &skip) {
            let (seqs, answered) = self
                .replica_seqs(&ep, origin, v1::ReplicaSet::Adopted, 0)
                .await;
            taken.extend(seqs);
            full &= answered;
        }
        (taken, full)
    }

    /// Every sequence number of `origin`'s objects in `set` that the node at `ep` answers,
    /// after `after` (an unreachable node answers what it answered so far).
    pub(super) async fn seqs_of(
        &self,
        ep: &str,
        origin: u32,
        set: v1::ReplicaSet,
        after: u64,
    ) -> Vec<u64> {
        self.replica_seqs(ep, origin, set, after).await.0
    }

    /// [`Daemon::seqs_of`] (for the unfinished set, the ids of the objects answered), and
    /// whether the node answered in full.
    pub(super) async fn replica_seqs(
        &self,
        ep: &str,
        origin: u32,
        set: v1::ReplicaSet,
        after: u64,
    ) -> (Vec<u64>, bool) {
        let mut out = Vec::new();
        let mut after = after;
        loop {
            let r = match self.peer(ep) {
                Ok(mut c) => c
                    .replicas(v1::ReplicasRequest {
                        origin,
                        after_seq: after,
                        limit: PAGE,
                        set: set as i32,
                    })
                    .await
                    .map(|r| r.into_inner()),
                Err(e) => Err(e.into()),
            };
            let Ok(r) = r else { return (out, false) };
            let page: Vec<u64> = if set == v1::ReplicaSet::Unfinished {
                r.objects
                    .iter()
                    .filter_map(|o| o.id.as_ref())
                    .filter(|id| id.node == origin)
                    .map(|id| id.seq)
                    .collect()
            } else {
                r.seqs
            };
            out.extend(&page);
            match page.last() {
                Some(&l) if r.more && l > after => after = l,
                _ => return (out, true),
            }
        }
    }

    /// The objects part of [`Daemon::catch_up`]: what this node's disk lost, the unfinished
    /// objects of the origins whose quorum holds it, and the end of copies finished
    /// meanwhile; the answer is how many objects it pulled.
    async fn catch_up_objects(&self, view: &View, g: &runtime::grid::Layout, me: u32) -> usize {
        // first what its own disk lost: until then it would answer those objects as gone
        self.repair_own(view).await;
        self.repair_until_done();
        let mut pulled = 0usize;
        for (origin, ep) in view.live_endpoints(g.origins_held_by(me), &[]) {
            match self.pull_all(&ep, origin).await {
                Ok((held, range)) => {
                    pulled += held.len();
                    // what the origin no longer holds was finished, or handed over to a
                    // member that adopted it: that member is asked, and with one that does
                    // not answer (or is down) nothing is ended this time (an heir paused
                    // past its lease had its adoption ended so; `daemon/ownsim`)
                    let (taken, whole) = self.adopted_in_quorum(origin).await;
                    let all_alive = g
                        .xs_quorum(origin)
                        .into_iter()
                        .filter(|&m| m != me && m != origin)
                        .all(|m| view.alive(m));
                    if !(whole && all_alive) {
                        tracing::debug!(
                            "not ending node {origin}'s copies: a member of its quorum is down"
                        );
                        continue;
                    }
                    if let Err(e) = self.drop_finished(origin, &held, range, &taken) {
                        tracing::warn!("dropping node {origin}'s finished copies: {e}");
                    }
                }
                Err(e) => tracing::debug!("catching up with node {origin}: {e}"),
            }
        }
        self.end_predecessors_delivered(view).await;
        pulled
    }

    /// Catching up at (re)registration: for every origin whose quorum holds this node, the
    /// unfinished objects this node lacks, and the end of copies their origin finished; for
    /// this node's own outbox, the objects a successor finished while it was down.
    pub(super) async fn catch_up(&self) {
        let view = self.view();
        let Some(g) = view.grid else {
            self.give_up_lost("no grid: no other node holds copies");
            return self.resume_deliveries(&HashSet::new());
        };
        let me = self.inner.cfg.node;
        if !g.contains(me) {
            self.give_up_lost("this node is outside the grid: no quorum holds its copies");
            return self.resume_deliveries(&HashSet::new());
        }
        // the subscription copies beside the objects: a coordinator's rebuild or tail
        // trusts this node's copies only once they are whole, and behind the objects'
        // catch-up (seconds on a busy machine) an election found no whole node and rebuilt
        // a million subscriptions in full (`bench failover --subs 1000000`, 15 s)
        let (pulled, subs) = tokio::join!(
            self.catch_up_objects(&view, &g, me),
            self.catch_up_subscriptions(&view)
        );
        self.inner
            .counters
            .copies_pulled
            .fetch_add((pulled + subs) as u64, Ordering::Relaxed);
        if subs > 0 {
            tracing::info!("caught up: {subs} subscription copies this position holds");
        }
        self.pull_subscriptions_until_whole();
        // a member that does not answer now is asked again by the relearn before the fence
        // lifts (the fence at start)
        let (handed, _) = self.learn_finished(&view).await;
        if pulled + handed.len() > 0 {
            tracing::info!(
                "caught up: {pulled} unfinished objects of other nodes; {} of this node's \
                 were finished or taken over meanwhile",
                handed.len()
            );
        }
        self.resume_deliveries(&handed);
        self.end_stale_copies(&view).await;
        // the records of handed-over objects were closed: durably now, or a kill before the
        // next flush opens them again for a start whose catch-up may not learn them handed
        if !handed.is_empty()
            && let Err(e) = self.inner.store.commit().await
        {
            tracing::warn!("storing the closed records of handed-over objects: {e}");
        }
        self.hand_over(handed);
    }

    /// Resumes the unfinished delivery records once (at the first catch-up), leaving out
    /// those of objects others finished or took over while this node was down.
    pub(super) fn resume_deliveries(&self, handed: &HashSet<ObjectId>) {
        if self.inner.resuming.swap(true, Ordering::AcqRel) {
            return;
        }
        let r = self.inner.deliverer.resume_except(handed);
        // only now are the records open in memory: a reader told "resumed" while they were
        // being opened looked neither on disk nor in memory, took an undelivered object for
        // delivered and ended its copies; the node's own relearn then found it finished at
        // a holder and closed its QoS 2 deliveries (28 objects lost, `bench chaos` seed
        // 6009: a federation link's acknowledgements arriving during the resume)
        self.inner.resumed.store(true, Ordering::Release);
        match r {
            Ok(n) if n > 0 => tracing::info!("resuming {n} unfinished deliveries"),
            Ok(_) => {}
            Err(e) => tracing::warn!("reading unfinished deliveries: {e}"),
        }
    }

    /// Marks finished the copies of `origin` below the next sequence number its store hands
    /// out (or, from an origin that does not say it, up to the highest it still holds) that
    /// it no longer holds (finished while this node was down). Left alone: copies below
    /// `owns_from`, the origin's first sequence number (an earlier node's at that position,
    /// its disk lost, which the origin never held: its heir takes them over), and copies
    /// this node or another member (`taken`) adopted and still disseminates (the origin
    /// handed them over). An origin
    /// that holds none of its objects any more ends every copy of them here: a holder killed
    /// before its ends reached its disk kept copies of delivered objects, and once the origin
    /// lost its disk, its heir delivered them again (QoS 2 duplicates, `bench chaos` seed
    /// 17095).
    fn drop_finished(
        &self,
        origin: u32,
        held: &[u64],
        range: SeqRange,
        taken: &HashSet<u64>,
    ) -> Result<(), ServiceError> {
        let owns_from = range.owns_from;
        // not above what the origin said it had handed out: a higher copy held here came
        // after its answer, which could not have named it
        let top = match range.next_seq {
            0 => held.iter().max().copied().unwrap_or(0),
            n => n,
        };
        if top == 0 {
            return Ok(());
        }
        let held: HashSet<u64> = held.iter().copied().collect();
        let store = &self.inner.store;
        let mut mine: Vec<ObjectId> = store
            .unfinished_replicas(origin, 0, usize::MAX)?
            .iter()
            .map(|o| o.id)
            .collect();
        // and forwarding copies whose links all had the object meanwhile
        mine.extend(
            store
                .forwarding_seqs(origin, 0, usize::MAX)?
                .into_iter()
                .map(|seq| ObjectId { node: origin, seq }),
        );
        // what this node adopted and still disseminates is not the origin's to answer for
        // (it handed them over): ending the copy here would take the object from under its
        // pending deliveries (a QoS 2 release lost; found by `bench chaos`)
        let open = self.inner.deliverer.open_objects(origin);
        let gone: Vec<ObjectId> = mine
            .into_iter()
            .filter(|id| id.seq >= owns_from && id.seq < top && !held.contains(&id.seq))
            .filter(|id| !store.in_outbox(*id) && !open.contains(&id.seq))
            .filter(|id| !taken.contains(&id.seq))
            .collect();
        // the evidence if a copy is ended that its origin still disseminates (`bench chaos
        // --quick`, seed 31: a member answered such an object finished)
        for id in &gone {
            tracing::debug!(
                "{}:{} is not among its origin's unfinished objects (below {top}): ended here",
                id.node,
                id.seq
            );
        }
        self.inner.store.finish_replicas(&gone)?;
        Ok(())
    }

    /// This node's objects that others finished while it was down, or took over and still
    /// disseminate, leave its delivery loop (exactly one owner per object): the live members
    /// of its quorum hold tombstones of the finished ones and forwarding copies of the
    /// delivered ones a link still owes (those leave the outbox), and its successor the
    /// adopted ones, which stay in the outbox handed to it ([`storage::Store::hand`]): held,
    /// not pushed, taken back if the adopter is lost before it finished them
    /// ([`Daemon::reclaim`]). The answer is those objects, and whether every live member
    /// answered in full.
    pub(super) async fn learn_finished(&self, view: &View) -> (HashSet<ObjectId>, bool) {
        let mut handed = HashSet::new();
        let Some(g) = view.grid else {
            return (handed, true);
        };
        let me = self.inner.cfg.node;
        let oldest_record = self
            .inner
            .deliverer
            .unfinished_objects()
            .unwrap_or_default()
            .into_iter()
            .find(|o| o.node == me)
            .map(|o| o.seq);
        let oldest_outbox = self.inner.store.own_pending_after(0, 1).first().copied();
        let Some(from) = [oldest_record, oldest_outbox].into_iter().flatten().min() else {
            return (handed, true);
        };
        let mut whole = true;
        // records not resumed yet are open on disk only
        let on_disk = if self.inner.resumed.load(Ordering::Acquire) {
            HashSet::new()
        } else {
            self.open_on_disk()
        };
        for (member, ep) in view.live_endpoints(g.xs_quorum(me), &[me]) {
            let adopter = Adopter::in_view(member, view);
            // delivered elsewhere too when a link still owes it (forwarding): left out of
            // these two sets, it was pushed again (found by `bench chaos`, seed 33)
            for set in [
                v1::ReplicaSet::Finished,
                v1::ReplicaSet::Adopted,
                v1::ReplicaSet::Forwarding,
            ] {
                let (seqs, answered) = self
                    .replica_seqs(&ep, me, set, from.saturating_sub(1))
                    .await;
                whole &= answered;
                for seq in seqs {
                    let id = ObjectId { node: me, seq };
                    // which member answered what: the evidence when an object was closed
                    // here that nobody delivered (`bench chaos --quick`, seeds 31 and 32)
                    if !handed.contains(&id) {
                        tracing::debug!("{me}:{seq} is {set:?} at {ep}: leaves this node");
                    }
                    if set == v1::ReplicaSet::Adopted {
                        // held for the holders, not pushed here (before, it left the outbox,
                        // and an adopter whose disk was lost then lost it; `daemon/ownsim`)
                        let open = self.inner.deliverer.is_open(id) || on_disk.contains(&id);
                        self.hand(id, adopter, open);
                        self.adopted_away(id);
                    } else {
                        let _ = self.inner.store.retire(id);
                    }
                    handed.insert(id);
                }
            }
        }
        (handed, whole)
    }
}

/// One page of [`Daemon::pull`].
pub(super) struct Pulled {
    pub(super) page: Vec<storage::StoredObject>,
    /// More follow after the page.
    pub(super) more: bool,
    /// (When the answer is the origin's) the first sequence number its store handed out.
    owns_from: u64,
    /// (When the answer is the origin's) the next one it hands out, read before the page.
    next_seq: u64,
    /// Which of the page are delivered but still owed to a federation link (forwarding).
    forwarding: Vec<u64>,
}

/// What an origin said of its store's sequence numbers: the first it handed out, and the
/// next (0 where it did not say).
#[derive(Debug, Clone, Copy, Default)]
struct SeqRange {
    owns_from: u64,
    next_seq: u64,
}
