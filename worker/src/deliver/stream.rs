//! Named streams: subscribers open a stream to the node (`Stream.Open`) and ack upstream;
//! deliveries to a stream go to one of its open sessions, and wait for one while none is
//! open (`backlog`).
//!
//! In a cluster a stream spans the nodes: a node with a subscriber of its own attaches to
//! the same stream on every other node (`Daemon.Relay`, `crate::daemon` keeps the relays), so
//! a delivery made on any node reaches the subscriber. A relay is a session like any other
//! where it attaches; what arrives through it goes only to the subscribers of the node that
//! opened it (never on through another relay), and their acks go back through it.

use super::*;

/// One attached stream subscriber.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) id: u64,
    pub(super) tx: mpsc::Sender<Result<v1::Delivery, Status>>,
    pub(super) acks: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
    /// Another node's relay (not a subscriber of this node).
    pub(super) relay: bool,
}

/// The longest stream key a relay may attach with (a tenant, a NUL, a stream name).
const MAX_RELAY_KEY: usize = 256;

/// The key of a tenant's named stream (the name itself without authentication).
pub fn stream_key(tenant: &str, name: &str) -> String {
    if tenant.is_empty() {
        name.to_string()
    } else {
        format!("{tenant}\u{0}{name}")
    }
}

impl Deliverer {
    /// One of the open sessions of stream `key` (spread by the arrival counter); `None`
    /// when nobody has it open.
    fn stream_session(&self, key: &str) -> Option<SessionEnds> {
        let streams = lock(&self.inner.streams);
        let sessions = streams.get(key).filter(|v| !v.is_empty())?;
        let i = (self.inner.seq.load(Ordering::Relaxed) as usize) % sessions.len();
        Some((sessions[i].tx.clone(), sessions[i].acks.clone()))
    }

    /// Pushes `d` to one of the stream's sessions and waits for its ack; `Detached` when
    /// nobody has the stream open (the delivery waits for a subscriber, see `backlog`).
    /// A call's stream deliveries go in [`Deliverer::stream_batch`]; this is one alone.
    pub(super) async fn to_stream(&self, name: &str, d: v1::Delivery) -> Result<Outcome, String> {
        let Some(session) = self.stream_session(name) else {
            return Ok(Outcome::Detached(name.to_string()));
        };
        send_awaiting_ack(session, d)
            .await
            .map_err(|e| format!("stream {name:?}: {e}"))?;
        Ok(Outcome::Done)
    }

    /// Pushes a batch of deliveries to stream `key` on one of its sessions, all sent before
    /// any ack is awaited, and settles each as its ack comes (or the attempt timeout
    /// passes): one task for the whole batch, where a call per delivery took a task each.
    pub(super) async fn stream_batch(&self, key: &str, ps: Vec<Prepared>) {
        let Some((tx, acks)) = self.stream_session(key) else {
            for p in ps {
                self.settle(p, Ok(Outcome::Detached(key.to_string()))).await;
            }
            return;
        };
        let deadline = tokio::time::Instant::now() + self.inner.cfg.attempt_timeout;
        let mut waiting = Vec::with_capacity(ps.len());
        {
            let mut a = lock(&acks);
            for p in &ps {
                let (ack_tx, ack_rx) = oneshot::channel();
                a.insert(p.delivery.delivery_id.clone(), ack_tx);
                waiting.push(ack_rx);
            }
        }
        let mut sent = Vec::with_capacity(ps.len());
        for (mut p, ack) in ps.into_iter().zip(waiting) {
            let d = std::mem::take(&mut p.delivery);
            p.delivery.delivery_id.clone_from(&d.delivery_id);
            let ok = tokio::time::timeout_at(deadline, tx.send(Ok(d)))
                .await
                .is_ok_and(|r| r.is_ok());
            sent.push((p, ok.then_some(ack)));
        }
        for (p, ack) in sent {
            let r = match ack {
                None => Err("closed".to_string()),
                Some(ack) => match tokio::time::timeout_at(deadline, ack).await {
                    Ok(Ok(())) => Ok(Outcome::Done),
                    Ok(Err(_)) => Err("closed before the ack".to_string()),
                    Err(_) => Err(self.no_answer()),
                },
            };
            if r.is_err() {
                lock(&acks).remove(&p.delivery.delivery_id);
            }
            let r = r.map_err(|e| format!("stream {key:?}: {e}"));
            self.settle(p, r).await;
        }
    }
}

/// A session's sender and its acks waiting.
type SessionEnds = (
    mpsc::Sender<Result<v1::Delivery, Status>>,
    Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
);

/// Sends `d` on a session and waits until its subscriber acks it.
async fn send_awaiting_ack((tx, acks): SessionEnds, d: v1::Delivery) -> Result<(), String> {
    let (ack_tx, ack_rx) = oneshot::channel();
    lock(&acks).insert(d.delivery_id.clone(), ack_tx);
    let id = d.delivery_id.clone();
    if tx.send(Ok(d)).await.is_err() {
        lock(&acks).remove(&id);
        return Err("closed".into());
    }
    ack_rx
        .await
        .map_err(|_| "closed before the ack".to_string())
}

#[tonic::async_trait]
impl v1::stream_server::Stream for Deliverer {
    type OpenStream = SessionStream;

    async fn open(
        &self,
        request: Request<Streaming<v1::StreamClientMessage>>,
    ) -> Result<Response<Self::OpenStream>, Status> {
        use tokio_stream::StreamExt;
        let caller = runtime::auth::caller(&request);
        let mut input = request.into_inner();
        let name = match input.next().await {
            Some(Ok(v1::StreamClientMessage {
                kind: Some(v1::stream_client_message::Kind::Attach(name)),
            })) => {
                runtime::validate::stream_name("attach", &name)?;
                // a tenant's streams are its own: the same name of another tenant is another
                // stream
                stream_key(caller.tenant(), &name)
            }
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(Status::invalid_argument(
                    "attach: the first message must name the stream to attach to",
                ));
            }
        };
        Ok(Response::new(self.attach_session(name, input, false)))
    }
}

impl Deliverer {
    /// Another node's relay of stream `key` (`Daemon.Relay`: the caller holds the cluster
    /// secret, and names the stream by its key).
    pub async fn relay_open(
        &self,
        mut input: Streaming<v1::StreamClientMessage>,
    ) -> Result<SessionStream, Status> {
        use tokio_stream::StreamExt;
        match input.next().await {
            Some(Ok(v1::StreamClientMessage {
                kind: Some(v1::stream_client_message::Kind::Attach(key)),
            })) if !key.is_empty() && key.len() <= MAX_RELAY_KEY => {
                Ok(self.attach_session(key, input, true))
            }
            Some(Err(e)) => Err(e),
            _ => Err(Status::invalid_argument(format!(
                "attach: the first message must carry a stream key of 1 to {MAX_RELAY_KEY} bytes"
            ))),
        }
    }

    /// The streams this node's own subscribers have open (the ones to relay from the others).
    pub fn local_streams(&self) -> Vec<String> {
        lock(&self.inner.streams)
            .iter()
            .filter(|(_, v)| v.iter().any(|s| !s.relay))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Hands a delivery that came through a relay to one of this node's own subscribers of
    /// `key` and waits for its ack (`Err`: none attached, or it went away first).
    pub async fn deliver_relayed(&self, key: &str, d: v1::Delivery) -> Result<(), String> {
        let session = {
            let streams = lock(&self.inner.streams);
            let own: Vec<&Session> = streams
                .get(key)
                .map(|v| v.iter().filter(|s| !s.relay).collect())
                .unwrap_or_default();
            if own.is_empty() {
                return Err(format!("no subscriber of stream {key:?} on this node"));
            }
            let i = (self.inner.seq.fetch_add(1, Ordering::Relaxed) as usize) % own.len();
            (own[i].tx.clone(), own[i].acks.clone())
        };
        send_awaiting_ack(session, d)
            .await
            .map_err(|e| format!("the subscriber's session: {e}"))
    }

    /// Registers a session of stream `name` (a subscriber, or another node's relay) fed by
    /// `input`'s acks; the deliveries go out on the returned stream.
    fn attach_session(
        &self,
        name: String,
        mut input: Streaming<v1::StreamClientMessage>,
        relay: bool,
    ) -> SessionStream {
        use tokio_stream::StreamExt;
        let (tx, rx) = mpsc::channel(256);
        let acks: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>> = Arc::default();
        let id = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.streams)
            .entry(name.clone())
            .or_default()
            .push(Session {
                id,
                tx,
                acks: acks.clone(),
                relay,
            });
        tracing::info!(
            "stream {name:?} attached{}",
            if relay { " (a relay)" } else { "" }
        );
        self.attached(&name);
        let me = self.clone();
        let mut closing = self.inner.closing.subscribe();
        tokio::spawn(async move {
            loop {
                // a stopping node stops reading acks too: the subscriber's half of the call
                // stays open while it has not ended it, and the server waited for it (a
                // stop that took the whole grace)
                let m = tokio::select! {
                    m = input.next() => m,
                    _ = closing.wait_for(|c| *c) => None,
                };
                let Some(Ok(m)) = m else { break };
                if let Some(v1::stream_client_message::Kind::Ack(d)) = m.kind
                    && let Some(t) = lock(&acks).remove(&d)
                {
                    let _ = t.send(());
                }
            }
            let mut streams = lock(&me.inner.streams);
            if let Some(v) = streams.get_mut(&name) {
                v.retain(|s| s.id != id);
            }
            tracing::info!("stream {name:?} detached");
        });
        self.until_stopped(rx)
    }
}

/// The deliveries of one stream session.
pub type SessionStream = runtime::link::DeliveryStream;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subscription is a QoS 1 subscription of stream "s".
    struct StreamS;

    #[tonic::async_trait]
    impl SubscriptionSource for StreamS {
        async fn subscription(&self, id: u64) -> Result<Option<v1::Subscription>, Status> {
            Ok(Some(v1::Subscription {
                id,
                target: Some(v1::Target {
                    kind: Some(v1::target::Kind::Stream("s".into())),
                }),
                qos: v1::Qos::AtLeastOnce as i32,
                ..v1::Subscription::default()
            }))
        }
    }

    /// A batch goes out on the session before any ack is awaited; an ack that never comes
    /// fails that delivery alone at the attempt timeout (its record written then, as a fresh
    /// QoS 1 delivery's is at its first failure), the retry delivers it again, and the
    /// others settle with no record.
    #[tokio::test]
    async fn a_stream_batch_settles_each_delivery_by_its_own_ack() {
        let dir = std::env::temp_dir().join(format!(
            "dissem-stream-batch-{}-{}",
            std::process::id(),
            runtime::random_u64()
        ));
        let store = storage::Store::open(&dir, 1).expect("store");
        let cfg = DeliveryConfig {
            attempt_timeout: Duration::from_secs(2),
            ..DeliveryConfig::default()
        };
        let d = Deliverer::new(cfg, store.clone(), Arc::new(StreamS), Lanes::new(false))
            .expect("deliverer");
        let objs: Vec<ObjectId> = store
            .put_batch(
                (0..3)
                    .map(|i| storage::NewObject {
                        data: vec![i],
                        external_id: String::new(),
                        metadata: Vec::new(),
                        priority: 0,
                        message_id: String::new(),
                    })
                    .collect(),
            )
            .await
            .expect("put")
            .into_iter()
            .map(|o| o.expect("stored").id)
            .collect();
        let (tx, mut rx) = mpsc::channel(16);
        let acks: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>> = Arc::default();
        lock(&d.inner.streams).insert(
            "s".into(),
            vec![Session {
                id: 1,
                tx,
                acks: acks.clone(),
                relay: false,
            }],
        );
        // the subscriber: acks everything but the first attempt of the second object
        let silent = delivery_id(7, objs[1]);
        let shown = Arc::new(Mutex::new(Vec::new()));
        let subscriber = {
            let shown = shown.clone();
            tokio::spawn(async move {
                while let Some(Ok(got)) = rx.recv().await {
                    lock(&shown).push((got.delivery_id.clone(), got.attempt));
                    if got.delivery_id == silent && got.attempt == 1 {
                        continue;
                    }
                    if let Some(t) = lock(&acks).remove(&got.delivery_id) {
                        let _ = t.send(());
                    }
                }
            })
        };
        tokio::time::pause();
        let jobs = objs
            .iter()
            .enumerate()
            .map(|(i, o)| Job {
                priority: 0,
                seq: i as u64,
                sub: 7,
                obj: *o,
                fresh: true,
                in_memory: true,
            })
            .collect();
        d.attempt(jobs).await;
        {
            let shown = lock(&shown);
            let first: Vec<_> = shown.iter().take(3).map(|(id, _)| id.clone()).collect();
            let want: Vec<_> = objs.iter().map(|o| delivery_id(7, *o)).collect();
            assert_eq!(first, want, "the whole batch went out in order");
        }
        assert_eq!(d.counters().acked.load(Ordering::Relaxed), 2);
        assert_eq!(d.counters().failures.load(Ordering::Relaxed), 1);
        assert_eq!(store.delivery(7, objs[0]).expect("read"), None, "no record");
        assert!(
            matches!(
                store.delivery(7, objs[1]).expect("read"),
                Some(DeliveryState::Pending { attempts: 1, .. })
            ),
            "the failed one has its record"
        );
        // the retry (on paused time: at once) delivers it again, and it is acknowledged
        for _ in 0..10_000 {
            if d.counters().acked.load(Ordering::Relaxed) == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(d.counters().acked.load(Ordering::Relaxed), 3);
        assert!(lock(&shown).contains(&(delivery_id(7, objs[1]), 2)));
        assert!(matches!(
            store.delivery(7, objs[1]).expect("read"),
            Some(DeliveryState::Acked { .. })
        ));
        assert!(!d.is_open(objs[1]), "its record is closed");
        subscriber.abort();
        drop(d);
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }
}
