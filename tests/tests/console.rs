//! The operator console (`/console` on the metrics listener) in headless Chromium against a
//! real cluster: a coordinator with a 1x2 grid and two `dissem node` processes. The page
//! draws the figures the node's `/metrics` serves (its puts, a subscription's dead letters,
//! the grid with both nodes up, the coordinator it follows), and, without a reload, shows a
//! node as down once it is SIGKILLed and its lease runs out. The coordinator's own console
//! says it leads and draws the same grid.

use std::time::Duration;

use proto::v1;
use serde_json::Value;
use tests::browser::{Browser, have_chromium};
use tests::{Cluster, dissem_bin, free_port, runtime, stats, temp_dir, temp_put, wait_for};

/// What the page shows, read from its DOM.
const READ_PAGE: &str = r#"
const cells = [...document.querySelectorAll('#grid td[data-node]')]
  .map(td => [td.dataset.node, td.dataset.state]);
const sub = [...document.querySelectorAll('#subscriptions tr[data-subscription]')]
  .map(tr => [tr.dataset.subscription, tr.querySelector('td.dead').textContent]);
return {
  title: document.getElementById('title').textContent,
  status: document.getElementById('status').textContent,
  updates: Number(document.body.dataset.updates || 0),
  puts: document.getElementById('figure-puts')?.dataset.value ?? null,
  leader: document.getElementById('leader').textContent,
  cells: Object.fromEntries(cells),
  subscriptions: Object.fromEntries(sub),
  charts: document.querySelectorAll('[data-histogram] svg rect').length,
};
"#;

#[test]
fn the_console_draws_a_real_cluster_and_shows_a_node_going_down() {
    if !have_chromium() {
        return;
    }
    let dir = temp_dir("console");
    let bin = dissem_bin();
    let coord_metrics = free_port().to_string();
    let node_metrics = free_port();
    let grid = [
        "--grid",
        "1x2",
        "--allow-private-targets",
        "--metrics-listen",
        &coord_metrics,
    ];
    let flags = tests::small_node_flags();
    let node_args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut c = Cluster::start_ids(&bin, &dir, 0..0, &grid, &node_args);
    let listen = node_metrics.to_string();
    let with_metrics = [&node_args[..], &["--metrics-listen", &listen]].concat();
    let n0 = c.start_node(&bin, 0, &with_metrics);
    c.nodes.push(n0);
    let n1 = c.start_node(&bin, 1, &node_args);
    c.nodes.push(n1);
    let coord = c.coordinator.url();
    let url = c.nodes[0].url();
    runtime().block_on(async {
        wait_for("two nodes registered", Duration::from_secs(60), || {
            let coord = coord.clone();
            async move { (stats(&coord).await.ok()?.cluster?.nodes == 2).then_some(()) }
        })
        .await;
        // a subscription whose endpoint refuses: one attempt, then a dead letter per object
        let dead_end = format!("http://{}", free_port());
        let sub = bench::procs::create_grpc_subscription(
            &url,
            "temp > 0".into(),
            &dead_end,
            v1::Qos::AtLeastOnce,
            Some(v1::RetryPolicy {
                max_attempts: 1,
                ..Default::default()
            }),
        )
        .await
        .expect("subscription");
        let ingest = v1::ingest_client::IngestClient::new(tests::channel(&url));
        for t in 1..=7 {
            wait_for("a put acknowledged", Duration::from_secs(30), || {
                let mut ingest = ingest.clone();
                async move { ingest.put(temp_put(t)).await.ok().map(drop) }
            })
            .await;
        }
        let metrics = node_metrics;
        wait_for(
            "seven dead letters in /metrics",
            Duration::from_secs(30),
            || async move {
                let (_, body) = tests::http(metrics, "GET", "/metrics", &[], "")
                    .await
                    .ok()?;
                body.contains("dissem_deliveries_total{outcome=\"dead_letter\"} 7\n")
                    .then_some(())
            },
        )
        .await;

        let browser = Browser::start(&dir).await;
        browser
            .open(&format!("http://{node_metrics}/console"))
            .await;
        let read = || async { browser.eval(READ_PAGE).await };
        let page = wait_until(&read, "the node's figures drawn", |p| {
            p["puts"] == "7"
                && p["cells"]["0"] == "up"
                && p["cells"]["1"] == "up"
                && p["subscriptions"][sub.to_string()] == "7"
        })
        .await;
        assert_eq!(page["title"], "dissem node 0", "{page}");
        let leader = page["leader"].as_str().unwrap_or_default();
        assert!(leader.contains(&coord), "the coordinator followed: {page}");
        assert!(
            page["charts"].as_u64().unwrap_or(0) > 0,
            "histogram bars: {page}"
        );
        let before = page["updates"].as_u64().unwrap_or(0);

        // node 1 dies: the same page (no reload) shows it down once its lease runs out
        c.nodes[1].kill();
        let page = wait_until(&read, "node 1 drawn as down", |p| {
            p["cells"]["1"] == "down" && p["cells"]["0"] == "up"
        })
        .await;
        assert!(
            page["updates"].as_u64().unwrap_or(0) > before,
            "the page updated itself: {page}"
        );

        // the coordinator's console: it leads, and sees the same grid
        browser
            .open(&format!("http://{coord_metrics}/console"))
            .await;
        let page = wait_until(&read, "the coordinator's console", |p| {
            p["cells"]["0"] == "up" && p["cells"]["1"] == "down"
        })
        .await;
        assert_eq!(page["title"], "dissem coordinator", "{page}");
        assert!(
            page["leader"]
                .as_str()
                .unwrap_or_default()
                .contains("this coordinator leads"),
            "{page}"
        );
    });
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads the page until `ok` holds (20 s at most; the page redraws every second).
async fn wait_until<F, Fut>(read: &F, what: &str, ok: impl Fn(&Value) -> bool) -> Value
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let page = read().await;
        if ok(&page) {
            return page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 20 s; the page shows {page}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
