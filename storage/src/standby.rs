//! The standby keyspace (active-passive federation): copies of a primary cluster's objects
//! that this node keeps, without disseminating them, until it is promoted or they expire.
//! Key: the origin cluster, a NUL, the origin node (4 bytes) and sequence number (8 bytes),
//! big endian, so one origin node's copies are one range in its order; value: when the copy
//! expires (unix ms, 8 bytes) and the encoded object. Beside them, in `meta`, each origin
//! node's finished-watermark (every object below it finished dissemination at the primary:
//! copies of those are dropped, and any that still arrive are not kept) and this node's role
//! (active or standby, and its epoch).

use super::*;

/// This node's active-passive role.
const META_ROLE: &[u8] = b"federation_role";
/// Prefix of the finished-watermarks: `standby_wm`, cluster, NUL, node.
const META_WATERMARK: &[u8] = b"standby_wm\0";

fn origin_prefix(cluster: &str, node: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(cluster.len() + 13);
    k.extend_from_slice(cluster.as_bytes());
    k.push(0);
    k.extend_from_slice(&node.to_be_bytes());
    k
}

fn copy_key(cluster: &str, node: u32, seq: u64) -> Vec<u8> {
    let mut k = origin_prefix(cluster, node);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn watermark_key(cluster: &str, node: u32) -> Vec<u8> {
    let mut k = META_WATERMARK.to_vec();
    k.extend_from_slice(&origin_prefix(cluster, node));
    k
}

fn expires_of(v: &[u8]) -> u64 {
    v.get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_be_bytes)
}

/// A kept copy as read back: its key (for [`Store::standby_remove`]) and its encoding.
pub type KeptCopy = (Vec<u8>, Vec<u8>);

/// One standby copy to keep: its origin sequence number, when it expires, its encoding.
#[derive(Debug, Clone, Copy)]
pub struct StandbyCopy<'a> {
    pub seq: u64,
    pub expires_unix_ms: u64,
    pub bytes: &'a [u8],
}

impl Store {
    /// This node's role: (active, epoch, the primary cluster it last kept copies of). A node
    /// that never recorded one is active at epoch 0 with no primary.
    pub fn federation_role(&self) -> Result<(bool, u64, String), StorageError> {
        Ok(match self.meta.get(META_ROLE)? {
            Some(v) if v.len() >= 9 => (
                v[0] == 1,
                <[u8; 8]>::try_from(&v[1..9]).map_or(0, u64::from_be_bytes),
                String::from_utf8_lossy(&v[9..]).into_owned(),
            ),
            _ => (true, 0, String::new()),
        })
    }

    /// Records this node's role; durable with the next [`Store::commit`].
    pub fn set_federation_role(
        &self,
        active: bool,
        epoch: u64,
        primary: &str,
    ) -> Result<(), StorageError> {
        let mut v = vec![u8::from(active)];
        v.extend_from_slice(&epoch.to_be_bytes());
        v.extend_from_slice(primary.as_bytes());
        self.meta.insert(META_ROLE, v)?;
        Ok(())
    }

    /// The finished-watermark of `cluster`'s node `node` (0 when none arrived).
    pub fn standby_watermark(&self, cluster: &str, node: u32) -> Result<u64, StorageError> {
        Ok(self
            .meta
            .get(watermark_key(cluster, node))?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_be_bytes))
    }

    /// Keeps copies of `cluster`'s node `node` (durable with the next commit), except those
    /// below its finished-watermark or already expired at `now`. Returns (kept new, seen
    /// before or not kept).
    pub fn standby_keep(
        &self,
        cluster: &str,
        node: u32,
        copies: &[StandbyCopy<'_>],
        now: u64,
    ) -> Result<(u32, u32), StorageError> {
        let below = self.standby_watermark(cluster, node)?;
        let (mut new, mut not) = (0, 0);
        for c in copies {
            if c.seq < below || c.expires_unix_ms <= now {
                not += 1;
                continue;
            }
            let mut v = Vec::with_capacity(8 + c.bytes.len());
            v.extend_from_slice(&c.expires_unix_ms.to_be_bytes());
            v.extend_from_slice(c.bytes);
            if self
                .standby
                .insert(copy_key(cluster, node, c.seq), v)?
                .is_some()
            {
                not += 1;
            } else {
                new += 1;
            }
        }
        Ok((new, not))
    }

    /// The primary finished everything of `cluster`'s node `node` below `below`: raises the
    /// watermark and drops those copies. Returns how many were dropped.
    pub fn standby_finished(
        &self,
        cluster: &str,
        node: u32,
        below: u64,
    ) -> Result<usize, StorageError> {
        if below <= self.standby_watermark(cluster, node)? {
            return Ok(0);
        }
        self.meta
            .insert(watermark_key(cluster, node), &below.to_be_bytes())?;
        let from = copy_key(cluster, node, 0);
        let to = copy_key(cluster, node, below);
        let mut b = sled::Batch::default();
        let mut n = 0;
        for kv in self.standby.range(from..to) {
            b.remove(kv?.0);
            n += 1;
        }
        self.standby.apply_batch(b)?;
        Ok(n)
    }

    /// Drops the copies expired at `now`; returns how many.
    pub fn standby_expire(&self, now: u64) -> Result<usize, StorageError> {
        let mut b = sled::Batch::default();
        let mut n = 0;
        for kv in self.standby.iter() {
            let (k, v) = kv?;
            if expires_of(&v) <= now {
                b.remove(k);
                n += 1;
            }
        }
        self.standby.apply_batch(b)?;
        Ok(n)
    }

    /// Up to `limit` copies not expired at `now`, in key order: (key, encoded object). The
    /// caller disseminates them, then removes them with [`Store::standby_remove`].
    pub fn standby_live(&self, now: u64, limit: usize) -> Result<Vec<KeptCopy>, StorageError> {
        let mut out = Vec::new();
        for kv in self.standby.iter() {
            if out.len() >= limit {
                break;
            }
            let (k, v) = kv?;
            if expires_of(&v) > now {
                out.push((k.to_vec(), v[8..].to_vec()));
            }
        }
        Ok(out)
    }

    /// Removes copies by key.
    pub fn standby_remove(&self, keys: &[Vec<u8>]) -> Result<(), StorageError> {
        let mut b = sled::Batch::default();
        for k in keys {
            b.remove(k.as_slice());
        }
        self.standby.apply_batch(b)?;
        Ok(())
    }

    /// Standby copies kept now.
    pub fn standby_len(&self) -> usize {
        self.standby.len()
    }

    /// Every object of this node below this sequence number has finished dissemination
    /// (the primary's finished-watermark).
    pub fn finished_below(&self) -> u64 {
        self.outbox_floor()
    }
}
