//! The outbox resend: an object still owed after `resend_after` (or every owed object, after a
//! new coordinator appeared) is sent to the coordinator again.

use super::*;

impl Daemon {
    /// Sends again every outbox object not sent within `after`.
    pub(super) async fn resend(&self, after: Duration) {
        let pending = match self.inner.store.outbox_pending() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("reading the outbox: {e}");
                return;
            }
        };
        let now = Instant::now();
        let due: Vec<ObjectId> = {
            let sent = lock(&self.inner.sent);
            pending
                .iter()
                .map(|(id, _)| *id)
                .filter(|id| sent.get(id).is_none_or(|t| now.duration_since(*t) >= after))
                // handed off, its pushes in memory: nothing to send
                .filter(|id| !self.inner.deliverer.owes(*id))
                .collect()
        };
        let mut batch = Vec::new();
        for id in due {
            match self.inner.store.get(id) {
                Ok(Some(o)) => {
                    lock(&self.inner.sent).insert(id, now);
                    batch.push(v1::ArrivedObject {
                        id: Some(v1::ObjectId {
                            node: id.node,
                            seq: id.seq,
                        }),
                        priority: o.priority as u32,
                        metadata: validate::attributes_to_proto(&o.metadata),
                        received_unix_ms: o.received_unix_ms,
                    });
                }
                // a put still being written (the outbox takes an object in when its id is
                // handed out): the next round sends it
                Ok(None) if id.node == self.inner.cfg.node => {}
                // an adopted object whose copy here ended: nothing to send it from (said, so
                // a chaos failure's logs show it; `bench chaos` seed 18188 lost 21 adopted
                // objects that were never sent again after a failed send)
                Ok(None) => tracing::debug!(
                    "adopted object {}:{} has no unfinished copy here: not sent",
                    id.node,
                    id.seq
                ),
                Err(e) => tracing::warn!("reading object {}:{}: {e}", id.node, id.seq),
            }
            if batch.len() >= self.inner.cfg.forward_batch {
                self.send_arrived(std::mem::take(&mut batch)).await;
            }
        }
        if !batch.is_empty() {
            self.send_arrived(batch).await;
        }
    }

    pub(super) async fn resender(self) {
        let every = (self.inner.cfg.resend_after / 2).max(Duration::from_millis(50));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            if self.inner.nonce.load(Ordering::Acquire) != 0
                && self.inner.caught_up.load(Ordering::Acquire)
                // a node that may have lost its lease does not claim objects back from
                // their heir (a resend makes the sender their owner)
                && !self.fenced()
            {
                self.resend(self.inner.cfg.resend_after).await;
            }
            let ttl = self.inner.cfg.result_ttl;
            lock(&self.inner.results).retain(|_, (t, _)| t.elapsed() < ttl);
        }
    }
}
