//! Spillover: clusters A and B, each with a spillover link to the other, a publisher each
//! and a recording subscriber named `orders` in each (max attempts 3); A's subscriber
//! refuses every delivery from a point on, so A's deliveries dead-letter and spill to B.

use super::*;

/// The spillover figures.
#[derive(Debug, Clone, Serialize)]
pub struct SpilloverReport {
    pub pass: bool,
    /// Acknowledged objects delivered in neither cluster, and deliveries beyond the first
    /// (over both clusters).
    pub missing: u64,
    pub duplicates: u64,
    pub acknowledged: u64,
    pub rate: u32,
    pub run_s: f64,
    pub refused_from_s: f64,
    /// Deliveries A's link handed to B, and deliveries spilled a second time (A's link
    /// finding B had one already, or B spilling back).
    pub spilled: u64,
    pub spilled_twice: u64,
    pub delivered_in_a: u64,
    pub delivered_in_b: u64,
    /// The subscriptions' delivery deadline, deliveries later than it after the put, and
    /// the slowest put-to-delivery time.
    pub deadline_ms: u64,
    pub late: u64,
    pub slowest_ms: f64,
}

pub(super) async fn run(o: &FederationOptions, dir: &Path) -> anyhow::Result<SpilloverReport> {
    let (a_addr, b_addr) = (procs::free_port(), procs::free_port());
    let link = |to: SocketAddr| {
        vec![
            "--link".to_string(),
            format!("peer=http://{to},mode=spillover"),
        ]
    };
    let a = cluster(&o.bin, dir, "a", a_addr, &link(b_addr));
    let b = cluster(&o.bin, dir, "b", b_addr, &link(a_addr));
    let (a_url, b_url) = (a.url(), b.url());
    let retry = v1::RetryPolicy {
        max_attempts: 3,
        ttl_ms: o.spill_deadline.as_millis() as u64,
        initial_backoff_ms: 50,
        max_backoff_ms: 200,
    };
    let (rec_a, target_a) = Recorder::start().await?;
    let (rec_b, target_b) = Recorder::start().await?;
    let orders = || Sub {
        name: "orders".into(),
        retry: Some(retry),
        qos: v1::Qos::AtLeastOnce,
        ordered: false,
    };
    subscribe(&a_url, &target_a, orders()).await?;
    subscribe(&b_url, &target_b, orders()).await?;
    let n = (f64::from(o.spill_rate) * o.spill_run.as_secs_f64()) as i64;
    let pa = Publisher::new("a", std::slice::from_ref(&a_url));
    let pb = Publisher::new("b", std::slice::from_ref(&b_url));
    let tasks = [
        pa.spawn_stream(0..n, o.spill_rate),
        pb.spawn_stream(0..n, o.spill_rate),
    ];
    tokio::time::sleep(o.spill_refuse_at).await;
    eprintln!(
        "  A's subscriber refuses everything from {} s on",
        o.spill_refuse_at.as_secs_f64()
    );
    rec_a.set_refusing(true);
    for t in tasks {
        t.await?;
    }
    let acked: BTreeMap<(String, i64), (Instant, usize)> =
        pa.acked().into_iter().chain(pb.acked()).collect();
    let _ = procs::try_wait_for(o.spill_deadline + Duration::from_secs(10), || async {
        let shown = shows(&[&rec_a, &rec_b]);
        acked.keys().all(|k| shown.contains_key(k)).then_some(())
    })
    .await;
    let _ = drained(&[a_url.clone(), b_url.clone()], Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let shown = shows(&[&rec_a, &rec_b]);
    let (missing, duplicates) = tally(&acked, &shown);
    let (in_a, in_b) = (rec_a.numbered(), rec_b.numbered());
    let mut slowest = Duration::ZERO;
    let mut late = 0;
    for (k, (put, _)) in &acked {
        let first = [in_a.get(k), in_b.get(k)]
            .into_iter()
            .flatten()
            .map(|v| v.first)
            .min();
        if let Some(t) = first {
            let took = t.duration_since(*put);
            slowest = slowest.max(took);
            if took > o.spill_deadline {
                late += 1;
            }
        }
    }
    let link_of =
        |url: String| async move { links(&url).await.and_then(|l| l.links.into_iter().next()) };
    let (la, lb) = (link_of(a_url).await, link_of(b_url).await);
    let spilled = la.as_ref().map_or(0, |l| l.acked);
    let spilled_twice =
        la.as_ref().map_or(0, |l| l.deduplicated) + lb.as_ref().map_or(0, |l| l.acked);
    let count = |m: &BTreeMap<(String, i64), Seen>| m.values().map(|v| u64::from(v.times)).sum();
    Ok(SpilloverReport {
        pass: missing == 0 && duplicates == 0 && late == 0 && spilled_twice == 0 && spilled > 0,
        missing,
        duplicates,
        acknowledged: acked.len() as u64,
        rate: o.spill_rate,
        run_s: o.spill_run.as_secs_f64(),
        refused_from_s: o.spill_refuse_at.as_secs_f64(),
        spilled,
        spilled_twice,
        delivered_in_a: count(&in_a),
        delivered_in_b: count(&in_b),
        deadline_ms: o.spill_deadline.as_millis() as u64,
        late,
        slowest_ms: slowest.as_secs_f64() * 1e3,
    })
}
