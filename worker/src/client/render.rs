//! How the client commands print what the API answered: text lines for people (counters
//! grouped, with their units) and one JSON document for scripts (`--output json`).

use proto::v1;
use serde_json::{Value, json};

/// One command's answer in both forms.
#[derive(Debug, Clone, PartialEq)]
pub struct Printed {
    /// For `--output text` (the default), one per line.
    pub lines: Vec<String>,
    /// For `--output json`.
    pub json: Value,
}

impl Printed {
    pub fn new(lines: Vec<String>, json: Value) -> Printed {
        Printed { lines, json }
    }
}

fn filter_text(s: &v1::Subscription) -> (&'static str, String) {
    match &s.filter {
        Some(v1::subscription::Filter::Text(t)) => ("text", t.clone()),
        Some(v1::subscription::Filter::Eventbridge(j)) => ("eventbridge", j.clone()),
        None => ("text", String::new()),
    }
}

fn target_text(s: &v1::Subscription) -> String {
    match s.target.as_ref().and_then(|t| t.kind.as_ref()) {
        Some(v1::target::Kind::Grpc(u)) => format!("grpc:{u}"),
        Some(v1::target::Kind::Webhook(u)) => format!("webhook:{u}"),
        Some(v1::target::Kind::Stream(n)) => format!("stream:{n}"),
        None => "-".into(),
    }
}

/// A subscription as JSON (as the API returns it: no secret, no header values).
pub fn subscription_json(s: &v1::Subscription) -> Value {
    let (kind, filter) = filter_text(s);
    let retry = s.retry.map(|r| {
        json!({
            "max_attempts": r.max_attempts,
            "ttl_ms": r.ttl_ms,
            "initial_backoff_ms": r.initial_backoff_ms,
            "max_backoff_ms": r.max_backoff_ms,
        })
    });
    json!({
        "id": s.id,
        "filter": { kind: filter },
        "target": target_text(s),
        "qos": runtime::validate::qos(s) as i32,
        "priority": s.priority,
        "retry": retry,
        "push_batch": s.push_batch,
        "tenant": s.tenant,
    })
}

/// A subscription as `name value` lines.
pub fn subscription_lines(s: &v1::Subscription) -> Vec<String> {
    let (kind, filter) = filter_text(s);
    let qos = match runtime::validate::qos(s) {
        v1::Qos::AtMostOnce => "0 (at most once)",
        v1::Qos::ExactlyOnce => "2 (exactly once)",
        _ => "1 (at least once)",
    };
    let mut lines = vec![
        format!("id        {}", s.id),
        format!(
            "filter    {filter}{}",
            if kind == "eventbridge" {
                "  (EventBridge)"
            } else {
                ""
            }
        ),
        format!("target    {}", target_text(s)),
        format!("qos       {qos}"),
        format!("priority  {}", s.priority),
    ];
    if let Some(r) = s.retry {
        lines.push(format!(
            "retry     max_attempts {} ttl {} ms backoff {}..{} ms (0: default)",
            r.max_attempts, r.ttl_ms, r.initial_backoff_ms, r.max_backoff_ms
        ));
    }
    if s.push_batch > 1 {
        lines.push(format!("batch     up to {} events per POST", s.push_batch));
    }
    if !s.tenant.is_empty() {
        lines.push(format!("tenant    {}", s.tenant));
    }
    lines
}

/// Subscriptions, one line each (`id  filter  -> target`), or a JSON array.
pub(super) fn subscription_list(subs: &[v1::Subscription]) -> Printed {
    Printed::new(
        subs.iter()
            .map(|s| format!("{}\t{}\t-> {}", s.id, filter_text(s).1, target_text(s)))
            .collect(),
        Value::Array(subs.iter().map(subscription_json).collect()),
    )
}

/// A group of counters: its heading and (name, value, unit) rows.
type Group = (&'static str, Vec<(&'static str, String, &'static str)>);

/// The node's (or the cluster's) counters, grouped with units; JSON keeps the API's names.
pub(super) fn stats(s: &v1::StatsResponse) -> Printed {
    let n = |v: u64| v.to_string();
    let mut groups: Vec<Group> = vec![(
        "node",
        vec![
            ("role", s.role.clone(), ""),
            ("id", n(u64::from(s.node)), ""),
            ("subscriptions", n(s.subscriptions), ""),
        ],
    )];
    let mut j = json!({
        "role": s.role,
        "node": s.node,
        "subscriptions": s.subscriptions,
    });
    if s.role != "coordinator" {
        groups.push((
            "objects",
            vec![
                ("stored", n(s.objects_stored), "objects"),
                ("puts accepted", n(s.puts_accepted), "puts"),
                ("puts rejected", n(s.puts_rejected), "puts"),
                ("outbox pending", n(s.outbox_pending), "objects"),
                ("matches handed", n(s.matches_handed), "pairs"),
                ("matches repeated", n(s.matches_repeated), "pairs"),
            ],
        ));
        groups.push((
            "deliveries",
            vec![
                ("records", n(s.deliveries), "deliveries"),
                ("acknowledged", n(s.deliveries_acked), "deliveries"),
                ("failed attempts", n(s.delivery_failures), "attempts"),
                ("dead-lettered", n(s.dead_lettered), "deliveries"),
                ("queued", n(s.deliveries_queued), "deliveries"),
            ],
        ));
        if s.copies_unfinished + s.copies_finished + s.objects_taken_over > 0 {
            groups.push((
                "replicas",
                vec![
                    ("copies unfinished", n(s.copies_unfinished), "objects"),
                    ("copies finished", n(s.copies_finished), "objects"),
                    ("taken over", n(s.objects_taken_over), "objects"),
                ],
            ));
        }
        for (k, v) in [
            ("objects_stored", s.objects_stored),
            ("puts_accepted", s.puts_accepted),
            ("puts_rejected", s.puts_rejected),
            ("outbox_pending", s.outbox_pending),
            ("matches_handed", s.matches_handed),
            ("matches_repeated", s.matches_repeated),
            ("deliveries", s.deliveries),
            ("deliveries_acked", s.deliveries_acked),
            ("delivery_failures", s.delivery_failures),
            ("dead_lettered", s.dead_lettered),
            ("deliveries_queued", s.deliveries_queued),
            ("copies_unfinished", s.copies_unfinished),
            ("copies_finished", s.copies_finished),
            ("objects_taken_over", s.objects_taken_over),
        ] {
            j[k] = json!(v);
        }
    }
    if let Some(c) = &s.cluster {
        let ms = |v: f64| format!("{v:.2}");
        groups.push((
            "cluster",
            vec![
                ("coordinator nonce", format!("{:016x}", c.nonce), ""),
                ("nodes", n(u64::from(c.nodes)), "nodes"),
                ("image version", n(c.image_version), ""),
                (
                    "image subscriptions",
                    n(c.image_subscriptions),
                    "subscriptions",
                ),
            ],
        ));
        groups.push((
            "matching",
            vec![
                ("objects arrived", n(c.objects_arrived), "objects"),
                ("objects matched", n(c.objects_matched), "objects"),
                ("objects in flight", n(c.objects_in_flight), "objects"),
                ("latency p50", ms(c.match_latency_p50_ms), "ms"),
                ("latency p99", ms(c.match_latency_p99_ms), "ms"),
                ("mean test task", ms(c.mean_test_ms), "ms"),
                ("mean match task", ms(c.mean_match_ms), "ms"),
            ],
        ));
        let mut workers: Vec<(&'static str, String, &'static str)> = vec![
            ("waiting tasks", n(c.waiting_tasks), "tasks"),
            ("open batches", n(c.open_batches), "batches"),
            ("reassignments", n(c.reassignments), "tasks"),
            ("dead workers", n(c.dead_workers), "workers"),
            ("block loads", n(c.loads), "loads"),
            ("messages", n(c.messages), "messages"),
        ];
        let mut w: Vec<_> = c.workers.iter().collect();
        w.sort();
        let mut wj = serde_json::Map::new();
        for (k, v) in w {
            wj.insert(k.clone(), json!(v));
        }
        let by_block = c
            .workers
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
            .join(", ");
        workers.push(("by block", by_block, ""));
        groups.push(("workers", workers));
        j["cluster"] = json!({
            "nonce": format!("{:016x}", c.nonce),
            "image_version": c.image_version,
            "image_subscriptions": c.image_subscriptions,
            "nodes": c.nodes,
            "waiting_tasks": c.waiting_tasks,
            "open_batches": c.open_batches,
            "mean_test_ms": c.mean_test_ms,
            "mean_match_ms": c.mean_match_ms,
            "reassignments": c.reassignments,
            "dead_workers": c.dead_workers,
            "objects_arrived": c.objects_arrived,
            "objects_matched": c.objects_matched,
            "objects_in_flight": c.objects_in_flight,
            "messages": c.messages,
            "loads": c.loads,
            "match_latency_p50_ms": c.match_latency_p50_ms,
            "match_latency_p99_ms": c.match_latency_p99_ms,
            "workers": Value::Object(wj),
        });
    }
    let width = groups
        .iter()
        .flat_map(|g| g.1.iter().map(|r| r.0.len()))
        .max()
        .unwrap_or(0);
    let mut lines = Vec::new();
    for (heading, rows) in groups {
        lines.push(heading.to_string());
        for (name, value, unit) in rows {
            let line = format!("  {name:<width$}  {value} {unit}");
            lines.push(line.trim_end().to_string());
        }
    }
    Printed::new(lines, j)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_are_grouped_with_units_and_json_keeps_the_api_names() {
        let s = v1::StatsResponse {
            role: "embedded".into(),
            node: 1,
            deliveries_acked: 7,
            cluster: Some(v1::ClusterStats {
                match_latency_p99_ms: 2.5,
                ..v1::ClusterStats::default()
            }),
            ..v1::StatsResponse::default()
        };
        let p = stats(&s);
        assert!(p.lines.contains(&"deliveries".to_string()), "{:?}", p.lines);
        assert!(
            p.lines
                .iter()
                .any(|l| l.trim_start().starts_with("acknowledged") && l.ends_with("7 deliveries")),
            "{:?}",
            p.lines
        );
        assert!(
            p.lines.iter().any(|l| l.ends_with("2.50 ms")),
            "{:?}",
            p.lines
        );
        assert_eq!(p.json["deliveries_acked"], 7);
        assert_eq!(p.json["cluster"]["match_latency_p99_ms"], 2.5);
    }

    #[test]
    fn a_subscription_shows_its_level_and_never_its_secret() {
        let s = v1::Subscription {
            id: 3,
            filter: Some(v1::subscription::Filter::Text("a = 1".into())),
            webhook_secret: "hush".into(),
            ..v1::Subscription::default()
        };
        let j = subscription_json(&s);
        assert_eq!(j["qos"], 1, "unset is at least once");
        assert_eq!(j["filter"]["text"], "a = 1");
        assert!(!j.to_string().contains("hush"));
        assert!(!subscription_lines(&s).join("\n").contains("hush"));
    }
}
