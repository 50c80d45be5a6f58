//! The benchmark commands (`bench match|ingest|cluster|e2e|latency|subs-churn|cost|quorum|churn|failover|federation|chaos|resize`)
//! and `demo`: flags in, a call into
//! the `bench` crate, figures out.

use bench::matchbench::{self, EngineChoice, MatchBenchOptions};
use bench::workload::{UniformSpec, Workload};
use bench::{Strategy, StrategyChoice};

use super::*;

mod ads;
mod e2e;
mod latency;
mod resize;
mod subschurn;
use ads::AdsArgs;
pub(super) use e2e::{E2eArgs, bench_e2e};
pub(super) use latency::bench_latency;
pub(super) use resize::bench_resize;
pub(super) use subschurn::{SubsChurnArgs, bench_subs_churn};

#[derive(Subcommand, Debug)]
pub(super) enum Bench {
    /// Matching throughput of each engine on a synthetic workload.
    Match(MatchArgs),
    /// Durable puts per second through the gRPC API vs sled with a flush per write.
    Ingest(IngestArgs),
    /// Objects per second through ingest -> test -> match with 1, 2, 4 node processes.
    Cluster(ClusterArgs),
    /// Durable put -> push delivered (gRPC and webhook): saturation, half load, 2x overload.
    E2e(E2eArgs),
    /// Subscriptions that change while objects flow: put -> delivered latency with and
    /// without creates, updates and deletes, how soon a change is matched, node CPU per
    /// change.
    SubsChurn(SubsChurnArgs),
    /// Put -> delivered at a steady low rate (200 objects/s, fan-out 10, 1,000
    /// subscriptions), per target kind: where nothing waits, every deadline shows.
    Latency(latency::LatencyArgs),
    /// Node CPU per delivery (from /proc) and objects/s for gRPC batch, webhook and stream
    /// targets, each object matching one subscription.
    Cost(CostArgs),
    /// Quorum replication on a grid of node processes: a p_f fraction SIGKILLed, deliveries
    /// against the oracle and the seed's analytic P_smd.
    Quorum(QuorumArgs),
    /// Seed 004's churn experiment, 10x compressed: nodes join and die under a stream of puts.
    Churn(ChurnArgs),
    /// Coordinator failover on etcd: the leader SIGKILLed under steady puts, time until
    /// matching resumes, nothing lost, no QoS 2 duplicate (needs `etcd` on the PATH).
    Failover(FailoverArgs),
    /// Federation between `dissem up` clusters: all-active (a triangle, a link cut mid-run),
    /// active-passive (the primary killed, the switch back) and spillover (a refusing
    /// subscriber), each pass or fail.
    Federation(FederationArgs),
    /// Seeded fault schedules over etcd, two coordinators and a grid of nodes (kills,
    /// pauses past the lease, etcd restarts, subscription changes while a node is down),
    /// with an oracle after each: nothing lost, no QoS 2 duplicate, nothing misdelivered,
    /// no deleted subscription back, no old version serving (needs `etcd` on the PATH).
    Chaos(ChaosArgs),
    /// An online grid resize under load: 2x3 grows to 3x3 (--grid, --to) and back, a node
    /// SIGKILLed during each move; nothing lost, no QoS 2 duplicate (needs `etcd`).
    Resize(resize::ResizeArgs),
}

#[derive(clap::Args, Debug)]
pub(super) struct ChaosArgs {
    /// The first schedule's seed (schedule i has seed + i); a failure names the seed that
    /// replays it with `--schedules 1`. Default: from the clock, printed.
    #[arg(long)]
    pub(super) seed: Option<u64>,
    /// Schedules to run.
    #[arg(long, default_value_t = 200)]
    pub(super) schedules: usize,
    /// Keep running schedules until this many minutes have passed (after `--schedules`).
    #[arg(long)]
    pub(super) minutes: Option<f64>,
    /// Faults per schedule.
    #[arg(long, default_value_t = 4)]
    pub(super) faults: usize,
    /// The grid of nodes, ROWSxCOLS.
    #[arg(long, default_value = "3x3")]
    pub(super) grid: String,
    /// Puts per second, spread over the nodes.
    #[arg(long, default_value_t = 40)]
    pub(super) rate: u32,
    /// The coordinators' etcd lease in seconds.
    #[arg(long, default_value_t = 2)]
    pub(super) lease_ttl: u64,
    /// Three schedules of three faults (CI): under a minute here.
    #[arg(long)]
    pub(super) quick: bool,
    /// Write the figures as JSON to this file (after every schedule, `pass` false until
    /// the end).
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(super) fn bench_chaos(a: ChaosArgs) -> anyhow::Result<bool> {
    let grid: runtime::grid::Grid = a
        .grid
        .parse()
        .map_err(|e| anyhow::anyhow!("--grid {:?}: {e}", a.grid))?;
    if a.rate == 0 || a.faults == 0 || a.lease_ttl == 0 {
        bail!("--rate, --faults and --lease-ttl must be at least 1");
    }
    if a.minutes.is_some_and(|m| !(m.is_finite() && m > 0.0)) {
        bail!("--minutes must be a positive number");
    }
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let (schedules, faults, minutes) = if a.quick {
        (3, 3, None)
    } else {
        (a.schedules, a.faults, a.minutes)
    };
    eprintln!("chaos seed {seed}");
    let report = bench::chaos::run(&bench::chaos::ChaosOptions {
        bin: std::env::current_exe()?,
        seed,
        schedules,
        minutes,
        faults,
        grid: (grid.rows, grid.cols),
        rate: a.rate,
        lease_ttl: a.lease_ttl,
        json: a.json.clone(),
    })?;
    bench::chaos::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    if !report.pass {
        bail!("the chaos benchmark found violations: see the seeds above");
    }
    Ok(true)
}

#[derive(clap::Args, Debug)]
pub(super) struct FederationArgs {
    /// A few seconds per mode instead of the sizes (2,000 objects per publisher,
    /// 20 s runs).
    #[arg(long)]
    pub(super) quick: bool,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(super) fn bench_federation(a: FederationArgs) -> anyhow::Result<bool> {
    use bench::fedbench::FederationOptions;
    let bin = std::env::current_exe()?;
    let o = if a.quick {
        FederationOptions::quick(bin)
    } else {
        FederationOptions::full(bin)
    };
    let report = bench::fedbench::run(&o)?;
    bench::fedbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    if !report.pass {
        bail!("the federation benchmark failed: see the figures above");
    }
    Ok(true)
}

#[derive(clap::Args, Debug)]
pub(super) struct FailoverArgs {
    /// Times the leader is SIGKILLed (each time restarted as a standby).
    #[arg(long, default_value_t = 5)]
    pub(super) kills: usize,
    /// Coordinator processes (one leads).
    #[arg(long, default_value_t = 3)]
    pub(super) coordinators: usize,
    /// Node processes (a one-row grid).
    #[arg(long, default_value_t = 3)]
    pub(super) nodes: u32,
    /// Puts per second, spread over the nodes.
    #[arg(long, default_value_t = 100)]
    pub(super) rate: u32,
    /// The coordinators' etcd lease in seconds.
    #[arg(long, default_value_t = 2)]
    pub(super) lease_ttl: u64,
    /// Seconds of steady running before each kill.
    #[arg(long, default_value_t = 3.0)]
    pub(super) between_s: f64,
    /// Subscriptions to register first (matching nothing): what each new leader rebuilds
    /// its registry from.
    #[arg(long, default_value_t = 0)]
    pub(super) subs: usize,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(super) fn bench_failover(a: FailoverArgs) -> anyhow::Result<bool> {
    if a.coordinators < 2 || a.nodes == 0 || a.rate == 0 {
        bail!("--coordinators must be at least 2, --nodes and --rate at least 1");
    }
    if !(a.between_s.is_finite() && a.between_s > 0.0) {
        bail!("--between-s must be a positive number of seconds");
    }
    let report = bench::failoverbench::run(&bench::failoverbench::FailoverOptions {
        bin: std::env::current_exe()?,
        kills: a.kills,
        coordinators: a.coordinators,
        nodes: a.nodes,
        rate: a.rate,
        lease_ttl: a.lease_ttl,
        between: std::time::Duration::from_secs_f64(a.between_s),
        subs: a.subs,
    })?;
    bench::failoverbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    if !report.pass {
        bail!("the failover benchmark failed: objects lost, QoS 2 duplicates, or a slow failover");
    }
    Ok(true)
}

#[derive(clap::Args, Debug)]
pub(super) struct ChurnArgs {
    /// The grid (positions 0 and n-1 are the stable nodes).
    #[arg(long, default_value = "5x6")]
    pub(super) grid: runtime::grid::Grid,
    /// Random seed (joins, lifetimes, puts).
    #[arg(long, default_value_t = 4)]
    pub(super) seed: u64,
    /// Publication rounds after the warm-up.
    #[arg(long, default_value_t = 30)]
    pub(super) rounds: usize,
    /// Seconds of warm-up before the first round.
    #[arg(long, default_value_t = 18.0)]
    pub(super) warmup_s: f64,
    /// The coordinator's node lease in ms (a live node whose heartbeats are late by more
    /// is taken for dead).
    #[arg(long, default_value_t = 1500)]
    pub(super) lease_ms: u64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(super) fn bench_churn(a: ChurnArgs) -> anyhow::Result<bool> {
    if a.grid.len() < 3 {
        bail!("--grid needs at least 3 positions (two stable nodes and one that churns)");
    }
    if a.rounds == 0 || a.rounds > 10_000 {
        bail!("--rounds must be between 1 and 10000");
    }
    if !(0.0..=600.0).contains(&a.warmup_s) {
        bail!("--warmup-s must be in [0, 600]");
    }
    let mut opts = bench::churnbench::ChurnOptions::seed004(std::env::current_exe()?);
    opts.grid = a.grid;
    opts.seed = a.seed;
    opts.rounds = a.rounds;
    opts.warmup_s = a.warmup_s;
    if a.lease_ms < 100 {
        bail!("--lease-ms must be at least 100");
    }
    opts.lease_ms = a.lease_ms;
    let report = bench::churnbench::run(&opts)?;
    bench::churnbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    if !report.pass {
        bail!(
            "the churn benchmark failed: objects lost, a stable delivery ratio under 0.99, or QoS 2 duplicates"
        );
    }
    Ok(true)
}

#[derive(clap::Args, Debug)]
pub(super) struct QuorumArgs {
    /// The grid: one node process per position, plus the coordinator.
    #[arg(long, default_value = "5x6")]
    pub(super) grid: runtime::grid::Grid,
    /// Fractions of the nodes SIGKILLed (comma separated), each on a fresh cluster.
    #[arg(long, value_delimiter = ',', default_values_t = [0.0, 0.1, 0.2, 0.3, 0.4])]
    pub(super) pf: Vec<f64>,
    /// Where objects are copied: row (R(i)), xs (R(i) ∪ C(j)), or both (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("row"), String::from("xs")])]
    pub(super) mode: Vec<String>,
    /// Objects put through random nodes.
    #[arg(long, default_value_t = 300)]
    pub(super) objects: usize,
    /// Random seed (subscriptions, objects, which nodes die).
    #[arg(long, default_value_t = 7)]
    pub(super) seed: u64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(super) fn bench_quorum(a: QuorumArgs) -> anyhow::Result<bool> {
    let modes = a
        .mode
        .iter()
        .map(|m| m.parse::<bench::quorumbench::Mode>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--mode {e}"))?;
    let report = bench::quorumbench::run(&bench::quorumbench::QuorumOptions {
        bin: std::env::current_exe()?,
        grid: a.grid,
        pfs: a.pf,
        modes,
        objects: a.objects,
        seed: a.seed,
    })?;
    bench::quorumbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    if !report.pass {
        bail!("the quorum benchmark failed: deliveries differ from the oracle, or duplicates");
    }
    Ok(true)
}

#[derive(clap::Args, Debug)]
pub(super) struct CostArgs {
    /// Target kinds to measure (comma separated): grpc-batch, webhook, webhook-batch, stream.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "grpc-batch,webhook,webhook-batch,stream"
    )]
    pub(super) kinds: Vec<String>,
    /// Subscriptions per kind.
    #[arg(long, default_value_t = 1_000)]
    pub(super) subs: usize,
    /// Subscriptions each object matches (at one endpoint, so they can share a push).
    #[arg(long, default_value_t = 1)]
    pub(super) fanout: usize,
    /// Objects put per kind (after a warm-up of a twentieth of that).
    #[arg(long, default_value_t = 100_000)]
    pub(super) objects: usize,
    /// Concurrent PutStream writers.
    #[arg(long, default_value_t = 8)]
    pub(super) writers: usize,
    /// Puts each writer keeps unanswered.
    #[arg(long, default_value_t = 32)]
    pub(super) window: usize,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(super) fn bench_cost(a: CostArgs) -> anyhow::Result<bool> {
    let kinds = a
        .kinds
        .iter()
        .map(|k| bench::cost::Kind::parse(k.trim()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let report = bench::cost::run(&bench::cost::CostOptions {
        bin: std::env::current_exe()?,
        kinds,
        subs: a.subs,
        fanout: a.fanout,
        objects: a.objects,
        writers: a.writers,
        window: a.window,
    })?;
    bench::cost::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    Ok(report.pass)
}

#[derive(clap::Args, Debug)]
pub(super) struct ClusterArgs {
    /// Node process counts to run (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 2, 4])]
    pub(super) nodes: Vec<u32>,
    /// Subscriptions of the iot workload.
    #[arg(long, default_value_t = 100_000)]
    pub(super) subs: usize,
    /// Objects put per node count.
    #[arg(long, default_value_t = 20_000)]
    pub(super) objects: usize,
    /// Concurrent writers.
    #[arg(long, default_value_t = 64)]
    pub(super) writers: usize,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Objects also checked against the naive reference matcher.
    #[arg(long, default_value_t = 200)]
    pub(super) check_objects: usize,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(super) fn demo(
    subs: usize,
    objects: usize,
    rate: f64,
    seed: u64,
    json: Option<PathBuf>,
) -> anyhow::Result<bool> {
    let report = bench::demo::run(&bench::demo::DemoOptions {
        bin: std::env::current_exe()?,
        subs,
        objects,
        rate,
        seed,
    })?;
    bench::demo::print(&report);
    if let Some(path) = &json {
        bench::write_json(path, &report)?;
    }
    Ok(report.lost == 0 && report.duplicates_by_qos.get(&2).is_none_or(|d| *d == 0))
}

pub(super) fn bench_cluster(a: ClusterArgs) -> anyhow::Result<bool> {
    if a.subs == 0 || a.objects == 0 || a.writers == 0 || a.writers > 1024 {
        bail!("--subs and --objects must be at least 1, --writers between 1 and 1024");
    }
    let report = bench::clusterbench::run(&bench::clusterbench::ClusterOptions {
        bin: std::env::current_exe()?,
        nodes: a.nodes,
        subs: a.subs,
        objects: a.objects,
        writers: a.writers,
        seed: a.seed,
        check_objects: a.check_objects,
    })?;
    bench::clusterbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    Ok(report.identical_matches)
}

#[derive(clap::Args, Debug)]
pub(super) struct IngestArgs {
    /// Object sizes in bytes (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 65536])]
    pub(super) sizes: Vec<usize>,
    /// Concurrent writers (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64])]
    pub(super) writers: Vec<usize>,
    /// Seconds per configuration and path.
    #[arg(long, default_value_t = 3.0)]
    pub(super) seconds: f64,
    /// Puts each writer keeps in flight on its PutStream in the pipelined row.
    #[arg(long, default_value_t = 32)]
    pub(super) window: usize,
    /// The replicated rows: a cluster of node processes on this grid, one run per
    /// --write-copies setting (the first is the reference of the ratio).
    #[arg(long, default_value = "1x3")]
    pub(super) grid: runtime::grid::Grid,
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 3])]
    pub(super) write_copies: Vec<usize>,
    /// Concurrent writers of the replicated rows (spread over the nodes).
    #[arg(long, default_value_t = 64)]
    pub(super) replicated_writers: usize,
    /// Leave the replicated rows out.
    #[arg(long)]
    pub(super) no_replicated: bool,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(super) fn bench_ingest(a: IngestArgs) -> anyhow::Result<bool> {
    if a.sizes
        .iter()
        .any(|&s| s == 0 || s > runtime::Limits::default().max_object_bytes)
    {
        bail!(
            "--sizes must be between 1 and {} bytes",
            runtime::Limits::default().max_object_bytes
        );
    }
    if a.writers.iter().any(|&w| w == 0 || w > 1024) {
        bail!("--writers must be between 1 and 1024");
    }
    if !(a.seconds > 0.0 && a.seconds <= 600.0) {
        bail!("--seconds must be in (0, 600], got {}", a.seconds);
    }
    if !(1..=4096).contains(&a.window) {
        bail!("--window must be between 1 and 4096, got {}", a.window);
    }
    if a.replicated_writers == 0 || a.replicated_writers > 1024 {
        bail!("--replicated-writers must be between 1 and 1024");
    }
    if a.write_copies.is_empty() || a.write_copies.contains(&0) {
        bail!("--write-copies must list settings of at least 1, e.g. 1,3");
    }
    let replicated_size = a.sizes.first().copied().unwrap_or(1024);
    let mut report = bench::ingestbench::run(&bench::ingestbench::IngestOptions {
        sizes: a.sizes,
        writers: a.writers,
        seconds: a.seconds,
        window: a.window,
    })?;
    if !a.no_replicated {
        report.replicated = Some(bench::replbench::run(
            &bench::replbench::ReplicatedOptions {
                bin: std::env::current_exe()?,
                grid: a.grid,
                write_copies: a.write_copies,
                writers: a.replicated_writers,
                object_bytes: replicated_size,
                seconds: a.seconds,
            },
        )?);
    }
    bench::ingestbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    Ok(true)
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WorkloadArg {
    Iot,
    Uniform,
    /// Ad targeting: Zipf-skewed categorical attributes (the --ads-* flags).
    Ads,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EngineArg {
    /// The match block with its per-shard strategy.
    Cpu,
    /// The match block forced onto the Bloom subset path (the GPU's path, run on the CPU).
    Bloom,
    /// The Bloom subset path with the scan on the GPU (wgpu; falls back to the CPU twin).
    Gpu,
    /// The naive reference matcher.
    Naive,
    /// Every engine above.
    All,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StrategyArg {
    /// Chosen per shard from its statistics.
    Auto,
    /// Access-predicate index.
    Access,
    /// Bloom subset scan.
    Bloom,
    /// Negative cell bitsets.
    Cells,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KindArg {
    Range,
    Eq,
}

/// `--events`: a count, or a file of events.
#[derive(Debug, Clone)]
pub(super) enum EventsArg {
    Count(usize),
    File(PathBuf),
}

impl std::str::FromStr for EventsArg {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<EventsArg, Self::Err> {
        Ok(match s.parse() {
            Ok(n) => EventsArg::Count(n),
            Err(_) => EventsArg::File(PathBuf::from(s)),
        })
    }
}

/// Events a given workload is repeated up to, so its throughput is measured over enough.
const GIVEN_MIN_EVENTS: usize = 2_000;

#[derive(clap::Args, Debug)]
pub(super) struct MatchArgs {
    /// Workload to generate.
    #[arg(long, value_enum, default_value_t = WorkloadArg::Iot)]
    pub(super) workload: WorkloadArg,
    /// Number of subscriptions.
    #[arg(long, default_value_t = 100_000)]
    pub(super) subs: usize,
    /// Number of events to match, or with --patterns a file of JSON events (one object per
    /// line; repeated in order up to 2,000 events when it holds fewer). 20,000 by default:
    /// two thousand are two batches, and the first pass over a fresh index weighed on them.
    #[arg(long, default_value = "20000")]
    pub(super) events: EventsArg,
    /// Your own filters instead of a generated workload: a file with one per line
    /// (EventBridge JSON, or the text syntax); needs --events FILE.
    #[arg(long)]
    pub(super) patterns: Option<PathBuf>,
    /// Random seed (the same seed gives the same workload).
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Engines to run; every engine's matches are compared.
    #[arg(long, value_enum, default_value_t = EngineArg::All)]
    pub(super) engine: EngineArg,
    /// Events the naive reference runs; all engines are compared on these.
    #[arg(long, default_value_t = 200)]
    pub(super) check_events: usize,
    /// Events per match batch. Each batch reads the index once (at a million subscriptions
    /// 150-270 MB, far past the caches): 1,024 events share that read where 256 paid for it
    /// four times (W1 on one thread 3,751 -> 6,358 events/s, W2 9,260 -> 14,230).
    #[arg(long, default_value_t = 1024)]
    pub(super) batch: usize,
    /// Threads the cpu and bloom engines match on (each batch split between them: a cell
    /// shard's conjunction blocks, or the events).
    #[arg(long, default_value_t = 1)]
    pub(super) threads: usize,
    /// Share of the subscriptions (0..=0.5) replaced after the build: `cpu` is then built
    /// over the changed set and `cpu-overlay` is the earlier base with the change as its
    /// overlay, applied 100 changes a version (a node between compactions); the run prints
    /// the two rates' ratio.
    #[arg(long, default_value_t = 0.0)]
    pub(super) overlay: f64,
    /// Bloom filter bits (m): a multiple of 64, 64..=1024.
    #[arg(long, default_value_t = 256)]
    pub(super) bloom_bits: u32,
    /// Match strategy of the `cpu` engine.
    #[arg(long, value_enum, default_value_t = StrategyArg::Auto)]
    pub(super) strategy: StrategyArg,
    /// Cells per numeric attribute for the cell strategy.
    #[arg(long, default_value_t = 32)]
    pub(super) cells: usize,
    /// Bloom bits per predicate (k), 1..=8.
    #[arg(long, default_value_t = 3)]
    pub(super) bloom_k: u32,
    /// uniform: number of attributes.
    #[arg(long, default_value_t = 20)]
    pub(super) attrs: usize,
    /// uniform: predicates per subscription (on distinct attributes).
    #[arg(long, default_value_t = 10)]
    pub(super) preds: usize,
    /// uniform: predicate kind.
    #[arg(long, value_enum, default_value_t = KindArg::Range)]
    pub(super) kind: KindArg,
    /// uniform, range: fraction of the domain each range covers.
    #[arg(long, default_value_t = 0.5)]
    pub(super) width: f64,
    /// uniform, eq: distinct values per attribute.
    #[arg(long, default_value_t = 100)]
    pub(super) cardinality: u64,
    #[command(flatten)]
    pub(super) ads: AdsArgs,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(super) fn bench_match(a: MatchArgs) -> anyhow::Result<bool> {
    let mut opts = MatchBenchOptions::new(match a.workload {
        WorkloadArg::Iot => "iot",
        WorkloadArg::Uniform => "uniform",
        WorkloadArg::Ads => "ads",
    })?;
    if a.workload == WorkloadArg::Ads {
        opts.workload = Workload::Ads(a.ads.spec().map_err(anyhow::Error::msg)?.generator());
    }
    if a.workload == WorkloadArg::Uniform {
        if a.attrs == 0 || a.preds == 0 || a.preds > a.attrs {
            bail!(
                "--preds must be between 1 and --attrs ({}), got {}",
                a.attrs,
                a.preds
            );
        }
        if !(a.width > 0.0 && a.width <= 1.0) {
            bail!("--width must be in (0, 1], got {}", a.width);
        }
        if a.cardinality == 0 || a.cardinality > bench::workload::DOMAIN {
            bail!(
                "--cardinality must be between 1 and {}, got {}",
                bench::workload::DOMAIN,
                a.cardinality
            );
        }
        opts.workload = Workload::Uniform(UniformSpec {
            attrs: a.attrs,
            preds: a.preds,
            eq: a.kind == KindArg::Eq,
            width: a.width,
            cardinality: a.cardinality,
        });
    }
    opts.bloom = blocks_bloom(a.bloom_bits, a.bloom_k)?;
    opts.subs = a.subs;
    match (&a.patterns, &a.events) {
        (Some(p), EventsArg::File(e)) => {
            let given = bench::given::load(p, e)?;
            opts.subs = given.subscriptions.len();
            opts.events = given.events.len().max(GIVEN_MIN_EVENTS);
            opts.workload_name = format!("{} x {}", p.display(), e.display());
            opts.workload = Workload::Given(std::sync::Arc::new(given));
        }
        (Some(_), EventsArg::Count(_)) => {
            bail!("--patterns needs --events FILE (JSON events, one per line)")
        }
        (None, EventsArg::File(e)) => bail!(
            "--events {}: not a number; a file of events goes with --patterns FILE",
            e.display()
        ),
        (None, EventsArg::Count(n)) => opts.events = *n,
    }
    opts.seed = a.seed;
    opts.check_events = a.check_events;
    opts.batch = a.batch;
    if a.threads == 0 || a.threads > 256 {
        bail!("--threads must be between 1 and 256, got {}", a.threads);
    }
    opts.threads = a.threads;
    opts.overlay = a.overlay;
    if a.cells == 0 || a.cells > 1024 {
        bail!("--cells must be between 1 and 1024, got {}", a.cells);
    }
    opts.cells = a.cells;
    opts.strategy = match a.strategy {
        StrategyArg::Auto => StrategyChoice::Auto,
        StrategyArg::Access => StrategyChoice::Fixed(Strategy::Access),
        StrategyArg::Bloom => StrategyChoice::Fixed(Strategy::Bloom),
        StrategyArg::Cells => StrategyChoice::Fixed(Strategy::Cells),
    };
    opts.engine = match a.engine {
        EngineArg::Cpu => EngineChoice::Cpu,
        EngineArg::Bloom => EngineChoice::Bloom,
        EngineArg::Naive => EngineChoice::Naive,
        EngineArg::Gpu => EngineChoice::Gpu,
        EngineArg::All => EngineChoice::All,
    };
    let report = matchbench::run(&opts)?;
    matchbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    Ok(report.identical_matches)
}

pub(super) fn blocks_bloom(bits: u32, k: u32) -> anyhow::Result<bench::BloomConfig> {
    Ok(bench::BloomConfig { bits, k }.validate()?)
}
