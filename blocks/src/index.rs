//! Versions of a shard and incremental change: the match block as workers hold it.
//!
//! A [`MatchIndex`] is an immutable snapshot: a compiled base (the shard as it was at some
//! version, [`MatchIndex::base_version`]), and the overlay of every subscription changed
//! since (its state in this version: upserted or deleted) in layers, oldest first, each
//! compiled into a small shard of its own, as a log-structured merge tree keeps its runs. A
//! change makes a new snapshot that shares the base and the older layers: small changes go
//! into the newest layer while it holds at most [`TOP_MAX`] subscriptions, larger ones make
//! a layer of their own, and a layer at least half the size of the one below it is merged
//! into it. Layer sizes so at least double downwards: a version costs what changed lately,
//! each change is compiled again a logarithmic number of times (a bulk load of a thousand
//! subscriptions a version compiled every change since the base again at every version
//! with one middle layer), and a handful of layers answer each object. Work in flight
//! keeps the snapshot it started with, so an object is matched against one consistent
//! version. A layer's results are filtered by the layers above it (a changed subscription
//! is answered by the newest layer that holds it only), and the overlays' are added.
//!
//! [`MatchIndex::compact`] folds the overlay into a fresh base; callers run it off the hot
//! path when [`MatchIndex::needs_compaction`] says so, and carry the newer versions made
//! meanwhile over to the fresh base with [`MatchIndex::rebase`], which compiles only what
//! changed after the compacted version.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::formula::Dnf;
use crate::hash::FastSet;
use crate::image::{self, DeltaImage, ImageError, ShardImage};
use crate::predicate::Event;
use crate::shard::{Base, BuildError, EvalCtx, ShardConfig, Strategy, StrategyChoice, VerifyStats};

/// Most changed subscriptions the newest layer takes more changes into (past it, a change
/// makes a layer of its own).
pub const TOP_MAX: usize = 128;

/// Overlay size below which compaction is never advised.
pub const MIN_COMPACT_DELTA: usize = 1024;

/// Overlay size above which compaction is always advised.
pub const MAX_COMPACT_DELTA: usize = 8192;

/// The base's share (1/N of its subscriptions) the overlay may reach between the two bounds
/// above before compaction is advised: a compaction costs the whole base, so a bigger base
/// waits for more changes and the compaction's cost per change stays about the same.
pub const COMPACT_SHARE: usize = 256;

/// Why a change could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("subscription {0} does not exist")]
    NotFound(u64),
    #[error("delta applies to version {expected}, but this index is at version {actual}")]
    VersionMismatch { expected: u64, actual: u64 },
    #[error(
        "version {version} cannot be carried over to the base compacted at version {compacted}"
    )]
    Rebase { version: u64, compacted: u64 },
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// The compiled base and what it was compiled from.
#[derive(Debug)]
struct BaseLayer {
    /// The version whose subscriptions it holds: its name (one version, one set of
    /// subscriptions, one compiled shard, whichever node compiled it).
    version: u64,
    base: Base,
    /// Its subscriptions, encoded (for compaction and images; compact in memory).
    image: Vec<u8>,
    ids: Vec<u64>,
}

/// Subscriptions changed (over the layers below), as they are in one version.
#[derive(Debug, Default)]
struct Overlay {
    /// Each changed subscription's state: `None` deleted (or never in a layer below).
    changes: BTreeMap<u64, Option<Arc<Dnf>>>,
    /// The upserted subscriptions compiled (`None`: there are none).
    compiled: Option<Base>,
    /// The changed ids again, for the lookup of every answer of the layers below.
    ids: FastSet<u64>,
}

impl Overlay {
    fn compile(
        cfg: ShardConfig,
        changes: BTreeMap<u64, Option<Arc<Dnf>>>,
    ) -> Result<Overlay, IndexError> {
        let compiled = if changes.values().any(Option::is_some) {
            let subs = changes
                .iter()
                .filter_map(|(id, s)| s.as_deref().map(|d| (*id, d)));
            Some(Base::build(overlay_config(cfg), subs)?)
        } else {
            None
        };
        let ids = changes.keys().copied().collect();
        Ok(Overlay {
            changes,
            compiled,
            ids,
        })
    }
}

/// One compiled overlay layer of a version, and what answers above it.
#[derive(Debug, Clone, Copy)]
pub struct OverlayLayer<'a> {
    /// The layer's upserted subscriptions, compiled.
    pub base: &'a Base,
    /// The newer layers.
    above: &'a [Arc<Overlay>],
}

impl OverlayLayer<'_> {
    /// Whether a newer layer changed subscription `id` again (then this layer's answer for
    /// it does not hold).
    pub fn shadowed(&self, id: u64) -> bool {
        self.above.iter().any(|l| l.ids.contains(&id))
    }
}

/// One version of a shard's match block.
#[derive(Debug, Clone)]
pub struct MatchIndex {
    version: u64,
    base: Arc<BaseLayer>,
    /// The overlay's layers, oldest first.
    layers: Vec<Arc<Overlay>>,
    /// Subscriptions changed since the base (counted once over the layers).
    delta: usize,
    /// Subscriptions in this version.
    len: usize,
}

/// How an overlay is compiled: with test ids (a match worker tests values against it and
/// finds candidates by predicate id), without Bloom tables (an overlay is small: its access
/// lists or cells are cheaper than filters to build), its strategy chosen as the base's is
/// (wide ranges match by cells there too).
fn overlay_config(cfg: ShardConfig) -> ShardConfig {
    let strategy = match cfg.strategy {
        StrategyChoice::Fixed(Strategy::Bloom) => StrategyChoice::Auto,
        s => s,
    };
    ShardConfig {
        strategy,
        bloom_tables: false,
        test_ids: true,
        ..cfg
    }
}

impl MatchIndex {
    /// Builds version 1 from subscriptions.
    pub fn build(cfg: ShardConfig, subs: Vec<(u64, Dnf)>) -> Result<MatchIndex, IndexError> {
        MatchIndex::build_version(cfg, 1, subs)
    }

    fn build_version(
        cfg: ShardConfig,
        version: u64,
        mut subs: Vec<(u64, Dnf)>,
    ) -> Result<MatchIndex, IndexError> {
        subs.sort_by_key(|s| s.0);
        if let Some(w) = subs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(BuildError::DuplicateSubscription(w[0].0).into());
        }
        let base = Base::build(cfg, subs.iter().map(|(id, d)| (*id, d)))?;
        let ids: Vec<u64> = subs.iter().map(|s| s.0).collect();
        let len = ids.len();
        let img = ShardImage {
            version,
            bloom: cfg.bloom,
            subs,
        };
        Ok(MatchIndex {
            version,
            base: Arc::new(BaseLayer {
                version,
                base,
                image: image::encode_shard(&img),
                ids,
            }),
            layers: Vec::new(),
            delta: 0,
            len,
        })
    }

    /// Loads a full shard image.
    pub fn from_image(cfg: ShardConfig, bytes: &[u8]) -> Result<MatchIndex, IndexError> {
        let img = image::decode_shard(bytes)?;
        let cfg = ShardConfig {
            bloom: img.bloom,
            ..cfg
        };
        MatchIndex::build_version(cfg, img.version, img.subs)
    }

    /// The version number.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The compiled base (for the GPU path and statistics). A subscription changed since
    /// the base is answered by the overlay: filter the base's answers with
    /// [`MatchIndex::changed`].
    pub fn base(&self) -> &Base {
        &self.base.base
    }

    /// The version the base holds the subscriptions of (its name: two nodes holding bases
    /// of the same version hold the same compiled shard, predicate ids included).
    pub fn base_version(&self) -> u64 {
        self.base.version
    }

    /// The compiled overlay layers (those with upserted subscriptions), oldest first: a
    /// subscription's answer from a layer holds unless [`OverlayLayer::shadowed`].
    pub fn overlays(&self) -> Vec<OverlayLayer<'_>> {
        self.layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                l.compiled.as_ref().map(|b| OverlayLayer {
                    base: b,
                    above: &self.layers[i + 1..],
                })
            })
            .collect()
    }

    /// Whether subscription `id` changed since the base (then the base's answer for it does
    /// not hold in this version).
    pub fn changed(&self, id: u64) -> bool {
        self.layers.iter().any(|l| l.ids.contains(&id))
    }

    /// Whether both are versions on the same compiled base (one made from the other without
    /// a compaction in between, or the same version).
    pub fn same_base(&self, other: &MatchIndex) -> bool {
        Arc::ptr_eq(&self.base, &other.base)
    }

    /// Number of subscriptions in this version.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of changes not yet folded into the base (subscriptions changed since).
    pub fn delta_len(&self) -> usize {
        self.delta
    }

    /// Each changed subscription's state in this version (the layers merged).
    fn net_changes(&self) -> BTreeMap<u64, Option<Arc<Dnf>>> {
        let mut all = BTreeMap::new();
        for l in &self.layers {
            for (id, s) in &l.changes {
                all.insert(*id, s.clone());
            }
        }
        all
    }

    /// A changed subscription's state (`None`: not changed since the base).
    fn change(&self, id: u64) -> Option<&Option<Arc<Dnf>>> {
        self.layers.iter().rev().find_map(|l| l.changes.get(&id))
    }

    /// The overlay size past which compaction is advised for this base (see
    /// [`COMPACT_SHARE`]).
    pub fn compaction_threshold(&self) -> usize {
        (self.base.ids.len() / COMPACT_SHARE).clamp(MIN_COMPACT_DELTA, MAX_COMPACT_DELTA)
    }

    /// Whether the overlay has grown past [`MatchIndex::compaction_threshold`].
    pub fn needs_compaction(&self) -> bool {
        self.delta_len() > self.compaction_threshold()
    }

    fn in_base(&self, id: u64) -> bool {
        self.base.ids.binary_search(&id).is_ok()
    }

    /// Whether a subscription exists in this version.
    pub fn contains(&self, id: u64) -> bool {
        match self.change(id) {
            Some(state) => state.is_some(),
            None => self.in_base(id),
        }
    }

    /// A new version with the subscription added or replaced.
    pub fn upsert(&self, id: u64, dnf: Dnf) -> Result<MatchIndex, IndexError> {
        self.changed_to(self.version + 1, [(id, Some(dnf))])
    }

    /// A new version without the subscription.
    pub fn remove(&self, id: u64) -> Result<MatchIndex, IndexError> {
        if !self.contains(id) {
            return Err(IndexError::NotFound(id));
        }
        self.changed_to(self.version + 1, [(id, None)])
    }

    /// Version `version`: this one with `changes` made (`None`: deleted; deleting a
    /// subscription that is not there changes nothing). Compiles one layer: the newest
    /// with the changes in it, or a new one, merged with those below it at most half its
    /// size.
    pub fn changed_to(
        &self,
        version: u64,
        changes: impl IntoIterator<Item = (u64, Option<Dnf>)>,
    ) -> Result<MatchIndex, IndexError> {
        let mut fresh: BTreeMap<u64, Option<Arc<Dnf>>> = BTreeMap::new();
        let (mut len, mut delta) = (self.len, self.delta);
        for (id, state) in changes {
            let was = match fresh.get(&id) {
                Some(s) => s.is_some(),
                None => {
                    delta += usize::from(!self.changed(id));
                    self.contains(id)
                }
            };
            len = len + usize::from(state.is_some()) - usize::from(was);
            fresh.insert(id, state.map(Arc::new));
        }
        let mut layers = self.layers.clone();
        // a small newest layer takes the changes; a layer below at most twice the new
        // one's size is merged into it (the newer state wins)
        let merge = |fresh: &mut BTreeMap<u64, Option<Arc<Dnf>>>, below: &Overlay| {
            let mut merged = below.changes.clone();
            merged.append(fresh);
            *fresh = merged;
        };
        if let Some(top) = layers.last()
            && top.changes.len() <= TOP_MAX
        {
            merge(&mut fresh, top);
            layers.pop();
        }
        while let Some(below) = layers.last()
            && below.changes.len() <= 2 * fresh.len()
        {
            merge(&mut fresh, below);
            layers.pop();
        }
        let cfg = self.base.base.config();
        layers.push(Arc::new(Overlay::compile(cfg, fresh)?));
        Ok(MatchIndex {
            version,
            base: Arc::clone(&self.base),
            layers,
            delta,
            len,
        })
    }

    /// Applies a delta image (which must start from this version).
    pub fn apply(&self, delta: &DeltaImage) -> Result<MatchIndex, IndexError> {
        if delta.base_version != self.version {
            return Err(IndexError::VersionMismatch {
                expected: delta.base_version,
                actual: self.version,
            });
        }
        let removes = delta.removes.iter().map(|id| (*id, None));
        let upserts = delta.upserts.iter().map(|(id, d)| (*id, Some(d.clone())));
        self.changed_to(delta.version, removes.chain(upserts))
    }

    /// This version over `compacted`, the base compacted from `from` (an earlier version of
    /// this index on the same base): the overlay then holds only what changed after `from`,
    /// compiled once. Fails when `from` is not such a version.
    pub fn rebase(
        &self,
        from: &MatchIndex,
        compacted: &MatchIndex,
    ) -> Result<MatchIndex, IndexError> {
        let refused = IndexError::Rebase {
            version: self.version,
            compacted: compacted.version,
        };
        if !self.same_base(from)
            || compacted.version != from.version
            || compacted.delta_len() != 0
            || from.version > self.version
        {
            return Err(refused);
        }
        // changes only accumulate on one base: each of `from`'s is in this version too
        let (now, then) = (self.net_changes(), from.net_changes());
        if then.keys().any(|id| !now.contains_key(id)) {
            return Err(refused);
        }
        let later: BTreeMap<u64, Option<Arc<Dnf>>> = now
            .into_iter()
            .filter(|(id, state)| !then.get(id).is_some_and(|old| same_state(old, state)))
            .collect();
        let cfg = compacted.base.base.config();
        let delta = later.len();
        let layers = if later.is_empty() {
            Vec::new()
        } else {
            vec![Arc::new(Overlay::compile(cfg, later)?)]
        };
        Ok(MatchIndex {
            version: self.version,
            base: Arc::clone(&compacted.base),
            layers,
            delta,
            len: self.len,
        })
    }

    /// Every subscription of this version, sorted by id.
    pub fn subscriptions(&self) -> Result<Vec<(u64, Dnf)>, IndexError> {
        let base = image::decode_shard(&self.base.image)?;
        let mut subs: Vec<(u64, Dnf)> = base
            .subs
            .into_iter()
            .filter(|(id, _)| !self.changed(*id))
            .collect();
        subs.extend(
            self.net_changes()
                .iter()
                .filter_map(|(id, s)| s.as_deref().map(|d| (*id, d.clone()))),
        );
        subs.sort_by_key(|s| s.0);
        Ok(subs)
    }

    /// The full data image of this version.
    pub fn to_image(&self) -> Result<Vec<u8>, IndexError> {
        Ok(image::encode_shard(&ShardImage {
            version: self.version,
            bloom: self.base.base.config().bloom,
            subs: self.subscriptions()?,
        }))
    }

    /// The same version with the overlay folded into a freshly built base.
    pub fn compact(&self) -> Result<MatchIndex, IndexError> {
        MatchIndex::build_version(self.base.base.config(), self.version, self.subscriptions()?)
    }

    /// Matches a batch of events with the shard's own strategy: `out[i]` gets the sorted,
    /// deduplicated subscription ids event `i` matches.
    pub fn match_batch(
        &self,
        events: &[Event],
        ctx: &mut EvalCtx,
        out: &mut Vec<Vec<u64>>,
    ) -> VerifyStats {
        self.match_batch_with(self.base().strategy(), events, ctx, out)
    }

    /// As [`MatchIndex::match_batch`] on up to `threads` threads
    /// ([`crate::shard::Base::match_records_split`]).
    pub fn match_batch_split(
        &self,
        events: &[Event],
        threads: usize,
        out: &mut Vec<Vec<u64>>,
    ) -> VerifyStats {
        let mut recs: Vec<Vec<u32>> = vec![Vec::new(); events.len()];
        let stats = self.base().match_records_split(events, threads, &mut recs);
        out.resize_with(events.len(), Vec::new);
        let threads = threads.clamp(1, events.len().max(1));
        if threads == 1 {
            self.finish_into(events, &recs, out);
            return stats;
        }
        // each event's ids are sorted on its own (W1: ~1,000 per event, a tenth of a batch's
        // time on one thread), so the events are split between the threads here too
        let per = events.len().div_ceil(threads);
        std::thread::scope(|s| {
            for ((evs, rs), o) in events
                .chunks(per)
                .zip(recs.chunks(per))
                .zip(out.chunks_mut(per))
            {
                s.spawn(move || self.finish_into(evs, rs, o));
            }
        });
        stats
    }

    /// As [`MatchIndex::match_batch`] with an explicit strategy (for the base).
    pub fn match_batch_with(
        &self,
        strategy: Strategy,
        events: &[Event],
        ctx: &mut EvalCtx,
        out: &mut Vec<Vec<u64>>,
    ) -> VerifyStats {
        let mut recs: Vec<Vec<u32>> = vec![Vec::new(); events.len()];
        let stats = self
            .base()
            .match_records_with(strategy, events, ctx, &mut recs);
        self.finish(events, &recs, out);
        stats
    }

    /// Turns the base's matched conjunction records into subscription ids and applies the
    /// overlay (matching the events against it).
    pub fn finish(&self, events: &[Event], recs: &[Vec<u32>], out: &mut Vec<Vec<u64>>) {
        out.resize_with(events.len(), Vec::new);
        self.finish_into(events, recs, out);
    }

    /// [`MatchIndex::finish`] into `out`, one entry per event.
    fn finish_into(&self, events: &[Event], recs: &[Vec<u32>], out: &mut [Vec<u64>]) {
        let base = self.base();
        let changed = self.delta_len() > 0;
        let layers: Vec<(OverlayLayer<'_>, Vec<Vec<u32>>)> = self
            .overlays()
            .into_iter()
            .map(|l| {
                let mut found = vec![Vec::new(); events.len()];
                let mut ctx = l.base.new_ctx();
                l.base.match_records(events, &mut ctx, &mut found);
                (l, found)
            })
            .collect();
        for (i, (rs, o)) in recs.iter().zip(out.iter_mut()).enumerate() {
            o.clear();
            o.extend(rs.iter().map(|&r| base.conjunction_subscription(r)));
            if changed {
                o.retain(|id| !self.changed(*id));
            }
            for (l, found) in &layers {
                let from = o.len();
                o.extend(found[i].iter().map(|&r| l.base.conjunction_subscription(r)));
                let mut k = from;
                while k < o.len() {
                    if l.shadowed(o[k]) {
                        o.swap_remove(k);
                    } else {
                        k += 1;
                    }
                }
            }
            o.sort_unstable();
            o.dedup();
        }
    }

    /// Matches one event.
    pub fn match_event(&self, event: &Event, ctx: &mut EvalCtx) -> Vec<u64> {
        let mut out = Vec::new();
        self.match_batch(std::slice::from_ref(event), ctx, &mut out);
        out.pop().unwrap_or_default()
    }
}

/// Whether two overlay states are the same change (the same allocation, or equal).
fn same_state(a: &Option<Arc<Dnf>>, b: &Option<Arc<Dnf>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => Arc::ptr_eq(x, y) || x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::num::Num;
    use crate::predicate::Value;

    fn dnf(t: &str) -> Dnf {
        crate::text::parse_text(t).expect("valid filter")
    }

    fn event(site: &str, temp: i64) -> Event {
        Event::new([
            ("site", Value::Str(site.into())),
            ("temp", Value::Num(Num::from(temp))),
        ])
    }

    fn matches(index: &MatchIndex, ev: &Event) -> Vec<u64> {
        let mut ctx = index.base().new_ctx();
        index.match_event(ev, &mut ctx)
    }

    #[test]
    fn a_change_compiles_the_overlay_only_and_the_base_is_shared() {
        let subs = (0..100)
            .map(|i| (i, dnf(&format!("site = \"s{i}\" && temp > 10"))))
            .collect();
        let v1 = MatchIndex::build(ShardConfig::default(), subs).expect("build");
        let v2 = v1
            .upsert(7, dnf("site = \"s7\" && temp > 50"))
            .expect("upsert");
        let v3 = v2.upsert(1000, dnf("site = \"s7\"")).expect("upsert");
        let v4 = v3.remove(8).expect("remove");
        assert!(v4.same_base(&v1));
        assert_eq!((v4.version(), v4.base_version(), v4.delta_len()), (4, 1, 3));
        assert_eq!(v4.len(), 100);
        // 7 now needs temp > 50; 1000 is new; 8 is gone
        assert_eq!(matches(&v4, &event("s7", 20)), vec![1000]);
        assert_eq!(matches(&v4, &event("s7", 60)), vec![7, 1000]);
        assert!(matches(&v4, &event("s8", 60)).is_empty());
        assert_eq!(matches(&v1, &event("s8", 60)), vec![8]);
        assert_eq!(matches(&v1, &event("s7", 20)), vec![7]);
        assert!(matches!(v4.remove(8), Err(IndexError::NotFound(8))));
    }

    #[test]
    fn a_rebase_keeps_only_what_changed_after_the_compacted_version() {
        let subs = (0..50).map(|i| (i, dnf(&format!("temp > {i}")))).collect();
        let v1 = MatchIndex::build(ShardConfig::default(), subs).expect("build");
        let v2 = v1.upsert(3, dnf("temp > 100")).expect("upsert");
        let v3 = v2.remove(4).expect("remove");
        // compaction of v3 runs while v4 and v5 come
        let compacted = v3.compact().expect("compact");
        let v4 = v3.upsert(60, dnf("temp > 1")).expect("upsert");
        let v5 = v4.upsert(3, dnf("temp > 2")).expect("upsert");
        let rebased = v5.rebase(&v3, &compacted).expect("rebase");
        assert_eq!((rebased.version(), rebased.base_version()), (5, 3));
        assert_eq!(rebased.delta_len(), 2);
        assert_eq!(rebased.len(), v5.len());
        for t in [0, 2, 3, 5, 30, 101] {
            let ev = event("x", t);
            assert_eq!(matches(&rebased, &ev), matches(&v5, &ev), "temp {t}");
        }
        // a version not made from `from` is refused
        let other = v1.upsert(9, dnf("temp > 9")).expect("upsert");
        assert!(matches!(
            other.rebase(&v3, &compacted),
            Err(IndexError::Rebase { .. })
        ));
    }

    #[test]
    fn layers_merge_as_they_grow_and_answers_stay() {
        let subs = (0..10).map(|i| (i, dnf(&format!("temp > {i}")))).collect();
        let mut idx = MatchIndex::build(ShardConfig::default(), subs).expect("build");
        // one id changed again and again, others created and deleted
        for k in 0..(TOP_MAX as u64 + 10) {
            idx = idx
                .changed_to(
                    idx.version() + 1,
                    [
                        (1000 + k, Some(dnf("temp > 5"))),
                        (3, Some(dnf(&format!("temp > {k}")))),
                    ],
                )
                .expect("change");
            if k % 3 == 0 {
                idx = idx.remove(1000 + k).expect("remove");
            }
        }
        assert!(idx.layers.len() >= 2, "layers: {}", idx.layers.len());
        // sizes at least double downwards (a layer is merged into one at most twice it)
        for w in idx.layers.windows(2) {
            assert!(w[0].changes.len() > 2 * w[1].changes.len() || w[1].changes.len() <= TOP_MAX);
        }
        assert_eq!(idx.delta_len(), idx.net_changes().len());
        let want_3 = TOP_MAX as i64 + 9;
        let live = (0..(TOP_MAX as u64 + 10)).filter(|k| k % 3 != 0).count();
        assert_eq!(idx.len(), 10 + live);
        let ev = event("x", want_3 + 1);
        let got = matches(&idx, &ev);
        assert!(got.contains(&3), "3 answers by its newest filter");
        assert_eq!(got.len(), 10 + live, "{got:?}");
        assert!(!matches(&idx, &event("x", want_3)).contains(&3));
        let compacted = idx.compact().expect("compact");
        assert_eq!(matches(&compacted, &ev), got);
    }

    #[test]
    fn the_compaction_threshold_follows_the_base() {
        let small = MatchIndex::build(ShardConfig::default(), vec![]).expect("build");
        assert_eq!(small.compaction_threshold(), MIN_COMPACT_DELTA);
        let n = 2000usize;
        let mut idx = small;
        let many: Vec<_> = (0..n as u64).map(|i| (i, Some(dnf("temp > 1")))).collect();
        idx = idx.changed_to(2, many).expect("changes");
        assert!(idx.needs_compaction());
        let c = idx.compact().expect("compact");
        assert!(!c.needs_compaction());
        assert_eq!(c.len(), n);
    }

    /// Random batches of creates, updates and deletes (1 to 400 a version) over a base:
    /// every version answers as a fresh build of its subscriptions does, and the layer sizes
    /// stay logarithmic. Replays from the seed it prints on failure (`INDEX_SEED`).
    #[test]
    fn random_changes_answer_as_a_fresh_build_does() {
        let seed: u64 = std::env::var("INDEX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_1dea);
        let mut x = seed | 1;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let filter = |k: u64| dnf(&format!("site = \"s{}\" && temp > {}", k % 7, k % 50));
        let mut want: BTreeMap<u64, u64> = (0..200).map(|i| (i, i)).collect();
        let subs = want.iter().map(|(&id, &k)| (id, filter(k))).collect();
        let mut idx = MatchIndex::build(ShardConfig::default(), subs).expect("build");
        for round in 0..60 {
            let size = 1 + next(if round % 5 == 0 { 400 } else { 40 });
            let mut batch = Vec::new();
            for _ in 0..size {
                let id = next(1200);
                if next(4) == 0 {
                    want.remove(&id);
                    batch.push((id, None));
                } else {
                    let k = next(1000);
                    want.insert(id, k);
                    batch.push((id, Some(filter(k))));
                }
            }
            idx = idx.changed_to(idx.version() + 1, batch).expect("change");
            assert_eq!(idx.len(), want.len(), "seed {seed} round {round}");
            assert!(
                idx.layers.len() <= 16,
                "seed {seed}: {} layers",
                idx.layers.len()
            );
            let fresh = MatchIndex::build(
                ShardConfig::default(),
                want.iter().map(|(&id, &k)| (id, filter(k))).collect(),
            )
            .expect("fresh");
            for site in 0..7 {
                let ev = event(&format!("s{site}"), next(60) as i64);
                let (mut got, mut exp) = (matches(&idx, &ev), matches(&fresh, &ev));
                got.sort_unstable();
                exp.sort_unstable();
                assert_eq!(got, exp, "seed {seed} round {round}");
            }
        }
    }
}
