//! Randomized schedules over the subscription copies of a grid: creates, updates and
//! deletes through random nodes while others are down, nodes killed or paused past their
//! lease, nodes back (with their disk or a fresh one; a paused one without registering
//! again) and catching up later (a node is live, and takes new changes, a while before its
//! catch-up is done), and new leaders rebuilding the registry, thousands of schedules a
//! second. The placement, catch-up and rebuild follow the daemon's and the coordinator's
//! rules (`worker::daemon::replicate`, `subcopies`, `coordinator::rebuild`); every store
//! and the rebuild's merge take copies by the real rule (`storage::replaces`,
//! `storage::Newest`).
//!
//! After every rebuild the oracle checks: no deleted subscription is alive again, no
//! updated one serves an older version, and no created one is missing, whenever a node
//! that was told of the change (and kept its disk) answers the new leader; and nothing
//! served was never acknowledged (a Create or an Update that only the leader stored). A schedule is
//! drawn from its seed alone; a failure names the seed, and `DISSEM_SIM_SEED=S` replays
//! from it.
//!
//! Schedules also resize the grid online (`sim/resize.rs`, the rules of
//! `coordinator::resize`): nodes learn the move at their heartbeats, place what is created
//! through them by the layout they know, and catch up under it.
//!
//! A standby coordinator tails the nodes' change feeds between steps and wins half the
//! elections (`sim/tail.rs`, the rules of `coordinator::tail`); nodes catch up from their
//! peers' feeds once they pulled from them whole (`worker::daemon::subcopies`).
//!
//! [`Rules`] can undo each fix (unversioned copies without tombstones, a rebuild that
//! trusts one holder, a whole holder trusted before it caught up or after a lapse; for
//! resizes, a commit without the pull step, a move without joint holders, a shrink that
//! drops what departed placers placed; for the standby, a tail that ignores a node's new
//! disk, one served without a whole holder, and one that resumes after leading with the
//! leadership's failed writes kept): the mutation checks (`copies/checks.rs`)
//! show that a schedule then fails. `DISSEM_SIM_TRACE=1` prints every step of the
//! schedules run.

use std::collections::{BTreeMap, BTreeSet};

use runtime::grid::{Grid, Layout};
use runtime::rng::Rng;
use storage::{Held, Newest, SubCopy, replaces};

/// Which fixes are in force (all, except in the mutation checks).
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Copies carry revisions (newest wins) and deletions leave tombstones.
    pub versions: bool,
    /// A rebuild merges both whole holders and every node's changes.
    pub merged_rebuild: bool,
    /// Node 0 and node n-1 are trusted to hold everything only once caught up
    /// (`SubscriptionCopiesResponse.whole`).
    pub whole_when_caught_up: bool,
    /// Schedules resize the grid.
    pub resizes: bool,
    /// A resize has its pull step (every node catches up again once all know the move).
    pub pull_step: bool,
    /// During a move a subscription also goes to node 0 and the last node of both grids.
    pub joint_holders: bool,
    /// Node 0 and the last node keep the copies placed by positions that left the grid.
    pub departed_placers: bool,
    /// A standby coordinator tails the nodes' change feeds (`coordinator::tail`) and leads
    /// from its registry when it wins an election.
    pub standby_tail: bool,
    /// The tail pulls a node whole again when it answers from another store (a new disk).
    pub tail_checks_store: bool,
    /// The tail's registry is served only when a whole holder answered whole.
    pub tail_needs_whole: bool,
    /// A node's catch-up takes from each peer only what changed since its last pull from
    /// it (`subcopies::pull_subscriptions`), when the peer's store and the placers are
    /// the same.
    pub catch_up_by_feed: bool,
    /// A node taken for dead while it still ran (paused, cut off) is not whole when it is
    /// back: it missed the changes made meanwhile, yet it never registered again, so its
    /// catch-up of the registration before stood (`bench chaos` seed 56146).
    pub lapse_not_whole: bool,
    /// A tail resuming after its leadership sets the ids the leadership wrote to what a
    /// whole holder holds (a write whose replication failed is undone).
    pub resume_undoes_journal: bool,
}

impl Rules {
    pub const FIXED: Rules = Rules {
        versions: true,
        merged_rebuild: true,
        whole_when_caught_up: true,
        resizes: true,
        pull_step: true,
        joint_holders: true,
        departed_placers: true,
        standby_tail: true,
        tail_checks_store: true,
        tail_needs_whole: true,
        catch_up_by_feed: true,
        lapse_not_whole: true,
        resume_undoes_journal: true,
    };
}

/// One node's subscription copies.
#[derive(Debug, Default, Clone)]
pub(super) struct Node {
    pub(super) up: bool,
    /// Taken for dead while it runs on (paused past its lease, cut off): its disk, its
    /// registration and its catch-up stay as they were.
    paused: bool,
    /// Pulled what its position must hold since it came back (or learned a new layout).
    pub(super) caught_up: bool,
    /// The layout and resize step it last learned (from a heartbeat or its registration).
    pub(super) known: Option<(Layout, u64)>,
    /// The resize step its last catch-up was for (what its heartbeats report).
    pub(super) reported: u64,
    /// id -> (revision, placed by).
    copies: BTreeMap<u64, (u64, u32)>,
    tombs: BTreeSet<u64>,
    /// The store's identity (another after a wipe) and its change feed: number -> id,
    /// each id at its newest change (`storage::Store::subscription_changes`).
    pub(super) store: u64,
    pub(super) feed: BTreeMap<u64, u64>,
    feed_of: BTreeMap<u64, u64>,
    /// peer -> (its store, its last change pulled, the placers pulled for).
    cursors: BTreeMap<u32, (u64, u64, BTreeSet<u32>)>,
}

impl Node {
    pub(super) fn held(&self, id: u64) -> Held {
        if self.tombs.contains(&id) {
            Held::Deleted
        } else {
            self.copies
                .get(&id)
                .map_or(Held::Absent, |c| Held::Revision(c.0))
        }
    }

    /// `Store::apply_subscription_copy_unflushed`, or (unversioned) what the store did
    /// before revisions: a placement always written, an update wherever a copy is held.
    fn apply(
        &mut self,
        rules: Rules,
        id: u64,
        rev: u64,
        placed_by: Option<u32>,
        only_if_held: bool,
    ) {
        let held = self.held(id);
        if only_if_held && !matches!(held, Held::Revision(_)) {
            return;
        }
        if rules.versions && !replaces(held, rev) {
            return;
        }
        let by = placed_by.or(self.copies.get(&id).map(|c| c.1)).unwrap_or(0);
        self.copies.insert(id, (rev, by));
        self.note(id);
    }

    fn delete(&mut self, rules: Rules, id: u64) {
        let existed = self.copies.remove(&id).is_some();
        let new_tombstone = rules.versions && self.tombs.insert(id);
        // a deletion known already is no change
        if existed || new_tombstone {
            self.note(id);
        }
    }

    /// Numbers a change of `id` in the feed.
    fn note(&mut self, id: u64) {
        let n = self.feed.last_key_value().map_or(1, |(n, _)| n + 1);
        if let Some(old) = self.feed_of.insert(id, n) {
            self.feed.remove(&old);
        }
        self.feed.insert(n, id);
    }

    /// The last change's number.
    pub(super) fn last_change(&self) -> u64 {
        self.feed.last_key_value().map_or(0, |(n, _)| *n)
    }

    /// What changed after change `after`, as each is now (`subscription_changes`).
    pub(super) fn changes(&self, after: u64, changed_only: bool) -> Vec<SubCopy> {
        let listed: BTreeMap<u64, SubCopy> = self
            .list(changed_only)
            .into_iter()
            .map(|c| (c.id, c))
            .collect();
        self.feed
            .range(after + 1..)
            .filter_map(|(_, id)| listed.get(id).cloned())
            .collect()
    }

    /// The tombstones held.
    pub(super) fn tombstones(&self) -> &BTreeSet<u64> {
        &self.tombs
    }

    /// `Store::subscription_copies` over every placer.
    pub(super) fn list(&self, changed_only: bool) -> Vec<SubCopy> {
        let mut out: Vec<SubCopy> = self
            .copies
            .iter()
            .filter(|(id, c)| !changed_only || c.0 > **id)
            .map(|(&id, &(revision, by))| SubCopy {
                id,
                revision,
                placed_by: Some(by),
                record: Some(revision.to_be_bytes().to_vec()),
            })
            .collect();
        out.extend(self.tombs.iter().map(|&id| SubCopy {
            id,
            revision: 0,
            placed_by: None,
            record: None,
        }));
        out
    }
}

/// The registry's truth and who was told each change.
#[derive(Debug, Default)]
pub(super) struct Truth {
    live: BTreeMap<u64, u64>,
    deleted: BTreeSet<u64>,
    /// id -> nodes told the newest version or the deletion (their disk kept since).
    pub(super) witnesses: BTreeMap<u64, BTreeSet<u32>>,
    counter: u64,
}

/// A violation of the oracle, with what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    Resurrected {
        id: u64,
    },
    Stale {
        id: u64,
        served: u64,
        newest: u64,
    },
    Lost {
        id: u64,
    },
    /// Served a subscription, or a version of one, that no Create or Update acknowledged.
    Unacknowledged {
        id: u64,
        served: u64,
    },
}

/// What one schedule did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub steps: usize,
    pub rebuilds: usize,
    pub violations: Vec<Violation>,
    /// Resizes committed.
    pub resizes: usize,
    /// Elections the standby won and served from its tail's registry.
    pub tail_elections: usize,
    /// Times the standby's tail resumed from its saved state after leading.
    pub resumes: usize,
}

/// The simulated cluster of one schedule.
pub(super) struct Cluster {
    /// The grid in force, and the one a resize moves to (with its step).
    pub(super) grid: Grid,
    pub(super) next: Option<Grid>,
    pub(super) step: u64,
    pub(super) rules: Rules,
    /// Every position of any grid a schedule draws.
    pub(super) nodes: Vec<Node>,
    pub(super) truth: Truth,
    /// Disks handed out so far (each node's store identity is one).
    pub(super) disks: u64,
    /// The standby coordinator that tails the nodes (`sim/tail.rs`).
    pub(super) standby: super::tail::Standby,
}

/// The grids a schedule starts on or resizes to.
pub(super) const SHAPES: [(u32, u32); 5] = [(1, 3), (2, 2), (2, 3), (3, 3), (3, 2)];

impl Cluster {
    pub(super) fn layout(&self) -> Layout {
        Layout::new(self.grid, self.next)
    }

    pub(super) fn up(&self) -> Vec<u32> {
        (0..self.layout().len())
            .filter(|&n| self.nodes[n as usize].up)
            .collect()
    }

    fn next_rev(&mut self) -> u64 {
        self.truth.counter += 1;
        self.truth.counter
    }

    /// `Create` through node `via`: its column quorum's live members take the copy, in the
    /// layout `via` knows (it may not have heard of a resize yet).
    fn create(&mut self, via: u32) {
        let id = self.next_rev();
        if self.standby.leading {
            self.standby.led_write(id, id);
        }
        self.truth.live.insert(id, id);
        let mut told = BTreeSet::new();
        let layout = self.nodes[via as usize]
            .known
            .map_or(self.layout(), |(l, _)| l);
        for n in self.quorum(layout, via) {
            if self.nodes[n as usize].up {
                self.nodes[n as usize].apply(self.rules, id, id, Some(via), false);
                told.insert(n);
            }
        }
        self.truth.witnesses.insert(id, told);
    }

    /// A `Create` the leader stored whose replication failed: no node took it, and it was
    /// not acknowledged.
    fn create_failed(&mut self) {
        let id = self.next_rev();
        self.standby.led_write(id, id);
    }

    /// An `Update` the leader stored whose replication failed.
    fn update_failed(&mut self, id: u64) {
        let rev = self.next_rev();
        self.standby.led_write(id, rev);
    }

    /// `Update`: every live node holding a copy replaces it.
    fn update(&mut self, id: u64) {
        let rev = self.next_rev();
        if self.standby.leading {
            self.standby.led_write(id, rev);
        }
        self.truth.live.insert(id, rev);
        let mut told = BTreeSet::new();
        for n in self.up() {
            let node = &mut self.nodes[n as usize];
            if node.copies.contains_key(&id) {
                node.apply(self.rules, id, rev, None, true);
                told.insert(n);
            }
        }
        self.truth.witnesses.insert(id, told);
    }

    /// `Delete`: every live node drops its copy (leaving a tombstone).
    fn delete(&mut self, id: u64) {
        if self.standby.leading {
            self.standby.led_delete(id);
        }
        self.truth.live.remove(&id);
        self.truth.deleted.insert(id);
        let up = self.up();
        for &n in &up {
            self.nodes[n as usize].delete(self.rules, id);
        }
        self.truth.witnesses.insert(id, up.into_iter().collect());
    }

    fn kill(&mut self, n: u32) {
        self.nodes[n as usize].up = false;
    }

    /// Node `n` taken for dead while it runs on: nothing reaches it until it is back.
    fn pause(&mut self, n: u32) {
        let node = &mut self.nodes[n as usize];
        node.up = false;
        node.paused = true;
    }

    /// A paused node back: live again under the registration it had, having missed what
    /// changed meanwhile; under the fix its answered heartbeat finds the lapse, and it is
    /// not whole until it caught up again.
    fn resume(&mut self, n: u32) {
        let node = &mut self.nodes[n as usize];
        node.up = true;
        node.paused = false;
        if self.rules.lapse_not_whole {
            node.caught_up = false;
        }
    }

    /// A node back (with a fresh disk if `wiped`): live, so it takes new changes, but not
    /// caught up yet.
    fn rejoin(&mut self, n: u32, wiped: bool) {
        self.nodes[n as usize].paused = false;
        if wiped {
            self.disks += 1;
            self.nodes[n as usize] = Node {
                store: self.disks,
                ..Node::default()
            };
            for w in self.truth.witnesses.values_mut() {
                w.remove(&n);
            }
        }
        let known = Some((self.layout(), self.step));
        let node = &mut self.nodes[n as usize];
        node.up = true;
        node.caught_up = false;
        // its registration answers the layout; what it reported before is forgotten
        node.known = known;
        node.reported = 0;
    }

    /// Where a subscription created through `via` goes in `layout`
    /// (`Layout::subscription_quorum`, or without the joint holders the plain union).
    fn quorum(&self, layout: Layout, via: u32) -> Vec<u32> {
        if self.rules.joint_holders {
            return layout.subscription_quorum(via);
        }
        let grids = std::iter::once(layout.grid).chain(layout.next);
        let mut q: Vec<u32> = grids
            .filter(|g| g.contains(via))
            .flat_map(|g| g.subscription_quorum(via))
            .collect();
        q.sort_unstable();
        q.dedup();
        q
    }

    /// The placers whose copies `n` pulls (`Layout::placers_held_by`, or without the
    /// departed placers only the positions whose quorum holds it).
    fn placers(&self, layout: Layout, n: u32) -> BTreeSet<u32> {
        let mut v: BTreeSet<u32> = (0..layout.len())
            .filter(|&q| self.quorum(layout, q).contains(&n))
            .collect();
        if self.rules.departed_placers {
            let all: BTreeSet<u32> = layout.placers_held_by(n).into_iter().collect();
            v.extend(all.into_iter().filter(|&q| q >= layout.len()));
        }
        v
    }

    /// The state, one line (for `DISSEM_SIM_TRACE`): the layout, and per position whether
    /// it is up (U), paused (p) or down (d), and caught up (C), the step it reported and
    /// its copies (id.rev.placer).
    fn describe(&self) -> String {
        let nodes: Vec<String> = (0..self.layout().len())
            .map(|p| {
                let n = &self.nodes[p as usize];
                let copies: Vec<String> = n
                    .copies
                    .iter()
                    .map(|(id, (rev, by))| format!("{id}.{rev}.{by}"))
                    .collect();
                format!(
                    "n{p}:{}{}r{}[{}]",
                    match (n.up, n.paused) {
                        (true, _) => "U",
                        (false, true) => "p",
                        (false, false) => "d",
                    },
                    if n.caught_up { "C" } else { "-" },
                    n.reported,
                    copies.join(",")
                )
            })
            .collect();
        format!("{} step {} | {}", self.layout(), self.step, nodes.join(" "))
    }

    /// Node 0 or n-1 taken as holding everything: live, and (under the fix) caught up.
    pub(super) fn whole(&self, f: u32) -> bool {
        let node = &self.nodes[f as usize];
        node.up && (node.caught_up || !self.rules.whole_when_caught_up)
    }

    /// A live node's catch-up, as `subcopies` does it: from the first whole holder, else
    /// from every live node. Without a whole holder the node is caught up only when every
    /// other position answered (a create made while node 0 and node n-1 were both down is
    /// held by its column alone); else it tries again later.
    fn catch_up(&mut self, n: u32) {
        let g = self.layout();
        self.nodes[n as usize].known = Some((g, self.step));
        let placers = self.placers(g, n);
        let full: Vec<u32> = g
            .whole_holders()
            .into_iter()
            .filter(|&f| f != n && self.whole(f))
            .take(1)
            .collect();
        let pulled = !full.is_empty() || self.up().len() == g.len() as usize;
        let sources: Vec<u32> = if full.is_empty() {
            self.up().into_iter().filter(|&s| s != n).collect()
        } else {
            full
        };
        for s in sources {
            let peer = &self.nodes[s as usize];
            let listed = match self.nodes[n as usize].cursors.get(&s) {
                Some((store, at, pulled_for))
                    if self.rules.catch_up_by_feed
                        && *store == peer.store
                        && *pulled_for == placers =>
                {
                    peer.changes(*at, false)
                }
                _ => peer.list(false),
            };
            let cursor = (peer.store, peer.last_change(), placers.clone());
            self.nodes[n as usize].cursors.insert(s, cursor);
            for c in listed {
                let node = &mut self.nodes[n as usize];
                match c.record {
                    None => node.delete(self.rules, c.id),
                    // before revisions the catch-up took only what the node lacked
                    Some(_)
                        if c.placed_by.is_some_and(|p| placers.contains(&p))
                            && (self.rules.versions || !node.copies.contains_key(&c.id)) =>
                    {
                        node.apply(self.rules, c.id, c.revision, c.placed_by, false);
                    }
                    Some(_) => {}
                }
            }
        }
        self.nodes[n as usize].caught_up = pulled;
        if pulled {
            self.nodes[n as usize].reported = self.step;
        }
    }

    /// A new leader's registry, as `rebuild` makes it from the live nodes.
    pub(super) fn rebuild(&self) -> BTreeMap<u64, u64> {
        let up = self.up();
        let ends: BTreeSet<u32> = self.layout().whole_holders().into_iter().collect();
        let whole: Vec<u32> = ends.iter().copied().filter(|&f| self.whole(f)).collect();
        if !self.rules.merged_rebuild {
            // before: the first whole holder alone, else the union (later nodes win)
            let mut out = BTreeMap::new();
            let from: Vec<u32> = whole.first().map_or(up.clone(), |&f| vec![f]);
            for s in from {
                for c in self.nodes[s as usize].list(false) {
                    if c.record.is_some() {
                        out.insert(c.id, c.revision);
                    }
                }
            }
            return out;
        }
        let mut merged = Newest::default();
        // one whole holder listed in full, the other what changed since Creates (both in
        // full with neither whole)
        let listed = whole.iter().copied().find(|f| up.contains(f));
        for &f in ends.iter().filter(|f| up.contains(f)) {
            let changed_only = listed.is_some_and(|l| l != f);
            for c in self.nodes[f as usize].list(changed_only) {
                merged.offer(c);
            }
        }
        for &n in up.iter().filter(|n| !ends.contains(n)) {
            for c in self.nodes[n as usize].list(!whole.is_empty()) {
                merged.offer(c);
            }
        }
        let (records, _) = merged.into_parts();
        records.into_iter().map(|(id, rev, _)| (id, rev)).collect()
    }

    /// The oracle, on a new leader's registry.
    pub(super) fn check(&self, registry: &BTreeMap<u64, u64>, out: &mut Vec<Violation>) {
        let up: BTreeSet<u32> = self.up().into_iter().collect();
        let witnessed = |id: u64| {
            self.truth
                .witnesses
                .get(&id)
                .is_some_and(|w| w.iter().any(|n| up.contains(n)))
        };
        for (&id, &served) in registry {
            if !self.truth.deleted.contains(&id)
                && self
                    .truth
                    .live
                    .get(&id)
                    .is_none_or(|&newest| served > newest)
            {
                out.push(Violation::Unacknowledged { id, served });
            } else if self.truth.deleted.contains(&id) {
                if witnessed(id) {
                    out.push(Violation::Resurrected { id });
                }
            } else if let Some(&newest) = self.truth.live.get(&id)
                && served < newest
                && witnessed(id)
            {
                out.push(Violation::Stale { id, served, newest });
            }
        }
        for &id in self.truth.live.keys() {
            if !registry.contains_key(&id) && witnessed(id) {
                out.push(Violation::Lost { id });
            }
        }
    }
}

/// Runs the schedule of `seed` under `rules`.
pub fn run(seed: u64, rules: Rules) -> Outcome {
    let mut rng = Rng::new(seed);
    let grid = super::resize::shape(&mut rng);
    let positions = SHAPES.iter().map(|(r, c)| r * c).max().unwrap_or(0);
    let mut nodes: Vec<Node> = (0..positions)
        .map(|p| Node {
            store: u64::from(p) + 1,
            ..Node::default()
        })
        .collect();
    for n in nodes.iter_mut().take(grid.len() as usize) {
        n.up = true;
        n.caught_up = true;
        n.known = Some((Layout::fixed(grid), 0));
    }
    let mut c = Cluster {
        grid,
        next: None,
        step: 0,
        rules,
        nodes,
        truth: Truth::default(),
        disks: u64::from(positions),
        standby: super::tail::Standby::default(),
    };
    let mut out = Outcome::default();
    // DISSEM_SIM_TRACE=1 with DISSEM_SIM_SEED=S: every step of the replayed schedules
    let trace = std::env::var_os("DISSEM_SIM_TRACE").is_some();
    let steps = if rules.resizes {
        40 + rng.below(80) as usize
    } else {
        20 + rng.below(40) as usize
    };
    for _ in 0..steps {
        out.steps += 1;
        let up = c.up();
        let down: Vec<u32> = (0..c.layout().len()).filter(|n| !up.contains(n)).collect();
        let live: Vec<u64> = c.truth.live.keys().copied().collect();
        let draw = if rules.resizes {
            rng.below(140)
        } else {
            rng.below(100)
        };
        // the standby tails the nodes now and then, between any two steps
        if rules.standby_tail && !c.standby.leading && rng.below(6) == 0 {
            c.standby_round();
        }
        if trace {
            eprintln!("{seed} step {}: draw {draw}; {}", out.steps, c.describe());
        }
        match draw {
            // while the standby leads, some of its writes never reach a node
            0..=24 if c.standby.leading && rng.below(4) == 0 => c.create_failed(),
            0..=24 => {
                if let Some(via) = rng.pick(&up) {
                    c.create(via);
                }
            }
            25..=39 if c.standby.leading && rng.below(4) == 0 => {
                if let Some(id) = rng.pick(&live) {
                    c.update_failed(id);
                }
            }
            25..=39 => {
                if let Some(id) = rng.pick(&live) {
                    c.update(id);
                }
            }
            40..=51 => {
                if let Some(id) = rng.pick(&live) {
                    c.delete(id);
                }
            }
            52..=69 => {
                // never the last live node: changes go through nodes
                if up.len() > 1
                    && let Some(n) = rng.pick(&up)
                {
                    if rng.below(3) == 0 {
                        c.pause(n);
                    } else {
                        c.kill(n);
                    }
                }
            }
            70..=81 => {
                if let Some(n) = rng.pick(&down) {
                    if c.nodes[n as usize].paused {
                        c.resume(n);
                    } else {
                        let wiped = rng.below(5) == 0;
                        c.rejoin(n, wiped);
                    }
                }
            }
            82..=87 => {
                let behind: Vec<u32> = up
                    .iter()
                    .copied()
                    .filter(|&n| !c.nodes[n as usize].caught_up)
                    .collect();
                if let Some(n) = rng.pick(&behind) {
                    c.catch_up(n);
                }
            }
            88..=99 => {
                out.rebuilds += 1;
                // whoever led before is deposed
                c.standby.leading = false;
                // the standby wins half the elections (from its tail when it has a base)
                let registry = if rules.standby_tail && rng.below(2) == 0 {
                    let (registry, from_tail) = c.standby_leads();
                    out.tail_elections += usize::from(from_tail);
                    registry
                } else {
                    c.rebuild()
                };
                c.check(&registry, &mut out.violations);
            }
            100..=105 => c.start_resize(&mut rng),
            106..=111 => {
                // one node's heartbeat ahead of the others'
                if let Some(n) = rng.pick(&up) {
                    c.learn(n);
                }
            }
            112..=125 => {
                // a round of heartbeats, then the leader steps the move on
                for n in up {
                    c.learn(n);
                }
                out.resizes += usize::from(c.advance());
            }
            _ => {
                // the catch-ups that are due, in a random order
                let mut behind: Vec<u32> = up
                    .into_iter()
                    .filter(|&n| !c.nodes[n as usize].caught_up)
                    .collect();
                while let Some(n) = rng.pick(&behind) {
                    behind.retain(|&b| b != n);
                    c.catch_up(n);
                }
                out.resizes += usize::from(c.advance());
            }
        }
    }
    out.rebuilds += 1;
    let registry = c.rebuild();
    c.check(&registry, &mut out.violations);
    out.resumes = c.standby.resumed;
    out
}

/// The first seed from `base` (of `count`) whose schedule fails under `rules`.
pub fn first_failure(base: u64, count: u64, rules: Rules) -> Option<(u64, Vec<Violation>)> {
    (base..base + count).find_map(|seed| {
        let o = run(seed, rules);
        (!o.violations.is_empty()).then_some((seed, o.violations))
    })
}

#[cfg(test)]
mod checks;
