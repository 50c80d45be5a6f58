//! The subscriptions keyspace: opaque records by id, ids from a durable counter.

use super::*;

fn corrupt_placed() -> StorageError {
    StorageError::Corrupt {
        tree: "subscription_placed",
        source: CodecError::Truncated,
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

    /// Hands subscription ids out from `floor` on (if that is above what was handed out):
    /// an elected coordinator numbers from its epoch, so no two leaders hand out one id.
    pub fn raise_subscription_ids(&self, floor: u64) {
        self.subscription_id_floor
            .fetch_max(floor, Ordering::AcqRel);
    }

    /// Replaces every stored subscription with `records` (id, encoded record) and makes it
    /// durable: a new coordinator leader's registry, rebuilt from the nodes' copies.
    pub async fn replace_subscriptions(
        &self,
        records: &[(u64, Vec<u8>)],
    ) -> Result<(), StorageError> {
        self.subs.clear()?;
        self.placed.clear()?;
        for (id, r) in records {
            self.subs.insert(id.to_be_bytes(), r.as_slice())?;
        }
        self.commit().await
    }

    /// Stores (or replaces) a subscription record durably.
    pub async fn put_subscription(&self, id: u64, record: Vec<u8>) -> Result<(), StorageError> {
        self.subs.insert(id.to_be_bytes(), record)?;
        self.commit().await
    }

    /// Stores (or replaces) a subscription record, not yet durable ([`Store::commit`]).
    pub fn put_subscription_unflushed(&self, id: u64, record: &[u8]) -> Result<(), StorageError> {
        self.subs.insert(id.to_be_bytes(), record)?;
        Ok(())
    }

    /// Stores a copy of subscription `id` that node `placed_by` placed here (quorum
    /// replication), not yet durable.
    pub fn put_subscription_copy_unflushed(
        &self,
        id: u64,
        record: &[u8],
        placed_by: u32,
    ) -> Result<(), StorageError> {
        self.subs.insert(id.to_be_bytes(), record)?;
        self.placed
            .insert(id.to_be_bytes(), &placed_by.to_be_bytes()[..])?;
        Ok(())
    }

    /// Up to `limit` subscription copies with ids above `after`, in id order, that a node
    /// in `placed_by` placed: (id, record, placer).
    pub fn subscription_copies(
        &self,
        after: u64,
        limit: usize,
        placed_by: &std::collections::HashSet<u32>,
    ) -> Result<Vec<(u64, Vec<u8>, u32)>, StorageError> {
        let mut out = Vec::new();
        if after == u64::MAX {
            return Ok(out);
        }
        for kv in self.placed.range(after.saturating_add(1).to_be_bytes()..) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = kv?;
            let by = <[u8; 4]>::try_from(v.as_ref())
                .map(u32::from_be_bytes)
                .map_err(|_| corrupt_placed())?;
            if !placed_by.contains(&by) {
                continue;
            }
            if let Some(record) = self.subs.get(&k)? {
                let id = <[u8; 8]>::try_from(k.as_ref())
                    .map(u64::from_be_bytes)
                    .map_err(|_| corrupt_placed())?;
                out.push((id, record.to_vec(), by));
            }
        }
        Ok(out)
    }

    /// Removes a subscription record, not yet durable; false if it did not exist.
    pub fn remove_subscription_unflushed(&self, id: u64) -> Result<bool, StorageError> {
        self.placed.remove(id.to_be_bytes())?;
        Ok(self.subs.remove(id.to_be_bytes())?.is_some())
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
