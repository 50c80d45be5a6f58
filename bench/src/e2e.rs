//! `dissem bench e2e`: durable put -> push delivered, through an embedded cluster, to gRPC
//! push and webhook subscribers on loopback (the `demo` setup with those two kinds, QoS 1).
//! Three phases on the same cluster and subscriptions: saturation (writers put as fast as
//! they can; objects/s until the last delivery), half that rate (latency per priority), and
//! twice that rate (overload: priority 7 against priority 0). Prints the figures, writes
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
    /// Objects of the saturation phase.
    pub objects: usize,
    /// Length of the half-load and overload phases, seconds.
    pub seconds: f64,
    pub writers: usize,
    pub seed: u64,
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
    /// Objects/s from the first put to the last delivery, writers unthrottled.
    pub saturation_objects_per_second: f64,
    /// Deliveries (pushes acknowledged) per second in the saturation phase.
    pub saturation_deliveries_per_second: f64,
    pub saturation: Phase,
    pub half_load: RatedPhase,
    pub overload: RatedPhase,
    /// Priority-7 p99 at 2x overload divided by its p99 at half load (target: <= 2).
    pub p7_p99_overload_over_half: f64,
    /// Priority-0 p99 at 2x overload divided by its p99 at half load, for comparison.
    pub p0_p99_overload_over_half: f64,
    pub lost: usize,
}

fn p99(l: &BTreeMap<u8, Latency>, p: u8) -> f64 {
    l.get(&p).map_or(0.0, |x| x.p99_ms)
}

/// An SVG bar chart of p99 latency per priority: half load and overload side by side.
pub fn svg(r: &E2eReport) -> String {
    let (w, h, left, bottom) = (720.0, 360.0, 60.0, 40.0);
    let half = &r.half_load.phase.latency_by_priority;
    let over = &r.overload.phase.latency_by_priority;
    let max = (0..8u8)
        .flat_map(|p| [p99(half, p), p99(over, p)])
        .fold(1.0f64, f64::max);
    let plot_h = h - bottom - 30.0;
    let slot = (w - left - 20.0) / 8.0;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{left}\" y=\"18\">p99 put -> delivered (ms) per priority: half load \
         ({:.0}/s, blue) and 2x overload ({:.0}/s, red); {} subscriptions</text>",
        r.half_load.rate, r.overload.rate, r.subscriptions
    );
    let y0 = h - bottom;
    let _ = write!(
        s,
        "<line x1=\"{left}\" y1=\"{y0}\" x2=\"{}\" y2=\"{y0}\" stroke=\"black\"/>\
         <line x1=\"{left}\" y1=\"30\" x2=\"{left}\" y2=\"{y0}\" stroke=\"black\"/>\
         <text x=\"4\" y=\"34\">{max:.0}</text><text x=\"4\" y=\"{y0}\">0</text>",
        w - 20.0
    );
    for p in 0..8u8 {
        let x = left + slot * p as f64 + slot * 0.15;
        let bw = slot * 0.35;
        for (i, (v, color)) in [(p99(half, p), "#3366cc"), (p99(over, p), "#cc3333")]
            .into_iter()
            .enumerate()
        {
            let bh = plot_h * v / max;
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" \
                 fill=\"{color}\"><title>priority {p}: {v:.1} ms</title></rect>",
                x + bw * i as f64,
                y0 - bh
            );
        }
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\">{p}</text>",
            x + bw * 0.8,
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
            &progress,
        )
        .await?;
        let patience = Duration::from_secs(15);
        let sat = s
            .phase(
                &PhaseSpec {
                    seed: opts.seed + 1,
                    objects: opts.objects,
                    rate: None,
                    writers: opts.writers,
                    patience,
                },
                &progress,
                "saturation",
            )
            .await?;
        let ops = sat.put as f64 / sat.delivered_seconds.max(1e-9);
        let dps = sat.latency.count as f64 / sat.delivered_seconds.max(1e-9);
        progress.line(&format!(
            "saturation: {ops:.0} objects/s, {dps:.0} deliveries/s end to end"
        ));
        let half_load = rated(&s, opts, ops, 0.5, 2, "half load", &progress).await?;
        let overload = rated(&s, opts, ops, 2.0, 3, "2x overload", &progress).await?;
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
            lost: sat.lost + half_load.phase.lost + overload.phase.lost,
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
        "saturation: {:.0} objects/s, {:.0} deliveries/s ({} objects, {} deliveries, p50 {:.1} ms, p99 {:.1} ms)",
        r.saturation_objects_per_second,
        r.saturation_deliveries_per_second,
        r.saturation.put,
        r.saturation.latency.count,
        r.saturation.latency.p50_ms,
        r.saturation.latency.p99_ms
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
            println!(
                "  priority {p}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                l.p50_ms, l.p99_ms, l.max_ms
            );
        }
    }
    println!(
        "priority 7 p99 at 2x overload / at half load: {:.2} (priority 0: {:.2}); lost {}",
        r.p7_p99_overload_over_half, r.p0_p99_overload_over_half, r.lost
    );
}
