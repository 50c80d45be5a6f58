//! Subscriptions that change while objects flow, through the real `dissem up`: a bulk load
//! from a JSON Lines file (`dissem subscribe --file`), then creates, updates and deletes each
//! followed at once by a put that only the change decides. The node loads the versions as
//! changes (its overlay), compacts its base in the background, and every put is matched
//! against the version its change made (read-your-writes through overlays and compactions).

use std::collections::BTreeMap;
use std::time::Duration;

use proto::v1;
use tests::{run_dissem, runtime, start_up, temp_dir, wait_for};

fn put(n: i64) -> v1::PutRequest {
    v1::PutRequest {
        metadata: vec![v1::Attribute {
            name: "n".into(),
            value: Some(v1::Value {
                kind: Some(v1::value::Kind::Integer(n)),
            }),
        }],
        ..Default::default()
    }
}

fn stream_sub(filter: String) -> v1::Subscription {
    v1::Subscription {
        filter: Some(v1::subscription::Filter::Text(filter)),
        target: Some(v1::Target {
            kind: Some(v1::target::Kind::Stream("churn".into())),
        }),
        qos: v1::Qos::AtLeastOnce as i32,
        ..Default::default()
    }
}

#[test]
fn changes_are_in_force_when_answered_through_overlays_and_compactions() {
    const LOADED: i64 = 1500;
    const ROUNDS: i64 = 200;
    let dir = temp_dir("subs-churn");
    let mut up = start_up(&dir, &[]);
    let url = up.url();
    // a bulk load from a file: one line per subscription (filters the puts below never meet)
    let file = dir.join("subs.jsonl");
    let mut text = String::from("# loaded in bulk\n");
    for k in 0..LOADED {
        text.push_str(&format!(
            "{{\"filter\": \"n = {}\", \"target\": \"stream:churn\", \"qos\": 1}}\n",
            1_000_000 + k
        ));
    }
    std::fs::write(&file, text).expect("write the file");
    let file_arg = file.display().to_string();
    let (code, out, err) = run_dissem(
        &[
            "subscribe",
            "--node-url",
            &url,
            "--file",
            &file_arg,
            "-o",
            "json",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    let loaded: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(loaded["created"], LOADED, "{out}");
    assert!(
        err.contains(&format!("{LOADED} of {LOADED} subscriptions created")),
        "{err}"
    );
    // a bad line is refused before anything is created, naming its line and field
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"filter\": \"n = 1\", \"target\": \"stream:churn\"}\n{\"filter\": \"n = 2\", \"target\": \"ftp:x\"}\n",
    )
    .expect("write");
    let bad_arg = bad.display().to_string();
    let (code, _, err) = run_dissem(
        &["subscribe", "--node-url", &url, "--file", &bad_arg],
        Duration::from_secs(60),
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("line 2: target"), "{err}");

    runtime().block_on(async {
        let got = tests::collect_by_n(&url, "churn").await;
        let mut subs = v1::subscriptions_client::SubscriptionsClient::new(tests::channel(&url));
        let mut ingest = v1::ingest_client::IngestClient::new(tests::channel(&url));
        // want[n]: the subscriptions object n must reach (and no other)
        let mut want: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
        let mut live: Vec<(u64, i64)> = Vec::new();
        // a deleted subscription's deliveries still waiting are dropped, so a subscription is
        // updated or deleted only once its last object reached it
        let delivered = |n: i64| {
            let got = got.clone();
            async move {
                wait_for("an earlier delivery", Duration::from_secs(30), || {
                    let seen = got
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .contains_key(&n);
                    async move { seen.then_some(()) }
                })
                .await
            }
        };
        for r in 0..ROUNDS {
            if r % 4 >= 2
                && let Some((_, n)) = live.first()
            {
                delivered(*n).await;
            }
            match r % 4 {
                // an update: the subscription now takes n = 20000 + r, no longer its old n
                3 if !live.is_empty() => {
                    let (id, old) = live.remove(0);
                    let n = 20_000 + r;
                    let mut s = stream_sub(format!("n = {n}"));
                    s.id = id;
                    subs.update(s).await.expect("update");
                    live.push((id, n));
                    ingest.put(put(n)).await.expect("put after update");
                    want.insert(n, vec![id]);
                    // the old filter no longer holds: only the put made before the update
                    // reached it
                    ingest.put(put(old + 50_000)).await.expect("put");
                    want.insert(old + 50_000, vec![]);
                }
                // a delete: a put after it reaches nothing
                2 if !live.is_empty() => {
                    let (id, n) = live.remove(0);
                    subs.delete(v1::DeleteSubscriptionRequest { id })
                        .await
                        .expect("delete");
                    ingest
                        .put(put(n + 100_000))
                        .await
                        .expect("put after delete");
                    want.insert(n + 100_000, vec![]);
                }
                _ => {
                    let n = 10_000 + r;
                    let s = subs
                        .create(v1::CreateSubscriptionRequest {
                            subscription: Some(stream_sub(format!(
                                "n = {n} || n = {} || n = {}",
                                n + 50_000,
                                n + 100_000
                            ))),
                        })
                        .await
                        .expect("create")
                        .into_inner();
                    ingest.put(put(n)).await.expect("put after create");
                    want.insert(n, vec![s.id]);
                    live.push((s.id, n));
                }
            }
        }
        // a marker put after everything: once it is delivered, everything before it was
        let marker = subs
            .create(v1::CreateSubscriptionRequest {
                subscription: Some(stream_sub("n = -7".into())),
            })
            .await
            .expect("create marker")
            .into_inner();
        ingest.put(put(-7)).await.expect("put marker");
        want.insert(-7, vec![marker.id]);
        let expected = want.values().filter(|v| !v.is_empty()).count();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            let m = got.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if m.len() >= expected && m.contains_key(&-7) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let m = got.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let wrong: Vec<String> = want
            .iter()
            .filter_map(|(n, ids)| {
                let mut seen = m.get(n).cloned().unwrap_or_default();
                seen.dedup();
                (&seen != ids).then(|| format!("n = {n}: want {ids:?}, delivered to {seen:?}"))
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{} of {} objects wrong: {wrong:?}",
            wrong.len(),
            want.len()
        );
        // the node loaded versions as changes and compacted its base in the background
        let stats = wait_for("a compaction", Duration::from_secs(60), || {
            let u = url.clone();
            async move {
                let s = tests::stats(&u).await.ok()?;
                (s.images_compacted >= 1).then_some(s)
            }
        })
        .await;
        assert!(stats.images_applied > 0, "{stats:?}");
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
