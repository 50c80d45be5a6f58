//! The in-memory hand-off of fresh matches: a QoS 1 match whose subscription is cached is
//! pushed straight from memory with no record, and the object stays owed (in the outbox) until
//! every such push is settled.

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
        lock(&self.inner.owed).contains_key(&obj)
    }

    /// Starts the deliveries of a fresh match of `obj` to `subs` that need no record: those
    /// to subscriptions that are QoS 1 as last seen, or not seen yet (QoS 0 must not repeat
    /// after a crash, and QoS 2 records its phases; a subscription that turns out not to be
    /// QoS 1 gets its record before its first attempt). When some started, the caller holds
    /// one more share of the object (`held`), which it gives back with
    /// [`Deliverer::release`] once the records of the others are durable. `None` (nothing
    /// started) when pushes of `obj` are in memory already: a repeated hand-off.
    pub fn hand_off(&self, obj: ObjectId, subs: Vec<u64>) -> Option<HandOff> {
        let qos1 = |s: &v1::Subscription| s.qos == v1::Qos::AtLeastOnce as i32;
        let mut memory = Vec::new();
        let mut to_record = Vec::new();
        {
            let cache = lock(&self.inner.cache);
            for sub in subs {
                match cache.get(&sub) {
                    _ if !self.inner.cfg.enabled => to_record.push(sub),
                    Some((_, Some(s))) if qos1(s) => memory.push((sub, Some(s.clone()))),
                    Some(_) => to_record.push(sub),
                    None => memory.push((sub, None)),
                }
            }
        }
        if memory.is_empty() {
            return Some(HandOff {
                to_record,
                held: false,
            });
        }
        {
            let mut owed = lock(&self.inner.owed);
            if owed.contains_key(&obj) {
                return None;
            }
            owed.insert(obj, (memory.len() + 1, false));
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
                    let me = self.clone();
                    tokio::spawn(async move {
                        match me.subscription(sub).await {
                            Ok(Some(s)) if qos1(&s) => me.queue(obj, vec![(s, sub)], true, true),
                            _ => me.to_record(sub, obj).await,
                        }
                    });
                }
            }
        }
        self.queue(obj, known, true, true);
        Some(HandOff {
            to_record,
            held: true,
        })
    }

    /// Gives back one share of `obj`: the last one takes the object out of the outbox.
    pub fn release(&self, obj: ObjectId) {
        self.give_back(obj, false);
    }

    /// Gives back the hand-off's share of `obj` after its hand-off failed: the object stays
    /// in the outbox, to be matched again once its in-memory pushes settle.
    pub fn abandon(&self, obj: ObjectId) {
        self.give_back(obj, true);
    }

    pub(super) fn give_back(&self, obj: ObjectId, keep: bool) {
        let retire = {
            let mut owed = lock(&self.inner.owed);
            match owed.get_mut(&obj) {
                Some((n, k)) if *n > 1 => {
                    *n -= 1;
                    *k |= keep;
                    false
                }
                Some((_, k)) => {
                    let keep = *k || keep;
                    owed.remove(&obj);
                    !keep
                }
                None => false,
            }
        };
        if retire && let Err(e) = self.inner.store.retire(obj) {
            tracing::warn!("retiring object {}:{}: {e}", obj.node, obj.seq);
        }
    }
}
