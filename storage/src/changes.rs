//! The change feed of subscription copies: every write of a copy or a tombstone takes the
//! next number of a counter of this store's own, so a standby coordinator can tail a node
//! (everything changed after the last number it saw) and keep its registry current while
//! it stands by. An election then pulls only what changed since the last tail instead of
//! every copy of a million subscriptions (issue 31, hole 3).
//!
//! Numbers are handed out under the subscription write lock, in the order the writes are
//! made, so a reader that saw number `n` has seen every write numbered below it. Each id
//! keeps only its newest number (the older entry goes), so the feed holds one entry per
//! subscription. A store has an identity (`store_id`, drawn when it is created): a node
//! that comes back on a new disk counts from 1 again, and a tail that names the old
//! identity starts over with every copy.

use super::subscriptions::be_u64;
use super::*;

/// The feed's tree (named in a corruption error).
const FEED: &str = "subscription_changes";

const META_STORE_ID: &[u8] = b"store_id";

/// The first number of the feed since the registry was last replaced whole.
const META_FEED_FROM: &[u8] = b"feed_from";

/// The feed: number -> id, id -> its number, and the next number.
#[derive(Debug, Clone)]
pub(crate) struct Changes {
    by_number: sled::Tree,
    of_id: sled::Tree,
    next: Arc<AtomicU64>,
    /// Entries below it are of the feed before the registry was replaced: never read.
    from: Arc<AtomicU64>,
    store_id: Arc<AtomicU64>,
    meta: sled::Tree,
    /// Nobody tails this store (a coordinator's): writes are not numbered.
    off: Arc<std::sync::atomic::AtomicBool>,
}

/// Draws and records a new identity: the time in nanoseconds and the process, distinct for
/// every disk.
fn new_identity(meta: &sled::Tree) -> Result<u64, StorageError> {
    let id = (SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 40))
        | 1;
    meta.insert(META_STORE_ID, &id.to_be_bytes())?;
    Ok(id)
}

impl Changes {
    pub(crate) fn open(db: &sled::Db, meta: &sled::Tree) -> Result<Changes, StorageError> {
        let by_number = db.open_tree(FEED)?;
        let of_id = db.open_tree("subscription_changed_at")?;
        let last = match by_number.last()? {
            Some((k, _)) => be_u64(&k, FEED)?,
            None => 0,
        };
        let store_id = match meta.get(META_STORE_ID)? {
            Some(v) => <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .unwrap_or(0),
            None => 0,
        };
        let from = match meta.get(META_FEED_FROM)? {
            Some(v) => be_u64(&v, FEED)?,
            None => 0,
        };
        let store_id = if store_id != 0 {
            store_id
        } else {
            // the creation time in nanoseconds and the process: distinct for every disk
            new_identity(meta)?
        };
        Ok(Changes {
            by_number,
            of_id,
            next: Arc::new(AtomicU64::new((last + 1).max(from))),
            from: Arc::new(AtomicU64::new(from)),
            store_id: Arc::new(AtomicU64::new(store_id)),
            meta: meta.clone(),
            off: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        })
    }

    /// Forgets the feed and takes a new identity (the registry was replaced whole: a tail
    /// of the old one starts over). The numbers go on; those handed out before are never
    /// read again (sled's `clear` of a feed of a million entries took over a minute).
    pub(crate) fn restart(&self) -> Result<(), StorageError> {
        let from = self.next.load(Ordering::Acquire);
        self.meta.insert(META_FEED_FROM, &from.to_be_bytes())?;
        self.from.store(from, Ordering::Release);
        self.store_id
            .store(new_identity(&self.meta)?, Ordering::Release);
        Ok(())
    }

    /// Numbers the change of `id` (under the subscription write lock, not yet durable).
    pub(crate) fn note(&self, id: u64) -> Result<(), StorageError> {
        if self.off.load(Ordering::Relaxed) {
            return Ok(());
        }
        let n = self.next.fetch_add(1, Ordering::AcqRel);
        let k = id.to_be_bytes();
        if let Some(old) = self.of_id.insert(k, &n.to_be_bytes()[..])? {
            self.by_number.remove(old)?;
        }
        self.by_number.insert(n.to_be_bytes(), &k[..])?;
        Ok(())
    }

    /// The last number handed out (0: none).
    pub(crate) fn last(&self) -> u64 {
        self.next.load(Ordering::Acquire).saturating_sub(1)
    }

    /// Up to `limit` (number, id) after number `after`, in order.
    pub(crate) fn after(&self, after: u64, limit: usize) -> Result<Vec<(u64, u64)>, StorageError> {
        let mut out = Vec::new();
        let start = after
            .saturating_add(1)
            .max(self.from.load(Ordering::Acquire));
        for kv in self.by_number.range(start.to_be_bytes()..).take(limit) {
            let (k, v) = kv?;
            out.push((be_u64(&k, FEED)?, be_u64(&v, FEED)?));
        }
        Ok(out)
    }
}

/// One page of the change feed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChangedCopies {
    /// The copies and tombstones that changed, in the order of their changes.
    pub copies: Vec<SubCopy>,
    /// The number of the last change read (the next page starts after it); pass it back.
    pub last: u64,
    /// Changes follow after `last`.
    pub more: bool,
}

impl Store {
    /// This store's identity: drawn when it was created, so a node on a new disk has another.
    pub fn store_id(&self) -> u64 {
        self.changes.store_id.load(Ordering::Acquire)
    }

    /// For a coordinator's store, which nobody tails: its writes of subscriptions are no
    /// longer numbered in the change feed (three of the eight writes a standby made per
    /// change it took).
    pub fn without_change_feed(&self) {
        self.changes.off.store(true, Ordering::Release);
    }

    /// The number of the last change to a subscription copy or tombstone here: a reader
    /// that lists every copy after reading it, then tails from it, misses nothing.
    pub fn last_subscription_change(&self) -> u64 {
        self.changes.last()
    }

    /// The copies and tombstones changed after change `after`, at most `limit` changes read,
    /// filtered like [`Store::subscription_copies`] (`placed_by`, `changed_only`). Each is
    /// listed as it is now (a copy changed twice is listed once, at its newest change).
    pub fn subscription_changes(
        &self,
        after: u64,
        limit: usize,
        placed_by: &std::collections::HashSet<u32>,
        changed_only: bool,
    ) -> Result<ChangedCopies, StorageError> {
        // read with writers held off: a number is taken before its entry is written, so a
        // walk beside a writer could see number n + 1 and not yet n, and its reader would
        // then tail past n for good
        let _w = self.write_lock();
        let page = self.changes.after(after, limit.max(1))?;
        let more = page.len() >= limit.max(1);
        let last = page.last().map_or(after, |p| p.0);
        let mut copies = Vec::with_capacity(page.len());
        for (_, id) in page {
            if let Some(c) = self.current_copy(id, placed_by, changed_only)? {
                copies.push(c);
            }
        }
        Ok(ChangedCopies { copies, last, more })
    }
}
