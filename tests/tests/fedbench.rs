//! `dissem bench federation --quick` runs its three modes end to end (real clusters, a link
//! cut, a SIGKILLed primary, a refusing subscriber) and writes the JSON the issue asks for:
//! an object per mode with `pass`, `missing` and `duplicates`; nothing acknowledged may be
//! missing in any mode. (Whether each mode passes also depends on timings, e.g. the
//! promotion within 1 s, which a loaded CI machine may miss: the benchmark reports those.)

use tests::temp_dir;

#[test]
fn the_federation_benchmark_runs_every_mode_and_loses_nothing() {
    let dir = temp_dir("fedbench");
    let json = dir.join("federation.json");
    let (r, text, _) = tests::bench_json(&["bench", "federation", "--quick"], &json);
    for mode in ["all_active", "active_passive", "spillover"] {
        let m = &r[mode];
        assert!(m["pass"].is_boolean(), "{mode}: {m}");
        assert_eq!(m["missing"], 0, "{mode} lost objects: {m}");
        assert!(m["duplicates"].is_u64(), "{mode}: {m}");
    }
    let a = &r["all_active"];
    assert_eq!(a["forwards"], a["expected_forwards"], "{a}");
    assert_eq!(a["re_forwards"], 0, "{a}");
    assert!(
        r["spillover"]["spilled"].as_u64() > Some(0),
        "{}",
        r["spillover"]
    );
    assert!(
        text.contains("all-active") && text.contains("federation: "),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
