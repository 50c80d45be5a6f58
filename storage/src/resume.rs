//! What lets a coordinator's registry resume after a restart or a leadership instead of
//! being rebuilt from a million copies (issue 31: a restarted standby took 8–12 s to be
//! ready again, and the next election found none). The standby's tail writes, with every
//! round, where it stands in each node's change feed (the *tail state*, opaque here). While
//! the coordinator leads it writes its registry itself, and each such write is journaled
//! (`led`) before the record, so a registry found on disk is always the nodes' copies as
//! of the tail state, plus the journaled writes (a Create stored here whose replication to
//! the nodes then failed must not outlive the leadership). The journal is cheap to keep
//! and to clear at any size: the leadership's Creates are every id from the first one it
//! handed out (ids only grow, and a leadership numbers from its epoch), and only its
//! Updates of older subscriptions are listed one by one. A resuming tail sets each
//! journaled id to what a whole node holds, clears the journal, and takes the nodes'
//! changes since the tail state.

use std::sync::atomic::Ordering;

use super::*;

/// The meta key of the tail state.
const META_TAIL_STATE: &[u8] = b"registry_tail_state";

/// The meta key of the first id a leadership handed out (every id from it on is a Create
/// of that leadership, or of a later one).
const META_LED_FROM: &[u8] = b"registry_led_from";

/// What a leadership wrote to the registry, since the journal was last cleared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Journal {
    /// The first id it handed out: every record from it on is one of its Creates.
    pub from: Option<u64>,
    /// The older subscriptions it updated (ids below `from`), in order.
    pub updated: Vec<u64>,
}

impl Journal {
    pub fn is_empty(&self) -> bool {
        self.from.is_none() && self.updated.is_empty()
    }
}

impl Store {
    /// From now on every registry write is journaled: this coordinator leads. Call it once
    /// the ids are raised to the leadership's floor: its Creates are the ids from the next
    /// one on (recorded here, unless an earlier leadership not yet undone recorded a lower
    /// one), its Updates of older subscriptions are journaled one by one.
    pub fn journal_registry_writes(&self) -> Result<(), StorageError> {
        let from = match self.meta.get(META_LED_FROM)? {
            Some(v) => subscriptions::be_u64(&v, "meta")?,
            None => {
                let from = self.next_subscription_id()?;
                self.meta.insert(META_LED_FROM, &from.to_be_bytes())?;
                from
            }
        };
        self.led_from.store(from, Ordering::Release);
        Ok(())
    }

    /// Journals a registry write of `id` (under the subscription write lock, before the
    /// record: a record the disk kept has its journal entry). A Create of this leadership
    /// (an id from its first on) needs none.
    pub(crate) fn journal(&self, id: u64) -> Result<(), StorageError> {
        let from = self.led_from.load(Ordering::Acquire);
        if from != 0 && id < from {
            self.led.insert(id.to_be_bytes(), &[][..])?;
        }
        Ok(())
    }

    /// What leaderships wrote since the journal was last cleared.
    pub fn registry_journal(&self) -> Result<Journal, StorageError> {
        let from = match self.meta.get(META_LED_FROM)? {
            Some(v) => Some(subscriptions::be_u64(&v, "meta")?),
            None => None,
        };
        let updated = self
            .led
            .iter()
            .keys()
            .map(|k| subscriptions::be_u64(&k?, "registry_led"))
            .collect::<Result<_, _>>()?;
        Ok(Journal { from, updated })
    }

    /// Clears `journal` (as [`Store::registry_journal`] read it), not yet durable; writes
    /// are no longer journaled (until the next leadership).
    pub fn clear_registry_journal_unflushed(&self, journal: &Journal) -> Result<(), StorageError> {
        let _w = self.write_lock();
        self.led_from.store(0, Ordering::Release);
        self.meta.remove(META_LED_FROM)?;
        for id in &journal.updated {
            self.led.remove(id.to_be_bytes())?;
        }
        Ok(())
    }

    /// Forgets where a leadership's Creates start (the registry was replaced by the
    /// nodes' copies), under the write lock. Journaled updates stay: set again to the
    /// nodes' copies at the next resume, harmlessly (clearing a large tree is slow).
    pub(crate) fn forget_led_from(&self) -> Result<(), StorageError> {
        self.led_from.store(0, Ordering::Release);
        self.meta.remove(META_LED_FROM)?;
        Ok(())
    }

    /// The ids of the records held from `from` on, in order.
    pub fn subscription_ids_from(&self, from: u64) -> Result<Vec<u64>, StorageError> {
        self.subs
            .range(from.to_be_bytes()..)
            .keys()
            .map(|k| subscriptions::be_u64(&k?, "subscriptions"))
            .collect()
    }

    /// The tail state written last, if any.
    pub fn tail_state(&self) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.meta.get(META_TAIL_STATE)?.map(|v| v.to_vec()))
    }

    /// Writes the tail state (`None`: removes it), not yet durable. Written after the
    /// changes it describes, under the write lock: a disk that kept it kept them.
    pub fn set_tail_state_unflushed(&self, state: Option<&[u8]>) -> Result<(), StorageError> {
        let _w = self.write_lock();
        match state {
            Some(s) => self.meta.insert(META_TAIL_STATE, s)?,
            None => self.meta.remove(META_TAIL_STATE)?,
        };
        Ok(())
    }
    /// Sets subscription `id` to what a node holds: `Some((revision, record))`, whatever
    /// revision is held here (a journaled update may have a higher one that no node took),
    /// or `None`, no record (no tombstone either). A tombstone here stays. Not yet durable;
    /// the answer is whether a record is held now.
    pub fn set_subscription_unflushed(
        &self,
        id: u64,
        to: Option<(u64, &[u8])>,
    ) -> Result<bool, StorageError> {
        let _w = self.write_lock();
        let k = id.to_be_bytes();
        if self.deleted.contains_key(k)? {
            return Ok(false);
        }
        match to {
            Some((revision, record)) => {
                self.subs.insert(k, record)?;
                self.revisions.insert(k, &revision.to_be_bytes()[..])?;
            }
            None => {
                self.subs.remove(k)?;
                self.revisions.remove(k)?;
                self.placed.remove(k)?;
            }
        }
        self.changes.note(id)?;
        Ok(to.is_some())
    }
}
