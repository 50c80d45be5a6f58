//! `dissem bench subs-churn`: subscriptions that change while objects flow. An embedded
//! cluster (`dissem up`) holds `--subs` iot subscriptions (gRPC and webhook, QoS 1); objects
//! flow at a low rate and at half of saturation, each rate once without changes and once per
//! change rate (creates, updates and deletes mixed, of subscriptions to a second gRPC
//! endpoint). For each phase: put -> delivered latency of the registered subscriptions
//! (judged against their own matches: none lost), the changes' answer times, the time from a
//! change's answer to a put being delivered through it (a probe subscription created, then at
//! once an object only it matches), and the node's CPU per change (the phase's CPU above
//! what its deliveries cost at the same rate without changes, divided by its changes; the
//! changed subscriptions match none of the phase's objects, so no delivery of theirs is
//! counted as the change's).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use proto::v1;
use serde::Serialize;
use storage::ObjectId;

use crate::demo::{Latency, Phase, PhaseSpec, Shared, Targets, in_temp_dir, latency, lock, setup};
use crate::procs;
use crate::progress::Progress;
use crate::workload::{IotSpec, Workload};

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct SubsChurnOptions {
    pub bin: PathBuf,
    pub subs: usize,
    /// Seconds of each phase.
    pub seconds: f64,
    /// Objects per second of the low-rate phases.
    pub low_rate: f64,
    /// Subscription changes per second of the change phases.
    pub change_rates: Vec<f64>,
    /// Skip the phases at half of saturation (and the burst that measures it).
    pub low_only: bool,
    pub seed: u64,
}

/// The changes of one phase.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Changes {
    /// Changes asked for per second, and made.
    pub rate: f64,
    pub made: usize,
    pub failed: usize,
    /// The answer time of each kind of change (in force cluster-wide when answered).
    pub create: Latency,
    pub update: Latency,
    pub delete: Latency,
    /// From a probe subscription's create answer to the delivery of an object put right
    /// after it that only it matches.
    pub answer_to_delivered: Latency,
    /// Probes whose object never came (the change was not in force when answered).
    pub probes_lost: usize,
    /// The node's CPU over the phase above what its deliveries cost in the same rate's
    /// phase without changes (CPU per delivery there), per change, microseconds.
    pub node_cpu_us_per_change: f64,
}

/// One phase: objects at a rate, with or without changes.
#[derive(Debug, Clone, Serialize)]
pub struct ChurnPhase {
    pub label: String,
    pub object_rate: f64,
    pub phase: Phase,
    pub node_cpu_seconds: f64,
    pub changes: Option<Changes>,
    /// p99 of this phase over the p99 of the same rate without changes.
    pub p99_over_quiet: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct SubsChurnReport {
    pub subscriptions: usize,
    pub registered_seconds: f64,
    pub registered_per_second: f64,
    pub saturation_objects_per_second: f64,
    pub phases: Vec<ChurnPhase>,
    pub node_images_applied: u64,
    pub node_images_compiled: u64,
    pub lost: usize,
}

/// Runs the benchmark.
pub fn run(opts: &SubsChurnOptions) -> anyhow::Result<SubsChurnReport> {
    if opts.subs == 0 || !(opts.seconds > 0.0 && opts.seconds <= 600.0) {
        bail!("--subs must be at least 1 and --seconds in (0, 600]");
    }
    if !(opts.low_rate > 0.0 && opts.low_rate <= 100_000.0) {
        bail!("--low-rate must be in (0, 100000], got {}", opts.low_rate);
    }
    if let Some(r) = opts
        .change_rates
        .iter()
        .find(|r| !(**r > 0.0 && **r <= 10_000.0))
    {
        bail!("--change-rates must each be in (0, 10000], got {r}");
    }
    in_temp_dir("bench-subs-churn", async |dir| {
        let progress = Progress::new();
        let t = Instant::now();
        let s = setup(
            &opts.bin,
            dir,
            opts.subs,
            opts.seed,
            Targets::GrpcAndWebhook,
            None,
            &progress,
        )
        .await?;
        let registered = t.elapsed().as_secs_f64();
        progress.line(&format!(
            "{} subscriptions registered and loaded in {registered:.1} s ({:.0}/s)",
            opts.subs,
            opts.subs as f64 / registered
        ));
        let churn_seen: Shared = Arc::default();
        let churn_target = crate::demo::grpc_endpoint(churn_seen.clone(), false).await?;
        let mut rates = vec![("low", opts.low_rate)];
        let mut saturation = 0.0;
        if !opts.low_only {
            let burst = s
                .phase(
                    &PhaseSpec {
                        seed: opts.seed + 100,
                        objects: 2_000,
                        rate: None,
                        writers: 64,
                        patience: Duration::from_secs(15),
                    },
                    &progress,
                    "calibration burst",
                )
                .await?;
            saturation = burst.put as f64 / burst.delivered_seconds.max(1e-9);
            progress.line(&format!("saturation about {saturation:.0} objects/s"));
            rates.push(("half", (saturation / 2.0).max(1.0)));
        }
        let mut phases = Vec::new();
        let mut lost = 0;
        let mut next_seed = opts.seed + 200;
        let mut churner = Churner::new(opts.seed, &s.url(), churn_target, churn_seen);
        for (name, rate) in rates {
            let mut quiet: Option<(f64, f64)> = None;
            for change_rate in std::iter::once(None).chain(opts.change_rates.iter().map(Some)) {
                next_seed += 1;
                let label = match change_rate {
                    None => format!("{name} rate {rate:.0}/s, no changes"),
                    Some(c) => format!("{name} rate {rate:.0}/s, {c} changes/s"),
                };
                let objects = ((rate * opts.seconds) as usize).max(8);
                let spec = PhaseSpec {
                    seed: next_seed,
                    objects,
                    rate: Some(rate),
                    writers: 256,
                    patience: Duration::from_secs(30),
                };
                let cpu0 = crate::cpu::process_cpu_seconds(s.node_pid()).unwrap_or(0.0);
                let stop = Arc::new(AtomicBool::new(false));
                let running = change_rate.map(|c| {
                    let stop = stop.clone();
                    let mut ch = std::mem::take(&mut churner);
                    let c = *c;
                    tokio::spawn(async move {
                        let got = ch.run(c, &stop).await;
                        (ch, got)
                    })
                });
                let phase = s.phase(&spec, &progress, &label).await?;
                stop.store(true, Ordering::SeqCst);
                let mut changes = match running {
                    Some(h) => {
                        let (ch, got) = h.await?;
                        churner = ch;
                        Some(got?)
                    }
                    None => None,
                };
                let cpu = crate::cpu::process_cpu_seconds(s.node_pid()).unwrap_or(0.0) - cpu0;
                // the quiet phase's CPU per delivery stands for the deliveries' share (phases
                // differ in how many deliveries their objects make)
                let per_delivery = cpu / phase.matched.max(1) as f64;
                if let Some(c) = changes.as_mut()
                    && let Some((q, _)) = quiet
                {
                    let above = cpu - q * phase.matched as f64;
                    c.node_cpu_us_per_change = (above.max(0.0) * 1e6) / c.made.max(1) as f64;
                }
                let p99_over_quiet = match quiet {
                    Some((_, q99)) if q99 > 0.0 => phase.latency.p99_ms / q99,
                    _ => 1.0,
                };
                if change_rate.is_none() {
                    quiet = Some((per_delivery, phase.latency.p99_ms));
                }
                lost += phase.lost;
                let line = match &changes {
                    None => format!(
                        "{label}: p50 {:.1} ms, p99 {:.1} ms, lost {}",
                        phase.latency.p50_ms, phase.latency.p99_ms, phase.lost
                    ),
                    Some(c) => format!(
                        "{label}: p50 {:.1} ms, p99 {:.1} ms ({p99_over_quiet:.2}x quiet), lost \
                         {}; {} changes (create p99 {:.1} ms, update {:.1}, delete {:.1}), \
                         answer -> delivered p50 {:.1} ms p99 {:.1} ms, {:.0} µs node CPU per \
                         change",
                        phase.latency.p50_ms,
                        phase.latency.p99_ms,
                        phase.lost,
                        c.made,
                        c.create.p99_ms,
                        c.update.p99_ms,
                        c.delete.p99_ms,
                        c.answer_to_delivered.p50_ms,
                        c.answer_to_delivered.p99_ms,
                        c.node_cpu_us_per_change
                    ),
                };
                progress.line(&line);
                phases.push(ChurnPhase {
                    label,
                    object_rate: rate,
                    phase,
                    node_cpu_seconds: cpu,
                    changes,
                    p99_over_quiet,
                });
            }
        }
        let stats = s.stats().await?;
        Ok(SubsChurnReport {
            subscriptions: opts.subs,
            registered_seconds: registered,
            registered_per_second: opts.subs as f64 / registered,
            saturation_objects_per_second: saturation,
            phases,
            node_images_applied: stats.images_applied,
            node_images_compiled: stats.images_compiled,
            lost,
        })
    })
}

/// Makes subscription changes at a rate: its own subscriptions, created, updated and
/// deleted in turn, and every fifth change a probe.
#[derive(Default)]
struct Churner {
    url: String,
    target: String,
    seen: Shared,
    /// Its subscriptions that exist now.
    live: Vec<u64>,
    workload: Option<Workload>,
    seed: u64,
    n: u64,
}

impl Churner {
    fn new(seed: u64, url: &str, target: String, seen: Shared) -> Churner {
        Churner {
            url: url.to_string(),
            target,
            seen,
            live: Vec::new(),
            workload: Some(Workload::Iot(IotSpec)),
            seed,
            n: 0,
        }
    }

    fn subscription(&self, filter: String) -> v1::Subscription {
        v1::Subscription {
            filter: Some(v1::subscription::Filter::Text(filter)),
            target: Some(v1::Target {
                kind: Some(v1::target::Kind::Grpc(self.target.clone())),
            }),
            qos: v1::Qos::AtLeastOnce as i32,
            ..v1::Subscription::default()
        }
    }

    /// An iot filter (the registered subscriptions' shape, so the node compiles what it
    /// would for a real change) that the phase's objects never match (they have no
    /// `churn` attribute): the change's cost is measured without deliveries of its own.
    fn filter(&self) -> String {
        let w = self.workload.as_ref().unwrap_or(&Workload::Iot(IotSpec));
        let subs = w.subscriptions(self.seed.wrapping_mul(1_000_003) + self.n, 1, |_| {});
        subs.first().map_or_else(
            || format!("churn = \"{}\"", self.n),
            |(_, d)| format!("({}) && churn = \"{}\"", d.to_text(), self.n),
        )
    }

    /// Changes at `rate` per second until `stop`; then waits for the probes in flight.
    async fn run(&mut self, rate: f64, stop: &AtomicBool) -> anyhow::Result<Changes> {
        let mut client =
            v1::subscriptions_client::SubscriptionsClient::new(procs::channel(&self.url));
        let ingest = v1::ingest_client::IngestClient::new(procs::channel(&self.url));
        let (mut create, mut update, mut delete) = (Vec::new(), Vec::new(), Vec::new());
        let (mut made, mut failed) = (0usize, 0usize);
        let mut probes = tokio::task::JoinSet::new();
        let t0 = Instant::now();
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let due = t0 + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            i += 1;
            self.n += 1;
            let kind = if i.is_multiple_of(5) {
                3 // a probe
            } else if self.live.len() < 8 {
                0
            } else {
                (i % 3) as u8
            };
            let at = Instant::now();
            let ok = match kind {
                0 => {
                    let req = v1::CreateSubscriptionRequest {
                        subscription: Some(self.subscription(self.filter())),
                    };
                    let r = client.create(req).await;
                    if let Ok(r) = &r {
                        self.live.push(r.get_ref().id);
                        create.push(at.elapsed().as_secs_f64() * 1000.0);
                    }
                    r.is_ok()
                }
                1 => {
                    let id = self.live[(self.n as usize * 7919) % self.live.len()];
                    let mut sub = self.subscription(self.filter());
                    sub.id = id;
                    let r = client.update(sub).await;
                    update.push(at.elapsed().as_secs_f64() * 1000.0);
                    r.is_ok()
                }
                2 => {
                    let k = (self.n as usize * 7919) % self.live.len();
                    let id = self.live.swap_remove(k);
                    let r = client.delete(v1::DeleteSubscriptionRequest { id }).await;
                    delete.push(at.elapsed().as_secs_f64() * 1000.0);
                    r.is_ok()
                }
                _ => {
                    let tag = format!("p{}-{}", self.seed, self.n);
                    let req = v1::CreateSubscriptionRequest {
                        subscription: Some(self.subscription(format!("churnprobe = \"{tag}\""))),
                    };
                    match client.create(req).await {
                        Ok(r) => {
                            let id = r.into_inner().id;
                            self.live.push(id);
                            let answered = Instant::now();
                            create.push(answered.duration_since(at).as_secs_f64() * 1000.0);
                            let event = blocks::Event::new([("churnprobe", tag.as_str())]);
                            let mut ingest = ingest.clone();
                            let seen = self.seen.clone();
                            probes.spawn(async move {
                                let put =
                                    ingest.put(procs::put_request(&event, String::new())).await;
                                let obj = put.ok()?.into_inner().id?;
                                let obj = ObjectId {
                                    node: obj.node,
                                    seq: obj.seq,
                                };
                                let deadline = Instant::now() + Duration::from_secs(30);
                                while Instant::now() < deadline {
                                    if let Some((_, first)) = lock(&seen).pairs.get(&(id, obj)) {
                                        return Some(
                                            first.saturating_duration_since(answered).as_secs_f64()
                                                * 1000.0,
                                        );
                                    }
                                    tokio::time::sleep(Duration::from_millis(1)).await;
                                }
                                None
                            });
                            true
                        }
                        Err(_) => false,
                    }
                }
            };
            if ok {
                made += 1;
            } else {
                failed += 1;
            }
        }
        let mut delivered = Vec::new();
        let mut probes_lost = 0;
        while let Some(r) = probes.join_next().await {
            match r {
                Ok(Some(ms)) => delivered.push(ms),
                _ => probes_lost += 1,
            }
        }
        Ok(Changes {
            rate,
            made,
            failed,
            create: latency(create),
            update: latency(update),
            delete: latency(delete),
            answer_to_delivered: latency(delivered),
            probes_lost,
            node_cpu_us_per_change: 0.0,
        })
    }
}

/// Prints the figures.
pub fn print(r: &SubsChurnReport) {
    println!(
        "subs-churn: {} subscriptions (registered at {:.0}/s), saturation about {:.0} objects/s",
        r.subscriptions, r.registered_per_second, r.saturation_objects_per_second
    );
    println!(
        "{:<34} {:>9} {:>9} {:>7} {:>8} {:>10} {:>10} {:>11}",
        "phase", "p50 ms", "p99 ms", "x quiet", "changes", "vis p50", "vis p99", "µs/change"
    );
    for p in &r.phases {
        let c = p.changes.clone().unwrap_or_default();
        println!(
            "{:<34} {:>9.1} {:>9.1} {:>7.2} {:>8} {:>10.1} {:>10.1} {:>11.0}",
            p.label,
            p.phase.latency.p50_ms,
            p.phase.latency.p99_ms,
            p.p99_over_quiet,
            c.made,
            c.answer_to_delivered.p50_ms,
            c.answer_to_delivered.p99_ms,
            c.node_cpu_us_per_change
        );
    }
    println!(
        "node: {} versions applied as changes, {} compiled whole; lost {}",
        r.node_images_applied, r.node_images_compiled, r.lost
    );
}
