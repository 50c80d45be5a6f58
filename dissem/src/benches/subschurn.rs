//! `dissem bench subs-churn`: the flags of the benchmark of subscriptions changing while
//! objects flow, and its run (the benchmark itself is `bench::subschurn`).

use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub(crate) struct SubsChurnArgs {
    /// Registered subscriptions of the iot workload.
    #[arg(long, default_value_t = 100_000)]
    pub(super) subs: usize,
    /// Seconds of each phase.
    #[arg(long, default_value_t = 15.0)]
    pub(super) seconds: f64,
    /// Objects per second of the low-rate phases (the others run at half of saturation).
    #[arg(long, default_value_t = 50.0)]
    pub(super) low_rate: f64,
    /// Subscription changes per second, one phase each (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "5,50")]
    pub(super) change_rates: Vec<f64>,
    /// Only the low-rate phases (no calibration burst, no phases at half of saturation).
    #[arg(long)]
    pub(super) low_only: bool,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
}

pub(crate) fn bench_subs_churn(a: SubsChurnArgs) -> anyhow::Result<bool> {
    let report = bench::subschurn::run(&bench::subschurn::SubsChurnOptions {
        bin: std::env::current_exe()?,
        subs: a.subs,
        seconds: a.seconds,
        low_rate: a.low_rate,
        change_rates: a.change_rates,
        low_only: a.low_only,
        seed: a.seed,
    })?;
    bench::subschurn::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    Ok(report.lost == 0)
}
