//! Disk faults through the real binary (issue 31): a node whose disk fills up refuses puts
//! with `RESOURCE_EXHAUSTED` naming its data directory, keeps serving what it holds, and
//! takes puts again once space is freed; a node whose object log was damaged while it was
//! down (a flipped byte in an acknowledged record, a torn record at the end) names the
//! damage in its log, starts and serves every other object. In neither case is anything
//! acknowledged lost, except the record the disk itself damaged. A disk filled to the last
//! byte that fails sled's own write leaves the node refusing writes until the disk has room,
//! then it starts again in place (and one that starts on a full disk waits for room); and a
//! QoS 2 delivery whose received phase the disk refused is never released until it is
//! stored, so a restart shows it once.
//!
//! The full disk is a small tmpfs mounted for the test (as root, which CI is). Where mounts
//! are not allowed the test says so and passes, unless `DISSEM_REQUIRE_MOUNT` is set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bench::chaosdisk::{Tmpfs, fill, free};
use proto::v1;
use tests::{Proc, channel, dissem_bin, runtime, temp_dir, wait_for};

fn up(data: &Path) -> Proc {
    up_with(data, &[])
}

fn up_with(data: &Path, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = [
        "up",
        "--listen",
        "127.0.0.1:0",
        "--gpu",
        "off",
        "--data",
        &data.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::start(&dissem_bin(), &args)
}

fn put_of(n: i64, bytes: usize) -> v1::PutRequest {
    v1::PutRequest {
        data: vec![(n % 251) as u8; bytes],
        ..tests::temp_put(n)
    }
}

async fn put(url: &str, req: v1::PutRequest) -> Result<v1::ObjectId, tonic::Status> {
    v1::ingest_client::IngestClient::new(channel(url))
        .put(req)
        .await
        .map(|r| r.into_inner().id.unwrap_or_default())
}

async fn get(url: &str, id: v1::ObjectId) -> Result<v1::StoredObject, tonic::Status> {
    v1::objects_client::ObjectsClient::new(channel(url))
        .get(v1::GetObjectRequest { id: Some(id) })
        .await
        .map(|r| r.into_inner())
}

/// Every acknowledged object reads back whole (by its number).
async fn all_read_back(url: &str, acked: &[(i64, v1::ObjectId)], bytes: usize) {
    for (n, id) in acked {
        let o = get(url, *id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged object {n} ({id:?}): {e}"));
        assert_eq!(o.data, vec![(n % 251) as u8; bytes], "object {n}");
    }
}

#[test]
fn a_full_disk_refuses_puts_by_name_keeps_serving_and_recovers_when_freed() {
    let dir = temp_dir("disk-full");
    let Some(fs) = Tmpfs::mount_for_test(&dir.join("mnt"), 48) else {
        return;
    };
    let data = fs.path().join("data");
    runtime().block_on(async {
        let mut node = up(&data);
        let url = node.url();
        const BYTES: usize = 32 << 10;
        let mut acked = Vec::new();
        for n in 0..20 {
            acked.push((n, put(&url, put_of(n, BYTES)).await.expect("put")));
        }
        fill(fs.path()).expect("fill the disk");
        // the disk is full: refused by name, never acknowledged
        let mut refused = None;
        for n in 20..60 {
            match put(&url, put_of(n, BYTES)).await {
                Ok(id) => acked.push((n, id)),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let e = refused.expect("a put on a full disk was refused");
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        assert!(
            e.message().contains(&data.display().to_string()) && e.message().contains("full"),
            "the error names the disk: {e}"
        );
        // still serving: what it holds reads back, the admin API answers
        all_read_back(&url, &acked, BYTES).await;
        v1::admin_client::AdminClient::new(channel(&url))
            .stats(v1::StatsRequest::default())
            .await
            .expect("stats on a full disk");
        // space freed: puts are taken again
        free(fs.path()).expect("free the disk");
        let n = 1000;
        let id = wait_for(
            "a put after space was freed",
            Duration::from_secs(30),
            || {
                let url = url.clone();
                async move { put(&url, put_of(n, BYTES)).await.ok() }
            },
        )
        .await;
        acked.push((n, id));
        // and after a kill, everything acknowledged is there
        node.restart();
        all_read_back(&node.url(), &acked, BYTES).await;
        drop(node);
    });
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node started on a full disk (sled needs room to open its store) waits, says so in its
/// log, and comes up once the disk has room, with everything it acknowledged before
/// (`bench chaos` seed 48069: a node started again in place after a full disk found it full
/// again, and exited).
#[test]
fn a_node_started_on_a_full_disk_waits_for_room_and_comes_up() {
    let dir = temp_dir("disk-full-start");
    let Some(fs) = Tmpfs::mount_for_test(&dir.join("mnt"), 48) else {
        return;
    };
    let data = fs.path().join("data");
    let log = dir.join("node.log");
    runtime().block_on(async {
        const BYTES: usize = 32 << 10;
        let mut acked = Vec::new();
        let node = up(&data);
        for n in 0..10 {
            acked.push((n, put(&node.url(), put_of(n, BYTES)).await.expect("put")));
        }
        drop(node);
        fill(fs.path()).expect("fill the disk");
        // the disk is freed a while after the node starts
        let mnt = fs.path().to_path_buf();
        let freer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(3));
            free(&mnt)
        });
        let node = Logged::up(&data, &log);
        freer
            .join()
            .expect("the freeing thread")
            .expect("free the disk");
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            said.contains("the disk is full") && said.contains("trying again every second"),
            "the node says it waits for room: {said}"
        );
        all_read_back(&node.url, &acked, BYTES).await;
        drop(node);
    });
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dissem up` with its log (stderr, at `warn`) in a file.
struct Logged {
    child: std::process::Child,
    url: String,
}

impl Logged {
    fn up(data: &Path, log: &Path) -> Logged {
        Self::up_with(data, log, &[])
    }

    fn up_with(data: &Path, log: &Path, extra: &[&str]) -> Logged {
        use std::io::BufRead;
        let mut child = Command::new(dissem_bin())
            .args(["up", "--listen", "127.0.0.1:0", "--gpu", "off", "--data"])
            .arg(data)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("dissem up");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(out).lines();
            if let Some(Ok(l)) = lines.next() {
                let _ = tx.send(l);
            }
            for _ in lines {}
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!("dissem up did not report its address")
            });
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_default()
            .to_string();
        Logged {
            child,
            url: format!("http://{addr}"),
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The newest object-log segment in `data` (the one a crash leaves its tail in).
fn newest_segment(data: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(data.join("objects"))
        .expect("object log")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
        .collect();
    segs.sort();
    segs.pop().expect("a segment with records")
}

#[test]
fn a_damaged_log_tail_is_named_at_start_and_everything_else_is_served() {
    let dir = temp_dir("disk-torn");
    let data = dir.join("data");
    runtime().block_on(async {
        let mut node = up(&data);
        let url = node.url();
        const BYTES: usize = 1000;
        // the first put waits until the node has heard from its coordinator (a retryable
        // UNAVAILABLE before that: it failed this test once)
        let first = bench::procs::put_retrying(&url, put_of(0, BYTES), Duration::from_secs(30))
            .await
            .expect("put");
        let mut acked = vec![(
            0,
            v1::ObjectId {
                node: first.node,
                seq: first.seq,
            },
        )];
        for n in 1..30 {
            acked.push((n, put(&url, put_of(n, BYTES)).await.expect("put")));
        }
        node.kill();
        // the last record's payload is damaged, and a torn record follows it
        let seg = newest_segment(&data);
        let mut bytes = std::fs::read(&seg).expect("segment");
        let last = bytes.len() - 10;
        bytes[last] ^= 0xff;
        bytes.extend_from_slice(&4096u32.to_le_bytes());
        bytes.extend_from_slice(b"torn");
        std::fs::write(&seg, &bytes).expect("damage");
        let log = dir.join("node.log");
        let node = Logged::up(&data, &log);
        let url = node.url.clone();
        let (damaged, kept) = acked.split_last().expect("objects");
        all_read_back(&url, kept, BYTES).await;
        let e = get(&url, damaged.1).await.expect_err("the damaged object");
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            text.contains("fails its checksum") && text.contains(&seg.display().to_string()),
            "the damaged record is named in the log:\n{text}"
        );
        assert!(
            text.contains("not a whole record"),
            "the torn tail too:\n{text}"
        );
        // alone, no other node holds a copy: the lost object is named and given up (kept,
        // it would hold the outbox floor, and every start would match again what follows it)
        let given_up = wait_for("the lost object given up", Duration::from_secs(10), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            async move { text.contains("cannot be restored (no grid").then_some(text) }
        })
        .await;
        assert!(given_up.contains("lost at open"), "{given_up}");
        // and it takes puts
        put(&url, put_of(99, BYTES))
            .await
            .expect("a put after the repair");
        drop(node);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// A full disk on which sled failed a write: the node sends a QoS 2 subscriber nothing (no
/// Deliver whose received phase it could not store, no release) until it starts again on
/// what its disk holds, once freed; the subscriber shows each object once, across a restart
/// too. (`bench chaos` seeds 41068/41069 found a node releasing unrecorded on a full disk and
/// delivering again after a restart; seed 42046 a release on a phase that only sled's memory
/// held.) In a run where the full disk was refused by the reserve check and sled kept room of
/// its own, sled does not fail, and only the second half holds (it says so on stderr).
#[test]
fn a_qos2_delivery_is_not_released_while_a_full_disk_refuses_its_received_phase() {
    use bench::recorder::Recorder;
    let dir = temp_dir("disk-qos2");
    let Some(fs) = Tmpfs::mount_for_test(&dir.join("mnt"), 48) else {
        return;
    };
    let data = fs.path().join("data");
    runtime().block_on(async {
        let mut node = up_with(&data, &["--allow-private-targets"]);
        let url = node.url();
        let (rec, target) = Recorder::start().await.expect("recorder");
        rec.set_refusing(true);
        let retry = v1::RetryPolicy {
            max_attempts: 1000,
            initial_backoff_ms: 50,
            max_backoff_ms: 200,
            ..Default::default()
        };
        let sub = wait_for("the subscription", Duration::from_secs(30), || {
            let (url, target) = (url.clone(), target.clone());
            async move {
                bench::procs::create_grpc_subscription(
                    &url,
                    "temp >= 0".into(),
                    &target,
                    v1::Qos::ExactlyOnce,
                    Some(retry),
                )
                .await
                .ok()
            }
        })
        .await;
        rec.expect_qos2(sub);
        let mut ids = Vec::new();
        for n in 0..5 {
            let id = bench::procs::put_retrying(&url, put_of(n, 100), Duration::from_secs(30))
                .await
                .expect("put");
            ids.push(id);
        }
        // the deliveries are owed (refused so far); the disk fills and sled (in most runs)
        // fails a write, then the subscriber takes them: every Deliver's received phase is
        // refused
        fill(fs.path()).expect("fill the disk");
        sled_fails(&url).await;
        // the refusal came from sled's failed write, or from the reserve check before any
        // write reached sled; then sled may fail later, or never (its files keep room they
        // took before the disk filled; two runs in about thirty here)
        let failed = bench::procs::try_wait_for(Duration::from_secs(5), || {
            let url = url.clone();
            async move {
                bench::procs::stats(&url)
                    .await
                    .ok()
                    .filter(|s| s.store_failed)
            }
        })
        .await
        .is_some();
        rec.set_refusing(false);
        if failed {
            // while the store has failed nothing goes out: no Deliver (its received phase
            // cannot be stored) and no release (`bench chaos` seed 42046: a release on a
            // phase that lived in sled's memory only, then a Deliver again). Three seconds
            // are fifteen retries at this policy's backoff.
            let called = bench::procs::try_wait_for(Duration::from_secs(3), || {
                let any = ids.iter().any(|&id| !rec.calls((sub, id)).is_empty());
                async move { any.then_some(()) }
            })
            .await;
            assert!(
                called.is_none(),
                "a QoS 2 call went out while the store had failed: calls {:?}, shown {:?}",
                ids.iter()
                    .map(|&id| rec.calls((sub, id)))
                    .collect::<Vec<_>>(),
                rec.shown()
            );
            assert_eq!(
                rec.distinct(),
                0,
                "released while the disk refused the received phase"
            );
        } else {
            // the deliveries go on while sled has room of its own; what must hold either
            // way is checked below: each shown once, none again after a restart
            eprintln!(
                "note: sled did not fail within 5 s of the refusal; the failed-store path was \
                 not taken this run"
            );
        }
        // space freed: each is released once
        free(fs.path()).expect("free the disk");
        wait_for("every object shown", Duration::from_secs(30), || {
            let all = ids.iter().all(|&id| rec.first_shown((sub, id)).is_some());
            async move { all.then_some(()) }
        })
        .await;
        // and a restart shows none of them again (one more object shows it has resumed)
        node.restart();
        let url = node.url();
        let last = bench::procs::put_retrying(&url, put_of(5, 100), Duration::from_secs(30))
            .await
            .expect("put after the restart");
        wait_for("the last object shown", Duration::from_secs(30), || {
            let shown = rec.first_shown((sub, last)).is_some();
            async move { shown.then_some(()) }
        })
        .await;
        assert_eq!(rec.extra_shows(|s| s == sub), 0, "{:?}", rec.shown());
        drop(node);
    });
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Creates subscriptions (no object matches them) through the node at `url` until one is
/// refused: on a full disk, by the reserve check or once sled's own write failed. The refusal is
/// `RESOURCE_EXHAUSTED`, naming the disk, within the call's deadline (before, the Create
/// waited for an image that could not be written, past the caller's deadline).
async fn sled_fails(url: &str) {
    for i in 0..50 {
        let s = bench::procs::grpc_subscription(
            &format!("temp > {}", 1_000_000 + i),
            "http://127.0.0.1:9",
        );
        if let Err(e) = bench::procs::create_subscription(url, s).await {
            assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
            assert!(e.message().contains("is full"), "{e}");
            return;
        }
    }
    panic!("50 subscriptions created on a full disk");
}

/// A disk filled to the last byte by another process can make sled's own write fail before
/// the reserve refuses anything (here: a subscription's record); sled then refuses every
/// operation until it is opened again. Once the disk has room the node starts again in place
/// (same process, same address) and takes puts again, with everything it acknowledged.
#[test]
fn a_node_whose_store_failed_on_a_full_disk_starts_again_in_place_once_freed() {
    let dir = temp_dir("disk-sled");
    let Some(fs) = Tmpfs::mount_for_test(&dir.join("mnt"), 48) else {
        return;
    };
    let data = fs.path().join("data");
    let log = dir.join("node.log");
    runtime().block_on(async {
        let mut node = Logged::up_with(&data, &log, &["--allow-private-targets"]);
        let url = node.url.clone();
        let first = bench::procs::put_retrying(&url, put_of(0, 1000), Duration::from_secs(30))
            .await
            .expect("put");
        fill(fs.path()).expect("fill the disk");
        // writes that go past the reserve check to sled's disk, until sled's flush fails
        sled_fails(&url).await;
        free(fs.path()).expect("free the disk");
        let id = wait_for(
            "a put once the disk has room",
            Duration::from_secs(30),
            || {
                let url = url.clone();
                async move { put(&url, put_of(1, 1000)).await.ok() }
            },
        )
        .await;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            text.contains("starting again in place"),
            "the node started again to open its store:\n{text}"
        );
        assert!(
            node.child.try_wait().ok().flatten().is_none(),
            "the process ended:\n{text}"
        );
        let first = v1::ObjectId {
            node: first.node,
            seq: first.seq,
        };
        all_read_back(&url, &[(0, first), (1, id)], 1000).await;
        drop(node);
    });
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}
