//! The active-passive role of a node: active (it disseminates and, on active-passive links,
//! sends standby copies) or a standby (it keeps a primary's copies without disseminating
//! them). Epochs order the promotions: each promotion takes an epoch above every one this
//! node has seen, so of two sides that both believe they are active the later promotion
//! wins and the other steps down. A promotion disseminates the copies that have not expired
//! (the primary's finished-watermark already dropped the ones it finished).

use super::*;
use crate::services::Node;

/// What a standby stream from a primary meets here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Meets {
    /// A standby (or an active node that stepped down to one): the copies are kept.
    Standby,
    /// This node was promoted after the sender (at this epoch): nothing is kept.
    Superseded(u64),
    /// Both sides are active at the same epoch: a configuration error.
    BothActive(u64),
}

/// How often a standby with `--promote-after` looks at its primary's silence.
const WATCH: Duration = Duration::from_millis(100);

impl Federation {
    /// This node's role now.
    pub fn role(&self) -> Role {
        *self.inner.role.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_role(&self, role: Role) {
        *self.inner.role.lock().unwrap_or_else(|p| p.into_inner()) = role;
    }

    /// The primary cluster this node last kept copies of ("" when none).
    fn primary(&self) -> String {
        self.inner
            .primary
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Steps this node down to standby at `epoch` (a peer's promotion), durably.
    pub(super) async fn step_down(&self, epoch: u64) -> Result<(), ServiceError> {
        let mut role = self.role();
        role.active = false;
        role.epoch = role.epoch.max(epoch);
        role.peer_epoch = role.peer_epoch.max(epoch);
        self.inner
            .store
            .set_federation_role(false, role.epoch, &self.primary())?;
        self.inner.store.commit().await?;
        self.set_role(role);
        Ok(())
    }

    /// A primary's stream from cluster `from` at `epoch` arrived: what it meets here. An
    /// active node at a lower epoch steps down, if `from` is the primary it once kept copies
    /// of (the sender was promoted after it); any other cluster cannot make it step down.
    pub(crate) async fn meet_primary(&self, from: &str, epoch: u64) -> Result<Meets, ServiceError> {
        let role = self.role();
        if role.active {
            if epoch < role.epoch {
                return Ok(Meets::Superseded(role.epoch));
            }
            if epoch == role.epoch {
                return Ok(Meets::BothActive(epoch));
            }
            if self.primary() != from {
                return Err(ServiceError::FailedPrecondition(format!(
                    "this cluster is active at epoch {} and was never a standby of {from:?}: \
                     it steps down only for the primary it took over from",
                    role.epoch
                )));
            }
            tracing::warn!(
                "{from:?}, promoted at epoch {epoch}, reached this node (active at epoch {}): \
                 it steps down to standby",
                role.epoch
            );
            self.step_down(epoch).await?;
        } else {
            if self.primary() != from {
                self.inner
                    .store
                    .set_federation_role(false, role.epoch, from)?;
                *self.inner.primary.lock().unwrap_or_else(|p| p.into_inner()) = from.to_string();
            }
            if epoch > role.peer_epoch {
                let mut r = role;
                r.peer_epoch = epoch;
                self.set_role(r);
            }
        }
        self.inner
            .primary_seen
            .store(runtime::now_ms(), Ordering::Relaxed);
        Ok(Meets::Standby)
    }

    /// Makes this node active at an epoch above every one it has seen (durably); returns the
    /// epoch. An active node keeps its epoch.
    pub(crate) async fn become_active(&self) -> Result<u64, ServiceError> {
        let mut role = self.role();
        if role.active {
            return Ok(role.epoch);
        }
        role.active = true;
        role.epoch = role.epoch.max(role.peer_epoch) + 1;
        self.inner
            .store
            .set_federation_role(true, role.epoch, &self.primary())?;
        self.inner.store.commit().await?;
        self.set_role(role);
        self.wake();
        Ok(role.epoch)
    }

    /// How long the primary has been silent, once that is `--promote-after` or more (`None`
    /// before, when active, or when no primary was heard from since start).
    fn silence(&self) -> Option<Duration> {
        let after = self.inner.cfg.promote_after?;
        let seen = self.inner.primary_seen.load(Ordering::Relaxed);
        if seen == 0 || self.role().active {
            return None;
        }
        let quiet = Duration::from_millis(runtime::now_ms().saturating_sub(seen));
        (quiet >= after).then_some(quiet)
    }
}

impl Node {
    /// Promotes this node: active at a new epoch, then the standby copies not expired are
    /// disseminated (stored as objects of their origin, so a repeat is stored once) and the
    /// expired ones dropped. Idempotent: an active node disseminates what copies remain.
    pub async fn promote(&self) -> Result<v1::PromoteResponse, ServiceError> {
        let f = self.federation_settings()?;
        let epoch = f.become_active().await?;
        let store = &f.inner.store;
        let mut disseminated = 0u64;
        loop {
            let now = runtime::now_ms();
            let live = store.standby_live(now, BATCH)?;
            if live.is_empty() {
                break;
            }
            let mut keys = Vec::with_capacity(live.len());
            let mut objs = Vec::with_capacity(live.len());
            for (k, b) in live {
                keys.push(k);
                match v1::FederatedObject::decode(b.as_slice()) {
                    Ok(o) => objs.push(self.taken_over_object(o)),
                    Err(e) => tracing::error!("a standby copy does not decode: {e}"),
                }
            }
            for r in self.store_objects(objs, false).await {
                match r {
                    Ok(p) if !p.duplicate => disseminated += 1,
                    Ok(_) => {}
                    // bad copies are dropped, saying why; a storage failure stops here and the
                    // copies stay for the next promote
                    Err(ServiceError::InvalidArgument { field, reason }) => {
                        tracing::error!("a standby copy is not a valid object: {field}: {reason}")
                    }
                    Err(e) => return Err(e),
                }
            }
            store.standby_remove(&keys)?;
        }
        let expired = store.standby_expire(runtime::now_ms())? as u64;
        store.commit().await?;
        tracing::warn!(
            "promoted at epoch {epoch}: {disseminated} standby copies disseminated, {expired} \
             expired"
        );
        Ok(v1::PromoteResponse {
            epoch,
            disseminated,
            expired,
        })
    }

    /// A primary's copy as this node disseminates it once promoted: under the writer's own
    /// message id when it had one (this cluster now stands for the primary, and a writer
    /// that failed over resends with that id: stored once), else under its origin's.
    fn taken_over_object(
        &self,
        o: v1::FederatedObject,
    ) -> Result<storage::NewObject, ServiceError> {
        let own = o.message_id.clone();
        let mut n = self.replicated_object(o)?;
        if !own.is_empty() && own.len() <= self.limits.max_message_id_bytes {
            n.message_id = own;
        }
        Ok(n)
    }

    /// With `--promote-after`: promotes this standby once its primary has been silent that
    /// long. Runs until the task is dropped.
    pub async fn watch_primary(self) {
        let Some(f) = self.federation.clone() else {
            return;
        };
        let mut tick = tokio::time::interval(WATCH);
        loop {
            tick.tick().await;
            if let Some(quiet) = f.silence() {
                tracing::warn!(
                    "the primary has been silent for {} ms: promoting this standby",
                    quiet.as_millis()
                );
                if let Err(e) = self.promote().await {
                    tracing::error!("promoting: {e}");
                }
            }
        }
    }

    /// Starts the federation's senders, hands dead letters to the spillover links (when
    /// there are any), and, with `--promote-after`, the primary's watch.
    pub fn start_federation(&self) {
        if let Some(f) = &self.federation {
            if let crate::services::Sink::Cluster(d) = &self.sink {
                // spillover links may also be added later
                d.deliverer().on_dead_letter(std::sync::Arc::new(f.clone()));
                d.deliverer().on_standby(std::sync::Arc::new(f.clone()));
                // copies of what an all-active link owes outlive delivery
                f.keep_copies_for_links(d);
                tokio::spawn(d.deliverer().clone().forget_spilled());
            }
            f.spawn();
            if f.inner.cfg.promote_after.is_some() {
                tokio::spawn(self.clone().watch_primary());
            }
        }
    }
}

/// How long after its last acknowledgement a standby counts as healthy (a QoS 2 delivery
/// waits for a healthy standby only).
const STANDBY_HEALTHY_MS: u64 = 1000;
/// The longest a QoS 2 delivery waits for the standby to learn its object finished.
const STANDBY_WAIT: Duration = Duration::from_secs(1);

impl Federation {
    /// The finished-watermark every healthy standby acknowledged (`None`: no healthy one).
    fn healthy_standby_watermark(&self) -> Option<u64> {
        let now = runtime::now_ms();
        self.current()
            .iter()
            .filter(|l| matches!(l.cfg.mode, LinkMode::ActivePassive { .. }))
            .filter(|l| now.saturating_sub(l.acked_at.load(Ordering::SeqCst)) < STANDBY_HEALTHY_MS)
            .map(|l| l.acked_below.load(Ordering::SeqCst))
            .min()
    }

    /// Tells waiting QoS 2 deliveries how far the standbys know this node finished.
    pub(super) fn note_standby_knows(&self) {
        if let Some(w) = self.healthy_standby_watermark() {
            self.inner.standby_knows.send_if_modified(|v| {
                let up = w > *v;
                if up {
                    *v = w;
                }
                up
            });
        }
    }
}

/// A QoS 2 delivery of this node's object waits until every healthy standby knows the object
/// finished here (its watermark passed it): a standby promoted after this node dies then
/// never delivers it again. Without a healthy standby (none, or silent for a second) it
/// does not wait, and it waits at most [`STANDBY_WAIT`].
#[tonic::async_trait]
impl crate::deliver::StandbyGate for Federation {
    async fn known_to_standby(&self, obj: ObjectId) {
        if !self.role().active || self.healthy_standby_watermark().is_none() {
            return;
        }
        let mut rx = self.inner.standby_knows.subscribe();
        let _ = tokio::time::timeout(STANDBY_WAIT, rx.wait_for(|w| *w > obj.seq)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliver::StandbyGate;

    /// A QoS 2 delivery waits for a healthy standby to learn that its object finished, and
    /// does not wait for a silent one.
    #[tokio::test]
    async fn a_delivery_waits_for_a_healthy_standby_only() {
        let dir = std::env::temp_dir().join(format!("dissem-gate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir, 1).expect("store");
        let link = LinkConfig {
            name: "dr".into(),
            url: "http://127.0.0.1:1".into(),
            token: None,
            filter: None,
            mode: LinkMode::ActivePassive {
                ttl: Duration::from_secs(60),
            },
        };
        let cfg = FederationConfig {
            cluster: "p".into(),
            links: vec![link],
            standby: false,
            promote_after: None,
        };
        let f = Federation::new(cfg, store).expect("federation");
        let obj = ObjectId { node: 1, seq: 5 };
        let quick = |f: Federation| async move {
            tokio::time::timeout(Duration::from_millis(50), f.known_to_standby(obj))
                .await
                .is_ok()
        };
        assert!(quick(f.clone()).await, "no standby heard from: no wait");
        let dr = f.current()[0].clone();
        let acked = |below: u64| {
            dr.acked_below.fetch_max(below, Ordering::SeqCst);
            dr.acked_at.store(runtime::now_ms(), Ordering::SeqCst);
            f.note_standby_knows();
        };
        acked(3);
        assert!(!quick(f.clone()).await, "the standby knows only below 3");
        let waiting = tokio::spawn({
            let f = f.clone();
            async move { f.known_to_standby(obj).await }
        });
        // the waiting task runs up to its wait (one thread: it runs when this one yields)
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "it waits for the standby");
        acked(6);
        tokio::time::timeout(Duration::from_millis(500), waiting)
            .await
            .expect("released once the standby knows")
            .expect("task");
        // silent for over a second: not waited for
        dr.acked_at
            .store(runtime::now_ms() - 2000, Ordering::SeqCst);
        assert!(quick(f.clone()).await, "a silent standby is not waited for");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
