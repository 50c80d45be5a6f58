//! A TCP relay on loopback whose connections the benchmarks cut at will: a link between two
//! clusters goes through it, and `set_down(true)` breaks every connection and refuses new
//! ones until `set_down(false)`, as a network partition would, while both processes run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The relay (cheap to clone; clones control the same relay).
#[derive(Debug, Clone)]
pub struct Cut {
    /// Where peers connect.
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Cut {
    /// Relays a free loopback port to `upstream` until the runtime ends.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Cut> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let cut = Cut {
            addr: listener.local_addr()?,
            down: Arc::default(),
            conns: Arc::default(),
        };
        let c = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if c.down.load(Ordering::SeqCst) {
                    continue; // dropped: the peer sees its connection closed
                }
                let relay = tokio::spawn(async move {
                    if let Ok(mut out) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                let mut conns = runtime::lock(&c.conns);
                conns.retain(|h| !h.is_finished());
                conns.push(relay);
            }
        });
        Ok(cut)
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
}
