//! The checks of the simulated subscription-copy schedules: 10,000 schedules with every
//! fix in force hold the oracle, a schedule replays from its seed alone, and a mutation
//! check per fix (undo it: some schedule fails).

use super::*;

/// Schedules in CI (each a few dozen steps).
const SCHEDULES: u64 = 10_000;

fn base_seed() -> u64 {
    runtime::rng::sim_seed(0x5eed_0000)
}

#[test]
fn ten_thousand_schedules_keep_deleted_subscriptions_deleted_and_versions_newest() {
    let base = base_seed();
    let (mut steps, mut rebuilds, mut resizes, mut tails, mut resumes) = (0, 0, 0, 0, 0);
    for seed in base..base + SCHEDULES {
        let o = run(seed, Rules::FIXED);
        assert!(
            o.violations.is_empty(),
            "schedule {seed} failed (replay: DISSEM_SIM_SEED={seed}): {:?}",
            o.violations
        );
        steps += o.steps;
        rebuilds += o.rebuilds;
        resizes += o.resizes;
        tails += o.tail_elections;
        resumes += o.resumes;
    }
    assert!(rebuilds >= SCHEDULES as usize, "{rebuilds} rebuilds");
    assert!(
        resizes >= SCHEDULES as usize / 20,
        "{resizes} resizes committed"
    );
    assert!(
        tails >= SCHEDULES as usize / 2,
        "{tails} elections served from the standby's tail"
    );
    assert!(
        resumes >= SCHEDULES as usize / 4,
        "{resumes} resumes after a leadership"
    );
    eprintln!(
        "{SCHEDULES} schedules from seed {base}: {steps} steps, {rebuilds} rebuilds, \
         {resizes} resizes committed, {tails} elections served from a standby's tail, \
         {resumes} resumes after leading"
    );
}

#[test]
fn a_schedule_is_drawn_from_its_seed_alone() {
    for seed in [1, 2, 99] {
        let (a, b) = (run(seed, Rules::FIXED), run(seed, Rules::FIXED));
        assert_eq!(
            (a.steps, a.rebuilds, a.resizes),
            (b.steps, b.rebuilds, b.resizes)
        );
        let unversioned = Rules {
            versions: false,
            merged_rebuild: false,
            ..Rules::FIXED
        };
        assert_eq!(
            run(seed, unversioned).violations,
            run(seed, unversioned).violations
        );
    }
}

/// Mutation check: copies without revisions or tombstones (the code before the fix)
/// bring deleted subscriptions back, or serve old versions.
#[test]
fn without_versions_a_schedule_fails() {
    let rules = Rules {
        versions: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), SCHEDULES, rules);
    let (seed, v) = found.expect("unversioned copies passed every schedule");
    assert!(
        v.iter().any(|v| matches!(v, Violation::Resurrected { .. })),
        "seed {seed}: {v:?}"
    );
}

/// Mutation check: a rebuild that trusts the first whole holder (the code before the
/// fix) serves an old version that a returning holder still had.
#[test]
fn a_rebuild_from_one_holder_fails_a_schedule() {
    let rules = Rules {
        merged_rebuild: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), SCHEDULES, rules);
    assert!(
        found.is_some(),
        "a one-holder rebuild passed every schedule"
    );
}

/// Mutation check: node 0 or n-1 trusted to hold everything while it is still catching
/// up (the code before the fix; found by `bench chaos`, seeds 9088 and 9113) loses a
/// subscription created while it was down, or serves an old version.
#[test]
fn a_holder_trusted_before_it_caught_up_fails_a_schedule() {
    let rules = Rules {
        whole_when_caught_up: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), SCHEDULES, rules);
    let (seed, v) = found.expect("trusting a holder still catching up passed every schedule");
    eprintln!("seed {seed}: {v:?}");
}

/// Mutation check: a holder taken for dead while it ran on (paused past its lease) and
/// back without registering again, trusted as whole, lacks what was created meanwhile
/// (`bench chaos` seed 56146: a subscription missing at the new leader).
#[test]
fn a_holder_back_from_a_lapse_trusted_as_whole_fails_a_schedule() {
    let rules = Rules {
        lapse_not_whole: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), SCHEDULES, rules);
    let (seed, v) = found.expect("trusting a holder back from a lapse passed every schedule");
    eprintln!("seed {seed}: {v:?}");
}

/// Mutation check: during a move, a subscription created through a node of the new grid
/// alone goes to its new column only, which lacks the old grid's last node, so a
/// rebuild that trusts that node loses it.
#[test]
fn a_move_without_joint_holders_fails_a_schedule() {
    let rules = Rules {
        joint_holders: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), SCHEDULES, rules);
    let (seed, v) = found.expect("moves without joint holders passed every schedule");
    eprintln!("seed {seed}: {v:?}");
}

/// Mutation check: after a shrink, the subscriptions placed by a node that left belong
/// to no column, and a whole holder that does not keep them loses them at its next
/// catch-up (or never pulls them). Rare (about one schedule in 7,500 fails): twice the
/// schedules.
#[test]
fn a_shrink_that_drops_departed_placers_fails_a_schedule() {
    let rules = Rules {
        departed_placers: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), 2 * SCHEDULES, rules);
    let (seed, v) = found.expect("dropping departed placers passed every schedule");
    eprintln!("seed {seed}: {v:?}");
}

/// Mutation check: a resize committed once every node knows it, without the pull step,
/// leaves a new whole holder without what was created through a node that had not
/// heard of the move yet (placed by the old grid alone).
#[test]
fn a_resize_without_its_pull_step_fails_a_schedule() {
    let rules = Rules {
        pull_step: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), SCHEDULES, rules);
    let (seed, v) = found.expect("resizes without the pull step passed every schedule");
    eprintln!("seed {seed}: {v:?}");
}

/// Mutation check: a tail that goes on from its cursor when a node answers from another
/// store (a new disk numbers its changes from 1 again) misses what that store took.
#[test]
fn a_tail_that_ignores_a_new_disk_fails_a_schedule() {
    let rules = Rules {
        tail_checks_store: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), SCHEDULES, rules);
    let (seed, v) = found.expect("a tail ignoring new disks passed every schedule");
    eprintln!("seed {seed}: {v:?}");
}

/// Mutation check: a standby that serves its tail's registry without a whole holder in
/// its last round misses what only the nodes that were not tailed whole hold.
#[test]
fn a_tail_served_without_a_whole_holder_fails_a_schedule() {
    let rules = Rules {
        tail_needs_whole: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), SCHEDULES, rules);
    let (seed, v) = found.expect("a tail served without a whole holder passed every schedule");
    eprintln!("seed {seed}: {v:?}");
}

/// Mutation check: a tail that resumes after its leadership from the cursors it saved,
/// keeping what the leadership wrote without setting it to a whole holder's copies,
/// serves a Create or an Update whose replication failed (never acknowledged).
#[test]
fn a_resume_that_keeps_a_leaderships_failed_writes_fails_a_schedule() {
    let rules = Rules {
        resume_undoes_journal: false,
        ..Rules::FIXED
    };
    let found = first_failure(base_seed(), SCHEDULES, rules);
    let (seed, v) = found.expect("a resume keeping failed writes passed every schedule");
    assert!(
        v.iter()
            .any(|v| matches!(v, Violation::Unacknowledged { .. })),
        "seed {seed}: {v:?}"
    );
}
