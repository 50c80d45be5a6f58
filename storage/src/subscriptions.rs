//! The subscriptions keyspace: opaque records by id, ids from a durable counter.

use super::*;

impl Store {
    /// A fresh subscription id (monotonic, durable across restarts).
    pub fn next_subscription_id(&self) -> Result<u64, StorageError> {
        Ok(self.db.generate_id()? + 1)
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

    /// Removes a subscription record, not yet durable; false if it did not exist.
    pub fn remove_subscription_unflushed(&self, id: u64) -> Result<bool, StorageError> {
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
