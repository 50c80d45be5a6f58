//! What a new user of the system expects on day one, through the real `dissem up` on
//! 127.0.0.1:0.

use std::time::Duration;

use tests::{Proc, attach, dissem_bin, http, runtime, start_up, temp_dir, wait_for};

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
                http(metrics, "GET", "/readyz", &[], "")
                    .await
                    .ok()
                    .filter(|r| r.0 == 200)
            },
        )
        .await;
        assert_eq!(ready.1.trim(), "ready");
        let (code, body) = http(metrics, "GET", "/healthz", &[], "")
            .await
            .expect("healthz");
        assert_eq!((code, body.trim()), (200, "ok"));
        let (code, body) = http(metrics, "GET", "/metrics", &[], "")
            .await
            .expect("metrics");
        assert_eq!(code, 200);
        assert!(body.contains("# TYPE dissem_"), "{body}");
        let (code, _) = http(metrics, "GET", "/nope", &[], "").await.expect("404");
        assert_eq!(code, 404);
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Logs written to a pipe or a file carry no terminal colour codes.
#[test]
fn logs_to_a_pipe_are_plain_text() {
    use std::io::BufRead;
    let dir = temp_dir("plain-logs");
    let mut child = std::process::Command::new(dissem_bin())
        .args(["up", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.join("data"))
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dissem up");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("INFO")) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => seen.push(l),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        seen.iter().any(|l| l.contains("INFO")),
        "no info line within 30 s: {seen:?}"
    );
    assert!(
        seen.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in piped logs: {seen:?}"
    );
}

/// A subscription is in force when `Create` returns: a put made right after it is matched,
/// every time (read-your-writes), and so is a `Delete`: a put after it is not.
#[test]
fn a_put_right_after_create_is_matched_every_time() {
    use proto::v1;
    use std::collections::BTreeMap;
    const ROUNDS: i64 = 1000;
    let dir = temp_dir("read-your-writes");
    let mut up = start_up(&dir, &[]);
    runtime().block_on(async {
        let url = up.url();
        // one stream subscriber receives every subscription's deliveries
        let got = tests::collect_by_n(&url, "ryw").await;
        let mut subs = v1::subscriptions_client::SubscriptionsClient::new(tests::channel(&url));
        let mut ingest = v1::ingest_client::IngestClient::new(tests::channel(&url));
        let put = |n: i64| v1::PutRequest {
            metadata: vec![v1::Attribute {
                name: "n".into(),
                value: Some(v1::Value {
                    kind: Some(v1::value::Kind::Integer(n)),
                }),
            }],
            ..Default::default()
        };
        let mut ids = BTreeMap::new();
        for n in 0..ROUNDS {
            let s = subs
                .create(v1::CreateSubscriptionRequest {
                    subscription: Some(v1::Subscription {
                        filter: Some(v1::subscription::Filter::Text(format!("n = {n}"))),
                        target: Some(v1::Target {
                            kind: Some(v1::target::Kind::Stream("ryw".into())),
                        }),
                        qos: v1::Qos::AtLeastOnce as i32,
                        ..Default::default()
                    }),
                })
                .await
                .expect("create")
                .into_inner();
            ids.insert(n, s.id);
            ingest.put(put(n)).await.expect("put");
        }
        // a deleted subscription matches nothing put after the delete returned
        subs.delete(v1::DeleteSubscriptionRequest { id: ids[&0] })
            .await
            .expect("delete");
        ingest.put(put(0)).await.expect("put after delete");
        // a marker put after everything: once it is delivered, everything before it was
        let marker = subs
            .create(v1::CreateSubscriptionRequest {
                subscription: Some(v1::Subscription {
                    filter: Some(v1::subscription::Filter::Text("n = -7".into())),
                    target: Some(v1::Target {
                        kind: Some(v1::target::Kind::Stream("ryw".into())),
                    }),
                    ..Default::default()
                }),
            })
            .await
            .expect("create marker")
            .into_inner();
        ingest.put(put(-7)).await.expect("put marker");
        // a missing delivery is reported by what is missing, not as a timeout
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            let m = got.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if m.len() as i64 == ROUNDS + 1 && m.contains_key(&-7) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let m = got.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let missing: Vec<i64> = (0..ROUNDS).filter(|n| !m.contains_key(n)).collect();
        assert!(
            missing.is_empty(),
            "{} of {ROUNDS} puts not matched: {missing:?}; got {m:?}",
            missing.len()
        );
        for n in 0..ROUNDS {
            assert_eq!(m.get(&n), Some(&vec![ids[&n]]), "object n = {n}");
        }
        assert_eq!(m.get(&-7), Some(&vec![marker.id]));
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A write-slot reserve that leaves lower priorities no slot is refused before the node
/// binds or prints its address, naming both flags.
#[test]
fn a_write_slot_reserve_that_leaves_no_slot_is_refused_at_start() {
    let dir = temp_dir("slots");
    let data = dir.join("data").display().to_string();
    let mut child = std::process::Command::new(dissem_bin())
        .args(["up", "--listen", "127.0.0.1:0", "--data", &data])
        .args(["--write-slots", "2", "--urgent-write-slots", "2"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run dissem up");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dissem up took the flags and ran");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!status.success(), "{stdout} {stderr}");
    assert!(
        stderr.contains("--urgent-write-slots (2) must be fewer than --write-slots (2)"),
        "{stderr}"
    );
    assert!(
        !stdout.contains("listening"),
        "refused only after binding: {stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs one client command of `dissem` against `url`: (exit code, stdout, stderr).
fn cli(url: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(dissem_bin())
        .args(args)
        .env("DISSEM_NODE_URL", url)
        .envs(env.iter().copied())
        .output()
        .expect("run dissem");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The README tour: `dissem up`, `dissem sub` in one terminal receiving the `dissem put` of
/// another, as JSON lines; the other client commands and flags a first user reaches for.
#[test]
fn the_readme_tour_shows_a_delivery_on_the_command_line() {
    use std::io::BufRead;
    let dir = temp_dir("tour");
    let mut up = start_up(&dir, &[]);
    let url = up.url();
    let mut sub = std::process::Command::new(dissem_bin())
        .args(["sub", "-u", &url, "-f", "temp > 30", "--count", "2"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dissem sub");
    let stderr = sub.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(l);
        }
    });
    let attached = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("dissem sub says when it is attached");
    assert!(
        attached.starts_with("attached: subscription "),
        "{attached}"
    );
    // the subscription is in force once attached: these puts match at once
    let (code, _, err) = cli(
        &url,
        &[
            "put",
            "-a",
            "temp=31.5",
            "-a",
            "site=kr/seoul",
            "-d",
            "hello",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, _, _) = cli(&url, &["put", "-a", "temp=10"], &[]);
    assert_eq!(code, Some(0));
    // a variable meant for `dissem up --data` is not the bytes of a put; --file reads bytes
    let bin = dir.join("bytes.bin");
    std::fs::write(&bin, [0xff, 0x00, 0x01]).expect("write");
    let (code, _, err) = cli(
        &url,
        &["put", "-a", "temp=40", "--file", &bin.display().to_string()],
        &[("DISSEM_DATA", "/var/lib/dissem")],
    );
    assert_eq!(code, Some(0), "{err}");
    let out = sub
        .wait_with_output()
        .expect("dissem sub ends after --count 2");
    assert!(out.status.success(), "{:?}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("each stdout line is JSON"))
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0]["metadata"]["temp"], 31.5);
    assert_eq!(lines[0]["metadata"]["site"], "kr/seoul");
    assert_eq!(lines[0]["data"], "hello");
    assert_eq!(lines[1]["metadata"]["temp"], 40);
    assert_eq!(lines[1]["data_base64"], "/wAB", "{}", lines[1]);
    // the subscription went with the command
    let (code, list, _) = cli(&url, &["subscriptions", "-o", "json"], &[]);
    assert_eq!(code, Some(0));
    assert_eq!(list, "[]");

    // subscribe's options, get, --output json; an unset QoS is at least once
    let (code, created, err) = cli(
        &url,
        &[
            "subscribe",
            "-f",
            "temp > 1",
            "-t",
            "stream:later",
            "--max-attempts",
            "3",
            "--ttl",
            "90s",
            "-o",
            "json",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    let created: serde_json::Value = serde_json::from_str(&created).expect("json");
    assert_eq!(created["qos"], 1, "{created}");
    assert_eq!(created["retry"]["max_attempts"], 3);
    assert_eq!(created["retry"]["ttl_ms"], 90_000);
    let id = created["id"].as_u64().expect("id").to_string();
    let (code, got, _) = cli(&url, &["get", &id], &[]);
    assert_eq!(code, Some(0));
    assert!(got.contains("qos       1 (at least once)"), "{got}");
    let (code, _, err) = cli(&url, &["get", "999999"], &[]);
    assert_eq!(
        (code, err.as_str()),
        (Some(1), "error: subscription 999999 not found\n")
    );
    let (code, _, err) = cli(
        &url,
        &[
            "subscribe",
            "-f",
            "a = 1",
            "-t",
            "stream:x",
            "--ttl",
            "5 parsecs",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--ttl"), "{err}");
    let (code, _, err) = cli(&url, &["sub", "-f", "a = 1", "-q", "2"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--qos"), "{err}");

    // EventBridge's TestEventPattern on the command line: exit 0 match, 1 no match
    let event = r#"{"source":"aws.ec2","detail":{"state":"terminated"}}"#;
    let (code, out, _) = cli(
        &url,
        &[
            "test-pattern",
            "--pattern",
            r#"{"detail":{"state":["terminated"]}}"#,
            "--event",
            event,
        ],
        &[],
    );
    assert_eq!((code, out.as_str()), (Some(0), "match"));
    let (code, out, _) = cli(
        &url,
        &[
            "test-pattern",
            "--pattern",
            r#"{"source":["aws.s3"]}"#,
            "--event",
            event,
        ],
        &[],
    );
    assert_eq!((code, out.as_str()), (Some(1), "no match"));

    // completions for the common shells
    for shell in ["bash", "zsh", "fish"] {
        let (code, script, _) = cli(&url, &["completions", shell], &[]);
        assert_eq!(code, Some(0));
        assert!(
            script.contains("dissem") && script.contains("subscribe"),
            "{shell}"
        );
    }
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stream subscription keeps its deliveries while nobody is attached (no attempt counted,
/// so its `max_attempts` does not run out), and a subscriber that attaches later gets the
/// backlog, as a JetStream durable consumer does; a delivery still waiting when its TTL
/// passes is dead-lettered, saying so.
#[test]
fn a_stream_keeps_its_deliveries_until_a_subscriber_attaches() {
    use proto::v1;
    let dir = temp_dir("durable-stream");
    let mut up = start_up(&dir, &[]);
    runtime().block_on(async {
        let url = up.url();
        let mut subs = v1::subscriptions_client::SubscriptionsClient::new(tests::channel(&url));
        let create =
            |filter: &str, stream: &str, retry: v1::RetryPolicy| v1::CreateSubscriptionRequest {
                subscription: Some(v1::Subscription {
                    filter: Some(v1::subscription::Filter::Text(filter.into())),
                    target: Some(v1::Target {
                        kind: Some(v1::target::Kind::Stream(stream.into())),
                    }),
                    retry: Some(retry),
                    ..Default::default()
                }),
            };
        // two quick attempts would dead-letter it at once if waiting counted as failing
        let late = subs
            .create(create(
                "n < 100",
                "later",
                v1::RetryPolicy {
                    max_attempts: 2,
                    initial_backoff_ms: 10,
                    ..Default::default()
                },
            ))
            .await
            .expect("create")
            .into_inner()
            .id;
        let short = subs
            .create(create(
                "n >= 100",
                "never",
                v1::RetryPolicy {
                    ttl_ms: 1500,
                    ..Default::default()
                },
            ))
            .await
            .expect("create")
            .into_inner()
            .id;
        let mut ingest = v1::ingest_client::IngestClient::new(tests::channel(&url));
        for n in [1, 2, 3, 100] {
            let mut p = tests::temp_put(0);
            p.metadata[0].name = "n".into();
            p.metadata[0].value = Some(v1::Value {
                kind: Some(v1::value::Kind::Integer(n)),
            });
            ingest.put(p).await.expect("put");
        }
        // the delivery with the short TTL and nobody attached is given up on, naming why
        let mut admin = v1::admin_client::AdminClient::new(tests::channel(&url));
        let dead = wait_for("the TTL's dead letter", Duration::from_secs(15), || {
            let mut admin = admin.clone();
            async move {
                let d = admin
                    .dead_letters(v1::DeadLettersRequest { limit: 10 })
                    .await
                    .ok()?
                    .into_inner()
                    .dead_letters;
                (!d.is_empty()).then_some(d)
            }
        })
        .await;
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert_eq!(dead[0].subscription_id, short);
        assert!(
            dead[0].reason.contains("no subscriber attached") && dead[0].reason.contains("TTL"),
            "{}",
            dead[0].reason
        );
        // now a subscriber attaches to the other stream and gets the whole backlog
        let (tx, mut down) = attach(&url, "later").await;
        let mut got = Vec::new();
        while got.len() < 3 {
            let d = tokio::time::timeout(Duration::from_secs(10), down.message())
                .await
                .expect("the backlog within 10 s")
                .expect("stream")
                .expect("a delivery");
            assert_eq!(d.subscription_id, late);
            got.push(d.delivery_id.clone());
            let ack = v1::stream_client_message::Kind::Ack(d.delivery_id);
            tx.send(v1::StreamClientMessage { kind: Some(ack) })
                .await
                .expect("ack");
        }
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 3, "{got:?}");
        let still = admin
            .dead_letters(v1::DeadLettersRequest { limit: 10 })
            .await
            .expect("dead letters")
            .into_inner()
            .dead_letters;
        assert_eq!(still.len(), 1, "only the TTL's: {still:?}");
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Python recipe of docs/clients.md, run as written with the client package of `clients/python`
/// on the path (CI also installs it with pip), against `dissem up`; the script prints the
/// delivery of the object it put.
#[test]
fn the_readme_python_recipe_runs() {
    if !tests::have_python_grpc() {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf();
    let readme = std::fs::read_to_string(root.join("docs/clients.md")).expect("docs/clients.md");
    let marker = "<!-- python-recipe -->\n```python";
    let at = readme.find(marker).expect("the recipe in docs/clients.md");
    let rest = &readme[at + marker.len()..];
    let start = rest.find('\n').map_or(0, |i| i + 1);
    let end = rest[start..].find("\n```").expect("end of block");
    let script = &rest[start..start + end];
    assert!(
        readme.contains("```sh\npip install ./clients/python\n```"),
        "docs/clients.md installs the client package"
    );
    let dir = temp_dir("python-recipe");
    std::fs::write(dir.join("recipe.py"), script).expect("script");
    let mut up = start_up(&dir, &[]);
    let mut cmd = std::process::Command::new("python3");
    cmd.arg("recipe.py")
        .arg(&up.addr)
        .env("PYTHONPATH", root.join("clients/python"))
        .current_dir(&dir);
    let (code, stdout, stderr) = tests::run_to_end(cmd, Duration::from_secs(60));
    assert!(code.is_some(), "the recipe did not finish within 60 s");
    assert!(code == Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("subscription 1 got hot ("), "{stdout}");
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
