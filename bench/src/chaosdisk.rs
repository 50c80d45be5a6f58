//! The disk faults of `dissem bench chaos`: a node's object log damaged while it is down, as
//! a failing disk or a torn write leaves it. The newest segment's last records each get a
//! byte of their payload flipped, so their checksums fail at the next start (the node names
//! them and drops them; its quorum holds copies it restores them from).

use std::path::{Path, PathBuf};

use anyhow::Context;

/// A record's header: length (u32), CRC32 (u32), sequence number (u64), little endian
/// (`storage::objlog`).
const HEADER: usize = 16;

/// The newest object-log segment of the node whose data directory is `data` that holds
/// records.
fn newest_segment(data: &Path) -> anyhow::Result<Option<PathBuf>> {
    let dir = data.join("objects");
    if !dir.exists() {
        return Ok(None);
    }
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > HEADER as u64))
        .collect();
    segs.sort();
    Ok(segs.pop())
}

/// Flips the last payload byte of each of the last `records` whole records of the newest
/// segment under `data` (the process must be down); the answer is how many it damaged.
pub fn damage_tail(data: &Path, records: usize) -> anyhow::Result<usize> {
    let Some(seg) = newest_segment(data)? else {
        return Ok(0);
    };
    let mut bytes = std::fs::read(&seg).with_context(|| format!("reading {}", seg.display()))?;
    // the payload ends of the whole records, walking from the start
    let mut ends = Vec::new();
    let mut at = 0usize;
    while at + HEADER <= bytes.len() {
        let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let end = at + HEADER + len as usize;
        if len == 0 || end > bytes.len() {
            break;
        }
        ends.push(end);
        at = end;
    }
    let damaged = ends.len().min(records);
    for &end in &ends[ends.len() - damaged..] {
        bytes[end - 1] ^= 0xff;
    }
    std::fs::write(&seg, &bytes).with_context(|| format!("writing {}", seg.display()))?;
    Ok(damaged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_records_of_the_newest_segment_are_damaged() {
        let dir = std::env::temp_dir().join(format!("chaosdisk-{}", std::process::id()));
        let objects = dir.join("objects");
        std::fs::create_dir_all(&objects).expect("dir");
        let record = |seq: u64, payload: &[u8]| {
            let mut r = (payload.len() as u32).to_le_bytes().to_vec();
            r.extend_from_slice(&[0; 4]);
            r.extend_from_slice(&seq.to_le_bytes());
            r.extend_from_slice(payload);
            r
        };
        let mut seg = Vec::new();
        for s in 1..=4 {
            seg.extend(record(s, b"abc"));
        }
        seg.extend_from_slice(&[9, 0]); // a torn tail
        std::fs::write(objects.join("0000000001.log"), b"old").expect("older");
        std::fs::write(objects.join("0000000002.log"), &seg).expect("newest");
        assert_eq!(damage_tail(&dir, 3).expect("damage"), 3);
        let after = std::fs::read(objects.join("0000000002.log")).expect("read");
        let changed: Vec<usize> = (0..seg.len()).filter(|&i| seg[i] != after[i]).collect();
        assert_eq!(changed, [2 * 19 - 1, 3 * 19 - 1, 4 * 19 - 1]);
        assert_eq!(damage_tail(&dir.join("none"), 3).expect("no log"), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
