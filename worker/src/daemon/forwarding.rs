//! Objects a federation link still owes outlive their delivery (issue #31, hole 2). What a
//! put owes each all-active link is stored on the node that took it; if that node's disk were
//! lost after delivery, but before the peer cluster acknowledged the object, the peer would
//! never get it. So an object's end reaches the holders of its copies in two steps: when it
//! is delivered while a link still owes it, they mark their copies *forwarding* (the bytes
//! stay; nobody disseminates it again); when the last link acknowledged it (or it was
//! delivered with nothing owed), they end them (`finished`). A node that takes a lost
//! origin over owes the copies it adopts, and the forwarding ones, to its own all-active
//! links (the peer stores an object once, by its origin id, so a second sender is harmless).
//!
//! The finisher is the one place that decides: it hears of every delivered object (from
//! delivery) and of every object a link acknowledged (from the federation senders).

use tokio::sync::mpsc::UnboundedReceiver;

use storage::StoredObject;

use super::replicate::PeerMsg;
use super::*;

/// Notes of adopted-away objects kept at most (see [`Daemon::adopted_away`]).
const MAX_ADOPTED_AWAY: usize = 100_000;

/// What the node's federation links owe (the federation implements it; a node without links
/// has none).
pub trait LinkLedger: Send + Sync + std::fmt::Debug {
    /// Whether an all-active link still owes the object `id`.
    fn owes(&self, id: ObjectId) -> bool;
    /// This node's objects above `after` an all-active link still owes, in order, at most
    /// `limit`.
    fn owed_own_after(&self, after: u64, limit: usize) -> Vec<u64>;
    /// Owes another node's object (a copy this node took over) to every all-active link whose
    /// filter it passes; durable with the store's next commit.
    fn owe_copy(&self, o: &StoredObject) -> Result<(), ServiceError>;
    /// Entries the links owe in all (a node that leaves the grid waits for none: its disk
    /// goes with it).
    fn owed_total(&self) -> u64;
}

impl Daemon {
    /// Hands the daemon the node's federation links: copies of what they owe are kept past
    /// delivery. The answer is where the links report each object they acknowledged.
    pub fn set_links(&self, links: Arc<dyn LinkLedger>) -> mpsc::UnboundedSender<ObjectId> {
        *lock(&self.inner.links) = Some(links);
        self.inner.links_acked.clone()
    }

    pub(super) fn links(&self) -> Option<Arc<dyn LinkLedger>> {
        lock(&self.inner.links).clone()
    }

    /// Whether a link still owes `id`.
    pub(super) fn links_owe(&self, id: ObjectId) -> bool {
        self.links().is_some_and(|l| l.owes(id))
    }

    /// Whether `id` is still being disseminated here (in the outbox, adopted, lost at open
    /// and awaiting its repair, or with an open delivery record: until the records are
    /// resumed, those on disk count too).
    pub(super) fn disseminating(&self, id: ObjectId) -> bool {
        let store = &self.inner.store;
        if store.in_outbox(id) || self.inner.deliverer.is_open(id) {
            return true;
        }
        // a link's acknowledgement of an object this node lost at open must not end its
        // copies: they are what the repair restores it from (3 acknowledged objects lost,
        // never delivered; found by `bench chaos`, seed 109)
        if id.node == self.inner.cfg.node && store.awaits_repair(id.seq) {
            return true;
        }
        !self.inner.resumed.load(Ordering::Acquire) && self.open_on_disk().contains(&id)
    }

    /// The objects of the durable open delivery records (read from the store).
    pub(super) fn open_on_disk(&self) -> HashSet<ObjectId> {
        match self.inner.deliverer.unfinished_objects() {
            Ok(v) => v.into_iter().collect(),
            Err(e) => {
                tracing::warn!("reading unfinished deliveries: {e}");
                HashSet::new()
            }
        }
    }

    /// Ends the copies of delivered objects: each delivered object (delivery's finished
    /// queue, taken in batches), and each object a link acknowledged (`acked`), goes to the
    /// holders of its copies as forwarding while a link still owes it, else as finished. An
    /// object of this node's, or one it took over (whose copy here changes the same way).
    pub(super) async fn finisher(self, mut acked: UnboundedReceiver<ObjectId>) {
        let delivered = self.inner.finished.clone();
        loop {
            let (ids, from_delivery) = tokio::select! {
                ids = delivered.take() => (ids, true),
                Some(id) = acked.recv() => (vec![id], false),
            };
            for id in ids {
                self.finish(id, from_delivery);
            }
        }
    }

    /// Ends the copies of `id`, which delivery reported finished.
    pub(super) fn finish_reported(&self, id: ObjectId) {
        self.finish(id, true);
    }

    /// Ends the copies of `id`, delivered (`from_delivery`) or acknowledged by a link, when
    /// nothing else still needs them.
    fn finish(&self, id: ObjectId, from_delivery: bool) {
        // a link's acknowledgement of an object still being delivered: its delivery
        // ends it
        if !from_delivery && self.disseminating(id) {
            return;
        }
        // delivered to the subscriptions of a fresh match, while records of the object
        // from before a restart wait on disk for the resume: those end it once they are
        // delivered. Before, the copies ended here, the node's own relearn found the
        // object finished at a holder and closed its QoS 2 deliveries undelivered (an
        // object lost, `bench chaos` seed 6009: a resend's matches delivered at once)
        if from_delivery
            && !self.inner.resumed.load(Ordering::Acquire)
            && self.open_on_disk().contains(&id)
        {
            tracing::debug!(
                "object {}:{} delivered, with records waiting for the resume: not ended yet",
                id.node,
                id.seq
            );
            return;
        }
        // an object of this node's that another node adopted is that node's to end: its
        // records closed here (handed over) are no delivery, and ending its copies
        // would end the adopter's too, which then never delivered it (a QoS 2 loss,
        // found by `bench chaos`, seeds 15167 and 15174)
        if self.is_adopted_away(id) {
            tracing::debug!(
                "object {}:{} closed here: its adopter ends its copies",
                id.node,
                id.seq
            );
            return;
        }
        let forwarding = self.links_owe(id);
        if forwarding && !from_delivery {
            return; // another link still owes it: its acknowledgement ends it
        }
        self.end_copies(id, forwarding);
    }

    /// Notes that another node adopted object `id` (this node's, learnt at a catch-up or
    /// after a lapse; or one this node had adopted and gave up to another claimant): its
    /// closure here ends no copy.
    pub(super) fn adopted_away(&self, id: ObjectId) {
        let mut a = lock(&self.inner.adopted_away);
        if a.len() >= MAX_ADOPTED_AWAY {
            a.clear(); // bounded: the oldest notes are for objects long closed
        }
        a.insert(id);
    }

    /// Whether `id` is an object of this node's that another node adopted. The note
    /// outlives the object's closure here: a link's later acknowledgement ends no copy
    /// either, and the object is never answered as delivered ([`Daemon::forwarding_own_after`]).
    fn is_adopted_away(&self, id: ObjectId) -> bool {
        lock(&self.inner.adopted_away).contains(&id)
    }

    /// Tells the holders of `id`'s copies (and this node's own copy, of another node's
    /// object) that it was delivered: forwarding, or finished.
    fn end_copies(&self, id: ObjectId, forwarding: bool) {
        let Some(g) = self.grid() else { return };
        tracing::debug!(
            "object {}:{} delivered: its copies end ({})",
            id.node,
            id.seq,
            if forwarding { "forwarding" } else { "finished" }
        );
        let me = self.inner.cfg.node;
        if id.node != me {
            let store = &self.inner.store;
            let r = if forwarding {
                store.forward_replicas(&[id])
            } else {
                store.finish_replicas(&[id])
            };
            if let Err(e) = r {
                tracing::warn!("ending copy {}:{}: {e}", id.node, id.seq);
            }
        }
        if !g.contains(id.node) {
            return;
        }
        for p in g.xs_quorum(id.node) {
            if p != me {
                let msg = if forwarding {
                    PeerMsg::Forwarding(id)
                } else {
                    PeerMsg::Finished(id)
                };
                self.to_peer(p, msg);
            }
        }
    }

    /// This node's objects above `after` that are held only because a link still owes them
    /// (delivered; a holder keeps them as forwarding copies), at most `limit`.
    pub(super) fn forwarding_own_after(&self, after: u64, limit: usize) -> Vec<u64> {
        let Some(l) = self.links() else {
            return Vec::new();
        };
        let me = self.inner.cfg.node;
        // before the records are resumed, an object with an open record on disk is not
        // delivered yet: a holder told otherwise would take it for delivered, and this node's
        // own catch-up would then close the record (a QoS 2 release lost; found by `bench
        // chaos`, seed 6009)
        let on_disk = if self.inner.resumed.load(Ordering::Acquire) {
            HashSet::new()
        } else {
            self.open_on_disk()
        };
        l.owed_own_after(after, limit)
            .into_iter()
            .map(|seq| ObjectId { node: me, seq })
            .filter(|id| {
                !self.inner.store.in_outbox(*id)
                    && !self.inner.deliverer.is_open(*id)
                    && !on_disk.contains(id)
                    // handed to its adopter, not delivered: answered as forwarding, its
                    // adopter's copy stopped being sent (21 objects lost, seed 18188)
                    && !self.is_adopted_away(*id)
            })
            .map(|id| id.seq)
            .collect()
    }

    /// A takeover's share of the links: every copy of `origin`'s objects below `below` that
    /// this node adopted or holds forwarding is owed to its links (durable before the
    /// answer); forwarding copies no link of this node's takes end at once.
    pub(super) async fn owe_taken_over(&self, origin: u32, below: u64, adopted: &[StoredObject]) {
        let Some(links) = self.links() else { return };
        let store = &self.inner.store;
        let mut owed = 0usize;
        let mut ended = Vec::new();
        for o in adopted {
            tracing::debug!("owing adopted {}:{} to the links", o.id.node, o.id.seq);
            match links.owe_copy(o) {
                Ok(()) => owed += 1,
                Err(e) => tracing::error!("owing {}:{} to the links: {e}", o.id.node, o.id.seq),
            }
        }
        let mut after = 0;
        loop {
            let page = match store.forwarding_replicas(origin, after, 512) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("reading node {origin}'s forwarding copies: {e}");
                    break;
                }
            };
            let Some(last) = page.last() else { break };
            after = last.id.seq;
            for o in page.iter().filter(|o| o.id.seq < below) {
                tracing::debug!("owing forwarding {}:{} to the links", o.id.node, o.id.seq);
                match links.owe_copy(o) {
                    Ok(()) => owed += 1,
                    Err(e) => {
                        tracing::error!("owing {}:{} to the links: {e}", o.id.node, o.id.seq)
                    }
                }
                if !links.owes(o.id) {
                    ended.push(o.id); // no link of this node's takes it
                }
            }
        }
        if let Err(e) = store.commit().await {
            tracing::error!("storing what node {origin}'s objects owe the links: {e}");
            return;
        }
        for id in ended {
            self.end_copies(id, false);
        }
        if owed > 0 {
            tracing::info!("owed {owed} of node {origin}'s objects to this node's links");
        }
    }
}
