//! `dissem bench chaos` (issue 31): seeded fault schedules over a whole cluster of real
//! processes, and an oracle after each. The cluster is etcd, two coordinators (one leads)
//! and a grid of nodes (3x3 by default), with a QoS 1 and a QoS 2 subscriber on a recording
//! gRPC endpoint, a QoS 1 webhook and a QoS 1 stream subscriber that moves to another node
//! when its own dies (`endpoints`), a `dissem receive` process with a QoS 1 and a QoS 2
//! subscription whose journal the oracle reads (`receiver`), and a writer putting numbered
//! objects through every node throughout.
//!
//! A schedule is drawn from its seed alone: a few faults, each one of SIGKILL and restart of
//! a node (with its disk, or with its data directory deleted), SIGSTOP past the lease then
//! SIGCONT of a node, SIGKILL of the leading coordinator
//! (restarted as a standby), SIGKILL and restart of etcd, the subscribers refusing every
//! delivery for a while, and subscription changes while a node is down (a subscription
//! deleted, a canary updated, a canary created). Every node links (all-active) to a peer
//! cluster through a relay (`chaosfed`); about a third of the schedules start by cutting
//! that link, or by SIGKILLing the peer, and heal it only after their last fault, so what
//! the puts owe the peer is owed while nodes die and lose their disks. Schedule `i`
//! of a run with seed `S` has seed `S + i`; a failing one is printed with its seed, and
//! `--seed <that> --schedules 1` replays it.
//!
//! After each schedule the oracle checks: every acknowledged object delivered to every
//! subscriber (at least once for QoS 1, exactly once for QoS 2); nothing delivered to a
//! canary (a filter no object matches) nor to a deleted subscription for an object put
//! after the delete returned; no deleted subscription listed again by the leader; no
//! canary listed at an older revision than its last update returned; every acknowledged
//! object shown to the peer cluster's subscriber. After the last schedule the leader is
//! killed once more, and the next leader must list exactly the same subscriptions at the
//! same revisions (`leaders_disagree` otherwise).
//!
//! About a quarter of the schedules end by damaging a node's object log while it is down
//! (`chaosdisk`): the node must take the lost records back from their copies. About a
//! quarter fill a node's disk to the last byte while it runs and free it a few seconds later
//! (each node's data directory is a tmpfs of its own; where mounts are not allowed these
//! faults are counted as `disk_full_skipped` and not applied): the node must refuse puts
//! it cannot store, keep running and lose nothing it acknowledged. About a third make the
//! federation link a wide-area one for the whole schedule: 50-200 ms each way and 1% of the
//! segments late by a retransmission timeout (the relay's impairment; `tc netem` in network
//! namespaces would need a machine of its own per cluster).
//!
//! After every schedule each process the benchmark started must still run, unless a fault
//! of the schedule stopped it (`crashed` otherwise; it is started again).
//!
//! A run that fails keeps its folder (the receiver's journal, etcd, the coordinators' and
//! untouched nodes' stores) and says where; with `DISSEM_CHAOS_KEEP_STORES` set it also
//! copies the nodes' tmpfs disks beside it before they are unmounted.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::v1;
use serde::Serialize;

mod calls;
mod check;
mod endpoints;
mod receiver;
mod schedule;

pub use schedule::{Fault, schedule};

use crate::chaosfed::Peer;
use crate::elected::ElectedCluster;
use crate::failoverbench::Traffic;
use crate::procs::{self, try_wait_for};
use calls::{create, delete, retry};
use check::{check_registry, duplicated, misdeliveries, not_in, peer_missing};
use storage::ObjectId;

/// Options of the chaos benchmark.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub bin: std::path::PathBuf,
    pub seed: u64,
    /// Schedules to run (at least; with `minutes`, more until that time has passed).
    pub schedules: usize,
    pub minutes: Option<f64>,
    /// Faults per schedule.
    pub faults: usize,
    pub grid: (u32, u32),
    /// Puts per second, spread over the nodes.
    pub rate: u32,
    pub lease_ttl: u64,
    /// The report is written here after every schedule too (a run stopped early still
    /// leaves its figures).
    pub json: Option<std::path::PathBuf>,
}

/// One broken invariant, with the schedule that broke it.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub seed: u64,
    pub invariant: &'static str,
    pub detail: String,
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    pub seed: u64,
    pub grid: String,
    pub schedules: usize,
    /// Cluster faults drawn per schedule (`--faults`): a seed's schedule depends on it.
    pub faults_per_schedule: usize,
    pub faults: BTreeMap<&'static str, usize>,
    pub acknowledged: usize,
    pub lost: usize,
    pub qos2_duplicates: u64,
    pub qos1_repeats: u64,
    pub misdelivered: u64,
    pub resurrected: usize,
    pub stale_versions: usize,
    /// Acknowledged objects the peer cluster's subscriber was never shown.
    pub federation_missing: usize,
    pub violations: Vec<Violation>,
    pub seconds: f64,
    pub pass: bool,
}

/// The subscriptions a schedule changes, and what each change returned.
#[derive(Debug, Default)]
struct Changes {
    /// Canaries (no object matches them): id -> the revision the last change returned.
    canaries: BTreeMap<u64, u64>,
    /// Deleted subscriptions (pushing every object): id -> the first object number put
    /// after the delete returned.
    deleted: BTreeMap<u64, usize>,
    /// Deleted subscriptions a check found listed again.
    resurrected: std::collections::BTreeSet<u64>,
}

/// Runs the benchmark on a runtime of its own.
pub fn run(o: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(async {
            // stopped by a signal, the run is dropped: every process it started is killed
            // and every disk it mounted unmounted (their `Drop`s), instead of left behind
            tokio::select! {
                r = run_async(o) => r,
                s = interrupted() => bail!("stopped by {s}"),
            }
        })
}

/// Waits for SIGINT or SIGTERM and names it (never, where they cannot be watched).
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        _ => std::future::pending().await,
    }
}

async fn run_async(o: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    if !crate::elected::etcd_available() {
        bail!("the chaos benchmark needs etcd (apt-get install etcd-server)");
    }
    let started = Instant::now();
    let dir = procs::temp_dir("chaos");
    let nodes = o.grid.0 * o.grid.1;
    eprintln!(
        "starting etcd, 2 coordinators and a {}x{} grid of nodes",
        o.grid.0, o.grid.1
    );
    let mut peer = Peer::start(&o.bin, &dir).await?;
    let mut flags = procs::small_node_flags();
    flags.extend(peer.link_flags());
    // a disk of its own per node, for the full-disk faults (unmounted when the run ends)
    let disks: Vec<crate::chaosdisk::Tmpfs> = (0..nodes)
        .map_while(|id| crate::chaosdisk::Tmpfs::mount(&dir.join(format!("node{id}")), DISK_MIB))
        .collect();
    let tmpfs = disks.len() == nodes as usize;
    if !tmpfs {
        eprintln!("no tmpfs can be mounted here (not root?): full-disk faults are skipped");
    }
    let mut c = ElectedCluster::start_grid(&o.bin, &dir, 2, o.grid, o.lease_ttl, &flags).await?;
    let mut traffic = Traffic::start(&c, o.rate).await?;
    let hook = endpoints::Hook::start(&live_node(&c, None), traffic.numbers.clone())
        .await
        .context("creating the webhook subscription")?;
    let urls = c.nodes.iter().map(|n| n.url()).collect();
    let stream = endpoints::StreamSub::start(&o.bin, urls, traffic.numbers.clone())
        .await
        .context("creating the stream subscription")?;
    let receiver =
        receiver::Receiver::start(&o.bin, &live_node(&c, None), traffic.numbers.clone(), &dir)
            .await
            .context("starting the receiver process")?;
    let mut changes = Changes::default();
    let mut faults: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut violations = Vec::new();
    // acknowledged objects found not delivered (here, at the peer) by a check
    let (mut lost, mut resurrected, mut stale) = (0usize, 0, 0);
    let mut fed_missing = 0usize;
    let mut known_lost = std::collections::HashSet::new();
    let mut known_fed = std::collections::HashSet::new();
    // QoS 2 duplicates as of the last check (each schedule's are its own violation), and the
    // pairs already named
    let mut dups = 0;
    let mut reported = std::collections::BTreeSet::new();
    let mut done = 0;
    loop {
        let time_left = o
            .minutes
            .is_some_and(|m| started.elapsed().as_secs_f64() < m * 60.0);
        if done >= o.schedules && !time_left {
            break;
        }
        let seed = o.seed.wrapping_add(done as u64);
        let plan = schedule(seed, o.faults, nodes);
        let at = Instant::now();
        let mut victim = Some(
            create(&live_node(&c, None), "n >= 0", &traffic)
                .await
                .context("creating the schedule's subscription")?
                .id,
        );
        let mut took = Vec::new();
        for f in &plan {
            let skipped = matches!(f, Fault::DiskFull { .. }) && !tmpfs;
            let kind = if skipped {
                "disk_full_skipped"
            } else {
                f.kind()
            };
            *faults.entry(kind).or_default() += 1;
            if skipped {
                continue;
            }
            let t = Instant::now();
            let mut on = Targets {
                c: &mut c,
                peer: &mut peer,
                traffic: &traffic,
                hook: &hook,
                stream: &stream,
                receiver: &receiver,
            };
            apply(&mut on, &mut changes, &mut victim, *f, o.lease_ttl)
                .await
                .with_context(|| format!("schedule seed {seed}: {f:?}"))?;
            took.push(format!("{} {:.1} s", f.label(), t.elapsed().as_secs_f64()));
        }
        // the link, cut, slowed or with its peer down since the start, is whole again
        peer.heal();
        let faulted = Instant::now();
        let ended = crashed(&mut c);
        if !ended.is_empty() {
            violations.push(Violation {
                seed,
                invariant: "crashed",
                detail: format!("ended though no fault stopped them: {}", ended.join(", ")),
            });
        }
        if let Some(id) = victim.take() {
            // every node is back: an ordinary delete, checked like the others
            delete(&live_node(&c, None), id, &traffic, &mut changes)
                .await
                .context("deleting the schedule's subscription")?;
        }
        // the schedule's checks, once every node is back (of the objects not found missing
        // before: those are counted already, and waiting for them again would only slow
        // every later schedule by the whole minute)
        let acked = traffic.acked();
        let check = not_in(&acked, &known_lost);
        let (missing, by_hook, by_stream, by_receiver) =
            undelivered(&traffic, &hook, &stream, &receiver, &check).await;
        if !missing.is_empty() {
            violations.push(Violation {
                seed,
                invariant: "lost",
                detail: format!(
                    "{} acknowledged objects ({} not shown to the QoS 1 subscriber, {} not to \
                     the QoS 2 one, {} not to the webhook, {} not to the stream, {} not to \
                     the receiver process), e.g. {:?}",
                    missing.len(),
                    missing
                        .iter()
                        .filter(|id| traffic.rec.first_shown((traffic.q1, **id)).is_none())
                        .count(),
                    missing
                        .iter()
                        .filter(|id| traffic.rec.first_shown((traffic.q2, **id)).is_none())
                        .count(),
                    by_hook,
                    by_stream,
                    by_receiver,
                    &missing[..missing.len().min(3)]
                ),
            });
        }
        known_lost.extend(missing);
        lost = known_lost.len();
        let check = not_in(&acked, &known_fed);
        let at_peer = peer_missing(&peer, &traffic, &check).await;
        if !at_peer.is_empty() {
            violations.push(Violation {
                seed,
                invariant: "federation_missing",
                detail: format!(
                    "{} acknowledged objects never reached the peer cluster, e.g. (n, id) {:?}",
                    at_peer.len(),
                    &at_peer[..at_peer.len().min(3)]
                ),
            });
        }
        known_fed.extend(at_peer.iter().map(|(_, id)| *id));
        fed_missing = known_fed.len();
        let (now_dups, _) = repeats(&traffic, &receiver);
        if now_dups > dups {
            violations.push(Violation {
                seed,
                invariant: "qos2_duplicates",
                detail: format!(
                    "{} QoS 2 deliveries shown twice: {}",
                    now_dups - dups,
                    duplicated(&traffic, &receiver, &mut reported)
                ),
            });
        }
        dups = now_dups;
        let (r, s) = check_registry(&c, &mut changes, seed, &mut violations).await?;
        resurrected += r;
        stale += s;
        done += 1;
        eprintln!(
            "schedule {done} (seed {seed}) in {:.1} s: {}; checked in {:.1} s",
            at.elapsed().as_secs_f64(),
            took.join(", "),
            faulted.elapsed().as_secs_f64(),
        );
        for v in violations.iter().filter(|v| v.seed == seed) {
            eprintln!("  VIOLATION {}: {}", v.invariant, v.detail);
        }
        if let Some(path) = &o.json {
            let t = Tally {
                schedules: done,
                faults: faults.clone(),
                acknowledged: acked.len(),
                lost,
                resurrected,
                stale,
                fed_missing,
                violations: violations.clone(),
            };
            // not finished: no pass yet
            let r = report(o, t, (&traffic, &receiver), &changes, started, false);
            crate::write_json(path, &r)?;
        }
    }
    let acked = traffic.stop().await?;
    let check = not_in(&acked, &known_lost);
    let (missing, ..) = undelivered(&traffic, &hook, &stream, &receiver, &check).await;
    if !missing.is_empty() {
        violations.push(Violation {
            seed: o.seed,
            invariant: "lost",
            detail: format!("{} acknowledged objects at the end", missing.len()),
        });
    }
    let lost = lost + missing.len();
    let check = not_in(&acked, &known_fed);
    let at_peer = peer_missing(&peer, &traffic, &check).await;
    if !at_peer.is_empty() {
        violations.push(Violation {
            seed: o.seed,
            invariant: "federation_missing",
            detail: format!(
                "{} acknowledged objects never reached the peer cluster at the end",
                at_peer.len()
            ),
        });
    }
    let fed_missing = fed_missing + at_peer.len();
    let (qos2_duplicates, _) = repeats(&traffic, &receiver);
    if qos2_duplicates > dups {
        violations.push(Violation {
            seed: o.seed,
            invariant: "qos2_duplicates",
            detail: format!(
                "{} QoS 2 deliveries shown twice after the last schedule",
                qos2_duplicates - dups
            ),
        });
    }
    // the next leader serves the same subscriptions
    check::leaders_agree(&mut c, o.seed, &mut violations).await?;
    let misdelivered = misdeliveries(&traffic, &changes);
    if misdelivered > 0 {
        violations.push(Violation {
            seed: o.seed,
            invariant: "misdelivered",
            detail: format!("{misdelivered} deliveries to canaries or deleted subscriptions"),
        });
    }
    let pass = violations.is_empty();
    let t = Tally {
        schedules: done,
        faults,
        acknowledged: acked.len(),
        lost,
        resurrected,
        stale,
        fed_missing,
        violations,
    };
    let report = report(o, t, (&traffic, &receiver), &changes, started, pass);
    drop(c);
    if !pass && std::env::var_os("DISSEM_CHAOS_KEEP_STORES").is_some() {
        let _ = std::process::Command::new("cp")
            .args(["-a"])
            .arg(&dir)
            .arg(format!("{}-stores", dir.display()))
            .status();
    }
    drop(disks);
    if pass {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        // the receiver's journal and the nodes' stores, to read what went wrong
        eprintln!("kept {} for inspection", dir.display());
    }
    Ok(report)
}

/// What a run counted itself; the rest of a report is read from the traffic.
struct Tally {
    schedules: usize,
    faults: BTreeMap<&'static str, usize>,
    acknowledged: usize,
    lost: usize,
    resurrected: usize,
    stale: usize,
    fed_missing: usize,
    violations: Vec<Violation>,
}

fn report(
    o: &ChaosOptions,
    t: Tally,
    (traffic, receiver): (&Traffic, &receiver::Receiver),
    changes: &Changes,
    started: Instant,
    pass: bool,
) -> ChaosReport {
    let (qos2_duplicates, qos1_repeats) = repeats(traffic, receiver);
    ChaosReport {
        seed: o.seed,
        grid: format!("{}x{}", o.grid.0, o.grid.1),
        schedules: t.schedules,
        faults_per_schedule: o.faults,
        faults: t.faults,
        acknowledged: t.acknowledged,
        lost: t.lost,
        qos2_duplicates,
        qos1_repeats,
        misdelivered: misdeliveries(traffic, changes),
        resurrected: t.resurrected,
        stale_versions: t.stale,
        federation_missing: t.fed_missing,
        pass,
        violations: t.violations,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// QoS 2 deliveries shown more than once, and QoS 1 ones shown again, by the in-process gRPC
/// subscribers and the receiver process together.
fn repeats(traffic: &Traffic, receiver: &receiver::Receiver) -> (u64, u64) {
    let (a2, a1) = traffic.repeats();
    let (b2, b1) = receiver.repeats();
    (a2 + b2, a1 + b1)
}

/// Which of `objects` a subscriber (gRPC QoS 1, QoS 2, the webhook, the stream or the
/// receiver process) was not shown within a minute, and how many of those the webhook, the
/// stream and the receiver were not.
async fn undelivered(
    traffic: &Traffic,
    hook: &endpoints::Hook,
    stream: &endpoints::StreamSub,
    receiver: &receiver::Receiver,
    objects: &[ObjectId],
) -> (Vec<ObjectId>, usize, usize, usize) {
    let limit = Duration::from_secs(60);
    let mut missing = traffic.undelivered(objects, limit).await;
    // the gRPC subscribers' wait is the others' too, unless it already ran out
    let rest = if missing.is_empty() {
        limit
    } else {
        Duration::from_secs(5)
    };
    let by_hook = hook.missing(objects, rest).await;
    let by_stream = stream.missing(objects, rest).await;
    let by_receiver = receiver.missing(objects, rest).await;
    missing.extend(
        by_hook
            .iter()
            .chain(&by_stream)
            .chain(&by_receiver)
            .copied(),
    );
    missing.sort_unstable();
    missing.dedup();
    (missing, by_hook.len(), by_stream.len(), by_receiver.len())
}

/// The size of each node's tmpfs: a run of hours at the default rate fills a few MiB of it.
const DISK_MIB: u32 = 256;

/// The processes of `c` that have ended, each started again; what the answer names ended
/// though no fault stopped it (a fault's own kills restart before the schedule ends).
fn crashed(c: &mut ElectedCluster) -> Vec<String> {
    let mut ended = Vec::new();
    for (i, n) in c.nodes.iter_mut().enumerate() {
        if let Some(status) = n.try_wait() {
            ended.push(format!("node {i} ({status})"));
            n.restart();
        }
    }
    for k in 0..c.coordinators.len() {
        if let Some(status) = c.coordinators[k].try_wait() {
            ended.push(format!("coordinator c{k} ({status})"));
            c.coordinators[k] = c.start_coordinator(k);
        }
    }
    ended
}

/// A live node to send subscription changes through (not `but`).
fn live_node(c: &ElectedCluster, but: Option<u32>) -> String {
    let i = (0..c.nodes.len())
        .find(|&i| Some(i as u32) != but)
        .unwrap_or(0);
    c.nodes[i].url()
}

/// What a fault acts on.
struct Targets<'a> {
    c: &'a mut ElectedCluster,
    peer: &'a mut Peer,
    traffic: &'a Traffic,
    hook: &'a endpoints::Hook,
    stream: &'a endpoints::StreamSub,
    receiver: &'a receiver::Receiver,
}

async fn apply(
    on: &mut Targets<'_>,
    changes: &mut Changes,
    victim: &mut Option<u64>,
    f: Fault,
    lease_ttl: u64,
) -> anyhow::Result<()> {
    let (c, traffic) = (&mut *on.c, on.traffic);
    match f {
        Fault::LinkCut => on.peer.cut.set_down(true),
        Fault::LinkSlow {
            delay_ms,
            loss_permille,
        } => on.peer.cut.set_impaired(Some(crate::cut::Impairment {
            delay: Duration::from_millis(delay_ms),
            loss_permille,
        })),
        Fault::DiskFull { node, hold_ms } => {
            let data = c.dir.join(format!("node{node}"));
            crate::chaosdisk::fill(&data)?;
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            crate::chaosdisk::free(&data)?;
        }
        Fault::PeerDown => on.peer.stop(),
        Fault::LogDamaged { node } => {
            let n = &mut c.nodes[node as usize];
            n.kill();
            crate::chaosdisk::damage_tail(&c.dir.join(format!("node{node}")), 3)?;
            n.restart();
        }
        Fault::NodeKill { node, down_ms } => {
            c.nodes[node as usize].kill();
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            c.nodes[node as usize].restart();
        }
        Fault::NodeWiped { node } => {
            c.nodes[node as usize].kill();
            crate::chaosdisk::wipe(&c.dir.join(format!("node{node}")))?;
            c.nodes[node as usize].restart();
        }
        Fault::NodePause { node } => {
            let n = &c.nodes[node as usize];
            n.signal("STOP");
            tokio::time::sleep(Duration::from_millis(lease_ttl * 1000 + 1500)).await;
            n.signal("CONT");
        }
        Fault::LeaderKill => {
            c.kill_leader().await?;
        }
        Fault::SubscriberDown { down_ms } if down_ms % 2 == 0 => {
            // every subscriber crashed: each connection to the in-process gRPC and webhook
            // endpoints broken mid-call and new ones closed, the stream's client and the
            // receiver's process SIGKILLed
            let crash = |down| {
                traffic.relay.set_down(down);
                on.hook.set_down(down);
                on.stream.set_down(down);
            };
            crash(true);
            on.receiver.set_down(true).await?;
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            crash(false);
            on.receiver.set_down(false).await?;
        }
        Fault::SubscriberDown { down_ms } => {
            traffic.rec.set_refusing(true);
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            traffic.rec.set_refusing(false);
        }
        Fault::EtcdRestart => {
            c.etcd.restart().await?;
            c.wait_leader(Duration::from_secs(30)).await?;
        }
        Fault::SubsWhileDown { node } => {
            c.nodes[node as usize].kill();
            let via = live_node(c, Some(node));
            let subs = v1::subscriptions_client::SubscriptionsClient::new(procs::channel(&via));
            if let Some(id) = victim.take() {
                delete(&via, id, traffic, changes)
                    .await
                    .context("deleting a subscription while a node is down")?;
            }
            if let Some((&id, _)) = changes.canaries.iter().next_back() {
                let mut s = retry(|| {
                    let mut subs = subs.clone();
                    async move { subs.get(v1::GetSubscriptionRequest { id }).await }
                })
                .await
                .context("reading a canary")?;
                s.filter = Some(v1::subscription::Filter::Text(format!(
                    "n < -{}",
                    1 + s.revision % 1000
                )));
                let s = retry(|| {
                    let mut subs = subs.clone();
                    let s = s.clone();
                    async move { subs.update(s).await }
                })
                .await
                .context("updating a canary while a node is down")?;
                changes.canaries.insert(id, s.revision);
            }
            let canary = create(&via, "n < 0", traffic)
                .await
                .context("creating a canary while a node is down")?;
            changes.canaries.insert(canary.id, canary.revision);
            c.nodes[node as usize].restart();
        }
    }
    Ok(())
}

/// Prints the figures.
pub fn print(r: &ChaosReport) {
    println!(
        "chaos: {} schedules on a {} grid from seed {} in {:.0} s",
        r.schedules, r.grid, r.seed, r.seconds
    );
    let faults: Vec<String> = r.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("faults: {}", faults.join(", "));
    println!(
        "acknowledged {}, lost {}, QoS 2 duplicates {}, QoS 1 repeats {}, misdelivered {}, \
         resurrected {}, stale versions {}, missing at the peer cluster {}",
        r.acknowledged,
        r.lost,
        r.qos2_duplicates,
        r.qos1_repeats,
        r.misdelivered,
        r.resurrected,
        r.stale_versions,
        r.federation_missing
    );
    // the schedule a seed draws depends on the faults per schedule and the grid too: a
    // `--quick` run's failure replayed without `--faults 3` was another schedule
    for v in &r.violations {
        println!(
            "VIOLATION {} (replay: --seed {} --schedules 1 --faults {} --grid {}): {}",
            v.invariant, v.seed, r.faults_per_schedule, r.grid, v.detail
        );
    }
    println!("{}", if r.pass { "PASS" } else { "FAIL" });
}
