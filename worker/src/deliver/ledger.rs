//! The object ledger: what delivery knows of each object it is disseminating, in one
//! structure behind one lock, changed only through the methods below. Before it, this state
//! lived in seven maps under seven locks (shares owed, QoS 0 started, taken back, open
//! records, spill deadlines, fresh deliveries in transit), and "is this object finished?"
//! read three of them under three locks.
//!
//! The rules it keeps, each a unit test below:
//! - **Shares**: a hand-off of an object's fresh matches takes `n` shares (one per push
//!   from memory, plus the hand-off's own); a second hand-off while shares are out is a
//!   repeat and takes none. The last share given back retires the object from the outbox,
//!   unless a share was given back as failed (`keep`): then it stays, to be matched again.
//! - **QoS 0 at most once**: the first match of an object put since the store opened may
//!   push QoS 0 from memory; once that started, a repeated match of it drops QoS 0, until the
//!   object leaves the outbox.
//! - **Finished**: an object is finished once it left the outbox, no share is out and none
//!   of its delivery records is open.
//! - **Taken back**: an object taken back from a lost adopter counts its subscribers'
//!   "received" marks until it leaves the outbox.
//! - **Spilled in**: an object peers spilled over to this node has a deadline (the latest
//!   one given), forgotten once it is old.
//! - **In transit**: fresh deliveries on their way to a queue hold back ordered deliveries
//!   of later objects; the lowest object in transit is the frontier.
//!
//! The start's claims of fresh pairs (`fresh.rs`) are kept apart, behind their own lock:
//! the resume holds it across a read of the store, which must not stall every delivery.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use blocks::hash::{FastMap, FastSet};
use storage::ObjectId;

use runtime::lock;

/// One object's entry: gone once every field is back to its default. Small (24 bytes):
/// under a backlog the ledger holds an entry for every object whose pushes are out, and
/// each delivery looks its object up a few times.
#[derive(Debug, Default)]
struct Entry {
    /// Subscriptions whose delivery records of it are open (most objects have none: their
    /// pushes go from memory).
    open: Option<Box<FastSet<u64>>>,
    /// The deadline of its deliveries (unix ms), when peers spilled it over to this node;
    /// 0: none.
    deadline: u64,
    /// Shares out (pushes from memory plus the hand-off's own).
    shares: u32,
    /// A share was given back failed: the object must stay in the outbox.
    keep: bool,
    /// A QoS 0 push of it started from memory.
    qos0_started: bool,
    /// Taken back from a lost adopter.
    reclaimed: bool,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.shares == 0
            && !self.keep
            && !self.qos0_started
            && !self.reclaimed
            && !self.is_open()
            && self.deadline == 0
    }

    fn is_open(&self) -> bool {
        self.open.as_ref().is_some_and(|s| !s.is_empty())
    }

    fn deadline(&self) -> Option<u64> {
        (self.deadline != 0).then_some(self.deadline)
    }

    /// Sets the deadline to `d` if later; `true` when the entry had none before.
    fn later_deadline(&mut self, d: u64) -> bool {
        let first = self.deadline == 0 && d != 0;
        self.deadline = self.deadline.max(d);
        first
    }
}

#[derive(Debug, Default)]
struct Book {
    objects: FastMap<ObjectId, Entry>,
    /// Fresh deliveries on their way to a queue, per object, in object order.
    transit: BTreeMap<ObjectId, usize>,
}

impl Book {
    /// Applies `f` to the entry of `obj` (made if missing), dropping it when it empties.
    fn with<T>(&mut self, obj: ObjectId, f: impl FnOnce(&mut Entry) -> T) -> T {
        let e = self.objects.entry(obj).or_default();
        let r = f(e);
        if e.is_empty() {
            self.objects.remove(&obj);
        }
        r
    }

    /// Applies `f` to the entry of `obj` if it has one (`None` if not), dropping it when it
    /// empties: for the changes that only undo (a share back, a record closed, a
    /// retirement), which must not make an entry to drop it again on every delivery.
    fn update<T>(&mut self, obj: ObjectId, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        let e = self.objects.get_mut(&obj)?;
        let r = f(e);
        if e.is_empty() {
            self.objects.remove(&obj);
        }
        Some(r)
    }

    fn get(&self, obj: ObjectId) -> Option<&Entry> {
        self.objects.get(&obj)
    }
}

/// What giving a share back did ([`Ledger::give_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GiveBack {
    /// Shares are still out (or none was: nothing to do).
    Out,
    /// The last share: the object leaves the outbox.
    Retire,
    /// The last share, but one failed: the object stays in the outbox.
    Keep,
}

/// The ledger of the objects delivery holds (cheap to share behind the deliverer's `Arc`).
#[derive(Debug, Default)]
pub(super) struct Ledger {
    book: Mutex<Book>,
    /// How many entries have a spill deadline: every attempt asks for its object's, and
    /// almost none has one (the answer then needs no look at the book).
    deadlines: AtomicUsize,
}

impl Ledger {
    /// A ledger that knows the spill deadlines stored before a restart.
    pub(super) fn with_deadlines(deadlines: impl IntoIterator<Item = (ObjectId, u64)>) -> Ledger {
        let l = Ledger::default();
        {
            let mut b = lock(&l.book);
            for (obj, d) in deadlines {
                if b.with(obj, |e| e.later_deadline(d)) {
                    l.deadlines.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        l
    }

    /// Whether shares of `obj` are out (its pushes are in memory, or its hand-off runs).
    pub(super) fn owes(&self, obj: ObjectId) -> bool {
        lock(&self.book).get(obj).is_some_and(|e| e.shares > 0)
    }

    /// A hand-off of `obj` takes `shares` shares: `false` (none taken) when shares are out
    /// already, a repeated hand-off.
    pub(super) fn take_shares(&self, obj: ObjectId, shares: usize) -> bool {
        // one share per subscription matched: far below u32::MAX
        let shares = u32::try_from(shares).unwrap_or(u32::MAX);
        lock(&self.book).with(obj, |e| {
            if e.shares > 0 {
                return false;
            }
            e.shares = shares;
            e.keep = false;
            true
        })
    }

    /// Gives one share of `obj` back; `failed`: the object must stay in the outbox.
    pub(super) fn give_back(&self, obj: ObjectId, failed: bool) -> GiveBack {
        let back = lock(&self.book).update(obj, |e| match e.shares {
            0 => GiveBack::Out,
            1 => {
                let keep = e.keep || failed;
                e.shares = 0;
                e.keep = false;
                if keep {
                    GiveBack::Keep
                } else {
                    GiveBack::Retire
                }
            }
            _ => {
                e.shares -= 1;
                e.keep |= failed;
                GiveBack::Out
            }
        });
        back.unwrap_or(GiveBack::Out)
    }

    /// Whether a match of `obj` may push QoS 0 from memory: the object was put since the
    /// store opened, and no QoS 0 push of it started yet.
    pub(super) fn qos0_first(&self, obj: ObjectId, put_since_open: bool) -> bool {
        put_since_open && !lock(&self.book).get(obj).is_some_and(|e| e.qos0_started)
    }

    /// A QoS 0 push of `obj` from memory starts (before it does): a repeated match drops
    /// QoS 0 from now on.
    pub(super) fn qos0_start(&self, obj: ObjectId) {
        lock(&self.book).with(obj, |e| e.qos0_started = true);
    }

    /// `obj` left the outbox: it is never matched again, so neither its QoS 0 mark nor its
    /// taking back matter any more. The answer: whether it is finished now (no share out,
    /// no record open).
    pub(super) fn retired(&self, obj: ObjectId) -> bool {
        let finished = lock(&self.book).update(obj, |e| {
            e.qos0_started = false;
            e.reclaimed = false;
            e.shares == 0 && !e.is_open()
        });
        finished.unwrap_or(true)
    }

    /// These objects were taken back from a lost adopter.
    pub(super) fn reclaim(&self, objects: impl IntoIterator<Item = ObjectId>) {
        let mut b = lock(&self.book);
        for obj in objects {
            b.with(obj, |e| e.reclaimed = true);
        }
    }

    /// Whether `obj` was taken back from a lost adopter (and is still in the outbox).
    pub(super) fn is_reclaimed(&self, obj: ObjectId) -> bool {
        lock(&self.book).get(obj).is_some_and(|e| e.reclaimed)
    }

    /// The delivery record of (sub, obj) is open.
    pub(super) fn opened(&self, sub: u64, obj: ObjectId) {
        lock(&self.book).with(obj, |e| {
            e.open.get_or_insert_default().insert(sub);
        });
    }

    /// The record of (sub, obj) is final: `true` when it was the object's last open one and
    /// no share is out (the object is finished once it left the outbox too).
    pub(super) fn closed(&self, sub: u64, obj: ObjectId) -> bool {
        // most records closed were never open (a push from memory, acknowledged)
        let last = lock(&self.book).update(obj, |e| {
            let Some(open) = &mut e.open else {
                return false;
            };
            if !open.remove(&sub) {
                return false;
            }
            if open.is_empty() {
                e.open = None;
            }
            e.open.is_none() && e.shares == 0
        });
        last.unwrap_or(false)
    }

    /// Whether nothing of `obj` is out: no share, no open record. With the object out of
    /// the outbox, that is finished.
    pub(super) fn settled(&self, obj: ObjectId) -> bool {
        lock(&self.book)
            .get(obj)
            .is_none_or(|e| e.shares == 0 && !e.is_open())
    }

    /// Whether `obj` has open delivery records.
    pub(super) fn is_open(&self, obj: ObjectId) -> bool {
        lock(&self.book).get(obj).is_some_and(Entry::is_open)
    }

    /// The sequence numbers of `origin`'s objects with open records.
    pub(super) fn open_objects(&self, origin: u32) -> HashSet<u64> {
        lock(&self.book)
            .objects
            .iter()
            .filter(|(id, e)| id.node == origin && e.is_open())
            .map(|(id, _)| id.seq)
            .collect()
    }

    /// Peers spilled `obj` over with this deadline (the latest one given counts).
    pub(super) fn spilled_in(&self, obj: ObjectId, deadline_unix_ms: u64) {
        let mut b = lock(&self.book);
        if b.with(obj, |e| e.later_deadline(deadline_unix_ms)) {
            self.deadlines.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The deadline of `obj`'s deliveries when it was spilled in.
    pub(super) fn deadline(&self, obj: ObjectId) -> Option<u64> {
        if self.deadlines.load(Ordering::Relaxed) == 0 {
            return None;
        }
        lock(&self.book).get(obj).and_then(Entry::deadline)
    }

    /// Forgets spill deadlines before `cutoff`.
    pub(super) fn forget_deadlines_before(&self, cutoff: u64) {
        let mut b = lock(&self.book);
        let mut forgotten = 0;
        b.objects.retain(|_, e| {
            if e.deadline().is_some_and(|d| d < cutoff) {
                e.deadline = 0;
                forgotten += 1;
            }
            !e.is_empty()
        });
        self.deadlines.fetch_sub(forgotten, Ordering::Relaxed);
    }

    /// A fresh delivery of `obj` starts (`true`) or ends its way to a queue. The answer:
    /// whether one ended (ordered deliveries may move).
    pub(super) fn transit(&self, obj: ObjectId, start: bool) -> bool {
        let mut b = lock(&self.book);
        let n = b.transit.entry(obj).or_insert(0);
        if start {
            *n += 1;
            false
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                b.transit.remove(&obj);
            }
            true
        }
    }

    /// The lowest sequence of `node`'s objects with fresh deliveries in transit.
    pub(super) fn first_in_transit(&self, node: u32) -> Option<u64> {
        lock(&self.book)
            .transit
            .keys()
            .find(|o| o.node == node)
            .map(|o| o.seq)
    }

    /// How many objects the ledger holds entries for (the entries are dropped once empty).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.book).objects.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(seq: u64) -> ObjectId {
        ObjectId { node: 1, seq }
    }

    #[test]
    fn an_entry_stays_small() {
        // a backlog holds one per object whose pushes are out
        assert!(
            std::mem::size_of::<Entry>() <= 24,
            "{}",
            std::mem::size_of::<Entry>()
        );
    }

    #[test]
    fn the_last_share_retires_and_a_second_hand_off_takes_none() {
        let l = Ledger::default();
        assert!(!l.owes(o(1)));
        assert!(l.take_shares(o(1), 3));
        assert!(l.owes(o(1)));
        assert!(
            !l.take_shares(o(1), 2),
            "a repeated hand-off while shares are out"
        );
        assert_eq!(l.give_back(o(1), false), GiveBack::Out);
        assert_eq!(l.give_back(o(1), false), GiveBack::Out);
        assert_eq!(l.give_back(o(1), false), GiveBack::Retire);
        assert!(!l.owes(o(1)));
        assert_eq!(l.give_back(o(1), false), GiveBack::Out, "none out: nothing");
        assert_eq!(l.len(), 0, "an emptied entry goes");
    }

    #[test]
    fn a_failed_share_keeps_the_object_in_the_outbox_whenever_it_came_back() {
        for failed_at in 0..3 {
            let l = Ledger::default();
            assert!(l.take_shares(o(2), 3));
            let mut last = GiveBack::Out;
            for i in 0..3 {
                last = l.give_back(o(2), i == failed_at);
            }
            assert_eq!(last, GiveBack::Keep, "failed share {failed_at}");
            // the next hand-off starts clean
            assert!(l.take_shares(o(2), 1));
            assert_eq!(l.give_back(o(2), false), GiveBack::Retire);
        }
    }

    #[test]
    fn qos0_goes_from_memory_once_until_the_object_retires() {
        let l = Ledger::default();
        assert!(!l.qos0_first(o(3), false), "put before the store opened");
        assert!(l.qos0_first(o(3), true));
        l.qos0_start(o(3));
        assert!(!l.qos0_first(o(3), true), "a repeated match drops QoS 0");
        assert!(l.retired(o(3)));
        assert!(l.qos0_first(o(3), true), "forgotten once out of the outbox");
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn finished_needs_no_share_and_no_open_record() {
        let l = Ledger::default();
        assert!(l.settled(o(4)));
        assert!(l.take_shares(o(4), 1));
        l.opened(7, o(4));
        l.opened(8, o(4));
        assert!(!l.settled(o(4)));
        assert!(!l.retired(o(4)), "shares out and records open");
        assert_eq!(l.give_back(o(4), false), GiveBack::Retire);
        assert!(!l.settled(o(4)), "records open");
        assert!(l.is_open(o(4)));
        assert_eq!(l.open_objects(1), [4].into_iter().collect());
        assert!(l.open_objects(2).is_empty());
        assert!(!l.closed(7, o(4)));
        assert!(!l.closed(7, o(4)), "closed twice: not the last");
        assert!(l.closed(8, o(4)), "the last open record");
        assert!(l.settled(o(4)) && !l.is_open(o(4)));
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn the_last_record_closing_while_shares_are_out_is_not_finished() {
        let l = Ledger::default();
        assert!(l.take_shares(o(5), 2));
        l.opened(7, o(5));
        assert!(!l.closed(7, o(5)), "a push from memory is still out");
        assert_eq!(l.give_back(o(5), false), GiveBack::Out);
        assert_eq!(l.give_back(o(5), false), GiveBack::Retire);
        assert!(l.retired(o(5)));
    }

    #[test]
    fn taken_back_objects_count_until_they_retire() {
        let l = Ledger::default();
        l.reclaim([o(6), o(7)]);
        assert!(l.is_reclaimed(o(6)) && l.is_reclaimed(o(7)));
        assert!(!l.is_reclaimed(o(8)));
        assert!(l.retired(o(6)));
        assert!(!l.is_reclaimed(o(6)));
        assert!(l.is_reclaimed(o(7)));
    }

    #[test]
    fn spill_deadlines_keep_the_latest_and_are_forgotten_when_old() {
        let l = Ledger::with_deadlines([(o(9), 100), (o(9), 50), (o(10), 300)]);
        assert_eq!(l.deadline(o(9)), Some(100));
        l.spilled_in(o(9), 80);
        assert_eq!(
            l.deadline(o(9)),
            Some(100),
            "an earlier deadline changes nothing"
        );
        l.spilled_in(o(9), 200);
        assert_eq!(l.deadline(o(9)), Some(200));
        l.opened(7, o(10));
        l.forget_deadlines_before(250);
        assert_eq!(l.deadline(o(9)), None);
        assert_eq!(l.deadline(o(10)), Some(300));
        assert_eq!(l.deadlines.load(Ordering::Relaxed), 1);
        l.forget_deadlines_before(1_000);
        assert_eq!(l.deadline(o(10)), None);
        assert_eq!(l.deadlines.load(Ordering::Relaxed), 0);
        assert!(
            l.is_open(o(10)),
            "forgetting a deadline keeps the rest of the entry"
        );
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn the_frontier_is_the_lowest_object_in_transit_of_the_node() {
        let l = Ledger::default();
        assert_eq!(l.first_in_transit(1), None);
        assert!(!l.transit(o(12), true));
        assert!(!l.transit(o(11), true));
        assert!(!l.transit(o(11), true));
        assert!(!l.transit(ObjectId { node: 0, seq: 1 }, true));
        assert_eq!(l.first_in_transit(1), Some(11));
        assert!(l.transit(o(11), false));
        assert_eq!(
            l.first_in_transit(1),
            Some(11),
            "one of two still in transit"
        );
        assert!(l.transit(o(11), false));
        assert_eq!(l.first_in_transit(1), Some(12));
        assert!(l.transit(o(12), false));
        assert_eq!(l.first_in_transit(1), None);
        assert_eq!(l.first_in_transit(0), Some(1));
    }
}
