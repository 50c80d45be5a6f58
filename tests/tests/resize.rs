//! Online grid resize (issue 33, part 1), with real processes: `dissem bench resize` grows a
//! 2x3 cluster under load to 3x3 through `dissem grid resize` and shrinks it back through
//! `Admin.ResizeGrid`, with a node SIGKILLed during each move and the leading coordinator
//! SIGKILLed during the shrink; every acknowledged object reaches both subscribers, the QoS 2
//! one once, copies moved, and the nodes that left exited 0. A resize a single node cannot do
//! is refused with the reason.
//!
//! Without an `etcd` binary the benchmark test says so and passes, unless
//! `DISSEM_REQUIRE_ETCD` is set.

use std::time::Duration;

use tests::{run_dissem, start_up, temp_dir};

#[test]
fn a_grid_grows_and_shrinks_under_load_through_kills_and_loses_nothing() {
    if !tests::have_etcd() {
        return;
    }
    let json = temp_dir("resize-json").join("resize.json");
    let (r, out, ok) = tests::bench_json(
        &[
            "bench",
            "resize",
            "--rate",
            "30",
            "--subs",
            "40",
            "--settle-s",
            "2",
        ],
        &json,
    );
    assert!(ok, "the benchmark failed: {out}\n{r}");
    assert_eq!(r["pass"], true, "{r}");
    assert_eq!(r["lost"], 0, "{r}");
    assert_eq!(r["qos2_duplicates"], 0, "{r}");
    assert!(r["acknowledged"].as_u64().unwrap_or(0) > 0, "{r}");
    let moves = r["moves"].as_array().expect("moves");
    assert_eq!(moves.len(), 2, "{r}");
    for m in moves {
        assert!(
            m["moved_copies"].as_u64().unwrap_or(0) > 0,
            "copies moved: {m}"
        );
    }
    assert_eq!(r["resize_seconds"].as_array().map(Vec::len), Some(2), "{r}");
    assert!(out.contains("PASS"), "{out}");
    let _ = std::fs::remove_file(&json);
}

#[test]
fn a_single_node_cluster_refuses_a_resize_and_says_why() {
    let dir = temp_dir("resize-up");
    let up = start_up(&dir, &[]);
    let url = up.url();
    let (code, out, err) = run_dissem(
        &["grid", "resize", "3x3", "--node-url", &url],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(err.contains("no grid to resize"), "{err}");
    let (code, _, err) = run_dissem(
        &["grid", "resize", "0x3", "--node-url", &url],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("rows and columns must be at least 1"), "{err}");
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
}
