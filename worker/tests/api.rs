//! The node API end to end: a real tonic server on 127.0.0.1:0 over a real sled store, and a
//! real tonic client: put, get, announce, thousands of streamed puts, subscription CRUD,
//! every validation error, and reflection.

use std::net::SocketAddr;

use proto::v1;
use proto::v1::ingest_client::IngestClient;
use proto::v1::objects_client::ObjectsClient;
use proto::v1::subscriptions_client::SubscriptionsClient;
use tonic::Code;
use tonic::transport::Channel;

struct Node {
    addr: SocketAddr,
    store: storage::Store,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    dir: std::path::PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start(name: &str) -> Node {
    // the tests' webhook targets are on loopback
    let limits = runtime::Limits {
        allow_private_targets: true,
        ..runtime::Limits::default()
    };
    start_with(name, limits).await
}

async fn start_with(name: &str, limits: runtime::Limits) -> Node {
    let dir = std::env::temp_dir().join(format!("dissem-api-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = storage::Store::open(&dir, 7).expect("open store");
    let (listener, addr) = runtime::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let kept = store.clone();
    let listener = runtime::listen::Listener::new(listener, limits.listen);
    tokio::spawn(worker::run(listener, store, limits, async move {
        let _ = rx.await;
    }));
    Node {
        addr,
        store: kept,
        stop: Some(tx),
        dir,
    }
}

async fn channel(addr: SocketAddr) -> Channel {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
        {
            Ok(c) => return c,
            Err(e) if tokio::time::Instant::now() > deadline => {
                panic!("server did not come up: {e}")
            }
            Err(_) => tokio::task::yield_now().await,
        }
    }
}

fn attr(name: &str, v: v1::value::Kind) -> v1::Attribute {
    v1::Attribute {
        name: name.into(),
        value: Some(v1::Value { kind: Some(v) }),
    }
}

fn text(s: &str) -> v1::value::Kind {
    v1::value::Kind::Text(s.into())
}

fn put(data: &[u8], meta: Vec<v1::Attribute>) -> v1::PutRequest {
    v1::PutRequest {
        data: data.to_vec(),
        metadata: meta,
        priority: 3,
        message_id: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_announce_and_stream() {
    let node = start("objects").await;
    let ch = channel(node.addr).await;
    let mut ingest = IngestClient::new(ch.clone());
    let mut objects = ObjectsClient::new(ch.clone());
    let r = ingest
        .put(put(
            b"frame",
            vec![
                attr("temp", v1::value::Kind::Decimal("31.5".into())),
                attr("site", text("kr/seoul/b12")),
                attr("n", v1::value::Kind::Integer(-3)),
                attr("f", v1::value::Kind::Number(0.1)),
            ],
        ))
        .await
        .expect("put")
        .into_inner();
    let id = r.id.expect("id");
    assert_eq!(id.node, 7);
    let got = objects
        .get(v1::GetObjectRequest { id: Some(id) })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.data, b"frame");
    assert_eq!(got.priority, 3);
    let vals: Vec<String> = got
        .metadata
        .iter()
        .map(|a| {
            format!(
                "{}={:?}",
                a.name,
                a.value.as_ref().and_then(|v| v.kind.clone())
            )
        })
        .collect();
    assert_eq!(
        vals,
        [
            "temp=Some(Decimal(\"31.5\"))",
            "site=Some(Text(\"kr/seoul/b12\"))",
            "n=Some(Decimal(\"-3\"))",
            "f=Some(Decimal(\"0.1\"))"
        ]
    );
    // dedup by message id
    let mut m = put(b"x", vec![]);
    m.message_id = "msg-1".into();
    let first = ingest.put(m.clone()).await.expect("put").into_inner();
    let again = ingest.put(m).await.expect("put").into_inner();
    assert!(!first.duplicate && again.duplicate);
    assert_eq!(first.id, again.id);
    // announce
    let a = ingest
        .announce(v1::AnnounceRequest {
            external_id: "s3://bucket/key".into(),
            metadata: vec![attr("type", text("cam"))],
            priority: 7,
            message_id: String::new(),
        })
        .await
        .expect("announce")
        .into_inner();
    let got = objects
        .get(v1::GetObjectRequest { id: a.id })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.external_id, "s3://bucket/key");
    assert!(got.data.is_empty());
    // missing object
    let e = objects
        .get(v1::GetObjectRequest {
            id: Some(v1::ObjectId {
                node: 7,
                seq: 999_999,
            }),
        })
        .await
        .expect_err("missing");
    assert_eq!(e.code(), Code::NotFound);
    // thousands of puts on one stream, one bad one in the middle
    let n = 3000usize;
    let reqs: Vec<v1::PutRequest> = (0..n)
        .map(|i| {
            if i == 1234 {
                put(b"", vec![attr("", text("x"))])
            } else {
                put(
                    &i.to_le_bytes(),
                    vec![attr("i", v1::value::Kind::Integer(i as i64))],
                )
            }
        })
        .collect();
    let mut stream = ingest
        .put_stream(tokio_stream::iter(reqs))
        .await
        .expect("stream")
        .into_inner();
    let mut ids = Vec::new();
    let mut rejected = Vec::new();
    while let Some(r) = stream.message().await.expect("stream message") {
        match r.result.expect("result") {
            v1::put_stream_response::Result::Ok(p) => ids.push(p.id.expect("id")),
            v1::put_stream_response::Result::Rejected(rej) => {
                rejected.push((ids.len() + rejected.len(), rej))
            }
        }
    }
    assert_eq!(ids.len(), n - 1);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].0, 1234);
    assert_eq!(rejected[0].1.code, Code::InvalidArgument as i32);
    assert!(
        rejected[0].1.message.contains("metadata[0].name"),
        "{}",
        rejected[0].1.message
    );
    let mut seqs: Vec<u64> = ids.iter().map(|i| i.seq).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), n - 1, "ids are distinct and in order");
    let last = objects
        .get(v1::GetObjectRequest {
            id: ids.last().cloned(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(last.data, (n - 1).to_le_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_validation_error_names_its_field() {
    let node = start("validation").await;
    let ch = channel(node.addr).await;
    let mut ingest = IngestClient::new(ch.clone());
    let big = "x".repeat(5000);
    let cases: Vec<(v1::PutRequest, &str)> = vec![
        (
            put(b"", vec![attr("", text("a"))]),
            "metadata[0].name: attribute names cannot be empty",
        ),
        (put(b"", vec![attr("1abc", text("a"))]), "metadata[0].name"),
        (put(b"", vec![attr("a b", text("a"))]), "metadata[0].name"),
        (
            put(b"", vec![attr(&"n".repeat(129), text("a"))]),
            "exceeds the limit of 128",
        ),
        (
            put(b"", vec![attr("a", text("x")), attr("a", text("y"))]),
            "metadata[1].name: duplicate attribute name",
        ),
        (
            put(b"", vec![attr("a", v1::value::Kind::Number(f64::NAN))]),
            "metadata[0].value: NaN",
        ),
        (
            put(b"", vec![attr("a", v1::value::Kind::Number(f64::INFINITY))]),
            "metadata[0].value",
        ),
        (
            put(
                b"",
                vec![attr("a", v1::value::Kind::Decimal("0.1.2".into()))],
            ),
            "metadata[0].value: not a number",
        ),
        (
            put(
                b"",
                vec![attr("a", v1::value::Kind::Decimal("1e400".into()))],
            ),
            "out of range",
        ),
        (
            put(b"", vec![attr("a", text(&big))]),
            "metadata[0].value: string of 5000 bytes exceeds the limit of 4096",
        ),
        (
            put(
                b"",
                vec![v1::Attribute {
                    name: "a".into(),
                    value: None,
                }],
            ),
            "metadata[0].value: a value is required",
        ),
        (
            put(
                b"",
                (0..65).map(|i| attr(&format!("a{i}"), text("v"))).collect(),
            ),
            "metadata: 65 attributes exceed the limit of 64",
        ),
        (
            v1::PutRequest {
                priority: 8,
                ..put(b"", vec![])
            },
            "priority: 8 is not in 0..=7",
        ),
        (
            v1::PutRequest {
                message_id: "m".repeat(300),
                ..put(b"", vec![])
            },
            "message_id",
        ),
    ];
    let before = node_objects(ch.clone()).await;
    for (req, needle) in cases {
        let e = ingest.put(req).await.expect_err(needle);
        assert_eq!(e.code(), Code::InvalidArgument, "{needle}: {e}");
        assert!(
            e.message().contains(needle),
            "expected {needle:?} in {:?}",
            e.message()
        );
    }
    // an over-size object
    let huge = vec![0u8; (16 << 20) + 1];
    let e = ingest.put(put(&huge, vec![])).await.expect_err("too big");
    assert!(
        matches!(
            e.code(),
            Code::InvalidArgument | Code::OutOfRange | Code::ResourceExhausted
        ),
        "{e}"
    );
    let e = ingest
        .announce(v1::AnnounceRequest::default())
        .await
        .expect_err("announce without id");
    assert!(e.message().contains("external_id"), "{e}");
    // nothing partial was stored
    assert_eq!(node_objects(ch).await, before);
}

async fn node_objects(ch: Channel) -> u64 {
    proto::v1::admin_client::AdminClient::new(ch)
        .stats(v1::StatsRequest {})
        .await
        .expect("stats")
        .into_inner()
        .objects_stored
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_crud_and_errors() {
    let node = start("subs").await;
    let ch = channel(node.addr).await;
    let mut subs = SubscriptionsClient::new(ch.clone());
    let sub = |filter: v1::subscription::Filter| v1::Subscription {
        id: 0,
        filter: Some(filter),
        target: Some(v1::Target {
            kind: Some(v1::target::Kind::Webhook("http://127.0.0.1:9/hook".into())),
        }),
        qos: v1::Qos::AtLeastOnce as i32,
        retry: None,
        priority: 5,
        webhook_secret: "s3cret".into(),
        tenant: String::new(),
        ..v1::Subscription::default()
    };
    let mut created = Vec::new();
    for i in 0..5 {
        let f = if i % 2 == 0 {
            v1::subscription::Filter::Text(format!("temp > {i} && site prefix \"kr/\""))
        } else {
            v1::subscription::Filter::Eventbridge(format!(
                r#"{{"temp": [{{"numeric": [">", {i}]}}]}}"#
            ))
        };
        let s = subs
            .create(v1::CreateSubscriptionRequest {
                subscription: Some(sub(f)),
            })
            .await
            .expect("create")
            .into_inner();
        assert!(s.id > 0);
        assert!(s.webhook_secret.is_empty(), "the secret is write-only");
        created.push(s);
    }
    let got = subs
        .get(v1::GetSubscriptionRequest { id: created[2].id })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got, created[2]);
    // paging
    let p1 = subs
        .list(v1::ListSubscriptionsRequest {
            after_id: 0,
            limit: 3,
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(p1.subscriptions.len(), 3);
    let p2 = subs
        .list(v1::ListSubscriptionsRequest {
            after_id: p1.next_after_id,
            limit: 3,
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(p2.subscriptions.len(), 2);
    assert_eq!(p2.next_after_id, 0);
    // update
    let mut u = created[0].clone();
    u.filter = Some(v1::subscription::Filter::Text("humidity < 10".into()));
    let u2 = subs.update(u.clone()).await.expect("update").into_inner();
    assert_eq!(u2.filter, u.filter);
    // delete
    subs.delete(v1::DeleteSubscriptionRequest { id: created[1].id })
        .await
        .expect("delete");
    let e = subs
        .get(v1::GetSubscriptionRequest { id: created[1].id })
        .await
        .expect_err("deleted");
    assert_eq!(e.code(), Code::NotFound);
    let e = subs
        .delete(v1::DeleteSubscriptionRequest { id: created[1].id })
        .await
        .expect_err("deleted twice");
    assert_eq!(e.code(), Code::NotFound);
    // marked as deleted before (its tombstone is spread again), unlike an id never created
    assert!(
        e.metadata().get(runtime::subscriptions::DELETED).is_some(),
        "{e:?}"
    );
    let e = subs
        .delete(v1::DeleteSubscriptionRequest { id: u64::MAX / 2 })
        .await
        .expect_err("never created");
    assert_eq!(e.code(), Code::NotFound);
    assert!(
        e.metadata().get(runtime::subscriptions::DELETED).is_none(),
        "{e:?}"
    );
    // bad filters and targets name their field and position
    for (s, needle) in [
        (
            sub(v1::subscription::Filter::Text("temp >".into())),
            "subscription.filter.text: at column 7",
        ),
        (
            sub(v1::subscription::Filter::Eventbridge(
                r#"{"a": [{"wildcard": "x**"}]}"#.into(),
            )),
            "subscription.filter.eventbridge: at $.a[0].wildcard",
        ),
        (
            v1::Subscription {
                target: None,
                ..sub(v1::subscription::Filter::Text("a = 1".into()))
            },
            "subscription.target",
        ),
        (
            v1::Subscription {
                priority: 9,
                ..sub(v1::subscription::Filter::Text("a = 1".into()))
            },
            "subscription.priority",
        ),
        (
            v1::Subscription {
                filter: None,
                ..sub(v1::subscription::Filter::Text("a = 1".into()))
            },
            "subscription.filter",
        ),
    ] {
        let e = subs
            .create(v1::CreateSubscriptionRequest {
                subscription: Some(s),
            })
            .await
            .expect_err(needle);
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains(needle),
            "expected {needle:?} in {:?}",
            e.message()
        );
    }
    let e = subs
        .update(v1::Subscription {
            id: 999_999,
            ..sub(v1::subscription::Filter::Text("a = 1".into()))
        })
        .await
        .expect_err("update missing");
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_many_registers_all_or_none() {
    let node = start("many").await;
    let ch = channel(node.addr).await;
    let mut subs = SubscriptionsClient::new(ch.clone());
    let sub = |filter: &str| v1::Subscription {
        filter: Some(v1::subscription::Filter::Text(filter.into())),
        target: Some(v1::Target {
            kind: Some(v1::target::Kind::Webhook("http://127.0.0.1:9/hook".into())),
        }),
        webhook_secret: "s3cret".into(),
        ..v1::Subscription::default()
    };
    let count = |ch: Channel| async move {
        SubscriptionsClient::new(ch)
            .list(v1::ListSubscriptionsRequest {
                after_id: 0,
                limit: 1000,
            })
            .await
            .expect("list")
            .into_inner()
            .subscriptions
            .len()
    };
    let filters = ["temp > 1", "site prefix \"kr/\"", "humidity < 10"];
    let made = subs
        .create_many(v1::CreateSubscriptionsRequest {
            subscriptions: filters.iter().map(|f| sub(f)).collect(),
        })
        .await
        .expect("create many")
        .into_inner()
        .subscriptions;
    assert_eq!(made.len(), 3);
    for (s, f) in made.iter().zip(filters) {
        assert_eq!(s.filter, sub(f).filter, "answered in request order");
        assert!(s.id > 0 && s.webhook_secret.is_empty(), "{s:?}");
        assert_eq!(s.qos, v1::Qos::AtLeastOnce as i32, "stored with its level");
        let got = subs
            .get(v1::GetSubscriptionRequest { id: s.id })
            .await
            .expect("get")
            .into_inner();
        assert_eq!(&got, s);
    }
    assert!(made.windows(2).all(|w| w[0].id < w[1].id), "{made:?}");
    assert_eq!(count(ch.clone()).await, 3);
    // one bad subscription refuses the request whole, naming its position and field
    let e = subs
        .create_many(v1::CreateSubscriptionsRequest {
            subscriptions: vec![sub("a = 1"), sub("temp >"), sub("b = 2")],
        })
        .await
        .expect_err("a bad filter");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message()
            .contains("subscriptions[1].filter.text: at column 7"),
        "{e:?}"
    );
    let e = subs
        .create_many(v1::CreateSubscriptionsRequest {
            subscriptions: vec![
                sub("a = 1"),
                v1::Subscription {
                    target: None,
                    ..sub("a = 2")
                },
            ],
        })
        .await
        .expect_err("no target");
    assert!(e.message().contains("subscriptions[1].target"), "{e:?}");
    assert_eq!(
        count(ch.clone()).await,
        3,
        "nothing of a refused request is stored"
    );
    // bounds: none, and more than a thousand
    for n in [0, runtime::subscriptions::MAX_CREATE_MANY + 1] {
        let e = subs
            .create_many(v1::CreateSubscriptionsRequest {
                subscriptions: vec![sub("a = 1"); n],
            })
            .await
            .expect_err("out of bounds");
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("subscriptions: "), "{e:?}");
    }
    assert_eq!(count(ch).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_get_errors_not_panics() {
    // raw, hand-made gRPC frames with garbage protobuf: the server answers with an error
    // status and keeps serving
    let node = start("garbage").await;
    let ch = channel(node.addr).await;
    let mut ingest = IngestClient::new(ch.clone());
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.expect("ready");
    for bytes in [
        vec![0xffu8; 10],
        vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
        vec![0x12, 0x05, 0x0a],
    ] {
        let mut g = grpc.clone();
        g.ready().await.expect("ready");
        let r = g
            .unary::<_, RawResponse, _>(
                tonic::Request::new(RawBytes(bytes)),
                "/dissem.v1.Ingest/Put".parse().expect("path"),
                RawCodec,
            )
            .await;
        assert!(r.is_err(), "garbage must be rejected");
    }
    // still serving
    ingest
        .put(put(b"ok", vec![]))
        .await
        .expect("put after garbage");
}

#[derive(Debug, Clone)]
struct RawBytes(Vec<u8>);
#[derive(Debug, Clone, Default)]
struct RawResponse;

#[derive(Debug, Clone, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = RawBytes;
    type Decode = RawResponse;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = RawBytes;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: RawBytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes_put::BufMutExt;
        dst.put_all(&item.0);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = RawResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        _src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<RawResponse>, tonic::Status> {
        Ok(Some(RawResponse))
    }
}

mod bytes_put {
    pub trait BufMutExt {
        fn put_all(&mut self, b: &[u8]);
    }
    impl BufMutExt for tonic::codec::EncodeBuf<'_> {
        fn put_all(&mut self, b: &[u8]) {
            use prost::bytes::BufMut;
            self.put_slice(b);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_every_service_in_v1_and_v1alpha() {
    let node = start("reflection").await;
    let ch = channel(node.addr).await;
    let v1_names = {
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut resp = ServerReflectionClient::new(ch.clone())
            .server_reflection_info(tokio_stream::iter(vec![req]))
            .await
            .expect("reflection v1")
            .into_inner();
        let msg = resp.message().await.expect("message").expect("a response");
        let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
            panic!("unexpected reflection answer");
        };
        list.service.into_iter().map(|s| s.name).collect::<Vec<_>>()
    };
    // the older dialect, the only one grpcio-reflection, Postman and older grpcurl speak
    let v1alpha_names = {
        use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut resp = ServerReflectionClient::new(ch)
            .server_reflection_info(tokio_stream::iter(vec![req]))
            .await
            .expect("reflection v1alpha")
            .into_inner();
        let msg = resp.message().await.expect("message").expect("a response");
        let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
            panic!("unexpected reflection answer");
        };
        list.service.into_iter().map(|s| s.name).collect::<Vec<_>>()
    };
    let ours = |names: &[String]| -> Vec<String> {
        let mut v: Vec<String> = names
            .iter()
            .filter(|n| n.starts_with("dissem."))
            .cloned()
            .collect();
        v.sort();
        v
    };
    let want = [
        "dissem.v1.Admin",
        "dissem.v1.Federation",
        "dissem.v1.Ingest",
        "dissem.v1.Objects",
        "dissem.v1.Subscriptions",
    ];
    assert_eq!(ours(&v1_names), want, "v1: {v1_names:?}");
    assert_eq!(ours(&v1alpha_names), want, "v1alpha: {v1alpha_names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_rate_is_limited_per_connection() {
    let limits = runtime::Limits {
        max_requests_per_second_per_connection: 5,
        ..runtime::Limits::default()
    };
    let node = start_with("rate", limits).await;
    let ch = channel(node.addr).await;
    let mut ingest = IngestClient::new(ch.clone());
    let mut ok = 0;
    let mut limited = 0;
    for _ in 0..20 {
        match ingest.put(put(b"x", vec![])).await {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
                assert!(e.message().contains("5 requests per second"), "{e}");
                limited += 1;
            }
        }
    }
    assert!(ok >= 5 && limited > 0, "ok {ok}, limited {limited}");
    assert_eq!(
        node_objects(ch.clone()).await,
        ok,
        "nothing stored for limited requests"
    );
    // another connection has its own budget
    let other = channel(node.addr).await;
    IngestClient::new(other)
        .put(put(b"y", vec![]))
        .await
        .expect("a fresh connection is not limited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_objects_are_matched_into_pending_deliveries() {
    let node = start("dissem").await;
    let ch = channel(node.addr).await;
    let mut subs = SubscriptionsClient::new(ch.clone());
    let mut ingest = IngestClient::new(ch.clone());
    let filters = [
        r#"temp > 30 && site prefix "kr/""#,
        r#"type in ["cam", "lidar"]"#,
        r#"temp <= 30 || type = "door""#,
    ];
    let mut ids = Vec::new();
    for f in filters {
        let s = subs
            .create(v1::CreateSubscriptionRequest {
                subscription: Some(v1::Subscription {
                    filter: Some(v1::subscription::Filter::Text(f.into())),
                    target: Some(v1::Target {
                        kind: Some(v1::target::Kind::Stream("s".into())),
                    }),
                    qos: v1::Qos::AtMostOnce as i32,
                    ..v1::Subscription::default()
                }),
            })
            .await
            .expect("create")
            .into_inner();
        ids.push(s.id);
    }
    // a deleted subscription matches nothing
    subs.delete(v1::DeleteSubscriptionRequest { id: ids[2] })
        .await
        .expect("delete");
    let objects = [
        (31, "kr/seoul", "cam", vec![ids[0], ids[1]]),
        (31, "us/nyc", "lidar", vec![ids[1]]),
        (10, "kr/busan", "door", vec![]),
    ];
    let mut put_ids = Vec::new();
    for (temp, site, ty, _) in &objects {
        let r = ingest
            .put(put(
                b"",
                vec![
                    attr("temp", v1::value::Kind::Integer(*temp)),
                    attr("site", text(site)),
                    attr("type", text(ty)),
                ],
            ))
            .await
            .expect("put")
            .into_inner();
        let id = r.id.expect("id");
        put_ids.push(storage::ObjectId {
            node: id.node,
            seq: id.seq,
        });
    }
    // wait (with a deadline) until the outbox is drained
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !node.store.outbox_pending().expect("outbox").is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "objects were not disseminated"
        );
        tokio::task::yield_now().await;
    }
    for ((_, _, _, want), oid) in objects.iter().zip(&put_ids) {
        for &sub in &ids {
            let d = node.store.delivery(sub, *oid).expect("delivery");
            assert_eq!(
                d.is_some(),
                want.contains(&sub),
                "object {oid:?}, subscription {sub}: {d:?}"
            );
            if let Some(state) = d {
                assert!(matches!(
                    state,
                    storage::DeliveryState::Pending { attempts: 0, .. }
                ));
            }
        }
    }
}
