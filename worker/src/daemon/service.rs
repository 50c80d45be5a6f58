//! The internal `Daemon` service: hellos, assignments, fetches of cached test results,
//! matches and stream relays, each handed to the part that handles it.

use super::*;

#[tonic::async_trait]
impl v1::daemon_server::Daemon for Daemon {
    type RelayStream = crate::deliver::SessionStream;

    async fn relay(
        &self,
        request: Request<tonic::Streaming<v1::StreamClientMessage>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        let s = self
            .inner
            .deliverer
            .relay_open(request.into_inner())
            .await?;
        Ok(Response::new(s))
    }

    async fn hello(
        &self,
        request: Request<v1::HelloRequest>,
    ) -> Result<Response<v1::HelloResponse>, Status> {
        let theirs = request.into_inner().nonce;
        let ours = self.inner.nonce.load(Ordering::Acquire);
        if theirs != ours {
            self.inner.reregister.notify_one();
        }
        Ok(Response::new(v1::HelloResponse { nonce: ours }))
    }

    async fn assign(
        &self,
        request: Request<v1::AssignRequest>,
    ) -> Result<Response<v1::AssignResponse>, Status> {
        let req = request.into_inner();
        if let Some(leader) = self.inner.coord.leader_nonce()
            && req.nonce != leader
        {
            // a deposed leader that still sends (paused past its lease, cut off from etcd)
            return Err(Status::failed_precondition(format!(
                "nonce: {:016x} is not the coordinator etcd names as leader",
                req.nonce
            )));
        }
        let tx = {
            let mut ws = lock(&self.inner.workers);
            let slot = ws
                .get_mut(&req.worker)
                .ok_or_else(|| ServiceError::NotFound(format!("worker {:x}", req.worker)))?;
            slot.busy = true;
            slot.tx.clone()
        };
        let worker = req.worker;
        if let Err(e) = tx.try_send(req) {
            // not taken: the worker stays idle (the coordinator treats it as gone)
            if let Some(slot) = lock(&self.inner.workers).get_mut(&worker) {
                slot.busy = false;
            }
            return Err(Status::resource_exhausted(format!("worker queue: {e}")));
        }
        Ok(Response::new(v1::AssignResponse {}))
    }

    async fn fetch(
        &self,
        request: Request<v1::FetchRequest>,
    ) -> Result<Response<v1::FetchResponse>, Status> {
        let req = request.into_inner();
        let keys: HashSet<u64> = req.keys.iter().copied().collect();
        let (rs, missing) = self.take_results(req.nonce, &req.tasks, &keys);
        Ok(Response::new(v1::FetchResponse {
            results: rs.iter().map(|r| (**r).clone()).collect(),
            missing,
        }))
    }

    async fn matched(
        &self,
        request: Request<v1::MatchedRequest>,
    ) -> Result<Response<v1::MatchedResponse>, Status> {
        self.handoff(request.into_inner()).await?;
        Ok(Response::new(v1::MatchedResponse {}))
    }

    async fn replicate(
        &self,
        request: Request<v1::ReplicateRequest>,
    ) -> Result<Response<v1::ReplicateResponse>, Status> {
        Ok(Response::new(self.take_copies(request.into_inner()).await?))
    }

    async fn subscription_copies(
        &self,
        request: Request<v1::SubscriptionCopiesRequest>,
    ) -> Result<Response<v1::SubscriptionCopiesResponse>, Status> {
        Ok(Response::new(self.copies_placed_by(request.into_inner())?))
    }

    async fn replicas(
        &self,
        request: Request<v1::ReplicasRequest>,
    ) -> Result<Response<v1::ReplicasResponse>, Status> {
        let r = request.into_inner();
        let limit = r.limit.clamp(1, 1024) as usize;
        let set = v1::ReplicaSet::try_from(r.set)
            .map_err(|_| ServiceError::invalid("set", format!("unknown set {}", r.set)))?;
        if set != v1::ReplicaSet::Unfinished {
            let store = &self.inner.store;
            let mut seqs = match set {
                v1::ReplicaSet::Finished => store
                    .finished_replicas(r.origin, r.after_seq, limit + 1)
                    .map_err(ServiceError::from)?,
                v1::ReplicaSet::Forwarding => store
                    .forwarding_seqs(r.origin, r.after_seq, limit + 1)
                    .map_err(ServiceError::from)?,
                _ => {
                    // adopted and still in the outbox, or matched already with deliveries
                    // open here: both are this node's to finish (an origin back from a lapse
                    // that missed the second pushed them again; found by `bench chaos`)
                    let mut v = store.adopted_after(r.origin, r.after_seq, limit + 1);
                    if r.origin != self.inner.cfg.node {
                        v.extend(
                            self.inner
                                .deliverer
                                .open_objects(r.origin)
                                .into_iter()
                                .filter(|&s| s > r.after_seq),
                        );
                        // records not resumed yet after a start are open on disk only (an
                        // origin's audit would take them back; `Daemon::auditor`)
                        if !self.inner.resumed.load(Ordering::Acquire) {
                            v.extend(
                                self.open_on_disk()
                                    .into_iter()
                                    .filter(|id| id.node == r.origin && id.seq > r.after_seq)
                                    .map(|id| id.seq),
                            );
                        }
                        v.sort_unstable();
                        v.dedup();
                        v.truncate(limit + 1);
                    }
                    v
                }
            };
            let more = seqs.len() > limit;
            seqs.truncate(limit);
            return Ok(Response::new(v1::ReplicasResponse {
                objects: Vec::new(),
                more,
                seqs,
                received: Vec::new(),
                owns_from: 0,
                forwarding: Vec::new(),
                next_seq: 0,
            }));
        }
        // read before the answer is gathered: what was handed out below it is in the
        // answer, or finished; but not below an object whose put has not written it yet
        let next_seq = if r.origin == self.inner.cfg.node {
            self.inner.store.next_seq_out()
        } else {
            0
        };
        let replicate::Held {
            objects,
            more,
            forwarding,
            unwritten,
        } = self.held_after(r.origin, r.after_seq, limit)?;
        let next_seq = unwritten.map_or(next_seq, |u| u.min(next_seq));
        let mut received = Vec::new();
        for o in &objects {
            for sub in self
                .inner
                .store
                .received_marks(o.id)
                .map_err(ServiceError::from)?
            {
                received.push(v1::ReceivedMark {
                    id: Some(v1::ObjectId {
                        node: o.id.node,
                        seq: o.id.seq,
                    }),
                    subscription: sub,
                });
            }
        }
        let owns_from = if r.origin == self.inner.cfg.node {
            self.inner.store.owns_from()
        } else {
            0
        };
        Ok(Response::new(v1::ReplicasResponse {
            objects: objects.iter().map(replicate::replica_to_proto).collect(),
            more,
            seqs: Vec::new(),
            received,
            owns_from,
            forwarding,
            next_seq,
        }))
    }
}
