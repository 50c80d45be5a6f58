//! The Prometheus metrics endpoint (`GET /metrics`, text exposition format 0.0.4): ingest,
//! matching, deliveries by outcome, retries, dead letters, queue depths, workers by state and
//! block, the coordinator's scheduler figures, and per-subscription delivery counters. The
//! figures come from the process's own `Admin` service, so the endpoint and `dissem stats`
//! never disagree. `/healthz` (the process answers) and `/readyz` (its own services answer)
//! are served beside it, for orchestrators' probes.

use std::fmt::Write;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use proto::v1;
use tokio::net::TcpListener;
use tonic::Request;

/// Per-subscription push counters: (subscription, [acked, failed, dead-lettered]).
pub trait SubscriptionCounters: Send + Sync {
    fn per_subscription(&self) -> Vec<(u64, [u64; 3])>;
}

/// Where the figures come from.
#[derive(Clone)]
pub struct MetricsSource {
    pub admin: Arc<dyn v1::admin_server::Admin>,
    /// Per-subscription delivery counters (nodes only).
    pub deliveries: Option<Arc<dyn SubscriptionCounters>>,
}

impl std::fmt::Debug for MetricsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsSource")
    }
}

fn line(out: &mut String, name: &str, help: &str, kind: &str, samples: &[(String, f64)]) {
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

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders the figures in the Prometheus text format.
pub fn render(
    s: &v1::StatsResponse,
    workers: &[v1::WorkerInfo],
    per_sub: &[(u64, [u64; 3])],
) -> String {
    let mut o = String::new();
    let role = escape(&s.role);
    line(
        &mut o,
        "dissem_info",
        "The process: its role and node id.",
        "gauge",
        &[(format!("role=\"{role}\",node=\"{}\"", s.node), 1.0)],
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
            "Copies of other nodes' objects held for quorum replication, by state.",
            "gauge",
            &[
                ("state=\"unfinished\"".into(), s.copies_unfinished as f64),
                ("state=\"finished\"".into(), s.copies_finished as f64),
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
            "dissem_task_mean_ms",
            "Mean task completion time by kind, ms.",
            "gauge",
            &[
                ("kind=\"test\"".into(), c.mean_test_ms),
                ("kind=\"match\"".into(), c.mean_match_ms),
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
        line(
            &mut o,
            "dissem_match_latency_ms",
            "Put -> matched latency over the last 100,000 objects, ms.",
            "gauge",
            &[
                ("quantile=\"0.5\"".into(), c.match_latency_p50_ms),
                ("quantile=\"0.99\"".into(), c.match_latency_p99_ms),
            ],
        );
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
    if !per_sub.is_empty() {
        let mut samples = Vec::with_capacity(per_sub.len() * 3);
        for (sub, [acked, failed, dead]) in per_sub {
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
            &mut o,
            "dissem_subscription_deliveries_total",
            "Push attempts per subscription by outcome.",
            "counter",
            &samples,
        );
    }
    o
}

async fn scrape(src: &MetricsSource) -> Result<String, tonic::Status> {
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
    let per_sub = src
        .deliveries
        .as_ref()
        .map(|d| d.per_subscription())
        .unwrap_or_default();
    Ok(render(&s, &w, &per_sub))
}

/// Whether the process's own services answer (its `Admin.Stats`).
async fn ready(src: &MetricsSource) -> Result<(), tonic::Status> {
    src.admin
        .stats(Request::new(v1::StatsRequest {}))
        .await
        .map(drop)
}

/// Serves `GET /metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, src: MetricsSource) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let src = src.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let src = src.clone();
                    async move {
                        let (status, body, ctype) = match req.uri().path() {
                            "/metrics" => match scrape(&src).await {
                                Ok(b) => (200, b, "text/plain; version=0.0.4"),
                                Err(e) => (503, format!("{e}\n"), "text/plain"),
                            },
                            // alive: the process answers
                            "/healthz" => (200, "ok\n".to_string(), "text/plain"),
                            // ready: its own services answer
                            "/readyz" => match ready(&src).await {
                                Ok(()) => (200, "ready\n".to_string(), "text/plain"),
                                Err(e) => (503, format!("not ready: {e}\n"), "text/plain"),
                            },
                            _ => (
                                404,
                                "not found: try /metrics, /healthz or /readyz\n".to_string(),
                                "text/plain",
                            ),
                        };
                        hyper::Response::builder()
                            .status(status)
                            .header("content-type", ctype)
                            .body(Full::new(Bytes::from(body)))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}
