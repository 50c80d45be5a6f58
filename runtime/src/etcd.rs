//! A small etcd v3 client over gRPC (the generated `proto::etcd` clients): what coordinator
//! election and the cluster's small metadata need, and nothing more. Reads, writes, a
//! create-if-absent transaction, leases with a keep-alive stream, and watches. Every unary
//! call has a deadline; the streams have none (they live as long as their owner wants), and
//! their owners notice a dead stream as its end.
//!
//! All keys live under one prefix (`--etcd-prefix`, default `/dissem/`), so several
//! clusters can share an etcd.

use std::time::Duration;

use proto::etcd;
use proto::etcd::kv_client::KvClient;
use proto::etcd::lease_client::LeaseClient;
use proto::etcd::watch_client::WatchClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::ServiceError;

/// How long one unary etcd call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest key prefix accepted (a flag).
const MAX_PREFIX: usize = 256;

pub use proto::etcd::KeyValue;

/// A connection to an etcd cluster (cheap to clone).
#[derive(Clone)]
pub struct Etcd {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    watch: WatchClient<Channel>,
    prefix: String,
    urls: String,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("urls", &self.urls)
            .field("prefix", &self.prefix)
            .finish()
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Unavailable(format!("etcd {what}: {e}"))
}

/// The end of the range of every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// A transaction's test: `target` of `key` equals `value`.
fn equal(
    target: etcd::compare::CompareTarget,
    key: &[u8],
    value: etcd::compare::TargetUnion,
) -> etcd::Compare {
    etcd::Compare {
        result: etcd::compare::CompareResult::Equal as i32,
        target: target as i32,
        key: key.to_vec(),
        target_union: Some(value),
    }
}

impl Etcd {
    /// A lazily connected client of the etcd members at `urls` (comma-separated
    /// `http://host:port`; calls are spread over them and skip members that are down),
    /// keeping its keys under `prefix`.
    pub fn connect(urls: &str, prefix: &str) -> Result<Etcd, ServiceError> {
        if prefix.len() > MAX_PREFIX || !prefix.starts_with('/') {
            return Err(ServiceError::invalid(
                "etcd-prefix",
                format!("must start with '/' and be at most {MAX_PREFIX} bytes"),
            ));
        }
        let mut endpoints = Vec::new();
        for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let e = Endpoint::from_shared(url.to_string())
                .map_err(|e| ServiceError::invalid("etcd", format!("{url:?}: {e}")))?
                .connect_timeout(Duration::from_secs(1))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(1))
                .keep_alive_timeout(Duration::from_secs(2));
            endpoints.push(e);
        }
        let channel = match endpoints.len() {
            0 => return Err(ServiceError::invalid("etcd", "no URL given")),
            1 => endpoints.remove(0).connect_lazy(),
            _ => Channel::balance_list(endpoints.into_iter()),
        };
        Ok(Etcd {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            watch: WatchClient::new(channel),
            prefix: prefix.to_string(),
            urls: urls.to_string(),
        })
    }

    /// The full key of `name` under this client's prefix.
    pub fn key(&self, name: &str) -> Vec<u8> {
        format!("{}{name}", self.prefix).into_bytes()
    }

    async fn timed<T>(
        what: &str,
        f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ServiceError> {
        match tokio::time::timeout(CALL_TIMEOUT, f).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(unavailable(what, s.message())),
            Err(_) => Err(unavailable(
                what,
                format!("no answer within {CALL_TIMEOUT:?}"),
            )),
        }
    }

    /// The key `name`, if it exists.
    pub async fn get(&self, name: &str) -> Result<Option<KeyValue>, ServiceError> {
        let r = Self::timed(
            "range",
            self.kv.clone().range(etcd::RangeRequest {
                key: self.key(name),
                ..Default::default()
            }),
        )
        .await?;
        Ok(r.kvs.into_iter().next())
    }

    /// Every key that starts with `name`, in key order.
    pub async fn get_prefix(&self, name: &str) -> Result<Vec<KeyValue>, ServiceError> {
        let key = self.key(name);
        let r = Self::timed(
            "range",
            self.kv.clone().range(etcd::RangeRequest {
                range_end: prefix_end(&key),
                key,
                ..Default::default()
            }),
        )
        .await?;
        Ok(r.kvs)
    }

    /// Writes `name` (attached to `lease` unless 0); the answer is the store's revision.
    pub async fn put(&self, name: &str, value: Vec<u8>, lease: i64) -> Result<i64, ServiceError> {
        let r = Self::timed(
            "put",
            self.kv.clone().put(etcd::PutRequest {
                key: self.key(name),
                value,
                lease,
            }),
        )
        .await?;
        Ok(r.header.map_or(0, |h| h.revision))
    }

    /// Writes `name` only if `lease` still holds it (it was created under that lease);
    /// `false`: someone else's key, or none.
    pub async fn put_if_held(
        &self,
        name: &str,
        value: Vec<u8>,
        lease: i64,
    ) -> Result<bool, ServiceError> {
        let key = self.key(name);
        let held = equal(
            etcd::compare::CompareTarget::Lease,
            &key,
            etcd::compare::TargetUnion::Lease(lease),
        );
        let r = self.put_if(held, key, value, lease, vec![]).await?;
        Ok(r.succeeded)
    }

    /// Creates `name` with `value` under `lease` if no such key exists: `Ok(revision)` of the
    /// creation, or `Err(the key that exists)`.
    pub async fn create(
        &self,
        name: &str,
        value: Vec<u8>,
        lease: i64,
    ) -> Result<Result<i64, KeyValue>, ServiceError> {
        let key = self.key(name);
        let absent = equal(
            etcd::compare::CompareTarget::Create,
            &key,
            etcd::compare::TargetUnion::CreateRevision(0),
        );
        let read = etcd::RequestOp {
            request: Some(etcd::request_op::Request::RequestRange(
                etcd::RangeRequest {
                    key: key.clone(),
                    ..Default::default()
                },
            )),
        };
        let r = self.put_if(absent, key, value, lease, vec![read]).await?;
        if r.succeeded {
            return Ok(Ok(r.header.map_or(0, |h| h.revision)));
        }
        let holder = r.responses.into_iter().find_map(|op| match op.response {
            Some(etcd::response_op::Response::ResponseRange(rr)) => rr.kvs.into_iter().next(),
            _ => None,
        });
        match holder {
            Some(kv) => Ok(Err(kv)),
            // it was deleted between the compare and the range: try again
            None => Err(unavailable("txn", "the key vanished; try again")),
        }
    }

    /// Puts `key` if `compare` holds, else runs `failure`.
    async fn put_if(
        &self,
        compare: etcd::Compare,
        key: Vec<u8>,
        value: Vec<u8>,
        lease: i64,
        failure: Vec<etcd::RequestOp>,
    ) -> Result<etcd::TxnResponse, ServiceError> {
        let put = etcd::RequestOp {
            request: Some(etcd::request_op::Request::RequestPut(etcd::PutRequest {
                key,
                value,
                lease,
            })),
        };
        Self::timed(
            "txn",
            self.kv.clone().txn(etcd::TxnRequest {
                compare: vec![compare],
                success: vec![put],
                failure,
            }),
        )
        .await
    }

    /// Deletes `name`.
    pub async fn delete(&self, name: &str) -> Result<(), ServiceError> {
        Self::timed(
            "delete",
            self.kv.clone().delete_range(etcd::DeleteRangeRequest {
                key: self.key(name),
                ..Default::default()
            }),
        )
        .await?;
        Ok(())
    }

    /// A new lease of `ttl_s` seconds (etcd may raise it to its minimum).
    pub async fn grant(&self, ttl_s: i64) -> Result<(i64, i64), ServiceError> {
        let r = Self::timed(
            "lease grant",
            self.lease
                .clone()
                .lease_grant(etcd::LeaseGrantRequest { ttl: ttl_s, id: 0 }),
        )
        .await?;
        if !r.error.is_empty() {
            return Err(unavailable("lease grant", r.error));
        }
        Ok((r.id, r.ttl))
    }

    /// Ends a lease now: every key attached to it is deleted.
    pub async fn revoke(&self, id: i64) -> Result<(), ServiceError> {
        Self::timed(
            "lease revoke",
            self.lease
                .clone()
                .lease_revoke(etcd::LeaseRevokeRequest { id }),
        )
        .await?;
        Ok(())
    }

    /// Renews `id` once: the lease's new TTL in seconds (0 or less: it is gone).
    pub async fn keep_alive_once(&self, id: i64) -> Result<i64, ServiceError> {
        let (tx, rx) = mpsc::channel(1);
        tx.send(etcd::LeaseKeepAliveRequest { id })
            .await
            .map_err(|e| unavailable("keep-alive", e))?;
        let call = async {
            let mut s = self
                .lease
                .clone()
                .lease_keep_alive(ReceiverStream::new(rx))
                .await?
                .into_inner();
            s.message().await
        };
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(Some(r))) => Ok(r.ttl),
            Ok(Ok(None)) => Err(unavailable("keep-alive", "the stream ended")),
            Ok(Err(s)) => Err(unavailable("keep-alive", s.message())),
            Err(_) => Err(unavailable(
                "keep-alive",
                format!("no answer within {CALL_TIMEOUT:?}"),
            )),
        }
    }

    /// Watches `name` (every key under it when `prefix`) from `start_revision` on (0: from
    /// now). The stream ends when etcd goes away; the watcher then reads again and watches
    /// anew.
    pub async fn watch(
        &self,
        name: &str,
        prefix: bool,
        start_revision: i64,
    ) -> Result<Watcher, ServiceError> {
        let key = self.key(name);
        let range_end = if prefix { prefix_end(&key) } else { vec![] };
        let (tx, rx) = mpsc::channel(1);
        tx.send(etcd::WatchRequest {
            request_union: Some(etcd::watch_request::RequestUnion::CreateRequest(
                etcd::WatchCreateRequest {
                    key,
                    range_end,
                    start_revision,
                    progress_notify: true,
                },
            )),
        })
        .await
        .map_err(|e| unavailable("watch", e))?;
        let stream =
            Self::timed("watch", self.watch.clone().watch(ReceiverStream::new(rx))).await?;
        Ok(Watcher {
            _requests: tx,
            stream,
        })
    }
}

/// An open watch: its events, until etcd goes away.
#[derive(Debug)]
pub struct Watcher {
    /// Keeps the request side open (etcd ends the watch when it closes).
    _requests: mpsc::Sender<etcd::WatchRequest>,
    stream: tonic::Streaming<etcd::WatchResponse>,
}

/// One change a watch saw.
#[derive(Debug, Clone)]
pub enum Change {
    Put(KeyValue),
    /// The key that was deleted (or whose lease ran out).
    Delete(Vec<u8>),
}

impl Watcher {
    /// The next batch of changes (empty for etcd's progress notices); `None`: the watch is
    /// over (etcd went away or cancelled it).
    pub async fn next(&mut self) -> Option<Vec<Change>> {
        loop {
            let r = self.stream.message().await.ok().flatten()?;
            if r.canceled {
                return None;
            }
            if r.created && r.events.is_empty() {
                continue;
            }
            return Some(
                r.events
                    .into_iter()
                    .filter_map(|e| {
                        let kv = e.kv?;
                        Some(if e.r#type == etcd::event::EventType::Delete as i32 {
                            Change::Delete(kv.key)
                        } else {
                            Change::Put(kv)
                        })
                    })
                    .collect(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end(b"/dissem/"), b"/dissem0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn a_prefix_must_be_absolute_and_short() {
        assert!(Etcd::connect("http://127.0.0.1:1", "dissem/").is_err());
        assert!(Etcd::connect("http://127.0.0.1:1", &format!("/{}", "x".repeat(300))).is_err());
        assert!(Etcd::connect("", "/dissem/").is_err());
    }
}
