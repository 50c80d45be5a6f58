//! Federation between clusters (DESIGN §7, seed 003). Every object a node ingests is owed to
//! each peer cluster this node links to (`--link`), and one sender per link (`sender`) sends
//! what is owed, in the order the node took it, in batches (`Federation.Replicate`, with the
//! link's token). What is owed is stored with the put, before it is acknowledged
//! (`storage::links`), and leaves only when the peer acknowledged it: it survives restarts of
//! either side and link outages, and goes out once the peer is back (at least once on the
//! wire).
//!
//! - **All-active** links: the peer stores each object under a message id made of its origin
//!   cluster and its message id there (or its object id), so a repeat is stored once, and
//!   disseminates it; it never owes a replicated object to its own links, so no topology (a
//!   triangle included) loops.
//! - **Active-passive** links (`standby`): the peer is a standby that keeps the copies, each
//!   with a time to live, without disseminating them; the primary's finished-watermark travels
//!   with the stream (every batch, and a heartbeat while idle) and the standby drops what the
//!   primary finished. Promoted (`dissem link promote`, or on its own once the primary has been
//!   silent for `--promote-after`), the standby disseminates what it keeps that has not
//!   expired. Epochs order promotions: a primary that meets a peer promoted after it steps
//!   down, and drops what it still owed that peer (it disseminates its own objects itself).
//!
//! - **Spillover** links (`spill`): a delivery that dead-letters here is owed to the peer,
//!   whose subscriptions of the same tenant and name get it, each within the link's ttl (by
//!   default half the subscription's delivery TTL); a spilled-in delivery that dead-letters
//!   there is never spilled again.
//!
//! Per link, `/metrics` shows what is owed, sent, acknowledged and deduplicated, and the lag
//! (the age of the oldest object owed). Links come from `--link` flags, the config file's
//! `[[federation.link]]` entries, or `dissem link add` at run time (`manage`, kept in the
//! store).

mod manage;
pub use manage::{MAX_LINK_TTL, link_from_request};
mod owed;
mod sender;
mod serve;
mod spill;
mod standby;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use blocks::{Dnf, Event};
use prost::Message;
use proto::v1;
use runtime::error::ServiceError;
use storage::{NewObject, ObjectId, Store};

/// Objects in one `Replicate` call at most.
pub const BATCH: usize = 512;
/// A batch closes once its objects pass this many bytes.
pub const BATCH_BYTES: usize = 32 << 20;
/// The longest cluster name.
pub const MAX_CLUSTER_NAME: usize = 64;

/// One link to a peer cluster.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// The link's name (letters, digits, `_ . -`; it keys what is owed).
    pub name: String,
    /// A node of the peer cluster, e.g. `http://10.1.0.5:7700`.
    pub url: String,
    /// The peer's token with the `federate` role, when the peer authenticates.
    pub token: Option<String>,
    /// Only objects this filter matches go (all without one).
    pub filter: Option<Dnf>,
    pub mode: LinkMode,
}

/// How a link replicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkMode {
    /// The peer disseminates every object it gets.
    AllActive,
    /// The peer is a standby: it keeps each copy for `ttl` without disseminating it, until it
    /// is promoted.
    ActivePassive { ttl: Duration },
    /// Only deliveries that dead-letter here go, to the peer's subscriptions of the same
    /// tenant and name, which have `ttl` to deliver them (`None`: half the subscription's
    /// delivery TTL).
    Spillover { ttl: Option<Duration> },
}

impl LinkMode {
    /// The mode's name in flags, the config file and `dissem link list`.
    pub fn name(&self) -> &'static str {
        match self {
            LinkMode::AllActive => "all-active",
            LinkMode::ActivePassive { .. } => "active-passive",
            LinkMode::Spillover { .. } => "spillover",
        }
    }

    /// The link's ttl setting in ms (0: none, or the spillover default).
    pub fn ttl_ms(&self) -> u64 {
        match self {
            LinkMode::ActivePassive { ttl } | LinkMode::Spillover { ttl: Some(ttl) } => {
                ttl.as_millis() as u64
            }
            _ => 0,
        }
    }
}

/// The standby's copy time to live when a link does not set one: 2 x a 30 s failover.
pub const DEFAULT_STANDBY_TTL: Duration = Duration::from_secs(60);

/// This cluster's name, its links, and its active-passive settings.
#[derive(Debug, Clone)]
pub struct FederationConfig {
    /// Carried by every object this cluster sends (its origin).
    pub cluster: String,
    pub links: Vec<LinkConfig>,
    /// Start as (or step down to) a standby (`--standby`); the role is kept in the store, so
    /// a standby stays one across restarts until it is promoted.
    pub standby: bool,
    /// A standby promotes itself once the primary, heard from since this process started,
    /// has been silent this long (`--promote-after`).
    pub promote_after: Option<Duration>,
}

/// Whether `s` is a usable cluster or link name: 1..=64 of letters, digits, `_ . -`.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_CLUSTER_NAME
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Per link: sent, acknowledged, and found duplicate by the peer.
#[derive(Debug, Default)]
pub struct LinkCounters {
    pub sent: AtomicU64,
    pub acked: AtomicU64,
    pub duplicates: AtomicU64,
    pub failures: AtomicU64,
    /// Spillover: deliveries no subscription of the peer took (no tenant and name match).
    pub unclaimed: AtomicU64,
}

/// One link as it runs: its settings and counters.
pub(crate) struct Link {
    pub(crate) cfg: LinkConfig,
    pub(crate) counters: LinkCounters,
    /// Added at run time (`dissem link add`, kept in the store), not from the flags.
    pub(crate) added: bool,
    /// Set once removed: its sender stops.
    pub(crate) removed: std::sync::atomic::AtomicBool,
    /// Active-passive: the finished-watermark the standby last acknowledged, and when (unix
    /// ms; 0: not since start).
    pub(crate) acked_below: AtomicU64,
    pub(crate) acked_at: AtomicU64,
}

impl Link {
    fn new(cfg: LinkConfig, added: bool) -> Arc<Link> {
        Arc::new(Link {
            cfg,
            counters: LinkCounters::default(),
            added,
            removed: Default::default(),
            acked_below: AtomicU64::new(0),
            acked_at: AtomicU64::new(0),
        })
    }
}

struct Inner {
    cfg: FederationConfig,
    store: Store,
    wake: tokio::sync::Notify,
    /// The links now: the flags' first, then those added at run time.
    links: std::sync::RwLock<Vec<Arc<Link>>>,
    role: std::sync::Mutex<Role>,
    /// The primary cluster this node last kept copies of: the only one whose promotion an
    /// active node steps down for.
    primary: std::sync::Mutex<String>,
    /// When a primary's stream last reached this node (unix ms; 0: not since start).
    primary_seen: AtomicU64,
    /// The finished-watermark every healthy standby acknowledged (QoS 2 deliveries wait for
    /// it: `standby`'s gate).
    standby_knows: tokio::sync::watch::Sender<u64>,
    /// Where the all-active links report the objects they acknowledged (the node daemon's
    /// finisher: copies of what a link owes outlive delivery).
    acked_to: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<ObjectId>>>,
}

/// This node's active-passive role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    pub active: bool,
    /// Grows by one with each promotion (of either side).
    pub epoch: u64,
    /// The highest epoch a primary's stream carried (a promotion goes above it).
    pub peer_epoch: u64,
}

/// A node's federation: what it owes its links, and their senders (cheap to clone).
#[derive(Clone)]
pub struct Federation {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Federation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Federation")
            .field("cluster", &self.inner.cfg.cluster)
            .field("links", &self.current().len())
            .finish()
    }
}

impl Federation {
    /// The federation of a node over `store`; its role is the store's (a fresh store is
    /// active at epoch 0), stepped down to standby when `cfg.standby` says so (durable with
    /// the store's next commit). A standby leaves its unfinished objects that the peer
    /// holds copies of to the peer: call this before the node's outbox is disseminated.
    pub fn new(cfg: FederationConfig, store: Store) -> Result<Federation, ServiceError> {
        let mut links: Vec<Arc<Link>> = cfg
            .links
            .iter()
            .map(|l| Link::new(l.clone(), false))
            .collect();
        for (name, bytes) in store.kept_links()? {
            if links.iter().any(|l| l.cfg.name == name) {
                tracing::warn!("link {name}: given by the flags too; the flags' settings apply");
                continue;
            }
            match manage::kept_link(&bytes) {
                Ok(l) => links.push(Link::new(l, true)),
                Err(e) => tracing::error!("link {name}, added earlier, is not usable: {e}"),
            }
        }
        let (mut active, epoch, primary) = store.federation_role()?;
        if cfg.standby && active {
            store.set_federation_role(false, epoch, &primary)?;
            active = false;
        }
        if !active {
            // the peer holds copies of these and disseminated them when it was promoted
            let handed = store.copied_unfinished()?;
            for id in &handed {
                store.retire(*id)?;
            }
            if !handed.is_empty() {
                tracing::warn!(
                    "a standby: {} unfinished objects the active peer holds copies of are \
                     left to it",
                    handed.len()
                );
            }
        }
        Ok(Federation {
            inner: Arc::new(Inner {
                cfg,
                store,
                wake: tokio::sync::Notify::new(),
                links: std::sync::RwLock::new(links),
                role: std::sync::Mutex::new(Role {
                    active,
                    epoch,
                    peer_epoch: 0,
                }),
                primary_seen: AtomicU64::new(0),
                standby_knows: tokio::sync::watch::Sender::new(0),
                acked_to: std::sync::Mutex::new(None),
                primary: std::sync::Mutex::new(primary),
            }),
        })
    }

    /// This cluster's name.
    pub fn cluster(&self) -> &str {
        &self.inner.cfg.cluster
    }

    /// Whether any link is configured.
    pub fn has_links(&self) -> bool {
        !self
            .inner
            .links
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// The links now.
    pub(crate) fn current(&self) -> Vec<Arc<Link>> {
        self.inner
            .links
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many objects `link` is owed now.
    pub fn owed(&self, link: &str) -> usize {
        self.inner.store.link_owed_len(link)
    }

    /// How far `link` is behind: the age of the oldest object it is owed (zero when it owes
    /// nothing).
    pub(crate) fn lag(&self, link: &Link) -> Duration {
        let spill = matches!(link.cfg.mode, LinkMode::Spillover { .. });
        let oldest = self
            .inner
            .store
            .link_owed(&link.cfg.name, 1)
            .ok()
            .and_then(|v| v.into_iter().next())
            .map(|e| e.bytes)
            .and_then(|b| {
                if spill {
                    v1::SpilledDelivery::decode(b.as_slice())
                        .ok()
                        .and_then(|d| d.object)
                } else {
                    v1::FederatedObject::decode(b.as_slice()).ok()
                }
            });
        oldest.map_or(Duration::ZERO, |o| {
            Duration::from_millis(runtime::now_ms().saturating_sub(o.received_unix_ms))
        })
    }

    /// Writes the per-link families, and this node's role, for `/metrics`.
    pub fn write_metrics(&self, o: &mut String) {
        use runtime::metrics::{escape, line};
        let links = self.current();
        let per = |f: &dyn Fn(&Link) -> f64| -> Vec<(String, f64)> {
            links
                .iter()
                .map(|l| (format!("link=\"{}\"", escape(&l.cfg.name)), f(l)))
                .collect()
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        line(
            o,
            "dissem_link_owed",
            "Objects a federation link owes its peer cluster.",
            "gauge",
            &per(&|l| self.owed(&l.cfg.name) as f64),
        );
        line(
            o,
            "dissem_link_sent_total",
            "Objects sent to the peer (a retried batch counts again).",
            "counter",
            &per(&|l| load(&l.counters.sent)),
        );
        line(
            o,
            "dissem_link_acked_total",
            "Objects the peer acknowledged.",
            "counter",
            &per(&|l| load(&l.counters.acked)),
        );
        line(
            o,
            "dissem_link_deduplicated_total",
            "Objects the peer had already (stored once).",
            "counter",
            &per(&|l| load(&l.counters.duplicates)),
        );
        line(
            o,
            "dissem_link_unclaimed_total",
            "Spillover: deliveries the peer had no subscription of their tenant and name for.",
            "counter",
            &per(&|l| load(&l.counters.unclaimed)),
        );
        line(
            o,
            "dissem_link_lag_seconds",
            "Age of the oldest object the link owes (0 when it owes nothing).",
            "gauge",
            &per(&|l| self.lag(l).as_secs_f64()),
        );
        let role = self.role();
        line(
            o,
            "dissem_federation_active",
            "1 when this node is active, 0 when it is an active-passive standby.",
            "gauge",
            &[(String::new(), f64::from(u8::from(role.active)))],
        );
        line(
            o,
            "dissem_federation_epoch",
            "This node's active-passive epoch (one more with each promotion).",
            "gauge",
            &[(String::new(), role.epoch as f64)],
        );
        line(
            o,
            "dissem_standby_copies",
            "Copies of a primary's objects this standby keeps.",
            "gauge",
            &[(String::new(), self.inner.store.standby_len() as f64)],
        );
    }

    /// Owes the object this node took as `id` to every link whose filter it passes (an
    /// active-passive link only while this node is active); durable with the store's next
    /// commit (the caller's, before it acknowledges the put).
    pub fn owe(&self, id: ObjectId, obj: &NewObject) -> Result<(), ServiceError> {
        let event = Event {
            attrs: obj.metadata.clone(),
        };
        let active = self.role().active;
        let now = runtime::now_ms();
        let mut object = None;
        // the last encoding, by expiry: links of one mode share it
        let mut encoded: Option<(u64, Vec<u8>)> = None;
        // every put comes here: the links are read in place, not copied
        let links = self.inner.links.read().unwrap_or_else(|p| p.into_inner());
        for link in links.iter() {
            let l = &link.cfg;
            if l.filter.as_ref().is_some_and(|f| !f.eval(&event)) {
                continue;
            }
            let expires_unix_ms = match l.mode {
                LinkMode::AllActive => 0,
                LinkMode::ActivePassive { .. } if !active => continue,
                LinkMode::ActivePassive { ttl } => now.saturating_add(ttl.as_millis() as u64),
                // a spillover link carries dead letters only (`Spill`)
                LinkMode::Spillover { .. } => continue,
            };
            let o = object.get_or_insert_with(|| v1::FederatedObject {
                origin_cluster: self.inner.cfg.cluster.clone(),
                origin_id: Some(v1::ObjectId {
                    node: id.node,
                    seq: id.seq,
                }),
                message_id: obj.message_id.clone(),
                data: obj.data.clone(),
                metadata: runtime::validate::attributes_to_proto(&obj.metadata),
                priority: u32::from(obj.priority),
                external_id: obj.external_id.clone(),
                received_unix_ms: now,
                expires_unix_ms: 0,
            });
            if encoded.as_ref().is_none_or(|(e, _)| *e != expires_unix_ms) {
                o.expires_unix_ms = expires_unix_ms;
                encoded = Some((expires_unix_ms, o.encode_to_vec()));
            }
            if let Some((_, bytes)) = &encoded {
                self.inner.store.link_owe(&l.name, id.seq, bytes)?;
            }
        }
        Ok(())
    }

    /// Wakes the senders (something new is owed).
    pub fn wake(&self) {
        self.inner.wake.notify_waiters();
    }

    /// Starts one sender per link.
    pub fn spawn(&self) {
        for l in self.current() {
            tokio::spawn(self.clone().sender(l));
        }
    }

    /// The links as `dissem link list` shows them (never a token).
    pub fn links(&self) -> v1::LinksResponse {
        let role = self.role();
        let links = self.current().iter().map(|l| self.info(l)).collect();
        v1::LinksResponse {
            cluster: self.inner.cfg.cluster.clone(),
            links,
            role: if role.active { "active" } else { "standby" }.into(),
            epoch: role.epoch,
            standby_copies: self.inner.store.standby_len() as u64,
            primary_seen_unix_ms: self.inner.primary_seen.load(Ordering::Relaxed),
        }
    }
}

impl Federation {
    /// How `dissem link list` shows a link (never its token).
    pub(crate) fn info(&self, link: &Link) -> v1::LinkInfo {
        let (l, c) = (&link.cfg, &link.counters);
        v1::LinkInfo {
            name: l.name.clone(),
            peer: l.url.clone(),
            mode: l.mode.name().into(),
            ttl_ms: l.mode.ttl_ms(),
            has_filter: l.filter.is_some(),
            has_token: l.token.is_some(),
            owed: self.owed(&l.name) as u64,
            sent: c.sent.load(Ordering::Relaxed),
            acked: c.acked.load(Ordering::Relaxed),
            deduplicated: c.duplicates.load(Ordering::Relaxed),
            lag_seconds: self.lag(link).as_secs_f64(),
            added: link.added,
            unclaimed: c.unclaimed.load(Ordering::Relaxed),
        }
    }
}

/// The message id a replicated object is stored under here: its origin cluster and its
/// message id there (or its object id), hashed when longer than a message id may be.
pub fn replicated_message_id(o: &v1::FederatedObject, max: usize) -> String {
    let id = o.origin_id.unwrap_or_default();
    let own = if o.message_id.is_empty() {
        format!("{}:{}", id.node, id.seq)
    } else {
        o.message_id.clone()
    };
    bounded_id("fed:", format!("fed:{}:{own}", o.origin_cluster), max)
}

/// `id` when it fits in `max` bytes, else `prefix` and its SHA-256 (stable, and still
/// under the reserved prefix).
pub(crate) fn bounded_id(prefix: &str, id: String, max: usize) -> String {
    if id.len() <= max {
        id
    } else {
        format!("{prefix}{}", runtime::auth::sha256_hex(id.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicated_message_ids_name_the_origin_and_stay_bounded() {
        let mut o = v1::FederatedObject {
            origin_cluster: "eu".into(),
            origin_id: Some(v1::ObjectId { node: 1, seq: 9 }),
            ..Default::default()
        };
        assert_eq!(replicated_message_id(&o, 256), "fed:eu:1:9");
        o.message_id = "m-1".into();
        assert_eq!(replicated_message_id(&o, 256), "fed:eu:m-1");
        o.message_id = "x".repeat(300);
        let long = replicated_message_id(&o, 256);
        assert!(long.len() <= 256 && long.starts_with("fed:"), "{long}");
        assert_eq!(long, replicated_message_id(&o, 256), "stable");
        assert!(valid_name("eu-west.1") && !valid_name("") && !valid_name("a b"));
    }
}
