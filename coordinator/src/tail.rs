//! The standby's registry (issue 31, hole 3): a coordinator that stands by keeps its own
//! copy of the subscription registry current, so that an election at a million
//! subscriptions does not pull every copy from the nodes, write them all to disk and parse
//! every filter before the new leader serves.
//!
//! The first round is the rebuild an election would run ([`crate::rebuild::rebuild`]),
//! and it notes where each node's change feed stood (`storage` numbers every write of a
//! copy or a tombstone). Every later round asks each node only for what changed after
//! that: node 0 and node n-1 (the whole holders) give every change, the other nodes what
//! changed since a Create (tombstones, updated copies), as the rebuild takes them. The
//! changes go into this store with the rebuild's rule (the newest revision wins, a
//! deletion is final) and into the parsed registry kept in memory, which the new leader's
//! registry starts from. An election runs one more round; the tail vouches for the
//! registry only when a whole holder answered whole in it, and the new leader rebuilds in
//! full otherwise (rounds without a whole holder still take what the nodes changed). A
//! node on a new disk (another store identity) is pulled whole again. After a leadership
//! the tail starts over: the leader wrote this store itself, and a subscription it stored
//! whose Create then failed must not outlive the next rebuild.

use std::collections::{BTreeMap, BTreeSet};

use runtime::cluster_secret::ClusterSecret;
use runtime::etcd::Etcd;
use runtime::grid::Layout;
use runtime::{Limits, ServiceError, validate};
use storage::{Newest, Store};

use crate::kept::KeptSubscriptions;
use crate::rebuild::{Cursor, pull};

/// A parsed registry, ready for a new leader (from [`Tail::take_preloaded`]).
#[derive(Debug)]
pub struct Preloaded(pub(crate) KeptSubscriptions);

/// What a standby knows of the nodes' change feeds, and its parsed registry.
#[derive(Debug, Default)]
pub struct Tail {
    cursors: BTreeMap<u32, Cursor>,
    /// The store holds a registry a rebuild made, and the cursors say where it stands.
    synced: bool,
    /// The store's registry, parsed (loaded at the first round after a rebuild).
    kept: Option<KeptSubscriptions>,
    /// The last rebuild found no node recorded (a new cluster): nothing to follow yet.
    no_nodes: bool,
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Copies and tombstones the nodes listed.
    pub listed: usize,
    /// Subscriptions in the store after it.
    pub subscriptions: usize,
}

impl Tail {
    /// Forgets everything: the next round rebuilds in full.
    pub fn reset(&mut self) {
        *self = Tail::default();
    }

    /// A rebuild that a whole holder vouched for left the store at `cursors`.
    pub(crate) fn synced(&mut self, cursors: BTreeMap<u32, Cursor>) {
        self.cursors = cursors;
        self.synced = true;
        self.no_nodes = false;
        self.kept = None;
    }

    /// Whether the rounds take only changes (a rebuild was made since the last reset).
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The last rebuild found no node recorded in etcd.
    pub(crate) fn nothing_to_follow(&mut self) {
        self.no_nodes = true;
    }

    /// Whether this standby may lead without a full rebuild that a synced standby would
    /// spare: it is synced, or there is nothing to rebuild from (a new cluster).
    pub fn ready(&self) -> bool {
        self.synced || self.no_nodes
    }

    /// The parsed registry for a new leader; the tail starts over (the leader writes the
    /// store from now on).
    pub fn take_preloaded(&mut self) -> Option<Preloaded> {
        let kept = self.kept.take().map(Preloaded);
        self.reset();
        kept
    }

    /// One round: the rebuild when the tail is not synced, else what changed at each node
    /// since the last round. The answer is `Some` when a whole holder answered whole in
    /// this round (the store is a registry a new leader may serve), `None` when not (a new
    /// leader must rebuild in full; the tail goes on: while nodes catch up after an
    /// election none is whole, and rebuilding then would only slow them down). A failed
    /// round starts the tail over.
    pub async fn follow(
        &mut self,
        store: &Store,
        etcd: &Etcd,
        layout: Layout,
        secret: &ClusterSecret,
        limits: &Limits,
    ) -> Result<Option<Round>, ServiceError> {
        if !self.synced {
            let n =
                crate::rebuild::rebuild(store, etcd, layout, secret, limits.max_object_bytes, self)
                    .await?;
            if !self.synced {
                return Ok(None);
            }
            self.load_kept(store, limits).await?;
            return Ok(Some(Round {
                listed: n,
                subscriptions: n,
            }));
        }
        let r = self.changes(store, etcd, layout, secret, limits).await;
        if r.is_err() {
            self.reset();
        }
        r
    }

    async fn changes(
        &mut self,
        store: &Store,
        etcd: &Etcd,
        layout: Layout,
        secret: &ClusterSecret,
        limits: &Limits,
    ) -> Result<Option<Round>, ServiceError> {
        let started = std::time::Instant::now();
        let nodes = crate::rebuild::nodes(etcd, secret).await?;
        let holders: BTreeSet<u32> = layout.whole_holders().into_iter().collect();
        let mut merged = Newest::default();
        let mut vouched = false;
        let mut cursors = BTreeMap::new();
        let mut listed = 0;
        for r in nodes.values() {
            let holder = holders.contains(&r.node);
            let max = limits.max_object_bytes;
            let at = self.cursors.get(&r.node).copied();
            let mut p = pull(&r.endpoint, secret, max, !holder, at, &mut merged).await;
            if at.is_none() || matches!(&p, Ok(p) if p.other_store) {
                // a node new to the tail, or on a new disk: everything it holds
                p = pull(&r.endpoint, secret, max, !holder, None, &mut merged).await;
            }
            match p {
                Ok(p) => {
                    vouched |= holder && p.whole;
                    listed += p.listed;
                    cursors.insert(r.node, p.cursor);
                }
                Err(e) => tracing::debug!("tailing node {}: {e}", r.node),
            }
        }
        let pulled = started.elapsed();
        let kept = self.load_kept(store, limits).await?;
        let (records, deleted) = merged.into_parts();
        for id in deleted {
            store.remove_subscription_unflushed(id)?;
            kept.remove(id);
        }
        for (id, revision, record) in records {
            if store.apply_subscription_copy_unflushed(id, &record, revision, None, false)? {
                kept.upsert(id, validate::stored_filter(id, &record, limits)?);
            }
        }
        let subscriptions = kept.len();
        store.commit().await?;
        self.cursors.extend(cursors);
        tracing::debug!(
            "tail round: {listed} changes listed in {} ms, applied in {} ms",
            pulled.as_millis(),
            (started.elapsed() - pulled).as_millis()
        );
        // what the nodes hold is taken either way; it is the whole registry only when a
        // whole holder says so (counted in memory: the store's count walks every record)
        Ok(vouched.then_some(Round {
            listed,
            subscriptions,
        }))
    }

    /// The parsed registry, loaded from the store the first time (off the async threads:
    /// a million filters take seconds, and the campaign goes on meanwhile).
    async fn load_kept(
        &mut self,
        store: &Store,
        limits: &Limits,
    ) -> Result<&mut KeptSubscriptions, ServiceError> {
        if self.kept.is_none() {
            let (store, limits) = (store.clone(), *limits);
            let kept = tokio::task::spawn_blocking(move || {
                let mut kept = KeptSubscriptions::default();
                for (id, dnf) in validate::stored_subscriptions(&store, &limits)? {
                    kept.upsert(id, dnf);
                }
                Ok::<_, ServiceError>(kept)
            })
            .await
            .map_err(|e| ServiceError::Startup(format!("parsing the registry: {e}")))??;
            self.kept = Some(kept);
        }
        Ok(self.kept.get_or_insert_with(KeptSubscriptions::default))
    }
}
