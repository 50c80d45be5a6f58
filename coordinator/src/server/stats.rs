//! The cluster's figures as the coordinator's driver has them (`Admin.Stats`): the
//! scheduler's queues and means, the published image, and match latency percentiles.

use std::collections::HashMap;

use proto::v1;

use super::{Driver, block_name};

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64
}

impl Driver {
    pub(super) fn stats(&self) -> v1::ClusterStats {
        let snap = self.protocol.scheduler().snapshot();
        let counts = self.protocol.counts();
        let published = self.registry.published();
        let mut workers = HashMap::new();
        for (b, n) in &snap.idle {
            workers.insert(format!("idle {}", block_name(b)), *n as u64);
        }
        for (b, n) in &snap.busy {
            workers.insert(format!("busy {}", block_name(b)), *n as u64);
        }
        let mut lat = self.latencies.clone();
        lat.sort_unstable();
        v1::ClusterStats {
            match_latency_p50_ms: percentile(&lat, 0.5),
            match_latency_p99_ms: percentile(&lat, 0.99),
            nonce: self.protocol.nonce(),
            image_version: published.version,
            image_subscriptions: published.subscriptions as u64,
            nodes: self.protocol.nodes() as u32,
            waiting_tasks: snap.waiting_tasks as u64,
            open_batches: snap.open_batches as u64,
            mean_test_ms: snap.mean_test_ms,
            mean_match_ms: snap.mean_match_ms,
            reassignments: snap.reassignments,
            dead_workers: snap.dead_workers,
            objects_arrived: counts.arrived,
            objects_matched: counts.matched,
            objects_in_flight: self.protocol.in_flight() as u64,
            messages: counts.messages,
            loads: counts.loads,
            workers,
        }
    }
}
