//! One sender per link: sends what the link is owed, in order, in batches, until the process
//! ends; retries with backoff while the peer is away. On an active-passive link it also
//! carries this node's epoch and finished-watermark, in every batch and, while nothing is
//! owed, in a heartbeat whenever the watermark moved (at most every 20 ms) or 200 ms passed;
//! it sends nothing while this node is a standby, and steps the node down when the peer
//! answers that it was promoted after it. A spillover link's entries are dead-lettered
//! deliveries.

use super::*;

/// How often an idle active-passive link looks at the watermark.
const WATERMARK_POLL: Duration = Duration::from_millis(20);
/// An idle active-passive link's heartbeat (the standby's sign of a live primary).
const HEARTBEAT: Duration = Duration::from_millis(200);

impl Federation {
    /// Sends what `this` link is owed, in order, until the link is removed or the process
    /// ends.
    pub(super) async fn sender(self, this: Arc<Link>) {
        let link = &this.cfg;
        let counters = &this.counters;
        let passive = matches!(link.mode, LinkMode::ActivePassive { .. });
        let spill = matches!(link.mode, LinkMode::Spillover { .. });
        let mut backoff = Duration::from_millis(100);
        let mut client = None;
        // the watermark last sent, and when anything last went out
        let mut sent_below = None;
        let mut sent_at = std::time::Instant::now();
        while !this.removed.load(Ordering::SeqCst) {
            let role = self.role();
            if passive && !role.active {
                // a standby owes its own standby nothing
                let _ = tokio::time::timeout(HEARTBEAT, self.inner.wake.notified()).await;
                continue;
            }
            // the watermark before the batch (what it covers finished before being read);
            // only an active-passive link carries one
            let finished_below = if passive {
                self.inner.store.finished_below()
            } else {
                0
            };
            let owed = match self.owed_batch(&link.name) {
                Ok(o) => o,
                Err(e) => {
                    tracing::error!("link {}: reading what is owed: {e}", link.name);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if owed.is_empty() {
                let due = passive
                    && (sent_below != Some(finished_below) || sent_at.elapsed() >= HEARTBEAT);
                if !due {
                    // woken by a put, or a look every half second (every 20 ms on an
                    // active-passive link, for its watermark)
                    let wait = if passive {
                        WATERMARK_POLL
                    } else {
                        Duration::from_millis(500)
                    };
                    let _ = tokio::time::timeout(wait, self.inner.wake.notified()).await;
                    continue;
                }
            }
            let entries: Vec<(u64, Option<ObjectId>)> =
                owed.iter().map(|e| (e.key, e.foreign)).collect();
            let seqs: Vec<u64> = owed.iter().map(|e| e.key).collect();
            let mut objects: Vec<v1::FederatedObject> = Vec::new();
            let mut spilled: Vec<v1::SpilledDelivery> = Vec::new();
            for e in &owed {
                let b = e.bytes.as_slice();
                let decoded = if spill {
                    v1::SpilledDelivery::decode(b).map(|d| spilled.push(d))
                } else {
                    v1::FederatedObject::decode(b).map(|o| objects.push(o))
                };
                // written by this node, so only a damaged store gets here: said, then dropped
                // with the batch's acknowledgement rather than blocking the link
                if let Err(err) = decoded {
                    tracing::error!("link {}: entry {} does not decode: {err}", link.name, e.key)
                }
            }
            let n = (objects.len() + spilled.len()) as u64;
            let req = v1::FederateRequest {
                from_cluster: self.inner.cfg.cluster.clone(),
                objects,
                spilled,
                standby: passive.then(|| v1::Standby {
                    epoch: role.epoch,
                    origin_node: self.inner.store.node(),
                    finished_below,
                }),
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
            sent_at = std::time::Instant::now();
            let sent = tokio::time::timeout(Duration::from_secs(10), c.replicate(req)).await;
            match sent {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    backoff = Duration::from_millis(100);
                    if r.superseded {
                        self.superseded(link, r.epoch).await;
                        continue;
                    }
                    sent_below = Some(finished_below);
                    if passive {
                        this.acked_below.fetch_max(finished_below, Ordering::SeqCst);
                        this.acked_at.store(runtime::now_ms(), Ordering::SeqCst);
                        self.note_standby_knows();
                    }
                    tracing::debug!(
                        "link {}: {} entries acknowledged ({} for other nodes' objects)",
                        link.name,
                        entries.len(),
                        entries.iter().filter(|(_, f)| f.is_some()).count()
                    );
                    if let Err(e) = self.inner.store.link_acked(&link.name, &entries) {
                        // a full disk: the peer holds them (a repeat is stored once there);
                        // sent again after a pause, not in a loop as fast as the peer answers
                        tracing::error!(
                            "link {}: noting what the peer acknowledged: {e}",
                            link.name
                        );
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                    if link.mode == LinkMode::AllActive {
                        // their copies end once no link owes them
                        let me = self.inner.store.node();
                        self.report_acked(owed.iter().map(|e| e.object(me)));
                    }
                    // what the standby holds copies of while it is unfinished here is the
                    // standby's to disseminate if this node comes back as a standby
                    if passive && let Err(e) = self.inner.store.note_copies(&seqs) {
                        tracing::error!("link {}: {e}", link.name);
                    }
                    counters.acked.fetch_add(n, Ordering::Relaxed);
                    counters
                        .duplicates
                        .fetch_add(u64::from(r.duplicates), Ordering::Relaxed);
                    if r.unclaimed > 0 {
                        counters
                            .unclaimed
                            .fetch_add(u64::from(r.unclaimed), Ordering::Relaxed);
                        tracing::warn!(
                            "link {}: {} spilled deliveries found no subscription of their \
                             tenant and name at the peer (dead letters here only)",
                            link.name,
                            r.unclaimed
                        );
                    }
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

    /// The next batch `link` is owed: at most [`BATCH`] entries, closed once past
    /// [`BATCH_BYTES`].
    fn owed_batch(&self, link: &str) -> Result<Vec<storage::LinkEntry>, storage::StorageError> {
        let mut o = self.inner.store.link_owed(link, BATCH)?;
        let mut bytes = 0;
        let keep = o
            .iter()
            .take_while(|e| {
                let first = bytes == 0;
                bytes += e.bytes.len();
                first || bytes <= BATCH_BYTES
            })
            .count();
        o.truncate(keep);
        Ok(o)
    }

    /// The peer of `link` was promoted after this node (at `epoch`): this node steps down to
    /// standby and drops what it still owed the peer (its own objects it disseminates
    /// itself; the peer took over the rest).
    async fn superseded(&self, link: &LinkConfig, epoch: u64) {
        let owed: Vec<(u64, Option<ObjectId>)> = self
            .inner
            .store
            .link_owed(&link.name, usize::MAX)
            .map(|v| v.into_iter().map(|e| (e.key, e.foreign)).collect())
            .unwrap_or_default();
        if let Err(e) = self.step_down(epoch).await {
            tracing::error!("link {}: stepping down: {e}", link.name);
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        if let Err(e) = self.inner.store.link_acked(&link.name, &owed) {
            tracing::error!("link {}: {e}", link.name);
        }
        tracing::warn!(
            "link {}: the peer was promoted at epoch {epoch}; this node is a standby now \
             ({} objects it still owed the peer are disseminated here only)",
            link.name,
            owed.len()
        );
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
