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
                    Ok(o) => objs.push(self.replicated_object(o)),
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
                tokio::spawn(d.deliverer().clone().forget_spilled());
            }
            f.spawn();
            if f.inner.cfg.promote_after.is_some() {
                tokio::spawn(self.clone().watch_primary());
            }
        }
    }
}
