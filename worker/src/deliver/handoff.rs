//! The in-memory hand-off of fresh matches: a QoS 1 match whose subscription is cached is
//! pushed straight from memory with no record, and the object stays owed (in the outbox) until
//! every such push is settled. So is a QoS 0 match of an object put since the node started,
//! the first time it is matched: at most once needs no record, only that a repeated match
//! (after a crash, or a resend while the object is still owed) drops QoS 0 deliveries.

use super::*;

/// What [`Deliverer::hand_off`] left to the caller.
#[derive(Debug)]
pub struct HandOff {
    /// The subscriptions whose deliveries need a pending record.
    pub to_record: Vec<u64>,
    /// Deliveries started from memory: the caller holds a share of the object.
    pub held: bool,
}

impl Deliverer {
    /// Whether deliveries of `obj` are in memory (its hand-off is done or running).
    pub fn owes(&self, obj: ObjectId) -> bool {
        self.inner.ledger.owes(obj)
    }

    /// Starts the deliveries of a fresh match of `obj` to `subs` that need no record: those
    /// to subscriptions that are QoS 1 as last seen, or not seen yet (QoS 0 must not repeat
    /// after a crash, and QoS 2 records its phases; a subscription that turns out not to be
    /// QoS 1 gets its record before its first attempt). When some started, the caller holds
    /// one more share of the object (`held`), which it gives back with
    /// [`Deliverer::release`] once the records of the others are durable. `None` (nothing
    /// started) when pushes of `obj` are in memory already: a repeated hand-off.
    pub(super) fn hand_off(&self, obj: ObjectId, subs: Vec<u64>) -> Option<HandOff> {
        let qos0_first = self
            .inner
            .ledger
            .qos0_first(obj, self.inner.store.put_since_open(obj));
        let mut memory = Vec::new();
        let mut to_record = Vec::new();
        let mut qos0 = false;
        {
            let cache = lock(&self.inner.cache);
            for sub in subs {
                match cache.get(&sub) {
                    _ if !self.inner.cfg.enabled => to_record.push(sub),
                    Some((_, Some(s))) => match s.qos {
                        v1::Qos::AtLeastOnce => memory.push((sub, Some(s.clone()))),
                        v1::Qos::AtMostOnce if qos0_first => {
                            qos0 = true;
                            memory.push((sub, Some(s.clone())));
                        }
                        // a repeated match: it may have been pushed already
                        v1::Qos::AtMostOnce => self.drop_qos0(sub, obj),
                        _ => to_record.push(sub),
                    },
                    Some((_, None)) => to_record.push(sub),
                    None => memory.push((sub, None)),
                }
            }
        }
        if qos0 || (qos0_first && memory.iter().any(|(_, s)| s.is_none())) {
            // before any push starts: a repeated match from now on drops QoS 0
            self.inner.ledger.qos0_start(obj);
        }
        if memory.is_empty() {
            return Some(HandOff {
                to_record,
                held: false,
            });
        }
        // handed over (owed) before its pushes are queued: ordered deliveries of later
        // objects wait until they are
        self.transit(obj, 1);
        if !self.inner.ledger.take_shares(obj, memory.len() + 1) {
            self.transit(obj, -1);
            return None;
        }
        self.inner
            .counters
            .queued
            .fetch_add(memory.len() as u64, Ordering::Relaxed);
        let mut known = Vec::with_capacity(memory.len());
        for (sub, cached) in memory {
            match cached {
                Some(s) => known.push((s, sub)),
                // not seen yet: looked up first (a QoS 1 one is pushed from memory)
                None => {
                    self.transit(obj, 1);
                    let me = self.clone();
                    tokio::spawn(async move {
                        match me.subscription(sub).await {
                            Ok(Some(s)) => match s.qos {
                                v1::Qos::AtLeastOnce => me.queue(obj, vec![(s, sub)], true, true),
                                v1::Qos::AtMostOnce if qos0_first => {
                                    me.queue(obj, vec![(s, sub)], true, true)
                                }
                                v1::Qos::AtMostOnce => {
                                    me.drop_qos0(sub, obj);
                                    me.release(obj);
                                }
                                _ => me.to_record(sub, obj).await,
                            },
                            _ => me.to_record(sub, obj).await,
                        }
                        me.transit(obj, -1);
                    });
                }
            }
        }
        self.queue(obj, known, true, true);
        self.transit(obj, -1);
        Some(HandOff {
            to_record,
            held: true,
        })
    }

    /// Gives back one share of `obj`: the last one takes the object out of the outbox.
    pub(super) fn release(&self, obj: ObjectId) {
        self.give_back(obj, false);
    }

    /// Gives back the hand-off's share of `obj` after its hand-off failed: the object stays
    /// in the outbox, to be matched again once its in-memory pushes settle.
    pub(super) fn abandon(&self, obj: ObjectId) {
        self.give_back(obj, true);
    }

    pub(super) fn give_back(&self, obj: ObjectId, keep: bool) {
        if self.inner.ledger.give_back(obj, keep) == ledger::GiveBack::Retire {
            match self.inner.store.retire(obj) {
                Ok(_) => self.retired(obj),
                Err(e) => tracing::warn!("retiring object {}:{}: {e}", obj.node, obj.seq),
            }
        }
    }

    /// `obj` left the outbox: it is never matched again.
    pub(super) fn retired(&self, obj: ObjectId) {
        if self.inner.ledger.retired(obj) {
            self.maybe_finished(obj);
        }
    }

    /// Drops a QoS 0 match of a repeated match of `obj` (its delivery may have been pushed
    /// before: at most once), counting it as settled.
    fn drop_qos0(&self, sub: u64, obj: ObjectId) {
        tracing::debug!(
            "delivery {}: QoS 0 of a repeated match (its push may have begun before): dropped",
            delivery_id(sub, obj)
        );
        self.inner
            .counters
            .qos0_dropped
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// What [`Deliverer::accept`] did with a batch of matches.
#[derive(Debug, Default)]
pub struct Accepted {
    /// Matches handed in.
    pub handed: u64,
    /// Of those, repeats that changed nothing (the object left the outbox, its pushes are in
    /// memory, or its record exists).
    pub repeated: u64,
    /// Objects whose matches delivery took (recorded, or pushed from memory).
    pub taken: Vec<ObjectId>,
}

impl Deliverer {
    /// Takes the matches of objects this node stored, (object, subscriptions) each. A match
    /// to a QoS 1 subscription (or one not seen yet, looked up first) is pushed at once
    /// without a record: the object's outbox record stands for it until it is acknowledged
    /// (a crash before that matches the object again at the next start); a failed attempt
    /// writes its record. Every other match gets a pending record, pushed while the records
    /// are flushed. The object leaves the outbox once its records are flushed and its
    /// in-memory deliveries settled: delivery is the only part of the node that retires
    /// outbox records. A match of an object that left the outbox, or whose in-memory
    /// deliveries run, is a repeat and changes nothing. A storage failure leaves the objects
    /// in the outbox (the resend matches them again).
    pub async fn accept(
        &self,
        objects: Vec<(ObjectId, Vec<u64>)>,
    ) -> (Accepted, Result<(), storage::StorageError>) {
        let mut acc = Accepted::default();
        let mut pairs = Vec::new();
        let mut held = Vec::new();
        let mut plain = Vec::new();
        let store = &self.inner.store;
        for (id, subs) in objects {
            let n = subs.len() as u64;
            acc.handed += n;
            // handed to an adopter (`Store::hand`): a stale match, the adopter's to deliver
            if !store.in_outbox(id) || self.owes(id) || store.is_handed(id) {
                tracing::debug!(
                    "matches of {}:{} to {subs:?}: a repeat (in the outbox: {}, pushes in memory: {})",
                    id.node,
                    id.seq,
                    store.in_outbox(id),
                    self.owes(id)
                );
                acc.repeated += n;
                continue;
            }
            tracing::debug!("matches of {}:{} to {subs:?}", id.node, id.seq);
            let Some(h) = self.hand_off(id, subs) else {
                acc.repeated += n; // a concurrent hand-off of the object has its pushes in memory
                continue;
            };
            pairs.extend(h.to_record.into_iter().map(|s| (s, id)));
            if h.held {
                held.push(id);
            } else {
                plain.push(id);
            }
        }
        // the pushes start while the records are flushed: the objects stay in the outbox
        // until the flush, so a crash before it matches them again (QoS 1 may repeat a
        // push, and QoS 2's delivery id absorbs it; the durable "received" phase is
        // flushed on its own)
        let recorded = async {
            let claimed = self.claim_fresh(&pairs);
            let added = store.add_pending_deliveries_unflushed(&pairs).await?;
            acc.repeated += (pairs.len() - added.len()) as u64;
            if added.len() < pairs.len() {
                let new: std::collections::HashSet<_> = added.iter().copied().collect();
                let existing: Vec<_> = pairs.iter().filter(|p| !new.contains(p)).copied().collect();
                for (s, id) in &existing {
                    tracing::debug!("delivery {} has a record already", delivery_id(*s, *id));
                }
                // records from before the restart that the resume left to this match
                for (s, id) in self.settle_fresh(&claimed, &existing) {
                    self.opened(s, id);
                    self.enqueue(s, id);
                }
            }
            let any = !added.is_empty();
            for (s, id) in added {
                self.opened(s, id);
                if self.received_elsewhere(s, id)? {
                    self.enqueue(s, id);
                } else {
                    self.enqueue_new(s, id);
                }
            }
            if any {
                store.commit().await?;
            }
            Ok::<_, storage::StorageError>(())
        }
        .await;
        if let Err(e) = recorded {
            // the records may be missing: the objects stay in the outbox, and once their
            // in-memory pushes settle the resend matches them again
            for id in held {
                self.abandon(id);
            }
            return (acc, Err(e));
        }
        acc.taken = plain.iter().chain(&held).copied().collect();
        for id in plain {
            // a concurrent hand-off of the same object may have pushes in memory: the last
            // of them retires it
            if !self.owes(id) {
                if let Err(e) = store.retire(id) {
                    return (acc, Err(e));
                }
                self.retired(id);
            }
        }
        for id in held {
            self.release(id);
        }
        // the matched frontier moved: ordered deliveries waiting for it may go
        self.resequence();
        (acc, Ok(()))
    }
}

impl Deliverer {
    /// This node takes its `objects` back from an adopter that lost them (they were handed
    /// over, their records here closed): their records go, so that their next match
    /// records and pushes them afresh, and a subscriber's "received" mark (pulled from the
    /// holders) leaves only the release owed. The answer is how many records went, not yet
    /// durable.
    pub async fn reclaim(
        &self,
        objects: std::collections::HashSet<ObjectId>,
    ) -> Result<usize, storage::StorageError> {
        self.inner.ledger.reclaim(objects.iter().copied());
        let store = self.inner.store.clone();
        // a scan of every record: off the async threads
        tokio::task::spawn_blocking(move || store.remove_deliveries_of(&objects))
            .await
            .map_err(|_| storage::StorageError::Flusher)?
    }

    fn is_reclaimed(&self, obj: ObjectId) -> bool {
        self.inner.ledger.is_reclaimed(obj)
    }

    /// For a pending record just written: when `obj` is a copy taken over (or taken back)
    /// whose QoS 2 delivery to `sub` a subscriber has "received" from its earlier owner (a
    /// holder's mark, [`storage::Store::received_marks`]), the record becomes `Received`
    /// (not yet durable) and `true` says only its release is owed. Every path that writes
    /// a fresh record asks, the one for subscriptions looked up first too: after a start
    /// the cache is cold, and an heir restarted just before its takeover sent the first
    /// phase again to a subscriber that had released the delivery (shown twice, `bench
    /// chaos` seed 54168).
    pub(super) fn received_elsewhere(
        &self,
        sub: u64,
        obj: ObjectId,
    ) -> Result<bool, storage::StorageError> {
        let store = &self.inner.store;
        if obj.node == store.node() && !self.is_reclaimed(obj) {
            return Ok(false);
        }
        if !store.received_marks(obj)?.contains(&sub) {
            return Ok(false);
        }
        let state = DeliveryState::Received {
            attempts: 1,
            next_attempt_unix_ms: self.now_ms(),
        };
        store.set_delivery_unflushed(sub, obj, &state)?;
        Ok(true)
    }
}
