//! `dissem bench match`: matching throughput of each engine on a synthetic workload.
//!
//! Engines: `cpu` (the match block with its per-shard strategy), `bloom` (the match block forced
//! onto the Bloom subset path, the one the GPU runs), `naive` (the reference matcher, also the
//! correctness oracle). Every engine's matches are compared on the events they all ran; any
//! difference makes the run fail. Figures are printed and optionally written as JSON.

use std::time::Instant;

use anyhow::{Context, bail};
use blocks::{Event, MatchIndex, ReferenceMatcher, ShardConfig, Strategy, StrategyChoice};
use serde::Serialize;

use crate::mem;
use crate::progress::Progress;
use crate::workload::{IotSpec, UniformSpec, Workload};

/// Changes a version of `--overlay` makes (a node applies changes a version at a time).
const OVERLAY_BATCH: usize = 100;

/// Which engines to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineChoice {
    Cpu,
    Bloom,
    Naive,
    Gpu,
    All,
}

/// Benchmark options (the CLI maps its flags onto these).
#[derive(Debug, Clone)]
pub struct MatchBenchOptions {
    pub workload: Workload,
    pub workload_name: String,
    pub subs: usize,
    pub events: usize,
    pub seed: u64,
    pub engine: EngineChoice,
    /// Events the naive engine runs (it is slow); all engines are compared on these.
    pub check_events: usize,
    pub batch: usize,
    pub bloom: blocks::bloom::BloomConfig,
    /// Strategy of the `cpu` engine (`Auto`: chosen per shard).
    pub strategy: StrategyChoice,
    /// Cells per numeric attribute for the cell strategy.
    pub cells: usize,
    /// Threads the CPU engines match on (each batch split between them; the GPU engine and the
    /// naive reference use one).
    pub threads: usize,
    /// Share of the subscriptions (0..=0.5) replaced after the build: the `cpu` engine is then
    /// built fresh over the changed set, and `cpu-overlay` is the base built before the change
    /// with the change as its overlay, 100 changes a version (what a node matches with
    /// between compactions).
    pub overlay: f64,
}

impl MatchBenchOptions {
    /// Defaults for a workload: small enough for a laptop run in seconds.
    pub fn new(workload: &str) -> anyhow::Result<MatchBenchOptions> {
        let w = match workload {
            "iot" => Workload::Iot(IotSpec),
            "ads" => Workload::Ads(crate::ads::AdsSpec::default().generator()),
            "uniform" => Workload::Uniform(UniformSpec {
                attrs: 20,
                preds: 10,
                eq: false,
                width: 0.5,
                cardinality: 100,
            }),
            other => bail!("unknown workload {other:?}: expected `iot`, `uniform` or `ads`"),
        };
        Ok(MatchBenchOptions {
            workload: w,
            workload_name: workload.to_string(),
            subs: 100_000,
            events: 20_000,
            seed: 1,
            engine: EngineChoice::All,
            check_events: 200,
            batch: 1024,
            bloom: blocks::bloom::BloomConfig::default(),
            strategy: StrategyChoice::Auto,
            cells: ShardConfig::default().cells,
            threads: 1,
            overlay: 0.0,
        })
    }
}

/// Figures for one engine.
#[derive(Debug, Clone, Serialize)]
pub struct EngineReport {
    pub engine: String,
    pub strategy: Option<String>,
    pub subscriptions: usize,
    pub events: usize,
    pub build_seconds: f64,
    pub match_seconds: f64,
    pub events_per_second: f64,
    pub matches_total: u64,
    pub matches_per_event: f64,
    pub bloom_candidates_rejected: u64,
    /// Subscriptions (conjunctions) checked exactly per event.
    pub verified_per_event: f64,
    /// The structure's own accounting of its heap, and per subscription.
    pub index_bytes: Option<u64>,
    pub index_bytes_per_subscription: Option<f64>,
    /// Resident memory growth while building, and the process peak so far.
    pub rss_growth_bytes: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
    /// The GPU engine's adapter and per-batch phase times.
    pub gpu: Option<GpuReport>,
}

/// What the GPU engine ran on and where its time went (per batch of events).
#[derive(Debug, Clone, Serialize)]
pub struct GpuReport {
    pub adapter: String,
    pub backend: String,
    pub device_type: String,
    pub on_gpu: bool,
    pub chunks: usize,
    pub batches: u64,
    pub object_filter_ms_per_batch: f64,
    pub upload_ms_per_batch: f64,
    pub dispatch_ms_per_batch: f64,
    pub readback_ms_per_batch: f64,
    pub overflow_reruns: u64,
    /// Events per second of the kernel alone (batch size / dispatch time), and the filter
    /// bytes it streamed per second: compare with the device's memory bandwidth.
    pub kernel_events_per_second: f64,
    pub kernel_filter_gb_per_second: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct MatchBenchReport {
    pub workload: String,
    pub subscriptions: usize,
    pub events: usize,
    pub checked_events: usize,
    pub seed: u64,
    pub bloom_bits: u32,
    pub bloom_k: u32,
    /// Threads the CPU engines matched on.
    pub threads: usize,
    pub engines: Vec<EngineReport>,
    /// Events per second of each engine relative to the naive reference (same run).
    pub speedup_vs_naive: Vec<(String, f64)>,
    pub identical_matches: bool,
    /// Engines that could not run on this workload, and why.
    pub skipped: Vec<String>,
    /// Subscriptions replaced after the build (`--overlay`), and the seconds the overlay of
    /// `cpu-overlay` took to compile.
    pub overlay_changed: usize,
    pub overlay_seconds: f64,
    /// `cpu-overlay`'s events per second over `cpu`'s (the fresh build of the same set).
    pub overlay_over_fresh: Option<f64>,
}

/// An engine's matches: those of the first `keep` events kept (the engines are compared on
/// them), the rest counted, their vectors left to the engine to fill again (keeping millions
/// of result vectors would time the allocator, not the engine).
#[derive(Debug, Default)]
struct Matched {
    keep: usize,
    kept: Vec<Vec<u64>>,
    events: usize,
    total: u64,
}

impl Matched {
    fn new(keep: usize) -> Matched {
        Matched {
            keep,
            ..Matched::default()
        }
    }

    /// Counts one batch's matches (event order), keeping them while fewer than `keep` are.
    fn take(&mut self, out: &mut [Vec<u64>]) {
        for o in out {
            self.events += 1;
            self.total += o.len() as u64;
            if self.kept.len() < self.keep {
                self.kept.push(std::mem::take(o));
            }
        }
    }
}

/// The CPU engine over `threads` threads: each batch is split between them (a cell shard
/// by conjunction blocks, the others by events). The answer is (Bloom-rejected, verified)
/// candidates.
fn match_on_threads(
    index: &MatchIndex,
    events: &[blocks::Event],
    opts: &MatchBenchOptions,
    bar: &indicatif::ProgressBar,
    all: &mut Matched,
) -> (u64, u64) {
    let (mut rejected, mut verified) = (0, 0);
    let mut out = Vec::new();
    for chunk in events.chunks(opts.batch) {
        let c = index.match_batch_split(chunk, opts.threads, &mut out);
        all.take(&mut out);
        bar.inc(chunk.len() as u64);
        rejected += c.bloom_rejected;
        verified += c.verified;
    }
    (rejected, verified)
}

/// Runs the benchmark.
pub fn run(opts: &MatchBenchOptions) -> anyhow::Result<MatchBenchReport> {
    if opts.subs == 0 || opts.events == 0 {
        bail!("--subs and --events must be at least 1");
    }
    if opts.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let progress = Progress::new();
    let bar = progress.bar(opts.subs as u64, "generating subscriptions");
    let mut subs = opts
        .workload
        .subscriptions(opts.seed, opts.subs, |i| bar.set_position(i as u64));
    bar.finish();
    let n_subs = subs.len();
    if !(0.0..=0.5).contains(&opts.overlay) {
        bail!("--overlay must be in [0, 0.5], got {}", opts.overlay);
    }
    // the replaced subscriptions: `subs` becomes the changed set, `before` keeps what they were
    let n_changed = (opts.overlay * n_subs as f64).round() as usize;
    let mut before: Vec<(usize, blocks::Dnf)> = Vec::with_capacity(n_changed);
    if n_changed > 0 {
        let fresh = opts
            .workload
            .subscriptions(opts.seed.wrapping_add(7919), n_changed, |_| {});
        let step = n_subs / n_changed;
        for (k, (_, d)) in fresh.into_iter().enumerate() {
            let at = k * step;
            before.push((at, std::mem::replace(&mut subs[at].1, d)));
        }
    }
    let mut overlay_seconds = 0.0;
    let events = opts.workload.events(opts.seed, opts.events);
    let checked = opts.check_events.min(opts.events);
    let mut engines = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut results: Vec<(String, Vec<Vec<u64>>)> = Vec::new();

    let want = |e: EngineChoice| opts.engine == e || opts.engine == EngineChoice::All;
    let with_overlay = (n_changed > 0).then_some(("cpu-overlay", opts.strategy, EngineChoice::Cpu));
    for (name, strategy, choice) in [
        Some(("cpu", opts.strategy, EngineChoice::Cpu)),
        with_overlay,
        Some((
            "bloom",
            StrategyChoice::Fixed(Strategy::Bloom),
            EngineChoice::Bloom,
        )),
        Some((
            "gpu",
            StrategyChoice::Fixed(Strategy::Bloom),
            EngineChoice::Gpu,
        )),
    ]
    .into_iter()
    .flatten()
    {
        if !want(choice) {
            continue;
        }
        let cfg = ShardConfig {
            bloom: opts.bloom,
            strategy,
            bloom_tables: true,
            // a match block only: exact-id indexes belong to the test workers
            test_ids: false,
            cells: opts.cells,
            ..ShardConfig::default()
        };
        progress.line(&format!(
            "{name}: building the index over {n_subs} subscriptions"
        ));
        // the engine gets its own copy, as a worker gets its image's: copying is not
        // building. One engine alone (no reference to compare with) takes the generated
        // list itself, so a 10M run holds one list, not two.
        let overlaid = name == "cpu-overlay";
        // (with an overlay, `cpu-overlay` builds from the list after `cpu`)
        let mut owned = if opts.engine == EngineChoice::All || n_changed > 0 {
            subs.clone()
        } else {
            std::mem::take(&mut subs)
        };
        if overlaid {
            // the base as it was built before the change
            for (at, d) in &before {
                owned[*at].1 = d.clone();
            }
        }
        let rss0 = mem::rss_bytes();
        let t = Instant::now();
        let index = match MatchIndex::build(cfg, owned) {
            Ok(i) => i,
            Err(blocks::index::IndexError::Build(
                e @ blocks::shard::BuildError::BloomUnavailable,
            )) if opts.engine == EngineChoice::All => {
                progress.line(&format!("{name}: skipped ({e}; raise the row-filter budget or use fewer distinct constants)"));
                skipped.push(format!("{name}: {e}"));
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("building the {name} index")),
        };
        let build = t.elapsed().as_secs_f64();
        let index = if overlaid {
            let t = Instant::now();
            // a version at a time, as a node applies them: the overlay in the layers
            // that many versions leave
            let mut i = index;
            for batch in before.chunks(OVERLAY_BATCH) {
                let changes = batch
                    .iter()
                    .map(|(at, _)| (subs[*at].0, Some(subs[*at].1.clone())));
                i = i
                    .changed_to(i.version() + 1, changes)
                    .context("compiling the overlay")?;
            }
            overlay_seconds = t.elapsed().as_secs_f64();
            progress.line(&format!(
                "{name}: overlay of {n_changed} changed subscriptions ({OVERLAY_BATCH} a \
                 version, {} layers) compiled in {:.0} ms",
                i.overlays().len(),
                overlay_seconds * 1000.0
            ));
            i
        } else {
            index
        };
        let rss1 = mem::rss_bytes();
        let stats = index.base().stats();
        let mut ctx = index.base().new_ctx();
        let mut subset = if choice == EngineChoice::Gpu {
            let base = index.base();
            let m = gpu::SubsetMatcher::new(
                base.filters(),
                base.conjunctions(),
                base.filter_words(),
                gpu::GpuOptions {
                    max_batch_objects: opts.batch.max(1),
                    ..gpu::GpuOptions::default()
                },
            )
            .context("preparing the GPU engine")?;
            match &m {
                gpu::SubsetMatcher::Gpu(g) => progress.line(&format!(
                    "gpu: adapter {} ({}, {}), {} resident chunk(s)",
                    g.info().name,
                    g.info().backend,
                    g.info().device_type,
                    g.chunks()
                )),
                gpu::SubsetMatcher::Cpu(_) => {
                    progress.line("gpu: no usable adapter, the CPU twin runs instead")
                }
            }
            Some(m)
        } else {
            None
        };
        let bar = progress.bar(events.len() as u64, &format!("{name}: matching"));
        let mut all = Matched::new(checked);
        let mut out = Vec::new();
        let mut rejected = 0;
        let mut verified = 0;
        let mut filter_seconds = 0.0;
        let t = Instant::now();
        if subset.is_none() && opts.threads > 1 {
            // the index is shared read-only; each thread has its own context
            let (rej, ver) = match_on_threads(&index, &events, opts, &bar, &mut all);
            rejected += rej;
            verified += ver;
        }
        for chunk in events.chunks(opts.batch) {
            if subset.is_none() && opts.threads > 1 {
                break; // matched above
            }
            let c = match subset.as_mut() {
                Some(m) => {
                    let tf = Instant::now();
                    let base = index.base();
                    let objs: Vec<u64> = chunk
                        .iter()
                        .flat_map(|e| base.event_filter(e, &mut ctx))
                        .collect();
                    filter_seconds += tf.elapsed().as_secs_f64();
                    let pairs = m.candidates(&[&objs]).pop().unwrap_or_default();
                    let mut cands: Vec<Vec<u32>> = vec![Vec::new(); chunk.len()];
                    for (o, rec) in pairs {
                        cands[o as usize].push(rec);
                    }
                    let mut recs: Vec<Vec<u32>> = vec![Vec::new(); chunk.len()];
                    let c = base.verify_candidates(chunk, &cands, &mut ctx, &mut recs);
                    index.finish(chunk, &recs, &mut out);
                    c
                }
                None => index.match_batch(chunk, &mut ctx, &mut out),
            };
            rejected += c.bloom_rejected;
            verified += c.verified;
            all.take(&mut out);
            bar.inc(chunk.len() as u64);
        }
        let secs = t.elapsed().as_secs_f64();
        bar.finish();
        let gpu_report = subset.as_ref().map(|m| match m {
            gpu::SubsetMatcher::Gpu(g) => {
                let tm = g.timings();
                let per = |x: f64| 1000.0 * x / tm.batches.max(1) as f64;
                GpuReport {
                    adapter: g.info().name.clone(),
                    backend: g.info().backend.clone(),
                    device_type: g.info().device_type.clone(),
                    on_gpu: true,
                    chunks: g.chunks(),
                    batches: tm.batches,
                    object_filter_ms_per_batch: 1000.0 * filter_seconds / tm.batches.max(1) as f64,
                    upload_ms_per_batch: per(tm.upload_seconds),
                    dispatch_ms_per_batch: per(tm.dispatch_seconds),
                    readback_ms_per_batch: per(tm.readback_seconds),
                    overflow_reruns: tm.overflow_reruns,
                    kernel_events_per_second: events.len() as f64 / tm.dispatch_seconds.max(1e-9),
                    kernel_filter_gb_per_second: (tm.batches as f64
                        * (index.base().conjunctions() * index.base().filter_words() * 8) as f64)
                        / tm.dispatch_seconds.max(1e-9)
                        / 1e9,
                }
            }
            gpu::SubsetMatcher::Cpu(_) => GpuReport {
                adapter: "none (CPU fallback)".into(),
                backend: "-".into(),
                device_type: "-".into(),
                on_gpu: false,
                chunks: 0,
                batches: 0,
                object_filter_ms_per_batch: 0.0,
                upload_ms_per_batch: 0.0,
                dispatch_ms_per_batch: 0.0,
                readback_ms_per_batch: 0.0,
                overflow_reruns: 0,
                kernel_events_per_second: 0.0,
                kernel_filter_gb_per_second: 0.0,
            },
        });
        engines.push(report(
            name,
            Some(format!("{:?}", stats.strategy).to_lowercase()),
            n_subs,
            &all,
            build,
            secs,
            rejected,
            verified,
            Some(stats.heap_bytes as u64),
            rss0.zip(rss1).map(|(a, b)| b.saturating_sub(a)),
        ));
        if let Some(last) = engines.last_mut() {
            last.gpu = gpu_report;
        }
        results.push((name.to_string(), all.kept));
        drop(index);
    }
    if want(EngineChoice::Naive) {
        let rss0 = mem::rss_bytes();
        let t = Instant::now();
        let mut r = ReferenceMatcher::new();
        for (id, d) in &subs {
            r.insert(*id, d.clone());
        }
        let build = t.elapsed().as_secs_f64();
        let rss1 = mem::rss_bytes();
        let bar = progress.bar(checked as u64, "naive: matching");
        let t = Instant::now();
        let mut all = Matched::new(checked);
        let mut found: Vec<Vec<u64>> = events[..checked]
            .iter()
            .map(|e: &Event| {
                bar.inc(1);
                r.match_event(e)
            })
            .collect();
        all.take(&mut found);
        let secs = t.elapsed().as_secs_f64();
        bar.finish();
        engines.push(report(
            "naive",
            None,
            n_subs,
            &all,
            build,
            secs,
            0,
            (subs.len() * all.events) as u64,
            None,
            rss0.zip(rss1).map(|(a, b)| b.saturating_sub(a)),
        ));
        results.push(("naive".to_string(), all.kept));
    }
    let common = results.iter().map(|r| r.1.len()).min().unwrap_or(0);
    let identical = results
        .windows(2)
        .all(|w| w[0].1[..common] == w[1].1[..common]);
    let naive_rate = engines
        .iter()
        .find(|e| e.engine == "naive")
        .map(|e| e.events_per_second);
    let speedup_vs_naive = match naive_rate {
        Some(n) if n > 0.0 => engines
            .iter()
            .filter(|e| e.engine != "naive")
            .map(|e| (e.engine.clone(), e.events_per_second / n))
            .collect(),
        _ => Vec::new(),
    };
    let rate = |n: &str| {
        engines
            .iter()
            .find(|e| e.engine == n)
            .map(|e| e.events_per_second)
    };
    let overlay_over_fresh = rate("cpu-overlay")
        .zip(rate("cpu"))
        .map(|(o, f)| o / f.max(1e-9));
    if let Some(r) = overlay_over_fresh {
        progress.line(&format!(
            "cpu-overlay matches at {:.2}x the fresh build's rate ({n_changed} subscriptions changed)",
            r
        ));
    }
    Ok(MatchBenchReport {
        overlay_changed: n_changed,
        overlay_seconds,
        overlay_over_fresh,
        workload: opts.workload_name.clone(),
        subscriptions: n_subs,
        events: events.len(),
        checked_events: common,
        seed: opts.seed,
        bloom_bits: opts.bloom.bits,
        bloom_k: opts.bloom.k,
        threads: opts.threads,
        engines,
        speedup_vs_naive,
        identical_matches: identical,
        skipped,
    })
}

#[allow(clippy::too_many_arguments)]
fn report(
    name: &str,
    strategy: Option<String>,
    subscriptions: usize,
    all: &Matched,
    build: f64,
    secs: f64,
    rejected: u64,
    verified: u64,
    index_bytes: Option<u64>,
    rss_growth: Option<u64>,
) -> EngineReport {
    let (events, total) = (all.events, all.total);
    EngineReport {
        engine: name.to_string(),
        strategy,
        subscriptions,
        events,
        build_seconds: build,
        match_seconds: secs,
        events_per_second: events as f64 / secs.max(1e-9),
        matches_total: total,
        matches_per_event: total as f64 / events.max(1) as f64,
        bloom_candidates_rejected: rejected,
        verified_per_event: verified as f64 / events.max(1) as f64,
        index_bytes,
        index_bytes_per_subscription: index_bytes.map(|b| b as f64 / subscriptions.max(1) as f64),
        rss_growth_bytes: rss_growth,
        peak_rss_bytes: mem::peak_rss_bytes(),
        gpu: None,
    }
}

/// Prints the report as a table.
pub fn print(r: &MatchBenchReport) {
    println!(
        "workload {}: {} subscriptions, {} events (all engines compared on the first {}), seed {}, bloom {} bits k={}, {} thread(s) for cpu and bloom",
        r.workload,
        r.subscriptions,
        r.events,
        r.checked_events,
        r.seed,
        r.bloom_bits,
        r.bloom_k,
        r.threads
    );
    println!(
        "{:<7} {:<8} {:>9} {:>12} {:>11} {:>10} {:>12} {:>10} {:>7} {:>9}",
        "engine",
        "strategy",
        "build s",
        "events/s",
        "matches",
        "per event",
        "verified/ev",
        "rejected",
        "B/sub",
        "peak MiB"
    );
    for e in &r.engines {
        println!(
            "{:<7} {:<8} {:>9.2} {:>12.0} {:>11} {:>10.2} {:>12.0} {:>10} {:>7} {:>9}",
            e.engine,
            e.strategy.as_deref().unwrap_or("-"),
            e.build_seconds,
            e.events_per_second,
            e.matches_total,
            e.matches_per_event,
            e.verified_per_event,
            e.bloom_candidates_rejected,
            e.index_bytes_per_subscription
                .map_or("-".to_string(), |b| format!("{b:.0}")),
            e.peak_rss_bytes
                .map_or("-".to_string(), |b| format!("{}", b >> 20)),
        );
    }
    for e in &r.engines {
        if let Some(g) = &e.gpu {
            println!(
                "{}: adapter {} (backend {}, device type {}), {} chunk(s), per batch: object filters {:.2} ms, upload {:.2} ms, dispatch {:.2} ms, readback {:.2} ms, {} overflow reruns; kernel alone {:.0} events/s streaming {:.1} GB/s of filters",
                e.engine,
                g.adapter,
                g.backend,
                g.device_type,
                g.chunks,
                g.object_filter_ms_per_batch,
                g.upload_ms_per_batch,
                g.dispatch_ms_per_batch,
                g.readback_ms_per_batch,
                g.overflow_reruns,
                g.kernel_events_per_second,
                g.kernel_filter_gb_per_second
            );
        }
    }
    for s in &r.skipped {
        println!("skipped {s}");
    }
    for (name, s) in &r.speedup_vs_naive {
        println!("{name}: {s:.1}x the naive reference");
    }
    println!(
        "matches identical across engines: {}",
        if r.identical_matches { "yes" } else { "NO" }
    );
}
