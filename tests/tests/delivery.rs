//! Delivery end to end: a real `dissem up` pushes matches to real subscriber endpoints on
//! loopback (allowed with `--allow-private-targets`): an HTTP webhook server that checks the
//! HMAC signature, a gRPC `Subscriber` server (with fault injection for QoS 2), and a stream
//! opened to the node. Each test waits on conditions with deadlines.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use proto::v1;
use tests::{
    Proc, bearer, channel, dissem_bin, runtime, stats, temp_dir, temp_put, wait_for, wait_image,
};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

static SERIAL: Mutex<()> = Mutex::new(());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn start_node(dir: &std::path::Path, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = [
        "up",
        "--listen",
        "127.0.0.1:0",
        "--allow-private-targets",
        "--gpu",
        "off",
        "--data",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(dir.join("data").display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::start(&dissem_bin(), &args)
}

struct Sub<'a> {
    filter: &'a str,
    target: v1::target::Kind,
    qos: v1::Qos,
    retry: Option<v1::RetryPolicy>,
    secret: &'a str,
}

async fn create(url: &str, s: Sub<'_>) -> u64 {
    v1::subscriptions_client::SubscriptionsClient::new(channel(url))
        .create(v1::CreateSubscriptionRequest {
            subscription: Some(v1::Subscription {
                filter: Some(v1::subscription::Filter::Text(s.filter.into())),
                target: Some(v1::Target {
                    kind: Some(s.target),
                }),
                qos: s.qos as i32,
                retry: s.retry,
                webhook_secret: s.secret.into(),
                ..v1::Subscription::default()
            }),
        })
        .await
        .expect("create subscription")
        .into_inner()
        .id
}

async fn wait_published(url: &str, n: u64) {
    let u = url.to_string();
    wait_for(
        "the subscriptions to be published",
        Duration::from_secs(30),
        || {
            let u = u.clone();
            async move { (stats(&u).await.ok()?.cluster?.image_subscriptions == n).then_some(()) }
        },
    )
    .await;
}

/// Puts objects with `temp` = each value, at `priority`; returns their ids as "node:seq".
async fn put_temps(url: &str, temps: &[i64], priority: u32) -> Vec<String> {
    let mut c = v1::ingest_client::IngestClient::new(channel(url));
    let mut ids = Vec::new();
    for &t in temps {
        let r = c
            .put(v1::PutRequest {
                data: format!("t{t}").into_bytes(),
                metadata: vec![v1::Attribute {
                    name: "temp".into(),
                    value: Some(v1::Value {
                        kind: Some(v1::value::Kind::Integer(t)),
                    }),
                }],
                priority,
                message_id: String::new(),
            })
            .await
            .expect("put")
            .into_inner();
        let id = r.id.unwrap_or_default();
        ids.push(format!("{}:{}", id.node, id.seq));
    }
    ids
}

/// Retries every 50..400 ms, up to 100 attempts: an endpoint that comes back is served soon.
fn fast_retry() -> Option<v1::RetryPolicy> {
    Some(v1::RetryPolicy {
        max_attempts: 100,
        ttl_ms: 0,
        initial_backoff_ms: 50,
        max_backoff_ms: 400,
    })
}

fn key(d: &v1::Delivery) -> String {
    let o = d.object_id.unwrap_or_default();
    format!("{}:{}", o.node, o.seq)
}

// --- a gRPC subscriber with QoS 2 semantics and fault injection ------------------------------

#[derive(Default)]
struct SubscriberState {
    /// What the application saw, in order (QoS 0/1 on Deliver, QoS 2 on Release).
    shown: Vec<(String, u32)>,
    /// QoS 2: received, not yet released (delivery id -> object).
    received: BTreeMap<String, (String, u32)>,
    calls: u64,
    /// `DeliverBatch` calls, and the deliveries they carried.
    batch_calls: u64,
    batched: u64,
}

#[derive(Clone, Default)]
struct Subscriber {
    state: Arc<Mutex<SubscriberState>>,
    exactly_once: bool,
    /// Fail (after processing) every n-th delivery and release: the ack is "lost".
    drop_every: u64,
    delay: Duration,
    /// Take each delivery (the application sees it), then answer only after this long: a
    /// push that arrived but whose ack never came back.
    stall: Duration,
    /// Answer `DeliverBatch` with UNIMPLEMENTED (a subscriber written before it existed).
    no_batch: bool,
}

impl Subscriber {
    /// Takes one delivery; `Err` when fault injection loses its ack.
    fn take(&self, d: &v1::Delivery) -> Result<(), String> {
        let mut s = lock(&self.state);
        s.calls += 1;
        let entry = (key(d), d.priority);
        if self.exactly_once {
            s.received.entry(d.delivery_id.clone()).or_insert(entry);
        } else {
            s.shown.push(entry);
        }
        if self.drop_every > 0 && s.calls.is_multiple_of(self.drop_every) {
            return Err("ack lost (fault injection)".into());
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl v1::subscriber_server::Subscriber for Subscriber {
    async fn deliver(
        &self,
        request: Request<v1::Delivery>,
    ) -> Result<Response<v1::DeliverAck>, Status> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.take(&request.into_inner())
            .map_err(Status::unavailable)?;
        if !self.stall.is_zero() {
            tokio::time::sleep(self.stall).await;
        }
        Ok(Response::new(v1::DeliverAck {}))
    }

    async fn deliver_batch(
        &self,
        request: Request<v1::DeliveryBatch>,
    ) -> Result<Response<v1::DeliverBatchAck>, Status> {
        if self.no_batch {
            return Err(Status::unimplemented("DeliverBatch"));
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let batch = request.into_inner().deliveries;
        {
            let mut s = lock(&self.state);
            s.batch_calls += 1;
            s.batched += batch.len() as u64;
        }
        let rejected = batch
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                self.take(d).err().map(|reason| v1::Rejected {
                    index: i as u32,
                    reason,
                })
            })
            .collect();
        if !self.stall.is_zero() {
            tokio::time::sleep(self.stall).await;
        }
        Ok(Response::new(v1::DeliverBatchAck { rejected }))
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseAck>, Status> {
        let id = request.into_inner().delivery_id;
        let mut s = lock(&self.state);
        s.calls += 1;
        if let Some(entry) = s.received.remove(&id) {
            s.shown.push(entry);
        }
        if self.drop_every > 0 && s.calls.is_multiple_of(self.drop_every) {
            return Err(Status::unavailable("ack lost (fault injection)"));
        }
        Ok(Response::new(v1::ReleaseAck {}))
    }
}

impl Subscriber {
    /// The objects the application saw, distinct.
    fn shown_set(&self) -> BTreeSet<String> {
        lock(&self.state)
            .shown
            .iter()
            .map(|x| x.0.clone())
            .collect()
    }

    /// Waits until the application saw exactly `want`.
    async fn wait_shown(&self, what: &str, want: &BTreeSet<String>) {
        wait_for(what, Duration::from_secs(60), || {
            let got = self.shown_set();
            async move { (got == *want).then_some(()) }
        })
        .await;
    }
}

async fn serve_subscriber(sub: Subscriber, listener: TcpListener) {
    tonic::transport::Server::builder()
        .add_service(v1::subscriber_server::SubscriberServer::new(sub))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await
        .expect("subscriber server");
}

// --- a webhook receiver that checks signatures ----------------------------------------------

#[derive(Default)]
struct Hooks {
    /// CloudEvent ids and subjects received with a valid signature.
    ok: Vec<(String, String)>,
    bad_signatures: u64,
    /// POSTs received, and those that carried a batch of several events.
    posts: u64,
    batches: u64,
    /// Validation handshakes (OPTIONS) answered.
    validations: u64,
}

fn hmac_hex(secret: &str, ts: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("hmac key");
    mac.update(ts.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A webhook receiver checking signatures; each answer is held back `hold` (a slow
/// subscriber).
async fn serve_webhook(
    listener: TcpListener,
    secret: &'static str,
    hooks: Arc<Mutex<Hooks>>,
    hold: Duration,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let hooks = hooks.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let hooks = hooks.clone();
                    async move {
                        if req.method() == hyper::Method::OPTIONS {
                            // the CloudEvents abuse-protection handshake: consent to the
                            // origin that asks
                            let mut b = hyper::Response::builder().status(200);
                            if let Some(o) = req.headers().get("webhook-request-origin") {
                                b = b.header("WebHook-Allowed-Origin", o.clone());
                            }
                            lock(&hooks).validations += 1;
                            return Ok(b
                                .body(http_body_util::Full::new(hyper::body::Bytes::new()))
                                .unwrap_or_default());
                        }
                        let ts = req
                            .headers()
                            .get("x-dissem-timestamp")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let sig = req
                            .headers()
                            .get("x-dissem-signature")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let ctype = req
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let body = req.into_body().collect().await?.to_bytes();
                        tokio::time::sleep(hold).await;
                        let signed = sig == format!("sha256={}", hmac_hex(secret, &ts, &body));
                        // one event in structured mode, or several in batched mode
                        let parsed: serde_json::Value =
                            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                        let events = match parsed {
                            serde_json::Value::Array(v)
                                if ctype.starts_with("application/cloudevents-batch+json") =>
                            {
                                v
                            }
                            ev if ctype.starts_with("application/cloudevents+json") => vec![ev],
                            _ => Vec::new(),
                        };
                        let mut h = lock(&hooks);
                        h.posts += 1;
                        let good = signed
                            && !events.is_empty()
                            && events.iter().all(|ev| ev["specversion"] == "1.0");
                        let status = if good {
                            if events.len() > 1 {
                                h.batches += 1;
                            }
                            for ev in events {
                                h.ok.push((
                                    ev["id"].as_str().unwrap_or("").to_string(),
                                    ev["subject"].as_str().unwrap_or("").to_string(),
                                ));
                            }
                            200
                        } else {
                            h.bad_signatures += 1;
                            401
                        };
                        let resp = hyper::Response::builder()
                            .status(status)
                            .body(http_body_util::Full::new(hyper::body::Bytes::new()))
                            .unwrap_or_default();
                        Ok::<_, hyper::Error>(resp)
                    }
                });
            let http = hyper::server::conn::http1::Builder::new();
            match tls {
                None => {
                    let _ = http
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                }
                Some(acceptor) => {
                    if let Ok(s) = acceptor.accept(stream).await {
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                            .await;
                    }
                }
            }
        });
    }
}

/// A webhook receiver on loopback: its URL and what it received.
async fn start_webhook(secret: &'static str, hold: Duration) -> (String, Arc<Mutex<Hooks>>) {
    let hooks = Arc::new(Mutex::new(Hooks::default()));
    let wl = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let hook_url = format!("http://{}/hook", wl.local_addr().expect("addr"));
    tokio::spawn(serve_webhook(wl, secret, hooks.clone(), hold, None));
    (hook_url, hooks)
}

fn expected(ids: &[String], temps: &[i64], pred: impl Fn(i64) -> bool) -> BTreeSet<String> {
    ids.iter()
        .zip(temps)
        .filter(|(_, t)| pred(**t))
        .map(|(i, _)| i.clone())
        .collect()
}

#[test]
fn pushes_that_queue_for_a_slow_webhook_go_together_as_a_signed_batch() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-batch");
    let node = start_node(&dir, &[]);
    runtime().block_on(async {
        let url = node.url();
        // each answer takes 300 ms: what matches meanwhile waits for the next POST, in one
        // batch where the subscription asks for batches
        let (hook_url, hooks) = start_webhook("b4tch", Duration::from_millis(300)).await;
        let (single_url, singles) = start_webhook("b4tch", Duration::from_millis(300)).await;
        for (target, push_batch) in [(hook_url, 64), (single_url, 0)] {
            v1::subscriptions_client::SubscriptionsClient::new(channel(&url))
                .create(v1::CreateSubscriptionRequest {
                    subscription: Some(v1::Subscription {
                        filter: Some(v1::subscription::Filter::Text("temp >= 0".into())),
                        target: Some(v1::Target {
                            kind: Some(v1::target::Kind::Webhook(target)),
                        }),
                        qos: v1::Qos::AtLeastOnce as i32,
                        webhook_secret: "b4tch".into(),
                        push_batch,
                        ..Default::default()
                    }),
                })
                .await
                .expect("create");
        }
        let temps: Vec<i64> = (0..40).collect();
        let ids = put_temps(&url, &temps, 0).await;
        let want = expected(&ids, &temps, |_| true);
        for hooks in [&hooks, &singles] {
            wait_for("every event", Duration::from_secs(60), || {
                let hooks = hooks.clone();
                let want = want.clone();
                async move {
                    let h: BTreeSet<String> = lock(&hooks).ok.iter().map(|x| x.1.clone()).collect();
                    (h == want).then_some(())
                }
            })
            .await;
        }
        let h = lock(&hooks);
        assert_eq!(h.bad_signatures, 0);
        assert_eq!(h.ok.len(), 40, "each event once");
        assert!(h.batches >= 1, "no POST carried a batch: {} posts", h.posts);
        assert!(h.posts < 40, "{} POSTs for 40 events", h.posts);
        // batching is off by default: the CloudEvents SDKs parse single events
        let s = lock(&singles);
        assert_eq!((s.batches, s.posts, s.ok.len()), (0, 40, 40));
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn grpc_pushes_that_queue_go_together_in_deliver_batch_and_old_subscribers_get_deliver() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-grpc-batch");
    let node = start_node(&dir, &[]);
    runtime().block_on(async {
        let url = node.url();
        let fast_retry = fast_retry();
        // slow (each call takes 200 ms): what matches meanwhile waits for the next call
        let slow = Subscriber {
            delay: Duration::from_millis(200),
            ..Subscriber::default()
        };
        // written before DeliverBatch existed: answers UNIMPLEMENTED
        let old = Subscriber {
            delay: Duration::from_millis(20),
            no_batch: true,
            ..Subscriber::default()
        };
        // rejects every fourth delivery of a batch: those are retried on their own schedule
        let picky = Subscriber {
            delay: Duration::from_millis(50),
            drop_every: 4,
            ..Subscriber::default()
        };
        for sub in [&slow, &old, &picky] {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            create(
                &url,
                Sub {
                    filter: "temp >= 0",
                    target: v1::target::Kind::Grpc(format!(
                        "http://{}",
                        l.local_addr().expect("addr")
                    )),
                    qos: v1::Qos::AtLeastOnce,
                    retry: fast_retry,
                    secret: "",
                },
            )
            .await;
            tokio::spawn(serve_subscriber(sub.clone(), l));
        }
        wait_published(&url, 3).await;
        let temps: Vec<i64> = (0..40).collect();
        let ids = put_temps(&url, &temps, 0).await;
        let want: BTreeSet<String> = ids.iter().cloned().collect();
        slow.wait_shown("every delivery to the slow subscriber", &want)
            .await;
        old.wait_shown("every delivery to the subscriber without batches", &want)
            .await;
        picky
            .wait_shown("every delivery to the subscriber that rejects some", &want)
            .await;
        let s = lock(&slow.state);
        assert!(
            s.batch_calls >= 1 && s.batched > s.batch_calls,
            "no call carried several deliveries: {} calls, {} deliveries",
            s.batch_calls,
            s.batched
        );
        assert!(
            s.batch_calls < 40,
            "{} calls for 40 deliveries",
            s.batch_calls
        );
        assert_eq!(s.shown.len(), 40, "each delivery once");
        assert_eq!(lock(&old.state).batch_calls, 0);
        let p = lock(&picky.state);
        assert!(
            p.calls > 40,
            "rejections were retried: {} deliveries",
            p.calls
        );
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn webhook_grpc_push_and_stream_deliver_every_match() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-kinds");
    let node = start_node(&dir, &[]);
    runtime().block_on(async {
        let url = node.url();
        let (hook_url, hooks) = start_webhook("s3cret", Duration::ZERO).await;
        let gl = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let grpc_url = format!("http://{}", gl.local_addr().expect("addr"));
        let sub = Subscriber::default();
        tokio::spawn(serve_subscriber(sub.clone(), gl));

        create(
            &url,
            Sub {
                filter: "temp > 10",
                target: v1::target::Kind::Webhook(hook_url),
                qos: v1::Qos::AtLeastOnce,
                retry: None,
                secret: "s3cret",
            },
        )
        .await;
        create(
            &url,
            Sub {
                filter: "temp > 20",
                target: v1::target::Kind::Grpc(grpc_url),
                qos: v1::Qos::AtLeastOnce,
                retry: None,
                secret: "",
            },
        )
        .await;
        create(
            &url,
            Sub {
                filter: "temp < 15",
                target: v1::target::Kind::Stream("alerts".into()),
                qos: v1::Qos::AtLeastOnce,
                retry: None,
                secret: "",
            },
        )
        .await;
        wait_published(&url, 3).await;

        // the stream subscriber attaches and acks everything it gets
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tx.send(v1::StreamClientMessage {
            kind: Some(v1::stream_client_message::Kind::Attach("alerts".into())),
        })
        .await
        .expect("attach");
        let mut down = v1::stream_client::StreamClient::new(channel(&url))
            .open(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("open stream")
            .into_inner();
        let streamed = Arc::new(Mutex::new(Vec::new()));
        let s2 = streamed.clone();
        tokio::spawn(async move {
            while let Ok(Some(d)) = down.message().await {
                lock(&s2).push(key(&d));
                let _ = tx
                    .send(v1::StreamClientMessage {
                        kind: Some(v1::stream_client_message::Kind::Ack(d.delivery_id)),
                    })
                    .await;
            }
        });

        let temps: Vec<i64> = (0..30).collect();
        let ids = put_temps(&url, &temps, 0).await;
        let want_hook = expected(&ids, &temps, |t| t > 10);
        let want_grpc = expected(&ids, &temps, |t| t > 20);
        let want_stream = expected(&ids, &temps, |t| t < 15);
        wait_for("every push", Duration::from_secs(60), || {
            let hooks = hooks.clone();
            let sub = sub.clone();
            let streamed = streamed.clone();
            let (wh, wg, ws) = (want_hook.clone(), want_grpc.clone(), want_stream.clone());
            async move {
                let h: BTreeSet<String> = lock(&hooks).ok.iter().map(|x| x.1.clone()).collect();
                let g: BTreeSet<String> =
                    lock(&sub.state).shown.iter().map(|x| x.0.clone()).collect();
                let s: BTreeSet<String> = lock(&streamed).iter().cloned().collect();
                (h == wh && g == wg && s == ws).then_some(())
            }
        })
        .await;
        assert_eq!(lock(&hooks).bad_signatures, 0);
        let total = (want_hook.len() + want_grpc.len() + want_stream.len()) as u64;
        let u = url.clone();
        let st = wait_for("every ack recorded", Duration::from_secs(30), || {
            let u = u.clone();
            async move {
                let s = stats(&u).await.ok()?;
                (s.deliveries_acked == total).then_some(s)
            }
        })
        .await;
        assert_eq!(st.dead_lettered, 0);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn qos1_survives_an_endpoint_outage_and_qos2_never_shows_a_duplicate() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-qos");
    let node = start_node(&dir, &[]);
    runtime().block_on(async {
        let url = node.url();
        // QoS 1 endpoint: its port is known but nothing listens yet
        let down = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let down_addr = down.local_addr().expect("addr");
        drop(down);
        let fast_retry = fast_retry();
        create(
            &url,
            Sub {
                filter: "temp >= 0",
                target: v1::target::Kind::Grpc(format!("http://{down_addr}")),
                qos: v1::Qos::AtLeastOnce,
                retry: fast_retry,
                secret: "",
            },
        )
        .await;
        // QoS 2 endpoint that loses every third ack
        let gl = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let faulty = Subscriber {
            exactly_once: true,
            drop_every: 3,
            ..Subscriber::default()
        };
        create(
            &url,
            Sub {
                filter: "temp >= 0",
                target: v1::target::Kind::Grpc(format!("http://{}", gl.local_addr().expect("a"))),
                qos: v1::Qos::ExactlyOnce,
                retry: fast_retry,
                secret: "",
            },
        )
        .await;
        tokio::spawn(serve_subscriber(faulty.clone(), gl));
        wait_published(&url, 2).await;

        let temps: Vec<i64> = (0..40).collect();
        let ids = put_temps(&url, &temps, 0).await;
        let want: BTreeSet<String> = ids.iter().cloned().collect();

        // QoS 2: everything shown exactly once despite the lost acks
        faulty.wait_shown("every QoS 2 release", &want).await;
        let u = url.clone();
        wait_for("the retries of the outage", Duration::from_secs(30), || {
            let u = u.clone();
            async move { (stats(&u).await.ok()?.delivery_failures >= 40).then_some(()) }
        })
        .await;
        // the endpoint comes back: every QoS 1 delivery arrives, none lost
        let back = TcpListener::bind(down_addr).await.expect("rebind");
        let recovered = Subscriber::default();
        tokio::spawn(serve_subscriber(recovered.clone(), back));
        recovered
            .wait_shown("every QoS 1 delivery after the outage", &want)
            .await;
        let shown = lock(&faulty.state).shown.clone();
        let distinct: HashSet<&String> = shown.iter().map(|x| &x.0).collect();
        assert_eq!(
            distinct.len(),
            shown.len(),
            "a QoS 2 delivery was shown twice"
        );
        assert!(
            lock(&faulty.state).calls > 80,
            "acks were really dropped and retried"
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn qos1_pushes_in_memory_when_the_node_dies_are_delivered_after_the_restart() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-crash");
    let mut node = start_node(&dir, &[]);
    runtime().block_on(async {
        let url = node.url();
        // the subscriber takes the pushes and never answers: they are in flight, unrecorded
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let stuck = Subscriber {
            delay: Duration::from_secs(3600),
            ..Subscriber::default()
        };
        let server = tokio::spawn(serve_subscriber(stuck, l));
        create(
            &url,
            Sub {
                filter: "temp >= 0",
                target: v1::target::Kind::Grpc(format!("http://{addr}")),
                qos: v1::Qos::AtLeastOnce,
                retry: fast_retry(),
                secret: "",
            },
        )
        .await;
        wait_published(&url, 1).await;
        let temps: Vec<i64> = (0..20).collect();
        let ids = put_temps(&url, &temps, 0).await;
        let want: BTreeSet<String> = ids.iter().cloned().collect();
        let u = url.clone();
        wait_for("every push handed off", Duration::from_secs(30), || {
            let u = u.clone();
            async move {
                let s = stats(&u).await.ok()?;
                (s.matches_handed >= 20 && s.deliveries_acked == 0).then_some(())
            }
        })
        .await;
        // the node dies with every push unanswered; the subscriber goes too
        node.kill();
        server.abort();
        let _ = server.await;
        // restarted on the same data, with a subscriber that answers at the same address:
        // the objects were still owed (outbox), so they are matched and pushed again
        node.restart();
        let back = TcpListener::bind(addr).await.expect("rebind");
        let ok = Subscriber::default();
        tokio::spawn(serve_subscriber(ok.clone(), back));
        ok.wait_shown("every object after the restart", &want).await;
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits (up to a minute) until the node's stats satisfy `ok`, and returns them.
async fn wait_stats(
    url: &str,
    what: &str,
    ok: impl Fn(&v1::StatsResponse) -> bool,
) -> v1::StatsResponse {
    let ok = &ok;
    wait_for(what, Duration::from_secs(60), || async move {
        stats(url).await.ok().filter(|s| ok(s))
    })
    .await
}

/// QoS 0 writes no delivery record: a push is made from memory, and its object leaves the
/// outbox once it settles. At most once still holds across a crash: an object whose QoS 0
/// push reached the subscriber but was not acknowledged when the node died is matched again
/// at the restart, and its QoS 0 delivery is dropped (counted), never pushed a second time.
#[test]
fn qos0_pushes_keep_no_record_and_a_crash_mid_push_drops_rather_than_repeats_them() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-qos0");
    let mut node = start_node(&dir, &[]);
    runtime().block_on(async {
        let url = node.url();
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let fine_addr = l.local_addr().expect("addr");
        let fine = Subscriber::default();
        tokio::spawn(serve_subscriber(fine.clone(), l));
        // this one sees each push and never acknowledges it
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let stuck_addr = l.local_addr().expect("addr");
        let stuck = Subscriber {
            stall: Duration::from_secs(3600),
            ..Subscriber::default()
        };
        let server = tokio::spawn(serve_subscriber(stuck.clone(), l));
        for (filter, addr) in [("temp < 100", fine_addr), ("temp >= 100", stuck_addr)] {
            create(
                &url,
                Sub {
                    filter,
                    target: v1::target::Kind::Grpc(format!("http://{addr}")),
                    qos: v1::Qos::AtMostOnce,
                    retry: None,
                    secret: "",
                },
            )
            .await;
        }
        wait_published(&url, 2).await;
        let temps: Vec<i64> = (0..10).collect();
        let want: BTreeSet<String> = put_temps(&url, &temps, 0).await.into_iter().collect();
        fine.wait_shown("the acknowledged QoS 0 pushes", &want)
            .await;
        let s = wait_stats(&url, "the objects to leave the outbox", |s| {
            s.outbox_pending == 0 && s.deliveries_acked >= 10
        })
        .await;
        assert_eq!(s.deliveries, 0, "no delivery record for QoS 0: {s:?}");
        let temps: Vec<i64> = (100..110).collect();
        let want: BTreeSet<String> = put_temps(&url, &temps, 0).await.into_iter().collect();
        stuck
            .wait_shown("the unacknowledged QoS 0 pushes", &want)
            .await;
        // the node dies with those pushes unanswered; the subscriber goes too
        node.kill();
        server.abort();
        let _ = server.await;
        node.restart();
        let back = TcpListener::bind(stuck_addr).await.expect("rebind");
        let after = Subscriber::default();
        tokio::spawn(serve_subscriber(after.clone(), back));
        let s = wait_stats(
            &node.url(),
            "the objects matched again, their QoS 0 dropped",
            |s| s.outbox_pending == 0 && s.qos0_dropped >= 10,
        )
        .await;
        assert_eq!(s.qos0_dropped, 10, "{s:?}");
        assert!(
            after.shown_set().is_empty() && fine.shown_set().len() == 10,
            "no QoS 0 delivery was made twice: after the restart {:?}",
            after.shown_set()
        );
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn max_attempts_dead_letter_then_redrive_delivers() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-dead");
    let node = start_node(&dir, &[]);
    runtime().block_on(async {
        let url = node.url();
        let gone = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = gone.local_addr().expect("addr");
        drop(gone);
        create(
            &url,
            Sub {
                filter: "temp > 0",
                target: v1::target::Kind::Grpc(format!("http://{addr}")),
                qos: v1::Qos::AtLeastOnce,
                retry: Some(v1::RetryPolicy {
                    max_attempts: 3,
                    ttl_ms: 0,
                    initial_backoff_ms: 20,
                    max_backoff_ms: 50,
                }),
                secret: "",
            },
        )
        .await;
        wait_published(&url, 1).await;
        let ids = put_temps(&url, &[5, 6, 7], 0).await;
        let mut admin = v1::admin_client::AdminClient::new(channel(&url));
        let dead = wait_for("three dead letters", Duration::from_secs(30), || {
            let mut a = admin.clone();
            async move {
                let d = a
                    .dead_letters(v1::DeadLettersRequest { limit: 0 })
                    .await
                    .ok()?
                    .into_inner()
                    .dead_letters;
                (d.len() == 3).then_some(d)
            }
        })
        .await;
        assert!(
            dead.iter().all(|d| d.reason.contains("3 attempts")),
            "{dead:?}"
        );
        let back = TcpListener::bind(addr).await.expect("rebind");
        let sub = Subscriber::default();
        tokio::spawn(serve_subscriber(sub.clone(), back));
        let r = admin
            .redrive(v1::RedriveRequest {
                dead_letters: Vec::new(),
                all: true,
            })
            .await
            .expect("redrive")
            .into_inner();
        assert_eq!(r.redriven, 3);
        let want: BTreeSet<String> = ids.into_iter().collect();
        sub.wait_shown("the redriven deliveries", &want).await;
        let left = admin
            .dead_letters(v1::DeadLettersRequest { limit: 0 })
            .await
            .expect("list")
            .into_inner()
            .dead_letters;
        assert!(left.is_empty(), "{left:?}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn priority_7_overtakes_priority_0_when_delivery_is_saturated() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-priority");
    // one call at a time per lane, one delivery per call: 40 priority-0 pushes take 1.2 s
    let node = start_node(
        &dir,
        &["--in-flight-per-endpoint", "1", "--push-batch", "1"],
    );
    runtime().block_on(async {
        let url = node.url();
        let gl = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let slow = Subscriber {
            delay: Duration::from_millis(30),
            ..Subscriber::default()
        };
        create(
            &url,
            Sub {
                filter: "temp >= 0",
                target: v1::target::Kind::Grpc(format!("http://{}", gl.local_addr().expect("a"))),
                qos: v1::Qos::AtLeastOnce,
                retry: None,
                secret: "",
            },
        )
        .await;
        tokio::spawn(serve_subscriber(slow.clone(), gl));
        wait_published(&url, 1).await;
        let low: Vec<i64> = (0..40).collect();
        put_temps(&url, &low, 0).await;
        let high: Vec<i64> = (100..105).collect();
        put_temps(&url, &high, 7).await;
        let seen = Arc::new(AtomicU64::new(0));
        wait_for("every delivery", Duration::from_secs(60), || {
            let s = slow.clone();
            let seen = seen.clone();
            async move {
                let n = lock(&s.state).shown.len();
                seen.store(n as u64, Ordering::Relaxed);
                (n == 45).then_some(())
            }
        })
        .await;
        let order = lock(&slow.state).shown.clone();
        let last_high = order
            .iter()
            .rposition(|x| x.1 == 7)
            .expect("priority 7 delivered");
        let low_after = order[last_high..].iter().filter(|x| x.1 == 0).count();
        assert!(
            low_after >= 20,
            "priority-7 objects put last were delivered before most priority-0 ones put \
             earlier: {low_after} of 40 came after the last priority 7: {order:?}"
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TLS acceptor for an HTTPS receiver with `cert` and `key`.
fn acceptor(cert: &std::path::Path, key: &std::path::Path) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("certs")
        .collect::<Result<_, _>>()
        .expect("cert pem");
    let key = PrivateKeyDer::from_pem_file(key).expect("key pem");
    let cfg = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

/// An authenticated, TLS-only `dissem up` end to end: a put by an `ingest` token reaches the
/// HTTPS webhook (a private CA, certificate and host name verified, the validation handshake
/// answered) of a `subscribe` token's subscription; another tenant sees none of it; an
/// anonymous client is refused and a plain-text client gets nothing.
#[test]
fn a_secured_node_pushes_over_https_to_a_verified_webhook() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-secure");
    let (ca, cert, key) = tests::make_certs(&dir);
    let auth = dir.join("auth.toml");
    let ingest = tests::token_create(&auth, "gw", "acme", "ingest");
    let app = tests::token_create(&auth, "app", "acme", "subscribe");
    let other = tests::token_create(&auth, "other", "globex", "subscribe");
    let ops = tests::token_create(&auth, "ops", "ops", "admin");
    let (s_auth, s_cert, s_key, s_ca) = (
        auth.display().to_string(),
        cert.display().to_string(),
        key.display().to_string(),
        ca.display().to_string(),
    );
    let node = start_node(
        &dir,
        &[
            "--auth-file",
            &s_auth,
            "--tls-cert",
            &s_cert,
            "--tls-key",
            &s_key,
            "--webhook-ca",
            &s_ca,
        ],
    );
    let port = node.addr.rsplit(':').next().expect("port").to_string();
    let url = format!("https://localhost:{port}");
    runtime().block_on(async {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(
                std::fs::read(&ca).expect("ca"),
            ))
            .domain_name("localhost");
        let ch = tonic::transport::Channel::from_shared(url.clone())
            .expect("url")
            .tls_config(tls)
            .expect("tls")
            .connect()
            .await
            .expect("TLS connect");

        // a plain-text client gets nothing from the TLS port
        let plain = v1::admin_client::AdminClient::new(channel(&node.url()))
            .stats(bearer(v1::StatsRequest {}, &ops))
            .await;
        assert!(plain.is_err(), "plain text answered: {plain:?}");
        // anonymous over TLS is refused
        let e = v1::admin_client::AdminClient::new(ch.clone())
            .stats(v1::StatsRequest {})
            .await
            .expect_err("anonymous");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);

        // the HTTPS receiver, with a certificate of the private CA
        let hooks = Arc::new(Mutex::new(Hooks::default()));
        let wl = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let hook_url = format!(
            "https://localhost:{}/hook",
            wl.local_addr().expect("addr").port()
        );
        tokio::spawn(serve_webhook(
            wl,
            "s3cr3t",
            hooks.clone(),
            Duration::ZERO,
            Some(acceptor(&cert, &key)),
        ));
        let mut subs = v1::subscriptions_client::SubscriptionsClient::new(ch.clone());
        let sub = subs
            .create(bearer(
                v1::CreateSubscriptionRequest {
                    subscription: Some(v1::Subscription {
                        filter: Some(v1::subscription::Filter::Text("temp > 30".into())),
                        target: Some(v1::Target {
                            kind: Some(v1::target::Kind::Webhook(hook_url)),
                        }),
                        qos: v1::Qos::AtLeastOnce as i32,
                        webhook_secret: "s3cr3t".into(),
                        ..Default::default()
                    }),
                },
                &app,
            ))
            .await
            .expect("create")
            .into_inner();
        let seen = subs
            .list(bearer(v1::ListSubscriptionsRequest::default(), &other))
            .await
            .expect("list")
            .into_inner();
        assert!(seen.subscriptions.is_empty(), "another tenant sees nothing");
        wait_image(ch.clone(), &ops, 1).await;
        let put = v1::ingest_client::IngestClient::new(ch.clone())
            .put(bearer(temp_put(31), &ingest))
            .await
            .expect("put")
            .into_inner();
        let id = put.id.expect("id");
        let subject = format!("{}:{}", id.node, id.seq);
        wait_for("the HTTPS push", Duration::from_secs(30), || {
            let hooks = hooks.clone();
            let subject = subject.clone();
            async move {
                lock(&hooks)
                    .ok
                    .iter()
                    .any(|(_, s)| *s == subject)
                    .then_some(())
            }
        })
        .await;
        let h = lock(&hooks);
        assert_eq!(h.bad_signatures, 0);
        assert!(h.validations >= 1, "the webhook was asked to consent first");
        drop(h);
        assert!(sub.id > 0);
    });
    // the CLI reaches the TLS node with --tls-ca and a token
    let out = std::process::Command::new(dissem_bin())
        .args(["subscriptions", "--node-url", &url, "--tls-ca"])
        .arg(&ca)
        .env("DISSEM_TOKEN", &app)
        .output()
        .expect("dissem subscriptions");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("temp > 30"));
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A webhook that answers with a redirect is not followed: the redirect target never gets
/// the event and the delivery fails with the status.
#[test]
fn webhook_redirects_are_not_followed() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-redirect");
    let node = start_node(&dir, &["--skip-webhook-validation"]);
    runtime().block_on(async {
        let url = node.url();
        let (target_url, target) = start_webhook("", Duration::ZERO).await;
        let hook = serve_answers(move |_| {
            hyper::Response::builder()
                .status(307)
                .header("location", target_url.clone())
                .body(http_body_util::Full::new(hyper::body::Bytes::new()))
                .unwrap_or_default()
        })
        .await;
        create(
            &url,
            Sub {
                filter: "temp > 0",
                target: v1::target::Kind::Webhook(hook),
                qos: v1::Qos::AtLeastOnce,
                retry: Some(v1::RetryPolicy {
                    max_attempts: 1,
                    ..Default::default()
                }),
                secret: "",
            },
        )
        .await;
        wait_published(&url, 1).await;
        put_temps(&url, &[5], 0).await;
        let dead = first_dead_letters(&url).await;
        assert!(dead[0].reason.contains("307"), "{:?}", dead[0].reason);
        assert_eq!(lock(&target).posts, 0, "the redirect was not followed");
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A multi-process cluster locked down: the coordinator and the node speak only TLS and
/// demand client certificates of the cluster's CA (mutual TLS), carry the cluster secret, and
/// authenticate callers with one auth file. A subscription made through the node (its proxy
/// forwards the caller's token) receives a put made through the node; a client without a
/// certificate gets nowhere.
#[test]
fn a_mutual_tls_cluster_with_tokens_delivers_end_to_end() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-mtls");
    let (ca, cert, key) = tests::make_certs(&dir);
    let auth = dir.join("auth.toml");
    let ingest = tests::token_create(&auth, "gw", "acme", "ingest");
    let app = tests::token_create(&auth, "app", "acme", "subscribe");
    let ops = tests::token_create(&auth, "ops", "ops", "admin");
    let s = |p: &std::path::Path| p.display().to_string();
    let secured = |extra: &[String]| {
        let mut a: Vec<String> = [
            "--listen",
            "127.0.0.1:0",
            "--auth-file",
            &s(&auth),
            "--tls-cert",
            &s(&cert),
            "--tls-key",
            &s(&key),
            "--tls-client-ca",
            &s(&ca),
            "--tls-ca",
            &s(&ca),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        a.extend(extra.iter().cloned());
        a
    };
    let mut cargs = vec!["coordinator".to_string()];
    cargs.extend(secured(&["--data".into(), s(&dir.join("coordinator"))]));
    let coordinator = Proc::start(&dissem_bin(), &cargs);
    let cport = coordinator
        .addr
        .rsplit(':')
        .next()
        .expect("port")
        .to_string();
    let mut nargs = vec!["node".to_string()];
    nargs.extend(secured(&[
        "--data".into(),
        s(&dir.join("node1")),
        "--node".into(),
        "1".into(),
        "--gpu".into(),
        "off".into(),
        "--coordinator".into(),
        format!("https://localhost:{cport}"),
        "--cluster-secret-file".into(),
        s(&dir.join("coordinator").join("cluster.secret")),
    ]));
    let node = Proc::start(&dissem_bin(), &nargs);
    let nport = node.addr.rsplit(':').next().expect("port").to_string();
    runtime().block_on(async {
        let pem = |p: &std::path::Path| std::fs::read(p).expect("pem");
        let connect = |port: String, with_cert: bool| {
            let mut tls = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(pem(&ca)))
                .domain_name("localhost");
            if with_cert {
                tls = tls.identity(tonic::transport::Identity::from_pem(pem(&cert), pem(&key)));
            }
            async move {
                tonic::transport::Channel::from_shared(format!("https://localhost:{port}"))
                    .expect("url")
                    .tls_config(tls)
                    .expect("tls")
                    .connect()
                    .await
            }
        };
        // no client certificate: the handshake fails, or the first call does
        if let Ok(ch) = connect(nport.clone(), false).await {
            let r = v1::admin_client::AdminClient::new(ch)
                .stats(bearer(v1::StatsRequest {}, &ops))
                .await;
            assert!(
                r.is_err(),
                "a client without a certificate was served: {r:?}"
            );
        }
        let node_ch = connect(nport.clone(), true)
            .await
            .expect("mTLS to the node");
        let coord_ch = connect(cport.clone(), true)
            .await
            .expect("mTLS to the coordinator");
        // the node registered over mutual TLS with the secret
        wait_for(
            "the node's workers at the coordinator",
            Duration::from_secs(30),
            || {
                let ch = coord_ch.clone();
                let ops = ops.clone();
                async move {
                    let w = v1::admin_client::AdminClient::new(ch)
                        .workers(bearer(v1::WorkersRequest {}, &ops))
                        .await
                        .ok()?
                        .into_inner();
                    (!w.workers.is_empty()).then_some(())
                }
            },
        )
        .await;
        let sub = v1::subscriptions_client::SubscriptionsClient::new(node_ch.clone())
            .create(bearer(
                v1::CreateSubscriptionRequest {
                    subscription: Some(v1::Subscription {
                        filter: Some(v1::subscription::Filter::Text("temp > 30".into())),
                        target: Some(v1::Target {
                            kind: Some(v1::target::Kind::Stream("alerts".into())),
                        }),
                        qos: v1::Qos::AtMostOnce as i32,
                        ..Default::default()
                    }),
                },
                &app,
            ))
            .await
            .expect("create through the node's proxy")
            .into_inner();
        assert_eq!(sub.tenant, "acme", "the proxy forwarded the caller's token");
        wait_image(coord_ch.clone(), &ops, 1).await;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(v1::StreamClientMessage {
            kind: Some(v1::stream_client_message::Kind::Attach("alerts".into())),
        })
        .await
        .expect("attach");
        let mut down = v1::stream_client::StreamClient::new(node_ch.clone())
            .open(bearer(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                &app,
            ))
            .await
            .expect("open")
            .into_inner();
        // the node's image may lag the coordinator's: put until one is delivered
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let got = loop {
            assert!(
                std::time::Instant::now() < deadline,
                "no delivery over the locked-down cluster in 60 s"
            );
            v1::ingest_client::IngestClient::new(node_ch.clone())
                .put(bearer(temp_put(31), &ingest))
                .await
                .expect("put through the node");
            if let Ok(Ok(Some(d))) =
                tokio::time::timeout(Duration::from_secs(2), down.message()).await
            {
                break d;
            }
        };
        assert_eq!(got.subscription_id, sub.id);
        drop(tx);
    });
    drop(node);
    drop(coordinator);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A webhook that does not consent to the validation handshake is never sent an event: its
/// deliveries are dead-lettered with the reason.
#[test]
fn a_webhook_that_does_not_consent_gets_no_events() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-consent");
    let node = start_node(&dir, &[]);
    runtime().block_on(async {
        let url = node.url();
        let posts = Arc::new(AtomicU64::new(0));
        let p = posts.clone();
        // no WebHook-Allowed-Origin: this receiver never consents
        let hook = serve_answers(move |req| {
            let status = if req.method() == hyper::Method::OPTIONS {
                405
            } else {
                p.fetch_add(1, Ordering::SeqCst);
                200
            };
            hyper::Response::builder()
                .status(status)
                .body(http_body_util::Full::new(hyper::body::Bytes::new()))
                .unwrap_or_default()
        })
        .await;
        create(
            &url,
            Sub {
                filter: "temp > 0",
                target: v1::target::Kind::Webhook(hook),
                qos: v1::Qos::AtLeastOnce,
                retry: Some(v1::RetryPolicy {
                    max_attempts: 2,
                    ttl_ms: 0,
                    initial_backoff_ms: 20,
                    max_backoff_ms: 50,
                }),
                secret: "",
            },
        )
        .await;
        wait_published(&url, 1).await;
        put_temps(&url, &[5], 0).await;
        let dead = first_dead_letters(&url).await;
        assert!(
            dead[0].reason.contains("webhook validation"),
            "{:?}",
            dead[0].reason
        );
        assert_eq!(posts.load(Ordering::SeqCst), 0, "no event was POSTed");
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A webhook receiver on loopback answering every request with `answer(request)`; its URL.
async fn serve_answers(
    answer: impl Fn(
        &hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>>
    + Clone
    + Send
    + Sync
    + 'static,
) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let hook = format!("http://{}/hook", l.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = l.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let resp = answer(&req);
                        async move { Ok::<_, hyper::Error>(resp) }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    hook
}

/// The node's dead letters, once there is at least one.
async fn first_dead_letters(url: &str) -> Vec<v1::DeadLetter> {
    wait_for("the dead letter", Duration::from_secs(30), || {
        let u = url.to_string();
        async move {
            let d = v1::admin_client::AdminClient::new(channel(&u))
                .dead_letters(v1::DeadLettersRequest { limit: 0 })
                .await
                .ok()?
                .into_inner()
                .dead_letters;
            (!d.is_empty()).then_some(d)
        }
    })
    .await
}

/// What a webhook answers decides what happens next: a 4xx other than 408/429 is
/// dead-lettered at once with the status; a 429's `Retry-After` delays the retry; every
/// request carries a User-Agent and the subscription's own headers.
#[test]
fn webhook_answers_are_honoured_and_requests_carry_agent_and_headers() {
    let _serial = lock(&SERIAL);
    let dir = temp_dir("delivery-answers");
    let node = start_node(&dir, &["--skip-webhook-validation"]);
    runtime().block_on(async {
        let url = node.url();
        // (path, when, user-agent, x-team, traceparent) of every POST
        type Seen = Vec<(String, Instant, String, String, String)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let s2 = seen.clone();
        let hook = serve_answers(move |req| {
            let header = |n: &str| {
                req.headers()
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string()
            };
            let path = req.uri().path().to_string();
            let mut seen = lock(&s2);
            let earlier = seen.iter().filter(|x| x.0 == path).count();
            seen.push((
                path.clone(),
                Instant::now(),
                header("user-agent"),
                header("x-team"),
                header("traceparent"),
            ));
            let (status, retry_after) = match path.as_str() {
                "/gone" => (410, None),
                "/throttle" if earlier == 0 => (429, Some("1")),
                _ => (200, None),
            };
            let mut b = hyper::Response::builder().status(status);
            if let Some(r) = retry_after {
                b = b.header("retry-after", r);
            }
            b.body(http_body_util::Full::new(hyper::body::Bytes::new()))
                .unwrap_or_default()
        })
        .await;
        let base = hook.trim_end_matches("/hook").to_string();
        for (path, team) in [("/gone", ""), ("/throttle", "blue")] {
            let mut headers = std::collections::HashMap::new();
            if !team.is_empty() {
                headers.insert("X-Team".to_string(), team.to_string());
            }
            v1::subscriptions_client::SubscriptionsClient::new(channel(&url))
                .create(v1::CreateSubscriptionRequest {
                    subscription: Some(v1::Subscription {
                        filter: Some(v1::subscription::Filter::Text("temp > 0".into())),
                        target: Some(v1::Target {
                            kind: Some(v1::target::Kind::Webhook(format!("{base}{path}"))),
                        }),
                        retry: fast_retry(),
                        webhook_headers: headers,
                        ..Default::default()
                    }),
                })
                .await
                .expect("create");
        }
        // the put's W3C trace context travels as the POST's traceparent header too
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut put = temp_put(5);
        put.metadata.push(v1::Attribute {
            name: "traceparent".into(),
            value: Some(v1::Value {
                kind: Some(v1::value::Kind::Text(tp.into())),
            }),
        });
        v1::ingest_client::IngestClient::new(channel(&url))
            .put(put)
            .await
            .expect("put");
        let dead = first_dead_letters(&url).await;
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert!(dead[0].reason.contains("410"), "{:?}", dead[0].reason);
        let s3 = seen.clone();
        wait_for("the throttled event", Duration::from_secs(30), || {
            let seen = s3.clone();
            async move { (lock(&seen).iter().filter(|x| x.0 == "/throttle").count() == 2).then_some(()) }
        })
        .await;
        let seen = lock(&seen).clone();
        let gone: Vec<_> = seen.iter().filter(|x| x.0 == "/gone").collect();
        assert_eq!(gone.len(), 1, "a 410 is not retried");
        let thr: Vec<_> = seen.iter().filter(|x| x.0 == "/throttle").collect();
        let gap = thr[1].1 - thr[0].1;
        assert!(gap >= Duration::from_millis(950), "retried {gap:?} after a Retry-After of 1 s");
        for s in &seen {
            assert!(s.2.starts_with("dissem/"), "user agent {:?}", s.2);
            assert_eq!(s.4, tp, "the traceparent header of {}", s.0);
        }
        assert_eq!((thr[0].3.as_str(), gone[0].3.as_str()), ("blue", ""));
        // the headers are write-only, like the secret
        let listed = v1::subscriptions_client::SubscriptionsClient::new(channel(&url))
            .list(v1::ListSubscriptionsRequest { after_id: 0, limit: 10 })
            .await
            .expect("list")
            .into_inner();
        assert!(listed.subscriptions.iter().all(|s| s.webhook_headers.is_empty()));
    });
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
