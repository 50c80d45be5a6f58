//! The disk reserve: a put is refused while the file system holding the data directory has
//! less free space than a reserve (1% of its size, at least 16 MiB, at most 1 GiB), so the
//! objects never take the last bytes that sled, the delivery records and the outbox floor
//! need to stay writable. A node whose disk fills therefore refuses new objects with a
//! clear error (`RESOURCE_EXHAUSTED`, naming the directory), keeps serving and delivering
//! what it holds, and takes puts again as soon as space is freed. Free space is read at
//! most every 100 ms (a statvfs), and at every put while it is low.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::StorageError;

/// Free space is read again after this long.
const EVERY_MS: u64 = 100;
const MIN_RESERVE: u64 = 16 << 20;
const MAX_RESERVE: u64 = 1 << 30;

/// The reserve for a file system of `total` bytes.
pub fn reserve_for(total: u64) -> u64 {
    (total / 100).clamp(MIN_RESERVE, MAX_RESERVE)
}

#[derive(Debug)]
pub(crate) struct Space {
    dir: PathBuf,
    checked_ms: AtomicU64,
    low: AtomicBool,
    /// What the last reading found: (free, reserve), for the error.
    free: AtomicU64,
    reserve: AtomicU64,
}

impl Space {
    pub(crate) fn new(dir: PathBuf) -> Space {
        Space {
            dir,
            checked_ms: AtomicU64::new(0),
            low: AtomicBool::new(false),
            free: AtomicU64::new(0),
            reserve: AtomicU64::new(0),
        }
    }

    /// Ok while the disk has room for objects; [`StorageError::DiskFull`] below the reserve.
    pub(crate) fn check(&self, now_ms: u64) -> Result<(), StorageError> {
        let due = now_ms.saturating_sub(self.checked_ms.load(Ordering::Relaxed)) >= EVERY_MS;
        if due || self.low.load(Ordering::Relaxed) {
            self.checked_ms.store(now_ms, Ordering::Relaxed);
            // a file system that cannot say is not taken for full
            if let (Ok(free), Ok(total)) =
                (fs2::available_space(&self.dir), fs2::total_space(&self.dir))
            {
                let reserve = reserve_for(total);
                self.free.store(free, Ordering::Relaxed);
                self.reserve.store(reserve, Ordering::Relaxed);
                self.low.store(free < reserve, Ordering::Relaxed);
            }
        }
        if !self.low.load(Ordering::Relaxed) {
            return Ok(());
        }
        Err(StorageError::DiskFull {
            dir: self.dir.display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "{} KiB free, under the {} KiB kept in reserve",
                    self.free.load(Ordering::Relaxed) >> 10,
                    self.reserve.load(Ordering::Relaxed) >> 10
                ),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_a_hundredth_within_bounds() {
        assert_eq!(reserve_for(100 << 20), MIN_RESERVE);
        assert_eq!(reserve_for(10 << 30), (10 << 30) / 100);
        assert_eq!(reserve_for(1 << 42), MAX_RESERVE);
    }

    #[test]
    fn a_disk_with_room_passes() {
        let s = Space::new(std::env::temp_dir());
        // the test machine's temporary directory has more than the reserve free
        if let (Ok(free), Ok(total)) = (
            fs2::available_space(std::env::temp_dir()),
            fs2::total_space(std::env::temp_dir()),
        ) && free > reserve_for(total)
        {
            assert!(s.check(1_000).is_ok());
        }
    }
}
