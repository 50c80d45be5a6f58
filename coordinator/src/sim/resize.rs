//! Online grid resizes in the subscription-copy schedules (`sim/copies.rs`), by the rules
//! of `coordinator::resize`: an admin starts a move (new positions join with empty disks),
//! nodes learn the move and its step at their heartbeats (a change leaves their copies not
//! whole until their next catch-up), and the leader steps the move on once every node it
//! waits for reported the step: learn, then pull, then commit (nodes outside the new grid
//! leave with their disks).

use runtime::grid::Grid;
use runtime::rng::Rng;

use super::copies::{Cluster, Node, SHAPES};

/// A grid drawn from [`SHAPES`].
pub(super) fn shape(rng: &mut Rng) -> Grid {
    let (rows, cols) = SHAPES[rng.below(SHAPES.len() as u64) as usize];
    match Grid::new(rows, cols) {
        Ok(g) => g,
        Err(e) => panic!("grid {rows}x{cols}: {e}"),
    }
}

impl Cluster {
    /// `Admin.ResizeGrid` to a drawn grid, when no move is under way: the new positions'
    /// nodes start on empty disks (live, registered, not caught up).
    pub(super) fn start_resize(&mut self, rng: &mut Rng) {
        if self.next.is_some() {
            return;
        }
        let to = shape(rng);
        if to == self.grid {
            return;
        }
        self.next = Some(to);
        self.step = 1;
        let known = Some((self.layout(), self.step));
        for p in self.grid.len()..to.len() {
            let mut fresh = Node::default();
            fresh.up = true;
            fresh.known = known;
            self.nodes[p as usize] = fresh;
        }
        for n in &mut self.nodes {
            n.reported = 0;
        }
    }

    /// A live node's heartbeat answer: it learns the layout and the step; a change starts
    /// its catch-up, so its copies are not whole until that is done.
    pub(super) fn learn(&mut self, n: u32) {
        let now = Some((self.layout(), self.step));
        let node = &mut self.nodes[n as usize];
        if node.known != now {
            node.known = now;
            node.caught_up = false;
        }
    }

    /// The leader after a heartbeat: step 1 ends when every live node and every position
    /// of the new grid reported it, step 2 (or step 1, without the pull step) when every
    /// position of the new grid did; then the new grid is committed and the nodes outside
    /// it leave. `true` when a move was committed.
    pub(super) fn advance(&mut self) -> bool {
        let Some(to) = self.next else { return false };
        let step = self.step;
        let reported = |c: &Cluster, p: u32| {
            let n = &c.nodes[p as usize];
            n.up && n.reported == step
        };
        let positions = (0..to.len()).all(|p| reported(self, p));
        let everyone = self.up().into_iter().all(|p| reported(self, p));
        if !positions || (step == 1 && !everyone) {
            return false;
        }
        if step == 1 && self.rules.pull_step {
            self.step = 2;
            return false;
        }
        let old = self.grid.len();
        self.grid = to;
        self.next = None;
        self.step = 0;
        for p in to.len()..old {
            self.nodes[p as usize] = Node::default();
            for w in self.truth.witnesses.values_mut() {
                w.remove(&p);
            }
        }
        for n in &mut self.nodes {
            n.reported = 0;
        }
        true
    }
}
