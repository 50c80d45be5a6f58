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
        for found in self.locators_from(floor) {
            let (seq, e) = match found? {
                locators::Found::Object(seq, e) => (seq, e),
                locators::Found::Damaged(k) => {
                    // a damaged locator run: named and dropped, the node starts without it
                    tracing::error!(
                        "object locators {:?} do not decode (damaged on disk): dropped",
                        k.as_ref()
                    );
                    self.remove_run(&k)?;
                    dropped += 1;
                    continue;
                }
            };
            if self.log.read(e.at, seq)?.is_some() {
                if !e.targeted {
                    outbox.insert(seq, e.priority);
                }
            } else {
                tracing::debug!(
                    "object {seq}: no record that checks out at segment {} offset {}",
                    e.at.segment,
                    e.at.offset
                );
                self.remove_locator(seq)?;
                // its quorum may hold a copy (`repair`)
                self.needs_repair(seq, true)?;
                dropped += 1;
            }
        }
        *self.lock_outbox() = outbox;
        if dropped > 0 {
            tracing::warn!(
                "dropped {dropped} object(s) whose record is missing or does not check out: \
                 puts a crash cut off before their acknowledgement, or records named above as \
                 damaged (restored from their copies when the row quorum holds any)"
            );
            self.db.flush()?;
        }
        Ok(())
    }

    /// The lowest sequence number still owed dissemination (or the next to be handed out).
    pub(super) fn outbox_floor(&self) -> u64 {
        let g = self.lock_seq();
        let next = g.0;
        let outbox = self.lock_outbox().keys().next().copied().unwrap_or(next);
        // an object lost at open and not yet restored stays owed
        let lost = self
            .lock_repair()
            .iter()
            .find(|(_, outbox)| **outbox)
            .map_or(next, |(seq, _)| *seq);
        outbox.min(lost)
    }

    /// Writes the outbox floor if it moved (it reaches the disk with the flush that follows).
    pub(super) fn write_outbox_floor(&self) -> Result<(), StorageError> {
        let floor = self.outbox_floor();
        if self.outbox_floor_written.fetch_max(floor, Ordering::SeqCst) < floor {
            self.meta.insert(META_OUTBOX_FROM, &floor.to_be_bytes())?;
        }
        Ok(())
    }

    pub(super) fn lock_adopted(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<ObjectId, u8>> {
        self.adopted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Objects not yet retired, oldest first: (object id, priority), this node's own (but
    /// those handed to an adopter, [`Store::hand`]), then the adopted copies
    /// ([`Store::adopt`]). Replayed at start, resent while owed.
    pub fn outbox_pending(&self) -> Result<Vec<(ObjectId, u8)>, StorageError> {
        let outbox = self.lock_outbox();
        let handed = self.lock_handed();
        let mut v: Vec<(ObjectId, u8)> = outbox
            .iter()
            .filter(|(seq, _)| !handed.contains(seq))
            .map(|(&seq, &p)| {
                (
                    ObjectId {
                        node: self.node,
                        seq,
                    },
                    p,
                )
            })
            .collect();
        drop((handed, outbox));
        v.extend(self.lock_adopted().iter().map(|(&id, &p)| (id, p)));
        Ok(v)
    }

    /// The first `limit` of this node's own objects still in the outbox, in order, but
    /// those handed to an adopter (its deliveries are not this node's to order).
    pub fn outbox_head(&self, limit: usize) -> Vec<u64> {
        let outbox = self.lock_outbox();
        let handed = self.lock_handed();
        outbox
            .keys()
            .filter(|seq| !handed.contains(seq))
            .take(limit)
            .copied()
            .collect()
    }

    /// This node's own objects still in the outbox, after sequence `after`, in order, at
    /// most `limit`.
    pub fn own_pending_after(&self, after: u64, limit: usize) -> Vec<u64> {
        self.lock_outbox()
            .range(after.saturating_add(1)..)
            .take(limit)
            .map(|(&seq, _)| seq)
            .collect()
    }

    /// Whether `id` is in the outbox (its dissemination is not finished): one of this
    /// node's objects (handed to an adopter or not), or an adopted copy.
    pub fn in_outbox(&self, id: ObjectId) -> bool {
        if id.node == self.node {
            self.lock_outbox().contains_key(&id.seq)
        } else {
            self.lock_adopted().contains_key(&id)
        }
    }

    /// Objects in the outbox (adopted copies included).
    pub fn outbox_len(&self) -> usize {
        self.lock_outbox().len() + self.lock_adopted().len()
    }

    /// Takes an object out of the outbox once every push it owes is recorded; `false` when
    /// it was not there.
    pub fn retire(&self, id: ObjectId) -> Result<bool, StorageError> {
        Ok(if id.node == self.node {
            let mut outbox = self.lock_outbox();
            if self.lock_handed().remove(&id.seq) {
                self.handings.remove(id.seq.to_be_bytes())?;
            }
            outbox.remove(&id.seq).is_some()
        } else {
            self.adoptions
                .remove(replicas::replica_key(id.node, id.seq))?;
            self.lock_adopted().remove(&id).is_some()
        })
    }

    /// Claims an unfinished copy of another node's object for this node's outbox: this node
    /// disseminates it now (it took over the object's dead origin). The claim is written,
    /// not yet durable; [`Store::adopted`] puts it in the outbox once a commit made it so,
    /// and only then do others learn of it. Before, adoptions lived in memory: an heir
    /// restarted after its origin came back and closed the object (adopted elsewhere)
    /// forgot it, and nobody delivered it (`bench chaos` seed 24000). `false` when no
    /// unfinished copy is held, or it is claimed already.
    pub fn adopt(&self, id: ObjectId) -> Result<bool, StorageError> {
        if id.node == self.node {
            return Ok(false);
        }
        let Some(o) = self.replica(id)? else {
            return Ok(false);
        };
        let k = replicas::replica_key(id.node, id.seq);
        Ok(self
            .adoptions
            .compare_and_swap(k, None as Option<&[u8]>, Some(&[o.priority][..]))?
            .is_ok())
    }

    /// Puts claimed copies ([`Store::adopt`], durable since) in the outbox: (id, priority).
    pub fn adopted(&self, claimed: &[(ObjectId, u8)]) {
        self.lock_adopted().extend(claimed.iter().copied());
    }

    /// Loads the durable adoptions at open, those whose copy is still unfinished (the rest
    /// were delivered: their claims go).
    pub(super) fn load_adopted(&self) -> Result<(), StorageError> {
        let mut adopted = std::collections::BTreeMap::new();
        for kv in self.adoptions.iter() {
            let (k, v) = kv?;
            let Some(id) = replicas::replica_id(&k) else {
                self.adoptions.remove(&k)?;
                continue;
            };
            if self.replica(id)?.is_some() {
                adopted.insert(id, v.first().copied().unwrap_or(0));
            } else {
                self.adoptions.remove(&k)?;
            }
        }
        if !adopted.is_empty() {
            tracing::info!(
                "{} adopted copies of other nodes' objects are owed",
                adopted.len()
            );
        }
        *self.lock_adopted() = adopted;
        Ok(())
    }

    /// Sequence numbers of adopted copies of `origin` above `after`, in order, at most `limit`.
    pub fn adopted_after(&self, origin: u32, after: u64, limit: usize) -> Vec<u64> {
        self.lock_adopted()
            .range(
                ObjectId {
                    node: origin,
                    seq: after.saturating_add(1),
                }..=ObjectId {
                    node: origin,
                    seq: u64::MAX,
                },
            )
            .take(limit)
            .map(|(id, _)| id.seq)
            .collect()
    }

    /// Every adopted copy's id.
    pub fn adopted_ids(&self) -> std::collections::HashSet<ObjectId> {
        self.lock_adopted().keys().copied().collect()
    }

    /// Gives back every adopted copy of `origin` (it is alive again and owns them); the
    /// answer is how many.
    pub fn unadopt(&self, origin: u32) -> Result<usize, StorageError> {
        let k = origin.to_be_bytes();
        for key in self.adoptions.scan_prefix(k).keys() {
            self.adoptions.remove(key?)?;
        }
        let mut a = self.lock_adopted();
        let before = a.len();
        a.retain(|id, _| id.node != origin);
        Ok(before - a.len())
    }
}
