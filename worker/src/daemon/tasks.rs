//! The tasks a worker runs: loading a block from the image of a version (shared by the node's
//! workers), test tasks whose results are cached until a match worker collects them, and match
//! tasks that fetch results from the test workers' nodes, OR the filters, scan and verify.

use super::*;

/// Set once `GpuUse::Hardware` found no hardware adapter: later images do not probe again.
pub(super) static NO_HARDWARE_GPU: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A compiled image version: the shard plus the test outputs of absent attributes.
#[derive(Debug)]
pub(super) struct Loaded {
    pub(super) index: MatchIndex,
    pub(super) absent: Vec<(String, TestOutput)>,
    /// The resident subset matcher of match blocks: the GPU when an adapter opens, else the
    /// CPU twin; `None` when the node runs match blocks on the CPU scan of `blocks`.
    pub(super) subset: Option<Mutex<gpu::SubsetMatcher>>,
    /// What its subscriptions are (from the coordinator; `None` from one that did not say).
    pub(super) digest: Option<u128>,
}

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

    /// [`Daemon::image`]; `ahead` (a compile before any task names the version): `None`
    /// without compiling once a newer version is known. While subscriptions are created at
    /// a high rate every compile of a million-subscription image outlives several versions,
    /// and compiling each in turn kept the node's cores busy with versions no task named.
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
        let held = images.last_key_value().map(|(_, l)| l.clone());
        let have_digest = held
            .as_ref()
            .and_then(|l| l.digest)
            .map_or_else(Vec::new, |d| d.to_le_bytes().to_vec());
        let resp = self
            .inner
            .coord
            .image(v1::ImageRequest {
                version,
                have_digest,
            })
            .await
            .map_err(|e| ServiceError::Unavailable(format!("fetching image {version}: {e}")))?;
        let digest = <[u8; 16]>::try_from(resp.digest.as_slice())
            .ok()
            .map(u128::from_le_bytes);
        // the same subscriptions as the image compiled here (a new leader's first version):
        // that one serves this version too
        if let Some(h) =
            held.filter(|h| resp.image.is_empty() && h.digest.is_some() && h.digest == digest)
        {
            tracing::info!("image {version} holds the subscriptions compiled here already: kept");
            self.inner
                .counters
                .images_kept
                .fetch_add(1, Ordering::Relaxed);
            return Ok(Some(self.loaded_as(&mut images, version, h)));
        }
        let use_gpu = self.inner.cfg.gpu;
        let loaded = tokio::task::spawn_blocking(move || {
            let index = MatchIndex::from_image(cluster_shard_config(), &resp.image)?;
            let base = index.base();
            let absent = base
                .attribute_names()
                .iter()
                .filter_map(|a| {
                    base.test_attribute(a, None)
                        .filter(|o| !o.ids.is_empty())
                        .map(|o| (a.clone(), o))
                })
                .collect();
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
            Ok::<_, blocks::index::IndexError>(Loaded {
                index,
                absent,
                subset,
                digest,
            })
        })
        .await
        .map_err(|e| ServiceError::Unavailable(format!("image build task: {e}")))?
        .map_err(|e| ServiceError::Unavailable(format!("image {version}: {e}")))?;
        self.inner
            .counters
            .images_compiled
            .fetch_add(1, Ordering::Relaxed);
        Ok(Some(self.loaded_as(&mut images, version, Arc::new(loaded))))
    }

    /// Keeps `loaded` as image `version` (the three newest are kept).
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
        while images.len() > 3 {
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
        let mut by_version: BTreeMap<u64, Vec<(u64, blocks::Value)>> = BTreeMap::new();
        for (i, t) in req.tests.iter().enumerate() {
            let v = validate::value(
                t.value.as_ref(),
                &format!("tests[{i}].value"),
                &self.inner.limits,
            )?;
            by_version.entry(t.version).or_default().push((t.key, v));
        }
        let mut results = Vec::with_capacity(req.tests.len());
        for (version, items) in by_version {
            let loaded = self.image(version).await?;
            let attr = attr.to_string();
            let task = req.task;
            let test = move || {
                let base = loaded.index.base();
                let mut ctx = base.new_ctx();
                items
                    .into_iter()
                    .filter_map(|(key, v)| {
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
            let out = if objs.len() <= INLINE_OBJECTS && loaded.subset.is_none() {
                match_objects(&loaded, objs) // cheaper than a hand-off to a blocking thread
            } else {
                self.inner
                    .lanes
                    .spawn_blocking(priority(&req), move || match_objects(&loaded, objs))
                    .await
                    .map_err(|e| ServiceError::Unavailable(format!("match task: {e}")))?
            };
            matched.extend(out);
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

pub(super) fn match_objects(loaded: &Loaded, objs: Vec<ObjectResults>) -> Vec<(usize, Vec<u64>)> {
    let base = loaded.index.base();
    let w = base.filter_words();
    let mut filters = vec![0u64; w * objs.len()];
    let mut ids: Vec<RoaringBitmap> = Vec::with_capacity(objs.len());
    for (o, (_, rs)) in objs.iter().enumerate() {
        let f = &mut filters[o * w..o * w + w];
        let mut set = RoaringBitmap::new();
        for r in rs {
            for (x, y) in f.iter_mut().zip(&r.filter) {
                *x |= y;
            }
            if let Ok(b) = RoaringBitmap::deserialize_from(r.ids.as_slice()) {
                set |= b;
            }
        }
        for (attr, out) in &loaded.absent {
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
    match &loaded.subset {
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
        .map(|(o, (i, _))| {
            let subs = base
                .verified_subscriptions(&cands[o], &ids[o])
                .unwrap_or_default();
            (*i, subs)
        })
        .collect()
}
