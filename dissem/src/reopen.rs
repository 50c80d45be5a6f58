//! A node whose store's sled hit an I/O error (a disk filled to the last byte by another
//! process, before the reserve check could refuse the writes) starts again in place once the
//! disk has room. sled keeps its first I/O error for good and refuses every operation after
//! it until it is opened again, so without this the node would refuse every put and every
//! delivery record for as long as it runs, though the disk was freed long ago (found by
//! `dissem bench chaos`: a full disk, freed after 2 s, left a node refusing writes until it
//! was killed). The process replaces itself (`exec`, same process id, same arguments, the
//! address it is bound to kept), which is what a supervisor's restart would do: everything
//! acknowledged is on disk, and what was in flight is taken up again as after any restart.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

/// How often the store is looked at.
const EVERY: Duration = Duration::from_millis(500);

/// Watches `store` on the current runtime; replaces the process once sled has failed and
/// the disk has room again.
pub(crate) fn when_sled_fails(store: storage::Store, bound: SocketAddr) {
    tokio::spawn(async move {
        let mut said = false;
        loop {
            tokio::time::sleep(EVERY).await;
            // sled may have failed a write of its own that no flush of ours saw (on a disk
            // full for a moment, perhaps freed since): asked every time, since after such a
            // failure every write fails before it reaches a flush of ours
            if !store.probe_sled().await {
                continue;
            }
            if !store.has_room() {
                if !std::mem::replace(&mut said, true) {
                    tracing::error!(
                        "the store failed a write to disk (full): writes are refused; this \
                         node starts again in place once the disk has room"
                    );
                }
                continue;
            }
            tracing::error!(
                "the store failed a write to disk earlier and refuses every write since; the \
                 disk has room again: starting again in place to open it again"
            );
            let err = exec(&args_bound_to(std::env::args_os().skip(1), bound));
            tracing::error!("starting again failed: {err}; writes stay refused");
            return;
        }
    });
}

/// Opens the store in `dir` for node `node`. While its disk is full (sled needs room to
/// open: a start in place after a full disk whose room was taken again, or a start on a
/// full disk) it tries again every second instead of exiting: until then the node is down,
/// as if killed, and it comes up once there is room (`bench chaos`, seed 48069: a node
/// started again in place found the disk full again and exited).
pub(crate) async fn open_store(dir: &std::path::Path, node: u32) -> anyhow::Result<storage::Store> {
    let mut said = false;
    loop {
        match storage::Store::open(dir, node) {
            Ok(s) => {
                if said {
                    tracing::warn!("the disk has room again: store in {} open", dir.display());
                }
                return Ok(s);
            }
            Err(e) if e.is_disk_full() => {
                if !std::mem::replace(&mut said, true) {
                    tracing::error!(
                        "opening the store in {}: the disk is full ({e}); trying again every \
                         second until it has room",
                        dir.display()
                    );
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => anyhow::bail!("opening the store in {}: {e}", dir.display()),
        }
    }
}

/// `args` with the listen address set to `bound` (the port a `:0` picked stays this node's).
fn args_bound_to(mut args: impl Iterator<Item = OsString>, bound: SocketAddr) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut set = false;
    while let Some(a) = args.next() {
        if a == "--listen" {
            args.next();
            out.push(a);
            out.push(bound.to_string().into());
            set = true;
        } else if a.to_string_lossy().starts_with("--listen=") {
            out.push(format!("--listen={bound}").into());
            set = true;
        } else {
            out.push(a);
        }
    }
    if !set {
        out.push("--listen".into());
        out.push(bound.to_string().into());
    }
    out
}

#[cfg(unix)]
fn exec(args: &[OsString]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    match std::env::current_exe() {
        Ok(me) => std::process::Command::new(me).args(args).exec(),
        Err(e) => e,
    }
}

#[cfg(not(unix))]
fn exec(_: &[OsString]) -> std::io::Error {
    std::io::Error::other("starting again in place needs exec (unix)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_bound_address_replaces_the_listen_flag_or_is_added() {
        let bound: SocketAddr = "127.0.0.1:4242".parse().expect("addr");
        let got = args_bound_to(
            os(&["node", "--listen", "127.0.0.1:0", "--node", "3"]).into_iter(),
            bound,
        );
        assert_eq!(
            got,
            os(&["node", "--listen", "127.0.0.1:4242", "--node", "3"])
        );
        let got = args_bound_to(
            os(&["up", "--listen=0.0.0.0:0", "--listen-max-connections", "9"]).into_iter(),
            bound,
        );
        assert_eq!(
            got,
            os(&[
                "up",
                "--listen=127.0.0.1:4242",
                "--listen-max-connections",
                "9"
            ])
        );
        let got = args_bound_to(os(&["up", "--data", "d"]).into_iter(), bound);
        assert_eq!(
            got,
            os(&["up", "--data", "d", "--listen", "127.0.0.1:4242"])
        );
    }
}
