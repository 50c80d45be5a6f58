//! `dissem bench e2e`: the flags of the end-to-end benchmark, and its run (the benchmark
//! itself is `bench::e2e`).

use std::path::PathBuf;

use anyhow::bail;

#[derive(clap::Args, Debug)]
pub(crate) struct E2eArgs {
    /// Subscriptions of the iot workload.
    #[arg(long, default_value_t = 100_000)]
    pub(super) subs: usize,
    /// Seconds the saturation phase is sustained for (sized from a calibration burst).
    #[arg(long, default_value_t = 5.0)]
    pub(super) saturation_seconds: f64,
    /// Objects of the calibration burst that estimates the saturation rate.
    #[arg(long, default_value_t = 5_000)]
    pub(super) objects: usize,
    /// Seconds of the half-load and overload phases.
    #[arg(long, default_value_t = 5.0)]
    pub(super) seconds: f64,
    /// Concurrent writers in the saturation phase.
    #[arg(long, default_value_t = 64)]
    pub(super) writers: usize,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
    /// Write the latency plot (SVG) to this file.
    #[arg(long)]
    pub(super) svg: Option<PathBuf>,
    /// Trace the priority-7 puts: the node exports their put, test, match and push spans to
    /// this OTLP/HTTP collector (e.g. http://127.0.0.1:4318), to see where their latency goes.
    #[arg(long)]
    pub(super) otlp_endpoint: Option<String>,
}

pub(crate) fn bench_e2e(a: E2eArgs) -> anyhow::Result<bool> {
    if !(a.saturation_seconds.is_finite()
        && a.saturation_seconds > 0.0
        && a.saturation_seconds <= 600.0)
    {
        bail!(
            "--saturation-seconds must be in (0, 600], got {}",
            a.saturation_seconds
        );
    }
    let report = bench::e2e::run(&bench::e2e::E2eOptions {
        bin: std::env::current_exe()?,
        subs: a.subs,
        objects: a.objects,
        saturation_seconds: a.saturation_seconds,
        seconds: a.seconds,
        writers: a.writers,
        seed: a.seed,
        otlp_endpoint: a.otlp_endpoint,
    })?;
    bench::e2e::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    if let Some(path) = &a.svg {
        std::fs::write(path, bench::e2e::svg(&report))
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    Ok(report.lost == 0)
}
