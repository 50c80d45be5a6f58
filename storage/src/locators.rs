//! The objects' locators in sled, in runs: a put of several objects (a `PutStream` window)
//! takes consecutive sequence numbers and writes all their locators under one key, `d` and
//! the run's first sequence number, so a batch costs sled one insert, not one per object.
//! sled splits a leaf past 16 keys, and with one key per object the ever-growing tail of the
//! keyspace split every eight puts (a quarter of a node's CPU per delivery went to sled).
//!
//! A run's value is its slots, one [`Entry`] each (26 bytes) for consecutive sequence
//! numbers; a slot with the absent flag stands for no object (a duplicate or a failed write
//! in the batch, or an object deleted since). A single object's locator is a run of one, so
//! a store written one locator per key reads as before. A run whose last slot is removed is
//! deleted.

use super::objects::Entry;
use super::*;

/// Bytes of one slot.
pub(super) const SLOT: usize = Locator::BYTES + 10;
/// The flags bit of a slot that holds no object.
const ABSENT: u8 = 4;

/// One slot's flags byte.
const FLAGS_AT: usize = Locator::BYTES + 8;

/// A slot that holds no object.
const ABSENT_SLOT: [u8; SLOT] = {
    let mut s = [0u8; SLOT];
    s[FLAGS_AT] = ABSENT;
    s
};

/// What a scan of the locators meets: an object's locator, or a run that does not decode.
pub(super) enum Found {
    Object(u64, Entry),
    Damaged(sled::IVec),
}

pub(super) fn damaged() -> StorageError {
    StorageError::Corrupt {
        tree: "object locators",
        source: CodecError::Truncated,
    }
}

/// The slots of a run's value (`None` when its length is not a whole number of slots).
fn slots(v: &[u8]) -> Option<std::slice::ChunksExact<'_, u8>> {
    (!v.is_empty() && v.len().is_multiple_of(SLOT)).then(|| v.chunks_exact(SLOT))
}

/// A slot's entry, `None` when it is absent.
fn slot_entry(s: &[u8]) -> Result<Option<Entry>, StorageError> {
    if s.get(FLAGS_AT).is_some_and(|f| f & ABSENT != 0) {
        return Ok(None);
    }
    Store::decode_entry(s).map(Some)
}

impl Store {
    /// The run that covers `seq` (its key and value), if any.
    fn run_of(&self, seq: u64) -> Result<Option<(u64, sled::IVec, sled::IVec)>, StorageError> {
        let Some(kv) = self.data.range(key(b'd', 0)..=key(b'd', seq)).next_back() else {
            return Ok(None);
        };
        let (k, v) = kv?;
        let first = seq_of(&k).ok_or_else(damaged)?;
        let n = (v.len() / SLOT) as u64;
        Ok((seq < first.saturating_add(n.max(1))).then_some((first, k, v)))
    }

    /// The locator of this node's object `seq`, if it has one.
    pub(super) fn locator(&self, seq: u64) -> Result<Option<Entry>, StorageError> {
        let Some((first, _, v)) = self.run_of(seq)? else {
            return Ok(None);
        };
        let at = (seq - first) as usize * SLOT;
        if slots(&v).is_none() {
            return Err(damaged());
        }
        v.get(at..at + SLOT).map_or(Ok(None), slot_entry)
    }

    /// Whether this node's object `seq` has a locator.
    pub(super) fn has_locator(&self, seq: u64) -> Result<bool, StorageError> {
        Ok(self.locator(seq)?.is_some())
    }

    /// Writes the locators of the consecutive sequence numbers from `first` on (`None`: no
    /// object there) with one sled insert; nothing when every slot is empty.
    pub(super) fn put_run(&self, first: u64, run: &[Option<Entry>]) -> Result<(), StorageError> {
        let lead = run.iter().take_while(|e| e.is_none()).count();
        let tail = run.iter().rev().take_while(|e| e.is_none()).count();
        if lead == run.len() {
            return Ok(());
        }
        let run = &run[lead..run.len() - tail];
        let mut v = Vec::with_capacity(run.len() * SLOT);
        for e in run {
            match e {
                Some(e) => v.extend_from_slice(&Self::encode_entry(e)),
                None => v.extend_from_slice(&ABSENT_SLOT),
            }
        }
        self.data.insert(key(b'd', first + lead as u64), v)?;
        Ok(())
    }

    /// Sets the locator of `seq`, in the run that covers it (a slot of an object restored
    /// after its locator was dropped) or as a run of one.
    pub(super) fn set_locator(&self, seq: u64, e: &Entry) -> Result<(), StorageError> {
        if !self.rewrite_slot(seq, e)? {
            self.put_run(seq, &[Some(*e)])?;
        }
        Ok(())
    }

    /// Removes the locator of `seq` (its run rewritten without it, deleted when it was the
    /// last).
    pub(super) fn remove_locator(&self, seq: u64) -> Result<(), StorageError> {
        self.remove_locators(&[seq])
    }

    /// Removes the locators of `seqs` (ascending), each run they share rewritten once.
    pub(super) fn remove_locators(&self, seqs: &[u64]) -> Result<(), StorageError> {
        let mut rest = seqs;
        while let Some(&seq) = rest.first() {
            let Some((first, k, v)) = self.run_of(seq)? else {
                rest = &rest[1..];
                continue;
            };
            let end = first + (v.len() / SLOT) as u64;
            let n = rest.iter().take_while(|&&s| s < end).count().max(1);
            let offsets: Vec<usize> = rest[..n]
                .iter()
                .map(|s| (s - first) as usize * SLOT)
                .collect();
            self.rewrite_slots(&k, &offsets, &ABSENT_SLOT)?;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Rewrites the slot of `seq` in the run that covers it, atomically against changes to
    /// its other slots; `false` when no run covers it.
    fn rewrite_slot(&self, seq: u64, e: &Entry) -> Result<bool, StorageError> {
        let Some((first, k, _)) = self.run_of(seq)? else {
            return Ok(false);
        };
        let slot = Self::encode_entry(e);
        self.rewrite_slots(&k, &[(seq - first) as usize * SLOT], &slot)
    }

    /// Writes `slot` at each of `offsets` in the run under `k`, in one atomic update (the run
    /// deleted when no slot of it is left); `false` when the run no longer covers them all.
    fn rewrite_slots(
        &self,
        k: &[u8],
        offsets: &[usize],
        slot: &[u8],
    ) -> Result<bool, StorageError> {
        let mut covered = false;
        self.data.update_and_fetch(k, |old| {
            let old = old?;
            covered = slots(old).is_some() && offsets.iter().all(|&at| old.len() >= at + SLOT);
            if !covered {
                return Some(old.to_vec());
            }
            let mut v = old.to_vec();
            for &at in offsets {
                v[at..at + SLOT].copy_from_slice(slot);
            }
            let live = v.chunks_exact(SLOT).any(|s| s[FLAGS_AT] & ABSENT == 0);
            live.then_some(v)
        })?;
        Ok(covered)
    }

    /// Removes a whole run that does not decode (its key as a scan found it).
    pub(super) fn remove_run(&self, k: &[u8]) -> Result<(), StorageError> {
        self.data.remove(k)?;
        Ok(())
    }

    /// Every locator from sequence number `from` on, in order; a run that does not decode is
    /// met as [`Found::Damaged`].
    pub(super) fn locators_from(
        &self,
        from: u64,
    ) -> Box<dyn Iterator<Item = Result<Found, StorageError>> + '_> {
        let start = match self.run_of(from) {
            Ok(Some((first, _, _))) => first,
            Ok(None) => from,
            Err(e) => return Box::new(std::iter::once(Err(e))),
        };
        let runs = self
            .data
            .range(key(b'd', start)..=key(b'd', u64::MAX))
            .flat_map(move |kv| -> Vec<Result<Found, StorageError>> {
                let (k, v) = match kv {
                    Ok(kv) => kv,
                    Err(e) => return vec![Err(e.into())],
                };
                let (Some(first), Some(slots)) = (seq_of(&k), slots(&v)) else {
                    return vec![Ok(Found::Damaged(k))];
                };
                let mut out = Vec::with_capacity(v.len() / SLOT);
                for (seq, s) in (first..).zip(slots) {
                    if seq < from {
                        continue;
                    }
                    match slot_entry(s) {
                        Ok(Some(e)) => out.push(Ok(Found::Object(seq, e))),
                        Ok(None) => {}
                        Err(_) => return vec![Ok(Found::Damaged(k))],
                    }
                }
                out
            });
        Box::new(runs)
    }
}
