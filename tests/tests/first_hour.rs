//! What a new user of the system expects on day one, through the real `dissem up` on
//! 127.0.0.1:0.

use std::time::{Duration, Instant};

use proto::v1;
use tests::{Proc, channel, dissem_bin, runtime, stats, temp_dir, wait_for};

/// Subscribe, then put at once: each put is matched by the subscription created just before
/// it. A subscription is in force when `Create` returns (read-your-writes), not only once a
/// debounced image was published some milliseconds later; likewise gone when `Delete` returns.
#[test]
fn a_put_right_after_create_is_matched_every_time() {
    const N: u64 = 1_000;
    let dir = temp_dir("read-your-writes");
    let mut up = Proc::start(
        &dissem_bin(),
        &[
            "up".to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data".into(),
            dir.join("data").display().to_string(),
        ],
    );
    let rt = runtime();
    rt.block_on(async {
        let url = up.url();
        let mut subs = v1::subscriptions_client::SubscriptionsClient::new(channel(&url));
        let mut ingest = v1::ingest_client::IngestClient::new(channel(&url));
        let t0 = Instant::now();
        for i in 0..N {
            subs.create(v1::CreateSubscriptionRequest {
                subscription: Some(v1::Subscription {
                    filter: Some(v1::subscription::Filter::Text(format!("k = {i}"))),
                    target: Some(v1::Target {
                        kind: Some(v1::target::Kind::Stream("ryw".into())),
                    }),
                    ..v1::Subscription::default()
                }),
            })
            .await
            .expect("create");
            ingest
                .put(v1::PutRequest {
                    metadata: vec![v1::Attribute {
                        name: "k".into(),
                        value: Some(v1::Value {
                            kind: Some(v1::value::Kind::Integer(i as i64)),
                        }),
                    }],
                    ..v1::PutRequest::default()
                })
                .await
                .expect("put");
        }
        println!("{N} creates, each followed by a put, in {:?}", t0.elapsed());
        let u = url.clone();
        // every put was acknowledged, so the outbox holds each object until it was matched
        // (an object that matched nothing leaves it too)
        let handed = wait_for("every put to be matched", Duration::from_secs(60), || {
            let u = u.clone();
            async move {
                let s = stats(&u).await.ok()?;
                (s.outbox_pending == 0).then_some(s.matches_handed)
            }
        })
        .await;
        assert_eq!(
            handed, N,
            "each put matches exactly the subscription created before it"
        );

        // and a put right after Delete returns is not matched by the deleted subscription
        for i in 0..50i64 {
            let id = subs
                .create(v1::CreateSubscriptionRequest {
                    subscription: Some(v1::Subscription {
                        filter: Some(v1::subscription::Filter::Text(format!("gone = {i}"))),
                        target: Some(v1::Target {
                            kind: Some(v1::target::Kind::Stream("ryw".into())),
                        }),
                        ..v1::Subscription::default()
                    }),
                })
                .await
                .expect("create")
                .into_inner()
                .id;
            subs.delete(v1::DeleteSubscriptionRequest { id })
                .await
                .expect("delete");
            ingest
                .put(v1::PutRequest {
                    metadata: vec![v1::Attribute {
                        name: "gone".into(),
                        value: Some(v1::Value {
                            kind: Some(v1::value::Kind::Integer(i)),
                        }),
                    }],
                    ..v1::PutRequest::default()
                })
                .await
                .expect("put");
        }
        let u = url.clone();
        let after = wait_for(
            "the puts after deletes to settle",
            Duration::from_secs(60),
            || {
                let u = u.clone();
                async move {
                    let s = stats(&u).await.ok()?;
                    (s.outbox_pending == 0).then_some(s.matches_handed)
                }
            },
        )
        .await;
        assert_eq!(after, N, "a deleted subscription matched a later put");
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
