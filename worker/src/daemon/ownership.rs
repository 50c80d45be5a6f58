//! Who disseminates which origin's objects, sans I/O (DESIGN §7): the decisions
//! [`super::Daemon::membership_changed`] and a takeover make, as plain state and functions,
//! so that the daemon and the simulated schedules (`daemon/ownsim`) run the same rules. The
//! daemon does the I/O around them: the pulls from holders, the adoption on disk, the pushes.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::replicate::View;

/// The origins whose objects this node took over, besides its own.
#[derive(Debug, Default)]
pub(super) struct Ownership {
    /// Dead origins whose objects this node took over.
    owned: BTreeSet<u32>,
    /// Live origins on a fresh disk whose predecessor's objects (below the sequence number
    /// given) this node took over.
    below: HashMap<u32, u64>,
}

/// A takeover to run: `origin`'s unfinished copies with sequence numbers below `below`
/// (`u64::MAX`: all of them; the origin is dead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TakeOver {
    pub(super) origin: u32,
    pub(super) below: u64,
}

impl Ownership {
    /// Node `me`'s view changed from `old` to `new`: takes dead origins it is the heir of
    /// over, gives back origins that came back (what it adopted stays with it), and answers
    /// the takeovers to run.
    pub(super) fn view_changed(&mut self, me: u32, old: &View, new: &View) -> Vec<TakeOver> {
        let mut out = Vec::new();
        let Some(g) = new.grid else { return out };
        if !g.contains(me) {
            return out;
        }
        // nodes that died since the last view: what they had adopted goes to the owner of
        // its origin now (every takeover runs again where one of its holders died)
        let died: Vec<u32> = new
            .members
            .keys()
            .copied()
            .filter(|&n| new.dead(n) && old.alive(n))
            .collect();
        for origin in 0..g.len() {
            if origin == me {
                continue;
            }
            let owned = self.owned.contains(&origin);
            // the coordinator names one heir per position and keeps it until it dies, so two
            // nodes with views of different ages never take the same objects over
            let heir = new.heirs.get(&origin) == Some(&me);
            let holder_died = died
                .iter()
                .any(|d| *d != origin && g.xs_quorum(origin).contains(d));
            if heir && holder_died {
                let below = if owned && new.dead(origin) {
                    Some(u64::MAX)
                } else {
                    self.below.get(&origin).copied()
                };
                if let Some(below) = below {
                    out.push(TakeOver { origin, below });
                }
            }
            if new.dead(origin) && !owned && heir {
                self.owned.insert(origin);
                tracing::info!("node {origin} is down: taking its objects over");
                out.push(TakeOver {
                    origin,
                    below: u64::MAX,
                });
            } else if owned && (new.alive(origin) || !heir) {
                // the objects adopted so far stay here until they are finished (the origin
                // leaves them out of its outbox when it catches up): one owner each
                self.owned.remove(&origin);
                tracing::info!(
                    "node {origin} is back, or has another heir: no more of its objects taken"
                );
            }
            // a node at this position on a fresh disk: what its predecessor left (copies
            // below its first sequence number) is the heir's, as if that node were dead
            let from = new.owns_from.get(&origin).copied().unwrap_or(0);
            if new.alive(origin) && from > 0 {
                if heir && self.below.get(&origin) != Some(&from) {
                    self.below.insert(origin, from);
                    out.push(TakeOver {
                        origin,
                        below: from,
                    });
                } else if !heir {
                    self.below.remove(&origin);
                }
            }
        }
        out
    }

    /// Whether a takeover of `origin`'s objects below `below` still stands.
    pub(super) fn still_taking(&self, origin: u32, below: u64) -> bool {
        if below == u64::MAX {
            self.owned.contains(&origin)
        } else {
            self.below.get(&origin) == Some(&below)
        }
    }
}

/// Whether a takeover below `below` adopts the unfinished copy `seq`: not one another live
/// member adopted already (`taken`: one owner per object), nor one a live holder knows
/// delivered (`finished`: a copy here can have missed its end).
pub(super) fn claims(seq: u64, below: u64, taken: &HashSet<u64>, finished: &HashSet<u64>) -> bool {
    seq < below && !taken.contains(&seq) && !finished.contains(&seq)
}

/// The members of node `me`'s quorum that were dead in `old` and are alive in `new`: each
/// may hold adoptions of `me`'s objects that `me` has not learnt (it was not asked while
/// dead), so `me` relearns before its next QoS 2 push (found by `daemon/ownsim`: an heir
/// paused past its lease while its origin came back; both pushed what it had adopted).
pub(super) fn quorum_back(me: u32, old: &View, new: &View) -> Vec<u32> {
    let Some(g) = new.grid else {
        return Vec::new();
    };
    if !g.contains(me) {
        return Vec::new();
    }
    g.xs_quorum(me)
        .into_iter()
        .filter(|&m| m != me && old.dead(m) && new.alive(m))
        .collect()
}

/// A member of this node's quorum that adopted some of this node's objects, as the view
/// showed it when this node learnt so: the objects stay in this node's outbox, not pushed
/// here, until they are finished or the adopter loses them ([`Adopter::lost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Adopter {
    pub(super) node: u32,
    /// The first sequence number its store had handed out (another on a fresh disk).
    pub(super) owns_from: u64,
}

impl Adopter {
    /// Member `node` as `view` shows it.
    pub(super) fn in_view(node: u32, view: &View) -> Adopter {
        Adopter {
            node,
            owns_from: view.owns_from.get(&node).copied().unwrap_or(0),
        }
    }

    /// Whether `view` says the adopter may have lost what it adopted: dead (its lease ran
    /// out: fenced, it pushes no QoS 2 until it relearnt), or alive on a fresh disk. Its
    /// origin then takes the objects back (found by `daemon/ownsim`: an heir's disk lost
    /// after its origin came back and handed it the backlog lost the backlog).
    pub(super) fn lost(&self, view: &View) -> bool {
        view.dead(self.node)
            || view
                .owns_from
                .get(&self.node)
                .is_some_and(|&f| f != self.owns_from)
    }
}

/// The adopters among `adopters` that `new` shows lost and `old` did not: the origin takes
/// back what it handed them.
pub(super) fn adopters_lost(
    adopters: impl IntoIterator<Item = Adopter>,
    old: &View,
    new: &View,
) -> BTreeSet<Adopter> {
    adopters
        .into_iter()
        .filter(|a| a.lost(new) && !a.lost(old))
        .collect()
}
