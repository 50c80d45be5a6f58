//! A clean stop (SIGTERM): no new call starts, the calls under way settle (their outcomes
//! written), then stream sessions end with UNAVAILABLE so their subscribers attach again
//! later or elsewhere. Before, a stop recorded nothing more: an acknowledgement written
//! without a flush (QoS 1 acks, released QoS 2 deliveries, the outbox records of objects
//! whose in-memory pushes were acked) was lost with the process and the delivery came again
//! after the restart, and an attached subscriber's stream kept the node from stopping at all.

use std::pin::Pin;
use std::task::{Context, Poll};

use super::*;

/// How often a stop looks whether the calls under way have settled.
const SETTLE_POLL: Duration = Duration::from_millis(10);

impl Deliverer {
    /// Whether the node is stopping (no call starts any more).
    pub(super) fn stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Acquire)
    }

    /// Stops delivering: no call starts from now on, the calls under way get up to `settle`
    /// to end (a stream's delivery until its subscriber acks it), then every stream session
    /// ends. Answers whether every call settled in time. Called more than once (the signal
    /// starts it, the end of serving waits for it), it runs once and each caller gets its
    /// answer.
    pub async fn stop(&self, settle: Duration) -> bool {
        *self
            .inner
            .stopped
            .get_or_init(|| async {
                self.inner.stopping.store(true, Ordering::Release);
                let deadline = tokio::time::Instant::now() + settle;
                let settled = loop {
                    let busy: usize = lock(&self.inner.queues)
                        .values()
                        .map(|q| q.in_flight[0] + q.in_flight[1])
                        .sum();
                    if busy == 0 {
                        break true;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        tracing::warn!(
                            "stopping: {busy} delivery calls still under way after {settle:?}; \
                             their deliveries may come again after the restart"
                        );
                        break false;
                    }
                    tokio::time::sleep(SETTLE_POLL).await;
                };
                let _ = self.inner.closing.send(true);
                settled
            })
            .await
    }

    /// The session stream of `rx`, ending with UNAVAILABLE once the node stops.
    pub(super) fn until_stopped(
        &self,
        rx: mpsc::Receiver<Result<v1::Delivery, Status>>,
    ) -> SessionStream {
        let mut closing = self.inner.closing.subscribe();
        let closed = async move {
            if closing.wait_for(|c| *c).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        Box::pin(UntilStopped {
            rx,
            closed: Box::pin(closed),
            done: false,
        })
    }
}

/// A session's deliveries until the node stops.
struct UntilStopped {
    rx: mpsc::Receiver<Result<v1::Delivery, Status>>,
    closed: Pin<Box<dyn Future<Output = ()> + Send>>,
    done: bool,
}

impl tokio_stream::Stream for UntilStopped {
    type Item = Result<v1::Delivery, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.closed.as_mut().poll(cx).is_ready() {
            self.done = true;
            return Poll::Ready(Some(Err(Status::unavailable(
                "the node is stopping: attach again (the stream's deliveries wait for you)",
            ))));
        }
        self.rx.poll_recv(cx)
    }
}
