//! The operator console: one page (`GET /console` on the metrics listener) that draws the
//! cluster from the same `/metrics` scrape Prometheus reads, polled every second: the grid
//! with each node's state, the leader and its epoch, per-subscription push rates, backlog and
//! dead letters, federation links and their lag, and the latency histograms as live charts.
//! It holds no figure of its own, so the page, `/metrics` and `dissem stats` never disagree.
//!
//! What the page needs beyond the delivery families is the cluster as the process sees it
//! ([`v1::ClusterView`], part of `Admin.Stats`): [`write_view`] turns it into gauges
//! (`dissem_grid_rows`, `dissem_member_up{node,row,col}`, `dissem_leader_epoch`, ...), which
//! Prometheus and Grafana can use as well.

use proto::v1;

use crate::metrics::{escape, line};

/// The page: HTML with its script and style inline, no request leaves the listener.
pub const PAGE: &str = include_str!("console.html");

/// The most subscriptions a scrape may ask per-subscription series for
/// (`/metrics?subscriptions=K`, as the console does).
pub const MAX_SUBSCRIPTIONS: usize = 100;

/// The view of a coordinator's membership answer (the leader fields are the caller's).
pub fn view_of(m: &v1::Membership) -> v1::ClusterView {
    let next = crate::grid::Grid::new(m.next_rows, m.next_cols).ok();
    let grid = crate::grid::Grid::new(m.rows, m.cols)
        .ok()
        .map(|g| crate::grid::Layout::new(g, next));
    v1::ClusterView {
        rows: m.rows,
        cols: m.cols,
        next_rows: m.next_rows,
        next_cols: m.next_cols,
        members: m
            .members
            .iter()
            .map(|n| {
                let (row, col) = grid.map_or((0, 0), |g| g.position(n.node));
                v1::GridMember {
                    node: n.node,
                    row,
                    col,
                    alive: n.alive,
                    heir: n.heir,
                    endpoint: n.endpoint.clone(),
                }
            })
            .collect(),
        lease_ms: m.lease_ms,
        ..v1::ClusterView::default()
    }
}

/// Writes the view's families: the grid's shape, each member's liveness and heir, and the
/// leader (an info series with its name and URL, and its epoch).
pub fn write_view(o: &mut String, v: &v1::ClusterView) {
    line(
        o,
        "dissem_grid_rows",
        "Rows of the quorum grid (0: no grid).",
        "gauge",
        &[(String::new(), v.rows as f64)],
    );
    line(
        o,
        "dissem_grid_cols",
        "Columns of the quorum grid (0: no grid).",
        "gauge",
        &[(String::new(), v.cols as f64)],
    );
    line(
        o,
        "dissem_grid_next_rows",
        "Rows of the grid an online resize moves to (0: no resize under way).",
        "gauge",
        &[(String::new(), v.next_rows as f64)],
    );
    line(
        o,
        "dissem_grid_next_cols",
        "Columns of the grid an online resize moves to (0: no resize under way).",
        "gauge",
        &[(String::new(), v.next_cols as f64)],
    );
    let at =
        |m: &v1::GridMember| format!("node=\"{}\",row=\"{}\",col=\"{}\"", m.node, m.row, m.col);
    let up: Vec<_> = v
        .members
        .iter()
        .map(|m| (at(m), if m.alive { 1.0 } else { 0.0 }))
        .collect();
    line(
        o,
        "dissem_member_up",
        "Registered nodes: 1 when heard from within the lease, as this process last learned.",
        "gauge",
        &up,
    );
    let heirs: Vec<_> = v
        .members
        .iter()
        .filter_map(|m| m.heir.map(|h| (format!("node=\"{}\"", m.node), h as f64)))
        .collect();
    line(
        o,
        "dissem_member_heir",
        "The node named to disseminate a node's objects should it die.",
        "gauge",
        &heirs,
    );
    if !v.leader_name.is_empty() || !v.leader_url.is_empty() {
        line(
            o,
            "dissem_leader_info",
            "The coordinator leading, as this process knows it.",
            "gauge",
            &[(
                format!(
                    "name=\"{}\",url=\"{}\",nonce=\"{:016x}\"",
                    escape(&v.leader_name),
                    escape(&v.leader_url),
                    v.leader_nonce
                ),
                1.0,
            )],
        );
    }
    line(
        o,
        "dissem_leader_epoch",
        "The leading coordinator's epoch (0: not elected through etcd).",
        "gauge",
        &[(String::new(), v.leader_epoch as f64)],
    );
}

/// The `subscriptions=K` of a scrape's query: how many subscriptions to write
/// per-subscription series for (at most [`MAX_SUBSCRIPTIONS`]); `None` when not asked.
pub fn subscriptions_asked(query: Option<&str>) -> Option<usize> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("subscriptions="))
        .and_then(|k| k.parse::<usize>().ok())
        .map(|k| k.min(MAX_SUBSCRIPTIONS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_becomes_gauges_with_positions_and_the_leader() {
        let m = v1::Membership {
            rows: 2,
            cols: 3,
            lease_ms: 3000,
            members: vec![
                v1::Member {
                    node: 4,
                    endpoint: "http://n4".into(),
                    alive: false,
                    owns_from: 0,
                    heir: Some(5),
                },
                v1::Member {
                    node: 5,
                    endpoint: "http://n5".into(),
                    alive: true,
                    owns_from: 0,
                    heir: Some(3),
                },
            ],
            ..v1::Membership::default()
        };
        let mut v = view_of(&m);
        v.leader_name = "c\"1".into();
        v.leader_epoch = 42;
        let mut o = String::new();
        write_view(&mut o, &v);
        assert!(o.contains("dissem_grid_rows 2\n"), "{o}");
        assert!(o.contains("dissem_grid_next_rows 0\n"), "{o}");
        assert!(
            o.contains("dissem_member_up{node=\"4\",row=\"1\",col=\"1\"} 0\n"),
            "{o}"
        );
        assert!(
            o.contains("dissem_member_up{node=\"5\",row=\"1\",col=\"2\"} 1\n"),
            "{o}"
        );
        assert!(o.contains("dissem_member_heir{node=\"4\"} 5\n"), "{o}");
        assert!(
            o.contains("dissem_leader_info{name=\"c\\\"1\",url=\"\""),
            "{o}"
        );
        assert!(o.contains("dissem_leader_epoch 42\n"), "{o}");
    }

    #[test]
    fn a_scrape_asks_for_a_bounded_number_of_subscriptions() {
        assert_eq!(subscriptions_asked(None), None);
        assert_eq!(subscriptions_asked(Some("x=1")), None);
        assert_eq!(subscriptions_asked(Some("x=1&subscriptions=7")), Some(7));
        assert_eq!(
            subscriptions_asked(Some("subscriptions=999999")),
            Some(MAX_SUBSCRIPTIONS)
        );
        assert_eq!(subscriptions_asked(Some("subscriptions=-1")), None);
    }
}
