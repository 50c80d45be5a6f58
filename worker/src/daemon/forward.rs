//! The link to the coordinator for objects: each stored object is queued and the forwarder
//! sends what gathered in one `Cluster.Arrived`: at once while objects come one at a time
//! (the last message carried one), and under a stream that gathers more at most one message
//! per 2 ms. Batching is for when work waits, never a reason for a lone object to wait.
//! What waits goes highest priority first: under a backlog a priority-7 object rides the
//! next message, not the one after every object that arrived before it.

use std::collections::VecDeque;

use super::*;

/// The longest an `Arrived` waits for its answer (what it carried is resent later).
const ARRIVED_LIMIT: Duration = Duration::from_secs(5);
/// Objects the forwarder holds at most besides its channel's; past it the channel fills and
/// drops (the outbox resend picks them up).
const WAITING: usize = 65_536;

/// Objects waiting for a message to the coordinator, a queue per priority (0..=7, higher
/// first; arrival order within one).
#[derive(Debug, Default)]
struct Waiting {
    by_priority: [VecDeque<v1::ArrivedObject>; 8],
    len: usize,
}

impl Waiting {
    fn push(&mut self, o: v1::ArrivedObject) {
        let p = o.priority.min(u32::from(runtime::URGENT_PRIORITY)) as usize;
        self.by_priority[p].push_back(o);
        self.len += 1;
    }

    /// At most `n` objects, highest priority first.
    fn take(&mut self, n: usize) -> Vec<v1::ArrivedObject> {
        let mut batch = Vec::with_capacity(n.min(self.len));
        for q in self.by_priority.iter_mut().rev() {
            let k = q.len().min(n - batch.len());
            batch.extend(q.drain(..k));
        }
        self.len -= batch.len();
        batch
    }
}

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
        // when the last message went, if it carried more than one object
        let mut last: Option<tokio::time::Instant> = None;
        let mut waiting = Waiting::default();
        let mut open = true;
        while open || waiting.len > 0 {
            if waiting.len == 0 {
                match rx.recv().await {
                    Some(o) => waiting.push(o),
                    None => return,
                }
            }
            // what is ready, and until the gap since the last message passed what comes
            let due = last.map(|t| t + cfg.forward_gap);
            while open && waiting.len < WAITING {
                match rx.try_recv() {
                    Ok(o) => {
                        waiting.push(o);
                        continue;
                    }
                    Err(mpsc::error::TryRecvError::Disconnected) => open = false,
                    Err(mpsc::error::TryRecvError::Empty) => {}
                }
                if !open || waiting.len >= cfg.forward_batch {
                    break;
                }
                match due {
                    Some(due) if tokio::time::Instant::now() < due => {
                        match tokio::time::timeout_at(due, rx.recv()).await {
                            Ok(Some(o)) => waiting.push(o),
                            Ok(None) => open = false,
                            Err(_) => break,
                        }
                    }
                    _ => break,
                }
            }
            let batch = waiting.take(cfg.forward_batch);
            last = (batch.len() > 1).then(tokio::time::Instant::now);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn object(seq: u64, priority: u32) -> v1::ArrivedObject {
        v1::ArrivedObject {
            id: Some(v1::ObjectId { node: 0, seq }),
            priority,
            ..Default::default()
        }
    }

    #[test]
    fn waiting_objects_go_highest_priority_first_in_arrival_order() {
        let mut w = Waiting::default();
        for (seq, p) in [(1, 0), (2, 7), (3, 3), (4, 0), (5, 7), (6, 9)] {
            w.push(object(seq, p));
        }
        let seqs = |b: Vec<v1::ArrivedObject>| -> Vec<u64> {
            b.iter().map(|o| o.id.map_or(0, |i| i.seq)).collect()
        };
        // 9 is out of range: taken as 7, after the 7s that came before it
        assert_eq!(seqs(w.take(4)), [2, 5, 6, 3]);
        assert_eq!(w.len, 2);
        assert_eq!(seqs(w.take(4)), [1, 4]);
        assert_eq!(w.len, 0);
        assert!(w.take(4).is_empty());
    }
}
