//! Cluster-level tests with real processes: the process harness lives in `bench::procs`
//! (the cluster benchmark uses it too); this crate adds where the `dissem` binary is and the
//! tests themselves (`tests/cluster.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

pub use bench::procs::*;

/// The `dissem` binary of this build (built on demand when a test runs alone).
pub fn dissem_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/dissem
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf();
    let bin = dir.join("dissem");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-p", "dissem"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok && bin.exists(), "could not build {}", bin.display());
    }
    bin
}

/// Starts a coordinator and `n` nodes of this build's `dissem`.
pub fn start_cluster(dir: &Path, n: u32, coord_args: &[&str], node_args: &[&str]) -> Cluster {
    Cluster::start(&dissem_bin(), dir, n, coord_args, node_args)
}

/// The runtime a test drives its clients on: two worker threads, like the machine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
