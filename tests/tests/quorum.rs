//! Quorum replication with real processes (DESIGN §7): a coordinator with a 3x3 grid and
//! nine `dissem node` processes, subscribers on a recording gRPC endpoint in this process.
//! Two nodes are SIGKILLed in the middle of a burst of puts; every acknowledged object must
//! still reach every matching subscriber (their successors take their outboxes over), no
//! QoS 2 subscriber may see a duplicate, and no subscription is lost. Then one killed node
//! returns: it catches up (the subscription copy its position missed too), and what is put
//! through it is delivered too. And a node paused
//! past its lease (SIGSTOP) while its deliveries wait finds, when it continues, that its heir
//! took its objects over and delivered them: it pushes none of them again (the lease fence).
//! And a node that has not heard from a coordinator since it started acknowledges no put.
//! And a holder that missed the end of a delivered object while the origin lost its disk
//! learns it from the other holders, in either order of their returns. And an origin back
//! from the dead takes back what its heir adopted when the heir then loses its disk.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bench::recorder::Recorder;
use bench::workload::Rng;
use proto::v1;
use storage::ObjectId;
use tests::{Cluster, Proc, channel, dissem_bin, runtime, stats, temp_dir, temp_put, wait_for};

static SERIAL: Mutex<()> = Mutex::new(());

const NODE_ARGS: &[&str] = &[
    "--gpu",
    "off",
    "--allow-private-targets",
    "--resend-ms",
    "1000",
    "--workers",
    "2",
    "--min-workers",
    "1",
    "--max-workers",
    "2",
];

/// Twelve subscriptions through `url` (seeded temp ranges, every third QoS 2, as the quorum
/// benchmark makes them): (id, lo, hi, QoS 2).
async fn create_subscriptions(
    url: &str,
    target: &str,
    rec: &Recorder,
) -> Vec<(u64, i64, i64, bool)> {
    let through = vec![url.to_string(); 12];
    let subs = bench::quorumbench::subscribe(&through, target, &mut Rng::new(11))
        .await
        .expect("create subscriptions");
    subs.into_iter()
        .map(|(id, _, lo, hi, qos2)| {
            if qos2 {
                rec.expect_qos2(id);
            }
            (id, lo, hi, qos2)
        })
        .collect()
}

/// One put, retried on its node for a while: `None` when it was never acknowledged.
async fn put_once(url: &str, t: i64, msg: String) -> Option<ObjectId> {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let mut req = temp_put(t);
        req.message_id = msg.clone();
        let mut c = v1::ingest_client::IngestClient::new(channel(url));
        match c.put(req).await {
            Ok(r) => {
                let id = r.into_inner().id.unwrap_or_default();
                return Some(ObjectId {
                    node: id.node,
                    seq: id.seq,
                });
            }
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => return None,
        }
    }
}

fn expected(
    subs: &[(u64, i64, i64, bool)],
    acked: &[(ObjectId, i64)],
) -> BTreeSet<(u64, ObjectId)> {
    let mut want = BTreeSet::new();
    for &(id, t) in acked {
        for &(s, lo, hi, _) in subs {
            if t >= lo && t < hi {
                want.insert((s, id));
            }
        }
    }
    want
}

async fn wait_delivered(rec: &Recorder, want: &BTreeSet<(u64, ObjectId)>, what: &str) {
    wait_for(what, Duration::from_secs(90), || {
        let shown = rec.shown();
        let missing = want.iter().filter(|p| !shown.contains_key(p)).count();
        async move { (missing == 0).then_some(()) }
    })
    .await;
}

/// `n` puts through node 4 (`url4`) while the subscriber refuses, each acknowledged, and
/// then node 4's deliveries waiting in their retries: (object, temperature) each.
async fn backlog_on_4(url4: &str, n: usize, tag: &str) -> Vec<(ObjectId, i64)> {
    let mut acked = Vec::new();
    for i in 0..n {
        let t = (i * 7 % 100) as i64;
        let id = put_once(url4, t, format!("{tag}-{i}"))
            .await
            .expect("a put through node 4");
        acked.push((id, t));
    }
    wait_for(
        "node 4's deliveries waiting",
        Duration::from_secs(30),
        || async move { (stats(url4).await.ok()?.delivery_failures > 0).then_some(()) },
    )
    .await;
    acked
}

/// A coordinator with a 3x3 grid and a 1.5 s node lease, and nine nodes.
fn start_3x3(dir: &std::path::Path) -> Cluster {
    let grid = [
        "--grid",
        "3x3",
        "--allow-private-targets",
        "--lease-ms",
        "1500",
    ];
    Cluster::start_ids(&dissem_bin(), dir, 0..9, &grid, NODE_ARGS)
}

/// Waits until the nine nodes registered.
async fn registered(coord: &str) {
    wait_for(
        "nine nodes registered",
        Duration::from_secs(60),
        || async move { (stats(coord).await.ok()?.cluster?.nodes == 9).then_some(()) },
    )
    .await;
}

/// Waits until the twelve subscriptions are in the coordinator's image.
async fn published(coord: &str) {
    wait_for(
        "the subscriptions published",
        Duration::from_secs(30),
        || async move {
            (stats(coord).await.ok()?.cluster?.image_subscriptions == 12).then_some(())
        },
    )
    .await;
}

#[test]
fn a_3x3_grid_loses_no_acknowledged_object_when_two_nodes_die_mid_burst() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = temp_dir("quorum-3x3");
    let mut c = start_3x3(&dir);
    let rt = runtime();
    rt.block_on(async {
        let coord = c.coordinator.url();
        registered(&coord).await;
        let (rec, target) = Recorder::start().await.expect("recorder");
        // a slow subscriber: deliveries are in flight when the nodes die
        rec.set_delay(Duration::from_millis(40));
        let subs = create_subscriptions(&c.nodes[0].url(), &target, &rec).await;
        published(&coord).await;

        // the burst: 450 puts over the live nodes, 12 at a time; node 4 (the middle) dies
        // after a third of them are acknowledged, node 2 after two thirds
        let total = 450usize;
        let urls: Vec<String> = c.nodes.iter().map(Proc::url).collect();
        let dead: Arc<Mutex<BTreeSet<usize>>> = Arc::default();
        let acked: Arc<Mutex<Vec<(ObjectId, i64)>>> = Arc::default();
        let next = Arc::new(AtomicUsize::new(0));
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..12 {
            let (urls, dead, acked, next) =
                (urls.clone(), dead.clone(), acked.clone(), next.clone());
            set.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return;
                    }
                    let mut k = i % 9;
                    while dead.lock().unwrap_or_else(|p| p.into_inner()).contains(&k) {
                        k = (k + 1) % 9;
                    }
                    let t = (i * 37 % 100) as i64;
                    if let Some(id) = put_once(&urls[k], t, format!("burst-{i}")).await {
                        acked
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((id, t));
                    }
                }
            });
        }
        for (victim, at) in [(4usize, total / 3), (2, 2 * total / 3)] {
            wait_for(
                "the burst to reach the kill",
                Duration::from_secs(120),
                || {
                    let n = acked.lock().unwrap_or_else(|p| p.into_inner()).len();
                    async move { (n >= at).then_some(()) }
                },
            )
            .await;
            dead.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(victim);
            c.nodes[victim].kill();
            eprintln!("killed node {victim} after {at} acknowledged puts");
        }
        while let Some(r) = set.join_next().await {
            r.expect("put task");
        }
        let acked = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert!(
            acked.len() >= total * 9 / 10,
            "only {} of {total} puts acknowledged",
            acked.len()
        );
        let want = expected(&subs, &acked);
        wait_delivered(
            &rec,
            &want,
            "every acknowledged object delivered to every match",
        )
        .await;
        let mut taken_over = 0;
        for (k, u) in urls.iter().enumerate() {
            if k != 2 && k != 4 {
                taken_over += stats(u).await.expect("stats").objects_taken_over;
            }
        }
        assert!(taken_over > 0, "the dead nodes left nothing to take over");
        let qos2: BTreeSet<u64> = subs.iter().filter(|s| s.3).map(|s| s.0).collect();
        assert_eq!(
            rec.extra_shows(|s| qos2.contains(&s)),
            0,
            "QoS 2 duplicates"
        );
        eprintln!(
            "{} acknowledged objects, {} deliveries owed, all delivered ({taken_over} taken \
             over); QoS 1 repeats {}",
            acked.len(),
            want.len(),
            rec.extra_shows(|s| !qos2.contains(&s))
        );

        // every subscription is stored on the five nodes of C(0) (it was created through
        // node 0), none of which died: placed at its Create, or (a member the creator's
        // view did not hold yet, on a loaded machine) taken from a peer's feed within a few
        // seconds (`Daemon::follow_peers`)
        let copies = || {
            let urls = urls.clone();
            async move {
                let mut copies = 0;
                for (k, u) in urls.iter().enumerate() {
                    if k != 2 && k != 4 {
                        copies += stats(u).await.ok()?.subscriptions;
                    }
                }
                Some(copies)
            }
        };
        let placed = tests::try_wait_for(Duration::from_secs(20), || async {
            copies().await.filter(|&n| n == 12 * 5)
        })
        .await;
        assert_eq!(
            placed,
            Some(12 * 5),
            "subscription copies on the live nodes: {:?}",
            copies().await
        );
        // no subscription is lost: every one is still listed
        let mut sc = v1::subscriptions_client::SubscriptionsClient::new(channel(&urls[0]));
        let listed = sc
            .list(v1::ListSubscriptionsRequest::default())
            .await
            .expect("list")
            .into_inner()
            .subscriptions
            .len();
        assert_eq!(listed, subs.len(), "subscriptions listed after the kills");
        // a subscription made through node 1 while node 4 is down: C(1) = {0, 1, 4, 7, 8}
        // holds it, so node 4 must pull its copy when it returns
        let late = tests::create_grpc_subscription(
            &urls[1],
            "temp >= 1000".into(),
            &target,
            v1::Qos::AtLeastOnce,
            None,
        )
        .await
        .expect("a subscription while node 4 is down");

        // node 4 returns on its disk: it catches up (its own outbox finished by its
        // successor leaves it) and takes puts again
        c.nodes[4].restart();
        let url4 = c.nodes[4].url();
        wait_for("node 4's outbox to drain", Duration::from_secs(60), || {
            let url4 = url4.clone();
            async move { (stats(&url4).await.ok()?.outbox_pending == 0).then_some(()) }
        })
        .await;
        wait_for(
            "node 4 pulled the subscription copy it missed",
            Duration::from_secs(30),
            || {
                let url4 = url4.clone();
                async move { (stats(&url4).await.ok()?.subscriptions == 1).then_some(()) }
            },
        )
        .await;
        eprintln!("node 4 holds the copy of subscription {late} made while it was down");
        let mut more = Vec::new();
        for i in 0..20 {
            let t = (i * 13 % 100) as i64;
            let id = put_once(&url4, t, format!("after-{i}"))
                .await
                .expect("a put through the returned node");
            more.push((id, t));
        }
        let want_more = expected(&subs, &more);
        wait_delivered(&rec, &want_more, "puts through the returned node delivered").await;
        assert_eq!(
            rec.extra_shows(|s| qos2.contains(&s)),
            0,
            "QoS 2 duplicates after the return"
        );
        // it holds copies for its row again: what node 3 took after the return is copied
        let s4 = stats(&url4).await.expect("stats");
        eprintln!(
            "node 4 back: {} unfinished copies, {} finished",
            s4.copies_unfinished, s4.copies_finished
        );
    });
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_paused_past_its_lease_pushes_nothing_its_heir_took_over() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = temp_dir("quorum-paused");
    let c = start_3x3(&dir);
    let rt = runtime();
    rt.block_on(async {
        let coord = c.coordinator.url();
        registered(&coord).await;
        let (rec, target) = Recorder::start().await.expect("recorder");
        let subs = create_subscriptions(&c.nodes[0].url(), &target, &rec).await;
        published(&coord).await;
        // the subscriber refuses for now: node 4's deliveries wait in their retries
        rec.set_refusing(true);
        let url4 = c.nodes[4].url();
        let acked = backlog_on_4(&url4, 30, "paused").await;
        let want = expected(&subs, &acked);
        let qos2: BTreeSet<u64> = subs.iter().filter(|s| s.3).map(|s| s.0).collect();
        assert!(
            want.iter().any(|(s, _)| qos2.contains(s)),
            "no QoS 2 delivery owed: the test would show nothing"
        );

        c.nodes[4].signal("STOP");
        let others: Vec<String> = (0..9)
            .filter(|&k| k != 4)
            .map(|k| c.nodes[k].url())
            .collect();
        wait_for(
            "node 4's objects taken over by its heir",
            Duration::from_secs(30),
            || {
                let others = others.clone();
                async move {
                    let mut n = 0;
                    for u in &others {
                        n += stats(u).await.ok()?.objects_taken_over;
                    }
                    (n > 0).then_some(())
                }
            },
        )
        .await;
        rec.set_refusing(false);
        wait_delivered(&rec, &want, "the heir delivered node 4's objects").await;

        // node 4 continues with its retries due: it must leave them to its heir
        c.nodes[4].signal("CONT");
        wait_for(
            "node 4 left its deliveries to its heir",
            Duration::from_secs(60),
            || {
                let url4 = url4.clone();
                async move {
                    let s = stats(&url4).await.ok()?;
                    (s.deliveries_queued == 0 && s.outbox_pending == 0).then_some(())
                }
            },
        )
        .await;
        for (pair, n) in rec.shown() {
            if n > 1 && qos2.contains(&pair.0) {
                eprintln!("shown {n} times: {pair:?}: {:?}", rec.calls(pair));
            }
        }
        assert_eq!(
            rec.extra_shows(|s| qos2.contains(&s)),
            0,
            "QoS 2 duplicates after the paused node continued"
        );
        eprintln!(
            "{} deliveries owed, delivered by the heir; QoS 1 repeats after the pause {}",
            want.len(),
            rec.extra_shows(|s| !qos2.contains(&s))
        );
    });
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node started while no coordinator answers cannot know its quorum: it refuses puts
/// (UNAVAILABLE, saying why) instead of acknowledging objects that stand on its disk alone
/// (found by `bench chaos`, seeds 13069 and 13078: a node restarted while etcd was down took
/// puts without copies, then its log was damaged and they were gone). Once the coordinator
/// answers, the same put (same message id) is acknowledged with its copies placed.
#[test]
fn a_node_that_has_not_heard_from_a_coordinator_acknowledges_no_put() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = temp_dir("quorum-no-view");
    let grid = ["--grid", "1x3", "--allow-private-targets"];
    let mut c = Cluster::start_ids(&dissem_bin(), &dir, 0..3, &grid, NODE_ARGS);
    let coord = c.coordinator.url();
    runtime().block_on(async {
        wait_for("three nodes registered", Duration::from_secs(60), || {
            let coord = coord.clone();
            async move { (stats(&coord).await.ok()?.cluster?.nodes == 3).then_some(()) }
        })
        .await;
    });
    c.coordinator.kill();
    c.nodes[0].restart();
    let url = c.nodes[0].url();
    runtime().block_on(async {
        let put = || {
            let mut req = temp_put(5);
            req.message_id = "no-view-1".into();
            let url = url.clone();
            async move {
                v1::ingest_client::IngestClient::new(channel(&url))
                    .put(req)
                    .await
            }
        };
        let refused = put()
            .await
            .expect_err("no coordinator has answered this node yet");
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        assert!(
            refused
                .message()
                .contains("has not heard from a coordinator"),
            "{refused:?}"
        );
    });
    c.coordinator.restart();
    runtime().block_on(async {
        let url = c.nodes[0].url();
        let id = wait_for("the put acknowledged", Duration::from_secs(60), || {
            let url = url.clone();
            async move {
                let mut req = temp_put(5);
                req.message_id = "no-view-1".into();
                let r = v1::ingest_client::IngestClient::new(channel(&url))
                    .put(req)
                    .await
                    .ok()?;
                r.into_inner().id
            }
        })
        .await;
        assert_eq!(id.node, 0);
        // its copies are on the other two nodes of the row
        for n in &c.nodes[1..] {
            let u = n.url();
            wait_for("the copy", Duration::from_secs(30), || {
                let u = u.clone();
                async move {
                    let s = stats(&u).await.ok()?;
                    // unfinished, or already ended (nothing subscribes here)
                    (s.copies_unfinished + s.copies_finished + s.copies_forwarding >= 1)
                        .then_some(())
                }
            })
            .await;
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits until node `url` holds `n` unfinished copies.
async fn unfinished_copies(url: &str, n: u64, what: &str) {
    let seen = AtomicUsize::new(usize::MAX);
    let held = tests::try_wait_for(Duration::from_secs(45), || async {
        let s = stats(url).await.ok()?;
        seen.store(s.copies_unfinished as usize, Ordering::Relaxed);
        (s.copies_unfinished == n).then_some(())
    });
    if held.await.is_none() {
        let seen = seen.load(Ordering::Relaxed);
        panic!("timed out waiting for {what}: {seen} unfinished copies, not {n}");
    }
}

/// A holder that was down when an object was delivered missed its end; then the origin lost
/// its disk, taking the end it kept for that holder along, and the node at its position now
/// never held the object. The other holders end the copy instead: the heir, at the holder
/// it pulls from when it takes the earlier node's objects over (the holder back first), and
/// the holder itself, from the heir's tombstone, when it catches up (the origin back first).
/// Before, the copy stayed unfinished for good, and ten minutes later an heir on a fresh
/// disk took it from that holder and delivered it again (QoS 2 duplicates, `bench chaos`
/// seed 23000).
#[test]
fn a_holder_that_missed_an_end_learns_it_from_the_other_holders_once_the_origin_lost_its_disk() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = temp_dir("quorum-lost-end");
    let mut c = start_3x3(&dir);
    let rt = runtime();
    let coord = c.coordinator.url();
    let (url3, url4, url5) = (c.nodes[3].url(), c.nodes[4].url(), c.nodes[5].url());
    let (rec, subs) = rt.block_on(async {
        registered(&coord).await;
        let (rec, target) = Recorder::start().await.expect("recorder");
        let subs = create_subscriptions(&c.nodes[0].url(), &target, &rec).await;
        published(&coord).await;
        (rec, subs)
    });
    let qos2: BTreeSet<u64> = subs.iter().filter(|s| s.3).map(|s| s.0).collect();
    for holder_back_first in [true, false] {
        rt.block_on(async {
            // node 3's deliveries wait while both holders of its row take the copies
            rec.set_refusing(true);
            let mut acked = Vec::new();
            for i in 0..10 {
                let t = (i * 9 % 100) as i64;
                let msg = format!("lost-end-{holder_back_first}-{i}");
                let id = wait_for("a put through node 3", Duration::from_secs(30), || {
                    put_once(&url3, t, msg.clone())
                })
                .await;
                acked.push((id, t));
            }
            // an object no subscription matches is finished at once
            let matched = |acked: &[(ObjectId, i64)]| {
                let want = expected(&subs, acked);
                let n = acked
                    .iter()
                    .filter(|(id, _)| want.iter().any(|(_, o)| o == id))
                    .count() as u64;
                (want, n)
            };
            let (mut want, owed) = matched(&acked);
            assert!(owed > 0, "no delivery owed: the test would show nothing");
            // node 5's death is seen once its heir (node 3) took its waiting object over:
            // then node 4, node 3's heir, does not reach node 5 when it takes the earlier
            // node 3's objects over, and the end reaches node 5 only at its own catch-up
            let mut of5 = 0;
            let taken3 = stats(&url3).await.expect("node 3").objects_taken_over;
            if !holder_back_first {
                let t = acked
                    .iter()
                    .find(|(id, _)| want.iter().any(|(_, o)| o == id));
                let t = t.expect("a matched object").1;
                let id = wait_for("a put through node 5", Duration::from_secs(30), || {
                    put_once(&url5, t, "lost-end-of-5".into())
                })
                .await;
                let (w, n) = matched(&[(id, t)]);
                want.extend(w);
                of5 = n;
            }
            unfinished_copies(&url4, owed + of5, "node 4 holds the copies").await;
            unfinished_copies(&url5, owed, "node 5 holds the copies").await;
            c.nodes[5].kill();
            if !holder_back_first {
                wait_for(
                    "node 3 took node 5's object over",
                    Duration::from_secs(30),
                    || async {
                        let s = stats(&url3).await.ok()?;
                        (s.objects_taken_over > taken3).then_some(())
                    },
                )
                .await;
            }
            rec.set_refusing(false);
            wait_delivered(&rec, &want, "node 3 delivered its objects").await;
            unfinished_copies(&url4, 0, "the ends reached node 4").await;
        });
        // node 3 loses its disk, and with it the ends it keeps for node 5
        c.nodes[3].kill();
        std::fs::remove_dir_all(c.node_data(3)).expect("wiping node 3");
        if holder_back_first {
            c.nodes[5].restart();
            rt.block_on(async {
                wait_for("node 5 back", Duration::from_secs(30), || async {
                    stats(&url5).await.ok()
                })
                .await;
            });
            c.nodes[3].restart();
        } else {
            c.nodes[3].restart();
            rt.block_on(async {
                wait_for(
                    "node 3 back on its fresh disk",
                    Duration::from_secs(30),
                    || put_once(&url3, 200, "lost-end-back".into()),
                )
                .await;
            });
            c.nodes[5].restart();
        }
        rt.block_on(unfinished_copies(
            &url5,
            0,
            "node 5 ended the copies it missed the end of",
        ));
    }
    assert_eq!(
        rec.extra_shows(|s| qos2.contains(&s)),
        0,
        "QoS 2 duplicates"
    );
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits until some node of `urls` took objects over; the answer is its index.
async fn heir_of(urls: &[String]) -> usize {
    wait_for(
        "the heir took the objects over",
        Duration::from_secs(30),
        || {
            let urls = urls.to_vec();
            async move {
                for (k, u) in urls.iter().enumerate() {
                    if stats(u).await.ok()?.objects_taken_over > 0 {
                        return Some(k);
                    }
                }
                None
            }
        },
    )
    .await
}

/// Node 4's backlog (the subscriber refusing) is taken over by its heir while node 4 is
/// down; node 4 comes back and learns its heir adopted the backlog: those objects stay in its
/// outbox, handed to the heir (on its disk: it is killed and started again once more). Then
/// the heir loses its disk before it delivered them. Node 4
/// takes them back and delivers them itself: every acknowledged object reaches every
/// matching subscriber, none twice at QoS 2. Before, node 4 had let them go from its outbox,
/// and nobody delivered them (found by the ownership simulation, `worker/src/daemon/ownsim`).
#[test]
fn an_origin_takes_back_what_its_heir_adopted_when_the_heir_loses_its_disk() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = temp_dir("quorum-taken-back");
    let mut c = start_3x3(&dir);
    let rt = runtime();
    let coord = c.coordinator.url();
    let url4 = c.nodes[4].url();
    let urls: Vec<String> = (0..9).map(|k| c.nodes[k].url()).collect();
    let (rec, subs, want) = rt.block_on(async {
        registered(&coord).await;
        let (rec, target) = Recorder::start().await.expect("recorder");
        let subs = create_subscriptions(&c.nodes[0].url(), &target, &rec).await;
        published(&coord).await;
        // the subscriber refuses: node 4's deliveries wait, a backlog to take over
        rec.set_refusing(true);
        let acked = backlog_on_4(&url4, 20, "taken-back").await;
        let want = expected(&subs, &acked);
        assert!(
            !want.is_empty(),
            "no delivery owed: the test would show nothing"
        );
        (rec, subs, want)
    });
    c.nodes[4].kill();
    let heir = rt.block_on(heir_of(&urls));
    assert_ne!(heir, 4);
    let holding = |what: &'static str| {
        let url4 = url4.clone();
        async move {
            wait_for(what, Duration::from_secs(60), || {
                let url4 = url4.clone();
                async move { (stats(&url4).await.ok()?.objects_handed > 0).then_some(()) }
            })
            .await
        }
    };
    c.nodes[4].restart();
    rt.block_on(holding("node 4 back, holding what its heir adopted"));
    // the marks are on its disk: killed and started again, it holds them at once (its
    // records of them closed, its outbox floor past some of them)
    c.nodes[4].kill();
    c.nodes[4].restart();
    rt.block_on(holding("node 4 restarted, holding them again"));
    // the heir loses its disk before the subscriber takes anything
    c.nodes[heir].kill();
    std::fs::remove_dir_all(c.node_data(heir)).expect("wiping the heir");
    rt.block_on(async {
        wait_for(
            "node 4 took its objects back from the lost heir",
            Duration::from_secs(60),
            || {
                let url4 = url4.clone();
                async move {
                    let s = stats(&url4).await.ok()?;
                    (s.objects_taken_back > 0 && s.objects_handed == 0).then_some(())
                }
            },
        )
        .await;
    });
    c.nodes[heir].restart();
    let qos2: BTreeSet<u64> = subs.iter().filter(|s| s.3).map(|s| s.0).collect();
    rt.block_on(async {
        rec.set_refusing(false);
        wait_delivered(&rec, &want, "node 4 delivered what it took back").await;
    });
    assert_eq!(
        rec.extra_shows(|s| qos2.contains(&s)),
        0,
        "QoS 2 duplicates"
    );
    eprintln!(
        "{} deliveries owed, all delivered after the heir {heir} lost its disk",
        want.len()
    );
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
