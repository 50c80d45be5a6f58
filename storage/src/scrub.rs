//! What a start finds at the tail of the object log. The newest segment is the one a crash
//! (or a failing disk) leaves damaged: a torn record whose write was cut off, or a record
//! whose bytes changed. At open every record of that segment is read back and checked
//! (length, CRC32, sequence), and what does not check out is named in the log with its
//! file and offset, then skipped: its locator reads as absent, and the process starts and
//! serves everything else. Never a panic, and no allocation sized by what the damaged
//! bytes say (payloads are checksummed in fixed-size chunks).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::objlog::{HEADER, segment_path};

/// Chunk in which payloads are read for their checksum.
const CHUNK: usize = 64 << 10;

/// One record that did not check out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damaged {
    pub file: PathBuf,
    pub offset: u64,
    /// The sequence number its header names (it may itself be damaged).
    pub seq: u64,
}

/// What the check of one segment found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TailReport {
    /// Records that checked out.
    pub records: u64,
    /// Records whose checksum failed (skipped; the rest of the segment was still read).
    pub damaged: Vec<Damaged>,
    /// Bytes at the end that are not a whole record (a write cut off, or a length that
    /// points past the end): (offset, bytes).
    pub torn: Option<(u64, u64)>,
}

/// Checks every record of segment `segment` in `dir`.
pub fn check_segment(dir: &Path, segment: u32) -> std::io::Result<TailReport> {
    let path = segment_path(dir, segment);
    let mut f = std::io::BufReader::new(File::open(&path)?);
    let size = f.get_ref().metadata()?.len();
    let mut report = TailReport::default();
    let mut at = 0u64;
    let mut buf = vec![0u8; CHUNK];
    while at < size {
        if size - at < HEADER as u64 {
            report.torn = Some((at, size - at));
            break;
        }
        let mut h = [0u8; HEADER];
        f.read_exact(&mut h)?;
        let field = |r: std::ops::Range<usize>| h.get(r).unwrap_or(&[]);
        let len = field(0..4).try_into().map_or(0, u32::from_le_bytes) as u64;
        let crc = field(4..8).try_into().map_or(0, u32::from_le_bytes);
        let seq = field(8..16).try_into().map_or(0, u64::from_le_bytes);
        if len > size - at - HEADER as u64 {
            report.torn = Some((at, size - at));
            break;
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&seq.to_le_bytes());
        let mut left = len as usize;
        while left > 0 {
            let n = left.min(CHUNK);
            f.read_exact(&mut buf[..n])?;
            hasher.update(&buf[..n]);
            left -= n;
        }
        if hasher.finalize() == crc {
            report.records += 1;
        } else {
            report.damaged.push(Damaged {
                file: path.clone(),
                offset: at,
                seq,
            });
        }
        at += HEADER as u64 + len;
    }
    Ok(report)
}

/// Checks the newest segment in `dir` (if any) and names in the log what it found damaged.
pub fn check_tail(dir: &Path, newest: Option<u32>) -> TailReport {
    let Some(segment) = newest else {
        return TailReport::default();
    };
    match check_segment(dir, segment) {
        Ok(r) => {
            for d in &r.damaged {
                tracing::error!(
                    "object log {} at offset {}: the record of object sequence {} fails its \
                     checksum (damaged on disk): skipped, that object reads as absent",
                    d.file.display(),
                    d.offset,
                    d.seq
                );
            }
            if let Some((offset, bytes)) = r.torn {
                tracing::warn!(
                    "object log {} at offset {offset}: {bytes} bytes that are not a whole \
                     record (a write cut off by a crash): skipped, never appended to",
                    segment_path(dir, segment).display()
                );
            }
            r
        }
        Err(e) => {
            tracing::error!(
                "object log {}: the tail could not be read ({e}); starting anyway, records \
                 that do not check out read as absent",
                segment_path(dir, segment).display()
            );
            TailReport::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objlog::ObjectLog;

    #[test]
    fn a_flipped_byte_and_a_torn_tail_are_named_and_the_rest_checks_out() {
        let d = std::env::temp_dir().join(format!("dissem-scrub-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let log = ObjectLog::open(&d).expect("open");
        let a = log.append(1, b"first").expect("append");
        let b = log.append(2, &[7u8; 200_000]).expect("append");
        let c = log.append(3, b"third").expect("append");
        log.sync().expect("sync");
        drop(log);
        let path = segment_path(&d, a.segment);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[(b.offset as usize) + HEADER + 100] ^= 0x40;
        // a torn record: a header that promises more than follows
        bytes.extend_from_slice(&1000u32.to_le_bytes());
        bytes.extend_from_slice(&[0xab; 9]);
        std::fs::write(&path, &bytes).expect("write");
        let r = check_tail(&d, Some(a.segment));
        assert_eq!(r.records, 2);
        assert_eq!(
            r.damaged,
            vec![Damaged {
                file: path.clone(),
                offset: b.offset,
                seq: 2
            }]
        );
        assert_eq!(r.torn, Some((c.offset + HEADER as u64 + 5, 13)));
        // a length field that is garbage reads as a torn tail, without a huge allocation
        bytes.truncate(c.offset as usize);
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0u8; 12]);
        std::fs::write(&path, &bytes).expect("write");
        let r = check_tail(&d, Some(a.segment));
        assert_eq!(r.torn, Some((c.offset, 16)));
        // the log opens over it and serves the records that check out
        let log = ObjectLog::open(&d).expect("reopen");
        assert_eq!(
            log.read(a, 1).expect("read").as_deref(),
            Some(&b"first"[..])
        );
        assert_eq!(log.read(b, 2).expect("read"), None);
        let _ = std::fs::remove_dir_all(&d);
    }
}
