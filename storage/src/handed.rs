//! Objects of this node's outbox handed to an adopter: when a node comes back and learns that
//! the heir that took its objects over while it was down still disseminates some of them,
//! those stay in its outbox, marked handed. A handed object is held (answered as unfinished
//! to a holder catching up, so no copy of it ends) but not matched here: not replayed, not
//! resent, and a stale match of it is a repeat. If the adopter is lost before it delivered
//! them (its disk gone), the origin takes them back ([`Store::take_back`]) and disseminates them
//! itself; before, they had left the outbox, and nobody delivered them (found by the
//! ownership simulation, `worker/src/daemon/ownsim`). The marks are on disk, with their
//! adopter: an origin restarted after it handed objects over holds them again at open
//! (their delivery records here were closed, and the outbox floor may have passed them), so
//! that it can still take them back.

use super::*;

impl Store {
    pub(super) fn lock_handed(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<u64>> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks this node's object `seq` handed to `adopter` (its node, and the first sequence
    /// number its store had handed out). One that left the outbox (its delivery records were
    /// written; they are still open) enters it again when `priority` is given. `false` when
    /// it is not (or no longer) in the outbox. The mark is written, durable with the next
    /// commit.
    pub fn hand(
        &self,
        seq: u64,
        priority: Option<u8>,
        adopter: (u32, u64),
    ) -> Result<bool, StorageError> {
        // the outbox's lock first, as everywhere: it is not left while the mark is set
        let mut outbox = self.lock_outbox();
        let p = match (outbox.get(&seq).copied(), priority) {
            (None, None) => return Ok(false),
            (Some(p), _) | (None, Some(p)) => p,
        };
        let mut v = Vec::with_capacity(13);
        v.extend_from_slice(&adopter.0.to_be_bytes());
        v.extend_from_slice(&adopter.1.to_be_bytes());
        v.push(p);
        self.handings.insert(seq.to_be_bytes(), v)?;
        outbox.insert(seq, p);
        self.lock_handed().insert(seq);
        Ok(true)
    }

    /// Takes the handed object `seq` back: it is disseminated here again. `false` when it
    /// was not handed.
    pub fn take_back(&self, seq: u64) -> Result<bool, StorageError> {
        let was = self.lock_handed().remove(&seq);
        if was {
            self.handings.remove(seq.to_be_bytes())?;
        }
        Ok(was)
    }

    /// Every handed object: (sequence number, its adopter's node, the adopter's first
    /// sequence number), in order.
    pub fn handings(&self) -> Result<Vec<(u64, u32, u64)>, StorageError> {
        let mut out = Vec::new();
        for kv in self.handings.iter() {
            let (k, v) = kv?;
            if let Some(h) = decode_handing(&k, &v) {
                out.push((h.0, h.1, h.2));
            }
        }
        Ok(out)
    }

    /// Loads the handed marks at open: each object enters the outbox again, held (a mark
    /// whose object is gone, or that does not decode, is dropped and named).
    pub(super) fn load_handed(&self) -> Result<(), StorageError> {
        let mut outbox = self.lock_outbox();
        let mut handed = self.lock_handed();
        for kv in self.handings.iter() {
            let (k, v) = kv?;
            let mut known = decode_handing(&k, &v);
            if let Some(h) = known
                && !self.has_locator(h.0)?
            {
                known = None;
            }
            match known {
                Some((seq, _, _, p)) => {
                    outbox.entry(seq).or_insert(p);
                    handed.insert(seq);
                }
                None => {
                    tracing::warn!(
                        "handed mark {:?}: no such object here, or damaged: dropped",
                        k.as_ref()
                    );
                    self.handings.remove(&k)?;
                }
            }
        }
        if !handed.is_empty() {
            tracing::info!(
                "{} of this node's objects are handed to their adopters",
                handed.len()
            );
        }
        Ok(())
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

/// A handed mark: (seq, adopter node, adopter's first sequence number, priority).
fn decode_handing(k: &[u8], v: &[u8]) -> Option<(u64, u32, u64, u8)> {
    let seq = u64::from_be_bytes(k.try_into().ok()?);
    let node = u32::from_be_bytes(v.get(..4)?.try_into().ok()?);
    let from = u64::from_be_bytes(v.get(4..12)?.try_into().ok()?);
    Some((seq, node, from, *v.get(12)?))
}
