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
        "name": s.name,
        "ordered": s.ordered,
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
    if !s.name.is_empty() {
        lines.push(format!("name      {}", s.name));
    }
    if s.ordered {
        lines.push("ordered   in the order the node took the objects".into());
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

/// One counter: its API name (the JSON key), its label, value and unit.
type Row = (&'static str, &'static str, Value, &'static str);

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_f64() => format!("{:.2}", n.as_f64().unwrap_or(0.0)),
        other => other.to_string(),
    }
}

/// The node's (or the cluster's) counters, grouped with units; JSON keeps the API's names
/// (the cluster's under `cluster`).
pub(super) fn stats(s: &v1::StatsResponse) -> Printed {
    let mut groups: Vec<(&'static str, Vec<Row>)> = vec![(
        "node",
        vec![
            ("role", "role", json!(s.role), ""),
            ("node", "id", json!(s.node), ""),
            ("subscriptions", "subscriptions", json!(s.subscriptions), ""),
        ],
    )];
    let mut cluster_groups = Vec::new();
    if s.role != "coordinator" {
        groups.push((
            "objects",
            vec![
                (
                    "objects_stored",
                    "stored",
                    json!(s.objects_stored),
                    "objects",
                ),
                (
                    "store_failed",
                    "store failed (disk full, writes refused)",
                    json!(s.store_failed),
                    "",
                ),
                (
                    "puts_accepted",
                    "puts accepted",
                    json!(s.puts_accepted),
                    "puts",
                ),
                (
                    "puts_rejected",
                    "puts rejected",
                    json!(s.puts_rejected),
                    "puts",
                ),
                (
                    "puts_waited",
                    "puts that waited for a write slot",
                    json!(s.puts_waited),
                    "puts",
                ),
                (
                    "puts_refused_overloaded",
                    "puts refused (too many waiting)",
                    json!(s.puts_refused_overloaded),
                    "puts",
                ),
                (
                    "outbox_pending",
                    "outbox pending",
                    json!(s.outbox_pending),
                    "objects",
                ),
                (
                    "matches_handed",
                    "matches handed",
                    json!(s.matches_handed),
                    "pairs",
                ),
                (
                    "matches_repeated",
                    "matches repeated",
                    json!(s.matches_repeated),
                    "pairs",
                ),
            ],
        ));
        groups.push((
            "deliveries",
            vec![
                ("deliveries", "records", json!(s.deliveries), "deliveries"),
                (
                    "deliveries_acked",
                    "acknowledged",
                    json!(s.deliveries_acked),
                    "deliveries",
                ),
                (
                    "delivery_failures",
                    "failed attempts",
                    json!(s.delivery_failures),
                    "attempts",
                ),
                (
                    "dead_lettered",
                    "dead-lettered",
                    json!(s.dead_lettered),
                    "deliveries",
                ),
                (
                    "deliveries_queued",
                    "queued",
                    json!(s.deliveries_queued),
                    "deliveries",
                ),
                (
                    "qos0_dropped",
                    "QoS 0 dropped on a repeated match",
                    json!(s.qos0_dropped),
                    "deliveries",
                ),
            ],
        ));
        groups.push((
            "replicas",
            vec![
                (
                    "copies_unfinished",
                    "copies unfinished",
                    json!(s.copies_unfinished),
                    "objects",
                ),
                (
                    "copies_finished",
                    "copies finished",
                    json!(s.copies_finished),
                    "objects",
                ),
                (
                    "objects_taken_over",
                    "taken over",
                    json!(s.objects_taken_over),
                    "objects",
                ),
                (
                    "objects_handed",
                    "handed to an adopter",
                    json!(s.objects_handed),
                    "objects",
                ),
                (
                    "objects_taken_back",
                    "taken back from a lost adopter",
                    json!(s.objects_taken_back),
                    "objects",
                ),
                (
                    "copies_pulled",
                    "copies pulled at catch-ups",
                    json!(s.copies_pulled),
                    "copies",
                ),
            ],
        ));
        groups.push((
            "images",
            vec![
                ("image_loaded", "newest loaded", json!(s.image_loaded), ""),
                (
                    "images_compiled",
                    "compiled",
                    json!(s.images_compiled),
                    "versions",
                ),
                (
                    "images_kept",
                    "kept (same subscriptions)",
                    json!(s.images_kept),
                    "versions",
                ),
                (
                    "images_applied",
                    "applied as changes",
                    json!(s.images_applied),
                    "versions",
                ),
                (
                    "images_compacted",
                    "bases compacted",
                    json!(s.images_compacted),
                    "",
                ),
            ],
        ));
    }
    if let Some(c) = &s.cluster {
        cluster_groups.push((
            "cluster",
            vec![
                (
                    "nonce",
                    "coordinator nonce",
                    json!(format!("{:016x}", c.nonce)),
                    "",
                ),
                ("nodes", "nodes", json!(c.nodes), "nodes"),
                ("image_version", "image version", json!(c.image_version), ""),
                (
                    "image_subscriptions",
                    "image subscriptions",
                    json!(c.image_subscriptions),
                    "subscriptions",
                ),
            ],
        ));
        // an elected leader: how it got its registry at its election
        if s.registry_kept || s.registry_ready_ms > 0 {
            let how = if s.registry_kept {
                "kept while standing by"
            } else {
                "rebuilt from the nodes"
            };
            if let Some((_, group)) = cluster_groups.last_mut() {
                group.push(("registry_source", "registry", json!(how), ""));
                group.push((
                    "registry_ready_ms",
                    "registry ready after",
                    json!(s.registry_ready_ms),
                    "ms",
                ));
            }
        }
        cluster_groups.push((
            "matching",
            vec![
                (
                    "objects_arrived",
                    "objects arrived",
                    json!(c.objects_arrived),
                    "objects",
                ),
                (
                    "objects_matched",
                    "objects matched",
                    json!(c.objects_matched),
                    "objects",
                ),
                (
                    "objects_in_flight",
                    "objects in flight",
                    json!(c.objects_in_flight),
                    "objects",
                ),
                (
                    "match_latency_p50_ms",
                    "latency p50",
                    json!(c.match_latency_p50_ms),
                    "ms",
                ),
                (
                    "match_latency_p99_ms",
                    "latency p99",
                    json!(c.match_latency_p99_ms),
                    "ms",
                ),
                (
                    "mean_test_ms",
                    "mean test task",
                    json!(c.mean_test_ms),
                    "ms",
                ),
                (
                    "mean_match_ms",
                    "mean match task",
                    json!(c.mean_match_ms),
                    "ms",
                ),
            ],
        ));
        let workers: std::collections::BTreeMap<&String, &u64> = c.workers.iter().collect();
        let by_block = workers
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        cluster_groups.push((
            "workers",
            vec![
                (
                    "waiting_tasks",
                    "waiting tasks",
                    json!(c.waiting_tasks),
                    "tasks",
                ),
                (
                    "open_batches",
                    "open batches",
                    json!(c.open_batches),
                    "batches",
                ),
                (
                    "reassignments",
                    "reassignments",
                    json!(c.reassignments),
                    "tasks",
                ),
                (
                    "dead_workers",
                    "dead workers",
                    json!(c.dead_workers),
                    "workers",
                ),
                ("loads", "block loads", json!(c.loads), "loads"),
                ("messages", "messages", json!(c.messages), "messages"),
                // one line here; the JSON form is the map (below)
                ("workers", "by block", json!(by_block), ""),
            ],
        ));
    }
    let rows_json = |gs: &[(&str, Vec<Row>)]| -> serde_json::Map<String, Value> {
        gs.iter()
            .flat_map(|g| g.1.iter().map(|r| (r.0.to_string(), r.2.clone())))
            .collect()
    };
    let mut j = rows_json(&groups);
    if let Some(c) = &s.cluster {
        let mut cj = rows_json(&cluster_groups);
        cj.insert("workers".into(), json!(c.workers));
        j.insert("cluster".into(), Value::Object(cj));
    }
    groups.extend(cluster_groups);
    // a node that replicates nothing has no replica figures to show
    groups.retain(|(h, rows)| *h != "replicas" || rows.iter().any(|r| r.2 != json!(0)));
    let width = groups
        .iter()
        .flat_map(|g| g.1.iter().map(|r| r.1.len()))
        .max()
        .unwrap_or(0);
    let mut lines = Vec::new();
    for (heading, rows) in groups {
        lines.push(heading.to_string());
        for (_, label, value, unit) in rows {
            let line = format!("  {label:<width$}  {} {unit}", text(&value));
            lines.push(line.trim_end().to_string());
        }
    }
    if let Some(v) = &s.view {
        let (l, vj) = view(v);
        lines.extend(l);
        j.insert("view".into(), vj);
    }
    Printed::new(lines, Value::Object(j))
}

/// The cluster as the process sees it: the grid's members and the leader.
fn view(v: &v1::ClusterView) -> (Vec<String>, Value) {
    let shape = if v.rows > 0 {
        format!("grid {}x{}", v.rows, v.cols)
    } else {
        "no grid".into()
    };
    let mut lines = vec!["cluster view".to_string(), format!("  {shape}")];
    for m in &v.members {
        let heir = m.heir.map(|h| format!(", heir {h}")).unwrap_or_default();
        lines.push(format!(
            "  node {} at {},{} {}{heir}",
            m.node,
            m.row,
            m.col,
            if m.alive { "up" } else { "down" }
        ));
    }
    let who = [v.leader_name.as_str(), v.leader_url.as_str()]
        .into_iter()
        .filter(|x| !x.is_empty())
        .collect::<Vec<_>>()
        .join(" at ");
    if !who.is_empty() {
        lines.push(format!(
            "  leader {who}, epoch {}, nonce {:016x}",
            v.leader_epoch, v.leader_nonce
        ));
    }
    let members: Vec<Value> = v
        .members
        .iter()
        .map(|m| {
            json!({"node": m.node, "row": m.row, "col": m.col, "alive": m.alive,
                   "heir": m.heir, "endpoint": m.endpoint})
        })
        .collect();
    let j = json!({
        "rows": v.rows,
        "cols": v.cols,
        "lease_ms": v.lease_ms,
        "members": members,
        "leader": {"name": v.leader_name, "url": v.leader_url, "epoch": v.leader_epoch,
                   "nonce": format!("{:016x}", v.leader_nonce)},
    });
    (lines, j)
}

/// `dissem link list`: the role, then a line per link (never a token: only whether one is
/// set).
pub fn links(r: &v1::LinksResponse) -> Printed {
    let mut lines = vec![format!(
        "cluster {} {} at epoch {} ({} standby copies)",
        r.cluster, r.role, r.epoch, r.standby_copies
    )];
    let mut json = Vec::new();
    for l in &r.links {
        let ttl = if l.ttl_ms > 0 {
            format!(" ttl {} ms", l.ttl_ms)
        } else {
            String::new()
        };
        let unclaimed = if l.unclaimed > 0 {
            format!(" unclaimed {}", l.unclaimed)
        } else {
            String::new()
        };
        lines.push(format!(
            "{} {} {}{ttl} owed {} sent {} acked {} deduplicated {}{unclaimed} lag {:.1} s{}{}{}",
            l.name,
            l.peer,
            l.mode,
            l.owed,
            l.sent,
            l.acked,
            l.deduplicated,
            l.lag_seconds,
            if l.has_filter { " filtered" } else { "" },
            if l.has_token { " token" } else { "" },
            if l.added { " (added)" } else { "" },
        ));
        json.push(json!({
            "name": l.name,
            "peer": l.peer,
            "mode": l.mode,
            "ttl_ms": l.ttl_ms,
            "filter": l.has_filter,
            "token": l.has_token,
            "owed": l.owed,
            "sent": l.sent,
            "acked": l.acked,
            "deduplicated": l.deduplicated,
            "unclaimed": l.unclaimed,
            "lag_seconds": l.lag_seconds,
            "added": l.added,
        }));
    }
    Printed::new(
        lines,
        json!({
            "cluster": r.cluster,
            "role": r.role,
            "epoch": r.epoch,
            "standby_copies": r.standby_copies,
            "primary_seen_unix_ms": r.primary_seen_unix_ms,
            "links": json,
        }),
    )
}

/// A drained node (`dissem node drain`).
pub(super) fn drained(r: &v1::DrainResponse, exited: bool) -> Printed {
    let what = if exited {
        "drained and exited"
    } else {
        "drained (still running, refusing puts)"
    };
    Printed::new(
        vec![format!(
            "{what}; its links owe {} entries, sent after the restart",
            r.owed_to_links
        )],
        serde_json::json!({
            "drained": true,
            "exited": exited,
            "owed_to_links": r.owed_to_links,
        }),
    )
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
