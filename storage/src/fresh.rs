//! Objects this node wrote lately, kept in memory: each new object is read back once soon
//! after its put (delivery reads it to push it), and that read is otherwise a sled lookup
//! and an object-log read. Bounded by count and bytes; a deleted object leaves it with its
//! record, so it never answers for an object sled no longer has.

use std::collections::VecDeque;

use blocks::hash::FastMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::objects::StoredObject;

/// Most objects kept: a backlog of this many new objects (a burst the node matches and
/// pushes behind its writers) is still read from memory.
const MAX_OBJECTS: usize = 262_144;
/// Most bytes kept (data, ids and metadata, as [`size`] counts them).
const MAX_BYTES: usize = 64 << 20;
/// Objects larger than this are not kept (they would push out many small ones).
const MAX_OBJECT_BYTES: usize = 256 << 10;

#[derive(Default)]
struct Inner {
    by_seq: FastMap<u64, Arc<StoredObject>>,
    /// Sequence numbers, oldest first (some may have left `by_seq` already).
    order: VecDeque<u64>,
    bytes: usize,
}

/// The recently written objects of one store (shared by its clones).
#[derive(Clone, Default)]
pub(crate) struct Fresh(Arc<Mutex<Inner>>);

impl std::fmt::Debug for Fresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.lock();
        f.debug_struct("Fresh")
            .field("objects", &c.by_seq.len())
            .field("bytes", &c.bytes)
            .finish()
    }
}

/// What an object kept costs, about: its data, ids and metadata, and a fixed overhead.
fn size(o: &StoredObject) -> usize {
    let meta: usize = o
        .metadata
        .iter()
        .map(|(name, v)| {
            name.len()
                + 48
                + match v {
                    blocks::Value::Str(s) => s.len(),
                    blocks::Value::Num(_) => 0,
                }
        })
        .sum();
    o.data.len() + o.external_id.len() + o.message_id.len() + meta + 160
}

impl Fresh {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `o`, written as sequence number `seq`, pushing out the oldest past the bounds.
    pub(crate) fn keep(&self, seq: u64, o: Arc<StoredObject>) {
        let n = size(&o);
        if o.data.len() > MAX_OBJECT_BYTES {
            return;
        }
        let mut c = self.lock();
        if let Some(old) = c.by_seq.insert(seq, o) {
            c.bytes -= size(&old);
        } else {
            c.order.push_back(seq);
        }
        c.bytes += n;
        while c.by_seq.len() > MAX_OBJECTS || c.bytes > MAX_BYTES {
            let Some(s) = c.order.pop_front() else {
                break;
            };
            if let Some(old) = c.by_seq.remove(&s) {
                c.bytes -= size(&old);
            }
        }
        if c.order.len() > 2 * MAX_OBJECTS {
            // forgotten objects left their numbers behind
            let Inner { by_seq, order, .. } = &mut *c;
            order.retain(|s| by_seq.contains_key(s));
        }
    }

    /// A copy of the object written as `seq`, if it is still kept.
    pub(crate) fn get(&self, seq: u64) -> Option<Arc<StoredObject>> {
        self.lock().by_seq.get(&seq).cloned()
    }

    /// Forgets the object written as `seq` (it is being deleted).
    pub(crate) fn forget(&self, seq: u64) {
        let mut c = self.lock();
        if let Some(old) = c.by_seq.remove(&seq) {
            c.bytes -= size(&old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ObjectId;

    fn obj(seq: u64, bytes: usize) -> Arc<StoredObject> {
        Arc::new(StoredObject {
            id: ObjectId { node: 1, seq },
            data: vec![7; bytes],
            external_id: String::new(),
            metadata: Vec::new(),
            priority: 0,
            message_id: String::new(),
            received_unix_ms: 0,
        })
    }

    #[test]
    fn keeps_the_latest_within_count_and_bytes_and_forgets_on_delete() {
        let f = Fresh::default();
        for s in 0..(MAX_OBJECTS as u64 + 10) {
            f.keep(s, obj(s, 10));
        }
        assert!(f.get(0).is_none() && f.get(9).is_none(), "the oldest left");
        assert_eq!(f.get(10).map(|o| o.id.seq), Some(10));
        let last = MAX_OBJECTS as u64 + 9;
        assert_eq!(f.get(last).map(|o| o.data.len()), Some(10));
        f.forget(last);
        assert!(f.get(last).is_none());
        // large objects are not kept, and bytes bound what is
        f.keep(1 << 40, obj(1 << 40, MAX_OBJECT_BYTES + 1));
        assert!(f.get(1 << 40).is_none());
        for s in 0..(MAX_BYTES / MAX_OBJECT_BYTES + 4) as u64 {
            f.keep(1_000_000 + s, obj(s, MAX_OBJECT_BYTES));
        }
        assert!(f.lock().bytes <= MAX_BYTES);
        assert!(f.get(1_000_000).is_none());
        assert!(f.lock().order.len() <= 2 * MAX_OBJECTS + 1);
    }
}
