//! Objects of this node's outbox handed to an adopter: when a node comes back and learns that
//! the heir that took its objects over while it was down still disseminates some of them,
//! those stay in its outbox, marked handed. A handed object is held (answered as unfinished
//! to a holder catching up, so no copy of it ends) but not matched here: not replayed, not
//! resent, its stale matches repeats. If the adopter is lost before it delivered them (its
//! disk gone), the origin takes them back ([`Store::take_back`]) and disseminates them
//! itself; before, they had left the outbox, and nobody delivered them (found by the
//! ownership simulation, `worker/src/daemon/ownsim`).

use super::*;

impl Store {
    pub(super) fn lock_handed(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<u64>> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks this node's object `seq` handed to an adopter. One that left the outbox (its
    /// delivery records were written; they are still open) enters it again when `priority`
    /// is given. `false` when it is not (or no longer) in the outbox.
    pub fn hand(&self, seq: u64, priority: Option<u8>) -> bool {
        // the outbox's lock first, as everywhere: it is not left while the mark is set
        let mut outbox = self.lock_outbox();
        match (outbox.entry(seq), priority) {
            (std::collections::btree_map::Entry::Vacant(_), None) => return false,
            (std::collections::btree_map::Entry::Vacant(v), Some(p)) => {
                v.insert(p);
            }
            (std::collections::btree_map::Entry::Occupied(_), _) => {}
        }
        self.lock_handed().insert(seq);
        true
    }

    /// Takes the handed object `seq` back: it is disseminated here again. `false` when it
    /// was not handed.
    pub fn take_back(&self, seq: u64) -> bool {
        self.lock_handed().remove(&seq)
    }

    /// Whether `id` is one of this node's objects handed to an adopter.
    pub fn is_handed(&self, id: ObjectId) -> bool {
        id.node == self.node && self.lock_handed().contains(&id.seq)
    }

    /// This node's objects handed to an adopter, in order.
    pub fn handed_seqs(&self) -> Vec<u64> {
        self.lock_handed().iter().copied().collect()
    }
}
