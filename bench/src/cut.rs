//! A TCP relay on loopback whose connections the benchmarks cut and slow at will: a link
//! between two clusters goes through it. `set_down(true)` breaks every connection and
//! refuses new ones until `set_down(false)`, as a network partition would, while both
//! processes run. `set_impaired(Some(..))` makes it a slow, lossy wide-area link instead:
//! every chunk read is written on after a delay, and a share of them (the lost segments)
//! only after a retransmission timeout more, in order, as TCP over a lossy path delivers
//! them. (A real `tc netem` needs network namespaces and root; the relay works anywhere.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How a lost segment is delayed: TCP's minimum retransmission timeout.
const RETRANSMIT: Duration = Duration::from_millis(200);
/// Chunks in flight per direction of a connection (the relay's window).
const IN_FLIGHT: usize = 256;

/// A slow, lossy link: each chunk waits `delay` (one way), and `loss_permille` of them
/// [`RETRANSMIT`] more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Impairment {
    pub delay: Duration,
    pub loss_permille: u32,
}

/// The relay (cheap to clone; clones control the same relay).
#[derive(Debug, Clone)]
pub struct Cut {
    /// Where peers connect.
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    /// The impairment: delay in ms and loss in permille packed (0: none).
    impaired: Arc<AtomicU64>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Cut {
    /// Relays a free loopback port to `upstream` until the runtime ends.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Cut> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let cut = Cut {
            addr: listener.local_addr()?,
            down: Arc::default(),
            impaired: Arc::default(),
            conns: Arc::default(),
        };
        let c = cut.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while let Ok((inbound, _)) = listener.accept().await {
                if c.down.load(Ordering::SeqCst) {
                    continue; // dropped: the peer sees its connection closed
                }
                n += 1;
                let impaired = c.impaired.clone();
                let relay = tokio::spawn(async move {
                    if let Ok(out) = TcpStream::connect(upstream).await {
                        relay(inbound, out, impaired, n).await;
                    }
                });
                let mut conns = runtime::lock(&c.conns);
                conns.retain(|h| !h.is_finished());
                conns.push(relay);
            }
        });
        Ok(cut)
    }

    /// A relay in front of the endpoint at `url` (`http://host:port`, with a path or not),
    /// and the URL that reaches the endpoint through it (the same path): a subscriber behind
    /// it is crashed, as the nodes see it, by cutting the relay.
    pub async fn in_front_of(url: &str) -> anyhow::Result<(Cut, String)> {
        use anyhow::Context;
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("{url} is not an http:// URL"))?;
        let (addr, path) = rest.split_once('/').unwrap_or((rest, ""));
        let upstream: SocketAddr = addr
            .parse()
            .with_context(|| format!("the address in {url}"))?;
        let cut = Cut::start(upstream)
            .await
            .with_context(|| format!("a relay in front of {url}"))?;
        let through = match path {
            "" => format!("http://{}", cut.addr),
            p => format!("http://{}/{p}", cut.addr),
        };
        Ok((cut, through))
    }

    /// Cuts every connection and refuses new ones (`true`), or lets them through again.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            for h in runtime::lock(&self.conns).drain(..) {
                h.abort();
            }
        }
    }

    /// Slows the link (`Some`), or makes it fast again (`None`); open connections follow
    /// from their next chunk on.
    pub fn set_impaired(&self, i: Option<Impairment>) {
        self.impaired.store(i.map_or(0, pack), Ordering::SeqCst);
    }
}

fn pack(i: Impairment) -> u64 {
    let ms = u64::try_from(i.delay.as_millis()).unwrap_or(u64::from(u32::MAX));
    (ms.min(u64::from(u32::MAX)) << 32) | u64::from(i.loss_permille.min(1000))
}

fn unpack(v: u64) -> Option<Impairment> {
    (v != 0).then(|| Impairment {
        delay: Duration::from_millis(v >> 32),
        loss_permille: (v & 0xffff_ffff) as u32,
    })
}

/// Both directions of one relayed connection, until either side closes.
async fn relay(inbound: TcpStream, out: TcpStream, impaired: Arc<AtomicU64>, n: u64) {
    let (ir, iw) = inbound.into_split();
    let (or, ow) = out.into_split();
    let up = one_way(ir, ow, impaired.clone(), n.wrapping_mul(2));
    let down = one_way(or, iw, impaired, n.wrapping_mul(2) + 1);
    // in this task, so that aborting it (a cut) drops both sockets
    tokio::join!(up, down);
}

/// Copies `from` to `to`, each chunk released at its time: now plus the delay (and a
/// retransmission for a lost one), never before the chunk ahead of it.
async fn one_way<R, W>(mut from: R, mut to: W, impaired: Arc<AtomicU64>, seed: u64)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let reader = async move {
        let mut rng = runtime::rng::Rng::new(seed ^ 0x7e1a_7e1a);
        let mut last = Instant::now();
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let mut at = Instant::now();
            if let Some(i) = unpack(impaired.load(Ordering::SeqCst)) {
                at += i.delay;
                if rng.below(1000) < u64::from(i.loss_permille) {
                    at += RETRANSMIT;
                }
            }
            // in order: a chunk never overtakes the one ahead of it
            last = last.max(at);
            if tx.send((last, buf[..n].to_vec())).await.is_err() {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    // the writer drains what the reader passed before a close
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impairment_packs_and_unpacks() {
        let i = Impairment {
            delay: Duration::from_millis(150),
            loss_permille: 10,
        };
        assert_eq!(unpack(pack(i)), Some(i));
        assert_eq!(unpack(0), None);
    }

    #[tokio::test]
    async fn a_relay_in_front_of_a_url_keeps_its_path_and_reaches_its_endpoint() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let at = l.local_addr().expect("addr");
        let (cut, url) = Cut::in_front_of(&format!("http://{at}/hook"))
            .await
            .expect("relay");
        assert_eq!(url, format!("http://{}/hook", cut.addr));
        let (_, bare) = Cut::in_front_of(&format!("http://{at}"))
            .await
            .expect("relay");
        assert!(!bare.ends_with('/'), "{bare}");
        assert!(Cut::in_front_of("https://127.0.0.1:1").await.is_err());
        assert!(Cut::in_front_of("http://not-an-address/x").await.is_err());
        let _client = TcpStream::connect(cut.addr).await.expect("connect");
        let reached = tokio::time::timeout(Duration::from_secs(10), l.accept()).await;
        assert!(matches!(reached, Ok(Ok(_))), "the endpoint was not reached");
    }

    #[tokio::test]
    async fn an_impaired_relay_delays_in_order_and_a_healed_one_does_not() {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let upstream = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let cut = Cut::start(upstream).await.expect("relay");
        let round_trip = |cut: Cut| async move {
            let mut s = TcpStream::connect(cut.addr).await.expect("connect");
            let t = std::time::Instant::now();
            let mut got = Vec::new();
            for k in 0..20u8 {
                s.write_all(&[k]).await.expect("write");
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await.expect("read");
                got.push(b[0]);
            }
            (t.elapsed(), got)
        };
        cut.set_impaired(Some(Impairment {
            delay: Duration::from_millis(20),
            loss_permille: 0,
        }));
        let (slow, got) = round_trip(cut.clone()).await;
        assert_eq!(got, (0..20).collect::<Vec<u8>>());
        // 20 round trips of two 20 ms legs each
        assert!(slow >= Duration::from_millis(800), "{slow:?}");
        cut.set_impaired(None);
        let (fast, got) = round_trip(cut.clone()).await;
        assert_eq!(got, (0..20).collect::<Vec<u8>>());
        assert!(fast < slow, "{fast:?} vs {slow:?}");
    }
}
