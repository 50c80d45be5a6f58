//! The link to the coordinator for objects: each stored object is queued and the forwarder
//! sends what gathered in one `Cluster.Arrived` (at once after a quiet spell; under a steady
//! stream at most one message per 2 ms).

use super::*;

/// The longest an `Arrived` waits for its answer (what it carried is resent later).
const ARRIVED_LIMIT: Duration = Duration::from_secs(5);

impl Daemon {
    /// A stored object (still in the outbox) to be matched: queued for the coordinator.
    pub fn arrived(&self, id: ObjectId, priority: u8, metadata: &[(String, blocks::Value)]) {
        let obj = v1::ArrivedObject {
            id: Some(v1::ObjectId {
                node: id.node,
                seq: id.seq,
            }),
            priority: priority as u32,
            metadata: validate::attributes_to_proto(metadata),
            received_unix_ms: now_ms(),
        };
        lock(&self.inner.sent).insert(id, Instant::now());
        // a full queue drops it here; the outbox resend picks it up
        let _ = self.inner.forward.try_send(obj);
    }

    pub(super) async fn forwarder(self, mut rx: mpsc::Receiver<v1::ArrivedObject>) {
        let cfg = &self.inner.cfg;
        let mut last: Option<tokio::time::Instant> = None;
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            let due = last.map(|t| t + cfg.forward_gap);
            while batch.len() < cfg.forward_batch {
                let next = match due {
                    Some(due) if tokio::time::Instant::now() < due => {
                        tokio::time::timeout_at(due, rx.recv()).await.ok().flatten()
                    }
                    _ => rx.try_recv().ok(),
                };
                match next {
                    Some(o) => batch.push(o),
                    None => break,
                }
            }
            last = Some(tokio::time::Instant::now());
            self.send_arrived(batch).await;
        }
    }

    pub(super) async fn send_arrived(&self, objects: Vec<v1::ArrivedObject>) {
        let n = objects.len();
        let req = v1::ArrivedRequest {
            node: self.inner.cfg.node,
            objects,
        };
        let call = tokio::time::timeout(ARRIVED_LIMIT, self.inner.coord.arrived(req));
        let answer = match &self.inner.coord {
            // a leader that stops answering (paused, cut off) is replaced: the objects go to
            // the next one with the outbox resend after registering, not after this call
            ToCoordinator::Elected(e) => {
                let mut leader = e.leader().changes();
                tokio::select! {
                    r = call => r,
                    _ = leader.changed() => return,
                }
            }
            _ => call.await,
        };
        if let Err(e) =
            answer.unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer in time")))
        {
            tracing::debug!("sending {n} objects to the coordinator failed (resent later): {e}");
        }
    }
}
