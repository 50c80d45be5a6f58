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
//! object again at the next start. A QoS 0 match of an object put since the store opened
//! has none either, the first time the object is matched; a repeated match (after a crash,
//! or a resend while its pushes ran) drops it, so QoS 0 stays at most once. Targets that resolve to loopback, private or
//! link-local addresses are refused unless `allow_private_targets` is set.

use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blocks::hash::FastMap;
use http_body_util::Full;
use hyper::body::Bytes;
use proto::v1;
use proto::v1::subscriber_client::SubscriberClient;
use storage::{DeliveryState, ObjectId, Store};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::lanes::{Lanes, on_bulk};
use runtime::link::ToCoordinator;
use runtime::lock;
use runtime::validate;

mod attempt;
mod backlog;
mod cache;
mod cloudevents;
mod config;
mod figures;
mod finished;
mod fresh;
mod grpc_push;
mod handoff;
mod http_answer;
mod ledger;
mod ordered;
mod queue;
mod retry;
mod settled;
mod spans;
mod spill;
mod stop;
mod stream;
mod sub;
mod webhook;

pub use cache::SubscriptionSource;
pub use cloudevents::{
    SIGNATURE_HEADER, TIMESTAMP_HEADER, base64, cloudevent, metadata_json, rfc3339, sign,
};
pub use config::DeliveryConfig;
pub use finished::FinishedQueue;
pub use handoff::{Accepted, HandOff};
pub use settled::{Hold, Phases, StandbyGate};
pub use spill::Spill;
pub use stream::{SessionStream, stream_key};

// what the parts share with each other (each part takes the whole module with `use super::*`)
use attempt::{Outcome, Prepared};
use cache::{CachedObject, CachedSub, ObjectCache, live};
use cloudevents::{CLOUDEVENT, CLOUDEVENT_BATCH, EventParts, event_json};
use config::*;
use figures::{Figures, PushOutcome};
use grpc_push::{BatchSupport, MAX_BATCH_BYTES, runs_by_size};
use queue::{EndpointQueue, Job};
use stream::Session;
use sub::Sub;
use webhook::HookKey;

/// Subscription ids of one (tenant, name), and when they were looked up.
type NamedIds = (Instant, Vec<u64>);

/// Counters for the admin API.
#[derive(Debug, Default)]
pub struct DeliveryCounters {
    pub acked: AtomicU64,
    pub failures: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub queued: AtomicU64,
    /// QoS 0 matches dropped because their object was matched again (after a restart, or a
    /// resend while still owed): their push may have begun before, and at most once allows
    /// no second.
    pub qos0_dropped: AtomicU64,
}

struct Inner {
    clock: Clock,
    cfg: DeliveryConfig,
    store: Store,
    subs: Arc<dyn SubscriptionSource>,
    /// Subscriptions by id (ids are the registry's, never a caller's choice: the fast
    /// hasher is safe here, as for the per-subscription counters and the objects).
    cache: Mutex<FastMap<u64, CachedSub>>,
    objects: Mutex<ObjectCache>,
    /// Which gRPC endpoints take `DeliverBatch`, by URL.
    batch_support: Mutex<HashMap<String, BatchSupport>>,
    /// What delivery knows of each object it holds: shares out, QoS 0 started, taken back,
    /// open records, spill deadlines, fresh deliveries in transit ([`ledger`]).
    ledger: ledger::Ledger,
    /// QoS 2 deliveries with an attempt under way: one at a time each (`attempt.rs`).
    attempting: Mutex<std::collections::HashSet<(u64, ObjectId)>>,
    queues: Mutex<HashMap<Arc<str>, EndpointQueue>>,
    streams: Mutex<HashMap<String, Vec<Session>>>,
    /// Stream deliveries waiting for a subscriber to attach (durable streams).
    backlog: Mutex<backlog::Backlog>,
    /// The backlog's TTL check runs (started with the first waiting delivery).
    backlog_ttl: std::sync::atomic::AtomicBool,
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
    per_sub: Mutex<FastMap<u64, [u64; 3]>>,
    /// Histograms and per-tenant counters for `/metrics`.
    figures: Figures,
    /// Where spans of traced objects go (`--otlp-endpoint`).
    tracer: std::sync::OnceLock<crate::trace::Tracer>,
    /// Until the start's resume of durable records: the pairs whose records this process
    /// is writing (fresh matches), which the resume leaves to their writer (`fresh`).
    before_resume: Mutex<Option<std::collections::HashSet<(u64, ObjectId)>>>,
    /// Where finished objects are reported.
    finished: std::sync::OnceLock<Arc<FinishedQueue>>,
    /// Who learns of QoS 2 "received" phases before releases.
    phases: Mutex<Option<Arc<dyn Phases>>>,
    /// Whether an active-passive standby knows an object finished here.
    standby: Mutex<Option<Arc<dyn StandbyGate>>>,
    /// Where dead-lettering deliveries are handed over (spillover links).
    spill: Mutex<Option<Arc<dyn Spill>>>,
    /// Subscription ids by (tenant, name), as last looked up.
    named: Mutex<HashMap<(String, String), NamedIds>>,
    /// Ordered subscriptions' deliveries, per subscription ([`ordered`]).
    ordered: Mutex<HashMap<u64, ordered::Sequencer>>,
    /// The periodic look at waiting ordered deliveries runs.
    ordered_ticking: std::sync::atomic::AtomicBool,
    /// The node is stopping: no call starts any more ([`stop`]).
    stopping: std::sync::atomic::AtomicBool,
    /// Set once stream sessions are to end ([`stop`]).
    closing: tokio::sync::watch::Sender<bool>,
    /// The stop's outcome, once: whether every call under way settled in time.
    stopped: tokio::sync::OnceCell<bool>,
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

/// Delivery's clock: unix milliseconds that advance with tokio's clock, so due times, backoff
/// and TTLs all follow `tokio::time` (a test under `tokio::time::pause()` runs a whole retry
/// schedule without waiting for it) while records keep wall-clock times.
#[derive(Debug, Clone, Copy)]
struct Clock {
    base_unix_ms: u64,
    base: tokio::time::Instant,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            base_unix_ms: runtime::now_ms(),
            base: tokio::time::Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base_unix_ms + self.base.elapsed().as_millis() as u64
    }
}

/// The delivery id of (subscription, object): the same on every retry.
pub fn delivery_id(sub: u64, obj: ObjectId) -> String {
    format!("{sub}-{}-{}", obj.node, obj.seq)
}

use runtime::target_guard::check_literal;

impl Deliverer {
    /// The delivery loop over `store`, looking subscriptions up through `subs`. Call
    /// [`Deliverer::resume`] once the node is up to pick up unfinished records.
    pub fn new(
        cfg: DeliveryConfig,
        store: Store,
        subs: Arc<dyn SubscriptionSource>,
        lanes: Lanes,
    ) -> Result<Deliverer, runtime::error::ServiceError> {
        let tls = crate::push_http::webhook_tls(cfg.webhook_ca_pem.as_deref().map(Vec::as_slice))?;
        let allow = cfg.allow_private_targets;
        let http = || crate::push_http::webhook_client(allow, tls.clone());
        let deadlines = store
            .spill_deadlines()
            .map_err(runtime::error::ServiceError::from)?;
        Ok(Deliverer {
            inner: Arc::new(Inner {
                clock: Clock::new(),
                cfg,
                store,
                subs,
                cache: Mutex::new(FastMap::default()),
                objects: Mutex::default(),
                batch_support: Mutex::new(HashMap::new()),
                ledger: ledger::Ledger::with_deadlines(deadlines),
                attempting: Mutex::default(),
                queues: Mutex::new(HashMap::new()),
                streams: Mutex::new(HashMap::new()),
                backlog: Mutex::default(),
                backlog_ttl: std::sync::atomic::AtomicBool::new(false),
                grpc: Mutex::new(HashMap::new()),
                http: [http(), http()],
                consents: crate::push_http::Consents::default(),
                lanes,
                seq: AtomicU64::new(0),
                counters: DeliveryCounters::default(),
                per_sub: Mutex::new(FastMap::default()),
                figures: Figures::default(),
                tracer: std::sync::OnceLock::new(),
                before_resume: Mutex::new(Some(Default::default())),
                finished: std::sync::OnceLock::new(),
                phases: Mutex::new(None),
                standby: Mutex::new(None),
                spill: Mutex::new(None),
                named: Mutex::default(),
                ordered: Mutex::default(),
                ordered_ticking: std::sync::atomic::AtomicBool::new(false),
                stopping: std::sync::atomic::AtomicBool::new(false),
                closing: tokio::sync::watch::channel(false).0,
                stopped: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// Counters for the admin API.
    pub fn counters(&self) -> &DeliveryCounters {
        &self.inner.counters
    }

    /// Now, in unix milliseconds on delivery's clock.
    fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// The `k` subscriptions that rank first for per-subscription series
    /// ([`runtime::metrics::subscription_rank`]), in one pass with a heap of `k`: a scrape
    /// costs no copy of a million subscriptions' counters.
    pub fn top_subscriptions(&self, k: usize) -> Vec<(u64, [u64; 3])> {
        if k == 0 {
            return Vec::new();
        }
        let mut heap = BinaryHeap::with_capacity(k + 1);
        for (id, c) in lock(&self.inner.per_sub).iter() {
            heap.push((runtime::metrics::subscription_rank(*id, c), *id, *c));
            if heap.len() > k {
                heap.pop(); // the one ranking last
            }
        }
        heap.into_iter().map(|(_, id, c)| (id, c)).collect()
    }

    fn count(&self, sub: u64, outcome: usize) {
        lock(&self.inner.per_sub).entry(sub).or_default()[outcome] += 1;
    }

    /// Queues every unfinished delivery record (after a restart).
    pub fn resume(&self) -> Result<usize, storage::StorageError> {
        self.resume_except(&std::collections::HashSet::new())
    }

    /// Queues every unfinished delivery record except those of `handed_over` objects:
    /// another node (which took them over while this one was down) delivers or delivered
    /// them, so their records here are closed as acknowledged, never pushed again.
    pub fn resume_except(
        &self,
        handed_over: &std::collections::HashSet<ObjectId>,
    ) -> Result<usize, storage::StorageError> {
        if !self.inner.cfg.enabled {
            lock(&self.inner.before_resume).take(); // nothing to leave to anyone
            return Ok(0);
        }
        // read with the fresh pairs taken, atomically: a record written after this read
        // is its writer's to push, and one written before it either is in `fresh` or
        // belongs to the resume
        let (recs, fresh) = {
            let mut g = lock(&self.inner.before_resume);
            let fresh = g.take().unwrap_or_default();
            (self.inner.store.unfinished_deliveries(usize::MAX)?, fresh)
        };
        let mut n = 0;
        for (sub, obj, _) in &recs {
            if fresh.contains(&(*sub, *obj)) {
                continue; // a fresh match of this start recorded it and pushes it
            }
            if handed_over.contains(obj) {
                let done = DeliveryState::Acked {
                    at_unix_ms: self.now_ms(),
                };
                self.inner.store.set_delivery_unflushed(*sub, *obj, &done)?;
                continue;
            }
            n += 1;
            self.opened(*sub, *obj);
            self.enqueue(*sub, *obj);
        }
        Ok(n)
    }

    /// The objects of this node's unfinished delivery records, lowest sequence first.
    pub fn unfinished_objects(&self) -> Result<Vec<ObjectId>, storage::StorageError> {
        let mut v: Vec<ObjectId> = self
            .inner
            .store
            .unfinished_deliveries(usize::MAX)?
            .into_iter()
            .map(|(_, o, _)| o)
            .collect();
        v.sort_unstable();
        v.dedup();
        Ok(v)
    }
}
