//! The standby's tail in the simulated schedules (`coordinator::tail`): a standby that
//! rebuilt once (vouched for or not) takes, every round, what changed at each live node
//! since its cursor (the whole holders' every change, the other nodes' changes since a
//! Create), and when it wins an election serves that registry if a whole holder it listed
//! in full answered whole in the last round, else rebuilds in full. A node on a new disk
//! is pulled whole again. While it leads it writes its store itself, journaled, and some
//! of those writes never reach a node (a Create or an Update whose replication failed);
//! after the leadership it resumes from the cursors it saved, with each journaled id set
//! to what a whole holder holds (with none whole, it waits a few rounds, then rebuilds).
//! [`Rules`] can undo the store check, the need for a whole holder, and the undoing of the
//! journal.

use std::collections::{BTreeMap, BTreeSet};

use storage::{Held, Newest, replaces};

use super::copies::{Cluster, Rules};
use crate::tail::Resumed;

/// node -> (store identity, last change taken).
type Cursors = BTreeMap<u32, (u64, u64)>;

/// The standby's registry and where it stands in each node's feed.
#[derive(Debug, Default)]
pub(crate) struct Standby {
    /// A rebuild was made (or the saved state resumed): the rounds take changes since the
    /// cursors.
    based: bool,
    cursors: Cursors,
    /// The whole holders listed in full from their cursors on: only these vouch.
    listed: BTreeSet<u32>,
    /// id -> revision.
    copies: BTreeMap<u64, u64>,
    tombs: BTreeSet<u64>,
    /// The cursors and the listed holders as the store saved them last.
    saved: Option<(Cursors, BTreeSet<u32>)>,
    /// It leads: its writes go to its store, journaled.
    pub(super) leading: bool,
    /// The ids its leaderships wrote since it last resumed or rebuilt.
    journal: BTreeSet<u64>,
    /// Times it resumed from its saved state after leading.
    pub(super) resumed: usize,
    /// Rounds its resume waited for a whole holder.
    waited: u32,
}

/// Rounds a resume waits for a whole holder before the tail rebuilds
/// (`coordinator::tail`'s `RESUME_PATIENCE`).
const PATIENCE: u32 = 3;

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

    fn save(&mut self) {
        self.saved = Some((self.cursors.clone(), self.listed.clone()));
    }

    /// The leader stored `id` at `revision` (a Create or an Update), journaled, before
    /// the nodes took it (or failed to).
    pub(super) fn led_write(&mut self, id: u64, revision: u64) {
        if !self.tombs.contains(&id) {
            self.copies.insert(id, revision);
            self.journal.insert(id);
        }
    }

    /// The leader deleted `id` (its tombstone is final, as the store keeps it).
    pub(super) fn led_delete(&mut self, id: u64) {
        self.copies.remove(&id);
        self.tombs.insert(id);
    }
}

impl Cluster {
    /// One round of the tail (`Tail::follow`); whether a whole holder vouched for it.
    pub(super) fn standby_round(&mut self) -> bool {
        let rules: Rules = self.rules;
        if !self.standby.based {
            match self.standby_resume() {
                Resumed::Yes => {}
                Resumed::No => return self.base_rebuild(),
                Resumed::Wait => return false,
            }
        }
        self.changes_round(rules)
    }

    /// The tail resumes from the state its store saved: the journaled ids set to what a
    /// whole holder holds. [`Resumed::No`] (rebuild) with nothing saved, or journaled ids
    /// and no whole holder for [`PATIENCE`] rounds; [`Resumed::Wait`] before that.
    fn standby_resume(&mut self) -> Resumed {
        let Some((cursors, listed)) = self.standby.saved.clone() else {
            return Resumed::No;
        };
        if !self.standby.journal.is_empty() && self.rules.resume_undoes_journal {
            let up = self.up();
            let Some(h) = self
                .layout()
                .whole_holders()
                .into_iter()
                .find(|&h| up.contains(&h) && self.whole(h))
            else {
                self.standby.waited += 1;
                if self.standby.waited < PATIENCE {
                    return Resumed::Wait;
                }
                self.standby.waited = 0;
                return Resumed::No;
            };
            let journal = std::mem::take(&mut self.standby.journal);
            for id in journal {
                let at_holder = self.nodes[h as usize].held(id);
                let s = &mut self.standby;
                match at_holder {
                    Held::Revision(r) => {
                        if !s.tombs.contains(&id) {
                            s.copies.insert(id, r);
                        }
                    }
                    Held::Deleted => {
                        s.copies.remove(&id);
                        s.tombs.insert(id);
                    }
                    Held::Absent => {
                        s.copies.remove(&id);
                    }
                }
            }
        }
        let s = &mut self.standby;
        s.journal.clear();
        s.resumed += 1;
        s.waited = 0;
        s.based = true;
        s.cursors = cursors;
        s.listed = listed;
        Resumed::Yes
    }

    /// The tail's rebuild: the registry replaced, cursors where each feed stood, the
    /// journal cleared; whether a whole holder vouched for it.
    fn base_rebuild(&mut self) -> bool {
        {
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
                saved: None,
                leading: false,
                journal: BTreeSet::new(),
                resumed: self.standby.resumed,
                waited: 0,
            };
            self.standby.save();
            vouched
        }
    }

    /// A round of what changed since the cursors.
    fn changes_round(&mut self, rules: Rules) -> bool {
        let holders: BTreeSet<u32> = self.layout().whole_holders().into_iter().collect();
        let mut merged = Newest::default();
        let mut vouched = false;
        let mut unlisted_whole = Vec::new();
        // a listed holder first; once one vouched, the other holder gives what changed
        // since Creates and is listed in full no more
        let mut order = self.up();
        order.sort_by_key(|n| !(holders.contains(n) && self.standby.listed.contains(n)));
        for n in order {
            let node = &self.nodes[n as usize];
            let holder = holders.contains(&n);
            let changed_only = !holder || vouched;
            if holder && vouched {
                self.standby.listed.remove(&n);
            }
            let copies = match self.standby.cursors.get(&n) {
                Some(&(store, at)) if store == node.store || !rules.tail_checks_store => {
                    node.changes(at, changed_only)
                }
                _ => {
                    if !changed_only {
                        self.standby.listed.insert(n);
                    }
                    node.list(changed_only)
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
        s.save();
        vouched || !rules.tail_needs_whole
    }

    /// The standby wins an election: a last round, then its registry if vouched for, else
    /// a rebuild; its tail starts over (it leads, and writes its store itself). The answer
    /// says whether the registry was the tail's.
    pub(super) fn standby_leads(&mut self) -> (BTreeMap<u64, u64>, bool) {
        let from_tail = self.standby.based && self.standby_round();
        if !from_tail {
            // the leader's rebuild replaces the store and saves its cursors
            self.base_rebuild();
        }
        let registry = self.standby.copies.clone();
        // the tail starts over in memory (the store keeps what it saved) and the leader
        // writes the store
        let s = &mut self.standby;
        s.based = false;
        s.cursors.clear();
        s.listed.clear();
        s.leading = true;
        (registry, from_tail)
    }
}
