//! The chaos benchmark's own subscription calls (create, update, delete through a node),
//! tried again while the cluster is between leaders or a connection broke mid-call.

use std::time::{Duration, Instant};

use proto::v1;

use super::Changes;
use crate::failoverbench::Traffic;
use crate::procs;

/// Creates a QoS 1 subscription of `filter` pushing to the recorder, through the node at
/// `via` (tried again between leaders; a create whose answer was lost may leave one more).
pub(super) async fn create(
    via: &str,
    filter: &str,
    traffic: &Traffic,
) -> Result<v1::Subscription, tonic::Status> {
    create_retrying(via, procs::grpc_subscription(filter, &traffic.target)).await
}

/// Creates `s` through the node at `via`, tried again between leaders (a create whose
/// answer was lost may leave one more).
pub(super) async fn create_retrying(
    via: &str,
    s: v1::Subscription,
) -> Result<v1::Subscription, tonic::Status> {
    let subs = v1::subscriptions_client::SubscriptionsClient::new(procs::channel(via));
    retry(|| {
        let mut subs = subs.clone();
        let subscription = Some(s.clone());
        async move {
            subs.create(v1::CreateSubscriptionRequest { subscription })
                .await
        }
    })
    .await
}

/// Deletes subscription `id` through the node at `via` and records from which object on
/// nothing may be delivered to it.
pub(super) async fn delete(
    via: &str,
    id: u64,
    traffic: &Traffic,
    changes: &mut Changes,
) -> Result<(), tonic::Status> {
    let subs = v1::subscriptions_client::SubscriptionsClient::new(procs::channel(via));
    let deleted = retry(|| {
        let mut subs = subs.clone();
        async move { subs.delete(v1::DeleteSubscriptionRequest { id }).await }
    })
    .await;
    match deleted {
        // only this benchmark deletes its subscriptions: an earlier try went through and
        // its answer was lost
        Ok(_) => {}
        Err(e) if e.code() == tonic::Code::NotFound => {}
        Err(e) => return Err(e),
    }
    let next = traffic
        .numbers
        .next
        .load(std::sync::atomic::Ordering::SeqCst);
    changes.deleted.insert(id, next);
    Ok(())
}

/// A subscription call, tried again while the cluster is between leaders or its connection
/// broke mid-call (10 s at most). Every call this benchmark makes is safe to send again: a
/// read; an update stores the same filter once more under a newer revision; a delete tried
/// again answers NOT_FOUND; a create may leave one more subscription of the same filter.
pub(super) async fn retry<T, F, Fut>(mut f: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match f().await {
            Ok(r) => return Ok(r.into_inner()),
            Err(e) if outcome_unknown(&e) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether a call may not have reached a leader or its answer was lost: no leader now, or the
/// connection broke mid-call (the process it went through was killed or cut off; tonic
/// answers such a call UNKNOWN, "transport error").
fn outcome_unknown(e: &tonic::Status) -> bool {
    match e.code() {
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::DeadlineExceeded => true,
        tonic::Code::Unknown => e.message().contains("transport error"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::outcome_unknown;
    use tonic::{Code, Status};

    #[test]
    fn a_call_broken_mid_flight_is_tried_again_and_a_refusal_is_not() {
        assert!(outcome_unknown(&Status::unavailable("no leader")));
        assert!(outcome_unknown(&Status::unknown(
            "transport error: connection error: broken pipe"
        )));
        assert!(!outcome_unknown(&Status::unknown("something else")));
        assert!(!outcome_unknown(&Status::new(Code::NotFound, "gone")));
        assert!(!outcome_unknown(&Status::invalid_argument("filter")));
    }
}
