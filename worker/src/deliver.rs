//! Delivery (DESIGN §6): pushes each matched (subscription, object) to the subscription's
//! target with its QoS, from the node that took the write, where the delivery records live.
//!
//! Targets: gRPC push (`Subscriber.Deliver`, plus `Release` for QoS 2), HTTP webhooks
//! (CloudEvents 1.0 structured JSON, HMAC-SHA256 signed with the subscription's secret and a
//! timestamp), and named streams subscribers open to the node (`Stream.Open`, acks
//! upstream). Deliveries that queue for one endpoint while all its calls are out go together
//! in the next call: gRPC QoS 0/1 as one `DeliverBatch` (a subscriber that answers
//! UNIMPLEMENTED gets one `Deliver` each), webhook events with one secret as one POST in
//! CloudEvents' batched mode.
//! QoS 0 is one attempt; QoS 1 retries with exponential backoff and jitter up to the
//! subscription's max attempts and TTL, then dead-letters with the reason; QoS 2 over gRPC is
//! the two-phase handshake, and the "received" phase is stored, so a retry after it only
//! repeats the release and the subscriber never sees the delivery twice.
//!
//! Every target (endpoint) has its own queue, highest priority first, with a bounded number
//! of calls in flight, so a slow or dead endpoint delays only itself; a call that frees up
//! takes the front of the queue, so batches keep the priority order. While the node has a
//! backlog, calls of urgent deliveries run on the node's runtime with their own in-flight
//! bound and clients, the rest on the lower-priority bulk lane ([`crate::lanes`]), so a
//! backlog never slows an urgent push. Records are durable: unfinished ones are resumed at
//! start. A fresh QoS 1 match has no record at first: its
//! object stays in the outbox until the push is acknowledged (nothing written then) or its
//! first attempt fails (its record written durably then), so a crash in between matches the
//! object again at the next start. Targets that resolve to loopback, private or
//! link-local addresses are refused unless `allow_private_targets` is set.

use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use proto::v1;
use proto::v1::subscriber_client::SubscriberClient;
use storage::{DeliveryState, ObjectId, Store};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::daemon::CoordLink;
use crate::lanes::{Lanes, on_bulk};
use crate::validate;
use crate::{lock, now_ms};

/// Settings of delivery.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// Push matches to subscribers. Off, matches are only recorded as pending delivery
    /// records (benchmarks of the matching pipeline, or another system drains the records).
    pub enabled: bool,
    /// Allow targets on loopback, private and link-local addresses (tests, private networks).
    pub allow_private_targets: bool,
    /// Calls in flight per endpoint (each carries up to `push_batch` deliveries).
    pub in_flight_per_endpoint: usize,
    /// One attempt (both phases of QoS 2) gives up after this long.
    pub attempt_timeout: Duration,
    /// Objects up to this size travel with the push; larger ones as metadata and id only.
    pub max_data_bytes: usize,
    /// Most deliveries in one call to an endpoint. Pushes that queue for one endpoint while
    /// all its calls are out go together in the next one: a webhook POST in CloudEvents'
    /// batched mode (`application/cloudevents-batch+json`; a lone event goes in structured
    /// mode), or one `Subscriber.DeliverBatch` for gRPC QoS 0/1. 1 sends every delivery on
    /// its own.
    pub push_batch: usize,
    /// Extra CAs (PEM) that HTTPS webhooks may be signed by, besides the bundled web roots.
    pub webhook_ca_pem: Option<Arc<Vec<u8>>>,
    /// Send events to a new webhook URL without first asking it to consent (the CloudEvents
    /// abuse-protection handshake), for receivers that cannot answer it.
    pub skip_webhook_validation: bool,
}

impl Default for DeliveryConfig {
    fn default() -> DeliveryConfig {
        DeliveryConfig {
            enabled: true,
            allow_private_targets: false,
            in_flight_per_endpoint: 16,
            attempt_timeout: Duration::from_secs(5),
            max_data_bytes: 1 << 20,
            push_batch: 64,
            webhook_ca_pem: None,
            skip_webhook_validation: false,
        }
    }
}

const DEFAULT_MAX_ATTEMPTS: u32 = 10;
const DEFAULT_TTL_MS: u64 = 24 * 3600 * 1000;
const DEFAULT_INITIAL_BACKOFF_MS: u64 = 100;
const DEFAULT_MAX_BACKOFF_MS: u64 = 60_000;
/// Subscriptions are looked up again after this long (updates reach delivery this fast).
const SUB_CACHE: Duration = Duration::from_secs(5);
/// Objects kept in memory while their deliveries go out (one object goes to many
/// subscribers; stored objects never change).
const OBJECT_CACHE: usize = 1024;

/// Most bytes of deliveries in one batched call past its first delivery (below the 4 MiB a
/// gRPC server takes by default); a larger batch goes in several calls.
const MAX_BATCH_BYTES: usize = 2 << 20;

/// Splits items of these sizes, in order, into runs of at most `max` bytes (an item larger
/// than `max` alone).
fn runs_by_size(sizes: &[usize], max: usize) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, n) in sizes.iter().enumerate() {
        if i > start && bytes.saturating_add(*n) > max {
            runs.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(*n);
    }
    if start < sizes.len() {
        runs.push(start..sizes.len());
    }
    runs
}

/// One attempt's inputs: the job, its subscription, the delivery to push and the record's
/// state before the attempt.
struct Prepared {
    job: Job,
    s: Arc<v1::Subscription>,
    delivery: v1::Delivery,
    attempts: u32,
    received: bool,
    object: Arc<CachedObject>,
}

/// Whether a gRPC subscriber endpoint takes `DeliverBatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchSupport {
    Unknown,
    Yes,
    No,
}

/// The content types of one event and of a batch of events.
const CLOUDEVENT: &str = "application/cloudevents+json; charset=utf-8";
const CLOUDEVENT_BATCH: &str = "application/cloudevents-batch+json; charset=utf-8";

/// What every delivery of one object shares, built once: the stored object, its attributes
/// as gRPC sends them, and the subscription-independent parts of its CloudEvent.
#[derive(Debug)]
struct CachedObject {
    stored: storage::StoredObject,
    metadata: Vec<v1::Attribute>,
    event: EventParts,
    /// A `Delivery`'s object fields (metadata and data) as protobuf bytes, encoded once and
    /// appended to each batched delivery of the object ([`BatchOut`]).
    grpc_shared: Bytes,
}

/// Recently delivered objects, oldest evicted first.
#[derive(Default)]
struct ObjectCache {
    map: HashMap<ObjectId, Arc<CachedObject>>,
    order: std::collections::VecDeque<ObjectId>,
}

/// What [`Deliverer::hand_off`] left to the caller.
#[derive(Debug)]
pub struct HandOff {
    /// The subscriptions whose deliveries need a pending record.
    pub to_record: Vec<u64>,
    /// Deliveries started from memory: the caller holds a share of the object.
    pub held: bool,
}

/// Counters for the admin API.
#[derive(Debug, Default)]
pub struct DeliveryCounters {
    pub acked: AtomicU64,
    pub failures: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub queued: AtomicU64,
}

#[derive(Debug, PartialEq, Eq)]
struct Job {
    priority: u8,
    seq: u64,
    sub: u64,
    obj: ObjectId,
    /// A fresh match: its record was just written as pending with no attempt yet, so the
    /// attempt need not read it back.
    fresh: bool,
    /// A fresh match with no record at all: the object's outbox record stands for it until
    /// it is acknowledged (then nothing is written) or fails once (then its record is
    /// written, durably, and it goes on like any other).
    in_memory: bool,
}

impl Ord for Job {
    fn cmp(&self, o: &Job) -> std::cmp::Ordering {
        // highest priority first, then first come first served
        self.priority.cmp(&o.priority).then(o.seq.cmp(&self.seq))
    }
}

impl PartialOrd for Job {
    fn partial_cmp(&self, o: &Job) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

#[derive(Debug, Default)]
struct EndpointQueue {
    heap: BinaryHeap<Job>,
    /// Calls out, bulk and urgent (each bounded by `in_flight_per_endpoint`).
    in_flight: [usize; 2],
}

/// One attached stream subscriber.
#[derive(Debug)]
struct Session {
    id: u64,
    tx: mpsc::Sender<Result<v1::Delivery, Status>>,
    acks: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
}

type CachedSub = (Instant, Option<Arc<v1::Subscription>>);

struct Inner {
    cfg: DeliveryConfig,
    store: Store,
    subs: CoordLink,
    cache: Mutex<HashMap<u64, CachedSub>>,
    objects: Mutex<ObjectCache>,
    /// Which gRPC endpoints take `DeliverBatch`, by URL.
    batch_support: Mutex<HashMap<String, BatchSupport>>,
    /// Per object: in-memory deliveries not settled yet (plus one while its hand-off runs),
    /// and whether the object must stay in the outbox anyway (its hand-off failed). The
    /// object leaves the outbox when the count reaches zero.
    owed: Mutex<HashMap<ObjectId, (usize, bool)>>,
    queues: Mutex<HashMap<String, EndpointQueue>>,
    streams: Mutex<HashMap<String, Vec<Session>>>,
    /// Clients per lane (`on_bulk()` as the index): a connection is driven by the runtime
    /// that opened it, so the lanes never share one.
    grpc: Mutex<HashMap<(String, bool), Channel>>,
    http: [crate::push_http::WebhookClient; 2],
    /// Webhooks' answers to the validation handshake.
    consents: crate::push_http::Consents,
    lanes: Lanes,
    seq: AtomicU64,
    counters: DeliveryCounters,
    /// Per subscription: acked, failed attempts, dead letters.
    per_sub: Mutex<HashMap<u64, [u64; 3]>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer").field("cfg", &self.cfg).finish()
    }
}

/// The delivery loop of one node (cheap to clone).
#[derive(Debug, Clone)]
pub struct Deliverer {
    inner: Arc<Inner>,
}

/// The delivery id of (subscription, object): the same on every retry.
/// The key of a tenant's named stream (the name itself without authentication).
pub fn stream_key(tenant: &str, name: &str) -> String {
    if tenant.is_empty() {
        name.to_string()
    } else {
        format!("{tenant}\u{0}{name}")
    }
}

pub fn delivery_id(sub: u64, obj: ObjectId) -> String {
    format!("{sub}-{}-{}", obj.node, obj.seq)
}

use crate::target_guard::check_literal;
pub use crate::target_guard::{check_target, is_private};

/// Formats unix ms as RFC 3339 UTC (CloudEvents `time`).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // civil from days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        ms % 1000
    )
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The CloudEvents 1.0 structured-mode JSON body of a webhook delivery.
pub fn cloudevent(d: &v1::Delivery, node: u32, received_unix_ms: u64) -> Vec<u8> {
    event_json(
        &EventParts::new(&d.metadata, &d.data, received_unix_ms),
        d,
        node,
    )
}

/// The parts of an object's CloudEvent that every delivery of it shares (JSON text), built
/// once per object.
#[derive(Debug)]
struct EventParts {
    /// The attributes as a JSON object.
    metadata: String,
    /// The bytes in base64 (no quotes), when they travel.
    data_base64: Option<String>,
    /// RFC 3339.
    time: String,
}

impl EventParts {
    fn new(metadata: &[v1::Attribute], data: &[u8], received_unix_ms: u64) -> EventParts {
        let mut meta = serde_json::Map::new();
        for a in metadata {
            let v = match a.value.as_ref().and_then(|v| v.kind.as_ref()) {
                Some(v1::value::Kind::Text(s)) => serde_json::Value::String(s.clone()),
                Some(v1::value::Kind::Decimal(s)) => serde_json::from_str::<serde_json::Number>(s)
                    .map(serde_json::Value::Number)
                    .unwrap_or_else(|_| serde_json::Value::String(s.clone())),
                Some(v1::value::Kind::Integer(i)) => serde_json::Value::from(*i),
                Some(v1::value::Kind::Number(f)) => serde_json::Value::from(*f),
                None => serde_json::Value::Null,
            };
            meta.insert(a.name.clone(), v);
        }
        EventParts {
            metadata: serde_json::to_string(&meta).unwrap_or_else(|_| "{}".into()),
            data_base64: (!data.is_empty()).then(|| base64(data)),
            time: rfc3339(received_unix_ms),
        }
    }
}

/// One delivery's CloudEvent from its object's shared parts: the JSON that serde_json
/// writes for the event (keys in order), without building it as a value per delivery.
fn event_json(p: &EventParts, d: &v1::Delivery, node: u32) -> Vec<u8> {
    use std::fmt::Write;
    let obj = d.object_id.unwrap_or_default();
    let mut s = String::with_capacity(
        320 + p.metadata.len() + p.data_base64.as_ref().map_or(0, String::len),
    );
    let _ = write!(s, r#"{{"data":{{"attempt":{},"#, d.attempt);
    if let Some(b) = &p.data_base64 {
        let _ = write!(s, r#""data_base64":"{b}","#);
    }
    let _ = write!(
        s,
        r#""metadata":{},"object":{{"node":{},"seq":{}}},"priority":{},"subscription":{}}},"datacontenttype":"application/json","id":{},"source":"dissem://node/{node}","specversion":"1.0","subject":"{}:{}","time":"{}","type":"dissem.object.matched"}}"#,
        p.metadata,
        obj.node,
        obj.seq,
        d.priority,
        d.subscription_id,
        serde_json::Value::String(d.delivery_id.clone()),
        obj.node,
        obj.seq,
        p.time
    );
    s.into_bytes()
}

/// The signature header value of a webhook body: `sha256=<hex>` of
/// HMAC-SHA256(secret, "<timestamp>.<body>").
pub fn sign(secret: &str, timestamp: u64, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = match Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(), // HMAC accepts any key length
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let out = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(7 + 64);
    hex.push_str("sha256=");
    for b in out {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// The header carrying the signature, and the one carrying its timestamp (unix seconds;
/// receivers reject old ones to stop replays).
pub const SIGNATURE_HEADER: &str = "x-dissem-signature";
pub const TIMESTAMP_HEADER: &str = "x-dissem-timestamp";

enum Outcome {
    Done,
    /// QoS 2: received by the subscriber, release still owed.
    Received,
}

impl Deliverer {
    /// The delivery loop over `store`, looking subscriptions up through `subs`. Call
    /// [`Deliverer::resume`] once the node is up to pick up unfinished records.
    pub fn new(
        cfg: DeliveryConfig,
        store: Store,
        subs: CoordLink,
        lanes: Lanes,
    ) -> Result<Deliverer, crate::error::NodeError> {
        let tls = crate::push_http::webhook_tls(cfg.webhook_ca_pem.as_deref().map(Vec::as_slice))?;
        let allow = cfg.allow_private_targets;
        let http = || crate::push_http::webhook_client(allow, tls.clone());
        Ok(Deliverer {
            inner: Arc::new(Inner {
                cfg,
                store,
                subs,
                cache: Mutex::new(HashMap::new()),
                objects: Mutex::default(),
                batch_support: Mutex::new(HashMap::new()),
                owed: Mutex::new(HashMap::new()),
                queues: Mutex::new(HashMap::new()),
                streams: Mutex::new(HashMap::new()),
                grpc: Mutex::new(HashMap::new()),
                http: [http(), http()],
                consents: crate::push_http::Consents::default(),
                lanes,
                seq: AtomicU64::new(0),
                counters: DeliveryCounters::default(),
                per_sub: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Whether webhook `url` consents to this node's events (the validation handshake, unless
    /// skipped).
    async fn consented(&self, url: &str) -> Result<(), String> {
        if self.inner.cfg.skip_webhook_validation {
            return Ok(());
        }
        self.inner
            .consents
            .check(&self.inner.http[usize::from(on_bulk())], url)
            .await
    }

    /// Counters for the admin API.
    pub fn counters(&self) -> &DeliveryCounters {
        &self.inner.counters
    }

    /// Per subscription: (id, [acked, failed attempts, dead letters]), by id.
    pub fn per_subscription(&self) -> Vec<(u64, [u64; 3])> {
        let mut v: Vec<_> = lock(&self.inner.per_sub)
            .iter()
            .map(|(k, c)| (*k, *c))
            .collect();
        v.sort_unstable();
        v
    }

    fn count(&self, sub: u64, outcome: usize) {
        lock(&self.inner.per_sub).entry(sub).or_default()[outcome] += 1;
    }

    /// Queues every unfinished delivery record (after a restart).
    pub fn resume(&self) -> Result<usize, storage::StorageError> {
        if !self.inner.cfg.enabled {
            return Ok(0);
        }
        let recs = self.inner.store.unfinished_deliveries(usize::MAX)?;
        for (sub, obj, _) in &recs {
            self.enqueue(*sub, *obj);
        }
        Ok(recs.len())
    }

    /// A delivery record to push (due now or at its stored next attempt).
    pub fn enqueue(&self, sub: u64, obj: ObjectId) {
        if !self.inner.cfg.enabled {
            return;
        }
        self.inner.counters.queued.fetch_add(1, Ordering::Relaxed);
        let me = self.clone();
        tokio::spawn(async move { me.schedule(sub, obj).await });
    }

    /// Queues a record just written as pending and due now (a fresh match). When its
    /// subscription is cached it goes straight into its endpoint's priority queue, so under
    /// overload a priority-7 delivery does not wait behind the backlog's lookups.
    pub fn enqueue_new(&self, sub: u64, obj: ObjectId) {
        if !self.inner.cfg.enabled {
            return;
        }
        let Some(Some(s)) = self.cached_subscription(sub) else {
            return self.enqueue(sub, obj);
        };
        self.inner.counters.queued.fetch_add(1, Ordering::Relaxed);
        self.queue(obj, vec![(s, sub)], true, false);
    }

    /// An in-memory delivery that must have a record after all (its subscription is not
    /// QoS 1, or was not cached): written durably, then the object's share is given back and
    /// the record goes the usual way.
    async fn to_record(&self, sub: u64, obj: ObjectId) {
        let state = DeliveryState::Pending {
            attempts: 0,
            next_attempt_unix_ms: now_ms(),
        };
        self.finish(sub, obj, state, true).await;
        self.schedule(sub, obj).await;
    }

    /// Whether deliveries of `obj` are in memory (its hand-off is done or running).
    pub fn owes(&self, obj: ObjectId) -> bool {
        lock(&self.inner.owed).contains_key(&obj)
    }

    /// Starts the deliveries of a fresh match of `obj` to `subs` that need no record: those
    /// to subscriptions that are QoS 1 as last seen, or not seen yet (QoS 0 must not repeat
    /// after a crash, and QoS 2 records its phases; a subscription that turns out not to be
    /// QoS 1 gets its record before its first attempt). When some started, the caller holds
    /// one more share of the object (`held`), which it gives back with
    /// [`Deliverer::release`] once the records of the others are durable. `None` (nothing
    /// started) when pushes of `obj` are in memory already: a repeated hand-off.
    pub fn hand_off(&self, obj: ObjectId, subs: Vec<u64>) -> Option<HandOff> {
        let qos1 = |s: &v1::Subscription| s.qos == v1::Qos::AtLeastOnce as i32;
        let mut memory = Vec::new();
        let mut to_record = Vec::new();
        {
            let cache = lock(&self.inner.cache);
            for sub in subs {
                match cache.get(&sub) {
                    _ if !self.inner.cfg.enabled => to_record.push(sub),
                    Some((_, Some(s))) if qos1(s) => memory.push((sub, Some(s.clone()))),
                    Some(_) => to_record.push(sub),
                    None => memory.push((sub, None)),
                }
            }
        }
        if memory.is_empty() {
            return Some(HandOff {
                to_record,
                held: false,
            });
        }
        {
            let mut owed = lock(&self.inner.owed);
            if owed.contains_key(&obj) {
                return None;
            }
            owed.insert(obj, (memory.len() + 1, false));
        }
        self.inner
            .counters
            .queued
            .fetch_add(memory.len() as u64, Ordering::Relaxed);
        let mut known = Vec::with_capacity(memory.len());
        for (sub, cached) in memory {
            match cached {
                Some(s) => known.push((s, sub)),
                // not seen yet: looked up first (a QoS 1 one is pushed from memory)
                None => {
                    let me = self.clone();
                    tokio::spawn(async move {
                        match me.subscription(sub).await {
                            Ok(Some(s)) if qos1(&s) => me.queue(obj, vec![(s, sub)], true, true),
                            _ => me.to_record(sub, obj).await,
                        }
                    });
                }
            }
        }
        self.queue(obj, known, true, true);
        Some(HandOff {
            to_record,
            held: true,
        })
    }

    /// Puts due deliveries of `obj` in their endpoints' priority queues and starts what the
    /// in-flight bounds allow: the object read once, each endpoint's queue locked once and
    /// pumped once.
    fn queue(
        &self,
        obj: ObjectId,
        subs: Vec<(Arc<v1::Subscription>, u64)>,
        fresh: bool,
        in_memory: bool,
    ) {
        if subs.is_empty() {
            return;
        }
        let obj_priority = self
            .object(obj)
            .ok()
            .flatten()
            .map_or(0, |o| o.stored.priority);
        // an object's deliveries go to few endpoints
        let mut by_key: Vec<(String, Vec<Job>)> = Vec::new();
        for (s, sub) in subs {
            let job = Job {
                priority: obj_priority.max(s.priority.min(7) as u8),
                seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
                sub,
                obj,
                fresh,
                in_memory,
            };
            let key = endpoint_key(&s);
            match by_key.iter_mut().find(|(k, _)| *k == key) {
                Some((_, jobs)) => jobs.push(job),
                None => by_key.push((key, vec![job])),
            }
        }
        {
            let mut qs = lock(&self.inner.queues);
            for (key, jobs) in &mut by_key {
                qs.entry(key.clone())
                    .or_default()
                    .heap
                    .extend(jobs.drain(..));
            }
        }
        for (key, _) in &by_key {
            self.pump(key);
        }
    }

    /// Gives back one share of `obj`: the last one takes the object out of the outbox.
    pub fn release(&self, obj: ObjectId) {
        self.give_back(obj, false);
    }

    /// Gives back the hand-off's share of `obj` after its hand-off failed: the object stays
    /// in the outbox, to be matched again once its in-memory pushes settle.
    pub fn abandon(&self, obj: ObjectId) {
        self.give_back(obj, true);
    }

    fn give_back(&self, obj: ObjectId, keep: bool) {
        let retire = {
            let mut owed = lock(&self.inner.owed);
            match owed.get_mut(&obj) {
                Some((n, k)) if *n > 1 => {
                    *n -= 1;
                    *k |= keep;
                    false
                }
                Some((_, k)) => {
                    let keep = *k || keep;
                    owed.remove(&obj);
                    !keep
                }
                None => false,
            }
        };
        if retire && let Err(e) = self.inner.store.retire(obj) {
            tracing::warn!("retiring object {}:{}: {e}", obj.node, obj.seq);
        }
    }

    /// A subscription looked up less than `SUB_CACHE` ago (`Some(None)`: it was not found).
    fn cached_subscription(&self, id: u64) -> Option<Option<Arc<v1::Subscription>>> {
        live(lock(&self.inner.cache).get(&id))
    }

    /// The tenant owning subscription `id` (`None`: no such subscription).
    pub async fn subscription_tenant(&self, id: u64) -> Result<Option<String>, Status> {
        Ok(self.subscription(id).await?.map(|s| s.tenant.clone()))
    }

    async fn subscription(&self, id: u64) -> Result<Option<Arc<v1::Subscription>>, Status> {
        if let Some(s) = self.cached_subscription(id) {
            return Ok(s);
        }
        let s = match self
            .inner
            .subs
            .subscription(v1::SubscriptionRecordRequest { id })
            .await
        {
            Ok(s) => Some(Arc::new(s)),
            Err(e) if e.code() == tonic::Code::NotFound => None,
            Err(e) => return Err(e),
        };
        lock(&self.inner.cache).insert(id, (Instant::now(), s.clone()));
        Ok(s)
    }

    /// An object to deliver, read once for all its deliveries.
    fn object(&self, id: ObjectId) -> Result<Option<Arc<CachedObject>>, storage::StorageError> {
        if let Some(o) = lock(&self.inner.objects).map.get(&id) {
            return Ok(Some(o.clone()));
        }
        let Some(stored) = self.inner.store.get(id)? else {
            return Ok(None);
        };
        let metadata = validate::attributes_to_proto(&stored.metadata);
        let data: &[u8] = if stored.data.len() <= self.inner.cfg.max_data_bytes {
            &stored.data
        } else {
            &[]
        };
        let event = EventParts::new(&metadata, data, stored.received_unix_ms);
        let grpc_shared = Bytes::from(prost::Message::encode_to_vec(&v1::Delivery {
            metadata: metadata.clone(),
            data: data.to_vec(),
            ..v1::Delivery::default()
        }));
        let o = Arc::new(CachedObject {
            stored,
            metadata,
            event,
            grpc_shared,
        });
        let mut c = lock(&self.inner.objects);
        if c.map.insert(id, o.clone()).is_none() {
            c.order.push_back(id);
            if c.order.len() > OBJECT_CACHE
                && let Some(old) = c.order.pop_front()
            {
                c.map.remove(&old);
            }
        }
        Ok(Some(o))
    }

    /// Records a delivery's new state. Only the QoS 2 "received" phase must be durable
    /// before the next step (a lost one would deliver again); the others are written without
    /// waiting for a flush: after a crash an older state means one more attempt, which QoS 1
    /// allows and QoS 2's delivery id absorbs. An in-memory delivery (`in_memory`) writes
    /// nothing when acknowledged; any other state becomes its first record, durable before
    /// the object's outbox record may go.
    fn finish(
        &self,
        sub: u64,
        obj: ObjectId,
        state: DeliveryState,
        in_memory: bool,
    ) -> impl Future<Output = ()> {
        let me = self.clone();
        async move {
            let acked = matches!(state, DeliveryState::Acked { .. });
            let durable = matches!(state, DeliveryState::Received { .. }) || in_memory;
            let r = if in_memory && acked {
                Ok(())
            } else if durable {
                me.inner.store.set_delivery(sub, obj, &state).await
            } else {
                me.inner.store.set_delivery_unflushed(sub, obj, &state)
            };
            match r {
                Ok(()) if in_memory => me.release(obj),
                Ok(()) => {}
                // the object stays in the outbox: matched again at the next start
                Err(e) => tracing::warn!("recording delivery {}: {e}", delivery_id(sub, obj)),
            }
        }
    }

    async fn dead_letter(&self, sub: u64, obj: ObjectId, reason: String, in_memory: bool) {
        tracing::info!("dead letter {}: {reason}", delivery_id(sub, obj));
        self.count(sub, 2);
        self.inner
            .counters
            .dead_lettered
            .fetch_add(1, Ordering::Relaxed);
        self.inner.counters.queued.fetch_sub(1, Ordering::Relaxed);
        self.finish(
            sub,
            obj,
            DeliveryState::DeadLetter {
                reason,
                at_unix_ms: now_ms(),
            },
            in_memory,
        )
        .await;
    }

    /// Waits until the record is due, then puts it in its endpoint's queue.
    async fn schedule(&self, sub: u64, obj: ObjectId) {
        let due = match self.inner.store.delivery(sub, obj) {
            Ok(Some(DeliveryState::Pending {
                next_attempt_unix_ms,
                ..
            }))
            | Ok(Some(DeliveryState::Received {
                next_attempt_unix_ms,
                ..
            })) => next_attempt_unix_ms,
            _ => {
                self.inner.counters.queued.fetch_sub(1, Ordering::Relaxed);
                return; // finished meanwhile
            }
        };
        let wait = due.saturating_sub(now_ms());
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        let s = loop {
            match self.subscription(sub).await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::debug!("looking up subscription {sub}: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        let Some(s) = s else {
            self.dead_letter(sub, obj, format!("subscription {sub} was deleted"), false)
                .await;
            return;
        };
        self.queue(obj, vec![(s, sub)], false, false);
    }

    /// Starts calls to an endpoint up to its in-flight bound, highest priority first. A free
    /// call takes every due delivery up to `push_batch` (pushes that queued while all calls
    /// were out), so batches form only under load and always from the front of the queue.
    /// A call carries urgent deliveries only or bulk ones only, and runs on its lane; each
    /// lane has its own in-flight bound, so urgent pushes never wait for a bulk call.
    fn pump(&self, key: &str) {
        let batch = self.inner.cfg.push_batch.max(1);
        let lanes = &self.inner.lanes;
        let mut qs = lock(&self.inner.queues);
        let Some(q) = qs.get_mut(key) else { return };
        while let Some(top) = q.heap.peek() {
            let priority = top.priority;
            let lane = usize::from(lanes.urgent(priority));
            if q.in_flight[lane] >= self.inner.cfg.in_flight_per_endpoint {
                break; // what follows is of this lane or below
            }
            let mut jobs = Vec::with_capacity(q.heap.len().min(batch));
            while jobs.len() < batch
                && q.heap
                    .peek()
                    .is_some_and(|j| lanes.urgent(j.priority) == (lane == 1))
                && let Some(job) = q.heap.pop()
            {
                jobs.push(job);
            }
            q.in_flight[lane] += 1;
            let me = self.clone();
            let key = key.to_string();
            lanes.spawn(priority, async move {
                me.attempt(jobs).await;
                {
                    let mut qs = lock(&me.inner.queues);
                    if let Some(q) = qs.get_mut(&key) {
                        q.in_flight[lane] -= 1;
                        if q.in_flight == [0, 0] && q.heap.is_empty() {
                            qs.remove(&key);
                        }
                    }
                }
                me.pump(&key);
            });
        }
    }

    /// One attempt of each job: gRPC QoS 0/1 deliveries to one URL go in one
    /// `DeliverBatch`, webhook events to one URL with one secret in one POST, the rest on
    /// their own; then each job's outcome is recorded.
    async fn attempt(&self, jobs: Vec<Job>) {
        let mut grpc: HashMap<String, Vec<Prepared>> = HashMap::new();
        let mut hooks: HashMap<(String, String), Vec<Prepared>> = HashMap::new();
        let mut single = Vec::new();
        // the subscriptions and objects of the call, each cache locked once
        let (subs, objects): (Vec<_>, Vec<_>) = {
            let cache = lock(&self.inner.cache);
            let subs = jobs
                .iter()
                .map(|j| live(cache.get(&j.sub)).flatten())
                .collect();
            drop(cache);
            let objects = lock(&self.inner.objects);
            (
                subs,
                jobs.iter()
                    .map(|j| objects.map.get(&j.obj).cloned())
                    .collect(),
            )
        };
        for ((job, sub), object) in jobs.into_iter().zip(subs).zip(objects) {
            let Some(p) = self.prepare(job, sub, object).await else {
                continue;
            };
            match p.s.target.as_ref().and_then(|t| t.kind.as_ref()) {
                Some(v1::target::Kind::Grpc(url)) if self.batched_grpc(&p.s) => {
                    grpc.entry(url.clone()).or_default().push(p);
                }
                Some(v1::target::Kind::Webhook(url)) if self.inner.cfg.push_batch > 1 => {
                    hooks
                        .entry((url.clone(), p.s.webhook_secret.clone()))
                        .or_default()
                        .push(p);
                }
                _ => single.push(p),
            }
        }
        let mut set = tokio::task::JoinSet::new();
        for (url, ps) in grpc {
            let me = self.clone();
            set.spawn(async move { me.grpc_batch(&url, ps).await });
        }
        for ((url, secret), ps) in hooks {
            let me = self.clone();
            set.spawn(async move { me.webhook_batch(&url, &secret, ps).await });
        }
        for mut p in single {
            let me = self.clone();
            set.spawn(async move {
                let d = std::mem::take(&mut p.delivery);
                let push = me.push(&p.s, d, p.received, &p.object);
                let r = match tokio::time::timeout(me.inner.cfg.attempt_timeout, push).await {
                    Ok(r) => r,
                    Err(_) => Err(me.no_answer()),
                };
                me.settle(p, r).await;
            });
        }
        while set.join_next().await.is_some() {}
    }

    /// Whether deliveries to `s` go in `DeliverBatch` calls (gRPC, QoS 0/1, batching on).
    fn batched_grpc(&self, s: &v1::Subscription) -> bool {
        matches!(
            s.target.as_ref().and_then(|t| t.kind.as_ref()),
            Some(v1::target::Kind::Grpc(_))
        ) && s.qos != v1::Qos::ExactlyOnce as i32
            && self.inner.cfg.push_batch > 1
    }

    fn no_answer(&self) -> String {
        format!(
            "no answer within {} ms",
            self.inner.cfg.attempt_timeout.as_millis()
        )
    }

    /// Reads what an attempt needs: the record's state, the subscription and the object.
    /// `None` when there is nothing to push now (finished meanwhile, or dead-lettered or
    /// rescheduled here).
    /// `known` and `cached`: the subscription and object when the caller has them at hand.
    async fn prepare(
        &self,
        job: Job,
        known: Option<Arc<v1::Subscription>>,
        cached: Option<Arc<CachedObject>>,
    ) -> Option<Prepared> {
        let (sub, obj) = (job.sub, job.obj);
        let state = if job.fresh {
            Ok(Some(DeliveryState::Pending {
                attempts: 0,
                next_attempt_unix_ms: 0,
            }))
        } else {
            self.inner.store.delivery(sub, obj)
        };
        let (attempts, received) = match state {
            Ok(Some(DeliveryState::Pending { attempts, .. })) => (attempts, false),
            Ok(Some(DeliveryState::Received { attempts, .. })) => (attempts, true),
            _ => {
                self.inner.counters.queued.fetch_sub(1, Ordering::Relaxed);
                return None;
            }
        };
        let looked_up = match known {
            Some(s) => Ok(Some(s)),
            None => self.subscription(sub).await,
        };
        let s = match looked_up {
            Ok(Some(s)) if job.in_memory && s.qos != v1::Qos::AtLeastOnce as i32 => {
                // its QoS changed since it was last seen
                self.to_record(sub, obj).await;
                return None;
            }
            Ok(Some(s)) => s,
            Ok(None) => {
                self.dead_letter(
                    sub,
                    obj,
                    format!("subscription {sub} was deleted"),
                    job.in_memory,
                )
                .await;
                return None;
            }
            Err(e) => {
                self.retry_later(&job, attempts, received, None, format!("{e}"))
                    .await;
                return None;
            }
        };
        let object = match cached.map_or_else(|| self.object(obj), |o| Ok(Some(o))) {
            Ok(Some(o)) => o,
            Ok(None) => {
                self.dead_letter(
                    sub,
                    obj,
                    "the object expired before delivery".into(),
                    job.in_memory,
                )
                .await;
                return None;
            }
            Err(e) => {
                self.retry_later(&job, attempts, received, Some(&s), e.to_string())
                    .await;
                return None;
            }
        };
        // a webhook event is written from the object's shared parts: no copy of the bytes
        let webhook = matches!(
            s.target.as_ref().and_then(|t| t.kind.as_ref()),
            Some(v1::target::Kind::Webhook(_))
        );
        // webhooks write the event from the object's shared parts, and batched gRPC
        // deliveries append its shared encoding: neither copies the object
        let shared = webhook || self.batched_grpc(&s);
        let delivery = v1::Delivery {
            delivery_id: delivery_id(sub, obj),
            subscription_id: sub,
            object_id: Some(v1::ObjectId {
                node: obj.node,
                seq: obj.seq,
            }),
            metadata: if shared {
                Vec::new()
            } else {
                object.metadata.clone()
            },
            data: if !shared && object.stored.data.len() <= self.inner.cfg.max_data_bytes {
                object.stored.data.clone()
            } else {
                Vec::new()
            },
            priority: job.priority as u32,
            attempt: attempts + 1,
        };
        Some(Prepared {
            job,
            s,
            delivery,
            attempts,
            received,
            object,
        })
    }

    /// Records the outcome of one attempt.
    async fn settle(&self, p: Prepared, result: Result<Outcome, String>) {
        let (sub, obj) = (p.job.sub, p.job.obj);
        match result {
            Ok(Outcome::Done) => {
                self.count(sub, 0);
                self.inner.counters.acked.fetch_add(1, Ordering::Relaxed);
                self.inner.counters.queued.fetch_sub(1, Ordering::Relaxed);
                self.finish(
                    sub,
                    obj,
                    DeliveryState::Acked {
                        at_unix_ms: now_ms(),
                    },
                    p.job.in_memory,
                )
                .await;
            }
            Ok(Outcome::Received) => {
                // the release failed after "received": only the release is retried
                self.retry_later(
                    &p.job,
                    p.attempts,
                    true,
                    Some(&p.s),
                    "release failed".into(),
                )
                .await;
            }
            Err(e) if p.s.qos == v1::Qos::AtMostOnce as i32 => {
                self.count(sub, 1);
                self.inner.counters.failures.fetch_add(1, Ordering::Relaxed);
                self.dead_letter(
                    sub,
                    obj,
                    format!("QoS 0 (at most once): the only attempt failed: {e}"),
                    p.job.in_memory,
                )
                .await;
            }
            Err(e) => {
                self.retry_later(&p.job, p.attempts, p.received, Some(&p.s), e)
                    .await;
            }
        }
    }

    /// QoS 0/1 deliveries to one gRPC endpoint in one `DeliverBatch` (one `Deliver` each
    /// where the endpoint does not take batches).
    async fn grpc_batch(&self, url: &str, mut ps: Vec<Prepared>) {
        let deliveries: Vec<(v1::Delivery, Bytes)> = ps
            .iter_mut()
            .map(|p| {
                (
                    std::mem::take(&mut p.delivery),
                    p.object.grpc_shared.clone(),
                )
            })
            .collect();
        let sizes: Vec<usize> = deliveries
            .iter()
            .map(|(d, shared)| prost::Message::encoded_len(d) + shared.len())
            .collect();
        let mut outcomes = Vec::with_capacity(ps.len());
        let mut deliveries = deliveries.into_iter();
        for run in runs_by_size(&sizes, MAX_BATCH_BYTES) {
            let part: Vec<_> = deliveries.by_ref().take(run.len()).collect();
            match tokio::time::timeout(
                self.inner.cfg.attempt_timeout,
                self.send_grpc_batch(url, part),
            )
            .await
            {
                Ok(o) => outcomes.extend(o),
                Err(_) => outcomes.extend(vec![Err(self.no_answer()); run.len()]),
            }
        }
        for (p, r) in ps.into_iter().zip(outcomes) {
            self.settle(p, r.map(|()| Outcome::Done)).await;
        }
    }

    /// The outcome of each delivery, in order.
    async fn send_grpc_batch(
        &self,
        url: &str,
        deliveries: Vec<(v1::Delivery, Bytes)>,
    ) -> Vec<Result<(), String>> {
        let n = deliveries.len();
        if let Err(e) = check_literal(url, self.inner.cfg.allow_private_targets) {
            return vec![Err(e); n];
        }
        let ch = match self.grpc_channel(url) {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let c = SubscriberClient::new(ch.clone());
        let support = lock(&self.inner.batch_support)
            .get(url)
            .copied()
            .unwrap_or(BatchSupport::Unknown);
        if support == BatchSupport::No || n == 1 {
            return deliver_each(&c, deliveries.into_iter().map(whole).collect()).await;
        }
        // until the endpoint is known to take batches, keep the deliveries for one Deliver
        // each
        let fallback = (support != BatchSupport::Yes).then(|| deliveries.clone());
        match deliver_batch(ch, BatchOut(deliveries)).await {
            Ok(ack) => {
                if support != BatchSupport::Yes {
                    lock(&self.inner.batch_support).insert(url.to_string(), BatchSupport::Yes);
                }
                let mut outcomes = vec![Ok(()); n];
                for rej in ack.into_inner().rejected {
                    if let Some(o) = outcomes.get_mut(rej.index as usize) {
                        *o = Err(format!("the subscriber rejected it: {}", rej.reason));
                    }
                }
                outcomes
            }
            Err(e) if e.code() == tonic::Code::Unimplemented && fallback.is_some() => {
                tracing::info!("{url} does not take DeliverBatch; one Deliver per delivery");
                lock(&self.inner.batch_support).insert(url.to_string(), BatchSupport::No);
                let each = fallback.unwrap_or_default().into_iter().map(whole);
                deliver_each(&c, each.collect()).await
            }
            Err(e) => vec![Err(format!("DeliverBatch: {e}")); n],
        }
    }

    /// Webhook events to one URL with one secret in one POST (several past
    /// `MAX_BATCH_BYTES`): structured mode for one event, CloudEvents' batched mode for
    /// several; a 2xx acks them all.
    async fn webhook_batch(&self, url: &str, secret: &str, ps: Vec<Prepared>) {
        let events: Vec<Vec<u8>> = ps
            .iter()
            .map(|p| {
                let node = p.delivery.object_id.map_or(0, |o| o.node);
                event_json(&p.object.event, &p.delivery, node)
            })
            .collect();
        let sizes: Vec<usize> = events.iter().map(Vec::len).collect();
        let mut ps = ps.into_iter();
        for run in runs_by_size(&sizes, MAX_BATCH_BYTES) {
            let part = &events[run.clone()];
            let send = async {
                check_literal(url, self.inner.cfg.allow_private_targets)?;
                self.consented(url).await?;
                let (body, ctype) = if part.len() == 1 {
                    (part[0].clone(), CLOUDEVENT)
                } else {
                    let mut body = Vec::with_capacity(part.iter().map(|e| e.len() + 1).sum());
                    body.push(b'[');
                    for (i, e) in part.iter().enumerate() {
                        if i > 0 {
                            body.push(b',');
                        }
                        body.extend_from_slice(e);
                    }
                    body.push(b']');
                    (body, CLOUDEVENT_BATCH)
                };
                self.send_post(url, secret, body, ctype).await
            };
            let r = match tokio::time::timeout(self.inner.cfg.attempt_timeout, send).await {
                Ok(r) => r,
                Err(_) => Err(format!("POST {url}: {}", self.no_answer())),
            };
            for p in ps.by_ref().take(run.len()) {
                self.settle(p, r.clone().map(|()| Outcome::Done)).await;
            }
        }
    }

    /// Records a failed attempt: retried after a backoff, or dead-lettered at the limits.
    async fn retry_later(
        &self,
        job: &Job,
        attempts: u32,
        received: bool,
        s: Option<&v1::Subscription>,
        error: String,
    ) {
        let (sub, obj) = (job.sub, job.obj);
        self.count(sub, 1);
        self.inner.counters.failures.fetch_add(1, Ordering::Relaxed);
        let attempts = attempts + 1;
        let retry = s.and_then(|s| s.retry);
        let max_attempts = retry
            .map(|r| r.max_attempts)
            .filter(|m| *m > 0)
            .unwrap_or(DEFAULT_MAX_ATTEMPTS);
        let ttl = retry
            .map(|r| r.ttl_ms)
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_TTL_MS);
        let initial = retry
            .map(|r| r.initial_backoff_ms)
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_INITIAL_BACKOFF_MS);
        let max_backoff = retry
            .map(|r| r.max_backoff_ms)
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_MAX_BACKOFF_MS);
        let born = self
            .inner
            .store
            .get(obj)
            .ok()
            .flatten()
            .map_or(now_ms(), |o| o.received_unix_ms);
        let now = now_ms();
        if attempts >= max_attempts {
            self.dead_letter(
                sub,
                obj,
                format!("gave up after {attempts} attempts (max_attempts {max_attempts}): {error}"),
                job.in_memory,
            )
            .await;
            return;
        }
        if now.saturating_sub(born) >= ttl {
            self.dead_letter(
                sub,
                obj,
                format!("gave up after {attempts} attempts: TTL of {ttl} ms passed: {error}"),
                job.in_memory,
            )
            .await;
            return;
        }
        // exponential backoff with full jitter in its upper half
        let exp = initial
            .saturating_mul(1u64 << (attempts - 1).min(30))
            .min(max_backoff);
        let jitter = crate::daemon::random_u64() % (exp / 2 + 1);
        let next = now + exp / 2 + jitter;
        tracing::debug!(
            "delivery {} attempt {attempts} failed ({error}); next in {} ms",
            delivery_id(sub, obj),
            next - now
        );
        let state = if received {
            DeliveryState::Received {
                attempts,
                next_attempt_unix_ms: next,
            }
        } else {
            DeliveryState::Pending {
                attempts,
                next_attempt_unix_ms: next,
            }
        };
        self.finish(sub, obj, state, job.in_memory).await;
        let me = self.clone();
        tokio::spawn(async move { me.schedule(sub, obj).await });
    }

    async fn push(
        &self,
        s: &v1::Subscription,
        d: v1::Delivery,
        received: bool,
        object: &CachedObject,
    ) -> Result<Outcome, String> {
        let target = s
            .target
            .as_ref()
            .and_then(|t| t.kind.as_ref())
            .ok_or("the subscription has no target")?;
        let exactly_once = s.qos == v1::Qos::ExactlyOnce as i32;
        match target {
            v1::target::Kind::Grpc(url) => {
                check_literal(url, self.inner.cfg.allow_private_targets)?;
                let mut c = self.grpc_client(url)?;
                let id = d.delivery_id.clone();
                let (sub, attempts) = (d.subscription_id, d.attempt.saturating_sub(1));
                let obj = d.object_id.map(|o| ObjectId {
                    node: o.node,
                    seq: o.seq,
                });
                if !received {
                    c.deliver(d).await.map_err(|e| format!("Deliver: {e}"))?;
                    if exactly_once && let Some(obj) = obj {
                        // "received" is durable before the release goes out (as MQTT's
                        // PUBREL state): after a crash only the release is repeated, never
                        // the delivery the subscriber may already have shown
                        self.finish(
                            sub,
                            obj,
                            DeliveryState::Received {
                                attempts,
                                next_attempt_unix_ms: now_ms(),
                            },
                            false,
                        )
                        .await;
                    }
                }
                if exactly_once
                    && let Err(e) = c.release(v1::ReleaseRequest { delivery_id: id }).await
                {
                    if !received {
                        // "received" is stored: the retry only releases
                        tracing::debug!("Release: {e}");
                        return Ok(Outcome::Received);
                    }
                    return Err(format!("Release: {e}"));
                }
                Ok(Outcome::Done)
            }
            v1::target::Kind::Webhook(url) => {
                check_literal(url, self.inner.cfg.allow_private_targets)?;
                self.consented(url).await?;
                let node = d.object_id.map_or(0, |o| o.node);
                let event = event_json(&object.event, &d, node);
                self.send_post(url, &s.webhook_secret, event, CLOUDEVENT)
                    .await?;
                Ok(Outcome::Done)
            }
            v1::target::Kind::Stream(name) => {
                self.to_stream(&stream_key(&s.tenant, name), d).await?;
                Ok(Outcome::Done)
            }
        }
    }

    fn grpc_client(&self, url: &str) -> Result<SubscriberClient<Channel>, String> {
        self.grpc_channel(url).map(SubscriberClient::new)
    }

    fn grpc_channel(&self, url: &str) -> Result<Channel, String> {
        let key = (url.to_string(), on_bulk());
        let mut g = lock(&self.inner.grpc);
        if let Some(c) = g.get(&key) {
            return Ok(c.clone());
        }
        let ch = tonic::transport::Endpoint::from_shared(url.to_string())
            .map_err(|e| format!("target {}: {e}", blocks::quote::quoted(url)))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .connect_with_connector_lazy(crate::push_http::grpc_connector(
                self.inner.cfg.allow_private_targets,
            ));
        g.insert(key, ch.clone());
        Ok(ch)
    }

    /// One signed POST.
    async fn send_post(
        &self,
        url: &str,
        secret: &str,
        body: Vec<u8>,
        ctype: &str,
    ) -> Result<(), String> {
        let ts = now_ms() / 1000;
        let mut req = hyper::Request::post(url)
            .header("content-type", ctype)
            .header(TIMESTAMP_HEADER, ts.to_string());
        if !secret.is_empty() {
            req = req.header(SIGNATURE_HEADER, sign(secret, ts, &body));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("building the request: {e}"))?;
        let resp = self.inner.http[usize::from(on_bulk())]
            .request(req)
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("POST {url}: HTTP {}", resp.status()))
        }
    }

    async fn to_stream(&self, name: &str, d: v1::Delivery) -> Result<(), String> {
        let (tx, acks) = {
            let streams = lock(&self.inner.streams);
            let sessions = streams
                .get(name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("no subscriber has stream {name:?} open"))?;
            let i = (self.inner.seq.load(Ordering::Relaxed) as usize) % sessions.len();
            (sessions[i].tx.clone(), sessions[i].acks.clone())
        };
        let (ack_tx, ack_rx) = oneshot::channel();
        lock(&acks).insert(d.delivery_id.clone(), ack_tx);
        let id = d.delivery_id.clone();
        if tx.send(Ok(d)).await.is_err() {
            lock(&acks).remove(&id);
            return Err(format!("stream {name:?} closed"));
        }
        ack_rx
            .await
            .map_err(|_| format!("stream {name:?} closed before the ack"))
    }
}

/// One `Deliver` per delivery, all at once (an endpoint without `DeliverBatch`); the
/// outcomes in the deliveries' order.
/// A `DeliveryBatch` on the wire, written from deliveries without their object fields plus
/// each object's shared encoding of them (protobuf concatenates the fields of one message),
/// so a batch copies no object per delivery. The subscriber decodes a plain `DeliveryBatch`.
#[derive(Debug, Default)]
struct BatchOut(Vec<(v1::Delivery, Bytes)>);

impl BatchOut {
    fn item_len((d, shared): &(v1::Delivery, Bytes)) -> usize {
        prost::Message::encoded_len(d) + shared.len()
    }
}

impl prost::Message for BatchOut {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        for item in &self.0 {
            prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(BatchOut::item_len(item) as u64, buf);
            item.0.encode_raw(buf);
            buf.put_slice(&item.1);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // only ever encoded
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0
            .iter()
            .map(|item| {
                let l = BatchOut::item_len(item);
                prost::encoding::key_len(1) + prost::encoding::encoded_len_varint(l as u64) + l
            })
            .sum()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// `Subscriber.DeliverBatch` with a [`BatchOut`] as the request.
async fn deliver_batch(
    ch: Channel,
    batch: BatchOut,
) -> Result<Response<v1::DeliverBatchAck>, Status> {
    let mut g = tonic::client::Grpc::new(ch);
    g.ready()
        .await
        .map_err(|e| Status::unavailable(format!("the subscriber is not reachable: {e}")))?;
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/dissem.v1.Subscriber/DeliverBatch");
    let codec = proto::codec::DissemCodec::<BatchOut, v1::DeliverBatchAck>::default();
    g.unary(Request::new(batch), path, codec).await
}

/// A delivery with its object fields merged back from their shared encoding.
fn whole((mut d, shared): (v1::Delivery, Bytes)) -> v1::Delivery {
    if let Err(e) = prost::Message::merge(&mut d, shared) {
        tracing::warn!("rebuilding delivery {}: {e}", d.delivery_id);
    }
    d
}

async fn deliver_each(
    c: &SubscriberClient<Channel>,
    deliveries: Vec<v1::Delivery>,
) -> Vec<Result<(), String>> {
    let mut set = tokio::task::JoinSet::new();
    let n = deliveries.len();
    for (i, d) in deliveries.into_iter().enumerate() {
        let mut c = c.clone();
        set.spawn(async move { (i, c.deliver(d).await.map_err(|e| format!("Deliver: {e}"))) });
    }
    let mut outcomes = vec![Err("Deliver: the call was lost".to_string()); n];
    while let Some(r) = set.join_next().await {
        if let Ok((i, r)) = r
            && let Some(o) = outcomes.get_mut(i)
        {
            *o = r.map(|_| ());
        }
    }
    outcomes
}

/// A subscription cache entry younger than `SUB_CACHE` (`Some(None)`: it was not found).
fn live(entry: Option<&CachedSub>) -> Option<Option<Arc<v1::Subscription>>> {
    entry
        .filter(|(at, _)| at.elapsed() < SUB_CACHE)
        .map(|(_, s)| s.clone())
}

fn endpoint_key(s: &v1::Subscription) -> String {
    match s.target.as_ref().and_then(|t| t.kind.as_ref()) {
        Some(v1::target::Kind::Grpc(u)) => format!("grpc {u}"),
        Some(v1::target::Kind::Webhook(u)) => format!("webhook {u}"),
        Some(v1::target::Kind::Stream(n)) => format!("stream {n}"),
        None => "none".into(),
    }
}

#[tonic::async_trait]
impl v1::stream_server::Stream for Deliverer {
    type OpenStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::Delivery, Status>> + Send>>;

    async fn open(
        &self,
        request: Request<Streaming<v1::StreamClientMessage>>,
    ) -> Result<Response<Self::OpenStream>, Status> {
        use tokio_stream::StreamExt;
        let caller = crate::auth::caller(&request);
        let mut input = request.into_inner();
        let name = match input.next().await {
            Some(Ok(v1::StreamClientMessage {
                kind: Some(v1::stream_client_message::Kind::Attach(name)),
            })) => {
                crate::validate::stream_name("attach", &name)?;
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
            });
        tracing::info!("stream {name:?} attached");
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(Ok(m)) = input.next().await {
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
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_split_by_size_and_an_oversized_item_goes_alone() {
        assert_eq!(runs_by_size(&[], 10), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(runs_by_size(&[4, 4, 4], 10), vec![0..2, 2..3]);
        assert_eq!(runs_by_size(&[20, 1, 1], 10), vec![0..1, 1..3]);
        assert_eq!(runs_by_size(&[1, 20, 1], 10), vec![0..1, 1..2, 2..3]);
        assert_eq!(runs_by_size(&[5, 5], 10), vec![0..2]);
    }

    #[test]
    fn a_batch_with_shared_object_fields_decodes_as_the_whole_deliveries() {
        use prost::Message;
        let metadata = vec![
            v1::Attribute {
                name: "temp".into(),
                value: Some(v1::Value {
                    kind: Some(v1::value::Kind::Number(21.5)),
                }),
            },
            v1::Attribute {
                name: "site".into(),
                value: Some(v1::Value {
                    kind: Some(v1::value::Kind::Text("lab".into())),
                }),
            },
        ];
        let shared = Bytes::from(
            v1::Delivery {
                metadata: metadata.clone(),
                data: b"payload".to_vec(),
                ..v1::Delivery::default()
            }
            .encode_to_vec(),
        );
        let bare = |sub: u64, seq: u64| v1::Delivery {
            delivery_id: delivery_id(sub, ObjectId { node: 1, seq }),
            subscription_id: sub,
            object_id: Some(v1::ObjectId { node: 1, seq }),
            priority: 7,
            attempt: 2,
            ..v1::Delivery::default()
        };
        let full = |sub, seq| v1::Delivery {
            metadata: metadata.clone(),
            data: b"payload".to_vec(),
            ..bare(sub, seq)
        };
        let out = BatchOut(vec![
            (bare(3, 10), shared.clone()),
            (bare(4, 10), shared.clone()),
            (bare(5, 11), Bytes::new()),
        ]);
        let wire = out.encode_to_vec();
        assert_eq!(wire.len(), out.encoded_len());
        let got = v1::DeliveryBatch::decode(wire.as_slice()).expect("decodes");
        assert_eq!(got.deliveries, vec![full(3, 10), full(4, 10), bare(5, 11)]);
        assert_eq!(whole((bare(3, 10), shared)), full(3, 10));
    }

    #[test]
    fn cloudevents_from_shared_parts_are_what_serde_json_writes() {
        let attr = |name: &str, kind| v1::Attribute {
            name: name.into(),
            value: Some(v1::Value { kind: Some(kind) }),
        };
        let mut d = v1::Delivery {
            delivery_id: "7-1-42".into(),
            subscription_id: 7,
            object_id: Some(v1::ObjectId { node: 1, seq: 42 }),
            metadata: vec![
                attr("temp", v1::value::Kind::Decimal("21.50".into())),
                attr("room", v1::value::Kind::Text("a \"quoted\" name".into())),
                attr("count", v1::value::Kind::Integer(-3)),
                attr("ratio", v1::value::Kind::Number(0.25)),
            ],
            data: b"hello".to_vec(),
            priority: 5,
            attempt: 2,
        };
        // the event as serde_json builds it, field by field
        let reference = |d: &v1::Delivery| {
            let mut meta = serde_json::Map::new();
            let exact: serde_json::Number = serde_json::from_str("21.50").expect("decimal");
            meta.insert("temp".into(), serde_json::Value::Number(exact));
            meta.insert("room".into(), serde_json::json!("a \"quoted\" name"));
            meta.insert("count".into(), serde_json::json!(-3));
            meta.insert("ratio".into(), serde_json::json!(0.25));
            let mut data = serde_json::json!({
                "subscription": 7,
                "object": {"node": 1, "seq": 42},
                "metadata": meta,
                "priority": 5,
                "attempt": 2,
            });
            if !d.data.is_empty() {
                data["data_base64"] = serde_json::Value::String(base64(&d.data));
            }
            serde_json::to_vec(&serde_json::json!({
                "specversion": "1.0",
                "id": "7-1-42",
                "source": "dissem://node/1",
                "type": "dissem.object.matched",
                "subject": "1:42",
                "time": rfc3339(1_700_000_000_123),
                "datacontenttype": "application/json",
                "data": data,
            }))
            .expect("json")
        };
        let got = cloudevent(&d, 1, 1_700_000_000_123);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&reference(&d))
        );
        d.data.clear();
        assert_eq!(cloudevent(&d, 1, 1_700_000_000_123), reference(&d));
    }

    #[test]
    fn signatures_and_times_are_as_documented() {
        // HMAC-SHA256 over "<ts>.<body>" (expected value from Python's hmac module)
        let sig = sign("Jefe", 1, b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=a9049465ce89cfb8e9aac62333abda66f80e3403f51f57f6bae3c3a4485eca38"
        );
        assert_ne!(sig, sign("Jefe", 2, b"what do ya want for nothing?"));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert_eq!(base64(b"hi!"), "aGkh");
    }
}
