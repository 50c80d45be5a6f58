//! `dissem bench e2e`: durable put -> push delivered, through an embedded cluster, to gRPC
//! push and webhook subscribers on loopback (the `demo` setup with those two kinds, QoS 1).
//! Phases on the same cluster and subscriptions: a calibration burst that estimates the
//! saturation rate, saturation itself sustained for `--saturation-seconds` (writers put as
//! fast as they can; objects/s until the last delivery), half that rate (latency per
//! priority), and twice that rate (overload: priority 7 against priority 0, and whether a
//! backlog built up, as it must when the rate really is twice what the cluster sustains). Prints the figures, writes
//! JSON and an SVG plot of p99 latency per priority at half load and overload.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use serde::Serialize;

use crate::demo::{Latency, Phase, PhaseSpec, Targets, in_temp_dir, setup};
use crate::progress::Progress;

/// Options of the end-to-end benchmark.
#[derive(Debug, Clone)]
pub struct E2eOptions {
    pub bin: PathBuf,
    pub subs: usize,
    /// Objects of the calibration burst that estimates the saturation rate.
    pub objects: usize,
    /// The saturation phase runs unthrottled for about this long (at the rate the burst
    /// estimated), so its rate is a sustained one.
    pub saturation_seconds: f64,
    /// Length of the half-load and overload phases, seconds.
    pub seconds: f64,
    pub writers: usize,
    pub seed: u64,
    /// The node exports spans to this OTLP/HTTP collector and priority-7 puts are traced
    /// (where their time goes: put, tests, match, push).
    pub otlp_endpoint: Option<String>,
}

/// A phase at a fixed rate.
#[derive(Debug, Clone, Serialize)]
pub struct RatedPhase {
    pub rate: f64,
    pub phase: Phase,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct E2eReport {
    pub subscriptions: usize,
    pub writers: usize,
    /// Objects/s from the first put to the last delivery, writers unthrottled, over the
    /// sustained phase.
    pub saturation_objects_per_second: f64,
    /// How long the sustained saturation phase ran (first put to last delivery).
    pub saturation_seconds: f64,
    /// The calibration burst's rate (objects/s), which sized the sustained phase.
    pub burst_objects_per_second: f64,
    /// Deliveries (pushes acknowledged) per second in the saturation phase.
    pub saturation_deliveries_per_second: f64,
    /// The node process's CPU time (`/proc/<pid>/stat`) over the saturation phase divided by
    /// its deliveries, microseconds.
    pub saturation_node_cpu_us_per_delivery: f64,
    pub saturation: Phase,
    pub half_load: RatedPhase,
    pub overload: RatedPhase,
    /// Priority-7 p99 at 2x overload divided by its p99 at half load (target: <= 2).
    pub p7_p99_overload_over_half: f64,
    /// Priority-0 p99 at 2x overload divided by its p99 at half load, for comparison.
    pub p0_p99_overload_over_half: f64,
    /// At 2x overload, how long deliveries went on after the last put: a backlog that built
    /// up while the puts outran delivery.
    pub overload_backlog_seconds: f64,
    /// At 2x overload, how much longer the puts took than the rate planned: the node held
    /// its writers back (puts waiting for its write path, admitted in priority order).
    pub overload_puts_held_back_seconds: f64,
    /// Whether the overload phase built a backlog (deliveries ended over a tenth of the
    /// phase after the puts, or the puts took over a tenth longer than planned). When not,
    /// the saturation rate was not a saturation.
    pub overload_backlog_built: bool,
    pub lost: usize,
}

fn p99(l: &BTreeMap<u8, Latency>, p: u8) -> f64 {
    l.get(&p).map_or(0.0, |x| x.p99_ms)
}

/// A round step for about five ticks up to `max`.
fn tick_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// An SVG bar chart of p99 latency per priority, half load and overload side by side: a
/// title and subtitle, both axes labelled with ticks and grid lines, a legend, and each
/// bar's value written above it (and as hover text).
pub fn svg(r: &E2eReport) -> String {
    let (w, h, left, right, top, bottom) = (900.0, 460.0, 80.0, 20.0, 70.0, 60.0);
    let half = &r.half_load.phase.latency_by_priority;
    let over = &r.overload.phase.latency_by_priority;
    let max = (0..8u8)
        .flat_map(|p| [p99(half, p), p99(over, p)])
        .fold(1.0f64, f64::max);
    let step = tick_step(max);
    let top_value = (max / step).ceil() * step;
    let plot_h = h - top - bottom;
    let plot_w = w - left - right;
    let slot = plot_w / 8.0;
    let y0 = h - bottom;
    let y_of = |v: f64| y0 - plot_h * v / top_value;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{}\" y=\"22\" font-size=\"16\" text-anchor=\"middle\">p99 latency, \
         put to delivered, per priority</text>\
         <text x=\"{}\" y=\"42\" text-anchor=\"middle\" fill=\"#444\">{} subscriptions; \
         half load {:.0} objects/s, 2x overload {:.0} objects/s</text>",
        w / 2.0,
        w / 2.0,
        r.subscriptions,
        r.half_load.rate,
        r.overload.rate
    );
    // grid, ticks and the y axis's label
    let digits = if step >= 1.0 { 0 } else { 2 };
    for k in 0..=((top_value / step).round() as usize) {
        let v = step * k as f64;
        let y = y_of(v);
        let _ = write!(
            s,
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.digits$}</text>",
            w - right,
            left - 6.0,
            y + 4.0
        );
    }
    let _ = write!(
        s,
        "<line x1=\"{left}\" y1=\"{y0}\" x2=\"{:.1}\" y2=\"{y0}\" stroke=\"black\"/>\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{y0}\" stroke=\"black\"/>\
         <text transform=\"translate(20 {:.1}) rotate(-90)\" text-anchor=\"middle\">p99 \
         latency (ms)</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">object priority (7 most \
         urgent)</text>",
        w - right,
        top + plot_h / 2.0,
        left + plot_w / 2.0,
        h - 14.0
    );
    // the legend, top right inside the plot
    let lx = w - right - 230.0;
    for (i, (label, color)) in [
        (format!("half load ({:.0}/s)", r.half_load.rate), "#3366cc"),
        (format!("2x overload ({:.0}/s)", r.overload.rate), "#cc3333"),
    ]
    .iter()
    .enumerate()
    {
        let ly = top + 8.0 + 18.0 * i as f64;
        let _ = write!(
            s,
            "<rect x=\"{lx:.1}\" y=\"{ly:.1}\" width=\"12\" height=\"12\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{label}</text>",
            lx + 18.0,
            ly + 10.0
        );
    }
    for p in 0..8u8 {
        let x = left + slot * p as f64 + slot * 0.12;
        let bw = slot * 0.38;
        for (i, (v, color)) in [(p99(half, p), "#3366cc"), (p99(over, p), "#cc3333")]
            .into_iter()
            .enumerate()
        {
            let bx = x + bw * i as f64;
            let y = y_of(v);
            let _ = write!(
                s,
                "<rect x=\"{bx:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" \
                 fill=\"{color}\"><title>priority {p}: {v:.1} ms</title></rect>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{v:.1}</text>",
                y0 - y,
                bx + bw / 2.0,
                y - 3.0
            );
        }
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{p}</text>",
            x + bw,
            y0 + 16.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Runs the benchmark.
pub fn run(opts: &E2eOptions) -> anyhow::Result<E2eReport> {
    if opts.subs == 0 || opts.objects == 0 || opts.writers == 0 {
        bail!("--subs, --objects and --writers must be at least 1");
    }
    if opts.seconds.is_nan() || opts.seconds <= 0.0 || opts.seconds > 600.0 {
        bail!("--seconds must be in (0, 600], got {}", opts.seconds);
    }
    in_temp_dir("bench-e2e", async |dir| {
        let progress = Progress::new();
        let s = setup(
            &opts.bin,
            dir,
            opts.subs,
            opts.seed,
            Targets::GrpcAndWebhook,
            opts.otlp_endpoint.as_deref(),
            &progress,
        )
        .await?;
        let patience = Duration::from_secs(15);
        let unthrottled = |seed: u64, objects: usize| PhaseSpec {
            seed,
            objects,
            rate: None,
            writers: opts.writers,
            patience,
        };
        let burst = s
            .phase(
                &unthrottled(opts.seed + 1, opts.objects),
                &progress,
                "calibration burst",
            )
            .await?;
        let burst_ops = burst.put as f64 / burst.delivered_seconds.max(1e-9);
        // sized from the last rate seen until a phase lasts most of the time asked for (a
        // burst underestimates: the cluster speeds up as it warms)
        let mut rate = burst_ops;
        let mut round = 0;
        let cpu_now = || crate::cpu::process_cpu_seconds(s.node_pid()).unwrap_or(0.0);
        let (sat, sat_cpu) = loop {
            let objects = ((rate * opts.saturation_seconds) as usize).max(opts.objects);
            let cpu0 = cpu_now();
            let sat = s
                .phase(
                    &unthrottled(opts.seed + 4 + round, objects),
                    &progress,
                    "saturation",
                )
                .await?;
            let cpu = cpu_now() - cpu0;
            rate = sat.put as f64 / sat.delivered_seconds.max(1e-9);
            round += 1;
            if sat.delivered_seconds >= 0.8 * opts.saturation_seconds || round == 3 {
                break (sat, cpu);
            }
        };
        let ops = rate;
        let dps = sat.latency.count as f64 / sat.delivered_seconds.max(1e-9);
        let cpu_us = sat_cpu * 1e6 / sat.latency.count.max(1) as f64;
        progress.line(&format!(
            "saturation: {ops:.0} objects/s, {dps:.0} deliveries/s end to end, node CPU \
             {cpu_us:.1} µs per delivery"
        ));
        let half_load = rated(&s, opts, ops, 0.5, 2, "half load", &progress).await?;
        let overload = rated(&s, opts, ops, 2.0, 3, "2x overload", &progress).await?;
        let backlog = (overload.phase.delivered_seconds - overload.phase.put_seconds).max(0.0);
        let planned = overload.phase.put as f64 / overload.rate;
        let held_back = (overload.phase.put_seconds - planned).max(0.0);
        let ratio = |p: u8| {
            let h = p99(&half_load.phase.latency_by_priority, p);
            if h > 0.0 {
                p99(&overload.phase.latency_by_priority, p) / h
            } else {
                0.0
            }
        };
        Ok(E2eReport {
            subscriptions: opts.subs,
            writers: opts.writers,
            saturation_objects_per_second: ops,
            saturation_deliveries_per_second: dps,
            saturation_node_cpu_us_per_delivery: cpu_us,
            lost: burst.lost + sat.lost + half_load.phase.lost + overload.phase.lost,
            saturation_seconds: sat.delivered_seconds,
            burst_objects_per_second: burst_ops,
            overload_backlog_seconds: backlog,
            overload_puts_held_back_seconds: held_back,
            overload_backlog_built: backlog > 0.1 * overload.phase.put_seconds
                || held_back > 0.1 * planned,
            p7_p99_overload_over_half: ratio(7),
            p0_p99_overload_over_half: ratio(0),
            saturation: sat,
            half_load,
            overload,
        })
    })
}

/// A phase at `factor` times the saturation rate `ops`, lasting `opts.seconds`.
async fn rated(
    s: &crate::demo::Setup,
    opts: &E2eOptions,
    ops: f64,
    factor: f64,
    seed_offset: u64,
    label: &str,
    progress: &Progress,
) -> anyhow::Result<RatedPhase> {
    let rate = (ops * factor).max(1.0);
    let objects = ((rate * opts.seconds) as usize).max(16);
    let phase = s
        .phase(
            &PhaseSpec {
                seed: opts.seed + seed_offset,
                objects,
                rate: Some(rate),
                writers: opts.writers.max(256),
                patience: Duration::from_secs(15),
            },
            progress,
            label,
        )
        .await?;
    Ok(RatedPhase { rate, phase })
}

/// Prints the figures.
pub fn print(r: &E2eReport) {
    println!(
        "end to end: {} subscriptions, gRPC push + webhook (QoS 1), {} writers",
        r.subscriptions, r.writers
    );
    println!(
        "saturation: {:.0} objects/s, {:.0} deliveries/s sustained over {:.1} s (burst estimate {:.0}/s; {} objects, {} deliveries, p50 {:.1} ms, p99 {:.1} ms)",
        r.saturation_objects_per_second,
        r.saturation_deliveries_per_second,
        r.saturation_seconds,
        r.burst_objects_per_second,
        r.saturation.put,
        r.saturation.latency.count,
        r.saturation.latency.p50_ms,
        r.saturation.latency.p99_ms
    );
    println!(
        "saturation: node CPU {:.1} µs per delivery (node process CPU seconds / deliveries, \
         from /proc; `dissem bench cost` gives it per target kind)",
        r.saturation_node_cpu_us_per_delivery
    );
    for (name, ph) in [("half load", &r.half_load), ("2x overload", &r.overload)] {
        println!(
            "{name} ({:.0} objects/s): p50 {:.1} ms, p99 {:.1} ms, lost {}; the puts alone: p50 {:.1} ms, p99 {:.1} ms",
            ph.rate,
            ph.phase.latency.p50_ms,
            ph.phase.latency.p99_ms,
            ph.phase.lost,
            ph.phase.put_latency.p50_ms,
            ph.phase.put_latency.p99_ms
        );
        for (p, l) in &ph.phase.latency_by_priority {
            let put = ph.phase.put_latency_by_priority.get(p);
            println!(
                "  priority {p}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; its puts: p50 {:.1} ms, p99 {:.1} ms",
                l.p50_ms,
                l.p99_ms,
                l.max_ms,
                put.map_or(0.0, |l| l.p50_ms),
                put.map_or(0.0, |l| l.p99_ms)
            );
        }
    }
    println!(
        "2x overload: the puts took {:.2} s longer than planned (writers held back at the \
         write path), deliveries went on {:.2} s after the last put: {}",
        r.overload_puts_held_back_seconds,
        r.overload_backlog_seconds,
        if r.overload_backlog_built {
            "a backlog built up, as an overload should"
        } else {
            "no backlog built up (the phase was absorbed: the saturation rate above is not one)"
        }
    );
    println!(
        "priority 7 p99 at 2x overload / at half load: {:.2} (priority 0: {:.2}); lost {}",
        r.p7_p99_overload_over_half, r.p0_p99_overload_over_half, r.lost
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn ticks_are_round() {
        assert_eq!(super::tick_step(100.0), 20.0);
        assert_eq!(super::tick_step(7.0), 2.0);
        assert_eq!(super::tick_step(0.3), 0.1);
    }
}
