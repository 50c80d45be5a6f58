//! The Prometheus metrics endpoint (`GET /metrics`, text exposition format 0.0.4): ingest,
//! matching, deliveries by outcome, retries, dead letters, queue depths, workers by state and
//! block, the coordinator's scheduler figures, times in seconds, build and process figures.
//! A node adds its delivery families ([`Families`]): put -> delivered and push-duration
//! histograms, outcomes per tenant and target kind, and per-subscription series only for the
//! top k subscriptions an operator opted into (`--metrics-top-subscriptions`, 0 by default),
//! so a scrape stays the same size at a million subscriptions. The process-wide figures come
//! from the process's own `Admin` service, so the endpoint and `dissem stats` never disagree;
//! the cluster as the process sees it (grid, members, leader) comes from there too
//! ([`crate::console::write_view`]). `/healthz` (the process answers) and `/readyz` (its own
//! services answer) are served beside it, for orchestrators' probes, and the operator console
//! (`/console`, [`crate::console`]), which draws itself from `/metrics`.

use std::cmp::Reverse;
use std::fmt::Write;
use std::sync::Arc;

use proto::v1;
use tokio::net::TcpListener;
use tonic::Request;

/// A node's own families (delivery, federation links), written after the process-wide ones.
pub trait Families: Send + Sync {
    /// Appends the families to a scrape.
    fn write_metrics(&self, out: &mut String, scrape: &Scrape);
}

/// What one scrape asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scrape {
    /// Per-subscription series for this many subscriptions instead of the process's
    /// `--metrics-top-subscriptions` (`/metrics?subscriptions=K`, bounded).
    pub subscriptions: Option<usize>,
}

/// Where the figures come from.
#[derive(Clone)]
pub struct MetricsSource {
    pub admin: Arc<dyn v1::admin_server::Admin>,
    /// Delivery figures (nodes only).
    pub families: Option<Arc<dyn Families>>,
    /// Put -> matched latencies (coordinators only).
    pub match_latency: Option<Arc<crate::histogram::Histogram>>,
}

impl std::fmt::Debug for MetricsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsSource")
    }
}

/// Writes one family: its `# HELP` and `# TYPE` lines and each (labels, value) sample.
pub fn line(out: &mut String, name: &str, help: &str, kind: &str, samples: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, v) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }
}

fn one(v: u64) -> Vec<(String, f64)> {
    vec![(String::new(), v as f64)]
}

/// A label value escaped as the text format wants it.
pub fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders the process-wide figures in the Prometheus text format.
pub fn render(s: &v1::StatsResponse, workers: &[v1::WorkerInfo]) -> String {
    let mut o = String::new();
    let role = escape(&s.role);
    line(
        &mut o,
        "dissem_info",
        "The process: its role and node id.",
        "gauge",
        &[(format!("role=\"{role}\",node=\"{}\"", s.node), 1.0)],
    );
    line(
        &mut o,
        "dissem_build_info",
        "The build: its version.",
        "gauge",
        &[(format!("version=\"{}\"", env!("CARGO_PKG_VERSION")), 1.0)],
    );
    if s.role != "coordinator" {
        line(
            &mut o,
            "dissem_puts_accepted_total",
            "Puts and announces acknowledged (durable).",
            "counter",
            &one(s.puts_accepted),
        );
        line(
            &mut o,
            "dissem_puts_rejected_total",
            "Puts and announces rejected (bad input, rate limit).",
            "counter",
            &one(s.puts_rejected),
        );
        line(
            &mut o,
            "dissem_puts_waited_total",
            "Puts that waited for a slot of the write path (admitted in priority order).",
            "counter",
            &one(s.puts_waited),
        );
        line(
            &mut o,
            "dissem_puts_refused_overloaded_total",
            "Puts refused UNAVAILABLE because too many waited for the write path.",
            "counter",
            &one(s.puts_refused_overloaded),
        );
        line(
            &mut o,
            "dissem_puts_waiting",
            "Puts waiting for a slot of the write path now.",
            "gauge",
            &one(s.puts_waiting),
        );
        line(
            &mut o,
            "dissem_objects_stored",
            "Objects stored on this node.",
            "gauge",
            &one(s.objects_stored),
        );
        line(
            &mut o,
            "dissem_outbox_pending",
            "Objects not yet matched (outbox records).",
            "gauge",
            &one(s.outbox_pending),
        );
        line(
            &mut o,
            "dissem_copies",
            "Copies of other nodes' objects held for quorum replication, by state (forwarding: \
             delivered, kept while a federation link owes them).",
            "gauge",
            &[
                ("state=\"unfinished\"".into(), s.copies_unfinished as f64),
                ("state=\"finished\"".into(), s.copies_finished as f64),
                ("state=\"forwarding\"".into(), s.copies_forwarding as f64),
            ],
        );
        line(
            &mut o,
            "dissem_objects_taken_over_total",
            "Objects of dead nodes this node took over.",
            "counter",
            &one(s.objects_taken_over),
        );
        line(
            &mut o,
            "dissem_objects_handed",
            "This node's objects another node adopted, held here until that node finished them.",
            "gauge",
            &one(s.objects_handed),
        );
        line(
            &mut o,
            "dissem_objects_taken_back_total",
            "This node's objects taken back from an adopter lost before it finished them.",
            "counter",
            &one(s.objects_taken_back),
        );
        line(
            &mut o,
            "dissem_store_failed",
            "1 when the store failed a write to its disk (full): writes are refused until the node starts again in place.",
            "gauge",
            &one(u64::from(s.store_failed)),
        );
        line(
            &mut o,
            "dissem_matches_total",
            "Matches (object, subscription) handed to delivery.",
            "counter",
            &one(s.matches_handed),
        );
        line(
            &mut o,
            "dissem_matches_repeated_total",
            "Matches handed over again after a fault (stored once).",
            "counter",
            &one(s.matches_repeated),
        );
        line(
            &mut o,
            "dissem_deliveries_total",
            "Push attempts by outcome: acked, failed (retried later or given up), dead_letter.",
            "counter",
            &[
                ("outcome=\"acked\"".into(), s.deliveries_acked as f64),
                ("outcome=\"failed\"".into(), s.delivery_failures as f64),
                ("outcome=\"dead_letter\"".into(), s.dead_lettered as f64),
            ],
        );
        line(
            &mut o,
            "dissem_delivery_queue_depth",
            "Pushes queued or in flight.",
            "gauge",
            &one(s.deliveries_queued),
        );
        line(
            &mut o,
            "dissem_delivery_records",
            "Delivery records held (every state).",
            "gauge",
            &one(s.deliveries),
        );
    }
    if let Some(c) = &s.cluster {
        line(
            &mut o,
            "dissem_image_version",
            "Newest published subscription image version.",
            "gauge",
            &one(c.image_version),
        );
        line(
            &mut o,
            "dissem_subscriptions",
            "Subscriptions in that version.",
            "gauge",
            &one(c.image_subscriptions),
        );
        line(
            &mut o,
            "dissem_nodes",
            "Registered node daemons.",
            "gauge",
            &one(u64::from(c.nodes)),
        );
        line(
            &mut o,
            "dissem_tasks_waiting",
            "Tasks waiting for a worker.",
            "gauge",
            &one(c.waiting_tasks),
        );
        line(
            &mut o,
            "dissem_batches_open",
            "Batches still collecting objects.",
            "gauge",
            &one(c.open_batches),
        );
        line(
            &mut o,
            "dissem_task_mean_seconds",
            "Mean task completion time by kind.",
            "gauge",
            &[
                ("kind=\"test\"".into(), c.mean_test_ms / 1e3),
                ("kind=\"match\"".into(), c.mean_match_ms / 1e3),
            ],
        );
        line(
            &mut o,
            "dissem_reassignments_total",
            "Tasks taken back and queued again.",
            "counter",
            &one(c.reassignments),
        );
        line(
            &mut o,
            "dissem_dead_workers_total",
            "Workers judged dead.",
            "counter",
            &one(c.dead_workers),
        );
        line(
            &mut o,
            "dissem_objects_matched_total",
            "Objects fully matched.",
            "counter",
            &one(c.objects_matched),
        );
        line(
            &mut o,
            "dissem_objects_in_flight",
            "Objects between arrival and match.",
            "gauge",
            &one(c.objects_in_flight),
        );
        line(
            &mut o,
            "dissem_cluster_messages_total",
            "Coordinator <-> node messages.",
            "counter",
            &one(c.messages),
        );
        line(
            &mut o,
            "dissem_block_loads_total",
            "Block loads and switches ordered.",
            "counter",
            &one(c.loads),
        );
    }
    if let Some(v) = &s.view {
        crate::console::write_view(&mut o, v);
    }
    let mut by: std::collections::BTreeMap<(String, String), u64> = Default::default();
    for w in workers {
        *by.entry((w.state.clone(), w.block.clone())).or_default() += 1;
    }
    line(
        &mut o,
        "dissem_workers",
        "Workers by state and block.",
        "gauge",
        &by.into_iter()
            .map(|((st, b), n)| {
                (
                    format!("state=\"{}\",block=\"{}\"", escape(&st), escape(&b)),
                    n as f64,
                )
            })
            .collect::<Vec<_>>(),
    );
    o
}

/// How subscriptions rank for per-subscription series (first: the most failed and
/// dead-lettered pushes, then the most acknowledged, then the lowest id).
pub fn subscription_rank(
    id: u64,
    [acked, failed, dead]: &[u64; 3],
) -> (Reverse<u64>, Reverse<u64>, u64) {
    (Reverse(failed + dead), Reverse(*acked), id)
}

/// The per-subscription push counters of the `k` subscriptions with the most failed and
/// dead-lettered pushes (then the most acknowledged): `per_sub` is (subscription, [acked,
/// failed, dead-lettered]). Nothing when `k` is 0. Returns the subscriptions written.
pub fn top_subscriptions(o: &mut String, per_sub: &[(u64, [u64; 3])], k: usize) -> Vec<u64> {
    if k == 0 || per_sub.is_empty() {
        return Vec::new();
    }
    let mut top: Vec<&(u64, [u64; 3])> = per_sub.iter().collect();
    top.sort_by_key(|(id, c)| subscription_rank(*id, c));
    top.truncate(k);
    let mut samples = Vec::with_capacity(top.len() * 3);
    for (sub, [acked, failed, dead]) in &top {
        samples.push((
            format!("subscription=\"{sub}\",outcome=\"acked\""),
            *acked as f64,
        ));
        samples.push((
            format!("subscription=\"{sub}\",outcome=\"failed\""),
            *failed as f64,
        ));
        samples.push((
            format!("subscription=\"{sub}\",outcome=\"dead_letter\""),
            *dead as f64,
        ));
    }
    line(
        o,
        "dissem_subscription_deliveries_total",
        &format!("Push attempts by outcome of the {k} subscriptions with the most failures."),
        "counter",
        &samples,
    );
    top.into_iter().map(|(sub, _)| *sub).collect()
}

async fn scrape(src: &MetricsSource, asked: &Scrape) -> Result<String, tonic::Status> {
    let s = src
        .admin
        .stats(Request::new(v1::StatsRequest {}))
        .await?
        .into_inner();
    let w = src
        .admin
        .workers(Request::new(v1::WorkersRequest {}))
        .await?
        .into_inner()
        .workers;
    let mut out = render(&s, &w);
    if let Some(h) = &src.match_latency {
        let name = "dissem_match_latency_seconds";
        crate::histogram::header(
            &mut out,
            name,
            "From an object's arrival at its node until it is fully matched.",
        );
        h.render(&mut out, name, "");
    }
    if let Some(d) = &src.families {
        d.write_metrics(&mut out, asked);
    }
    process_metrics(&mut out);
    Ok(out)
}

/// The process figures Prometheus clients export (Linux `/proc`; nothing elsewhere).
fn process_metrics(o: &mut String) {
    const TICKS: f64 = 100.0; // USER_HZ on Linux
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    // the fields after the command name, which is in parentheses and may hold spaces
    let Some(fields) = stat
        .rsplit_once(')')
        .map(|(_, f)| f.split_whitespace().collect::<Vec<_>>())
    else {
        return;
    };
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    // fields[0] is field 3 (state): utime 14, stime 15, starttime 22, rss 24
    if let (Some(u), Some(st)) = (field(11), field(12)) {
        line(
            o,
            "process_cpu_seconds_total",
            "User and system CPU time.",
            "counter",
            &[(String::new(), (u + st) / TICKS)],
        );
    }
    if let Some(rss) = field(21) {
        line(
            o,
            "process_resident_memory_bytes",
            "Resident memory.",
            "gauge",
            &[(String::new(), rss * 4096.0)],
        );
    }
    let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    });
    if let (Some(boot), Some(start)) = (boot, field(19)) {
        line(
            o,
            "process_start_time_seconds",
            "Start time since the Unix epoch.",
            "gauge",
            &[(String::new(), boot + start / TICKS)],
        );
    }
}

/// Whether the process's own services answer (its `Admin.Stats`).
async fn ready(src: &MetricsSource) -> Result<(), tonic::Status> {
    src.admin
        .stats(Request::new(v1::StatsRequest {}))
        .await
        .map(drop)
}

/// Serves `GET /metrics`, `/console`, `/healthz` and `/readyz` on `listener` until the task is dropped,
/// behind the HTTP guard (a connection cap and deadlines, [`crate::http_serve`]).
pub async fn serve(listener: TcpListener, src: MetricsSource) {
    let limits = crate::http_serve::HttpLimits {
        max_connections: 64,
        ..Default::default()
    };
    crate::http_serve::serve(listener, limits, None, move |_, req| {
        let src = src.clone();
        async move {
            let asked = Scrape {
                subscriptions: crate::console::subscriptions_asked(req.uri().query()),
            };
            match req.uri().path() {
                "/metrics" => match scrape(&src, &asked).await {
                    Ok(b) => (200, "text/plain; version=0.0.4", b),
                    Err(e) => (503, "text/plain", format!("{e}\n")),
                },
                // alive: the process answers
                "/healthz" => (200, "text/plain", "ok\n".to_string()),
                // ready: its own services answer
                "/readyz" => match ready(&src).await {
                    Ok(()) => (200, "text/plain", "ready\n".to_string()),
                    Err(e) => (503, "text/plain", format!("not ready: {e}\n")),
                },
                "/console" | "/console/" => (
                    200,
                    "text/html; charset=utf-8",
                    crate::console::PAGE.to_string(),
                ),
                _ => (
                    404,
                    "text/plain",
                    "not found: try /metrics, /console, /healthz or /readyz\n".to_string(),
                ),
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_subscription_series_are_bounded_and_times_are_seconds() {
        let per_sub: Vec<(u64, [u64; 3])> = (0..10_000).map(|i| (i, [5, i % 7, 0])).collect();
        let s = v1::StatsResponse {
            role: "embedded".into(),
            cluster: Some(v1::ClusterStats {
                match_latency_p99_ms: 250.0,
                ..v1::ClusterStats::default()
            }),
            ..v1::StatsResponse::default()
        };
        let mut out = render(&s, &[]);
        top_subscriptions(&mut out, &per_sub, 0);
        assert!(
            !out.contains("dissem_subscription_deliveries_total"),
            "opt-in"
        );
        top_subscriptions(&mut out, &per_sub, 20);
        let series = out
            .lines()
            .filter(|l| l.starts_with("dissem_subscription_deliveries_total{"))
            .count();
        assert_eq!(series, 20 * 3);
        // the ones shown are those with the most failures
        assert!(
            out.contains("subscription=\"6\",outcome=\"failed\"} 6"),
            "{out}"
        );
        assert!(
            !out.contains("quantile"),
            "histograms, not quantile gauges: {out}"
        );
        assert!(out.contains("dissem_build_info{version="));
        assert!(!out.contains("_ms"), "no millisecond series");
        let mut p = String::new();
        process_metrics(&mut p);
        assert!(p.contains("process_resident_memory_bytes"), "{p}");
    }
}
