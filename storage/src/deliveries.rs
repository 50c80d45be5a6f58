//! The deliveries keyspace, keyed by (subscription, object): pending, received (QoS 2),
//! acknowledged and dead-lettered, redrive, and retention of finished ones.

use super::*;

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

pub(super) fn delivery_key(sub: u64, obj: ObjectId) -> [u8; 20] {
    let mut k = [0u8; 20];
    k[..8].copy_from_slice(&sub.to_be_bytes());
    k[8..12].copy_from_slice(&obj.node.to_be_bytes());
    k[12..].copy_from_slice(&obj.seq.to_be_bytes());
    k
}

pub(super) fn delivery_of_key(k: &[u8]) -> Option<(u64, ObjectId)> {
    let sub = u64::from_be_bytes(k.get(..8)?.try_into().ok()?);
    let node = u32::from_be_bytes(k.get(8..12)?.try_into().ok()?);
    let seq = u64::from_be_bytes(k.get(12..20)?.try_into().ok()?);
    Some((sub, ObjectId { node, seq }))
}

impl DeliveryState {
    /// How far a delivery has come. A record only moves forward ([`Store::set_delivery`]):
    /// pending, then received (QoS 2), then dead-lettered or acknowledged.
    fn rank(&self) -> u8 {
        match self {
            DeliveryState::Pending { .. } => 0,
            DeliveryState::Received { .. } => 1,
            DeliveryState::DeadLetter { .. } => 2,
            DeliveryState::Acked { .. } => 3,
        }
    }
}

impl Store {
    /// Records where a delivery stands (durably); see [`Store::set_delivery_unflushed`].
    pub async fn set_delivery(
        &self,
        sub: u64,
        obj: ObjectId,
        state: &DeliveryState,
    ) -> Result<bool, StorageError> {
        let applied = self.set_delivery_unflushed(sub, obj, state)?;
        self.commit().await?;
        Ok(applied)
    }

    /// Records where a delivery stands without waiting for a flush (it reaches disk with the
    /// next one): for states whose loss in a crash only means one more attempt. A record
    /// never moves back: a state behind the one stored (a pending over a "received" or an
    /// acknowledged one, written by an attempt that read the record before another attempt
    /// moved it on) leaves it as it is, and the answer is `false`. Only a redrive takes a
    /// dead letter back to pending ([`Store::redrive`]). Before, a stale attempt's pending
    /// state could overwrite a QoS 2 delivery's "received" phase, and the delivery went out
    /// again from the start after its release.
    pub fn set_delivery_unflushed(
        &self,
        sub: u64,
        obj: ObjectId,
        state: &DeliveryState,
    ) -> Result<bool, StorageError> {
        let new = codec::encode_delivery(state);
        let mut applied = false;
        self.deliveries
            .fetch_and_update(delivery_key(sub, obj), |old| {
                // an undecodable record is overwritten
                let ahead = old
                    .and_then(|b| codec::decode_delivery(b).ok())
                    .is_some_and(|o| o.rank() > state.rank());
                applied = !ahead;
                if ahead {
                    old.map(<[u8]>::to_vec)
                } else {
                    Some(new.clone())
                }
            })?;
        Ok(applied)
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

    /// Removes every delivery record of the `objects` (a scan of all records: for the rare
    /// object an origin takes back from a lost adopter, whose records here were closed
    /// when it handed the object over); the answer is how many went. Not yet durable.
    pub fn remove_deliveries_of(
        &self,
        objects: &std::collections::HashSet<ObjectId>,
    ) -> Result<usize, StorageError> {
        let mut gone = 0;
        for kv in self.deliveries.iter() {
            let (k, _) = kv?;
            if delivery_of_key(&k).is_some_and(|(_, obj)| objects.contains(&obj)) {
                self.deliveries.remove(&k)?;
                gone += 1;
            }
        }
        Ok(gone)
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

    pub(super) fn deliveries_where(
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
                // the one move back a record makes
                let pending = DeliveryState::Pending {
                    attempts: 0,
                    next_attempt_unix_ms: now_unix_ms,
                };
                self.deliveries
                    .insert(delivery_key(sub, obj), codec::encode_delivery(&pending))?;
                self.commit().await?;
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
}
