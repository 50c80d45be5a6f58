//! A node's presence in etcd (`dissem node --etcd`): the key `live/<id>` under a lease of
//! the node's own, kept alive while the node runs, naming its endpoint and `owns_from`. A
//! newly elected coordinator reads it to know which nodes are up before they register with
//! it, so its first membership answers already hold them all (no node takes a live peer
//! for dead because the new leader had not heard of it yet). A node that dies leaves the
//! key to its lease. The record is signed with the cluster secret (a leader sends the
//! secret only to endpoints the secret signed).

use super::*;
use runtime::election::Signed;

/// The presence lease, in seconds (etcd's minimum is about 2).
const PRESENCE_TTL_S: i64 = 3;

impl Daemon {
    /// Keeps `live/<id>` in etcd while the node runs: a lease, the key, keep-alives three
    /// times per TTL; a lost lease (etcd restarted past it, a long pause) is taken anew.
    pub(super) async fn presence(self, etcd: runtime::etcd::Etcd) {
        let cfg = &self.inner.cfg;
        let record = runtime::election::NodeRecord {
            node: cfg.node,
            endpoint: cfg.endpoint.clone(),
            owns_from: self.inner.store.owns_from(),
            sig: String::new(),
        }
        .signed(&cfg.cluster_secret);
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let key = format!("{}{}", runtime::election::LIVE_PREFIX, cfg.node);
        let every = Duration::from_millis((PRESENCE_TTL_S as u64 * 1000) / 3);
        let mut lease = None;
        loop {
            let id = match lease {
                Some(id) => id,
                None => {
                    let granted = async {
                        let (id, _) = etcd.grant(PRESENCE_TTL_S).await?;
                        etcd.put(&key, value.clone(), id).await?;
                        Ok::<_, ServiceError>(id)
                    };
                    match granted.await {
                        Ok(id) => {
                            lease = Some(id);
                            id
                        }
                        Err(e) => {
                            tracing::debug!("announcing this node in etcd: {e}");
                            tokio::time::sleep(every).await;
                            continue;
                        }
                    }
                }
            };
            tokio::time::sleep(every).await;
            match etcd.keep_alive_once(id).await {
                Ok(ttl) if ttl > 0 => {}
                Ok(_) => lease = None, // gone: a fresh one, and the key again
                Err(e) => tracing::debug!("keeping this node's etcd lease: {e}"),
            }
        }
    }
}
