//! An online grid resize (`dissem grid resize`, issue 33), sans I/O: the protocol's side of
//! moving a running cluster from one grid to another without stopping writers or
//! subscribers.
//!
//! A move goes through joint quorums (`runtime::grid::Layout`): from its start every node is
//! told both grids, and from the moment a node knows them it copies what it writes to the
//! quorums of both. Two steps make the new quorums whole before the commit drops the old:
//!
//! 1. **Learn.** Every node catches up under both grids and reports step 1. Once every live
//!    node did (and every position of the new grid is held), no node writes to the old
//!    quorums alone any more.
//! 2. **Pull.** Every node catches up again (its catch-up now sees everything written
//!    before step 1 ended, and the joint writes reach it anyway) and reports step 2.
//!
//! The commit waits for step 2 at every position of the new grid, and for every node outside
//! it to be drained (it refuses puts once it learns it leaves and disseminates what it
//! took). The driver records the move's target in etcd at the start and the new grid at the
//! commit, so a new leader resumes a move (from step 1) and never half-applies one.

use runtime::grid::Grid;

use crate::protocol::Protocol;

/// Where a resize stands, for `Admin.ResizeGrid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizeStatus {
    /// The grid in force.
    pub grid: Option<Grid>,
    /// The grid moved to, while a move is under way.
    pub moving_to: Option<Grid>,
    /// The move's step (1 learn, 2 pull).
    pub step: u64,
    /// What the next step waits for, one line per node.
    pub waiting: Vec<String>,
}

impl Protocol {
    /// Whether a move to `to` would start now (`Ok(false)`: it is the grid in force, or the
    /// move under way already). Refused without a grid, and while a move to another grid is
    /// under way.
    pub fn check_resize(&self, to: Grid) -> Result<bool, String> {
        let Some(g) = self.grid else {
            return Err(
                "this cluster has no grid: its coordinators were started without \
                        --grid (a single node has nothing to move)"
                    .into(),
            );
        };
        match self.next {
            Some(n) if n == to => Ok(false),
            Some(n) => Err(format!(
                "a resize from {g} to {n} is under way: wait until it is committed, then \
                 resize again"
            )),
            None => Ok(to != g),
        }
    }

    /// Starts moving to `to` when [`Protocol::check_resize`] says so (`Ok(true)`).
    pub fn start_resize(&mut self, to: Grid) -> Result<bool, String> {
        let start = self.check_resize(to)?;
        if start {
            self.resume_resize(Some(to));
        }
        Ok(start)
    }

    /// The move's step (0: none under way).
    pub fn resize_step(&self) -> u64 {
        self.resize_step
    }

    /// Takes up the move to `next` that etcd records (a leader that just won): from step 1.
    pub fn resume_resize(&mut self, next: Option<Grid>) {
        self.next = next.filter(|n| Some(*n) != self.grid);
        self.resize_step = u64::from(self.next.is_some());
    }

    /// Where the move stands at `now`.
    pub fn resize_status(&self, now: u64) -> ResizeStatus {
        ResizeStatus {
            grid: self.grid,
            moving_to: self.next,
            step: self.resize_step,
            waiting: self.waiting(now),
        }
    }

    /// What the current step waits for.
    fn waiting(&self, now: u64) -> Vec<String> {
        let (Some(g), Some(to)) = (self.grid, self.next) else {
            return Vec::new();
        };
        let step = self.resize_step;
        let alive = |seen: u64| now.saturating_sub(seen) <= self.node_lease_ms;
        let mut out = Vec::new();
        for p in 0..to.len() {
            match self.nodes.get(&p) {
                None => out.push(format!("node {p}: not registered (start a node at {p})")),
                Some(n) if !alive(n.seen) => {
                    out.push(format!("node {p}: not heard from within the node lease"))
                }
                Some(n) if n.caught_up != step => {
                    out.push(format!("node {p}: catching up its copies (step {step})"))
                }
                Some(_) => {}
            }
        }
        for (&p, n) in self.nodes.range(to.len()..g.len().max(to.len())) {
            if step == 1 && alive(n.seen) && n.caught_up != step {
                out.push(format!("node {p}: learning the new grid"));
            } else if step == 2 && !n.drained {
                out.push(if alive(n.seen) {
                    format!("node {p}: draining (it leaves the grid)")
                } else {
                    format!("node {p}: down before it drained (start it again: it drains)")
                });
            }
        }
        out
    }

    /// Steps the move on at `now`: from step 1 to 2 once nothing waits; the answer is the
    /// grid to commit once step 2 waits for nothing (the driver records it, then calls
    /// [`Protocol::commit_resize`]).
    pub fn advance_resize(&mut self, now: u64) -> Option<Grid> {
        let to = self.next?;
        if !self.waiting(now).is_empty() {
            return None;
        }
        if self.resize_step == 1 {
            self.resize_step = 2;
            return None;
        }
        Some(to)
    }

    /// Makes `to` the grid in force (when it is the move under way): nodes outside it leave
    /// the membership, and their heirs go.
    pub fn commit_resize(&mut self, to: Grid) {
        if self.next != Some(to) {
            return;
        }
        self.grid = Some(to);
        self.next = None;
        self.resize_step = 0;
        self.nodes.retain(|p, _| to.contains(*p));
        self.heirs.retain(|p, h| to.contains(*p) && to.contains(*h));
        for n in self.nodes.values_mut() {
            n.caught_up = 0;
            n.drained = false;
        }
    }
}
