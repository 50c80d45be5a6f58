//! A rolling restart under load (issue 33, part 2), with real processes: etcd, two
//! coordinators and a 3x3 grid of nodes, a QoS 1 and a QoS 2 subscriber, and puts to every
//! node throughout. Each node in turn is drained (`dissem node drain`: it refuses puts,
//! disseminates what it took and exits 0) and started again on its disk; then the standby
//! coordinator and the leader are stopped with SIGTERM and started again. Every
//! acknowledged object reaches both subscribers, and the QoS 2 one sees none twice.
//!
//! Without an `etcd` binary the test says so and passes, unless `DISSEM_REQUIRE_ETCD` is set.

use std::time::Duration;

use bench::elected::ElectedCluster;
use bench::failoverbench::Traffic;
use tests::{dissem_bin, runtime, small_node_flags, temp_dir, wait_for};

#[test]
fn every_node_and_coordinator_restarted_one_by_one_under_load_loses_nothing() {
    if !tests::have_etcd() {
        return;
    }
    let dir = temp_dir("rolling");
    runtime().block_on(async {
        let mut c =
            ElectedCluster::start_grid(&dissem_bin(), &dir, 2, (3, 3), 2, &small_node_flags())
                .await
                .expect("a 3x3 cluster");
        let mut traffic = Traffic::start(&c, 60).await.expect("traffic");
        tests::wait_acked(&traffic, 60).await;

        for i in 0..c.nodes.len() {
            let url = c.nodes[i].url();
            let (code, out, err) = tokio::task::spawn_blocking(move || {
                tests::run_dissem(
                    &["node", "drain", "--node-url", &url, "--timeout", "60"],
                    Duration::from_secs(90),
                )
            })
            .await
            .expect("drain");
            assert_eq!(code, Some(0), "draining node {i}: {out}\n{err}");
            assert!(out.contains("drained and exited"), "node {i}: {out}\n{err}");
            let status = wait_for(
                &format!("node {i} to exit"),
                Duration::from_secs(10),
                || {
                    let s = c.nodes[i].try_wait();
                    async move { s }
                },
            )
            .await;
            assert!(status.success(), "node {i} exited with {status}");
            c.nodes[i].restart();
            tests::wait_acked(&traffic, traffic.acked().len() + 20).await;
        }

        // the standby, then the leader: SIGTERM, and the same coordinator started again
        let leader = c
            .wait_leader(Duration::from_secs(10))
            .await
            .expect("leader");
        let lk = ElectedCluster::index_of(&leader.name).expect("one of ours");
        let standby = 1 - lk;
        c.coordinators[standby].signal("TERM");
        let status = wait_for("the standby to exit", Duration::from_secs(10), || {
            let s = c.coordinators[standby].try_wait();
            async move { s }
        })
        .await;
        assert!(status.success(), "the standby exited with {status}");
        c.coordinators[standby] = c.start_coordinator(standby);
        c.coordinators[lk].signal("TERM");
        let status = wait_for("the leader to exit", Duration::from_secs(10), || {
            let s = c.coordinators[lk].try_wait();
            async move { s }
        })
        .await;
        assert!(status.success(), "the leader exited with {status}");
        let new = c
            .wait_new_leader(leader.epoch, Duration::from_secs(20))
            .await
            .expect("the standby leads");
        assert_ne!(new.name, leader.name);
        c.coordinators[lk] = c.start_coordinator(lk);
        tests::wait_acked(&traffic, traffic.acked().len() + 60).await;

        let n = tests::all_delivered_once(&mut traffic).await;
        eprintln!("{n} objects acknowledged through the rolling restart");
        drop(c);
    });
    let _ = std::fs::remove_dir_all(&dir);
}
