//! `dissem bench cluster`: objects per second through ingest -> test -> match with 1, 2, 4...
//! node processes on this machine, against the one-node figure and the in-process match
//! engine measured in the same run.
//!
//! For each node count a coordinator (its subscription data kept across configurations, so
//! the subscriptions are registered once) and that many `dissem node` processes start on
//! loopback; `writers` clients put the `iot` objects round-robin across the nodes with durable
//! acks; the clock stops when the coordinator has seen every object matched. Figures: objects
//! per second, messages between coordinator and nodes per object, put -> match latency
//! p50/p99 (from the coordinator), and whether the (object, subscription) pairs handed to
//! delivery (read from the nodes' sled files after they stop) equal the in-process engine's
//! for every object and the naive reference matcher's for the first `check_objects`. Nodes
//! run with `--no-delivery`: this measures ingest -> test -> match, not the pushes (the demo
//! exercises those).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use blocks::{Event, MatchIndex, ReferenceMatcher, ShardConfig};
use proto::v1;
use serde::Serialize;
use storage::ObjectId;

use crate::procs::{self, Proc};
use crate::progress::Progress;
use crate::workload::{IotSpec, Workload};

/// Options of the cluster benchmark.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The `dissem` binary to start the processes from.
    pub bin: PathBuf,
    pub nodes: Vec<u32>,
    pub subs: usize,
    pub objects: usize,
    pub writers: usize,
    pub seed: u64,
    /// Objects also checked against the naive reference matcher.
    pub check_objects: usize,
}

/// Figures of one node count.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterRow {
    pub nodes: u32,
    pub objects: usize,
    pub seconds: f64,
    pub objects_per_second: f64,
    /// Coordinator <-> node messages per object (heartbeats and hellos included).
    pub messages_per_object: f64,
    pub match_latency_p50_ms: f64,
    pub match_latency_p99_ms: f64,
    /// (object, subscription) pairs handed to delivery.
    pub matches: usize,
    pub reassignments: u64,
    pub block_loads: u64,
    /// The pairs equal the in-process engine's for every object...
    pub identical_to_engine: bool,
    /// ...and the naive reference matcher's for the first `check_objects` objects.
    pub identical_to_reference: bool,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    pub workload: String,
    pub subscriptions: usize,
    pub writers: usize,
    pub check_objects: usize,
    /// The in-process match engine on the same objects (one thread), objects/s.
    pub engine_objects_per_second: f64,
    pub rows: Vec<ClusterRow>,
    /// Objects/s of each node count divided by the one-node figure (when 1 was run).
    pub speedup_vs_one_node: Vec<(u32, f64)>,
    pub identical_matches: bool,
}

fn coordinator_args(dir: &std::path::Path) -> Vec<String> {
    vec![
        "coordinator".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--data".into(),
        dir.join("coordinator").display().to_string(),
    ]
}

/// Runs the benchmark.
pub fn run(opts: &ClusterOptions) -> anyhow::Result<ClusterReport> {
    if opts.nodes.is_empty() || opts.nodes.iter().any(|&n| n == 0 || n > 64) {
        bail!("--nodes must list node counts between 1 and 64");
    }
    let rt = tokio::runtime::Runtime::new()?;
    let progress = Progress::new();
    let dir = std::env::temp_dir().join(format!("dissem-bench-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = rt.block_on(run_all(opts, &dir, &progress));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run_all(
    opts: &ClusterOptions,
    dir: &std::path::Path,
    progress: &Progress,
) -> anyhow::Result<ClusterReport> {
    let w = Workload::Iot(IotSpec);
    let subs = w.subscriptions(opts.seed, opts.subs, |_| {});
    let events = Arc::new(w.events(opts.seed, opts.objects));

    // register once, straight at the coordinator
    let mut coordinator = Proc::start(&opts.bin, &coordinator_args(dir));
    let filters: Vec<String> = subs.iter().map(|(_, d)| d.to_text()).collect();
    let bar = progress.bar(subs.len() as u64, "registering subscriptions");
    let ids = subscribe_with_progress(&coordinator.url(), &filters, &bar).await;
    bar.finish();
    let subs: Vec<(u64, blocks::Dnf)> =
        ids.into_iter().zip(subs.into_iter().map(|s| s.1)).collect();

    // the in-process engine (expected pairs for every object) and the naive reference
    progress.line("matching in-process for the expected pairs");
    let index = MatchIndex::build(ShardConfig::default(), subs.clone())?;
    let mut ctx = index.base().new_ctx();
    let mut engine_out = Vec::new();
    let t = Instant::now();
    for chunk in events.chunks(256) {
        let mut out = Vec::new();
        index.match_batch(chunk, &mut ctx, &mut out);
        engine_out.extend(out);
    }
    let engine_ops = events.len() as f64 / t.elapsed().as_secs_f64();
    let check = opts.check_objects.min(events.len());
    let mut reference = ReferenceMatcher::new();
    for (id, d) in &subs {
        reference.insert(*id, d.clone());
    }
    let reference_out: Vec<Vec<u64>> = events[..check]
        .iter()
        .map(|e| reference.match_event(e))
        .collect();

    let mut rows = Vec::new();
    for (round, &n) in opts.nodes.iter().enumerate() {
        if round > 0 {
            // a fresh coordinator on the same registry: no state from the previous nodes
            coordinator.kill();
            coordinator = Proc::start(&opts.bin, &coordinator_args(dir));
        }
        let row = run_one(
            opts,
            dir,
            round,
            n,
            &coordinator,
            events.clone(),
            &engine_out,
            &reference_out,
            progress,
        )
        .await?;
        progress.line(&format!(
            "{} node(s): {:.0} objects/s, {:.3} messages/object, p50 {:.0} ms, p99 {:.0} ms, {}",
            row.nodes,
            row.objects_per_second,
            row.messages_per_object,
            row.match_latency_p50_ms,
            row.match_latency_p99_ms,
            if row.identical_to_engine && row.identical_to_reference {
                "matches identical"
            } else {
                "MATCHES DIFFER"
            }
        ));
        rows.push(row);
    }
    coordinator.kill();
    let one = rows
        .iter()
        .find(|r| r.nodes == 1)
        .map(|r| r.objects_per_second);
    let speedup = match one {
        Some(o) if o > 0.0 => rows
            .iter()
            .map(|r| (r.nodes, r.objects_per_second / o))
            .collect(),
        _ => Vec::new(),
    };
    Ok(ClusterReport {
        workload: "iot".into(),
        subscriptions: opts.subs,
        writers: opts.writers,
        check_objects: check,
        engine_objects_per_second: engine_ops,
        identical_matches: rows
            .iter()
            .all(|r| r.identical_to_engine && r.identical_to_reference),
        rows,
        speedup_vs_one_node: speedup,
    })
}

async fn subscribe_with_progress(
    url: &str,
    filters: &[String],
    bar: &indicatif::ProgressBar,
) -> Vec<u64> {
    let mut ids = Vec::with_capacity(filters.len());
    for chunk in filters.chunks(1000) {
        ids.extend(procs::subscribe_all(url, chunk, 256).await);
        bar.inc(chunk.len() as u64);
    }
    ids
}

#[allow(clippy::too_many_arguments)]
async fn run_one(
    opts: &ClusterOptions,
    dir: &std::path::Path,
    round: usize,
    n: u32,
    coordinator: &Proc,
    events: Arc<Vec<Event>>,
    engine_out: &[Vec<u64>],
    reference_out: &[Vec<u64>],
    progress: &Progress,
) -> anyhow::Result<ClusterRow> {
    let coord = coordinator.url();
    let mut nodes: Vec<Proc> = (1..=n)
        .map(|i| {
            let args = vec![
                "node".to_string(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--data".into(),
                dir.join(format!("r{round}-node{i}")).display().to_string(),
                "--node".into(),
                i.to_string(),
                "--coordinator".into(),
                coord.clone(),
                "--cluster-secret-file".into(),
                dir.join("coordinator")
                    .join("cluster.secret")
                    .display()
                    .to_string(),
                // the matching pipeline only: matches become delivery records, no pushes
                "--no-delivery".into(),
            ];
            Proc::start(&opts.bin, &args)
        })
        .collect();
    let want_subs = opts.subs as u64;
    let c2 = coord.clone();
    procs::wait(
        "the nodes to register and the image",
        Duration::from_secs(120),
        move || {
            let c = c2.clone();
            async move {
                let s = procs::stats(&c).await.ok()?.cluster?;
                (s.nodes == n && s.image_subscriptions == want_subs).then_some(())
            }
        },
    )
    .await?;
    let before = procs::stats(&coord)
        .await?
        .cluster
        .context("coordinator stats")?;

    // writers put round-robin across the nodes, each over its own connection
    let urls: Vec<String> = nodes.iter().map(|p| p.url()).collect();
    let bar = progress.bar(events.len() as u64, &format!("{n} node(s): putting"));
    let next = Arc::new(AtomicUsize::new(0));
    let ids = Arc::new(std::sync::Mutex::new(vec![
        ObjectId { node: 0, seq: 0 };
        events.len()
    ]));
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..opts.writers {
        let (urls, events, next, ids, bar) = (
            urls.clone(),
            events.clone(),
            next.clone(),
            ids.clone(),
            bar.clone(),
        );
        set.spawn(async move {
            let mut clients: Vec<_> = urls
                .iter()
                .map(|u| v1::ingest_client::IngestClient::new(procs::channel(u)))
                .collect();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= events.len() {
                    return Ok::<(), tonic::Status>(());
                }
                let k = i % clients.len();
                let req = procs::put_request(&events[i], format!("bench-{i}"));
                let r = clients[k].put(req).await?.into_inner();
                let id = r.id.unwrap_or_default();
                ids.lock().unwrap_or_else(|p| p.into_inner())[i] = ObjectId {
                    node: id.node,
                    seq: id.seq,
                };
                bar.inc(1);
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.context("writer task")?.context("put")?;
    }
    bar.finish();
    let total = events.len() as u64;
    let arrived_before = before.objects_matched;
    let c2 = coord.clone();
    let after = procs::wait(
        "every object to be matched",
        Duration::from_secs(600),
        move || {
            let c = c2.clone();
            async move {
                let s = procs::stats(&c).await.ok()?.cluster?;
                (s.objects_matched >= arrived_before + total).then_some(s)
            }
        },
    )
    .await?;
    let seconds = t0.elapsed().as_secs_f64();
    // drained on the nodes too (matches handed to delivery before the coordinator heard)
    let urls2 = urls.clone();
    procs::wait(
        "the outboxes to drain",
        Duration::from_secs(120),
        move || {
            let urls = urls2.clone();
            async move {
                for u in &urls {
                    if procs::stats(u).await.ok()?.outbox_pending > 0 {
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await?;

    // stop the nodes and read what they handed to delivery
    for p in nodes.iter_mut() {
        p.kill();
    }
    let mut got = BTreeSet::new();
    for i in 1..=n {
        let data = dir.join(format!("r{round}-node{i}"));
        got.extend(procs::delivery_records(&data, i));
    }
    let ids = ids.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let pairs = |outs: &[Vec<u64>]| -> BTreeSet<(u64, ObjectId)> {
        outs.iter()
            .zip(&ids)
            .flat_map(|(subs, oid)| subs.iter().map(move |s| (*s, *oid)))
            .collect()
    };
    let engine = pairs(engine_out);
    let checked: BTreeSet<ObjectId> = ids[..reference_out.len()].iter().copied().collect();
    let got_checked: BTreeSet<(u64, ObjectId)> = got
        .iter()
        .filter(|(_, o)| checked.contains(o))
        .copied()
        .collect();
    Ok(ClusterRow {
        nodes: n,
        objects: events.len(),
        seconds,
        objects_per_second: events.len() as f64 / seconds,
        messages_per_object: (after.messages - before.messages) as f64 / events.len() as f64,
        match_latency_p50_ms: after.match_latency_p50_ms,
        match_latency_p99_ms: after.match_latency_p99_ms,
        matches: got.len(),
        reassignments: after.reassignments,
        block_loads: after.loads,
        identical_to_engine: got == engine,
        identical_to_reference: got_checked == pairs(reference_out),
    })
}

/// Prints the figures.
pub fn print(r: &ClusterReport) {
    println!(
        "cluster benchmark: {} subscriptions ({}), {} writers, in-process engine {:.0} objects/s",
        r.subscriptions, r.workload, r.writers, r.engine_objects_per_second
    );
    println!(
        "{:>5} {:>8} {:>10} {:>9} {:>8} {:>8} {:>9} {:>7} {:>6}  identical (engine / reference on {})",
        "nodes",
        "objects",
        "objects/s",
        "msgs/obj",
        "p50 ms",
        "p99 ms",
        "matches",
        "reassn",
        "loads",
        r.check_objects
    );
    for row in &r.rows {
        println!(
            "{:>5} {:>8} {:>10.0} {:>9.3} {:>8.0} {:>8.0} {:>9} {:>7} {:>6}  {} / {}",
            row.nodes,
            row.objects,
            row.objects_per_second,
            row.messages_per_object,
            row.match_latency_p50_ms,
            row.match_latency_p99_ms,
            row.matches,
            row.reassignments,
            row.block_loads,
            row.identical_to_engine,
            row.identical_to_reference
        );
    }
    for (n, s) in &r.speedup_vs_one_node {
        println!("{n} node(s) vs 1: {s:.2}x");
    }
}
