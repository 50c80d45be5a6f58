//! One priority queue per endpoint with a bounded number of calls in flight per lane: jobs in,
//! the pump starts a call whenever a slot is free, taking every due job of the endpoint up to
//! the batch size from the front.

use super::*;

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Job {
    pub(super) priority: u8,
    /// Its number in arrival order (the counter also spreads a stream's batches over its
    /// sessions).
    pub(super) seq: u64,
    pub(super) sub: u64,
    pub(super) obj: ObjectId,
    /// A fresh match: its record was just written as pending with no attempt yet, so the
    /// attempt need not read it back.
    pub(super) fresh: bool,
    /// A fresh match with no record at all: the object's outbox record stands for it until
    /// it is acknowledged (then nothing is written) or fails once (then its record is
    /// written, durably, and it goes on like any other).
    pub(super) in_memory: bool,
}

/// The jobs waiting for one endpoint, highest priority first and first come first served
/// within a priority: a queue per priority. (A binary heap of a large backlog cost a cache
/// miss per level on every pop: 5% of the node's CPU at fan-out 10.)
#[derive(Debug, Default)]
pub(super) struct Jobs {
    by_priority: std::collections::BTreeMap<std::cmp::Reverse<u8>, std::collections::VecDeque<Job>>,
    len: usize,
}

impl Jobs {
    pub(super) fn push(&mut self, job: Job) {
        self.len += 1;
        self.by_priority
            .entry(std::cmp::Reverse(job.priority))
            .or_default()
            .push_back(job);
    }

    /// The job that goes next.
    pub(super) fn peek(&self) -> Option<&Job> {
        self.by_priority.values().next().and_then(|q| q.front())
    }

    pub(super) fn pop(&mut self) -> Option<Job> {
        let mut first = self.by_priority.first_entry()?;
        let job = first.get_mut().pop_front();
        if first.get().is_empty() {
            first.remove();
        }
        self.len -= usize::from(job.is_some());
        job
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Job> {
        self.by_priority.values().flatten()
    }
}

impl Extend<Job> for Jobs {
    fn extend<I: IntoIterator<Item = Job>>(&mut self, jobs: I) {
        for j in jobs {
            self.push(j);
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct EndpointQueue {
    pub(super) jobs: Jobs,
    /// Calls out, bulk and urgent (each bounded by `in_flight_per_endpoint`).
    pub(super) in_flight: [usize; 2],
}

impl Deliverer {
    /// A delivery record to push (due now or at its stored next attempt).
    pub fn enqueue(&self, sub: u64, obj: ObjectId) {
        if !self.inner.cfg.enabled {
            return;
        }
        self.inner.counters.queued.fetch_add(1, Ordering::Relaxed);
        let me = self.clone();
        tokio::spawn(async move { me.schedule(sub, obj).await });
    }

    /// Queues a record just written as pending and due now (a fresh match). When its
    /// subscription is cached it goes straight into its endpoint's priority queue, so under
    /// overload a priority-7 delivery does not wait behind the backlog's lookups.
    pub fn enqueue_new(&self, sub: u64, obj: ObjectId) {
        if !self.inner.cfg.enabled {
            return;
        }
        let Some(Some(s)) = self.cached_subscription(sub) else {
            // looked up first: ordered deliveries of later objects wait until it is queued
            self.inner.counters.queued.fetch_add(1, Ordering::Relaxed);
            self.transit(obj, 1);
            let me = self.clone();
            tokio::spawn(async move {
                me.schedule(sub, obj).await;
                me.transit(obj, -1);
            });
            return;
        };
        self.inner.counters.queued.fetch_add(1, Ordering::Relaxed);
        self.queue(obj, vec![(s, sub)], true, false);
    }

    /// An in-memory delivery that must have a record after all (its subscription is not
    /// QoS 1, or was not cached): written durably, then the object's share is given back and
    /// the record goes the usual way. A record of the pair that exists already is left as
    /// it is: it was written before a restart (the object was matched again before it left
    /// the outbox), and the start's resume pushes it if it is open (`fresh`; two pushes of
    /// one QoS 2 delivery would show it twice; found by `bench chaos`, seed 9090).
    pub(super) async fn to_record(&self, sub: u64, obj: ObjectId) {
        let store = &self.inner.store;
        let claimed = self.claim_fresh(&[(sub, obj)]);
        let added = match store.add_pending_deliveries_unflushed(&[(sub, obj)]).await {
            Ok(added) => added,
            Err(e) => {
                // the object stays in the outbox: matched again at the next start
                tracing::warn!("recording delivery {}: {e}", delivery_id(sub, obj));
                return;
            }
        };
        if added.is_empty() {
            self.release(obj);
            if !self.settle_fresh(&claimed, &[(sub, obj)]).is_empty() {
                // the resume ran meanwhile and left it to this hand-off
                self.opened(sub, obj);
                self.schedule(sub, obj).await;
            } else {
                // the hand-off counted this delivery queued; the record's push counts itself
                self.inner.counters.queued.fetch_sub(1, Ordering::Relaxed);
                tracing::debug!(
                    "delivery {} has a record already: left to it",
                    delivery_id(sub, obj)
                );
            }
            return;
        }
        // taken over from an owner whose subscriber "received" it: only the release
        if let Err(e) = self.received_elsewhere(sub, obj) {
            tracing::warn!("recording delivery {}: {e}", delivery_id(sub, obj));
            return;
        }
        if let Err(e) = store.commit().await {
            tracing::warn!("recording delivery {}: {e}", delivery_id(sub, obj));
            return;
        }
        self.opened(sub, obj);
        self.release(obj);
        self.schedule(sub, obj).await;
    }

    /// Puts due deliveries of `obj` in their endpoints' priority queues and starts what the
    /// in-flight bounds allow: the object read once, each endpoint's queue locked once and
    /// pumped once.
    pub(super) fn queue(
        &self,
        obj: ObjectId,
        subs: Vec<(Arc<Sub>, u64)>,
        fresh: bool,
        in_memory: bool,
    ) {
        if subs.is_empty() {
            return;
        }
        let obj_priority = self
            .object(obj)
            .ok()
            .flatten()
            .map_or(0, |o| o.stored.priority);
        // an object's deliveries go to few endpoints
        let mut by_key: Vec<(Arc<str>, Vec<Job>)> = Vec::new();
        for (s, sub) in subs {
            let job = Job {
                priority: obj_priority
                    .max(s.priority.min(u32::from(runtime::URGENT_PRIORITY)) as u8),
                seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
                sub,
                obj,
                fresh,
                in_memory,
            };
            if s.ordered {
                self.queue_ordered(&s, job);
                continue;
            }
            let key = s.endpoint.clone();
            match by_key.iter_mut().find(|(k, _)| *k == key) {
                Some((_, jobs)) => jobs.push(job),
                None => by_key.push((key, vec![job])),
            }
        }
        {
            let mut qs = lock(&self.inner.queues);
            for (key, jobs) in &mut by_key {
                qs.entry(key.clone())
                    .or_default()
                    .jobs
                    .extend(jobs.drain(..));
            }
        }
        for (key, _) in &by_key {
            self.pump(key);
        }
    }

    /// Waits until the record is due, then puts it in its endpoint's queue.
    pub(super) async fn schedule(&self, sub: u64, obj: ObjectId) {
        let due = match self.inner.store.delivery(sub, obj) {
            Ok(Some(DeliveryState::Pending {
                next_attempt_unix_ms,
                ..
            }))
            | Ok(Some(DeliveryState::Received {
                next_attempt_unix_ms,
                ..
            })) => next_attempt_unix_ms,
            other => {
                tracing::debug!(
                    "delivery {}: not scheduled ({other:?})",
                    delivery_id(sub, obj)
                );
                self.inner.counters.queued.fetch_sub(1, Ordering::Relaxed);
                return; // finished meanwhile
            }
        };
        let wait = due.saturating_sub(self.now_ms());
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        let s = loop {
            match self.subscription(sub).await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::debug!("looking up subscription {sub}: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        let Some(s) = s else {
            self.dead_letter(sub, obj, format!("subscription {sub} was deleted"), false)
                .await;
            return;
        };
        self.queue(obj, vec![(s, sub)], false, false);
    }

    /// Starts calls to an endpoint up to its in-flight bound, highest priority first. A free
    /// call takes every due delivery up to `push_batch` (pushes that queued while all calls
    /// were out), so batches form only under load and always from the front of the queue.
    /// A call carries urgent deliveries only or bulk ones only, and runs on its lane; each
    /// lane has its own in-flight bound, so urgent pushes never wait for a bulk call.
    pub(super) fn pump(&self, key: &Arc<str>) {
        if self.stopping() {
            return; // the jobs stay queued: their records or the outbox keep them
        }
        let batch = self.inner.cfg.push_batch.max(1);
        let lanes = &self.inner.lanes;
        let mut qs = lock(&self.inner.queues);
        let Some(q) = qs.get_mut(key) else { return };
        while let Some(top) = q.jobs.peek() {
            let priority = top.priority;
            let lane = usize::from(lanes.urgent(priority));
            if q.in_flight[lane] >= self.inner.cfg.in_flight_per_endpoint {
                break; // what follows is of this lane or below
            }
            let mut jobs = Vec::with_capacity(q.jobs.len().min(batch));
            while jobs.len() < batch
                && q.jobs
                    .peek()
                    .is_some_and(|j| lanes.urgent(j.priority) == (lane == 1))
                && let Some(job) = q.jobs.pop()
            {
                jobs.push(job);
            }
            q.in_flight[lane] += 1;
            let me = self.clone();
            let key = key.clone();
            lanes.spawn(priority, async move {
                me.attempt(jobs).await;
                {
                    let mut qs = lock(&me.inner.queues);
                    if let Some(q) = qs.get_mut(&key) {
                        q.in_flight[lane] -= 1;
                        if q.in_flight == [0, 0] && q.jobs.is_empty() {
                            qs.remove(&key);
                        }
                    }
                }
                me.pump(&key);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(priority: u8, seq: u64) -> Job {
        Job {
            priority,
            seq,
            sub: seq,
            obj: ObjectId { node: 1, seq },
            fresh: true,
            in_memory: true,
        }
    }

    #[test]
    fn jobs_go_highest_priority_first_and_in_arrival_order_within_one() {
        let mut q = Jobs::default();
        assert!(q.peek().is_none() && q.pop().is_none() && q.is_empty());
        for (p, s) in [(0, 1), (7, 2), (3, 3), (7, 4), (0, 5), (3, 6)] {
            q.push(job(p, s));
        }
        assert_eq!(q.len(), 6);
        assert_eq!(q.iter().count(), 6);
        assert_eq!(q.peek().map(|j| j.seq), Some(2));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|j| j.seq).collect();
        assert_eq!(order, [2, 4, 3, 6, 1, 5]);
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
        // a job of a higher priority arriving later goes first
        q.extend([job(1, 7), job(1, 8)]);
        assert_eq!(q.pop().map(|j| j.seq), Some(7));
        q.push(job(5, 9));
        assert_eq!(q.pop().map(|j| j.seq), Some(9));
        assert_eq!(q.pop().map(|j| j.seq), Some(8));
    }
}
