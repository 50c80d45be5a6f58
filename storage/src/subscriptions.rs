//! The subscriptions keyspace: opaque records by id, ids from a durable counter, each
//! record's revision, and the tombstones of deleted ids. Copies placed by other nodes
//! (quorum replication) follow [`crate::newest`]: the highest revision wins and a deletion
//! is final, so a node that was down while a subscription changed never brings an old
//! version, or a deleted one, back.

use super::*;

/// Makes `tree` hold exactly `want` (key, value), in key order: only what differs is
/// written, and the keys not wanted are removed. A registry replaced at a million
/// subscriptions is mostly what the disk holds already; sled's `clear` and a full rewrite
/// took minutes there.
fn sync_tree<'a>(
    tree: &sled::Tree,
    want: impl Iterator<Item = ([u8; 8], &'a [u8])>,
) -> Result<(), StorageError> {
    let mut have = tree.iter();
    let mut cur = have.next().transpose()?;
    for (k, v) in want {
        while let Some((hk, _)) = &cur
            && hk.as_ref() < &k[..]
        {
            tree.remove(hk)?;
            cur = have.next().transpose()?;
        }
        match &cur {
            Some((hk, hv)) if hk.as_ref() == &k[..] => {
                if hv.as_ref() != v {
                    tree.insert(k, v)?;
                }
                cur = have.next().transpose()?;
            }
            _ => {
                tree.insert(k, v)?;
            }
        }
    }
    while let Some((hk, _)) = cur {
        tree.remove(hk)?;
        cur = have.next().transpose()?;
    }
    Ok(())
}

fn corrupt(tree: &'static str) -> StorageError {
    StorageError::Corrupt {
        tree,
        source: CodecError::Truncated,
    }
}

pub(super) fn be_u64(v: &[u8], tree: &'static str) -> Result<u64, StorageError> {
    <[u8; 8]>::try_from(v)
        .map(u64::from_be_bytes)
        .map_err(|_| corrupt(tree))
}

fn be_u32(v: &[u8], tree: &'static str) -> Result<u32, StorageError> {
    <[u8; 4]>::try_from(v)
        .map(u32::from_be_bytes)
        .map_err(|_| corrupt(tree))
}

/// The id of the next key of `it`, without taking it (an error is taken and returned).
fn peek_id(
    it: &mut std::iter::Peekable<sled::Iter>,
    tree: &'static str,
) -> Result<Option<u64>, StorageError> {
    match it.peek() {
        Some(Ok((k, _))) => be_u64(k, tree).map(Some),
        Some(Err(_)) => match it.next() {
            Some(Err(e)) => Err(e.into()),
            _ => Ok(None),
        },
        None => Ok(None),
    }
}

impl Store {
    /// A fresh subscription id (monotonic, durable across restarts).
    pub fn next_subscription_id(&self) -> Result<u64, StorageError> {
        let counted = self.db.generate_id()? + 1;
        if self.subscription_id_floor.load(Ordering::Acquire) == 0 {
            return Ok(counted);
        }
        // both sequences only grow, so their maximum does too
        let floor = self.subscription_id_floor.fetch_add(1, Ordering::AcqRel);
        Ok(counted.max(floor))
    }

    /// A revision for a change to a subscription: drawn from the same counter as ids, so it
    /// is above every id and revision this store handed out before, and (from an elected
    /// coordinator's epoch floor) above every one an earlier leader handed out.
    pub fn next_subscription_revision(&self) -> Result<u64, StorageError> {
        self.next_subscription_id()
    }

    /// Hands subscription ids out from `floor` on (if that is above what was handed out):
    /// an elected coordinator numbers from its epoch, so no two leaders hand out one id.
    pub fn raise_subscription_ids(&self, floor: u64) {
        self.subscription_id_floor
            .fetch_max(floor, Ordering::AcqRel);
    }

    pub(crate) fn write_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.subs_write.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces every stored subscription with `records` (id, revision, encoded record) and
    /// records `deleted` as deleted, durably: a new coordinator leader's registry, rebuilt
    /// from the nodes' copies. Tombstones already here stay, and a record whose id is one
    /// of them is not taken. The tail state goes (the caller writes the new one), and so
    /// does the start of a leadership's Creates in the journal. The answer is how many
    /// subscriptions the store holds now.
    pub async fn replace_subscriptions(
        &self,
        records: &[(u64, u64, Vec<u8>)],
        deleted: &[u64],
    ) -> Result<usize, StorageError> {
        // a crash part way leaves a registry no tail state describes: none is kept
        self.set_tail_state_unflushed(None)?;
        self.commit().await?;
        let held = {
            let _w = self.write_lock();
            self.placed.clear()?;
            self.changes.restart()?;
            let now = now_ms().to_be_bytes();
            for id in deleted {
                if !self.deleted.contains_key(id.to_be_bytes())? {
                    self.deleted.insert(id.to_be_bytes(), &now[..])?;
                }
            }
            let mut kept = Vec::with_capacity(records.len());
            for r in records {
                if !self.deleted.contains_key(r.0.to_be_bytes())? {
                    kept.push(r);
                }
            }
            if !kept.is_sorted_by_key(|r| r.0) {
                kept.sort_by_key(|r| r.0);
            }
            kept.dedup_by_key(|r| r.0);
            let revisions: Vec<[u8; 8]> = kept.iter().map(|r| r.1.to_be_bytes()).collect();
            sync_tree(
                &self.subs,
                kept.iter()
                    .map(|(id, _, r)| (id.to_be_bytes(), r.as_slice())),
            )?;
            sync_tree(
                &self.revisions,
                kept.iter()
                    .zip(&revisions)
                    .map(|((id, _, _), rev)| (id.to_be_bytes(), &rev[..])),
            )?;
            // the registry is the nodes' now: no Create of a leadership is left to undo
            self.forget_led_from()?;
            kept.len()
        };
        self.commit().await?;
        Ok(held)
    }

    /// Stores (or replaces) the registry's record of a subscription at `revision`, durably
    /// (the registry is the authority: no comparison of revisions). False, and nothing
    /// written, if the subscription was deleted.
    pub async fn put_subscription(
        &self,
        id: u64,
        record: Vec<u8>,
        revision: u64,
    ) -> Result<bool, StorageError> {
        {
            let _w = self.write_lock();
            if self.deleted.contains_key(id.to_be_bytes())? {
                return Ok(false);
            }
            self.journal(id)?;
            self.subs.insert(id.to_be_bytes(), record)?;
            self.revisions
                .insert(id.to_be_bytes(), &revision.to_be_bytes()[..])?;
            self.changes.note(id)?;
        }
        self.commit().await?;
        Ok(true)
    }

    /// [`Store::put_subscription`] for many records `(id, record, revision)` with one
    /// durable write; the answer says of each whether it was stored (not deleted before).
    pub async fn put_subscriptions(
        &self,
        records: &[(u64, Vec<u8>, u64)],
    ) -> Result<Vec<bool>, StorageError> {
        let mut stored = Vec::with_capacity(records.len());
        {
            let _w = self.write_lock();
            for (id, record, revision) in records {
                if self.deleted.contains_key(id.to_be_bytes())? {
                    stored.push(false);
                    continue;
                }
                self.journal(*id)?;
                self.subs.insert(id.to_be_bytes(), record.as_slice())?;
                self.revisions
                    .insert(id.to_be_bytes(), &revision.to_be_bytes()[..])?;
                self.changes.note(*id)?;
                stored.push(true);
            }
        }
        self.commit().await?;
        Ok(stored)
    }

    /// What this store holds of subscription `id`.
    pub fn subscription_held(&self, id: u64) -> Result<Held, StorageError> {
        if self.deleted.contains_key(id.to_be_bytes())? {
            return Ok(Held::Deleted);
        }
        if !self.subs.contains_key(id.to_be_bytes())? {
            return Ok(Held::Absent);
        }
        Ok(Held::Revision(
            match self.revisions.get(id.to_be_bytes())? {
                Some(v) => be_u64(&v, "subscription_revisions")?,
                None => 0,
            },
        ))
    }

    /// Takes a copy of subscription `id` at `revision` if it is newer than what is held
    /// (never after its deletion), not yet durable; with `only_if_held`, only in place of a
    /// copy held (an update never adds one). `placed_by`: the node that took its Create (a
    /// quorum copy); `None` keeps what was recorded. The answer is whether it was taken.
    pub fn apply_subscription_copy_unflushed(
        &self,
        id: u64,
        record: &[u8],
        revision: u64,
        placed_by: Option<u32>,
        only_if_held: bool,
    ) -> Result<bool, StorageError> {
        let _w = self.write_lock();
        let held = self.subscription_held(id)?;
        if (only_if_held && !matches!(held, Held::Revision(_))) || !replaces(held, revision) {
            return Ok(false);
        }
        self.subs.insert(id.to_be_bytes(), record)?;
        self.revisions
            .insert(id.to_be_bytes(), &revision.to_be_bytes()[..])?;
        if let Some(by) = placed_by {
            self.placed
                .insert(id.to_be_bytes(), &by.to_be_bytes()[..])?;
        }
        self.changes.note(id)?;
        Ok(true)
    }

    /// Up to `limit` subscription ids above `after`, in id order: the copies that a node in
    /// `placed_by` placed, and every tombstone (a returning node and a rebuild need every
    /// deletion). With `changed_only`, only what changed since a Create: the tombstones and
    /// the copies of updated subscriptions (revision above the id).
    pub fn subscription_copies(
        &self,
        after: u64,
        limit: usize,
        placed_by: &std::collections::HashSet<u32>,
        changed_only: bool,
    ) -> Result<Vec<SubCopy>, StorageError> {
        let mut out = Vec::new();
        if after == u64::MAX {
            return Ok(out);
        }
        let from = after.saturating_add(1).to_be_bytes();
        // copies are walked by the placed tree, or (changed only) by the revisions
        let (walked, walked_name) = if changed_only {
            (&self.revisions, "subscription_revisions")
        } else {
            (&self.placed, "subscription_placed")
        };
        let mut copies = walked.range(from..).peekable();
        let mut tombs = self.deleted.range(from..).peekable();
        while out.len() < limit {
            let next_copy = peek_id(&mut copies, walked_name)?;
            let next_tomb = peek_id(&mut tombs, "subscription_deleted")?;
            let take_copy = match (next_copy, next_tomb) {
                (None, None) => break,
                (Some(c), Some(t)) => c < t,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            if take_copy {
                let Some((k, v)) = copies.next().transpose()? else {
                    break;
                };
                // walking the placed tree, its value is the placer already
                let placer = if changed_only { None } else { Some(v) };
                if let Some(c) = self.listed_copy(&k, placer, placed_by, changed_only)? {
                    out.push(c);
                }
            } else if let Some(t) = next_tomb {
                if next_copy == Some(t) {
                    copies.next(); // a copy left behind a tombstone is deleted
                }
                tombs.next();
                out.push(SubCopy {
                    id: t,
                    revision: 0,
                    placed_by: None,
                    record: None,
                });
            }
        }
        Ok(out)
    }

    /// Subscription `id` as [`Store::subscription_copies`] would list it now: its tombstone,
    /// its copy, or nothing (not held, or filtered out).
    pub(crate) fn current_copy(
        &self,
        id: u64,
        placed_by: &std::collections::HashSet<u32>,
        changed_only: bool,
    ) -> Result<Option<SubCopy>, StorageError> {
        if self.deleted.contains_key(id.to_be_bytes())? {
            return Ok(Some(SubCopy {
                id,
                revision: 0,
                placed_by: None,
                record: None,
            }));
        }
        self.listed_copy(&id.to_be_bytes(), None, placed_by, changed_only)
    }

    /// The copy under key `k` if `placed_by` placed it (and, `changed_only`, if it was
    /// updated since its Create); `placer`: its entry in the placed tree, when the caller
    /// read it already.
    fn listed_copy(
        &self,
        k: &[u8],
        placer: Option<sled::IVec>,
        placed_by: &std::collections::HashSet<u32>,
        changed_only: bool,
    ) -> Result<Option<SubCopy>, StorageError> {
        let id = be_u64(k, "subscriptions")?;
        let revision = match self.revisions.get(k)? {
            Some(r) => be_u64(&r, "subscription_revisions")?,
            None => 0,
        };
        if changed_only && revision <= id {
            return Ok(None);
        }
        let placer = match placer {
            Some(p) => Some(p),
            None => self.placed.get(k)?,
        };
        let Some(by) = placer else {
            return Ok(None); // a registry record, not a placed copy
        };
        let by = be_u32(&by, "subscription_placed")?;
        if !placed_by.contains(&by) {
            return Ok(None);
        }
        Ok(self.subs.get(k)?.map(|record| SubCopy {
            id,
            revision,
            placed_by: Some(by),
            record: Some(record.to_vec()),
        }))
    }

    /// Deletes subscription `id` for good, not yet durable: its record goes and its
    /// tombstone stays, so no copy of it is taken again. The answer is whether a record
    /// was there.
    pub fn remove_subscription_unflushed(&self, id: u64) -> Result<bool, StorageError> {
        let _w = self.write_lock();
        let new_tombstone = !self.deleted.contains_key(id.to_be_bytes())?;
        if new_tombstone {
            self.deleted
                .insert(id.to_be_bytes(), &now_ms().to_be_bytes()[..])?;
        }
        self.placed.remove(id.to_be_bytes())?;
        self.revisions.remove(id.to_be_bytes())?;
        let existed = self.subs.remove(id.to_be_bytes())?.is_some();
        // a deletion known already is no change (the feed stays quiet)
        if new_tombstone || existed {
            self.changes.note(id)?;
        }
        Ok(existed)
    }

    /// Whether subscription `id` was deleted (and its tombstone is still kept).
    pub fn subscription_deleted(&self, id: u64) -> Result<bool, StorageError> {
        Ok(self.deleted.contains_key(id.to_be_bytes())?)
    }

    /// Forgets the tombstones of deletions made before `before_ms` (unix ms); the answer is
    /// how many. A node down for longer than tombstones are kept must rejoin with a fresh
    /// disk, or an old copy of its could come back.
    pub fn prune_subscription_tombstones(&self, before_ms: u64) -> Result<usize, StorageError> {
        let _w = self.write_lock();
        let mut gone = 0;
        for kv in self.deleted.iter() {
            let (k, v) = kv?;
            if be_u64(&v, "subscription_deleted")? < before_ms {
                self.deleted.remove(k)?;
                gone += 1;
            }
        }
        Ok(gone)
    }

    /// A subscription record.
    pub fn get_subscription(&self, id: u64) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.subs.get(id.to_be_bytes())?.map(|v| v.to_vec()))
    }

    /// Up to `limit` records with ids above `after`, in id order.
    pub fn list_subscriptions(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let mut out = Vec::new();
        let start = after.saturating_add(1).to_be_bytes();
        if after == u64::MAX {
            return Ok(out);
        }
        for kv in self.subs.range(start..).take(limit) {
            let (k, v) = kv?;
            let id = <[u8; 8]>::try_from(k.as_ref())
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            out.push((id, v.to_vec()));
        }
        Ok(out)
    }

    /// Deletes a subscription durably, leaving its tombstone; false if it did not exist.
    pub async fn delete_subscription(&self, id: u64) -> Result<bool, StorageError> {
        let existed = self.remove_subscription_unflushed(id)?;
        self.commit().await?;
        Ok(existed)
    }

    /// Number of subscriptions.
    pub fn subscription_count(&self) -> usize {
        self.subs.len()
    }
}
