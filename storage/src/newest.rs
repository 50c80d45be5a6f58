//! The one rule that orders the versions of a subscription wherever its copies meet: a
//! node's store taking a copy, a returning node's catch-up, a new leader's rebuild. The
//! highest revision wins, and a deletion is final: subscription ids are never handed out
//! twice, so nothing written after a delete can be a newer version of the deleted one.
//!
//! Pure, so the copies' simulation (`coordinator/src/sim/copies.rs`) runs the same rule as
//! the stores and the rebuild do.

use std::collections::{BTreeMap, BTreeSet};

/// What a store (or a merge) holds of one subscription id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Absent,
    /// A copy at this revision (0: a record written before revisions existed).
    Revision(u64),
    Deleted,
}

/// Whether a copy at revision `incoming` replaces what is held. The same revision again
/// is the same version (a revision names one change): it is not written again, so a pull
/// that finds what is held writes nothing and the change feed stays quiet (two nodes
/// catching up from each other's feeds would otherwise rewrite every copy back and forth).
/// Records older than revisions (0) stay replaceable by each other.
pub fn replaces(held: Held, incoming: u64) -> bool {
    match held {
        Held::Absent => true,
        Held::Revision(r) => incoming > r || (incoming == 0 && r == 0),
        Held::Deleted => false,
    }
}

/// One subscription id as a store lists it: a copy, or the tombstone of a deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubCopy {
    pub id: u64,
    /// The change that wrote this version (0 for a tombstone or an old record).
    pub revision: u64,
    /// The node that took the Create (quorum copies), if recorded.
    pub placed_by: Option<u32>,
    /// The encoded record; `None`: deleted.
    pub record: Option<Vec<u8>>,
}

/// The newest state of every subscription among many sources (a rebuild's merge).
#[derive(Debug, Default)]
pub struct Newest {
    copies: BTreeMap<u64, (u64, Vec<u8>)>,
    deleted: BTreeSet<u64>,
}

impl Newest {
    /// Takes one source's view of one id.
    pub fn offer(&mut self, c: SubCopy) {
        match c.record {
            None => {
                self.copies.remove(&c.id);
                self.deleted.insert(c.id);
            }
            Some(record) => {
                if replaces(self.held(c.id), c.revision) {
                    self.copies.insert(c.id, (c.revision, record));
                }
            }
        }
    }

    /// Takes everything another merge holds (sources merged apart, then together: the
    /// same answer as one merge of them all, in any order).
    pub fn absorb(&mut self, other: Newest) {
        for id in other.deleted {
            self.offer(SubCopy {
                id,
                revision: 0,
                placed_by: None,
                record: None,
            });
        }
        for (id, (revision, record)) in other.copies {
            self.offer(SubCopy {
                id,
                revision,
                placed_by: None,
                record: Some(record),
            });
        }
    }

    /// What the merge holds of `id`.
    pub fn held(&self, id: u64) -> Held {
        if self.deleted.contains(&id) {
            Held::Deleted
        } else {
            self.copies
                .get(&id)
                .map_or(Held::Absent, |(r, _)| Held::Revision(*r))
        }
    }

    /// Live subscriptions held.
    pub fn len(&self) -> usize {
        self.copies.len()
    }

    /// Whether no live subscription is held.
    pub fn is_empty(&self) -> bool {
        self.copies.is_empty()
    }

    /// The live copies as (id, revision, record), in id order, and the deleted ids.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(self) -> (Vec<(u64, u64, Vec<u8>)>, Vec<u64>) {
        (
            self.copies
                .into_iter()
                .map(|(id, (rev, rec))| (id, rev, rec))
                .collect(),
            self.deleted.into_iter().collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(id: u64, revision: u64, r: &str) -> SubCopy {
        SubCopy {
            id,
            revision,
            placed_by: None,
            record: Some(r.as_bytes().to_vec()),
        }
    }

    #[test]
    fn the_highest_revision_wins_in_any_order_and_merge_and_a_deletion_is_final() {
        let offers = [
            copy(1, 5, "old"),
            copy(1, 9, "new"),
            copy(2, 3, "x"),
            SubCopy {
                id: 2,
                revision: 0,
                placed_by: None,
                record: None,
            },
            copy(3, 7, "only"),
        ];
        // every order of the same offers merges to the same thing
        for rot in 0..offers.len() {
            for rev in [false, true] {
                let mut v: Vec<SubCopy> = offers.to_vec();
                v.rotate_left(rot);
                if rev {
                    v.reverse();
                }
                // merged at once, or in two parts then together (a rebuild that pulls
                // sources side by side)
                for split in 0..=v.len() {
                    let mut n = Newest::default();
                    let mut other = Newest::default();
                    for (i, c) in v.iter().cloned().enumerate() {
                        if i < split {
                            n.offer(c);
                        } else {
                            other.offer(c);
                        }
                    }
                    n.absorb(other);
                    assert_eq!(n.held(1), Held::Revision(9));
                    assert_eq!(n.held(2), Held::Deleted);
                    let (live, deleted) = n.into_parts();
                    assert_eq!(
                        live,
                        vec![(1, 9, b"new".to_vec()), (3, 7, b"only".to_vec())]
                    );
                    assert_eq!(deleted, vec![2]);
                }
            }
        }
    }

    #[test]
    fn replaces_follows_the_rule() {
        assert!(replaces(Held::Absent, 0));
        assert!(
            !replaces(Held::Revision(4), 4),
            "the same version is not written again"
        );
        assert!(replaces(Held::Revision(0), 0));
        assert!(replaces(Held::Revision(4), 5));
        assert!(!replaces(Held::Revision(4), 3));
        assert!(!replaces(Held::Deleted, u64::MAX));
    }
}
