//! A node that stops cleanly, through the real binary (issue: what a Ceph RGW in front of
//! dissem showed):
//! - SIGTERM with a subscriber's stream attached ends the stream (UNAVAILABLE) and the
//!   process exits 0 within the shutdown grace; before, it served on until the subscriber
//!   left (minutes), and Kubernetes would have killed it.
//! - an acknowledged delivery does not come again after a clean stop and a restart; before,
//!   the ack lived only in memory (written without a flush) and the same delivery came again
//!   saying `attempt: 1`.
//! - after a crash a delivery may come again, and then it says so (`redelivered`).
//! - `dissem sub` tells whether it deleted its subscription: before, it printed "deleted"
//!   when the delete had failed, leaving an orphan.
//! - gRPC deliveries (QoS 1 and QoS 2, to a `dissem receive`) acknowledged before a clean
//!   stop are not delivered again after the restart.

use std::time::Duration;

use proto::v1;
use tests::{
    Proc, channel, dissem_bin, numbered_put, runtime, shown, start_up, stream_subscriber, temp_dir,
    wait_for,
};

/// Puts `n` of publisher `who` on the node at `url`.
async fn put(url: &str, who: &str, n: i64) {
    v1::ingest_client::IngestClient::new(channel(url))
        .put(numbered_put(who, n))
        .await
        .expect("put");
}

/// The `n` attribute of a delivery.
fn n_of(d: &v1::Delivery) -> i64 {
    d.metadata
        .iter()
        .find(|a| a.name == "n")
        .and_then(|a| match a.value.as_ref()?.kind.as_ref()? {
            v1::value::Kind::Integer(i) => Some(*i),
            v1::value::Kind::Decimal(t) => t.parse().ok(),
            v1::value::Kind::Number(f) => Some(*f as i64),
            v1::value::Kind::Text(_) => None,
        })
        .unwrap_or(-1)
}

/// The next delivery on `down` within `limit` (`None`: none came, or the stream ended).
async fn next(down: &mut tonic::Streaming<v1::Delivery>, limit: Duration) -> Option<v1::Delivery> {
    tokio::time::timeout(limit, down.message())
        .await
        .ok()
        .and_then(|r| r.ok())
        .flatten()
}

async fn ack(tx: &tokio::sync::mpsc::Sender<v1::StreamClientMessage>, d: &v1::Delivery) {
    let kind = v1::stream_client_message::Kind::Ack(d.delivery_id.clone());
    tx.send(v1::StreamClientMessage { kind: Some(kind) })
        .await
        .expect("ack sent");
}

/// Waits (up to `limit`) until the counters of the node at `url` satisfy `done`.
async fn wait_stats(
    what: &str,
    url: &str,
    limit: Duration,
    done: impl Fn(&v1::StatsResponse) -> bool,
) {
    let done = &done;
    wait_for(what, limit, || async move {
        let s = v1::admin_client::AdminClient::new(channel(url))
            .stats(v1::StatsRequest {})
            .await
            .ok()?
            .into_inner();
        done(&s).then_some(())
    })
    .await;
}

/// Waits until the node at `url` counts `n` acknowledged deliveries.
async fn acked(url: &str, n: u64) {
    wait_stats("the ack counted", url, Duration::from_secs(20), |s| {
        s.deliveries_acked >= n
    })
    .await;
}

/// SIGTERM, then the exit status within `limit`, and how long the exit took.
async fn terminate(p: &mut Proc, limit: Duration) -> (std::process::ExitStatus, Duration) {
    let t = std::time::Instant::now();
    p.signal("TERM");
    let status = wait_for("the process to exit after SIGTERM", limit, || {
        let s = p.try_wait();
        async move { s }
    })
    .await;
    (status, t.elapsed())
}

fn filter() -> v1::subscription::Filter {
    v1::subscription::Filter::Text("n >= 0".into())
}

#[test]
fn sigterm_with_a_subscriber_attached_exits_and_an_acked_delivery_never_comes_again() {
    let dir = temp_dir("clean-stop");
    let mut up = start_up(&dir, &["--shutdown-grace-s", "6"]);
    let url = up.url();
    let rt = runtime();
    rt.block_on(async {
        let (tx, mut down, _) = stream_subscriber(&url, "keep", filter()).await;
        put(&url, "a", 1).await;
        let d = next(&mut down, Duration::from_secs(20))
            .await
            .expect("the first delivery");
        assert_eq!((n_of(&d), d.attempt, d.redelivered), (1, 1, false));
        ack(&tx, &d).await;
        acked(&url, 1).await;
        // the subscriber stays attached while the node stops
        let (status, took) = terminate(&mut up, Duration::from_secs(15)).await;
        assert!(status.success(), "exit status after SIGTERM: {status}");
        assert!(
            took < Duration::from_secs(8),
            "the stop took {took:?} with a subscriber attached (grace 6 s)"
        );
        let end = tokio::time::timeout(Duration::from_secs(5), down.message())
            .await
            .expect("the stream ended with the node");
        match end {
            Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
            Ok(m) => assert!(m.is_none(), "a delivery after the stop: {m:?}"),
        }
    });
    up.restart();
    let url = up.url();
    rt.block_on(async {
        let (tx, mut down) = tests::attach(&url, "keep").await;
        put(&url, "a", 2).await;
        // what arrives after the restart: the new put only, never the acknowledged one
        let mut got = Vec::new();
        while let Some(d) = next(&mut down, Duration::from_secs(3)).await {
            ack(&tx, &d).await;
            got.push((n_of(&d), d.attempt, d.redelivered));
            if got.len() > 4 {
                break;
            }
        }
        assert_eq!(got, [(2, 1, false)], "deliveries after the clean restart");
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_delivery_repeated_after_a_crash_says_it_is_redelivered() {
    let dir = temp_dir("crash-redelivered");
    let mut up = start_up(&dir, &[]);
    let url = up.url();
    let rt = runtime();
    rt.block_on(async {
        let (_tx, mut down, _) = stream_subscriber(&url, "crash", filter()).await;
        put(&url, "c", 1).await;
        let d = next(&mut down, Duration::from_secs(20))
            .await
            .expect("the delivery");
        assert_eq!((d.attempt, d.redelivered), (1, false));
        // pushed, not acknowledged: the node dies with the delivery out
    });
    up.kill();
    up.restart();
    let url = up.url();
    rt.block_on(async {
        let (tx, mut down) = tests::attach(&url, "crash").await;
        let d = next(&mut down, Duration::from_secs(30))
            .await
            .expect("the delivery again after the crash");
        assert_eq!(n_of(&d), 1);
        assert!(
            d.redelivered,
            "a repeat after a crash must say so: {d:?} (attempt {})",
            d.attempt
        );
        ack(&tx, &d).await;
        acked(&url, 1).await;
    });
    // a clean stop now, and a restart: nothing comes again, and nothing says redelivered
    rt.block_on(async {
        let (status, _) = terminate(&mut up, Duration::from_secs(15)).await;
        assert!(status.success(), "{status}");
    });
    up.restart();
    let url = up.url();
    rt.block_on(async {
        let (tx, mut down) = tests::attach(&url, "crash").await;
        put(&url, "c", 2).await;
        let d = next(&mut down, Duration::from_secs(20))
            .await
            .expect("the next put's delivery");
        ack(&tx, &d).await;
        assert_eq!((n_of(&d), d.attempt, d.redelivered), (2, 1, false));
        assert!(
            next(&mut down, Duration::from_secs(2)).await.is_none(),
            "nothing more"
        );
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dissem sub` (not durable) as a child process: its stderr, once it has exited.
/// A running `dissem sub` and what it wrote to stderr so far (read as it comes).
struct Sub {
    child: std::process::Child,
    err: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

fn run_sub(url: &str) -> Sub {
    let mut child = std::process::Command::new(dissem_bin())
        .args(["sub", "--node-url", url, "-f", "n >= 0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("dissem sub");
    let err = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = child.stderr.take().map(|mut e| {
        let err = err.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut e, &mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = err.lock().unwrap_or_else(|p| p.into_inner());
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    });
    Sub { child, err, reader }
}

impl Sub {
    fn stderr(&self) -> String {
        self.err.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until the command says it is attached with its subscription created: a node
    /// killed before that (the subscription listed, its create not yet answered) leaves the
    /// command nothing to name.
    async fn attached(&self) {
        wait_for("dissem sub to attach", Duration::from_secs(20), || {
            let s = self.stderr();
            async move { s.contains("attached: subscription").then_some(()) }
        })
        .await;
    }
}

/// Waits (up to `limit`) for `sub` to exit: its status and stderr.
async fn ended(mut sub: Sub, limit: Duration) -> (std::process::ExitStatus, String) {
    let status = wait_for("dissem sub to exit", limit, || {
        let s = sub.child.try_wait().ok().flatten();
        async move { s }
    })
    .await;
    // all it wrote: the reader ends at the pipe's end, which came with the exit
    if let Some(r) = sub.reader.take() {
        let _ = r.join();
    }
    (status, sub.stderr())
}

/// The subscriptions of the node at `url`.
async fn subscriptions(url: &str) -> Vec<u64> {
    v1::subscriptions_client::SubscriptionsClient::new(channel(url))
        .list(v1::ListSubscriptionsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .subscriptions
        .into_iter()
        .map(|s| s.id)
        .collect()
}

#[test]
fn dissem_sub_says_whether_it_deleted_its_subscription() {
    let dir = temp_dir("sub-orphan");
    let mut up = start_up(&dir, &[]);
    let url = up.url();
    let rt = runtime();
    // the node dies under the subscriber and stays down: the delete cannot be made, and
    // the command says so (exit status 1, the id, how to delete it)
    let sub = run_sub(&url);
    rt.block_on(async {
        sub.attached().await;
        wait_for("the subscription", Duration::from_secs(20), || async {
            (subscriptions(&url).await.len() == 1).then_some(())
        })
        .await;
    });
    up.kill();
    rt.block_on(async {
        let (status, err) = ended(sub, Duration::from_secs(30)).await;
        assert!(!status.success(), "dissem sub exited {status}: {err}");
        assert!(err.contains("was NOT deleted"), "{err}");
        assert!(err.contains("dissem unsubscribe"), "{err}");
    });
    up.restart();
    let url = up.url();
    // the orphan is there, as the command said
    let orphan = rt.block_on(subscriptions(&url));
    assert_eq!(orphan.len(), 1, "{orphan:?}");
    // a node that is back within the delete's retries: the delete is made, and said
    let sub = run_sub(&url);
    rt.block_on(async {
        sub.attached().await;
        wait_for(
            "the second subscription",
            Duration::from_secs(20),
            || async { (subscriptions(&url).await.len() == 2).then_some(()) },
        )
        .await;
    });
    up.kill();
    up.restart();
    let url = up.url();
    rt.block_on(async {
        let (_, err) = ended(sub, Duration::from_secs(30)).await;
        assert!(
            err.contains("deleted") && !err.contains("NOT deleted"),
            "{err}"
        );
        assert_eq!(subscriptions(&url).await, orphan, "only the orphan is left");
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn grpc_deliveries_acknowledged_before_a_clean_stop_never_come_again() {
    let dir = temp_dir("clean-stop-grpc");
    let mut up = start_up(&dir, &["--allow-private-targets"]);
    let url = up.url();
    let at = tests::free_port();
    let target = format!("http://{at}");
    let journal = dir.join("journal");
    let rt = runtime();
    let (q1, q2) = rt.block_on(async {
        let sub = |qos| tests::create_grpc_subscription(&url, "n >= 0".into(), &target, qos, None);
        let q2 = sub(v1::Qos::ExactlyOnce).await.expect("QoS 2");
        let q1 = sub(v1::Qos::AtLeastOnce).await.expect("QoS 1");
        (q1, q2)
    });
    let receiver = tests::start_receiver(at, &journal, q2);
    rt.block_on(async {
        for n in 0..5 {
            put(&url, "g", n).await;
        }
        wait_for(
            "both subscriptions shown five",
            Duration::from_secs(30),
            || async { (shown(&journal).len() >= 10).then_some(()) },
        )
        .await;
        acked(&url, 10).await;
        let (status, _) = terminate(&mut up, Duration::from_secs(15)).await;
        assert!(status.success(), "{status}");
    });
    up.restart();
    let url = up.url();
    rt.block_on(async {
        put(&url, "g", 5).await;
        wait_for(
            "the put after the restart shown",
            Duration::from_secs(30),
            || async { (shown(&journal).len() >= 12).then_some(()) },
        )
        .await;
        // until the node owes nothing: a repeat would have been pushed, and journaled by
        // the receiver before its ack, by then
        wait_stats(
            "the node to owe nothing",
            &url,
            Duration::from_secs(30),
            |s| s.deliveries_acked >= 2 && s.outbox_pending == 0 && s.deliveries_queued == 0,
        )
        .await;
        let seen = shown(&journal);
        let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "shown again after a clean stop: {twice:?}"
        );
        assert_eq!(seen.len(), 12, "{seen:?}");
        assert_eq!(seen.keys().filter(|(s, _)| *s == q1).count(), 6);
    });
    drop(receiver);
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
