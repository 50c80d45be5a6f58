//! Federation, active-passive: a primary `dissem up` replicates to a standby that keeps the
//! copies without disseminating them; killed, the primary is replaced by the standby (promoted
//! on its own after the primary's silence), and switching back (publishers first, drain,
//! then the promotion) loses nothing and delivers nothing twice. And the standby's own rules,
//! driven through its API as a primary would: copies below the finished-watermark and expired
//! copies are never disseminated, copies survive its restart, a promotion disseminates the
//! rest (under the writers' own message ids, so a writer's resend to the standby is the same
//! object), and a primary from before the promotion is told it was superseded.

use std::net::SocketAddr;
use std::time::Duration;

use proto::v1;
use tests::{
    Proc, cluster_up, federation, free_port, numbered_put as put, receive_numbered as receive,
    runtime, stream_subscriber, temp_dir, wait_for,
};

fn up(dir: &std::path::Path, name: &str, addr: SocketAddr, extra: &[String]) -> Proc {
    cluster_up(dir, name, &addr.to_string(), extra)
}

async fn links(url: &str) -> Option<v1::LinksResponse> {
    federation(url)
        .links(v1::LinksRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// Waits until the node at `url` has `role` and keeps no standby copy.
async fn settled(who: &str, url: &str, role: &'static str) -> v1::LinksResponse {
    wait_for(
        &format!("{who} {role} with no standby copy"),
        Duration::from_secs(20),
        || async move {
            links(url)
                .await
                .filter(|l| l.role == role && l.standby_copies == 0)
        },
    )
    .await
}

#[test]
fn a_standby_takes_over_from_a_dead_primary_and_hands_back() {
    let dir = temp_dir("active-passive");
    let (p_addr, s_addr) = (free_port(), free_port());
    let link = |name: &str, to: SocketAddr| {
        vec![
            "--link".to_string(),
            format!("{name}=http://{to},mode=active-passive,ttl=30s"),
        ]
    };
    let mut primary = up(&dir, "p", p_addr, &link("to-s", s_addr));
    let mut standby_flags = link("to-p", p_addr);
    standby_flags.extend(["--standby".into(), "--promote-after".into(), "1s".into()]);
    let mut secondary = up(&dir, "s", s_addr, &standby_flags);
    let rt = runtime();
    rt.block_on(async {
        let (p, s) = (primary.url(), secondary.url());
        let filter = || v1::subscription::Filter::Text("n >= 0".into());
        let (p_tx, mut p_down, _) = stream_subscriber(&p, "all", filter()).await;
        let (s_tx, mut s_down, _) = stream_subscriber(&s, "all", filter()).await;
        // the primary disseminates; the standby keeps copies until the watermark passes them
        tests::put_numbered(&p, "a", 0..20).await;
        let got = receive("primary", &p_tx, &mut p_down, 20, 0).await;
        assert!(got.len() == 20 && got.values().all(|c| *c == 1), "{got:?}");
        let s_links = settled("the secondary", &s, "standby").await;
        assert_eq!(s_links.epoch, 0);
        assert!(s_links.primary_seen_unix_ms > 0, "{s_links:?}");

        // the primary dies: the standby promotes itself after a second of silence, and
        // disseminates nothing the primary had finished
        primary.kill();
        let s_links = settled("the secondary", &s, "active").await;
        assert_eq!(s_links.epoch, 1, "{s_links:?}");
        tests::put_numbered(&s, "a", 20..30).await;
        let got = receive("secondary", &s_tx, &mut s_down, 10, 20).await;
        assert!(
            got.len() == 10 && got.iter().all(|((_, n), c)| *n >= 20 && *c == 1),
            "only the new objects, once: {got:?}"
        );

        // the old primary comes back as a standby: the secondary's objects reach it as
        // copies and are dropped there once the secondary reports them finished
        primary.restart_with(&["--standby"]);
        let p = primary.url();
        let p_links = settled("the old primary", &p, "standby").await;
        assert_eq!(p_links.epoch, 0, "{p_links:?}");
        wait_for(
            "the secondary's link to owe nothing",
            Duration::from_secs(20),
            || async {
                links(&s)
                    .await
                    .filter(|l| l.links.iter().all(|k| k.owed == 0 && k.acked >= 10))
            },
        )
        .await;

        // switching back: publishers first (a standby disseminates what is put to it), the
        // secondary drained, then the old primary promoted; the secondary steps down
        let (p_tx, mut p_down, _) = stream_subscriber(&p, "all2", filter()).await;
        tests::put_numbered(&p, "b", 0..10).await;
        let got = receive("old primary", &p_tx, &mut p_down, 10, 0).await;
        assert!(got.len() == 10 && got.values().all(|c| *c == 1), "{got:?}");
        let promoted = federation(&p)
            .promote(v1::PromoteRequest {})
            .await
            .expect("promote")
            .into_inner();
        assert_eq!(promoted.epoch, 2, "above the secondary's 1: {promoted:?}");
        assert_eq!(promoted.disseminated, 0, "{promoted:?}");
        settled("the secondary", &s, "standby").await;
        tests::put_numbered(&p, "b", 10..15).await;
        let got = receive("old primary", &p_tx, &mut p_down, 5, 10).await;
        assert!(
            got.keys().filter(|(_, n)| *n >= 10).count() == 5 && got.values().all(|c| *c == 1),
            "{got:?}"
        );
        // the secondary delivered nothing more after its own ten
        assert!(
            tokio::time::timeout(Duration::from_millis(500), s_down.message())
                .await
                .is_err(),
            "the secondary delivered after stepping down"
        );
    });
    primary.kill();
    secondary.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

fn copy(n: i64, seq: u64, expires_unix_ms: u64) -> v1::FederatedObject {
    let p = put("prim", n);
    v1::FederatedObject {
        origin_cluster: "prim".into(),
        origin_id: Some(v1::ObjectId { node: 1, seq }),
        message_id: p.message_id,
        metadata: p.metadata,
        received_unix_ms: runtime::now_ms(),
        expires_unix_ms,
        ..Default::default()
    }
}

/// What the node at `url` answers a standby stream from `from` at `epoch` with the
/// finished-watermark `finished_below`, carrying `objects` (origin node 1).
async fn send(
    url: &str,
    from: &str,
    epoch: u64,
    finished_below: u64,
    objects: Vec<v1::FederatedObject>,
) -> Result<v1::FederateResponse, tonic::Status> {
    federation(url)
        .replicate(v1::FederateRequest {
            from_cluster: from.into(),
            objects,
            standby: Some(v1::Standby {
                epoch,
                origin_node: 1,
                finished_below,
            }),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

#[test]
fn a_promotion_disseminates_only_unfinished_copies_that_have_not_expired() {
    let dir = temp_dir("standby-rules");
    let addr = free_port();
    let mut node = up(&dir, "dr", addr, &["--standby".to_string()]);
    let rt = runtime();
    rt.block_on(async {
        let url = node.url();
        let filter = v1::subscription::Filter::Text("n >= 0".into());
        let (tx, down, _) = stream_subscriber(&url, "all", filter).await;
        let now = runtime::now_ms();
        let soon = now + 1500;
        let later = now + 120_000;
        // seq 1, 2: finished at the primary; 3: expired already; 5: expires soon; 4, 6: live
        let objects = vec![
            copy(1, 1, later),
            copy(2, 2, later),
            copy(3, 3, now - 1),
            copy(4, 4, later),
            copy(5, 5, soon),
            copy(6, 6, later),
        ];
        let r = send(&url, "prim", 0, 3, objects).await.expect("replicate");
        assert_eq!(
            (r.stored, r.duplicates, r.superseded),
            (3, 3, false),
            "{r:?}"
        );
        // a heartbeat: the primary finished 4 too
        send(&url, "prim", 0, 5, Vec::new())
            .await
            .expect("heartbeat");
        // bad input is named
        let e = send(&url, "prim", 0, 5, vec![copy(7, 7, 0)])
            .await
            .expect_err("no expiry");
        assert!(e.message().contains("objects[0].expires_unix_ms"), "{e}");
        assert_eq!(links(&url).await.expect("links").standby_copies, 2);

        // the copies survive a restart, and the node is still a standby (no flag needed)
        node.restart_with(&[]);
        let url = node.url();
        let l = links(&url).await.expect("links");
        assert_eq!((l.role.as_str(), l.standby_copies), ("standby", 2), "{l:?}");
        let (tx2, mut down2) = tests::attach(&url, "all").await;
        drop((tx, down));

        // a writer that failed over resends 6 here under its own message id: delivered by
        // this standby (its own put), and the copy of 6 is then the same object
        v1::ingest_client::IngestClient::new(tests::channel(&url))
            .put(put("prim", 6))
            .await
            .expect("the writer's resend");
        // once 5 has expired, the promotion has only 6 left, and stores it once
        wait_for("copy 5 to expire", Duration::from_secs(10), || async {
            (runtime::now_ms() > soon).then_some(())
        })
        .await;
        let p = federation(&url)
            .promote(v1::PromoteRequest {})
            .await
            .expect("promote")
            .into_inner();
        assert_eq!((p.epoch, p.disseminated, p.expired), (1, 0, 1), "{p:?}");
        let got = receive("promoted", &tx2, &mut down2, 1, 0).await;
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            vec![(("prim".to_string(), 6), 1)],
            "6 once: the resend and the copy are one object"
        );
        // the old primary, still at epoch 0, is told it was superseded, and nothing is kept
        let r = send(&url, "prim", 0, 6, vec![copy(8, 8, later)])
            .await
            .expect("replicate");
        assert_eq!((r.superseded, r.epoch, r.stored), (true, 1, 0), "{r:?}");
        assert_eq!(links(&url).await.expect("links").standby_copies, 0);
        // a promotion after this one makes it step down, but only the primary's: another
        // cluster's stream is refused, whatever its epoch
        let e = send(&url, "other", 5, 0, Vec::new())
            .await
            .expect_err("not its primary");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(e.message().contains("never a standby of \"other\""), "{e}");
        assert_eq!(links(&url).await.expect("links").role, "active");
        send(&url, "prim", 5, 0, Vec::new())
            .await
            .expect("the primary, promoted again");
        let l = links(&url).await.expect("links");
        assert_eq!((l.role.as_str(), l.epoch), ("standby", 5), "{l:?}");
    });
    node.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
