//! What an operator plugs dissem into, through the real `dissem up` on loopback:
//! - an object store as a write path by configuration alone: `--s3-events-listen` takes the
//!   notification a MinIO server POSTs, the record becomes an announced object, an
//!   EventBridge pattern with the newer operators matches it, a stream subscriber gets it,
//!   and `/metrics` counts the delivery in its histograms and per-tenant totals; with an auth
//!   file the endpoint wants an ingest token;
//! - an OpenTelemetry collector: `--otlp-endpoint` exports the put, test, match and push
//!   spans of a traced put, in the put's trace.

use std::net::SocketAddr;
use std::time::Duration;

use proto::v1;
use tests::{
    free_port, http, runtime, start_up, stream_subscriber, temp_dir, token_create, wait_for,
};

/// A MinIO webhook body for one object (`X-Amz-Meta-Site` user metadata, a URL-encoded key).
fn minio_put(key: &str, site: &str, sequencer: &str) -> String {
    format!(
        r#"{{"EventName":"s3:ObjectCreated:Put","Key":"images/{key}","Records":[{{
        "eventVersion":"2.0","eventSource":"minio:s3","awsRegion":"",
        "eventTime":"2024-05-01T10:00:00.000Z","eventName":"s3:ObjectCreated:Put",
        "userIdentity":{{"principalId":"minioadmin"}},
        "requestParameters":{{"principalId":"minioadmin","region":"","sourceIPAddress":"10.0.0.12"}},
        "responseElements":{{"x-amz-request-id":"17C9A8F8E1D3B0A1"}},
        "s3":{{"s3SchemaVersion":"1.0","configurationId":"Config",
          "bucket":{{"name":"images","ownerIdentity":{{"principalId":"minioadmin"}},"arn":"arn:aws:s3:::images"}},
          "object":{{"key":"{key}","size":52311,"eTag":"0e1bb2a6c2d6f8f1e5f3b2b5f1e3a9c7",
            "contentType":"image/jpeg","userMetadata":{{"X-Amz-Meta-Site":"{site}"}},
            "sequencer":"{sequencer}"}}}}}}]}}"#
    )
}

#[test]
fn an_s3_notification_becomes_a_delivery_and_is_counted() {
    let dir = temp_dir("s3-events");
    let (metrics, s3) = (free_port(), free_port());
    let mut up = start_up(
        &dir,
        &[
            "--metrics-listen",
            &metrics.to_string(),
            "--s3-events-listen",
            &s3.to_string(),
        ],
    );
    runtime().block_on(async {
        let url = up.url();
        // a stream subscriber with an EventBridge pattern of the newer operators
        let pattern = r#"{"s3": {"event": [{"wildcard": "ObjectCreated:*"}],
            "key": [{"suffix": {"equals-ignore-case": ".JPG"}}],
            "source_ip": [{"cidr": "10.0.0.0/24"}],
            "meta": {"site": [{"prefix": {"equals-ignore-case": "KR/"}}]},
            "bucket": [{"anything-but": {"wildcard": "tmp-*"}}]}}"#;
        let filter = v1::subscription::Filter::Eventbridge(pattern.into());
        let (tx, mut down, sub) = stream_subscriber(&url, "uploads", filter).await;
        // wait until the endpoint is up, then the store's notification
        let body = minio_put("cam%201.JPG", "kr/seoul", "17C9A8F8E2A1C5D3");
        let (code, answer) = wait_for(
            "the S3 event endpoint",
            Duration::from_secs(20),
            || {
                let body = body.clone();
                async move {
                    http(s3, "POST", "/s3-events", &[], &body)
                        .await
                        .ok()
                }
            },
        )
        .await;
        assert_eq!(code, 200, "{answer}");
        let first: serde_json::Value = serde_json::from_str(&answer).expect("JSON answer");
        assert_eq!(first["announced"][0]["duplicate"], false, "{answer}");
        // a record the pattern does not match (another site) is stored but not delivered
        let other = minio_put("x.jpg", "us/ny", "17C9A8F8E2A1C5D4");
        let (code, _) = http(s3, "POST", "/", &[], &other).await.expect("post");
        assert_eq!(code, 200);
        let d = tokio::time::timeout(Duration::from_secs(10), down.message())
            .await
            .expect("a delivery within 10 s")
            .expect("stream")
            .expect("a delivery");
        assert_eq!(d.subscription_id, sub);
        let meta: std::collections::BTreeMap<String, String> = d
            .metadata
            .iter()
            .map(|a| {
                let v = match a.value.as_ref().and_then(|v| v.kind.as_ref()) {
                    Some(v1::value::Kind::Text(t)) => t.clone(),
                    Some(v1::value::Kind::Integer(i)) => i.to_string(),
                    Some(v1::value::Kind::Decimal(d)) => d.clone(),
                    other => format!("{other:?}"),
                };
                (a.name.clone(), v)
            })
            .collect();
        assert_eq!(meta["s3.key"], "cam 1.JPG");
        assert_eq!(meta["s3.size"], "52311");
        assert_eq!(meta["s3.meta.site"], "kr/seoul");
        tx.send(v1::StreamClientMessage {
            kind: Some(v1::stream_client_message::Kind::Ack(d.delivery_id.clone())),
        })
        .await
        .expect("ack");
        // the store sends the same notification again: stored once
        let (code, again) = http(s3, "POST", "/s3-events", &[], &body)
            .await
            .expect("post");
        assert_eq!(code, 200);
        let again: serde_json::Value = serde_json::from_str(&again).expect("JSON");
        assert_eq!(again["announced"][0]["duplicate"], true);
        assert_eq!(again["announced"][0]["seq"], first["announced"][0]["seq"]);
        // bad input is named, other methods and paths are refused
        let (code, why) = http(s3, "POST", "/", &[], r#"{"Records": [{"eventName": "x"}]}"#)
            .await
            .expect("post");
        assert_eq!(code, 400);
        assert!(why.contains("Records[0].s3.bucket.name: missing"), "{why}");
        let (code, why) = http(s3, "POST", "/", &[], "{").await.expect("post");
        assert_eq!(code, 400);
        assert!(why.starts_with("body: not JSON"), "{why}");
        assert_eq!(http(s3, "GET", "/", &[], "").await.expect("get").0, 405);
        assert_eq!(http(s3, "POST", "/x", &[], "{}").await.expect("post").0, 404);
        let huge = "x".repeat(5 << 20);
        assert_eq!(http(s3, "POST", "/", &[], &huge).await.map(|r| r.0).unwrap_or(413), 413);
        // the delivery is in the histograms and the tenant's totals, with no per-subscription
        // series unless asked for
        let body = wait_for("the acked delivery in /metrics", Duration::from_secs(10), || async move {
            let (_, b) = http(metrics, "GET", "/metrics", &[], "").await.ok()?;
            b.contains("dissem_put_to_delivered_seconds_count 1").then_some(b)
        })
        .await;
        assert!(body.contains("# TYPE dissem_put_to_delivered_seconds histogram"), "{body}");
        assert!(
            body.contains("dissem_push_duration_seconds_count{target_kind=\"stream\"} 1"),
            "{body}"
        );
        assert!(
            body.contains(
                "dissem_tenant_deliveries_total{tenant=\"\",target_kind=\"stream\",outcome=\"acked\"} 1"
            ),
            "{body}"
        );
        assert!(!body.contains("dissem_subscription_deliveries_total"), "{body}");
        assert!(!body.contains("quantile"), "histograms, not quantile gauges: {body}");
        assert!(
            body.contains("# TYPE dissem_match_latency_seconds histogram")
                && body.contains("dissem_match_latency_seconds_count 2"),
            "{body}"
        );
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_an_auth_file_the_endpoint_wants_an_ingest_token() {
    let dir = temp_dir("s3-auth");
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("auth.toml");
    let ingest = token_create(&file, "minio", "acme", "ingest");
    let reader = token_create(&file, "reader", "acme", "read");
    let s3 = free_port();
    let mut up = tests::start_up_with_s3(&dir, &file, s3, None);
    runtime().block_on(async {
        let _ = up.url();
        let body = minio_put("a.jpg", "kr/seoul", "1");
        let (code, why) = wait_for("the S3 event endpoint", Duration::from_secs(20), || {
            let body = body.clone();
            async move { http(s3, "POST", "/", &[], &body).await.ok() }
        })
        .await;
        assert_eq!(code, 401, "{why}");
        assert!(
            why.contains("?token="),
            "the ways to present one are named: {why}"
        );
        for (token, want) in [
            ("wrong", 401),
            (reader.as_str(), 403),
            (ingest.as_str(), 200),
        ] {
            // each way a store can send it: a bearer header (MinIO), Basic auth with the
            // token as the password, the path or the query (Ceph, which adds no headers)
            let bearer = format!("Bearer {token}");
            let basic = format!(
                "Basic {}",
                worker::deliver::base64(format!("ceph:{token}").as_bytes())
            );
            let in_path = format!("/s3-events/{token}");
            let in_query = format!("/s3-events?token={token}");
            for (path, headers) in [
                ("/", vec![("authorization", bearer.as_str())]),
                ("/s3-events", vec![("authorization", basic.as_str())]),
                (in_path.as_str(), vec![]),
                (in_query.as_str(), vec![]),
            ] {
                let (code, why) = http(s3, "POST", path, &headers, &body).await.expect("post");
                assert_eq!(code, want, "{path} {headers:?}: {why}");
                assert!(
                    !why.contains(token) || want == 200,
                    "the token is never echoed: {why}"
                );
                if want == 403 {
                    assert!(why.contains("ingest"), "{why}");
                }
            }
        }
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--s3-events-tls-cert/key`: the endpoint speaks only TLS, and a token in Basic auth (what
/// a store sends for `https://user:TOKEN@host/`) is taken over it.
#[test]
fn the_endpoint_serves_tls_with_a_certificate() {
    let dir = temp_dir("s3-tls");
    std::fs::create_dir_all(&dir).expect("dir");
    let (ca, cert, key) = tests::make_certs(&dir);
    let file = dir.join("auth.toml");
    let ingest = token_create(&file, "ceph", "acme", "ingest");
    let s3 = free_port();
    let mut up = tests::start_up_with_s3(&dir, &file, s3, Some((&cert, &key)));
    runtime().block_on(async {
        let _ = up.url();
        let body = minio_put("t.jpg", "kr/busan", "7");
        let basic = format!(
            "Basic {}",
            worker::deliver::base64(format!("ceph:{ingest}").as_bytes())
        );
        let (code, why) = wait_for(
            "the S3 event endpoint over TLS",
            Duration::from_secs(20),
            || {
                let (body, basic, ca) = (body.clone(), basic.clone(), ca.clone());
                async move {
                    tests::https(
                        s3,
                        &ca,
                        "POST",
                        "/s3-events",
                        &[("authorization", &basic)],
                        &body,
                    )
                    .await
                    .ok()
                }
            },
        )
        .await;
        assert_eq!(code, 200, "{why}");
        let plain = http(
            s3,
            "POST",
            "/s3-events",
            &[("authorization", &basic)],
            &body,
        )
        .await;
        assert!(
            !matches!(plain, Ok((200, _))),
            "plain HTTP must not be served: {plain:?}"
        );
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stand-in OpenTelemetry collector: an HTTP server on loopback keeping every body POSTed
/// to `/v1/traces`.
async fn collector() -> (
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
) {
    use http_body_util::BodyExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            let keep = keep.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let keep = keep.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let body = req.into_body().collect().await.map(|b| b.to_bytes());
                            if let (true, Ok(b)) = (path == "/v1/traces", body)
                                && let Ok(v) = serde_json::from_slice(&b)
                            {
                                keep.lock().expect("lock").push(v);
                            }
                            hyper::Response::builder()
                                .status(200)
                                .body(http_body_util::Full::new(hyper::body::Bytes::from("{}")))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, got)
}

/// Every span the collector got: (name, trace id, span id, parent span id, attributes).
fn spans(got: &[serde_json::Value]) -> Vec<(String, String, String, String, serde_json::Value)> {
    let mut out = Vec::new();
    for body in got {
        for rs in body["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for s in ss["spans"].as_array().into_iter().flatten() {
                    let t = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                    out.push((
                        t("name"),
                        t("traceId"),
                        t("spanId"),
                        t("parentSpanId"),
                        s["attributes"].clone(),
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn a_traced_put_has_put_test_match_and_push_spans_in_its_trace() {
    let dir = temp_dir("otlp");
    let rt = runtime();
    let (addr, got) = rt.block_on(collector());
    let mut up = start_up(&dir, &["--otlp-endpoint", &format!("http://{addr}")]);
    rt.block_on(async {
        let url = up.url();
        let filter = v1::subscription::Filter::Text("temp > 0".into());
        let (tx, mut down, sub) = stream_subscriber(&url, "traced", filter).await;
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let caller_span = "00f067aa0ba902b7";
        let mut ingest = v1::ingest_client::IngestClient::new(tests::channel(&url));
        // one traced put, one whose traceparent is not sampled, one without
        for (t, tp) in [
            (1, Some(format!("00-{trace}-{caller_span}-01"))),
            (2, Some(format!("00-{}-{caller_span}-00", "1".repeat(32)))),
            (3, None),
        ] {
            let mut p = tests::temp_put(t);
            if let Some(tp) = tp {
                p.metadata.push(v1::Attribute {
                    name: "traceparent".into(),
                    value: Some(v1::Value {
                        kind: Some(v1::value::Kind::Text(tp)),
                    }),
                });
            }
            ingest.put(p).await.expect("put");
        }
        for _ in 0..3 {
            let d = tokio::time::timeout(Duration::from_secs(10), down.message())
                .await
                .expect("a delivery within 10 s")
                .expect("stream")
                .expect("a delivery");
            tx.send(v1::StreamClientMessage {
                kind: Some(v1::stream_client_message::Kind::Ack(d.delivery_id)),
            })
            .await
            .expect("ack");
        }
        let all = wait_for(
            "the four spans at the collector",
            Duration::from_secs(15),
            || {
                let got = got.clone();
                async move {
                    let s = spans(&got.lock().expect("lock"));
                    (s.len() >= 4).then_some(s)
                }
            },
        )
        .await;
        let names: Vec<&str> = all.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(all.len(), 4, "only the sampled put is traced: {names:?}");
        let find = |n: &str| {
            all.iter()
                .find(|s| s.0 == n)
                .unwrap_or_else(|| panic!("no {n} span in {names:?}"))
        };
        let put = find("dissem.put");
        assert_eq!(put.1, trace);
        assert_eq!(put.3, caller_span, "the put span is the caller's child");
        for step in ["dissem.test", "dissem.match", "dissem.push"] {
            let s = find(step);
            assert_eq!(s.1, trace, "{step}");
            assert_eq!(s.3, put.2, "{step} is the put span's child");
        }
        let push = find("dissem.push").4.to_string();
        assert!(push.contains(&format!("\"{sub}\"")), "{push}");
        assert!(push.contains("\"stream\""), "{push}");
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
