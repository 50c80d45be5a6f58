//! The tasks a worker runs (on the blocks `images` loads): test tasks whose results are
//! cached until a match worker collects them, and match tasks that fetch results from the
//! test workers' nodes, OR the filters, scan and verify, and match the values against the
//! overlay of the subscriptions changed since the base.

use super::*;

/// A test task's results: when they were computed, and one per object.
pub(super) type CachedResults = (Instant, Vec<Arc<v1::TestResult>>);

/// One object of a match task: its index in the task, and its test results.
pub(super) type ObjectResults = (usize, Vec<Arc<v1::TestResult>>);

impl Daemon {
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
