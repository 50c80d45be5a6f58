//! The federation keyspace: what this node owes each peer cluster it links to. Key: the
//! link's name, a NUL, and the object's sequence number (big endian, so a link's entries are
//! one range in the order the node took the objects); value: the encoded object as it goes
//! out. An entry stays until the peer acknowledged it, so what is owed survives restarts of
//! either side and link outages; it is durable with the next commit.
//!
//! Beside them, under a prefix no link name has: this node's objects that an active-passive
//! standby acknowledged copies of while they were still in the outbox (unfinished here). A
//! node that starts as a standby hands those to the peer (it disseminated them when it was
//! promoted) instead of disseminating them again.

use super::*;

fn link_key(link: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(link.len() + 9);
    k.extend_from_slice(link.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The prefix of the copied-while-unfinished marks (no link name starts with a control byte).
const COPIED: &[u8] = b"\x01copied\0";

fn copied_key(seq: u64) -> Vec<u8> {
    let mut k = COPIED.to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The prefix of the links added at run time (`dissem link add`): name -> settings.
const ADDED: &[u8] = b"\x02added\0";

fn link_prefix(link: &str) -> Vec<u8> {
    let mut k = link.as_bytes().to_vec();
    k.push(0);
    k
}

impl Store {
    /// Owes `link` the object of sequence number `seq` (its encoding `bytes`); durable with
    /// the next [`Store::commit`]. Owing the same object again replaces the entry.
    pub fn link_owe(&self, link: &str, seq: u64, bytes: &[u8]) -> Result<(), StorageError> {
        self.links.insert(link_key(link, seq), bytes)?;
        Ok(())
    }

    /// The first `limit` entries `link` is owed, in order: (sequence number, bytes).
    pub fn link_owed(&self, link: &str, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let mut out = Vec::new();
        for kv in self.links.scan_prefix(link_prefix(link)).take(limit) {
            let (k, v) = kv?;
            if let Some(seq) = k
                .len()
                .checked_sub(8)
                .and_then(|at| <[u8; 8]>::try_from(&k[at..]).ok())
                .map(u64::from_be_bytes)
            {
                out.push((seq, v.to_vec()));
            }
        }
        Ok(out)
    }

    /// How many entries `link` is owed.
    pub fn link_owed_len(&self, link: &str) -> usize {
        self.links.scan_prefix(link_prefix(link)).count()
    }

    /// An active-passive standby acknowledged copies of these objects of this node: those
    /// still in the outbox are marked (durable with the next commit), and marks of objects
    /// that have left it since are dropped.
    pub fn note_copies(&self, seqs: &[u64]) -> Result<(), StorageError> {
        let mut b = sled::Batch::default();
        let me = self.node;
        for s in seqs {
            if self.in_outbox(ObjectId { node: me, seq: *s }) {
                b.insert(copied_key(*s), &[][..]);
            }
        }
        let floor = self.outbox_floor();
        for kv in self.links.range(copied_key(0)..copied_key(floor)) {
            b.remove(kv?.0);
        }
        self.links.apply_batch(b)?;
        Ok(())
    }

    /// Objects of this node still in the outbox that a standby holds copies of.
    pub fn copied_unfinished(&self) -> Result<Vec<ObjectId>, StorageError> {
        let me = self.node;
        let mut out = Vec::new();
        for kv in self.links.scan_prefix(COPIED) {
            let (k, _) = kv?;
            let seq = k
                .get(COPIED.len()..)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes);
            if let Some(seq) = seq
                && self.in_outbox(ObjectId { node: me, seq })
            {
                out.push(ObjectId { node: me, seq });
            }
        }
        Ok(out)
    }

    /// Keeps the settings of a link added at run time (opaque bytes); durable with the next
    /// commit.
    pub fn keep_link(&self, name: &str, settings: &[u8]) -> Result<(), StorageError> {
        let mut k = ADDED.to_vec();
        k.extend_from_slice(name.as_bytes());
        self.links.insert(k, settings)?;
        Ok(())
    }

    /// Forgets a link added at run time, and drops everything it owes; returns how many
    /// entries it owed. Durable with the next commit.
    pub fn forget_link(&self, name: &str) -> Result<u64, StorageError> {
        let mut k = ADDED.to_vec();
        k.extend_from_slice(name.as_bytes());
        let mut b = sled::Batch::default();
        b.remove(k);
        let mut dropped = 0;
        for kv in self.links.scan_prefix(link_prefix(name)) {
            b.remove(kv?.0);
            dropped += 1;
        }
        self.links.apply_batch(b)?;
        Ok(dropped)
    }

    /// The links added at run time: (name, settings), by name.
    pub fn kept_links(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let mut out = Vec::new();
        for kv in self.links.scan_prefix(ADDED) {
            let (k, v) = kv?;
            let name = String::from_utf8_lossy(&k[ADDED.len()..]).into_owned();
            out.push((name, v.to_vec()));
        }
        Ok(out)
    }

    /// The peer acknowledged these entries of `link`.
    pub fn link_acked(&self, link: &str, seqs: &[u64]) -> Result<(), StorageError> {
        let mut b = sled::Batch::default();
        for s in seqs {
            b.remove(link_key(link, *s));
        }
        self.links.apply_batch(b)?;
        Ok(())
    }
}
