//! `dissem demo`: the whole system on one machine. It starts an embedded cluster (`dissem up`
//! in a temporary directory) and local subscriber endpoints of every kind (a gRPC
//! `Subscriber` for QoS 1 and one for QoS 2, a webhook receiver that checks signatures, a
//! stream client for QoS 0), registers an `iot` subscription set spread over them, puts
//! objects at a target rate with mixed priorities, and reports what happened: put, matched,
//! delivered by QoS, dead-lettered, lost (must be 0), duplicates (QoS 2 must be 0), and
//! put -> delivered latency overall and per priority.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use blocks::{MatchIndex, ShardConfig};
use http_body_util::BodyExt;
use proto::v1;
use serde::Serialize;
use storage::ObjectId;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use crate::procs::{self, Proc};
use crate::progress::Progress;
use crate::workload::{IotSpec, Workload};

/// Options of the demo.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub bin: PathBuf,
    pub subs: usize,
    pub objects: usize,
    /// Objects put per second.
    pub rate: f64,
    pub seed: u64,
}

/// Latency figures, ms.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Latency {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// What the demo saw.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub subscriptions: usize,
    pub put: usize,
    pub put_seconds: f64,
    /// (object, subscription) pairs the subscriptions match (in-process engine).
    pub matched: usize,
    /// Distinct pairs delivered, per QoS level.
    pub delivered_by_qos: BTreeMap<u8, usize>,
    pub dead_lettered: u64,
    /// Matched pairs never delivered (nor dead-lettered).
    pub lost: usize,
    /// Pairs the subscriber's application saw more than once, per QoS level.
    pub duplicates_by_qos: BTreeMap<u8, usize>,
    pub bad_webhook_signatures: u64,
    pub latency: Latency,
    pub latency_by_priority: BTreeMap<u8, Latency>,
}

#[derive(Default)]
pub(crate) struct Seen {
    /// (subscription, "node:seq") -> (times shown, first time).
    pub(crate) pairs: HashMap<(u64, ObjectId), (u32, Instant)>,
    pub(crate) bad_signatures: u64,
}

pub(crate) type Shared = Arc<Mutex<Seen>>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn show(seen: &Shared, sub: u64, obj: ObjectId) {
    show_all(seen, [(sub, obj)]);
}

/// Records deliveries the subscriber's application saw, under one lock.
fn show_all(seen: &Shared, shown: impl IntoIterator<Item = (u64, ObjectId)>) {
    let now = Instant::now();
    let mut s = lock(seen);
    for key in shown {
        s.pairs.entry(key).or_insert((0, now)).0 += 1;
    }
}

/// What the webhook subscriber reads of a CloudEvent (the rest is skipped unparsed).
#[derive(serde::Deserialize)]
struct EventFields<'a> {
    #[serde(borrow)]
    subject: std::borrow::Cow<'a, str>,
    data: EventData,
}

#[derive(serde::Deserialize)]
struct EventData {
    #[serde(default)]
    subscription: u64,
}

/// The (subscription, object) pairs of a webhook body: one event (structured mode) or a
/// JSON array (batched mode); `None` if it is not that.
fn webhook_events(body: &[u8]) -> Option<Vec<(u64, ObjectId)>> {
    let events: Vec<EventFields<'_>> = if body.first() == Some(&b'[') {
        serde_json::from_slice(body).ok()?
    } else {
        vec![serde_json::from_slice(body).ok()?]
    };
    events
        .iter()
        .map(|e| Some((e.data.subscription, parse_subject(&e.subject)?)))
        .collect()
}

fn obj_key(d: &v1::Delivery) -> ObjectId {
    let o = d.object_id.unwrap_or_default();
    ObjectId {
        node: o.node,
        seq: o.seq,
    }
}

/// Parses a CloudEvent subject, "node:seq".
fn parse_subject(s: &str) -> Option<ObjectId> {
    let (node, seq) = s.split_once(':')?;
    Some(ObjectId {
        node: node.parse().ok()?,
        seq: seq.parse().ok()?,
    })
}

#[derive(Clone)]
struct GrpcSubscriber {
    seen: Shared,
    exactly_once: bool,
    received: Arc<Mutex<HashMap<String, (u64, ObjectId)>>>,
}

#[tonic::async_trait]
impl v1::subscriber_server::Subscriber for GrpcSubscriber {
    async fn deliver(
        &self,
        request: Request<v1::Delivery>,
    ) -> Result<Response<v1::DeliverAck>, Status> {
        let d = request.into_inner();
        if self.exactly_once {
            lock(&self.received)
                .entry(d.delivery_id.clone())
                .or_insert((d.subscription_id, obj_key(&d)));
        } else {
            show(&self.seen, d.subscription_id, obj_key(&d));
        }
        Ok(Response::new(v1::DeliverAck {}))
    }

    async fn deliver_batch(
        &self,
        request: Request<v1::DeliveryBatch>,
    ) -> Result<Response<v1::DeliverBatchAck>, Status> {
        let ds = request.into_inner().deliveries;
        show_all(
            &self.seen,
            ds.iter().map(|d| (d.subscription_id, obj_key(d))),
        );
        Ok(Response::new(v1::DeliverBatchAck::default()))
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseAck>, Status> {
        let id = request.into_inner().delivery_id;
        if let Some((sub, obj)) = lock(&self.received).remove(&id) {
            show(&self.seen, sub, obj);
        }
        Ok(Response::new(v1::ReleaseAck {}))
    }
}

pub(crate) async fn grpc_endpoint(seen: Shared, exactly_once: bool) -> anyhow::Result<String> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", l.local_addr()?);
    let svc = GrpcSubscriber {
        seen,
        exactly_once,
        received: Arc::default(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::subscriber_server::SubscriberServer::new(svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
    );
    Ok(url)
}

pub(crate) const SECRET: &str = "demo-secret";

pub(crate) async fn webhook_endpoint(seen: Shared) -> anyhow::Result<String> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", l.local_addr()?);
    tokio::spawn(async move {
        while let Ok((stream, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            if let Some(r) = worker::push_http::consent_response(&req) {
                                return Ok::<_, std::convert::Infallible>(r);
                            }
                            let header = |n: &str| {
                                req.headers()
                                    .get(n)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or("")
                                    .to_string()
                            };
                            let (ts, sig) = (
                                header(worker::deliver::TIMESTAMP_HEADER),
                                header(worker::deliver::SIGNATURE_HEADER),
                            );
                            let body = match req.into_body().collect().await {
                                Ok(b) => b.to_bytes(),
                                Err(_) => hyper::body::Bytes::new(),
                            };
                            let ok = ts
                                .parse::<u64>()
                                .is_ok_and(|t| sig == worker::deliver::sign(SECRET, t, &body));
                            let status = match webhook_events(&body) {
                                Some(shown) if ok && !shown.is_empty() => {
                                    show_all(&seen, shown);
                                    hyper::StatusCode::OK
                                }
                                _ => {
                                    lock(&seen).bad_signatures += 1;
                                    hyper::StatusCode::UNAUTHORIZED
                                }
                            };
                            let mut resp = hyper::Response::new(http_body_util::Full::new(
                                hyper::body::Bytes::new(),
                            ));
                            *resp.status_mut() = status;
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(url)
}

pub(crate) async fn stream_endpoint(node: &str, name: &str, seen: Shared) -> anyhow::Result<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    tx.send(v1::StreamClientMessage {
        kind: Some(v1::stream_client_message::Kind::Attach(name.into())),
    })
    .await?;
    let mut down = v1::stream_client::StreamClient::new(procs::channel(node))
        .open(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    tokio::spawn(async move {
        while let Ok(Some(d)) = down.message().await {
            show(&seen, d.subscription_id, obj_key(&d));
            let _ = tx
                .send(v1::StreamClientMessage {
                    kind: Some(v1::stream_client_message::Kind::Ack(d.delivery_id)),
                })
                .await;
        }
    });
    Ok(())
}

pub(crate) fn latency(mut v: Vec<f64>) -> Latency {
    if v.is_empty() {
        return Latency::default();
    }
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    Latency {
        count: v.len(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: v[v.len() - 1],
    }
}

/// Which endpoints the subscriptions are spread over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Targets {
    /// gRPC QoS 1, gRPC QoS 2, webhook QoS 1, stream QoS 0 in turn.
    AllKinds,
    /// gRPC QoS 1 and webhook QoS 1 in turn (the end-to-end benchmark).
    GrpcAndWebhook,
}

/// A running embedded cluster with subscriber endpoints and registered subscriptions.
pub struct Setup {
    // the child process lives as long as the setup
    node: Proc,
    url: String,
    seen: Shared,
    qos_of: HashMap<u64, u8>,
    index: MatchIndex,
    workload: Workload,
    /// Priority-7 puts carry a sampled W3C `traceparent` (the node exports their spans).
    trace_urgent: bool,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup").field("url", &self.url).finish()
    }
}

/// One phase of puts.
#[derive(Debug, Clone, Copy)]
pub struct PhaseSpec {
    /// Workload seed of the events (phases use different ones: no object repeats).
    pub seed: u64,
    pub objects: usize,
    /// Objects per second; `None`: as fast as `writers` concurrent writers go.
    pub rate: Option<f64>,
    pub writers: usize,
    /// Stop waiting for deliveries once none arrived for this long.
    pub patience: Duration,
}

/// What one phase of puts saw.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub put: usize,
    pub put_seconds: f64,
    /// From the first put until the last expected delivery arrived (or gave up waiting).
    pub delivered_seconds: f64,
    pub matched: usize,
    pub delivered_by_qos: BTreeMap<u8, usize>,
    pub lost: usize,
    pub duplicates_by_qos: BTreeMap<u8, usize>,
    pub latency: Latency,
    pub latency_by_priority: BTreeMap<u8, Latency>,
    /// The puts alone (request to durable acknowledgement): the ingest part of `latency`.
    pub put_latency: Latency,
    /// The puts alone, per priority.
    pub put_latency_by_priority: BTreeMap<u8, Latency>,
}

/// Waits until the node's published image holds `n` subscriptions and the node has loaded
/// it: a node compiles the published image ahead of the first put (as it does once
/// subscriptions are in place), so the first matches do not wait for it.
pub(crate) async fn wait_image(url: &str, n: u64) -> anyhow::Result<()> {
    procs::try_wait_for(Duration::from_secs(120), || {
        let u = url.to_string();
        async move { (procs::stats(&u).await.ok()?.cluster?.image_subscriptions == n).then_some(()) }
    })
    .await
    .context("the subscriptions were not published in time")?;
    procs::try_wait_for(Duration::from_secs(120), || {
        let u = url.to_string();
        async move {
            let s = procs::stats(&u).await.ok()?;
            (s.image_loaded >= s.cluster?.image_version).then_some(())
        }
    })
    .await
    .context("the node did not load the published image in time")
}

/// Starts `dissem up` in `dir`, the endpoints, and registers `subs` iot subscriptions.
/// With `otlp_endpoint`, the node exports spans there and priority-7 puts are traced.
pub async fn setup(
    bin: &std::path::Path,
    dir: &std::path::Path,
    subs: usize,
    seed: u64,
    targets: Targets,
    otlp_endpoint: Option<&str>,
    progress: &Progress,
) -> anyhow::Result<Setup> {
    let mut args: Vec<String> = vec![
        "up".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--allow-private-targets".into(),
        "--data".into(),
        dir.join("data").display().to_string(),
    ];
    if let Some(e) = otlp_endpoint {
        args.extend(["--otlp-endpoint".into(), e.to_string()]);
    }
    let node = Proc::start(bin, &args);
    let url = node.url();
    progress.line(&format!(
        "embedded cluster on {url} (data in {})",
        dir.display()
    ));
    let seen: Shared = Arc::default();
    let grpc1 = grpc_endpoint(seen.clone(), false).await?;
    let grpc2 = grpc_endpoint(seen.clone(), true).await?;
    let hook = webhook_endpoint(seen.clone()).await?;
    stream_endpoint(&url, "demo", seen.clone()).await?;

    let w = Workload::Iot(IotSpec);
    let list = w.subscriptions(seed, subs, |_| {});
    let bar = progress.bar(list.len() as u64, "registering subscriptions");
    let (created, levels): (Vec<_>, Vec<_>) = list
        .iter()
        .enumerate()
        .map(|(i, (_, dnf))| {
            let (target, qos) = match (targets, i % 4) {
                (Targets::AllKinds, 0) | (Targets::GrpcAndWebhook, 0 | 2) => {
                    (v1::target::Kind::Grpc(grpc1.clone()), v1::Qos::AtLeastOnce)
                }
                (Targets::AllKinds, 1) => {
                    (v1::target::Kind::Grpc(grpc2.clone()), v1::Qos::ExactlyOnce)
                }
                (Targets::AllKinds, 2) | (Targets::GrpcAndWebhook, _) => (
                    v1::target::Kind::Webhook(hook.clone()),
                    v1::Qos::AtLeastOnce,
                ),
                _ => (v1::target::Kind::Stream("demo".into()), v1::Qos::AtMostOnce),
            };
            let s = v1::Subscription {
                filter: Some(v1::subscription::Filter::Text(dnf.to_text())),
                target: Some(v1::Target { kind: Some(target) }),
                qos: qos as i32,
                webhook_secret: SECRET.into(),
                ..v1::Subscription::default()
            };
            (s, runtime::validate::qos_number(qos))
        })
        .unzip();
    let ids: Vec<(u64, u8)> = procs::create_many(&url, created, 4, |n| bar.inc(n))
        .await
        .context("creating a subscription")?
        .into_iter()
        .zip(levels)
        .collect();
    bar.finish();
    wait_image(&url, subs as u64).await?;
    let index = MatchIndex::build(
        ShardConfig::default(),
        ids.iter()
            .map(|i| i.0)
            .zip(list.into_iter().map(|s| s.1))
            .collect(),
    )?;
    Ok(Setup {
        node,
        url,
        seen,
        qos_of: ids.into_iter().collect(),
        index,
        workload: w,
        trace_urgent: otlp_endpoint.is_some(),
    })
}

impl Setup {
    /// The embedded cluster's URL.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The process id of the embedded cluster.
    pub fn node_pid(&self) -> u32 {
        self.node.pid()
    }

    /// The node's admin stats.
    pub async fn stats(&self) -> anyhow::Result<v1::StatsResponse> {
        Ok(procs::stats(&self.url).await?)
    }

    /// Puts the phase's events, priorities 0..=7 in turn, waits for the deliveries, and
    /// measures.
    pub async fn phase(
        &self,
        spec: &PhaseSpec,
        progress: &Progress,
        label: &str,
    ) -> anyhow::Result<Phase> {
        let PhaseSpec {
            seed,
            objects,
            rate,
            writers,
            patience,
        } = *spec;
        let events = self.workload.events(seed, objects);
        let mut ctx = self.index.base().new_ctx();
        let mut expected_subs = Vec::new();
        for chunk in events.chunks(256) {
            let mut out = Vec::new();
            self.index.match_batch(chunk, &mut ctx, &mut out);
            expected_subs.extend(out);
        }
        let bar = progress.bar(events.len() as u64, label);
        let sent: Arc<Mutex<HashMap<ObjectId, (Instant, u8)>>> = Arc::default();
        let put_ms: Arc<Mutex<Vec<(u8, f64)>>> = Arc::default();
        // objects never repeat across phases: new distinct pairs are this phase's; room for
        // them is made now, so the subscribers never stall on growing the map mid-phase
        let before = {
            let mut seen = lock(&self.seen);
            let want: usize = expected_subs.iter().map(Vec::len).sum();
            seen.pairs.reserve(want);
            seen.pairs.len()
        };
        let ingest = v1::ingest_client::IngestClient::new(procs::channel(&self.url));
        let sem = Arc::new(tokio::sync::Semaphore::new(writers.max(1)));
        let t0 = Instant::now();
        let mut puts = tokio::task::JoinSet::new();
        for (i, e) in events.iter().enumerate() {
            if let Some(rate) = rate {
                let due = t0 + Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(due.into()).await;
            }
            let permit = sem.clone().acquire_owned().await?;
            let mut req = procs::put_request(e, String::new());
            req.priority = (i % 8) as u32;
            if self.trace_urgent && req.priority == 7 {
                req.metadata.push(traceparent(seed, i));
            }
            let mut c = ingest.clone();
            let sent = sent.clone();
            let put_ms = put_ms.clone();
            let bar = bar.clone();
            puts.spawn(async move {
                let at = Instant::now();
                let r = c.put(req).await;
                drop(permit);
                lock(&put_ms).push(((i % 8) as u8, at.elapsed().as_secs_f64() * 1000.0));
                let id = r?.into_inner().id.unwrap_or_default();
                let k = ObjectId {
                    node: id.node,
                    seq: id.seq,
                };
                lock(&sent).insert(k, (at, (i % 8) as u8));
                bar.inc(1);
                Ok::<_, Status>((i, k))
            });
        }
        let mut obj_of = vec![ObjectId { node: 0, seq: 0 }; events.len()];
        while let Some(r) = puts.join_next().await {
            let (i, k) = r?.context("put")?;
            obj_of[i] = k;
        }
        let put_seconds = t0.elapsed().as_secs_f64();
        bar.finish();
        let expected: Vec<(u64, ObjectId)> = obj_of
            .iter()
            .zip(&expected_subs)
            .flat_map(|(o, subs)| subs.iter().map(move |s| (*s, *o)))
            .collect();
        let mut last = (usize::MAX, Instant::now());
        let mut done_at = Instant::now();
        loop {
            let got = lock(&self.seen).pairs.len().saturating_sub(before);
            if got >= expected.len() {
                done_at = Instant::now();
                break;
            }
            if got != last.0 {
                last = (got, Instant::now());
                done_at = Instant::now();
            } else if last.1.elapsed() > patience {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let put_ms = std::mem::take(&mut *lock(&put_ms));
        let mut put_by_prio: BTreeMap<u8, Vec<f64>> = BTreeMap::new();
        for &(p, ms) in &put_ms {
            put_by_prio.entry(p).or_default().push(ms);
        }
        let seen = lock(&self.seen);
        let sent = lock(&sent);
        let mut delivered_by_qos = BTreeMap::new();
        let mut duplicates_by_qos = BTreeMap::new();
        let mut all = Vec::new();
        let mut by_prio: BTreeMap<u8, Vec<f64>> = BTreeMap::new();
        let mut lost = 0usize;
        for (sub, obj) in &expected {
            let qos = self.qos_of.get(sub).copied().unwrap_or(0);
            match seen.pairs.get(&(*sub, *obj)) {
                Some((times, first)) => {
                    *delivered_by_qos.entry(qos).or_insert(0) += 1;
                    if *times > 1 {
                        *duplicates_by_qos.entry(qos).or_insert(0) += 1;
                    }
                    if let Some((t, p)) = sent.get(obj) {
                        let ms = first.saturating_duration_since(*t).as_secs_f64() * 1000.0;
                        all.push(ms);
                        by_prio.entry(*p).or_default().push(ms);
                    }
                }
                None => lost += 1,
            }
        }
        Ok(Phase {
            put: events.len(),
            put_seconds,
            delivered_seconds: done_at.saturating_duration_since(t0).as_secs_f64(),
            matched: expected.len(),
            delivered_by_qos,
            lost,
            duplicates_by_qos,
            latency: latency(all),
            latency_by_priority: by_prio.into_iter().map(|(p, v)| (p, latency(v))).collect(),
            put_latency: latency(put_ms.into_iter().map(|(_, ms)| ms).collect()),
            put_latency_by_priority: put_by_prio
                .into_iter()
                .map(|(p, v)| (p, latency(v)))
                .collect(),
        })
    }
}

/// A sampled W3C `traceparent` attribute for put `i` of the phase with `seed`: a trace of
/// its own per object.
fn traceparent(seed: u64, i: usize) -> v1::Attribute {
    v1::Attribute {
        name: "traceparent".into(),
        value: Some(v1::Value {
            kind: Some(v1::value::Kind::Text(format!(
                "00-{seed:016x}{:016x}-{:016x}-01",
                i as u64 + 1,
                (i as u64 + 1) << 8 | 0x5a
            ))),
        }),
    }
}

/// Runs `f` with a fresh temporary directory (removed afterwards) on a new runtime.
pub fn in_temp_dir<T>(
    name: &str,
    f: impl AsyncFnOnce(&std::path::Path) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let dir = std::env::temp_dir().join(format!("dissem-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let rt = tokio::runtime::Runtime::new()?;
    let r = rt.block_on(f(&dir));
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Runs the demo.
pub fn run(opts: &DemoOptions) -> anyhow::Result<DemoReport> {
    if opts.subs == 0 || opts.objects == 0 || opts.rate.is_nan() || opts.rate <= 0.0 {
        bail!("--subs, --objects and --rate must be positive");
    }
    in_temp_dir("demo", async |dir| {
        let progress = Progress::new();
        let s = setup(
            &opts.bin,
            dir,
            opts.subs,
            opts.seed,
            Targets::AllKinds,
            None,
            &progress,
        )
        .await?;
        let spec = PhaseSpec {
            seed: opts.seed,
            objects: opts.objects,
            rate: Some(opts.rate),
            writers: 256,
            patience: Duration::from_secs(15),
        };
        let p = s.phase(&spec, &progress, "putting objects").await?;
        let stats = s.stats().await?;
        let seen = lock(&s.seen);
        Ok(DemoReport {
            subscriptions: opts.subs,
            put: p.put,
            put_seconds: p.put_seconds,
            matched: p.matched,
            delivered_by_qos: p.delivered_by_qos,
            dead_lettered: stats.dead_lettered,
            lost: p.lost.saturating_sub(stats.dead_lettered as usize),
            duplicates_by_qos: p.duplicates_by_qos,
            bad_webhook_signatures: seen.bad_signatures,
            latency: p.latency,
            latency_by_priority: p.latency_by_priority,
        })
    })
}

/// Prints the summary.
pub fn print(r: &DemoReport) {
    println!(
        "demo: {} subscriptions, {} objects put in {:.1} s, {} (object, subscription) matches",
        r.subscriptions, r.put, r.put_seconds, r.matched
    );
    for (q, n) in &r.delivered_by_qos {
        println!("  delivered QoS {q}: {n}");
    }
    println!("  dead-lettered: {}", r.dead_lettered);
    println!("  lost: {}", r.lost);
    for (q, n) in &r.duplicates_by_qos {
        println!("  duplicates QoS {q}: {n}");
    }
    if r.duplicates_by_qos.is_empty() {
        println!("  duplicates: 0");
    }
    println!("  bad webhook signatures: {}", r.bad_webhook_signatures);
    println!(
        "  put -> delivered: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} deliveries)",
        r.latency.p50_ms, r.latency.p99_ms, r.latency.max_ms, r.latency.count
    );
    for (p, l) in &r.latency_by_priority {
        println!(
            "    priority {p}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            l.p50_ms, l.p99_ms, l.max_ms
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhook_subscriber_reads_single_and_batched_cloudevents() {
        let d = |sub: u64, seq: u64| v1::Delivery {
            subscription_id: sub,
            object_id: Some(v1::ObjectId { node: 1, seq }),
            delivery_id: format!("{sub}-1-{seq}"),
            data: b"{\"x\": \"a\\\"b\"}".to_vec(),
            ..v1::Delivery::default()
        };
        let one = worker::deliver::cloudevent(&d(7, 3), 1, 0);
        let id = |seq| ObjectId { node: 1, seq };
        assert_eq!(webhook_events(&one), Some(vec![(7, id(3))]));
        let mut batch = b"[".to_vec();
        batch.extend_from_slice(&one);
        batch.push(b',');
        batch.extend_from_slice(&worker::deliver::cloudevent(&d(8, 4), 1, 0));
        batch.push(b']');
        assert_eq!(webhook_events(&batch), Some(vec![(7, id(3)), (8, id(4))]));
        assert_eq!(webhook_events(b"not json"), None);
        assert_eq!(
            webhook_events(b"[{\"subject\": \"x\", \"data\": {}}]"),
            None
        );
    }
}
