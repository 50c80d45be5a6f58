//! A recording gRPC subscriber for the replication tests and benchmarks: it serves
//! `Subscriber` on loopback and counts, per (subscription, object), how often the
//! application was shown the delivery. QoS 0/1 are shown on `Deliver`/`DeliverBatch`; QoS 2
//! follows the two-phase handshake as a receiver without memory beyond it would: `Deliver`
//! holds the delivery as "received" (by delivery id), `Release` shows it and forgets the id.
//! So a node that delivers a QoS 2 delivery again after its release shows a duplicate here,
//! which is what the benchmarks count.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use proto::v1;
use storage::ObjectId;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One QoS 2 call at the subscriber: when, what, and the caller's port.
pub type Call = (Instant, &'static str, u16);

#[derive(Debug, Default)]
struct State {
    /// (subscription, object) -> times shown.
    shown: BTreeMap<(u64, ObjectId), u32>,
    /// When each pair was first shown.
    first: HashMap<(u64, ObjectId), Instant>,
    /// QoS 2: received, not yet released (delivery id -> pair).
    received: HashMap<String, (u64, ObjectId)>,
    /// QoS 2: every call of each pair (when, what, the caller's port), to explain duplicates.
    calls: HashMap<(u64, ObjectId), Vec<Call>>,
    /// Deliveries of numbered objects (`pub` and `n` attributes), as shown.
    numbered: BTreeMap<(String, i64), Seen>,
    /// QoS 2: the numbered object of each delivery received, not yet released.
    received_numbered: HashMap<String, (String, i64)>,
}

/// A numbered object as the subscriber was shown it.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// How often.
    pub times: u32,
    /// When first, and the object id that delivery carried (the cluster's own id).
    pub first: Instant,
    pub id: ObjectId,
}

/// The recording subscriber (cheap to clone; every clone shares the record).
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    state: Arc<Mutex<State>>,
    /// Subscriptions delivered with QoS 2 (shown on release).
    qos2: Arc<Mutex<std::collections::HashSet<u64>>>,
    /// How long each call takes (a slow subscriber keeps deliveries in flight).
    delay: Arc<Mutex<std::time::Duration>>,
    /// While set, every call is answered UNAVAILABLE (deliveries wait in their retries).
    refusing: Arc<std::sync::atomic::AtomicBool>,
}

fn port_of<T>(r: &Request<T>) -> u16 {
    r.remote_addr().map_or(0, |a| a.port())
}

fn pair(d: &v1::Delivery) -> (u64, ObjectId) {
    let o = d.object_id.unwrap_or_default();
    (
        d.subscription_id,
        ObjectId {
            node: o.node,
            seq: o.seq,
        },
    )
}

/// A numbered object's (publisher, n): its `pub` text and `n` integer attributes.
pub fn numbered_key(d: &v1::Delivery) -> Option<(String, i64)> {
    let mut p = None;
    let mut n = None;
    for a in &d.metadata {
        match a.value.as_ref().and_then(|v| v.kind.as_ref()) {
            Some(v1::value::Kind::Text(t)) if a.name == "pub" => p = Some(t.clone()),
            Some(v1::value::Kind::Integer(i)) if a.name == "n" => n = Some(*i),
            Some(v1::value::Kind::Decimal(s)) if a.name == "n" => n = s.parse().ok(),
            _ => {}
        }
    }
    Some((p?, n?))
}

impl Recorder {
    /// Serves a new recorder on a free loopback port; the answer is its URL.
    pub async fn start() -> std::io::Result<(Recorder, String)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let r = Recorder::default();
        let svc = v1::subscriber_server::SubscriberServer::new(r.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Ok((r, url))
    }

    /// Makes every call take `d` (before it is taken).
    pub fn set_delay(&self, d: std::time::Duration) {
        *lock(&self.delay) = d;
    }

    /// Refuses every call (UNAVAILABLE) while `on`: deliveries stay owed, retried later.
    pub fn set_refusing(&self, on: bool) {
        self.refusing.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    async fn pause(&self) -> Result<(), Status> {
        let d = *lock(&self.delay);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
        if self.refusing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Status::unavailable(
                "the subscriber refuses deliveries for now",
            ));
        }
        Ok(())
    }

    /// Says that `sub` is a QoS 2 subscription (its deliveries are shown on release).
    pub fn expect_qos2(&self, sub: u64) {
        lock(&self.qos2).insert(sub);
    }

    fn show(&self, p: (u64, ObjectId)) {
        let mut s = lock(&self.state);
        *s.shown.entry(p).or_insert(0) += 1;
        s.first.entry(p).or_insert_with(Instant::now);
    }

    fn take(&self, d: &v1::Delivery, port: u16) {
        let p = pair(d);
        if lock(&self.qos2).contains(&p.0) {
            let mut s = lock(&self.state);
            if let Some(k) = numbered_key(d) {
                s.received_numbered.insert(d.delivery_id.clone(), k);
            }
            let held = s.received.contains_key(&d.delivery_id);
            s.received.entry(d.delivery_id.clone()).or_insert(p);
            let what = if held { "deliver (held)" } else { "deliver" };
            s.calls
                .entry(p)
                .or_default()
                .push((Instant::now(), what, port));
        } else {
            self.show(p);
            if let Some(k) = numbered_key(d) {
                Self::seen(&mut lock(&self.state), k, p.1);
            }
        }
    }

    fn seen(s: &mut State, k: (String, i64), id: ObjectId) {
        s.numbered
            .entry(k)
            .or_insert(Seen {
                times: 0,
                first: Instant::now(),
                id,
            })
            .times += 1;
    }

    /// The numbered objects shown: (publisher, n) -> how often, when first, with which id.
    pub fn numbered(&self) -> BTreeMap<(String, i64), Seen> {
        lock(&self.state).numbered.clone()
    }

    /// The QoS 2 calls of `pair`: when, what and from which port.
    pub fn calls(&self, pair: (u64, ObjectId)) -> Vec<Call> {
        lock(&self.state)
            .calls
            .get(&pair)
            .cloned()
            .unwrap_or_default()
    }

    /// Every pair shown, with how often.
    pub fn shown(&self) -> BTreeMap<(u64, ObjectId), u32> {
        lock(&self.state).shown.clone()
    }

    /// Pairs shown at least once.
    pub fn distinct(&self) -> usize {
        lock(&self.state).shown.len()
    }

    /// When `pair` was first shown.
    pub fn first_shown(&self, pair: (u64, ObjectId)) -> Option<Instant> {
        lock(&self.state).first.get(&pair).copied()
    }

    /// Shows beyond the first, for the subscriptions `subs` says (QoS 2 ones: duplicates;
    /// QoS 1 ones: repeats).
    pub fn extra_shows(&self, subs: impl Fn(u64) -> bool) -> u64 {
        lock(&self.state)
            .shown
            .iter()
            .filter(|((s, _), _)| subs(*s))
            .map(|(_, &n)| u64::from(n.saturating_sub(1)))
            .sum()
    }
}

#[tonic::async_trait]
impl v1::subscriber_server::Subscriber for Recorder {
    async fn deliver(
        &self,
        request: Request<v1::Delivery>,
    ) -> Result<Response<v1::DeliverAck>, Status> {
        self.pause().await?;
        let port = port_of(&request);
        self.take(&request.into_inner(), port);
        Ok(Response::new(v1::DeliverAck {}))
    }

    async fn deliver_batch(
        &self,
        request: Request<v1::DeliveryBatch>,
    ) -> Result<Response<v1::DeliverBatchAck>, Status> {
        self.pause().await?;
        let port = port_of(&request);
        for d in &request.into_inner().deliveries {
            self.take(d, port);
        }
        Ok(Response::new(v1::DeliverBatchAck { rejected: vec![] }))
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseAck>, Status> {
        self.pause().await?;
        let port = port_of(&request);
        let id = request.into_inner().delivery_id;
        let p = {
            let mut s = lock(&self.state);
            let p = s.received.remove(&id);
            if let (Some(p), Some(k)) = (p, s.received_numbered.remove(&id)) {
                Self::seen(&mut s, k, p.1);
            }
            if let Some(p) = p {
                s.calls
                    .entry(p)
                    .or_default()
                    .push((Instant::now(), "release (shown)", port));
            }
            p
        };
        if let Some(p) = p {
            self.show(p);
        }
        Ok(Response::new(v1::ReleaseAck {}))
    }
}
