//! `dissem bench latency`: put -> delivered at a steady low rate, where nothing waits for
//! anything and every millisecond is a deadline somebody set. For each target kind (a gRPC
//! subscriber acking each `Deliver`/`DeliverBatch`, a webhook answering each POST) it starts
//! its own embedded cluster (`dissem up`), registers subscriptions that each object matches
//! `fanout` times (`site = "sX" && kind = "kY"`: two tests and a match per object), and
//! puts objects of five attributes and 100 bytes at `rate` objects/s, evenly spaced, over
//! `writers` `PutStream`s (or a unary `Put` each), as the NATS side by side does
//! (`../shared/anchors/nats`): the latency from each put's request to each of its
//! deliveries, and of the put alone. The figure is 200 objects/s, fan-out 10,
//! 1,000 subscriptions.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::v1;
use serde::Serialize;
use storage::ObjectId;

use crate::cost::{self, Kind, KindNode};
use crate::demo::{self, Latency, lock};
use crate::procs;
use crate::progress::Progress;

/// Options of the latency benchmark.
#[derive(Debug, Clone)]
pub struct LatencyOptions {
    pub bin: PathBuf,
    /// Kinds to measure: `grpc-batch` (a gRPC subscriber) and `webhook` are the issue's.
    pub kinds: Vec<Kind>,
    pub subs: usize,
    pub fanout: usize,
    /// Objects per second, evenly spaced.
    pub rate: f64,
    /// Seconds of puts measured (after a warm-up of two seconds at the same rate).
    pub seconds: f64,
    /// `PutStream` writers the objects are spread over; 0: a unary `Put` each.
    pub writers: usize,
}

/// One kind's figures.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    pub kind: Kind,
    pub objects: usize,
    pub deliveries: usize,
    pub lost: usize,
    /// Put request -> each delivery shown by the subscriber.
    pub delivered: Latency,
    /// Put request -> its durable answer.
    pub put: Latency,
    /// The node process's CPU over the phase, microseconds per delivery.
    pub node_cpu_us_per_delivery: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyReport {
    pub subscriptions: usize,
    pub fanout: usize,
    pub rate: f64,
    pub seconds: f64,
    /// `PutStream` writers (0: unary puts).
    pub writers: usize,
    pub rows: Vec<LatencyRow>,
    /// Nothing lost.
    pub pass: bool,
    /// The targets: put -> delivered p50 and p99, ms.
    pub target_p50_ms: f64,
    pub target_p99_ms: f64,
}

/// The filter of group `g`: two attributes, as a sensor subscription names a site and a
/// kind of reading.
fn filter(g: usize) -> String {
    format!("site = \"s{}\" && kind = \"k{}\"", g / 8, g % 8)
}

/// The put of object `i`: it matches group `i % groups` only. Five attributes, as a sensor
/// reading has (the ones no subscription names are dropped at the coordinator).
fn put(i: usize, groups: usize) -> v1::PutRequest {
    let g = i % groups;
    let attr = |name: &str, kind| v1::Attribute {
        name: name.into(),
        value: Some(v1::Value { kind: Some(kind) }),
    };
    use v1::value::Kind as K;
    v1::PutRequest {
        data: vec![b'x'; 100],
        metadata: vec![
            attr("site", K::Text(format!("s{}", g / 8))),
            attr("kind", K::Text(format!("k{}", g % 8))),
            attr("temp", K::Number(20.0 + (i % 100) as f64 / 10.0)),
            attr("unit", K::Text("C".into())),
            attr("seq", K::Integer(i as i64)),
        ],
        priority: 0,
        message_id: String::new(),
    }
}

/// When each object was put, how long its answer took, by id: (index, sent, ms).
type Sent = HashMap<ObjectId, (usize, Instant, f64)>;

fn object_id(id: Option<v1::ObjectId>) -> ObjectId {
    let id = id.unwrap_or_default();
    ObjectId {
        node: id.node,
        seq: id.seq,
    }
}

/// Puts objects `range` at `rate`, evenly spaced. `writers` 0: each a unary `Put` of its
/// own, spawned on time so a slow answer never delays the next; else that many
/// `PutStream`s, object `k` on stream `k % writers` (as the NATS side by side publishes).
async fn put_at_rate(
    url: &str,
    range: std::ops::Range<usize>,
    groups: usize,
    rate: f64,
    writers: usize,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Sent> {
    let t0 = Instant::now();
    let due = move |k: usize| t0 + Duration::from_secs_f64(k as f64 / rate);
    let mut set = tokio::task::JoinSet::new();
    if writers == 0 {
        let ingest = v1::ingest_client::IngestClient::new(procs::channel(url));
        for (k, i) in range.enumerate() {
            tokio::time::sleep_until(due(k).into()).await;
            let mut c = ingest.clone();
            let bar = bar.clone();
            set.spawn(async move {
                let at = Instant::now();
                let r = c.put(put(i, groups)).await;
                let ms = at.elapsed().as_secs_f64() * 1000.0;
                bar.inc(1);
                let id = object_id(r.context("put")?.into_inner().id);
                Ok::<_, anyhow::Error>(vec![(id, (i, at, ms))])
            });
        }
    } else {
        let mine: Vec<Vec<(usize, usize)>> = (0..writers)
            .map(|w| range.clone().enumerate().skip(w).step_by(writers).collect())
            .collect();
        for objects in mine {
            let mut c = v1::ingest_client::IngestClient::new(procs::channel(url));
            let bar = bar.clone();
            set.spawn(async move {
                let n = objects.len();
                let (tx, rx) = tokio::sync::mpsc::channel::<v1::PutRequest>(64);
                let times: Arc<Mutex<std::collections::VecDeque<(usize, Instant)>>> =
                    Arc::default();
                let sender = {
                    let times = times.clone();
                    tokio::spawn(async move {
                        for (k, i) in objects {
                            tokio::time::sleep_until(due(k).into()).await;
                            lock(&times).push_back((i, Instant::now()));
                            if tx.send(put(i, groups)).await.is_err() {
                                return;
                            }
                        }
                    })
                };
                let mut answers = c
                    .put_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await?
                    .into_inner();
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    let Some(v1::PutStreamResponse {
                        result: Some(v1::put_stream_response::Result::Ok(r)),
                    }) = answers.message().await?
                    else {
                        sender.abort();
                        bail!("the put stream ended or refused a put");
                    };
                    let (i, at) = lock(&times)
                        .pop_front()
                        .context("an answer before its put")?;
                    bar.inc(1);
                    out.push((
                        object_id(r.id),
                        (i, at, at.elapsed().as_secs_f64() * 1000.0),
                    ));
                }
                let _ = sender.await;
                Ok(out)
            });
        }
    }
    let mut out = HashMap::new();
    while let Some(r) = set.join_next().await {
        out.extend(r??);
    }
    Ok(out)
}

/// One kind on its own embedded cluster in `dir`.
async fn run_kind(
    o: &LatencyOptions,
    kind: Kind,
    dir: &std::path::Path,
    progress: &Progress,
) -> anyhow::Result<LatencyRow> {
    let KindNode {
        node,
        url,
        seen,
        ids,
    } = KindNode::start(&o.bin, kind, dir, o.subs, o.fanout, filter).await?;
    let groups = o.subs / o.fanout;
    // warm-up at the same rate: connections, lookups, the allocator
    let warm = ((o.rate * 2.0) as usize).max(20);
    let hidden = indicatif::ProgressBar::hidden();
    put_at_rate(&url, 0..warm, groups, o.rate, o.writers, &hidden).await?;
    let warm_pairs = warm * o.fanout;
    let (got, _) = cost::wait_shown(&seen, warm_pairs).await;
    if got < warm_pairs {
        bail!(
            "{}: {got} of {warm_pairs} warm-up deliveries arrived",
            kind.name()
        );
    }
    let objects = ((o.rate * o.seconds) as usize).max(1);
    let pid = node.pid();
    let cpu0 = crate::cpu::process_cpu_seconds(pid).context("reading the node's CPU time")?;
    let bar = progress.bar(objects as u64, kind.name());
    let sent = put_at_rate(&url, warm..warm + objects, groups, o.rate, o.writers, &bar).await?;
    cost::wait_shown(&seen, warm_pairs + objects * o.fanout).await;
    let cpu1 = crate::cpu::process_cpu_seconds(pid).context("reading the node's CPU time")?;
    bar.finish();
    let s = lock(&seen);
    let mut delivered = Vec::with_capacity(objects * o.fanout);
    for (&(sub, obj), &(_, first)) in &s.pairs {
        let Some(&(i, at, _)) = sent.get(&obj) else {
            continue;
        };
        let group = i % groups;
        if ids
            .get(group * o.fanout..(group + 1) * o.fanout)
            .is_some_and(|g| g.contains(&sub))
        {
            delivered.push(first.saturating_duration_since(at).as_secs_f64() * 1000.0);
        }
    }
    let deliveries = delivered.len();
    Ok(LatencyRow {
        kind,
        objects,
        deliveries,
        lost: (objects * o.fanout).saturating_sub(deliveries),
        delivered: demo::latency(delivered),
        put: demo::latency(sent.values().map(|v| v.2).collect()),
        node_cpu_us_per_delivery: (cpu1 - cpu0) * 1e6 / deliveries.max(1) as f64,
    })
}

/// Runs every kind in turn.
pub fn run(o: &LatencyOptions) -> anyhow::Result<LatencyReport> {
    if o.subs == 0 || o.fanout == 0 || o.fanout > o.subs {
        bail!("--subs and --fanout must be positive, --fanout at most --subs");
    }
    if !(o.rate > 0.0 && o.rate <= 100_000.0) {
        bail!("--rate must be between 0 and 100000 objects/s");
    }
    if !(o.seconds > 0.0 && o.seconds <= 3600.0) {
        bail!("--seconds must be between 0 and 3600");
    }
    if o.kinds.is_empty() {
        bail!("--kinds: name at least one target kind");
    }
    if o.writers > 64 {
        bail!("--writers: at most 64 PutStreams");
    }
    let mut kinds = o.kinds.clone();
    kinds.sort();
    kinds.dedup();
    demo::in_temp_dir("bench-latency", async |dir| {
        let progress = Progress::new();
        let mut rows = Vec::new();
        for kind in kinds {
            let row = run_kind(o, kind, dir, &progress).await?;
            progress.line(&format!(
                "{}: put -> delivered p50 {:.2} ms, p99 {:.2} ms",
                kind.name(),
                row.delivered.p50_ms,
                row.delivered.p99_ms
            ));
            rows.push(row);
        }
        Ok(LatencyReport {
            subscriptions: o.subs,
            fanout: o.fanout,
            rate: o.rate,
            seconds: o.seconds,
            writers: o.writers,
            pass: rows.iter().all(|r| r.lost == 0),
            rows,
            target_p50_ms: 2.0,
            target_p99_ms: 10.0,
        })
    })
}

/// Prints the table.
pub fn print(r: &LatencyReport) {
    let puts = match r.writers {
        0 => "a unary Put each".to_string(),
        n => format!("over {n} PutStreams"),
    };
    println!(
        "latency at a steady {:.0} objects/s ({puts}) for {:.0} s: {} subscriptions, each \
         object matches {}",
        r.rate, r.seconds, r.subscriptions, r.fanout
    );
    println!(
        "{:>14} {:>8} {:>11} {:>5} {:>13} {:>13} {:>13} {:>11} {:>11} {:>10}",
        "target",
        "objects",
        "deliveries",
        "lost",
        "delivered p50",
        "delivered p99",
        "delivered max",
        "put p50",
        "put p99",
        "node µs/d"
    );
    for row in &r.rows {
        println!(
            "{:>14} {:>8} {:>11} {:>5} {:>10.2} ms {:>10.2} ms {:>10.2} ms {:>8.2} ms {:>8.2} ms {:>10.1}",
            row.kind.name(),
            row.objects,
            row.deliveries,
            row.lost,
            row.delivered.p50_ms,
            row.delivered.p99_ms,
            row.delivered.max_ms,
            row.put.p50_ms,
            row.put.p99_ms,
            row.node_cpu_us_per_delivery
        );
    }
    println!(
        "targets: put -> delivered p50 <= {:.0} ms, p99 <= {:.0} ms",
        r.target_p50_ms, r.target_p99_ms
    );
}
