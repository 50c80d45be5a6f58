//! The lease fence (one owner per object, DESIGN §7). With quorum replication a node's heir
//! takes its objects over once the coordinator has not heard from it for a lease, and a node
//! whose heartbeats are only late (a paused process, an overloaded machine) is then still
//! running. So a node pushes QoS 2 deliveries only while it surely holds its lease: until a
//! third of a lease before the lease of its last answered heartbeat could run out (timed
//! from when that heartbeat was sent, which is before the coordinator heard it). A node that
//! finds its lease may have lapsed (an answer came over a lease after the heartbeat before
//! it was sent) stays fenced for one more lease, in which its heir sees it alive again and
//! stops adopting; then it learns which of the objects it disseminated a live node adopted
//! or finished meanwhile, leaves those to it, and goes on with the rest. A node that starts
//! is fenced the same way after its first answer: it may have been down past its lease. A
//! node also fences itself and relearns at once when a member of its quorum is alive again:
//! taken for dead, that member may have adopted what this node took back meanwhile. The
//! state machine ([`Fence`]) is sans I/O, so `daemon/ownsim` runs it too.

use super::*;
use crate::deliver::Hold;
use replicate::View;

/// Between two tries of a relearn that a live member of the quorum did not answer.
const RELEARN_RETRY: Duration = Duration::from_millis(500);

/// The fence's state, sans I/O: time is passed in (`T` is [`Instant`] in the daemon, the
/// simulated clock in `daemon/ownsim`).
#[derive(Debug)]
pub(super) struct Fence<T> {
    /// When the last answered heartbeat (or registration) was sent.
    sent: Option<T>,
    /// Fenced until a relearn lifts it: the lease may have lapsed, or a member of the
    /// quorum is back.
    lapsed: bool,
    /// Changes so far (lapses, members back): one during a relearn makes it run again
    /// before the fence lifts.
    lapses: u64,
    /// A lapse holds the fence at least until a lease after it was found (the heir sees
    /// this node alive again and stops adopting), whatever relearn runs meanwhile.
    not_before: Option<T>,
}

impl<T> Default for Fence<T> {
    fn default() -> Self {
        Fence {
            sent: None,
            lapsed: false,
            lapses: 0,
            not_before: None,
        }
    }
}

/// What an answered heartbeat did to the fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Renewal {
    /// The lease held (or a relearn already runs, and runs again for the lapse).
    Held,
    /// The lease may have lapsed (`started`: the first answer since the process started):
    /// fenced now; the caller relearns once a lease passed, then calls [`Fence::relearned`].
    Lapsed { started: bool },
}

impl<T> Fence<T>
where
    T: Copy + Ord + std::ops::Sub<Output = Duration> + std::ops::Add<Duration, Output = T>,
{
    /// A heartbeat (or registration) sent at `sent` was answered at `now`.
    pub(super) fn renewed(&mut self, now: T, sent: T, lease: Duration) -> Renewal {
        // the first answer since this process started counts as a lapse too: killed and
        // started again, the node may have been down past its lease, and its heir, whose
        // view lags by a heartbeat, may still be adopting (what this node held, and what is
        // put here since); pushed at once, such an object went out from both (QoS 2
        // duplicates, `bench chaos` seed 44121)
        let started = self.sent.is_none();
        let lapsed = self.sent.is_none_or(|prev| now - prev > lease);
        self.sent = Some(sent);
        if !lapsed {
            return Renewal::Held;
        }
        self.lapses += 1;
        self.not_before = Some(self.not_before.map_or(now + lease, |t| t.max(now + lease)));
        if self.lapsed {
            return Renewal::Held; // the relearn under way runs again
        }
        self.lapsed = true;
        Renewal::Lapsed { started }
    }

    /// Whether the node may not hold its lease at `now`: lapsed, or within a third of a
    /// lease of the end of the lease of its last answered heartbeat (timed from when that
    /// heartbeat was sent, which is before the coordinator heard it).
    pub(super) fn fenced(&self, now: T, lease: Duration) -> bool {
        match self.sent {
            _ if self.lapsed => true,
            Some(sent) => (now - sent) + lease / 3 > lease,
            None => true,
        }
    }

    /// A member of this node's quorum is alive again: while it was taken for dead it may
    /// have adopted objects this node took back meanwhile, and it pushes them once its own
    /// fence lifts. Fenced until a relearn learns them; `true` when the caller must start
    /// one (none runs).
    pub(super) fn member_back(&mut self) -> bool {
        self.lapses += 1;
        !std::mem::replace(&mut self.lapsed, true)
    }

    /// The lapses so far (read when a relearn starts).
    pub(super) fn lapses(&self) -> u64 {
        self.lapses
    }

    /// A relearn that started after `lapses` changes is done at `now`: the fence lifts
    /// (`None`), unless a change came meanwhile or a lapse's lease has not passed yet
    /// (`Some(wait)`: relearn again after `wait`).
    pub(super) fn relearned(&mut self, now: T, lapses: u64) -> Option<Duration> {
        let wait = self.not_before.map_or(Duration::ZERO, |t| t - now);
        if self.lapses == lapses && wait.is_zero() {
            self.lapsed = false;
            self.not_before = None;
            None
        } else {
            Some(wait)
        }
    }
}

impl Daemon {
    /// A heartbeat (or registration) sent at `sent` was answered.
    pub(super) fn lease_renewed(&self, sent: Instant) {
        let Some(lease) = self.fence_lease() else {
            return; // no heirs without a grid: nothing to fence against
        };
        let renewal = lock(&self.inner.lease).renewed(Instant::now(), sent, lease);
        let Renewal::Lapsed { started } = renewal else {
            return;
        };
        if started {
            tracing::info!(
                "started: no QoS 2 pushes for a lease ({lease:?}), until this node learned \
                 what others took over while it was down"
            );
        } else {
            tracing::warn!(
                "no heartbeat answer for over {lease:?} (an election, or this node was paused \
                 or cut off), so its lease may have lapsed: no QoS 2 pushes until it learned \
                 what others took over, and its subscription copies not whole until it \
                 pulled them again"
            );
            self.subscriptions_lapsed();
        }
        self.relearn_later(lease);
    }

    /// Relearns what others took over once `lease` passed.
    fn relearn_later(&self, lease: Duration) {
        self.relearn_after(lease, lease);
    }

    /// Relearns what others took over after `delay` (a lapse during it: again a `lease` on).
    fn relearn_after(&self, delay: Duration, lease: Duration) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            me.relearn(lease).await;
        });
    }

    /// Members of this node's quorum are alive again ([`super::ownership::quorum_back`]):
    /// no QoS 2 push until it learned what they adopted while taken for dead.
    pub(super) fn members_back(&self, back: &[u32]) {
        let Some(lease) = self.fence_lease() else {
            return;
        };
        if lock(&self.inner.lease).member_back() {
            tracing::info!(
                "nodes {back:?} of this node's quorum are alive again: no QoS 2 pushes until \
                 it learned what they adopted"
            );
            self.relearn_after(Duration::ZERO, lease);
        }
    }

    /// Whether this node may push a delivery of `obj` now.
    pub(super) fn hold(&self, obj: ObjectId, exactly_once: bool) -> Hold {
        if lock(&self.inner.handed).contains(&obj) {
            return Hold::Handed;
        }
        if !exactly_once || !self.fenced() {
            return Hold::Go;
        }
        Hold::Wait
    }

    /// The node lease the fence keeps to: `None` without a grid (read on every QoS 2
    /// attempt, so the view is not cloned for it).
    pub(super) fn fence_lease(&self) -> Option<Duration> {
        let v = lock(&self.inner.view);
        (v.grid.is_some() && !v.lease.is_zero()).then_some(v.lease)
    }

    /// Whether this node may not hold its lease now (never without a grid).
    pub(super) fn fenced(&self) -> bool {
        let Some(lease) = self.fence_lease() else {
            return false;
        };
        lock(&self.inner.lease).fenced(Instant::now(), lease)
    }

    /// After a lapse: the objects this node disseminated that a live node adopted or
    /// finished meanwhile leave its outbox and its delivery queues; then the fence lifts,
    /// once every member alive in its view answered (a paused heir that did not answer kept
    /// pushing what it adopted when continued, and so did its origin; found by
    /// `daemon/ownsim`): else it asks again, fenced.
    async fn relearn(&self, lease: Duration) {
        let lapses = lock(&self.inner.lease).lapses();
        let view = self.view();
        let (mut handed, whole) = self.learn_finished(&view).await;
        let (others, whole_others) = self.adopted_by_others(&view).await;
        handed.extend(others);
        if !handed.is_empty() {
            tracing::info!(
                "after the lapse: {} objects are another node's now",
                handed.len()
            );
        }
        self.hand_over(handed);
        if !(whole && whole_others) {
            tracing::debug!("relearning: a live member of the quorum did not answer; again");
            self.relearn_after(RELEARN_RETRY, lease);
            return;
        }
        let again = lock(&self.inner.lease).relearned(Instant::now(), lapses);
        if let Some(wait) = again {
            // it lapsed again meanwhile (what its heir took since is learnt too), or a
            // member came back, or the lapse's lease has not passed yet
            self.relearn_after(wait, lease);
        }
    }

    /// The objects this node adopted from other origins that a live member of their quorum
    /// adopted too (its heir while this node's lease had lapsed), or holds as delivered
    /// (finished or forwarding); they leave this node. And whether every live member
    /// answered in full.
    async fn adopted_by_others(&self, view: &View) -> (HashSet<ObjectId>, bool) {
        let mut out = HashSet::new();
        let Some(g) = view.grid else {
            return (out, true);
        };
        let mut whole = true;
        let me = self.inner.cfg.node;
        let mine = self.inner.store.adopted_ids();
        let origins: std::collections::BTreeSet<u32> = mine.iter().map(|id| id.node).collect();
        for origin in origins {
            let from = mine
                .iter()
                .filter(|id| id.node == origin)
                .map(|id| id.seq)
                .min()
                .unwrap_or(0);
            for (_, ep) in view.live_endpoints(g.xs_quorum(origin), &[me, origin]) {
                // adopted by another, or delivered by another already (finished, or
                // forwarding while a link still owes it)
                for set in [
                    v1::ReplicaSet::Adopted,
                    v1::ReplicaSet::Finished,
                    v1::ReplicaSet::Forwarding,
                ] {
                    let (seqs, answered) = self
                        .replica_seqs(&ep, origin, set, from.saturating_sub(1))
                        .await;
                    whole &= answered;
                    for seq in seqs {
                        let id = ObjectId { node: origin, seq };
                        if mine.contains(&id) {
                            let _ = self.inner.store.retire(id);
                            // its deliveries here close as handed over, which is no
                            // delivery: their closure ends no copy. Before, it told every
                            // holder the object finished, the member that holds it now
                            // among them, which then dropped it undelivered
                            self.adopted_away(id);
                            out.insert(id);
                        }
                    }
                }
            }
        }
        (out, whole)
    }

    /// Objects another node disseminates now: their pushes still queued here are dropped.
    pub(super) fn hand_over(&self, ids: HashSet<ObjectId>) {
        if !ids.is_empty() {
            if tracing::enabled!(tracing::Level::DEBUG) {
                let mut seqs: Vec<String> = ids
                    .iter()
                    .map(|i| format!("{}:{}", i.node, i.seq))
                    .collect();
                seqs.sort();
                tracing::debug!("finished or adopted elsewhere, closed here: {seqs:?}");
            }
            lock(&self.inner.handed).extend(ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::DaemonConfig;

    #[test]
    fn a_lapse_holds_the_fence_a_lease_and_a_member_back_only_until_it_relearned() {
        let lease = Duration::from_millis(300);
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut f = Fence::default();
        assert!(f.fenced(t0, lease), "no answer yet");
        assert_eq!(f.renewed(t0, t0, lease), Renewal::Lapsed { started: true });
        // a member back meanwhile: the relearn under way covers it
        assert!(!f.member_back());
        // a relearn that ends before the lapse's lease passed does not lift the fence (an
        // heir a heartbeat behind may still adopt; found by `daemon/ownsim`)
        let l = f.lapses();
        assert_eq!(f.relearned(t0 + ms(10), l), Some(ms(290)));
        assert!(f.fenced(t0 + ms(10), lease));
        assert_eq!(f.relearned(t0 + lease, l), None);
        assert_eq!(f.renewed(t0 + lease, t0 + lease, lease), Renewal::Held);
        assert!(!f.fenced(t0 + lease, lease));
        // a member back: fenced until a relearn, at once, with no lease to wait
        assert!(f.member_back());
        assert!(f.fenced(t0 + lease, lease));
        let l = f.lapses();
        assert_eq!(f.relearned(t0 + lease + ms(5), l), None);
        assert!(!f.fenced(t0 + lease + ms(5), lease));
        // a change during a relearn makes it run again
        assert!(f.member_back());
        let l = f.lapses();
        assert!(!f.member_back());
        assert_eq!(f.relearned(t0 + lease + ms(9), l), Some(Duration::ZERO));
        assert_eq!(f.relearned(t0 + lease + ms(9), f.lapses()), None);
    }

    #[tokio::test]
    async fn a_node_that_starts_pushes_no_qos2_until_a_lease_after_its_first_answer() {
        let dir = std::env::temp_dir().join(format!(
            "dissem-fence-{}-{}",
            std::process::id(),
            runtime::random_u64()
        ));
        let store = Store::open(&dir, 0).expect("store");
        // nothing listens at the coordinator's address: the daemon is not spawned, and the
        // heartbeat answers are made here
        let cfg = DaemonConfig::new(0, "http://127.0.0.1:9".into(), "http://127.0.0.1:9".into());
        let link = Daemon::link(&cfg).expect("link");
        let d = Daemon::new(cfg, store, Limits::default(), link).expect("daemon");
        let lease = Duration::from_millis(300);
        let m = v1::Membership {
            rows: 1,
            cols: 1,
            lease_ms: lease.as_millis() as u64,
            members: vec![v1::Member {
                node: 0,
                endpoint: "http://127.0.0.1:9".into(),
                alive: true,
                ..v1::Member::default()
            }],
            ..v1::Membership::default()
        };
        d.set_view(Some(&m), true);
        let obj = ObjectId { node: 0, seq: 1 };
        assert_eq!(d.hold(obj, true), Hold::Wait, "no answer yet");
        let first = Instant::now();
        d.lease_renewed(first);
        assert_eq!(
            d.hold(obj, true),
            Hold::Wait,
            "the first answer fences, as a lapse"
        );
        assert_eq!(d.hold(obj, false), Hold::Go, "QoS 1 is never fenced");
        // heartbeats answered on time from here: the fence lifts once it relearnt, a lease on
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.hold(obj, true) != Hold::Go {
            assert!(Instant::now() < deadline, "still fenced after 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
            d.lease_renewed(Instant::now());
        }
        assert!(
            first.elapsed() >= lease,
            "lifted after {:?}",
            first.elapsed()
        );
        drop(d);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
