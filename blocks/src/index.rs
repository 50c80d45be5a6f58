//! Versions of a shard and incremental change: the match block as workers hold it.
//!
//! A [`MatchIndex`] is an immutable snapshot: a compiled [`Base`] plus a small delta of
//! subscriptions upserted or removed since the base was built. Changing one subscription makes
//! a new snapshot that shares the base and copies only the delta (no rebuild); work in flight
//! keeps the snapshot it started with, so an object is matched against one consistent version.
//! Delta subscriptions are evaluated directly, and removed ones are filtered out of the base's
//! results. [`MatchIndex::compact`] folds the delta into a fresh base; callers run it off the
//! hot path when [`MatchIndex::needs_compaction`] says so.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::formula::Dnf;
use crate::image::{self, DeltaImage, ImageError, ShardImage};
use crate::predicate::Event;
use crate::shard::{Base, BuildError, EvalCtx, ShardConfig, Strategy, VerifyStats};

/// Delta size above which compaction is advised.
pub const DEFAULT_MAX_DELTA: usize = 4096;

/// Why a change could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("subscription {0} does not exist")]
    NotFound(u64),
    #[error("delta applies to version {expected}, but this index is at version {actual}")]
    VersionMismatch { expected: u64, actual: u64 },
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Image(#[from] ImageError),
}

#[derive(Debug, Clone, Default)]
struct Delta {
    upserts: BTreeMap<u64, Dnf>,
    /// Base subscriptions hidden from results (removed, or replaced by an upsert).
    hidden: HashSet<u64>,
}

/// One version of a shard's match block.
#[derive(Debug, Clone)]
pub struct MatchIndex {
    version: u64,
    base: Arc<Base>,
    /// The base's subscriptions, encoded (for compaction and images; compact in memory).
    base_image: Arc<Vec<u8>>,
    base_ids: Arc<Vec<u64>>,
    delta: Arc<Delta>,
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
        let base_ids: Vec<u64> = subs.iter().map(|s| s.0).collect();
        let img = ShardImage {
            version,
            bloom: cfg.bloom,
            subs,
        };
        Ok(MatchIndex {
            version,
            base: Arc::new(base),
            base_image: Arc::new(image::encode_shard(&img)),
            base_ids: Arc::new(base_ids),
            delta: Arc::new(Delta::default()),
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

    /// The compiled base (for the GPU path and statistics).
    pub fn base(&self) -> &Base {
        &self.base
    }

    /// Number of subscriptions in this version.
    pub fn len(&self) -> usize {
        let hidden_in_base = self.delta.hidden.len();
        self.base_ids.len() - hidden_in_base + self.delta.upserts.len()
    }

    /// Whether there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of changes not yet folded into the base.
    pub fn delta_len(&self) -> usize {
        self.delta.upserts.len() + self.delta.hidden.len()
    }

    /// Whether the delta has grown past [`DEFAULT_MAX_DELTA`].
    pub fn needs_compaction(&self) -> bool {
        self.delta_len() > DEFAULT_MAX_DELTA
    }

    fn in_base(&self, id: u64) -> bool {
        self.base_ids.binary_search(&id).is_ok()
    }

    /// Whether a subscription exists in this version.
    pub fn contains(&self, id: u64) -> bool {
        self.delta.upserts.contains_key(&id)
            || (self.in_base(id) && !self.delta.hidden.contains(&id))
    }

    /// A new version with the subscription added or replaced.
    pub fn upsert(&self, id: u64, dnf: Dnf) -> MatchIndex {
        let mut delta = (*self.delta).clone();
        if self.in_base(id) {
            delta.hidden.insert(id);
        }
        delta.upserts.insert(id, dnf);
        self.next(delta)
    }

    /// A new version without the subscription.
    pub fn remove(&self, id: u64) -> Result<MatchIndex, IndexError> {
        if !self.contains(id) {
            return Err(IndexError::NotFound(id));
        }
        let mut delta = (*self.delta).clone();
        delta.upserts.remove(&id);
        if self.in_base(id) {
            delta.hidden.insert(id);
        }
        Ok(self.next(delta))
    }

    fn next(&self, delta: Delta) -> MatchIndex {
        MatchIndex {
            version: self.version + 1,
            base: Arc::clone(&self.base),
            base_image: Arc::clone(&self.base_image),
            base_ids: Arc::clone(&self.base_ids),
            delta: Arc::new(delta),
        }
    }

    /// Applies a delta image (which must start from this version).
    pub fn apply(&self, delta: &DeltaImage) -> Result<MatchIndex, IndexError> {
        if delta.base_version != self.version {
            return Err(IndexError::VersionMismatch {
                expected: delta.base_version,
                actual: self.version,
            });
        }
        let mut next = self.clone();
        for id in &delta.removes {
            next = next.remove(*id)?;
        }
        for (id, dnf) in &delta.upserts {
            next = next.upsert(*id, dnf.clone());
        }
        next.version = delta.version;
        Ok(next)
    }

    /// Every subscription of this version, sorted by id.
    pub fn subscriptions(&self) -> Result<Vec<(u64, Dnf)>, IndexError> {
        let base = image::decode_shard(&self.base_image)?;
        let mut subs: Vec<(u64, Dnf)> = base
            .subs
            .into_iter()
            .filter(|(id, _)| !self.delta.hidden.contains(id))
            .collect();
        subs.extend(self.delta.upserts.iter().map(|(id, d)| (*id, d.clone())));
        subs.sort_by_key(|s| s.0);
        Ok(subs)
    }

    /// The full data image of this version.
    pub fn to_image(&self) -> Result<Vec<u8>, IndexError> {
        Ok(image::encode_shard(&ShardImage {
            version: self.version,
            bloom: self.base.config().bloom,
            subs: self.subscriptions()?,
        }))
    }

    /// The same version with the delta folded into a freshly built base.
    pub fn compact(&self) -> Result<MatchIndex, IndexError> {
        MatchIndex::build_version(self.base.config(), self.version, self.subscriptions()?)
    }

    /// Matches a batch of events with the shard's own strategy: `out[i]` gets the sorted,
    /// deduplicated subscription ids event `i` matches.
    pub fn match_batch(
        &self,
        events: &[Event],
        ctx: &mut EvalCtx,
        out: &mut Vec<Vec<u64>>,
    ) -> VerifyStats {
        self.match_batch_with(self.base.strategy(), events, ctx, out)
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
        let stats = self.base.match_records_split(events, threads, &mut recs);
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

    /// As [`MatchIndex::match_batch`] with an explicit strategy.
    pub fn match_batch_with(
        &self,
        strategy: Strategy,
        events: &[Event],
        ctx: &mut EvalCtx,
        out: &mut Vec<Vec<u64>>,
    ) -> VerifyStats {
        let mut recs: Vec<Vec<u32>> = vec![Vec::new(); events.len()];
        let stats = self
            .base
            .match_records_with(strategy, events, ctx, &mut recs);
        self.finish(events, &recs, out);
        stats
    }

    /// Turns matched conjunction records into subscription ids, applying the delta.
    pub fn finish(&self, events: &[Event], recs: &[Vec<u32>], out: &mut Vec<Vec<u64>>) {
        out.resize_with(events.len(), Vec::new);
        self.finish_into(events, recs, out);
    }

    /// [`MatchIndex::finish`] into `out`, one entry per event.
    fn finish_into(&self, events: &[Event], recs: &[Vec<u32>], out: &mut [Vec<u64>]) {
        for ((ev, rs), o) in events.iter().zip(recs).zip(out.iter_mut()) {
            o.clear();
            o.extend(rs.iter().map(|&r| self.base.conjunction_subscription(r)));
            if !self.delta.hidden.is_empty() {
                o.retain(|id| !self.delta.hidden.contains(id));
            }
            for (id, dnf) in &self.delta.upserts {
                if dnf.eval(ev) {
                    o.push(*id);
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
