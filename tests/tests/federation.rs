//! Federation between clusters, all-active: three `dissem up` clusters on loopback linked in a
//! triangle. Every object put in one reaches the subscribers of all three exactly once (no
//! loops, no repeats), and what a cluster owes a peer that is down is delivered once the peer
//! is back, also when the owing cluster restarts meanwhile.

use std::net::SocketAddr;
use std::time::Duration;

use proto::v1;
use tests::{
    Proc, attach, cluster_up, free_port, http, numbered_put as put, receive_numbered as receive,
    runtime, stream_subscriber, temp_dir, token_create, wait_for,
};

const CLUSTERS: [&str; 3] = ["eu", "us", "ap"];

/// Cluster `i` of the triangle on `addrs[i]`, linked to the other two (`eu` serves metrics
/// on `metrics`).
fn start(dir: &std::path::Path, i: usize, addrs: &[SocketAddr], metrics: SocketAddr) -> Proc {
    let mut args = Vec::new();
    if i == 0 {
        args.push("--metrics-listen".to_string());
        args.push(metrics.to_string());
    }
    for (j, a) in addrs.iter().enumerate() {
        if j != i {
            args.push("--link".into());
            args.push(format!("{}=http://{a}", CLUSTERS[j]));
        }
    }
    cluster_up(dir, CLUSTERS[i], &addrs[i].to_string(), &args)
}

#[test]
fn a_triangle_of_clusters_delivers_every_object_everywhere_once() {
    let dir = temp_dir("federation");
    let addrs: Vec<SocketAddr> = (0..3).map(|_| free_port()).collect();
    let metrics = free_port();
    let mut procs: Vec<Proc> = (0..3).map(|i| start(&dir, i, &addrs, metrics)).collect();
    let rt = runtime();
    rt.block_on(async {
        let urls: Vec<String> = procs.iter_mut().map(|p| p.url()).collect();
        // a stream subscriber in each cluster, for every object
        let mut subs = Vec::new();
        for u in &urls {
            let filter = v1::subscription::Filter::Text("n >= 0".into());
            let (tx, down, _) = stream_subscriber(u, "all", filter).await;
            subs.push((tx, down));
        }
        // 20 objects put in each cluster
        for (i, u) in urls.iter().enumerate() {
            let mut c = v1::ingest_client::IngestClient::new(tests::channel(u));
            for n in 0..20 {
                c.put(put(CLUSTERS[i], n)).await.expect("put");
            }
        }
        for (i, (tx, down)) in subs.iter_mut().enumerate() {
            let got = receive(CLUSTERS[i], tx, down, 60, 0).await;
            assert_eq!(got.len(), 60, "{}: every object of the three", CLUSTERS[i]);
            let repeated: Vec<_> = got.iter().filter(|(_, c)| **c > 1).collect();
            assert!(repeated.is_empty(), "{}: repeats {repeated:?}", CLUSTERS[i]);
        }
        // "ap" goes down; what the others owe it waits, and arrives once it is back
        drop(subs.pop());
        procs[2].kill();
        for (i, u) in urls.iter().enumerate().take(2) {
            let mut c = v1::ingest_client::IngestClient::new(tests::channel(u));
            for n in 20..30 {
                c.put(put(CLUSTERS[i], n)).await.expect("put");
            }
        }
        for (i, (tx, down)) in subs.iter_mut().enumerate() {
            let got = receive(CLUSTERS[i], tx, down, 20, 20).await;
            assert_eq!(got.len(), 20, "{}", CLUSTERS[i]);
            assert!(got.values().all(|c| *c == 1), "{}: {got:?}", CLUSTERS[i]);
        }
        // eu's link to ap owes its 10 objects, and says how far behind it is
        let scrape = wait_for(
            "eu's link to ap owing 10",
            Duration::from_secs(10),
            || async move {
                let (_, body) = http(metrics, "GET", "/metrics", &[], "").await.ok()?;
                body.contains("dissem_link_owed{link=\"ap\"} 10")
                    .then_some(body)
            },
        )
        .await;
        assert!(
            scrape.contains("dissem_link_acked_total{link=\"us\"} 30"),
            "{scrape}"
        );
        assert!(
            scrape.contains("dissem_link_owed{link=\"us\"} 0"),
            "{scrape}"
        );
        assert!(
            scrape.contains("dissem_link_lag_seconds{link=\"us\"} 0\n"),
            "{scrape}"
        );
        let lag: f64 = scrape
            .lines()
            .find_map(|l| l.strip_prefix("dissem_link_lag_seconds{link=\"ap\"} "))
            .and_then(|v| v.parse().ok())
            .expect("ap's lag");
        assert!(lag > 0.0, "{scrape}");
        // the sending side restarts too while it owes: what it owed is kept
        drop(subs);
        procs[0].restart();
        procs[2] = start(&dir, 2, &addrs, metrics);
        let url = procs[2].url();
        let (tx, mut down) = attach(&url, "all").await;
        let got = receive("ap after its restart", &tx, &mut down, 20, 20).await;
        // SIGKILLed, ap matches again what it had not yet recorded as finished (QoS 1 is at
        // least once); what eu and us owed it arrives once each
        let owed: Vec<_> = got.iter().filter(|((_, n), _)| *n >= 20).collect();
        assert_eq!(owed.len(), 20, "what eu and us owed it: {got:?}");
        assert!(
            owed.iter().all(|((p, _), c)| p != "ap" && **c == 1),
            "{owed:?}"
        );
    });
    for p in &mut procs {
        p.kill();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer with an auth file takes replicated objects only with a token of the `federate`
/// role: of two links to it, the one holding an ingest token is refused (what it owes stays
/// owed), the one holding a federate token gets its object stored.
#[test]
fn a_link_needs_the_peers_federate_token() {
    let dir = temp_dir("federation-auth");
    let auth = dir.join("auth.toml");
    let federate = token_create(&auth, "eu-link", "peers", "federate");
    let ingest = token_create(&auth, "writer", "peers", "ingest");
    let admin = token_create(&auth, "ops", "peers", "admin");
    let (good, bad) = (dir.join("good.token"), dir.join("bad.token"));
    std::fs::write(&good, &federate).expect("token file");
    std::fs::write(&bad, &ingest).expect("token file");
    let peer_addr = free_port();
    let up =
        |name: &str, listen: String, extra: Vec<String>| cluster_up(&dir, name, &listen, &extra);
    let mut peer = up(
        "us",
        peer_addr.to_string(),
        vec!["--auth-file".into(), auth.display().to_string()],
    );
    // the good link carries n = 1 only, the bad one n = 2 only
    let metrics = free_port();
    let mut origin = up(
        "eu",
        "127.0.0.1:0".into(),
        vec![
            "--metrics-listen".into(),
            metrics.to_string(),
            "--link".into(),
            format!(
                "good=http://{peer_addr},token-file={},filter=n = 1",
                good.display()
            ),
            "--link".into(),
            format!(
                "bad=http://{peer_addr},token-file={},filter=n = 2",
                bad.display()
            ),
        ],
    );
    runtime().block_on(async {
        let (peer_url, url) = (peer.url(), origin.url());
        let mut c = v1::ingest_client::IngestClient::new(tests::channel(&url));
        for n in [1, 2] {
            c.put(put("eu", n)).await.expect("put");
        }
        let stored = || {
            let (peer_url, admin) = (peer_url.clone(), admin.clone());
            async move {
                v1::admin_client::AdminClient::new(tests::channel(&peer_url))
                    .stats(tests::bearer(v1::StatsRequest {}, &admin))
                    .await
                    .ok()
                    .map(|s| s.into_inner().objects_stored)
            }
        };
        wait_for(
            "the good link's object",
            Duration::from_secs(20),
            || async { stored().await.filter(|n| *n >= 1) },
        )
        .await;
        // the bad link has sent its object twice (so the peer refused the first call) and
        // nothing of it was acknowledged
        let scrape = wait_for(
            "the bad link's second try",
            Duration::from_secs(20),
            || async move {
                let (_, body) = http(metrics, "GET", "/metrics", &[], "").await.ok()?;
                let sent = body
                    .lines()
                    .find_map(|l| l.strip_prefix("dissem_link_sent_total{link=\"bad\"} "))
                    .and_then(|v| v.parse::<f64>().ok())?;
                (sent >= 2.0).then_some(body)
            },
        )
        .await;
        assert!(
            scrape.contains("dissem_link_acked_total{link=\"bad\"} 0\n"),
            "{scrape}"
        );
        assert!(
            scrape.contains("dissem_link_owed{link=\"bad\"} 1\n"),
            "{scrape}"
        );
        assert_eq!(stored().await, Some(1), "only the federate token's object");
    });
    origin.kill();
    peer.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
