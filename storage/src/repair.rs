//! Objects this node lost at open: a record that did not check out (a byte changed on disk,
//! a record torn by a crash). Without more the object would be gone, although its row quorum
//! may still hold copies of it (the put was replicated before it was acknowledged). So each
//! such sequence number is remembered (`repair` keys in the meta tree, durable with the next
//! flush) until the node daemon restored the object from a copy ([`Store::restore_own`]) or
//! asked every holder and found none ([`Store::give_up_repair`]: a put a crash cut off
//! before its answer, or one already delivered).
//!
//! Two kinds: an object still in the outbox (its locator is dropped at open; it keeps the
//! outbox floor below it, and goes back into the outbox when restored), and one already
//! matched, found damaged in the newest log segment (`scrub`), whose delivery records wait
//! for its bytes (restored in place, not matched again).

use super::*;

const REPAIR: &[u8] = b"repair\0";

fn repair_key(seq: u64) -> Vec<u8> {
    let mut k = REPAIR.to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

impl Store {
    /// Remembers that the object of `seq` was lost at open: `outbox` when it was still to be
    /// matched (durable with the next flush).
    pub(super) fn needs_repair(&self, seq: u64, outbox: bool) -> Result<(), StorageError> {
        self.meta.insert(repair_key(seq), &[u8::from(outbox)][..])?;
        self.lock_repair().insert(seq, outbox);
        Ok(())
    }

    /// The objects already matched that the newest log segment holds damaged (their
    /// locators stay, reading as absent): to restore in place.
    pub(super) fn note_damaged(&self, seqs: &[u64]) -> Result<(), StorageError> {
        for &seq in seqs {
            if self.lock_repair().contains_key(&seq) || self.lock_outbox().contains_key(&seq) {
                continue;
            }
            if self.has_locator(seq)? {
                self.needs_repair(seq, false)?;
            }
        }
        Ok(())
    }

    /// Reads what earlier opens left to repair.
    pub(super) fn load_repair(&self) -> Result<(), StorageError> {
        let mut set = self.lock_repair();
        for kv in self.meta.scan_prefix(REPAIR) {
            let (k, v) = kv?;
            if let Some(seq) = k
                .get(REPAIR.len()..)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
            {
                set.insert(seq, v.first() == Some(&1));
            }
        }
        Ok(())
    }

    pub(super) fn lock_repair(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, bool>> {
        self.repair.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This node's objects lost at open and not yet restored, in order.
    pub fn to_repair(&self) -> Vec<u64> {
        self.lock_repair().keys().copied().collect()
    }

    /// Whether this node's object of `seq` was lost at open and is not yet restored (nor
    /// given up): it is still to be disseminated, although nothing here holds its bytes.
    pub fn awaits_repair(&self, seq: u64) -> bool {
        self.lock_repair().contains_key(&seq)
    }

    /// Restores this node's objects lost at open from copies (each as it was: same sequence
    /// number, priority and time received): those that were still to be matched into the
    /// outbox, the others in place. Copies of anything else are left alone. Durable with the
    /// next [`Store::commit`]; the answer is how many.
    pub fn restore_own(&self, copies: &[StoredObject]) -> Result<usize, StorageError> {
        let mut restored = 0;
        for o in copies {
            let outbox = match self.lock_repair().get(&o.id.seq) {
                Some(&outbox) if o.id.node == self.node => outbox,
                _ => continue,
            };
            let seq = o.id.seq;
            let at = self.log.append(seq, &codec::encode_object(o))?;
            let entry = objects::Entry {
                at,
                received_unix_ms: o.received_unix_ms,
                has_message_id: !o.message_id.is_empty(),
                priority: o.priority,
                targeted: false,
            };
            self.set_locator(seq, &entry)?;
            if outbox {
                self.lock_outbox().insert(seq, o.priority);
            }
            self.fresh.keep(seq, Arc::new(o.clone()));
            self.meta.remove(repair_key(seq))?;
            self.lock_repair().remove(&seq);
            restored += 1;
        }
        Ok(restored)
    }

    /// Stops looking for copies of these lost objects (no holder has one). Durable with the
    /// next flush.
    pub fn give_up_repair(&self, seqs: &[u64]) -> Result<(), StorageError> {
        for &seq in seqs {
            self.meta.remove(repair_key(seq))?;
            self.lock_repair().remove(&seq);
        }
        Ok(())
    }
}
