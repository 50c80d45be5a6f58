//! Whether the last run of a store ended with a clean stop. A clean stop (SIGTERM) lets the
//! deliveries under way settle, writes every outcome and flushes, then leaves a mark; the next
//! open takes the mark away (durably, so a crash later in that run is not taken for a clean
//! stop). Without the mark the last run crashed, and a delivery it left open, or an object
//! it left in the outbox, may have been pushed with its outcome lost: delivered again, it
//! says so (`Delivery.redelivered`), where a repeat that said `attempt: 1` could not be told
//! from a first delivery.

use super::*;

/// The meta key of the clean-stop mark.
const META_CLEAN_STOP: &[u8] = b"clean_stop";

/// Takes the clean-stop mark at open: whether the last run stopped cleanly (a store without
/// any earlier run counts as clean). The removal is flushed at once.
pub(super) fn take_mark(
    db: &sled::Db,
    meta: &sled::Tree,
    fresh: bool,
) -> Result<bool, StorageError> {
    let marked = meta.remove(META_CLEAN_STOP)?.is_some();
    if marked {
        db.flush()?;
    }
    Ok(marked || fresh)
}

impl Store {
    /// The last write of a clean stop: flushes what is written, then marks the store as
    /// stopped cleanly. Call it once nothing is being delivered any more: an outcome written
    /// after the mark might not reach the disk, and the next run would trust it.
    pub async fn stopped_cleanly(&self) -> Result<(), StorageError> {
        self.commit().await?;
        self.meta.insert(META_CLEAN_STOP, &[1u8][..])?;
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|_| StorageError::Flusher)??;
        Ok(())
    }

    /// Whether the run before this opening ended in a crash (no clean-stop mark).
    pub fn crashed_before(&self) -> bool {
        self.crashed_before
    }

    /// Whether a delivery of `id` may have been pushed before by someone whose outcome this
    /// node does not know: the object was put before a crash of this node, or it is a copy
    /// this node took over from its dead origin.
    pub fn maybe_delivered_before(&self, id: ObjectId) -> bool {
        if id.node == self.node {
            return self.crashed_before && !self.put_since_open(id);
        }
        self.crashed_before || self.lock_adopted().contains_key(&id)
    }
}
