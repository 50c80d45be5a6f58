//! The coordinator's scheduling, as a sans-I/O state machine: events in, actions out.
//!
//! It keeps the queues of DESIGN §5: one idle queue per attribute (test workers holding that
//! attribute's block), an idle queue of match workers, an idle queue of empty workers, and the
//! tasks waiting for a worker. A task for block `B` goes to
//! 1. an idle worker holding `B`; else
//! 2. an empty worker, told to load `B`; else
//! 3. a worker from the longest other idle queue, told to switch to `B`; else
//! 4. nobody: it waits (more work would hurt the storage system's own I/O).
//!
//! Waiting tasks are served highest priority first (0..=7), first come first served within a
//! priority, with bounded aging so no level starves. Values of one attribute from many objects
//! form one test task and many objects one match task; a batch closes on size or deadline, or
//! at once when a worker holding its block is idle, no task of that block waits or runs and
//! its last batch closed at least a deadline ago.
//! Faults: workers hold leases (renewed by heartbeats, checked before a task is handed out);
//! a task that overruns a multiple of its kind's mean completion time is reassigned and its
//! worker is considered dead and never gets another task. The coordinator's random nonce goes
//! out in periodic hellos so nodes notice a new coordinator and re-register.
//!
//! Time is passed in (milliseconds), so every rule and fault is a deterministic unit test.
//! Actions come out in a deterministic order (tasks falling due together by id). This file
//! holds the vocabulary (blocks, settings, events, actions, figures); the state machine is
//! `scheduler` ([`Coordinator`]).
//! [`protocol`] wraps the scheduler with the rest of the protocol (nodes, objects in flight,
//! nonces, retries), also without I/O; `sim` steps it with simulated node daemons over a
//! simulated network. [`server`] is the I/O around it: the gRPC `Cluster` service, one driver
//! task that owns the protocol, and the calls to the node daemons. [`rebuild`] is what an
//! elected leader (`--etcd`) does before it serves: the registry from the nodes' copies.

mod images;
mod kept;
pub mod protocol;
pub mod rebuild;
pub mod registry;
pub mod resize;
mod scheduler;
pub mod server;
#[cfg(test)]
mod sim;
pub mod tail;

use std::collections::BTreeMap;

pub use scheduler::{Coordinator, WorkerRow};

/// A worker's id (unique in the cluster).
pub type WorkerId = u64;
/// A task's id.
pub type TaskId = u64;
/// An object's id, as the coordinator tracks it.
pub type ObjectKey = u64;

/// The function block a worker holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Block {
    Empty,
    /// The test block of one attribute.
    Test(String),
    /// The match block.
    Match,
}

/// Settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// Objects per test task (values of one attribute) and per match task.
    pub test_batch: usize,
    pub match_batch: usize,
    /// A batch closes this long after its first object at the latest.
    pub batch_deadline_ms: u64,
    /// A batch also closes at once when a worker holding its block is idle, no task of that
    /// block waits or runs and its last batch held one object or closed at least a deadline
    /// ago (no batching wait while the cluster is idle or objects come one at a time; at
    /// most one task per block and deadline under a stream that gathers).
    pub eager_close: bool,
    /// A task is overdue after this multiple of its kind's mean completion time...
    pub timeout_multiple: f64,
    /// ...but never before this.
    pub min_timeout_ms: u64,
    /// A worker whose lease was not renewed for this long is not handed tasks.
    pub lease_ms: u64,
    /// A waiting task gains one priority level per this much waiting (up to 7): with the
    /// default 5 s, a priority-0 task competes as a 7 after 35 s behind urgent work.
    pub aging_ms: u64,
    /// Hellos go out this often.
    pub hello_every_ms: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            test_batch: 256,
            match_batch: 256,
            batch_deadline_ms: 2,
            eager_close: true,
            timeout_multiple: 8.0,
            min_timeout_ms: 2_000,
            lease_ms: 3_000,
            aging_ms: 5_000,
            hello_every_ms: 1_000,
        }
    }
}

/// What happens to the coordinator.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A node daemon started (or re-registered) a worker.
    WorkerJoined {
        worker: WorkerId,
        node: u32,
        block: Block,
        /// Kept for priority-7 tasks only (the node's urgent reserve).
        urgent: bool,
    },
    /// A worker renewed its lease.
    Heartbeat { worker: WorkerId },
    /// A node daemon terminated a worker (load regulation or shutdown).
    WorkerLeft { worker: WorkerId },
    /// An object arrived; `attrs` are its attributes that some predicate mentions.
    ObjectArrived {
        object: ObjectKey,
        priority: u8,
        attrs: Vec<String>,
    },
    /// A worker finished a task and now holds `block`.
    TaskDone {
        worker: WorkerId,
        task: TaskId,
        block: Block,
    },
    /// Time passes: batches close on deadline, overdue tasks are reassigned, hellos go out.
    Tick,
}

/// What the coordinator asks its I/O layer to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Hand a task to a worker; `load` is set when it must first load or switch blocks;
    /// `priority` is the task's effective priority (aging included) as it starts.
    Assign {
        worker: WorkerId,
        task: TaskId,
        block: Block,
        objects: Vec<ObjectKey>,
        load: Option<Block>,
        priority: u8,
    },
    /// Broadcast a hello with this coordinator's nonce.
    Hello { nonce: u64 },
    /// A task was taken back from a worker (overdue, or the worker left) and queued again.
    Reassigned { task: TaskId, from: WorkerId },
    /// A worker was judged dead (lease expired or task overdue); it gets no more tasks.
    WorkerDead { worker: WorkerId },
}

/// Counts and means, for the admin API.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Live workers per block, split into idle and busy.
    pub idle: BTreeMap<Block, usize>,
    pub busy: BTreeMap<Block, usize>,
    pub waiting_tasks: usize,
    pub open_batches: usize,
    pub mean_test_ms: f64,
    pub mean_match_ms: f64,
    pub reassignments: u64,
    pub dead_workers: u64,
}

#[cfg(test)]
mod tests;
