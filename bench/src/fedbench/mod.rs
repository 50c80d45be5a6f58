//! `dissem bench federation` (issue 16): the three federation modes on real `dissem up`
//! clusters on loopback, times compressed, each judged pass or fail.
//!
//! - `all_active`: three clusters in a triangle, a publisher per cluster; every cluster's
//!   subscriber gets every object exactly once, each publisher's objects in order; the link
//!   counters show each object forwarded once to each peer and never on; nothing changes for a
//!   while after traffic stops; one link is cut for a few seconds mid-run (a TCP relay drops
//!   its connections) and loses nothing ([`all_active`]).
//! - `active_passive`: a primary replicating to a standby (short TTL) under steady puts is
//!   SIGKILLed; the standby promotes itself, the publisher fails over to it; then the switch
//!   back: the old primary returns as a standby, publishers move first, the link drains, the
//!   old primary is promoted. Every acknowledged object is delivered exactly once across the
//!   two clusters, and the standby never delivers a copy older than the TTL
//!   ([`active_passive`]).
//! - `spillover`: two clusters with spillover links, a publisher each; cluster A's subscriber
//!   starts refusing everything (max attempts 3); every object is delivered exactly once, in
//!   A or in B, within the subscription's deadline, and nothing is spilled twice
//!   ([`spillover`]).
//!
//! Subscribers are recording gRPC endpoints ([`crate::recorder::Recorder`]) that count each
//! numbered object (publisher, n) they were shown.

mod active_passive;
mod all_active;
mod publisher;
mod spillover;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::v1;
use serde::Serialize;

use crate::procs::{self, Proc, channel, numbered_put};
use crate::recorder::{Recorder, Seen};

pub use active_passive::ActivePassiveReport;
pub use all_active::AllActiveReport;
use publisher::Publisher;
pub use spillover::SpilloverReport;

/// The sizes and times of the three runs.
#[derive(Debug, Clone)]
pub struct FederationOptions {
    /// The `dissem` binary the clusters run.
    pub bin: PathBuf,
    /// All-active: objects per publisher (one publisher per cluster), puts per second each,
    /// how long one link is cut mid-run, and how long the counts must stay flat after.
    pub objects: u32,
    pub rate: u32,
    pub cut: Duration,
    pub flat: Duration,
    /// Active-passive: puts per second, run time, when the primary is killed, the standby
    /// copies' TTL and the standby's `--promote-after`.
    pub ap_rate: u32,
    pub ap_run: Duration,
    pub ap_kill_at: Duration,
    pub ap_ttl: Duration,
    pub ap_promote_after: Duration,
    /// Spillover: puts per second per cluster, run time, when A's subscriber starts refusing,
    /// and the subscriptions' delivery deadline (their retry TTL).
    pub spill_rate: u32,
    pub spill_run: Duration,
    pub spill_refuse_at: Duration,
    pub spill_deadline: Duration,
}

impl FederationOptions {
    /// The sizes the issue asks for.
    pub fn full(bin: PathBuf) -> FederationOptions {
        FederationOptions {
            bin,
            objects: 2000,
            rate: 500,
            cut: Duration::from_secs(3),
            flat: Duration::from_secs(5),
            ap_rate: 200,
            ap_run: Duration::from_secs(20),
            ap_kill_at: Duration::from_secs(8),
            ap_ttl: Duration::from_secs(2),
            ap_promote_after: Duration::from_millis(500),
            spill_rate: 100,
            spill_run: Duration::from_secs(20),
            spill_refuse_at: Duration::from_secs(5),
            spill_deadline: Duration::from_secs(10),
        }
    }

    /// A few seconds per mode (a smoke run).
    pub fn quick(bin: PathBuf) -> FederationOptions {
        FederationOptions {
            objects: 200,
            rate: 100,
            cut: Duration::from_secs(1),
            flat: Duration::from_secs(1),
            ap_rate: 50,
            ap_run: Duration::from_secs(4),
            ap_kill_at: Duration::from_secs(2),
            spill_rate: 50,
            spill_run: Duration::from_secs(4),
            spill_refuse_at: Duration::from_secs(1),
            ..FederationOptions::full(bin)
        }
    }
}

/// The three results.
#[derive(Debug, Clone, Serialize)]
pub struct FederationReport {
    pub all_active: AllActiveReport,
    pub active_passive: ActivePassiveReport,
    pub spillover: SpilloverReport,
    pub pass: bool,
}

/// Runs the three modes one after the other on a runtime of its own.
pub fn run(o: &FederationOptions) -> anyhow::Result<FederationReport> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let dir = procs::temp_dir("federation");
        eprintln!("all-active: 3 clusters in a triangle");
        let all_active = all_active::run(o, &dir.join("all-active")).await?;
        eprintln!("active-passive: a primary, a standby");
        let active_passive = active_passive::run(o, &dir.join("active-passive")).await?;
        eprintln!("spillover: two clusters");
        let spillover = spillover::run(o, &dir.join("spillover")).await?;
        let _ = std::fs::remove_dir_all(&dir);
        let pass = all_active.pass && active_passive.pass && spillover.pass;
        Ok(FederationReport {
            all_active,
            active_passive,
            spillover,
            pass,
        })
    })
}

/// Prints the figures.
pub fn print(r: &FederationReport) {
    let verdict = |p: bool| if p { "pass" } else { "FAIL" };
    let a = &r.all_active;
    println!(
        "all-active      {}: {} missing, {} duplicates; {} forwards (want {}), {} re-forwards, \
         {} retransmitted; {} stored out of order ({} arrived out of order); counts flat {} s \
         after: {}; link cut {} s",
        verdict(a.pass),
        a.missing,
        a.duplicates,
        a.forwards,
        a.expected_forwards,
        a.re_forwards,
        a.retransmitted,
        a.out_of_order,
        a.arrived_out_of_order,
        a.flat_s,
        !a.changed_after_stop,
        a.cut_s
    );
    let p = &r.active_passive;
    println!(
        "active-passive  {}: {} missing, {} duplicates of {} acknowledged; promoted {:.0} ms \
         after the kill; {} delivered by the primary, {} by the secondary, {} older than the \
         {} ms TTL; switched back: {}",
        verdict(p.pass),
        p.missing,
        p.duplicates,
        p.acknowledged,
        p.promoted_after_ms,
        p.delivered_by_primary,
        p.delivered_by_secondary,
        p.stale,
        p.ttl_ms,
        p.switched_back
    );
    let s = &r.spillover;
    println!(
        "spillover       {}: {} missing, {} duplicates of {} acknowledged; {} spilled to B, \
         {} spilled twice; {} delivered in A, {} in B; {} past the {} ms deadline (slowest \
         {:.0} ms)",
        verdict(s.pass),
        s.missing,
        s.duplicates,
        s.acknowledged,
        s.spilled,
        s.spilled_twice,
        s.delivered_in_a,
        s.delivered_in_b,
        s.late,
        s.deadline_ms,
        s.slowest_ms
    );
    println!("federation: {}", verdict(r.pass));
}

/// `dissem up` of cluster `name` on `addr`, data under `dir/name`, loopback targets allowed.
fn cluster(bin: &Path, dir: &Path, name: &str, addr: SocketAddr, extra: &[String]) -> Proc {
    let mut flags = vec!["--allow-private-targets".to_string()];
    flags.extend(extra.iter().cloned());
    procs::cluster_up(bin, dir, name, &addr.to_string(), &flags)
}

/// How a benchmark subscribes: its name, retry policy, QoS and whether it is ordered.
#[derive(Debug, Clone, Default)]
struct Sub {
    name: String,
    retry: Option<v1::RetryPolicy>,
    qos: v1::Qos,
    ordered: bool,
}

/// A gRPC subscription of every numbered object on the cluster at `url`, pushing to
/// `target`, as `sub` says.
async fn subscribe(url: &str, target: &str, sub: Sub) -> anyhow::Result<u64> {
    let s = v1::Subscription {
        qos: sub.qos as i32,
        retry: sub.retry,
        name: sub.name,
        ordered: sub.ordered,
        ..procs::grpc_subscription("n >= 0", target)
    };
    Ok(procs::create_subscription(url, s).await?)
}

/// The links of the cluster at `url` (`None` while it does not answer).
async fn links(url: &str) -> Option<v1::LinksResponse> {
    v1::federation_client::FederationClient::new(channel(url))
        .links(v1::LinksRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// Waits (at most `timeout`) until no link of the clusters at `urls` owes anything.
async fn drained(urls: &[String], timeout: Duration) -> bool {
    procs::try_wait_for(timeout, || async {
        for u in urls {
            if links(u).await?.links.iter().any(|l| l.owed > 0) {
                return None;
            }
        }
        Some(())
    })
    .await
    .is_some()
}

/// Shows per numbered object summed over `recs`.
fn shows(recs: &[&Recorder]) -> BTreeMap<(String, i64), u32> {
    let mut m = BTreeMap::new();
    for r in recs {
        for (k, v) in r.numbered() {
            *m.entry(k).or_insert(0) += v.times;
        }
    }
    m
}

/// (missing, duplicates) of the `acked` objects in `shown`.
fn tally<V>(
    acked: &BTreeMap<(String, i64), V>,
    shown: &BTreeMap<(String, i64), u32>,
) -> (u64, u64) {
    let missing = acked.keys().filter(|k| !shown.contains_key(*k)).count() as u64;
    let duplicates = shown.values().map(|n| u64::from(n.saturating_sub(1))).sum();
    (missing, duplicates)
}
