//! The elastic workers: each a task with one inbox, started and terminated by load regulation
//! from the node's CPU samples, and the switch of the bulk lane from the outbox backlog.

use super::*;

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) block: String,
    pub(super) busy: bool,
    /// Of the urgent reserve: priority-7 tasks only, never terminated by regulation.
    pub(super) urgent: bool,
    pub(super) last_task_ms: u64,
    pub(super) tx: mpsc::Sender<v1::AssignRequest>,
}

#[derive(Debug, Default)]
pub(super) struct Changes {
    pub(super) started: Vec<v1::WorkerState>,
    pub(super) terminated: Vec<u64>,
}

impl Daemon {
    /// The node's workers: (id, block, busy, of the urgent reserve).
    pub fn workers(&self) -> Vec<(u64, String, bool, bool)> {
        lock(&self.inner.workers)
            .iter()
            .map(|(id, s)| (*id, s.block.clone(), s.busy, s.urgent))
            .collect()
    }

    /// The last CPU utilisation sample (0..=1).
    pub fn cpu(&self) -> f64 {
        *lock(&self.inner.cpu)
    }

    /// Starts an empty worker (`urgent`: of the urgent reserve).
    pub(super) fn start_worker(&self, urgent: bool) -> u64 {
        let id = self.inner.id_prefix | self.inner.next_worker.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(8);
        lock(&self.inner.workers).insert(
            id,
            Slot {
                block: "empty".into(),
                busy: false,
                urgent,
                last_task_ms: now_ms(),
                tx,
            },
        );
        lock(&self.inner.changes).started.push(v1::WorkerState {
            worker: id,
            block: "empty".into(),
            urgent,
        });
        self.inner
            .counters
            .workers_started
            .fetch_add(1, Ordering::Relaxed);
        tokio::spawn(self.clone().worker(id, rx));
        id
    }

    /// Terminates an idle worker; false when it is busy or gone.
    pub(super) fn terminate_worker(&self, id: u64) -> bool {
        let mut ws = lock(&self.inner.workers);
        if ws.get(&id).is_some_and(|s| !s.busy) {
            ws.remove(&id); // dropping the sender ends the worker's loop
            drop(ws);
            lock(&self.inner.changes).terminated.push(id);
            self.inner
                .counters
                .workers_terminated
                .fetch_add(1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    // --- background loops ---------------------------------------------------------------------

    pub(super) async fn regulator(self) {
        let mut sampler = CpuSampler::default();
        let mut tick = tokio::time::interval(self.inner.cfg.regulate_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let Some(cpu) = sampler.sample() else {
                continue;
            };
            *lock(&self.inner.cpu) = cpu;
            // the urgent reserve is not regulated: it stays for priority-7 tasks
            let views: Vec<WorkerView> = lock(&self.inner.workers)
                .iter()
                .filter(|(_, s)| !s.urgent)
                .map(|(id, s)| WorkerView {
                    id: *id,
                    idle: !s.busy,
                    last_task_ms: s.last_task_ms,
                })
                .collect();
            for r in regulate(&self.inner.cfg.regulator, now_ms(), cpu, &views) {
                match r {
                    Regulation::Start => {
                        let id = self.start_worker(false);
                        tracing::debug!("cpu {cpu:.2}: started empty worker {id:x}");
                    }
                    Regulation::Terminate(id) => {
                        if self.terminate_worker(id) {
                            tracing::debug!("cpu {cpu:.2}: terminated idle worker {id:x}");
                        }
                    }
                }
            }
        }
    }

    /// Drives the bulk lane from the backlog ([`lane_switch`]): the outbox and the puts
    /// waiting to be written.
    pub(super) async fn lane_switch(self) {
        let mut calm = 0u32;
        let mut tick = tokio::time::interval(LANE_SAMPLE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            // puts waiting to be written are a backlog too: once the write path admits in
            // priority order, an overload queues there first
            let backlog = self.inner.store.outbox_len() + self.inner.admission.waiting();
            let lanes = &self.inner.lanes;
            let was = lanes.overloaded();
            let now = lane_switch(was, backlog, &mut calm);
            if now != was {
                tracing::debug!(
                    "{backlog} objects in the outbox: bulk lane {}",
                    if now { "on" } else { "off" }
                );
                lanes.set_overloaded(now);
            }
        }
    }

    // --- workers and blocks -------------------------------------------------------------------

    pub(super) async fn worker(self, id: u64, mut rx: mpsc::Receiver<v1::AssignRequest>) {
        while let Some(req) = rx.recv().await {
            let task = req.task;
            let nonce = req.nonce;
            let block = req.block.clone();
            if req.load {
                self.inner.counters.loads.fetch_add(1, Ordering::Relaxed);
            }
            // the task runs on the lane of its priority: fetching results, matching and the
            // hand-off of a backlog never take the CPU from writes and urgent objects
            let p = priority(&req);
            let run = if self.inner.lanes.urgent(p) {
                Ok(self.run_task(req).await) // this runtime: no hop
            } else {
                let me = self.clone();
                let bulk = self
                    .inner
                    .lanes
                    .spawn(p, async move { me.run_task(req).await });
                bulk.await
            };
            let failed = match run {
                Ok(Ok(f)) => f,
                Ok(Err(e)) => {
                    tracing::warn!("worker {id:x}, task {task}: {e}");
                    Vec::new()
                }
                Err(e) => {
                    tracing::warn!("worker {id:x}, task {task} did not finish: {e}");
                    Vec::new()
                }
            };
            self.inner
                .counters
                .tasks_run
                .fetch_add(1, Ordering::Relaxed);
            {
                let mut ws = lock(&self.inner.workers);
                if let Some(s) = ws.get_mut(&id) {
                    s.busy = false;
                    s.block = block.clone();
                    s.last_task_ms = now_ms();
                }
            }
            let done = v1::DoneRequest {
                nonce,
                worker: id,
                task,
                block,
                failed,
            };
            if let Err(e) = self.inner.coord.done(done).await {
                tracing::debug!("reporting task {task} done: {e}");
            }
        }
    }
}

/// How often the bulk lane's switch looks at the outbox.
pub(super) const LANE_SAMPLE: Duration = Duration::from_millis(20);

/// Whether the bulk lane should be on, given whether it is (`on`) and the objects in the
/// outbox (put, not yet matched and delivered), sampled every 20 ms. On once a backlog built
/// up (300 objects: the node is not keeping up, and the order in which the CPU serves work
/// decides who waits); off only after 200 ms of calm (10 samples under 100 objects), so it
/// does not flap inside an overload. A busy CPU alone is no reason: without a backlog
/// nothing waits for long, and while off every object runs at one priority, so niced
/// threads never lengthen the tail of a load the node keeps up with.
pub fn lane_switch(on: bool, backlog: usize, calm: &mut u32) -> bool {
    if backlog >= 300 {
        *calm = 0;
        return true;
    }
    if backlog < 100 {
        *calm = calm.saturating_add(1);
    } else {
        *calm = 0;
    }
    on && *calm < 10
}

#[cfg(test)]
mod tests {
    use super::lane_switch;

    #[test]
    fn the_bulk_lane_turns_on_with_a_backlog_and_off_after_200_ms_of_calm() {
        let mut calm = 0;
        assert!(!lane_switch(false, 10, &mut calm), "no backlog");
        assert!(!lane_switch(false, 200, &mut calm), "below the threshold");
        assert!(lane_switch(false, 5_000, &mut calm), "a backlog");
        // a dip inside an overload does not turn it off
        let mut on = true;
        for _ in 0..9 {
            on = lane_switch(on, 10, &mut calm);
            assert!(on);
        }
        on = lane_switch(on, 200, &mut calm);
        assert!(on, "between the thresholds: calm starts over");
        for _ in 0..9 {
            on = lane_switch(on, 10, &mut calm);
            assert!(on);
        }
        assert!(!lane_switch(on, 10, &mut calm), "200 ms of calm");
    }
}
