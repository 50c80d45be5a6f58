//! `dissem receive`: a gRPC push subscriber that keeps what it is given in a journal on its
//! disk before it acknowledges it, so that a receiver killed at any moment (SIGKILL, power)
//! loses no delivery and, for exactly-once subscriptions, shows none twice. It is what a
//! user's QoS 2 endpoint must do, written once: the reference for client authors, and the
//! real-process subscriber of `dissem bench chaos`.
//!
//! The journal is the receiver's output: one JSON line per event, appended and fsynced before
//! the call is answered. A `shown` line is a delivery handed to the application (the same
//! fields `dissem sub` prints). For the subscriptions named exactly-once, a first-phase
//! `Deliver` appends a `received` line and holds the delivery; `Release` appends its `shown`
//! line and forgets it. A repeated first phase of a held delivery is answered without a
//! line, and a release of one not held (released before, the answer lost) too. At start the
//! journal is read back: a torn last line (killed mid-write, never acknowledged) is cut off,
//! and what was received and not released is held again. Subscriptions not named are shown
//! at once (QoS 0/1: a retry is a repeat, as at-least-once allows).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use proto::v1;
use tonic::{Request, Response, Status};

/// Most deliveries held between their two phases; past it a first phase is refused
/// (RESOURCE_EXHAUSTED) and retried by its node, so a node that never releases cannot fill
/// this process's memory.
pub const MAX_HELD: usize = 100_000;

/// What went wrong with the journal.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error("the journal {path}: {source}")]
    Journal {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{held} deliveries are held awaiting their release (at most {MAX_HELD})")]
    Full { held: usize },
}

impl From<ReceiveError> for Status {
    fn from(e: ReceiveError) -> Status {
        match e {
            // the node retries: the delivery is not taken
            ReceiveError::Journal { .. } => Status::unavailable(e.to_string()),
            ReceiveError::Full { .. } => Status::resource_exhausted(e.to_string()),
        }
    }
}

/// The journal file and what it says is held.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: std::fs::File,
    /// Exactly-once subscriptions' deliveries received and not released: delivery id ->
    /// the line to show at release (without its `event`).
    held: HashMap<String, serde_json::Map<String, serde_json::Value>>,
    exactly_once: HashSet<u64>,
    /// The file's length: where the next line goes (a failed append is cut back to it).
    len: u64,
    /// Lines appended since the last fsync.
    unsynced: bool,
}

/// What opening a journal found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Opened {
    /// Complete lines read back.
    pub lines: usize,
    /// Bytes of a torn last line cut off.
    pub torn_bytes: u64,
    /// Line numbers (1-based) that were not journal lines, skipped.
    pub unreadable: Vec<usize>,
    /// Deliveries held again (received, not released).
    pub held: usize,
}

impl Journal {
    /// Opens (or creates) the journal at `path`, reading back what is held.
    pub fn open(path: &Path, exactly_once: &[u64]) -> Result<(Journal, Opened), ReceiveError> {
        let err = |source| ReceiveError::Journal {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(err)?;
        let mut opened = Opened::default();
        let mut held = HashMap::new();
        let mut good = 0u64;
        {
            let mut r = std::io::BufReader::new(&mut file);
            let mut line = Vec::new();
            loop {
                line.clear();
                let n = r.read_until(b'\n', &mut line).map_err(err)?;
                if n == 0 {
                    break;
                }
                if line.last() != Some(&b'\n') {
                    opened.torn_bytes = n as u64;
                    break;
                }
                good += n as u64;
                opened.lines += 1;
                match parse(&line) {
                    Some((Event::Received, id, m)) => {
                        held.insert(id, m);
                    }
                    Some((Event::Shown, id, _)) => {
                        held.remove(&id);
                    }
                    None => opened.unreadable.push(opened.lines),
                }
            }
        }
        if opened.torn_bytes > 0 {
            // killed mid-append: that call was never answered, so its node sends it again
            file.set_len(good).map_err(err)?;
            file.sync_data().map_err(err)?;
        }
        opened.held = held.len();
        Ok((
            Journal {
                path: path.to_path_buf(),
                file,
                held,
                exactly_once: exactly_once.iter().copied().collect(),
                len: good,
                unsynced: false,
            },
            opened,
        ))
    }

    /// Appends one line; the answer, for a `shown` one, is the line the application is
    /// shown (without its `event`).
    fn append(
        &mut self,
        event: Event,
        mut m: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Option<String>, ReceiveError> {
        let shown = (event == Event::Shown)
            .then(|| serde_json::to_string(&m))
            .transpose()
            .map_err(|e| self.failed(std::io::Error::other(e)))?;
        m.insert("event".into(), event.name().into());
        m.insert(JOURNALED.into(), runtime::now_ms().into());
        let mut line = serde_json::Value::Object(m).to_string();
        line.push('\n');
        self.unsynced = true;
        if let Err(e) = self.file.write_all(line.as_bytes()) {
            // a part of the line may be there (a full disk): cut it, or the next line would
            // join it; the call is refused, and its node sends it again
            let _ = self.file.set_len(self.len);
            return Err(self.failed(e));
        }
        self.len += line.len() as u64;
        Ok(shown)
    }

    fn failed(&self, source: std::io::Error) -> ReceiveError {
        ReceiveError::Journal {
            path: self.path.clone(),
            source,
        }
    }

    /// Makes every appended line durable.
    pub fn sync(&mut self) -> Result<(), ReceiveError> {
        if self.unsynced {
            self.file.sync_data().map_err(|e| self.failed(e))?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Takes one delivery (first phase for exactly-once subscriptions); the answer is the
    /// line shown now, if any. Durable only after [`Journal::sync`].
    pub fn deliver(&mut self, d: &v1::Delivery) -> Result<Option<String>, ReceiveError> {
        let m = crate::subscriber::delivery_map(d);
        if !self.exactly_once.contains(&d.subscription_id) {
            return self.append(Event::Shown, m);
        }
        if self.held.contains_key(&d.delivery_id) {
            return Ok(None); // a repeated first phase
        }
        if self.held.len() >= MAX_HELD {
            return Err(ReceiveError::Full {
                held: self.held.len(),
            });
        }
        self.append(Event::Received, m.clone())?;
        self.held.insert(d.delivery_id.clone(), m);
        Ok(None)
    }

    /// The second phase: the line shown now, or none if `delivery_id` is not held.
    pub fn release(&mut self, delivery_id: &str) -> Result<Option<String>, ReceiveError> {
        let Some(m) = self.held.remove(delivery_id) else {
            return Ok(None);
        };
        match self.append(Event::Shown, m.clone()) {
            Ok(line) => Ok(line),
            Err(e) => {
                self.held.insert(delivery_id.to_string(), m);
                Err(e)
            }
        }
    }

    /// Deliveries held between their phases.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Received,
    Shown,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Received => "received",
            Event::Shown => "shown",
        }
    }
}

/// A journal line's field: when it was appended (Unix ms), to read a journal's order of
/// events against the nodes' logs. Not part of what the application is shown.
const JOURNALED: &str = "journaled_unix_ms";

/// One journal line: its event, delivery id and the rest of its fields.
fn parse(line: &[u8]) -> Option<(Event, String, serde_json::Map<String, serde_json::Value>)> {
    let serde_json::Value::Object(mut m) = serde_json::from_slice(line).ok()? else {
        return None;
    };
    let event = match m.remove("event")?.as_str()? {
        "received" => Event::Received,
        "shown" => Event::Shown,
        _ => return None,
    };
    m.remove(JOURNALED);
    let id = m.get("delivery_id")?.as_str()?.to_string();
    Some((event, id, m))
}

/// A journal line as the application reads it: `Some((event, fields))` for a journal line
/// (`shown` or `received`), the fields those `dissem sub` prints.
pub fn journal_line(line: &str) -> Option<(&'static str, serde_json::Value)> {
    let (e, _, m) = parse(line.as_bytes())?;
    Some((e.name(), serde_json::Value::Object(m)))
}

/// The `Subscriber` service over a journal; `shown` gets each line shown (after it is
/// durable).
#[derive(Clone)]
pub struct Receiver {
    journal: Arc<Mutex<Journal>>,
    shown: Arc<dyn Fn(&str) + Send + Sync>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

impl Receiver {
    pub fn new(journal: Journal, shown: impl Fn(&str) + Send + Sync + 'static) -> Receiver {
        Receiver {
            journal: Arc::new(Mutex::new(journal)),
            shown: Arc::new(shown),
        }
    }

    /// Runs `f` on the journal off the async threads, then fsyncs, then tells each line
    /// shown.
    async fn with_journal<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Journal) -> (T, Vec<String>) + Send + 'static,
    ) -> Result<T, Status> {
        let journal = self.journal.clone();
        let (out, lines) = tokio::task::spawn_blocking(move || {
            let mut j = runtime::lock(&journal);
            let (out, lines) = f(&mut j);
            j.sync().map(|()| (out, lines))
        })
        .await
        .map_err(|e| Status::internal(format!("the journal's writer: {e}")))??;
        for l in &lines {
            (self.shown)(l);
        }
        Ok(out)
    }
}

/// One call's outcome for [`Receiver::with_journal`]: its result and the line it showed.
fn one(r: Result<Option<String>, ReceiveError>) -> (Result<(), ReceiveError>, Vec<String>) {
    match r {
        Ok(l) => (Ok(()), l.into_iter().collect()),
        Err(e) => (Err(e), Vec::new()),
    }
}

#[tonic::async_trait]
impl v1::subscriber_server::Subscriber for Receiver {
    async fn deliver(
        &self,
        request: Request<v1::Delivery>,
    ) -> Result<Response<v1::DeliverAck>, Status> {
        let d = request.into_inner();
        self.with_journal(move |j| one(j.deliver(&d))).await??;
        Ok(Response::new(v1::DeliverAck {}))
    }

    async fn deliver_batch(
        &self,
        request: Request<v1::DeliveryBatch>,
    ) -> Result<Response<v1::DeliverBatchAck>, Status> {
        let ds = request.into_inner().deliveries;
        let rejected = self
            .with_journal(move |j| {
                let mut rejected = Vec::new();
                let mut lines = Vec::new();
                for (i, d) in ds.iter().enumerate() {
                    match j.deliver(d) {
                        Ok(l) => lines.extend(l),
                        Err(e) => rejected.push(v1::Rejected {
                            index: i as u32,
                            reason: e.to_string(),
                        }),
                    }
                }
                (rejected, lines)
            })
            .await?;
        Ok(Response::new(v1::DeliverBatchAck { rejected }))
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseAck>, Status> {
        let id = request.into_inner().delivery_id;
        self.with_journal(move |j| one(j.release(&id))).await??;
        Ok(Response::new(v1::ReleaseAck {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(id: &str, sub: u64, seq: u64) -> v1::Delivery {
        v1::Delivery {
            delivery_id: id.into(),
            subscription_id: sub,
            object_id: Some(v1::ObjectId { node: 1, seq }),
            ..v1::Delivery::default()
        }
    }

    fn shown_lines(path: &Path) -> Vec<(u64, String)> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(journal_line)
            .filter(|(e, _)| *e == "shown")
            .map(|(_, v)| {
                (
                    v["subscription"].as_u64().unwrap_or(0),
                    v["delivery_id"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn an_exactly_once_delivery_is_shown_once_across_restarts_and_repeats() {
        let dir = std::env::temp_dir().join(format!("dissem-receiver-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("journal");
        let (mut j, o) = Journal::open(&path, &[2]).expect("open");
        assert_eq!(o, Opened::default());
        // QoS 1 (subscription 1): shown at once, a retry shown again
        assert!(
            j.deliver(&delivery("1-a", 1, 1))
                .expect("deliver")
                .is_some()
        );
        assert!(
            j.deliver(&delivery("1-a", 1, 1))
                .expect("deliver")
                .is_some()
        );
        // QoS 2 (subscription 2): held, a repeated first phase adds nothing
        assert_eq!(j.deliver(&delivery("2-a", 2, 1)).expect("deliver"), None);
        assert_eq!(j.deliver(&delivery("2-a", 2, 1)).expect("deliver"), None);
        assert_eq!(j.deliver(&delivery("2-b", 2, 2)).expect("deliver"), None);
        assert!(j.release("2-a").expect("release").is_some());
        assert_eq!(j.release("2-a").expect("release"), None);
        j.sync().expect("sync");
        drop(j);
        // killed mid-append: a torn line at the end
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("reopen");
        f.write_all(br#"{"event":"shown","delivery_id":"2-"#)
            .expect("torn");
        drop(f);
        let (mut j, o) = Journal::open(&path, &[2]).expect("open again");
        assert_eq!(o.held, 1, "2-b is held again: {o:?}");
        assert!(o.torn_bytes > 0, "the torn line is cut: {o:?}");
        assert!(o.unreadable.is_empty(), "{o:?}");
        assert_eq!(j.held(), 1);
        // the node, not answered, repeats the first phase of the held one, then releases
        assert_eq!(j.deliver(&delivery("2-b", 2, 2)).expect("deliver"), None);
        assert!(j.release("2-b").expect("release").is_some());
        j.sync().expect("sync");
        drop(j);
        let shown = shown_lines(&path);
        assert_eq!(
            shown,
            vec![
                (1, "1-a".to_string()),
                (1, "1-a".to_string()),
                (2, "2-a".to_string()),
                (2, "2-b".to_string())
            ]
        );
        let (j, o) = Journal::open(&path, &[2]).expect("open a third time");
        assert_eq!((j.held(), o.torn_bytes), (0, 0));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_receiver_holding_its_limit_refuses_more_first_phases() {
        let dir = std::env::temp_dir().join(format!("dissem-receiver-full-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let (mut j, _) = Journal::open(&dir.join("journal"), &[2]).expect("open");
        for i in 0..MAX_HELD as u64 {
            j.held.insert(format!("h{i}"), serde_json::Map::new());
        }
        let e = j.deliver(&delivery("2-x", 2, 1)).expect_err("full");
        assert_eq!(Status::from(e).code(), tonic::Code::ResourceExhausted);
        // a release still works, and makes room
        assert!(j.release("h0").expect("release").is_some());
        assert_eq!(j.deliver(&delivery("2-x", 2, 1)).expect("deliver"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
