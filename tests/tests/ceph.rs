//! A real object store as dissem's write path: a Ceph radosgw (Debian's packages, one
//! monitor, one memstore OSD) with a bucket notification topic whose push endpoint is
//! `dissem up --s3-events-listen`, the token in the endpoint's query (Ceph 16's topics add no
//! headers). Objects written with boto3 as a user writes them (metadata, tags, a space, `+`
//! and `%`, unicode, an empty object, a copy, a multipart upload, a delete) reach a stream
//! subscriber once each, with the attributes the writer wrote and nothing else under
//! `s3.meta.` (Ceph lists request headers beside the user metadata of a copy, a multipart
//! upload and a delete).
//!
//! Skipped with a message where Ceph or boto3 is missing, unless `DISSEM_REQUIRE_CEPH` is
//! set (CI sets it, after `apt-get install ceph-mon ceph-osd radosgw python3-boto3`).

use std::collections::BTreeMap;
use std::time::Duration;

use proto::v1;
use tests::ceph::{ACCESS_KEY, Ceph, SECRET_KEY, have_ceph};
use tests::{channel, free_port, run_to_end, runtime, start_up_with_s3, temp_dir, token_create};

/// A delivery's metadata as text (numbers as the server wrote them).
fn attributes(d: &v1::Delivery) -> BTreeMap<String, String> {
    d.metadata
        .iter()
        .filter_map(|a| {
            let v = match a.value.as_ref()?.kind.as_ref()? {
                v1::value::Kind::Text(t) => t.clone(),
                v1::value::Kind::Integer(i) => i.to_string(),
                v1::value::Kind::Decimal(t) => t.clone(),
                v1::value::Kind::Number(f) => f.to_string(),
            };
            Some((a.name.clone(), v))
        })
        .collect()
}

#[test]
fn objects_written_to_ceph_reach_a_subscriber_once_with_their_attributes() {
    if !have_ceph() {
        assert!(
            std::env::var_os("DISSEM_REQUIRE_CEPH").is_none(),
            "DISSEM_REQUIRE_CEPH is set but Ceph (ceph-mon, ceph-osd, radosgw) or boto3 is \
             missing"
        );
        eprintln!(
            "skipped: no Ceph here (apt-get install ceph-mon ceph-osd radosgw python3-boto3)"
        );
        return;
    }
    let dir = temp_dir("ceph");
    std::fs::create_dir_all(&dir).expect("dir");
    // radosgw over HTTPS too: Ceph sends a password (Basic auth) only if the topic was
    // created over a secure transport
    let (ca, cert, key) = tests::make_certs(&dir);
    let ceph = Ceph::start(&dir, Some((&cert, &key)));
    let file = dir.join("auth.toml");
    let ingest = token_create(&file, "ceph", "acme", "ingest");
    let reader = token_create(&file, "app", "acme", "subscribe");
    let s3 = free_port();
    let up = start_up_with_s3(&dir, &file, s3, Some((&cert, &key)));
    let url = up.url();
    let rt = runtime();
    let (tx, mut down) = rt.block_on(async {
        let (tx, down) = tests::attach_as(&url, "ceph", &reader).await;
        v1::subscriptions_client::SubscriptionsClient::new(channel(&url))
            .create(tests::bearer(
                v1::CreateSubscriptionRequest {
                    subscription: Some(v1::Subscription {
                        filter: Some(v1::subscription::Filter::Text(
                            "s3.bucket = \"photos\"".into(),
                        )),
                        target: Some(v1::Target {
                            kind: Some(v1::target::Kind::Stream("ceph".into())),
                        }),
                        ..Default::default()
                    }),
                },
                &reader,
            ))
            .await
            .expect("create");
        (tx, down)
    });
    // the writer: boto3 against radosgw, the topic pushing to dissem with the token
    let mut writer = std::process::Command::new("python3");
    writer
        .env("AWS_CA_BUNDLE", &ca)
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ceph/writer.py"))
        .args([&ceph.rgw, ACCESS_KEY, SECRET_KEY])
        .arg(format!(
            "https://ceph:{ingest}@localhost:{}/s3-events",
            s3.port()
        ))
        .arg("photos");
    let (code, out, err) = run_to_end(writer, Duration::from_secs(120));
    assert_eq!(
        code,
        Some(0),
        "the writer failed:\n{out}\n{err}\n(Ceph's logs: {})",
        ceph.logs().display()
    );
    let written: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a writer line"))
        .collect();
    assert_eq!(written.len(), 6, "{out}");
    rt.block_on(async {
        let mut got: Vec<BTreeMap<String, String>> = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        // every write, then a second of nothing more (a repeat would show)
        loop {
            let wait = if got.len() >= written.len() {
                Duration::from_secs(1)
            } else {
                deadline.saturating_duration_since(tokio::time::Instant::now())
            };
            let Ok(Ok(Some(d))) = tokio::time::timeout(wait, down.message()).await else {
                break;
            };
            let kind = v1::stream_client_message::Kind::Ack(d.delivery_id.clone());
            let _ = tx.send(v1::StreamClientMessage { kind: Some(kind) }).await;
            got.push(attributes(&d));
        }
        assert_eq!(
            got.len(),
            written.len(),
            "each write once (Ceph's logs: {}):\n{got:#?}",
            ceph.logs().display()
        );
        for w in &written {
            let key = w["key"].as_str().expect("key");
            let event = match w["event"].as_str() {
                Some("put") => "ObjectCreated:Put",
                Some("copy") => "ObjectCreated:Copy",
                Some("multipart") => "ObjectCreated:CompleteMultipartUpload",
                _ => "ObjectRemoved:Delete",
            };
            let m = got
                .iter()
                .find(|m| {
                    m.get("s3.key").map(String::as_str) == Some(key) && m["s3.event"] == event
                })
                .unwrap_or_else(|| panic!("no delivery of {event} {key:?}: {got:#?}"));
            assert_eq!(m["s3.bucket"], "photos");
            assert_eq!(m["s3.source"], "ceph:s3");
            if event == "ObjectRemoved:Delete" {
                continue;
            }
            assert_eq!(m["s3.size"], w["size"].to_string(), "{key}");
            let want_meta: BTreeMap<String, String> = w["meta"]
                .as_object()
                .expect("meta")
                .iter()
                .map(|(k, v)| {
                    (
                        format!("s3.meta.{k}"),
                        v.as_str().expect("text").to_string(),
                    )
                })
                .collect();
            let meta: BTreeMap<String, String> = m
                .iter()
                .filter(|(k, _)| k.starts_with("s3.meta."))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(
                meta, want_meta,
                "{event} {key}: the user's metadata, nothing else"
            );
            for (k, v) in w["tags"].as_object().expect("tags") {
                assert_eq!(
                    m[&format!("s3.tag.{k}")],
                    v.as_str().expect("text"),
                    "{key}"
                );
            }
        }
    });
    drop(up);
    drop(ceph);
    let _ = std::fs::remove_dir_all(&dir);
}
