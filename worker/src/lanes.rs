//! Two lanes of CPU for a node, so urgent work keeps its latency when the node is overloaded.
//!
//! A tokio runtime has no priorities: when both cores are busy, every wake-up waits behind
//! every runnable task, whatever the priority of the objects it serves. So the work that can
//! wait (matching and pushing objects below [`URGENT_PRIORITY`]) runs on a second, *bulk*
//! runtime whose threads have a lower OS priority (nice +10), while the node's own runtime
//! keeps the storage writes (the storage system's own I/O, DESIGN §5 rule 4), the coordinator,
//! and the matching and pushing of urgent objects. The kernel then gives the bulk lane the CPU
//! the urgent lane leaves idle: nothing is held back while there is room, and under overload
//! the backlog is what waits, highest priority first in every queue as before.
//!
//! The bulk lane is used only while the node is overloaded ([`Lanes::set_overloaded`], which
//! the node daemon drives from its outbox backlog, `daemon::lane_switch`): while it keeps up,
//! every object runs at one priority, so niced threads never lengthen the tail of a load the
//! node keeps up with.
//! The bulk runtime is one per process, started on first use. Where it cannot be built (or
//! with `Lanes::new(false)`) everything runs on the caller's runtime, as before.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

/// Objects of this priority (after aging) are urgent: matched and pushed on the node's own
/// runtime at normal OS priority.
pub use runtime::URGENT_PRIORITY;

/// The nice value of the bulk lane's threads.
const BULK_NICE: i32 = 10;

thread_local! {
    static ON_BULK: Cell<bool> = const { Cell::new(false) };
}

static BULK: OnceLock<Option<Runtime>> = OnceLock::new();

/// Whether the calling thread belongs to the bulk lane.
pub fn on_bulk() -> bool {
    ON_BULK.with(Cell::get)
}

fn bulk() -> Option<&'static Handle> {
    BULK.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let built = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("dissem-bulk")
            .enable_all()
            .on_thread_start(|| {
                ON_BULK.with(|b| b.set(true));
                lower_priority();
            })
            .build();
        match built {
            Ok(rt) => Some(rt),
            Err(e) => {
                tracing::warn!("no bulk lane (everything runs at one priority): {e}");
                None
            }
        }
    })
    .as_ref()
    .map(Runtime::handle)
}

/// Runs `f` on a thread of its own at the bulk lane's lower OS priority, whether or not the
/// node is overloaded: work that must never take CPU from matching and pushing (a
/// compaction of the match block in the background). The answer comes on the receiver
/// (dropped if `f` panics or the thread cannot start).
pub fn spawn_background<F, R>(name: &str, f: F) -> tokio::sync::oneshot::Receiver<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let started = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            lower_priority();
            let _ = tx.send(f());
        });
    if let Err(e) = started {
        tracing::warn!("starting the {name} thread: {e}");
    }
    rx
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn lower_priority() {
    // SAFETY: gettid and setpriority take and return plain integers and touch no memory of
    // ours; on Linux the nice value set for a thread id is that thread's alone.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BULK_NICE)
    };
    if r != 0 {
        static ONCE: OnceLock<()> = OnceLock::new();
        ONCE.get_or_init(|| {
            tracing::warn!(
                "the bulk lane runs at normal priority (setpriority: {})",
                std::io::Error::last_os_error()
            );
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// Where a node's work runs: urgent work on the runtime that made the `Lanes` (the node's
/// own), the rest on the bulk lane. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Lanes {
    main: Option<Handle>,
    bulk: bool,
    overloaded: Arc<AtomicBool>,
}

impl Lanes {
    /// Urgent work on the current runtime (if any), the rest on the bulk lane while
    /// overloaded; with `bulk` false everything on the current runtime.
    pub fn new(bulk: bool) -> Lanes {
        Lanes {
            main: Handle::try_current().ok().filter(|_| !on_bulk()),
            bulk,
            overloaded: Arc::default(),
        }
    }

    /// Starts (true) or stops sending work below [`URGENT_PRIORITY`] to the bulk lane.
    pub fn set_overloaded(&self, on: bool) {
        self.overloaded.store(on, Ordering::Relaxed);
    }

    /// Whether work below [`URGENT_PRIORITY`] goes to the bulk lane now.
    pub fn overloaded(&self) -> bool {
        self.overloaded.load(Ordering::Relaxed)
    }

    /// Whether work of `priority` runs on the node's own runtime now: always without a bulk
    /// lane or while the node is not overloaded, else from [`URGENT_PRIORITY`] up.
    pub fn urgent(&self, priority: u8) -> bool {
        !self.bulk || priority >= URGENT_PRIORITY || !self.overloaded()
    }

    fn handle(&self, priority: u8) -> Option<&Handle> {
        if self.urgent(priority) {
            self.main.as_ref()
        } else {
            bulk().or(self.main.as_ref())
        }
    }

    /// Spawns a future on the lane of `priority`.
    pub fn spawn<F>(&self, priority: u8, f: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handle(priority) {
            Some(h) => h.spawn(f),
            None => tokio::spawn(f),
        }
    }

    /// Runs blocking work (matching) on the lane of `priority`.
    pub fn spawn_blocking<F, R>(&self, priority: u8, f: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        match self.handle(priority) {
            Some(h) => h.spawn_blocking(f),
            None => tokio::task::spawn_blocking(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bulk_work_runs_on_niced_threads_and_urgent_work_on_the_callers_runtime() {
        let lanes = Lanes::new(true);
        assert!(lanes.urgent(0), "not overloaded: one lane");
        assert!(
            !lanes
                .spawn(0, async { on_bulk() })
                .await
                .expect("not overloaded")
        );
        lanes.set_overloaded(true);
        assert!(lanes.urgent(7) && !lanes.urgent(6));
        let urgent = lanes.spawn(7, async { on_bulk() }).await.expect("urgent");
        assert!(!urgent);
        let bulk = lanes.spawn(0, async { on_bulk() }).await.expect("bulk");
        assert!(bulk);
        let blocking = lanes.spawn_blocking(3, on_bulk).await.expect("blocking");
        assert!(blocking);
        #[cfg(target_os = "linux")]
        {
            let nice = lanes
                .spawn_blocking(0, || {
                    // SAFETY: see lower_priority
                    #[allow(unsafe_code)]
                    unsafe {
                        libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t)
                    }
                })
                .await
                .expect("nice");
            assert_eq!(nice, BULK_NICE);
        }
        // urgent work spawned from the bulk lane goes back to the caller's runtime
        let l2 = lanes.clone();
        let back = lanes
            .spawn(0, async move { l2.spawn(7, async { on_bulk() }).await })
            .await
            .expect("outer")
            .expect("inner");
        assert!(!back);
        let one = Lanes::new(false);
        one.set_overloaded(true);
        assert!(one.urgent(0));
        assert!(!one.spawn(0, async { on_bulk() }).await.expect("one lane"));
    }
}
