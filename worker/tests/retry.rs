//! Delivery's retry schedule runs on tokio time: under a paused tokio clock a whole schedule of
//! backoffs (seconds of them) passes without waiting, and what it leaves (the attempts, the
//! dead letter and its reason, the time the schedule took) follows the subscription's policy.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use proto::v1;
use storage::{NewObject, Store};
use tonic::Status;
use worker::deliver::{Deliverer, DeliveryConfig, SubscriptionSource};
use worker::lanes::Lanes;

/// One subscription, as the coordinator's registry would answer it.
struct One(v1::Subscription);

#[tonic::async_trait]
impl SubscriptionSource for One {
    async fn subscription(&self, id: u64) -> Result<Option<v1::Subscription>, Status> {
        Ok((id == self.0.id).then(|| self.0.clone()))
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("dissem-retry-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Pushes one QoS 1 delivery under `policy` to a gRPC target on a private address the node
/// does not allow (every attempt fails at once, with no I/O to wait on) until it
/// dead-letters: its reason, the tokio time the
/// schedule took, and the wall time.
async fn until_dead_letter(name: &str, policy: v1::RetryPolicy) -> (String, Duration, Duration) {
    let dir = temp_dir(name);
    let store = Store::open(&dir, 1).expect("store");
    let put = store
        .put(NewObject {
            data: b"x".to_vec(),
            ..NewObject::default()
        })
        .await
        .expect("put");
    let sub = v1::Subscription {
        id: 7,
        filter: Some(v1::subscription::Filter::Text("a > 1".into())),
        target: Some(v1::Target {
            kind: Some(v1::target::Kind::Grpc("http://127.0.0.1:1".into())),
        }),
        qos: v1::Qos::AtLeastOnce as i32,
        retry: Some(policy),
        ..v1::Subscription::default()
    };
    let d = Deliverer::new(
        DeliveryConfig::default(),
        store.clone(),
        Arc::new(One(sub)),
        Lanes::new(false),
    )
    .expect("deliverer");
    store
        .add_pending_deliveries(&[(7, put.id)])
        .await
        .expect("record");
    let (wall, virt) = (Instant::now(), tokio::time::Instant::now());
    d.enqueue(7, put.id);
    let dead = loop {
        let dead = store.dead_letters(10).expect("dead letters");
        if !dead.is_empty() {
            break dead;
        }
        assert!(
            virt.elapsed() < Duration::from_secs(600) && wall.elapsed() < Duration::from_secs(20),
            "no dead letter after {:?} of tokio time",
            virt.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = virt.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(dead.len(), 1);
    let (s, o, state) = &dead[0];
    assert_eq!((*s, *o), (7, put.id));
    assert_eq!(d.counters().dead_lettered.load(Ordering::Relaxed), 1);
    let storage::DeliveryState::DeadLetter { reason, .. } = state else {
        panic!("not a dead letter: {state:?}");
    };
    assert!(
        reason.contains("127.0.0.1"),
        "the last error is named: {reason}"
    );
    (reason.clone(), took, wall.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_failing_push_backs_off_on_tokio_time_then_dead_letters_at_max_attempts() {
    let (reason, took, wall) = until_dead_letter(
        "attempts",
        v1::RetryPolicy {
            max_attempts: 6,
            ttl_ms: 3_600_000,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 60_000,
        },
    )
    .await;
    assert!(
        reason.contains("gave up after 6 attempts (max_attempts 6)"),
        "{reason}"
    );
    // five backoffs of 1, 2, 4, 8 and 16 s, each jittered within its upper half
    assert!(
        took >= Duration::from_millis(15_500) && took <= Duration::from_millis(31_500),
        "the schedule took {took:?} of tokio time"
    );
    assert!(
        wall < Duration::from_secs(10),
        "waited {wall:?} of wall time"
    );
}

#[tokio::test(start_paused = true)]
async fn the_ttl_is_measured_on_tokio_time() {
    // backoffs capped at 2 s, so a 10 s TTL ends the schedule long before 1,000 attempts
    let (reason, took, wall) = until_dead_letter(
        "ttl",
        v1::RetryPolicy {
            max_attempts: 1_000,
            ttl_ms: 10_000,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 2_000,
        },
    )
    .await;
    assert!(reason.contains("TTL of 10000 ms passed"), "{reason}");
    assert!(
        took >= Duration::from_secs(10) && took <= Duration::from_secs(13),
        "the TTL ended the schedule after {took:?} of tokio time"
    );
    assert!(
        wall < Duration::from_secs(10),
        "waited {wall:?} of wall time"
    );
}
