//! The Rust client crate (`clients/rust`, `dissem-client`; issue 33) against a real `dissem
//! up` with tokens and TLS: every verb a producer, a subscriber and an operator uses, and the
//! errors a caller meets, by gRPC code. The CLI is built on the same crate (its own tests
//! drive `dissem put`, `subscribe`, `sub`, `dead-letters`...).

use std::time::Duration;

use dissem_client::{Client, ClientError, v1};
use tests::{runtime, start_up, temp_dir, token_create, wait_for};

fn temp(t: i64) -> v1::PutRequest {
    dissem_client::put_request(
        b"reading".to_vec(),
        &[("temp", v1::value::Kind::Integer(t))],
    )
}

#[test]
fn the_rust_client_works_against_dissem_up_over_tls_with_tokens() {
    let dir = temp_dir("rust-client");
    let auth = dir.join("auth.toml");
    let token = token_create(&auth, "ops", "ops", "admin");
    // a CA and a certificate for 127.0.0.1
    let pki = bench::etcdtrust::EtcdTrust::make(&dir.join("pki")).expect("certificates");
    let args = [
        "--auth-file".to_string(),
        auth.display().to_string(),
        "--tls-cert".into(),
        pki.server_cert.display().to_string(),
        "--tls-key".into(),
        pki.server_key.display().to_string(),
        // the dead-letter check pushes to a closed loopback port
        "--allow-private-targets".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut up = start_up(&dir, &args);
    let url = format!("https://{}", up.addr);
    runtime().block_on(async {
        let c = Client::connect(&url, Some(&token), Some(&pki.ca))
            .await
            .expect("connect over TLS with the CA");
        // a subscriber on a stream, and a producer
        let sub = c
            .subscribe(dissem_client::stream_subscription("temp > 30", "rs"))
            .await
            .expect("subscribe");
        let mut session = c.attach("rs").await.expect("attach");
        assert_eq!(session.stream(), "rs");
        let put = c.put(temp(35)).await.expect("put");
        let id = put.id.expect("id");
        let d = tokio::time::timeout(Duration::from_secs(30), session.next())
            .await
            .expect("a delivery within 30 s")
            .expect("the stream is open")
            .expect("a delivery");
        assert_eq!(d.subscription_id, sub.id);
        assert_eq!(d.object_id, Some(id));
        assert_eq!(d.data, b"reading");
        session.ack(&d.delivery_id).await.expect("ack");
        // a put stream: one result per object, the refused one with its reason
        let mut bad = temp(40);
        bad.metadata[0].name.clear();
        let rs = c
            .put_stream(vec![temp(40), bad, temp(1)])
            .await
            .expect("put stream");
        assert_eq!(rs.len(), 3, "{rs:?}");
        assert!(rs[0].is_ok() && rs[2].is_ok(), "{rs:?}");
        let why = rs[1].as_ref().expect_err("the unnamed attribute");
        assert_eq!(why.code, tonic::Code::InvalidArgument as i32, "{why:?}");
        // reading and listing
        assert_eq!(c.subscription(sub.id).await.expect("get").id, sub.id);
        let e = c
            .subscription(987_654)
            .await
            .expect_err("no such subscription");
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        assert!(e.to_string().contains("987654"), "{e}");
        assert!(c.stats().await.expect("stats").objects_stored >= 3);
        // a delivery given up on, then redriven
        let mut dead = v1::Subscription {
            filter: Some(v1::subscription::Filter::Text("temp > 100".into())),
            target: Some(v1::Target {
                kind: Some(v1::target::Kind::Grpc("http://127.0.0.1:1".into())),
            }),
            ..v1::Subscription::default()
        };
        dead.retry = Some(v1::RetryPolicy {
            max_attempts: 1,
            ..v1::RetryPolicy::default()
        });
        let dead = c.subscribe(dead).await.expect("subscribe");
        c.put(temp(101)).await.expect("put");
        let letters = wait_for("the dead letter", Duration::from_secs(30), || async {
            let l: Vec<_> = c
                .dead_letters(100)
                .await
                .ok()?
                .into_iter()
                .filter(|d| d.subscription_id == dead.id)
                .collect();
            (!l.is_empty()).then_some(l)
        })
        .await;
        assert_eq!(c.redrive(letters).await.expect("redrive"), 1);
        let e = c.redrive(Vec::new()).await.expect_err("nothing to redrive");
        assert!(
            matches!(&e, ClientError::Invalid { field, .. } if field == "dead_letters"),
            "{e}"
        );
        assert!(
            c.subscriptions()
                .await
                .expect("list")
                .iter()
                .any(|s| s.id == dead.id)
        );
        c.unsubscribe(dead.id).await.expect("unsubscribe");
        // many at once: split into calls of MAX_CREATE_MANY, answered in order
        let filters: Vec<String> = (0..dissem_client::MAX_CREATE_MANY + 2)
            .map(|k| format!("temp = {k}"))
            .collect();
        let many = c
            .subscribe_many(
                filters
                    .iter()
                    .map(|f| dissem_client::stream_subscription(f, "rs-many"))
                    .collect(),
            )
            .await
            .expect("subscribe many");
        assert_eq!(many.len(), filters.len());
        assert!(
            many.iter()
                .zip(&filters)
                .all(|(s, f)| s.filter == Some(v1::subscription::Filter::Text(f.clone()))),
            "answered out of order"
        );
        for s in many {
            c.unsubscribe(s.id).await.expect("unsubscribe");
        }
        let e = c.subscription(dead.id).await.expect_err("deleted");
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        // the errors of a caller without a token, or without TLS
        let anonymous = Client::connect(&url, None, Some(&pki.ca))
            .await
            .expect("connect");
        let e = anonymous.put(temp(1)).await.expect_err("no token");
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
        let plain = format!("http://{}", up.addr);
        let e = Client::connect(&plain, Some(&token), Some(&pki.ca))
            .await
            .expect_err("a CA for a plain-text url");
        assert!(
            matches!(&e, ClientError::Invalid { field, .. } if field == "tls_ca"),
            "{e}"
        );
        let e = Client::connect("not a url", None, None)
            .await
            .expect_err("a bad url");
        assert!(
            matches!(&e, ClientError::Invalid { field, .. } if field == "url"),
            "{e}"
        );
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
