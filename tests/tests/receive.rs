//! `dissem receive` through the real binaries: a `dissem up` pushes every put to a QoS 1 and
//! a QoS 2 gRPC subscription of a `dissem receive` process, which is SIGKILLed again and
//! again mid-traffic and started on the same port and journal. Afterwards the journal shows
//! every acknowledged object to both subscriptions, and to the exactly-once one once.

use std::time::Duration;

use proto::v1;
use tests::{channel, free_port, numbered_put, runtime, shown, temp_dir, wait_for};

#[test]
fn a_receiver_killed_mid_traffic_loses_nothing_and_shows_exactly_once_deliveries_once() {
    let dir = temp_dir("receive-kills");
    // the subscriber is on loopback
    let node = tests::start_up(&dir, &["--allow-private-targets"]);
    let url = node.url();
    let at = free_port();
    let target = format!("http://{at}");
    let journal = dir.join("journal");
    let rt = runtime();
    rt.block_on(async {
        let retry = Some(v1::RetryPolicy {
            max_attempts: 1000,
            ttl_ms: 0,
            initial_backoff_ms: 20,
            max_backoff_ms: 200,
        });
        let sub = |qos| tests::create_grpc_subscription(&url, "n >= 0".into(), &target, qos, retry);
        let q2 = sub(v1::Qos::ExactlyOnce)
            .await
            .expect("the QoS 2 subscription");
        let q1 = sub(v1::Qos::AtLeastOnce)
            .await
            .expect("the QoS 1 subscription");
        let mut receiver = tests::start_receiver(at, &journal, q2);
        // puts throughout, while the receiver is killed and started again
        const N: i64 = 400;
        // a kill lands between a first phase and its release now and then: many kills
        const KILLS: usize = 40;
        let putting = {
            let url = url.clone();
            tokio::spawn(async move {
                let mut c = v1::ingest_client::IngestClient::new(channel(&url));
                let mut subjects = Vec::new();
                for n in 0..N {
                    let id = c
                        .put(numbered_put("r", n))
                        .await
                        .expect("a put")
                        .into_inner()
                        .id
                        .expect("an object id");
                    subjects.push(format!("{}:{}", id.node, id.seq));
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                subjects
            })
        };
        for k in 1..=KILLS {
            // each kill once more has been shown: mid-traffic, with exchanges in flight
            let want = k * 18;
            wait_for("the receiver to show more", Duration::from_secs(60), || {
                let n = shown(&journal).len();
                async move { (n >= want).then_some(()) }
            })
            .await;
            receiver.restart();
        }
        let subjects = putting.await.expect("the puts");
        let want: Vec<(u64, String)> = subjects
            .iter()
            .flat_map(|s| [(q1, s.clone()), (q2, s.clone())])
            .collect();
        let seen = wait_for(
            "every object shown to both subscriptions",
            Duration::from_secs(60),
            || {
                let seen = shown(&journal);
                let done = want.iter().all(|k| seen.contains_key(k));
                async move { done.then_some(seen) }
            },
        )
        .await;
        let twice: Vec<_> = seen
            .iter()
            .filter(|((s, _), n)| *s == q2 && **n > 1)
            .collect();
        assert!(twice.is_empty(), "QoS 2 deliveries shown twice: {twice:?}");
        let held = std::fs::read_to_string(&journal)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"received\""))
            .count();
        assert!(
            held > 0,
            "the exactly-once subscription had its first phases journaled"
        );
        drop(receiver);
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
