//! The guard in front of every gRPC listener: a cap on open connections, a handshake timeout
//! (a peer that connects and sends nothing, or too little to be a client, is closed), an idle
//! timeout (a connection with no request in flight for that long is closed) and HTTP/2
//! keepalive pings (a half-open peer that stops answering is closed), so that a flood of idle
//! or abandoned connections can neither take every file descriptor nor starve the clients
//! that are really there.
//!
//! The accept loop wraps each socket in a [`Conn`] holding one permit of the cap; the
//! [`ActivityLayer`] (a tower layer on the server) counts each connection's requests in flight
//! through a table keyed by the peer address, and the connection's own reads notice when it
//! has been idle too long.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::lock;

/// Bytes a peer must send within the handshake timeout: the HTTP/2 client preface is 24 bytes
/// (a TLS ClientHello is larger), so a peer that sends less is not a client.
const HANDSHAKE_BYTES: u64 = 24;

/// Connection limits of one listener; every one is a setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenConfig {
    /// Most connections open at once; past it new ones are closed at once.
    pub max_connections: usize,
    /// A new connection must send its first [`HANDSHAKE_BYTES`] within this.
    pub handshake_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// HTTP/2 pings to a quiet peer this often; one unanswered for `keepalive_timeout`
    /// closes the connection (half-open peers).
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// After a stop (SIGTERM), how long open calls and streams may take before the server
    /// stops anyway: a subscriber's stream never ends on its own, and Kubernetes kills a pod
    /// whose stop outlasts its grace period.
    pub shutdown_grace: Duration,
}

impl Default for ListenConfig {
    fn default() -> ListenConfig {
        ListenConfig {
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl ListenConfig {
    /// The cap actually applied: at most the configured one, and never more than the
    /// process's file descriptors allow (a quarter of them are kept for files, sled and
    /// outgoing calls).
    pub fn effective_max_connections(&self) -> usize {
        self.max_connections.min(fd_budget()).max(1)
    }
}

/// Three quarters of the process's open-file limit (from /proc; 1024 if unreadable).
fn fd_budget() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_string))
        })
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024);
    soft.saturating_mul(3) / 4
}

/// What the server knows of one open connection.
#[derive(Debug)]
struct ConnState {
    in_flight: AtomicUsize,
    /// Milliseconds since `epoch` of the last request start or end.
    last_active_ms: AtomicU64,
}

/// The open connections of one listener, by peer address (unique while a connection lives).
#[derive(Debug, Clone)]
pub struct Connections {
    inner: Arc<ConnectionsInner>,
}

#[derive(Debug)]
struct ConnectionsInner {
    cfg: ListenConfig,
    permits: Arc<Semaphore>,
    open: Mutex<HashMap<SocketAddr, Arc<ConnState>>>,
    epoch: Instant,
    refused: AtomicU64,
}

impl Connections {
    fn new(cfg: ListenConfig) -> Connections {
        Connections {
            inner: Arc::new(ConnectionsInner {
                cfg,
                permits: Arc::new(Semaphore::new(cfg.effective_max_connections())),
                open: Mutex::new(HashMap::new()),
                epoch: Instant::now(),
                refused: AtomicU64::new(0),
            }),
        }
    }

    fn now_ms(&self) -> u64 {
        self.inner.epoch.elapsed().as_millis() as u64
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        lock(&self.inner.open).len()
    }

    /// Connections closed at accept because the cap was reached.
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// The layer that counts requests in flight per connection of this listener.
    pub fn layer(&self) -> ActivityLayer {
        ActivityLayer {
            conns: self.clone(),
        }
    }

    fn admit(&self, io: TcpStream) -> Option<Conn> {
        let Ok(permit) = self.inner.permits.clone().try_acquire_owned() else {
            let n = self.inner.refused.fetch_add(1, Ordering::Relaxed);
            if n.is_power_of_two() {
                tracing::warn!(
                    "connection cap of {} reached: closed {} new connections so far",
                    self.inner.cfg.effective_max_connections(),
                    n + 1
                );
            }
            return None;
        };
        let peer = io.peer_addr().ok()?;
        let _ = io.set_nodelay(true);
        let state = Arc::new(ConnState {
            in_flight: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(self.now_ms()),
        });
        lock(&self.inner.open).insert(peer, state.clone());
        let cfg = self.inner.cfg;
        Some(Conn {
            io,
            peer,
            conns: self.clone(),
            state,
            received: 0,
            timer: Box::pin(tokio::time::sleep(cfg.handshake_timeout)),
            _permit: permit,
        })
    }

    fn state(&self, peer: Option<SocketAddr>) -> Option<Arc<ConnState>> {
        peer.and_then(|p| lock(&self.inner.open).get(&p).cloned())
    }
}

/// An accepted connection, holding one permit of its listener's cap.
#[derive(Debug)]
pub struct Conn {
    io: TcpStream,
    peer: SocketAddr,
    conns: Connections,
    state: Arc<ConnState>,
    received: u64,
    /// The handshake deadline until enough bytes came, then the next idle check.
    timer: Pin<Box<Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let mut open = lock(&self.conns.inner.open);
        if open
            .get(&self.peer)
            .is_some_and(|s| Arc::ptr_eq(s, &self.state))
        {
            open.remove(&self.peer);
        }
    }
}

impl Conn {
    /// Whether the connection should be closed now; re-arms the timer otherwise.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let cfg = self.conns.inner.cfg;
        while self.timer.as_mut().poll(cx).is_ready() {
            if self.received < HANDSHAKE_BYTES {
                return Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no client handshake within the handshake timeout",
                ));
            }
            let idle_ms = self
                .conns
                .now_ms()
                .saturating_sub(self.state.last_active_ms.load(Ordering::Relaxed));
            let idle = Duration::from_millis(idle_ms);
            if self.state.in_flight.load(Ordering::Relaxed) == 0 && idle >= cfg.idle_timeout {
                return Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle past the idle timeout",
                ));
            }
            let next = cfg
                .idle_timeout
                .saturating_sub(idle)
                .max(Duration::from_millis(10));
            self.timer
                .as_mut()
                .reset(tokio::time::Instant::now() + next);
        }
        None
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let was = this.received;
                this.received += (buf.filled().len() - before) as u64;
                if was < HANDSHAKE_BYTES && this.received >= HANDSHAKE_BYTES {
                    let idle = this.conns.inner.cfg.idle_timeout;
                    this.timer
                        .as_mut()
                        .reset(tokio::time::Instant::now() + idle);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.expired(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

/// Accepted connections, each admitted under the cap (over it: closed at once).
pub fn incoming(
    listener: TcpListener,
    conns: Connections,
) -> impl tokio_stream::Stream<Item = io::Result<Conn>> {
    async_stream_accept(listener, conns)
}

fn async_stream_accept(
    listener: TcpListener,
    conns: Connections,
) -> impl tokio_stream::Stream<Item = io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Conn>>(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            match accepted {
                Ok((io, _)) => {
                    if let Some(c) = conns.admit(io)
                        && tx.send(Ok(c)).await.is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    // out of descriptors and the like: wait a moment instead of spinning
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A server builder under `cfg`: large flow-control windows (objects up to the size limit)
/// and keepalive pings; [`Listener::server`] adds the activity layer.
fn server(cfg: &ListenConfig) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .http2_keepalive_interval(Some(cfg.keepalive_interval))
        .http2_keepalive_timeout(Some(cfg.keepalive_timeout))
}

/// The layers [`Listener::server`] stacks: authentication inside the activity count.
pub type GuardedLayers = tower_layer::Stack<
    crate::auth::AuthLayer,
    tower_layer::Stack<ActivityLayer, tower_layer::Identity>,
>;

/// The server type [`Listener::server`] builds.
pub type GuardedServer = tonic::transport::Server<GuardedLayers>;

/// A bound listener with its connection table and who may call it.
#[derive(Debug)]
pub struct Listener {
    pub listener: TcpListener,
    pub conns: Connections,
    auth: Option<Arc<crate::auth::Auth>>,
    tls: Option<tonic::transport::ServerTlsConfig>,
}

impl Listener {
    /// Guards `listener` under `cfg`; every caller is an open admin until [`Listener::with_auth`].
    pub fn new(listener: TcpListener, cfg: ListenConfig) -> Listener {
        Listener {
            listener,
            conns: Connections::new(cfg),
            auth: None,
            tls: None,
        }
    }

    /// Serves only TLS under `tls` (`None`: plain HTTP/2).
    pub fn with_tls(mut self, tls: Option<tonic::transport::ServerTlsConfig>) -> Listener {
        self.tls = tls;
        self
    }

    /// Whether the listener speaks TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Callers must present a token of `auth` (`None`: no authentication).
    pub fn with_auth(mut self, auth: Option<Arc<crate::auth::Auth>>) -> Listener {
        self.auth = auth;
        self
    }

    /// Whether callers are authenticated.
    pub fn authenticated(&self) -> bool {
        self.auth.is_some()
    }

    /// The tokens callers must present (`None`: no authentication), for the process's other
    /// listeners that take the same callers.
    pub fn auth(&self) -> Option<Arc<crate::auth::Auth>> {
        self.auth.clone()
    }

    /// How long a stop waits for open calls and streams ([`ListenConfig::shutdown_grace`]).
    pub fn shutdown_grace(&self) -> Duration {
        self.conns.inner.cfg.shutdown_grace
    }

    /// The layer counting this listener's requests per connection.
    pub fn layer(&self) -> ActivityLayer {
        self.conns.layer()
    }

    /// A server builder under this listener's settings, with its activity layer.
    pub fn server(&self) -> Result<GuardedServer, crate::ServiceError> {
        let mut s = server(&self.conns.inner.cfg);
        if let Some(tls) = &self.tls {
            s = s
                .tls_config(tls.clone())
                .map_err(|e| crate::ServiceError::Startup(format!("TLS: {e}")))?;
        }
        Ok(s.layer(self.layer())
            .layer(crate::auth::AuthLayer::new(self.auth.clone())))
    }

    /// The guarded connections, for `serve_with_incoming`.
    pub fn incoming(self) -> impl tokio_stream::Stream<Item = io::Result<Conn>> {
        incoming(self.listener, self.conns)
    }
}

/// Tower layer: marks a connection busy while one of its requests runs (the response body
/// included, so a long stream keeps its connection).
#[derive(Debug, Clone)]
pub struct ActivityLayer {
    conns: Connections,
}

impl<S> tower_layer::Layer<S> for ActivityLayer {
    type Service = Activity<S>;
    fn layer(&self, inner: S) -> Activity<S> {
        Activity {
            inner,
            conns: self.conns.clone(),
        }
    }
}

/// See [`ActivityLayer`].
#[derive(Debug, Clone)]
pub struct Activity<S> {
    inner: S,
    conns: Connections,
}

/// Held while a request runs; marks its connection idle-again when dropped.
#[derive(Debug)]
struct Busy {
    state: Arc<ConnState>,
    conns: Connections,
}

impl Busy {
    fn new(state: Arc<ConnState>, conns: Connections) -> Busy {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        state
            .last_active_ms
            .store(conns.now_ms(), Ordering::Relaxed);
        Busy { state, conns }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.state
            .last_active_ms
            .store(self.conns.now_ms(), Ordering::Relaxed);
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower_service::Service<http::Request<B>> for Activity<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Send,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let peer = req
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(|i| i.remote_addr());
        let busy = self
            .conns
            .state(peer)
            .map(|s| Busy::new(s, self.conns.clone()));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(match busy {
                None => resp,
                Some(b) => resp.map(|body| tonic::body::Body::new(BusyBody { body, _busy: b })),
            })
        })
    }
}

/// A response body that keeps its connection marked busy until it is done.
struct BusyBody {
    body: tonic::body::Body,
    _busy: Busy,
}

impl http_body::Body for BusyBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
