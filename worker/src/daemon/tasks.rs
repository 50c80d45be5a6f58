//! The tasks a worker runs: loading a block from the image of a version (shared by the node's
//! workers), test tasks whose results are cached until a match worker collects them, and match
//! tasks that fetch results from the test workers' nodes, OR the filters, scan and verify.

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

/// Versions held: each shares its base with the others (a version costs its overlay), and a
/// task naming a version below every one held needs a full image compiled.
const KEEP_LOADED: usize = 16;

/// A test task's results: when they were computed, and one per object.
pub(super) type CachedResults = (Instant, Vec<Arc<v1::TestResult>>);

/// One object of a match task: its index in the task, and its test results.
pub(super) type ObjectResults = (usize, Vec<Arc<v1::TestResult>>);

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

    /// Folds the overlay of `loaded` (version `version`) into a fresh base on a blocking
    /// thread, one compaction at a time; then carries the newest version held over to it
    /// ([`MatchIndex::rebase`]: only what changed after `version` is compiled again), so the
    /// versions loaded after it start from the fresh base. Matching goes on meanwhile.
    fn compact_in_background(&self, version: u64, loaded: Arc<Loaded>) {
        if self.inner.compacting.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let use_gpu = me.inner.cfg.gpu;
            let from = loaded.clone();
            let compacted = tokio::task::spawn_blocking(move || {
                let index = from.index.compact()?;
                let extras = Arc::new(base_extras(&index, use_gpu, version));
                Ok::<_, blocks::index::IndexError>((index, extras))
            })
            .await;
            let result = match compacted {
                Ok(Ok((index, extras))) => me.rebase_newest(version, &loaded, index, extras).await,
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(e.to_string()),
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

    /// Takes the cached test results of `tasks` for the objects `keys` out of the cache (an
    /// object's results serve one match; a match that runs again finds them gone and fails
    /// the object back to the coordinator, which tests it again), and names the tasks with
    /// none. Results nobody fetched expire after `result_ttl`.
    pub(super) fn take_results(
        &self,
        nonce: u64,
        tasks: &[u64],
        keys: &HashSet<u64>,
    ) -> (Vec<Arc<v1::TestResult>>, Vec<u64>) {
        let mut cache = lock(&self.inner.results);
        let (mut found, mut missing) = (Vec::new(), Vec::new());
        for &t in tasks {
            let Some((_, rs)) = cache.get_mut(&(nonce, t)) else {
                missing.push(t);
                continue;
            };
            rs.retain(|r| {
                let take = keys.contains(&r.key);
                if take {
                    found.push(r.clone());
                }
                !take
            });
            if rs.is_empty() {
                cache.remove(&(nonce, t));
            }
        }
        (found, missing)
    }

    /// A client of a peer node's daemon, one per lane (a connection is driven by the runtime
    /// that opened it).
    pub(super) fn peer(&self, endpoint: &str) -> Result<DaemonClient<Internal>, ServiceError> {
        let key = (endpoint.to_string(), crate::lanes::on_bulk());
        let mut peers = lock(&self.inner.peers);
        if let Some(c) = peers.get(&key) {
            return Ok(c.clone());
        }
        let c = DaemonClient::with_interceptor(
            runtime::channel(endpoint)?,
            self.inner.cfg.cluster_secret.stamp(),
        )
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30);
        peers.insert(key, c.clone());
        Ok(c)
    }

    /// Runs one task; returns the objects of a match task whose results were missing.
    pub(super) async fn run_task(&self, req: v1::AssignRequest) -> Result<Vec<u64>, ServiceError> {
        if let Some(attr) = req.block.strip_prefix("test:") {
            self.run_test(&req, attr).await?;
            Ok(Vec::new())
        } else if req.block == "match" {
            self.run_match(req).await
        } else {
            Err(ServiceError::invalid(
                "block",
                format!("{:?} is no block", req.block),
            ))
        }
    }

    pub(super) async fn run_test(
        &self,
        req: &v1::AssignRequest,
        attr: &str,
    ) -> Result<(), ServiceError> {
        type Item = (u64, blocks::Value, Option<v1::Value>);
        let mut by_version: BTreeMap<u64, Vec<Item>> = BTreeMap::new();
        for (i, t) in req.tests.iter().enumerate() {
            let v = validate::value(
                t.value.as_ref(),
                &format!("tests[{i}].value"),
                &self.inner.limits,
            )?;
            by_version
                .entry(t.version)
                .or_default()
                .push((t.key, v, t.value.clone()));
        }
        let mut results = Vec::with_capacity(req.tests.len());
        for (version, items) in by_version {
            let loaded = self.image(version).await?;
            let attr = attr.to_string();
            let task = req.task;
            let test = move || {
                let base = loaded.index.base();
                let base_version = loaded.index.base_version();
                let mut ctx = base.new_ctx();
                items
                    .into_iter()
                    .filter_map(|(key, v, value)| {
                        let o = base.test_attribute_with(&attr, Some(&v), &mut ctx)?;
                        let mut ids = Vec::with_capacity(o.ids.serialized_size());
                        o.ids.serialize_into(&mut ids).ok()?;
                        Some(v1::TestResult {
                            task,
                            key,
                            attribute: attr.clone(),
                            version,
                            filter: o.filter,
                            ids,
                            value,
                            base_version,
                        })
                    })
                    .collect::<Vec<_>>()
            };
            let out = if req.tests.len() <= INLINE_OBJECTS {
                test() // cheaper than a hand-off to a blocking thread and back
            } else {
                self.inner
                    .lanes
                    .spawn_blocking(priority(req), test)
                    .await
                    .map_err(|e| ServiceError::Unavailable(format!("test task: {e}")))?
            };
            results.extend(out);
        }
        let results = results.into_iter().map(Arc::new).collect();
        lock(&self.inner.results).insert((req.nonce, req.task), (Instant::now(), results));
        Ok(())
    }

    pub(super) async fn run_match(&self, req: v1::AssignRequest) -> Result<Vec<u64>, ServiceError> {
        let started_us = runtime::now_us();
        // collect the test results from the test workers' nodes, one call per node
        let mut per_node: HashMap<String, (HashSet<u64>, Vec<u64>)> = HashMap::new();
        for m in &req.matches {
            for s in &m.sources {
                let e = per_node.entry(s.endpoint.clone()).or_default();
                e.0.insert(s.task);
                e.1.push(m.key);
            }
        }
        let mut got: HashMap<(u64, u64), Arc<v1::TestResult>> =
            HashMap::with_capacity(req.matches.iter().map(|m| m.sources.len()).sum());
        let mut calls = tokio::task::JoinSet::new();
        for (endpoint, (tasks, mut keys)) in per_node {
            keys.sort_unstable();
            keys.dedup();
            let fetch = v1::FetchRequest {
                nonce: req.nonce,
                tasks: tasks.into_iter().collect(),
                keys,
            };
            if endpoint == self.inner.cfg.endpoint {
                // this node's own cache: no call, no copies
                let keys: HashSet<u64> = fetch.keys.iter().copied().collect();
                let (rs, _) = self.take_results(fetch.nonce, &fetch.tasks, &keys);
                for t in rs {
                    got.insert((t.task, t.key), t);
                }
                continue;
            }
            let me = self.clone();
            calls.spawn(async move {
                let mut c = me.peer(&endpoint).ok()?;
                c.fetch(fetch).await.map(|r| r.into_inner()).ok()
            });
        }
        while let Some(r) = calls.join_next().await {
            if let Ok(Some(r)) = r {
                for t in r.results {
                    got.insert((t.task, t.key), Arc::new(t));
                }
            }
        }
        // assemble each object's filter and predicate ids; missing results fail the object
        let mut failed = Vec::new();
        let mut by_version: BTreeMap<u64, Vec<ObjectResults>> = BTreeMap::new();
        for (i, m) in req.matches.iter().enumerate() {
            let mut rs = Vec::with_capacity(m.sources.len());
            for s in &m.sources {
                match got.remove(&(s.task, m.key)) {
                    Some(r) if r.version == m.version => rs.push(r),
                    _ => break,
                }
            }
            if rs.len() == m.sources.len() {
                by_version.entry(m.version).or_default().push((i, rs));
            } else {
                failed.push(m.key);
            }
        }
        let mut matched: Vec<(usize, Vec<u64>)> = Vec::new();
        for (version, objs) in by_version {
            let loaded = match self.image(version).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!("match task {}: {e}", req.task);
                    failed.extend(objs.iter().map(|(i, _)| req.matches[*i].key));
                    continue;
                }
            };
            let limits = self.inner.limits;
            let out = if objs.len() <= INLINE_OBJECTS && loaded.base.subset.is_none() {
                // cheaper than a hand-off to a blocking thread
                match_objects(&loaded, objs, &limits)
            } else {
                self.inner
                    .lanes
                    .spawn_blocking(priority(&req), move || {
                        match_objects(&loaded, objs, &limits)
                    })
                    .await
                    .map_err(|e| ServiceError::Unavailable(format!("match task: {e}")))?
            };
            for (i, subs) in out {
                match subs {
                    Some(subs) => matched.push((i, subs)),
                    // tested against another base, without the value to test again here
                    None => failed.push(req.matches[i].key),
                }
            }
        }
        // hand the matches to delivery on each object's origin node
        let mut per_origin: HashMap<String, Vec<v1::ObjectMatches>> = HashMap::new();
        let finished_us = runtime::now_us();
        for (i, subs) in matched {
            let m = &req.matches[i];
            per_origin
                .entry(m.origin.clone())
                .or_default()
                .push(v1::ObjectMatches {
                    id: m.id,
                    subscriptions: subs,
                    match_started_unix_us: started_us,
                    match_finished_unix_us: finished_us,
                });
        }
        let mut calls = tokio::task::JoinSet::new();
        for (origin, objects) in per_origin {
            let me = self.clone();
            calls.spawn(async move {
                let req = v1::MatchedRequest { objects };
                let res = if origin == me.inner.cfg.endpoint {
                    me.handoff(req).await
                } else {
                    match me.peer(&origin) {
                        Ok(mut c) => c
                            .matched(req)
                            .await
                            .map(|_| ())
                            .map_err(|e| ServiceError::Unavailable(e.to_string())),
                        Err(e) => Err(e),
                    }
                };
                if let Err(e) = res {
                    // the origin's outbox still holds these objects: they come back
                    tracing::debug!("handing matches to {origin}: {e}");
                }
            });
        }
        while calls.join_next().await.is_some() {}
        Ok(failed)
    }
}

/// Matches objects from their test results: OR of the filters (plus the outputs of absent
/// attributes), Bloom subset scan, exact verification by predicate ids.
/// Test and match tasks of at most this many objects run on the task's own thread; larger
/// ones (and GPU matches, which wait on the device) on a blocking thread of their lane.
pub(super) const INLINE_OBJECTS: usize = 16;

/// A task's priority as the coordinator handed it out (0..=7).
pub(super) fn priority(req: &v1::AssignRequest) -> u8 {
    req.priority.min(u32::from(runtime::URGENT_PRIORITY)) as u8
}

pub(super) fn match_objects(
    loaded: &Loaded,
    objs: Vec<ObjectResults>,
    limits: &Limits,
) -> Vec<(usize, Option<Vec<u64>>)> {
    let index = &loaded.index;
    let base = index.base();
    let base_version = index.base_version();
    let w = base.filter_words();
    let mut filters = vec![0u64; w * objs.len()];
    let mut ids: Vec<RoaringBitmap> = Vec::with_capacity(objs.len());
    let mut whole = vec![true; objs.len()];
    let mut ctx = base.new_ctx();
    for (o, (_, rs)) in objs.iter().enumerate() {
        let f = &mut filters[o * w..o * w + w];
        let mut set = RoaringBitmap::new();
        for r in rs {
            if r.base_version == base_version {
                for (x, y) in f.iter_mut().zip(&r.filter) {
                    *x |= y;
                }
                if let Ok(b) = RoaringBitmap::deserialize_from(r.ids.as_slice()) {
                    set |= b;
                }
                continue;
            }
            // tested against another compiled base (the test worker's node compacted at
            // another time): the predicate ids are that base's, so the value is tested here
            let out = tested_value(r, limits)
                .and_then(|v| base.test_attribute_with(&r.attribute, Some(&v), &mut ctx));
            match out {
                Some(out) => {
                    for (x, y) in f.iter_mut().zip(&out.filter) {
                        *x |= y;
                    }
                    set |= out.ids;
                }
                None => whole[o] = false,
            }
        }
        for (attr, out) in &loaded.base.absent {
            if !rs.iter().any(|r| r.attribute == *attr) {
                for (x, y) in f.iter_mut().zip(&out.filter) {
                    *x |= y;
                }
                set |= &out.ids;
            }
        }
        ids.push(set);
    }
    let mut cands: Vec<Vec<u32>> = vec![Vec::new(); objs.len()];
    match &loaded.base.subset {
        Some(m) => {
            let mut m = lock(m);
            for batch in m.candidates(&[&filters]) {
                for (o, rec) in batch {
                    cands[o as usize].push(rec);
                }
            }
        }
        // no GPU: the records whose access predicate the tests satisfied (a CPU Bloom scan
        // visits every conjunction for every object)
        None => {
            let mut by_ids = true;
            for (c, set) in cands.iter_mut().zip(&ids) {
                if !base.id_candidates(set, c) {
                    by_ids = false; // built without test ids: nothing was added
                    break;
                }
            }
            if !by_ids {
                base.bloom_candidates(&filters, |o, rec| cands[o].push(rec));
            }
        }
    }
    objs.iter()
        .enumerate()
        .map(|(o, (i, rs))| {
            if !whole[o] {
                return (*i, None);
            }
            let mut subs = base
                .verified_subscriptions(&cands[o], &ids[o])
                .unwrap_or_default();
            if index.delta_len() > 0 {
                subs.retain(|id| !index.changed(*id));
            }
            let layers = index.overlays();
            for (layer, absent) in layers.iter().zip(&loaded.overlay_absent) {
                match overlay_matches(layer.base, absent, rs, limits) {
                    Some(more) => subs.extend(more.into_iter().filter(|id| !layer.shadowed(*id))),
                    None => return (*i, None),
                }
            }
            if !layers.is_empty() {
                subs.sort_unstable();
                subs.dedup();
            }
            (*i, Some(subs))
        })
        .collect()
}

/// The value a test result was computed from (`None`: it carries none, or not a valid one).
fn tested_value(r: &v1::TestResult, limits: &Limits) -> Option<blocks::Value> {
    validate::value(r.value.as_ref(), "value", limits).ok()
}

/// The subscriptions of an overlay layer (subscriptions changed since the base) an object
/// matches: its tested values are tested against the layer here (it is small), then
/// verified by predicate ids. `None` when a value the layer tests did not come with its
/// result.
fn overlay_matches(
    overlay: &blocks::shard::Base,
    absent: &[(String, TestOutput)],
    rs: &[Arc<v1::TestResult>],
    limits: &Limits,
) -> Option<Vec<u64>> {
    let mut ctx = overlay.new_ctx();
    let mut set = RoaringBitmap::new();
    for r in rs {
        if !overlay.has_attribute(&r.attribute) {
            continue;
        }
        let v = tested_value(r, limits)?;
        set |= overlay
            .test_attribute_with(&r.attribute, Some(&v), &mut ctx)?
            .ids;
    }
    for (attr, out) in absent {
        if !rs.iter().any(|r| r.attribute == *attr) {
            set |= &out.ids;
        }
    }
    let mut cands = Vec::new();
    overlay.id_candidates(&set, &mut cands);
    overlay.verified_subscriptions(&cands, &set)
}
