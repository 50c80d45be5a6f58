//! The `dissem` binary end to end: the match benchmark on a small workload, its JSON, and its
//! errors for bad flags; the client commands against a running node; the demo.

use std::process::Command;

fn dissem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dissem"))
}

/// Runs `cmd` (logging at warn), fails the test with its output unless it succeeded, and
/// returns its standard output.
fn succeeds(cmd: &mut Command) -> String {
    let out = cmd
        .env("RUST_LOG", "warn")
        .output()
        .expect("running dissem");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The JSON file a command wrote.
fn json_file(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("the JSON file was written");
    serde_json::from_str(&text).expect("the JSON file parses")
}

/// Where each space-separated token of `line` ends.
fn token_ends(line: &str) -> Vec<usize> {
    let b = line.as_bytes();
    (0..b.len())
        .filter(|&i| b[i] != b' ' && (i + 1 == b.len() || b[i + 1] == b' '))
        .collect()
}

/// The engine table's rows line up under its headings: every value after the two left-aligned
/// columns ends where a heading ends, one heading per value.
fn table_lines_up(stdout: &str) {
    let lines: Vec<&str> = stdout.lines().collect();
    let h = lines
        .iter()
        .position(|l| l.starts_with("engine "))
        .expect("table heading");
    let heading = token_ends(lines[h]);
    for row in lines[h + 1..].iter().take_while(|l| {
        ["cpu ", "bloom ", "gpu ", "naive "]
            .iter()
            .any(|e| l.starts_with(e))
    }) {
        let values = &token_ends(row)[2..];
        assert_eq!(values.len(), 8, "{row}");
        for v in values {
            assert!(
                heading.contains(v),
                "a value ends at column {v}, under no heading:\n{}\n{row}",
                lines[h]
            );
        }
    }
}

/// A started process, killed when dropped (also when a test fails midway).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
        table_lines_up(&stdout);
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

#[test]
fn api_commands_against_a_running_node() {
    use std::io::{BufRead, BufReader};
    let dir = std::env::temp_dir().join(format!("dissem-cli-up-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut up = dissem()
        .args(["up", "--listen", "127.0.0.1:0", "--data"])
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn dissem up");
    let mut line = String::new();
    let stdout = up.stdout.take().expect("stdout");
    let up = KillOnDrop(up);
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("address line");
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .expect("address")
        .to_string();
    let url = format!("http://{addr}");
    let run = |args: &[&str]| {
        let out = dissem()
            .args(args)
            .env("DISSEM_NODE_URL", &url)
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // a fresh node has none (later, deliveries to the deleted subscription may dead-letter)
    let (code, out, _) = run(&["dead-letters"]);
    assert_eq!((code, out.as_str()), (Some(0), "no dead letters"));
    let (code, id, err) = run(&[
        "subscribe",
        "--filter",
        r#"temp > 30 && site prefix "kr/""#,
        "--target",
        "stream:alerts",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(id.parse::<u64>().is_ok(), "{id}");
    let (code, list, _) = run(&["subscriptions"]);
    assert_eq!(code, Some(0));
    assert!(
        list.contains("stream:alerts") && list.contains("temp > 30"),
        "{list}"
    );
    let (code, obj, err) = run(&[
        "put",
        "--attr",
        "temp=31.5",
        "--attr",
        "site=kr/seoul",
        "--data",
        "hello",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(obj.contains(':'), "{obj}");
    let (code, stats, _) = run(&["stats"]);
    assert_eq!(code, Some(0));
    assert!(
        stats.contains("objects\n") && stats.contains("1 objects"),
        "grouped, with units: {stats}"
    );
    let (code, stats, _) = run(&["stats", "-o", "json"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&stats).expect("stats json");
    assert_eq!(
        (v["objects_stored"].as_u64(), v["subscriptions"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    // errors name what to fix and exit 2
    let (code, _, err) = run(&["subscribe", "--filter", "temp >", "--target", "stream:x"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("subscription.filter.text: at column 7"),
        "{err}"
    );
    let (code, _, err) = run(&["put", "--attr", "noequals"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--attr"), "{err}");
    let (code, _, err) = run(&["subscribe", "--filter", "a = 1", "--target", "ftp:x"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--target"), "{err}");
    let (code, out, _) = run(&["unsubscribe", &id]);
    assert_eq!(code, Some(0));
    assert!(out.contains("deleted"));
    // what went wrong at run time reads as the node said it and exits 1
    let (code, _, err) = run(&["unsubscribe", "999999"]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err, "error: subscription 999999 not found\n");
    // a reader that goes away before the output comes (`dissem stats | head -0`): no panic
    let mut closed = dissem()
        .arg("stats")
        .env("DISSEM_NODE_URL", &url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dissem stats");
    drop(closed.stdout.take());
    let out = closed.wait_with_output().expect("dissem stats");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("panicked"),
        "{:?}: {err}",
        out.status
    );
    let (code, _, err) = run(&["stats", "--node-url", "http://127.0.0.1:1"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.starts_with("error: unavailable: cannot reach http://127.0.0.1:1"),
        "{err}"
    );
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_delivers_everything_to_every_endpoint_kind() {
    let json = std::env::temp_dir().join(format!("dissem-demo-{}.json", std::process::id()));
    let out = dissem()
        .args([
            "demo",
            "--subs",
            "400",
            "--objects",
            "200",
            "--rate",
            "400",
            "--json",
        ])
        .arg(&json)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running dissem demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("demo json")).expect("json");
    assert_eq!(v["put"], 200);
    assert_eq!(v["lost"], 0, "{v}");
    assert_eq!(v["bad_webhook_signatures"], 0);
    assert!(v["matched"].as_u64().unwrap_or(0) > 0, "{v}");
    // every QoS level got deliveries: gRPC QoS 1 and webhook, gRPC QoS 2, stream QoS 0
    for q in ["0", "1", "2"] {
        assert!(
            v["delivered_by_qos"][q].as_u64().unwrap_or(0) > 0,
            "QoS {q}: {v}"
        );
    }
    assert!(v["duplicates_by_qos"].get("2").is_none(), "{v}");
    let _ = std::fs::remove_file(&json);
}

#[test]
fn bench_cost_reports_node_cpu_per_delivery_for_every_target_kind() {
    let dir = std::env::temp_dir().join(format!("dissem-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json = dir.join("cost.json");
    let stdout = succeeds(
        dissem()
            .args([
                "bench",
                "cost",
                "--subs",
                "40",
                "--fanout",
                "2",
                // enough that each kind's phase costs the node well over the 10 ms a clock
                // tick of /proc/<pid>/stat counts (400 read 0 s once, on a quiet machine)
                "--objects",
                "3000",
                "--json",
            ])
            .arg(&json),
    );
    let v = json_file(&json);
    assert_eq!(v["pass"], true, "{v}");
    let rows = v["rows"].as_array().expect("rows");
    let kinds: Vec<_> = rows
        .iter()
        .map(|r| r["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        ["grpc-batch", "webhook", "webhook-batch", "stream"],
        "{v}"
    );
    for r in rows {
        // every object reached exactly its two subscriptions, and the node's CPU was read
        assert_eq!(r["deliveries"], 6000, "{r}");
        assert_eq!(r["lost"], 0, "{r}");
        assert_eq!(r["wrong"], 0, "{r}");
        assert!(r["node_cpu_seconds"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert!(
            r["node_cpu_us_per_delivery"].as_f64().unwrap_or(0.0) > 0.0,
            "{r}"
        );
        assert!(r["objects_per_second"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    }
    assert!(stdout.contains("node µs/delivery"), "{stdout}");
    let bad = dissem()
        .args(["bench", "cost", "--kinds", "pigeon"])
        .output()
        .expect("running dissem bench cost");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--kinds"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_e2e_writes_json_and_an_svg_plot() {
    let dir = std::env::temp_dir().join(format!("dissem-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (json, svg) = (dir.join("e2e.json"), dir.join("e2e.svg"));
    let stdout = succeeds(
        dissem()
            .args([
                "bench",
                "e2e",
                "--subs",
                "300",
                "--objects",
                "200",
                "--seconds",
                "0.5",
                "--saturation-seconds",
                "1",
                "--json",
            ])
            .arg(&json)
            .arg("--svg")
            .arg(&svg),
    );
    let v = json_file(&json);
    assert_eq!(v["lost"], 0, "{v}");
    assert!(v["saturation_objects_per_second"].as_f64().unwrap_or(0.0) > 0.0);
    // saturation is sustained (sized from the burst to about the second asked for), and
    // the overload phase says whether a backlog built up
    assert!(
        v["saturation_seconds"].as_f64().unwrap_or(0.0) > 0.4,
        "a sustained phase, not a burst: {v}"
    );
    assert!(v["burst_objects_per_second"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(
        v["saturation_node_cpu_us_per_delivery"]
            .as_f64()
            .unwrap_or(0.0)
            > 0.0,
        "{v}"
    );
    assert!(v["overload_backlog_seconds"].as_f64().is_some(), "{v}");
    assert!(v["overload_backlog_built"].is_boolean(), "{v}");
    assert!(stdout.contains("sustained over"), "{stdout}");
    assert!(stdout.contains("after the last put"), "{stdout}");
    assert!(v["half_load"]["phase"]["latency_by_priority"]["7"]["count"].as_u64() > Some(0));
    let plot = std::fs::read_to_string(&svg).expect("svg");
    assert!(
        plot.starts_with("<svg") && plot.contains("priority 7"),
        "{plot}"
    );
    // readable without hovering: axis labels, a legend, each bar's value as text, and a
    // title that fits the width (centred at half of it)
    for part in [
        "p99 latency (ms)",
        "object priority",
        "half load (",
        "2x overload (",
        "text-anchor=\"middle\">p99 latency, put to delivered",
    ] {
        assert!(plot.contains(part), "{part:?} missing:\n{plot}");
    }
    let p7 = v["half_load"]["phase"]["latency_by_priority"]["7"]["p99_ms"]
        .as_f64()
        .expect("p99");
    assert!(
        plot.contains(&format!(">{p7:.1}</text>")),
        "the value {p7:.1} on its bar:\n{plot}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// With no `XDG_RUNTIME_DIR` (a container, a CI job) the Vulkan loader and Mesa complain on
/// stderr at every GPU probe; dissem gives itself a private one, so none of that reaches the
/// terminal.
#[test]
fn no_runtime_dir_noise_reaches_the_terminal() {
    let out = dissem()
        .args([
            "bench",
            "match",
            "--subs",
            "200",
            "--events",
            "64",
            "--check-events",
            "16",
            "--engine",
            "gpu",
        ])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("RUST_LOG")
        .output()
        .expect("dissem bench match");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
}

/// `bench match --patterns FILE --events FILE`: a user's own EventBridge patterns (and text
/// filters) against their own JSON events, every engine compared with the naive reference;
/// a line that does not parse is named by file and line.
#[test]
fn bench_match_runs_a_users_own_patterns_and_events() {
    let dir = std::env::temp_dir().join(format!("dissem-given-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let patterns = dir.join("patterns.jsonl");
    let events = dir.join("events.jsonl");
    std::fs::write(
        &patterns,
        "# from the AWS documentation\n\
         {\"source\":[\"aws.ec2\"],\"detail\":{\"state\":[\"terminated\",\"stopped\"]}}\n\
         {\"detail\":{\"c-count\":[{\"numeric\":[\">\",0,\"<=\",5]}]}}\n\
         \n\
         detail.state prefix \"run\"\n",
    )
    .expect("patterns");
    let mut ev = String::new();
    for i in 0..40 {
        let state = ["running", "stopped", "terminated"][i % 3];
        ev.push_str(&format!(
            "{{\"source\":\"aws.ec2\",\"detail\":{{\"state\":\"{state}\",\"c-count\":{}}}}}\n",
            i % 8
        ));
    }
    std::fs::write(&events, ev).expect("events");
    let json = dir.join("out.json");
    let run = |p: &std::path::Path, e: &std::path::Path| {
        dissem()
            .args(["bench", "match", "--patterns"])
            .arg(p)
            .arg("--events")
            .arg(e)
            .arg("--json")
            .arg(&json)
            .output()
            .expect("dissem bench match")
    };
    let out = run(&patterns, &events);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("3 subscriptions"), "{stdout}");
    assert!(
        stdout.contains("matches identical across engines: yes"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parses");
    assert_eq!(report["identical_matches"], true, "{report}");
    // a bad line is named by file and line
    std::fs::write(
        &events,
        "{\"detail\":{\"state\":\"running\"}}\n{\"tags\":[\"a\",\"b\"]}\n",
    )
    .expect("events");
    let out = run(&patterns, &events);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("events.jsonl:2") && err.contains("tags is an array"),
        "{err}"
    );
    let out = dissem()
        .args(["bench", "match", "--patterns"])
        .arg(&patterns)
        .output()
        .expect("dissem bench match");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--events FILE"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--threads 2`: the CPU engines match on two threads and still give exactly the naive
/// reference's matches, in event order.
#[test]
fn bench_match_on_two_threads_matches_the_reference() {
    let dir = std::env::temp_dir().join(format!("dissem-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let json = dir.join("out.json");
    let out = dissem()
        .args([
            "bench",
            "match",
            "--subs",
            "3000",
            "--events",
            "1500",
            "--check-events",
            "1500",
            "--batch",
            "64",
            "--threads",
            "2",
            "--engine",
            "all",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("dissem bench match");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("2 thread(s)"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parses");
    assert_eq!(report["threads"], 2);
    assert_eq!(report["identical_matches"], true, "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
