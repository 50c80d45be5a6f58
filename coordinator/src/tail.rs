//! The standby's registry (issue 31, hole 3): a coordinator that stands by keeps its own
//! copy of the subscription registry current, so that an election at a million
//! subscriptions does not pull every copy from the nodes, write them all to disk and parse
//! every filter before the new leader serves.
//!
//! The first round is the rebuild an election would run ([`crate::rebuild::rebuild`]),
//! and it notes where each node's change feed stood (`storage` numbers every write of a
//! copy or a tombstone). Every later round asks each node only for what changed after
//! that, at most [`ROUND_BUDGET`] changes a node (the next round goes on from there): a
//! whole holder (node 0 or node n-1) listed in full gives every change, and once it
//! answered whole the other holder and the other nodes give what changed since a Create
//! (tombstones, updated copies), as the rebuild takes them; with none whole, both holders
//! give every change. A
//! rebuild no whole holder vouched for is kept as the base too, and a later round vouches
//! for it (rebuilding in full again took seconds at a million subscriptions, and an
//! election just after an election found no standby ready, `bench failover` 13 s). The
//! changes go into this store with the rebuild's rule (the newest revision wins, a
//! deletion is final) and into the parsed registry kept in memory, which the new leader's
//! registry starts from. An election runs one more round; the tail vouches for the
//! registry only when a whole holder answered whole in it, and only a holder whose every
//! copy the tail took (listed in full from its cursor on: the rebuild lists one holder in
//! full, the other for what changed since Creates); the new leader rebuilds in full
//! otherwise (rounds without a whole holder still take what the nodes changed). A node on
//! a new disk (another store identity) is pulled whole again.
//!
//! Every round saves where it stands in the store with the changes it took, so the tail
//! resumes after a restart instead of rebuilding (a restarted standby took 8–12 s to be
//! ready at a million subscriptions, and the next election found none). After a
//! leadership it resumes too: the leader wrote this store itself, journaled
//! (`storage::resume`), and a subscription it stored whose Create then failed must not
//! outlive the leadership, so each journaled id is first set to what a whole holder holds
//! (with none whole, the tail waits up to [`RESUME_PATIENCE`] for one, then rebuilds).

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
    /// The whole holders whose every copy the store took (listed in full from the cursor
    /// on): only such a holder answering whole vouches for a round. One listed only for
    /// what changed since Creates may hold a create the store lacks (made while the holder
    /// listed in full was down, or during its listing).
    listed: BTreeSet<u32>,
    /// The store holds a registry a rebuild made, and the cursors say where it stands.
    based: bool,
    /// A whole holder vouched for a round (or the rebuild) since then.
    synced: bool,
    /// The store's registry, parsed (loaded at the first round after a rebuild).
    kept: Option<KeptSubscriptions>,
    /// The last rebuild found no node recorded (a new cluster): nothing to follow yet.
    no_nodes: bool,
    /// Since when a resume waits for a whole holder to set a leadership's writes by.
    waiting: Option<std::time::Instant>,
}

/// How long a resume waits for a whole holder (after an election every node is not whole
/// until its catch-up, seconds at most) before the tail rebuilds instead (`bench chaos`
/// rebuilt 137 times where it could have resumed 16 times).
const RESUME_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// What a resume did (the simulation's resume answers the same, `sim::tail`).
pub(crate) enum Resumed {
    /// The tail goes on from the saved state.
    Yes,
    /// Nothing to resume from: rebuild.
    No,
    /// A leadership's writes wait for a whole holder: try again at the next round.
    Wait,
}

/// The tail state saved in the store (`storage::resume`): (node, store identity, last
/// change taken), and the holders listed in full.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Saved {
    cursors: Vec<(u32, u64, u64)>,
    listed: Vec<u32>,
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Copies and tombstones the nodes listed.
    pub listed: usize,
    /// Subscriptions in the store after it.
    pub subscriptions: usize,
    /// A node had more changes than [`ROUND_BUDGET`]: the next round goes on from where
    /// this one stopped (a new leader runs rounds until none is left).
    pub more: bool,
}

/// Most changes one round lists from one node. A round is bounded so that it never holds
/// a standby for long: during a bulk load a standby's round grew to 640,000 changes and
/// 36 s (`bench failover --subs 1000000`), and a campaign won meanwhile was seen only
/// when it ended (an election 9 s after the kill).
pub const ROUND_BUDGET: usize = 32 * 1024;

impl Tail {
    /// Forgets everything: the next round rebuilds in full.
    pub fn reset(&mut self) {
        *self = Tail::default();
    }

    /// A rebuild left the store at `cursors`, with every copy of the nodes `listed`
    /// (`vouched`: a whole holder answered whole in it).
    pub(crate) fn based(
        &mut self,
        cursors: BTreeMap<u32, Cursor>,
        listed: BTreeSet<u32>,
        vouched: bool,
    ) {
        self.cursors = cursors;
        self.listed = listed;
        self.based = true;
        self.synced = vouched;
        self.no_nodes = false;
        self.kept = None;
    }

    /// The rebuild's filters, parsed from its `held` records while the store wrote them:
    /// those the store did not take (this disk's own tombstones) are left out.
    pub(crate) fn parsed(
        &mut self,
        mut kept: KeptSubscriptions,
        held: usize,
        store: &Store,
    ) -> Result<(), ServiceError> {
        if kept.len() != held {
            for id in kept.ids() {
                if store.get_subscription(id)?.is_none() {
                    kept.remove(id);
                }
            }
        }
        self.kept = Some(kept);
        Ok(())
    }

    /// Whether the rounds take only changes (a rebuild was made since the last reset).
    pub fn is_based(&self) -> bool {
        self.based
    }

    /// The last rebuild found no node recorded in etcd.
    pub(crate) fn nothing_to_follow(&mut self) {
        self.no_nodes = true;
    }

    /// Whether this standby may lead without a full rebuild that a synced standby would
    /// spare: a whole holder vouched for a round since its rebuild, or there is nothing to
    /// rebuild from (a new cluster).
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

    /// One round: the rebuild when the tail has no base, else what changed at each node
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
        if !self.based {
            let resumed = match self.resume(store, etcd, layout, secret, limits).await {
                Ok(Resumed::Wait) => return Ok(None),
                Ok(r) => matches!(r, Resumed::Yes),
                Err(e) => {
                    tracing::warn!("resuming the registry on this disk: {e}; rebuilding");
                    false
                }
            };
            if !resumed {
                let max = limits.max_object_bytes;
                let n =
                    crate::rebuild::rebuild(store, etcd, layout, secret, max, Some(limits), self)
                        .await?;
                if !self.synced {
                    return Ok(None);
                }
                self.load_kept(store, limits).await?;
                return Ok(Some(Round {
                    listed: n,
                    subscriptions: n,
                    more: false,
                }));
            }
        }
        let r = self.changes(store, etcd, layout, secret, limits).await;
        match &r {
            Ok(Some(_)) => self.synced = true,
            Ok(None) => {}
            Err(_) => self.reset(),
        }
        r
    }

    /// Writes where the tail stands into `store` (not yet durable: the caller commits it
    /// with the changes it describes).
    pub(crate) fn save(&self, store: &Store) -> Result<(), ServiceError> {
        let saved = Saved {
            cursors: self
                .cursors
                .iter()
                .map(|(&n, c)| (n, c.store_id, c.change))
                .collect(),
            listed: self.listed.iter().copied().collect(),
        };
        let bytes = serde_json::to_vec(&saved)
            .map_err(|e| ServiceError::Startup(format!("the tail state: {e}")))?;
        store.set_tail_state_unflushed(Some(&bytes))?;
        Ok(())
    }

    /// Resumes from the registry on this disk (after a restart, or after leading): the
    /// store holds the nodes' copies as of the tail state it saved, plus the writes of a
    /// leadership since, journaled (`storage::resume`). Each journaled id is set to what a
    /// whole holder holds (a Create stored here whose replication then failed goes, an
    /// update no node took is undone), and the rounds go on from the saved cursors: a few
    /// pages instead of a million copies (a restarted standby took 8–12 s to be ready,
    /// `bench failover`). [`Resumed::No`] (rebuild in full) when the disk has no tail
    /// state, or journaled writes and no whole holder to set them by for
    /// [`RESUME_PATIENCE`]; until then [`Resumed::Wait`].
    async fn resume(
        &mut self,
        store: &Store,
        etcd: &Etcd,
        layout: Layout,
        secret: &ClusterSecret,
        limits: &Limits,
    ) -> Result<Resumed, ServiceError> {
        let Some(bytes) = store.tail_state()? else {
            return Ok(Resumed::No);
        };
        let saved: Saved = match serde_json::from_slice(&bytes) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("the tail state on this disk does not parse ({e}): rebuilding");
                return Ok(Resumed::No);
            }
        };
        let journal = store.registry_journal()?;
        if !journal.is_empty() {
            let nodes = crate::rebuild::nodes(etcd, secret).await?;
            let max = limits.max_object_bytes;
            let mut held = None;
            for n in layout.whole_holders() {
                let Some(r) = nodes.get(&n) else { continue };
                let (updated, from) = (&journal.updated, journal.from);
                let found = crate::rebuild::copies_of(&r.endpoint, secret, max, updated, from);
                match found.await {
                    Ok(h) => {
                        held = Some(h);
                        break;
                    }
                    Err(e) => tracing::debug!("the journaled subscriptions at node {n}: {e}"),
                }
            }
            let Some(held) = held else {
                let since = *self.waiting.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() < RESUME_PATIENCE {
                    return Ok(Resumed::Wait);
                }
                self.waiting = None;
                tracing::info!(
                    "registry on this disk: writes of a leadership to undo and no whole node \
                     to undo them by for {} s: rebuilding",
                    RESUME_PATIENCE.as_secs()
                );
                return Ok(Resumed::No);
            };
            // the leadership's Creates held here that no whole node holds go; every
            // journaled id becomes what the node holds
            let mut ids = journal.updated.clone();
            if let Some(from) = journal.from {
                ids.extend(store.subscription_ids_from(from)?);
                ids.extend(held.range(from..).map(|(&id, _)| id));
            }
            ids.sort_unstable();
            ids.dedup();
            for id in &ids {
                match held.get(id) {
                    Some(storage::SubCopy {
                        record: Some(record),
                        revision,
                        ..
                    }) => {
                        store.set_subscription_unflushed(*id, Some((*revision, record)))?;
                    }
                    Some(_) => {
                        store.remove_subscription_unflushed(*id)?;
                    }
                    None => {
                        store.set_subscription_unflushed(*id, None)?;
                    }
                }
            }
            tracing::info!(
                "registry on this disk: {} subscriptions a leadership wrote set to the nodes' \
                 copies",
                ids.len()
            );
        }
        store.clear_registry_journal_unflushed(&journal)?;
        store.commit().await?;
        let cursors = saved
            .cursors
            .into_iter()
            .map(|(n, store_id, change)| (n, Cursor { store_id, change }))
            .collect();
        self.based(cursors, saved.listed.into_iter().collect(), false);
        self.waiting = None;
        tracing::info!("registry on this disk resumed: taking the nodes' changes since");
        Ok(Resumed::Yes)
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
        let mut unlisted_whole = Vec::new();
        let mut cursors = BTreeMap::new();
        let mut listed = 0;
        let mut more = false;
        // a listed holder first: once one answered whole, the other holder gives what
        // changed since Creates like every node (as the rebuild takes them), instead of a
        // million creates twice in a bulk load
        let mut order: Vec<_> = nodes.values().collect();
        order.sort_by_key(|r| !(holders.contains(&r.node) && self.listed.contains(&r.node)));
        for r in order {
            let holder = holders.contains(&r.node);
            let changed_only = !holder || vouched;
            if holder && vouched {
                // its creates are not taken from here on: listed in full again if needed
                self.listed.remove(&r.node);
            }
            let max = limits.max_object_bytes;
            let at = self.cursors.get(&r.node).copied();
            let budget = ROUND_BUDGET;
            let mut p = pull(
                &r.endpoint,
                secret,
                max,
                changed_only,
                at,
                budget,
                &mut merged,
            )
            .await;
            if at.is_none() || matches!(&p, Ok(p) if p.other_store) {
                // a node new to the tail, or on a new disk: everything it holds
                let all = usize::MAX;
                p = pull(
                    &r.endpoint,
                    secret,
                    max,
                    changed_only,
                    None,
                    all,
                    &mut merged,
                )
                .await;
                if !changed_only && p.is_ok() {
                    self.listed.insert(r.node);
                }
            }
            match p {
                Ok(p) => {
                    if holder && p.whole && !self.listed.contains(&r.node) {
                        unlisted_whole.push(r.node);
                    }
                    vouched |= holder && p.whole && self.listed.contains(&r.node);
                    listed += p.listed;
                    more |= p.more;
                    cursors.insert(r.node, p.cursor);
                }
                Err(e) => tracing::debug!("tailing node {}: {e}", r.node),
            }
        }
        let pulled = started.elapsed();
        self.load_kept(store, limits).await?;
        let kept = self.kept.take().unwrap_or_default();
        // the writes and the parsing take seconds for a big round: off the async threads,
        // so the campaign beside the tail goes on
        let (applying, limits_at) = (store.clone(), *limits);
        let applied = tokio::task::spawn_blocking(move || {
            let mut kept = kept;
            let r = apply(&applying, &mut kept, merged, &limits_at);
            (kept, r)
        })
        .await
        .map_err(|e| ServiceError::Startup(format!("applying the nodes' changes: {e}")));
        let (kept, r) = applied?;
        let subscriptions = kept.len();
        self.kept = Some(kept);
        r?;
        self.cursors.extend(cursors);
        if !vouched {
            // the holder listed in full is down or catching up, the other one is whole:
            // the next round lists that one in full, and then it can vouch
            for n in unlisted_whole {
                self.cursors.remove(&n);
            }
        }
        self.save(store)?;
        store.commit().await?;
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
            more,
        }))
    }

    /// The parsed registry, loaded from the store the first time (off the async threads:
    /// a million filters take seconds, and the campaign goes on meanwhile); after a
    /// standby's rebuild, which parsed them beside the store, already there.
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

/// Takes the newest copies and tombstones a round merged into `store` (not yet durable)
/// and into the parsed registry `kept`.
fn apply(
    store: &Store,
    kept: &mut KeptSubscriptions,
    merged: Newest,
    limits: &Limits,
) -> Result<(), ServiceError> {
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
    Ok(())
}

/// The filters of a rebuild's records (id, revision, record), parsed.
pub(crate) fn parse_records(
    records: &[(u64, u64, Vec<u8>)],
    limits: &Limits,
) -> Result<KeptSubscriptions, ServiceError> {
    let started = std::time::Instant::now();
    let mut kept = KeptSubscriptions::default();
    for (id, _, record) in records {
        kept.upsert(*id, validate::stored_filter(*id, record, limits)?);
    }
    tracing::info!(
        "standby registry: {} filters parsed in {} ms",
        kept.len(),
        started.elapsed().as_millis()
    );
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use proto::v1;

    fn record(id: u64, k: u32) -> Vec<u8> {
        v1::Subscription {
            id,
            filter: Some(v1::subscription::Filter::Text(format!("n = {k}"))),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// The filters a rebuild parsed while the store wrote them are the store's: a record
    /// this disk holds a tombstone of is stored by neither.
    #[test]
    fn filters_parsed_beside_the_store_leave_out_what_the_store_refused() {
        let dir = std::env::temp_dir().join(format!(
            "dissem-tail-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let store = Store::open(&dir, 0).expect("store");
            store
                .put_subscription(2, record(2, 2), 1)
                .await
                .expect("put");
            assert!(store.delete_subscription(2).await.expect("delete"));
            let records: Vec<(u64, u64, Vec<u8>)> =
                (1..=3).map(|id| (id, 1, record(id, id as u32))).collect();
            let limits = Limits::default();
            let parsed = parse_records(&records, &limits).expect("parse");
            assert_eq!(parsed.len(), 3);
            let held = store
                .replace_subscriptions(&records, &[])
                .await
                .expect("replace");
            assert_eq!(held, 2, "the tombstone outlives the rebuild");
            let mut tail = Tail::default();
            tail.based(BTreeMap::new(), BTreeSet::new(), true);
            tail.parsed(parsed, held, &store).expect("parsed");
            let kept = tail.take_preloaded().expect("kept").0;
            assert_eq!(kept.ids(), vec![1, 3]);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
