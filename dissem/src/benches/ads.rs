//! The `--ads-*` flags of `dissem bench match --workload ads` (the shape of
//! [`bench::ads::AdsSpec`]; the defaults are its own).

/// The shape of the `ads` workload.
#[derive(clap::Args, Debug)]
pub(crate) struct AdsArgs {
    /// ads: attributes in all.
    #[arg(long, default_value_t = 120)]
    pub(super) ads_attrs: usize,
    /// ads: how many of them are numeric (the rest categorical).
    #[arg(long, default_value_t = 8)]
    pub(super) ads_numeric: usize,
    /// ads: values per categorical attribute.
    #[arg(long, default_value_t = 200)]
    pub(super) ads_values: usize,
    /// ads: Zipf exponent of attribute and value popularity (0: uniform).
    #[arg(long, default_value_t = 1.0)]
    pub(super) ads_zipf: f64,
    /// ads: mean predicates per subscription (a geometric count).
    #[arg(long, default_value_t = 8.0)]
    pub(super) ads_mean_preds: f64,
    /// ads: most predicates per subscription.
    #[arg(long, default_value_t = 56)]
    pub(super) ads_max_preds: usize,
    /// ads: attributes per event.
    #[arg(long, default_value_t = 20)]
    pub(super) ads_event_attrs: usize,
    /// ads: the most popular attributes every event carries.
    #[arg(long, default_value_t = 12)]
    pub(super) ads_core: usize,
}

impl AdsArgs {
    /// The workload's shape; the error names the flag.
    pub(crate) fn spec(&self) -> Result<bench::ads::AdsSpec, String> {
        let spec = bench::ads::AdsSpec {
            attrs: self.ads_attrs,
            numeric: self.ads_numeric,
            values: self.ads_values,
            zipf: self.ads_zipf,
            mean_preds: self.ads_mean_preds,
            max_preds: self.ads_max_preds,
            event_attrs: self.ads_event_attrs,
            core: self.ads_core,
        };
        spec.check()?;
        Ok(spec)
    }
}
