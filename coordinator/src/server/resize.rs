//! The I/O of an online grid resize (`Admin.ResizeGrid`, `dissem grid resize`): the
//! decisions are the protocol's (`crate::resize`); here the target is recorded in etcd before
//! the move starts, and the new grid before the protocol commits it, so a leader that wins
//! in between resumes the move or finds it done.

use proto::v1;
use runtime::ServiceError;
use runtime::grid::Grid;
use tokio::sync::oneshot;
use tonic::Status;

use super::{Driver, Handle, Msg};
use crate::resize::ResizeStatus;

/// What the handler asks the driver.
pub(super) enum Ask {
    /// Whether a move to the grid would start now (`Ok(false)`: it is done or under way).
    Check(Grid, oneshot::Sender<Result<bool, String>>),
    /// Start it (after etcd recorded it) and answer where it stands.
    Start(Grid, oneshot::Sender<Result<ResizeStatus, String>>),
    /// The new grid is recorded in etcd (`Ok`) or could not be (tried again later).
    Committed(Result<Grid, String>),
}

impl Driver {
    pub(super) fn resize(&mut self, now: u64, ask: Ask) {
        match ask {
            Ask::Check(to, reply) => {
                let _ = reply.send(self.protocol.check_resize(to));
            }
            Ask::Start(to, reply) => {
                let r = self.protocol.start_resize(to).map(|started| {
                    if started && let Some(l) = self.protocol.layout() {
                        tracing::info!("resizing the grid: {l}");
                    }
                    self.protocol.resize_status(now)
                });
                let _ = reply.send(r);
            }
            Ask::Committed(Ok(to)) => {
                self.committing = false;
                let from = self.protocol.grid();
                self.protocol.commit_resize(to);
                if let Some(from) = from {
                    tracing::info!("the grid is {to} now (resized from {from})");
                }
            }
            Ask::Committed(Err(e)) => {
                self.committing = false;
                tracing::warn!("recording the new grid in etcd: {e}; trying again");
            }
        }
    }

    /// Steps a resize under way on (after a heartbeat); once it may be committed, records
    /// the new grid in etcd (an elected leader) and commits it.
    pub(super) fn advance_resize(&mut self, now: u64) {
        if self.committing {
            return;
        }
        let step = self.protocol.resize_step();
        if step == 0 {
            return;
        }
        let Some(to) = self.protocol.advance_resize(now) else {
            if step == 1 && self.protocol.resize_step() == 2 {
                tracing::info!("resize: every node knows both grids; pulling the copies");
            }
            return;
        };
        let Some(from) = self.protocol.grid() else {
            return;
        };
        self.committing = true;
        let tx = self.tx.clone();
        let etcd = self.cfg.elected.as_ref().map(|e| e.etcd.clone());
        tokio::spawn(async move {
            let r = match etcd {
                Some(etcd) => crate::rebuild::record_commit(&etcd, from, to)
                    .await
                    .map(|()| to)
                    .map_err(|e| e.to_string()),
                None => Ok(to),
            };
            let _ = tx.send(Msg::Resize(Ask::Committed(r))).await;
        });
    }
}

impl Handle {
    /// `Admin.ResizeGrid`: starts the move (recorded in etcd first) unless it is done or
    /// under way, and answers where it stands.
    pub(super) async fn resize_grid(
        &self,
        r: v1::ResizeGridRequest,
    ) -> Result<v1::ResizeGridResponse, Status> {
        self.leading()?;
        let Some(etcd) = &self.etcd else {
            return Err(Status::failed_precondition(
                "a resize is agreed through etcd, so that it outlives this coordinator: run \
                 the coordinators with --etcd (and --grid)",
            ));
        };
        let to = Grid::new(r.rows, r.cols).map_err(|e| ServiceError::invalid("rows, cols", e))?;
        let start = self
            .ask(|tx| Msg::Resize(Ask::Check(to, tx)))
            .await?
            .map_err(Status::failed_precondition)?;
        if start {
            crate::rebuild::record_resize(etcd, to).await?;
        }
        let s = self
            .ask(|tx| Msg::Resize(Ask::Start(to, tx)))
            .await?
            .map_err(Status::failed_precondition)?;
        Ok(v1::ResizeGridResponse {
            grid: s.grid.map(|g| g.to_string()).unwrap_or_default(),
            moving_to: s.moving_to.map(|g| g.to_string()).unwrap_or_default(),
            done: s.grid == Some(to) && s.moving_to.is_none(),
            waiting: s.waiting,
        })
    }
}
