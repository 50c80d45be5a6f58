//! Ordered subscriptions: a publisher's objects reach an `ordered` subscription's gRPC
//! endpoint in the order they were put, each once, also while the endpoint refuses for a
//! while (the refused delivery is retried first and the later ones wait behind it).

use std::time::Duration;

use bench::recorder::Recorder;
use proto::v1;
use tests::{numbered_put as put, runtime, start_up, temp_dir, wait_for};

async fn subscribe(url: &str, target: &str, ordered: bool) {
    let s = v1::Subscription {
        retry: Some(v1::RetryPolicy {
            initial_backoff_ms: 50,
            max_backoff_ms: 100,
            ..Default::default()
        }),
        ordered,
        ..tests::grpc_subscription("n >= 0", target)
    };
    tests::create_subscription(url, s).await.expect("create");
}

/// The numbers `rec` was shown, in the order it was first shown them, and whether any came
/// twice.
fn arrival(rec: &Recorder) -> (Vec<i64>, bool) {
    let seen = rec.numbered();
    let twice = seen.values().any(|v| v.times > 1);
    let mut v: Vec<_> = seen.into_iter().map(|((_, n), v)| (v.first, n)).collect();
    v.sort();
    (v.into_iter().map(|(_, n)| n).collect(), twice)
}

#[test]
fn an_ordered_subscription_gets_a_publishers_objects_in_order_across_retries() {
    let dir = temp_dir("ordered");
    let node = start_up(&dir, &["--allow-private-targets"]);
    let rt = runtime();
    rt.block_on(async {
        let url = node.url();
        let (rec, target) = Recorder::start().await.expect("recorder");
        subscribe(&url, &target, true).await;
        let mut c = v1::ingest_client::IngestClient::new(tests::channel(&url));
        // three publishers at once, so matches of their objects interleave
        let total = 150;
        let mut tasks = Vec::new();
        for p in ["x", "y", "z"] {
            let url = url.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = v1::ingest_client::IngestClient::new(tests::channel(&url));
                for n in 0..total {
                    c.put(put(p, n)).await.expect("put");
                }
            }));
        }
        // the endpoint refuses for a while mid-run: the refused delivery is retried first
        wait_for("some deliveries", Duration::from_secs(30), || async {
            (rec.numbered().len() >= 60).then_some(())
        })
        .await;
        rec.set_refusing(true);
        tokio::time::sleep(Duration::from_millis(300)).await;
        rec.set_refusing(false);
        for t in tasks {
            t.await.expect("publisher");
        }
        c.put(put("w", 0)).await.expect("put");
        wait_for("every object", Duration::from_secs(60), || async {
            (rec.numbered().len() == 3 * total as usize + 1).then_some(())
        })
        .await;
        let seen = rec.numbered();
        let (order, twice) = arrival(&rec);
        assert!(!twice, "an object came twice");
        for p in ["x", "y", "z"] {
            let of_p: Vec<i64> = seen
                .iter()
                .filter(|((q, _), _)| q == p)
                .map(|(k, v)| (v.first, k.1))
                .collect::<std::collections::BTreeMap<_, _>>()
                .into_values()
                .collect();
            assert_eq!(
                of_p,
                (0..total).collect::<Vec<_>>(),
                "publisher {p} out of order"
            );
        }
        // and across publishers, in the order the node took them (its ids)
        let mut by_id: Vec<_> = seen.values().map(|v| (v.id, v.first)).collect();
        by_id.sort();
        let late: Vec<_> = by_id
            .windows(2)
            .filter(|w| w[0].1 > w[1].1)
            .map(|w| (w[0].0, w[1].0, w[0].1 - w[1].1))
            .collect();
        assert!(
            late.is_empty(),
            "arrival follows the node's order: {late:?} {order:?}"
        );
    });
}
