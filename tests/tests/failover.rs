//! Coordinator failover on etcd with real processes (issue 15): a real etcd (Debian's
//! `etcd-server`) on free ports, two coordinators campaigning through it, three nodes in a
//! one-row grid following the leader, and a QoS 1 and a QoS 2 subscriber on a recording gRPC
//! endpoint in this process. The leader is SIGKILLed in the middle of a burst; the leader is
//! paused past its lease and continued (it must stop leading, and nodes refuse its
//! assignments); etcd itself is killed and restarted. Every acknowledged object reaches both
//! subscribers, and the QoS 2 one sees none twice. A new leader serves the registry it kept
//! while standing by.
//!
//! Without an `etcd` binary the tests say so and pass, unless `DISSEM_REQUIRE_ETCD` is set
//! (CI installs etcd and sets it, so a missing etcd fails there).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bench::elected::ElectedCluster;
use bench::failoverbench::Traffic;
use proto::v1;
use storage::ObjectId;
use tests::{dissem_bin, runtime, small_node_flags, temp_dir, wait_for};

static SERIAL: Mutex<()> = Mutex::new(());

fn have_etcd() -> bool {
    tests::have_etcd()
}

/// A running cluster with the benchmark's traffic: both subscriptions and a putter.
struct Setup {
    cluster: ElectedCluster,
    traffic: Traffic,
    dir: std::path::PathBuf,
}

async fn setup(name: &str, rate: u32) -> Setup {
    let dir = temp_dir(name);
    let cluster = ElectedCluster::start(&dissem_bin(), &dir, 2, 3, 2, &small_node_flags())
        .await
        .expect("cluster");
    let traffic = Traffic::start(&cluster, rate).await.expect("traffic");
    Setup {
        cluster,
        traffic,
        dir,
    }
}

/// Runs `body` on a fresh cluster (one scenario at a time) once `rate` puts were
/// acknowledged; without etcd, says so and passes (unless `DISSEM_REQUIRE_ETCD`).
fn scenario<F: std::future::Future<Output = ()>>(
    name: &str,
    rate: u32,
    body: impl FnOnce(Setup) -> F,
) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_etcd() {
        return;
    }
    runtime().block_on(async {
        let s = setup(name, rate).await;
        s.wait_acked(rate as usize).await;
        body(s).await
    });
}

impl Setup {
    /// The leader now and which of the coordinators it is.
    async fn leader(&self) -> (runtime::election::LeaderInfo, usize) {
        let l = self
            .cluster
            .wait_leader(Duration::from_secs(5))
            .await
            .expect("a leader");
        let k = ElectedCluster::index_of(&l.name).expect("one of ours");
        (l, k)
    }

    fn acked(&self) -> Vec<ObjectId> {
        self.traffic.acked()
    }

    async fn wait_acked(&self, n: usize) {
        tests::wait_acked(&self.traffic, n).await;
    }

    /// Stops the puts; then every acknowledged object must reach both subscribers, the QoS
    /// 2 one exactly once. The answer is how many objects were acknowledged.
    async fn finish(mut self) -> usize {
        let objects = self.traffic.stop().await.expect("putter");
        let lost = self
            .traffic
            .undelivered(&objects, Duration::from_secs(60))
            .await;
        assert!(
            lost.is_empty(),
            "{} of {} acknowledged objects were not delivered to both subscribers, e.g. {:?}",
            lost.len(),
            objects.len(),
            &lost[..lost.len().min(5)]
        );
        let (dups, _) = self.traffic.repeats();
        assert_eq!(dups, 0, "QoS 2 deliveries shown twice");
        drop(self.cluster);
        let _ = std::fs::remove_dir_all(&self.dir);
        objects.len()
    }
}

/// Waits until every node of `nodes` has image `version` (or a later one) ready.
async fn compiled_everywhere(nodes: &[String], version: u64) {
    for url in nodes {
        wait_for(
            "the image compiled",
            Duration::from_secs(30),
            || async move {
                (tests::stats(url).await.map_or(0, |s| s.image_loaded) >= version).then_some(())
            },
        )
        .await;
    }
}

/// The subscriptions a node at `via` lists, once the leader it follows answers.
/// A QoS 1 subscription to nowhere, created through the node at `via`.
async fn create(via: &str, filter: &str) -> Result<u64, tonic::Status> {
    tests::create_grpc_subscription(
        via,
        filter.into(),
        "http://127.0.0.1:9",
        v1::Qos::AtLeastOnce,
        None,
    )
    .await
}

async fn served_through(via: &str) -> Vec<v1::Subscription> {
    wait_for("the new leader's registry", Duration::from_secs(30), || {
        let via = via.to_string();
        async move {
            let mut subs =
                v1::subscriptions_client::SubscriptionsClient::new(bench::procs::channel(&via));
            let list = subs
                .list(v1::ListSubscriptionsRequest {
                    after_id: 0,
                    limit: 1000,
                })
                .await
                .ok()?
                .into_inner();
            Some(list.subscriptions)
        }
    })
    .await
}

#[test]
fn a_leader_killed_mid_burst_is_replaced_and_nothing_is_lost() {
    scenario("failover-kill", 150, async |mut s| {
        let (old, k) = s.leader().await;
        // the next leader rebuilds from the nodes' copies: a change sent to the leader
        // itself (no copies) is refused, naming the way that works
        let e = tests::create_grpc_subscription(
            &old.url,
            "n >= 0".into(),
            "http://127.0.0.1:9",
            v1::Qos::AtLeastOnce,
            None,
        )
        .await
        .expect_err("a create sent to the elected coordinator directly");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(e.message().contains("through a node"), "{e}");
        let killed_at = Instant::now();
        s.cluster.coordinators[k].kill();
        let new = s
            .cluster
            .wait_new_leader(old.epoch, Duration::from_secs(10))
            .await
            .expect("a new leader");
        assert_ne!(new.name, old.name, "the killed coordinator cannot lead");
        // membership is in etcd: the node records (endpoints, positions) and each running
        // node's presence under its own lease
        for prefix in ["nodes/", runtime::election::LIVE_PREFIX] {
            let n = s
                .cluster
                .client
                .get_prefix(prefix)
                .await
                .expect("etcd")
                .len();
            assert_eq!(n, 3, "{prefix} keys in etcd");
        }
        assert!(new.epoch > old.epoch, "epochs only grow");
        eprintln!("new leader after {:?}", killed_at.elapsed());
        let before = s.acked().len();
        s.wait_acked(before + 150).await;
        let n = s.finish().await;
        assert!(n >= 300, "{n} puts");
    });
}

#[test]
fn a_leader_paused_past_its_lease_stops_leading_and_nodes_ignore_it() {
    scenario("failover-pause", 100, async |s| {
        let (old, k) = s.leader().await;
        s.cluster.coordinators[k].signal("STOP");
        let new = s
            .cluster
            .wait_new_leader(old.epoch, Duration::from_secs(10))
            .await
            .expect("a new leader while the old one is paused");
        let before = s.acked().len();
        s.wait_acked(before + 100).await;
        s.cluster.coordinators[k].signal("CONT");
        // the old leader's lease ran out while it was paused: once it runs again it must
        // not serve as leader (its services are gone) and the key keeps naming the new one
        let old_url = old.url.clone();
        wait_for(
            "the paused leader to stop serving",
            Duration::from_secs(5),
            || {
                let url = old_url.clone();
                async move { tests::stats(&url).await.is_err().then_some(()) }
            },
        )
        .await;
        let still = s.cluster.leader().await.expect("a leader");
        assert_eq!(
            still.epoch, new.epoch,
            "the continued leader took the key back"
        );
        // and a node refuses an assignment that carries the deposed leader's nonce
        let secret = runtime::cluster_secret::ClusterSecret::load(&s.dir.join("cluster.secret"))
            .expect("cluster secret");
        let mut d = v1::daemon_client::DaemonClient::with_interceptor(
            tests::channel(&s.cluster.nodes[1].url()),
            secret.stamp(),
        );
        let e = d
            .assign(v1::AssignRequest {
                nonce: old.nonce,
                worker: 1,
                task: 1,
                block: "match".into(),
                ..Default::default()
            })
            .await
            .expect_err("an assignment from the deposed leader");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        let before = s.acked().len();
        s.wait_acked(before + 50).await;
        s.finish().await;
    });
}

#[test]
fn etcd_restarted_the_cluster_keeps_serving_and_elects_again() {
    scenario("failover-etcd", 100, async |mut s| {
        let (first, _) = s.leader().await;
        s.cluster.etcd.kill();
        // puts go on while etcd is down: nodes store them and the leader (or, if its lease
        // lapsed meanwhile, the next one) matches them
        let before = s.acked().len();
        s.wait_acked(before + 50).await;
        s.cluster.etcd.restart().await.expect("etcd restarted");
        let (leader, k) = s.leader().await;
        // etcd keeps leases across its restart, so the leader's lease lived on: it held
        // everything back while etcd was away and leads on
        assert_eq!(
            (leader.name.as_str(), leader.epoch),
            (first.name.as_str(), first.epoch),
            "the leader changed across etcd's restart"
        );
        let before = s.acked().len();
        s.wait_acked(before + 100).await;
        // the election works again: the leader's death is noticed and another takes over
        s.cluster.coordinators[k].kill();
        s.cluster
            .wait_new_leader(leader.epoch, Duration::from_secs(15))
            .await
            .expect("a new leader after etcd's restart");
        let before = s.acked().len();
        s.wait_acked(before + 100).await;
        s.finish().await;
    });
}

#[test]
fn a_coordinator_with_another_grid_than_the_cluster_is_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_etcd() {
        return;
    }
    runtime().block_on(async {
        let dir = temp_dir("failover-grid");
        let etcd = bench::elected::EtcdProc::start(&dir.join("etcd"))
            .await
            .expect("etcd");
        let coordinator = |grid: &str, k: u32| {
            let d = dir.join(format!("c{k}"));
            vec![
                "coordinator".to_string(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--data".into(),
                d.display().to_string(),
                "--etcd".into(),
                etcd.url.clone(),
                "--grid".into(),
                grid.into(),
            ]
        };
        let first = tests::Proc::start(&dissem_bin(), &coordinator("1x3", 0));
        let out = std::process::Command::new(dissem_bin())
            .args(coordinator("2x2", 1))
            .output()
            .expect("second coordinator");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "a usage error: {err}");
        assert!(
            err.contains("2x2") && err.contains("1x3") && err.contains("grid"),
            "{err}"
        );
        drop(first);
        drop(etcd);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// Issue 31's first hole: node 0 (which holds every subscription, and which a new leader
/// asked first) is down while one subscription is deleted and another updated; it comes
/// back with its old copies, and the leader is killed. The new leader's registry must not
/// hold the deleted subscription, nor the old version of the updated one.
#[test]
fn a_node_down_while_subscriptions_change_brings_no_old_version_back_to_a_new_leader() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_etcd() {
        return;
    }
    runtime().block_on(async {
        let dir = temp_dir("failover-versions");
        let mut c = ElectedCluster::start(&dissem_bin(), &dir, 2, 3, 2, &small_node_flags())
            .await
            .expect("cluster");
        let via = c.nodes[1].url();
        let deleted = create(&via, "n >= 0").await.expect("create");
        let updated = create(&via, "n >= 1").await.expect("create");
        let mut subs =
            v1::subscriptions_client::SubscriptionsClient::new(bench::procs::channel(&via));
        let first = subs
            .get(v1::GetSubscriptionRequest { id: updated })
            .await
            .expect("get")
            .into_inner();
        assert!(first.revision > 0, "a created subscription has a revision");

        c.nodes[0].kill();
        subs.delete(v1::DeleteSubscriptionRequest { id: deleted })
            .await
            .expect("delete while node 0 is down");
        let mut change = first.clone();
        change.filter = Some(v1::subscription::Filter::Text("n >= 2".into()));
        let second = subs.update(change).await.expect("update").into_inner();
        assert!(
            second.revision > first.revision,
            "{second:?} after {first:?}"
        );

        // node 0 is back with its old copies, and answers before the leader goes
        c.nodes[0].restart();
        let (old, k) = {
            let l = c.wait_leader(Duration::from_secs(5)).await.expect("leader");
            let k = ElectedCluster::index_of(&l.name).expect("ours");
            (l, k)
        };
        c.coordinators[k].kill();
        c.wait_new_leader(old.epoch, Duration::from_secs(15))
            .await
            .expect("a new leader");

        // through a node (which follows the new leader): the deletion and the newest version
        let got = served_through(&via).await;
        let ids: Vec<u64> = got.iter().map(|s| s.id).collect();
        assert_eq!(
            ids,
            vec![updated],
            "the deleted subscription is back: {got:?}"
        );
        assert_eq!(
            got[0].revision, second.revision,
            "an old version serves: {got:?}"
        );
        assert_eq!(
            got[0].filter,
            Some(v1::subscription::Filter::Text("n >= 2".into()))
        );
        drop(c);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// A standby keeps the registry while it stands by (issue 31, hole 3): a new leader serves
/// the one it kept, with the nodes' last changes (a subscription created and one deleted
/// just before the kill among them), and says so in its stats; deletions and updates made
/// before are there as they are at the nodes. The third leader is one restarted after it
/// led: its tail resumed from its disk (`coordinator::tail`).
#[test]
fn a_new_leader_serves_the_registry_it_kept_while_standing_by() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_etcd() {
        return;
    }
    runtime().block_on(async {
        let dir = temp_dir("failover-kept");
        let mut c = ElectedCluster::start(&dissem_bin(), &dir, 2, 3, 2, &small_node_flags())
            .await
            .expect("cluster");
        let via = c.nodes[1].url();
        let mut subs =
            v1::subscriptions_client::SubscriptionsClient::new(bench::procs::channel(&via));
        // created by one CreateMany: its copies reach the nodes the standbys follow
        let made = subs
            .create_many(v1::CreateSubscriptionsRequest {
                subscriptions: (0..30)
                    .map(|k| {
                        bench::procs::grpc_subscription(&format!("n = {k}"), "http://127.0.0.1:9")
                    })
                    .collect(),
            })
            .await
            .expect("create many")
            .into_inner()
            .subscriptions;
        let mut want: std::collections::BTreeMap<u64, i32> =
            made.iter().zip(0..).map(|(s, k)| (s.id, k)).collect();
        assert_eq!(want.len(), 30);
        let ids: Vec<u64> = want.keys().copied().collect();
        for id in &ids[..5] {
            subs.delete(v1::DeleteSubscriptionRequest { id: *id })
                .await
                .expect("delete");
            want.remove(id);
        }
        for id in &ids[5..8] {
            let mut s = subs
                .get(v1::GetSubscriptionRequest { id: *id })
                .await
                .expect("get")
                .into_inner();
            s.filter = Some(v1::subscription::Filter::Text("n = 1000".into()));
            subs.update(s).await.expect("update");
            want.insert(*id, 1000);
        }
        // kill leaders until one is replaced by a standby that had its registry in step
        // (it follows the nodes every 500 ms once it rebuilt at its start), and at least
        // three times: then the new leader is one restarted after it led, whose tail
        // resumed from the state on its disk (its leadership's writes journaled) or,
        // failing that, rebuilt
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut kills = 0;
        let (stats, last) = loop {
            let l = c
                .wait_leader(Duration::from_secs(10))
                .await
                .expect("leader");
            let k = ElectedCluster::index_of(&l.name).expect("ours");
            // a change just before the kill: the new leader takes it with the last changes
            let late = tests::create_grpc_subscription(
                &via,
                "n = 2000".into(),
                "http://127.0.0.1:9",
                v1::Qos::AtLeastOnce,
                None,
            )
            .await
            .expect("create");
            want.insert(late, 2000);
            // and a delete: the tombstone must reach a tail that resumes from before it
            if let Some(&gone) = want.keys().find(|id| ids[8..].contains(id)) {
                subs.delete(v1::DeleteSubscriptionRequest { id: gone })
                    .await
                    .expect("delete");
                want.remove(&gone);
            }
            // every node compiled the leader's newest version (with the late create)
            let version = tests::stats(&l.url)
                .await
                .expect("the leader's stats")
                .cluster
                .map_or(0, |c| c.image_version);
            let nodes: Vec<String> = c.nodes.iter().map(|n| n.url()).collect();
            compiled_everywhere(&nodes, version).await;
            c.coordinators[k].kill();
            kills += 1;
            let new = c
                .wait_new_leader(l.epoch, Duration::from_secs(15))
                .await
                .expect("a new leader");
            c.coordinators[k] = c.start_coordinator(k);
            let stats = tests::stats(&new.url)
                .await
                .expect("the new leader's stats");
            if (stats.registry_kept && kills >= 3) || Instant::now() > deadline {
                break (stats, late);
            }
        };
        assert!(
            stats.registry_kept && kills >= 3,
            "after {kills} kills no new leader served a registry kept while standing by: \
             {stats:?}"
        );
        // what it serves is what the nodes hold: the deletions, the updates, the late create
        let got = served_through(&via).await;
        let served: std::collections::BTreeMap<u64, String> = got
            .iter()
            .map(|s| {
                let f = match &s.filter {
                    Some(v1::subscription::Filter::Text(t)) => t.clone(),
                    other => format!("{other:?}"),
                };
                (s.id, f)
            })
            .collect();
        let expected: std::collections::BTreeMap<u64, String> = want
            .iter()
            .map(|(id, k)| (*id, format!("n = {k}")))
            .collect();
        assert_eq!(served, expected, "the last create was {last}");
        assert_eq!(stats.subscriptions as usize, want.len(), "{stats:?}");
        // the new leader's first version holds what the nodes compiled: they keep it
        let version = stats.cluster.map_or(0, |c| c.image_version);
        let nodes: Vec<String> = c.nodes.iter().map(|n| n.url()).collect();
        compiled_everywhere(&nodes, version).await;
        for url in &nodes {
            let s = tests::stats(url).await.expect("the node's stats");
            assert!(s.images_kept >= 1, "node {url} compiled again: {s:?}");
        }
        drop(c);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// Whether node `of` is alive in the view of the node at `via` (as its coordinator last
/// described it).
async fn alive_in_view(via: &str, of: u32) -> Option<bool> {
    let view = tests::stats(via).await.ok()?.view?;
    view.members.iter().find(|m| m.node == of).map(|m| m.alive)
}

/// Node 2's answer to a rebuild, asked `times` times 300 ms apart: whenever it says it
/// holds every subscription, it must hold `must_hold`.
async fn never_whole_without(url: &str, dir: &std::path::Path, must_hold: u64, times: usize) {
    let secret = runtime::cluster_secret::ClusterSecret::load(&dir.join("cluster.secret"))
        .expect("cluster secret");
    let mut d =
        v1::daemon_client::DaemonClient::with_interceptor(tests::channel(url), secret.stamp());
    for _ in 0..times {
        let r = d
            .subscription_copies(v1::SubscriptionCopiesRequest {
                after_id: 0,
                limit: 1024,
                placed_by: (0..3).collect(),
                ..Default::default()
            })
            .await
            .expect("node 2's subscription copies")
            .into_inner();
        let held: Vec<u64> = r.copies.iter().map(|c| c.id).collect();
        assert!(
            !r.whole || held.contains(&must_hold),
            "node 2 says it holds every subscription, but lacks {must_hold}: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A holder of every subscription (node 2 of a 1x3 grid) paused past its lease is taken
/// for dead and misses a create; it continues without registering again. It must not
/// answer as whole while it lacks the create: the other holder (node 0) is down, and a
/// rebuild that trusted node 2 took only the changes of node 1, the one node that holds
/// the create, and lost it (`bench chaos` seed 56146, node_pause then leader_kill: a
/// subscription missing at the new leader). With `leader_killed`, the leader is killed
/// while node 2 is paused, so no heartbeat answer tells node 2 of its lapse before the new
/// leader rebuilds: node 2 finds the gap itself. A new leader serves both subscriptions.
fn paused_holder(name: &str, leader_killed: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !have_etcd() {
        return;
    }
    runtime().block_on(async {
        let dir = temp_dir(name);
        let mut c = ElectedCluster::start(&dissem_bin(), &dir, 2, 3, 2, &small_node_flags())
            .await
            .expect("cluster");
        let via = c.nodes[1].url();
        let before = create(&via, "n >= 0").await.expect("create");

        c.nodes[0].kill();
        c.nodes[2].signal("STOP");
        wait_for(
            "nodes 0 and 2 taken for dead",
            Duration::from_secs(30),
            || {
                let via = via.clone();
                async move {
                    let dead0 = !alive_in_view(&via, 0).await?;
                    let dead2 = !alive_in_view(&via, 2).await?;
                    (dead0 && dead2).then_some(())
                }
            },
        )
        .await;
        // stored on node 1 alone: the live member of its column quorum
        let during = create(&via, "n >= 1")
            .await
            .expect("create while nodes 0 and 2 are down");
        let old = c.wait_leader(Duration::from_secs(5)).await.expect("leader");
        let k = ElectedCluster::index_of(&old.name).expect("ours");
        if leader_killed {
            c.coordinators[k].kill();
        }
        c.nodes[2].signal("CONT");
        let url2 = c.nodes[2].url();
        if !leader_killed {
            wait_for("node 2 alive again", Duration::from_secs(30), || {
                let via = via.clone();
                async move { alive_in_view(&via, 2).await?.then_some(()) }
            })
            .await;
        }
        // while node 0 is down node 2 cannot catch up
        never_whole_without(&url2, &dir, during, 10).await;
        if !leader_killed {
            c.coordinators[k].kill();
        }
        c.wait_new_leader(old.epoch, Duration::from_secs(15))
            .await
            .expect("a new leader");
        let got = served_through(&via).await;
        let ids: Vec<u64> = got.iter().map(|s| s.id).collect();
        assert_eq!(
            ids,
            vec![before, during],
            "the new leader lost the subscription created while node 2 was paused"
        );
        drop(c);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn a_holder_back_from_a_pause_past_its_lease_is_not_trusted_to_hold_every_subscription() {
    paused_holder("failover-lapse", false);
}

#[test]
fn a_holder_continued_while_the_leader_is_down_finds_its_pause_itself() {
    paused_holder("failover-stall", true);
}
