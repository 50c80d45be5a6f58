//! Federation between clusters, all-active (DESIGN §7, seed 003): every object a node ingests
//! is owed to each peer cluster this node links to (`--link`), and one sender per link sends
//! what is owed, in the order the node took it, in batches (`Federation.Replicate`, with the
//! link's token). What is owed is stored with the put, before it is acknowledged
//! (`storage::links`), and leaves only when the peer acknowledged it: it survives restarts of
//! either side and link outages, and goes out once the peer is back (at least once on the
//! wire). The peer stores each object under a message id made of its origin cluster and its
//! message id there (or its object id), so a repeat is stored once; and it never owes a
//! replicated object to its own links, so no topology (a triangle included) loops.
//!
//! Per link, `/metrics` shows what is owed, sent, acknowledged and deduplicated, and the lag
//! (the age of the oldest object owed). Links come from `--link` flags or the config file's
//! `[[federation.link]]` entries. Not built yet: active-passive, spillover, and
//! `dissem link add|list|remove`.

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
}

/// This cluster's name and its links.
#[derive(Debug, Clone)]
pub struct FederationConfig {
    /// Carried by every object this cluster sends (its origin).
    pub cluster: String,
    pub links: Vec<LinkConfig>,
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
}

struct Inner {
    cfg: FederationConfig,
    store: Store,
    wake: tokio::sync::Notify,
    counters: Vec<LinkCounters>,
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
            .field("links", &self.inner.cfg.links.len())
            .finish()
    }
}

impl Federation {
    pub fn new(cfg: FederationConfig, store: Store) -> Federation {
        let counters = cfg.links.iter().map(|_| LinkCounters::default()).collect();
        Federation {
            inner: Arc::new(Inner {
                cfg,
                store,
                wake: tokio::sync::Notify::new(),
                counters,
            }),
        }
    }

    /// This cluster's name.
    pub fn cluster(&self) -> &str {
        &self.inner.cfg.cluster
    }

    /// Whether any link is configured.
    pub fn has_links(&self) -> bool {
        !self.inner.cfg.links.is_empty()
    }

    /// The counters of each link, by name.
    pub fn counters(&self) -> impl Iterator<Item = (&str, &LinkCounters)> {
        self.inner
            .cfg
            .links
            .iter()
            .map(|l| l.name.as_str())
            .zip(self.inner.counters.iter())
    }

    /// How many objects `link` is owed now.
    pub fn owed(&self, link: &str) -> usize {
        self.inner.store.link_owed_len(link)
    }

    /// How far `link` is behind: the age of the oldest object it is owed (zero when it owes
    /// nothing).
    pub fn lag(&self, link: &str) -> Duration {
        let oldest = self
            .inner
            .store
            .link_owed(link, 1)
            .ok()
            .and_then(|v| v.into_iter().next())
            .and_then(|(_, b)| v1::FederatedObject::decode(b.as_slice()).ok());
        oldest.map_or(Duration::ZERO, |o| {
            Duration::from_millis(runtime::now_ms().saturating_sub(o.received_unix_ms))
        })
    }

    /// Writes the per-link families for `/metrics`.
    pub fn write_metrics(&self, o: &mut String) {
        use runtime::metrics::{escape, line};
        let per = |f: &dyn Fn(&str, &LinkCounters) -> f64| -> Vec<(String, f64)> {
            self.counters()
                .map(|(name, c)| (format!("link=\"{}\"", escape(name)), f(name, c)))
                .collect()
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        line(
            o,
            "dissem_link_owed",
            "Objects a federation link owes its peer cluster.",
            "gauge",
            &per(&|n, _| self.owed(n) as f64),
        );
        line(
            o,
            "dissem_link_sent_total",
            "Objects sent to the peer (a retried batch counts again).",
            "counter",
            &per(&|_, c| load(&c.sent)),
        );
        line(
            o,
            "dissem_link_acked_total",
            "Objects the peer acknowledged.",
            "counter",
            &per(&|_, c| load(&c.acked)),
        );
        line(
            o,
            "dissem_link_deduplicated_total",
            "Objects the peer had already (stored once).",
            "counter",
            &per(&|_, c| load(&c.duplicates)),
        );
        line(
            o,
            "dissem_link_lag_seconds",
            "Age of the oldest object the link owes (0 when it owes nothing).",
            "gauge",
            &per(&|n, _| self.lag(n).as_secs_f64()),
        );
    }

    /// Owes the object this node took as `id` to every link whose filter it passes; durable
    /// with the store's next commit (the caller's, before it acknowledges the put).
    pub fn owe(&self, id: ObjectId, obj: &NewObject) -> Result<(), ServiceError> {
        let event = Event {
            attrs: obj.metadata.clone(),
        };
        let mut bytes = None;
        for l in &self.inner.cfg.links {
            if l.filter.as_ref().is_some_and(|f| !f.eval(&event)) {
                continue;
            }
            let b = bytes.get_or_insert_with(|| {
                v1::FederatedObject {
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
                    received_unix_ms: runtime::now_ms(),
                }
                .encode_to_vec()
            });
            self.inner.store.link_owe(&l.name, id.seq, b)?;
        }
        Ok(())
    }

    /// Wakes the senders (something new is owed).
    pub fn wake(&self) {
        self.inner.wake.notify_waiters();
    }

    /// Starts one sender per link.
    pub fn spawn(&self) {
        for i in 0..self.inner.cfg.links.len() {
            tokio::spawn(self.clone().sender(i));
        }
    }

    /// Sends what link `i` is owed, in order, until the process ends.
    async fn sender(self, i: usize) {
        let link = &self.inner.cfg.links[i];
        let counters = &self.inner.counters[i];
        let mut backoff = Duration::from_millis(100);
        let mut client = None;
        loop {
            let owed = match self.inner.store.link_owed(&link.name, BATCH) {
                Ok(mut o) => {
                    let mut bytes = 0;
                    let keep = o
                        .iter()
                        .take_while(|(_, b)| {
                            let first = bytes == 0;
                            bytes += b.len();
                            first || bytes <= BATCH_BYTES
                        })
                        .count();
                    o.truncate(keep);
                    o
                }
                Err(e) => {
                    tracing::error!("link {}: reading what is owed: {e}", link.name);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if owed.is_empty() {
                // woken by a put, or a look every half second
                let woken = self.inner.wake.notified();
                let _ = tokio::time::timeout(Duration::from_millis(500), woken).await;
                continue;
            }
            let seqs: Vec<u64> = owed.iter().map(|(s, _)| *s).collect();
            let mut objects: Vec<v1::FederatedObject> = Vec::with_capacity(owed.len());
            for (seq, b) in &owed {
                match v1::FederatedObject::decode(b.as_slice()) {
                    Ok(o) => objects.push(o),
                    // written by this node, so only a damaged store gets here: said, then
                    // dropped with the batch's acknowledgement rather than blocking the link
                    Err(e) => {
                        tracing::error!("link {}: entry {seq} does not decode: {e}", link.name)
                    }
                }
            }
            let n = objects.len() as u64;
            let req = v1::FederateRequest {
                from_cluster: self.inner.cfg.cluster.clone(),
                objects,
            };
            let c = match &mut client {
                Some(c) => c,
                None => match connect(link) {
                    Ok(c) => client.insert(c),
                    Err(e) => {
                        tracing::warn!("link {}: {e}", link.name);
                        tokio::time::sleep(backoff).await;
                        continue;
                    }
                },
            };
            counters.sent.fetch_add(n, Ordering::Relaxed);
            let sent = tokio::time::timeout(Duration::from_secs(10), c.replicate(req)).await;
            match sent {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    if let Err(e) = self.inner.store.link_acked(&link.name, &seqs) {
                        tracing::error!("link {}: {e}", link.name);
                    }
                    counters.acked.fetch_add(n, Ordering::Relaxed);
                    counters
                        .duplicates
                        .fetch_add(u64::from(r.duplicates), Ordering::Relaxed);
                    backoff = Duration::from_millis(100);
                }
                other => {
                    let why = match other {
                        Ok(Err(s)) => s.to_string(),
                        _ => "no answer within 10 s".to_string(),
                    };
                    counters.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("link {} to {}: {why}; retried", link.name, link.url);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// Adds the link's bearer token to each call.
type Stamp = Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;

type Client = v1::federation_client::FederationClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Stamp>,
>;

fn connect(link: &LinkConfig) -> Result<Client, ServiceError> {
    let channel = runtime::channel(&link.url)?;
    let auth = match &link.token {
        Some(t) => Some(
            tonic::metadata::MetadataValue::try_from(format!("Bearer {t}"))
                .map_err(|_| ServiceError::invalid("--link", "the token is not header text"))?,
        ),
        None => None,
    };
    let stamp: Stamp = Box::new(move |mut r: tonic::Request<()>| {
        if let Some(a) = &auth {
            r.metadata_mut().insert("authorization", a.clone());
        }
        Ok(r)
    });
    Ok(v1::federation_client::FederationClient::with_interceptor(
        channel, stamp,
    ))
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
    let m = format!("fed:{}:{own}", o.origin_cluster);
    if m.len() <= max {
        m
    } else {
        format!("fed:{}", runtime::auth::sha256_hex(m.as_bytes()))
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
