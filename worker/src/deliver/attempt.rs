//! One attempt at a batch of deliveries of one endpoint: read each record and its object,
//! build the delivery, push it by target kind, and settle the outcome in the record.

use super::*;

/// One attempt's inputs: the job, its subscription, the delivery to push and the record's
/// state before the attempt.
pub(super) struct Prepared {
    pub(super) job: Job,
    pub(super) s: Arc<Sub>,
    pub(super) delivery: v1::Delivery,
    pub(super) attempts: u32,
    pub(super) received: bool,
    pub(super) object: Arc<CachedObject>,
    /// When the attempt was ready to go out (its push duration runs from here).
    pub(super) started: Instant,
}

#[derive(Debug, Clone)]
pub(super) enum Outcome {
    Done,
    /// A stream with nobody attached (the stream's key): the delivery waits for one.
    Detached(String),
    /// QoS 2: received by the subscriber, release still owed.
    Received,
    /// Not pushed, or (QoS 2, `received`) not released: this node may not push it now
    /// ([`Hold`], asked again just before the `Deliver` and the `Release` go out), or the
    /// holders of the object's copies do not know yet that the subscriber has it received.
    /// Tried again shortly; no attempt counted (it is not the subscriber's fault).
    Postponed {
        received: bool,
    },
    /// The endpoint will never take it (a webhook's 4xx other than 408/429): dead-lettered
    /// now with the reason.
    Refused(String),
    /// The endpoint asked to be retried no sooner than `after` (`Retry-After`); counts as a
    /// failed attempt.
    Throttled {
        after: Duration,
        reason: String,
    },
}

impl Deliverer {
    /// One attempt of each job: gRPC QoS 0/1 deliveries to one URL go in one
    /// `DeliverBatch`, webhook events to one URL with one secret in one POST, the rest on
    /// their own; then each job's outcome is recorded.
    pub(super) async fn attempt(&self, jobs: Vec<Job>) {
        let mut grpc: HashMap<String, Vec<Prepared>> = HashMap::new();
        let mut hooks: HashMap<HookKey, Vec<Prepared>> = HashMap::new();
        let mut streams: HashMap<String, Vec<Prepared>> = HashMap::new();
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
                Some(v1::target::Kind::Webhook(url))
                    if self.webhook_batch_size(p.s.push_batch as usize) > 1 =>
                {
                    hooks.entry(HookKey::of(url, &p.s)).or_default().push(p);
                }
                Some(v1::target::Kind::Stream(name)) => {
                    let key = stream_key(&p.s.tenant, name);
                    streams.entry(key).or_default().push(p);
                }
                _ => single.push(p),
            }
        }
        // the usual call is one batch to one endpoint: made on this task, not a spawned one
        if grpc.len() + hooks.len() + streams.len() + single.len() == 1 {
            if let Some((url, ps)) = grpc.into_iter().next() {
                self.grpc_batch(&url, ps).await;
            } else if let Some((key, ps)) = hooks.into_iter().next() {
                self.webhook_batch(&key, ps).await;
            } else if let Some((key, ps)) = streams.into_iter().next() {
                self.stream_batch(&key, ps).await;
            } else if let Some(p) = single.pop() {
                self.push_one(p).await;
            }
            return;
        }
        let mut set = tokio::task::JoinSet::new();
        for (url, ps) in grpc {
            let me = self.clone();
            set.spawn(async move { me.grpc_batch(&url, ps).await });
        }
        for (key, ps) in hooks {
            let me = self.clone();
            set.spawn(async move { me.webhook_batch(&key, ps).await });
        }
        for (key, ps) in streams {
            let me = self.clone();
            set.spawn(async move { me.stream_batch(&key, ps).await });
        }
        for p in single {
            let me = self.clone();
            set.spawn(async move { me.push_one(p).await });
        }
        while set.join_next().await.is_some() {}
    }

    /// Pushes one delivery on its own (bounded by the attempt timeout) and settles it.
    async fn push_one(&self, mut p: Prepared) {
        let d = std::mem::take(&mut p.delivery);
        let push = self.push(&p.s, d, p.received, &p.object);
        let r = match tokio::time::timeout(self.inner.cfg.attempt_timeout, push).await {
            Ok(r) => r,
            Err(_) => Err(self.no_answer()),
        };
        self.settle(p, r).await;
    }

    /// Whether a delivery of `obj` to `s` may be pushed from memory, without a record: QoS 1,
    /// and QoS 0 of an object put since the node started (a repeated match drops it).
    pub(super) fn pushed_from_memory(&self, s: &Sub, obj: ObjectId) -> bool {
        match s.qos {
            v1::Qos::AtLeastOnce => true,
            v1::Qos::AtMostOnce => self.inner.store.put_since_open(obj),
            _ => false,
        }
    }

    pub(super) fn no_answer(&self) -> String {
        format!(
            "no answer within {} ms",
            self.inner.cfg.attempt_timeout.as_millis()
        )
    }

    /// Reads what an attempt needs: the record's state, the subscription and the object.
    /// `None` when there is nothing to push now (finished meanwhile, or dead-lettered or
    /// rescheduled here).
    /// `known` and `cached`: the subscription and object when the caller has them at hand.
    pub(super) async fn prepare(
        &self,
        job: Job,
        known: Option<Arc<Sub>>,
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
            other => {
                tracing::debug!(
                    "delivery {}: nothing to push ({other:?})",
                    delivery_id(sub, obj)
                );
                self.inner.counters.queued.fetch_sub(1, Ordering::Relaxed);
                return None;
            }
        };
        if let Some(deadline) = self.spill_deadline(obj).filter(|d| self.now_ms() >= *d) {
            let reason = format!(
                "the deadline of this delivery spilled over from a peer cluster passed after \
                 {attempts} attempts ({} ms ago)",
                self.now_ms() - deadline
            );
            self.dead_letter(sub, obj, reason, job.in_memory).await;
            return None;
        }
        let looked_up = match known {
            Some(s) => Ok(Some(s)),
            None => self.subscription(sub).await,
        };
        let s = match looked_up {
            Ok(Some(s)) if job.in_memory && !self.pushed_from_memory(&s, obj) => {
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
                self.retry_later(
                    &job,
                    attempts,
                    received,
                    None,
                    format!("{e}"),
                    Duration::ZERO,
                )
                .await;
                return None;
            }
        };
        let exactly_once = s.exactly_once();
        match self.hold(obj, exactly_once) {
            Hold::Go if exactly_once && !received => self.standby_knows(obj).await,
            Hold::Go => {}
            Hold::Wait => {
                self.postpone(&job, attempts, received).await;
                return None;
            }
            Hold::Handed => {
                // the node that took the object over delivers it
                tracing::debug!(
                    "delivery {}: the object is another node's now (or finished): closed here",
                    delivery_id(sub, obj)
                );
                self.inner.counters.queued.fetch_sub(1, Ordering::Relaxed);
                let done = DeliveryState::Acked {
                    at_unix_ms: self.now_ms(),
                };
                self.finish(sub, obj, done, job.in_memory).await;
                return None;
            }
        }
        let object = match cached.map_or_else(|| self.object(obj), |o| Ok(Some(o))) {
            Ok(Some(o)) => o,
            // lost at open (a damaged log tail) and not yet restored from its copies: it is
            // owed, not expired (dead-lettered, its delivery then ended the very copies the
            // repair restores it from: 3 acknowledged objects lost, `bench chaos` seeds
            // 14198 and 19037)
            Ok(None)
                if obj.node == self.inner.store.node()
                    && self.inner.store.awaits_repair(obj.seq) =>
            {
                self.retry_later(
                    &job,
                    attempts,
                    received,
                    Some(&s),
                    "the object is being restored from its copies".into(),
                    Duration::ZERO,
                )
                .await;
                return None;
            }
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
                self.retry_later(
                    &job,
                    attempts,
                    received,
                    Some(&s),
                    e.to_string(),
                    Duration::ZERO,
                )
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
            redelivered: attempts > 0 || self.inner.store.maybe_delivered_before(obj),
        };
        Some(Prepared {
            job,
            s,
            delivery,
            attempts,
            received,
            object,
            started: Instant::now(),
        })
    }

    /// Records the outcome of one attempt.
    pub(super) async fn settle(&self, p: Prepared, result: Result<Outcome, String>) {
        let (sub, obj) = (p.job.sub, p.job.obj);
        let took = Some(p.started.elapsed());
        match &result {
            Ok(Outcome::Done) => {
                let f = &self.inner.figures;
                f.pushed(Some(&p.s), PushOutcome::Acked, took);
                f.delivered(p.object.stored.received_unix_ms, runtime::now_ms());
                self.trace_push(&p, None);
            }
            Ok(Outcome::Received) => {
                let f = &self.inner.figures;
                f.pushed(Some(&p.s), PushOutcome::Failed, took);
                self.trace_push(&p, Some("received; the release failed".into()));
            }
            Ok(Outcome::Refused(why) | Outcome::Throttled { reason: why, .. }) | Err(why) => {
                let f = &self.inner.figures;
                f.pushed(Some(&p.s), PushOutcome::Failed, took);
                self.trace_push(&p, Some(why.clone()));
            }
            Ok(Outcome::Postponed { .. } | Outcome::Detached(_)) => {}
        }
        match result {
            Ok(Outcome::Done) => {
                self.count(sub, 0);
                self.inner.counters.acked.fetch_add(1, Ordering::Relaxed);
                self.inner.counters.queued.fetch_sub(1, Ordering::Relaxed);
                self.finish(
                    sub,
                    obj,
                    DeliveryState::Acked {
                        at_unix_ms: self.now_ms(),
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
                    Duration::ZERO,
                )
                .await;
            }
            Ok(Outcome::Postponed { received }) => {
                self.postpone(&p.job, p.attempts, received).await;
            }
            Ok(Outcome::Detached(stream)) => self.park(p, stream).await,
            Ok(Outcome::Refused(reason)) => self.failed(p, reason, None).await,
            Ok(Outcome::Throttled { after, reason }) => self.failed(p, reason, Some(after)).await,
            Err(e) => self.failed(p, e, Some(Duration::ZERO)).await,
        }
    }

    /// A failed attempt: dead-lettered at once when the endpoint refused it for good
    /// (`retry_after` `None`) or it was QoS 0's only attempt, else retried not before
    /// `retry_after`.
    pub(super) async fn failed(&self, p: Prepared, reason: String, retry_after: Option<Duration>) {
        let (sub, obj) = (p.job.sub, p.job.obj);
        let reason = match retry_after {
            Some(_) if p.s.qos == v1::Qos::AtMostOnce => {
                format!("QoS 0 (at most once): the only attempt failed: {reason}")
            }
            Some(after) => {
                self.retry_later(&p.job, p.attempts, p.received, Some(&p.s), reason, after)
                    .await;
                return;
            }
            None => reason,
        };
        self.count(sub, 1);
        self.inner.counters.failures.fetch_add(1, Ordering::Relaxed);
        self.dead_letter(sub, obj, reason, p.job.in_memory).await;
    }

    pub(super) async fn push(
        &self,
        s: &Sub,
        d: v1::Delivery,
        received: bool,
        object: &CachedObject,
    ) -> Result<Outcome, String> {
        let target = s
            .target
            .as_ref()
            .and_then(|t| t.kind.as_ref())
            .ok_or("the subscription has no target")?;
        let exactly_once = s.exactly_once();
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
                // a store whose flush failed (a full disk) may hold in memory a phase that
                // never reached its disk, and refuses every write: no QoS 2 step goes out
                // until the node starts again on what its disk holds (`reopen`). A release
                // sent on a "received" phase that lived only in memory, then a Deliver
                // again, showed the subscriber a duplicate (`bench chaos` seed 42046)
                if exactly_once && self.inner.store.sled_failed() {
                    return Ok(Outcome::Postponed { received });
                }
                // one attempt at a time per QoS 2 delivery, on the record as it stands now:
                // two attempts that both read it pending (a record queued twice, by a resume
                // and a repeated match) would each send the first phase, the second after the
                // first one's release, and the subscriber showed the delivery twice
                let _attempt = match (exactly_once, obj) {
                    (true, Some(o)) => match Attempting::take(self, sub, o) {
                        Some(a) => Some(a),
                        None => return Ok(Outcome::Postponed { received }),
                    },
                    _ => None,
                };
                let received = match (exactly_once, obj) {
                    (true, Some(o)) => match self.inner.store.delivery(sub, o) {
                        Ok(Some(DeliveryState::Pending { .. })) => received,
                        Ok(Some(DeliveryState::Received { .. })) => true,
                        // finished meanwhile by another attempt: its record says so
                        Ok(_) => return Ok(Outcome::Postponed { received }),
                        Err(e) => return Err(format!("reading delivery {id}: {e}")),
                    },
                    _ => received,
                };
                if !received {
                    // the lease may have lapsed since the attempt was prepared (a paused
                    // process): a QoS 2 delivery its heir may have released goes out never
                    if exactly_once
                        && let Some(obj) = obj
                        && self.hold(obj, true) != Hold::Go
                    {
                        return Ok(Outcome::Postponed { received: false });
                    }
                    if exactly_once {
                        tracing::debug!("QoS 2 Deliver {id} (attempt {})", d.attempt);
                    }
                    c.deliver(d).await.map_err(|e| format!("Deliver: {e}"))?;
                    if exactly_once && let Some(obj) = obj {
                        // "received" is durable before the release goes out (as MQTT's
                        // PUBREL state): after a crash only the release is repeated, never
                        // the delivery the subscriber may already have shown. Not stored
                        // (a full disk): no release; the retry delivers again under the
                        // same delivery id, which the subscriber's received phase absorbs
                        // (`bench chaos` seed 41068/41069: released unrecorded on a full
                        // disk, delivered again after a restart, 5 QoS 2 duplicates)
                        let recorded = self
                            .finish(
                                sub,
                                obj,
                                DeliveryState::Received {
                                    attempts,
                                    next_attempt_unix_ms: self.now_ms(),
                                },
                                false,
                            )
                            .await;
                        if !recorded {
                            return Err(format!(
                                "delivery {id}: its received phase could not be stored; no \
                                 release until it is"
                            ));
                        }
                    }
                }
                // the holders of the object's copies learn the phase first: a node that
                // takes the object over then only releases it
                if exactly_once
                    && let Some(obj) = obj
                    && !self.received_known(sub, obj).await
                {
                    tracing::debug!(
                        "delivery {id}: the received phase did not reach the object's holders yet"
                    );
                    return Ok(Outcome::Postponed { received: true });
                }
                // a Deliver that left before a pause may arrive after it: the release waits
                // until this node holds its lease again (and then finds whether its heir
                // delivered the object meanwhile)
                if exactly_once
                    && let Some(obj) = obj
                    && self.hold(obj, true) != Hold::Go
                {
                    return Ok(Outcome::Postponed { received: true });
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
                let event = event_json(object.event(), &d, node);
                let trace = object.event().trace_headers.as_slice();
                self.send_post(&HookKey::of(url, s), event, CLOUDEVENT, trace)
                    .await
            }
            v1::target::Kind::Stream(name) => self.to_stream(&stream_key(&s.tenant, name), d).await,
        }
    }
}

/// A QoS 2 delivery's attempt under way (released when dropped).
pub(super) struct Attempting {
    d: Deliverer,
    key: (u64, ObjectId),
}

impl Attempting {
    /// The attempt of (sub, obj), unless another is under way.
    pub(super) fn take(d: &Deliverer, sub: u64, obj: ObjectId) -> Option<Attempting> {
        lock(&d.inner.attempting)
            .insert((sub, obj))
            .then(|| Attempting {
                d: d.clone(),
                key: (sub, obj),
            })
    }
}

impl Drop for Attempting {
    fn drop(&mut self) {
        lock(&self.d.inner.attempting).remove(&self.key);
    }
}
