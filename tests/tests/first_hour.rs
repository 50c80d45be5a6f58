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

/// One HTTP/1.1 GET on `addr`: (status, body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

/// The metrics port answers orchestrators' probes beside `/metrics`: `/healthz` when the
/// process runs, `/readyz` when its services answer.
#[test]
fn the_metrics_port_serves_health_and_readiness() {
    let dir = temp_dir("probes");
    // a free port for the metrics listener (the node prints only its gRPC address on stdout)
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let mut up = Proc::start(
        &dissem_bin(),
        &[
            "up".to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--metrics-listen".into(),
            metrics.to_string(),
            "--data".into(),
            dir.join("data").display().to_string(),
        ],
    );
    runtime().block_on(async {
        let _ = up.url();
        let ready = wait_for(
            "the readiness probe",
            Duration::from_secs(30),
            || async move {
                http_get(metrics, "/readyz")
                    .await
                    .ok()
                    .filter(|r| r.0 == 200)
            },
        )
        .await;
        assert_eq!(ready.1.trim(), "ready");
        let (code, body) = http_get(metrics, "/healthz").await.expect("healthz");
        assert_eq!((code, body.trim()), (200, "ok"));
        let (code, body) = http_get(metrics, "/metrics").await.expect("metrics");
        assert_eq!(code, 200);
        assert!(body.contains("# TYPE dissem_"), "{body}");
        let (code, _) = http_get(metrics, "/nope").await.expect("404");
        assert_eq!(code, 404);
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
