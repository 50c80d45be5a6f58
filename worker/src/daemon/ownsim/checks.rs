//! The checks of the simulated ownership schedules: thousands of schedules with every fix in
//! force hold the oracle, a schedule replays from its seed alone, and a mutation check per
//! fix (undo it: some schedule fails).

use super::*;

/// Schedules in CI (each a few simulated seconds).
const SCHEDULES: u64 = 2_000;

/// Schedules a mutation check tries at most (it stops at the first that fails).
const SEARCH: u64 = 10_000;

fn base_seed() -> u64 {
    runtime::rng::sim_seed(0x0a3e_0000)
}

#[test]
fn schedules_of_kills_and_pauses_push_every_object_once() {
    let base = base_seed();
    let (mut acked, mut kills, mut pauses, mut adopted, mut events) = (0, 0, 0, 0, 0);
    let (mut wipes, mut reclaimed) = (0, 0);
    let started = std::time::Instant::now();
    for seed in base..base + SCHEDULES {
        let o = run(seed, Rules::FIXED);
        assert!(
            o.violations.is_empty(),
            "schedule {seed} failed (replay: DISSEM_SIM_SEED={seed}): {:?}",
            o.violations
        );
        acked += o.acknowledged;
        kills += o.kills;
        wipes += o.wipes;
        reclaimed += o.reclaimed;
        pauses += o.pauses;
        adopted += o.adopted;
        events += o.events;
    }
    assert!(kills >= SCHEDULES, "{kills} kills");
    assert!(adopted >= SCHEDULES, "{adopted} objects adopted");
    assert!(wipes >= SCHEDULES / 20, "{wipes} disks lost");
    assert!(reclaimed > 0, "nothing taken back from a lost adopter");
    eprintln!(
        "{SCHEDULES} schedules from seed {base} in {:?}: {acked} objects acknowledged, \
         {kills} kills ({wipes} with the disk), {pauses} pauses, {adopted} objects adopted, \
         {reclaimed} taken back from lost adopters, {events} events",
        started.elapsed()
    );
}

#[test]
fn a_schedule_is_drawn_from_its_seed_alone() {
    for seed in [1, 2, 99] {
        let (a, b) = (run(seed, Rules::FIXED), run(seed, Rules::FIXED));
        assert_eq!(
            (
                a.acknowledged,
                a.kills,
                a.wipes,
                a.pauses,
                a.adopted,
                a.events
            ),
            (
                b.acknowledged,
                b.kills,
                b.wipes,
                b.pauses,
                b.adopted,
                b.events
            )
        );
    }
}

/// Finds a failing schedule under `rules`, which must show a violation `kind` accepts.
fn fails_with(rules: Rules, what: &str, kind: fn(&Violation) -> bool) {
    let found = first_failure(base_seed(), SEARCH, rules);
    let (seed, v) = found.unwrap_or_else(|| panic!("{what}: every schedule passed"));
    assert!(v.iter().any(kind), "{what}, seed {seed}: {v:?}");
}

/// Finds a failing schedule under `rules`, which must show a duplicate.
fn fails_with_a_duplicate(rules: Rules, what: &str) {
    fails_with(rules, what, |v| matches!(v, Violation::Duplicate { .. }));
}

/// Mutation check: a node that starts pushes at its first answer (`bench chaos` seed
/// 44121), while its heir may still be adopting.
#[test]
fn without_the_fence_at_start_a_schedule_fails() {
    let rules = Rules {
        start_fence: false,
        ..Rules::FIXED
    };
    fails_with_a_duplicate(rules, "no fence at start");
}

/// Mutation check: an origin back pushes what its heir adopted.
#[test]
fn without_learning_what_the_heir_adopted_a_schedule_fails() {
    let rules = Rules {
        learn_adopted: false,
        ..Rules::FIXED
    };
    fails_with_a_duplicate(rules, "adoptions not learnt");
}

/// Mutation check: after a lapse, a node keeps pushing what another adopted meanwhile.
#[test]
fn without_giving_up_what_others_adopted_a_schedule_fails() {
    let rules = Rules {
        adopted_by_others: false,
        ..Rules::FIXED
    };
    fails_with_a_duplicate(rules, "adoptions kept after a lapse");
}

/// Mutation check: a holder catching up ends the copies its origin handed over to its heir
/// (taken for finished), and the heir's next takeover ends its adopted copy with them. An
/// origin that keeps what it handed in its outbox (`reclaim`) answers them held, which
/// covers this too: both are undone.
#[test]
fn without_keeping_what_was_handed_over_a_schedule_fails() {
    let rules = Rules {
        keep_handed: false,
        reclaim: false,
        ..Rules::FIXED
    };
    fails_with(rules, "handed-over copies ended", |v| {
        matches!(v, Violation::Lost { .. })
    });
}

/// Mutation check: an origin back pushes what its heir adopted while the heir was taken for
/// dead (paused past its lease), once the heir is alive again.
#[test]
fn without_relearning_when_a_member_returns_a_schedule_fails() {
    let rules = Rules {
        relearn_on_return: false,
        ..Rules::FIXED
    };
    fails_with_a_duplicate(rules, "no relearn when a member returns");
}

/// Mutation check: an origin back hands what its heir adopted over for good (out of its
/// outbox); the heir's disk lost before it pushed them loses them.
#[test]
fn without_taking_back_from_a_lost_adopter_a_schedule_fails() {
    let rules = Rules {
        reclaim: false,
        ..Rules::FIXED
    };
    fails_with(rules, "nothing taken back from a lost adopter", |v| {
        matches!(v, Violation::Lost { .. })
    });
}

/// Mutation check: a relearn lifts the fence though a member alive in the view (the heir,
/// paused) did not answer; the origin pushes what the heir adopted, and so does the heir.
#[test]
fn without_a_whole_relearn_a_schedule_fails() {
    let rules = Rules {
        relearn_whole: false,
        ..Rules::FIXED
    };
    fails_with_a_duplicate(rules, "a relearn with a member silent");
}

/// Mutation check: a node that gives up what it adopted to another claimant closes its
/// deliveries as handed over, and (the code before the fix) that closure ends the copies:
/// the claimant, told the object finished, drops it undelivered.
#[test]
fn without_giving_up_quietly_a_schedule_fails() {
    let rules = Rules {
        give_up_quietly: false,
        ..Rules::FIXED
    };
    fails_at(113, rules, "a give-up that ends the copies", |v| {
        matches!(v, Violation::Lost { .. })
    });
}

/// Mutation check: an origin keeps what it handed to an adopter that gave it up to another
/// claimant; that one's disk is lost, and the objects with it.
#[test]
fn without_auditing_what_was_handed_a_schedule_fails() {
    let rules = Rules {
        audit_handed: false,
        ..Rules::FIXED
    };
    fails_at(2_028_786, rules, "no audit of handed objects", |v| {
        matches!(v, Violation::Lost { .. })
    });
}

/// Schedule `seed` passes with every fix and fails under `rules` with a violation `kind`
/// accepts (a schedule found by a wider search than CI runs).
fn fails_at(seed: u64, rules: Rules, what: &str, kind: fn(&Violation) -> bool) {
    let fixed = run(seed, Rules::FIXED).violations;
    assert!(fixed.is_empty(), "seed {seed} with every fix: {fixed:?}");
    let v = run(seed, rules).violations;
    assert!(v.iter().any(kind), "{what}, seed {seed}: {v:?}");
}
