//! `dissem bench quorum` (DESIGN §7, seed 000): a `t x w` grid of real node processes and a
//! coordinator on loopback. Every position creates one subscription (through its own node);
//! objects are put through random nodes while the subscriber refuses deliveries (so every
//! delivery is still owed); once every object is fully replicated, a seeded random fraction
//! p_f of the nodes is SIGKILLed (not restarted), the subscriber starts taking deliveries, and
//! what reaches it is compared with the oracle: a delivery is possible iff some holder of the
//! object (its origin's row quorum, or R ∪ C in xS mode) and some holder of the subscription
//! (the column quorum of the node that took the Create, and the coordinator's registry,
//! which is not killed) are alive. The seed's stricter count, column quorum only, is
//! reported beside it. Beside the measured rate
//! stands the seed's analytic `P_smd = (1 - p_f^r)^(n/r)`.
//!
//! A fresh cluster per (mode, p_f). xS mode makes every object critical
//! (`--critical-priority 0`), row mode none (`--critical-priority 8`).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::v1;
use runtime::grid::Grid;
use serde::Serialize;
use storage::ObjectId;

use crate::procs::{self, Cluster, wait};
use crate::recorder::Recorder;
use crate::workload::Rng;

/// Where objects are copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The row quorum R(i) of the origin.
    Row,
    /// R(i) ∪ C(j).
    Xs,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "row" => Ok(Mode::Row),
            "xs" => Ok(Mode::Xs),
            _ => Err(format!("{s:?}: expected row or xs")),
        }
    }
}

/// Options of the quorum benchmark.
#[derive(Debug, Clone)]
pub struct QuorumOptions {
    pub bin: PathBuf,
    pub grid: Grid,
    pub pfs: Vec<f64>,
    pub modes: Vec<Mode>,
    pub objects: usize,
    pub seed: u64,
}

/// Figures of one (mode, p_f).
#[derive(Debug, Clone, Serialize)]
pub struct QuorumRow {
    pub mode: Mode,
    pub pf: f64,
    pub nodes: u32,
    pub killed: Vec<u32>,
    pub acknowledged: usize,
    /// (subscription, object) pairs the acknowledged objects match.
    pub owed: usize,
    /// Distinct owed pairs the subscriber was shown.
    pub delivered: usize,
    /// Owed pairs the oracle says are possible after the kills (a holder of the object and
    /// one of the subscription alive; the coordinator's registry holds every subscription).
    pub oracle: usize,
    /// The same without the registry: only the column quorum holds a subscription (the
    /// seed's model; a node-only cluster without a live coordinator).
    pub oracle_column_quorum_only: usize,
    /// Possible but not delivered.
    pub missed: usize,
    /// Delivered though the oracle says impossible.
    pub impossible: usize,
    /// QoS 2 pairs shown more than once (must be 0), and QoS 1 repeats.
    pub duplicates: u64,
    pub qos1_repeats: u64,
    /// Stored copies per object (origin included) and per subscription, as measured.
    pub copies_per_object: f64,
    pub copies_per_subscription: f64,
    /// From the last acknowledged put to every copy stored.
    pub replication_seconds: f64,
    /// From the kills to the last delivery.
    pub recovery_seconds: f64,
    pub p_smd_analytic: f64,
    pub p_smd_measured: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct QuorumReport {
    pub grid: String,
    pub objects: usize,
    pub seed: u64,
    pub rows: Vec<QuorumRow>,
    /// delivered == oracle everywhere, no QoS 2 duplicate, xS at least row at every p_f.
    pub pass: bool,
}

/// Runs every (mode, p_f).
pub fn run(opts: &QuorumOptions) -> anyhow::Result<QuorumReport> {
    if opts.pfs.iter().any(|p| !(0.0..1.0).contains(p)) {
        bail!("--pf values must be in [0, 1)");
    }
    if opts.objects == 0 || opts.objects > 100_000 {
        bail!("--objects must be between 1 and 100000");
    }
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    for &mode in &opts.modes {
        for &pf in &opts.pfs {
            eprintln!(
                "quorum: {} grid, {mode:?} mode, p_f {pf}: starting {} node processes",
                opts.grid,
                opts.grid.len()
            );
            let row = rt.block_on(run_one(opts, mode, pf))?;
            eprintln!(
                "  acknowledged {}, owed {}, delivered {}, oracle {}, missed {}, impossible {}, \
                 QoS 2 duplicates {}, copies/object {:.2}",
                row.acknowledged,
                row.owed,
                row.delivered,
                row.oracle,
                row.missed,
                row.impossible,
                row.duplicates,
                row.copies_per_object
            );
            rows.push(row);
        }
    }
    let mut pass = rows
        .iter()
        .all(|r| r.missed == 0 && r.impossible == 0 && r.duplicates == 0);
    for r in rows.iter().filter(|r| r.mode == Mode::Xs) {
        if let Some(row) = rows.iter().find(|x| x.mode == Mode::Row && x.pf == r.pf) {
            pass &= r.p_smd_measured >= row.p_smd_measured;
        }
    }
    Ok(QuorumReport {
        grid: opts.grid.to_string(),
        objects: opts.objects,
        seed: opts.seed,
        rows,
        pass,
    })
}

/// One subscription per position: (id, node that took it, lo, hi, QoS 2).
pub type Sub = (u64, u32, i64, i64, bool);

/// One subscription through each of `urls` (a temp range; every third QoS 2), retried
/// almost forever, pushed to `target`.
pub async fn subscribe(urls: &[String], target: &str, rng: &mut Rng) -> anyhow::Result<Vec<Sub>> {
    let mut subs = Vec::new();
    for (k, url) in urls.iter().enumerate() {
        let lo = rng.below(80) as i64;
        let hi = lo + 10 + rng.below(30) as i64;
        let qos2 = k % 3 == 2;
        let qos = if qos2 {
            v1::Qos::ExactlyOnce
        } else {
            v1::Qos::AtLeastOnce
        };
        let retry = v1::RetryPolicy {
            max_attempts: 100_000,
            ttl_ms: 0,
            initial_backoff_ms: 100,
            max_backoff_ms: 500,
        };
        let filter = format!("temp >= {lo} and temp < {hi}");
        let id = procs::create_grpc_subscription(url, filter, target, qos, Some(retry))
            .await
            .with_context(|| format!("creating a subscription through node {k}"))?;
        subs.push((id, k as u32, lo, hi, qos2));
    }
    Ok(subs)
}

/// Puts `n` objects through random nodes, 16 at a time: (id, temp, node) of each
/// acknowledged one.
async fn put_objects(urls: &[String], n: usize, seed: u64) -> Vec<(ObjectId, i64, u32)> {
    let mut rng = Rng::new(seed ^ 0x0b1e);
    let plan: Vec<(usize, i64)> = (0..n)
        .map(|_| (rng.below(urls.len() as u64) as usize, rng.below(100) as i64))
        .collect();
    let plan = std::sync::Arc::new(plan);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (plan, next, urls) = (plan.clone(), next.clone(), urls.to_vec());
        set.spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(k, t)) = plan.get(i) else {
                    return out;
                };
                let mut req = crate::procs::put_request(
                    &blocks::Event::new([("temp", blocks::Value::from(t))]),
                    format!("q-{i}"),
                );
                req.data = vec![b'o'; 64];
                if let Ok(id) = procs::put_retrying(&urls[k], req, Duration::from_secs(10)).await {
                    out.push((id, t, k as u32));
                }
            }
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.unwrap_or_default());
    }
    all
}

async fn run_one(opts: &QuorumOptions, mode: Mode, pf: f64) -> anyhow::Result<QuorumRow> {
    let g = opts.grid;
    let n = g.len();
    let dir = procs::temp_dir(&format!("bench-quorum-{mode:?}-{pf}"));
    let grid = g.to_string();
    let critical = match mode {
        Mode::Row => "8",
        Mode::Xs => "0",
    };
    let mut node_args = procs::small_node_flags();
    node_args.extend(["--critical-priority".to_string(), critical.to_string()]);
    let bin = opts.bin.clone();
    let dir2 = dir.clone();
    let mut c = tokio::task::spawn_blocking(move || {
        let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
        Cluster::start_ids(
            &bin,
            &dir2,
            0..n,
            &[
                "--grid",
                &grid,
                "--allow-private-targets",
                "--lease-ms",
                "1500",
            ],
            &node_args,
        )
    })
    .await
    .context("starting the cluster")?;
    let coord = c.coordinator.url();
    wait("every node registered", Duration::from_secs(120), || {
        let coord = coord.clone();
        async move { (procs::stats(&coord).await.ok()?.cluster?.nodes == n).then_some(()) }
    })
    .await?;
    let urls: Vec<String> = c.nodes.iter().map(procs::Proc::url).collect();
    let (rec, target) = Recorder::start().await?;
    rec.set_refusing(true);
    let mut rng = Rng::new(opts.seed);
    let subs = subscribe(&urls, &target, &mut rng).await?;
    for s in subs.iter().filter(|s| s.4) {
        rec.expect_qos2(s.0);
    }
    wait(
        "every subscription published",
        Duration::from_secs(60),
        || {
            let coord = coord.clone();
            async move {
                (procs::stats(&coord)
                    .await
                    .ok()?
                    .cluster?
                    .image_subscriptions
                    == u64::from(n))
                .then_some(())
            }
        },
    )
    .await?;
    // every node must know the whole membership before its puts are copied
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let acked = put_objects(&urls, opts.objects, opts.seed).await;
    let t_acked = Instant::now();
    let holders = |origin: u32| -> Vec<u32> { g.object_quorum(origin, mode == Mode::Xs) };
    let want_copies: u64 = acked
        .iter()
        .map(|(_, _, k)| holders(*k).len() as u64 - 1)
        .sum();
    let copies = wait(
        "every object fully replicated",
        Duration::from_secs(120),
        || {
            let urls = urls.clone();
            async move {
                let mut held = 0;
                for u in &urls {
                    let s = procs::stats(u).await.ok()?;
                    held += s.copies_unfinished + s.copies_finished;
                }
                (held >= want_copies).then_some(held)
            }
        },
    )
    .await?;
    let replication_seconds = t_acked.elapsed().as_secs_f64();
    // copies per subscription: the nodes' stores (the column quorum of the node that took
    // each Create)
    let mut sub_copies = 0u64;
    for u in &urls {
        sub_copies += procs::stats(u).await.map(|s| s.subscriptions).unwrap_or(0);
    }
    let sub_copies = sub_copies as f64 / subs.len().max(1) as f64;

    // the kills: a seeded random p_f fraction
    let mut order: Vec<u32> = (0..n).collect();
    let mut krng = Rng::new(opts.seed ^ (pf.to_bits()));
    for i in (1..order.len()).rev() {
        order.swap(i, krng.below(i as u64 + 1) as usize);
    }
    let k = (pf * f64::from(n)).round() as usize;
    let mut killed: Vec<u32> = order[..k].to_vec();
    killed.sort_unstable();
    for &d in &killed {
        c.nodes[d as usize].kill();
    }
    let t_kill = Instant::now();
    let dead: BTreeSet<u32> = killed.iter().copied().collect();
    let alive = |x: &u32| !dead.contains(x);

    // what is owed, and what the oracle allows: some holder of the object alive, and some
    // holder of the subscription: the column quorum of the node that took its Create, and
    // the coordinator's registry (it holds every subscription, and it lives)
    let mut owed = BTreeSet::new();
    let mut possible = BTreeSet::new();
    let mut possible_by_columns = 0;
    for &(id, t, origin) in &acked {
        let obj_alive = holders(origin).iter().any(alive);
        for &(sid, via, lo, hi, _) in &subs {
            if t >= lo && t < hi {
                owed.insert((sid, id));
                if obj_alive {
                    possible.insert((sid, id));
                    if g.subscription_quorum(via).iter().any(alive) {
                        possible_by_columns += 1;
                    }
                }
            }
        }
    }
    rec.set_refusing(false);
    // delivered: wait for every possible pair, then a quiet spell for late ones
    let mut last_change = Instant::now();
    let mut last = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let shown = rec.shown();
        let got = possible.iter().filter(|p| shown.contains_key(p)).count();
        let all = shown.len();
        if all != last {
            last = all;
            last_change = Instant::now();
        }
        let quiet = last_change.elapsed() > Duration::from_secs(5);
        if (got == possible.len() && quiet) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shown = rec.shown();
    let recovery_seconds = rec
        .shown()
        .keys()
        .filter_map(|p| rec.first_shown(*p))
        .max()
        .map_or(0.0, |t| t.saturating_duration_since(t_kill).as_secs_f64());
    let delivered = owed.iter().filter(|p| shown.contains_key(p)).count();
    let missed = possible.iter().filter(|p| !shown.contains_key(p)).count();
    let impossible = owed
        .iter()
        .filter(|p| shown.contains_key(p) && !possible.contains(p))
        .count();
    let qos2: BTreeSet<u64> = subs.iter().filter(|s| s.4).map(|s| s.0).collect();
    let duplicates = rec.extra_shows(|s| qos2.contains(&s));
    let qos1_repeats = rec.extra_shows(|s| !qos2.contains(&s));
    let r = match mode {
        Mode::Row => g.row_quorum(0).len() as f64,
        Mode::Xs => {
            let q: HashMap<u32, usize> = (0..n).map(|k| (k, g.xs_quorum(k).len())).collect();
            q.values().sum::<usize>() as f64 / f64::from(n)
        }
    };
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(QuorumRow {
        mode,
        pf,
        nodes: n,
        killed,
        acknowledged: acked.len(),
        owed: owed.len(),
        delivered,
        oracle: possible.len(),
        oracle_column_quorum_only: possible_by_columns,
        missed,
        impossible,
        duplicates,
        qos1_repeats,
        copies_per_object: (copies + acked.len() as u64) as f64 / acked.len().max(1) as f64,
        copies_per_subscription: sub_copies,
        replication_seconds,
        recovery_seconds,
        p_smd_analytic: (1.0 - pf.powf(r)).powf(f64::from(n) / r),
        p_smd_measured: delivered as f64 / owed.len().max(1) as f64,
    })
}

/// Prints the table.
pub fn print(r: &QuorumReport) {
    println!(
        "quorum replication, {} grid, {} objects, seed {}:",
        r.grid, r.objects, r.seed
    );
    println!(
        "{:>4} {:>4} {:>6} {:>6} {:>6} {:>9} {:>6} {:>6} {:>6} {:>5} {:>7} {:>8} {:>7} {:>8} {:>8}",
        "mode",
        "p_f",
        "killed",
        "acked",
        "owed",
        "delivered",
        "oracle",
        "missed",
        "imposs",
        "dups",
        "repeats",
        "copies/o",
        "repl s",
        "P_smd an",
        "measured"
    );
    for x in &r.rows {
        println!(
            "{:>4} {:>4.1} {:>6} {:>6} {:>6} {:>9} {:>6} {:>6} {:>6} {:>5} {:>7} {:>8.2} {:>7.2} {:>8.5} {:>8.5}",
            format!("{:?}", x.mode).to_lowercase(),
            x.pf,
            x.killed.len(),
            x.acknowledged,
            x.owed,
            x.delivered,
            x.oracle,
            x.missed,
            x.impossible,
            x.duplicates,
            x.qos1_repeats,
            x.copies_per_object,
            x.replication_seconds,
            x.p_smd_analytic,
            x.p_smd_measured
        );
    }
    println!(
        "{}",
        if r.pass {
            "PASS: delivered == oracle everywhere, no QoS 2 duplicate, xS >= row"
        } else {
            "FAIL: see the missed, impossible and duplicate columns"
        }
    );
}
