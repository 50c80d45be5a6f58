//! Where delivery reports the objects it finished, taken by the node daemon in batches.
//! A node finishes tens of thousands of objects a second; a channel message each woke the
//! daemon's finisher once per object (a futex wake-up and a lock taken by both threads each
//! time). Here a report is a push under a short lock, and only the first report into an
//! empty queue wakes the reader, which then takes everything reported meanwhile.

use std::sync::Mutex;

use storage::ObjectId;
use tokio::sync::Notify;

/// Finished objects waiting for the daemon's finisher (unbounded, as the channel it
/// replaces: each entry is one object that left this node's dissemination).
#[derive(Debug, Default)]
pub struct FinishedQueue {
    items: Mutex<Vec<ObjectId>>,
    ready: Notify,
}

impl FinishedQueue {
    /// Reports `id` finished.
    pub fn push(&self, id: ObjectId) {
        let first = {
            let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
            items.push(id);
            items.len() == 1
        };
        if first {
            self.ready.notify_one();
        }
    }

    /// Every object reported since the last take, in report order, without waiting (a
    /// stop takes what the finisher has not).
    pub fn take_now(&self) -> Vec<ObjectId> {
        std::mem::take(&mut *self.items.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Every object reported since the last take, in report order; waits while there is
    /// none. Cancel-safe: the reports are taken only by a call that returns them.
    pub async fn take(&self) -> Vec<ObjectId> {
        loop {
            let items = std::mem::take(&mut *self.items.lock().unwrap_or_else(|p| p.into_inner()));
            if !items.is_empty() {
                return items;
            }
            // a push between the look above and this wait leaves a permit: not missed
            self.ready.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn id(seq: u64) -> ObjectId {
        ObjectId { node: 1, seq }
    }

    #[tokio::test]
    async fn reports_are_taken_together_in_order_and_none_is_missed() {
        let q = Arc::new(FinishedQueue::default());
        for s in 0..5 {
            q.push(id(s));
        }
        let got = tokio::time::timeout(Duration::from_secs(5), q.take())
            .await
            .expect("reports waiting: no wait");
        assert_eq!(got, (0..5).map(id).collect::<Vec<_>>());
        // a reader waiting on an empty queue is woken by the next report, from any thread
        let reader = tokio::spawn({
            let q = q.clone();
            async move { q.take().await }
        });
        let pusher = std::thread::spawn({
            let q = q.clone();
            move || q.push(id(9))
        });
        pusher.join().expect("pusher");
        let got = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the waiting reader was woken")
            .expect("reader");
        assert_eq!(got, vec![id(9)]);
    }
}
