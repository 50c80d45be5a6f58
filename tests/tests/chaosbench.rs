//! `dissem bench chaos --quick` (issue 31) runs seeded fault schedules over real processes
//! (etcd, two coordinators, a 3x3 grid of nodes) and writes the JSON the issue asks for; a
//! fixed seed, so a failure here replays with `dissem bench chaos --quick --seed 31`.
//!
//! Without an `etcd` binary the test says so and passes, unless `DISSEM_REQUIRE_ETCD` is
//! set (CI installs etcd and sets it).

use std::path::Path;
use std::process::Command;
use tests::temp_dir;

/// One chaos cluster at a time: each is etcd, two coordinators, nine nodes and a peer
/// cluster, and four of them at once on two cores stretch every lease and deadline the
/// schedules are drawn against.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn the_chaos_benchmark_runs_its_schedules_and_every_invariant_holds() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !bench::elected::etcd_available() {
        assert!(
            std::env::var_os("DISSEM_REQUIRE_ETCD").is_none(),
            "DISSEM_REQUIRE_ETCD is set but there is no etcd binary"
        );
        eprintln!("skipped: no etcd binary on the PATH (apt-get install etcd-server)");
        return;
    }
    let dir = temp_dir("chaosbench");
    let (r, text, ok) = chaos_json(&["--quick", "--seed", "31"], &dir);
    let text = format!("{text}{}", evidence(&r, &dir, &text));
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
        "federation_missing",
    ] {
        assert_eq!(r[zero], 0, "{zero}: {r}\n{text}");
    }
    assert_eq!(r["violations"], serde_json::json!([]), "{text}");
    assert_eq!(r["pass"], true, "{text}");
    assert!(ok, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `dissem bench chaos <args>` with its processes' logs in `dir/logs` (debug for the
/// node's replication and delivery, unless `DISSEM_TEST_LOG` says otherwise): the JSON,
/// stdout, and whether it exited 0.
fn chaos_json(args: &[&str], dir: &Path) -> (serde_json::Value, String, bool) {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).expect("a folder for the logs");
    let json = dir.join("chaos.json");
    let level = std::env::var("DISSEM_TEST_LOG")
        .unwrap_or_else(|_| "info,worker::daemon=debug,worker::deliver=debug".into());
    let out = Command::new(tests::dissem_bin())
        .args(["bench", "chaos"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .env("DISSEM_TEST_LOG_DIR", &logs)
        .env("DISSEM_TEST_LOG", level)
        .output()
        .expect("dissem runs");
    let mut text = String::from_utf8_lossy(&out.stdout).to_string();
    // where a failed run kept its folder (the receiver's journal): `evidence` reads it
    for l in String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("kept "))
    {
        text.push_str(l);
        text.push('\n');
    }
    let r = std::fs::read_to_string(&json).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (
        serde_json::from_str(&r).expect("JSON"),
        text,
        out.status.success(),
    )
}

/// The objects a violation's detail names, as (node, seq): written `ObjectId { node: N,
/// seq: S }` or `object N:S`.
fn named_objects(detail: &str) -> Vec<(u64, u64)> {
    let digits = |s: &str| -> Option<u64> {
        let d: String = s.chars().take_while(char::is_ascii_digit).collect();
        d.parse().ok()
    };
    let mut out = Vec::new();
    for part in detail.split("ObjectId {").skip(1) {
        let num = |key: &str| part.split(key).nth(1).and_then(digits);
        if let (Some(node), Some(seq)) = (num("node: "), num("seq: ")) {
            out.push((node, seq));
        }
    }
    for part in detail.split("object ").skip(1) {
        let node = digits(part);
        let seq = part
            .split_once(':')
            .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
            .and_then(|(_, rest)| digits(rest));
        if let (Some(node), Some(seq)) = (node, seq) {
            out.push((node, seq));
        }
    }
    out
}

/// What the processes' logs (in `dir/logs`) and the receiver's journal (in the folder a
/// failed run kept, named in `text`) say about the objects the violations name, in time
/// order with the process that said it: a failure in CI, where the logs are gone with the
/// machine, is read from this.
fn evidence(r: &serde_json::Value, dir: &Path, text: &str) -> String {
    let mut needles = Vec::new();
    for v in r["violations"].as_array().into_iter().flatten() {
        for (node, seq) in named_objects(v["detail"].as_str().unwrap_or_default()) {
            needles.push(format!("{node}:{seq}"));
            needles.push(format!("-{node}-{seq}"));
        }
    }
    if needles.is_empty() {
        return String::new();
    }
    needles.truncate(12);
    let mut lines = Vec::new();
    let kept = text
        .lines()
        .filter_map(|l| l.strip_prefix("kept ")?.strip_suffix(" for inspection"))
        .map(|k| Path::new(k).join("receiver.journal"));
    let logs = std::fs::read_dir(dir.join("logs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|f| f.path());
    for f in logs.chain(kept) {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let who = name
            .rsplit('-')
            .next()
            .unwrap_or(&name)
            .trim_end_matches(".log")
            .to_string();
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for l in text
            .lines()
            .filter(|l| needles.iter().any(|n| l.contains(n.as_str())))
        {
            // a journal line is JSON: its time is `journaled_unix_ms`
            let journaled = serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["journaled_unix_ms"].as_u64());
            if let Some(ms) = journaled {
                lines.push(format!("{} {who:>12} {l}", worker::deliver::rfc3339(ms)));
                continue;
            }
            let (at, rest) = l.split_at(l.len().min(27));
            lines.push(format!(
                "{at} {who:>12} {}",
                rest.chars().take(260).collect::<String>()
            ));
        }
    }
    lines.sort();
    let shown = lines.len().min(150);
    format!(
        "\nthe logs on {} ({} lines, {shown} shown):\n{}\n",
        needles.join(" "),
        lines.len(),
        lines[..shown].join("\n")
    )
}

#[test]
fn the_evidence_reads_the_objects_a_violation_names() {
    assert_eq!(
        named_objects("object 6:17 at the receiver; object 6:18 (x); ObjectId { node: 2, seq: 9 }"),
        vec![(2, 9), (6, 17), (6, 18)]
    );
    assert_eq!(named_objects("2 objects"), vec![]);
}

/// Replays the one schedule of `seed`, checks it is still the schedule whose `faults` (by
/// kind) found the bug, and that it passes with every count at 0.
fn replay(seed: u64, faults: serde_json::Value) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !bench::elected::etcd_available() {
        return; // the first test says so, or fails under DISSEM_REQUIRE_ETCD
    }
    let dir = temp_dir(&format!("chaos-{seed}"));
    let seed = seed.to_string();
    let args = ["--seed", &seed, "--schedules", "1", "--faults", "4"];
    let (r, text, ok) = chaos_json(&args, &dir);
    let text = format!("{text}{}", evidence(&r, &dir, &text));
    assert_eq!(
        r["faults"], faults,
        "the schedule of seed {seed} changed: {r}"
    );
    for zero in ["lost", "qos2_duplicates", "federation_missing"] {
        assert_eq!(r[zero], 0, "{zero}: {text}");
    }
    assert!(ok && r["pass"] == true, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The schedule that found a node on a fresh disk ending its predecessor's unfinished
/// objects: a subscriber refusing (so node 1's first objects stay unfinished), node 1's data
/// directory deleted and the node started again, etcd restarted, the leader killed. At the
/// new leader every holder caught up with node 1 and took its answer (it held none of its
/// predecessor's objects) as their end, before node 1's heir could adopt them: 4 acknowledged
/// objects were never delivered. Holders now leave copies below the origin's first sequence
/// number to the heir. (Since link and disk faults are drawn, the seed also cuts the link to
/// the peer cluster first and damages a node's object log last; its cluster faults are the
/// same.) The damaged log found a second hole, about one run in twenty: node 4 restarted
/// without its last three objects, and before its repair asked the holders for their copies,
/// the healed link acknowledged those objects and node 4 told the holders to end the copies
/// (not in its outbox, no open record: taken for delivered). An object awaiting its repair now
/// counts as being disseminated, and a node answers no catch-up of its own objects until its
/// repair is done. And a third, about one run in forty: node 1 killed (the wipe) while its
/// match task handed node 3 the matches of one object; the dropped call dropped node 3's
/// hand-off after its QoS 1 pushes started but before the QoS 2 record was written, and the
/// object stayed owed for ever (the QoS 2 subscriber never saw it). Hand-offs now run on a
/// task of their own.
#[test]
fn a_lost_disk_before_a_new_leader_loses_no_acknowledged_object() {
    replay(
        109,
        serde_json::json!({"etcd_restart": 1, "leader_kill": 1, "link_cut": 1,
            "log_damaged": 1, "node_wiped": 1, "subscriber_down": 1}),
    );
}

/// The schedule that found a restarted node answering an object with a durable open QoS 2
/// record as delivered: the peer cluster down (so every object is owed to the link), node 0
/// killed between a QoS 2 Deliver and its "received" mark, then restarted. Before it resumed
/// its records, it answered its holders' catch-up with the objects its link still owed and
/// that had no delivery open in memory as forwarding (delivered); its own catch-up then
/// learned that object as delivered elsewhere and closed the record: the release never came.
/// Open records on disk now count until they are resumed. The schedule ends with a damaged
/// object log (node 6 restores one object from its copies). (Since slow links are drawn,
/// the link is a wide-area one throughout too; its other faults are the same.)
#[test]
fn a_restarted_node_does_not_answer_an_undelivered_object_as_delivered() {
    replay(
        6009,
        serde_json::json!({"link_slow": 1, "log_damaged": 1, "node_kill": 2, "node_pause": 1,
            "peer_down": 1, "subs_while_down": 1}),
    );
}

/// The schedule that found an heir missing what a peer cluster was owed: the link cut, node 1
/// killed and restarted while node 0 puts (so node 1 lacks the copies of node 0's newest
/// objects), then node 0's disk lost. Node 0 had delivered those objects, so node 2 held them
/// as forwarding, but the heir pulled only unfinished copies from the other holders and owed
/// its links only what it held itself: the peer never got them. Holders now answer their
/// forwarding copies too.
#[test]
fn an_heir_owes_the_links_the_forwarding_copies_it_missed() {
    replay(
        7015,
        serde_json::json!({"link_cut": 1, "node_pause": 1, "node_wiped": 1,
            "subs_while_down": 1, "subscriber_down": 1}),
    );
}

/// The schedule that found a damaged log tail hidden behind an empty segment: node 4 killed
/// and started again (while a subscription changed), then killed during that start, before
/// it wrote anything, and its object log's last records damaged. The start had left a fresh,
/// empty newest segment, and the check at open read only that one: the three objects behind
/// it read as absent for good, were never restored from their copies, and their deliveries
/// (the subscriber had refused them until then) were dead-lettered as expired. The check now
/// reads the newest segment that holds records. It replays every time. (Since full disks are
/// drawn, a node's disk is filled and freed among its faults too; the others are the same.)
#[test]
fn a_damaged_tail_behind_an_empty_segment_loses_no_acknowledged_object() {
    replay(
        19037,
        serde_json::json!({"disk_full": 1, "log_damaged": 1, "node_kill": 1, "node_pause": 1,
            "subs_while_down": 1, "subscriber_down": 1}),
    );
}
