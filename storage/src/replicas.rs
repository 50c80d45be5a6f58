//! The replicas keyspace (quorum replication, DESIGN §7): copies of objects other nodes took,
//! held for the row (or xS) quorum of their origin. Key: origin node, sequence (big endian, so
//! one origin's copies are one ordered range); value: a state byte and, while unfinished, the
//! encoded object. A finished copy (its origin, or whoever took over, delivered it) keeps a
//! tombstone, so a late copy or a catch-up cannot bring it back. A copy whose object was
//! delivered while a federation link still owed it is *forwarding*: it keeps its bytes, is
//! never disseminated again, and ends once every link acknowledged the object (so a lost
//! origin disk does not lose what a peer cluster was owed). Beside them, the QoS 2
//! deliveries of those objects that a subscriber has "received" (so a takeover only
//! releases them, and the subscriber never sees one twice).

use super::*;

const UNFINISHED: u8 = 0;
const FINISHED: u8 = 1;
const FORWARDING: u8 = 2;

pub(super) fn replica_key(origin: u32, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&origin.to_be_bytes());
    k[4..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn replica_id(k: &[u8]) -> Option<ObjectId> {
    let node = u32::from_be_bytes(<[u8; 4]>::try_from(k.get(..4)?).ok()?);
    let seq = u64::from_be_bytes(<[u8; 8]>::try_from(k.get(4..12)?).ok()?);
    Some(ObjectId { node, seq })
}

fn corrupt(source: CodecError) -> StorageError {
    StorageError::Corrupt {
        tree: "replicas",
        source,
    }
}

/// How many copies this node holds, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaCounts {
    pub unfinished: usize,
    pub finished: usize,
    /// Delivered, kept for the federation links that still owe the object.
    pub forwarding: usize,
}

impl Store {
    /// Stores copies of other nodes' objects (not yet durable: [`Store::commit`] makes them
    /// so). A copy already held, or already finished, is left as it is; the answer is how many
    /// were new.
    pub fn put_replicas_unflushed(&self, objects: &[StoredObject]) -> Result<usize, StorageError> {
        let mut added = 0;
        for o in objects {
            let k = replica_key(o.id.node, o.id.seq);
            let mut v = Vec::with_capacity(o.data.len() + 64);
            v.push(UNFINISHED);
            v.extend_from_slice(&codec::encode_object(o));
            if self
                .replicas
                .compare_and_swap(k, None as Option<&[u8]>, Some(v))?
                .is_ok()
            {
                added += 1;
            }
        }
        Ok(added)
    }

    /// Marks copies finished (delivered by whoever owned them): their bytes and received
    /// marks go, a tombstone stays. Not yet durable; a lost mark only means the copy is
    /// disseminated again after a takeover (a repeat, which delivery ids absorb).
    pub fn finish_replicas(&self, ids: &[ObjectId]) -> Result<(), StorageError> {
        for id in ids {
            self.replicas
                .insert(replica_key(id.node, id.seq), &[FINISHED][..])?;
            let prefix = replica_key(id.node, id.seq);
            for k in self.phases.scan_prefix(prefix).keys() {
                self.phases.remove(k?)?;
            }
        }
        Ok(())
    }

    /// Marks unfinished copies forwarding: their objects were delivered, but a federation
    /// link still owes them. The bytes stay (whoever takes the origin over owes them to its
    /// links), the received marks go; a finished copy stays finished, and an absent one is
    /// left absent. Not yet durable.
    pub fn forward_replicas(&self, ids: &[ObjectId]) -> Result<(), StorageError> {
        for id in ids {
            let k = replica_key(id.node, id.seq);
            let Some(v) = self.replicas.get(k)? else {
                continue;
            };
            if v.first() != Some(&UNFINISHED) {
                continue;
            }
            let mut f = v.to_vec();
            f[0] = FORWARDING;
            // a finish or a newer copy in between wins
            let _ = self.replicas.compare_and_swap(k, Some(v), Some(f))?;
            for k in self.phases.scan_prefix(k).keys() {
                self.phases.remove(k?)?;
            }
        }
        Ok(())
    }

    /// Records that subscribers have QoS 2 deliveries "received" (object, subscription):
    /// whoever takes the object over only releases them. Not yet durable.
    pub fn mark_received_unflushed(&self, marks: &[(ObjectId, u64)]) -> Result<(), StorageError> {
        for (id, sub) in marks {
            let mut k = [0u8; 20];
            k[..12].copy_from_slice(&replica_key(id.node, id.seq));
            k[12..].copy_from_slice(&sub.to_be_bytes());
            self.phases.insert(k, &[][..])?;
        }
        Ok(())
    }

    /// The subscriptions whose QoS 2 delivery of `id` a subscriber has "received".
    pub fn received_marks(&self, id: ObjectId) -> Result<Vec<u64>, StorageError> {
        let mut subs = Vec::new();
        for k in self.phases.scan_prefix(replica_key(id.node, id.seq)).keys() {
            let k = k?;
            let sub = k
                .get(12..20)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt(CodecError::Truncated))?;
            subs.push(sub);
        }
        Ok(subs)
    }

    /// The copy of `id`, when this node holds it unfinished.
    pub fn replica(&self, id: ObjectId) -> Result<Option<StoredObject>, StorageError> {
        let Some(v) = self.replicas.get(replica_key(id.node, id.seq))? else {
            return Ok(None);
        };
        match v.split_first() {
            Some((&UNFINISHED, rest)) => codec::decode_object(rest, id).map(Some).map_err(corrupt),
            _ => Ok(None),
        }
    }

    /// Whether this node knows `id` delivered: `Some(false)` for a finished copy (a
    /// tombstone), `Some(true)` for a forwarding one, `None` for an unfinished copy or none.
    pub fn delivered_replica(&self, id: ObjectId) -> Result<Option<bool>, StorageError> {
        let v = self.replicas.get(replica_key(id.node, id.seq))?;
        Ok(match v.as_deref().and_then(|v| v.first()) {
            Some(&FINISHED) => Some(false),
            Some(&FORWARDING) => Some(true),
            _ => None,
        })
    }

    /// Whether this node holds a copy of `id`, unfinished or finished.
    pub fn knows_replica(&self, id: ObjectId) -> Result<bool, StorageError> {
        Ok(self.replicas.contains_key(replica_key(id.node, id.seq))?)
    }

    /// Walks `origin`'s copies above `after` in order, keeping what `keep` makes of each
    /// (id, state byte, rest), up to `limit`.
    fn scan_after<T>(
        &self,
        origin: u32,
        after: u64,
        limit: usize,
        mut keep: impl FnMut(ObjectId, u8, &[u8]) -> Result<Option<T>, StorageError>,
    ) -> Result<Vec<T>, StorageError> {
        let mut out = Vec::new();
        if after == u64::MAX {
            return Ok(out);
        }
        let from = replica_key(origin, after + 1);
        let to = replica_key(origin, u64::MAX);
        for kv in self.replicas.range(from..=to) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = kv?;
            let id = replica_id(&k).ok_or_else(|| corrupt(CodecError::Truncated))?;
            let Some((&state, rest)) = v.split_first() else {
                return Err(corrupt(CodecError::Truncated));
            };
            out.extend(keep(id, state, rest)?);
        }
        Ok(out)
    }

    /// Up to `limit` unfinished copies of `origin`'s objects with sequence numbers above
    /// `after`, in order (a catch-up pages through them).
    pub fn unfinished_replicas(
        &self,
        origin: u32,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredObject>, StorageError> {
        self.copies_in(UNFINISHED, origin, after, limit)
    }

    /// Up to `limit` copies of `origin`'s objects above `after` that still have their bytes
    /// (unfinished, or forwarding: `true`), in order.
    pub fn held_replicas(
        &self,
        origin: u32,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(StoredObject, bool)>, StorageError> {
        self.scan_after(origin, after, limit, |id, state, rest| {
            if state == FINISHED {
                return Ok(None);
            }
            let o = codec::decode_object(rest, id).map_err(corrupt)?;
            Ok(Some((o, state == FORWARDING)))
        })
    }

    /// Up to `limit` copies of `origin`'s objects in `state` above `after`, in order.
    fn copies_in(
        &self,
        want: u8,
        origin: u32,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredObject>, StorageError> {
        self.scan_after(origin, after, limit, |id, state, rest| {
            if state != want {
                return Ok(None);
            }
            codec::decode_object(rest, id).map(Some).map_err(corrupt)
        })
    }

    /// Up to `limit` sequence numbers of `origin`'s delivered copies above `after` (finished
    /// or forwarding), in order.
    pub fn finished_replicas(
        &self,
        origin: u32,
        after: u64,
        limit: usize,
    ) -> Result<Vec<u64>, StorageError> {
        self.seqs_where(origin, after, limit, |state| state != UNFINISHED)
    }

    /// Up to `limit` sequence numbers of `origin`'s forwarding copies above `after`, in order.
    pub fn forwarding_seqs(
        &self,
        origin: u32,
        after: u64,
        limit: usize,
    ) -> Result<Vec<u64>, StorageError> {
        self.seqs_where(origin, after, limit, |state| state == FORWARDING)
    }

    /// Up to `limit` sequence numbers of `origin`'s copies above `after` whose state `keep`
    /// takes, in order.
    fn seqs_where(
        &self,
        origin: u32,
        after: u64,
        limit: usize,
        keep: impl Fn(u8) -> bool,
    ) -> Result<Vec<u64>, StorageError> {
        self.scan_after(origin, after, limit, |id, state, _| {
            Ok(keep(state).then_some(id.seq))
        })
    }

    /// Up to `limit` forwarding copies of `origin`'s objects above `after`, in order.
    pub fn forwarding_replicas(
        &self,
        origin: u32,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredObject>, StorageError> {
        self.copies_in(FORWARDING, origin, after, limit)
    }

    /// The copies this node holds, by state.
    pub fn replica_counts(&self) -> Result<ReplicaCounts, StorageError> {
        let mut c = ReplicaCounts::default();
        for kv in self.replicas.iter() {
            let (_, v) = kv?;
            match v.first() {
                Some(&UNFINISHED) => c.unfinished += 1,
                Some(&FORWARDING) => c.forwarding += 1,
                _ => c.finished += 1,
            }
        }
        Ok(c)
    }

    /// Unfinished copies held per origin.
    pub fn unfinished_replicas_by_origin(
        &self,
    ) -> Result<std::collections::BTreeMap<u32, usize>, StorageError> {
        let mut by = std::collections::BTreeMap::new();
        for kv in self.replicas.iter() {
            let (k, v) = kv?;
            if v.first() == Some(&UNFINISHED)
                && let Some(id) = replica_id(&k)
            {
                *by.entry(id.node).or_insert(0) += 1;
            }
        }
        Ok(by)
    }
}
