//! The disk faults of `dissem bench chaos`: a node's object log damaged while it is down, as
//! a failing disk or a torn write leaves it. The newest segment's last records each get a
//! byte of their payload flipped, so their checksums fail at the next start (the node names
//! them and drops them; its quorum holds copies it restores them from). And a node's disk
//! filled while it runs, then freed: each node's data directory is a small tmpfs of its
//! own where mounts are allowed (root), and a ballast file takes every free byte of it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// A tmpfs of `mib` MiB mounted at `at`, unmounted when dropped.
#[derive(Debug)]
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts it; `None` where mounts are not allowed (not root).
    pub fn mount(at: &Path, mib: u32) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }

    /// [`Tmpfs::mount`] for a test: where mounts are not allowed it says so and answers
    /// `None` (the test passes), unless `DISSEM_REQUIRE_MOUNT` is set (CI, as root): then
    /// it fails.
    pub fn mount_for_test(at: &Path, mib: u32) -> Option<Tmpfs> {
        let fs = Tmpfs::mount(at, mib);
        if fs.is_none() {
            assert!(
                std::env::var_os("DISSEM_REQUIRE_MOUNT").is_none(),
                "DISSEM_REQUIRE_MOUNT is set but a tmpfs cannot be mounted here"
            );
            eprintln!("skipped: a tmpfs cannot be mounted here (not root?)");
        }
        fs
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The ballast file that fills a node's disk.
fn ballast(data: &Path) -> PathBuf {
    data.join("chaos-ballast")
}

/// Writes a ballast into `data` until its file system has no byte left; the answer is its
/// size.
pub fn fill(data: &Path) -> anyhow::Result<u64> {
    let path = ballast(data);
    let mut f =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    // whole MiBs, then what is left byte by byte in smaller steps
    for step in [1 << 20, 4 << 10, 1] {
        while f.write_all(&chunk[..step]).is_ok() {
            written += step as u64;
        }
    }
    let _ = f.sync_all();
    Ok(written)
}

/// Removes the ballast [`fill`] wrote.
pub fn free(data: &Path) -> anyhow::Result<()> {
    let path = ballast(data);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// Deletes everything in `data` (a lost disk), keeping the directory itself (it may be a
/// mount point).
pub fn wipe(data: &Path) -> anyhow::Result<()> {
    let entries = match std::fs::read_dir(data) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", data.display())),
    };
    for e in entries {
        let p = e?.path();
        let gone = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        gone.with_context(|| format!("wiping {}", p.display()))?;
    }
    Ok(())
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
        wipe(&dir).expect("wipe");
        assert!(dir.is_dir());
        assert_eq!(std::fs::read_dir(&dir).expect("read").count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_ballast_takes_every_byte_of_a_small_tmpfs_and_goes() {
        let dir = std::env::temp_dir().join(format!("chaosfill-{}", std::process::id()));
        let Some(fs) = Tmpfs::mount_for_test(&dir, 2) else {
            return;
        };
        let filled = fill(&dir).expect("fill");
        assert!(filled > (1 << 20), "{filled}");
        assert!(
            std::fs::write(dir.join("x"), b"x").is_err(),
            "the disk is full"
        );
        free(&dir).expect("free");
        std::fs::write(dir.join("x"), b"x").expect("room again");
        drop(fs);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
