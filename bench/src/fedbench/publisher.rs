//! The benchmarks' publishers: numbered objects put at a steady rate, each acknowledged
//! one recorded with when and where. `spawn` puts one at a time and fails over to the next
//! URL when a put fails (as a client with a failover address would); `spawn_stream` pipelines
//! the puts on one `PutStream` (shared flushes, the order kept), resending what was not
//! acknowledged when the stream breaks.

use std::collections::VecDeque;

use super::*;

/// What a publisher got acknowledged: (publisher, n) -> (when, which of its URLs).
type Acked = Arc<Mutex<BTreeMap<(String, i64), (Instant, usize)>>>;

/// A publisher putting numbered objects, one at a time, at a steady rate, to the first URL
/// of its list that answers (it moves on when a put fails, as a client with a failover
/// address would; `at` says where it puts now).
#[derive(Clone)]
pub(super) struct Publisher {
    name: String,
    urls: Vec<String>,
    at: Arc<AtomicUsize>,
    acked: Acked,
}

impl Publisher {
    pub(super) fn new(name: &str, urls: &[String]) -> Publisher {
        Publisher {
            name: name.into(),
            urls: urls.to_vec(),
            at: Arc::default(),
            acked: Arc::default(),
        }
    }

    /// Puts `ns` at `rate` per second; ends once each is acknowledged (a put fails over to
    /// the next URL and is tried again with the same message id).
    pub(super) fn spawn(&self, ns: std::ops::Range<i64>, rate: u32) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let gap = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
            for (i, n) in ns.enumerate() {
                tokio::time::sleep_until(start + gap * i as u32).await;
                loop {
                    let at = me.at.load(Ordering::SeqCst) % me.urls.len();
                    let mut c = v1::ingest_client::IngestClient::new(channel(&me.urls[at]));
                    match c.put(numbered_put(&me.name, n)).await {
                        Ok(_) => {
                            runtime::lock(&me.acked)
                                .insert((me.name.clone(), n), (Instant::now(), at));
                            break;
                        }
                        Err(_) => {
                            let _ = me.at.compare_exchange(
                                at,
                                (at + 1) % me.urls.len(),
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            );
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            }
        })
    }

    /// Puts `ns` at `rate` per second on one `PutStream` to the first URL, several in
    /// flight (their flushes shared), in order; ends once each is acknowledged. A broken
    /// stream is opened again and what it had not acknowledged is sent again (same message
    /// ids: stored once).
    pub(super) fn spawn_stream(
        &self,
        ns: std::ops::Range<i64>,
        rate: u32,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let gap = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
            let (first, end) = (ns.start, ns.end);
            let mut next = first;
            // sent on the stream, not acknowledged yet, in order
            let mut pending: VecDeque<i64> = VecDeque::new();
            while next < end || !pending.is_empty() {
                let url = me.urls[0].clone();
                let (tx, rx) = tokio::sync::mpsc::channel(4096);
                for n in &pending {
                    let _ = tx.send(numbered_put(&me.name, *n)).await;
                }
                let mut c = v1::ingest_client::IngestClient::new(channel(&url));
                let stream = c
                    .put_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await;
                let Ok(stream) = stream else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let mut answers = stream.into_inner();
                loop {
                    if next >= end && pending.is_empty() {
                        return;
                    }
                    let due = start + gap * (next - first) as u32;
                    tokio::select! {
                        _ = tokio::time::sleep_until(due), if next < end => {
                            if tx.send(numbered_put(&me.name, next)).await.is_err() {
                                break;
                            }
                            pending.push_back(next);
                            next += 1;
                        }
                        a = answers.message() => match a {
                            Ok(Some(v1::PutStreamResponse {
                                result: Some(v1::put_stream_response::Result::Ok(_)),
                            })) => {
                                if let Some(n) = pending.pop_front() {
                                    runtime::lock(&me.acked)
                                        .insert((me.name.clone(), n), (Instant::now(), 0));
                                }
                            }
                            // a rejection or a broken stream: open another, send again
                            _ => break,
                        },
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    }

    pub(super) fn acked(&self) -> BTreeMap<(String, i64), (Instant, usize)> {
        runtime::lock(&self.acked).clone()
    }
}
