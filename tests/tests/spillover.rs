//! Federation, spillover: two `dissem up` clusters, each with a spillover link to the other
//! and a gRPC subscriber named `orders`. While A's subscriber refuses, each delivery that
//! dead-letters in A (max attempts 3) reaches B's `orders` exactly once, and nothing else in B
//! (an unnamed subscription matching everything there never sees it); what dead-letters in B
//! after being spilled in is not spilled back. What A owes survives B's absence and a restart
//! of both sides, and the peer's API refuses spilled deliveries it cannot take, naming the
//! field.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bench::recorder::Recorder;
use proto::v1;
use tests::{
    Proc, cluster_up, federation, free_port, numbered_put as put, runtime, temp_dir, wait_for,
};

fn up(dir: &std::path::Path, name: &str, addr: SocketAddr, peer: SocketAddr) -> Proc {
    cluster_up(
        dir,
        name,
        &addr.to_string(),
        &[
            "--allow-private-targets".into(),
            "--link".into(),
            format!("peer=http://{peer},mode=spillover"),
        ],
    )
}

async fn link(url: &str) -> Option<v1::LinkInfo> {
    federation(url)
        .links(v1::LinksRequest {})
        .await
        .ok()
        .and_then(|r| r.into_inner().links.into_iter().next())
}

/// A QoS 1 gRPC subscription of everything numbered, pushing to `target`, named `name`.
async fn subscribe(url: &str, target: &str, name: &str) -> u64 {
    let s = v1::Subscription {
        retry: Some(v1::RetryPolicy {
            max_attempts: 3,
            ttl_ms: 60_000,
            initial_backoff_ms: 50,
            max_backoff_ms: 100,
        }),
        name: name.into(),
        ..tests::grpc_subscription("n >= 0", target)
    };
    tests::create_subscription(url, s).await.expect("create")
}

/// Waits until `rec` showed every (publisher, n) of `ns`, then a further half second so a
/// repeat would show; returns how often each numbered object was shown.
async fn shown(
    who: &str,
    rec: &Recorder,
    publisher: &str,
    ns: std::ops::Range<i64>,
) -> BTreeMap<(String, i64), u32> {
    wait_for(
        &format!("{who}: {publisher}-{ns:?}"),
        Duration::from_secs(30),
        || async {
            let got = rec.numbered();
            ns.clone()
                .all(|n| got.contains_key(&(publisher.to_string(), n)))
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    rec.numbered()
        .into_iter()
        .map(|(k, v)| (k, v.times))
        .collect()
}

fn of(got: &BTreeMap<(String, i64), u32>, publisher: &str) -> Vec<(i64, u32)> {
    got.iter()
        .filter(|((p, _), _)| p == publisher)
        .map(|((_, n), c)| (*n, *c))
        .collect()
}

/// Each of `ns` once.
fn once(ns: std::ops::Range<i64>) -> Vec<(i64, u32)> {
    ns.map(|n| (n, 1)).collect()
}

#[test]
fn dead_letters_spill_over_to_the_peers_subscription_of_the_same_name_once() {
    let dir = temp_dir("spillover");
    let (a_addr, b_addr) = (free_port(), free_port());
    let mut a = up(&dir, "a", a_addr, b_addr);
    let mut b = up(&dir, "b", b_addr, a_addr);
    let rt = runtime();
    rt.block_on(async {
        let (a_url, b_url) = (a.url(), b.url());
        let (rec_a, target_a) = Recorder::start().await.expect("recorder a");
        let (rec_b, target_b) = Recorder::start().await.expect("recorder b");
        let (other, target_other) = Recorder::start().await.expect("recorder other");
        subscribe(&a_url, &target_a, "orders").await;
        subscribe(&b_url, &target_b, "orders").await;
        // matches everything in B, but has no name: it sees B's own objects only
        subscribe(&b_url, &target_other, "").await;

        // healthy: A delivers its objects itself, B its own
        tests::put_numbered(&a_url, "a", 0..10).await;
        tests::put_numbered(&b_url, "b", 0..5).await;
        let got_a = shown("A's orders", &rec_a, "a", 0..10).await;
        assert_eq!(of(&got_a, "a"), once(0..10));
        let got_b = shown("B's orders", &rec_b, "b", 0..5).await;
        assert_eq!(of(&got_b, "a"), vec![], "nothing spilled while A delivers");

        // A's subscriber refuses: each delivery dead-letters after 3 attempts and spills
        rec_a.set_refusing(true);
        tests::put_numbered(&a_url, "a", 10..20).await;
        let got_b = shown("B's orders, spilled", &rec_b, "a", 10..20).await;
        assert_eq!(of(&got_b, "a"), once(10..20), "each spilled once");
        let l = wait_for("A's link drained", Duration::from_secs(10), || async {
            link(&a_url).await.filter(|l| l.owed == 0 && l.acked >= 10)
        })
        .await;
        assert_eq!(
            (l.mode.as_str(), l.acked, l.deduplicated),
            ("spillover", 10, 0)
        );

        // B's subscriber refuses too: what dead-letters in B after spilling in stays there
        rec_b.set_refusing(true);
        tests::put_numbered(&a_url, "a", 20..23).await;
        let dead = wait_for("B's dead letters", Duration::from_secs(30), || async {
            let d = v1::admin_client::AdminClient::new(tests::channel(&b_url))
                .dead_letters(v1::DeadLettersRequest { limit: 100 })
                .await
                .ok()?
                .into_inner()
                .dead_letters;
            (d.len() >= 3).then_some(d)
        })
        .await;
        assert!(
            dead.iter().all(|d| d.reason.contains("not spilled again")),
            "{dead:?}"
        );
        let back = link(&b_url).await.expect("B's link");
        assert_eq!((back.sent, back.owed), (0, 0), "nothing bounced back");
        let l = link(&a_url).await.expect("A's link");
        assert_eq!((l.acked, l.owed), (13, 0), "spilled once each");
        rec_b.set_refusing(false);

        // B away: A keeps what it owes, across its own restart too
        b.kill();
        tests::put_numbered(&a_url, "a", 23..28).await;
        wait_for("A owes 5", Duration::from_secs(30), || async {
            link(&a_url).await.filter(|l| l.owed == 5)
        })
        .await;
        a.restart();
        b.restart();
        let a_url = a.url();
        let got_b = shown("B's orders after restarts", &rec_b, "a", 23..28).await;
        // 20..23 were refused at B and dead-lettered there; a dead letter that had not
        // reached B's disk when B was killed is tried again after its restart (at least once)
        let mut want = once(10..20);
        want.extend(once(23..28));
        let (late, rest): (Vec<_>, Vec<_>) = of(&got_b, "a")
            .into_iter()
            .partition(|(n, _)| (20..23).contains(n));
        assert_eq!(rest, want);
        assert!(late.iter().all(|(_, c)| *c == 1), "{late:?}");
        wait_for(
            "A's link drained again",
            Duration::from_secs(10),
            || async { link(&a_url).await.filter(|l| l.owed == 0) },
        )
        .await;
        assert!(
            other.numbered().keys().all(|(p, _)| p == "b"),
            "a spilled object was matched in B: {:?}",
            other.numbered().keys().collect::<Vec<_>>()
        );
        assert_eq!(other.numbered().len(), 5);
    });
}

#[test]
fn the_peer_refuses_spilled_deliveries_it_cannot_take_naming_the_field() {
    let dir = temp_dir("spillover-api");
    let (a_addr, b_addr) = (free_port(), free_port());
    let b = up(&dir, "b", b_addr, a_addr);
    let rt = runtime();
    rt.block_on(async {
        let url = b.url();
        let (rec, target) = Recorder::start().await.expect("recorder");
        subscribe(&url, &target, "orders").await;
        let spilled = |seq: u64, name: &str, expires_unix_ms: u64| v1::SpilledDelivery {
            object: Some(v1::FederatedObject {
                origin_cluster: "a".into(),
                origin_id: Some(v1::ObjectId { node: 1, seq }),
                metadata: put("x", seq as i64).metadata,
                expires_unix_ms,
                ..Default::default()
            }),
            subscription_id: 7,
            tenant: String::new(),
            name: name.into(),
            reason: "refused".into(),
        };
        let send = |spilled: Vec<v1::SpilledDelivery>| {
            let url = url.clone();
            async move {
                federation(&url)
                    .replicate(v1::FederateRequest {
                        from_cluster: "a".into(),
                        spilled,
                        ..Default::default()
                    })
                    .await
                    .map(|r| r.into_inner())
            }
        };
        let later = runtime::now_ms() + 30_000;
        let e = send(vec![spilled(1, "orders", 0)])
            .await
            .expect_err("no deadline");
        assert!(
            e.message().contains("spilled[0].object.expires_unix_ms"),
            "{e}"
        );
        let e = send(vec![spilled(1, "a b", later)])
            .await
            .expect_err("bad name");
        assert!(e.message().contains("spilled[0].name"), "{e}");
        let mut foreign = spilled(1, "orders", later);
        if let Some(o) = foreign.object.as_mut() {
            o.origin_cluster = "c".into();
        }
        let e = send(vec![foreign]).await.expect_err("another origin");
        assert!(
            e.message().contains("spilled[0].object.origin_cluster"),
            "{e}"
        );

        // taken once, a repeat is a duplicate, a name nobody has is unclaimed
        let r = send(vec![
            spilled(1, "orders", later),
            spilled(2, "nobody", later),
        ])
        .await
        .expect("taken");
        assert_eq!((r.stored, r.duplicates, r.unclaimed), (1, 0, 1));
        let r = send(vec![spilled(1, "orders", later)])
            .await
            .expect("repeat");
        assert_eq!((r.stored, r.duplicates), (0, 1));
        let got = shown("B's orders", &rec, "x", 1..2).await;
        assert_eq!(of(&got, "x"), vec![(1, 1)]);
        // a writer may not take the id a spilled object is stored under
        let mut p = put("y", 1);
        p.message_id = "spill:a:1:1".into();
        let e = v1::ingest_client::IngestClient::new(tests::channel(&url))
            .put(p)
            .await
            .expect_err("reserved");
        assert!(
            e.message().contains("message_id") && e.message().contains("reserved"),
            "{e}"
        );
    });
}
