//! Crash safety with a real process: `dissem up` is killed with SIGKILL in the middle of a
//! burst of concurrent puts. After a restart every acknowledged object is there with its
//! bytes, and no outbox record points at an object that is not.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::v1;
use proto::v1::ingest_client::IngestClient;
use proto::v1::objects_client::ObjectsClient;

/// Acknowledged puts: id and the bytes sent.
type Acked = Vec<(v1::ObjectId, Vec<u8>)>;

/// A started process, killed when dropped (also when a test fails midway).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(dir: &std::path::Path) -> (KillOnDrop, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dissem"))
        .args(["up", "--listen", "127.0.0.1:0", "--node", "5", "--data"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dissem up");
    let out = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .expect("first line");
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (KillOnDrop(child), format!("http://{addr}"))
}

async fn connect(url: &str) -> tonic::transport::Channel {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match tonic::transport::Channel::from_shared(url.to_string())
            .expect("uri")
            .connect()
            .await
        {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("no server at {url}: {e}"),
            Err(_) => tokio::task::yield_now().await,
        }
    }
}

fn payload(writer: usize, i: usize) -> Vec<u8> {
    format!("writer {writer} object {i} {}", "x".repeat(200)).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_burst_loses_no_acknowledged_object() {
    let dir = std::env::temp_dir().join(format!("dissem-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut child, url) = spawn(&dir);
    let ch = connect(&url).await;
    let acked: Arc<Mutex<Acked>> = Arc::new(Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for w in 0..16 {
        let mut client = IngestClient::new(ch.clone());
        let acked = Arc::clone(&acked);
        writers.push(tokio::spawn(async move {
            for i in 0..100_000 {
                let data = payload(w, i);
                let req = v1::PutRequest {
                    data: data.clone(),
                    metadata: vec![v1::Attribute {
                        name: "w".into(),
                        value: Some(v1::Value {
                            kind: Some(v1::value::Kind::Integer(w as i64)),
                        }),
                    }],
                    priority: 0,
                    message_id: String::new(),
                };
                match client.put(req).await {
                    Ok(r) => acked
                        .lock()
                        .expect("lock")
                        .push((r.into_inner().id.expect("id"), data)),
                    Err(_) => return, // the server died
                }
            }
        }));
    }
    // kill once a good number of puts were acknowledged, with writers still in flight
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.lock().expect("lock").len() < 1500 {
        assert!(Instant::now() < deadline, "puts too slow");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.0.kill().expect("SIGKILL");
    let _ = child.0.wait();
    for w in writers {
        let _ = w.await;
    }
    let acked = acked.lock().expect("lock").clone();
    assert!(acked.len() >= 1500);

    // restart on the same data: every acknowledged object is there
    let (mut child, url) = spawn(&dir);
    let ch = connect(&url).await;
    let mut objects = ObjectsClient::new(ch.clone());
    for (id, data) in &acked {
        let got = objects
            .get(v1::GetObjectRequest { id: Some(*id) })
            .await
            .unwrap_or_else(|e| panic!("acknowledged object {id:?} lost: {e}"))
            .into_inner();
        assert_eq!(&got.data, data);
    }
    // new ids never reuse old ones
    let max_seq = acked.iter().map(|a| a.0.seq).max().unwrap_or(0);
    let fresh = IngestClient::new(ch)
        .put(v1::PutRequest::default())
        .await
        .expect("put after restart")
        .into_inner();
    assert!(fresh.id.expect("id").seq > max_seq);
    child.0.kill().expect("kill");
    let _ = child.0.wait();

    // no outbox record without its object
    let store = storage::Store::open(&dir, 5).expect("open store");
    // (the restarted node replays and retires what it had; whatever is left must have its object)
    let pending = store.outbox_pending().expect("outbox");
    for (id, _) in pending {
        assert!(
            store.get(id).expect("get").is_some(),
            "outbox record {id:?} has no object"
        );
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
