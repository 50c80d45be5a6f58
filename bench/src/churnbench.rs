//! `dissem bench churn` (seed 004, time-compressed 10x): a grid of node processes under
//! churn. Two stable nodes (positions 0 and n-1, which every column quorum holds) live
//! throughout; the others join with exponential gaps (mean 0.4 s) at a free position on a
//! fresh disk and live Pareto lifetimes (xm 6 s, alpha 2.5, mean 10 s), then are SIGKILLed.
//! The subscribers (a recording gRPC endpoint in this process, subscriptions created through
//! a stable node) are attached throughout. After an 18 s warm-up come 30 rounds, each putting
//! one object through each of up to 10 distinct live nodes with exponential gaps (mean
//! 0.1 s), 1 s apart, then 3 s of final collection. A pair counts as delivered when the
//! subscriber was shown it within the 1 s window after its put; the measures are seed 004's
//! ([`crate::churnmetrics`]). After the run, churn stops and the objects get a long grace
//! to arrive: an acknowledged object that some matching subscriber never saw is lost.
//! Fixed seed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runtime::grid::Grid;
use serde::Serialize;
use storage::ObjectId;

use crate::churnmetrics::{Counts, Pair};
use crate::procs::{self, Proc};
use crate::recorder::Recorder;
use crate::workload::Rng;

/// Options of the churn benchmark (defaults: seed 004 compressed 10x).
#[derive(Debug, Clone)]
pub struct ChurnOptions {
    pub bin: PathBuf,
    pub grid: Grid,
    pub seed: u64,
    pub warmup_s: f64,
    pub rounds: usize,
    pub join_gap_mean_s: f64,
    pub life_xm_s: f64,
    pub life_alpha: f64,
    pub round_nodes: usize,
    pub put_gap_mean_s: f64,
    pub round_wait_s: f64,
    pub final_s: f64,
    pub window_s: f64,
    /// The coordinator's node lease (ms): how soon a dead node's objects are taken over.
    pub lease_ms: u64,
}

impl ChurnOptions {
    /// Seed 004's settings, compressed 10x.
    pub fn seed004(bin: PathBuf) -> ChurnOptions {
        ChurnOptions {
            bin,
            grid: Grid { rows: 5, cols: 6 },
            seed: 4,
            warmup_s: 18.0,
            rounds: 30,
            join_gap_mean_s: 0.4,
            life_xm_s: 6.0,
            life_alpha: 2.5,
            round_nodes: 10,
            put_gap_mean_s: 0.1,
            round_wait_s: 1.0,
            final_s: 3.0,
            window_s: 1.0,
            lease_ms: 1500,
        }
    }
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct ChurnReport {
    pub grid: String,
    pub seed: u64,
    pub stable_delivery_ratio: Option<f64>,
    pub initial_delivery_ratio: Option<f64>,
    pub coverage: Option<f64>,
    pub duplicates_per_pair: Option<f64>,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub acknowledged: usize,
    /// Acknowledged objects some matching subscriber never saw (after the grace).
    pub acknowledged_lost: usize,
    /// Puts not acknowledged (the node died, or too few copies): not owed.
    pub unacknowledged: usize,
    pub joins: usize,
    pub kills: usize,
    pub mean_alive: f64,
    /// QoS 2 pairs shown twice (must be 0).
    pub qos2_duplicates: u64,
    /// Owed pairs not shown within the delivery window.
    pub late: Late,
    pub counts: Counts,
    /// 0 lost, stable delivery ratio >= 0.99, 0 QoS 2 duplicates.
    pub pass: bool,
}

fn exp(rng: &mut Rng, mean: f64) -> f64 {
    -mean * (1.0 - rng.unit()).max(1e-12).ln()
}

fn pareto(rng: &mut Rng, xm: f64, alpha: f64) -> f64 {
    xm / (1.0 - rng.unit()).max(1e-12).powf(1.0 / alpha)
}

/// Owed pairs not shown within the delivery window, and why they may be late.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Late {
    pub pairs: usize,
    /// Of them, to QoS 2 subscriptions.
    pub qos2: usize,
    /// Of them, of objects whose origin was killed between the put and their first show.
    pub origin_died: usize,
}

/// A live churning node: its process and when it dies.
struct Live {
    proc: Proc,
    url: String,
    dies: Instant,
}

type Alive = Arc<Mutex<BTreeMap<u32, Live>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One subscription: (id, lo, hi, QoS 2).
type Sub = (u64, i64, i64, bool);

/// An acknowledged put: (id, temp, when it was sent).
type Acked = (ObjectId, i64, Instant);

/// Runs the benchmark.
pub fn run(opts: &ChurnOptions) -> anyhow::Result<ChurnReport> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run_async(opts))
}

fn node_args(dir: &std::path::Path, pos: u32, incarnation: usize, coord: &str) -> Vec<String> {
    let mut a: Vec<String> = ["node", "--listen", "127.0.0.1:0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(procs::small_node_flags());
    a.extend([
        "--data".into(),
        dir.join(format!("node{pos}-{incarnation}"))
            .display()
            .to_string(),
        "--node".into(),
        pos.to_string(),
        "--coordinator".into(),
        coord.to_string(),
        "--cluster-secret-file".into(),
        dir.join("coordinator")
            .join("cluster.secret")
            .display()
            .to_string(),
    ]);
    a
}

async fn run_async(opts: &ChurnOptions) -> anyhow::Result<ChurnReport> {
    let g = opts.grid;
    let n = g.len();
    let dir = procs::temp_dir("bench-churn");
    let bin = opts.bin.clone();
    let coord_args: Vec<String> = [
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--grid",
        &g.to_string(),
        "--allow-private-targets",
        "--lease-ms",
        &opts.lease_ms.to_string(),
        "--data",
        &dir.join("coordinator").display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let coordinator = {
        let bin = bin.clone();
        tokio::task::spawn_blocking(move || Proc::start(&bin, &coord_args)).await?
    };
    let coord = coordinator.url();
    let stable_pos = [0, n - 1];
    let mut stable = Vec::new();
    for &p in &stable_pos {
        let (bin, args) = (bin.clone(), node_args(&dir, p, 0, &coord));
        stable.push(tokio::task::spawn_blocking(move || Proc::start(&bin, &args)).await?);
    }
    procs::wait(
        "the stable nodes registered",
        Duration::from_secs(60),
        || {
            let coord = coord.clone();
            async move { (procs::stats(&coord).await.ok()?.cluster?.nodes >= 2).then_some(()) }
        },
    )
    .await?;
    let (rec, target) = Recorder::start().await?;
    let mut rng = Rng::new(opts.seed);
    let through = vec![stable[0].url(); 12];
    let subs: Vec<Sub> = crate::quorumbench::subscribe(&through, &target, &mut rng)
        .await?
        .into_iter()
        .map(|(id, _, lo, hi, qos2)| (id, lo, hi, qos2))
        .collect();
    for s in subs.iter().filter(|s| s.3) {
        rec.expect_qos2(s.0);
    }

    // the churn: joins at free positions, SIGKILL at the end of each lifetime
    let alive: Alive = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let joins = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let kills = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // every join and kill, to explain a duplicate
    let events: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let churn = {
        let (alive, stop, joins, kills) =
            (alive.clone(), stop.clone(), joins.clone(), kills.clone());
        let events = events.clone();
        let (bin, dir, coord) = (bin.clone(), dir.clone(), coord.clone());
        let (gap, xm, alpha) = (opts.join_gap_mean_s, opts.life_xm_s, opts.life_alpha);
        let mut rng = Rng::new(opts.seed ^ 0xc4u64);
        tokio::spawn(async move {
            let mut incarnation = 0usize;
            let mut next_join = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                // deaths
                let now = Instant::now();
                let due: Vec<u32> = lock(&alive)
                    .iter()
                    .filter(|(_, l)| l.dies <= now)
                    .map(|(p, _)| *p)
                    .collect();
                for p in due {
                    if let Some(mut l) = lock(&alive).remove(&p) {
                        l.proc.kill();
                        kills.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        lock(&events).push((Instant::now(), format!("kill {p}")));
                    }
                }
                // a join at a free position
                if now >= next_join {
                    next_join = now + Duration::from_secs_f64(exp(&mut rng, gap));
                    let free: Vec<u32> = (1..n - 1)
                        .filter(|p| !lock(&alive).contains_key(p))
                        .collect();
                    if !free.is_empty() {
                        let pos = free[rng.below(free.len() as u64) as usize];
                        incarnation += 1;
                        let life = pareto(&mut rng, xm, alpha);
                        let (bin, args) = (bin.clone(), node_args(&dir, pos, incarnation, &coord));
                        if let Ok(proc) =
                            tokio::task::spawn_blocking(move || Proc::start(&bin, &args)).await
                        {
                            let url = proc.url();
                            let dies = Instant::now() + Duration::from_secs_f64(life);
                            lock(&alive).insert(pos, Live { proc, url, dies });
                            lock(&events).push((Instant::now(), format!("join {pos}")));
                            joins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    eprintln!("churn: {:.0} s warm-up", opts.warmup_s);
    tokio::time::sleep(Duration::from_secs_f64(opts.warmup_s)).await;

    // the rounds
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let unacked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut samples = Vec::new();
    let mut puts = tokio::task::JoinSet::new();
    let mut prng = Rng::new(opts.seed ^ 0x9u64);
    let stable_urls: Vec<(u32, String)> = stable_pos
        .iter()
        .zip(&stable)
        .map(|(p, s)| (*p, s.url()))
        .collect();
    let mut msg = 0usize;
    for round in 0..opts.rounds {
        let mut live: Vec<(u32, String)> = lock(&alive)
            .iter()
            .map(|(p, l)| (*p, l.url.clone()))
            .chain(stable_urls.iter().cloned())
            .collect();
        samples.push(live.len() as f64);
        // up to `round_nodes` distinct live nodes, in random order
        for i in (1..live.len()).rev() {
            live.swap(i, prng.below(i as u64 + 1) as usize);
        }
        live.truncate(opts.round_nodes);
        for (_, url) in live {
            tokio::time::sleep(Duration::from_secs_f64(exp(&mut prng, opts.put_gap_mean_s))).await;
            let t = prng.below(100) as i64;
            msg += 1;
            let (acked, unacked) = (acked.clone(), unacked.clone());
            let mid = format!("churn-{msg}");
            puts.spawn(async move {
                let sent = Instant::now();
                let mut req = procs::put_request(
                    &blocks::Event::new([("temp", blocks::Value::from(t))]),
                    mid,
                );
                req.data = vec![b'c'; 64];
                // a node that dies mid-put is not retried elsewhere: the put is just not
                // acknowledged
                match procs::put_retrying(&url, req, Duration::from_millis(500)).await {
                    Ok(id) => lock(&acked).push((id, t, sent)),
                    Err(_) => {
                        unacked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
        eprintln!("churn: round {} of {}", round + 1, opts.rounds);
        tokio::time::sleep(Duration::from_secs_f64(opts.round_wait_s)).await;
    }
    while puts.join_next().await.is_some() {}
    tokio::time::sleep(Duration::from_secs_f64(opts.final_s)).await;
    let shown_at_end = rec.shown();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = churn.await;

    // the measures over the owed pairs (every subscriber stayed: all targets are stable)
    let acked = lock(&acked).clone();
    let mut owed = BTreeSet::new();
    let mut counts = Counts::default();
    let mut lat = Vec::new();
    let window = Duration::from_secs_f64(opts.window_s);
    let kills_of: Vec<(Instant, u32)> = lock(&events)
        .iter()
        .filter_map(|(t, e)| Some((*t, e.strip_prefix("kill ")?.parse().ok()?)))
        .collect();
    let mut late = Late::default();
    for &(id, t, sent) in &acked {
        for &(sid, lo, hi, qos2) in &subs {
            if t < lo || t >= hi {
                continue;
            }
            owed.insert((sid, id));
            let first = rec.first_shown((sid, id));
            let in_window = first.is_some_and(|f| f.saturating_duration_since(sent) <= window);
            if !in_window {
                late.pairs += 1;
                late.qos2 += usize::from(qos2);
                // its origin died before it was delivered: only a takeover (a lease later)
                // could deliver it
                let until = first.unwrap_or(sent + window);
                late.origin_died += usize::from(
                    kills_of
                        .iter()
                        .any(|(k, p)| *p == id.node && *k >= sent && *k <= until),
                );
            }
            if let Some(f) = first {
                lat.push(f.saturating_duration_since(sent).as_secs_f64() * 1000.0);
            }
            counts.add(Pair {
                stayed: true,
                received: in_window,
                copies: if in_window {
                    shown_at_end.get(&(sid, id)).copied().unwrap_or(1)
                } else {
                    0
                },
            });
        }
    }
    // the grace: what is still missing has up to 60 s more (churn has stopped)
    let missing = |shown: &BTreeMap<(u64, ObjectId), u32>| {
        owed.iter()
            .filter(|p| !shown.contains_key(p))
            .map(|p| p.1)
            .collect::<BTreeSet<ObjectId>>()
    };
    let _ = procs::try_wait_for(Duration::from_secs(60), || {
        let m = missing(&rec.shown()).len();
        async move { (m == 0).then_some(()) }
    })
    .await;
    let lost = missing(&rec.shown()).len();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p).round() as usize]
        }
    };
    let qos2: BTreeSet<u64> = subs.iter().filter(|s| s.3).map(|s| s.0).collect();
    let qos2_duplicates = rec.extra_shows(|s| qos2.contains(&s));
    explain_duplicates(&rec, &qos2, &lock(&events));
    let m = counts.measures();
    let mean_alive = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    for (_, mut l) in std::mem::take(&mut *lock(&alive)) {
        l.proc.kill();
    }
    drop(stable);
    drop(coordinator);
    let _ = std::fs::remove_dir_all(&dir);
    let pass =
        lost == 0 && m.stable_delivery_ratio.is_some_and(|r| r >= 0.99) && qos2_duplicates == 0;
    Ok(ChurnReport {
        grid: g.to_string(),
        seed: opts.seed,
        stable_delivery_ratio: m.stable_delivery_ratio,
        initial_delivery_ratio: m.initial_delivery_ratio,
        coverage: m.coverage,
        duplicates_per_pair: m.duplicates_per_pair,
        latency_p50_ms: pct(0.5),
        latency_p99_ms: pct(0.99),
        acknowledged: acked.len(),
        acknowledged_lost: lost,
        unacknowledged: unacked.load(std::sync::atomic::Ordering::Relaxed),
        joins: joins.load(std::sync::atomic::Ordering::Relaxed),
        kills: kills.load(std::sync::atomic::Ordering::Relaxed),
        mean_alive,
        qos2_duplicates,
        late,
        counts,
        pass,
    })
}

/// Prints, for each QoS 2 pair shown more than once, its calls at the subscriber and the
/// joins and kills from 5 s before its first call to its last.
fn explain_duplicates(rec: &Recorder, qos2: &BTreeSet<u64>, events: &[(Instant, String)]) {
    let Some(t0) = events.first().map(|e| e.0) else {
        return;
    };
    let at = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    for (pair, n) in rec.shown() {
        if n < 2 || !qos2.contains(&pair.0) {
            continue;
        }
        let calls = rec.calls(pair);
        let (Some(first), Some(last)) = (calls.first(), calls.last()) else {
            continue;
        };
        eprintln!(
            "QoS 2 duplicate: subscription {} object {}:{} shown {n} times",
            pair.0, pair.1.node, pair.1.seq
        );
        for (t, what, port) in &calls {
            eprintln!("  {:8.3} s  {what} from port {port}", at(*t));
        }
        let from = first.0.checked_sub(Duration::from_secs(5)).unwrap_or(t0);
        let near: Vec<String> = events
            .iter()
            .filter(|(t, _)| *t >= from && *t <= last.0)
            .map(|(t, e)| format!("{e} at {:.3}", at(*t)))
            .collect();
        eprintln!("  churn meanwhile: {}", near.join(", "));
    }
}

/// Prints the figures.
pub fn print(r: &ChurnReport) {
    let f = |x: Option<f64>| x.map_or("N/A".to_string(), |v| format!("{v:.4}"));
    println!(
        "churn (seed 004, 10x compressed), {} grid, seed {}:",
        r.grid, r.seed
    );
    println!(
        "  joins {}, kills {}, mean alive {:.1}",
        r.joins, r.kills, r.mean_alive
    );
    println!(
        "  acknowledged {}, lost {}, not acknowledged {}",
        r.acknowledged, r.acknowledged_lost, r.unacknowledged
    );
    println!(
        "  stable delivery ratio {}, initial {}, coverage {}, duplicates per reached pair {}",
        f(r.stable_delivery_ratio),
        f(r.initial_delivery_ratio),
        f(r.coverage),
        f(r.duplicates_per_pair)
    );
    println!(
        "  latency p50 {:.1} ms, p99 {:.1} ms; QoS 2 duplicates {}",
        r.latency_p50_ms, r.latency_p99_ms, r.qos2_duplicates
    );
    println!(
        "  outside the delivery window: {} pairs ({} QoS 2; {} of objects whose origin was \
         killed before they were shown)",
        r.late.pairs, r.late.qos2, r.late.origin_died
    );
    println!(
        "{}",
        if r.pass {
            "PASS: 0 acknowledged objects lost, stable delivery ratio >= 0.99, 0 QoS 2 duplicates"
        } else {
            "FAIL: see the figures above"
        }
    );
}
