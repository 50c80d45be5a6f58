//! The objects keyspace (prefix `d`: one locator per object into the object log) with message
//! ids (prefix `m`, claimed by compare-and-swap) and sequence numbers reserved durably in blocks:
//! writing, reading, counting and retention of finished objects.

use std::collections::HashMap;

use super::*;

/// Finished objects a retention pass removes together (their runs rewritten once).
const EXPIRE_CHUNK: usize = 256;

/// Sequence numbers reserved per durable reservation.
pub(super) const SEQ_BLOCK: u64 = 4096;

pub(super) const META_SEQ: &[u8] = b"seq_reserved";

/// The first sequence number a store handed out (written when it is created).
pub(super) const META_SEQ_ORIGIN: &[u8] = b"seq_origin";

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

/// An object whose message id is claimed and whose log record is encoded, to be appended.
struct Pending {
    stored: StoredObject,
    payload: Vec<u8>,
    targeted: bool,
}

impl Pending {
    /// Its locator once its record lies at `at`.
    fn entry(&self, at: Locator) -> Entry {
        Entry {
            at,
            received_unix_ms: self.stored.received_unix_ms,
            has_message_id: !self.stored.message_id.is_empty(),
            priority: self.stored.priority,
            targeted: self.targeted,
        }
    }
}

/// What [`Store::prepare`] found: an object to write, or the one on disk with its message id.
enum Prepared {
    Write(Pending),
    Duplicate(PutOutcome),
}

/// A locator record in sled.
#[derive(Clone, Copy)]
pub(super) struct Entry {
    pub(super) at: Locator,
    pub(super) received_unix_ms: u64,
    pub(super) has_message_id: bool,
    pub(super) priority: u8,
    /// Written for named deliveries only ([`Store::write_targeted`]): never in the outbox,
    /// so never matched.
    pub(super) targeted: bool,
}

pub(super) fn msg_key(msgid: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(msgid.len() + 1);
    k.push(b'm');
    k.extend_from_slice(msgid.as_bytes());
    k
}

impl Store {
    pub(super) fn lock_seq(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.seq.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A locator record: where the object lies, when it arrived, whether it has a message id,
    /// its priority.
    pub(super) fn encode_entry(e: &Entry) -> Vec<u8> {
        let mut v = Vec::with_capacity(Locator::BYTES + 10);
        v.extend_from_slice(&e.at.encode());
        v.extend_from_slice(&e.received_unix_ms.to_le_bytes());
        v.push(u8::from(e.has_message_id) | (u8::from(e.targeted) << 1));
        v.push(e.priority);
        v
    }

    pub(super) fn decode_entry(v: &[u8]) -> Result<Entry, StorageError> {
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
            has_message_id: flags[0] & 1 != 0,
            priority: flags[1],
            targeted: flags[0] & 2 != 0,
        })
    }

    /// Reserves `n` consecutive sequence numbers (a new block made durable first when they
    /// pass the reserved one): the first, with the sequence lock still held.
    fn take_seqs(
        &self,
        n: u64,
    ) -> Result<(u64, std::sync::MutexGuard<'_, (u64, u64)>), StorageError> {
        let mut g = self.lock_seq();
        if g.0 + n > g.1 {
            let end = g.0 + n.max(SEQ_BLOCK);
            self.meta.insert(META_SEQ, &end.to_be_bytes())?;
            // the reservation must be durable before any id from it is used
            self.meta.flush()?;
            g.1 = end;
        }
        let first = g.0;
        g.0 += n;
        Ok((first, g))
    }

    /// Hands out the next sequence number and, with `outbox`, enters it in the outbox (under
    /// the sequence lock, so the outbox floor never passes it).
    pub(super) fn next_seq(&self, priority: u8, outbox: bool) -> Result<u64, StorageError> {
        let (s, _seq_lock) = self.take_seqs(1)?;
        if outbox {
            self.lock_outbox().insert(s, priority);
        }
        Ok(s)
    }

    /// Hands out `priorities.len()` consecutive sequence numbers (the first is returned),
    /// each entered in the outbox with its priority, under the sequence lock as
    /// [`Store::next_seq`].
    pub(super) fn next_seqs(&self, priorities: &[u8]) -> Result<u64, StorageError> {
        let (first, _seq_lock) = self.take_seqs(priorities.len() as u64)?;
        let mut outbox = self.lock_outbox();
        for (seq, &p) in (first..).zip(priorities) {
            outbox.insert(seq, p);
        }
        Ok(first)
    }

    /// Writes an object and enters it in the outbox (not yet durable: see [`Store::put`] for
    /// the acknowledged form).
    pub(super) fn write(&self, obj: NewObject) -> Result<PutOutcome, StorageError> {
        self.space.check(now_ms())?;
        let seq = self.next_seq(obj.priority, true)?;
        let out = self.write_as(seq, obj, false);
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

    /// Writes an object that is never matched (not in the outbox, not after a restart
    /// either): one whose deliveries the caller names itself, e.g. a delivery spilled over
    /// from a peer cluster. Deduplicated by message id like a put; durable with the next
    /// commit.
    pub fn write_targeted(&self, obj: NewObject) -> Result<PutOutcome, StorageError> {
        let seq = self.next_seq(obj.priority, false)?;
        self.write_as(seq, obj, true)
    }

    pub(super) fn write_as(
        &self,
        seq: u64,
        obj: NewObject,
        targeted: bool,
    ) -> Result<PutOutcome, StorageError> {
        let p = match self.prepare(seq, obj, targeted)? {
            Prepared::Write(p) => p,
            Prepared::Duplicate(out) => return Ok(out),
        };
        let message_id = p.stored.message_id.clone();
        // the bytes go to the object log first; sled keeps where they are
        let out = self
            .log
            .append(seq, &p.payload)
            .map_err(StorageError::from)
            .and_then(|at| self.settle(p, at));
        self.release_claim(&message_id, seq);
        out
    }

    /// Takes `message_id` for the write of `seq` until [`Store::release_claim`]; refused
    /// while another write holds it.
    pub(super) fn take_claim(&self, message_id: &str, seq: u64) -> Result<(), StorageError> {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        match claims.get(message_id) {
            Some(&other) if other != seq => Err(StorageError::MessageIdInFlight {
                message_id: message_id.to_string(),
            }),
            _ => {
                claims.insert(message_id.to_string(), seq);
                Ok(())
            }
        }
    }

    /// Ends the write of `seq`'s hold on `message_id` (written or failed).
    pub(super) fn release_claim(&self, message_id: &str, seq: u64) {
        if message_id.is_empty() {
            return;
        }
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        if claims.get(message_id) == Some(&seq) {
            claims.remove(message_id);
        }
    }

    /// Claims `obj`'s message id for `seq` (a duplicate's outcome when an object on disk has
    /// it) and encodes its log record.
    ///
    /// The claim is held (in memory) until the caller's write ends: a concurrent put of the
    /// same id would otherwise find it on disk without a locator yet, take it over and store
    /// the object twice.
    fn prepare(&self, seq: u64, obj: NewObject, targeted: bool) -> Result<Prepared, StorageError> {
        if obj.message_id.is_empty() {
            return self.prepare_claimed(seq, obj, targeted);
        }
        self.take_claim(&obj.message_id, seq)?;
        let message_id = obj.message_id.clone();
        let prepared = self.prepare_claimed(seq, obj, targeted);
        if !matches!(prepared, Ok(Prepared::Write(_))) {
            self.release_claim(&message_id, seq);
        }
        prepared
    }

    /// [`Store::prepare`] once the write holds its message id in memory.
    fn prepare_claimed(
        &self,
        seq: u64,
        obj: NewObject,
        targeted: bool,
    ) -> Result<Prepared, StorageError> {
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
                        if self.has_locator(prev)? {
                            return Ok(Prepared::Duplicate(PutOutcome {
                                id: ObjectId {
                                    node: self.node,
                                    seq: prev,
                                },
                                duplicate: true,
                            }));
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
        let payload = codec::encode_object(&stored);
        Ok(Prepared::Write(Pending {
            stored,
            payload,
            targeted,
        }))
    }

    /// Records where a prepared object's bytes lie in the log (its locator in sled) and keeps
    /// it among the fresh objects.
    fn settle(&self, p: Pending, at: Locator) -> Result<PutOutcome, StorageError> {
        let id = p.stored.id;
        self.put_run(id.seq, &[Some(p.entry(at))])?;
        self.fresh.keep(id.seq, std::sync::Arc::new(p.stored));
        Ok(PutOutcome {
            id,
            duplicate: false,
        })
    }

    /// Stores an object durably: returns once the object, its locator and its message id are
    /// on disk. Concurrent puts share flushes.
    pub async fn put(&self, obj: NewObject) -> Result<PutOutcome, StorageError> {
        // in-memory work (sled buffers writes); only the flush below touches the disk
        let out = self.write(obj).map_err(|e| self.named(e))?;
        self.commit().await?;
        Ok(out)
    }

    /// Stores several objects with one shared flush (a pipelined `PutStream`): each result is
    /// that object's own, and every `Ok` in it is durable once this returns `Ok`.
    pub async fn put_batch(
        &self,
        objs: Vec<NewObject>,
    ) -> Result<Vec<Result<PutOutcome, StorageError>>, StorageError> {
        let outs = self.write_many(objs);
        if outs.iter().any(Result::is_ok) {
            self.commit().await?;
        }
        Ok(outs)
    }

    /// [`Store::write`] for several objects: consecutive sequence numbers, their records
    /// appended to the log with one write and their locators written as one run
    /// ([`locators`]). Each result is that object's own; a failed append or locator write
    /// fails all the objects it carried.
    fn write_many(&self, objs: Vec<NewObject>) -> Vec<Result<PutOutcome, StorageError>> {
        let mut outs: Vec<Option<Result<PutOutcome, StorageError>>> =
            Vec::with_capacity(objs.len());
        let mut admitted = Vec::with_capacity(objs.len());
        for obj in objs {
            match self.space.check(now_ms()) {
                Ok(()) => {
                    admitted.push((outs.len(), obj));
                    outs.push(None);
                }
                Err(e) => outs.push(Some(Err(self.named(e)))),
            }
        }
        let priorities: Vec<u8> = admitted.iter().map(|(_, o)| o.priority).collect();
        let first = match self.next_seqs(&priorities) {
            Ok(first) => first,
            Err(e) => {
                let e = Self::shared_error(&e);
                for (i, _) in admitted {
                    outs[i] = Some(Err(self.named(e())));
                }
                return Self::results(outs);
            }
        };
        let mut pending = Vec::with_capacity(admitted.len());
        // a message id repeated within the batch: the earlier object's id, answered as a
        // duplicate once (and only if) that object is written; its claim is not on disk yet,
        // so the claim below would take it over and store the object twice
        let mut in_batch: HashMap<String, usize> = HashMap::new();
        let mut echoes: Vec<(usize, usize)> = Vec::new();
        for ((i, obj), seq) in admitted.into_iter().zip(first..) {
            if !obj.message_id.is_empty() {
                if let Some(&earlier) = in_batch.get(&obj.message_id) {
                    self.lock_outbox().remove(&seq);
                    echoes.push((i, earlier));
                    continue;
                }
                in_batch.insert(obj.message_id.clone(), i);
            }
            let prepared = self.prepare(seq, obj, false);
            if !matches!(prepared, Ok(Prepared::Write(_))) {
                self.lock_outbox().remove(&seq);
            }
            match prepared {
                Ok(Prepared::Write(p)) => pending.push((i, p)),
                Ok(Prepared::Duplicate(out)) => outs[i] = Some(Ok(out)),
                Err(e) => outs[i] = Some(Err(self.named(e))),
            }
        }
        let written = self
            .log
            .append_many(
                pending
                    .iter()
                    .map(|(_, p)| (p.stored.id.seq, p.payload.as_slice())),
            )
            .map_err(StorageError::from)
            .and_then(|ats| {
                let n = priorities.len();
                let mut run: Vec<Option<Entry>> = (0..n).map(|_| None).collect();
                for ((_, p), &at) in pending.iter().zip(&ats) {
                    run[(p.stored.id.seq - first) as usize] = Some(p.entry(at));
                }
                self.put_run(first, &run)
            });
        for (_, p) in &pending {
            self.release_claim(&p.stored.message_id, p.stored.id.seq);
        }
        match written {
            Ok(()) => {
                for (i, p) in pending {
                    let id = p.stored.id;
                    self.fresh.keep(id.seq, std::sync::Arc::new(p.stored));
                    outs[i] = Some(Ok(PutOutcome {
                        id,
                        duplicate: false,
                    }));
                }
            }
            Err(e) => {
                let e = Self::shared_error(&e);
                for (i, p) in pending {
                    self.lock_outbox().remove(&p.stored.id.seq);
                    outs[i] = Some(Err(self.named(e())));
                }
            }
        }
        for (i, earlier) in echoes {
            // the earlier object's own answer: its id as a duplicate, or its failure
            outs[i] = Some(match &outs[earlier] {
                Some(Ok(out)) => Ok(PutOutcome {
                    id: out.id,
                    duplicate: true,
                }),
                Some(Err(e)) => Err(Self::shared_error(e)()),
                None => Err(StorageError::Log(std::io::Error::other(
                    "the object this one repeats the message id of was not written",
                ))),
            });
        }
        Self::results(outs)
    }

    /// Copies of one error for every object it failed: of the same kind (a full disk stays
    /// one) and message.
    fn shared_error(e: &StorageError) -> impl Fn() -> StorageError + '_ {
        move || match e {
            StorageError::MessageIdInFlight { message_id } => StorageError::MessageIdInFlight {
                message_id: message_id.clone(),
            },
            _ => StorageError::Log(std::io::Error::new(e.io_kind(), e.to_string())),
        }
    }

    /// The answers of [`Store::write_many`], one per object in order.
    fn results(
        outs: Vec<Option<Result<PutOutcome, StorageError>>>,
    ) -> Vec<Result<PutOutcome, StorageError>> {
        outs.into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(StorageError::Log(std::io::Error::other(
                        "a write produced no result",
                    )))
                })
            })
            .collect()
    }

    /// An object by id: this node's own, or an unfinished copy of another node's.
    pub fn get(&self, id: ObjectId) -> Result<Option<StoredObject>, StorageError> {
        if id.node == self.node
            && let Some(o) = self.fresh.get(id.seq)
        {
            return Ok(Some(StoredObject::clone(&o)));
        }
        self.read(id)
    }

    /// [`Store::get`] without a copy of a recently written object (it is shared with the
    /// store's memory of them): what delivery reads once per object.
    pub fn get_shared(
        &self,
        id: ObjectId,
    ) -> Result<Option<std::sync::Arc<StoredObject>>, StorageError> {
        if id.node == self.node
            && let Some(o) = self.fresh.get(id.seq)
        {
            return Ok(Some(o));
        }
        Ok(self.read(id)?.map(std::sync::Arc::new))
    }

    /// An object read from the disk (a replica from its tree, this node's own through its
    /// locator and the object log).
    fn read(&self, id: ObjectId) -> Result<Option<StoredObject>, StorageError> {
        if id.node != self.node {
            return self.replica(id);
        }
        let Some(entry) = self.locator(id.seq)? else {
            return Ok(None);
        };
        let Some(rec) = self.log.read(entry.at, id.seq)? else {
            return Ok(None);
        };
        codec::decode_object(&rec, id)
            .map(Some)
            .map_err(|e| StorageError::Corrupt {
                tree: "objects",
                source: e,
            })
    }

    /// This node's objects of `seqs`, read for an answer of what it still disseminates, and
    /// the lowest of them still in the outbox whose bytes cannot be read yet: a put between
    /// its sequence number and its write (the object-log append can wait out another
    /// segment's flush). Left out unmarked, such an object would read to a holder as
    /// finished (below the next sequence number, yet not answered), and the holder would end
    /// its copy while the put went on to be acknowledged (`bench chaos --quick`, seed 31).
    pub fn read_own(
        &self,
        seqs: impl IntoIterator<Item = u64>,
    ) -> Result<(Vec<StoredObject>, Option<u64>), StorageError> {
        let mut out = Vec::new();
        let mut unwritten: Option<u64> = None;
        for seq in seqs {
            let id = ObjectId {
                node: self.node,
                seq,
            };
            match self.get(id)? {
                Some(o) => out.push(o),
                None if self.lock_outbox().contains_key(&seq) => {
                    unwritten = Some(unwritten.map_or(seq, |u| u.min(seq)));
                }
                None => {}
            }
        }
        Ok((out, unwritten))
    }

    /// Number of objects stored.
    pub fn object_count(&self) -> usize {
        self.locators_from(0)
            .filter(|f| matches!(f, Ok(locators::Found::Object(..))))
            .count()
    }

    /// Finished objects (out of the outbox), oldest first, until `keep_going` says stop:
    /// each is deleted with its message id when `delete(received_unix_ms)` says so; log
    /// segments no object points into any more are deleted after. Returns how many objects.
    pub(super) fn expire_finished(
        &self,
        mut delete: impl FnMut(u64) -> bool,
        mut keep_going: impl FnMut(usize) -> bool,
    ) -> Result<usize, StorageError> {
        let mut removed = 0;
        // removed a few hundred at a time: one rewrite of each run they share
        let mut doomed = Vec::new();
        for found in self.locators_from(0) {
            if !keep_going(removed) {
                break;
            }
            if doomed.len() >= EXPIRE_CHUNK {
                self.remove_locators(&std::mem::take(&mut doomed))?;
            }
            let (seq, entry) = match found? {
                locators::Found::Object(seq, entry) => (seq, entry),
                locators::Found::Damaged(_) => return Err(locators::damaged()),
            };
            if self.lock_outbox().contains_key(&seq) {
                continue;
            }
            let Entry {
                received_unix_ms,
                has_message_id,
                ..
            } = entry;
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
                self.fresh.forget(seq);
                doomed.push(seq);
                removed += 1;
            }
        }
        self.remove_locators(&doomed)?;
        if removed > 0 {
            let mut oldest_live = self.log.current_segment();
            for found in self.locators_from(0) {
                match found? {
                    locators::Found::Object(_, e) => oldest_live = oldest_live.min(e.at.segment),
                    locators::Found::Damaged(_) => return Err(locators::damaged()),
                }
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

    /// Retention by size: deletes the oldest objects whose dissemination is finished until
    /// at most `max_objects` remain (pending ones are never deleted); returns how many.
    pub fn expire_to_count(&self, max_objects: usize) -> Result<usize, StorageError> {
        let excess = self.object_count().saturating_sub(max_objects);
        self.expire_finished(|_| true, |removed| removed < excess)
    }
}
