//! The federation keyspace: what this node owes each peer cluster it links to. Key: the
//! link's name, a NUL, and the object's sequence number (big endian, so a link's entries are
//! one range in the order the node took the objects); value: the encoded object as it goes
//! out. An entry stays until the peer acknowledged it, so what is owed survives restarts of
//! either side and link outages; it is durable with the next commit.
//!
//! An entry owed for another node's object (a copy this node took over from a lost origin)
//! has a longer key: a fresh sequence number of this node's (so it sorts with the rest and
//! collides with no object of this node's), then the object's origin and sequence number. An
//! index beside them (object -> link -> entry) says whether any link still owes such an
//! object.
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

/// An entry for another node's object `id`, at this node's fresh sequence number `entry`.
fn foreign_key(link: &str, entry: u64, id: ObjectId) -> Vec<u8> {
    let mut k = link_key(link, entry);
    k.extend_from_slice(&id.node.to_be_bytes());
    k.extend_from_slice(&id.seq.to_be_bytes());
    k
}

/// The prefix of the index of entries owed for other nodes' objects.
const OWING: &[u8] = b"\x03owing\0";

fn owing_prefix(id: ObjectId) -> Vec<u8> {
    let mut k = OWING.to_vec();
    k.extend_from_slice(&id.node.to_be_bytes());
    k.extend_from_slice(&id.seq.to_be_bytes());
    k
}

fn owing_key(id: ObjectId, link: &str) -> Vec<u8> {
    let mut k = owing_prefix(id);
    k.extend_from_slice(link.as_bytes());
    k
}

/// One entry a link is owed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkEntry {
    /// Its place in the link's order (this node's sequence numbers).
    pub key: u64,
    /// The other node's object it is owed for (`None`: this node's object `key`, or a
    /// spillover link's delivery).
    pub foreign: Option<ObjectId>,
    /// The encoded object (or delivery) as it goes out.
    pub bytes: Vec<u8>,
}

impl LinkEntry {
    /// The object this entry carries, given this node's id: the foreign one, else this
    /// node's object `key`.
    pub fn object(&self, me: u32) -> ObjectId {
        self.foreign.unwrap_or(ObjectId {
            node: me,
            seq: self.key,
        })
    }
}

fn decode_entry_key(link: &str, k: &[u8]) -> Option<(u64, Option<ObjectId>)> {
    let rest = k.get(link.len() + 1..)?;
    let key = u64::from_be_bytes(<[u8; 8]>::try_from(rest.get(..8)?).ok()?);
    match rest.len() {
        8 => Some((key, None)),
        20 => {
            let node = u32::from_be_bytes(<[u8; 4]>::try_from(&rest[8..12]).ok()?);
            let seq = u64::from_be_bytes(<[u8; 8]>::try_from(&rest[12..20]).ok()?);
            Some((key, Some(ObjectId { node, seq })))
        }
        _ => None,
    }
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

    /// Owes `link` another node's object `id` (a copy this node took over; its encoding
    /// `bytes`); durable with the next [`Store::commit`]. `false` when it is owed already.
    pub fn link_owe_foreign(
        &self,
        link: &str,
        id: ObjectId,
        bytes: &[u8],
    ) -> Result<bool, StorageError> {
        let index = owing_key(id, link);
        if self.links.contains_key(&index)? {
            return Ok(false);
        }
        let entry = self.next_seq(0, false)?;
        let mut b = sled::Batch::default();
        b.insert(foreign_key(link, entry, id), bytes);
        b.insert(index, &entry.to_be_bytes()[..]);
        self.links.apply_batch(b)?;
        Ok(true)
    }

    /// Whether `link` still owes this node's object `seq`.
    pub fn link_owes_own(&self, link: &str, seq: u64) -> Result<bool, StorageError> {
        Ok(self.links.contains_key(link_key(link, seq))?)
    }

    /// Whether any link still owes another node's object `id`.
    pub fn link_owes_foreign(&self, id: ObjectId) -> Result<bool, StorageError> {
        Ok(self
            .links
            .scan_prefix(owing_prefix(id))
            .next()
            .transpose()?
            .is_some())
    }

    /// This node's objects above `after` that `link` still owes, in order, at most `limit`.
    pub fn link_owed_own_after(
        &self,
        link: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<u64>, StorageError> {
        let mut out = Vec::new();
        if after == u64::MAX {
            return Ok(out);
        }
        // just past the link's entries
        let mut end = link_prefix(link);
        end.pop();
        end.push(1);
        for k in self.links.range(link_key(link, after + 1)..end).keys() {
            if out.len() >= limit {
                break;
            }
            if let Some((seq, None)) = decode_entry_key(link, &k?) {
                out.push(seq);
            }
        }
        Ok(out)
    }

    /// The first `limit` entries `link` is owed, in order.
    pub fn link_owed(&self, link: &str, limit: usize) -> Result<Vec<LinkEntry>, StorageError> {
        let mut out = Vec::new();
        for kv in self.links.scan_prefix(link_prefix(link)).take(limit) {
            let (k, v) = kv?;
            if let Some((key, foreign)) = decode_entry_key(link, &k) {
                out.push(LinkEntry {
                    key,
                    foreign,
                    bytes: v.to_vec(),
                });
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
            let k = kv?.0;
            if let Some((_, Some(id))) = decode_entry_key(name, &k) {
                b.remove(owing_key(id, name));
            }
            b.remove(k);
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

    /// The peer acknowledged these entries of `link` (key, foreign object).
    pub fn link_acked(
        &self,
        link: &str,
        entries: &[(u64, Option<ObjectId>)],
    ) -> Result<(), StorageError> {
        let mut b = sled::Batch::default();
        for &(key, foreign) in entries {
            match foreign {
                None => b.remove(link_key(link, key)),
                Some(id) => {
                    b.remove(foreign_key(link, key, id));
                    b.remove(owing_key(id, link));
                }
            }
        }
        self.links.apply_batch(b)?;
        Ok(())
    }
}
