//! A small etcd v3 client over gRPC (the generated `proto::etcd` clients): what coordinator
//! election and the cluster's small metadata need, and nothing more. Reads, writes, a
//! create-if-absent transaction, leases with a keep-alive stream, and watches. Every unary
//! call has a deadline; the streams have none (they live as long as their owner wants), and
//! their owners notice a dead stream as its end.
//!
//! All keys live under one prefix (`--etcd-prefix`, default `/dissem/`), so several
//! clusters can share an etcd.
//!
//! Trust ([`EtcdSecurity`]): `https://` members are reached over TLS, verified against
//! `--etcd-ca` and presenting this process's certificate (`--etcd-cert`, `--etcd-key`) to an
//! etcd that demands client certificates; with `--etcd-user` the client authenticates
//! (etcd's user auth) and sends the token with every call. A call refused for its token
//! (expired, or etcd restarted) gets a fresh one and fails as unavailable, which every
//! caller already retries.

use std::time::Duration;

use std::sync::{Arc, RwLock};

use proto::etcd;
use proto::etcd::auth_client::AuthClient;
use proto::etcd::kv_client::KvClient;
use proto::etcd::lease_client::LeaseClient;
use proto::etcd::watch_client::WatchClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::ServiceError;

/// How long one unary etcd call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest key prefix accepted (a flag).
const MAX_PREFIX: usize = 256;

pub use proto::etcd::KeyValue;

/// How this process proves itself to etcd and checks etcd's identity.
#[derive(Clone, Default)]
pub struct EtcdSecurity {
    /// The CA that signed the etcd members' certificates (`https://` members; without it,
    /// the bundled web roots).
    pub ca: Option<tonic::transport::Certificate>,
    /// This process's client certificate and key, for an etcd with `--client-cert-auth`.
    pub identity: Option<tonic::transport::Identity>,
    /// etcd user and password (etcd's `auth enable`).
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSecurity")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .field("user", &self.user.as_ref().map(|u| &u.0))
            .finish()
    }
}

/// The etcd auth token, sent as the `token` metadata of every call once authenticated.
#[derive(Clone, Default)]
struct Token(Arc<RwLock<Option<AsciiMetadataValue>>>);

impl Interceptor for Token {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let t = self.0.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(t) = t {
            r.metadata_mut().insert("token", t);
        }
        Ok(r)
    }
}

type Stamped = InterceptedService<Channel, Token>;

/// A connection to an etcd cluster (cheap to clone).
#[derive(Clone)]
pub struct Etcd {
    kv: KvClient<Stamped>,
    lease: LeaseClient<Stamped>,
    watch: WatchClient<Stamped>,
    auth: AuthClient<Channel>,
    user: Option<Arc<(String, String)>>,
    token: Token,
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
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
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
        Etcd::connect_with(urls, prefix, &EtcdSecurity::default())
    }

    /// The same, with `security`: TLS settings for `https://` members, and an etcd user
    /// (authenticate with [`Etcd::login`] before the first call; calls log in again when
    /// their token is refused).
    pub fn connect_with(
        urls: &str,
        prefix: &str,
        security: &EtcdSecurity,
    ) -> Result<Etcd, ServiceError> {
        if prefix.len() > MAX_PREFIX || !prefix.starts_with('/') {
            return Err(ServiceError::invalid(
                "etcd-prefix",
                format!("must start with '/' and be at most {MAX_PREFIX} bytes"),
            ));
        }
        let mut endpoints = Vec::new();
        let tls = (security.ca.is_some() || security.identity.is_some())
            .then(|| crate::tls::client(security.ca.clone(), security.identity.clone()));
        for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let mut e = Endpoint::from_shared(url.to_string())
                .map_err(|e| ServiceError::invalid("etcd", format!("{url:?}: {e}")))?
                .connect_timeout(Duration::from_secs(1))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(1))
                .keep_alive_timeout(Duration::from_secs(2));
            match (&tls, url.starts_with("https://")) {
                (Some(cfg), true) => {
                    e = e
                        .tls_config(cfg.clone())
                        .map_err(|e| ServiceError::invalid("etcd", format!("{url:?}: {e}")))?;
                }
                (Some(_), false) => {
                    return Err(ServiceError::invalid(
                        "etcd",
                        format!(
                            "{url:?} is not https:// although --etcd-ca or --etcd-cert is \
                             given (the cluster secret would cross in the clear)"
                        ),
                    ));
                }
                (None, true) => e = crate::tls::apply(e, url)?,
                (None, false) => {}
            }
            endpoints.push(e);
        }
        let channel = match endpoints.len() {
            0 => return Err(ServiceError::invalid("etcd", "no URL given")),
            1 => endpoints.remove(0).connect_lazy(),
            _ => Channel::balance_list(endpoints.into_iter()),
        };
        let token = Token::default();
        let stamped = |c: &Channel| InterceptedService::new(c.clone(), token.clone());
        Ok(Etcd {
            kv: KvClient::new(stamped(&channel)),
            lease: LeaseClient::new(stamped(&channel)),
            watch: WatchClient::new(stamped(&channel)),
            auth: AuthClient::new(channel),
            user: security.user.clone().map(Arc::new),
            token,
            prefix: prefix.to_string(),
            urls: urls.to_string(),
        })
    }

    /// Authenticates as the etcd user (nothing without one). A wrong name or password is
    /// `InvalidArgument` naming `--etcd-user`; etcd down is `Unavailable`.
    pub async fn login(&self) -> Result<(), ServiceError> {
        let Some(user) = &self.user else {
            return Ok(());
        };
        let mut auth = self.auth.clone();
        let call = auth.authenticate(etcd::AuthenticateRequest {
            name: user.0.clone(),
            password: user.1.clone(),
        });
        let r = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) if s.code() == tonic::Code::InvalidArgument => {
                return Err(ServiceError::invalid(
                    "etcd-user",
                    format!("etcd refused user {:?}: {}", user.0, s.message()),
                ));
            }
            Ok(Err(s)) => return Err(unavailable("authenticate", s.message())),
            Err(_) => {
                return Err(unavailable(
                    "authenticate",
                    format!("no answer within {CALL_TIMEOUT:?}"),
                ));
            }
        };
        let t = AsciiMetadataValue::try_from(r.token.as_str())
            .map_err(|e| unavailable("authenticate", format!("an unusable token: {e}")))?;
        *self.token.0.write().unwrap_or_else(|p| p.into_inner()) = Some(t);
        Ok(())
    }

    /// Whether etcd refused a call (`code`, `message`) for its token; if so a fresh one is
    /// fetched in the background (the caller retries as after any unavailable etcd).
    fn refused(&self, code: tonic::Code, message: &str) -> bool {
        let token = self.user.is_some()
            && (code == tonic::Code::Unauthenticated
                || message.contains("auth token")
                || message.contains("user name is empty"));
        if token {
            let me = self.clone();
            tokio::spawn(async move {
                if let Err(e) = me.login().await {
                    tracing::warn!("logging in to etcd again: {e}");
                }
            });
        }
        token
    }

    /// The full key of `name` under this client's prefix.
    pub fn key(&self, name: &str) -> Vec<u8> {
        format!("{}{name}", self.prefix).into_bytes()
    }

    async fn timed<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ServiceError> {
        match tokio::time::timeout(CALL_TIMEOUT, f).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => {
                self.refused(s.code(), s.message());
                Err(unavailable(what, s.message()))
            }
            Err(_) => Err(unavailable(
                what,
                format!("no answer within {CALL_TIMEOUT:?}"),
            )),
        }
    }

    /// The key `name`, if it exists.
    pub async fn get(&self, name: &str) -> Result<Option<KeyValue>, ServiceError> {
        let r = self
            .timed(
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
        let r = self
            .timed(
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
        let r = self
            .timed(
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
        self.timed(
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
        self.timed(
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
        let r = self
            .timed(
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
        self.timed(
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
            Ok(Err(s)) => {
                self.refused(s.code(), s.message());
                Err(unavailable("keep-alive", s.message()))
            }
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
        let stream = self
            .timed("watch", self.watch.clone().watch(ReceiverStream::new(rx)))
            .await?;
        Ok(Watcher {
            _requests: tx,
            stream,
            etcd: self.clone(),
        })
    }
}

/// An open watch: its events, until etcd goes away.
#[derive(Debug)]
pub struct Watcher {
    /// Keeps the request side open (etcd ends the watch when it closes).
    _requests: mpsc::Sender<etcd::WatchRequest>,
    stream: tonic::Streaming<etcd::WatchResponse>,
    /// To log in again when etcd cancels the watch for its token.
    etcd: Etcd,
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
            let r = match self.stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return None,
                Err(s) => {
                    self.etcd.refused(s.code(), s.message());
                    return None;
                }
            };
            if r.canceled {
                // a watch cancelled with a reason may have been refused its token (etcd says
                // so in the reason's words, not a code): logging in again costs one call
                if !r.cancel_reason.is_empty()
                    && !self
                        .etcd
                        .refused(tonic::Code::Unauthenticated, &r.cancel_reason)
                {
                    tracing::debug!("etcd cancelled a watch: {}", r.cancel_reason);
                }
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
