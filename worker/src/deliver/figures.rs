//! Delivery's figures for `/metrics`: put -> delivered latency and push duration by target
//! kind as histograms, push outcomes per tenant and target kind, and the per-subscription
//! counters (series only for the top k an operator opted into). The number of series is
//! bounded by the tenants (at most [`MAX_TENANTS`] named, further tenants as `other`), never
//! by the subscriptions.

use super::*;

use runtime::histogram::{self, Histogram};
use runtime::metrics::{escape, line, top_subscriptions};

/// Tenants named in the per-tenant series; pushes of further tenants count under `other`.
pub(super) const MAX_TENANTS: usize = 256;

/// The `target_kind` labels, in `TargetKind` order, then the kind of a push whose
/// subscription is gone.
const KIND_LABELS: [&str; 4] = ["grpc", "webhook", "stream", "unknown"];

/// What a subscription pushes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum TargetKind {
    Grpc,
    Webhook,
    Stream,
}

impl TargetKind {
    pub(super) fn of(s: &v1::Subscription) -> TargetKind {
        match s.target.as_ref().and_then(|t| t.kind.as_ref()) {
            Some(v1::target::Kind::Webhook(_)) => TargetKind::Webhook,
            Some(v1::target::Kind::Stream(_)) => TargetKind::Stream,
            _ => TargetKind::Grpc,
        }
    }

    pub(super) fn label(self) -> &'static str {
        KIND_LABELS[self as usize]
    }

    const ALL: [TargetKind; 3] = [TargetKind::Grpc, TargetKind::Webhook, TargetKind::Stream];
}

/// The outcome of one push, as the per-tenant counters see it.
#[derive(Debug, Clone, Copy)]
pub(super) enum PushOutcome {
    Acked = 0,
    Failed = 1,
    DeadLetter = 2,
}

/// The figures (one per node's deliverer).
#[derive(Debug, Default)]
pub(super) struct Figures {
    /// From the object's arrival to its subscriber's acknowledgement.
    put_to_delivered: Histogram,
    /// One attempt, by target kind (`TargetKind as usize`).
    push: [Histogram; 3],
    /// tenant -> per target kind ([`KIND_LABELS`]) -> [acked, failed, dead-lettered].
    by_tenant: Mutex<std::collections::BTreeMap<String, [[u64; 3]; 4]>>,
}

impl Figures {
    /// One settled attempt of a subscription's push (`s` is `None` when the subscription is
    /// gone: counted under tenant and kind `unknown`), with how long it took.
    pub(super) fn pushed(
        &self,
        s: Option<&v1::Subscription>,
        outcome: PushOutcome,
        took: Option<Duration>,
    ) {
        let kind = s.map(TargetKind::of);
        if let (Some(k), Some(t)) = (kind, took) {
            self.push[k as usize].observe(t);
        }
        // the target kinds, then `unknown` (the subscription is gone)
        let k = kind.map_or(KIND_LABELS.len() - 1, |k| k as usize);
        let tenant = s.map_or("unknown", |s| s.tenant.as_str());
        let mut map = lock(&self.by_tenant);
        // a known tenant is counted without allocating (this runs for every push)
        if let Some(c) = map.get_mut(tenant) {
            c[k][outcome as usize] += 1;
            return;
        }
        let name = if map.len() < MAX_TENANTS {
            tenant
        } else {
            "other"
        };
        map.entry(name.to_string()).or_default()[k][outcome as usize] += 1;
    }

    /// An acknowledged delivery of an object that arrived at `received_unix_ms`.
    pub(super) fn delivered(&self, received_unix_ms: u64, now_unix_ms: u64) {
        self.put_to_delivered.observe(Duration::from_millis(
            now_unix_ms.saturating_sub(received_unix_ms),
        ));
    }

    /// Writes the families; returns the subscriptions given per-subscription series.
    pub(super) fn write(
        &self,
        o: &mut String,
        per_sub: &[(u64, [u64; 3])],
        top_k: usize,
    ) -> Vec<u64> {
        let name = "dissem_put_to_delivered_seconds";
        histogram::header(
            o,
            name,
            "From an object's arrival at its node to a subscriber's acknowledgement.",
        );
        self.put_to_delivered.render(o, name, "");
        let name = "dissem_push_duration_seconds";
        histogram::header(
            o,
            name,
            "One push attempt (a call, a POST, a stream send), by target kind.",
        );
        for k in TargetKind::ALL {
            self.push[k as usize].render(o, name, &format!("target_kind=\"{}\"", k.label()));
        }
        let mut samples = Vec::new();
        for (tenant, kinds) in lock(&self.by_tenant).iter() {
            for (kind, counts) in KIND_LABELS.iter().zip(kinds) {
                if counts.iter().all(|c| *c == 0) {
                    continue; // no push of that kind for the tenant
                }
                for (i, outcome) in ["acked", "failed", "dead_letter"].iter().enumerate() {
                    samples.push((
                        format!(
                            "tenant=\"{}\",target_kind=\"{kind}\",outcome=\"{outcome}\"",
                            escape(tenant)
                        ),
                        counts[i] as f64,
                    ));
                }
            }
        }
        line(
            o,
            "dissem_tenant_deliveries_total",
            "Push attempts by tenant, target kind and outcome.",
            "counter",
            &samples,
        );
        top_subscriptions(o, per_sub, top_k)
    }
}

impl runtime::metrics::Families for Deliverer {
    fn write_metrics(&self, out: &mut String, scrape: &runtime::metrics::Scrape) {
        let k = scrape
            .subscriptions
            .unwrap_or(self.inner.cfg.metrics_top_subscriptions);
        let per_sub = self.top_subscriptions(k);
        let top = self.inner.figures.write(out, &per_sub, k);
        if top.is_empty() {
            return;
        }
        // their deliveries waiting in the endpoint queues (one pass over the queues)
        let mut waiting: std::collections::BTreeMap<u64, u64> =
            top.iter().map(|s| (*s, 0)).collect();
        for q in lock(&self.inner.queues).values() {
            for job in q.jobs.iter() {
                if let Some(n) = waiting.get_mut(&job.sub) {
                    *n += 1;
                }
            }
        }
        let samples: Vec<_> = waiting
            .into_iter()
            .map(|(sub, n)| (format!("subscription=\"{sub}\""), n as f64))
            .collect();
        line(
            out,
            "dissem_subscription_backlog",
            "Deliveries waiting in their endpoint's queue, of the subscriptions above.",
            "gauge",
            &samples,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(tenant: &str, kind: v1::target::Kind) -> v1::Subscription {
        v1::Subscription {
            tenant: tenant.into(),
            target: Some(v1::Target { kind: Some(kind) }),
            ..v1::Subscription::default()
        }
    }

    #[test]
    fn series_are_bounded_by_tenants_not_subscriptions() {
        let f = Figures::default();
        let hook = sub("acme", v1::target::Kind::Webhook("https://x".into()));
        for _ in 0..3 {
            f.pushed(
                Some(&hook),
                PushOutcome::Acked,
                Some(Duration::from_millis(4)),
            );
        }
        f.pushed(Some(&hook), PushOutcome::DeadLetter, None);
        f.pushed(None, PushOutcome::DeadLetter, None);
        for t in 0..5 * MAX_TENANTS {
            let s = sub(&format!("t{t}"), v1::target::Kind::Stream("s".into()));
            f.pushed(Some(&s), PushOutcome::Acked, None);
        }
        f.delivered(1_000, 1_003);
        let mut o = String::new();
        f.write(&mut o, &[(7, [1, 0, 0])], 0);
        assert!(
            o.contains(
                "dissem_tenant_deliveries_total{tenant=\"acme\",target_kind=\"webhook\",outcome=\"acked\"} 3"
            ),
            "{o}"
        );
        assert!(o.contains("outcome=\"dead_letter\"} 1"), "{o}");
        assert!(
            o.contains("tenant=\"unknown\",target_kind=\"unknown\",outcome=\"dead_letter\"} 1"),
            "{o}"
        );
        assert!(o.contains("tenant=\"other\",target_kind=\"stream\""), "{o}");
        let tenants = o
            .lines()
            .filter(|l| l.starts_with("dissem_tenant_deliveries_total{"))
            .count();
        assert!(tenants <= (MAX_TENANTS + 1) * 4 * 3, "{tenants} series");
        assert!(
            o.contains(
                "dissem_push_duration_seconds_bucket{target_kind=\"webhook\",le=\"0.005\"} 3"
            ),
            "{o}"
        );
        assert!(
            o.contains("dissem_put_to_delivered_seconds_bucket{le=\"0.005\"} 1"),
            "{o}"
        );
        assert!(
            !o.contains("dissem_subscription_deliveries_total"),
            "per-subscription is opt-in"
        );
        let mut opted = String::new();
        f.write(&mut opted, &[(7, [1, 0, 0])], 5);
        assert!(
            opted.contains("subscription=\"7\",outcome=\"acked\"} 1"),
            "{opted}"
        );
    }
}
