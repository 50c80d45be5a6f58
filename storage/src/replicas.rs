//! The replicas keyspace (quorum replication, DESIGN §7): copies of objects other nodes took,
//! held for the row (or xS) quorum of their origin. Key: origin node, sequence (big endian, so
//! one origin's copies are one ordered range); value: a state byte and, while unfinished, the
//! encoded object. A finished copy (its origin, or whoever took over, delivered it) keeps a
//! tombstone, so a late copy or a catch-up cannot bring it back.

use super::*;

const UNFINISHED: u8 = 0;
const FINISHED: u8 = 1;

fn replica_key(origin: u32, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&origin.to_be_bytes());
    k[4..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn replica_id(k: &[u8]) -> Option<ObjectId> {
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

    /// Marks copies finished (delivered by whoever owned them): their bytes go, a tombstone
    /// stays. Not yet durable; a lost mark only means the copy is disseminated again after a
    /// takeover (a repeat, which delivery ids absorb).
    pub fn finish_replicas(&self, ids: &[ObjectId]) -> Result<(), StorageError> {
        for id in ids {
            self.replicas
                .insert(replica_key(id.node, id.seq), &[FINISHED][..])?;
        }
        Ok(())
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

    /// Whether this node holds a copy of `id`, unfinished or finished.
    pub fn knows_replica(&self, id: ObjectId) -> Result<bool, StorageError> {
        Ok(self
            .replicas
            .contains_key(replica_key(id.node, id.seq))?)
    }

    /// Up to `limit` unfinished copies of `origin`'s objects with sequence numbers above
    /// `after`, in order (a catch-up pages through them).
    pub fn unfinished_replicas(
        &self,
        origin: u32,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredObject>, StorageError> {
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
            if let Some((&UNFINISHED, rest)) = v.split_first() {
                out.push(codec::decode_object(rest, id).map_err(corrupt)?);
            }
        }
        Ok(out)
    }

    /// The copies this node holds, by state.
    pub fn replica_counts(&self) -> Result<ReplicaCounts, StorageError> {
        let mut c = ReplicaCounts::default();
        for kv in self.replicas.iter() {
            let (_, v) = kv?;
            match v.first() {
                Some(&UNFINISHED) => c.unfinished += 1,
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
