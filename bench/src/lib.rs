//! Benchmark programs: deterministic workload generators and runners that print figures and
//! write JSON, each comparing engines against a reference measured in the same run.
//!
//! Unlike `blocks`, this crate does I/O (progress output, `/proc` memory figures, in-process
//! nodes on loopback, a sled baseline; it is the one place besides `storage` that opens sled,
//! for the baseline the ingest figures are compared with); the CLI's `bench` subcommands are
//! thin wrappers over it.

pub mod ads;
pub mod chaos;
pub mod chaosdisk;
pub mod chaosfed;
pub mod churnbench;
pub mod churnmetrics;
pub mod clusterbench;
pub mod cost;
pub mod cpu;
pub mod cut;
pub mod demo;
pub mod e2e;
pub mod elected;
pub mod etcdtrust;
pub mod failoverbench;
pub mod fedbench;
pub mod given;
pub mod ingestbench;
pub mod latency;
pub mod matchbench;
pub mod mem;
pub mod procs;
pub mod progress;
pub mod quorumbench;
pub mod recorder;
pub mod replbench;
pub mod resizebench;
pub mod subschurn;
pub mod workload;

pub use blocks::bloom::BloomConfig;
pub use blocks::{Strategy, StrategyChoice};

/// The `p` quantile (0..=1) of `sorted` by nearest rank (0 for none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Writes a serialisable report as pretty JSON.
pub fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> anyhow::Result<()> {
    use anyhow::Context;
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}
