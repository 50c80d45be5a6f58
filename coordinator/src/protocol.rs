//! The coordinator's protocol, sans I/O: the messages of the `Cluster` service in, replies and
//! calls to node daemons out, time passed in. It owns the scheduler ([`Coordinator`]) and
//! everything the workers need that the scheduler does not decide: the nodes and their
//! endpoints, each in-flight object's values, the image version it is matched against and
//! where its test results are cached. Every decision of the protocol is made here, so each is
//! a deterministic test (`coordinator/src/sim`): reports of an earlier coordinator (another
//! nonce) are ignored, a resent object already in flight is not admitted twice, attributes no
//! predicate mentions are dropped, a late report from a worker whose task was reassigned
//! records nothing, and an object whose test results went missing is tested again (up to
//! `max_attempts`, then left to its node's outbox resend).
//!
//! The driver (`server`) only moves messages: it feeds gRPC requests in, sends the calls out,
//! and feeds a call that failed back in ([`Protocol::assign_failed`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use proto::v1;

use crate::{Action, Block, Config, Coordinator, Event, ObjectKey, TaskId, WorkerId};

/// What the newest published image version holds, as the protocol needs it.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub version: u64,
    pub subscriptions: usize,
    /// Attributes some predicate mentions: an object's other attributes are dropped at once.
    pub attributes: Arc<HashSet<String>>,
}

/// A call to a node daemon.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Assign(v1::AssignRequest),
    Hello(v1::HelloRequest),
}

/// What the protocol asks its driver to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send `call` to node `node` (at the endpoint it registered).
    Send { node: u32, call: Call },
    /// An object was matched (for the put -> matched latency figures).
    Matched { received_unix_ms: u64 },
}

/// A block as the wire spells it.
pub fn block_name(b: &Block) -> String {
    match b {
        Block::Empty => "empty".into(),
        Block::Test(a) => format!("test:{a}"),
        Block::Match => "match".into(),
    }
}

/// Parses a block name; unknown names are empty workers.
pub fn parse_block(s: &str) -> Block {
    match s {
        "match" => Block::Match,
        _ => match s.strip_prefix("test:") {
            Some(a) => Block::Test(a.to_string()),
            None => Block::Empty,
        },
    }
}

/// A registered node.
#[derive(Debug, Clone)]
pub(crate) struct NodeEntry {
    pub(crate) endpoint: String,
    /// The first sequence number its store handed out.
    pub(crate) owns_from: u64,
    /// When it last registered or sent a heartbeat (ms).
    pub(crate) seen: u64,
    /// During a resize: the step it caught up for since it registered (0: none).
    pub(crate) caught_up: u64,
    /// During a resize: outside the grid moved to, it refuses puts and owes nothing.
    pub(crate) drained: bool,
}

#[derive(Debug)]
struct Obj {
    id: v1::ObjectId,
    /// The node that owns its dissemination (matches go there): the one that sent it.
    owner: u32,
    priority: u8,
    attrs: Vec<(String, v1::Value)>,
    version: u64,
    /// (test task, worker) that hold this object's test results.
    sources: Vec<(TaskId, WorkerId)>,
    attempts: u32,
    received_unix_ms: u64,
}

/// Message counts, for the admin API.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Messages in and out (registrations, heartbeats, arrivals, reports, assignments, hellos).
    pub messages: u64,
    pub arrived: u64,
    pub matched: u64,
    pub loads: u64,
}

/// The protocol state of one coordinator (one nonce).
#[derive(Debug)]
pub struct Protocol {
    sched: Coordinator,
    max_attempts: u32,
    /// Registered nodes and their endpoints.
    pub(crate) nodes: BTreeMap<u32, NodeEntry>,
    /// The grid of quorum replication, when the cluster has one.
    pub(crate) grid: Option<runtime::grid::Grid>,
    /// The grid an online resize moves to, until it is committed (`crate::resize`).
    pub(crate) next: Option<runtime::grid::Grid>,
    /// The resize's step (`v1::Membership::resize_step`).
    pub(crate) resize_step: u64,
    /// A node that sent nothing for this long is not alive in the membership.
    pub(crate) node_lease_ms: u64,
    /// Per position, the node that disseminates its orphaned objects (kept until it dies).
    pub(crate) heirs: BTreeMap<u32, u32>,
    objects: HashMap<ObjectKey, Obj>,
    by_id: HashMap<(u32, u64), ObjectKey>,
    next_key: ObjectKey,
    counts: Counts,
}

impl Protocol {
    /// A coordinator announcing `nonce`, starting at `now` ms; an object whose test results
    /// go missing `max_attempts` times is left to its node's outbox resend.
    pub fn new(cfg: Config, nonce: u64, max_attempts: u32, now: u64) -> Protocol {
        Protocol {
            node_lease_ms: cfg.lease_ms,
            sched: Coordinator::new(cfg, nonce, now),
            max_attempts,
            nodes: BTreeMap::new(),
            grid: None,
            next: None,
            resize_step: 0,
            heirs: BTreeMap::new(),
            objects: HashMap::new(),
            by_id: HashMap::new(),
            next_key: 1,
            counts: Counts::default(),
        }
    }

    /// The nonce this coordinator announces.
    pub fn nonce(&self) -> u64 {
        self.sched.nonce()
    }

    /// The scheduler, for figures.
    pub fn scheduler(&self) -> &Coordinator {
        &self.sched
    }

    /// The message counts.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Registered nodes.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The endpoint node `node` registered.
    pub fn endpoint(&self, node: u32) -> Option<&str> {
        self.nodes.get(&node).map(|n| n.endpoint.as_str())
    }

    /// Lays the nodes out in `grid` for quorum replication (told to every node).
    pub fn set_grid(&mut self, grid: Option<runtime::grid::Grid>) {
        self.grid = grid;
    }

    /// The grid, when the cluster has one.
    pub fn grid(&self) -> Option<runtime::grid::Grid> {
        self.grid
    }

    /// The grid with the one a resize moves to, when the cluster has one.
    pub fn layout(&self) -> Option<runtime::grid::Layout> {
        self.grid.map(|g| runtime::grid::Layout::new(g, self.next))
    }

    /// Every registered node, alive when it was heard from within the node lease, with its
    /// heir (with a grid); the nodes learn it with every heartbeat. An heir is kept until it
    /// dies, then the position's first live successor in the grid's order is the next.
    pub fn membership(&mut self, now: u64) -> v1::Membership {
        let lease = self.node_lease_ms;
        let alive = |n: &NodeEntry| now.saturating_sub(n.seen) <= lease;
        let live: std::collections::BTreeSet<u32> = self
            .nodes
            .iter()
            .filter(|(_, n)| alive(n))
            .map(|(k, _)| *k)
            .collect();
        if let Some(g) = self.layout() {
            for &p in self.nodes.keys() {
                let keep = self
                    .heirs
                    .get(&p)
                    .is_some_and(|h| *h != p && live.contains(h));
                if !keep {
                    match g.successor(p, |n| live.contains(&n)) {
                        Some(h) => {
                            self.heirs.insert(p, h);
                        }
                        None => {
                            self.heirs.remove(&p);
                        }
                    }
                }
            }
        }
        v1::Membership {
            rows: self.grid.map_or(0, |g| g.rows),
            cols: self.grid.map_or(0, |g| g.cols),
            next_rows: self.next.map_or(0, |g| g.rows),
            next_cols: self.next.map_or(0, |g| g.cols),
            resize_step: self.resize_step,
            lease_ms: lease,
            members: self
                .nodes
                .iter()
                .map(|(&node, n)| v1::Member {
                    node,
                    endpoint: n.endpoint.clone(),
                    alive: alive(n),
                    owns_from: n.owns_from,
                    heir: self.heirs.get(&node).copied(),
                })
                .collect(),
        }
    }

    /// Objects admitted and not matched yet.
    pub fn in_flight(&self) -> usize {
        self.objects.len()
    }

    /// With a grid, the endpoint of the live node (heard from within the node lease) that
    /// holds position `node` at another endpoint than `endpoint`: two live nodes at one
    /// position would both own its objects, so the second is refused until the first's lease
    /// runs out.
    pub fn position_held(&self, now: u64, node: u32, endpoint: &str) -> Option<&str> {
        self.grid?;
        let n = self.nodes.get(&node)?;
        (n.endpoint != endpoint && now.saturating_sub(n.seen) <= self.node_lease_ms)
            .then_some(n.endpoint.as_str())
    }

    /// A node registered (or registered again) at `endpoint` with `workers`; the reply is the
    /// nonce.
    pub fn register(&mut self, now: u64, r: &v1::RegisterRequest) -> (u64, Vec<Output>) {
        self.counts.messages += 1;
        self.nodes.insert(
            r.node,
            NodeEntry {
                endpoint: r.endpoint.clone(),
                owns_from: r.owns_from,
                seen: now,
                caught_up: 0,
                drained: false,
            },
        );
        let mut out = Vec::new();
        for w in &r.workers {
            self.join(now, r.node, w, &mut out);
        }
        (self.nonce(), out)
    }

    /// A node's heartbeat: renews its workers' leases, joins the workers it started and
    /// removes those it terminated. A node of another coordinator, or one that never
    /// registered, changes nothing and learns the nonce (it registers again). A worker judged
    /// dead never comes back under its id.
    pub fn heartbeat(&mut self, now: u64, h: &v1::HeartbeatRequest) -> (u64, Vec<Output>) {
        self.counts.messages += 1;
        let mut out = Vec::new();
        if h.nonce != self.nonce() {
            return (self.nonce(), out);
        }
        match self.nodes.get_mut(&h.node) {
            Some(n) => {
                n.seen = now;
                n.caught_up = h.caught_up_step;
                n.drained = h.drained;
            }
            None => return (self.nonce(), out),
        }
        for w in &h.started {
            if !self.sched.has_worker(w.worker) {
                self.join(now, h.node, w, &mut out);
            }
        }
        for &w in &h.terminated {
            self.step(now, Event::WorkerLeft { worker: w }, &mut out);
        }
        for w in &h.workers {
            if self.sched.has_worker(w.worker) {
                self.step(now, Event::Heartbeat { worker: w.worker }, &mut out);
            } else if !self.sched.is_dead(w.worker) && !h.terminated.contains(&w.worker) {
                self.join(now, h.node, w, &mut out);
            }
        }
        (self.nonce(), out)
    }

    /// Objects a node stored: each one not in flight already (a resend) is admitted with the
    /// attributes some predicate of `published` mentions, to be matched against that version.
    /// The reply is how many were admitted.
    pub fn arrived(
        &mut self,
        now: u64,
        a: v1::ArrivedRequest,
        published: &Published,
    ) -> (u32, Vec<Output>) {
        self.counts.messages += 1;
        let mut out = Vec::new();
        let mut accepted = 0;
        for o in a.objects {
            let Some(id) = o.id else { continue };
            if let Some(k) = self.by_id.get(&(id.node, id.seq)) {
                // in flight already (a resend); sent by another node, it took the object's
                // origin over: its matches go there
                if let Some(o) = self.objects.get_mut(k) {
                    o.owner = a.node;
                }
                continue;
            }
            let attrs = o
                .metadata
                .into_iter()
                .filter(|at| published.attributes.contains(&at.name))
                .filter_map(|at| at.value.map(|v| (at.name, v)))
                .collect();
            accepted += 1;
            self.admit(
                now,
                Obj {
                    id,
                    owner: a.node,
                    priority: o.priority.min(u32::from(runtime::URGENT_PRIORITY)) as u8,
                    attrs,
                    version: published.version,
                    sources: Vec::new(),
                    attempts: 0,
                    received_unix_ms: o.received_unix_ms,
                },
                &mut out,
            );
        }
        self.counts.arrived += u64::from(accepted);
        (accepted, out)
    }

    /// A worker's report of a finished task. A report of another coordinator's task, or a
    /// late one from a worker whose task was reassigned, records nothing (the worker still
    /// comes free). A test task's objects learn where their results are cached; a match
    /// task's objects are matched, except those whose results could not be collected
    /// (`failed`), which are tested again against the newest version of `published`.
    pub fn done(&mut self, now: u64, d: &v1::DoneRequest, published: &Published) -> Vec<Output> {
        self.counts.messages += 1;
        let mut out = Vec::new();
        if d.nonce != self.nonce() {
            return out; // a task of an earlier coordinator
        }
        if let Some((block, keys)) = self.sched.running_task(d.task, d.worker) {
            let (block, keys) = (block.clone(), keys.to_vec());
            self.task_finished(now, d, &block, keys, published, &mut out);
        }
        self.step(
            now,
            Event::TaskDone {
                worker: d.worker,
                task: d.task,
                block: parse_block(&d.block),
            },
            &mut out,
        );
        out
    }

    /// An assignment did not reach its worker: the worker leaves (its task goes back to the
    /// queue) unless the task was taken from it meanwhile.
    pub fn assign_failed(&mut self, now: u64, worker: WorkerId, task: TaskId) -> Vec<Output> {
        let mut out = Vec::new();
        if self.sched.running_task(task, worker).is_some() {
            self.step(now, Event::WorkerLeft { worker }, &mut out);
        }
        out
    }

    /// Time passes: batches close on deadline, overdue tasks are reassigned, hellos go out.
    pub fn tick(&mut self, now: u64) -> Vec<Output> {
        let mut out = Vec::new();
        self.step(now, Event::Tick, &mut out);
        out
    }

    fn join(&mut self, now: u64, node: u32, w: &v1::WorkerState, out: &mut Vec<Output>) {
        self.step(
            now,
            Event::WorkerJoined {
                worker: w.worker,
                node,
                block: parse_block(&w.block),
                urgent: w.urgent,
            },
            out,
        );
    }

    /// Steps the scheduler and turns its actions into calls. An assignment to a worker whose
    /// node never registered fails at once (the worker leaves; its task is queued again).
    fn step(&mut self, now: u64, e: Event, out: &mut Vec<Output>) {
        let mut events = std::collections::VecDeque::from([e]);
        while let Some(e) = events.pop_front() {
            for a in self.sched.step(now, e) {
                if let Some(failed) = self.act(a, out) {
                    events.push_back(failed);
                }
            }
        }
    }

    /// Records what a finished task produced: where test results are cached, or which
    /// objects are matched (and which must be tested again).
    fn task_finished(
        &mut self,
        now: u64,
        d: &v1::DoneRequest,
        block: &Block,
        keys: Vec<ObjectKey>,
        published: &Published,
        out: &mut Vec<Output>,
    ) {
        if *block != Block::Match {
            for k in keys {
                if let Some(o) = self.objects.get_mut(&k) {
                    o.sources.push((d.task, d.worker));
                }
            }
            return;
        }
        for k in keys {
            if d.failed.contains(&k) {
                self.retry(now, k, published, out);
            } else if let Some(o) = self.objects.remove(&k) {
                self.by_id.remove(&(o.id.node, o.id.seq));
                self.counts.matched += 1;
                out.push(Output::Matched {
                    received_unix_ms: o.received_unix_ms,
                });
            }
        }
    }

    fn admit(&mut self, now: u64, o: Obj, out: &mut Vec<Output>) {
        let key = self.next_key;
        self.next_key += 1;
        let attrs = o.attrs.iter().map(|(n, _)| n.clone()).collect();
        let priority = o.priority;
        self.by_id.insert((o.id.node, o.id.seq), key);
        self.objects.insert(key, o);
        self.step(
            now,
            Event::ObjectArrived {
                object: key,
                priority,
                attrs,
            },
            out,
        );
    }

    /// Tests an object again (its results went missing), against the newest version.
    fn retry(&mut self, now: u64, key: ObjectKey, published: &Published, out: &mut Vec<Output>) {
        let Some(mut o) = self.objects.remove(&key) else {
            return;
        };
        self.by_id.remove(&(o.id.node, o.id.seq));
        o.attempts += 1;
        if o.attempts >= self.max_attempts {
            tracing::warn!(
                "object {}:{} failed {} times; left to its node's outbox resend",
                o.id.node,
                o.id.seq,
                o.attempts
            );
            return;
        }
        o.version = published.version;
        o.attrs.retain(|(n, _)| published.attributes.contains(n));
        o.sources.clear();
        self.admit(now, o, out);
    }

    /// The endpoint of the node holding `worker` ("" if it is gone: the fetch fails and the
    /// object is tested again).
    fn worker_endpoint(&self, w: WorkerId) -> String {
        self.sched
            .node_of(w)
            .and_then(|n| self.nodes.get(&n))
            .map(|n| n.endpoint.clone())
            .unwrap_or_default()
    }

    /// Turns one scheduler action into output; returns the event to step when an assignment
    /// cannot be sent at all.
    fn act(&mut self, a: Action, out: &mut Vec<Output>) -> Option<Event> {
        match a {
            Action::Assign {
                worker,
                task,
                block,
                objects,
                load,
                priority,
            } => {
                let node = self
                    .sched
                    .node_of(worker)
                    .filter(|n| self.nodes.contains_key(n));
                let Some(node) = node else {
                    return Some(Event::WorkerLeft { worker });
                };
                let mut req = v1::AssignRequest {
                    nonce: self.nonce(),
                    worker,
                    task,
                    block: block_name(&block),
                    load: load.is_some(),
                    tests: Vec::new(),
                    matches: Vec::new(),
                    priority: u32::from(priority),
                };
                match &block {
                    Block::Test(attr) => {
                        for k in &objects {
                            if let Some(o) = self.objects.get(k)
                                && let Some((_, v)) = o.attrs.iter().find(|(n, _)| n == attr)
                            {
                                req.tests.push(v1::TestItem {
                                    key: *k,
                                    value: Some(v.clone()),
                                    version: o.version,
                                });
                            }
                        }
                    }
                    Block::Match => {
                        for k in &objects {
                            let Some(o) = self.objects.get(k) else {
                                continue;
                            };
                            req.matches.push(v1::MatchItem {
                                key: *k,
                                id: Some(o.id),
                                origin: self.endpoint(o.owner).unwrap_or_default().to_string(),
                                version: o.version,
                                sources: o
                                    .sources
                                    .iter()
                                    .map(|(t, w)| v1::Source {
                                        task: *t,
                                        endpoint: self.worker_endpoint(*w),
                                    })
                                    .collect(),
                            });
                        }
                    }
                    Block::Empty => {}
                }
                if load.is_some() {
                    self.counts.loads += 1;
                }
                self.counts.messages += 1;
                out.push(Output::Send {
                    node,
                    call: Call::Assign(req),
                });
            }
            Action::Hello { nonce } => {
                for &node in self.nodes.keys() {
                    self.counts.messages += 1;
                    out.push(Output::Send {
                        node,
                        call: Call::Hello(v1::HelloRequest { nonce }),
                    });
                }
            }
            Action::Reassigned { task, from } => {
                tracing::info!("task {task} taken back from worker {from:x}");
            }
            Action::WorkerDead { worker } => {
                tracing::info!("worker {worker:x} judged dead");
            }
        }
        None
    }
}
