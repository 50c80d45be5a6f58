//! What a simulated node does besides heartbeats: puts (copied to the row quorum), push
//! rounds (QoS 2 only while not fenced) with their finished marks, the catch-up at
//! registration, the relearn after a lapse, and the takeover's adoption, each following the
//! daemon's code it names (`takeover.rs`, `fence.rs`).

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use super::*;

impl Cluster {
    pub(super) fn put(&mut self, origin: u32) {
        let now = self.now;
        let o = &self.nodes[origin as usize];
        if !o.answers(now) || !o.registered {
            return;
        }
        let holders: Vec<u32> = self
            .grid
            .object_quorum(origin, false)
            .into_iter()
            .filter(|&h| h != origin && self.nodes[h as usize].answers(now))
            .collect();
        let o = &mut self.nodes[origin as usize];
        let seq = o.next_seq;
        o.next_seq += 1;
        o.outbox.insert(seq);
        if !o.caught_up {
            o.fresh.insert(seq);
        }
        for h in holders {
            self.nodes[h as usize].copies.insert(
                (origin, seq),
                Copy {
                    finished: false,
                    adopted: false,
                },
            );
        }
        self.acknowledged.push((origin, seq));
    }

    /// Sends the finished mark of `id` from `from` (process `inc`) to holder `to`.
    pub(super) fn send_finished(&mut self, from: u32, inc: u64, to: u32, id: Id) {
        let d = self.delay();
        let e = Event::Finished { from, inc, to, id };
        self.at(self.now + d, e);
    }

    /// Pushes what the node owns (QoS 2: only while not fenced), and resends unsent marks.
    pub(super) fn round(&mut self, node: u32) {
        let now = self.now;
        let unsent = std::mem::take(&mut self.nodes[node as usize].unsent);
        let inc = self.nodes[node as usize].inc;
        for (to, id) in unsent {
            self.send_finished(node, inc, to, id);
        }
        let n = &self.nodes[node as usize];
        if !n.registered
            || now < self.stalled_until
            || n.fence.fenced(At(now), Duration::from_millis(LEASE))
        {
            return;
        }
        let owned: Vec<Id> = n.owned().into_iter().take(PUSHES).collect();
        for id in owned {
            self.note(|| format!("node {node} pushes {id:?}"));
            let count = self.pushed.entry(id).or_default();
            *count += 1;
            if *count > 1 {
                self.out.violations.push(Violation::Duplicate {
                    origin: id.0,
                    seq: id.1,
                    by: node,
                    at: now,
                });
            }
            let n = &mut self.nodes[node as usize];
            if id.0 == node {
                n.outbox.remove(&id.1);
            } else if let Some(c) = n.copies.get_mut(&id) {
                c.finished = true;
                c.adopted = false;
            }
            let targets: Vec<u32> = self
                .grid
                .xs_quorum(id.0)
                .into_iter()
                .filter(|&h| h != node && h != id.0)
                .collect();
            for to in targets {
                self.send_finished(node, inc, to, id);
            }
        }
    }

    /// At registration: copies of the origins it holds for that it lacks, and the end of
    /// those their origins finished (`Daemon::catch_up`); then its own finished or adopted
    /// objects leave its outbox.
    pub(super) fn catch_up(&mut self, node: u32) {
        let origins = self.reachable(node, self.grid.origins_held_by(node), &[]);
        for origin in origins {
            // what a member adopted was handed over by the origin, not finished: it is
            // asked of every member, and nothing is ended while one does not answer
            let mut taken = HashSet::new();
            let members: Vec<u32> = self
                .grid
                .xs_quorum(origin)
                .into_iter()
                .filter(|m| *m != node && *m != origin)
                .collect();
            let answered = self.reachable(node, members.clone(), &[]);
            let whole = answered.len() == members.len();
            if self.rules.keep_handed {
                for m in answered {
                    taken.extend(self.nodes[m as usize].seqs(origin, |c| c.adopted && !c.finished));
                }
            }
            let o = &self.nodes[origin as usize];
            let held: Vec<u64> = o.outbox.iter().copied().collect();
            let top = o.next_seq;
            let n = &mut self.nodes[node as usize];
            for &seq in &held {
                n.copies.entry((origin, seq)).or_insert(Copy {
                    finished: false,
                    adopted: false,
                });
            }
            if self.rules.keep_handed && !whole {
                continue;
            }
            // `drop_finished`: what the origin no longer holds was finished (or handed over)
            for (id, c) in n.copies.range_mut((origin, 0)..=(origin, u64::MAX)) {
                if id.1 < top && !held.contains(&id.1) && !c.adopted && !taken.contains(&id.1) {
                    c.finished = true;
                }
            }
        }
        self.learn_finished(node);
        self.nodes[node as usize].caught_up = true;
    }

    /// Its own objects that live members of its quorum hold finished, or adopted, leave its
    /// outbox (`Daemon::learn_finished`).
    pub(super) fn learn_finished(&mut self, node: u32) {
        let members = self.reachable(node, self.grid.xs_quorum(node), &[node]);
        let mut handed = HashSet::new();
        for m in members {
            let adopted = self.rules.learn_adopted;
            handed.extend(
                self.nodes[m as usize].seqs(node, |c| c.finished || (adopted && c.adopted)),
            );
        }
        let n = &mut self.nodes[node as usize];
        let handed: Vec<u64> = handed.into_iter().filter(|s| n.outbox.remove(s)).collect();
        if !handed.is_empty() {
            self.note(|| format!("node {node} leaves its {handed:?} to others"));
        }
    }

    /// The objects it adopted that another live member of their quorum adopted or finished
    /// give up their claim here (`Daemon::adopted_by_others`).
    pub(super) fn adopted_by_others(&mut self, node: u32) {
        let mine: Vec<Id> = self.nodes[node as usize]
            .copies
            .iter()
            .filter(|(_, c)| c.adopted && !c.finished)
            .map(|(id, _)| *id)
            .collect();
        let origins: BTreeSet<u32> = mine.iter().map(|id| id.0).collect();
        for origin in origins {
            let members = self.reachable(node, self.grid.xs_quorum(origin), &[node, origin]);
            let mut elsewhere = HashSet::new();
            for m in members {
                elsewhere.extend(self.nodes[m as usize].seqs(origin, |c| c.adopted || c.finished));
            }
            let n = &mut self.nodes[node as usize];
            let mut given = Vec::new();
            for seq in elsewhere {
                if let Some(c) = n.copies.get_mut(&(origin, seq))
                    && c.adopted
                {
                    c.adopted = false;
                    given.push(seq);
                }
            }
            if !given.is_empty() {
                self.note(|| format!("node {node} gives up {origin}:{given:?}, adopted elsewhere"));
            }
        }
    }

    /// A takeover's pulls are done: it adopts by [`claims`] (`Daemon::take_over`).
    pub(super) fn take_over(&mut self, node: u32, origin: u32, below: u64) {
        if !self.nodes[node as usize]
            .ownership
            .still_taking(origin, below)
        {
            return;
        }
        let holders = self.reachable(node, self.grid.xs_quorum(origin), &[node, origin]);
        let mut pulled = BTreeSet::new();
        let mut taken = HashSet::new();
        let mut finished = HashSet::new();
        for h in holders {
            let h = &self.nodes[h as usize];
            pulled.extend(h.seqs(origin, |c| !c.finished));
            taken.extend(h.seqs(origin, |c| c.adopted && !c.finished));
            finished.extend(h.seqs(origin, |c| c.finished));
        }
        let n = &mut self.nodes[node as usize];
        for seq in pulled {
            n.copies.entry((origin, seq)).or_insert(Copy {
                finished: false,
                adopted: false,
            });
        }
        for &seq in &finished {
            if let Some(c) = n.copies.get_mut(&(origin, seq)) {
                c.finished = true;
                c.adopted = false;
            }
        }
        let mut adopted = Vec::new();
        for (id, c) in n.copies.range_mut((origin, 0)..=(origin, u64::MAX)) {
            if !c.finished && !c.adopted && claims(id.1, below, &taken, &finished) {
                c.adopted = true;
                adopted.push(id.1);
            }
        }
        self.note(|| format!("node {node} adopts {origin}:{adopted:?}"));
        self.out.adopted += adopted.len() as u64;
    }
}
