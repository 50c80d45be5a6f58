//! The real-process gRPC subscriber of `dissem bench chaos`: a `dissem receive` process with
//! a QoS 1 and a QoS 2 subscription of every object, SIGKILLed when the subscribers crash and
//! started again on the same port and journal when the crash is over. The oracle reads the
//! journal (its `shown` lines), the receiver's output that survives its kills, so a loss or
//! a QoS 2 delivery shown twice is the cluster's or the receiver's, never the benchmark's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

use proto::v1;
use storage::ObjectId;

use crate::demo::{self, Shared};
use crate::failoverbench::Numbers;
use crate::procs::{Proc, create_grpc_subscription, free_port};

/// The receiver process, its subscriptions and what its journal shows.
pub(super) struct Receiver {
    /// (subscription, first object number put after it was created), QoS 1 and QoS 2.
    q1: (u64, usize),
    q2: (u64, usize),
    numbers: Numbers,
    seen: Shared,
    /// The process (`None` while crashed).
    proc: Arc<Mutex<Option<Proc>>>,
    args: Vec<String>,
    bin: PathBuf,
    /// Where it listens, every run.
    at: SocketAddr,
    /// Reads the journal's new lines into `seen`.
    tail: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Subscribes a free loopback port, through the node at `via`, to every object (QoS 1
    /// and QoS 2), and starts `dissem receive` on it with its journal in `dir`.
    pub(super) async fn start(
        bin: &Path,
        via: &str,
        numbers: Numbers,
        dir: &Path,
    ) -> anyhow::Result<Receiver> {
        let at = free_port();
        let target = format!("http://{at}");
        let sub = |qos| create_grpc_subscription(via, "n >= 0".into(), &target, qos, None);
        let q2 = sub(v1::Qos::ExactlyOnce)
            .await
            .context("creating the receiver's QoS 2 subscription")?;
        let q1 = sub(v1::Qos::AtLeastOnce)
            .await
            .context("creating the receiver's QoS 1 subscription")?;
        let from = numbers.next.load(Ordering::SeqCst);
        let journal = dir.join("receiver.journal");
        let args: Vec<String> = [
            "receive".to_string(),
            "--listen".into(),
            at.to_string(),
            "--journal".into(),
            journal.display().to_string(),
            "--exactly-once".into(),
            q2.to_string(),
        ]
        .to_vec();
        let proc = spawn(bin.to_path_buf(), args.clone(), at).await?;
        let seen = Shared::default();
        let tail = tokio::spawn(tail(journal, seen.clone()));
        Ok(Receiver {
            q1: (q1, from),
            q2: (q2, from),
            numbers,
            seen,
            proc: Arc::new(Mutex::new(Some(proc))),
            args,
            bin: bin.to_path_buf(),
            at,
            tail,
        })
    }

    /// Crashes the receiver (SIGKILL) or starts it again on the same port and journal.
    pub(super) async fn set_down(&self, down: bool) -> anyhow::Result<()> {
        let was = demo::lock(&self.proc).take();
        if down {
            if let Some(mut p) = was {
                tokio::task::spawn_blocking(move || p.kill()).await?;
            }
            return Ok(());
        }
        let p = match was {
            Some(p) => p,
            None => spawn(self.bin.clone(), self.args.clone(), self.at).await?,
        };
        *demo::lock(&self.proc) = Some(p);
        Ok(())
    }

    /// Which of `objects` the receiver's journal does not show to both subscriptions within
    /// `limit`.
    pub(super) async fn missing(&self, objects: &[ObjectId], limit: Duration) -> Vec<ObjectId> {
        // one wait for both: the second gets what the first left of it
        let started = std::time::Instant::now();
        let mut out =
            super::endpoints::unseen(&self.seen, self.q2, &self.numbers, objects, limit).await;
        let rest = limit.saturating_sub(started.elapsed());
        out.extend(
            super::endpoints::unseen(&self.seen, self.q1, &self.numbers, objects, rest).await,
        );
        out.sort_unstable();
        out.dedup();
        out
    }

    /// QoS 2 deliveries shown more than once, and QoS 1 ones shown again.
    pub(super) fn repeats(&self) -> (u64, u64) {
        let seen = demo::lock(&self.seen);
        let extra = |sub: u64| -> u64 {
            seen.pairs
                .iter()
                .filter(|((s, _), _)| *s == sub)
                .map(|(_, (n, _))| u64::from(n.saturating_sub(1)))
                .sum()
        };
        (extra(self.q2.0), extra(self.q1.0))
    }

    /// The QoS 2 (subscription, object) pairs shown more than once.
    pub(super) fn duplicated(&self) -> Vec<(u64, ObjectId)> {
        demo::lock(&self.seen)
            .pairs
            .iter()
            .filter(|((s, _), (n, _))| *s == self.q2.0 && *n > 1)
            .map(|(pair, _)| *pair)
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.tail.abort();
        // the process is killed when its `Proc` goes
    }
}

/// `dissem receive` with `args` (listening on `addr`), once it says where it listens.
async fn spawn(bin: PathBuf, args: Vec<String>, addr: SocketAddr) -> anyhow::Result<Proc> {
    tokio::task::spawn_blocking(move || {
        // the port of a receiver killed a moment ago may linger
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpListener::bind(addr).is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        Proc::start(&bin, &args)
    })
    .await
    .context("starting `dissem receive`")
}

/// Reads the journal's complete lines as they are appended, counting each `shown` one in
/// `seen` (a torn last line is left until it is whole, or cut by the receiver's restart).
async fn tail(journal: PathBuf, seen: Shared) {
    use std::io::{Read, Seek};
    let mut offset = 0u64;
    loop {
        let mut chunk = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&journal)
            && f.seek(std::io::SeekFrom::Start(offset)).is_ok()
        {
            let _ = f.read_to_end(&mut chunk);
        }
        let whole = chunk.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if whole > 0 {
            let now = std::time::Instant::now();
            let text = String::from_utf8_lossy(&chunk[..whole]);
            let mut s = demo::lock(&seen);
            for (event, v) in text.lines().filter_map(worker::receiver::journal_line) {
                if event != "shown" {
                    continue;
                }
                if let Some(key) = super::endpoints::pair_of(&v) {
                    s.pairs.entry(key).or_insert((0, now)).0 += 1;
                }
            }
            offset += whole as u64;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
