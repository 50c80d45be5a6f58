//! Randomized schedules over object ownership (DESIGN §7), sans I/O, thousands a minute: a
//! 3x3 grid of simulated nodes under the real coordinator protocol
//! ([`coordinator::protocol::Protocol`]: leases, one heir per position), writers putting
//! QoS 2 objects throughout, nodes killed (restarted on their disk, or now and then on a
//! fresh one: the disk lost, one at a time) and paused past their lease, and the subscriber
//! down for a while (a backlog piles up, so that a fault finds objects to take over). Each node runs the daemon's own rules: its view is the real
//! membership answer ([`View::from_proto`]), takeovers come from [`Ownership::view_changed`]
//! and adopt by [`claims`], the lease fence is the daemon's [`Fence`]. The I/O between them (pulls,
//! the holders' answers, finished marks) follows `takeover.rs` and `fence.rs`: catch-up at
//! registration learns what holders finished or adopted (the adopted ones stay in the
//! origin's outbox, handed), a relearn a lease after a lapse (or at once when a member of the
//! node's quorum is alive again) learns the same and what others adopted of the objects this
//! node adopted, and lifts the fence only once every live member answered; an origin takes
//! back what it handed to an adopter that is lost (`reclaim.rs`), and every lease settles
//! what a live adopter no longer claims (`Daemon::auditor`). A push is the QoS 2 delivery:
//! its "received" mark goes first to the holders (`Daemon::spread_received`), and a pusher
//! that holds a mark already (pulled at a takeover or a take-back) only releases, which
//! the subscriber absorbs.
//!
//! The oracle: no object is pushed twice (QoS 2), and once every node is up and quiet, every
//! acknowledged object was pushed. A schedule is drawn from its seed alone; a failure names
//! the seed, and `DISSEM_SIM_SEED=S` replays from it (`DISSEM_SIM_TRACE=1` prints its
//! steps). [`Rules`] can undo each fix; the mutation checks (`checks.rs`) show a schedule
//! then fails.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashSet};
use std::time::Duration;

use coordinator::protocol::Protocol;
use proto::v1;
use runtime::grid::Grid;
use runtime::rng::Rng;

use super::fence::{Fence, Renewal};
use super::ownership::{Adopter, Ownership, adopters_lost, claims, quorum_back};
use super::replicate::View;

mod checks;
mod schedule;
mod steps;

pub use schedule::{first_failure, run};

/// The node lease (simulated ms).
const LEASE: u64 = 300;
/// Between two heartbeats of a node.
const BEAT: u64 = 50;
/// Between two push rounds of a node.
const ROUND: u64 = 10;
/// Pushes per node and round.
const PUSHES: usize = 3;
/// The coordinator's nonce.
const NONCE: u64 = 7;

/// Which fixes are in force (all, except in the mutation checks).
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// A node's first heartbeat answer since it started fences it a lease (`bench chaos`
    /// seed 44121).
    pub start_fence: bool,
    /// An origin back leaves out of its outbox what its heir adopted.
    pub learn_adopted: bool,
    /// A relearn after a lapse gives up the objects this node adopted that another adopted
    /// or finished meanwhile.
    pub adopted_by_others: bool,
    /// A holder catching up keeps the copies its origin handed over to a member that
    /// adopted them (found by this harness).
    pub keep_handed: bool,
    /// An origin relearns (fenced) when a member of its quorum is alive again (found by
    /// this harness).
    pub relearn_on_return: bool,
    /// An origin keeps what it handed to an adopter in its outbox (answered as held, not
    /// pushed) and takes it back when the adopter is lost (found by this harness: an
    /// heir's disk lost after its origin came back and handed it the backlog).
    pub reclaim: bool,
    /// A relearn lifts the fence only when every member alive in the node's view answered
    /// (found by this harness: an heir paused during its origin's relearn; both pushed
    /// what it had adopted).
    pub relearn_whole: bool,
    /// An origin looks again, every lease, at what it handed to a live adopter: what the
    /// adopter no longer claims (given up to another claimant, which may since be lost) is
    /// handed to whoever claims it now, or taken back (found by this harness, seed
    /// 2028786: two claimants, one of them stale, the other gave up; the stale one's disk
    /// was lost, and its origin had handed the objects to the other).
    pub audit_handed: bool,
    /// An object a node gives up to another claimant closes here as handed over, which
    /// ends no copy (before, its closure told every holder it finished, the claimant among
    /// them, which dropped it undelivered).
    pub give_up_quietly: bool,
}

impl Rules {
    pub const FIXED: Rules = Rules {
        start_fence: true,
        learn_adopted: true,
        adopted_by_others: true,
        keep_handed: true,
        relearn_on_return: true,
        reclaim: true,
        relearn_whole: true,
        audit_handed: true,
        give_up_quietly: true,
    };
}

/// What the oracle found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An object pushed a second time (QoS 2), by `by`, at `at` ms.
    Duplicate {
        origin: u32,
        seq: u64,
        by: u32,
        at: u64,
    },
    /// An acknowledged object nobody pushed.
    Lost { origin: u32, seq: u64 },
}

/// A schedule's figures.
#[derive(Debug, Default)]
pub struct Outcome {
    pub acknowledged: u64,
    pub kills: u64,
    pub pauses: u64,
    pub stalls: u64,
    pub wipes: u64,
    pub adopted: u64,
    /// Pushes that were only a release (a holder had the "received" mark).
    pub releases: u64,
    pub reclaimed: u64,
    pub events: u64,
    pub violations: Vec<Violation>,
}

/// Simulated milliseconds, the fence's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct At(u64);

impl std::ops::Add<Duration> for At {
    type Output = At;
    fn add(self, d: Duration) -> At {
        At(self.0 + d.as_millis() as u64)
    }
}

impl std::ops::Sub for At {
    type Output = Duration;
    fn sub(self, earlier: At) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// A copy of another origin's object, at a holder (on its disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Copy {
    finished: bool,
    /// Claimed by this holder's takeover (`Store::adopt`): it disseminates the object.
    adopted: bool,
}

type Id = (u32, u64);

/// A simulated node daemon.
#[derive(Debug)]
struct Node {
    id: u32,
    /// Bumped at each kill: events of an earlier process are dropped.
    inc: u64,
    up: bool,
    paused_until: u64,
    // on its disk
    outbox: BTreeSet<u64>,
    next_seq: u64,
    /// The first sequence number this disk handed out (copies of lower ones at holders are
    /// an earlier disk's at this position).
    owns_from: u64,
    copies: BTreeMap<Id, Copy>,
    /// Its own objects a member adopted (`Store::hand`): in the outbox, not pushed.
    handed: BTreeMap<u64, Adopter>,
    /// The QoS 2 "received" marks it holds (`Store::mark_received_unflushed`): a subscriber
    /// has the object, and whoever pushes it from here only releases it.
    marks: BTreeSet<Id>,
    // in its memory
    view: View,
    ownership: Ownership,
    fence: Fence<At>,
    registered: bool,
    caught_up: bool,
    /// Own objects put by this process before it caught up (pushed without waiting).
    fresh: HashSet<u64>,
    /// Finished marks a holder did not take yet: (holder, object).
    unsent: Vec<(u32, Id)>,
}

impl Node {
    fn new(id: u32) -> Node {
        Node {
            id,
            inc: 0,
            up: true,
            paused_until: 0,
            outbox: BTreeSet::new(),
            next_seq: 1,
            owns_from: 1,
            copies: BTreeMap::new(),
            view: View::from_proto(&v1::Membership::default()),
            handed: BTreeMap::new(),
            marks: BTreeSet::new(),
            ownership: Ownership::default(),
            fence: Fence::default(),
            registered: false,
            caught_up: false,
            fresh: HashSet::new(),
            unsent: Vec::new(),
        }
    }

    /// The process is gone: its memory with it.
    fn kill(&mut self) {
        self.inc += 1;
        self.up = false;
        self.paused_until = 0;
        self.view = View::from_proto(&v1::Membership::default());
        self.ownership = Ownership::default();
        self.fence = Fence::default();
        self.registered = false;
        self.caught_up = false;
        self.fresh.clear();
        self.unsent.clear();
    }

    /// Its disk is lost: it starts on a fresh one, whose sequence numbers begin above
    /// every earlier one.
    fn wipe(&mut self) {
        self.outbox.clear();
        self.copies.clear();
        self.handed.clear();
        self.marks.clear();
        self.owns_from = self.next_seq + 1_000;
        self.next_seq = self.owns_from;
    }

    /// Answers calls (not down, not paused).
    fn answers(&self, now: u64) -> bool {
        self.up && self.paused_until <= now
    }

    /// The objects it disseminates now: its own, and those it adopted.
    fn owned(&self) -> Vec<Id> {
        let mut v: Vec<Id> = self
            .outbox
            .iter()
            .filter(|s| self.caught_up || self.fresh.contains(s))
            .filter(|s| !self.handed.contains_key(s))
            .map(|&s| (self.id, s))
            .collect();
        if self.caught_up {
            v.extend(
                self.copies
                    .iter()
                    .filter(|(_, c)| c.adopted && !c.finished)
                    .map(|(id, _)| *id),
            );
        }
        v
    }

    /// Its copies of `origin`'s objects in a state.
    fn seqs(&self, origin: u32, f: impl Fn(&Copy) -> bool) -> HashSet<u64> {
        self.copies
            .range((origin, 0)..=(origin, u64::MAX))
            .filter(|(_, c)| f(c))
            .map(|(id, _)| id.1)
            .collect()
    }
}

/// What happens, in time order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A node sends a heartbeat (or registers).
    Beat {
        node: u32,
        inc: u64,
    },
    /// The coordinator hears it.
    Heard {
        node: u32,
        inc: u64,
        sent: u64,
        register: bool,
    },
    /// The node hears the answer (`answers[answer]`).
    Answer {
        node: u32,
        inc: u64,
        sent: u64,
        answer: usize,
    },
    /// A node pushes what it owns and may push.
    Round {
        node: u32,
        inc: u64,
    },
    /// A node's catch-up at registration is done.
    CatchUp {
        node: u32,
        inc: u64,
    },
    /// A takeover's pulls are done: it adopts.
    TakeOver {
        node: u32,
        inc: u64,
        origin: u32,
        below: u64,
    },
    /// An origin takes back what it handed to `adopter`, lost in its view.
    Reclaim {
        node: u32,
        inc: u64,
        adopter: Adopter,
    },
    /// An origin looks again at what it handed to live adopters.
    Audit {
        node: u32,
        inc: u64,
    },
    /// A relearn starts a lease after a lapse.
    Relearn {
        node: u32,
        inc: u64,
    },
    /// It is done.
    Relearned {
        node: u32,
        inc: u64,
        lapses: u64,
    },
    /// A finished mark reaches a holder.
    Finished {
        from: u32,
        inc: u64,
        to: u32,
        id: Id,
    },
    /// A writer puts an object through a node.
    Put {
        node: u32,
    },
    /// A node's process killed; `wiped`: its disk lost with it (it starts on a fresh one).
    Kill {
        node: u32,
        down: u64,
        wiped: bool,
    },
    Start {
        node: u32,
    },
    Pause {
        node: u32,
        ms: u64,
    },
    /// The subscriber is down: nothing is pushed for a while, and objects pile up.
    Stall {
        ms: u64,
    },
}

impl Event {
    /// The node whose process the event runs in (deferred while it is paused), and the
    /// process it was meant for.
    fn process(&self) -> Option<(u32, u64)> {
        match *self {
            Event::Beat { node, inc }
            | Event::Answer { node, inc, .. }
            | Event::Round { node, inc }
            | Event::CatchUp { node, inc }
            | Event::TakeOver { node, inc, .. }
            | Event::Reclaim { node, inc, .. }
            | Event::Audit { node, inc }
            | Event::Relearn { node, inc }
            | Event::Relearned { node, inc, .. } => Some((node, inc)),
            _ => None,
        }
    }
}

/// The simulated cluster.
struct Cluster {
    rules: Rules,
    rng: Rng,
    now: u64,
    order: u64,
    queue: BinaryHeap<Reverse<(u64, u64, Event)>>,
    coord: Protocol,
    grid: Grid,
    nodes: Vec<Node>,
    pushed: BTreeMap<Id, u32>,
    /// The subscriber takes no pushes until then.
    stalled_until: u64,
    /// The membership answers sent (events name them by index).
    answers: Vec<v1::Membership>,
    acknowledged: Vec<Id>,
    out: Outcome,
    trace: bool,
}

impl Cluster {
    fn new(seed: u64, rules: Rules) -> Cluster {
        let grid = Grid::new(3, 3).unwrap_or_else(|e| panic!("a 3x3 grid: {e}"));
        let cfg = coordinator::Config {
            lease_ms: LEASE,
            ..coordinator::Config::default()
        };
        let mut coord = Protocol::new(cfg, NONCE, 5, 0);
        coord.set_grid(Some(grid));
        Cluster {
            rules,
            rng: Rng::new(seed),
            now: 0,
            order: 0,
            queue: BinaryHeap::new(),
            coord,
            grid,
            nodes: (0..grid.len()).map(Node::new).collect(),
            pushed: BTreeMap::new(),
            stalled_until: 0,
            answers: Vec::new(),
            acknowledged: Vec::new(),
            out: Outcome::default(),
            trace: std::env::var_os("DISSEM_SIM_TRACE").is_some(),
        }
    }

    fn at(&mut self, when: u64, e: Event) {
        self.order += 1;
        self.queue.push(Reverse((when, self.order, e)));
    }

    /// A line of the trace (`DISSEM_SIM_TRACE`).
    fn note(&self, line: impl FnOnce() -> String) {
        if self.trace {
            eprintln!("{:>6}   {}", self.now, line());
        }
    }

    /// A network delay.
    fn delay(&mut self) -> u64 {
        1 + self.rng.below(15)
    }

    fn step(&mut self, e: Event) {
        if let Some((n, inc)) = e.process() {
            let node = &self.nodes[n as usize];
            if node.inc != inc || !node.up {
                return; // meant for a process that is gone
            }
            if node.paused_until > self.now {
                let until = node.paused_until;
                self.at(until, e); // a stopped process runs it once continued
                return;
            }
        }
        self.out.events += 1;
        if self.trace
            && !matches!(
                e,
                Event::Round { .. }
                    | Event::Beat { .. }
                    | Event::Heard { .. }
                    | Event::Answer { .. }
            )
        {
            eprintln!("{:>6} {e:?}", self.now);
        }
        match e {
            Event::Beat { node, inc } => {
                let register = !self.nodes[node as usize].registered;
                let d = self.delay();
                let sent = self.now;
                self.at(
                    sent + d,
                    Event::Heard {
                        node,
                        inc,
                        sent,
                        register,
                    },
                );
                self.at(sent + BEAT, Event::Beat { node, inc });
            }
            Event::Heard {
                node,
                inc,
                sent,
                register,
            } => {
                if register {
                    let r = v1::RegisterRequest {
                        node,
                        endpoint: format!("http://n{node}"),
                        workers: Vec::new(),
                        owns_from: self.nodes[node as usize].owns_from,
                    };
                    self.coord.register(self.now, &r);
                } else {
                    let h = v1::HeartbeatRequest {
                        node,
                        nonce: NONCE,
                        ..v1::HeartbeatRequest::default()
                    };
                    self.coord.heartbeat(self.now, &h);
                }
                self.answers.push(self.coord.membership(self.now));
                let answer = self.answers.len() - 1;
                let d = self.delay();
                self.at(
                    self.now + d,
                    Event::Answer {
                        node,
                        inc,
                        sent,
                        answer,
                    },
                );
            }
            Event::Answer {
                node,
                inc,
                sent,
                answer,
            } => self.answer(node, inc, sent, answer),
            Event::Round { node, inc } => {
                self.round(node);
                self.at(self.now + ROUND, Event::Round { node, inc });
            }
            Event::CatchUp { node, inc: _ } => self.catch_up(node),
            Event::TakeOver {
                node,
                inc: _,
                origin,
                below,
            } => self.take_over(node, origin, below),
            Event::Reclaim { node, inc, adopter } => self.reclaim(node, inc, adopter),
            Event::Audit { node, inc } => {
                if self.rules.audit_handed {
                    self.audit(node);
                }
                self.at(self.now + LEASE, Event::Audit { node, inc });
            }
            Event::Relearn { node, inc } => {
                let lapses = self.nodes[node as usize].fence.lapses();
                let d = 5 + self.rng.below(40);
                self.at(self.now + d, Event::Relearned { node, inc, lapses });
            }
            Event::Relearned { node, inc, lapses } => {
                let mut whole = self.learn_finished(node);
                if self.rules.adopted_by_others {
                    whole &= self.adopted_by_others(node);
                }
                if self.rules.relearn_whole && !whole {
                    // a member alive in its view did not answer: fenced, it asks again
                    let d = 20 + self.rng.below(40);
                    self.at(self.now + d, Event::Relearn { node, inc });
                    return;
                }
                let now = At(self.now);
                if let Some(wait) = self.nodes[node as usize].fence.relearned(now, lapses) {
                    self.at(
                        self.now + wait.as_millis() as u64,
                        Event::Relearn { node, inc },
                    );
                }
            }
            Event::Finished { from, inc, to, id } => {
                if to == id.0 {
                    // at the origin: a handed object is done (`Daemon::take_copies`); its
                    // own are its to end, and a mark missed is learnt at its catch-up
                    let o = &mut self.nodes[to as usize];
                    if o.answers(self.now) && o.handed.remove(&id.1).is_some() {
                        o.outbox.remove(&id.1);
                    }
                } else if self.nodes[to as usize].answers(self.now) {
                    let c = self.nodes[to as usize].copies.entry(id).or_insert(Copy {
                        finished: true,
                        adopted: false,
                    });
                    c.finished = true;
                    c.adopted = false;
                } else {
                    // kept for the holder while the sender lives (`daemon/unsent.rs`)
                    let f = &mut self.nodes[from as usize];
                    if f.inc == inc && f.up {
                        f.unsent.push((to, id));
                    }
                }
            }
            Event::Put { node } => self.put(node),
            Event::Kill { node, down, wiped } => {
                if self.nodes[node as usize].up {
                    self.out.kills += 1;
                    // one disk lost at a time, the rest of the grid up and caught up (a
                    // put while a node was down has its copies on fewer nodes until that
                    // node caught up)
                    let now = self.now;
                    let wiped = wiped
                        && self
                            .nodes
                            .iter()
                            .all(|m| m.id == node || (m.answers(now) && m.caught_up));
                    let n = &mut self.nodes[node as usize];
                    n.kill();
                    if wiped {
                        self.out.wipes += 1;
                        n.wipe();
                    }
                    self.at(self.now + down, Event::Start { node });
                }
            }
            Event::Start { node } => self.start(node),
            Event::Stall { ms } => {
                self.out.stalls += 1;
                self.stalled_until = self.stalled_until.max(self.now + ms);
            }
            Event::Pause { node, ms } => {
                let n = &mut self.nodes[node as usize];
                if n.up && n.paused_until <= self.now {
                    self.out.pauses += 1;
                    n.paused_until = self.now + ms;
                }
            }
        }
    }

    fn start(&mut self, node: u32) {
        let n = &mut self.nodes[node as usize];
        n.up = true;
        let inc = n.inc;
        let d = self.rng.below(BEAT);
        self.at(self.now + d, Event::Beat { node, inc });
        self.at(self.now + d, Event::Round { node, inc });
        self.at(self.now + d + LEASE, Event::Audit { node, inc });
    }

    fn answer(&mut self, node: u32, inc: u64, sent: u64, answer: usize) {
        let new = View::from_proto(&self.answers[answer]);
        let now = self.now;
        let rules = self.rules;
        let n = &mut self.nodes[node as usize];
        let first = !n.registered;
        n.registered = true;
        let old = std::mem::replace(&mut n.view, new);
        let takeovers = n.ownership.view_changed(node, &old, &n.view);
        let back = quorum_back(node, &old, &n.view);
        let lost = adopters_lost(n.handed.values().copied(), &old, &n.view);
        if rules.reclaim {
            for adopter in lost {
                let d = 5 + self.rng.below(40);
                self.at(now + d, Event::Reclaim { node, inc, adopter });
            }
        }
        let n = &mut self.nodes[node as usize];
        if rules.relearn_on_return && !back.is_empty() && n.fence.member_back() {
            self.at(now, Event::Relearn { node, inc });
        }
        let n = &mut self.nodes[node as usize];
        let lease = Duration::from_millis(LEASE);
        let renewal = n.fence.renewed(At(now), At(sent), lease);
        if let Renewal::Lapsed { started } = renewal {
            if started && !rules.start_fence {
                // the code before the fix: no fence at start
                let l = n.fence.lapses();
                let _ = n.fence.relearned(At(now + LEASE), l);
            } else {
                self.at(now + LEASE, Event::Relearn { node, inc });
            }
        }
        for t in takeovers {
            let d = 5 + self.rng.below(80);
            self.at(
                now + d,
                Event::TakeOver {
                    node,
                    inc,
                    origin: t.origin,
                    below: t.below,
                },
            );
        }
        if first {
            let d = 5 + self.rng.below(50);
            self.at(now + d, Event::CatchUp { node, inc });
        }
    }

    /// Live in `node`'s view and answering: the members it hears from.
    fn reachable(&self, node: u32, among: Vec<u32>, skip: &[u32]) -> Vec<u32> {
        let v = &self.nodes[node as usize].view;
        among
            .into_iter()
            .filter(|m| !skip.contains(m) && v.alive(*m))
            .filter(|m| self.nodes[*m as usize].answers(self.now))
            .collect()
    }
}
