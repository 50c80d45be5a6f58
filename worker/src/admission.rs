//! Ingest admission by priority (issue 32, "priorities end to end").
//!
//! A tokio runtime serves its runnable tasks in no priority order: under a backlog of puts,
//! a priority-7 put waited behind every lower one already being written (`bench e2e` at 2x
//! overload: priority 7's put p99 43 ms, the same as priority 0's). So the writing of puts
//! (the store's insert and its group-commit flush: this node's CPU and disk; the copies to
//! peers wait on the network after the slot is freed) is entered through a fixed number of
//! slots. While a slot open to its priority is free, a put takes it at once, as before; once
//! all are taken, puts wait in one queue ordered by priority, then by arrival, and a freed
//! slot goes to the highest waiter that may take it. Of the slots, `reserve` (see
//! [`Admission::new`]) are open to the urgent priority only, so an urgent put finds a slot
//! even while lower ones fill the rest.
//!
//! The queue is bounded: a put that finds it full is refused with `UNAVAILABLE` (retry
//! later, or elsewhere), unless it outranks the lowest waiter, which is then refused in its
//! place. A waiter whose caller went away is skipped when its turn comes.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use runtime::{ServiceError, URGENT_PRIORITY};
use tokio::sync::oneshot;

/// Puts written at once before the rest wait in priority order.
pub const DEFAULT_SLOTS: usize = 16;
/// Of those, the slots only urgent puts may take.
pub const DEFAULT_RESERVE: usize = 4;
/// Puts that may wait for a slot before more are refused.
pub const DEFAULT_MAX_WAITING: usize = 8192;

/// The gate in front of the write path of puts.
#[derive(Debug, Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    slots: usize,
    reserve: usize,
    max_waiting: usize,
    state: Mutex<State>,
    /// Puts that waited for their slot.
    waited: AtomicU64,
    /// Puts refused because too many waited.
    refused: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    busy: usize,
    waiting: BinaryHeap<Waiter>,
    arrivals: u64,
}

#[derive(Debug)]
struct Waiter {
    priority: u8,
    arrival: u64,
    tx: oneshot::Sender<Slot>,
}

impl Waiter {
    fn key(&self) -> (u8, std::cmp::Reverse<u64>) {
        (self.priority, std::cmp::Reverse(self.arrival))
    }
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Waiter {}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiter {
    /// The greatest is served first: the highest priority, then the earliest arrival.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.key().cmp(&other.key())
    }
}

/// One slot of the write path; freeing it (drop) hands it to the next waiter.
#[derive(Debug)]
pub struct Slot {
    inner: Option<Arc<Inner>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            inner.release();
        }
    }
}

/// A put turned away at the gate: `max_waiting` puts already waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overloaded {
    pub max_waiting: usize,
}

impl From<Overloaded> for ServiceError {
    fn from(o: Overloaded) -> ServiceError {
        ServiceError::Unavailable(format!(
            "this node is overloaded: {} puts already wait to be written; retry later with \
             the same message_id (or put to another node)",
            o.max_waiting
        ))
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn overloaded(&self) -> Overloaded {
        Overloaded {
            max_waiting: self.max_waiting,
        }
    }

    /// How many slots a put of `priority` may fill.
    fn limit(&self, priority: u8) -> usize {
        if priority >= URGENT_PRIORITY {
            self.slots
        } else {
            self.slots - self.reserve
        }
    }

    /// A slot came free: hand it to the best waiter that may take it.
    fn release(self: &Arc<Self>) {
        let mut st = self.lock();
        st.busy = st.busy.saturating_sub(1);
        while let Some(top) = st.waiting.peek() {
            // the best waiter is the highest priority: if it may not take a slot, none may
            if st.busy >= self.limit(top.priority) {
                break;
            }
            let Some(w) = st.waiting.pop() else { break };
            st.busy += 1;
            let slot = Slot {
                inner: Some(self.clone()),
            };
            if let Err(mut back) = w.tx.send(slot) {
                // its caller went away: the slot is still free (disarmed, so its drop does
                // not come back here while the lock is held)
                back.inner = None;
                st.busy -= 1;
            }
        }
    }
}

impl Admission {
    /// A gate of `slots` (at least 1) of which `reserve` are kept for urgent puts (fewer than
    /// `slots`), with room for `max_waiting` waiting puts.
    pub fn new(slots: usize, reserve: usize, max_waiting: usize) -> Admission {
        let slots = slots.max(1);
        Admission {
            inner: Arc::new(Inner {
                slots,
                reserve: reserve.min(slots - 1),
                max_waiting: max_waiting.max(1),
                state: Mutex::default(),
                waited: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// Waits for a slot for a put of `priority` (a batch: its highest); refused when too
    /// many wait and none of them ranks below it.
    pub async fn enter(&self, priority: u8) -> Result<Slot, Overloaded> {
        let rx = {
            let mut st = self.inner.lock();
            if st.busy < self.inner.limit(priority) {
                st.busy += 1;
                return Ok(Slot {
                    inner: Some(self.inner.clone()),
                });
            }
            if st.waiting.len() >= self.inner.max_waiting {
                // callers gone while waiting free their places first
                st.waiting.retain(|w| !w.tx.is_closed());
            }
            if st.waiting.len() >= self.inner.max_waiting {
                // the lowest waiter (lowest priority, latest arrival: keys are unique)
                match st.waiting.iter().map(Waiter::key).min() {
                    Some(lowest) if lowest.0 < priority => {
                        // refused in the newcomer's place: its sender dropped, it hears so
                        st.waiting.retain(|w| w.key() != lowest);
                    }
                    _ => {
                        drop(st);
                        self.inner.refused.fetch_add(1, Ordering::Relaxed);
                        return Err(self.inner.overloaded());
                    }
                }
                self.inner.refused.fetch_add(1, Ordering::Relaxed);
            }
            let (tx, rx) = oneshot::channel();
            st.arrivals += 1;
            let arrival = st.arrivals;
            st.waiting.push(Waiter {
                priority,
                arrival,
                tx,
            });
            rx
        };
        self.inner.waited.fetch_add(1, Ordering::Relaxed);
        rx.await.map_err(|_| self.inner.overloaded())
    }

    /// Puts that waited for a slot, and puts refused, so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.inner.waited.load(Ordering::Relaxed),
            self.inner.refused.load(Ordering::Relaxed),
        )
    }

    /// Puts waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.inner.lock().waiting.len()
    }
}

impl Default for Admission {
    fn default() -> Self {
        Admission::new(DEFAULT_SLOTS, DEFAULT_RESERVE, DEFAULT_MAX_WAITING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Spawns a put of `priority` that records its turn in `order` once admitted and holds
    /// its slot until `go` is closed.
    fn waiter(
        gate: &Admission,
        priority: u8,
        order: &Arc<Mutex<Vec<u8>>>,
    ) -> tokio::task::JoinHandle<Result<(), Overloaded>> {
        let (gate, order) = (gate.clone(), order.clone());
        tokio::spawn(async move {
            let slot = gate.enter(priority).await?;
            order
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(priority);
            drop(slot);
            Ok(())
        })
    }

    /// A waiter's answer, within a deadline (a put left waiting fails the test, not hangs it).
    async fn answer(
        what: &str,
        t: tokio::task::JoinHandle<Result<(), Overloaded>>,
    ) -> Result<(), Overloaded> {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap_or_else(|_| panic!("timed out: {what}"))
            .expect("task")
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_highest_priority_then_the_earliest() {
        let gate = Admission::new(2, 1, 100);
        // the one slot lower priorities may use, and the urgent reserve
        let held = gate.enter(0).await.expect("free slot");
        let reserve = gate.enter(7).await.expect("the reserve");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for p in [0, 3, 6, 3, 7, 1] {
            tasks.push(waiter(&gate, p, &order));
            let n = tasks.len();
            until("the put to wait", || gate.waiting() == n).await;
        }
        drop(held);
        drop(reserve);
        for t in tasks {
            answer("a waiter's slot", t).await.expect("admitted");
        }
        let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(order, vec![7, 6, 3, 3, 1, 0]);
        assert_eq!(gate.counts(), (6, 0));
    }

    #[tokio::test]
    async fn an_urgent_put_takes_the_reserve_while_lower_ones_wait() {
        let gate = Admission::new(3, 1, 100);
        let a = gate.enter(0).await.expect("slot 1");
        let b = gate.enter(5).await.expect("slot 2");
        let order = Arc::new(Mutex::new(Vec::new()));
        let low = waiter(&gate, 6, &order);
        until("priority 6 to wait", || gate.waiting() == 1).await;
        // the reserve is free: no wait at all
        let urgent = tokio::time::timeout(Duration::from_secs(5), gate.enter(7))
            .await
            .expect("the reserve is taken at once")
            .expect("admitted");
        assert_eq!(gate.waiting(), 1, "the lower put still waits");
        drop(urgent);
        assert_eq!(gate.waiting(), 1, "the reserve is not for priority 6");
        drop((a, b));
        answer("priority 6's slot", low).await.expect("admitted");
        assert_eq!(*order.lock().unwrap_or_else(|p| p.into_inner()), vec![6]);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_the_lowest_and_skips_callers_gone() {
        let gate = Admission::new(1, 0, 2);
        let held = gate.enter(0).await.expect("slot");
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = waiter(&gate, 2, &order);
        until("one waits", || gate.waiting() == 1).await;
        let second = waiter(&gate, 1, &order);
        until("two wait", || gate.waiting() == 2).await;
        // full: a newcomer that ranks below every waiter is refused
        let refused = gate.enter(1).await.expect_err("the queue is full");
        let refused = ServiceError::from(refused).to_string();
        assert!(refused.contains("overloaded"), "{refused}");
        // one that outranks the lowest takes its place; the lowest is refused
        let third = waiter(&gate, 5, &order);
        let lowest = answer("the lowest waiter's refusal", second)
            .await
            .expect_err("refused in its place");
        assert_eq!(lowest, Overloaded { max_waiting: 2 });
        until("the newcomer waits", || gate.waiting() == 2).await;
        // a caller that went away is skipped when its turn comes; the slot is not lost
        first.abort();
        let _ = first.await;
        drop(held);
        answer("the newcomer's slot", third)
            .await
            .expect("admitted");
        assert_eq!(*order.lock().unwrap_or_else(|p| p.into_inner()), vec![5]);
        assert_eq!(gate.counts().1, 2);
        // every slot came back: the whole gate is free again
        let again = tokio::time::timeout(Duration::from_secs(5), gate.enter(0)).await;
        assert!(matches!(again, Ok(Ok(_))), "the slot was lost");
    }
}
