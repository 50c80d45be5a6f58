//! Membership: registration with the coordinator, heartbeats that renew the workers' leases
//! and report started and terminated workers, and re-registration when a new coordinator
//! (a new nonce) appears.

use super::*;

/// The longest a catch-up after registration may hold the outbox resend up.
pub(super) const CATCH_UP_LIMIT: Duration = Duration::from_secs(60);

/// The longest a registration or heartbeat waits for its answer.
const CALL_LIMIT: Duration = Duration::from_secs(5);

fn late() -> tonic::Status {
    tonic::Status::deadline_exceeded(format!("no answer within {CALL_LIMIT:?}"))
}

impl Daemon {
    /// Runs `step` every few heartbeats until `done` says so, for as long as the node keeps
    /// its current registration (the next registration's catch-up starts over): what a
    /// catch-up could not settle because a node did not answer is asked again.
    pub(super) fn every_few_heartbeats_until<F>(
        &self,
        done: impl Fn(&Daemon) -> bool + Send + 'static,
        step: impl Fn(Daemon) -> F + Send + 'static,
    ) where
        F: std::future::Future<Output = ()> + Send,
    {
        let registration = self.inner.registrations.load(Ordering::Acquire);
        let me = self.clone();
        let current =
            move |d: &Daemon| d.inner.registrations.load(Ordering::Acquire) == registration;
        tokio::spawn(async move {
            let every = me.inner.cfg.heartbeat_every * 4;
            while !done(&me) && current(&me) {
                tokio::time::sleep(every).await;
                if !current(&me) {
                    return;
                }
                step(me.clone()).await;
            }
        });
    }

    /// The cluster as the last heartbeat answer described it, and the coordinator this node
    /// follows (for `Admin.Stats`, `/metrics` and the console); `None` before any answer.
    pub fn cluster_view(&self) -> Option<v1::ClusterView> {
        let v = self.view();
        if v.members.is_empty() {
            return None;
        }
        let members = v
            .members
            .iter()
            .map(|(&node, (ep, alive))| {
                let (row, col) = v.grid.map_or((0, 0), |g| g.position(node));
                v1::GridMember {
                    node,
                    row,
                    col,
                    alive: *alive,
                    heir: v.heirs.get(&node).copied(),
                    endpoint: ep.clone(),
                }
            })
            .collect();
        let mut out = v1::ClusterView {
            rows: v.grid.map_or(0, |g| g.grid.rows),
            cols: v.grid.map_or(0, |g| g.grid.cols),
            next_rows: v.grid.and_then(|g| g.next).map_or(0, |g| g.rows),
            next_cols: v.grid.and_then(|g| g.next).map_or(0, |g| g.cols),
            members,
            lease_ms: v.lease.as_millis() as u64,
            leader_nonce: self.inner.nonce.load(Ordering::Acquire),
            ..v1::ClusterView::default()
        };
        match &self.inner.coord {
            runtime::link::ToCoordinator::Elected(e) => {
                if let Some(l) = e.leader().current() {
                    out.leader_name = l.name;
                    out.leader_url = l.url;
                    out.leader_epoch = l.epoch;
                }
            }
            _ => out.leader_url = self.inner.cfg.coordinator.clone(),
        }
        Some(out)
    }

    pub(super) fn worker_states(&self) -> Vec<v1::WorkerState> {
        lock(&self.inner.workers)
            .iter()
            .map(|(id, s)| v1::WorkerState {
                worker: *id,
                block: s.block.clone(),
                urgent: s.urgent,
            })
            .collect()
    }

    /// With an elected coordinator: registers again as soon as etcd names a new leader that
    /// serves (the heartbeat's nonce check is the second path, as in seed 002).
    pub(super) async fn follow_leader(
        self,
        mut changes: tokio::sync::watch::Receiver<Option<runtime::election::LeaderInfo>>,
    ) {
        while changes.changed().await.is_ok() {
            let nonce = changes
                .borrow_and_update()
                .as_ref()
                .filter(|l| !l.url.is_empty())
                .map(|l| l.nonce);
            if let Some(n) = nonce
                && n != self.inner.nonce.load(Ordering::Acquire)
            {
                self.inner.reregister.notify_one();
            }
        }
    }

    /// `call`'s answer, unless a new leader is named first (`None`: a call to a leader that
    /// was paused or cut off would otherwise hold registration with the new one up), or
    /// the call takes longer than [`CALL_LIMIT`].
    async fn unless_leader_changes<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Option<Result<T, tonic::Status>> {
        let limit = tokio::time::timeout(CALL_LIMIT, call);
        if !matches!(self.inner.coord, ToCoordinator::Elected(_)) {
            return Some(limit.await.unwrap_or_else(|_| Err(late())));
        }
        tokio::select! {
            r = limit => Some(r.unwrap_or_else(|_| Err(late()))),
            _ = self.inner.reregister.notified() => None,
        }
    }

    /// Registration and heartbeats; registers again when the coordinator's nonce changes.
    pub(super) async fn membership(self) {
        let mut tick = tokio::time::interval(self.inner.cfg.heartbeat_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.inner.reregister.notified() => {
                    self.inner.nonce.store(0, Ordering::Release);
                }
            }
            let known = self.inner.nonce.load(Ordering::Acquire);
            if known == 0 {
                let req = v1::RegisterRequest {
                    node: self.inner.cfg.node,
                    endpoint: self.inner.cfg.endpoint.clone(),
                    workers: self.worker_states(),
                    owns_from: self.inner.store.owns_from(),
                };
                *lock(&self.inner.changes) = Changes::default();
                let sent = Instant::now();
                let call = self.inner.coord.register(req);
                let Some(answer) = self.unless_leader_changes(call).await else {
                    self.inner.reregister.notify_one(); // register with the new one at once
                    continue;
                };
                match answer {
                    Ok(r) => {
                        let nonce = r.nonce;
                        tracing::info!("registered with coordinator {nonce:016x}");
                        self.inner.nonce.store(nonce, Ordering::Release);
                        *lock(&self.inner.registered_at) = Some(Instant::now());
                        self.set_view(r.membership.as_ref(), true);
                        self.lease_renewed(sent);
                        self.prefetch_image(r.image_version);
                        // whatever was in flight with an earlier coordinator is sent again,
                        // once this node caught up with its quorums (no resend before)
                        lock(&self.inner.sent).clear();
                        self.inner.caught_up.store(false, Ordering::Release);
                        let registration =
                            self.inner.registrations.fetch_add(1, Ordering::AcqRel) + 1;
                        self.inner.subs_gen.fetch_add(1, Ordering::AcqRel);
                        let me = self.clone();
                        tokio::spawn(async move {
                            // a quorum that answers too slowly does not hold the outbox up
                            if !me.catch_up_and_report(registration).await {
                                tracing::warn!(
                                    "catching up took over {CATCH_UP_LIMIT:?}: going on without"
                                );
                                me.resume_deliveries(&HashSet::new());
                            }
                            me.inner.caught_up.store(true, Ordering::Release);
                            me.resend(Duration::ZERO).await
                        });
                    }
                    Err(e) if e.code() == tonic::Code::AlreadyExists => {
                        tracing::warn!("registering with the coordinator: {}", e.message());
                    }
                    Err(e) => tracing::debug!("registering with the coordinator: {e}"),
                }
                continue;
            }
            let changes = std::mem::take(&mut *lock(&self.inner.changes));
            let (caught_up_step, drained) = self.resize_report();
            let req = v1::HeartbeatRequest {
                node: self.inner.cfg.node,
                nonce: known,
                workers: self.worker_states(),
                started: changes.started.clone(),
                terminated: changes.terminated.clone(),
                caught_up_step,
                drained,
            };
            let sent = Instant::now();
            let call = self.inner.coord.heartbeat(req);
            let Some(answer) = self.unless_leader_changes(call).await else {
                let mut c = lock(&self.inner.changes);
                c.started.extend(changes.started);
                c.terminated.extend(changes.terminated);
                self.inner.reregister.notify_one(); // register with the new one at once
                continue;
            };
            match answer {
                Ok(r) if r.nonce == known => {
                    self.set_view(r.membership.as_ref(), false);
                    self.lease_renewed(sent);
                    self.prefetch_image(r.image_version);
                }
                Ok(r) => {
                    tracing::info!(
                        "coordinator changed ({known:016x} -> {:016x}): registering again",
                        r.nonce
                    );
                    self.inner.nonce.store(0, Ordering::Release);
                    self.inner.reregister.notify_one();
                }
                Err(e) => {
                    // keep the changes for the next heartbeat
                    let mut c = lock(&self.inner.changes);
                    c.started.extend(changes.started);
                    c.terminated.extend(changes.terminated);
                    tracing::debug!("heartbeat: {e}");
                }
            }
        }
    }
}
