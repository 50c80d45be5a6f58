//! The spilled keyspace (spillover federation): deliveries that peer clusters handed to this
//! node after they dead-lettered there. Key: the sending cluster, a NUL, the object's node
//! (4 bytes) and sequence number (8 bytes) there, and the subscription id (8 bytes) there,
//! big endian; value: when the delivery is given up (unix ms, 8 bytes), then the id of the
//! object's copy here (node 4 bytes, sequence 8 bytes; absent when nothing here took it).
//! An entry marks the delivery as taken, so a repeat from the sender is stored once, and
//! keeps its deadline across restarts; it is forgotten a while after that deadline.

use super::*;

/// One spilled delivery, as the sender names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillKey<'a> {
    /// The cluster it dead-lettered in.
    pub cluster: &'a str,
    /// The object's id there.
    pub origin: ObjectId,
    /// The subscription's id there.
    pub subscription: u64,
}

fn spill_key(k: &SpillKey<'_>) -> Vec<u8> {
    let mut v = Vec::with_capacity(k.cluster.len() + 21);
    v.extend_from_slice(k.cluster.as_bytes());
    v.push(0);
    v.extend_from_slice(&k.origin.node.to_be_bytes());
    v.extend_from_slice(&k.origin.seq.to_be_bytes());
    v.extend_from_slice(&k.subscription.to_be_bytes());
    v
}

fn decode_value(v: &[u8]) -> (u64, Option<ObjectId>) {
    let expires = v
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_be_bytes);
    let here = match (
        v.get(8..12).and_then(|b| <[u8; 4]>::try_from(b).ok()),
        v.get(12..20).and_then(|b| <[u8; 8]>::try_from(b).ok()),
    ) {
        (Some(n), Some(s)) => Some(ObjectId {
            node: u32::from_be_bytes(n),
            seq: u64::from_be_bytes(s),
        }),
        _ => None,
    };
    (expires, here)
}

impl Store {
    /// Whether the spilled delivery `key` was taken before.
    pub fn spill_seen(&self, key: &SpillKey<'_>) -> Result<bool, StorageError> {
        Ok(self.spilled.contains_key(spill_key(key))?)
    }

    /// Records the spilled delivery `key` as taken: given up at `expires_unix_ms`, its
    /// object's copy here `here` (`None`: no subscription here took it). Durable with the
    /// next [`Store::commit`].
    pub fn spill_taken(
        &self,
        key: &SpillKey<'_>,
        expires_unix_ms: u64,
        here: Option<ObjectId>,
    ) -> Result<(), StorageError> {
        let mut v = expires_unix_ms.to_be_bytes().to_vec();
        if let Some(id) = here {
            v.extend_from_slice(&id.node.to_be_bytes());
            v.extend_from_slice(&id.seq.to_be_bytes());
        }
        self.spilled.insert(spill_key(key), v)?;
        Ok(())
    }

    /// The deadline of each object copy here that spilled deliveries go to (the latest,
    /// when several name one copy).
    pub fn spill_deadlines(&self) -> Result<Vec<(ObjectId, u64)>, StorageError> {
        let mut m: std::collections::BTreeMap<ObjectId, u64> = Default::default();
        for kv in self.spilled.iter() {
            let (_, v) = kv?;
            if let (expires, Some(id)) = decode_value(&v) {
                let e = m.entry(id).or_insert(expires);
                *e = (*e).max(expires);
            }
        }
        Ok(m.into_iter().collect())
    }

    /// Forgets the spilled deliveries given up before `cutoff_unix_ms` (a repeat of one
    /// after that would be taken again); returns how many.
    pub fn spill_forget_before(&self, cutoff_unix_ms: u64) -> Result<usize, StorageError> {
        let mut b = sled::Batch::default();
        let mut n = 0;
        for kv in self.spilled.iter() {
            let (k, v) = kv?;
            if decode_value(&v).0 < cutoff_unix_ms {
                b.remove(k);
                n += 1;
            }
        }
        self.spilled.apply_batch(b)?;
        Ok(n)
    }

    /// How many spilled deliveries are remembered.
    pub fn spill_len(&self) -> usize {
        self.spilled.len()
    }

    /// A fresh key for an entry owed on a link that does not follow the node's own sequence
    /// (a spillover link owes deliveries, several per object): increasing, also across
    /// restarts.
    pub fn next_link_entry(&self) -> Result<u64, StorageError> {
        Ok(self.db.generate_id()?)
    }
}
