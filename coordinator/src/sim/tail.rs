//! The standby's tail in the simulated schedules (`coordinator::tail`): a standby that
//! rebuilt once (vouched for or not) takes, every round, what changed at each live node
//! since its cursor (the whole holders' every change, the other nodes' changes since a
//! Create), and when it wins an election serves that registry if a whole holder it listed
//! in full answered whole in the last round, else rebuilds in full. A node on a new disk
//! is pulled whole again. After it led, its tail starts over. [`Rules`] can undo the store
//! check and the need for a whole holder.

use std::collections::{BTreeMap, BTreeSet};

use storage::{Held, Newest, replaces};

use super::copies::{Cluster, Rules};

/// The standby's registry and where it stands in each node's feed.
#[derive(Debug, Default)]
pub(crate) struct Standby {
    /// A rebuild was made: the rounds take changes since the cursors.
    based: bool,
    /// node -> (store identity, last change taken).
    cursors: BTreeMap<u32, (u64, u64)>,
    /// The whole holders listed in full from their cursors on: only these vouch.
    listed: BTreeSet<u32>,
    /// id -> revision.
    copies: BTreeMap<u64, u64>,
    tombs: BTreeSet<u64>,
}

impl Standby {
    fn held(&self, id: u64) -> Held {
        if self.tombs.contains(&id) {
            Held::Deleted
        } else {
            self.copies
                .get(&id)
                .map_or(Held::Absent, |&r| Held::Revision(r))
        }
    }
}

impl Cluster {
    /// One round of the tail (`Tail::follow`); whether a whole holder vouched for it.
    pub(super) fn standby_round(&mut self) -> bool {
        let rules: Rules = self.rules;
        if !self.standby.based {
            // the rebuild: the registry replaced, cursors where each feed stood
            let up = self.up();
            let registry = self.rebuild();
            let ends = self.layout().whole_holders();
            // the rebuild lists the first whole holder in full and the other for what
            // changed since Creates; with neither whole, both in full
            let first_whole = ends
                .iter()
                .copied()
                .find(|&f| up.contains(&f) && self.whole(f));
            let vouched = first_whole.is_some();
            let listed: BTreeSet<u32> = match first_whole {
                Some(f) => [f].into(),
                None => ends.into_iter().filter(|f| up.contains(f)).collect(),
            };
            let cursors = up
                .iter()
                .map(|&n| {
                    let node = &self.nodes[n as usize];
                    (n, (node.store, node.last_change()))
                })
                .collect();
            // the store keeps its tombstones and takes the merge's
            let mut tombs = self.standby.tombs.clone();
            for &n in &up {
                tombs.extend(self.nodes[n as usize].tombstones().iter().copied());
            }
            self.standby = Standby {
                based: true,
                cursors,
                listed,
                copies: registry
                    .into_iter()
                    .filter(|(id, _)| !tombs.contains(id))
                    .collect(),
                tombs,
            };
            return vouched;
        }
        let holders: BTreeSet<u32> = self.layout().whole_holders().into_iter().collect();
        let mut merged = Newest::default();
        let mut vouched = false;
        let mut unlisted_whole = Vec::new();
        for n in self.up() {
            let node = &self.nodes[n as usize];
            let holder = holders.contains(&n);
            let copies = match self.standby.cursors.get(&n) {
                Some(&(store, at)) if store == node.store || !rules.tail_checks_store => {
                    node.changes(at, !holder)
                }
                _ => {
                    if holder {
                        self.standby.listed.insert(n);
                    }
                    node.list(!holder)
                }
            };
            for c in copies {
                merged.offer(c);
            }
            if holder && self.whole(n) && !self.standby.listed.contains(&n) {
                unlisted_whole.push(n);
            }
            vouched |= holder && self.whole(n) && self.standby.listed.contains(&n);
            self.standby
                .cursors
                .insert(n, (node.store, node.last_change()));
        }
        let (records, deleted) = merged.into_parts();
        let s = &mut self.standby;
        for id in deleted {
            s.copies.remove(&id);
            s.tombs.insert(id);
        }
        for (id, rev, _) in records {
            if replaces(s.held(id), rev) {
                s.copies.insert(id, rev);
            }
        }
        if !vouched {
            // the next round lists a whole holder it did not list in full
            for n in unlisted_whole {
                s.cursors.remove(&n);
            }
        }
        vouched || !rules.tail_needs_whole
    }

    /// The standby wins an election: a last round, then its registry if vouched for, else
    /// a rebuild; its tail starts over (it leads, and writes its store itself). The answer
    /// says whether the registry was the tail's.
    pub(super) fn standby_leads(&mut self) -> (BTreeMap<u64, u64>, bool) {
        let from_tail = self.standby.based && self.standby_round();
        let registry = if from_tail {
            self.standby.copies.clone()
        } else {
            self.rebuild()
        };
        self.standby.based = false;
        self.standby.cursors.clear();
        self.standby.listed.clear();
        (registry, from_tail)
    }
}
