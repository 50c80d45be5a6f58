//! The `dissem` binary end to end: the match benchmark on a small workload, its JSON, and its
//! errors for bad flags.

use std::process::Command;

fn dissem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dissem"))
}

#[test]
fn bench_match_runs_every_engine_and_writes_json() {
    let dir = std::env::temp_dir().join(format!("dissem-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for workload in [
        vec!["--workload", "iot"],
        vec!["--workload", "uniform", "--preds", "3", "--width", "0.1"],
        vec![
            "--workload",
            "uniform",
            "--kind",
            "eq",
            "--preds",
            "2",
            "--cardinality",
            "10",
        ],
    ] {
        let json = dir.join("out.json");
        let out = dissem()
            .args([
                "bench",
                "match",
                "--subs",
                "3000",
                "--events",
                "300",
                "--check-events",
                "300",
            ])
            .args(&workload)
            .arg("--json")
            .arg(&json)
            .output()
            .expect("run dissem");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{workload:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("matches identical across engines: yes"),
            "{stdout}"
        );
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
                .expect("valid json");
        assert_eq!(report["identical_matches"], serde_json::Value::Bool(true));
        let engines = report["engines"].as_array().expect("engines");
        let names: Vec<&str> = engines
            .iter()
            .filter_map(|e| e["engine"].as_str())
            .collect();
        assert_eq!(names, ["cpu", "bloom", "gpu", "naive"]);
        for e in engines {
            assert_eq!(e["events"].as_u64(), Some(300), "{e}");
            assert!(
                e["events_per_second"].as_f64().is_some_and(|v| v > 0.0),
                "{e}"
            );
        }
        // the same seed gives the same matches
        let total = engines[0]["matches_total"].clone();
        assert_eq!(engines[1]["matches_total"], total);
        assert_eq!(engines[2]["matches_total"], total);
        assert!(engines[2]["gpu"]["adapter"].is_string(), "{}", engines[2]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_flags_are_explained() {
    for (args, needle) in [
        (
            vec!["--workload", "uniform", "--preds", "30"],
            "--preds must be between 1 and --attrs",
        ),
        (
            vec!["--workload", "uniform", "--width", "0"],
            "--width must be in (0, 1]",
        ),
        (
            vec!["--bloom-bits", "100"],
            "bloom bits must be a multiple of 64",
        ),
        (
            vec!["--subs", "0"],
            "--subs and --events must be at least 1",
        ),
    ] {
        let out = dissem()
            .args(["bench", "match"])
            .args(&args)
            .output()
            .expect("run dissem");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
