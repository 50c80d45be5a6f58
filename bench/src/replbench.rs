//! The replicated rows of `dissem bench ingest` (DESIGN §7): durable puts per second through
//! a real cluster of node processes on a grid, with `--write-copies 3` (a put waits for three
//! durable copies in its row quorum) against `--write-copies 1` (copies go asynchronously)
//! in the same run. The ratio is what waiting for the quorum costs; copies are batched per
//! peer, so it should stay well above one half.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::v1;
use serde::Serialize;

use crate::procs::{self, Cluster};

/// Options of the replicated rows.
#[derive(Debug, Clone)]
pub struct ReplicatedOptions {
    /// The `dissem` binary to start the processes from.
    pub bin: PathBuf,
    /// The grid (rows x cols; every position gets a node process).
    pub grid: runtime::grid::Grid,
    /// The `--write-copies` settings to compare (the first is the reference).
    pub write_copies: Vec<usize>,
    pub writers: usize,
    pub object_bytes: usize,
    pub seconds: f64,
}

/// Figures of one `--write-copies` setting.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicatedRow {
    pub write_copies: usize,
    pub objects: u64,
    pub objects_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Copies of other nodes' objects the nodes held at the end, per acknowledged object
    /// (finished ones included): how far replication got beside the origin's own copy.
    pub copies_per_object: f64,
}

/// The replicated rows and their ratio.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicatedReport {
    pub grid: String,
    pub writers: usize,
    pub object_bytes: usize,
    pub rows: Vec<ReplicatedRow>,
    /// Objects/s of each setting divided by the first setting's.
    pub ratios: Vec<(usize, f64)>,
}

/// Runs one cluster per setting, one after the other.
pub fn run(opts: &ReplicatedOptions) -> anyhow::Result<ReplicatedReport> {
    if opts.write_copies.is_empty() || opts.write_copies.contains(&0) {
        bail!("--write-copies must list settings of at least 1");
    }
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    for &copies in &opts.write_copies {
        eprintln!(
            "ingest on a {} grid of node processes, --write-copies {copies}, {} writers, {:.0} s",
            opts.grid, opts.writers, opts.seconds
        );
        rows.push(rt.block_on(run_one(opts, copies))?);
    }
    let base = rows[0].objects_per_second.max(1e-9);
    let ratios = rows
        .iter()
        .map(|r| (r.write_copies, r.objects_per_second / base))
        .collect();
    Ok(ReplicatedReport {
        grid: opts.grid.to_string(),
        writers: opts.writers,
        object_bytes: opts.object_bytes,
        rows,
        ratios,
    })
}

async fn run_one(opts: &ReplicatedOptions, copies: usize) -> anyhow::Result<ReplicatedRow> {
    let dir = procs::temp_dir(&format!("bench-replicated-{copies}"));
    let grid = opts.grid.to_string();
    let copies_arg = copies.to_string();
    let node_args = [
        "--gpu",
        "off",
        "--no-delivery",
        "--write-copies",
        copies_arg.as_str(),
    ];
    let bin = opts.bin.clone();
    let n = opts.grid.len();
    let c = {
        let dir = dir.clone();
        let grid = grid.clone();
        let node_args: Vec<String> = node_args.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
            Cluster::start_ids(&bin, &dir, 0..n, &["--grid", &grid], &node_args)
        })
        .await
        .context("starting the cluster")?
    };
    let coord = c.coordinator.url();
    match procs::try_wait_for(Duration::from_secs(60), || {
        let coord = coord.clone();
        async move { (procs::stats(&coord).await.ok()?.cluster?.nodes == n).then_some(()) }
    })
    .await
    {
        Some(()) => {}
        None => bail!("the {grid} cluster did not register every node within 60 s"),
    }
    // every node must know the whole membership before puts are timed
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let urls: Vec<String> = c.nodes.iter().map(procs::Proc::url).collect();
    let stop = Instant::now() + Duration::from_secs_f64(opts.seconds);
    let acked = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for w in 0..opts.writers {
        let url = urls[w % urls.len()].clone();
        let acked = acked.clone();
        let data = vec![b'x'; opts.object_bytes];
        set.spawn(async move {
            let mut client = v1::ingest_client::IngestClient::new(procs::channel(&url));
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < stop {
                let t = Instant::now();
                let r = client
                    .put(v1::PutRequest {
                        data: data.clone(),
                        metadata: vec![v1::Attribute {
                            name: "w".into(),
                            value: Some(v1::Value {
                                kind: Some(v1::value::Kind::Integer(w as i64)),
                            }),
                        }],
                        priority: 0,
                        message_id: format!("r{w}-{i}"),
                    })
                    .await;
                i += 1;
                if r.is_ok() {
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
            lat
        });
    }
    let t0 = Instant::now();
    let mut lat = Vec::new();
    while let Some(r) = set.join_next().await {
        lat.extend(r.context("writer task")?);
    }
    let secs = t0.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    let objects = acked.load(Ordering::Relaxed);
    // let the asynchronous copies land before counting them
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut held = 0u64;
    for u in &urls {
        if let Ok(s) = procs::stats(u).await {
            held += s.copies_unfinished + s.copies_finished;
        }
    }
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ReplicatedRow {
        write_copies: copies,
        objects,
        objects_per_second: objects as f64 / secs.max(1e-9),
        p50_ms: crate::percentile(&lat, 0.5),
        p99_ms: crate::percentile(&lat, 0.99),
        copies_per_object: held as f64 / (objects.max(1) as f64),
    })
}

/// Prints the rows and ratios.
pub fn print(r: &ReplicatedReport) {
    println!(
        "replicated ingest, {} grid, {} writers, {} B objects:",
        r.grid, r.writers, r.object_bytes
    );
    println!(
        "{:>12} {:>9} {:>12} {:>9} {:>9} {:>14}",
        "write-copies", "objects", "objects/s", "p50 ms", "p99 ms", "copies/object"
    );
    for x in &r.rows {
        println!(
            "{:>12} {:>9} {:>12.0} {:>9.2} {:>9.2} {:>14.2}",
            x.write_copies,
            x.objects,
            x.objects_per_second,
            x.p50_ms,
            x.p99_ms,
            x.copies_per_object
        );
    }
    if let Some(first) = r.rows.first() {
        for (copies, ratio) in r.ratios.iter().skip(1) {
            println!(
                "--write-copies {copies} runs at {ratio:.2}x the rate of --write-copies {}",
                first.write_copies
            );
        }
    }
}
