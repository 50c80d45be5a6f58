//! When an object's dissemination is finished: it left the outbox, no push of it is in memory
//! and every delivery record it got is acknowledged or dead-lettered. Quorum replication
//! waits for this (not for the outbox alone, which an object leaves once its records are
//! durable) before the copies on other nodes may go: a node that dies with pending records
//! leaves them to whoever takes its objects over. And the QoS 2 "received" phase reaches the
//! holders before the release goes out ([`Phases`]).

use std::collections::HashSet;

use super::*;

/// What quorum replication needs from the QoS 2 handshake.
#[tonic::async_trait]
pub trait Phases: Send + Sync {
    /// A subscriber has the QoS 2 delivery (sub, obj) "received": `true` once the holders
    /// of the object's copies know it, so a node that takes the object over only releases
    /// it. The release waits for this.
    async fn received(&self, sub: u64, obj: ObjectId) -> bool;

    /// Whether a delivery of `obj` may be pushed now (`exactly_once`: of a QoS 2
    /// subscription), asked before every attempt.
    fn hold(&self, obj: ObjectId, exactly_once: bool) -> Hold;
}

/// What an active-passive primary's standby knows (the federation): a QoS 2 delivery of this
/// node's object goes out only once the standby knows the object finished here, so a standby
/// promoted after this node dies never delivers it a second time.
#[tonic::async_trait]
pub trait StandbyGate: Send + Sync {
    /// Returns once a healthy standby knows `obj` finished here (at once without a standby,
    /// or while it does not answer; at most after a bound).
    async fn known_to_standby(&self, obj: ObjectId);
}

/// Whether a delivery may be pushed now ([`Phases::hold`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Push it.
    Go,
    /// Not now (this node may have lost its lease, so another node may own the object):
    /// tried again shortly, no attempt counted.
    Wait,
    /// Another node took the object over and delivers it: the record here is closed.
    Handed,
}

impl Deliverer {
    /// Who learns of QoS 2 "received" phases before the release goes out.
    pub fn on_received(&self, p: Arc<dyn Phases>) {
        *lock(&self.inner.phases) = Some(p);
    }

    /// Tells [`Phases`] of the "received" phase of (sub, obj); `true` without one.
    pub(super) async fn received_known(&self, sub: u64, obj: ObjectId) -> bool {
        let p = lock(&self.inner.phases).clone();
        match p {
            Some(p) => p.received(sub, obj).await,
            None => true,
        }
    }

    /// Asks [`Phases`] whether a delivery of `obj` may be pushed now; always without one.
    pub(super) fn hold(&self, obj: ObjectId, exactly_once: bool) -> Hold {
        let p = lock(&self.inner.phases).clone();
        p.map_or(Hold::Go, |p| p.hold(obj, exactly_once))
    }

    /// Who tells whether a standby knows an object finished here ([`StandbyGate`]).
    pub fn on_standby(&self, g: Arc<dyn StandbyGate>) {
        *lock(&self.inner.standby) = Some(g);
    }

    /// Waits until a standby knows `obj` finished here (QoS 2 deliveries of this node's
    /// objects; at once without a [`StandbyGate`]).
    pub(super) async fn standby_knows(&self, obj: ObjectId) {
        let g = lock(&self.inner.standby).clone();
        if let Some(g) = g
            && obj.node == self.inner.store.node()
        {
            g.known_to_standby(obj).await;
        }
    }

    /// Where finished objects are reported (the node daemon tells the copies' holders).
    /// Set once; a second queue is ignored.
    pub fn on_finished(&self, queue: Arc<FinishedQueue>) {
        let _ = self.inner.finished.set(queue);
    }

    /// A delivery record of (sub, obj) is open (pending or QoS 2 "received").
    pub(super) fn opened(&self, sub: u64, obj: ObjectId) {
        self.inner.ledger.opened(sub, obj);
    }

    /// The record of (sub, obj) is final (acknowledged or dead-lettered).
    pub(super) fn closed(&self, sub: u64, obj: ObjectId) {
        if self.inner.ledger.closed(sub, obj) {
            self.maybe_finished(obj);
        }
    }

    /// Reports `obj` finished when it is: out of the outbox, no push in memory, no open record.
    pub(super) fn maybe_finished(&self, obj: ObjectId) {
        if self.inner.store.in_outbox(obj) || !self.inner.ledger.settled(obj) {
            return;
        }
        if let Some(q) = self.inner.finished.get() {
            q.push(obj);
        }
    }

    /// Whether `obj` has open delivery records.
    pub fn is_open(&self, obj: ObjectId) -> bool {
        self.inner.ledger.is_open(obj)
    }

    /// Objects of `origin` with open delivery records (their dissemination is not finished
    /// though they left the outbox).
    pub fn open_objects(&self, origin: u32) -> HashSet<u64> {
        self.inner.ledger.open_objects(origin)
    }
}
