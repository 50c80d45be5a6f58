//! A schedule drawn from its seed: writers putting throughout, then one to five faults at
//! random times (a node killed, now and then with its disk, or paused past its lease; the
//! subscriber down first, now and then), then quiet until every object could be pushed; and
//! the oracle's last check, that every acknowledged object was pushed.

use std::cmp::Reverse;

use super::*;

/// Runs the schedule of `seed` under `rules`.
pub fn run(seed: u64, rules: Rules) -> Outcome {
    let mut c = Cluster::new(seed, rules);
    for node in 0..c.grid.len() {
        c.start(node);
    }
    // writers throughout; faults after the cluster formed
    let span = 2_000 + c.rng.below(2_000);
    let mut t = 200;
    while t < span {
        let node = c.rng.below(u64::from(c.grid.len())) as u32;
        c.at(t, Event::Put { node });
        t += 2 + c.rng.below(12);
    }
    let faults = 1 + c.rng.below(5);
    for _ in 0..faults {
        let when = 300 + c.rng.below(span - 300);
        let node = c.rng.below(u64::from(c.grid.len())) as u32;
        // the subscriber down first, now and then: kills and pauses then meet a backlog
        if c.rng.chance(0.5) {
            let ms = 100 + c.rng.below(4 * LEASE);
            let before = c.rng.below(ms);
            c.at(when.saturating_sub(before), Event::Stall { ms });
        }
        if c.rng.chance(0.6) {
            // a lost disk now and then, down past its lease (the grid tolerates one disk
            // lost at a time: its copies are elsewhere)
            let wiped = c.rng.chance(0.25);
            let down = if wiped {
                2 * LEASE + c.rng.below(2 * LEASE)
            } else {
                20 + c.rng.below(3 * LEASE)
            };
            c.at(when, Event::Kill { node, down, wiped });
        } else {
            let ms = 50 + c.rng.below(3 * LEASE);
            c.at(when, Event::Pause { node, ms });
        }
    }
    // every process is back by then; quiet until every object could be pushed
    let end = span + 4 * LEASE + 2_000;
    while let Some(Reverse((when, _, e))) = c.queue.pop() {
        if when > end {
            break;
        }
        c.now = when;
        c.step(e);
    }
    c.out.acknowledged = c.acknowledged.len() as u64;
    for &(origin, seq) in &c.acknowledged {
        if !c.pushed.contains_key(&(origin, seq)) {
            c.out.violations.push(Violation::Lost { origin, seq });
        }
    }
    c.out
}

/// The first of `count` schedules from `base` that fails under `rules`, with what failed.
pub fn first_failure(base: u64, count: u64, rules: Rules) -> Option<(u64, Vec<Violation>)> {
    (base..base + count).find_map(|seed| {
        let o = run(seed, rules);
        (!o.violations.is_empty()).then_some((seed, o.violations))
    })
}
