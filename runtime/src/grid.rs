//! The xS-grid of quorum replication (DESIGN §7, seed 000): nodes laid out in a `t x w` grid,
//! node `k` at row `k / w`, column `k % w`. An object is replicated on the row quorum R(i) of
//! the node that took it (R(i) ∪ C(j) for critical priorities), a subscription on the column
//! quorum C(j). Every R(i) meets every C(j), so a publication always meets every subscription
//! on some node, and any two row quorums meet.
//!
//! Pure arithmetic: the coordinator (membership), the node (where copies go, who takes over a
//! dead node's outbox) and the benchmarks share it.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// A `rows x cols` grid of node positions (node ids are positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grid {
    pub rows: u32,
    pub cols: u32,
}

/// The most positions a grid may have (a bound on the `--grid` flag).
pub const MAX_POSITIONS: u32 = 4096;

impl Grid {
    /// A grid of `rows x cols` positions (both at least 1, at most [`MAX_POSITIONS`] in all).
    pub fn new(rows: u32, cols: u32) -> Result<Grid, String> {
        if rows == 0 || cols == 0 {
            return Err(format!(
                "{rows}x{cols}: rows and columns must be at least 1"
            ));
        }
        if rows.saturating_mul(cols) > MAX_POSITIONS {
            return Err(format!(
                "{rows}x{cols}: at most {MAX_POSITIONS} positions in all"
            ));
        }
        Ok(Grid { rows, cols })
    }

    /// Positions (node ids `0..len`).
    pub fn len(&self) -> u32 {
        self.rows * self.cols
    }

    /// Whether the grid has no position (never: [`Grid::new`] refuses it).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `node` is a position of the grid.
    pub fn contains(&self, node: u32) -> bool {
        node < self.len()
    }

    /// (row, column) of `node`.
    pub fn position(&self, node: u32) -> (u32, u32) {
        (node / self.cols, node % self.cols)
    }

    fn at(&self, row: u32, col: u32) -> u32 {
        row * self.cols + col
    }

    /// The row quorum R(i) in its takeover order: row i from column 0 on, then column 0 from
    /// row i - 1 up to row 0, then the last column from row i + 1 down to the last row.
    pub fn row_quorum(&self, row: u32) -> Vec<u32> {
        let last = self.cols - 1;
        let mut q: Vec<u32> = (0..self.cols).map(|c| self.at(row, c)).collect();
        q.extend((0..row).rev().map(|r| self.at(r, 0)));
        q.extend((row + 1..self.rows).map(|r| self.at(r, last)));
        dedup(q)
    }

    /// The column quorum C(j): column j from row 0 on, then row 0 from column j - 1 back to
    /// column 0, then the last row from column j + 1 to the last column.
    pub fn column_quorum(&self, col: u32) -> Vec<u32> {
        let last = self.rows - 1;
        let mut q: Vec<u32> = (0..self.rows).map(|r| self.at(r, col)).collect();
        q.extend((0..col).rev().map(|c| self.at(0, c)));
        q.extend((col + 1..self.cols).map(|c| self.at(last, c)));
        dedup(q)
    }

    /// The xS quorum of `node`: R(i) ∪ C(j), R(i) first (in its order), then the rest of C(j).
    pub fn xs_quorum(&self, node: u32) -> Vec<u32> {
        let (i, j) = self.position(node);
        let mut q = self.row_quorum(i);
        q.extend(self.column_quorum(j));
        dedup(q)
    }

    /// Where an object taken by `node` is replicated: R(i), or R(i) ∪ C(j) when `critical`.
    pub fn object_quorum(&self, node: u32, critical: bool) -> Vec<u32> {
        if critical {
            self.xs_quorum(node)
        } else {
            self.row_quorum(self.position(node).0)
        }
    }

    /// Where a subscription created through `node` is stored: C(j).
    pub fn subscription_quorum(&self, node: u32) -> Vec<u32> {
        self.column_quorum(self.position(node).1)
    }

    /// The nodes whose object quorum (row or xS) holds `node`: the origins `node` keeps
    /// copies for.
    pub fn origins_held_by(&self, node: u32) -> Vec<u32> {
        (0..self.len())
            .filter(|&o| o != node && self.xs_quorum(o).contains(&node))
            .collect()
    }

    /// The node that takes over the outbox of `dead`: the first member of its xS quorum in
    /// [`Grid::xs_quorum`]'s order (R(i) in [`Grid::row_quorum`]'s order, then the rest of
    /// C(j)), other than `dead`, that `alive` says is alive; `None` when none is. A member of
    /// R(i) holds every copy, so while one lives it is the successor; past R(i) only the
    /// copies of critical objects are left, and a member of C(j) holds them.
    pub fn successor(&self, dead: u32, alive: impl Fn(u32) -> bool) -> Option<u32> {
        self.xs_quorum(dead)
            .into_iter()
            .find(|&n| n != dead && alive(n))
    }

    /// The seed's expected size of R(i) ∩ C(j) over all positions:
    /// `(3(t-2)(w-2) + (t-2)(t+3) + (w-1)(w+2) + 2(t+w-1)) / (t*w)`.
    pub fn expected_intersection(&self) -> f64 {
        let (t, w) = (f64::from(self.rows), f64::from(self.cols));
        (3.0 * (t - 2.0) * (w - 2.0)
            + (t - 2.0) * (t + 3.0)
            + (w - 1.0) * (w + 2.0)
            + 2.0 * (t + w - 1.0))
            / (t * w)
    }
}

/// The grid a cluster runs on and, while an online resize moves it (`dissem grid resize`),
/// the grid it moves to. Until the move is committed every quorum is the union of the
/// quorums of the two grids (joint quorums, as in Raft's joint consensus): a copy goes to
/// both, a catch-up or a takeover asks both, so the new quorums are whole when the old
/// ones are dropped. Node ids stay what they are; a resize by columns moves positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    /// The grid in force.
    pub grid: Grid,
    /// The grid a resize moves to, until it is committed.
    pub next: Option<Grid>,
}

impl Layout {
    /// `grid`, moving to `next` (a `next` equal to `grid` is no move).
    pub fn new(grid: Grid, next: Option<Grid>) -> Layout {
        Layout {
            grid,
            next: next.filter(|n| *n != grid),
        }
    }

    /// One grid, no move.
    pub fn fixed(grid: Grid) -> Layout {
        Layout { grid, next: None }
    }

    fn grids(&self) -> impl Iterator<Item = Grid> + '_ {
        std::iter::once(self.grid).chain(self.next)
    }

    /// Node ids of either grid are `0..len`.
    pub fn len(&self) -> u32 {
        self.grids().map(|g| g.len()).max().unwrap_or(0)
    }

    /// Whether the layout has no position (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `node` is a position of either grid.
    pub fn contains(&self, node: u32) -> bool {
        self.grids().any(|g| g.contains(node))
    }

    /// Whether `node` is a position of the grid the cluster moves to (of the grid in force
    /// when none): a node outside it leaves at the commit.
    pub fn stays(&self, node: u32) -> bool {
        self.next.unwrap_or(self.grid).contains(node)
    }

    /// (row, column) of `node` in the grid it moves to, else in the grid in force.
    pub fn position(&self, node: u32) -> (u32, u32) {
        match self.next.filter(|n| n.contains(node)) {
            Some(n) => n.position(node),
            None => self.grid.position(node),
        }
    }

    fn union(&self, node: u32, f: impl Fn(&Grid) -> Vec<u32>) -> Vec<u32> {
        dedup(
            self.grids()
                .filter(|g| g.contains(node))
                .flat_map(|g| f(&g))
                .collect(),
        )
    }

    /// [`Grid::xs_quorum`] in both grids: the grid in force's order first.
    pub fn xs_quorum(&self, node: u32) -> Vec<u32> {
        self.union(node, |g| g.xs_quorum(node))
    }

    /// [`Grid::object_quorum`] in both grids.
    pub fn object_quorum(&self, node: u32, critical: bool) -> Vec<u32> {
        self.union(node, |g| g.object_quorum(node, critical))
    }

    /// [`Grid::subscription_quorum`] in both grids, and during a move node 0 and the last
    /// node of each grid besides: a node of the new grid alone has no column in the old one,
    /// yet a rebuild before the commit trusts the old grid's two to hold every subscription,
    /// and one after it the new grid's (found by the simulated schedules,
    /// `coordinator/src/sim/copies.rs`).
    pub fn subscription_quorum(&self, node: u32) -> Vec<u32> {
        let mut q = self.union(node, |g| g.subscription_quorum(node));
        if self.next.is_some() {
            q.extend(self.every_whole_holder());
        }
        dedup(q)
    }

    /// The placers whose subscriptions `node` holds copies of: every position whose
    /// [`Layout::subscription_quorum`] holds it, and for node 0 and the last node (of either
    /// grid) every position past the layout too: a node that left the grid in a resize
    /// placed subscriptions no column holds any more, and those two keep them (found by the
    /// simulated schedules, `coordinator/src/sim/copies.rs`).
    pub fn placers_held_by(&self, node: u32) -> Vec<u32> {
        let mut v: Vec<u32> = (0..self.len())
            .filter(|&q| self.subscription_quorum(q).contains(&node))
            .collect();
        if self.every_whole_holder().contains(&node) {
            v.extend(self.len()..MAX_POSITIONS);
        }
        v
    }

    /// Node 0 and the last node of each grid.
    fn every_whole_holder(&self) -> Vec<u32> {
        dedup(self.grids().flat_map(|g| [0, g.len() - 1]).collect())
    }

    /// The origins whose quorum, in either grid, holds `node`.
    pub fn origins_held_by(&self, node: u32) -> Vec<u32> {
        (0..self.len())
            .filter(|&o| o != node && self.xs_quorum(o).contains(&node))
            .collect()
    }

    /// [`Grid::successor`] over both grids' quorums of `dead`.
    pub fn successor(&self, dead: u32, alive: impl Fn(u32) -> bool) -> Option<u32> {
        self.xs_quorum(dead)
            .into_iter()
            .find(|&n| n != dead && alive(n))
    }

    /// The nodes that belong to every column quorum of the grid in force, so hold every
    /// subscription once caught up: node 0 and its last node (during a move the new last
    /// node is caught up before the commit makes it one of these).
    pub fn whole_holders(&self) -> [u32; 2] {
        [0, self.grid.len() - 1]
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.next {
            Some(n) => write!(f, "{} moving to {n}", self.grid),
            None => write!(f, "{}", self.grid),
        }
    }
}

fn dedup(q: Vec<u32>) -> Vec<u32> {
    let mut seen = BTreeSet::new();
    q.into_iter().filter(|n| seen.insert(*n)).collect()
}

impl fmt::Display for Grid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.rows, self.cols)
    }
}

impl FromStr for Grid {
    type Err = String;

    /// `TxW`, e.g. `5x6`.
    fn from_str(s: &str) -> Result<Grid, String> {
        let (t, w) = s
            .split_once(['x', 'X'])
            .ok_or_else(|| format!("{s:?}: expected ROWSxCOLS, e.g. 3x3"))?;
        let num = |v: &str| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| format!("{s:?}: {v:?} is not a whole number"))
        };
        Grid::new(num(t)?, num(w)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: Vec<u32>) -> BTreeSet<u32> {
        v.into_iter().collect()
    }

    #[test]
    fn five_by_six_matches_the_seed() {
        let g = Grid::new(5, 6).expect("grid");
        for i in 0..5 {
            assert_eq!(g.row_quorum(i).len(), 10, "R({i})");
        }
        for j in 0..6 {
            assert_eq!(g.column_quorum(j).len(), 10, "C({j})");
        }
        let want = [
            [2, 3, 4, 5, 6, 10],
            [3, 3, 3, 3, 3, 5],
            [4, 3, 3, 3, 3, 4],
            [5, 3, 3, 3, 3, 3],
            [10, 6, 5, 4, 3, 2],
        ];
        let (mut inter, mut union) = (0usize, 0usize);
        for i in 0..5 {
            for j in 0..6 {
                let r = set(g.row_quorum(i));
                let c = set(g.column_quorum(j));
                let n = r.intersection(&c).count();
                assert_eq!(n, want[i as usize][j as usize], "|R({i}) ∩ C({j})|");
                inter += n;
                union += r.union(&c).count();
                assert_eq!(g.xs_quorum(i * 6 + j).len(), r.union(&c).count());
            }
        }
        assert_eq!(inter as f64 / 30.0, 4.0);
        assert_eq!(g.expected_intersection(), 4.0);
        assert_eq!(union as f64 / 30.0, 16.0);
    }

    #[test]
    fn the_formula_equals_brute_force_and_quorums_meet() {
        for t in 2..=9 {
            for w in 2..=9 {
                let g = Grid::new(t, w).expect("grid");
                let mut total = 0usize;
                for i in 0..t {
                    let r = set(g.row_quorum(i));
                    for j in 0..w {
                        let c = set(g.column_quorum(j));
                        let n = r.intersection(&c).count();
                        assert!(n >= 1, "{g}: R({i}) and C({j}) meet");
                        total += n;
                    }
                    for i2 in 0..t {
                        let r2 = set(g.row_quorum(i2));
                        assert!(r.intersection(&r2).count() >= 1, "{g}: R({i}), R({i2})");
                    }
                }
                let brute = total as f64 / f64::from(t * w);
                assert!(
                    (brute - g.expected_intersection()).abs() < 1e-9,
                    "{g}: brute force {brute} against EQOS {}",
                    g.expected_intersection()
                );
            }
        }
    }

    #[test]
    fn every_column_quorum_holds_the_first_and_last_node() {
        let g = Grid::new(3, 4).expect("grid");
        for j in 0..4 {
            let c = g.column_quorum(j);
            assert!(
                c.contains(&0) && c.contains(&(g.len() - 1)),
                "C({j}) = {c:?}"
            );
        }
    }

    #[test]
    fn a_layout_moving_joins_both_grids_quorums() {
        let old = Grid::new(2, 3).expect("grid");
        let new = Grid::new(3, 3).expect("grid");
        let l = Layout::new(old, Some(new));
        assert_eq!(l.len(), 9);
        assert!(l.contains(8) && !Layout::fixed(old).contains(8));
        for n in 0..9 {
            let q = set(l.xs_quorum(n));
            if old.contains(n) {
                assert!(q.is_superset(&set(old.xs_quorum(n))), "{n}");
            }
            assert!(q.is_superset(&set(new.xs_quorum(n))), "{n}");
            assert!(set(l.subscription_quorum(n)).is_superset(&set(new.subscription_quorum(n))));
        }
        // a row quorum in force first: the takeover order stays the old one's
        assert_eq!(l.successor(3, |_| true), old.successor(3, |_| true));
        // a shrink: the leaving node 7 keeps its old quorum, and does not stay
        let shrink = Layout::new(new, Some(old));
        assert_eq!(shrink.xs_quorum(7), new.xs_quorum(7));
        assert!(!shrink.stays(7) && shrink.stays(5));
        assert_eq!(shrink.whole_holders(), [0, 8]);
        // node 8 has no column in 2x3: what is created through it reaches 0 and 5 too
        assert!(set(l.subscription_quorum(8)).is_superset(&set(vec![0, 5])));
        // shrinking, what node 7 places reaches the new last node, 5, which keeps the
        // copies of the positions that leave once the move is done
        assert!(shrink.subscription_quorum(7).contains(&5));
        let after = Layout::fixed(old);
        assert!(after.placers_held_by(5).contains(&7));
        assert!(!after.placers_held_by(4).contains(&7));
        assert_eq!(Layout::new(old, Some(old)).next, None);
        assert_eq!(l.to_string(), "2x3 moving to 3x3");
    }

    #[test]
    fn takeover_order_and_parsing() {
        let g: Grid = "3x3".parse().expect("grid");
        // R(1) = row 1 (3, 4, 5), then column 0 above (0), then the last column below (8)
        assert_eq!(g.row_quorum(1), vec![3, 4, 5, 0, 8]);
        assert_eq!(g.successor(3, |n| n != 4), Some(5));
        assert_eq!(g.successor(3, |_| false), None);
        // past R(1) = [3, 4, 5, 0, 8] comes the rest of C(0): 6, then 7
        assert_eq!(g.successor(3, |n| ![0, 4, 5, 8].contains(&n)), Some(6));
        // for node 4, past R(1) = [3, 4, 5, 0, 8] comes the rest of C(1): 1, 7
        assert_eq!(g.successor(4, |n| [1, 7].contains(&n)), Some(1));
        assert!(g.origins_held_by(0).contains(&1));
        assert_eq!(g.object_quorum(4, false), g.row_quorum(1));
        assert_eq!(g.object_quorum(4, true).len(), 7);
        for bad in ["3", "0x3", "ax3", "100x100"] {
            assert!(bad.parse::<Grid>().is_err(), "{bad}");
        }
        assert_eq!(Grid::new(1, 1).expect("grid").row_quorum(0), vec![0]);
    }
}
