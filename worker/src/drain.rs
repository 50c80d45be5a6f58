//! Draining a node before a restart or an upgrade (`dissem node drain`, `Admin.Drain`):
//! from the first call the node refuses puts with UNAVAILABLE (writers retry on another
//! node) and goes on disseminating what it took; it is *drained* once its outbox is empty,
//! no delivery record is open and no delivery is queued. Then, when the caller asked for it,
//! the process stops serving and exits 0, so a rolling restart replaces a node that owes
//! nothing in flight. Entries its federation links still owe are durable and are sent after
//! the restart: they are reported, not waited for (a peer cluster may be down for hours).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proto::v1;
use runtime::ServiceError;

use crate::services::{Node, Sink};

/// A node's drain state, shared by its services and its serving loop.
#[derive(Debug, Default)]
pub struct Drain {
    draining: AtomicBool,
    /// The process is stopping (SIGTERM): puts are refused as while draining.
    stopping: AtomicBool,
    exit: tokio::sync::Notify,
    exiting: AtomicBool,
}

impl Drain {
    /// Whether puts are refused.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Starts draining (puts are refused from now on); `true` the first time.
    pub fn start(&self) -> bool {
        !self.draining.swap(true, Ordering::AcqRel)
    }

    /// The process is stopping: puts are refused from now on.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Release);
        self.draining.store(true, Ordering::Release);
    }

    /// Asks the serving loop to stop now (a node that left the grid).
    pub fn exit_now(&self) {
        if !self.exiting.swap(true, Ordering::AcqRel) {
            self.exit.notify_waiters();
        }
    }

    /// Resolves once a drained node was asked to exit (the serving loop's shutdown).
    pub async fn exit_requested(self: Arc<Drain>) {
        loop {
            let notified = self.exit.notified();
            if self.exiting.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// The error a put gets while draining.
    pub fn refuse(&self) -> Result<(), ServiceError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(ServiceError::Unavailable(
                "this node is stopping: put through another node, or again once it is back".into(),
            ));
        }
        if self.draining() {
            return Err(ServiceError::Unavailable(
                "this node is draining (dissem node drain before a restart, or it leaves the \
                 grid): put through another node"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl Node {
    /// `Admin.Drain`: starts draining (once) and answers what is still owed; with `exit`,
    /// a drained node stops serving just after the answer.
    pub(crate) fn drain_step(&self, exit: bool) -> Result<v1::DrainResponse, ServiceError> {
        let d = self.drain();
        if d.start() {
            tracing::info!("draining: puts are refused from now on; disseminating the rest");
        }
        let open = self.store.unfinished_deliveries(usize::MAX)?.len() as u64;
        let queued = match &self.sink {
            Sink::Cluster(daemon) => daemon.deliverer().counters().queued.load(Ordering::Relaxed),
            _ => 0,
        };
        let owed = self
            .federation
            .as_ref()
            .map_or(0, |f| f.links().links.iter().map(|l| l.owed).sum());
        let outbox = self.store.outbox_len() as u64;
        let drained = outbox == 0 && open == 0 && queued == 0;
        if drained && exit && !d.exiting.swap(true, Ordering::AcqRel) {
            tracing::info!(
                "drained (links still owe {owed} entries, sent after the restart): exiting"
            );
            let d = d.clone();
            tokio::spawn(async move {
                // the answer goes out first
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                d.exit.notify_waiters();
            });
        }
        Ok(v1::DrainResponse {
            draining: true,
            outbox_pending: outbox,
            deliveries_open: open,
            deliveries_queued: queued,
            owed_to_links: owed,
            drained,
        })
    }
}
