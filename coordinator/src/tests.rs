//! Every scheduling rule and fault case, deterministically: no sockets, no clocks, no sleeps.

use super::*;

fn cfg() -> Config {
    Config {
        test_batch: 2,
        match_batch: 2,
        batch_deadline_ms: 5,
        eager_close: false,
        timeout_multiple: 4.0,
        min_timeout_ms: 50,
        lease_ms: 1_000,
        aging_ms: 100,
        hello_every_ms: 1_000,
    }
}

fn t(a: &str) -> Block {
    Block::Test(a.to_string())
}

fn join(c: &mut Coordinator, now: u64, worker: WorkerId, block: Block) -> Vec<Action> {
    join_as(c, now, worker, block, false)
}

/// A worker of a node's urgent reserve (priority-7 tasks only) joins.
fn join_urgent(c: &mut Coordinator, now: u64, worker: WorkerId, block: Block) -> Vec<Action> {
    join_as(c, now, worker, block, true)
}

fn join_as(
    c: &mut Coordinator,
    now: u64,
    worker: WorkerId,
    block: Block,
    urgent: bool,
) -> Vec<Action> {
    c.step(
        now,
        Event::WorkerJoined {
            worker,
            node: 1,
            block,
            urgent,
        },
    )
}

fn arrive(
    c: &mut Coordinator,
    now: u64,
    object: ObjectKey,
    priority: u8,
    attrs: &[&str],
) -> Vec<Action> {
    c.step(
        now,
        Event::ObjectArrived {
            object,
            priority,
            attrs: attrs.iter().map(|s| s.to_string()).collect(),
        },
    )
}

fn assigns(actions: &[Action]) -> Vec<(WorkerId, Block, Vec<ObjectKey>, Option<Block>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Assign {
                worker,
                block,
                objects,
                load,
                ..
            } => Some((*worker, block.clone(), objects.clone(), load.clone())),
            _ => None,
        })
        .collect()
}

/// The tasks assigned for `block`: (worker, task, objects).
fn tasks_on(actions: &[Action], block: &Block) -> Vec<(WorkerId, TaskId, Vec<ObjectKey>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Assign {
                worker,
                task,
                block: b,
                objects,
                ..
            } if b == block => Some((*worker, *task, objects.clone())),
            _ => None,
        })
        .collect()
}

fn done(
    c: &mut Coordinator,
    now: u64,
    worker: WorkerId,
    task: TaskId,
    block: Block,
) -> Vec<Action> {
    c.step(
        now,
        Event::TaskDone {
            worker,
            task,
            block,
        },
    )
}

fn task_of(actions: &[Action]) -> TaskId {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Assign { task, .. } => Some(*task),
            _ => None,
        })
        .expect("an assignment")
}

#[test]
fn rule1_idle_worker_with_the_block() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("temp"));
    join(&mut c, 0, 2, Block::Empty);
    let a = arrive(&mut c, 1, 100, 0, &["temp"]);
    assert!(assigns(&a).is_empty(), "batch of 2 not full yet");
    let a = arrive(&mut c, 1, 101, 0, &["temp"]);
    assert_eq!(assigns(&a), vec![(1, t("temp"), vec![100, 101], None)]);
}

#[test]
fn rule2_empty_worker_is_told_to_load() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("site"));
    join(&mut c, 0, 2, Block::Empty);
    arrive(&mut c, 1, 100, 0, &["temp"]);
    let a = arrive(&mut c, 1, 101, 0, &["temp"]);
    assert_eq!(
        assigns(&a),
        vec![(2, t("temp"), vec![100, 101], Some(t("temp")))]
    );
}

#[test]
fn rule3_longest_idle_queue_gives_up_a_worker() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("site"));
    join(&mut c, 0, 2, t("type"));
    join(&mut c, 0, 3, t("type"));
    arrive(&mut c, 1, 100, 0, &["temp"]);
    let a = arrive(&mut c, 1, 101, 0, &["temp"]);
    let got = assigns(&a);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].0, 2,
        "taken from the longest queue (type: 2 workers)"
    );
    assert_eq!(got[0].3, Some(t("temp")), "told to switch");
}

#[test]
fn rule4_at_capacity_the_task_waits_then_runs() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("temp"));
    arrive(&mut c, 1, 100, 0, &["temp"]);
    let a = arrive(&mut c, 1, 101, 0, &["temp"]);
    let first = task_of(&a);
    arrive(&mut c, 2, 102, 0, &["temp"]);
    let a = arrive(&mut c, 2, 103, 0, &["temp"]);
    assert!(assigns(&a).is_empty(), "no idle worker: buffered");
    assert_eq!(c.snapshot().waiting_tasks, 1);
    let a = c.step(
        10,
        Event::TaskDone {
            worker: 1,
            task: first,
            block: t("temp"),
        },
    );
    assert_eq!(assigns(&a), vec![(1, t("temp"), vec![102, 103], None)]);
}

#[test]
fn batches_close_on_deadline_and_matches_follow_all_tests() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("temp"));
    join(&mut c, 0, 2, t("site"));
    join(&mut c, 0, 3, Block::Match);
    assert!(assigns(&arrive(&mut c, 0, 100, 0, &["temp", "site"])).is_empty());
    assert!(
        assigns(&c.step(4, Event::Tick)).is_empty(),
        "deadline not reached"
    );
    let a = c.step(5, Event::Tick);
    let got = assigns(&a);
    assert_eq!(
        got.len(),
        2,
        "both attribute batches closed on the deadline"
    );
    let tasks: Vec<(WorkerId, TaskId)> = a
        .iter()
        .filter_map(|x| match x {
            Action::Assign { worker, task, .. } => Some((*worker, *task)),
            _ => None,
        })
        .collect();
    // the match task comes only after both tests are done
    let (w0, t0) = tasks[0];
    let b0 = if w0 == 1 { t("temp") } else { t("site") };
    let a = c.step(
        6,
        Event::TaskDone {
            worker: w0,
            task: t0,
            block: b0,
        },
    );
    assert!(assigns(&a).is_empty());
    let (w1, t1) = tasks[1];
    let b1 = if w1 == 1 { t("temp") } else { t("site") };
    c.step(
        7,
        Event::TaskDone {
            worker: w1,
            task: t1,
            block: b1,
        },
    );
    let a = c.step(12, Event::Tick);
    assert_eq!(assigns(&a), vec![(3, Block::Match, vec![100], None)]);
    // an object no predicate cares about goes straight to matching
    arrive(&mut c, 20, 200, 0, &[]);
    let a = arrive(&mut c, 20, 201, 0, &[]);
    assert!(
        assigns(&a)
            .iter()
            .any(|x| x.1 == Block::Match && x.2 == vec![200, 201])
    );
}

#[test]
fn priority_first_with_bounded_aging() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("a"));
    // occupy the only worker
    arrive(&mut c, 0, 1, 0, &["a"]);
    let busy = task_of(&arrive(&mut c, 0, 2, 0, &["a"]));
    // a low-priority batch, then a high-priority one
    arrive(&mut c, 1, 10, 0, &["a"]);
    arrive(&mut c, 1, 11, 0, &["a"]);
    arrive(&mut c, 2, 20, 7, &["a"]);
    arrive(&mut c, 2, 21, 7, &["a"]);
    let a = c.step(
        3,
        Event::TaskDone {
            worker: 1,
            task: busy,
            block: t("a"),
        },
    );
    assert_eq!(assigns(&a)[0].2, vec![20, 21], "priority 7 first");
    let hi = task_of(&a);
    // the low-priority task has now waited long: aging lifts it over a fresh priority-5 task
    arrive(&mut c, 800, 30, 5, &["a"]);
    arrive(&mut c, 800, 31, 5, &["a"]);
    let a = c.step(
        801,
        Event::TaskDone {
            worker: 1,
            task: hi,
            block: t("a"),
        },
    );
    assert_eq!(
        assigns(&a),
        vec![(1, Block::Match, vec![20, 21], Some(Block::Match))],
        "the match of objects put at 7 ties with the task aged into 7, and goes first"
    );
    let m = task_of(&a);
    let a = done(&mut c, 802, 1, m, Block::Match);
    assert_eq!(
        assigns(&a)[0].2,
        vec![10, 11],
        "aged priority-0 task is not starved"
    );
}

#[test]
fn expired_lease_is_checked_before_handing_out_a_task() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("a"));
    join(&mut c, 500, 2, t("a"));
    c.step(900, Event::Heartbeat { worker: 2 });
    arrive(&mut c, 1_200, 10, 0, &["a"]);
    let a = arrive(&mut c, 1_200, 11, 0, &["a"]);
    assert!(a.contains(&Action::WorkerDead { worker: 1 }), "{a:?}");
    assert_eq!(assigns(&a), vec![(2, t("a"), vec![10, 11], None)]);
}

#[test]
fn overdue_task_is_reassigned_and_its_worker_never_used_again() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("a"));
    join(&mut c, 0, 2, t("a"));
    // the match task that follows the first tests goes here, not to a test worker
    join(&mut c, 0, 3, Block::Match);
    // learn the mean: one task taking 10 ms
    arrive(&mut c, 0, 1, 0, &["a"]);
    let first = task_of(&arrive(&mut c, 0, 2, 0, &["a"]));
    c.step(
        10,
        Event::TaskDone {
            worker: 1,
            task: first,
            block: t("a"),
        },
    );
    c.step(10, Event::Heartbeat { worker: 2 });
    arrive(&mut c, 20, 3, 0, &["a"]);
    let a = arrive(&mut c, 20, 4, 0, &["a"]);
    let (w, ..) = assigns(&a)[0].clone();
    let task = task_of(&a);
    let other = if w == 1 { 2 } else { 1 };
    c.step(60, Event::Heartbeat { worker: other });
    // timeout = max(4 x 10 ms, 50 ms) = 50 ms
    let a = c.step(69, Event::Tick);
    assert!(assigns(&a).is_empty());
    let a = c.step(71, Event::Tick);
    assert!(a.contains(&Action::Reassigned { task, from: w }), "{a:?}");
    assert!(a.contains(&Action::WorkerDead { worker: w }));
    assert_eq!(assigns(&a), vec![(other, t("a"), vec![3, 4], None)]);
    // the dead worker's late report changes nothing; it cannot rejoin under its id
    let a = c.step(
        72,
        Event::TaskDone {
            worker: w,
            task,
            block: t("a"),
        },
    );
    assert!(assigns(&a).is_empty());
    join(&mut c, 73, w, t("a"));
    assert_eq!(c.snapshot().reassignments, 1);
    assert_eq!(c.snapshot().dead_workers, 1);
    assert!(!c.workers_of(1).contains(&w));
}

#[test]
fn a_leaving_worker_gives_its_task_back() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("a"));
    arrive(&mut c, 0, 1, 0, &["a"]);
    let task = task_of(&arrive(&mut c, 0, 2, 0, &["a"]));
    let a = c.step(5, Event::WorkerLeft { worker: 1 });
    assert!(a.contains(&Action::Reassigned { task, from: 1 }));
    assert_eq!(c.snapshot().waiting_tasks, 1);
    let a = join(&mut c, 6, 2, Block::Empty);
    assert_eq!(assigns(&a), vec![(2, t("a"), vec![1, 2], Some(t("a")))]);
}

#[test]
fn hellos_carry_the_nonce_periodically() {
    let mut c = Coordinator::new(cfg(), 0xabcd, 0);
    assert!(
        c.step(0, Event::Tick)
            .contains(&Action::Hello { nonce: 0xabcd })
    );
    assert!(
        !c.step(500, Event::Tick)
            .iter()
            .any(|a| matches!(a, Action::Hello { .. }))
    );
    assert!(
        c.step(1_000, Event::Tick)
            .contains(&Action::Hello { nonce: 0xabcd })
    );
    assert_eq!(c.nonce(), 0xabcd);
}

#[test]
fn snapshot_counts_workers_by_state_and_block() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("a"));
    join(&mut c, 0, 2, Block::Empty);
    join(&mut c, 0, 3, Block::Match);
    arrive(&mut c, 0, 1, 0, &["a"]);
    arrive(&mut c, 0, 2, 0, &["a"]);
    let s = c.snapshot();
    assert_eq!(s.busy.get(&t("a")), Some(&1));
    assert_eq!(s.idle.get(&Block::Empty), Some(&1));
    assert_eq!(s.idle.get(&Block::Match), Some(&1));
    assert_eq!(s.waiting_tasks, 0);
}

#[test]
fn saturated_batches_join_a_waiting_task_up_to_the_batch_size() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    // no worker: every closed batch waits
    arrive(&mut c, 0, 1, 0, &["a"]);
    c.step(10, Event::Tick);
    arrive(&mut c, 10, 2, 0, &["a"]);
    c.step(20, Event::Tick);
    assert_eq!(
        c.snapshot().waiting_tasks,
        1,
        "the second batch joined the first"
    );
    arrive(&mut c, 20, 3, 0, &["a"]);
    c.step(30, Event::Tick);
    assert_eq!(c.snapshot().waiting_tasks, 2, "a full task takes no more");
    let out = join(&mut c, 30, 7, t("a"));
    assert_eq!(assigns(&out), vec![(7, t("a"), vec![1, 2], None)]);
}

#[test]
fn an_urgent_reserve_takes_only_priority_7_and_an_aged_task_yields_to_one_put_at_7() {
    let mut c = Coordinator::new(cfg(), 9, 0);
    join(&mut c, 0, 1, t("a"));
    join_urgent(&mut c, 0, 2, t("a"));
    // the backlog takes the ordinary worker; the reserve stays idle for it
    arrive(&mut c, 0, 1, 0, &["a"]);
    let out = arrive(&mut c, 0, 2, 0, &["a"]);
    assert_eq!(assigns(&out), vec![(1, t("a"), vec![1, 2], None)]);
    let busy = task_of(&out);
    arrive(&mut c, 1, 3, 0, &["a"]);
    let out = arrive(&mut c, 1, 4, 0, &["a"]);
    assert!(
        assigns(&out).is_empty(),
        "a priority-0 task waits rather than take the urgent reserve: {out:?}"
    );
    assert_eq!(c.snapshot().waiting_tasks, 1);
    // a priority-7 batch goes to the reserve at once, past the waiting backlog
    arrive(&mut c, 2, 70, 7, &["a"]);
    let out = arrive(&mut c, 2, 71, 7, &["a"]);
    assert_eq!(assigns(&out), vec![(2, t("a"), vec![70, 71], None)]);
    let urgent = task_of(&out);
    // so does a match task of priority 7, which loads the match block on the reserve
    let out = done(&mut c, 3, 2, urgent, t("a"));
    assert_eq!(
        assigns(&out),
        vec![(2, Block::Match, vec![70, 71], Some(Block::Match))]
    );
    let m = task_of(&out);
    done(&mut c, 4, 2, m, Block::Match);
    // the waiting priority-0 task has aged to 7 (100 ms a level), yet the reserve holding
    // the match block takes the next priority-7 test batch (told to load its block), not it
    arrive(&mut c, 800, 72, 7, &["a"]);
    let out = arrive(&mut c, 800, 73, 7, &["a"]);
    assert_eq!(assigns(&out), vec![(2, t("a"), vec![72, 73], Some(t("a")))]);
    // the aged task runs once an ordinary worker is free
    let out = done(&mut c, 801, 1, busy, t("a"));
    assert_eq!(assigns(&out), vec![(1, t("a"), vec![3, 4], None)]);
}

#[test]
fn a_batch_that_must_wait_is_split_by_priority_and_priority_7_always_goes_apart() {
    let mut c = Coordinator::new(
        Config {
            test_batch: 4,
            match_batch: 100,
            ..cfg()
        },
        9,
        0,
    );
    join(&mut c, 0, 1, t("a"));
    join(&mut c, 0, 2, Block::Empty);
    let on_a = |out: &[Action]| -> Vec<(WorkerId, Vec<ObjectKey>)> {
        tasks_on(out, &t("a"))
            .into_iter()
            .map(|(w, _, objects)| (w, objects))
            .collect()
    };
    // idle workers and nothing waiting: the batch starts at once, but its priority-7
    // object goes apart (nodes run those at a higher OS priority) from the rest
    arrive(&mut c, 0, 1, 0, &["a"]);
    arrive(&mut c, 0, 2, 7, &["a"]);
    arrive(&mut c, 0, 3, 0, &["a"]);
    let out = arrive(&mut c, 0, 4, 3, &["a"]);
    assert_eq!(on_a(&out), vec![(1, vec![2]), (2, vec![1, 3, 4])]);
    let (t1, t2) = match tasks_on(&out, &t("a"))[..] {
        [(1, t1, _), (2, t2, _)] => (t1, t2),
        _ => panic!("two tasks on workers 1 and 2"),
    };
    // saturated: the next mixed batch waits as one task per priority
    for (o, p) in [(10, 0), (11, 7), (12, 0), (13, 3)] {
        arrive(&mut c, 1, o, p, &["a"]);
    }
    assert_eq!(c.snapshot().waiting_tasks, 3);
    // a later priority-7 object joins the waiting priority-7 task, not a priority-0 one
    arrive(&mut c, 2, 14, 7, &["a"]);
    c.step(10, Event::Tick);
    assert_eq!(c.snapshot().waiting_tasks, 3);
    let out = done(&mut c, 11, 1, t1, t("a"));
    assert_eq!(
        on_a(&out),
        vec![(1, vec![11, 14])],
        "priority 7 first, together, and not topped up from lower levels"
    );
    let out = done(&mut c, 12, 2, t2, t("a"));
    assert_eq!(
        on_a(&out),
        vec![(2, vec![13, 10, 12])],
        "a task below 7 is topped up from the next levels"
    );
    assert_eq!(c.snapshot().waiting_tasks, 0);
}

#[test]
fn eager_close_starts_at_once_on_an_idle_cluster_and_gathers_while_a_task_runs() {
    let mut c = Coordinator::new(
        Config {
            eager_close: true,
            test_batch: 100,
            match_batch: 100,
            ..cfg()
        },
        9,
        0,
    );
    join(&mut c, 0, 1, t("temp"));
    join(&mut c, 0, 2, Block::Match);
    // an idle worker holds the block and nothing of it runs: no batching wait
    let a = arrive(&mut c, 1, 100, 0, &["temp"]);
    assert_eq!(assigns(&a), vec![(1, t("temp"), vec![100], None)]);
    let task = task_of(&a);
    // while that task runs, the next objects gather (no idle worker of the block)
    assert!(assigns(&arrive(&mut c, 2, 101, 0, &["temp"])).is_empty());
    assert!(assigns(&arrive(&mut c, 2, 102, 3, &["temp"])).is_empty());
    // the worker comes free (a deadline after the last close) and takes what gathered
    // (higher priority first); the first object goes to match at once
    let a = done(&mut c, 6, 1, task, t("temp"));
    let mut got = assigns(&a);
    got.sort_by_key(|x| x.0);
    assert_eq!(
        got,
        vec![
            (1, t("temp"), vec![102, 101], None),
            (2, Block::Match, vec![100], None)
        ]
    );
    let t1 = task_of(&a);
    // a second idle worker of a block with a running task does not make it eager
    join(&mut c, 6, 3, t("temp"));
    assert!(assigns(&arrive(&mut c, 7, 103, 0, &["temp"])).is_empty());
    assert!(assigns(&arrive(&mut c, 8, 106, 0, &["temp"])).is_empty());
    // ...and the deadline still closes it
    let a = c.step(12, Event::Tick);
    assert_eq!(assigns(&a), vec![(3, t("temp"), vec![103, 106], None)]);
    let t3 = task_of(&a);
    // all idle again, but the block's last batch gathered two objects under a deadline
    // ago: the next object gathers (at most one task per deadline under a stream)
    done(&mut c, 13, 1, t1, t("temp"));
    done(&mut c, 13, 3, t3, t("temp"));
    assert!(assigns(&arrive(&mut c, 14, 104, 0, &["temp"])).is_empty());
    let a = c.step(19, Event::Tick);
    let [(w, t4, objects)] = &tasks_on(&a, &t("temp"))[..] else {
        panic!("one temp task: {a:?}");
    };
    assert_eq!(objects, &vec![104]);
    done(&mut c, 20, *w, *t4, t("temp"));
    // after a quiet spell an object starts at once again
    let a = arrive(&mut c, 40, 105, 0, &["temp"]);
    let started = tasks_on(&a, &t("temp"));
    assert_eq!(
        started.iter().map(|x| x.2.clone()).collect::<Vec<_>>(),
        vec![vec![105]]
    );
    // objects that come one at a time each go at once, however close together: a batch of
    // one holds nothing back
    done(&mut c, 41, started[0].0, started[0].1, t("temp"));
    let a = arrive(&mut c, 42, 107, 0, &["temp"]);
    let started: Vec<_> = tasks_on(&a, &t("temp")).into_iter().map(|x| x.2).collect();
    assert_eq!(started, vec![vec![107]]);
}

fn heirs(m: &proto::v1::Membership) -> std::collections::BTreeMap<u32, u32> {
    m.members
        .iter()
        .filter_map(|x| x.heir.map(|h| (x.node, h)))
        .collect()
}

#[test]
fn an_heir_is_kept_until_it_dies_so_one_node_takes_a_position_over() {
    use crate::protocol::Protocol;
    use proto::v1;
    let mut p = Protocol::new(cfg(), 7, 5, 0);
    p.set_grid(Some(runtime::grid::Grid::new(3, 3).expect("grid")));
    for node in 0..9 {
        let r = v1::RegisterRequest {
            node,
            endpoint: format!("http://n{node}"),
            workers: Vec::new(),
            owns_from: 1,
        };
        p.register(0, &r);
    }
    let beat = |p: &mut Protocol, now: u64, nodes: &[u32]| {
        for &node in nodes {
            p.heartbeat(
                now,
                &v1::HeartbeatRequest {
                    node,
                    nonce: 7,
                    ..v1::HeartbeatRequest::default()
                },
            );
        }
    };
    // 3 and 4 fall silent: 3's heir is 5 (R(1) = 3, 4, 5, 0, 8 in order; 4 is dead too)
    beat(&mut p, 900, &[0, 1, 2, 5, 6, 7, 8]);
    let m = p.membership(1_500);
    assert!(!m.members[3].alive && !m.members[4].alive);
    assert_eq!(heirs(&m).get(&3), Some(&5));
    // 4 comes back, earlier in the order: 3's heir stays 5
    beat(&mut p, 1_600, &[0, 1, 2, 4, 5, 6, 7, 8]);
    assert_eq!(heirs(&p.membership(1_700)).get(&3), Some(&5));
    // 5 dies: now the first live one, 4
    beat(&mut p, 2_600, &[0, 1, 2, 4, 6, 7, 8]);
    assert_eq!(heirs(&p.membership(3_000)).get(&3), Some(&4));
}

#[test]
fn a_grid_position_held_by_a_live_node_is_not_given_to_another() {
    use crate::protocol::Protocol;
    let mut p = Protocol::new(cfg(), 7, 5, 0);
    let at = |endpoint: &str| proto::v1::RegisterRequest {
        node: 4,
        endpoint: endpoint.into(),
        workers: Vec::new(),
        owns_from: 1,
    };
    p.register(0, &at("http://a"));
    // without a grid a position is just a node id: no check
    assert_eq!(p.position_held(10, 4, "http://b"), None);
    p.set_grid(Some(runtime::grid::Grid::new(3, 3).expect("grid")));
    let lease = cfg().lease_ms;
    assert_eq!(p.position_held(10, 4, "http://b"), Some("http://a"));
    // the same node again (a restart at its address), or a free position, is fine
    assert_eq!(p.position_held(10, 4, "http://a"), None);
    assert_eq!(p.position_held(10, 5, "http://b"), None);
    // once the holder's lease ran out the position is free
    assert_eq!(p.position_held(lease + 1, 4, "http://b"), None);
}

#[test]
fn a_resize_learns_pulls_then_commits_and_a_shrink_waits_for_the_leavers_to_drain() {
    use crate::protocol::Protocol;
    use proto::v1;
    use runtime::grid::Grid;
    let g23 = Grid::new(2, 3).expect("grid");
    let g33 = Grid::new(3, 3).expect("grid");
    let mut p = Protocol::new(cfg(), 7, 5, 0);
    assert!(p.start_resize(g33).is_err(), "no grid: nothing to resize");
    p.set_grid(Some(g23));
    let register = |p: &mut Protocol, node: u32| {
        p.register(
            0,
            &v1::RegisterRequest {
                node,
                endpoint: format!("http://n{node}"),
                workers: Vec::new(),
                owns_from: 1,
            },
        );
    };
    let beat = |p: &mut Protocol, now: u64, nodes: std::ops::Range<u32>, step: u64, drained| {
        for node in nodes {
            p.heartbeat(
                now,
                &v1::HeartbeatRequest {
                    node,
                    nonce: 7,
                    caught_up_step: step,
                    drained,
                    ..v1::HeartbeatRequest::default()
                },
            );
        }
    };
    for n in 0..6 {
        register(&mut p, n);
    }
    p.start_resize(g33).expect("a move");
    assert!(p.start_resize(Grid::new(4, 3).expect("grid")).is_err());
    let m = p.membership(1);
    assert_eq!((m.next_rows, m.next_cols, m.resize_step), (3, 3, 1));
    let s = p.resize_status(1);
    assert_eq!(s.waiting.len(), 9, "{:?}", s.waiting);
    assert!(s.waiting[6].contains("not registered"), "{:?}", s.waiting);
    // every old node learned both grids, but the new ones are not there: no step 2
    beat(&mut p, 10, 0..6, 1, false);
    assert_eq!(p.advance_resize(10), None);
    assert_eq!(p.resize_status(10).step, 1);
    for n in 6..9 {
        register(&mut p, n);
    }
    beat(&mut p, 20, 6..9, 1, false);
    assert_eq!(p.advance_resize(20), None);
    assert_eq!(p.resize_status(20).step, 2, "everyone knows: pull");
    // a node that reports step 1 only holds the commit up
    beat(&mut p, 30, 0..8, 2, false);
    assert_eq!(p.advance_resize(30), None);
    assert_eq!(p.resize_status(30).waiting.len(), 1);
    beat(&mut p, 40, 8..9, 2, false);
    assert_eq!(p.advance_resize(40), Some(g33));
    p.commit_resize(g33);
    let m = p.membership(41);
    assert_eq!((m.rows, m.cols, m.next_rows, m.resize_step), (3, 3, 0, 0));

    // and back: the leavers (6, 7, 8) must be drained before the commit
    p.start_resize(g23).expect("a move back");
    beat(&mut p, 50, 0..9, 1, false);
    assert_eq!(p.advance_resize(50), None);
    beat(&mut p, 60, 0..6, 2, false);
    beat(&mut p, 60, 6..9, 2, false);
    assert_eq!(p.advance_resize(60), None);
    let s = p.resize_status(60);
    assert_eq!(s.waiting.len(), 3, "{:?}", s.waiting);
    assert!(s.waiting.iter().all(|w| w.contains("draining")));
    beat(&mut p, 70, 6..9, 2, true);
    assert_eq!(p.advance_resize(70), Some(g23));
    p.commit_resize(g23);
    assert_eq!(p.nodes(), 6, "the leavers left the membership");
    assert_eq!(p.grid(), Some(g23));
    // a leader that resumes a move recorded in etcd starts it at step 1
    p.resume_resize(Some(g33));
    assert_eq!(p.resize_status(71).step, 1);
    p.resume_resize(Some(g23));
    assert_eq!(
        p.resize_status(72).moving_to,
        None,
        "no move to the grid in force"
    );
}
