//! A raft-rs-style harness: the coordinator's [`Protocol`] and simulated node daemons, stepped
//! over a simulated network in simulated time, deterministically. Links can be `cut`, a node
//! `isolate`d and everything `recover`ed; single messages can be dropped or held back; the
//! coordinator can be replaced by a new one (a new nonce).
//!
//! The simulated node follows the daemon's rules (`worker::daemon`) without its I/O: it
//! registers and heartbeats, sends each stored object in `Arrived` and keeps it in its outbox
//! until a match for it arrives, resends what stayed there too long (and everything after
//! registering with a new coordinator), runs test tasks by caching the keys it was given, and
//! match tasks by fetching those keys from the test workers' nodes (over the network: a cut
//! link or a missing result fails the object), sending the matches to the origin node and
//! reporting `Done`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use proto::v1;

use crate::protocol::{Call, Output, Protocol, Published};
use crate::{Config, TaskId, WorkerId};

/// The coordinator's address on the simulated network (nodes are 1..).
pub const COORD: u32 = 0;

/// How often a node heartbeats, and after how long it resends an object still in its outbox.
const HEARTBEAT_MS: u64 = 20;
const RESEND_MS: u64 = 300;

/// A message on the simulated network.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    Register(v1::RegisterRequest),
    Heartbeat(v1::HeartbeatRequest),
    Arrived(v1::ArrivedRequest),
    Done(v1::DoneRequest),
    Assign(v1::AssignRequest),
    Hello(v1::HelloRequest),
    /// The reply to a registration: the coordinator's nonce.
    Registered(u64),
    /// The reply to a heartbeat: the coordinator's nonce.
    Beat(u64),
    /// Matches of objects of the receiving node (from a match worker's node).
    Matched(Vec<v1::ObjectId>),
}

#[derive(Debug, Clone)]
struct Envelope {
    from: u32,
    to: u32,
    msg: Msg,
}

/// Chooses messages by (from, to, message).
type Filter = Box<dyn Fn(u32, u32, &Msg) -> bool>;

/// The simulated network: messages in order, cut links, and a filter that drops or holds
/// back chosen messages.
#[derive(Default)]
pub struct Network {
    queue: VecDeque<Envelope>,
    cut: BTreeSet<(u32, u32)>,
    /// Messages matching this are taken out once (dropped, or held when `hold` is set).
    take: Option<(Filter, usize, bool)>,
    held: Vec<Envelope>,
    pub dropped: usize,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("queued", &self.queue.len())
            .field("cut", &self.cut)
            .field("held", &self.held.len())
            .finish()
    }
}

impl Network {
    fn send(&mut self, from: u32, to: u32, msg: Msg) {
        if self.cut.contains(&(from, to)) {
            self.dropped += 1;
            return;
        }
        if let Some((pred, left, hold)) = &mut self.take
            && *left > 0
            && pred(from, to, &msg)
        {
            *left -= 1;
            if *hold {
                self.held.push(Envelope { from, to, msg });
            } else {
                self.dropped += 1;
            }
            return;
        }
        self.queue.push_back(Envelope { from, to, msg });
    }

    /// Whether `a` can reach `b`.
    pub fn connected(&self, a: u32, b: u32) -> bool {
        !self.cut.contains(&(a, b))
    }

    /// Cuts the link between `a` and `b`, both ways.
    pub fn cut(&mut self, a: u32, b: u32) {
        self.cut.insert((a, b));
        self.cut.insert((b, a));
    }

    /// Cuts `n` off from every other address up to `max`.
    pub fn isolate(&mut self, n: u32, max: u32) {
        for m in 0..=max {
            if m != n {
                self.cut(n, m);
            }
        }
    }

    /// Heals every link.
    pub fn recover(&mut self) {
        self.cut.clear();
    }

    /// Drops the next `count` messages `pred` accepts.
    pub fn drop_next(&mut self, count: usize, pred: impl Fn(u32, u32, &Msg) -> bool + 'static) {
        self.take = Some((Box::new(pred), count, false));
    }

    /// Holds back the next `count` messages `pred` accepts, until [`Network::release`].
    pub fn hold_next(&mut self, count: usize, pred: impl Fn(u32, u32, &Msg) -> bool + 'static) {
        self.take = Some((Box::new(pred), count, true));
    }

    /// The messages held back, in order.
    pub fn held(&self) -> Vec<Msg> {
        self.held.iter().map(|e| e.msg.clone()).collect()
    }

    /// Sends the held messages now, in order (late arrivals).
    pub fn release(&mut self) -> usize {
        let n = self.held.len();
        for e in std::mem::take(&mut self.held) {
            self.queue.push_back(e);
        }
        n
    }
}

/// A simulated node daemon.
#[derive(Debug, Default)]
pub struct SimNode {
    pub id: u32,
    /// The nonce of the coordinator this node registered with (0: none).
    pub nonce: u64,
    /// Workers and the block each holds.
    pub workers: BTreeMap<WorkerId, String>,
    started: Vec<v1::WorkerState>,
    /// Stored objects still owed: sequence -> (attributes, when last sent).
    pub outbox: BTreeMap<u64, (Vec<(String, i64)>, u64)>,
    next_seq: u64,
    /// Cached test results: the keys each test task was given.
    results: HashMap<TaskId, HashSet<u64>>,
    /// Matches of this node's objects that arrived while they were owed, per sequence.
    pub delivered: BTreeMap<u64, u32>,
    /// Matches that arrived for objects no longer owed (repeats, changing nothing).
    pub repeats: usize,
    /// Every assignment received: (time, worker).
    pub assignments: Vec<(u64, WorkerId)>,
    /// Objects a match task of this node could not collect results for.
    pub fetch_failures: usize,
    last_beat: u64,
}

impl SimNode {
    fn endpoint(id: u32) -> String {
        format!("sim://{id}")
    }

    fn states(&self) -> Vec<v1::WorkerState> {
        self.workers
            .iter()
            .map(|(w, b)| v1::WorkerState {
                worker: *w,
                block: b.clone(),
                urgent: false,
            })
            .collect()
    }

    fn arrived(&self, seqs: &[u64]) -> v1::ArrivedRequest {
        v1::ArrivedRequest {
            node: self.id,
            objects: seqs
                .iter()
                .filter_map(|s| self.outbox.get(s).map(|o| (s, o)))
                .map(|(s, (attrs, _))| v1::ArrivedObject {
                    id: Some(v1::ObjectId {
                        node: self.id,
                        seq: *s,
                    }),
                    priority: 0,
                    metadata: attrs
                        .iter()
                        .map(|(n, v)| v1::Attribute {
                            name: n.clone(),
                            value: Some(v1::Value {
                                kind: Some(v1::value::Kind::Integer(*v)),
                            }),
                        })
                        .collect(),
                    received_unix_ms: 0,
                })
                .collect(),
        }
    }
}

/// The coordinator and its nodes over one network.
#[derive(Debug)]
pub struct Sim {
    pub now: u64,
    pub coord: Protocol,
    pub nodes: BTreeMap<u32, SimNode>,
    pub net: Network,
    pub published: Published,
    cfg: Config,
    next_nonce: u64,
    next_worker: WorkerId,
}

/// Small batches and short timeouts, so faults show within a few hundred simulated ms.
pub fn config() -> Config {
    Config {
        test_batch: 8,
        match_batch: 8,
        batch_deadline_ms: 2,
        min_timeout_ms: 50,
        lease_ms: 100,
        timeout_multiple: 4.0,
        hello_every_ms: 20,
        ..Config::default()
    }
}

impl Sim {
    /// `nodes` nodes of `workers` empty workers each; predicates mention `attrs`. Every node
    /// has registered once the call returns.
    pub fn new(nodes: u32, workers: usize, attrs: &[&str]) -> Sim {
        let cfg = config();
        let mut sim = Sim {
            now: 0,
            coord: Protocol::new(cfg, 0x1001, 5, 0),
            nodes: BTreeMap::new(),
            net: Network::default(),
            published: Published {
                version: 1,
                subscriptions: 1,
                attributes: Arc::new(attrs.iter().map(|a| a.to_string()).collect()),
            },
            cfg,
            next_nonce: 0x2001,
            next_worker: 1,
        };
        for id in 1..=nodes {
            let mut n = SimNode {
                id,
                ..SimNode::default()
            };
            for _ in 0..workers {
                n.workers.insert(sim.next_worker, "empty".into());
                sim.next_worker += 1;
            }
            let reg = v1::RegisterRequest {
                node: id,
                endpoint: SimNode::endpoint(id),
                workers: n.states(),
                owns_from: 0,
            };
            sim.nodes.insert(id, n);
            sim.net.send(id, COORD, Msg::Register(reg));
        }
        sim.run_for(5);
        sim
    }

    /// The largest address on the network.
    pub fn max_addr(&self) -> u32 {
        self.nodes.keys().copied().max().unwrap_or(0)
    }

    /// Stores an object on `node` and sends it to the coordinator; its sequence number.
    pub fn put(&mut self, node: u32, attrs: &[(&str, i64)]) -> u64 {
        let now = self.now;
        let n = self.nodes.get_mut(&node).expect("node");
        n.next_seq += 1;
        let seq = n.next_seq;
        let attrs = attrs.iter().map(|(a, v)| (a.to_string(), *v)).collect();
        n.outbox.insert(seq, (attrs, now));
        let req = n.arrived(&[seq]);
        self.net.send(node, COORD, Msg::Arrived(req));
        seq
    }

    /// Starts a new empty worker on `node` (reported with its next heartbeat).
    pub fn start_worker(&mut self, node: u32) -> WorkerId {
        let w = self.next_worker;
        self.next_worker += 1;
        let n = self.nodes.get_mut(&node).expect("node");
        n.workers.insert(w, "empty".into());
        n.started.push(v1::WorkerState {
            worker: w,
            block: "empty".into(),
            urgent: false,
        });
        w
    }

    /// Replaces the coordinator with a new one (a new nonce, nothing remembered).
    pub fn new_coordinator(&mut self) -> u64 {
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        self.coord = Protocol::new(self.cfg, nonce, 5, self.now);
        nonce
    }

    /// Runs `ms` simulated milliseconds: every queued message is delivered (and what it
    /// causes), then time advances by 1 ms and everyone ticks.
    pub fn run_for(&mut self, ms: u64) {
        for _ in 0..ms {
            let mut budget = 100_000;
            while let Some(e) = self.net.queue.pop_front() {
                self.deliver(e);
                budget -= 1;
                assert!(budget > 0, "a message storm at {} ms", self.now);
            }
            self.now += 1;
            let out = self.coord.tick(self.now);
            self.coord_out(out);
            let ids: Vec<u32> = self.nodes.keys().copied().collect();
            for id in ids {
                self.node_tick(id);
            }
        }
    }

    /// Runs until every stored object was delivered at its origin (or `max_ms` passed);
    /// whether they all were.
    pub fn run_until_delivered(&mut self, max_ms: u64) -> bool {
        for _ in 0..max_ms {
            if self.all_delivered() {
                return true;
            }
            self.run_for(1);
        }
        self.all_delivered()
    }

    /// Whether every object stored anywhere left its outbox with a match.
    pub fn all_delivered(&self) -> bool {
        self.nodes
            .values()
            .all(|n| n.outbox.is_empty() && n.delivered.len() as u64 == n.next_seq)
    }

    fn coord_out(&mut self, out: Vec<Output>) {
        for o in out {
            if let Output::Send { node, call } = o {
                let msg = match call {
                    Call::Assign(r) => Msg::Assign(r),
                    Call::Hello(h) => Msg::Hello(h),
                };
                self.net.send(COORD, node, msg);
            }
        }
    }

    fn deliver(&mut self, e: Envelope) {
        let now = self.now;
        if e.to == COORD {
            match e.msg {
                Msg::Register(r) => {
                    let (nonce, out) = self.coord.register(now, &r);
                    self.coord_out(out);
                    self.net.send(COORD, e.from, Msg::Registered(nonce));
                }
                Msg::Heartbeat(h) => {
                    let (nonce, out) = self.coord.heartbeat(now, &h);
                    self.coord_out(out);
                    self.net.send(COORD, e.from, Msg::Beat(nonce));
                }
                Msg::Arrived(a) => {
                    let published = self.published.clone();
                    let (_, out) = self.coord.arrived(now, a, &published);
                    self.coord_out(out);
                }
                Msg::Done(d) => {
                    let published = self.published.clone();
                    let out = self.coord.done(now, &d, &published);
                    self.coord_out(out);
                }
                other => panic!("the coordinator got {other:?}"),
            }
            return;
        }
        let to = e.to;
        match e.msg {
            Msg::Registered(nonce) => {
                let n = self.nodes.get_mut(&to).expect("node");
                let fresh = n.nonce != nonce;
                n.nonce = nonce;
                if fresh {
                    // a new coordinator knows nothing: everything owed goes again
                    let seqs: Vec<u64> = n.outbox.keys().copied().collect();
                    for s in &seqs {
                        if let Some(o) = n.outbox.get_mut(s) {
                            o.1 = now;
                        }
                    }
                    if !seqs.is_empty() {
                        let req = n.arrived(&seqs);
                        self.net.send(to, COORD, Msg::Arrived(req));
                    }
                }
            }
            Msg::Beat(nonce) | Msg::Hello(v1::HelloRequest { nonce }) => {
                let n = self.nodes.get_mut(&to).expect("node");
                if n.nonce != nonce {
                    let reg = v1::RegisterRequest {
                        node: to,
                        endpoint: SimNode::endpoint(to),
                        workers: n.states(),
                        owns_from: 0,
                    };
                    self.net.send(to, COORD, Msg::Register(reg));
                }
            }
            Msg::Assign(r) => self.run_task(to, r),
            Msg::Matched(ids) => {
                let n = self.nodes.get_mut(&to).expect("node");
                for id in ids {
                    if n.outbox.remove(&id.seq).is_some() {
                        *n.delivered.entry(id.seq).or_default() += 1;
                    } else {
                        n.repeats += 1;
                    }
                }
            }
            other => panic!("node {to} got {other:?}"),
        }
    }

    fn run_task(&mut self, at: u32, r: v1::AssignRequest) {
        let now = self.now;
        let n = self.nodes.get_mut(&at).expect("node");
        n.assignments.push((now, r.worker));
        if !n.workers.contains_key(&r.worker) {
            return; // not ours (any more): no report
        }
        n.workers.insert(r.worker, r.block.clone());
        let mut failed = Vec::new();
        if r.block == "match" {
            let mut by_origin: BTreeMap<u32, Vec<v1::ObjectId>> = BTreeMap::new();
            for item in &r.matches {
                let ok = item.sources.iter().all(|s| {
                    let Some(src) = s
                        .endpoint
                        .strip_prefix("sim://")
                        .and_then(|x| x.parse::<u32>().ok())
                    else {
                        return false;
                    };
                    self.net.connected(at, src)
                        && self
                            .nodes
                            .get_mut(&src)
                            .and_then(|sn| sn.results.get_mut(&s.task))
                            .is_some_and(|keys| keys.remove(&item.key))
                });
                match (ok, item.id) {
                    (true, Some(id)) => by_origin.entry(id.node).or_default().push(id),
                    _ => failed.push(item.key),
                }
            }
            if let Some(n) = self.nodes.get_mut(&at) {
                n.fetch_failures += failed.len();
            }
            for (origin, ids) in by_origin {
                self.net.send(at, origin, Msg::Matched(ids));
            }
        } else {
            n.results
                .insert(r.task, r.tests.iter().map(|t| t.key).collect());
        }
        let done = v1::DoneRequest {
            nonce: r.nonce,
            worker: r.worker,
            task: r.task,
            block: r.block.clone(),
            failed,
        };
        self.net.send(at, COORD, Msg::Done(done));
    }

    fn node_tick(&mut self, id: u32) {
        let now = self.now;
        let n = self.nodes.get_mut(&id).expect("node");
        if n.nonce != 0 && now >= n.last_beat + HEARTBEAT_MS {
            n.last_beat = now;
            let h = v1::HeartbeatRequest {
                node: id,
                nonce: n.nonce,
                workers: n.states(),
                started: std::mem::take(&mut n.started),
                terminated: Vec::new(),
                ..v1::HeartbeatRequest::default()
            };
            self.net.send(id, COORD, Msg::Heartbeat(h));
        }
        let n = self.nodes.get_mut(&id).expect("node");
        let due: Vec<u64> = n
            .outbox
            .iter()
            .filter(|(_, (_, sent))| now >= sent + RESEND_MS)
            .map(|(s, _)| *s)
            .collect();
        if !due.is_empty() {
            for s in &due {
                if let Some(o) = n.outbox.get_mut(s) {
                    o.1 = now;
                }
            }
            let req = n.arrived(&due);
            self.net.send(id, COORD, Msg::Arrived(req));
        }
    }
}

pub mod copies;
mod resize;
mod tail;
#[cfg(test)]
mod tests;
