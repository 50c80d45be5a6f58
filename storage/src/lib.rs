//! The durable state of a storage node, on sled: objects, their dissemination outbox, message
//! id deduplication, the subscription registry, block data images by version, and delivery
//! state (pending, acknowledged, dead letters). This is the only crate of the system that
//! imports sled.
//!
//! An object's bytes and metadata are appended to the object log ([`objlog`]) beside sled; sled
//! holds one small locator per object (a batch's under one key: [`locators`]), and a locator
//! whose log record never reached the disk (an unacknowledged put, cut by a crash) is dropped
//! at open. The outbox (objects not yet handed to delivery) lives in memory; its floor, the
//! lowest sequence number still owed, is written with every flush, and at open every object
//! from the floor on is owed again. So a put (or a batch of them) costs one sled update, and a
//! retirement none. A put is acknowledged only after a flush covering it. A message id is
//! claimed first with a compare-and-swap; a claim whose object never made it to disk is ignored
//! and taken over. Flushes are shared ([`Store::commit`]): writers that arrive while a flush
//! runs wait for the next one together, so 64 concurrent writers cost a handful of fsyncs, not
//! 64. Object ids are `(node, seq)`; sequence numbers are reserved durably in blocks before
//! use, so an id is never handed out twice, even across crashes, and a fresh store starts them
//! at the current time in microseconds, so a new disk at the same node id does not reuse them
//! either.
//!
//! A file per keyspace: `objects` (writes, message ids, sequence blocks, retention),
//! `locators`, `outbox`, `subscriptions`, `images`, `deliveries`, `replicas` (copies of other
//! nodes' objects, for quorum replication); this file holds the store itself, its opening and
//! the shared flush.

mod changes;
mod codec;
mod deliveries;
mod fresh;
mod handed;
mod images;
mod links;
mod locators;
mod newest;
mod objects;
mod objlog;
mod outbox;
mod repair;
mod replicas;
mod resume;
mod scrub;
mod space;
mod spilled;
mod standby;
mod stop;
mod subscriptions;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use std::sync::atomic::{AtomicU64, Ordering};

use std::time::{SystemTime, UNIX_EPOCH};

use blocks::Value;

use tokio::sync::{Mutex, Notify};

pub use changes::ChangedCopies;
pub use codec::CodecError;
pub use deliveries::DeliveryState;
pub use links::LinkEntry;
pub use newest::{Held, Newest, SubCopy, replaces};
pub use objects::{NewObject, ObjectId, PutOutcome, StoredObject};
pub use replicas::ReplicaCounts;
pub use resume::Journal;
pub use spilled::SpillKey;
pub use standby::{KeptCopy, StandbyCopy};

use objlog::{Locator, ObjectLog};

// the keyspaces take the whole crate root with `use super::*`
use objects::{META_SEQ, META_SEQ_ORIGIN};

/// Scheduler yields a flusher makes before flushing, to gather more writes per flush.
const GROUP_YIELDS: usize = 8;

/// Storage failures.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage I/O: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt record in {tree}: {source}")]
    Corrupt {
        tree: &'static str,
        #[source]
        source: CodecError,
    },
    #[error("a storage background task stopped")]
    Flusher,
    #[error("object log I/O: {0}")]
    Log(#[from] std::io::Error),
    /// Another put with this message id is being written right now (its claim is made, its
    /// locator not yet): this one was not stored. Retried with the same message id once that
    /// write ends, it is answered as its duplicate (or stored, when that write failed).
    #[error(
        "a put with message id {message_id:?} is being written now: retry with the same message id"
    )]
    MessageIdInFlight { message_id: String },
    /// The disk under the data directory is full (or the quota used up): the write was not
    /// made, and nothing that needed it was acknowledged.
    #[error("the disk holding {dir} is full ({source}): writes are refused until space is freed")]
    DiskFull {
        dir: String,
        #[source]
        source: std::io::Error,
    },
}

/// `ENOSPC` and `EDQUOT`: no room left on the device, or in the user's quota. By kind too:
/// sled hands out clones of its I/O errors, which keep the kind and lose the OS code.
fn is_out_of_space(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{QuotaExceeded, StorageFull};
    matches!(e.raw_os_error(), Some(28) | Some(122))
        || matches!(e.kind(), StorageFull | QuotaExceeded)
}

impl StorageError {
    /// The kind of the I/O error behind this one (`Other` for an error that is not one).
    pub(crate) fn io_kind(&self) -> std::io::ErrorKind {
        match self {
            StorageError::Log(io) | StorageError::Sled(sled::Error::Io(io)) => io.kind(),
            StorageError::DiskFull { source, .. } => source.kind(),
            _ => std::io::ErrorKind::Other,
        }
    }

    /// Whether the disk (or the quota) is full.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StorageError::DiskFull { .. } => true,
            StorageError::Log(e) | StorageError::Sled(sled::Error::Io(e)) => is_out_of_space(e),
            _ => false,
        }
    }
}

#[derive(Debug, Default)]
struct Commit {
    /// Flushes started and finished; a writer waits for a flush that started after its write.
    started: AtomicU64,
    finished: AtomicU64,
    done: Notify,
    running: Mutex<()>,
    /// A flush of sled's failed: sled keeps its first I/O error for good and refuses every
    /// operation after it, until the store is opened again.
    sled_failed: std::sync::atomic::AtomicBool,
    /// The flushes that failed, by number, with their error (the latest [`FAILED_KEPT`]): a
    /// writer whose flush failed is told so, though it was not the one that ran it.
    failed: std::sync::Mutex<std::collections::BTreeMap<u64, (std::io::ErrorKind, String)>>,
    /// Tests: the next flush fails as a full disk would.
    #[cfg(test)]
    fail_next: std::sync::atomic::AtomicBool,
    /// Tests: the next flush stops before it flushes, as when its outbox floor is refused.
    #[cfg(test)]
    abort_next: std::sync::atomic::AtomicBool,
    /// Tests: writers that have waited for a flush.
    #[cfg(test)]
    waiting: std::sync::atomic::AtomicUsize,
}

/// Failed flushes remembered; a writer waiting on an older one is answered as failed.
const FAILED_KEPT: usize = 1024;

impl Commit {
    /// Notes that flush `n` failed with `e`.
    fn failed(&self, n: u64, e: &StorageError) {
        let kind = e.io_kind();
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        f.insert(n, (kind, e.to_string()));
        while f.len() > FAILED_KEPT {
            f.pop_first();
        }
    }

    /// The error of flush `n`, if it failed (or is too old to tell, among many failures).
    /// Every flush that finished either failed, noted here, or succeeded.
    fn failure_of(&self, n: u64) -> Option<StorageError> {
        let f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        let (kind, msg) = match f.get(&n) {
            Some(e) => e.clone(),
            None if f.len() >= FAILED_KEPT && f.keys().next().is_some_and(|&first| n < first) => (
                std::io::ErrorKind::Other,
                "one of many failed flushes".into(),
            ),
            None => return None,
        };
        Some(StorageError::Log(std::io::Error::new(
            kind,
            format!("the flush this write waited for failed: {msg}"),
        )))
    }
}

/// The node's store.
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    /// The data directory (named when its disk is full).
    dir: Arc<std::path::PathBuf>,
    /// Free space against the reserve, read before each put.
    space: Arc<space::Space>,
    /// Object locators (`d` + seq: where the record lies in the object log, when it was
    /// received, whether it has a message id, its priority) and message ids (`m` + id).
    data: sled::Tree,
    /// The objects' bytes and metadata, appended to segment files beside sled.
    log: Arc<ObjectLog>,
    /// The objects written lately, for their first reads.
    fresh: fresh::Fresh,
    /// Message ids claimed by writes whose locators are not written yet, with the sequence
    /// number each claimed them for (see [`StorageError::MessageIdInFlight`]).
    claims: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    subs: sled::Tree,
    /// Subscription copies (quorum replication): id -> the node that placed it (the node
    /// that took its Create), big endian.
    placed: sled::Tree,
    /// Subscription revisions: id -> the change that wrote the version held (big endian).
    revisions: sled::Tree,
    /// Tombstones of deleted subscriptions: id -> when it was deleted (unix ms, big endian).
    /// A deletion is final: no copy of that id is taken again.
    deleted: sled::Tree,
    /// The change feed of the subscription copies (what a standby coordinator tails).
    changes: changes::Changes,
    /// A coordinator's updates of older subscriptions while it leads (`resume`): id -> ().
    led: sled::Tree,
    /// The first id of the leadership whose writes are journaled (0: none).
    led_from: Arc<AtomicU64>,
    /// Writes to the subscription trees, one at a time (a read-compare-write each).
    subs_write: Arc<std::sync::Mutex<()>>,
    meta: sled::Tree,
    /// Block data images: name, 0, version (big endian) -> bytes.
    images: sled::Tree,
    /// Delivery state: subscription, object -> record.
    deliveries: sled::Tree,
    /// Copies of other nodes' objects (quorum replication): origin, seq -> state, object.
    replicas: sled::Tree,
    /// QoS 2 "received" marks of copied objects: origin, seq, subscription -> ().
    phases: sled::Tree,
    /// What peer clusters are owed (federation): link, seq -> object.
    links: sled::Tree,
    /// Standby copies of a primary cluster's objects (active-passive federation).
    standby: sled::Tree,
    /// Deliveries peer clusters spilled over to this node (spillover federation).
    spilled: sled::Tree,
    node: u32,
    seq: Arc<std::sync::Mutex<(u64, u64)>>, // (next, reserved end)
    /// The first sequence number this store handed out (0: it predates the record).
    owns_from: u64,
    /// The first sequence number of this opening: an object below it was put before the
    /// store was last opened (a crash or restart came between its put and now).
    run_from: u64,
    /// The run before this opening ended in a crash ([`stop`]).
    crashed_before: bool,
    /// The outbox: objects not yet retired, seq -> priority. It lives in memory; what
    /// survives a crash is its floor (`META_OUTBOX_FROM`, written with every flush): at open
    /// every object from the floor on is pending again. An object enters it when its
    /// sequence number is handed out, so the floor never passes a put in progress.
    outbox: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, u8>>>,
    /// Copies of other nodes' objects this node disseminates now (it took over their dead
    /// origin), durable ones: id -> priority, in memory, loaded from `adoptions` at open.
    adopted: Arc<std::sync::Mutex<std::collections::BTreeMap<ObjectId, u8>>>,
    /// Objects of the outbox that another node adopted and disseminates ([`Store::hand`]):
    /// held, not matched here; loaded from `handings` at open.
    handed: Arc<std::sync::Mutex<std::collections::BTreeSet<u64>>>,
    /// The handed objects on disk: seq -> their adopter and its priority.
    handings: sled::Tree,
    /// The adoptions on disk: origin, seq -> priority ([`Store::adopt`]).
    adoptions: sled::Tree,
    /// The floor last written to sled.
    outbox_floor_written: Arc<AtomicU64>,
    /// This node's objects lost at open, to restore from copies (`repair`); they hold the
    /// outbox floor below them.
    /// seq -> whether it was still to be matched.
    repair: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, bool>>>,
    commit: Arc<Commit>,
    /// Subscription ids are handed out from here on when it is above sled's counter (an
    /// elected coordinator's epoch; 0: sled's counter alone).
    subscription_id_floor: Arc<AtomicU64>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn key(prefix: u8, seq: u64) -> [u8; 9] {
    let mut k = [prefix; 9];
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn seq_of(k: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(k.get(1..)?)
        .ok()
        .map(u64::from_be_bytes)
}

/// Opens sled in `path`. A store dropped in this same process releases its file lock only
/// once sled's background flusher has stopped, a moment later: a lock that is still held is
/// tried again for up to five seconds before it is an error.
fn open_db(path: &std::path::Path) -> Result<sled::Db, StorageError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match sled::Config::new()
            .path(path)
            .mode(sled::Mode::HighThroughput)
            .open()
        {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return Ok(other?),
        }
    }
}

impl Store {
    /// Opens (or creates) the store in `path` for node `node`.
    pub fn open(path: &std::path::Path, node: u32) -> Result<Store, StorageError> {
        let db = open_db(path)?;
        let meta = db.open_tree("meta")?;
        // ids reserved before a crash are skipped, never reused; a fresh store starts at the
        // current time in microseconds, so a node that takes over a grid position on a new
        // disk never reuses an id its predecessor's copies still carry (that would need more
        // than a million puts per second over the predecessor's whole life)
        let reserved = meta
            .get(META_SEQ)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes);
        let crashed_before = !stop::take_mark(&db, &meta, reserved.is_none())?;
        let reserved = match reserved {
            Some(r) => r,
            None => {
                let start = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(1, |d| d.as_micros() as u64)
                    .max(1);
                meta.insert(META_SEQ_ORIGIN, &start.to_be_bytes())?;
                start
            }
        };
        // a store made before the origin was recorded owns every sequence number
        let owns_from = meta
            .get(META_SEQ_ORIGIN)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_be_bytes);
        let log = Arc::new(ObjectLog::open(&path.join("objects"))?);
        let store = Store {
            log,
            fresh: fresh::Fresh::default(),
            claims: Default::default(),
            data: db.open_tree("data")?,
            subs: db.open_tree("subscriptions")?,
            placed: db.open_tree("subscription_placed")?,
            revisions: db.open_tree("subscription_revisions")?,
            deleted: db.open_tree("subscription_deleted")?,
            subs_write: Arc::default(),
            changes: changes::Changes::open(&db, &meta)?,
            led: db.open_tree("registry_led")?,
            led_from: Arc::default(),
            images: db.open_tree("images")?,
            deliveries: db.open_tree("deliveries")?,
            replicas: db.open_tree("replicas")?,
            phases: db.open_tree("phases")?,
            links: db.open_tree("federation")?,
            standby: db.open_tree("standby")?,
            spilled: db.open_tree("spilled")?,
            adoptions: db.open_tree("adopted")?,
            handings: db.open_tree("handed")?,
            meta,
            db,
            dir: Arc::new(path.to_path_buf()),
            space: Arc::new(space::Space::new(path.to_path_buf())),
            node,
            seq: Arc::new(std::sync::Mutex::new((reserved, reserved))),
            owns_from,
            run_from: reserved,
            crashed_before,
            outbox: Arc::default(),
            adopted: Arc::default(),
            handed: Arc::default(),
            outbox_floor_written: Arc::default(),
            repair: Arc::default(),
            commit: Arc::new(Commit::default()),
            subscription_id_floor: Arc::default(),
        };
        store.load_repair()?;
        store.load_outbox()?;
        store.load_adopted()?;
        store.load_handed()?;
        let damaged = store.log.damaged_at_open();
        store.note_damaged(&damaged)?;
        Ok(store)
    }

    /// Sets the free space puts leave on the disk, in bytes (`None`: 1% of the file system,
    /// at least 16 MiB, at most 1 GiB; `DISSEM_DISK_RESERVE_MIB` sets the default).
    pub fn set_disk_reserve(&self, bytes: Option<u64>) {
        self.space.set_reserve(bytes);
    }

    /// This node's id.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// The first sequence number this store ever handed out (0 for a store older than the
    /// record): ids of this node below it were handed out by another store, an earlier node
    /// at the same position.
    pub fn owns_from(&self) -> u64 {
        self.owns_from
    }

    /// Whether `id` is an object this store took since it was opened: not one recovered
    /// from before a crash or restart (whose deliveries may have begun then).
    pub fn put_since_open(&self, id: ObjectId) -> bool {
        id.node == self.node && id.seq >= self.run_from
    }

    /// The next sequence number this store hands out: every one it handed out is below it
    /// (an object enters the outbox under the same lock, so one below it that is not in the
    /// outbox has left it).
    pub fn next_seq_out(&self) -> u64 {
        self.lock_seq().0
    }

    /// `e`, named [`StorageError::DiskFull`] with this store's directory when it says the
    /// disk is full.
    pub(crate) fn named(&self, e: StorageError) -> StorageError {
        if !e.is_disk_full() || matches!(e, StorageError::DiskFull { .. }) {
            return e;
        }
        let source = match e {
            StorageError::Log(io) | StorageError::Sled(sled::Error::Io(io)) => io,
            other => return other,
        };
        StorageError::DiskFull {
            dir: self.dir.display().to_string(),
            source,
        }
    }

    /// Waits until everything written before the call is durable (group commit).
    pub async fn commit(&self) -> Result<(), StorageError> {
        self.commit_inner().await.map_err(|e| self.named(e))
    }

    async fn commit_inner(&self) -> Result<(), StorageError> {
        // the flush we need is one that starts after now
        let needed = self.commit.started.load(Ordering::SeqCst) + 1;
        #[cfg(test)]
        let mut counted = false;
        loop {
            if self.commit.finished.load(Ordering::SeqCst) >= needed {
                // the flush that covers this writer's writes (the first that started after
                // them) may have failed, run by another writer: before, every waiter but the
                // one that ran it was answered Ok, so a put was acknowledged and a QoS 2
                // "received" phase released on a write that never reached the disk (`bench
                // chaos` seed 32: a full disk, the node started again in place, and
                // deliveries released before went out again). A later flush's success does
                // not make up for it (after a failed fsync the kernel may have dropped the
                // pages it could not write)
                return match self.commit.failure_of(needed) {
                    Some(e) => Err(e),
                    None => Ok(()),
                };
            }
            let notified = self.commit.done.notified();
            tokio::pin!(notified);
            #[cfg(test)]
            if !std::mem::replace(&mut counted, true) {
                // registered for the wake-up before it is counted
                notified.as_mut().enable();
                self.commit.waiting.fetch_add(1, Ordering::SeqCst);
            }
            if let Ok(guard) = self.commit.running.try_lock() {
                // become the flusher for everyone waiting; first let writers that are ready
                // to run finish their in-memory writes, so this flush covers them too
                for _ in 0..GROUP_YIELDS {
                    tokio::task::yield_now().await;
                }
                let n = self.commit.started.fetch_add(1, Ordering::SeqCst) + 1;
                // every flush ends noted, finished and announced, also one that stopped
                // before it flushed (its outbox floor refused by a sled that failed on its
                // own): before, that one returned early, its waiters were never woken by it,
                // and the next flush's waking answered them by a flush number with no failure
                // noted, Ok (`bench chaos` seed 32 again, in CI: two QoS 2 deliveries shown
                // twice)
                let r = self.flush_once(n).await;
                if let Err(e) = &r {
                    self.commit.failed(n, e);
                }
                self.commit.finished.fetch_max(n, Ordering::SeqCst);
                drop(guard);
                self.commit.done.notify_waiters();
                r?;
                if n >= needed {
                    return Ok(());
                }
                continue;
            }
            notified.await;
        }
    }

    /// One flush (number `n`) of the object log and sled, its outbox floor written first.
    async fn flush_once(&self, n: u64) -> Result<(), StorageError> {
        #[cfg(test)]
        if self.commit.abort_next.swap(false, Ordering::SeqCst) {
            // as the outbox floor's write is refused by a sled that failed on its own
            let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
            return Err(StorageError::Sled(sled::Error::Io(full)));
        }
        if let Err(e) = self.write_outbox_floor() {
            // sled refuses writes only once it failed (on its own, a full disk)
            self.commit.sled_failed.store(true, Ordering::SeqCst);
            return Err(e);
        }
        let db = self.db.clone();
        let log = self.log.clone();
        // both at once: a locator that reaches the disk before its bytes (sled also
        // flushes on its own) belongs to an unacknowledged put and is dropped at open
        let (synced, flushed) = tokio::join!(
            tokio::task::spawn_blocking(move || {
                let t = std::time::Instant::now();
                (log.sync(), t.elapsed())
            }),
            tokio::task::spawn_blocking(move || {
                let t = std::time::Instant::now();
                (db.flush(), t.elapsed())
            })
        );
        // where a put's wait goes (`RUST_LOG=storage=debug`)
        if let (Ok((_, a)), Ok((_, b))) = (&synced, &flushed) {
            tracing::debug!("flush {n}: the object log synced in {a:?}, sled flushed in {b:?}");
        }
        #[cfg(test)]
        let flushed = if self.commit.fail_next.swap(false, Ordering::SeqCst) {
            let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
            Ok((Err(sled::Error::Io(full)), std::time::Duration::ZERO))
        } else {
            flushed
        };
        match (synced.map(|x| x.0), flushed.map(|x| x.0)) {
            (Ok(Ok(())), Ok(Ok(_))) => Ok(()),
            (Ok(Err(e)), _) => Err(StorageError::Log(e)),
            (_, Ok(Err(e))) => {
                self.commit.sled_failed.store(true, Ordering::SeqCst);
                Err(StorageError::Sled(e))
            }
            _ => Err(StorageError::Flusher),
        }
    }

    /// Whether a flush of sled's failed (a full disk): sled then refuses every write until
    /// the store is opened again, so the process must open it again once there is room.
    pub fn sled_failed(&self) -> bool {
        self.commit.sled_failed.load(Ordering::SeqCst)
    }

    /// Asks sled whether it has failed, with a flush (which answers with the I/O error sled
    /// keeps), and notes a failure as [`Store::sled_failed`]. sled also writes on its own
    /// (its background flusher): on a full disk that write can fail with no flush of ours to
    /// see it, and sled refuses every operation after, while the node took it for healthy
    /// and never started again once the disk had room (`tests/disk.rs`: deliveries stuck
    /// after the disk was freed). Cheap when nothing is dirty (and a busy store flushes many
    /// times a second anyway); the node asks every 500 ms.
    pub async fn probe_sled(&self) -> bool {
        if self.sled_failed() {
            return true;
        }
        let db = self.db.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || db.flush()).await {
            tracing::debug!("sled answered a flush with: {e}");
            self.commit.sled_failed.store(true, Ordering::SeqCst);
        }
        self.sled_failed()
    }

    /// Whether the disk has room above the reserve again.
    pub fn has_room(&self) -> bool {
        self.space.check(now_ms()).is_ok()
    }

    /// Flushes (fsyncs) started so far: with group commit, far fewer than puts.
    pub fn flushes(&self) -> u64 {
        self.commit.started.load(Ordering::SeqCst)
    }
}
