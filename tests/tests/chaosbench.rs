//! `dissem bench chaos --quick` (issue 31) runs seeded fault schedules over real processes
//! (etcd, two coordinators, a 3x3 grid of nodes) and writes the JSON the issue asks for; a
//! fixed seed, so a failure here replays with `dissem bench chaos --quick --seed 31`.
//!
//! Without an `etcd` binary the test says so and passes, unless `DISSEM_REQUIRE_ETCD` is
//! set (CI installs etcd and sets it).

use tests::temp_dir;

#[test]
fn the_chaos_benchmark_runs_its_schedules_and_every_invariant_holds() {
    if !bench::elected::etcd_available() {
        assert!(
            std::env::var_os("DISSEM_REQUIRE_ETCD").is_none(),
            "DISSEM_REQUIRE_ETCD is set but there is no etcd binary"
        );
        eprintln!("skipped: no etcd binary on the PATH (apt-get install etcd-server)");
        return;
    }
    let dir = temp_dir("chaosbench");
    let json = dir.join("chaos.json");
    let (r, text, ok) = tests::bench_json(&["bench", "chaos", "--quick", "--seed", "31"], &json);
    assert!(r["schedules"].as_u64() >= Some(2), "{r}");
    let faults: u64 = r["faults"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0);
    assert!(faults >= 6, "faults by kind: {r}");
    assert!(r["acknowledged"].as_u64() > Some(0), "{r}");
    for zero in [
        "lost",
        "qos2_duplicates",
        "misdelivered",
        "resurrected",
        "stale_versions",
    ] {
        assert_eq!(r[zero], 0, "{zero}: {r}\n{text}");
    }
    assert_eq!(r["violations"], serde_json::json!([]), "{text}");
    assert_eq!(r["pass"], true, "{text}");
    assert!(ok, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
