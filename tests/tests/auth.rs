//! Authentication, roles and tenancy end to end: tokens made with the real `dissem token
//! create`, a real `dissem up --auth-file` on loopback, and clients with and without tokens.
//! Anonymous and wrong tokens are refused on every RPC, roles are enforced, a tenant sees
//! nothing of another's subscriptions or streams, and quotas answer `RESOURCE_EXHAUSTED`.

use std::io::Write;
use std::time::Duration;

use proto::v1;
use tests::{
    Proc, bearer, channel, dissem_bin, runtime, temp_dir, temp_put, token_create, wait_for,
    wait_image,
};
use tonic::Code;

/// A CreateMany of stream subscriptions to "q", one per filter.
fn many(filters: &[&str]) -> v1::CreateSubscriptionsRequest {
    v1::CreateSubscriptionsRequest {
        subscriptions: filters
            .iter()
            .filter_map(|f| stream_sub(f, "q").subscription)
            .collect(),
    }
}

fn stream_sub(filter: &str, stream: &str) -> v1::CreateSubscriptionRequest {
    v1::CreateSubscriptionRequest {
        subscription: Some(v1::Subscription {
            filter: Some(v1::subscription::Filter::Text(filter.into())),
            target: Some(v1::Target {
                kind: Some(v1::target::Kind::Stream(stream.into())),
            }),
            qos: v1::Qos::AtMostOnce as i32,
            ..Default::default()
        }),
    }
}

/// Every public RPC called with `token`; each must fail with `code`.
async fn every_rpc_fails(url: &str, token: &str, code: Code) {
    let ch = channel(url);
    let mut results: Vec<(&str, Result<(), tonic::Status>)> = Vec::new();
    let mut ingest = v1::ingest_client::IngestClient::new(ch.clone());
    results.push((
        "Put",
        ingest.put(bearer(temp_put(1), token)).await.map(drop),
    ));
    results.push((
        "PutStream",
        ingest
            .put_stream(bearer(tokio_stream::iter(vec![temp_put(1)]), token))
            .await
            .map(drop),
    ));
    results.push((
        "Announce",
        ingest
            .announce(bearer(v1::AnnounceRequest::default(), token))
            .await
            .map(drop),
    ));
    results.push((
        "Objects.Get",
        v1::objects_client::ObjectsClient::new(ch.clone())
            .get(bearer(v1::GetObjectRequest::default(), token))
            .await
            .map(drop),
    ));
    let mut subs = v1::subscriptions_client::SubscriptionsClient::new(ch.clone());
    results.push((
        "Create",
        subs.create(bearer(stream_sub("temp > 1", "s"), token))
            .await
            .map(drop),
    ));
    results.push((
        "CreateMany",
        subs.create_many(bearer(many(&["temp > 1"]), token))
            .await
            .map(drop),
    ));
    results.push((
        "Get",
        subs.get(bearer(v1::GetSubscriptionRequest { id: 1 }, token))
            .await
            .map(drop),
    ));
    results.push((
        "List",
        subs.list(bearer(v1::ListSubscriptionsRequest::default(), token))
            .await
            .map(drop),
    ));
    results.push((
        "Update",
        subs.update(bearer(v1::Subscription::default(), token))
            .await
            .map(drop),
    ));
    results.push((
        "Delete",
        subs.delete(bearer(v1::DeleteSubscriptionRequest { id: 1 }, token))
            .await
            .map(drop),
    ));
    let mut admin = v1::admin_client::AdminClient::new(ch.clone());
    results.push((
        "Stats",
        admin
            .stats(bearer(v1::StatsRequest {}, token))
            .await
            .map(drop),
    ));
    results.push((
        "Workers",
        admin
            .workers(bearer(v1::WorkersRequest {}, token))
            .await
            .map(drop),
    ));
    results.push((
        "DeadLetters",
        admin
            .dead_letters(bearer(v1::DeadLettersRequest::default(), token))
            .await
            .map(drop),
    ));
    results.push((
        "Redrive",
        admin
            .redrive(bearer(v1::RedriveRequest::default(), token))
            .await
            .map(drop),
    ));
    let attach = v1::StreamClientMessage {
        kind: Some(v1::stream_client_message::Kind::Attach("s".into())),
    };
    results.push((
        "Stream.Open",
        v1::stream_client::StreamClient::new(ch.clone())
            .open(bearer(tokio_stream::iter(vec![attach]), token))
            .await
            .map(drop),
    ));
    {
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        let r = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        results.push((
            "reflection",
            ServerReflectionClient::new(ch.clone())
                .server_reflection_info(bearer(tokio_stream::iter(vec![r]), token))
                .await
                .map(drop),
        ));
    }
    for (rpc, r) in results {
        match r {
            Ok(()) => panic!("{rpc} with token {token:?} succeeded"),
            Err(e) => assert_eq!(e.code(), code, "{rpc}: {e:?}"),
        }
    }
}

/// `grpc.health.v1.Health` answers probes without credentials (load balancers and
/// orchestrators send none): the server and each public service are SERVING, an unknown
/// service is NOT_FOUND.
async fn health_probes_need_no_token(url: &str) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let mut h = HealthClient::new(channel(url));
    for service in [
        "",
        "dissem.v1.Ingest",
        "dissem.v1.Subscriptions",
        "dissem.v1.Admin",
    ] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("health of {service:?}: {e}"))
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    let e = h
        .check(HealthCheckRequest {
            service: "dissem.v1.Cluster".into(),
        })
        .await
        .expect_err("internal services are not reported");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
}

#[test]
fn tokens_roles_and_tenants() {
    let dir = temp_dir("auth");
    let file = dir.join("auth.toml");
    let acme_in = token_create(&file, "acme-gw", "acme", "ingest");
    let acme_sub = token_create(&file, "acme-app", "acme", "subscribe,read");
    let globex = token_create(&file, "globex-app", "globex", "subscribe,ingest");
    let admin = token_create(&file, "ops", "ops", "admin");
    let text = std::fs::read_to_string(&file).expect("auth file");
    for t in [&acme_in, &acme_sub, &globex, &admin] {
        assert!(!text.contains(t.as_str()), "tokens are not stored");
    }
    std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .and_then(|mut f| {
            f.write_all(b"\n[tenants.globex]\nmax_subscriptions = 2\nmax_puts_per_second = 5\n")
        })
        .expect("quota");
    let node = Proc::start(
        &dissem_bin(),
        &[
            "up".to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--allow-private-targets".into(),
            "--gpu".into(),
            "off".into(),
            "--auth-file".into(),
            file.display().to_string(),
            "--data".into(),
            dir.join("data").display().to_string(),
        ],
    );
    let url = node.url();
    runtime().block_on(async {
        every_rpc_fails(&url, "", Code::Unauthenticated).await;
        every_rpc_fails(&url, "dsm_not-a-token", Code::Unauthenticated).await;
        health_probes_need_no_token(&url).await;

        let ch = channel(&url);
        let mut subs = v1::subscriptions_client::SubscriptionsClient::new(ch.clone());
        // roles
        let e = subs
            .list(bearer(v1::ListSubscriptionsRequest::default(), &acme_in))
            .await
            .expect_err("ingest cannot list");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("subscribe"), "{e:?}");
        let e = v1::admin_client::AdminClient::new(ch.clone())
            .stats(bearer(v1::StatsRequest {}, &acme_sub))
            .await
            .expect_err("stats is for admins");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

        // tenancy
        let mine = subs
            .create(bearer(stream_sub("temp > 30", "alerts"), &acme_sub))
            .await
            .expect("create")
            .into_inner();
        assert_eq!(mine.tenant, "acme");
        let theirs = subs
            .list(bearer(v1::ListSubscriptionsRequest::default(), &globex))
            .await
            .expect("list")
            .into_inner();
        assert!(theirs.subscriptions.is_empty(), "{theirs:?}");
        for e in [
            subs.get(bearer(v1::GetSubscriptionRequest { id: mine.id }, &globex))
                .await
                .map(drop),
            subs.delete(bearer(
                v1::DeleteSubscriptionRequest { id: mine.id },
                &globex,
            ))
            .await
            .map(drop),
            subs.update(bearer(
                stream_sub("temp > 0", "mine-now")
                    .subscription
                    .map(|mut s| {
                        s.id = mine.id;
                        s
                    })
                    .expect("sub"),
                &globex,
            ))
            .await
            .map(drop),
        ] {
            assert_eq!(e.expect_err("other tenant").code(), Code::NotFound);
        }
        let own = subs
            .list(bearer(v1::ListSubscriptionsRequest::default(), &acme_sub))
            .await
            .expect("list")
            .into_inner();
        assert_eq!(own.subscriptions.len(), 1);
        let all = subs
            .list(bearer(v1::ListSubscriptionsRequest::default(), &admin))
            .await
            .expect("admin list")
            .into_inner();
        assert_eq!(all.subscriptions.len(), 1, "admins see every tenant");

        // streams are per tenant: globex attaching "alerts" gets none of acme's deliveries
        wait_image(ch.clone(), &admin, 1).await;
        let open = |tok: String| {
            let ch = ch.clone();
            async move {
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                tx.send(v1::StreamClientMessage {
                    kind: Some(v1::stream_client_message::Kind::Attach("alerts".into())),
                })
                .await
                .expect("attach");
                let down = v1::stream_client::StreamClient::new(ch)
                    .open(bearer(
                        tokio_stream::wrappers::ReceiverStream::new(rx),
                        &tok,
                    ))
                    .await
                    .expect("open")
                    .into_inner();
                (tx, down)
            }
        };
        let (_keep_a, mut acme_stream) = open(acme_sub.clone()).await;
        let (_keep_g, mut globex_stream) = open(globex.clone()).await;
        let mut ingest = v1::ingest_client::IngestClient::new(ch.clone());
        ingest
            .put(bearer(temp_put(31), &acme_in))
            .await
            .expect("put");
        let got = tokio::time::timeout(Duration::from_secs(20), acme_stream.message())
            .await
            .expect("acme's delivery in time")
            .expect("stream")
            .expect("a delivery");
        assert_eq!(got.subscription_id, mine.id);
        let leaked = tokio::time::timeout(Duration::from_secs(1), globex_stream.message()).await;
        assert!(leaked.is_err(), "globex received {leaked:?}");

        // quotas: a CreateMany that does not fit is refused whole
        let e = subs
            .create_many(bearer(many(&["temp > 0", "temp > 1", "temp > 2"]), &globex))
            .await
            .expect_err("three do not fit a quota of two");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let made = subs
            .create_many(bearer(many(&["temp > 0", "temp > 1"]), &globex))
            .await
            .expect("within quota")
            .into_inner()
            .subscriptions;
        assert_eq!(made.len(), 2);
        assert!(made.iter().all(|s| s.tenant == "globex"), "{made:?}");
        let e = subs
            .create(bearer(stream_sub("temp > 9", "q"), &globex))
            .await
            .expect_err("over the subscription quota");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let mut limited = 0;
        for _ in 0..20 {
            if let Err(e) = ingest.put(bearer(temp_put(1), &globex)).await {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                limited += 1;
            }
        }
        assert!(limited >= 10, "only {limited} of 20 puts limited");

        // dead letters and redrive: a tenant sees and redrives only its own
        let gone = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let dead_url = format!("http://{}/hook", gone.local_addr().expect("addr"));
        drop(gone);
        let dead_sub = subs
            .create(bearer(
                v1::CreateSubscriptionRequest {
                    subscription: Some(v1::Subscription {
                        filter: Some(v1::subscription::Filter::Text("temp > 100".into())),
                        target: Some(v1::Target {
                            kind: Some(v1::target::Kind::Webhook(dead_url)),
                        }),
                        qos: v1::Qos::AtLeastOnce as i32,
                        retry: Some(v1::RetryPolicy {
                            max_attempts: 1,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                },
                &acme_sub,
            ))
            .await
            .expect("create")
            .into_inner();
        wait_image(ch.clone(), &admin, 4).await;
        ingest
            .put(bearer(temp_put(101), &acme_in))
            .await
            .expect("put");
        let adm = v1::admin_client::AdminClient::new(ch.clone());
        let dead_of = |tok: String| {
            let mut a = adm.clone();
            async move {
                a.dead_letters(bearer(v1::DeadLettersRequest::default(), &tok))
                    .await
                    .expect("dead letters")
                    .into_inner()
                    .dead_letters
            }
        };
        wait_for("acme's dead letter", Duration::from_secs(30), || {
            let f = dead_of(acme_sub.clone());
            async move { (!f.await.is_empty()).then_some(()) }
        })
        .await;
        assert!(
            dead_of(acme_sub.clone())
                .await
                .iter()
                .all(|d| d.subscription_id == dead_sub.id)
        );
        // globex sees only its own (its unattached QoS 0 streams' misses, if any)
        let theirs = dead_of(globex.clone()).await;
        assert!(
            !theirs.iter().any(|d| d.subscription_id == dead_sub.id),
            "globex sees acme's dead letter: {theirs:?}"
        );
        let redrive = |tok: String| {
            let mut a = adm.clone();
            async move {
                a.redrive(bearer(
                    v1::RedriveRequest {
                        dead_letters: Vec::new(),
                        all: true,
                    },
                    &tok,
                ))
                .await
                .expect("redrive")
                .into_inner()
                .redriven
            }
        };
        redrive(globex.clone()).await;
        assert!(
            dead_of(acme_sub.clone())
                .await
                .iter()
                .any(|d| d.subscription_id == dead_sub.id),
            "globex's redrive left acme's dead letter alone"
        );
        assert!(redrive(acme_sub.clone()).await >= 1);
    });

    // the CLI takes --token (or DISSEM_TOKEN)
    let cli = |tok: Option<&str>| {
        let mut c = std::process::Command::new(dissem_bin());
        c.args(["subscriptions", "--node-url", &url]);
        if let Some(t) = tok {
            c.env("DISSEM_TOKEN", t);
        } else {
            c.env_remove("DISSEM_TOKEN");
        }
        c.output().expect("dissem subscriptions")
    };
    let out = cli(Some(&acme_sub));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("temp > 30"));
    let out = cli(None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("token is required"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
