//! After a failed attempt: backoff with jitter on tokio time, the attempt and TTL limits, and
//! dead letters with the reason.

use super::*;

/// How long a delivery that may not be pushed now ([`Hold::Wait`]) waits.
const POSTPONE_MS: u64 = 100;

/// How long a delivery of `s` may take from its put (its retry policy's TTL, or the default).
pub(super) fn ttl_ms(s: Option<&v1::Subscription>) -> u64 {
    s.and_then(|s| s.retry)
        .map(|r| r.ttl_ms)
        .filter(|t| *t > 0)
        .unwrap_or(DEFAULT_TTL_MS)
}

impl Deliverer {
    /// When `obj` was put (now, if it is gone).
    pub(super) fn born(&self, obj: ObjectId) -> u64 {
        self.inner
            .store
            .get(obj)
            .ok()
            .flatten()
            .map_or(self.now_ms(), |o| o.received_unix_ms)
    }

    /// Records a delivery's new state. Only the QoS 2 "received" phase must be durable
    /// before the next step (a lost one would deliver again); the others are written without
    /// waiting for a flush: after a crash an older state means one more attempt, which QoS 1
    /// allows and QoS 2's delivery id absorbs. An in-memory delivery (`in_memory`) writes
    /// nothing when acknowledged; any other state becomes its first record, durable before
    /// the object's outbox record may go. The answer: whether the state was recorded (a
    /// full disk refuses it; a QoS 2 delivery then sends no release).
    pub(super) fn finish(
        &self,
        sub: u64,
        obj: ObjectId,
        state: DeliveryState,
        in_memory: bool,
    ) -> impl Future<Output = bool> {
        let me = self.clone();
        async move {
            let acked = matches!(state, DeliveryState::Acked { .. });
            let durable = matches!(state, DeliveryState::Received { .. }) || in_memory;
            let r = if in_memory && acked {
                Ok(true)
            } else if durable {
                me.inner.store.set_delivery(sub, obj, &state).await
            } else {
                me.inner.store.set_delivery_unflushed(sub, obj, &state)
            };
            let open = matches!(
                state,
                DeliveryState::Pending { .. } | DeliveryState::Received { .. }
            );
            match r {
                Ok(false) => {
                    // another attempt moved the record on since this one read it: left as
                    // it is (never back to pending under a released QoS 2 delivery)
                    tracing::debug!(
                        "delivery {}: a stale {state:?} left the record where it stands",
                        delivery_id(sub, obj)
                    );
                    if in_memory {
                        me.release(obj);
                    }
                    true
                }
                Ok(true) => {
                    if open {
                        me.opened(sub, obj);
                    } else {
                        me.closed(sub, obj);
                    }
                    if in_memory {
                        me.release(obj);
                    }
                    true
                }
                // the object stays in the outbox: matched again at the next start
                Err(e) => {
                    // a failed store says so once and starts again in place (`reopen`)
                    if me.inner.store.sled_failed() {
                        tracing::debug!("recording delivery {}: {e}", delivery_id(sub, obj));
                    } else {
                        tracing::warn!("recording delivery {}: {e}", delivery_id(sub, obj));
                    }
                    false
                }
            }
        }
    }

    pub(super) async fn dead_letter(
        &self,
        sub: u64,
        obj: ObjectId,
        reason: String,
        in_memory: bool,
    ) {
        self.count(sub, 2);
        // looked up again if it left the cache: a spillover needs its name and tenant
        let s = match self.cached_subscription(sub) {
            Some(s) => s,
            None => self.subscription(sub).await.ok().flatten(),
        };
        let reason = self.spill_over(sub, s.as_deref().map(|s| &**s), obj, reason);
        tracing::info!("dead letter {}: {reason}", delivery_id(sub, obj));
        self.inner
            .figures
            .pushed(s.as_deref().map(|s| &**s), PushOutcome::DeadLetter, None);
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
                at_unix_ms: self.now_ms(),
            },
            in_memory,
        )
        .await;
    }

    /// Puts a delivery back for [`POSTPONE_MS`] without counting an attempt ([`Hold::Wait`]).
    pub(super) async fn postpone(&self, job: &Job, attempts: u32, received: bool) {
        let (sub, obj) = (job.sub, job.obj);
        let next_attempt_unix_ms = self.now_ms() + POSTPONE_MS;
        let state = if received {
            DeliveryState::Received {
                attempts,
                next_attempt_unix_ms,
            }
        } else {
            DeliveryState::Pending {
                attempts,
                next_attempt_unix_ms,
            }
        };
        let recorded = self.finish(sub, obj, state, job.in_memory).await;
        self.schedule_after(sub, obj, recorded, POSTPONE_MS);
    }

    /// Schedules (sub, obj) again. When its new state was not recorded (a full disk), the
    /// store still holds the old next attempt, which may be due already: the wait is kept
    /// here instead (else it ran again at once, about 90,000 times a second on a failed
    /// store).
    fn schedule_after(&self, sub: u64, obj: ObjectId, recorded: bool, wait_ms: u64) {
        let me = self.clone();
        tokio::spawn(async move {
            if !recorded {
                tokio::time::sleep(Duration::from_millis(wait_ms)).await;
            }
            me.schedule(sub, obj).await
        });
    }

    /// Records a failed attempt: retried after a backoff, or dead-lettered at the limits.
    pub(super) async fn retry_later(
        &self,
        job: &Job,
        attempts: u32,
        received: bool,
        s: Option<&v1::Subscription>,
        error: String,
        not_before: Duration,
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
        let ttl = ttl_ms(s);
        let initial = retry
            .map(|r| r.initial_backoff_ms)
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_INITIAL_BACKOFF_MS);
        let max_backoff = retry
            .map(|r| r.max_backoff_ms)
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_MAX_BACKOFF_MS);
        let born = self.born(obj);
        let now = self.now_ms();
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
        if let Some(deadline) = self.spill_deadline(obj).filter(|d| now >= *d) {
            self.dead_letter(
                sub,
                obj,
                format!(
                    "gave up after {attempts} attempts: the deadline of this delivery spilled \
                     over from a peer cluster passed {} ms ago: {error}",
                    now - deadline
                ),
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
        let jitter = runtime::random_u64() % (exp / 2 + 1);
        // the endpoint's Retry-After, when it sent one, is the earliest next attempt
        let next = now + (exp / 2 + jitter).max(not_before.as_millis() as u64);
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
        let recorded = self.finish(sub, obj, state, job.in_memory).await;
        self.schedule_after(sub, obj, recorded, next - now);
    }
}
