//! The disk reserve: a put is refused while the file system holding the data directory has
//! less free space than a reserve (1% of its size, at least 16 MiB, at most 1 GiB), so the
//! objects never take the last bytes that sled, the delivery records and the outbox floor
//! need to stay writable. A node whose disk fills therefore refuses new objects with a
//! clear error (`RESOURCE_EXHAUSTED`, naming the directory), keeps serving and delivering
//! what it holds, and takes puts again as soon as space is freed. Free space is read at
//! most every 100 ms (a statvfs), and at every put while it is low.
//!
//! The operator may set the reserve instead (`--disk-reserve-mib`, or the environment variable
//! `DISSEM_DISK_RESERVE_MIB`, which also reaches stores opened in-process, as tests do): a
//! shared disk with little free room (a CI host) still takes puts under a small reserve.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::StorageError;

/// Free space is read again after this long.
const EVERY_MS: u64 = 100;
const MIN_RESERVE: u64 = 16 << 20;
const MAX_RESERVE: u64 = 1 << 30;
/// The environment variable that sets the reserve in MiB.
pub const RESERVE_ENV: &str = "DISSEM_DISK_RESERVE_MIB";
/// No reserve set: the share of the file system ([`reserve_for`]) is used.
const AUTO: u64 = u64::MAX;

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
    /// The reserve the operator set, in bytes, or [`AUTO`].
    fixed: AtomicU64,
}

/// The reserve that `DISSEM_DISK_RESERVE_MIB` sets, if it is set and a number.
fn reserve_from_env() -> u64 {
    match std::env::var(RESERVE_ENV) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(mib) => mib.saturating_mul(1 << 20),
            Err(_) => {
                tracing::warn!(
                    "{RESERVE_ENV}={v:?} is not a whole number of MiB: the default reserve applies"
                );
                AUTO
            }
        },
        Err(_) => AUTO,
    }
}

impl Space {
    pub(crate) fn new(dir: PathBuf) -> Space {
        Space {
            dir,
            checked_ms: AtomicU64::new(0),
            low: AtomicBool::new(false),
            free: AtomicU64::new(0),
            reserve: AtomicU64::new(0),
            fixed: AtomicU64::new(reserve_from_env()),
        }
    }

    /// Sets the reserve to `bytes` (`None`: back to the share of the file system).
    pub(crate) fn set_reserve(&self, bytes: Option<u64>) {
        self.fixed
            .store(bytes.map_or(AUTO, |b| b.min(AUTO - 1)), Ordering::Relaxed);
        // read again at the next put
        self.checked_ms.store(0, Ordering::Relaxed);
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
                let reserve = match self.fixed.load(Ordering::Relaxed) {
                    AUTO => reserve_for(total),
                    set => set,
                };
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
    fn a_reserve_set_by_the_operator_replaces_the_share() {
        let s = Space::new(std::env::temp_dir());
        // more than any disk has free: every put is refused
        s.set_reserve(Some(u64::MAX / 2));
        let e = s
            .check(1_000)
            .expect_err("a reserve above the free space refuses");
        assert!(e.to_string().contains("kept in reserve"), "{e}");
        // none: nothing is refused while the disk has any room at all
        s.set_reserve(Some(0));
        assert!(s.check(1_000).is_ok());
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
