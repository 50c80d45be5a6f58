//! The node's public services as thin gRPC adapters (`Ingest`, `Objects`, `Admin`): validate,
//! call the store, hand on to the sink, convert back. All state lives in the store; the
//! `Subscriptions` service is `runtime::subscriptions` (a single node) or the proxy to the
//! coordinator (a cluster node).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proto::v1;
use storage::{ObjectId, Store};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use runtime::auth::{self, Caller};
use runtime::{Limits, ServiceError, validate};

/// Where stored objects and subscription changes go (one per node, so the size of its
/// variants does not matter).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Sink {
    /// A single node: objects are matched in this process.
    Embedded(crate::disseminate::Disseminator),
    /// A cluster node: objects go to the coordinator through the node daemon (subscriptions
    /// are served by [`crate::proxy`], not here).
    Cluster(crate::daemon::Daemon),
}

impl Sink {
    fn role(&self) -> &'static str {
        match self {
            Sink::Embedded(_) => "embedded",
            Sink::Cluster(_) => "node",
        }
    }
}

/// The node's services, sharing one store.
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) store: Store,
    pub(crate) limits: Limits,
    /// The links to peer clusters, when this node has any.
    pub(crate) federation: Option<crate::federation::Federation>,
    accepted: Arc<AtomicU64>,
    rejected: Arc<AtomicU64>,
    rate: Arc<runtime::rate::RateLimiter>,
    pub(crate) sink: Sink,
    /// Draining before a restart (`Admin.Drain`): puts are refused.
    drain: Arc<crate::drain::Drain>,
    /// The write path's slots, taken in priority order once all are busy.
    admission: crate::admission::Admission,
}

impl Node {
    /// Services over a store.
    pub fn new(store: Store, limits: Limits, sink: Sink) -> Node {
        Node {
            store,
            limits,
            federation: None,
            accepted: Arc::new(AtomicU64::new(0)),
            rejected: Arc::new(AtomicU64::new(0)),
            rate: Arc::new(runtime::rate::RateLimiter::new(
                limits.max_requests_per_second_per_connection,
            )),
            drain: match &sink {
                Sink::Cluster(d) => d.drain().clone(),
                _ => Arc::default(),
            },
            admission: match &sink {
                Sink::Cluster(d) => d.admission().clone(),
                _ => crate::admission::Admission::default(),
            },
            sink,
        }
    }

    /// This node's drain state (its serving loop exits when a drained node is asked to).
    pub fn drain(&self) -> &Arc<crate::drain::Drain> {
        &self.drain
    }

    /// This node with its links to peer clusters (and the endpoint their objects arrive at).
    pub fn with_federation(mut self, f: crate::federation::Federation) -> Node {
        self.federation = Some(f);
        self
    }

    /// Admits one request of `caller` from `peer`: the connection's rate, then the tenant's
    /// puts-per-second quota.
    fn admit(
        &self,
        peer: Option<std::net::SocketAddr>,
        caller: &Caller,
    ) -> Result<(), ServiceError> {
        self.drain.refuse()?;
        if !self.rate.allow(peer, std::time::Instant::now()) {
            return Err(ServiceError::RateLimited(
                self.limits.max_requests_per_second_per_connection,
            ));
        }
        caller.tenant.charge_puts(1)
    }

    /// The tenant owning subscription `id`, wherever subscriptions live (this store, or the
    /// coordinator's registry for a cluster node); `None` if it is gone.
    async fn owner(&self, id: u64) -> Result<Option<String>, ServiceError> {
        if let Some(b) = self.store.get_subscription(id)? {
            return Ok(Some(runtime::subscriptions::decode_stored(id, &b)?.tenant));
        }
        match &self.sink {
            Sink::Cluster(d) => d
                .deliverer()
                .subscription_tenant(id)
                .await
                .map_err(ServiceError::from),
            _ => Ok(None),
        }
    }

    /// The first `limit` of `items` whose subscription (`sub_of`) belongs to `caller`'s tenant.
    async fn keep_own<T>(
        &self,
        caller: &Caller,
        items: Vec<T>,
        sub_of: impl Fn(&T) -> u64,
        limit: usize,
    ) -> Result<Vec<T>, ServiceError> {
        let mut mine = Vec::new();
        let mut owners: std::collections::HashMap<u64, bool> = std::collections::HashMap::new();
        for it in items {
            if mine.len() == limit {
                break;
            }
            let sub = sub_of(&it);
            let own = match owners.get(&sub) {
                Some(o) => *o,
                None => {
                    let o = self.owner(sub).await?.as_deref() == Some(caller.tenant());
                    owners.insert(sub, o);
                    o
                }
            };
            if own {
                mine.push(it);
            }
        }
        Ok(mine)
    }

    async fn put_object(
        &self,
        obj: Result<storage::NewObject, ServiceError>,
    ) -> Result<v1::PutResponse, ServiceError> {
        self.put_objects(vec![obj]).await.pop().unwrap_or_else(|| {
            Err(ServiceError::Unavailable(
                "the put produced no result".into(),
            ))
        })
    }

    /// Stores validated objects a writer of this cluster hands in: [`Node::store_objects`],
    /// owing each to the cluster's federation links, once the write path admits them (in
    /// priority order while it is busy: [`crate::admission`]; a batch at its highest).
    async fn put_objects(
        &self,
        objs: Vec<Result<storage::NewObject, ServiceError>>,
    ) -> Vec<Result<v1::PutResponse, ServiceError>> {
        let Some(priority) = objs.iter().flatten().map(|o| o.priority).max() else {
            // nothing valid: the rejections, without a slot
            return self.store_admitted(objs, true, None).await;
        };
        let slot = match self.admission.enter(priority).await {
            Ok(s) => s,
            Err(e) => {
                self.rejected
                    .fetch_add(objs.len() as u64, Ordering::Relaxed);
                return objs.into_iter().map(|o| o.and(Err(e.into()))).collect();
            }
        };
        self.store_admitted(objs, true, Some(slot)).await
    }

    /// The write path's admission: waited and refused puts so far, and those waiting now.
    pub fn admission(&self) -> &crate::admission::Admission {
        &self.admission
    }

    /// Stores validated objects with one shared flush and hands each new one to the sink;
    /// answers one result per input, in order (a rejected input does not stop the others).
    /// With `owe`, each is also owed to the federation links (durable before the answer);
    /// objects replicated from a peer cluster are not, so they never travel on.
    pub(crate) async fn store_objects(
        &self,
        objs: Vec<Result<storage::NewObject, ServiceError>>,
        owe: bool,
    ) -> Vec<Result<v1::PutResponse, ServiceError>> {
        self.store_admitted(objs, owe, None).await
    }

    /// [`Node::store_objects`] holding `slot` of the write path until the local write is
    /// durable: the copies to peers and the federation's record wait on the network, not on
    /// this node's CPU or disk, so a slow peer does not hold the slot (and every put behind it).
    async fn store_admitted(
        &self,
        objs: Vec<Result<storage::NewObject, ServiceError>>,
        owe: bool,
        slot: Option<crate::admission::Slot>,
    ) -> Vec<Result<v1::PutResponse, ServiceError>> {
        let start_us = runtime::now_us();
        let federation = self.federation.as_ref().filter(|f| owe && f.has_links());
        let mut results: Vec<Option<Result<v1::PutResponse, ServiceError>>> =
            Vec::with_capacity(objs.len());
        let mut valid = Vec::with_capacity(objs.len());
        let mut metas = Vec::with_capacity(objs.len());
        for obj in objs {
            match obj {
                Ok(obj) => {
                    if let Sink::Cluster(_) = &self.sink {
                        metas.push(Some((obj.priority, obj.metadata.clone())));
                    } else {
                        metas.push(None);
                    }
                    valid.push(obj);
                    results.push(None);
                }
                Err(e) => {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    results.push(Some(Err(e)));
                }
            }
        }
        let owed_copies: Option<Vec<storage::NewObject>> = federation.map(|_| valid.clone());
        let written = self.store.put_batch(valid).await;
        drop(slot);
        let stored = match written {
            Ok(outs) => outs,
            Err(e) => {
                // the shared flush failed: none of the writes is acknowledged
                tracing::error!("storage failure: {e}");
                let reason = format!("storage: {e}");
                return results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(ServiceError::Unavailable(reason.clone()))))
                    .collect();
            }
        };
        let copies = self.replicate(&stored).await;
        let owed = match (federation, owed_copies) {
            (Some(f), Some(objs)) => self.owe(f, &stored, &objs).await,
            _ => stored.iter().map(|_| Ok(())).collect(),
        };
        let mut stored = stored.into_iter().zip(metas).zip(copies).zip(owed);
        results
            .into_iter()
            .map(|r| {
                if let Some(r) = r {
                    return r;
                }
                let Some((((out, meta), copied), owed)) = stored.next() else {
                    return Err(ServiceError::Unavailable(
                        "the put produced no result".into(),
                    ));
                };
                let out = out?;
                if !out.duplicate {
                    if let (Sink::Cluster(d), Some((_, m))) = (&self.sink, &meta) {
                        d.deliverer().trace_put(out.id, m, start_us);
                    }
                    // in the outbox now: disseminated even if its copies fell short
                    self.hand_off(out.id, meta);
                }
                copied?;
                owed?;
                self.accepted.fetch_add(1, Ordering::Relaxed);
                Ok(v1::PutResponse {
                    id: Some(id_to_proto(out.id)),
                    duplicate: out.duplicate,
                })
            })
            .collect()
    }

    /// Owes each stored object (a repeat too: what was owed may have been lost with a crash
    /// before the first answer) to the federation links, durably; one result per outcome.
    async fn owe(
        &self,
        f: &crate::federation::Federation,
        stored: &[Result<storage::PutOutcome, storage::StorageError>],
        objs: &[storage::NewObject],
    ) -> Vec<Result<(), ServiceError>> {
        let mut out: Vec<Result<(), ServiceError>> = stored
            .iter()
            .zip(objs)
            .map(|(s, o)| match s {
                Ok(p) => f.owe(p.id, o),
                Err(_) => Ok(()),
            })
            .collect();
        if let Err(e) = self.store.commit().await {
            let why = format!("storage: {e}");
            out = out
                .into_iter()
                .map(|r| r.and(Err(ServiceError::Unavailable(why.clone()))))
                .collect();
        }
        f.wake();
        out
    }

    /// Copies the stored objects to their quorums (a cluster node with a grid); one result
    /// per outcome, `Ok` where nothing was needed. A duplicate is copied again, so a put
    /// retried after too few copies gets them.
    async fn replicate(
        &self,
        stored: &[Result<storage::PutOutcome, storage::StorageError>],
    ) -> Vec<Result<(), ServiceError>> {
        let mut out: Vec<Result<(), ServiceError>> = stored.iter().map(|_| Ok(())).collect();
        let Sink::Cluster(d) = &self.sink else {
            return out;
        };
        if d.grid().is_none() {
            if d.has_view() {
                return out; // a cluster without a grid: nothing is replicated
            }
            // just started, no coordinator heard yet: an acknowledgement now would stand
            // on this disk alone, and the quorum would hold no copy to restore it from
            // (a node wiped, restarted while etcd was down, then its log damaged: 3
            // acknowledged objects lost; found by `bench chaos`, seed 13069)
            let why = "this node has not heard from a coordinator yet, so its quorum's copies \
                       cannot be placed: retry with the same message_id (or another node)";
            for (r, s) in out.iter_mut().zip(stored) {
                if s.is_ok() {
                    *r = Err(ServiceError::Unavailable(why.into()));
                }
            }
            return out;
        }
        let mut objects = Vec::new();
        let mut at = Vec::new();
        for (i, s) in stored.iter().enumerate() {
            if let Ok(o) = s {
                match self.store.get(o.id) {
                    Ok(Some(obj)) => {
                        objects.push(obj);
                        at.push(i);
                    }
                    Ok(None) => {}
                    Err(e) => out[i] = Err(e.into()),
                }
            }
        }
        for (i, r) in at.into_iter().zip(d.replicate(&objects).await) {
            out[i] = r;
        }
        out
    }

    /// Passes a newly stored object on to matching (after its acknowledgement is decided; the
    /// durable outbox covers a crash meanwhile).
    fn hand_off(&self, id: ObjectId, meta: Option<(u8, Vec<(String, blocks::Value)>)>) {
        match (&self.sink, meta) {
            (Sink::Embedded(d), _) => {
                let d = d.clone();
                tokio::spawn(async move {
                    if let Err(e) = d.disseminate(id).await {
                        tracing::warn!(
                            "matching object {}:{} failed (left in the outbox): {e}",
                            id.node,
                            id.seq
                        );
                    }
                });
            }
            (Sink::Cluster(d), Some((priority, metadata))) => d.arrived(id, priority, &metadata),
            _ => {}
        }
    }
}

fn id_to_proto(id: ObjectId) -> v1::ObjectId {
    v1::ObjectId {
        node: id.node,
        seq: id.seq,
    }
}

/// The most requests of one `PutStream` stored under one flush.
const STREAM_BATCH: usize = 256;

/// The stream's next item if it is already there, without waiting: `None` when it is not.
fn ready_now<S: Stream + Unpin>(s: &mut S) -> Option<Option<S::Item>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match Pin::new(s).poll_next(&mut cx) {
        std::task::Poll::Ready(x) => Some(x),
        std::task::Poll::Pending => None,
    }
}

#[tonic::async_trait]
impl v1::ingest_server::Ingest for Node {
    async fn put(
        &self,
        request: Request<v1::PutRequest>,
    ) -> Result<Response<v1::PutResponse>, Status> {
        let admitted = self.admit(request.remote_addr(), &auth::caller(&request));
        let obj = admitted.and_then(|()| validate::put(request.into_inner(), &self.limits));
        Ok(Response::new(self.put_object(obj).await?))
    }

    type PutStreamStream =
        Pin<Box<dyn Stream<Item = Result<v1::PutStreamResponse, Status>> + Send + 'static>>;

    async fn put_stream(
        &self,
        request: Request<Streaming<v1::PutRequest>>,
    ) -> Result<Response<Self::PutStreamStream>, Status> {
        let peer = request.remote_addr();
        let caller = auth::caller(&request);
        let mut input = request.into_inner();
        let node = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_BATCH);
        tokio::spawn(async move {
            // A writer may keep several puts in flight: every request already received is
            // stored with one shared flush, then all are answered in order.
            while let Some(first) = input.next().await {
                let mut batch = vec![first];
                let mut ended = false;
                while batch.len() < STREAM_BATCH && !matches!(batch.last(), Some(Err(_))) {
                    match ready_now(&mut input) {
                        Some(Some(m)) => batch.push(m),
                        Some(None) => {
                            ended = true;
                            break;
                        }
                        None => break,
                    }
                }
                let broken = match batch.last() {
                    Some(Err(_)) => batch.pop().and_then(Result::err),
                    _ => None,
                };
                let objs = batch
                    .into_iter()
                    .flatten()
                    .map(|req| {
                        node.admit(peer, &caller)
                            .and_then(|()| validate::put(req, &node.limits))
                    })
                    .collect();
                for r in node.put_objects(objs).await {
                    let result = match r {
                        Ok(r) => v1::put_stream_response::Result::Ok(r),
                        Err(e) => {
                            let s = Status::from(e);
                            v1::put_stream_response::Result::Rejected(v1::Rejection {
                                code: s.code() as i32,
                                message: s.message().to_string(),
                            })
                        }
                    };
                    let reply = v1::PutStreamResponse {
                        result: Some(result),
                    };
                    if tx.send(Ok(reply)).await.is_err() {
                        return;
                    }
                }
                if let Some(status) = broken {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                if ended {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn announce(
        &self,
        request: Request<v1::AnnounceRequest>,
    ) -> Result<Response<v1::PutResponse>, Status> {
        let admitted = self.admit(request.remote_addr(), &auth::caller(&request));
        let obj = admitted.and_then(|()| validate::announce(request.into_inner(), &self.limits));
        Ok(Response::new(self.put_object(obj).await?))
    }
}

#[tonic::async_trait]
impl v1::objects_server::Objects for Node {
    async fn get(
        &self,
        request: Request<v1::GetObjectRequest>,
    ) -> Result<Response<v1::StoredObject>, Status> {
        let id = request
            .into_inner()
            .id
            .ok_or_else(|| ServiceError::invalid("id", "an object id is required"))?;
        let id = ObjectId {
            node: id.node,
            seq: id.seq,
        };
        let o = self
            .store
            .get(id)
            .map_err(ServiceError::from)?
            .ok_or_else(|| ServiceError::NotFound(format!("object {}:{}", id.node, id.seq)))?;
        Ok(Response::new(v1::StoredObject {
            id: Some(id_to_proto(o.id)),
            data: o.data,
            external_id: o.external_id,
            metadata: validate::attributes_to_proto(&o.metadata),
            priority: o.priority as u32,
            message_id: o.message_id,
            received_unix_ms: o.received_unix_ms,
        }))
    }
}

#[tonic::async_trait]
impl v1::admin_server::Admin for Node {
    async fn stats(
        &self,
        _request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        let (matches_handed, matches_repeated) = match &self.sink {
            Sink::Cluster(d) => (
                d.counters().matches_handed.load(Ordering::Relaxed),
                d.counters().matches_repeated.load(Ordering::Relaxed),
            ),
            _ => (0, 0),
        };
        let delivery = match &self.sink {
            Sink::Cluster(d) => Some(d.deliverer().counters()),
            _ => None,
        };
        let copies = self.store.replica_counts().map_err(ServiceError::from)?;
        // a cluster node's daemon figure; 0 on a single node
        let cluster = |f: fn(&crate::daemon::Daemon) -> u64| match &self.sink {
            Sink::Cluster(d) => f(d),
            _ => 0,
        };
        Ok(Response::new(v1::StatsResponse {
            copies_unfinished: copies.unfinished as u64,
            copies_finished: copies.finished as u64,
            copies_forwarding: copies.forwarding as u64,
            objects_taken_over: cluster(|d| d.counters().taken_over.load(Ordering::Relaxed)),
            objects_handed: self.store.handed_seqs().len() as u64,
            objects_taken_back: cluster(|d| d.counters().taken_back.load(Ordering::Relaxed)),
            store_failed: self.store.sled_failed(),
            puts_waited: self.admission.counts().0,
            puts_refused_overloaded: self.admission.counts().1,
            puts_waiting: self.admission.waiting() as u64,
            copies_pulled: cluster(|d| d.counters().copies_pulled.load(Ordering::Relaxed)),
            image_loaded: cluster(|d| d.image_loaded()),
            images_compiled: cluster(|d| d.counters().images_compiled.load(Ordering::Relaxed)),
            images_kept: cluster(|d| d.counters().images_kept.load(Ordering::Relaxed)),
            images_applied: cluster(|d| d.counters().images_applied.load(Ordering::Relaxed)),
            images_compacted: cluster(|d| d.counters().images_compacted.load(Ordering::Relaxed)),
            // a coordinator's
            registry_kept: false,
            registry_ready_ms: 0,
            node: self.store.node(),
            objects_stored: self.store.object_count() as u64,
            puts_accepted: self.accepted.load(Ordering::Relaxed),
            puts_rejected: self.rejected.load(Ordering::Relaxed),
            outbox_pending: self.store.outbox_len() as u64,
            subscriptions: self.store.subscription_count() as u64,
            role: self.sink.role().into(),
            matches_handed,
            matches_repeated,
            deliveries: self.store.delivery_count() as u64,
            deliveries_acked: delivery.map_or(0, |c| c.acked.load(Ordering::Relaxed)),
            delivery_failures: delivery.map_or(0, |c| c.failures.load(Ordering::Relaxed)),
            dead_lettered: delivery.map_or(0, |c| c.dead_lettered.load(Ordering::Relaxed)),
            deliveries_queued: delivery.map_or(0, |c| c.queued.load(Ordering::Relaxed)),
            qos0_dropped: delivery.map_or(0, |c| c.qos0_dropped.load(Ordering::Relaxed)),
            cluster: None,
            view: match &self.sink {
                Sink::Cluster(d) => d.cluster_view(),
                _ => None,
            },
        }))
    }

    async fn workers(
        &self,
        _request: Request<v1::WorkersRequest>,
    ) -> Result<Response<v1::WorkersResponse>, Status> {
        // an embedded node matches in-process and hosts no workers
        let workers = match &self.sink {
            Sink::Cluster(d) => d
                .workers()
                .into_iter()
                .map(|(id, block, busy, urgent)| v1::WorkerInfo {
                    id: format!("{id:x}"),
                    block,
                    state: if busy { "busy" } else { "idle" }.into(),
                    node: self.store.node(),
                    urgent,
                })
                .collect(),
            _ => Vec::new(),
        };
        Ok(Response::new(v1::WorkersResponse { workers }))
    }

    async fn dead_letters(
        &self,
        request: Request<v1::DeadLettersRequest>,
    ) -> Result<Response<v1::DeadLettersResponse>, Status> {
        let caller = auth::caller(&request);
        let limit = match request.into_inner().limit {
            0 => 100,
            l if l > 10_000 => {
                return Err(ServiceError::invalid("limit", format!("{l} exceeds 10000")).into());
            }
            l => l as usize,
        };
        let mut dead = self
            .store
            .dead_letters(if caller.is_admin() { limit } else { usize::MAX })
            .map_err(ServiceError::from)?;
        if !caller.is_admin() {
            dead = self.keep_own(&caller, dead, |d| d.0, limit).await?;
        }
        Ok(Response::new(v1::DeadLettersResponse {
            dead_letters: dead
                .into_iter()
                .filter_map(|(sub, obj, state)| match state {
                    storage::DeliveryState::DeadLetter { reason, at_unix_ms } => {
                        Some(v1::DeadLetter {
                            subscription_id: sub,
                            object_id: Some(id_to_proto(obj)),
                            reason,
                            at_unix_ms,
                        })
                    }
                    _ => None,
                })
                .collect(),
        }))
    }

    async fn drain(
        &self,
        request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        let exit = request.into_inner().exit;
        Ok(Response::new(self.drain_step(exit)?))
    }

    async fn resize_grid(
        &self,
        _request: Request<v1::ResizeGridRequest>,
    ) -> Result<Response<v1::ResizeGridResponse>, Status> {
        Err(Status::failed_precondition(
            "a node does not resize the grid: ask the leading coordinator (dissem grid resize \
             TxW --node-url <its URL>)",
        ))
    }

    async fn redrive(
        &self,
        request: Request<v1::RedriveRequest>,
    ) -> Result<Response<v1::RedriveResponse>, Status> {
        let caller = auth::caller(&request);
        let r = request.into_inner();
        let mut keys: Vec<(u64, ObjectId)> = if r.all {
            self.store
                .dead_letters(usize::MAX)
                .map_err(ServiceError::from)?
                .into_iter()
                .map(|(s, o, _)| (s, o))
                .collect()
        } else {
            let mut keys = Vec::with_capacity(r.dead_letters.len());
            for (i, d) in r.dead_letters.iter().enumerate() {
                let o = d.object_id.ok_or_else(|| {
                    ServiceError::invalid(format!("dead_letters[{i}].object_id"), "required")
                })?;
                keys.push((
                    d.subscription_id,
                    ObjectId {
                        node: o.node,
                        seq: o.seq,
                    },
                ));
            }
            keys
        };
        if !caller.is_admin() {
            // another tenant's dead letters are left alone (and not reported)
            keys = self.keep_own(&caller, keys, |k| k.0, usize::MAX).await?;
        }
        let now = runtime::now_ms();
        let mut redriven = 0;
        for (sub, obj) in keys {
            if self
                .store
                .redrive(sub, obj, now)
                .await
                .map_err(ServiceError::from)?
            {
                redriven += 1;
                if let Sink::Cluster(d) = &self.sink {
                    d.deliverer().enqueue(sub, obj);
                }
            }
        }
        Ok(Response::new(v1::RedriveResponse { redriven }))
    }
}

#[cfg(test)]
#[path = "services_tests.rs"]
mod tests;
