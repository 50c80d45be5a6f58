//! The address rule for outbound pushes, enforced where the connection is made: the push
//! client's resolver resolves a target's host once, refuses the whole answer if any address
//! is loopback, private or link-local (unless private targets are allowed), and hands the
//! connector exactly the addresses it checked. Checking in one lookup and connecting after
//! another would let DNS rebinding (a public answer to the check, a private one to the
//! connect) slip through; here there is only one lookup per connection.
//!
//! Hosts written as IP literals are never resolved (the connector dials them directly), so
//! [`check_literal`] checks those before a request is made.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

/// Looks a host name up (the system resolver, or a test's).
pub type Lookup = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> + Send + Sync,
>;

/// The system resolver.
pub fn system_lookup() -> Lookup {
    Arc::new(|host: String| {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    })
}

/// Whether an address is one the cluster must not be made to call by default.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64.0.0/10
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
        }
    }
}

fn refused(host: &str, ip: IpAddr) -> String {
    format!(
        "target {} resolves to {ip}, a loopback, private or link-local address; refused unless \
         the node allows private targets (--allow-private-targets)",
        blocks::quote::clip(host)
    )
}

/// The resolver of the push clients (see the module doc).
#[derive(Clone)]
pub struct GuardedResolver {
    allow_private: bool,
    lookup: Lookup,
    forbidden: fn(IpAddr) -> bool,
}

impl std::fmt::Debug for GuardedResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedResolver")
            .field("allow_private", &self.allow_private)
            .finish()
    }
}

impl GuardedResolver {
    /// The system resolver under the default rule.
    pub fn new(allow_private: bool) -> GuardedResolver {
        GuardedResolver::with(allow_private, system_lookup(), is_private)
    }

    /// A resolver with its own lookup and rule (tests).
    pub fn with(
        allow_private: bool,
        lookup: Lookup,
        forbidden: fn(IpAddr) -> bool,
    ) -> GuardedResolver {
        GuardedResolver {
            allow_private,
            lookup,
            forbidden,
        }
    }

    /// Resolves `host` once and checks every address.
    pub async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let addrs = (self.lookup)(host.to_string()).await?;
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} has no address", blocks::quote::clip(host)),
            ));
        }
        if !self.allow_private
            && let Some(ip) = addrs.iter().copied().find(|ip| (self.forbidden)(*ip))
        {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                refused(host, ip),
            ));
        }
        Ok(addrs)
    }
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let addrs = me.resolve(name.as_str()).await?;
            // the connector sets the port of the URL on each address
            Ok(addrs
                .into_iter()
                .map(|ip| SocketAddr::new(ip, 0))
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

/// Checks a target whose host is an IP literal (those are dialled without a lookup); names
/// are checked by the resolver when the connection is made.
pub fn check_literal(url: &str, allow_private: bool) -> Result<(), String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("target {} is not a URL: {e}", blocks::quote::quoted(url)))?;
    let host = uri
        .host()
        .ok_or_else(|| format!("target {} has no host", blocks::quote::quoted(url)))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) if !allow_private && is_private(ip) => Err(refused(bare, ip)),
        _ => Ok(()),
    }
}

/// The full check at subscribe time: the literal rule, then one lookup of a name under the
/// same rule (delivery checks again at each connection).
pub async fn check_target(url: &str, allow_private: bool) -> Result<(), String> {
    check_literal(url, allow_private)?;
    if allow_private {
        return Ok(());
    }
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("target {} is not a URL: {e}", blocks::quote::quoted(url)))?;
    let host = uri.host().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    GuardedResolver::new(false)
        .resolve(bare)
        .await
        .map(drop)
        .map_err(|e| match e.kind() {
            io::ErrorKind::PermissionDenied => e.to_string(),
            _ => format!("resolving {}: {e}", blocks::quote::clip(bare)),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses_are_recognised() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_private(a.parse().expect("ip")), "{a}");
        }
        for a in ["8.8.8.8", "1.1.1.1", "2606:4700::1111"] {
            assert!(!is_private(a.parse().expect("ip")), "{a}");
        }
    }

    #[tokio::test]
    async fn literals_and_names_are_checked() {
        assert!(check_literal("http://127.0.0.1:9/x", false).is_err());
        assert!(check_literal("http://[::1]:9/x", false).is_err());
        assert!(check_literal("http://127.0.0.1:9/x", true).is_ok());
        assert!(check_literal("http://example.com/x", false).is_ok());
        let e = check_target("http://localhost:9/x", false)
            .await
            .expect_err("localhost");
        assert!(e.contains("--allow-private-targets"), "{e}");
    }

    /// A loopback HTTP server on `ip:port` answering 200 to everything; counts connections.
    async fn counting_server(ip: &str, port: u16) -> Option<Arc<std::sync::atomic::AtomicUsize>> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind((ip, port)).await.ok()?;
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = s.read(&mut buf).await;
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        Some(hits)
    }

    /// DNS rebinding: the first answer is allowed, every later one points at a forbidden
    /// address. The push connects to exactly the checked address, and the rebound answer is
    /// refused at the next connection; the forbidden server is never reached.
    #[tokio::test]
    async fn a_rebinding_resolver_never_reaches_the_forbidden_address() {
        // "public" 127.0.0.2 and "internal" 127.0.0.1 on the same port
        let (public, internal, port) = loop {
            let probe = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let port = probe.local_addr().expect("addr").port();
            drop(probe);
            if let (Some(i), Some(p)) = (
                counting_server("127.0.0.1", port).await,
                counting_server("127.0.0.2", port).await,
            ) {
                break (p, i, port);
            }
        };
        let lookups = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n = lookups.clone();
        let lookup: Lookup = Arc::new(move |_host: String| {
            let first = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            Box::pin(async move {
                let ip = if first { "127.0.0.2" } else { "127.0.0.1" };
                Ok(vec![ip.parse().expect("ip")])
            })
        });
        fn only_127_0_0_1(ip: IpAddr) -> bool {
            ip == IpAddr::from([127, 0, 0, 1])
        }
        let resolver = GuardedResolver::with(false, lookup, only_127_0_0_1);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_max_idle_per_host(0)
                .build::<_, http_body_util::Empty<hyper::body::Bytes>>(
                    hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(resolver),
                );
        let url: hyper::Uri = format!("http://rebind.test:{port}/hook")
            .parse()
            .expect("url");
        let first = client
            .get(url.clone())
            .await
            .expect("the checked address answers");
        assert!(first.status().is_success());
        let second = client.get(url).await;
        let e = second.expect_err("the rebound answer is refused");
        let chain = format!("{e:?}");
        assert!(chain.contains("allow-private-targets"), "{chain}");
        use std::sync::atomic::Ordering::SeqCst;
        assert_eq!(public.load(SeqCst), 1);
        assert_eq!(
            internal.load(SeqCst),
            0,
            "the forbidden address was never dialled"
        );
        assert_eq!(lookups.load(SeqCst), 2, "one lookup per connection");
    }
}
