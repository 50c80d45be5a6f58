//! The versions of the shard a node holds, shared by its workers: a version is loaded as the
//! coordinator's delta from the newest version held below it (its overlay compiled in
//! milliseconds, `blocks::index`), or from a full image when none is held; the base is
//! compacted in the background once the overlay grows, and the newest version is carried over
//! to the new base, so no version waits for a whole shard to compile.

use super::*;

/// Set once `GpuUse::Hardware` found no hardware adapter: later images do not probe again.
pub(super) static NO_HARDWARE_GPU: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A compiled image version: the shard (a compiled base and the overlay of what changed
/// since, `blocks::index`) plus the test outputs of absent attributes.
#[derive(Debug)]
pub(super) struct Loaded {
    pub(super) index: MatchIndex,
    /// What belongs to the compiled base, shared by every version on it.
    pub(super) base: Arc<BaseExtras>,
    /// The test outputs of absent attributes for each overlay layer
    /// (`MatchIndex::overlays`, in order).
    pub(super) overlay_absent: Vec<Vec<(String, TestOutput)>>,
    /// What its subscriptions are (from the coordinator; `None` from one that did not say).
    pub(super) digest: Option<u128>,
}

/// The parts of a loaded version that come with its compiled base.
#[derive(Debug)]
pub(super) struct BaseExtras {
    pub(super) absent: Vec<(String, TestOutput)>,
    /// The resident subset matcher of match blocks: the GPU when an adapter opens, else the
    /// CPU twin; `None` when the node runs match blocks on the CPU scan of `blocks`.
    pub(super) subset: Option<Mutex<gpu::SubsetMatcher>>,
}

/// The test outputs of absent attributes of a compiled shard (those some predicate holds
/// for, such as `not exists`).
fn absent_outputs(base: &blocks::shard::Base) -> Vec<(String, TestOutput)> {
    base.attribute_names()
        .iter()
        .filter_map(|a| {
            base.test_attribute(a, None)
                .filter(|o| !o.ids.is_empty())
                .map(|o| (a.clone(), o))
        })
        .collect()
}

/// What comes with a freshly compiled base: its absent outputs and its subset matcher.
fn base_extras(index: &MatchIndex, use_gpu: GpuUse, version: u64) -> BaseExtras {
    let base = index.base();
    let probe = use_gpu == GpuUse::Any
        || (use_gpu == GpuUse::Hardware && !NO_HARDWARE_GPU.load(Ordering::Relaxed));
    let subset = if probe && base.bloom_ready() && base.conjunctions() > 0 {
        match gpu::SubsetMatcher::new(
            base.filters(),
            base.conjunctions(),
            base.filter_words(),
            gpu::GpuOptions::default(),
        ) {
            Ok(gpu::SubsetMatcher::Gpu(g))
                if use_gpu == GpuUse::Any || g.info().device_type != "Cpu" =>
            {
                tracing::info!(
                    "image {version}: match block on the GPU ({}, {})",
                    g.info().name,
                    g.info().device_type
                );
                Some(Mutex::new(gpu::SubsetMatcher::Gpu(g)))
            }
            Ok(_) => {
                // no hardware GPU: the CPU scan of `blocks`, and no more probing
                NO_HARDWARE_GPU.store(true, Ordering::Relaxed);
                None
            }
            Err(e) => {
                tracing::warn!("match block on the CPU scan: {e}");
                None
            }
        }
    } else {
        None
    };
    BaseExtras {
        absent: absent_outputs(base),
        subset,
    }
}

/// A loaded version of `index` over `base` (the extras of its compiled base).
fn loaded_over(index: MatchIndex, base: Arc<BaseExtras>, digest: Option<u128>) -> Loaded {
    let overlay_absent = index
        .overlays()
        .iter()
        .map(|l| absent_outputs(l.base))
        .collect();
    Loaded {
        index,
        base,
        overlay_absent,
        digest,
    }
}

/// The changes of a delta image, for [`MatchIndex::changed_to`].
fn delta_changes(delta: &blocks::image::DeltaImage) -> Vec<(u64, Option<blocks::Dnf>)> {
    let removes = delta.removes.iter().map(|id| (*id, None));
    let upserts = delta.upserts.iter().map(|(id, d)| (*id, Some(d.clone())));
    removes.chain(upserts).collect()
}

/// How long after a compaction the next may start, in multiples of its time.
const COMPACTION_REST: u32 = 2;

/// Versions held: each shares its base with the others (a version costs its overlay), and a
/// task naming a version below every one held needs a full image compiled.
const KEEP_LOADED: usize = 16;

impl Daemon {
    /// The compiled image `version`, fetched from the coordinator on first use.
    pub(super) async fn image(&self, version: u64) -> Result<Arc<Loaded>, ServiceError> {
        self.image_unless_newer(version, false)
            .await?
            .ok_or_else(|| ServiceError::Unavailable(format!("image {version} was not compiled")))
    }

    /// [`Daemon::image`]; `ahead` (a load before any task names the version): `None`
    /// without loading once a newer version is known. A version is the change from the
    /// newest version held below it, applied to that one's overlay (milliseconds); a full
    /// image is compiled only when none is held (a start, a new leader with other
    /// subscriptions). A compaction of the base runs in the background
    /// ([`Daemon::compact_in_background`]) and never holds a version up.
    async fn image_unless_newer(
        &self,
        version: u64,
        ahead: bool,
    ) -> Result<Option<Arc<Loaded>>, ServiceError> {
        let mut images = self.inner.images.lock().await;
        if let Some(l) = images.get(&version) {
            return Ok(Some(l.clone()));
        }
        if ahead && self.inner.image_prefetch.load(Ordering::Relaxed) > version {
            return Ok(None);
        }
        let newest = images.last_key_value().map(|(_, l)| l.clone());
        let below = images
            .range(..version)
            .next_back()
            .map(|(v, l)| (*v, l.clone()));
        let have_digest = newest
            .as_ref()
            .and_then(|l| l.digest)
            .map_or_else(Vec::new, |d| d.to_le_bytes().to_vec());
        let resp = self
            .inner
            .coord
            .image(v1::ImageRequest {
                version,
                have_digest,
                have_version: below.as_ref().map_or(0, |(v, _)| *v),
            })
            .await
            .map_err(|e| ServiceError::Unavailable(format!("fetching image {version}: {e}")))?;
        let digest = <[u8; 16]>::try_from(resp.digest.as_slice())
            .ok()
            .map(u128::from_le_bytes);
        // the same subscriptions as the image compiled here (a new leader's first version):
        // that one serves this version too
        if resp.image.is_empty() && resp.delta.is_empty() {
            let Some(h) = newest.filter(|h| h.digest.is_some() && h.digest == digest) else {
                return Err(ServiceError::Unavailable(format!(
                    "image {version}: the coordinator sent nothing to load"
                )));
            };
            tracing::info!("image {version} holds the subscriptions compiled here already: kept");
            self.inner
                .counters
                .images_kept
                .fetch_add(1, Ordering::Relaxed);
            return Ok(Some(self.loaded_as(&mut images, version, h)));
        }
        let delta = match resp.delta.is_empty() {
            true => None,
            false => Some(
                blocks::image::decode_delta(&resp.delta)
                    .map_err(|e| ServiceError::Unavailable(format!("image {version}: {e}")))?,
            ),
        };
        let use_gpu = self.inner.cfg.gpu;
        let full = !resp.image.is_empty();
        let loaded = match (full, below, delta) {
            // the change from the version held below: the overlay is compiled again
            (false, Some((held_version, held)), Some(delta))
                if delta.base_version == held_version && delta.version == version =>
            {
                tokio::task::spawn_blocking(move || {
                    let index = held.index.changed_to(version, delta_changes(&delta))?;
                    Ok::<_, blocks::index::IndexError>(loaded_over(
                        index,
                        held.base.clone(),
                        digest,
                    ))
                })
                .await
            }
            (false, _, _) => {
                return Err(ServiceError::Unavailable(format!(
                    "image {version}: the change sent does not start from a version held here"
                )));
            }
            // a full image (and the change from its version): the base is compiled
            (true, _, delta) => {
                tokio::task::spawn_blocking(move || {
                    let mut index = MatchIndex::from_image(cluster_shard_config(), &resp.image)?;
                    let extras = Arc::new(base_extras(&index, use_gpu, version));
                    if let Some(d) = delta {
                        if d.base_version != index.version() || d.version != version {
                            return Err(blocks::index::IndexError::VersionMismatch {
                                expected: d.base_version,
                                actual: index.version(),
                            });
                        }
                        index = index.changed_to(version, delta_changes(&d))?;
                    }
                    Ok(loaded_over(index, extras, digest))
                })
                .await
            }
        }
        .map_err(|e| ServiceError::Unavailable(format!("image build task: {e}")))?
        .map_err(|e| ServiceError::Unavailable(format!("image {version}: {e}")))?;
        let counter = match full {
            true => &self.inner.counters.images_compiled,
            false => &self.inner.counters.images_applied,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let loaded = self.loaded_as(&mut images, version, Arc::new(loaded));
        drop(images);
        if loaded.index.needs_compaction() {
            self.compact_in_background(version, loaded.clone());
        }
        Ok(Some(loaded))
    }

    /// Folds the overlay of `loaded` (version `version`) into a fresh base on a thread of its
    /// own at a lower OS priority (`lanes::spawn_background`), one compaction at a time; then carries the newest version held over to it
    /// ([`MatchIndex::rebase`]: only what changed after `version` is compiled again), so the
    /// versions loaded after it start from the fresh base. Matching goes on meanwhile.
    /// A compaction starts only once twice the last one's time has passed since it ended:
    /// under a bulk load (thousands of changes a second) the overlay grows between
    /// compactions instead of the node compiling its whole shard back to back, so they take
    /// at most a third of a core.
    fn compact_in_background(&self, version: u64, loaded: Arc<Loaded>) {
        let rested = lock(&self.inner.last_compaction)
            .is_none_or(|(ended, took)| ended.elapsed() >= took * COMPACTION_REST);
        if !rested || self.inner.compacting.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let use_gpu = me.inner.cfg.gpu;
            let from = loaded.clone();
            // at a lower OS priority: the compaction takes only the CPU that matching and
            // pushing leave
            let compacted = crate::lanes::spawn_background("dissem-compact", move || {
                let index = from.index.compact()?;
                let extras = Arc::new(base_extras(&index, use_gpu, version));
                Ok::<_, blocks::index::IndexError>((index, extras))
            })
            .await;
            let result = match compacted {
                Ok(Ok((index, extras))) => me.rebase_newest(version, &loaded, index, extras).await,
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("the compaction thread ended without an answer".to_string()),
            };
            match result {
                Ok(newest) => {
                    me.inner
                        .counters
                        .images_compacted
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "image {version}: base compacted in {} ms ({} subscriptions); version \
                         {newest} carried over to it",
                        started.elapsed().as_millis(),
                        loaded.index.len()
                    );
                }
                Err(e) => tracing::warn!("compacting image {version}: {e}"),
            }
            *lock(&me.inner.last_compaction) = Some((Instant::now(), started.elapsed()));
            me.inner.compacting.store(false, Ordering::SeqCst);
        });
    }

    /// Puts the base compacted from `from` (version `version`) under the versions held:
    /// `version` itself and the newest version (when it was made from `from`'s base).
    /// Returns the newest version.
    async fn rebase_newest(
        &self,
        version: u64,
        from: &Arc<Loaded>,
        compacted: MatchIndex,
        extras: Arc<BaseExtras>,
    ) -> Result<u64, String> {
        let mut images = self.inner.images.lock().await;
        if images.contains_key(&version) {
            let l = loaded_over(compacted.clone(), extras.clone(), from.digest);
            images.insert(version, Arc::new(l));
        }
        let Some((&newest, held)) = images.last_key_value() else {
            return Ok(version);
        };
        if newest == version || !held.index.same_base(&from.index) {
            return Ok(newest);
        }
        let held = held.clone();
        let from = from.clone();
        let rebased = tokio::task::spawn_blocking(move || {
            let index = held.index.rebase(&from.index, &compacted)?;
            Ok::<_, blocks::index::IndexError>(loaded_over(index, extras, held.digest))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        images.insert(newest, Arc::new(rebased));
        Ok(newest)
    }

    /// Keeps `loaded` as image `version` (the [`KEEP_LOADED`] newest are kept).
    fn loaded_as(
        &self,
        images: &mut BTreeMap<u64, Arc<Loaded>>,
        version: u64,
        loaded: Arc<Loaded>,
    ) -> Arc<Loaded> {
        images.insert(version, loaded.clone());
        self.inner
            .image_loaded
            .fetch_max(version, Ordering::Relaxed);
        while images.len() > KEEP_LOADED {
            images.pop_first();
        }
        loaded
    }

    /// Compiles image `version` ahead of the first task that names it (the coordinator
    /// published it), once per version; a failed compile is tried again when asked again.
    pub(super) fn prefetch_image(&self, version: u64) {
        if version == 0
            || self
                .inner
                .image_prefetch
                .fetch_max(version, Ordering::Relaxed)
                >= version
        {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me.image_unless_newer(version, true).await {
                tracing::debug!("loading image {version} ahead: {e}");
                // tried again at the next heartbeat
                me.inner
                    .image_prefetch
                    .fetch_min(version - 1, Ordering::Relaxed);
            }
        });
    }

    /// The newest image version compiled here.
    pub fn image_loaded(&self) -> u64 {
        self.inner.image_loaded.load(Ordering::Relaxed)
    }
}
