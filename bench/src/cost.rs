//! `dissem bench cost`: what a delivery costs the node, per target kind. For each kind (a
//! batching gRPC subscriber, a webhook with single events, a webhook in CloudEvents' batched
//! mode, a stream client) it starts its own embedded cluster (`dissem up`), registers
//! subscriptions that each object matches exactly once, warms the path up, then puts objects
//! as fast as pipelined `PutStream` writers go and reads the node process's CPU time from
//! `/proc` before and after: node CPU seconds / deliveries, and objects/s from the first put
//! to the last delivery. The writers and subscribers run in this process, on the same cores.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::v1;
use serde::Serialize;
use storage::ObjectId;

use crate::cpu;
use crate::demo::{self, Shared, lock};
use crate::procs::{self, Proc};
use crate::progress::Progress;

/// A kind of target the deliveries go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A gRPC `Subscriber` (QoS 1), deliveries batched in `DeliverBatch` calls.
    GrpcBatch,
    /// A webhook (QoS 1), one CloudEvent per POST (the default).
    Webhook,
    /// A webhook (QoS 1) in CloudEvents' batched mode (`push_batch` 64).
    WebhookBatch,
    /// A stream client (QoS 0) attached to a named stream.
    Stream,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 4] = [
        Kind::GrpcBatch,
        Kind::Webhook,
        Kind::WebhookBatch,
        Kind::Stream,
    ];

    /// The kind's name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Kind::GrpcBatch => "grpc-batch",
            Kind::Webhook => "webhook",
            Kind::WebhookBatch => "webhook-batch",
            Kind::Stream => "stream",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> anyhow::Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .with_context(|| {
                let names: Vec<_> = Kind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "--kinds: unknown target kind {s:?} (one of {})",
                    names.join(", ")
                )
            })
    }
}

/// Options of the cost benchmark.
#[derive(Debug, Clone)]
pub struct CostOptions {
    pub bin: PathBuf,
    pub kinds: Vec<Kind>,
    /// Subscriptions per kind; object `i` matches the `fanout` subscriptions
    /// `(i % (subs / fanout)) * fanout ..` only.
    pub subs: usize,
    /// Subscriptions each object matches (1: the one match per object).
    pub fanout: usize,
    /// Objects of the measured phase (a twentieth of that, at least 100, warm the path up
    /// first).
    pub objects: usize,
    /// Concurrent `PutStream` writers.
    pub writers: usize,
    /// Puts each writer keeps unanswered.
    pub window: usize,
}

/// One kind's figures.
#[derive(Debug, Clone, Serialize)]
pub struct KindRow {
    pub kind: Kind,
    pub objects: usize,
    /// Distinct (subscription, object) pairs delivered (`objects` x fanout when none is lost).
    pub deliveries: usize,
    pub lost: usize,
    /// Pairs shown more than once: allowed for QoS 1 (at least once), never for the QoS 0
    /// stream.
    pub duplicates: usize,
    /// Deliveries to a subscription the object does not match (must be 0).
    pub wrong: usize,
    /// From the first put to the last delivery.
    pub seconds: f64,
    pub objects_per_second: f64,
    /// Seconds from the first put until the last put was acknowledged.
    pub put_seconds: f64,
    /// The node process's CPU seconds (user + system, `/proc/<pid>/stat`) over the phase.
    pub node_cpu_seconds: f64,
    /// `node_cpu_seconds` / deliveries, microseconds (the put, test, match and push of
    /// the objects, shared among their deliveries).
    pub node_cpu_us_per_delivery: f64,
    /// The benchmark process's CPU (writers and subscriber) over the phase, microseconds per
    /// delivery: it shares the machine's cores with the node.
    pub client_cpu_us_per_delivery: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct CostReport {
    pub subscriptions: usize,
    /// Subscriptions each object matches.
    pub fanout: usize,
    pub writers: usize,
    pub window: usize,
    pub cores: usize,
    pub rows: Vec<KindRow>,
    /// No delivery lost or sent to a subscription its object does not match, and none
    /// repeated where the QoS forbids it (the stream's QoS 0).
    pub pass: bool,
    /// The 20,000 objects/s target for one match per object.
    pub target_objects_per_second: f64,
    /// The 5 µs target of node CPU per delivery.
    pub target_node_cpu_us_per_delivery: f64,
}

/// The metadata of object `i` (`cost = i % groups`): it matches the subscriptions of group
/// `i % groups`.
fn put(i: usize, groups: usize) -> v1::PutRequest {
    v1::PutRequest {
        data: format!("object {i}").into_bytes(),
        metadata: vec![v1::Attribute {
            name: "cost".into(),
            value: Some(v1::Value {
                kind: Some(v1::value::Kind::Integer((i % groups) as i64)),
            }),
        }],
        priority: 0,
        message_id: String::new(),
    }
}

type Ingest = v1::ingest_client::IngestClient<tonic::transport::Channel>;

/// Puts objects `range` on one `PutStream`, keeping up to `window` unanswered: each
/// object's index and id (the node answers in order).
async fn writer(
    mut client: Ingest,
    range: std::ops::Range<usize>,
    groups: usize,
    window: usize,
    bar: indicatif::ProgressBar,
) -> anyhow::Result<Vec<(usize, ObjectId)>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<v1::PutRequest>(window.max(1));
    let mut acks = client
        .put_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = range.start;
    let n = range.len();
    let mut out = Vec::with_capacity(n);
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(window.max(1)));
    let sender = {
        let permits = permits.clone();
        tokio::spawn(async move {
            for i in range {
                let Ok(p) = permits.acquire().await else {
                    return;
                };
                p.forget();
                if tx.send(put(i, groups)).await.is_err() {
                    return;
                }
            }
        })
    };
    for k in 0..n {
        match acks.message().await? {
            Some(v1::PutStreamResponse {
                result: Some(v1::put_stream_response::Result::Ok(r)),
            }) => {
                let id = r.id.unwrap_or_default();
                out.push((
                    first + k,
                    ObjectId {
                        node: id.node,
                        seq: id.seq,
                    },
                ));
                permits.add_permits(1);
                bar.inc(1);
            }
            other => {
                sender.abort();
                bail!("the put stream answered {other:?}");
            }
        }
    }
    let _ = sender.await;
    Ok(out)
}

/// Puts objects `range` with `writers` writers: the seconds until the last was
/// acknowledged, and each object's index by id.
async fn put_all(
    url: &str,
    range: std::ops::Range<usize>,
    o: &CostOptions,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<(f64, HashMap<ObjectId, usize>)> {
    let t0 = Instant::now();
    let writers = o.writers.clamp(1, range.len().max(1));
    let per = range.len().div_ceil(writers);
    let mut set = tokio::task::JoinSet::new();
    // a few connections, as a client library would open
    let channels: Vec<_> = (0..writers.min(4)).map(|_| procs::channel(url)).collect();
    for w in 0..writers {
        let start = range.start + w * per;
        let end = (start + per).min(range.end);
        if start >= end {
            break;
        }
        let client = Ingest::new(channels[w % channels.len()].clone());
        set.spawn(writer(
            client,
            start..end,
            o.subs / o.fanout,
            o.window,
            bar.clone(),
        ));
    }
    let mut index = HashMap::with_capacity(range.len());
    while let Some(r) = set.join_next().await {
        index.extend(r??.into_iter().map(|(i, id)| (id, i)));
    }
    Ok((t0.elapsed().as_secs_f64(), index))
}

/// Waits until `want` distinct pairs were shown (or none came for 10 s); the time of the last.
pub(crate) async fn wait_shown(seen: &Shared, want: usize) -> (usize, Instant) {
    let mut last = (usize::MAX, Instant::now());
    loop {
        let got = lock(seen).pairs.len();
        if got >= want {
            return (got, Instant::now());
        }
        if got != last.0 {
            last = (got, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(10) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Registers `subs` subscriptions of `kind` (subscription `j` has the filter of group
/// `j / fanout`), returning their ids in order.
async fn subscribe(
    url: &str,
    kind: Kind,
    endpoint: &str,
    subs: usize,
    fanout: usize,
    filter: impl Fn(usize) -> String,
) -> anyhow::Result<Vec<u64>> {
    let (target, qos, push_batch) = match kind {
        Kind::GrpcBatch => (
            v1::target::Kind::Grpc(endpoint.into()),
            v1::Qos::AtLeastOnce,
            0,
        ),
        Kind::Webhook => (
            v1::target::Kind::Webhook(endpoint.into()),
            v1::Qos::AtLeastOnce,
            0,
        ),
        Kind::WebhookBatch => (
            v1::target::Kind::Webhook(endpoint.into()),
            v1::Qos::AtLeastOnce,
            64,
        ),
        Kind::Stream => (
            v1::target::Kind::Stream(endpoint.into()),
            v1::Qos::AtMostOnce,
            0,
        ),
    };
    let all = (0..subs)
        .map(|j| v1::Subscription {
            filter: Some(v1::subscription::Filter::Text(filter(j / fanout))),
            target: Some(v1::Target {
                kind: Some(target.clone()),
            }),
            qos: qos as i32,
            webhook_secret: demo::SECRET.into(),
            push_batch,
            ..v1::Subscription::default()
        })
        .collect();
    procs::create_all(url, all, 64, || {})
        .await
        .context("creating a subscription")
}

/// An embedded cluster of one kind's benchmark, with its subscriber and subscriptions.
pub(crate) struct KindNode {
    pub(crate) node: Proc,
    pub(crate) url: String,
    /// What the subscriber was shown.
    pub(crate) seen: Shared,
    /// The subscriptions' ids, in order.
    pub(crate) ids: Vec<u64>,
}

impl KindNode {
    /// Starts `dissem up` in `dir/<kind>`, the kind's subscriber, and `subs` subscriptions
    /// of `kind` (subscription `j` has the filter of group `j / fanout`), and waits until
    /// the node loaded them.
    pub(crate) async fn start(
        bin: &std::path::Path,
        kind: Kind,
        dir: &std::path::Path,
        subs: usize,
        fanout: usize,
        filter: impl Fn(usize) -> String,
    ) -> anyhow::Result<KindNode> {
        let node = Proc::start(
            bin,
            &[
                "up".into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--allow-private-targets".into(),
                "--data".into(),
                dir.join(kind.name()).display().to_string(),
            ],
        );
        let url = node.url();
        let seen: Shared = Shared::default();
        let endpoint = match kind {
            Kind::GrpcBatch => demo::grpc_endpoint(seen.clone(), false).await?,
            Kind::Webhook | Kind::WebhookBatch => demo::webhook_endpoint(seen.clone()).await?,
            Kind::Stream => {
                demo::stream_endpoint(&url, "bench", seen.clone()).await?;
                "bench".to_string()
            }
        };
        let ids = subscribe(&url, kind, &endpoint, subs, fanout, filter).await?;
        demo::wait_image(&url, subs as u64).await?;
        Ok(KindNode {
            node,
            url,
            seen,
            ids,
        })
    }
}

/// One kind on its own embedded cluster in `dir`.
async fn run_kind(
    o: &CostOptions,
    kind: Kind,
    dir: &std::path::Path,
    progress: &Progress,
) -> anyhow::Result<KindRow> {
    let KindNode {
        node,
        url,
        seen,
        ids,
    } = KindNode::start(&o.bin, kind, dir, o.subs, o.fanout, |g| {
        format!("cost = {g}")
    })
    .await?;
    // warm-up: connections, the subscriptions' first lookups, the allocator
    let warm = (o.objects / 20).max(100);
    put_all(&url, 0..warm, o, &indicatif::ProgressBar::hidden()).await?;
    let warm_pairs = warm * o.fanout;
    let (got, _) = wait_shown(&seen, warm_pairs).await;
    if got < warm_pairs {
        bail!(
            "{}: {got} of {warm_pairs} warm-up deliveries arrived",
            kind.name()
        );
    }
    let want = o.objects * o.fanout;
    lock(&seen).pairs.reserve(want);
    let pid = node.pid();
    let cpu0 = cpu::process_cpu_seconds(pid).context("reading the node's /proc/<pid>/stat")?;
    let own0 = cpu::own_cpu_seconds().unwrap_or(0.0);
    let t0 = Instant::now();
    let bar = progress.bar(o.objects as u64, kind.name());
    let (put_seconds, index) = put_all(&url, warm..warm + o.objects, o, &bar).await?;
    let (_, done) = wait_shown(&seen, warm_pairs + want).await;
    let cpu1 = cpu::process_cpu_seconds(pid).context("reading the node's /proc/<pid>/stat")?;
    let own1 = cpu::own_cpu_seconds().unwrap_or(0.0);
    bar.finish();
    let seconds = done.saturating_duration_since(t0).as_secs_f64().max(1e-9);
    let s = lock(&seen);
    let (mut deliveries, mut duplicates, mut wrong) = (0, 0, 0);
    for (&(sub, obj), &(times, _)) in &s.pairs {
        // only the measured objects; each must reach the subscriptions of its group only
        let Some(&i) = index.get(&obj) else {
            continue;
        };
        let group = i % (o.subs / o.fanout);
        if ids
            .get(group * o.fanout..(group + 1) * o.fanout)
            .is_some_and(|g| g.contains(&sub))
        {
            deliveries += 1;
            duplicates += usize::from(times > 1);
        } else {
            wrong += 1;
        }
    }
    let per = |cpu: f64| cpu * 1e6 / deliveries.max(1) as f64;
    Ok(KindRow {
        kind,
        objects: o.objects,
        deliveries,
        lost: want.saturating_sub(deliveries),
        duplicates,
        wrong,
        seconds,
        objects_per_second: o.objects as f64 / seconds,
        put_seconds,
        node_cpu_seconds: cpu1 - cpu0,
        node_cpu_us_per_delivery: per(cpu1 - cpu0),
        client_cpu_us_per_delivery: per(own1 - own0),
    })
}

/// Runs every kind in turn.
pub fn run(o: &CostOptions) -> anyhow::Result<CostReport> {
    if o.subs == 0 || o.objects == 0 || o.writers == 0 || o.window == 0 || o.fanout == 0 {
        bail!("--subs, --objects, --fanout, --writers and --window must be positive");
    }
    if o.fanout > o.subs {
        bail!("--fanout ({}) is more than --subs ({})", o.fanout, o.subs);
    }
    if o.kinds.is_empty() {
        bail!("--kinds: name at least one target kind");
    }
    let mut kinds = o.kinds.clone();
    kinds.sort();
    kinds.dedup();
    demo::in_temp_dir("bench-cost", async |dir| {
        let progress = Progress::new();
        let mut rows = Vec::new();
        for kind in kinds {
            let row = run_kind(o, kind, dir, &progress).await?;
            progress.line(&format!(
                "{}: {:.0} objects/s, node CPU {:.1} µs per delivery",
                kind.name(),
                row.objects_per_second,
                row.node_cpu_us_per_delivery
            ));
            rows.push(row);
        }
        let pass = rows
            .iter()
            .all(|r| r.lost == 0 && r.wrong == 0 && (r.kind != Kind::Stream || r.duplicates == 0));
        Ok(CostReport {
            pass,
            subscriptions: o.subs,
            fanout: o.fanout,
            writers: o.writers,
            window: o.window,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            rows,
            target_objects_per_second: 20_000.0,
            target_node_cpu_us_per_delivery: 5.0,
        })
    })
}

/// Prints the table.
pub fn print(r: &CostReport) {
    println!(
        "cost per delivery: {} subscriptions, each object matches {}; {} PutStream writers x{}; \
         {} cores shared by the node and this process",
        r.subscriptions, r.fanout, r.writers, r.window, r.cores
    );
    println!(
        "{:>14} {:>9} {:>11} {:>12} {:>6} {:>5} {:>6} {:>16} {:>18}",
        "target",
        "objects",
        "deliveries",
        "objects/s",
        "lost",
        "dups",
        "wrong",
        "node µs/delivery",
        "client µs/delivery"
    );
    for row in &r.rows {
        println!(
            "{:>14} {:>9} {:>11} {:>12.0} {:>6} {:>5} {:>6} {:>16.1} {:>18.1}",
            row.kind.name(),
            row.objects,
            row.deliveries,
            row.objects_per_second,
            row.lost,
            row.duplicates,
            row.wrong,
            row.node_cpu_us_per_delivery,
            row.client_cpu_us_per_delivery
        );
    }
    println!(
        "targets: >= {:.0} objects/s, <= {:.0} µs of node CPU per delivery",
        r.target_objects_per_second, r.target_node_cpu_us_per_delivery
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_by_name_and_unknown_ones_are_named() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.name()).expect("known"), k);
        }
        let e = Kind::parse("carrier-pigeon").expect_err("unknown");
        assert!(e.to_string().contains("carrier-pigeon"), "{e}");
        assert!(e.to_string().contains("grpc-batch"), "{e}");
    }

    #[test]
    fn object_i_names_subscription_i_mod_subs() {
        let r = put(12, 5);
        assert_eq!(
            r.metadata[0].value.as_ref().and_then(|v| v.kind.clone()),
            Some(v1::value::Kind::Integer(2))
        );
    }
}
