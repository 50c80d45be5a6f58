//! The trust boundary tried as a hostile outside user would, against the real `dissem`
//! binary on loopback (`dissem up`, and a coordinator with a node): requests that used to
//! crash a process, read a webhook secret, store subscriptions that can never work, echo
//! megabytes of error text, or exhaust the connections. Each test fails on a build without
//! the guard it covers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use proto::v1;
use tests::{Proc, channel, dissem_bin, runtime, stats, temp_dir, wait_for};
use tonic::Code;

fn up(dir: &std::path::Path, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = ["up", "--listen", "127.0.0.1:0", "--gpu", "off", "--data"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(dir.join("data").display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::start(&dissem_bin(), &args)
}

fn sub(filter: v1::subscription::Filter, target: v1::target::Kind) -> v1::Subscription {
    v1::Subscription {
        filter: Some(filter),
        target: Some(v1::Target { kind: Some(target) }),
        qos: v1::Qos::AtMostOnce as i32,
        ..Default::default()
    }
}

fn text(f: &str) -> v1::subscription::Filter {
    v1::subscription::Filter::Text(f.to_string())
}

fn stream(n: &str) -> v1::target::Kind {
    v1::target::Kind::Stream(n.to_string())
}

async fn create(url: &str, s: v1::Subscription) -> Result<v1::Subscription, tonic::Status> {
    v1::subscriptions_client::SubscriptionsClient::new(channel(url))
        .create(v1::CreateSubscriptionRequest {
            subscription: Some(s),
        })
        .await
        .map(|r| r.into_inner())
}

/// `e` is `InvalidArgument`, short, and contains every one of `needles`.
fn invalid(e: &tonic::Status, needles: &[&str]) {
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().len() < 1200, "{} bytes", e.message().len());
    for n in needles {
        assert!(e.message().contains(n), "{n:?} not in {:?}", e.message());
    }
}

fn deep_text(depth: usize) -> String {
    format!("{}temp > 1{}", "(".repeat(depth), ")".repeat(depth))
}

fn deep_pattern(depth: usize) -> String {
    format!("{}[1]{}", "{\"a\":".repeat(depth), "}".repeat(depth))
}

/// Deep filters through Create, Update and (in the cluster) a node's proxy to the coordinator
/// are refused naming the limit, and every process keeps serving.
#[test]
fn deeply_nested_filters_crash_nothing() {
    let dir = temp_dir("hostile-deep");
    let node = up(&dir, &[]);
    let url = node.url();
    runtime().block_on(async {
        for depth in [2_000, 30_000] {
            let e = create(&url, sub(text(&deep_text(depth)), stream("s")))
                .await
                .expect_err("too deep");
            invalid(&e, &["subscription.filter.text", "nesting limit"]);
        }
        let p = v1::subscription::Filter::Eventbridge(deep_pattern(2_000));
        let e = create(&url, sub(p, stream("s")))
            .await
            .expect_err("too deep");
        invalid(&e, &["subscription.filter.eventbridge", "limit"]);
        let ok = create(&url, sub(text("temp > 1"), stream("s")))
            .await
            .expect("a plain filter");
        let mut update = sub(text(&deep_text(2_000)), stream("s"));
        update.id = ok.id;
        let e = v1::subscriptions_client::SubscriptionsClient::new(channel(&url))
            .update(update)
            .await
            .expect_err("too deep");
        invalid(&e, &["nesting limit"]);
        stats(&url).await.expect("the node still serves");
    });

    // the cluster: a node forwards subscriptions to the coordinator, which parses them
    let cluster = tests::start_cluster(&dir.join("cluster"), 1, &[], &["--gpu", "off"]);
    let coord = cluster.coordinator.url();
    let node_url = cluster.nodes[0].url();
    runtime().block_on(async {
        for target in [&node_url, &coord] {
            let e = create(target, sub(text(&deep_text(2_000)), stream("s")))
                .await
                .expect_err("too deep");
            invalid(&e, &["nesting limit"]);
        }
        stats(&coord).await.expect("the coordinator still serves");
        stats(&node_url).await.expect("the node still serves");
    });
    drop(cluster);
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The internal services answer nobody without the cluster secret, and reflection advertises
/// only the public services a port serves.
#[test]
fn internal_services_refuse_outsiders() {
    let dir = temp_dir("hostile-internal");
    let cluster = tests::start_cluster(&dir, 1, &["--allow-private-targets"], &["--gpu", "off"]);
    let coord = cluster.coordinator.url();
    let node_url = cluster.nodes[0].url();
    runtime().block_on(async {
        let mut s = sub(
            text("temp > 1"),
            v1::target::Kind::Webhook("http://127.0.0.1:9/hook".into()),
        );
        s.webhook_secret = "the-webhook-secret".into();
        let created = create(&coord, s).await.expect("create");
        assert!(created.webhook_secret.is_empty(), "secrets are write-only");
        let e = v1::cluster_client::ClusterClient::new(channel(&coord))
            .subscription(v1::SubscriptionRecordRequest { id: created.id })
            .await
            .expect_err("anonymous Cluster.Subscription");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(!format!("{e:?}").contains("the-webhook-secret"));
        let e = v1::cluster_client::ClusterClient::new(channel(&coord))
            .register(v1::RegisterRequest::default())
            .await
            .expect_err("anonymous Cluster.Register");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        let e = v1::daemon_client::DaemonClient::new(channel(&node_url))
            .fetch(v1::FetchRequest::default())
            .await
            .expect_err("anonymous Daemon.Fetch");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        // the cluster itself still works: the node registered and saw the subscription
        wait_for("the node to register", Duration::from_secs(20), || {
            let c = coord.clone();
            async move {
                let w = tests::workers(&c).await.ok()?;
                (!w.is_empty()).then_some(())
            }
        })
        .await;

        let coord_services = reflected(&coord).await;
        assert_eq!(
            coord_services,
            ["dissem.v1.Admin", "dissem.v1.Subscriptions"],
            "the coordinator advertises what it serves publicly"
        );
        let node_services = reflected(&node_url).await;
        assert!(!node_services.iter().any(|s| s.contains("Daemon")));
        assert!(node_services.iter().any(|s| s == "dissem.v1.Ingest"));
    });
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn reflected(url: &str) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = ServerReflectionClient::new(channel(url))
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .expect("reflection")
        .into_inner();
    let first = answers
        .message()
        .await
        .expect("answer")
        .expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = first.message_response else {
        panic!("unexpected reflection answer");
    };
    let mut names: Vec<String> = list
        .service
        .into_iter()
        .map(|s| s.name)
        .filter(|n| !n.starts_with("grpc.reflection"))
        .collect();
    names.sort();
    names
}

/// Subscriptions that could never be delivered are refused when they are made, naming the
/// field; so are oversized stream names at attach.
#[test]
fn subscriptions_that_can_never_work_are_refused() {
    let dir = temp_dir("hostile-subs");
    let node = up(&dir, &[]);
    let url = node.url();
    runtime().block_on(async {
        for (target, field) in [
            (
                v1::target::Kind::Grpc("http://127.0.0.1:7000".into()),
                "subscription.target.grpc",
            ),
            (
                v1::target::Kind::Webhook("http://localhost:8080/hook".into()),
                "subscription.target.webhook",
            ),
            (
                v1::target::Kind::Webhook("http://169.254.169.254/latest".into()),
                "subscription.target.webhook",
            ),
            (
                v1::target::Kind::Webhook("http://[::1]:80/".into()),
                "subscription.target.webhook",
            ),
        ] {
            let e = create(&url, sub(text("temp > 1"), target))
                .await
                .expect_err("private target");
            invalid(&e, &[field, "--allow-private-targets"]);
        }
        let e = create(
            &url,
            sub(
                text("temp > 1"),
                v1::target::Kind::Grpc("https://example.com:443".into()),
            ),
        )
        .await
        .expect_err("https grpc");
        invalid(&e, &["subscription.target.grpc", "https"]);
        let mut q = sub(text("temp > 1"), stream("s"));
        q.qos = 7;
        let e = create(&url, q).await.expect_err("qos 7");
        invalid(&e, &["subscription.qos"]);
        let long = format!("\"{}\" > 1", "a".repeat(200));
        let e = create(&url, sub(text(&long), stream("s")))
            .await
            .expect_err("long name");
        invalid(&e, &["subscription.filter.text", "128"]);
        let odd = create(&url, sub(text("\"has space\" > 1"), stream("s")))
            .await
            .expect_err("unputtable name");
        invalid(&odd, &["can never be put"]);
        let e = create(&url, sub(text("temp > 1"), stream(&"s".repeat(100_000))))
            .await
            .expect_err("long stream name");
        invalid(&e, &["subscription.target.stream"]);

        // a stream attach with a 100,000-byte name
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(v1::StreamClientMessage {
            kind: Some(v1::stream_client_message::Kind::Attach("n".repeat(100_000))),
        })
        .await
        .expect("send");
        let e = v1::stream_client::StreamClient::new(channel(&url))
            .open(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect_err("long attach name");
        invalid(&e, &["attach"]);
        drop(tx);

        let listed = v1::subscriptions_client::SubscriptionsClient::new(channel(&url))
            .list(v1::ListSubscriptionsRequest::default())
            .await
            .expect("list")
            .into_inner();
        assert!(listed.subscriptions.is_empty(), "nothing was stored");
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rejected 3,000,000-digit number is quoted short; duplicate EventBridge keys are refused.
#[test]
fn bad_values_get_short_errors_and_duplicate_keys_are_refused() {
    let dir = temp_dir("hostile-values");
    let node = up(&dir, &[]);
    let url = node.url();
    runtime().block_on(async {
        let big = "9".repeat(3_000_000);
        let e = v1::ingest_client::IngestClient::new(channel(&url))
            .put(v1::PutRequest {
                metadata: vec![v1::Attribute {
                    name: "temp".into(),
                    value: Some(v1::Value {
                        kind: Some(v1::value::Kind::Decimal(big)),
                    }),
                }],
                ..Default::default()
            })
            .await
            .expect_err("out of range");
        invalid(&e, &["metadata[0]", "3000000 bytes"]);

        let p = v1::subscription::Filter::Eventbridge(r#"{"dk":[1],"dk":[2]}"#.into());
        let e = create(&url, sub(p, stream("s")))
            .await
            .expect_err("duplicate key");
        invalid(
            &e,
            &["subscription.filter.eventbridge", "duplicate key \"dk\""],
        );
        stats(&url).await.expect("still serving");
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Connects raw sockets that send nothing; returns them.
fn idle_sockets(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect()
}

/// Whether the server closed `s` within `within` (EOF or reset on read).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {} // the server's SETTINGS and the like
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

/// A flood of idle connections past the cap neither takes the process's descriptors nor
/// keeps a real client out: silent connections are closed after the handshake timeout, idle
/// HTTP/2 connections after the idle timeout.
#[test]
fn idle_connections_cannot_exhaust_the_node() {
    let dir = temp_dir("hostile-conns");
    let node = up(
        &dir,
        &[
            "--max-connections",
            "64",
            "--handshake-timeout-ms",
            "500",
            "--idle-timeout-s",
            "2",
        ],
    );
    let url = node.url();
    let addr = node.addr.clone();
    // far more silent connections than the cap (and than a default descriptor limit allows
    // a process that keeps them all)
    let mut flood = idle_sockets(&addr, 300);
    assert!(flood.len() > 64, "only {} connected", flood.len());
    runtime().block_on(async {
        wait_for(
            "a real client to be served despite the flood",
            Duration::from_secs(20),
            || {
                let u = url.clone();
                async move { stats(&u).await.ok() }
            },
        )
        .await;
    });
    // every silent connection is closed by the server
    let start = Instant::now();
    let mut closed = 0;
    for s in flood.iter_mut().take(80) {
        if closed_within(s, Duration::from_secs(10)) {
            closed += 1;
        }
    }
    assert_eq!(closed, 80, "silent connections are closed");
    assert!(start.elapsed() < Duration::from_secs(30));
    drop(flood);

    // a client that speaks HTTP/2 and then makes no request is closed after the idle timeout
    let mut h2 = TcpStream::connect(&addr).expect("connect");
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .expect("preface");
    let t = Instant::now();
    assert!(
        closed_within(&mut h2, Duration::from_secs(15)),
        "idle h2 closed"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "closed by the idle timeout, not the handshake one ({:?})",
        t.elapsed()
    );
    runtime().block_on(async { stats(&url).await.expect("still serving") });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node refuses to listen on a non-loopback address without `--insecure`, saying why.
#[test]
fn non_loopback_listen_needs_insecure() {
    let dir = temp_dir("hostile-listen");
    let out = std::process::Command::new(dissem_bin())
        .args(["up", "--listen", "0.0.0.0:0", "--data"])
        .arg(dir.join("data"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--insecure"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
