//! The guard in front of the plain HTTP/1.1 listeners (metrics and probes, the S3 event
//! notification endpoint): a cap on open connections (past it a new one is closed at once),
//! a deadline for a request's headers, one for the whole request, and a bound on the body
//! read into memory. A handler sees a request whose body it reads with [`read_body`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Limits of one HTTP listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// A connection must send a request's headers within this.
    pub header_timeout: Duration,
    /// A request (body included) must be answered within this.
    pub request_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// An answer: status, content type and body.
pub type Answer = (u16, &'static str, String);

/// Reads a body of at most `max` bytes: `Err` is the answer to send (413 past the bound, 400
/// for a body that broke off).
pub async fn read_body(body: Incoming, max: usize) -> Result<Bytes, Answer> {
    match Limited::new(body, max).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err((
            413,
            "text/plain",
            format!("the body exceeds the limit of {max} bytes\n"),
        )),
        Err(e) => Err((400, "text/plain", format!("reading the body: {e}\n"))),
    }
}

/// A connection's bytes, plain or over TLS.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Serves `handler` on `listener` until the task is dropped; only TLS with `tls` (the
/// handshake within the header deadline).
pub async fn serve<H, F>(
    listener: TcpListener,
    limits: HttpLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handler: H,
) where
    H: Fn(SocketAddr, hyper::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let cap = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            // out of descriptors, say: wait a little rather than spin
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(permit) = cap.clone().try_acquire_owned() else {
            drop(stream); // over the cap: closed at once
            continue;
        };
        let handler = handler.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let handler = handler.clone();
                async move {
                    let (status, ctype, body) = match tokio::time::timeout(
                        limits.request_timeout,
                        handler(peer, req),
                    )
                    .await
                    {
                        Ok(a) => a,
                        Err(_) => (408, "text/plain", "the request took too long\n".to_string()),
                    };
                    hyper::Response::builder()
                        .status(status)
                        .header("content-type", ctype)
                        .body(Full::new(Bytes::from(body)))
                }
            });
            let io: Box<dyn Io> = match tls {
                None => Box::new(stream),
                Some(tls) => {
                    match tokio::time::timeout(limits.header_timeout, tls.accept(stream)).await {
                        Ok(Ok(stream)) => Box::new(stream),
                        _ => return, // no handshake in time, or a failed one
                    }
                }
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(io), svc);
            // a connection lives at most as long as a few requests may take: a client that
            // keeps one open and idle gives its permit back then
            let _ = tokio::time::timeout(limits.request_timeout * 4, conn).await;
        });
    }
}
