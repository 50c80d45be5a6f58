//! The protocol's fault cases, each stepped through the harness: a lost `Done`, a late report
//! after reassignment, a new coordinator nonce, missing test results, and a node that returns
//! after being declared dead. Every case ends with each stored object matched exactly once at
//! its origin.

use super::*;

/// A test task's report, from any node.
fn is_test_done(_: u32, to: u32, m: &Msg) -> bool {
    to == COORD && matches!(m, Msg::Done(d) if d.block.starts_with("test:"))
}

/// A match task's report, or its matches: everything a match worker sends.
fn is_match_output(from: u32, _: u32, m: &Msg) -> bool {
    from != COORD
        && match m {
            Msg::Done(d) => d.block == "match",
            Msg::Matched(_) => true,
            _ => false,
        }
}

fn put_many(sim: &mut Sim, per_node: u64) {
    let nodes: Vec<u32> = sim.nodes.keys().copied().collect();
    for i in 0..per_node {
        for &n in &nodes {
            sim.put(
                n,
                &[("a", i as i64), ("b", -(i as i64)), ("unmentioned", 1)],
            );
        }
    }
}

fn delivered_once(sim: &Sim) {
    for n in sim.nodes.values() {
        assert!(
            n.outbox.is_empty(),
            "node {} still owes {:?}",
            n.id,
            n.outbox.keys()
        );
        assert_eq!(n.delivered.len() as u64, n.next_seq, "node {}", n.id);
        assert!(
            n.delivered.values().all(|c| *c == 1),
            "node {}: {:?}",
            n.id,
            n.delivered
        );
    }
}

#[test]
fn objects_flow_from_put_to_match_and_unmentioned_attributes_are_dropped() {
    let mut sim = Sim::new(3, 2, &["a", "b"]);
    assert_eq!(sim.coord.nodes(), 3);
    put_many(&mut sim, 20);
    assert!(sim.run_until_delivered(500), "{:?}", sim.coord.counts());
    delivered_once(&sim);
    assert_eq!(sim.coord.counts().matched, 60);
    assert_eq!(sim.coord.in_flight(), 0);
    // only the mentioned attributes were tested: no worker ever held another block
    for n in sim.nodes.values() {
        assert!(
            n.workers.values().all(|b| b != "test:unmentioned"),
            "{:?}",
            n.workers
        );
    }
}

#[test]
fn a_resend_of_an_object_in_flight_is_not_admitted_twice() {
    let mut sim = Sim::new(1, 2, &["a"]);
    sim.net.hold_next(1, is_test_done);
    sim.put(1, &[("a", 1)]);
    sim.run_for(5);
    // the same object again while its test is out
    let req = sim.nodes[&1].arrived(&[1]);
    let published = sim.published.clone();
    let (accepted, _) = sim.coord.arrived(sim.now, req, &published);
    assert_eq!(accepted, 0);
    sim.net.release();
    assert!(sim.run_until_delivered(500));
    delivered_once(&sim);
    assert_eq!(sim.coord.counts().arrived, 1);
}

#[test]
fn a_lost_done_is_taken_back_and_the_objects_still_match() {
    let mut sim = Sim::new(2, 2, &["a", "b"]);
    sim.net.drop_next(1, is_test_done);
    put_many(&mut sim, 4);
    assert!(sim.run_until_delivered(2_000), "{:?}", sim.coord.counts());
    delivered_once(&sim);
    let snap = sim.coord.scheduler().snapshot();
    assert!(snap.reassignments >= 1, "{snap:?}");
    assert!(snap.dead_workers >= 1, "{snap:?}");
}

#[test]
fn a_late_report_after_reassignment_records_nothing() {
    // one node: the first match task's matches (to itself) and its report are held back
    let mut sim = Sim::new(1, 3, &["a"]);
    sim.net.hold_next(2, is_match_output);
    put_many(&mut sim, 3);
    for _ in 0..1_000 {
        if sim.coord.scheduler().snapshot().reassignments > 0 {
            break;
        }
        sim.run_for(1);
    }
    assert_eq!(sim.coord.scheduler().snapshot().reassignments, 1);
    let Some(Msg::Done(late)) = sim
        .net
        .held()
        .into_iter()
        .find(|m| matches!(m, Msg::Done(_)))
    else {
        panic!("no match report held");
    };
    // the task runs again on another worker; hold its report too, and meanwhile the first
    // worker's report arrives
    sim.net.hold_next(2, is_match_output);
    for _ in 0..100 {
        if sim.net.held().len() == 4 {
            break;
        }
        sim.run_for(1);
    }
    let again = sim.nodes[&1]
        .assignments
        .iter()
        .rev()
        .find(|(_, w)| *w != late.worker)
        .map(|(_, w)| *w)
        .expect("reassigned");
    assert!(
        sim.coord
            .scheduler()
            .running_task(late.task, again)
            .is_some()
    );
    let matched = sim.coord.counts().matched;
    let published = sim.published.clone();
    let now = sim.now;
    sim.coord.done(now, &late, &published);
    assert_eq!(sim.coord.counts().matched, matched, "a late report counted");
    assert!(
        sim.coord
            .scheduler()
            .running_task(late.task, again)
            .is_some(),
        "a late report finished the reassigned task"
    );
    // everything held arrives now (the first worker's matches, the second one's report,
    // which may name objects whose results the first fetch took: those are tested again)
    sim.net.release();
    assert!(sim.run_until_delivered(2_000), "{:?}", sim.coord.counts());
    sim.run_for(500);
    assert_eq!(sim.coord.in_flight(), 0);
    delivered_once(&sim);
}

#[test]
fn a_new_coordinator_nonce_makes_nodes_register_and_resend() {
    let mut sim = Sim::new(2, 2, &["a", "b"]);
    put_many(&mut sim, 3);
    assert!(sim.run_until_delivered(500));
    // the coordinator dies with a test report out and objects on their way
    sim.net.hold_next(1, is_test_done);
    sim.net.isolate(COORD, sim.max_addr());
    put_many(&mut sim, 3);
    sim.run_for(10);
    let old = sim.coord.nonce();
    let nonce = sim.new_coordinator();
    assert_ne!(old, nonce);
    sim.net.recover();
    assert!(sim.run_until_delivered(2_000), "{:?}", sim.coord.counts());
    for n in sim.nodes.values() {
        assert_eq!(n.nonce, nonce, "node {} registered again", n.id);
    }
    assert_eq!(sim.coord.nodes(), 2);
    // the old coordinator's report reaches the new one: it records nothing
    let before = sim.coord.counts();
    assert_eq!(sim.net.release(), 1);
    sim.run_for(20);
    assert_eq!(sim.coord.counts().matched, before.matched);
    assert_eq!(sim.coord.in_flight(), 0);
    delivered_once(&sim);
    // a report naming a task that runs now, but sent under the old nonce, records nothing
    sim.net.hold_next(1, is_test_done);
    sim.put(1, &[("a", 1)]);
    sim.run_for(3);
    let Some(Msg::Done(d)) = sim.net.held().pop() else {
        panic!("no test report held");
    };
    assert!(
        sim.coord
            .scheduler()
            .running_task(d.task, d.worker)
            .is_some()
    );
    let forged = v1::DoneRequest {
        nonce: old,
        ..d.clone()
    };
    let published = sim.published.clone();
    let now = sim.now;
    sim.coord.done(now, &forged, &published);
    assert!(
        sim.coord
            .scheduler()
            .running_task(d.task, d.worker)
            .is_some(),
        "an old coordinator's report finished a task of the new one"
    );
    sim.net.release();
    assert!(sim.run_until_delivered(500));
    delivered_once(&sim);
}

#[test]
fn missing_test_results_are_tested_again() {
    let mut sim = Sim::new(3, 1, &["a"]);
    put_many(&mut sim, 1);
    assert!(sim.run_until_delivered(500));
    // test results on node 1 can no longer be fetched from the other nodes
    sim.net.cut(1, 2);
    sim.net.cut(1, 3);
    put_many(&mut sim, 6);
    sim.run_for(300);
    sim.net.recover();
    assert!(sim.run_until_delivered(3_000), "{:?}", sim.coord.counts());
    delivered_once(&sim);
    let failures: usize = sim.nodes.values().map(|n| n.fetch_failures).sum();
    assert!(failures >= 1, "no match task missed a result");
}

#[test]
fn a_node_that_returns_after_being_declared_dead_gets_no_task_for_its_dead_workers() {
    let mut sim = Sim::new(3, 2, &["a", "b"]);
    put_many(&mut sim, 2);
    assert!(sim.run_until_delivered(500));
    let max = sim.max_addr();
    sim.net.isolate(3, max);
    sim.run_for(150); // past the lease
    // work for the others meanwhile: node 3's workers are tried (their leases expired, or the
    // assignment never arrives and the task is overdue) and judged dead
    for i in 0..60 {
        sim.put(1, &[("a", i), ("b", i)]);
        sim.put(2, &[("a", i), ("b", i)]);
    }
    sim.run_for(200);
    assert!(sim.nodes[&1].outbox.is_empty() && sim.nodes[&2].outbox.is_empty());
    let dead: Vec<WorkerId> = sim.nodes[&3]
        .workers
        .keys()
        .copied()
        .filter(|w| sim.coord.scheduler().is_dead(*w))
        .collect();
    assert!(
        !dead.is_empty(),
        "no worker of the isolated node was judged dead"
    );
    let t = sim.now;
    sim.net.recover();
    sim.put(3, &[("a", 7), ("b", 8)]);
    let fresh = sim.start_worker(3);
    assert!(sim.run_until_delivered(2_000), "{:?}", sim.coord.counts());
    delivered_once(&sim);
    let after: Vec<WorkerId> = sim.nodes[&3]
        .assignments
        .iter()
        .filter(|(at, _)| *at > t)
        .map(|(_, w)| *w)
        .collect();
    assert!(
        after.iter().all(|w| !dead.contains(w)),
        "a dead worker got a task: {after:?}"
    );
    sim.run_for(2 * HEARTBEAT_MS);
    assert!(
        sim.coord.scheduler().has_worker(fresh),
        "the worker it started afterwards joined"
    );
}

#[test]
fn the_same_run_twice_gives_the_same_calls() {
    let run = || {
        let mut sim = Sim::new(3, 2, &["a", "b"]);
        sim.net.drop_next(1, is_test_done);
        put_many(&mut sim, 10);
        sim.run_until_delivered(2_000);
        sim.nodes
            .values()
            .map(|n| n.assignments.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}
