//! Active-passive: a primary `p` replicating to a standby `s` (each with a recording
//! subscriber; `s` promotes itself after a short silence), a publisher that fails over from
//! `p` to `s`; `p` is SIGKILLed mid-run, and after the run the switch back follows the
//! docs/federation.md's procedure: `p` returns with `--standby`, the publisher moves to it first, the
//! links drain, then `p` is promoted and `s` steps down.

use super::*;

/// The active-passive figures.
#[derive(Debug, Clone, Serialize)]
pub struct ActivePassiveReport {
    pub pass: bool,
    /// Acknowledged objects delivered by neither cluster, and deliveries beyond the first
    /// (over both clusters).
    pub missing: u64,
    pub duplicates: u64,
    pub acknowledged: u64,
    pub rate: u32,
    pub run_s: f64,
    pub killed_at_s: f64,
    pub ttl_ms: u64,
    /// From the kill until the standby reports itself active (at most
    /// [`PROMOTED_WITHIN_MS`] to pass).
    pub promoted_after_ms: f64,
    pub delivered_by_primary: u64,
    pub delivered_by_secondary: u64,
    /// Objects acknowledged by the primary that the secondary delivered later than the TTL
    /// after their put.
    pub stale: u64,
    /// The old primary leads again and the secondary stands by, with nothing lost.
    pub switched_back: bool,
    /// The first objects delivered more than once: `publisher-n` with the times shown by
    /// the primary's and the secondary's subscriber.
    pub repeated: Vec<String>,
}

/// The standby is to be promoted within this of the primary's kill.
pub const PROMOTED_WITHIN_MS: f64 = 1000.0;

/// How much later than the TTL a copy's delivery may land (the push itself takes time).
const STALE_SLACK: Duration = Duration::from_millis(250);

pub(super) async fn run(o: &FederationOptions, dir: &Path) -> anyhow::Result<ActivePassiveReport> {
    let (p_addr, s_addr) = (procs::free_port(), procs::free_port());
    let ttl = humantime(o.ap_ttl);
    let link = |to: SocketAddr| {
        vec![
            "--link".to_string(),
            format!("peer=http://{to},mode=active-passive,ttl={ttl}"),
        ]
    };
    let mut p = cluster(&o.bin, dir, "p", p_addr, &link(s_addr));
    let mut s_flags = link(p_addr);
    s_flags.extend([
        "--standby".to_string(),
        "--promote-after".into(),
        humantime(o.ap_promote_after),
    ]);
    let s = cluster(&o.bin, dir, "s", s_addr, &s_flags);
    let (p_url, s_url) = (p.url(), s.url());
    let (rec_p, target_p) = Recorder::start().await?;
    let (rec_s, target_s) = Recorder::start().await?;
    // exactly once across a SIGKILL needs QoS 2: a QoS 1 push acknowledged just before the
    // kill is pushed again after the restart (at least once)
    let q2 = || Sub {
        qos: v1::Qos::ExactlyOnce,
        ..Sub::default()
    };
    rec_p.expect_qos2(subscribe(&p_url, &target_p, q2()).await?);
    rec_s.expect_qos2(subscribe(&s_url, &target_s, q2()).await?);

    let publisher = Publisher::new("ap", &[p_url.clone(), s_url.clone()]);
    let total = (f64::from(o.ap_rate) * o.ap_run.as_secs_f64()) as i64;
    let task = publisher.spawn(0..total, o.ap_rate);
    tokio::time::sleep(o.ap_kill_at).await;
    eprintln!(
        "  SIGKILL of the primary at {} s",
        o.ap_kill_at.as_secs_f64()
    );
    let killed = Instant::now();
    p.kill();
    let promoted = procs::try_wait_for(Duration::from_secs(20), || async {
        links(&s_url).await.filter(|l| l.role == "active")
    })
    .await;
    let promoted_after_ms = killed.elapsed().as_secs_f64() * 1e3;
    if promoted.is_none() {
        anyhow::bail!("the standby did not promote itself within 20 s of the primary's kill");
    }
    eprintln!("  the standby promoted itself after {promoted_after_ms:.0} ms");
    task.await?;

    eprintln!("  switching back: the old primary returns as a standby");
    p.restart_with(&["--standby"]);
    let drained_s = drained(std::slice::from_ref(&s_url), Duration::from_secs(30)).await;
    // publishers first: new puts go to the old primary (a standby delivers its own puts)
    let back = Publisher::new("ap2", std::slice::from_ref(&p_url));
    let second = (f64::from(o.ap_rate) * 1.0) as i64;
    back.spawn(0..second, o.ap_rate).await?;
    // drain: the active side's link owes nothing, and the standby keeps no copy
    let copies_gone = procs::try_wait_for(Duration::from_secs(30), || async {
        links(&p_url).await.filter(|l| l.standby_copies == 0).and(
            drained(std::slice::from_ref(&s_url), Duration::ZERO)
                .await
                .then_some(()),
        )
    })
    .await
    .is_some();
    // then the consumers: the old primary is promoted, and the other side steps down
    let promote = v1::federation_client::FederationClient::new(channel(&p_url))
        .promote(v1::PromoteRequest {})
        .await;
    let stepped_down = procs::try_wait_for(Duration::from_secs(20), || async {
        links(&s_url).await.filter(|l| l.role == "standby")
    })
    .await
    .is_some();
    let after = Publisher::new("ap3", std::slice::from_ref(&p_url));
    after.spawn(0..second, o.ap_rate).await?;

    let acked: BTreeMap<(String, i64), (Instant, usize)> = [&publisher, &back, &after]
        .iter()
        .flat_map(|p| p.acked())
        .collect();
    let _ = procs::try_wait_for(Duration::from_secs(30), || async {
        let shown = shows(&[&rec_p, &rec_s]);
        acked.keys().all(|k| shown.contains_key(k)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let shown = shows(&[&rec_p, &rec_s]);
    let (missing, duplicates) = tally(&acked, &shown);
    // a copy the standby delivered long after its put at the primary
    let at_s = rec_s.numbered();
    let stale = publisher
        .acked()
        .iter()
        .filter(|(_, (_, at))| *at == 0)
        .filter_map(|(k, (put, _))| at_s.get(k).map(|v| v.first.duration_since(*put)))
        .filter(|age| *age > o.ap_ttl + STALE_SLACK)
        .count() as u64;
    let count = |r: &Recorder| r.numbered().values().map(|v| u64::from(v.times)).sum();
    let at_p = rec_p.numbered();
    let times = |m: &BTreeMap<(String, i64), Seen>, k| m.get(k).map_or(0, |v| v.times);
    let repeated = shown
        .iter()
        .filter(|(_, n)| **n > 1)
        .take(10)
        .map(|(k, _)| {
            format!(
                "{}-{}: p {} s {}",
                k.0,
                k.1,
                times(&at_p, k),
                times(&at_s, k)
            )
        })
        .collect();
    let switched_back = drained_s && copies_gone && promote.is_ok() && stepped_down;
    Ok(ActivePassiveReport {
        pass: missing == 0
            && duplicates == 0
            && stale == 0
            && switched_back
            && promoted_after_ms <= PROMOTED_WITHIN_MS,
        missing,
        duplicates,
        acknowledged: acked.len() as u64,
        rate: o.ap_rate,
        run_s: o.ap_run.as_secs_f64(),
        killed_at_s: o.ap_kill_at.as_secs_f64(),
        ttl_ms: o.ap_ttl.as_millis() as u64,
        promoted_after_ms,
        delivered_by_primary: count(&rec_p),
        delivered_by_secondary: count(&rec_s),
        stale,
        switched_back,
        repeated,
    })
}

/// A duration as the flags take it (milliseconds).
fn humantime(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}
