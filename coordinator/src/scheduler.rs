//! The scheduler of DESIGN §5 (see the crate docs): idle queues per block, waiting tasks by
//! priority with bounded aging, the four assignment rules, batching, leases and reassignment.
//! Events in, actions out; no I/O, no clock.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crate::{Action, Block, Config, Event, ObjectKey, Snapshot, TaskId, WorkerId};
use runtime::URGENT_PRIORITY;

#[derive(Clone, Debug)]
struct Task {
    id: TaskId,
    block: Block,
    objects: Vec<ObjectKey>,
    priority: u8,
    enqueued: u64,
}

#[derive(Clone, Debug)]
struct Running {
    task: Task,
    worker: WorkerId,
    started: u64,
}

#[derive(Clone, Debug)]
struct Worker {
    node: u32,
    block: Block,
    lease_until: u64,
    busy: bool,
    /// The node keeps it for priority-7 tasks only (its urgent reserve).
    urgent: bool,
}

#[derive(Clone, Debug, Default)]
struct Batch {
    objects: Vec<ObjectKey>,
    /// Each object's priority (same order as `objects`).
    priorities: Vec<u8>,
    priority: u8,
    opened: u64,
}

#[derive(Clone, Debug, Default)]
struct Mean {
    sum: f64,
    n: u64,
}

impl Mean {
    fn add(&mut self, x: f64) {
        self.sum += x;
        self.n += 1;
    }

    fn get(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / self.n as f64)
    }
}

/// What the admin API shows of a live worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerRow {
    pub id: WorkerId,
    pub node: u32,
    pub block: Block,
    pub busy: bool,
    /// Of its node's urgent reserve (priority-7 tasks only).
    pub urgent: bool,
}

/// Which idle workers a task may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    /// Any (a priority-7 task).
    Any,
    /// Not one of a node's urgent reserve (a task below priority 7).
    Ordinary,
    /// Only one of an urgent reserve.
    Reserve,
}

/// The scheduler.
#[derive(Debug)]
pub struct Coordinator {
    cfg: Config,
    nonce: u64,
    now: u64,
    last_hello: Option<u64>,
    next_task: TaskId,
    workers: HashMap<WorkerId, Worker>,
    dead: HashSet<WorkerId>,
    idle: BTreeMap<Block, VecDeque<WorkerId>>,
    waiting: Vec<Task>,
    running: HashMap<TaskId, Running>,
    test_batches: BTreeMap<String, Batch>,
    match_batch: Batch,
    /// When each block's last batch closed.
    closed_at: HashMap<Block, u64>,
    /// Objects waiting for their tests: attributes still to test, priority.
    pending: HashMap<ObjectKey, (usize, u8)>,
    mean_test: Mean,
    mean_match: Mean,
    reassignments: u64,
}

impl Coordinator {
    /// A coordinator with a random `nonce` (chosen by the caller) starting at `now` ms.
    pub fn new(cfg: Config, nonce: u64, now: u64) -> Coordinator {
        Coordinator {
            cfg,
            nonce,
            now,
            last_hello: None,
            next_task: 1,
            workers: HashMap::new(),
            dead: HashSet::new(),
            idle: BTreeMap::new(),
            waiting: Vec::new(),
            running: HashMap::new(),
            test_batches: BTreeMap::new(),
            match_batch: Batch::default(),
            closed_at: HashMap::new(),
            pending: HashMap::new(),
            mean_test: Mean::default(),
            mean_match: Mean::default(),
            reassignments: 0,
        }
    }

    /// The nonce this coordinator announces.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Applies an event at time `now` (ms; never goes backwards) and returns the actions.
    pub fn step(&mut self, now: u64, event: Event) -> Vec<Action> {
        self.now = self.now.max(now);
        let mut out = Vec::new();
        match event {
            Event::WorkerJoined {
                worker,
                node,
                block,
                urgent,
            } => {
                if self.dead.contains(&worker) {
                    return out; // a dead worker never comes back under the same id
                }
                self.remove_idle(worker);
                self.workers.insert(
                    worker,
                    Worker {
                        node,
                        block: block.clone(),
                        lease_until: self.now + self.cfg.lease_ms,
                        busy: false,
                        urgent,
                    },
                );
                self.idle.entry(block).or_default().push_back(worker);
            }
            Event::Heartbeat { worker } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.lease_until = self.now + self.cfg.lease_ms;
                }
            }
            Event::WorkerLeft { worker } => {
                self.remove_idle(worker);
                self.workers.remove(&worker);
                // its running task, if any, goes back to the queue
                let mut tasks: Vec<TaskId> = self
                    .running
                    .iter()
                    .filter(|(_, r)| r.worker == worker)
                    .map(|(t, _)| *t)
                    .collect();
                tasks.sort_unstable();
                for t in tasks {
                    if let Some(r) = self.running.remove(&t) {
                        self.reassignments += 1;
                        out.push(Action::Reassigned {
                            task: t,
                            from: worker,
                        });
                        self.waiting.push(r.task);
                    }
                }
            }
            Event::ObjectArrived {
                object,
                priority,
                attrs,
            } => {
                let priority = priority.min(URGENT_PRIORITY);
                if attrs.is_empty() {
                    self.add_to_match(object, priority);
                } else {
                    self.pending.insert(object, (attrs.len(), priority));
                    for a in attrs {
                        let (full, urgent) = {
                            let b = self.test_batches.entry(a.clone()).or_default();
                            if b.objects.is_empty() {
                                b.opened = self.now;
                            }
                            b.objects.push(object);
                            b.priorities.push(priority);
                            b.priority = b.priority.max(priority);
                            (
                                b.objects.len() >= self.cfg.test_batch,
                                b.priority >= URGENT_PRIORITY,
                            )
                        };
                        if full || self.eager(&Block::Test(a.clone()), urgent) {
                            self.close_test_batch(&a);
                        }
                    }
                }
            }
            Event::TaskDone {
                worker,
                task,
                block,
            } => {
                let valid = self.running.get(&task).is_some_and(|r| r.worker == worker);
                if valid && let Some(r) = self.running.remove(&task) {
                    let took = (self.now - r.started) as f64;
                    match &r.task.block {
                        Block::Match => self.mean_match.add(took),
                        _ => {
                            self.mean_test.add(took);
                            for o in &r.task.objects {
                                let done = match self.pending.get_mut(o) {
                                    Some(p) => {
                                        p.0 -= 1;
                                        (p.0 == 0).then_some(p.1)
                                    }
                                    None => None,
                                };
                                if let Some(prio) = done {
                                    self.pending.remove(o);
                                    self.add_to_match(*o, prio);
                                }
                            }
                        }
                    }
                }
                // a late report from a worker judged dead is ignored: its task was reassigned
                if self.workers.contains_key(&worker) {
                    self.remove_idle(worker); // never queued twice
                }
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.busy = false;
                    w.block = block.clone();
                    w.lease_until = self.now + self.cfg.lease_ms;
                    self.idle
                        .entry(block.clone())
                        .or_default()
                        .push_back(worker);
                }
                // the worker that came free takes what gathered while it was busy
                match &block {
                    Block::Test(a)
                        if self
                            .test_batches
                            .get(a)
                            .is_some_and(|b| self.eager(&block, b.priority >= URGENT_PRIORITY)) =>
                    {
                        let a = a.clone();
                        self.close_test_batch(&a);
                    }
                    Block::Match
                        if !self.match_batch.objects.is_empty()
                            && self.eager(&block, self.match_batch.priority >= URGENT_PRIORITY) =>
                    {
                        self.close_match_batch();
                    }
                    _ => {}
                }
            }
            Event::Tick => {
                let closing: Vec<String> = self
                    .test_batches
                    .iter()
                    .filter(|(_, b)| {
                        !b.objects.is_empty() && self.now >= b.opened + self.cfg.batch_deadline_ms
                    })
                    .map(|(a, _)| a.clone())
                    .collect();
                for a in closing {
                    self.close_test_batch(&a);
                }
                if !self.match_batch.objects.is_empty()
                    && self.now >= self.match_batch.opened + self.cfg.batch_deadline_ms
                {
                    self.close_match_batch();
                }
                self.reassign_overdue(&mut out);
                if self
                    .last_hello
                    .is_none_or(|t| self.now >= t + self.cfg.hello_every_ms)
                {
                    self.last_hello = Some(self.now);
                    out.push(Action::Hello { nonce: self.nonce });
                }
            }
        }
        self.schedule(&mut out);
        out
    }

    fn add_to_match(&mut self, object: ObjectKey, priority: u8) {
        if self.match_batch.objects.is_empty() {
            self.match_batch.opened = self.now;
        }
        self.match_batch.objects.push(object);
        self.match_batch.priorities.push(priority);
        self.match_batch.priority = self.match_batch.priority.max(priority);
        if self.match_batch.objects.len() >= self.cfg.match_batch
            || self.eager(&Block::Match, self.match_batch.priority >= URGENT_PRIORITY)
        {
            self.close_match_batch();
        }
    }

    /// Whether an open batch of `block` closes now rather than on size or deadline: a worker
    /// holding the block is idle, no task of the block waits or runs, and the block's last
    /// batch held one object or closed at least a deadline ago. So an object that finds the
    /// cluster idle waits for no batch, while under a stream that gathers a block still
    /// starts at most one task per deadline (messages per object stay as low as with
    /// deadlines alone). A worker of an urgent reserve counts only for a batch that holds a
    /// priority-7 object (`urgent`).
    fn eager(&self, block: &Block, urgent: bool) -> bool {
        self.cfg.eager_close
            && self
                .closed_at
                .get(block)
                .is_none_or(|t| self.now >= t + self.cfg.batch_deadline_ms)
            && self
                .idle
                .get(block)
                .is_some_and(|q| q.iter().any(|w| self.takes(*w, urgent)))
            && !self.waiting.iter().any(|t| t.block == *block)
            && !self.running.values().any(|r| r.task.block == *block)
    }

    fn new_task(&mut self, block: Block, b: Batch) -> Task {
        let id = self.next_task;
        self.next_task += 1;
        Task {
            id,
            block,
            objects: b.objects,
            priority: b.priority,
            enqueued: self.now,
        }
    }

    fn close_test_batch(&mut self, attr: &str) {
        if let Some(b) = self.test_batches.remove(attr) {
            let block = Block::Test(attr.to_string());
            self.closed(&block, b.objects.len());
            self.enqueue(block, b, self.cfg.test_batch);
        }
    }

    fn close_match_batch(&mut self) {
        let b = std::mem::take(&mut self.match_batch);
        self.closed(&Block::Match, b.objects.len());
        self.enqueue(Block::Match, b, self.cfg.match_batch);
    }

    /// A batch of `block` with `objects` closed now. Only a batch that gathered more than one
    /// object holds the next eager close back for a deadline: objects that come one at a
    /// time are no stream to gather, and each goes at once.
    fn closed(&mut self, block: &Block, objects: usize) {
        if objects > 1 {
            self.closed_at.insert(block.clone(), self.now);
        } else {
            self.closed_at.remove(block);
        }
    }

    /// Queues a closed batch. When nothing waits and a worker is idle it goes whole (it
    /// starts now). Otherwise the cluster is saturated and the batch is split by priority, so
    /// a waiting task carries one level and urgent objects overtake the backlog; each part
    /// joins a waiting task of the same block and priority, up to the batch size: tasks grow
    /// instead of multiplying, so per-object messages fall as load rises.
    ///
    /// Priority-7 objects always form tasks of their own (nodes run those at a higher OS
    /// priority, see [`Coordinator::top_up`]).
    fn enqueue(&mut self, block: Block, b: Batch, max: usize) {
        if self.waiting.is_empty() && self.idle.values().any(|q| !q.is_empty()) {
            let urgent = b
                .priorities
                .iter()
                .filter(|p| **p >= URGENT_PRIORITY)
                .count();
            if urgent == 0 || urgent == b.objects.len() {
                let t = self.new_task(block, b);
                self.waiting.push(t);
                return;
            }
            let (mut hi, mut lo) = (Batch::default(), Batch::default());
            for (o, p) in b.objects.into_iter().zip(b.priorities) {
                let part = if p >= URGENT_PRIORITY {
                    &mut hi
                } else {
                    &mut lo
                };
                part.objects.push(o);
                part.priority = part.priority.max(p);
            }
            for part in [hi, lo] {
                let t = self.new_task(block.clone(), part);
                self.waiting.push(t);
            }
            return;
        }
        let mut by_priority: BTreeMap<u8, Vec<ObjectKey>> = BTreeMap::new();
        for (o, p) in b.objects.into_iter().zip(b.priorities) {
            by_priority.entry(p).or_default().push(o);
        }
        for (priority, objects) in by_priority.into_iter().rev() {
            if let Some(t) = self
                .waiting
                .iter_mut()
                .filter(|t| {
                    t.block == block
                        && t.priority == priority
                        && t.objects.len() + objects.len() <= max
                })
                .min_by_key(|t| t.id)
            {
                t.objects.extend(objects);
                continue;
            }
            let part = Batch {
                objects,
                priorities: Vec::new(),
                priority,
                opened: b.opened,
            };
            let t = self.new_task(block.clone(), part);
            self.waiting.push(t);
        }
    }

    fn timeout_of(&self, block: &Block) -> u64 {
        let mean = match block {
            Block::Match => self.mean_match.get(),
            _ => self.mean_test.get(),
        };
        match mean {
            Some(m) => ((m * self.cfg.timeout_multiple) as u64).max(self.cfg.min_timeout_ms),
            None => self.cfg.min_timeout_ms.max(self.cfg.lease_ms),
        }
    }

    fn reassign_overdue(&mut self, out: &mut Vec<Action>) {
        let mut overdue: Vec<TaskId> = self
            .running
            .iter()
            .filter(|(_, r)| self.now > r.started + self.timeout_of(&r.task.block))
            .map(|(t, _)| *t)
            .collect();
        overdue.sort_unstable(); // in task order, not the hash map's
        for t in overdue {
            if let Some(r) = self.running.remove(&t) {
                self.kill(r.worker, out);
                self.reassignments += 1;
                out.push(Action::Reassigned {
                    task: t,
                    from: r.worker,
                });
                self.waiting.push(r.task);
            }
        }
    }

    fn kill(&mut self, worker: WorkerId, out: &mut Vec<Action>) {
        self.remove_idle(worker);
        self.workers.remove(&worker);
        if self.dead.insert(worker) {
            out.push(Action::WorkerDead { worker });
        }
    }

    fn remove_idle(&mut self, worker: WorkerId) {
        for q in self.idle.values_mut() {
            q.retain(|w| *w != worker);
        }
        self.idle.retain(|_, q| !q.is_empty());
    }

    /// Whether idle worker `w` may take a task: a worker of an urgent reserve takes only a
    /// priority-7 one (`urgent`; as put, not aged into it).
    fn takes(&self, w: WorkerId, urgent: bool) -> bool {
        self.fits(w, if urgent { Fit::Any } else { Fit::Ordinary })
    }

    /// Whether idle worker `w` is of the kind `fit` asks for (an unknown one is popped and
    /// dropped by [`Coordinator::pop_live`]).
    fn fits(&self, w: WorkerId, fit: Fit) -> bool {
        self.workers.get(&w).is_none_or(|i| match fit {
            Fit::Any => true,
            Fit::Ordinary => !i.urgent,
            Fit::Reserve => i.urgent,
        })
    }

    /// Pops a live idle worker of the kind `fit` asks for from the queue of `block` (lease
    /// checked; expired ones die).
    fn pop_live(&mut self, block: &Block, fit: Fit, out: &mut Vec<Action>) -> Option<WorkerId> {
        loop {
            let q = self.idle.get(block)?;
            let at = q.iter().position(|w| self.fits(*w, fit))?;
            let w = self.idle.get_mut(block)?.remove(at)?;
            if self.idle.get(block).is_some_and(|q| q.is_empty()) {
                self.idle.remove(block);
            }
            match self.workers.get(&w) {
                Some(info) if info.lease_until >= self.now => return Some(w),
                Some(_) => self.kill(w, out),
                None => {}
            }
        }
    }

    /// Pops an idle worker of an urgent reserve for a task of `block`: one holding the block,
    /// else any (told to load the block; loads on a node are cheap, the image is shared).
    fn pop_reserve(
        &mut self,
        block: &Block,
        out: &mut Vec<Action>,
    ) -> Option<(WorkerId, Option<Block>)> {
        if let Some(w) = self.pop_live(block, Fit::Reserve, out) {
            return Some((w, None));
        }
        loop {
            let other = self
                .idle
                .iter()
                .find(|(_, q)| q.iter().any(|w| self.fits(*w, Fit::Reserve)))
                .map(|(b, _)| b.clone())?;
            if let Some(w) = self.pop_live(&other, Fit::Reserve, out) {
                return Some((w, Some(block.clone())));
            }
        }
    }

    fn effective_priority(&self, t: &Task) -> u64 {
        let aged = (self.now - t.enqueued) / self.cfg.aging_ms.max(1);
        (t.priority as u64 + aged).min(u64::from(URGENT_PRIORITY))
    }

    fn schedule(&mut self, out: &mut Vec<Action>) {
        loop {
            if self.waiting.is_empty() {
                return;
            }
            // highest effective priority, then put as urgent (an object put at 7 before
            // one aged into it), then oldest
            let best = (0..self.waiting.len())
                .max_by(|&a, &b| {
                    let (ta, tb) = (&self.waiting[a], &self.waiting[b]);
                    self.effective_priority(ta)
                        .cmp(&self.effective_priority(tb))
                        .then(ta.priority.cmp(&tb.priority))
                        .then(tb.enqueued.cmp(&ta.enqueued))
                        .then(tb.id.cmp(&ta.id))
                })
                .unwrap_or(0);
            let block = self.waiting[best].block.clone();
            // no waiting task outranks `best`: when it is not urgent, none is
            let urgent = self.waiting[best].priority >= URGENT_PRIORITY;
            let fit = if urgent { Fit::Any } else { Fit::Ordinary };
            let (worker, load) =
                if let Some(w) = urgent.then(|| self.pop_reserve(&block, out)).flatten() {
                    w // an urgent task takes the reserve first: the others stay with the backlog
                } else if let Some(w) = self.pop_live(&block, fit, out) {
                    (w, None)
                } else if let Some(w) = self.pop_live(&Block::Empty, fit, out) {
                    (w, Some(block.clone()))
                } else {
                    // the longest other idle queue gives up a worker to switch
                    let longest = self
                        .idle
                        .iter()
                        .filter(|(b, q)| **b != block && q.iter().any(|w| self.takes(*w, urgent)))
                        .max_by_key(|(_, q)| q.len())
                        .map(|(b, _)| b.clone());
                    match longest.and_then(|b| self.pop_live(&b, fit, out)) {
                        Some(w) => (w, Some(block.clone())),
                        None => {
                            if !self.idle.values().flatten().any(|w| self.takes(*w, urgent)) {
                                return; // at capacity: the task waits
                            }
                            continue; // dead workers were dropped; try again
                        }
                    }
                };
            let mut task = self.waiting.swap_remove(best);
            let priority = self.effective_priority(&task) as u8;
            self.top_up(&mut task, priority);
            if let Some(w) = self.workers.get_mut(&worker) {
                w.busy = true;
                w.block = block.clone();
            }
            out.push(Action::Assign {
                worker,
                task: task.id,
                block: block.clone(),
                objects: task.objects.clone(),
                load,
                priority,
            });
            self.running.insert(
                task.id,
                Running {
                    task,
                    worker,
                    started: self.now,
                },
            );
        }
    }

    /// Fills a task about to start with the waiting objects of its block, highest effective
    /// priority first, then oldest, up to the batch size: waiting tasks carry one priority
    /// each, but the tasks that run stay as large as the backlog allows. A task that starts
    /// at priority 7 takes only objects at 7 (aging included): nodes run those apart, at a
    /// higher OS priority, and a backlog must not ride along.
    fn top_up(&mut self, task: &mut Task, priority: u8) {
        let max = match task.block {
            Block::Match => self.cfg.match_batch,
            _ => self.cfg.test_batch,
        };
        if task.objects.len() >= max {
            return;
        }
        let mut same: Vec<(std::cmp::Reverse<u64>, u64, TaskId, usize)> = self
            .waiting
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                t.block == task.block
                    && (priority < URGENT_PRIORITY
                        || self.effective_priority(t) >= u64::from(URGENT_PRIORITY))
            })
            .map(|(i, t)| {
                (
                    std::cmp::Reverse(self.effective_priority(t)),
                    t.enqueued,
                    t.id,
                    i,
                )
            })
            .collect();
        same.sort_unstable();
        let mut emptied = Vec::new();
        for (_, _, _, i) in same {
            let room = max.saturating_sub(task.objects.len());
            if room == 0 {
                break;
            }
            let t = &mut self.waiting[i];
            let take = room.min(t.objects.len());
            task.objects.extend(t.objects.drain(..take));
            if t.objects.is_empty() {
                emptied.push(i);
            }
        }
        emptied.sort_unstable_by(|a, b| b.cmp(a));
        for i in emptied {
            self.waiting.swap_remove(i);
        }
    }

    /// Counts for the admin API.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot {
            waiting_tasks: self.waiting.len(),
            open_batches: self.test_batches.len()
                + usize::from(!self.match_batch.objects.is_empty()),
            mean_test_ms: self.mean_test.get().unwrap_or(0.0),
            mean_match_ms: self.mean_match.get().unwrap_or(0.0),
            reassignments: self.reassignments,
            dead_workers: self.dead.len() as u64,
            ..Snapshot::default()
        };
        for w in self.workers.values() {
            let m = if w.busy { &mut s.busy } else { &mut s.idle };
            *m.entry(w.block.clone()).or_default() += 1;
        }
        s
    }

    /// Whether `worker` is a live worker this coordinator knows.
    pub fn has_worker(&self, worker: WorkerId) -> bool {
        self.workers.contains_key(&worker)
    }

    /// The node of live worker `worker`.
    pub fn node_of(&self, worker: WorkerId) -> Option<u32> {
        self.workers.get(&worker).map(|w| w.node)
    }

    /// The block and objects of `task` if it runs on `worker` (not taken back from it).
    pub fn running_task(&self, task: TaskId, worker: WorkerId) -> Option<(&Block, &[ObjectKey])> {
        self.running
            .get(&task)
            .filter(|r| r.worker == worker)
            .map(|r| (&r.task.block, r.task.objects.as_slice()))
    }

    /// Whether `worker` was judged dead.
    pub fn is_dead(&self, worker: WorkerId) -> bool {
        self.dead.contains(&worker)
    }

    /// Every live worker, by id.
    pub fn worker_list(&self) -> Vec<WorkerRow> {
        let mut v: Vec<_> = self
            .workers
            .iter()
            .map(|(id, w)| WorkerRow {
                id: *id,
                node: w.node,
                block: w.block.clone(),
                busy: w.busy,
                urgent: w.urgent,
            })
            .collect();
        v.sort_by_key(|w| w.id);
        v
    }

    /// Workers of a node (for re-registration after a coordinator change).
    pub fn workers_of(&self, node: u32) -> Vec<WorkerId> {
        let mut v: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| w.node == node)
            .map(|(id, _)| *id)
            .collect();
        v.sort_unstable();
        v
    }
}
