//! The durable state of a storage node, on sled: objects, their dissemination outbox, message
//! id deduplication, the subscription registry, block data images by version, and delivery
//! state (pending, acknowledged, dead letters). This is the only crate of the system that
//! imports sled.
//!
//! An object's bytes and metadata are appended to the object log ([`objlog`]) beside sled;
//! sled holds one small locator per object, and a locator whose log record never reached the
//! disk (an unacknowledged put, cut by a crash) is dropped at open. The outbox (objects not
//! yet handed to delivery) lives in memory; its floor, the lowest sequence number still owed,
//! is written with every flush, and at open every object from the floor on is owed again.
//! So a put costs one sled update, and a retirement none. A put is acknowledged only after a
//! flush covering it. A message id is claimed first with a compare-and-swap; a claim whose
//! object never made it to disk is ignored and taken over. Flushes are shared
//! ([`Store::commit`]): writers that arrive while a flush runs wait for the next one
//! together, so 64 concurrent writers cost a handful of fsyncs, not 64. Object ids are
//! `(node, seq)`; sequence numbers are reserved durably in blocks before use, so an id is
//! never handed out twice, even across crashes.

mod codec;
mod objlog;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use blocks::Value;
use tokio::sync::{Mutex, Notify};

pub use codec::CodecError;
use objlog::{Locator, ObjectLog};

/// Sequence numbers reserved per durable reservation.
const SEQ_BLOCK: u64 = 4096;
const META_SEQ: &[u8] = b"seq_reserved";
/// Every object below this sequence number has left the outbox (replay starts here).
const META_OUTBOX_FROM: &[u8] = b"outbox_from";
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
}

/// A cluster-unique object id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId {
    pub node: u32,
    pub seq: u64,
}

/// An object as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredObject {
    pub id: ObjectId,
    pub data: Vec<u8>,
    pub external_id: String,
    pub metadata: Vec<(String, Value)>,
    pub priority: u8,
    pub message_id: String,
    pub received_unix_ms: u64,
}

/// What a writer hands in (validated by the caller).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct NewObject {
    pub data: Vec<u8>,
    pub external_id: String,
    pub metadata: Vec<(String, Value)>,
    pub priority: u8,
    pub message_id: String,
}

/// Result of a put: the id and whether the message id was seen before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutOutcome {
    pub id: ObjectId,
    pub duplicate: bool,
}

#[derive(Debug, Default)]
struct Commit {
    /// Flushes started and finished; a writer waits for a flush that started after its write.
    started: AtomicU64,
    finished: AtomicU64,
    done: Notify,
    running: Mutex<()>,
}

/// The node's store.
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    /// Object locators (`d` + seq: where the record lies in the object log, when it was
    /// received, whether it has a message id, its priority) and message ids (`m` + id).
    data: sled::Tree,
    /// The objects' bytes and metadata, appended to segment files beside sled.
    log: Arc<ObjectLog>,
    subs: sled::Tree,
    meta: sled::Tree,
    /// Block data images: name, 0, version (big endian) -> bytes.
    images: sled::Tree,
    /// Delivery state: subscription, object -> record.
    deliveries: sled::Tree,
    node: u32,
    seq: Arc<std::sync::Mutex<(u64, u64)>>, // (next, reserved end)
    /// The outbox: objects not yet retired, seq -> priority. It lives in memory; what
    /// survives a crash is its floor (`META_OUTBOX_FROM`, written with every flush): at open
    /// every object from the floor on is pending again. An object enters it when its
    /// sequence number is handed out, so the floor never passes a put in progress.
    outbox: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, u8>>>,
    /// The floor last written to sled.
    outbox_floor_written: Arc<AtomicU64>,
    commit: Arc<Commit>,
}

/// A locator record in sled.
struct Entry {
    at: Locator,
    received_unix_ms: u64,
    has_message_id: bool,
    priority: u8,
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

fn msg_key(msgid: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(msgid.len() + 1);
    k.push(b'm');
    k.extend_from_slice(msgid.as_bytes());
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
        // ids reserved before a crash are skipped, never reused
        let reserved = meta
            .get(META_SEQ)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(1);
        let log = Arc::new(ObjectLog::open(&path.join("objects"))?);
        let store = Store {
            log,
            data: db.open_tree("data")?,
            subs: db.open_tree("subscriptions")?,
            images: db.open_tree("images")?,
            deliveries: db.open_tree("deliveries")?,
            meta,
            db,
            node,
            seq: Arc::new(std::sync::Mutex::new((reserved, reserved))),
            outbox: Arc::default(),
            outbox_floor_written: Arc::default(),
            commit: Arc::new(Commit::default()),
        };
        store.load_outbox()?;
        Ok(store)
    }

    fn lock_seq(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.seq.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_outbox(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, u8>> {
        self.outbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rebuilds the outbox from the durable floor on. After a crash sled may hold the locator
    /// of an object whose log record never reached the disk (that put was not acknowledged):
    /// it is removed, so the outbox replays only objects that exist. Objects retired after
    /// the floor was last written are pending again (matching them twice is harmless: a
    /// delivery record that exists is left as it is).
    fn load_outbox(&self) -> Result<(), StorageError> {
        let floor = self
            .meta
            .get(META_OUTBOX_FROM)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0);
        self.outbox_floor_written.store(floor, Ordering::SeqCst);
        let mut dropped = 0usize;
        let mut outbox = std::collections::BTreeMap::new();
        for kv in self.data.range(key(b'd', floor)..=key(b'd', u64::MAX)) {
            let (k, v) = kv?;
            let seq = seq_of(&k).ok_or_else(|| StorageError::Corrupt {
                tree: "object locators",
                source: CodecError::Truncated,
            })?;
            let e = Self::decode_entry(&v)?;
            if self.log.read(e.at, seq)?.is_some() {
                outbox.insert(seq, e.priority);
            } else {
                self.data.remove(&k)?;
                dropped += 1;
            }
        }
        *self.lock_outbox() = outbox;
        if dropped > 0 {
            tracing::warn!(
                "dropped {dropped} unacknowledged object(s) whose bytes never reached the disk"
            );
            self.db.flush()?;
        }
        Ok(())
    }

    /// The lowest sequence number still owed dissemination (or the next to be handed out).
    fn outbox_floor(&self) -> u64 {
        let g = self.lock_seq();
        let next = g.0;
        self.lock_outbox().keys().next().copied().unwrap_or(next)
    }

    /// Writes the outbox floor if it moved (it reaches the disk with the flush that follows).
    fn write_outbox_floor(&self) -> Result<(), StorageError> {
        let floor = self.outbox_floor();
        if self.outbox_floor_written.fetch_max(floor, Ordering::SeqCst) < floor {
            self.meta.insert(META_OUTBOX_FROM, &floor.to_be_bytes())?;
        }
        Ok(())
    }

    /// A locator record: where the object lies, when it arrived, whether it has a message id,
    /// its priority.
    fn encode_entry(e: &Entry) -> Vec<u8> {
        let mut v = Vec::with_capacity(Locator::BYTES + 10);
        v.extend_from_slice(&e.at.encode());
        v.extend_from_slice(&e.received_unix_ms.to_le_bytes());
        v.push(u8::from(e.has_message_id));
        v.push(e.priority);
        v
    }

    fn decode_entry(v: &[u8]) -> Result<Entry, StorageError> {
        let corrupt = || StorageError::Corrupt {
            tree: "object locators",
            source: CodecError::Truncated,
        };
        let at = Locator::decode(v).ok_or_else(corrupt)?;
        let received_unix_ms = v
            .get(Locator::BYTES..Locator::BYTES + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
            .ok_or_else(corrupt)?;
        let flags = v
            .get(Locator::BYTES + 8..Locator::BYTES + 10)
            .ok_or_else(corrupt)?;
        Ok(Entry {
            at,
            received_unix_ms,
            has_message_id: flags[0] != 0,
            priority: flags[1],
        })
    }

    /// This node's id.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Hands out the next sequence number and enters it in the outbox (under the sequence
    /// lock, so the outbox floor never passes it).
    fn next_seq(&self, priority: u8) -> Result<u64, StorageError> {
        let mut g = self.lock_seq();
        if g.0 >= g.1 {
            let end = g.0 + SEQ_BLOCK;
            self.meta.insert(META_SEQ, &end.to_be_bytes())?;
            // the reservation must be durable before any id from it is used
            self.meta.flush()?;
            g.1 = end;
        }
        let s = g.0;
        g.0 += 1;
        self.lock_outbox().insert(s, priority);
        Ok(s)
    }

    /// Writes an object and enters it in the outbox (not yet durable: see [`Store::put`] for
    /// the acknowledged form).
    fn write(&self, obj: NewObject) -> Result<PutOutcome, StorageError> {
        let seq = self.next_seq(obj.priority)?;
        let out = self.write_as(seq, obj);
        if !matches!(
            out,
            Ok(PutOutcome {
                duplicate: false,
                ..
            })
        ) {
            self.lock_outbox().remove(&seq);
        }
        out
    }

    fn write_as(&self, seq: u64, obj: NewObject) -> Result<PutOutcome, StorageError> {
        let id = ObjectId {
            node: self.node,
            seq,
        };
        if !obj.message_id.is_empty() {
            let mk = msg_key(&obj.message_id);
            let mut expected: Option<sled::IVec> = None;
            loop {
                match self.data.compare_and_swap(
                    &mk,
                    expected.as_ref(),
                    Some(&seq.to_be_bytes()[..]),
                )? {
                    Ok(()) => break,
                    Err(cas) => {
                        let Some(cur) = cas.current else {
                            expected = None;
                            continue;
                        };
                        let prev = <[u8; 8]>::try_from(cur.as_ref())
                            .map(u64::from_be_bytes)
                            .map_err(|_| StorageError::Corrupt {
                                tree: "message ids",
                                source: CodecError::Truncated,
                            })?;
                        if self.data.contains_key(key(b'd', prev))? {
                            return Ok(PutOutcome {
                                id: ObjectId {
                                    node: self.node,
                                    seq: prev,
                                },
                                duplicate: true,
                            });
                        }
                        // claimed by a write that never reached the disk: take it over
                        expected = Some(cur);
                    }
                }
            }
        }
        let stored = StoredObject {
            id,
            data: obj.data,
            external_id: obj.external_id,
            metadata: obj.metadata,
            priority: obj.priority,
            message_id: obj.message_id,
            received_unix_ms: now_ms(),
        };
        // the bytes go to the object log first; sled keeps where they are
        let at = self.log.append(seq, &codec::encode_object(&stored))?;
        let entry = Self::encode_entry(&Entry {
            at,
            received_unix_ms: stored.received_unix_ms,
            has_message_id: !stored.message_id.is_empty(),
            priority: stored.priority,
        });
        self.data.insert(key(b'd', seq), entry)?;
        Ok(PutOutcome {
            id,
            duplicate: false,
        })
    }

    /// Stores an object durably: returns once the object, its locator and its message id are
    /// on disk. Concurrent puts share flushes.
    pub async fn put(&self, obj: NewObject) -> Result<PutOutcome, StorageError> {
        // in-memory work (sled buffers writes); only the flush below touches the disk
        let out = self.write(obj)?;
        self.commit().await?;
        Ok(out)
    }

    /// Stores several objects with one shared flush (a pipelined `PutStream`): each result is
    /// that object's own, and every `Ok` in it is durable once this returns `Ok`.
    pub async fn put_batch(
        &self,
        objs: Vec<NewObject>,
    ) -> Result<Vec<Result<PutOutcome, StorageError>>, StorageError> {
        let outs: Vec<_> = objs.into_iter().map(|o| self.write(o)).collect();
        if outs.iter().any(Result::is_ok) {
            self.commit().await?;
        }
        Ok(outs)
    }

    /// Waits until everything written before the call is durable (group commit).
    pub async fn commit(&self) -> Result<(), StorageError> {
        // the flush we need is one that starts after now
        let needed = self.commit.started.load(Ordering::SeqCst) + 1;
        loop {
            if self.commit.finished.load(Ordering::SeqCst) >= needed {
                return Ok(());
            }
            let notified = self.commit.done.notified();
            if let Ok(guard) = self.commit.running.try_lock() {
                // become the flusher for everyone waiting; first let writers that are ready
                // to run finish their in-memory writes, so this flush covers them too
                for _ in 0..GROUP_YIELDS {
                    tokio::task::yield_now().await;
                }
                let n = self.commit.started.fetch_add(1, Ordering::SeqCst) + 1;
                self.write_outbox_floor()?;
                let db = self.db.clone();
                let log = self.log.clone();
                // both at once: a locator that reaches the disk before its bytes (sled also
                // flushes on its own) belongs to an unacknowledged put and is dropped at open
                let (synced, flushed) = tokio::join!(
                    tokio::task::spawn_blocking(move || log.sync()),
                    tokio::task::spawn_blocking(move || db.flush())
                );
                let r = match (synced, flushed) {
                    (Ok(Ok(())), Ok(Ok(_))) => Ok(()),
                    (Ok(Err(e)), _) => Err(StorageError::Log(e)),
                    (_, Ok(Err(e))) => Err(StorageError::Sled(e)),
                    _ => Err(StorageError::Flusher),
                };
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

    /// Flushes (fsyncs) started so far: with group commit, far fewer than puts.
    pub fn flushes(&self) -> u64 {
        self.commit.started.load(Ordering::SeqCst)
    }

    /// An object by id.
    pub fn get(&self, id: ObjectId) -> Result<Option<StoredObject>, StorageError> {
        if id.node != self.node {
            return Ok(None);
        }
        let Some(v) = self.data.get(key(b'd', id.seq))? else {
            return Ok(None);
        };
        let Some(rec) = self.log.read(Self::decode_entry(&v)?.at, id.seq)? else {
            return Ok(None);
        };
        codec::decode_object(&rec, id)
            .map(Some)
            .map_err(|e| StorageError::Corrupt {
                tree: "objects",
                source: e,
            })
    }

    /// Number of objects stored.
    pub fn object_count(&self) -> usize {
        self.data.scan_prefix(b"d").count()
    }

    /// Objects not yet retired, oldest first: (object id, priority). Replayed at start.
    pub fn outbox_pending(&self) -> Result<Vec<(ObjectId, u8)>, StorageError> {
        Ok(self
            .lock_outbox()
            .iter()
            .map(|(&seq, &p)| {
                (
                    ObjectId {
                        node: self.node,
                        seq,
                    },
                    p,
                )
            })
            .collect())
    }

    /// Whether `id` is in the outbox (its dissemination is not finished).
    pub fn in_outbox(&self, id: ObjectId) -> bool {
        id.node == self.node && self.lock_outbox().contains_key(&id.seq)
    }

    /// Objects in the outbox.
    pub fn outbox_len(&self) -> usize {
        self.lock_outbox().len()
    }

    /// Takes an object out of the outbox once every push it owes is recorded; `false` when
    /// it was not there.
    pub fn retire(&self, id: ObjectId) -> Result<bool, StorageError> {
        Ok(id.node == self.node && self.lock_outbox().remove(&id.seq).is_some())
    }

    /// Finished objects (out of the outbox), oldest first, until `keep_going` says stop:
    /// each is deleted with its message id when `delete(received_unix_ms)` says so; log
    /// segments no object points into any more are deleted after. Returns how many objects.
    fn expire_finished(
        &self,
        mut delete: impl FnMut(u64) -> bool,
        mut keep_going: impl FnMut(usize) -> bool,
    ) -> Result<usize, StorageError> {
        let mut removed = 0;
        for kv in self.data.scan_prefix(b"d") {
            if !keep_going(removed) {
                break;
            }
            let (k, v) = kv?;
            let seq = seq_of(&k).unwrap_or(0);
            if self.lock_outbox().contains_key(&seq) {
                continue;
            }
            let Entry {
                received_unix_ms,
                has_message_id,
                ..
            } = Self::decode_entry(&v)?;
            if delete(received_unix_ms) {
                let id = ObjectId {
                    node: self.node,
                    seq,
                };
                if has_message_id
                    && let Some(obj) = self.get(id)?
                    && !obj.message_id.is_empty()
                {
                    self.data.remove(msg_key(&obj.message_id))?;
                }
                self.data.remove(&k)?;
                removed += 1;
            }
        }
        if removed > 0 {
            let mut oldest_live = self.log.current_segment();
            for kv in self.data.scan_prefix(b"d") {
                let (_, v) = kv?;
                oldest_live = oldest_live.min(Self::decode_entry(&v)?.at.segment);
            }
            self.log.delete_below(oldest_live)?;
        }
        Ok(removed)
    }

    /// Deletes objects received before `cutoff_unix_ms` that have left the outbox;
    /// returns how many were removed (retention by age).
    pub fn expire_before(&self, cutoff_unix_ms: u64) -> Result<usize, StorageError> {
        self.expire_finished(|received| received < cutoff_unix_ms, |_| true)
    }

    // --- subscription registry: opaque records keyed by id ----------------------------------

    /// A fresh subscription id (monotonic, durable across restarts).
    pub fn next_subscription_id(&self) -> Result<u64, StorageError> {
        Ok(self.db.generate_id()? + 1)
    }

    /// Stores (or replaces) a subscription record durably.
    pub async fn put_subscription(&self, id: u64, record: Vec<u8>) -> Result<(), StorageError> {
        self.subs.insert(id.to_be_bytes(), record)?;
        self.commit().await
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

    /// Removes a subscription durably; false if it did not exist.
    pub async fn delete_subscription(&self, id: u64) -> Result<bool, StorageError> {
        let existed = self.subs.remove(id.to_be_bytes())?.is_some();
        self.commit().await?;
        Ok(existed)
    }

    /// Number of subscriptions.
    pub fn subscription_count(&self) -> usize {
        self.subs.len()
    }
}

/// Where one delivery (an object owed to a subscription) stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryState {
    /// Still to be delivered: attempts so far and when the next may start (unix ms).
    Pending {
        attempts: u32,
        next_attempt_unix_ms: u64,
    },
    /// QoS 2: the subscriber has it ("received"); the release is still owed.
    Received {
        attempts: u32,
        next_attempt_unix_ms: u64,
    },
    /// Acknowledged by the subscriber.
    Acked { at_unix_ms: u64 },
    /// Given up on, with the reason; kept until redriven or expired.
    DeadLetter { reason: String, at_unix_ms: u64 },
}

fn delivery_key(sub: u64, obj: ObjectId) -> [u8; 20] {
    let mut k = [0u8; 20];
    k[..8].copy_from_slice(&sub.to_be_bytes());
    k[8..12].copy_from_slice(&obj.node.to_be_bytes());
    k[12..].copy_from_slice(&obj.seq.to_be_bytes());
    k
}

fn delivery_of_key(k: &[u8]) -> Option<(u64, ObjectId)> {
    let sub = u64::from_be_bytes(k.get(..8)?.try_into().ok()?);
    let node = u32::from_be_bytes(k.get(8..12)?.try_into().ok()?);
    let seq = u64::from_be_bytes(k.get(12..20)?.try_into().ok()?);
    Some((sub, ObjectId { node, seq }))
}

fn image_key(name: &str, version: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 9);
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(&version.to_be_bytes());
    k
}

impl Store {
    // --- block data images by version ---------------------------------------------------------

    /// Stores a data image version durably.
    pub async fn put_image(
        &self,
        name: &str,
        version: u64,
        bytes: &[u8],
    ) -> Result<(), StorageError> {
        self.images.insert(image_key(name, version), bytes)?;
        self.commit().await
    }

    /// One version of an image.
    pub fn get_image(&self, name: &str, version: u64) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self
            .images
            .get(image_key(name, version))?
            .map(|v| v.to_vec()))
    }

    /// The newest version of an image.
    pub fn latest_image(&self, name: &str) -> Result<Option<(u64, Vec<u8>)>, StorageError> {
        let mut prefix = name.as_bytes().to_vec();
        prefix.push(0);
        match self.images.scan_prefix(&prefix).next_back() {
            None => Ok(None),
            Some(kv) => {
                let (k, v) = kv?;
                let version = k
                    .get(prefix.len()..)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .ok_or(StorageError::Corrupt {
                        tree: "images",
                        source: CodecError::Truncated,
                    })?;
                Ok(Some((version, v.to_vec())))
            }
        }
    }

    /// Drops versions of an image older than `keep_from`; returns how many.
    pub fn prune_images(&self, name: &str, keep_from: u64) -> Result<usize, StorageError> {
        let mut n = 0;
        for kv in self
            .images
            .range(image_key(name, 0)..image_key(name, keep_from))
        {
            let (k, _) = kv?;
            self.images.remove(k)?;
            n += 1;
        }
        Ok(n)
    }

    // --- delivery state -------------------------------------------------------------------------

    /// Records where a delivery stands (durably).
    pub async fn set_delivery(
        &self,
        sub: u64,
        obj: ObjectId,
        state: &DeliveryState,
    ) -> Result<(), StorageError> {
        self.deliveries
            .insert(delivery_key(sub, obj), codec::encode_delivery(state))?;
        self.commit().await
    }

    /// Records where a delivery stands without waiting for a flush (it reaches disk with the
    /// next one): for states whose loss in a crash only means one more attempt.
    pub fn set_delivery_unflushed(
        &self,
        sub: u64,
        obj: ObjectId,
        state: &DeliveryState,
    ) -> Result<(), StorageError> {
        self.deliveries
            .insert(delivery_key(sub, obj), codec::encode_delivery(state))?;
        Ok(())
    }

    /// Records a pending delivery, due now, for each (subscription, object) that has no
    /// record yet, with one shared flush; a record that exists (a match repeated after a
    /// reassignment or a replay) is left where it stands. Returns the pairs recorded.
    pub async fn add_pending_deliveries(
        &self,
        pairs: &[(u64, ObjectId)],
    ) -> Result<Vec<(u64, ObjectId)>, StorageError> {
        let added = self.add_pending_deliveries_unflushed(pairs).await?;
        if !added.is_empty() {
            self.commit().await?;
        }
        Ok(added)
    }

    /// [`Store::add_pending_deliveries`] without the flush: the caller commits before it
    /// lets go of what the records stand for (the objects' outbox records), and may start
    /// the pushes meanwhile.
    pub async fn add_pending_deliveries_unflushed(
        &self,
        pairs: &[(u64, ObjectId)],
    ) -> Result<Vec<(u64, ObjectId)>, StorageError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let pending = codec::encode_delivery(&DeliveryState::Pending {
            attempts: 0,
            next_attempt_unix_ms: now_ms(),
        });
        // thousands of tree updates per hand-off: off the async threads, which serve puts
        // and pushes meanwhile
        let tree = self.deliveries.clone();
        let pairs = pairs.to_vec();
        let added = tokio::task::spawn_blocking(move || {
            let mut added = Vec::with_capacity(pairs.len());
            for (sub, obj) in pairs {
                let fresh = tree
                    .compare_and_swap(
                        delivery_key(sub, obj),
                        None::<&[u8]>,
                        Some(pending.as_slice()),
                    )?
                    .is_ok();
                if fresh {
                    added.push((sub, obj));
                }
            }
            Ok::<_, StorageError>(added)
        })
        .await
        .map_err(|_| StorageError::Flusher)??;
        Ok(added)
    }

    /// Number of delivery records (every state).
    pub fn delivery_count(&self) -> usize {
        self.deliveries.len()
    }

    /// Every delivery record (sub, object), in key order: for tests and tools.
    pub fn delivery_keys(&self) -> Result<Vec<(u64, ObjectId)>, StorageError> {
        let mut out = Vec::with_capacity(self.deliveries.len());
        for kv in self.deliveries.iter() {
            let (k, _) = kv?;
            if let Some(d) = delivery_of_key(&k) {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// Where a delivery stands.
    pub fn delivery(&self, sub: u64, obj: ObjectId) -> Result<Option<DeliveryState>, StorageError> {
        match self.deliveries.get(delivery_key(sub, obj))? {
            None => Ok(None),
            Some(v) => codec::decode_delivery(&v)
                .map(Some)
                .map_err(|e| StorageError::Corrupt {
                    tree: "deliveries",
                    source: e,
                }),
        }
    }

    fn deliveries_where(
        &self,
        keep: impl Fn(&DeliveryState) -> bool,
        limit: usize,
    ) -> Result<Vec<(u64, ObjectId, DeliveryState)>, StorageError> {
        let mut out = Vec::new();
        for kv in self.deliveries.iter() {
            let (k, v) = kv?;
            let state = codec::decode_delivery(&v).map_err(|e| StorageError::Corrupt {
                tree: "deliveries",
                source: e,
            })?;
            if keep(&state) {
                let (sub, obj) = delivery_of_key(&k).ok_or(StorageError::Corrupt {
                    tree: "deliveries",
                    source: CodecError::Truncated,
                })?;
                out.push((sub, obj, state));
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Pending deliveries (they survive restarts), up to `limit`.
    pub fn pending_deliveries(
        &self,
        limit: usize,
    ) -> Result<Vec<(u64, ObjectId, DeliveryState)>, StorageError> {
        self.deliveries_where(|s| matches!(s, DeliveryState::Pending { .. }), limit)
    }

    /// Deliveries not finished (pending, or QoS 2 received and not yet released), up to
    /// `limit`: what the delivery loop resumes after a restart.
    pub fn unfinished_deliveries(
        &self,
        limit: usize,
    ) -> Result<Vec<(u64, ObjectId, DeliveryState)>, StorageError> {
        self.deliveries_where(
            |s| {
                matches!(
                    s,
                    DeliveryState::Pending { .. } | DeliveryState::Received { .. }
                )
            },
            limit,
        )
    }

    /// Dead letters, up to `limit`.
    pub fn dead_letters(
        &self,
        limit: usize,
    ) -> Result<Vec<(u64, ObjectId, DeliveryState)>, StorageError> {
        self.deliveries_where(|s| matches!(s, DeliveryState::DeadLetter { .. }), limit)
    }

    /// Puts a dead letter back to pending (attempts reset); false if it is not a dead letter.
    pub async fn redrive(
        &self,
        sub: u64,
        obj: ObjectId,
        now_unix_ms: u64,
    ) -> Result<bool, StorageError> {
        match self.delivery(sub, obj)? {
            Some(DeliveryState::DeadLetter { .. }) => {
                self.set_delivery(
                    sub,
                    obj,
                    &DeliveryState::Pending {
                        attempts: 0,
                        next_attempt_unix_ms: now_unix_ms,
                    },
                )
                .await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Deletes acknowledged deliveries and dead letters older than the cutoff (retention).
    pub fn expire_deliveries_before(&self, cutoff_unix_ms: u64) -> Result<usize, StorageError> {
        let mut n = 0;
        for kv in self.deliveries.iter() {
            let (k, v) = kv?;
            let old = match codec::decode_delivery(&v) {
                Ok(DeliveryState::Acked { at_unix_ms })
                | Ok(DeliveryState::DeadLetter { at_unix_ms, .. }) => at_unix_ms < cutoff_unix_ms,
                Ok(DeliveryState::Pending { .. } | DeliveryState::Received { .. }) => false,
                Err(e) => {
                    return Err(StorageError::Corrupt {
                        tree: "deliveries",
                        source: e,
                    });
                }
            };
            if old {
                self.deliveries.remove(k)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Retention by size: deletes the oldest objects whose dissemination is finished until
    /// at most `max_objects` remain (pending ones are never deleted); returns how many.
    pub fn expire_to_count(&self, max_objects: usize) -> Result<usize, StorageError> {
        let excess = self.object_count().saturating_sub(max_objects);
        self.expire_finished(|_| true, |removed| removed < excess)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn images_and_delivery_state_survive_reopen() {
        let dir = temp_dir("img");
        let o1 = ObjectId { node: 1, seq: 10 };
        let o2 = ObjectId { node: 1, seq: 11 };
        {
            let s = Store::open(&dir, 1).expect("open");
            for v in [1u64, 2, 300] {
                s.put_image("match/0", v, &v.to_le_bytes())
                    .await
                    .expect("image");
            }
            s.put_image("test/temp", 7, b"t").await.expect("image");
            s.set_delivery(
                5,
                o1,
                &DeliveryState::Pending {
                    attempts: 2,
                    next_attempt_unix_ms: 99,
                },
            )
            .await
            .expect("set");
            s.set_delivery(
                5,
                o2,
                &DeliveryState::DeadLetter {
                    reason: "max attempts (10)".into(),
                    at_unix_ms: 50,
                },
            )
            .await
            .expect("set");
            s.set_delivery(6, o1, &DeliveryState::Acked { at_unix_ms: 40 })
                .await
                .expect("set");
        }
        let s = Store::open(&dir, 1).expect("reopen");
        assert_eq!(
            s.latest_image("match/0").expect("latest"),
            Some((300, 300u64.to_le_bytes().to_vec()))
        );
        assert_eq!(
            s.get_image("match/0", 2).expect("get"),
            Some(2u64.to_le_bytes().to_vec())
        );
        assert_eq!(s.latest_image("match/1").expect("latest"), None);
        assert_eq!(s.prune_images("match/0", 300).expect("prune"), 2);
        assert_eq!(s.get_image("match/0", 2).expect("get"), None);
        assert_eq!(
            s.latest_image("test/temp").expect("latest").map(|x| x.0),
            Some(7)
        );
        assert_eq!(s.pending_deliveries(10).expect("pending").len(), 1);
        let dead = s.dead_letters(10).expect("dead");
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].0, 5);
        assert_eq!(dead[0].1, o2);
        assert!(s.redrive(5, o2, 123).await.expect("redrive"));
        assert!(
            !s.redrive(5, o2, 124).await.expect("redrive twice"),
            "no longer a dead letter"
        );
        assert_eq!(
            s.delivery(5, o2).expect("get"),
            Some(DeliveryState::Pending {
                attempts: 0,
                next_attempt_unix_ms: 123
            })
        );
        // retention removes old acknowledged deliveries and dead letters, never pending ones
        assert_eq!(s.expire_deliveries_before(45).expect("expire"), 1);
        assert_eq!(s.delivery(6, o1).expect("get"), None);
        assert_eq!(s.pending_deliveries(10).expect("pending").len(), 2);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn obj(i: u64, msg: &str) -> NewObject {
        NewObject {
            data: vec![i as u8; 10],
            metadata: vec![
                ("n".into(), Value::from(i as i64)),
                ("s".into(), Value::from("x")),
            ],
            priority: (i % 8) as u8,
            message_id: msg.to_string(),
            ..NewObject::default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_shares_one_flush_and_survives_reopen() {
        let dir = temp_dir("batch");
        let ids: Vec<ObjectId>;
        {
            let s = Store::open(&dir, 4).expect("open");
            let first = s.put(obj(1, "m-1")).await.expect("put");
            let before = s.flushes();
            let batch = (2..12)
                .map(|i| obj(i, if i == 5 { "m-1" } else { "" }))
                .collect();
            let outs = s.put_batch(batch).await.expect("batch");
            assert_eq!(s.flushes() - before, 1, "one flush for the whole batch");
            let outs: Vec<PutOutcome> = outs.into_iter().map(|r| r.expect("put")).collect();
            assert_eq!(outs.len(), 10);
            // the repeated message id answers with the first object, marked duplicate
            assert!(outs[3].duplicate);
            assert_eq!(outs[3].id, first.id);
            assert_eq!(outs.iter().filter(|o| o.duplicate).count(), 1);
            ids = outs.iter().filter(|o| !o.duplicate).map(|o| o.id).collect();
            let distinct: std::collections::HashSet<_> = ids.iter().collect();
            assert_eq!(distinct.len(), 9);
            // an empty batch is no flush
            let before = s.flushes();
            assert!(s.put_batch(Vec::new()).await.expect("empty").is_empty());
            assert_eq!(s.flushes(), before);
        }
        let s = Store::open(&dir, 4).expect("reopen");
        for id in &ids {
            assert!(s.get(*id).expect("get").is_some(), "{id:?} lost");
        }
        assert_eq!(s.outbox_pending().expect("outbox").len(), 10);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A fresh directory for one test's store.
    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("dissem-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn pending_ids(s: &Store) -> Vec<ObjectId> {
        let pending = s.outbox_pending().expect("outbox");
        pending.into_iter().map(|(id, _)| id).collect()
    }

    fn log_segments(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join("objects"))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn retention_keeps_pending_objects_and_deletes_unused_log_segments() {
        let dir = temp_dir("ret");
        let mut ids = Vec::new();
        // three runs of the process: three log segments
        for run in 0..3u64 {
            let s = Store::open(&dir, 5).expect("open");
            for i in 0..4 {
                ids.push(
                    s.put(obj(run * 10 + i, &format!("r{run}-{i}")))
                        .await
                        .expect("put")
                        .id,
                );
            }
        }
        assert_eq!(log_segments(&dir), 3);
        let s = Store::open(&dir, 5).expect("open");
        assert_eq!(log_segments(&dir), 4, "three written and the fresh one");
        // everything but the last object is finished
        for id in &ids[..ids.len() - 1] {
            assert!(s.retire(*id).expect("retire"));
        }
        assert_eq!(s.expire_to_count(6).expect("expire"), 6);
        assert_eq!(s.object_count(), 6);
        assert!(s.get(ids[5]).expect("get").is_none());
        assert!(s.get(ids[6]).expect("get").is_some());
        // the first run's segment is unused now and gone; the second's is still read
        assert_eq!(log_segments(&dir), 3);
        assert_eq!(s.expire_to_count(6).expect("again"), 0);
        assert_eq!(s.expire_before(u64::MAX).expect("expire all"), 5);
        // the pending object is kept, and with it its segment and the one being written
        assert_eq!(s.object_count(), 1);
        assert!(s.get(ids[11]).expect("get").is_some());
        assert_eq!(log_segments(&dir), 2);
        // an expired message id may be used again
        let again = s.put(obj(1, "r0-1")).await.expect("put");
        assert!(!again.duplicate);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_object_whose_bytes_never_reached_the_log_is_dropped_at_open() {
        let dir = temp_dir("torn");
        let kept;
        {
            let s = Store::open(&dir, 6).expect("open");
            kept = s.put(obj(1, "")).await.expect("put").id;
            // what sled can hold after a crash: a locator whose log record was never written
            let at = Locator {
                segment: 1,
                offset: 1 << 20,
                len: 10,
            };
            let entry = Store::encode_entry(&Entry {
                at,
                received_unix_ms: 1,
                has_message_id: false,
                priority: 0,
            });
            s.data.insert(key(b'd', 999), entry).expect("insert");
            s.db.flush().expect("flush");
        }
        let s = Store::open(&dir, 6).expect("reopen");
        let pending = pending_ids(&s);
        assert_eq!(pending, vec![kept]);
        assert_eq!(s.object_count(), 1);
        assert!(s.get(kept).expect("get").is_some());
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_outbox_replays_from_its_durable_floor() {
        let dir = temp_dir("floor");
        let mut ids = Vec::new();
        {
            let s = Store::open(&dir, 7).expect("open");
            for i in 0..5 {
                ids.push(s.put(obj(i, "")).await.expect("put").id);
            }
            for i in [0, 1, 3] {
                assert!(s.retire(ids[i]).expect("retire"));
            }
            assert!(!s.retire(ids[0]).expect("retire"), "retired once");
            assert_eq!(s.outbox_len(), 2);
            // the next flush writes the floor: the lowest object still owed (ids[2])
            ids.push(s.put(obj(5, "")).await.expect("put").id);
        }
        let s = Store::open(&dir, 7).expect("reopen");
        let pending = pending_ids(&s);
        // below the floor nothing is replayed; above it a retired object is owed again
        // (matching twice leaves existing delivery records as they are)
        assert_eq!(pending, vec![ids[2], ids[3], ids[4], ids[5]]);
        let priorities: Vec<u8> = s
            .outbox_pending()
            .expect("outbox")
            .iter()
            .map(|p| p.1)
            .collect();
        assert_eq!(priorities, vec![2, 3, 4, 5], "priorities survive too");
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pending_deliveries_are_added_once_and_never_reset() {
        let dir = temp_dir("pending");
        let s = Store::open(&dir, 8).expect("open");
        let id = s.put(obj(1, "")).await.expect("put").id;
        let added = s
            .add_pending_deliveries(&[(1, id), (2, id)])
            .await
            .expect("add");
        assert_eq!(added, vec![(1, id), (2, id)]);
        s.set_delivery(1, id, &DeliveryState::Acked { at_unix_ms: 5 })
            .await
            .expect("ack");
        // matched again (a replay): only the new pair is added, the acked one stays acked
        let added = s
            .add_pending_deliveries(&[(1, id), (2, id), (3, id)])
            .await
            .expect("add");
        assert_eq!(added, vec![(3, id)]);
        assert_eq!(
            s.delivery(1, id).expect("read"),
            Some(DeliveryState::Acked { at_unix_ms: 5 })
        );
        assert!(matches!(
            s.delivery(2, id).expect("read"),
            Some(DeliveryState::Pending { attempts: 0, .. })
        ));
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn put_get_outbox_dedup_and_reopen() {
        let dir = temp_dir("main");
        let ids;
        {
            let s = Store::open(&dir, 3).expect("open");
            let a = s.put(obj(1, "m1")).await.expect("put");
            let b = s.put(obj(2, "")).await.expect("put");
            let again = s.put(obj(9, "m1")).await.expect("put");
            assert_eq!(
                again,
                PutOutcome {
                    id: a.id,
                    duplicate: true
                }
            );
            assert_eq!(a.id.node, 3);
            assert!(b.id.seq > a.id.seq);
            let got = s.get(a.id).expect("get").expect("exists");
            assert_eq!(got.data, vec![1u8; 10]);
            assert_eq!(got.metadata[0], ("n".to_string(), Value::from(1)));
            assert_eq!(s.outbox_pending().expect("outbox").len(), 2);
            assert!(s.retire(a.id).expect("retire"));
            // concurrent puts share flushes and all get distinct ids
            let mut tasks = Vec::new();
            for i in 0..64 {
                let s = s.clone();
                tasks.push(tokio::spawn(async move { s.put(obj(100 + i, "")).await }));
            }
            let flushes_before = s.flushes();
            let mut seen = std::collections::HashSet::new();
            for t in tasks {
                assert!(seen.insert(t.await.expect("join").expect("put").id));
            }
            let flushes = s.flushes() - flushes_before;
            assert!(
                flushes < 64,
                "64 concurrent puts took {flushes} flushes: no group commit"
            );
            ids = (a.id, b.id);
        }
        let s = Store::open(&dir, 3).expect("reopen");
        assert!(s.get(ids.0).expect("get").is_some());
        assert_eq!(s.outbox_pending().expect("outbox").len(), 65);
        let c = s.put(obj(5, "")).await.expect("put");
        assert!(
            c.id.seq > ids.1.seq + 64,
            "ids are never reused after a restart"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
