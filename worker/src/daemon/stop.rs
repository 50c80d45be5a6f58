//! The node's clean stop (SIGTERM, Ctrl-C, a drained node asked to exit): puts are refused
//! from the signal on, the deliveries under way settle and the streams end
//! ([`crate::deliver::Deliverer::stop`]), the objects they finished end their copies, and the
//! store is flushed and marked as stopped cleanly. What the last deliveries finished was
//! written without a flush and lost with the process before: an acknowledged delivery came
//! again after a restart, saying `attempt: 1`.

use std::time::Duration;

use super::*;

impl Daemon {
    /// Starts the stop at the signal: puts are refused, no delivery call starts, and the
    /// calls under way get half of `grace` before the streams end (the rest is the
    /// server's, to close its connections).
    pub fn begin_stop(&self, grace: Duration) {
        self.inner.drain.stopping();
        tracing::info!(
            "stopping: puts are refused; letting the deliveries under way finish (at most \
             {grace:?})"
        );
        let d = self.inner.deliverer.clone();
        tokio::spawn(async move { d.stop(grace / 2).await });
    }

    /// Ends the stop once the server has stopped serving: waits for the deliveries under
    /// way (the same bound), ends the copies of the objects they finished, and flushes the
    /// store; it is marked as stopped cleanly when every call settled.
    pub async fn finish_stop(&self, grace: Duration) -> Result<(), storage::StorageError> {
        let settled = self.inner.deliverer.stop(grace / 2).await;
        // reports the finisher has not taken yet (it runs on, but the process ends soon)
        for id in self.inner.finished.take_now() {
            self.finish_reported(id);
        }
        let store = &self.inner.store;
        if settled {
            store.stopped_cleanly().await?;
            tracing::info!("stopped cleanly: every delivery outcome is on disk");
        } else {
            store.commit().await?;
        }
        Ok(())
    }
}
