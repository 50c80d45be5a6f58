//! The object log: object records appended to segment files beside the sled database, with
//! sled keeping only a small locator per object (key-value separation, as in WiscKey).
//!
//! sled rewrites whole leaf pages on change, so storing 1 KiB–1 MiB values in it multiplies
//! every write several times over and seals its I/O buffers often; under load that made
//! ingest slow and exposed a deadlock in sled 0.34's segment accountant (a file truncation
//! queued behind I/O threads that wait for the lock its caller holds). Appending the bytes
//! here keeps sled's write volume to a few dozen bytes per object.
//!
//! Each record is `[len u32][crc32 u32][seq u64][payload]` (little endian). A writer process
//! always starts a fresh segment, so a torn tail left by a crash is never appended to and an
//! offset is never reused. Durability: [`ObjectLog::sync`] runs `fdatasync` on the segment
//! being written (a segment is synced when it is closed); the store syncs the log while it
//! flushes sled, and a put is acknowledged only after both. A locator that reached the disk
//! before its bytes (sled also flushes on its own) points at a record that fails its length,
//! checksum or sequence check and reads as absent; the store drops it at open.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// A segment is closed and a new one started past this size.
const SEGMENT_BYTES: u64 = 64 << 20;
pub(crate) const HEADER: usize = 16;
/// The length a segment is given after a failed write: past any limit, so it is closed.
const BROKEN: u64 = u64::MAX / 2;

/// Where a record lies: segment number, offset of its header, payload length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Locator {
    pub segment: u32,
    pub offset: u64,
    pub len: u32,
}

impl Locator {
    pub const BYTES: usize = 16;

    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..4].copy_from_slice(&self.segment.to_le_bytes());
        b[4..12].copy_from_slice(&self.offset.to_le_bytes());
        b[12..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Locator> {
        if b.len() < Self::BYTES {
            return None;
        }
        Some(Locator {
            segment: u32::from_le_bytes(b[..4].try_into().ok()?),
            offset: u64::from_le_bytes(b[4..12].try_into().ok()?),
            len: u32::from_le_bytes(b[12..16].try_into().ok()?),
        })
    }
}

struct Writer {
    segment: u32,
    file: Arc<File>,
    len: u64,
}

/// Append-only segment files of object records.
#[derive(Debug)]
pub struct ObjectLog {
    dir: PathBuf,
    writer: Mutex<Writer>,
    readers: Mutex<HashMap<u32, Arc<File>>>,
    /// (segment, length) covered by the last sync.
    synced: Mutex<(u32, u64)>,
    /// `fdatasync` calls made by [`ObjectLog::sync`].
    disk_syncs: std::sync::atomic::AtomicU64,
    /// The records the check at open found damaged (their sequence numbers).
    damaged: Vec<u64>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("segment", &self.segment)
            .field("len", &self.len)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn segment_path(dir: &Path, segment: u32) -> PathBuf {
    dir.join(format!("{segment:010}.log"))
}

fn segment_of(name: &str) -> Option<u32> {
    name.strip_suffix(".log")?.parse().ok()
}

fn create_segment(dir: &Path, segment: u32) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(segment_path(dir, segment))?;
    // the new file's directory entry must survive a crash too
    File::open(dir)?.sync_all()?;
    Ok(f)
}

impl ObjectLog {
    /// Opens the log in `dir` (created if missing), checks the newest segment there (what
    /// a crash or a failing disk damaged is named in the log: `scrub`), and starts a fresh
    /// segment after it.
    pub fn open(dir: &Path) -> std::io::Result<ObjectLog> {
        std::fs::create_dir_all(dir)?;
        let mut segments = Self::segments_in(dir)?;
        segments.sort_unstable_by(|a, b| b.cmp(a));
        let newest = segments.first().copied();
        // the newest that holds records: a process killed before it wrote anything leaves
        // an empty newest segment, and checking only that one hid the damaged tail before it
        // (its objects read as absent, were never restored, and their deliveries were
        // dead-lettered as expired: 3 acknowledged objects lost, `bench chaos` seed 19037)
        let written = segments
            .iter()
            .copied()
            .find(|&s| std::fs::metadata(segment_path(dir, s)).is_ok_and(|m| m.len() > 0));
        let report = crate::scrub::check_tail(dir, written);
        let damaged = report.damaged.iter().map(|d| d.seq).collect();
        let segment = newest.map_or(1, |s| s + 1);
        let file = create_segment(dir, segment)?;
        Ok(ObjectLog {
            dir: dir.to_path_buf(),
            writer: Mutex::new(Writer {
                segment,
                file: Arc::new(file),
                len: 0,
            }),
            readers: Mutex::new(HashMap::new()),
            synced: Mutex::new((segment, 0)),
            disk_syncs: Default::default(),
            damaged,
        })
    }

    /// The sequence numbers of the records the check at open found damaged.
    pub fn damaged_at_open(&self) -> Vec<u64> {
        self.damaged.clone()
    }

    fn segments_in(dir: &Path) -> std::io::Result<Vec<u32>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            if let Some(s) = e?.file_name().to_str().and_then(segment_of) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Appends one record for object `seq` (not yet durable: see [`ObjectLog::sync`]).
    pub fn append(&self, seq: u64, payload: &[u8]) -> std::io::Result<Locator> {
        let at = self.append_many(std::iter::once((seq, payload)))?;
        at.into_iter()
            .next()
            .ok_or_else(|| std::io::Error::other("an append produced no locator"))
    }

    /// Appends a record for each `(seq, payload)` with one write, in order, all in the same
    /// segment (not yet durable: see [`ObjectLog::sync`]); their locators in the same order.
    pub fn append_many<'a>(
        &self,
        records: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> std::io::Result<Vec<Locator>> {
        let mut rec = Vec::new();
        let mut placed = Vec::new();
        for (seq, payload) in records {
            let len = u32::try_from(payload.len())
                .map_err(|_| std::io::Error::other("object record over 4 GiB"))?;
            placed.push((rec.len() as u64, len));
            rec.reserve(HEADER + payload.len());
            rec.extend_from_slice(&len.to_le_bytes());
            let mut crc = crc32fast::Hasher::new();
            crc.update(&seq.to_le_bytes());
            crc.update(payload);
            rec.extend_from_slice(&crc.finalize().to_le_bytes());
            rec.extend_from_slice(&seq.to_le_bytes());
            rec.extend_from_slice(payload);
        }
        if rec.is_empty() {
            return Ok(Vec::new());
        }
        let mut w = lock(&self.writer);
        if w.len > 0 && w.len + rec.len() as u64 > SEGMENT_BYTES {
            // close the full (or broken) segment durably before writing past it
            w.file.sync_data()?;
            let next = w.segment + 1;
            let file = create_segment(&self.dir, next)?;
            *w = Writer {
                segment: next,
                file: Arc::new(file),
                len: 0,
            };
        }
        let at = w.len;
        if let Err(e) = (&*w.file).write_all(&rec) {
            // the file may now hold part of this record, so offsets counted from here would
            // be wrong: the next append starts a fresh segment
            w.len = BROKEN;
            return Err(e);
        }
        w.len += rec.len() as u64;
        Ok(placed
            .into_iter()
            .map(|(off, len)| Locator {
                segment: w.segment,
                offset: at + off,
                len,
            })
            .collect())
    }

    /// Makes every record appended before the call durable. Nothing new since the last
    /// sync (a flush of delivery state only): no disk sync.
    pub fn sync(&self) -> std::io::Result<()> {
        let (file, upto) = {
            let w = lock(&self.writer);
            (w.file.clone(), (w.segment, w.len))
        };
        if *lock(&self.synced) >= upto {
            return Ok(());
        }
        // sync outside the writer's lock: appends go on meanwhile (they wait for the next)
        file.sync_data()?;
        self.disk_syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut synced = lock(&self.synced);
        *synced = (*synced).max(upto);
        Ok(())
    }

    fn reader(&self, segment: u32) -> std::io::Result<Option<Arc<File>>> {
        if let Some(f) = lock(&self.readers).get(&segment) {
            return Ok(Some(f.clone()));
        }
        match File::open(segment_path(&self.dir, segment)) {
            Ok(f) => {
                let f = Arc::new(f);
                lock(&self.readers).insert(segment, f.clone());
                Ok(Some(f))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The payload of object `seq` at `at`; `None` when the record is missing or does not
    /// check out (never made durable before a crash, or its segment was deleted).
    pub fn read(&self, at: Locator, seq: u64) -> std::io::Result<Option<Vec<u8>>> {
        let Some(file) = self.reader(at.segment)? else {
            return Ok(None);
        };
        let mut buf = vec![0u8; HEADER + at.len as usize];
        match file.read_exact_at(&mut buf, at.offset) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let field = |r: std::ops::Range<usize>| buf.get(r).unwrap_or(&[]);
        let len = field(0..4).try_into().map(u32::from_le_bytes).ok();
        let crc = field(4..8).try_into().map(u32::from_le_bytes).ok();
        let rec_seq = field(8..16).try_into().map(u64::from_le_bytes).ok();
        if len != Some(at.len) || rec_seq != Some(seq) {
            return Ok(None);
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&seq.to_le_bytes());
        h.update(&buf[HEADER..]);
        if crc != Some(h.finalize()) {
            return Ok(None);
        }
        buf.drain(..HEADER);
        Ok(Some(buf))
    }

    /// Deletes the closed segments numbered below `keep_from` (none of their records is
    /// referenced any more); returns how many files were removed.
    pub fn delete_below(&self, keep_from: u32) -> std::io::Result<usize> {
        let current = lock(&self.writer).segment;
        let mut removed = 0;
        for s in Self::segments_in(&self.dir)? {
            if s < keep_from && s != current {
                lock(&self.readers).remove(&s);
                std::fs::remove_file(segment_path(&self.dir, s))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The segment being written.
    pub fn current_segment(&self) -> u32 {
        lock(&self.writer).segment
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dissem-objlog-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn records_read_back_and_bad_ones_read_as_absent() {
        let d = dir("rw");
        let log = ObjectLog::open(&d).expect("open");
        let a = log.append(7, b"hello").expect("append");
        let b = log.append(8, &[9u8; 3000]).expect("append");
        log.sync().expect("sync");
        assert_eq!(
            log.read(a, 7).expect("read").as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(log.read(b, 8).expect("read"), Some(vec![9u8; 3000]));
        // wrong sequence, wrong length, past the end, unknown segment: absent, no error
        assert_eq!(log.read(a, 8).expect("read"), None);
        assert_eq!(log.read(Locator { len: 4, ..a }, 7).expect("read"), None);
        assert_eq!(
            log.read(
                Locator {
                    offset: 1 << 30,
                    ..b
                },
                8
            )
            .expect("read"),
            None
        );
        assert_eq!(
            log.read(Locator { segment: 99, ..a }, 7).expect("read"),
            None
        );
        // a flipped byte fails the checksum
        let path = segment_path(&d, a.segment);
        let mut bytes = std::fs::read(&path).expect("read file");
        bytes[HEADER + 1] ^= 0xff;
        std::fs::write(&path, bytes).expect("write file");
        let reopened = ObjectLog::open(&d).expect("reopen");
        assert_eq!(reopened.read(a, 7).expect("read"), None);
        assert_eq!(reopened.read(b, 8).expect("read"), Some(vec![9u8; 3000]));
        // a reopened log writes a new segment and never reuses an offset
        assert!(reopened.current_segment() > a.segment);
        let c = reopened.append(9, b"x").expect("append");
        assert_ne!((c.segment, c.offset), (a.segment, a.offset));
        assert_eq!(
            reopened
                .delete_below(reopened.current_segment())
                .expect("gc"),
            1
        );
        assert_eq!(reopened.read(b, 8).expect("read"), None);
        assert_eq!(
            reopened.read(c, 9).expect("read").as_deref(),
            Some(&b"x"[..])
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn after_a_failed_write_records_go_to_a_fresh_segment() {
        let d = dir("broken");
        let log = ObjectLog::open(&d).expect("open");
        let a = log.append(1, b"before").expect("append");
        // what a failed write leaves behind: a length that no longer matches the file
        lock(&log.writer).len = BROKEN;
        let b = log.append(2, b"after").expect("append");
        assert_eq!(b.segment, a.segment + 1);
        assert_eq!(b.offset, 0);
        log.sync().expect("sync");
        assert_eq!(
            log.read(a, 1).expect("read").as_deref(),
            Some(&b"before"[..])
        );
        assert_eq!(
            log.read(b, 2).expect("read").as_deref(),
            Some(&b"after"[..])
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn records_appended_together_read_back_each_at_its_locator() {
        let d = dir("many");
        let log = ObjectLog::open(&d).expect("open");
        let first = log.append(1, b"alone").expect("append");
        let payloads: [&[u8]; 3] = [b"one", &[7u8; 1000], b""];
        let ats = log
            .append_many([(2, payloads[0]), (3, payloads[1]), (4, payloads[2])])
            .expect("append many");
        assert_eq!(ats.len(), 3);
        assert_eq!(ats[0].offset, first.offset + (HEADER + 5) as u64);
        assert!(log.append_many([]).expect("nothing").is_empty());
        log.sync().expect("sync");
        for ((seq, payload), at) in (2..).zip(payloads).zip(&ats) {
            assert_eq!(log.read(*at, seq).expect("read").as_deref(), Some(payload));
        }
        assert_eq!(
            log.read(ats[1], 2).expect("read"),
            None,
            "another's sequence"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_sync_with_nothing_new_touches_no_disk() {
        let d = dir("sync");
        let log = ObjectLog::open(&d).expect("open");
        let syncs = || log.disk_syncs.load(std::sync::atomic::Ordering::Relaxed);
        log.sync().expect("sync");
        assert_eq!(syncs(), 0, "an empty segment needs no sync");
        log.append(1, b"a").expect("append");
        log.sync().expect("sync");
        log.sync().expect("sync");
        assert_eq!(syncs(), 1);
        log.append(2, b"b").expect("append");
        log.sync().expect("sync");
        assert_eq!(syncs(), 2);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn locators_round_trip_and_short_ones_are_rejected() {
        let l = Locator {
            segment: 3,
            offset: 1 << 40,
            len: 77,
        };
        assert_eq!(Locator::decode(&l.encode()), Some(l));
        assert_eq!(Locator::decode(&l.encode()[..15]), None);
    }
}
