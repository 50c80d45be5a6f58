//! Durable streams (JetStream's durable consumers): a QoS 1 delivery to a stream with
//! nobody attached is kept, with no attempt counted, until a subscriber attaches (it then gets the
//! whole backlog at once, in priority order) or the subscription's TTL passes (then it is
//! dead-lettered, saying so). A stream keeps at most [`MAX_BACKLOG`] waiting deliveries;
//! beyond that a new one is dead-lettered at once, naming the bound. The records are the
//! delivery records every target has, so a backlog survives a restart of the node. QoS 0
//! keeps its one attempt: with nobody attached it is dead-lettered at once, as before.

use super::*;

/// Deliveries that wait for one stream at most.
pub(super) const MAX_BACKLOG: usize = 100_000;

/// How often waiting deliveries are checked against their TTL.
const TTL_CHECK: Duration = Duration::from_secs(1);

/// The deliveries waiting for a subscriber, per stream key: (subscription, object) -> when
/// its TTL runs out (unix ms).
pub(super) type Backlog = HashMap<String, HashMap<(u64, ObjectId), u64>>;

impl Deliverer {
    /// A stream delivery with nobody attached: kept until someone attaches or its TTL
    /// passes.
    pub(super) async fn park(&self, p: Prepared, stream: String) {
        let name = stream
            .split('\u{0}')
            .next_back()
            .unwrap_or_default()
            .to_string();
        if p.s.qos == v1::Qos::AtMostOnce {
            // at most once: its one attempt found nobody (as a NATS core subject would)
            let reason = format!("no subscriber has stream {name:?} open");
            return self.failed(p, reason, Some(Duration::ZERO)).await;
        }
        let (sub, obj) = (p.job.sub, p.job.obj);
        if !self.inner.backlog_ttl.swap(true, Ordering::AcqRel) {
            tokio::spawn(self.clone().backlog_ttl());
        }
        let ttl = retry::ttl_ms(Some(&p.s));
        let born = self.born(obj);
        let now = self.now_ms();
        if now.saturating_sub(born) >= ttl {
            let reason = format!(
                "no subscriber attached to stream {name:?} within the subscription's TTL of \
                 {ttl} ms"
            );
            self.dead_letter(sub, obj, reason, p.job.in_memory).await;
            return;
        }
        // the record first: a subscriber attaching takes the delivery out of the backlog
        // and schedules it from its record, which a fresh match's first attempt has not
        // written yet (it had only the object's outbox record)
        let state = DeliveryState::Pending {
            attempts: p.attempts,
            next_attempt_unix_ms: now,
        };
        let full = {
            let b = lock(&self.inner.backlog);
            b.get(&stream)
                .is_some_and(|w| w.len() >= MAX_BACKLOG && !w.contains_key(&(sub, obj)))
        };
        if full {
            let reason = format!(
                "stream {name:?} has {MAX_BACKLOG} deliveries waiting for a subscriber (its \
                 backlog bound)"
            );
            self.dead_letter(sub, obj, reason, p.job.in_memory).await;
            return;
        }
        self.finish(sub, obj, state, p.job.in_memory).await;
        lock(&self.inner.backlog)
            .entry(stream.clone())
            .or_default()
            .insert((sub, obj), born.saturating_add(ttl));
        // a subscriber that attached after the attempt found nobody, and before the delivery
        // joined the backlog, emptied the backlog without it: it goes out now, not at its TTL
        let attached = lock(&self.inner.streams)
            .get(&stream)
            .is_some_and(|v| !v.is_empty());
        if attached {
            self.attached(&stream);
        }
    }

    /// A subscriber attached to `stream`: everything waiting for it goes out now.
    pub(super) fn attached(&self, stream: &str) {
        let waiting = lock(&self.inner.backlog).remove(stream).unwrap_or_default();
        if !waiting.is_empty() {
            tracing::info!(
                "stream {stream:?}: {} waiting deliveries go out",
                waiting.len()
            );
        }
        for (sub, obj) in waiting.into_keys() {
            let me = self.clone();
            tokio::spawn(async move { me.schedule(sub, obj).await });
        }
    }

    /// Waiting deliveries whose TTL passed are tried once more (and dead-lettered when
    /// still nobody is attached). Runs until the task is dropped.
    pub(super) async fn backlog_ttl(self) {
        let mut tick = tokio::time::interval(TTL_CHECK);
        loop {
            tick.tick().await;
            let now = self.now_ms();
            let due: Vec<(u64, ObjectId)> = {
                let mut b = lock(&self.inner.backlog);
                let mut due = Vec::new();
                for waiting in b.values_mut() {
                    waiting.retain(|k, until| {
                        let keep = *until > now;
                        if !keep {
                            due.push(*k);
                        }
                        keep
                    });
                }
                b.retain(|_, w| !w.is_empty());
                due
            };
            for (sub, obj) in due {
                let me = self.clone();
                tokio::spawn(async move { me.schedule(sub, obj).await });
            }
        }
    }

    /// How many deliveries wait for a subscriber, over every stream.
    pub fn backlog_len(&self) -> usize {
        lock(&self.inner.backlog).values().map(HashMap::len).sum()
    }
}
