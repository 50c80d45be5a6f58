//! `dissem bench latency`: the flags of the steady low-rate latency benchmark
//! (`bench::latency`).

use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub(crate) struct LatencyArgs {
    /// Target kinds to measure (comma separated): grpc-batch, webhook, webhook-batch, stream.
    #[arg(long, value_delimiter = ',', default_value = "grpc-batch,webhook")]
    pub(crate) kinds: Vec<String>,
    /// Subscriptions per kind.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) subs: usize,
    /// Subscriptions each object matches (at one endpoint).
    #[arg(long, default_value_t = 10)]
    pub(crate) fanout: usize,
    /// Objects per second, evenly spaced, each a unary Put.
    #[arg(long, default_value_t = 200.0)]
    pub(crate) rate: f64,
    /// Seconds of puts measured per kind (after two seconds of warm-up).
    #[arg(long, default_value_t = 15.0)]
    pub(crate) seconds: f64,
    /// PutStream writers the objects are spread over (as the NATS side by side publishes);
    /// 0: a unary Put each.
    #[arg(long, default_value_t = 4)]
    pub(crate) writers: usize,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

pub(crate) fn bench_latency(a: LatencyArgs) -> anyhow::Result<bool> {
    let kinds = a
        .kinds
        .iter()
        .map(|k| bench::cost::Kind::parse(k.trim()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let report = bench::latency::run(&bench::latency::LatencyOptions {
        bin: std::env::current_exe()?,
        kinds,
        subs: a.subs,
        fanout: a.fanout,
        rate: a.rate,
        seconds: a.seconds,
        writers: a.writers,
    })?;
    bench::latency::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    Ok(report.pass)
}
