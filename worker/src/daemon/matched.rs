//! Matches arriving at the origin node (`Daemon.Matched`): checked, then handed to delivery,
//! which records them and retires the objects from the outbox.

use super::*;

impl Daemon {
    /// Matches of objects this node owns (took, or took over from a dead origin): each id
    /// checked to be one of those, then handed to
    /// delivery ([`crate::deliver::Deliverer::accept`]), which alone records them and retires
    /// the objects from the outbox.
    pub async fn handoff(&self, req: v1::MatchedRequest) -> Result<(), ServiceError> {
        self.inner.deliverer.trace_matched(&req.objects);
        let mut objects = Vec::with_capacity(req.objects.len());
        for o in req.objects {
            let id =
                o.id.ok_or_else(|| ServiceError::invalid("objects.id", "required"))?;
            let id = ObjectId {
                node: id.node,
                seq: id.seq,
            };
            if id.node != self.inner.cfg.node && !self.inner.store.knows_replica(id)? {
                return Err(ServiceError::invalid(
                    "objects.id.node",
                    format!(
                        "object of node {} sent to node {}, which holds no copy of it",
                        id.node, self.inner.cfg.node
                    ),
                ));
            }
            objects.push((id, o.subscriptions));
        }
        // on a task of its own: a caller that goes away (the matching node killed, its call
        // timed out) drops the future that awaits this, and a hand-off dropped after its
        // in-memory pushes started but before its records were written kept the object owed
        // for ever: never recorded for the rest of its subscriptions, never matched again (a
        // QoS 2 subscriber never saw it; found by `bench chaos`, seed 109)
        let deliverer = self.inner.deliverer.clone();
        let (accepted, recorded) = tokio::spawn(async move { deliverer.accept(objects).await })
            .await
            .map_err(|e| ServiceError::Unavailable(format!("handing matches to delivery: {e}")))?;
        let c = &self.inner.counters;
        c.matches_handed
            .fetch_add(accepted.handed, Ordering::Relaxed);
        c.matches_repeated
            .fetch_add(accepted.repeated, Ordering::Relaxed);
        recorded?;
        // delivery has them now: the resend stops watching them
        let mut sent = lock(&self.inner.sent);
        for id in &accepted.taken {
            sent.remove(id);
        }
        Ok(())
    }
}
