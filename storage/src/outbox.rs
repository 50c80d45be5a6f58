//! The outbox: in memory, with a durable floor (the lowest sequence still owed, written with
//! every flush); at open every object from the floor on is owed again.

use super::*;

/// Every object below this sequence number has left the outbox (replay starts here).
pub(super) const META_OUTBOX_FROM: &[u8] = b"outbox_from";

impl Store {
    pub(super) fn lock_outbox(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, u8>> {
        self.outbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rebuilds the outbox from the durable floor on. After a crash sled may hold the locator
    /// of an object whose log record never reached the disk (that put was not acknowledged):
    /// it is removed, so the outbox replays only objects that exist. Objects retired after
    /// the floor was last written are pending again (matching them twice is harmless: a
    /// delivery record that exists is left as it is).
    pub(super) fn load_outbox(&self) -> Result<(), StorageError> {
        let floor = self
            .meta
            .get(META_OUTBOX_FROM)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0);
        self.outbox_floor_written.store(floor, Ordering::SeqCst);
        let mut dropped = 0usize;
        let mut outbox = std::collections::BTreeMap::new();
        for kv in self.data.range(key(b'd', floor)..=key(b'd', u64::MAX)) {
            let (k, v) = kv?;
            let seq = seq_of(&k).ok_or_else(|| StorageError::Corrupt {
                tree: "object locators",
                source: CodecError::Truncated,
            })?;
            let e = Self::decode_entry(&v)?;
            if self.log.read(e.at, seq)?.is_some() {
                outbox.insert(seq, e.priority);
            } else {
                self.data.remove(&k)?;
                dropped += 1;
            }
        }
        *self.lock_outbox() = outbox;
        if dropped > 0 {
            tracing::warn!(
                "dropped {dropped} unacknowledged object(s) whose bytes never reached the disk"
            );
            self.db.flush()?;
        }
        Ok(())
    }

    /// The lowest sequence number still owed dissemination (or the next to be handed out).
    pub(super) fn outbox_floor(&self) -> u64 {
        let g = self.lock_seq();
        let next = g.0;
        self.lock_outbox().keys().next().copied().unwrap_or(next)
    }

    /// Writes the outbox floor if it moved (it reaches the disk with the flush that follows).
    pub(super) fn write_outbox_floor(&self) -> Result<(), StorageError> {
        let floor = self.outbox_floor();
        if self.outbox_floor_written.fetch_max(floor, Ordering::SeqCst) < floor {
            self.meta.insert(META_OUTBOX_FROM, &floor.to_be_bytes())?;
        }
        Ok(())
    }

    /// Objects not yet retired, oldest first: (object id, priority). Replayed at start.
    pub fn outbox_pending(&self) -> Result<Vec<(ObjectId, u8)>, StorageError> {
        Ok(self
            .lock_outbox()
            .iter()
            .map(|(&seq, &p)| {
                (
                    ObjectId {
                        node: self.node,
                        seq,
                    },
                    p,
                )
            })
            .collect())
    }

    /// Whether `id` is in the outbox (its dissemination is not finished).
    pub fn in_outbox(&self, id: ObjectId) -> bool {
        id.node == self.node && self.lock_outbox().contains_key(&id.seq)
    }

    /// Objects in the outbox.
    pub fn outbox_len(&self) -> usize {
        self.lock_outbox().len()
    }

    /// Takes an object out of the outbox once every push it owes is recorded; `false` when
    /// it was not there.
    pub fn retire(&self, id: ObjectId) -> Result<bool, StorageError> {
        Ok(id.node == self.node && self.lock_outbox().remove(&id.seq).is_some())
    }
}
