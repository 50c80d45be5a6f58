//! What a simulated node does besides heartbeats: puts (copied to the row quorum), push
//! rounds (QoS 2 only while not fenced) with their finished marks, the catch-up at
//! registration, the relearn after a lapse, and the takeover's adoption, each following the
//! daemon's code it names (`takeover.rs`, `fence.rs`).

use std::collections::{BTreeSet, HashMap, HashSet};
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
        if holders.is_empty() {
            return; // refused: no copy could be placed, nothing acknowledged
        }
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
            // the "received" phase: the release waits until enough holders stored its mark
            // (`Daemon::spread_received`); a pusher that holds a mark only releases
            let Some(release_only) = self.spread_received(node, id) else {
                continue;
            };
            if release_only {
                self.note(|| format!("node {node} releases {id:?}"));
                self.out.releases += 1;
            } else {
                self.note(|| format!("node {node} pushes {id:?}"));
            }
            let count = self.pushed.entry(id).or_default();
            *count += u32::from(!release_only);
            if *count > 1 && !release_only {
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
            // the origin too (`Daemon::end_copies`): what it handed over leaves its outbox
            let targets: Vec<u32> = self
                .grid
                .xs_quorum(id.0)
                .into_iter()
                .filter(|&h| h != node)
                .collect();
            for to in targets {
                self.send_finished(node, inc, to, id);
            }
        }
    }

    /// The QoS 2 marks of `id` pushed by `node`, as `Daemon::spread_received` stores them:
    /// `None` while too few holders answer (postponed); else whether `node` held a mark
    /// already (a subscriber has the object: only the release goes out).
    fn spread_received(&mut self, node: u32, id: Id) -> Option<bool> {
        let origin = id.0;
        let v = &self.nodes[node as usize].view;
        let holders: Vec<u32> = self
            .grid
            .xs_quorum(origin)
            .into_iter()
            .filter(|&h| h != node && h != origin)
            .collect();
        // the origin stores no marks of its own objects: not asked; as many as a put
        // needs, counted over every holder, the dead too
        let needed = holders.len().min(2);
        let asked: Vec<u32> = holders.into_iter().filter(|&h| !v.dead(h)).collect();
        let now = self.now;
        let stored: Vec<u32> = asked
            .into_iter()
            .filter(|&h| self.nodes[h as usize].answers(now))
            .collect();
        if stored.len() < needed {
            return None;
        }
        // an origin holds marks of its own objects only as a reclaim pulled them
        let known = self.nodes[node as usize].marks.contains(&id);
        for h in stored {
            self.nodes[h as usize].marks.insert(id);
        }
        Some(known)
    }

    /// The marks `node` pulls of `origin`'s objects from `from` (`Daemon::pull`): those of
    /// unfinished copies there.
    fn pull_marks(&mut self, node: u32, origin: u32, from: &[u32]) {
        let mut got = Vec::new();
        for &h in from {
            let h = &self.nodes[h as usize];
            got.extend(
                h.marks
                    .range((origin, 0)..=(origin, u64::MAX))
                    .filter(|id| h.copies.get(id).is_some_and(|c| !c.finished))
                    .copied(),
            );
        }
        self.nodes[node as usize].marks.extend(got);
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
            let (top, owns_from) = (o.next_seq, o.owns_from);
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
                // below `owns_from`: an earlier disk's, which its heir takes over
                if id.1 < top
                    && id.1 >= owns_from
                    && !held.contains(&id.1)
                    && !c.adopted
                    && !taken.contains(&id.1)
                {
                    c.finished = true;
                }
            }
        }
        self.learn_finished(node);
        self.nodes[node as usize].caught_up = true;
    }

    /// Its own objects that live members of its quorum hold finished leave its outbox;
    /// those a member adopted stay in it, handed to that member: not pushed here, answered
    /// as held (`Daemon::learn_finished`). The answer: whether every member alive in its
    /// view answered.
    pub(super) fn learn_finished(&mut self, node: u32) -> bool {
        let live = self.live_members(node, node);
        let members = self.reachable(node, live.clone(), &[]);
        let whole = members.len() == live.len();
        let mut finished = HashSet::new();
        let mut adopted = Vec::new();
        for m in members {
            let mm = &self.nodes[m as usize];
            finished.extend(mm.seqs(node, |c| c.finished));
            if self.rules.learn_adopted {
                let a = Adopter::in_view(m, &self.nodes[node as usize].view);
                adopted.extend(mm.seqs(node, |c| c.adopted).into_iter().map(|s| (s, a)));
            }
        }
        let reclaim = self.rules.reclaim;
        let n = &mut self.nodes[node as usize];
        let mut left = Vec::new();
        for seq in finished {
            n.handed.remove(&seq);
            if n.outbox.remove(&seq) {
                left.push(seq);
            }
        }
        for (seq, a) in adopted {
            if !n.outbox.contains(&seq) {
                continue;
            }
            if reclaim {
                n.handed.insert(seq, a);
            } else {
                n.outbox.remove(&seq); // the code before the fix
            }
            left.push(seq);
        }
        if !left.is_empty() {
            self.note(|| format!("node {node} leaves its {left:?} to others"));
        }
        whole
    }

    /// The members of `origin`'s quorum alive in `node`'s view, but `node` and `origin`.
    fn live_members(&self, node: u32, origin: u32) -> Vec<u32> {
        let v = &self.nodes[node as usize].view;
        self.grid
            .xs_quorum(origin)
            .into_iter()
            .filter(|&m| m != node && m != origin && v.alive(m))
            .collect()
    }

    /// An origin takes back what it handed to `adopter`, lost in its view
    /// (`Daemon::reclaim`): what a live holder knows finished leaves its outbox, the rest
    /// it pushes itself. Every live member of its quorum must answer; else it tries again.
    pub(super) fn reclaim(&mut self, node: u32, inc: u64, adopter: Adopter) {
        let n = &self.nodes[node as usize];
        if !adopter.lost(&n.view) {
            return; // back meanwhile, on its disk: still its
        }
        let seqs: Vec<u64> = n
            .handed
            .iter()
            .filter(|(_, a)| **a == adopter)
            .map(|(s, _)| *s)
            .collect();
        if seqs.is_empty() {
            return;
        }
        let members: Vec<u32> = self
            .grid
            .xs_quorum(node)
            .into_iter()
            .filter(|&m| m != node && m != adopter.node && n.view.alive(m))
            .collect();
        let answered = self.reachable(node, members.clone(), &[]);
        if answered.len() < members.len() {
            let d = 100 + self.rng.below(100);
            self.at(self.now + d, Event::Reclaim { node, inc, adopter });
            return;
        }
        // with the subscribers' "received" marks (`Daemon::reclaim`)
        self.pull_marks(node, node, &answered);
        let mut finished = HashSet::new();
        for m in answered {
            finished.extend(self.nodes[m as usize].seqs(node, |c| c.finished));
        }
        let n = &mut self.nodes[node as usize];
        let mut back = Vec::new();
        for seq in seqs {
            n.handed.remove(&seq);
            if finished.contains(&seq) {
                n.outbox.remove(&seq);
            } else {
                back.push(seq);
            }
        }
        self.out.reclaimed += back.len() as u64;
        self.note(|| format!("node {node} takes back {back:?} from lost {adopter:?}"));
    }

    /// What `node` handed to live adopters that no longer claim it (`Daemon::audit_handed`):
    /// every live member of its quorum is asked, and the objects go to whoever claims them
    /// now, leave the outbox when one finished them, or are taken back. At the first audit
    /// that finds them unclaimed: the daemon waits for a second, for an adopter's moment
    /// between its last delivery and its copies' end, which this model has not.
    pub(super) fn audit(&mut self, node: u32) {
        let n = &self.nodes[node as usize];
        if !n.registered || !n.caught_up {
            return;
        }
        let now = self.now;
        let mut dropped = Vec::new();
        for (&seq, a) in &n.handed {
            if a.lost(&n.view) || !n.view.alive(a.node) {
                continue; // the reclaim's
            }
            let am = &self.nodes[a.node as usize];
            if !am.answers(now) {
                continue;
            }
            if !am
                .copies
                .get(&(node, seq))
                .is_some_and(|c| c.adopted || c.finished)
            {
                dropped.push(seq);
            }
        }
        if dropped.is_empty() {
            return;
        }
        let members = self.live_members(node, node);
        let answered = self.reachable(node, members.clone(), &[]);
        if answered.len() < members.len() {
            return; // asked again at the next audit
        }
        self.pull_marks(node, node, &answered);
        let mut finished = HashSet::new();
        let mut claimed = HashMap::new();
        for &m in &answered {
            let mm = &self.nodes[m as usize];
            finished.extend(mm.seqs(node, |c| c.finished));
            let a = Adopter::in_view(m, &self.nodes[node as usize].view);
            for s in mm.seqs(node, |c| c.adopted && !c.finished) {
                claimed.insert(s, a);
            }
        }
        let n = &mut self.nodes[node as usize];
        let mut back = Vec::new();
        for seq in dropped {
            if finished.contains(&seq) {
                n.handed.remove(&seq);
                n.outbox.remove(&seq);
            } else if let Some(a) = claimed.get(&seq) {
                n.handed.insert(seq, *a);
            } else {
                n.handed.remove(&seq);
                back.push(seq);
            }
        }
        self.out.reclaimed += back.len() as u64;
        if !back.is_empty() {
            self.note(|| format!("node {node} takes back {back:?}, no longer claimed"));
        }
    }

    /// The objects it adopted that another live member of their quorum adopted or finished
    /// give up their claim here (`Daemon::adopted_by_others`). The answer: whether every
    /// member alive in its view answered.
    pub(super) fn adopted_by_others(&mut self, node: u32) -> bool {
        let mut whole = true;
        let mine: Vec<Id> = self.nodes[node as usize]
            .copies
            .iter()
            .filter(|(_, c)| c.adopted && !c.finished)
            .map(|(id, _)| *id)
            .collect();
        let origins: BTreeSet<u32> = mine.iter().map(|id| id.0).collect();
        for origin in origins {
            let live = self.live_members(node, origin);
            let members = self.reachable(node, live.clone(), &[]);
            whole &= members.len() == live.len();
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
            if !self.rules.give_up_quietly {
                // the code before the fix: the closure ended the copies
                let inc = self.nodes[node as usize].inc;
                for seq in given {
                    let id = (origin, seq);
                    if let Some(c) = self.nodes[node as usize].copies.get_mut(&id) {
                        c.finished = true;
                    }
                    for to in self.grid.xs_quorum(origin) {
                        if to != node {
                            self.send_finished(node, inc, to, id);
                        }
                    }
                }
            }
        }
        whole
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
        self.pull_marks(node, origin, &holders);
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
