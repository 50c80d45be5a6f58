//! Ordered subscriptions (`Subscription.ordered`): their deliveries bypass the endpoint
//! queues for a sequencer per subscription that pushes them in object order (per origin
//! node, the order the node took them), one call at a time. A delivery goes out only when
//! every earlier object of this node has been matched (handed to delivery: it is out of the
//! outbox or its pushes run) and none of their fresh deliveries is still on its way to a
//! queue (its subscription being looked up), so a late match cannot overtake; and while one
//! delivery waits for its retry, the subscription's later ones wait behind it. A dead letter
//! does not hold the rest up.

use std::collections::BTreeMap;

use super::*;

/// How often waiting ordered deliveries look again whether they may go (besides the wake-ups
/// when matches are handed over).
const LOOK_AGAIN: Duration = Duration::from_millis(50);
/// How many outbox entries the matched frontier looks at (beyond them it waits).
const FRONTIER_SCAN: usize = 4096;

/// One ordered subscription's deliveries.
#[derive(Debug, Default)]
pub(super) struct Sequencer {
    /// Jobs queued, by object.
    waiting: BTreeMap<ObjectId, Job>,
    /// The object whose delivery is out, or waits for its retry: nothing later goes first.
    head: Option<ObjectId>,
    /// A call is out.
    busy: bool,
    /// The subscription as last queued with.
    sub: Option<Arc<Sub>>,
}

impl Deliverer {
    /// Queues `job` of the ordered subscription `sub` and pushes what may go.
    pub(super) fn queue_ordered(&self, s: &Arc<Sub>, job: Job) {
        let sub = job.sub;
        {
            let mut all = lock(&self.inner.ordered);
            let q = all.entry(sub).or_default();
            q.waiting.insert(job.obj, job);
            q.sub = Some(s.clone());
        }
        self.look_again_later();
        self.sequence(sub);
    }

    /// The first of this node's objects in the outbox that is not handed to delivery yet
    /// (`u64::MAX`: none): ordered deliveries of this node's objects go only below it.
    fn matched_frontier(&self) -> u64 {
        let me = self.inner.store.node();
        let transit = self.inner.ledger.first_in_transit(me).unwrap_or(u64::MAX);
        let head = self.inner.store.outbox_head(FRONTIER_SCAN);
        let outbox = match head.iter().find(|seq| {
            !self.owes(ObjectId {
                node: me,
                seq: **seq,
            })
        }) {
            Some(seq) => *seq,
            // all of those looked at are handed over; what lies beyond them is not known
            None if head.len() == FRONTIER_SCAN => head.last().map_or(u64::MAX, |l| l + 1),
            None => u64::MAX,
        };
        outbox.min(transit)
    }

    /// A fresh delivery of `obj` starts (`1`) or ends (`-1`) its way to a queue.
    pub(super) fn transit(&self, obj: ObjectId, step: i8) {
        if self.inner.ledger.transit(obj, step > 0) {
            self.resequence();
        }
    }

    /// Starts the next call of ordered subscription `sub` if none is out: the deliveries
    /// from the front, in object order, that may go (up to the batch size when the target
    /// takes batches).
    fn sequence(&self, sub: u64) {
        let s = {
            let mut all = lock(&self.inner.ordered);
            match all.get(&sub) {
                None => return,
                Some(q) if q.busy => return,
                Some(q) if q.waiting.is_empty() => {
                    // nothing waits: forgotten unless a retry is still to come back
                    if q.head.is_none_or(|h| !self.record_open(sub, h)) {
                        all.remove(&sub);
                    }
                    return;
                }
                Some(q) => q.sub.clone(),
            }
        };
        let Some(s) = s else { return };
        let frontier = self.matched_frontier();
        let me = self.inner.store.node();
        let batch = if self.batched_grpc(&s) {
            self.inner.cfg.push_batch.max(1)
        } else if matches!(
            s.target.as_ref().and_then(|t| t.kind.as_ref()),
            Some(v1::target::Kind::Webhook(_))
        ) {
            self.webhook_batch_size(s.push_batch as usize)
        } else {
            1
        };
        let jobs = {
            let mut all = lock(&self.inner.ordered);
            let Some(q) = all.get_mut(&sub) else { return };
            if q.busy {
                return;
            }
            // a head that finished by another way (a redrive, a stream's backlog) holds
            // nothing up any more
            if let Some(h) = q.head
                && !q.waiting.contains_key(&h)
                && !self.record_open(sub, h)
            {
                q.head = None;
            }
            let mut jobs = Vec::new();
            while jobs.len() < batch {
                let Some((&obj, _)) = q.waiting.first_key_value() else {
                    break;
                };
                // the delivery out, or waiting for its retry, goes first
                if q.head.is_some_and(|h| h < obj) {
                    break;
                }
                if obj.node == me && obj.seq >= frontier {
                    break; // an earlier object of this node is not matched yet
                }
                if let Some((_, job)) = q.waiting.pop_first() {
                    jobs.push(job);
                }
            }
            if jobs.is_empty() {
                if q.waiting.is_empty() && q.head.is_none() {
                    all.remove(&sub);
                }
                return;
            }
            q.busy = true;
            jobs
        };
        let objs: Vec<ObjectId> = jobs.iter().map(|j| j.obj).collect();
        let priority = jobs.iter().map(|j| j.priority).max().unwrap_or(0);
        let me = self.clone();
        self.inner.lanes.spawn(priority, async move {
            me.attempt(jobs).await;
            // the first delivery not finished holds the rest until it is
            let open = objs.into_iter().find(|obj| me.record_open(sub, *obj));
            if let Some(q) = lock(&me.inner.ordered).get_mut(&sub) {
                q.busy = false;
                q.head = open;
            }
            me.sequence(sub);
        });
    }

    /// Whether the delivery record of (sub, obj) is open (pending or QoS 2 "received").
    fn record_open(&self, sub: u64, obj: ObjectId) -> bool {
        matches!(
            self.inner.store.delivery(sub, obj),
            Ok(Some(
                DeliveryState::Pending { .. } | DeliveryState::Received { .. }
            ))
        )
    }

    /// Looks again at every ordered subscription with waiting deliveries (matches were
    /// handed over, or a while passed).
    pub(super) fn resequence(&self) {
        let subs: Vec<u64> = lock(&self.inner.ordered).keys().copied().collect();
        for sub in subs {
            self.sequence(sub);
        }
    }

    /// Makes sure a look every [`LOOK_AGAIN`] runs while ordered deliveries wait.
    fn look_again_later(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.inner.ordered_ticking.swap(true, SeqCst) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LOOK_AGAIN).await;
                me.resequence();
                if lock(&me.inner.ordered).is_empty() {
                    me.inner.ordered_ticking.store(false, SeqCst);
                    return;
                }
            }
        });
    }
}
