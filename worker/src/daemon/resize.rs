//! A node's part in an online grid resize (`dissem grid resize`; the steps are the
//! coordinator's, `coordinator/src/resize.rs`). The heartbeat answer names the grid the
//! cluster moves to and the move's step; from then on every quorum this node computes is
//! both grids' (`runtime::grid::Layout`). Whenever the layout or the step changes, the node
//! catches up again, as at a registration: it pulls the object copies and the subscription
//! copies its position holds in either grid, and reports the step it caught up for. A node
//! outside the grid moved to drains (it refuses puts, disseminates what it took) and says
//! so; once the new grid is committed without it, it exits 0.

use super::*;
use replicate::View;

/// A node's state in a resize.
#[derive(Debug, Default)]
pub(super) struct NodeResize {
    /// The resize step this node's last catch-up was for.
    caught_up_step: u64,
    /// It leaves the grid (it drains until the commit, then exits).
    leaving: bool,
}

impl Daemon {
    /// Reacts to the view's layout: a node outside the grid moved to drains (also one that
    /// starts again during the move), one outside the grid in force after the commit exits
    /// if it was leaving; a changed layout or step is caught up with, as a registration does
    /// (not at a registration: its own catch-up runs).
    pub(super) fn layout_changed(&self, old: &View, new: &View, registering: bool) {
        let Some(now) = new.grid else { return };
        let me = self.inner.cfg.node;
        if !now.contains(me) {
            if lock(&self.inner.resize).leaving {
                tracing::info!("the grid is {now} now, without this node: it drained, exiting");
                self.inner.drain.exit_now();
            }
            return;
        }
        if !now.stays(me) && !lock(&self.inner.resize).leaving {
            lock(&self.inner.resize).leaving = true;
            tracing::info!("{now}: this node leaves the grid, draining (puts are refused)");
            self.inner.drain.start();
        }
        let changed = old.grid != new.grid || old.resize_step != new.resize_step;
        if registering || old.grid.is_none() || !changed {
            return;
        }
        tracing::info!(
            "grid {now} (resize step {}): catching up with the new quorums",
            new.resize_step
        );
        self.catch_up_for_layout();
    }

    /// Catches up again under the current view, as a registration does (the resend is not
    /// held up meanwhile); the step it caught up for is reported once it is done. A catch-up
    /// that runs out of time is tried again, until a later one (a registration, another
    /// change) takes over: the move waits for this node's report.
    fn catch_up_for_layout(&self) {
        let registration = self.inner.registrations.fetch_add(1, Ordering::AcqRel) + 1;
        self.inner.subs_gen.fetch_add(1, Ordering::AcqRel);
        let me = self.clone();
        tokio::spawn(async move {
            while !me.catch_up_and_report(registration).await
                && me.inner.registrations.load(Ordering::Acquire) == registration
            {
                tracing::warn!("catching up with the new quorums timed out: trying again");
            }
        });
    }

    /// Runs the catch-up of registration `registration` and notes the resize step it was
    /// for, unless a later catch-up began meanwhile (its own report follows).
    pub(super) async fn catch_up_and_report(&self, registration: u64) -> bool {
        let step = self.view().resize_step;
        let limit = membership::CATCH_UP_LIMIT;
        let done = tokio::time::timeout(limit, self.catch_up()).await.is_ok();
        if done && self.inner.registrations.load(Ordering::Acquire) == registration {
            lock(&self.inner.resize).caught_up_step = step;
        }
        done
    }

    /// For the heartbeat: the resize step this node caught up for (0 until its subscription
    /// copies are whole too), and whether it leaves the grid and owes nothing any more.
    pub(super) fn resize_report(&self) -> (u64, bool) {
        let r = lock(&self.inner.resize);
        let step = if self.subscriptions_whole() {
            r.caught_up_step
        } else {
            0
        };
        (step, r.leaving && self.owes_nothing())
    }

    /// Nothing in the outbox, no delivery record open, none queued, and nothing owed to a
    /// federation link (unlike a drain before a restart, a node that leaves takes its disk
    /// with it).
    fn owes_nothing(&self) -> bool {
        let queued = self
            .inner
            .deliverer
            .counters()
            .queued
            .load(Ordering::Relaxed);
        let open = self
            .inner
            .store
            .unfinished_deliveries(1)
            .map_or(1, |v| v.len());
        let owed = self.links().map_or(0, |l| l.owed_total());
        self.inner.store.outbox_len() == 0 && open == 0 && queued == 0 && owed == 0
    }
}
