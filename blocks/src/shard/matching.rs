//! Matching against a built shard: loading an object's values into an [`EvalCtx`], the three
//! strategies' loops (access index, Bloom subset scan, cell bitsets), the test blocks' answers
//! for one attribute (what a test worker reports), and verification by predicate ids.

use super::*;

/// Largest objects x attributes the cell path keeps rows for densely (16 MiB).
const DENSE_ROWS_MAX: usize = 1 << 22;

/// One batch loaded for the cell scan ([`Base::load_for_cells`]).
pub(super) struct CellBatch {
    pub(super) per_event: Vec<Vec<u16>>,
    pub(super) rows: Vec<u32>,
    pub(super) dense: bool,
    pub(super) loaded: Vec<Loaded>,
}

impl Base {
    /// Runs the test blocks of every attribute of the object into the context: with `every`,
    /// every test (for Bloom filters); without, those the codes and the access index read
    /// (for matching and verification).
    pub(super) fn load(&self, ev: &Event, ctx: &mut EvalCtx, every: bool) {
        ctx.fit(self.attr_names.len(), self.n_flags as usize);
        for (name, v) in &ev.attrs {
            let Some(&a) = self.attr_ids.get(name) else {
                continue;
            };
            self.load_attr(a, v, ctx, every);
        }
    }

    /// Runs the test block of attribute `a` on `v` into a fitted context (`every`: as in
    /// [`Base::load`]).
    pub(super) fn load_attr(&self, a: u32, v: &Value, ctx: &mut EvalCtx, every: bool) {
        if ctx.rows[a as usize] != NO_ROW {
            return; // duplicate attribute in the event: the first value wins
        }
        ctx.touched.push(a);
        let blk = &self.attrs[a as usize];
        match v {
            Value::Num(x) => {
                let r = blk.consts.as_ref().map_or(0, |t| t.row(*x));
                ctx.rows[a as usize] = r;
                if !blk.hit_rows.is_empty() {
                    let s = blk.hit_rows.partition_point(|&h| h < r);
                    let e = blk.hit_rows.partition_point(|&h| h <= r);
                    for &f in &blk.hit_flags[s..e] {
                        ctx.set_flag(f);
                    }
                }
            }
            Value::Str(s) => {
                ctx.rows[a as usize] = STR_ROW;
                if !blk.values.is_empty()
                    && let Some(&v) = blk.values.get(s.as_str())
                {
                    ctx.values[a as usize] = v;
                }
                let strings = if every || !blk.codes_only {
                    &blk.strings
                } else {
                    &blk.code_strings
                };
                if let Some(sb) = strings {
                    let mut buf = std::mem::take(&mut ctx.scratch);
                    sb.test(s, |f| buf.push(f));
                    for &f in &buf {
                        ctx.set_flag(f);
                    }
                    buf.clear();
                    ctx.scratch = buf;
                }
            }
        }
    }

    #[inline]
    pub(super) fn rec_codes(&self, rec: u32) -> &[Code] {
        &self.codes
            [self.code_start[rec as usize] as usize..self.code_start[rec as usize + 1] as usize]
    }

    /// Access strategy for a loaded context: pushes matching conjunction records.
    pub(super) fn match_access(&self, ctx: &EvalCtx, out: &mut Vec<u32>) -> u64 {
        let mut visited = 0u64;
        let mut verify_rest = |rec: u32, out: &mut Vec<u32>| {
            visited += 1;
            let slot = &self.recs[rec as usize];
            let lists = &self.value_lists;
            if !ctx.check(slot.probe[0], lists) || !ctx.check(slot.probe[1], lists) {
                return;
            }
            let codes = self.rec_codes(rec);
            if codes.len() <= 3 || ctx.check_all(&codes[3..], lists) {
                out.push(rec);
            }
        };
        for &a in &ctx.touched {
            let r = ctx.rows[a as usize];
            if r < STR_ROW
                && let Some(ix) = &self.num_index[a as usize]
            {
                if let Ok(i) = ix.point_rows.binary_search(&r) {
                    let runs = &self.runs[ix.point_runs[i] as usize..ix.point_runs[i + 1] as usize];
                    self.visit_runs(ctx, runs, &mut |rec| verify_rest(rec, out));
                }
                ix.spans.query(r, |rec| verify_rest(rec, out));
            }
            for rec in self.exists_post[a as usize]..self.exists_post[a as usize + 1] {
                verify_rest(rec, out);
            }
            let v = ctx.values[a as usize];
            if let Some(w) = self.value_post[a as usize].get(v as usize..v as usize + 2) {
                for &rec in &self.value_recs[w[0] as usize..w[1] as usize] {
                    verify_rest(rec, out);
                }
            }
        }
        for &w in &ctx.flag_words {
            // only flags that are some conjunction's access predicate have postings
            let mut bits = ctx.flags[w as usize] & self.flag_access[w as usize];
            while bits != 0 {
                let f = w * 64 + bits.trailing_zeros();
                bits &= bits - 1;
                let runs = &self.runs
                    [self.flag_runs[f as usize] as usize..self.flag_runs[f as usize + 1] as usize];
                self.visit_runs(ctx, runs, &mut |rec| verify_rest(rec, out));
            }
        }
        for rec in self.always.0..self.always.1 {
            if ctx.check_all(self.rec_codes(rec), &self.value_lists) {
                out.push(rec);
            }
        }
        visited + (self.always.1 - self.always.0) as u64
    }

    /// Visits the records of a posting list's runs; in a point run only those whose probe
    /// row equals the object's row on the run's attribute.
    #[inline]
    pub(super) fn visit_runs(&self, ctx: &EvalCtx, runs: &[Run], f: &mut impl FnMut(u32)) {
        for run in runs {
            if run.point {
                let r = ctx.rows[run.attr as usize];
                if r >= STR_ROW {
                    continue; // absent or not a number: no point probe holds
                }
                let keys = &self.probe_rows[run.start as usize..run.end as usize];
                let lo = keys.partition_point(|&k| k < r) as u32;
                let hi = keys.partition_point(|&k| k <= r) as u32;
                for rec in run.start + lo..run.start + hi {
                    f(rec);
                }
            } else {
                for rec in run.start..run.end {
                    f(rec);
                }
            }
        }
    }

    pub(super) fn pred_filter_into(&self, pid: u32, out: &mut [u64]) {
        let k = self.cfg.bloom.k as usize;
        for &p in &self.pred_pos[pid as usize * k..pid as usize * k + k] {
            if p == NO_POS {
                continue;
            }
            out[(p / 64) as usize] |= 1u64 << (p % 64);
        }
    }

    /// The object's Bloom filter from a loaded context (requires the Bloom tables).
    pub(super) fn object_filter(&self, ctx: &EvalCtx, out: &mut [u64]) {
        out.iter_mut().for_each(|w| *w = 0);
        let w = self.words;
        for &a in &ctx.touched {
            let blk = &self.attrs[a as usize];
            let r = ctx.rows[a as usize];
            if r < STR_ROW {
                if !blk.row_filters.is_empty() {
                    or_into(out, &blk.row_filters[r as usize * w..r as usize * w + w]);
                }
            } else if !blk.str_value_filter.is_empty() {
                or_into(out, &blk.str_value_filter);
            }
            for &(flag, pid) in &blk.neg_flags {
                if !ctx.flag(flag) {
                    self.pred_filter_into(pid, out);
                }
            }
            if blk.exists_pred != NONE {
                self.pred_filter_into(blk.exists_pred, out);
            }
        }
        for &wd in &ctx.flag_words {
            let mut bits = ctx.flags[wd as usize];
            while bits != 0 {
                let f = wd * 64 + bits.trailing_zeros();
                bits &= bits - 1;
                let pid = self.flag_pred[f as usize];
                if pid != NONE {
                    self.pred_filter_into(pid, out);
                }
            }
        }
        for &a in &self.not_exists_attrs {
            if ctx.rows[a as usize] == NO_ROW {
                self.pred_filter_into(self.attrs[a as usize].not_exists_pred, out);
            }
        }
    }

    /// The exact test result of one attribute for a value (`None`: absent): its Bloom filter
    /// (zero when the Bloom tables are not built) and the ids of the predicates it satisfies.
    /// This is what a test worker returns to the match worker.
    /// `None` when the shard was built without test ids (`ShardConfig::test_ids`).
    pub fn test_attribute(&self, attr: &str, value: Option<&Value>) -> Option<TestOutput> {
        let mut ctx = self.new_ctx();
        self.test_attribute_with(attr, value, &mut ctx)
    }

    /// [`Base::test_attribute`] with a context reused across values (one per batch: no
    /// allocation per value).
    pub fn test_attribute_with(
        &self,
        attr: &str,
        value: Option<&Value>,
        ctx: &mut EvalCtx,
    ) -> Option<TestOutput> {
        if !self.cfg.test_ids {
            return None;
        }
        let mut out = TestOutput {
            filter: vec![0; self.words],
            ids: RoaringBitmap::new(),
        };
        let Some(&a) = self.attr_ids.get(attr) else {
            return Some(out);
        };
        let blk = &self.attrs[a as usize];
        ctx.fit(self.attr_names.len(), self.n_flags as usize);
        ctx.reset();
        if let Some(v) = value {
            self.load_attr(a, v, ctx, true);
        }
        // gathered in a vector and sorted: building the bitmap from sorted ids is several
        // times cheaper than inserting them one by one in the index's order
        let mut ids = std::mem::take(&mut ctx.ids);
        ids.clear();
        let r = ctx.rows[a as usize];
        if r == NO_ROW {
            if blk.not_exists_pred != NONE {
                ids.push(blk.not_exists_pred);
            }
        } else {
            if blk.exists_pred != NONE {
                ids.push(blk.exists_pred);
            }
            if r < STR_ROW {
                blk.id_index.query(r, |p| ids.push(p));
            }
            for &(ra, rb, p) in &blk.neg_rows {
                if !(r >= ra && r <= rb) {
                    ids.push(p);
                }
            }
            for &(flag, p) in &blk.neg_flags {
                if !ctx.flag(flag) {
                    ids.push(p);
                }
            }
            for &wd in &ctx.flag_words {
                let mut bits = ctx.flags[wd as usize];
                while bits != 0 {
                    let f = wd * 64 + bits.trailing_zeros();
                    bits &= bits - 1;
                    if self.flag_pred[f as usize] != NONE {
                        ids.push(self.flag_pred[f as usize]);
                    }
                }
            }
        }
        ids.sort_unstable();
        ids.dedup();
        if self.bloom_ready {
            for &p in &ids {
                self.pred_filter_into(p, &mut out.filter);
            }
        }
        out.ids = RoaringBitmap::from_sorted_iter(ids.iter().copied()).unwrap_or_default();
        ctx.ids = ids;
        ctx.reset();
        Some(out)
    }

    /// Conjunction records whose predicate ids are all in `ids` among the given candidates
    /// (the match worker's exact verification of Bloom candidates from test outputs).
    /// Returns false (and verifies nothing) when the shard was built without test ids.
    pub fn verify_by_ids(
        &self,
        candidates: &[u32],
        ids: &RoaringBitmap,
        out: &mut Vec<u32>,
    ) -> bool {
        if !self.cfg.test_ids {
            return false;
        }
        for &rec in candidates {
            let s = self.code_start[rec as usize] as usize;
            let e = self.code_start[rec as usize + 1] as usize;
            if self.conj_preds[s..e].iter().all(|p| ids.contains(*p)) {
                out.push(rec);
            }
        }
        true
    }

    /// The subscriptions (sorted, distinct) of the candidates that verify by `ids`; `None`
    /// when the shard was built without test ids.
    pub fn verified_subscriptions(
        &self,
        candidates: &[u32],
        ids: &RoaringBitmap,
    ) -> Option<Vec<u64>> {
        let mut recs = Vec::new();
        if !self.verify_by_ids(candidates, ids, &mut recs) {
            return None;
        }
        let mut subs: Vec<u64> = recs
            .iter()
            .map(|&r| self.conjunction_subscription(r))
            .collect();
        subs.sort_unstable();
        subs.dedup();
        Some(subs)
    }

    /// Candidates of an object from the predicate ids of its test results, without Bloom
    /// filters: the records whose access predicate is among `ids`, and those without one.
    /// Exact after [`Base::verify_by_ids`]; far fewer than a Bloom scan visits when no GPU
    /// runs the scan. Returns false (and adds nothing) without test ids.
    pub fn id_candidates(&self, ids: &RoaringBitmap, out: &mut Vec<u32>) -> bool {
        if self.id_post.len() < 2 {
            return false;
        }
        let n = self.id_post.len() - 2;
        let range = |p: usize| self.id_post[p] as usize..self.id_post[p + 1] as usize;
        for p in ids {
            let p = p as usize;
            if p < n {
                out.extend_from_slice(&self.id_recs[range(p)]);
            }
        }
        out.extend_from_slice(&self.id_recs[range(n)]);
        true
    }

    /// Bloom subset scan of every conjunction for a batch of object filters (`words` each,
    /// concatenated). Calls `f(object, record)` for every candidate. Blocks of conjunctions
    /// stay in cache while the whole batch passes over them.
    pub fn bloom_candidates(&self, objs: &[u64], mut f: impl FnMut(usize, u32)) {
        const BLOCK: usize = 2048;
        let n = self.conjunctions();
        let w = self.words;
        let n_obj = objs.len() / w.max(1);
        let mut acc = vec![0u64; BLOCK];
        let mut start = 0;
        while start < n {
            let end = (start + BLOCK).min(n);
            let len = end - start;
            for o in 0..n_obj {
                let obj = &objs[o * w..o * w + w];
                let acc = &mut acc[..len];
                let not0 = !obj[0];
                let col0 = &self.filters[start..end];
                for (x, &s) in acc.iter_mut().zip(col0) {
                    *x = s & not0;
                }
                for (wi, &ow) in obj.iter().enumerate().skip(1) {
                    let not_w = !ow;
                    let col = &self.filters[wi * n + start..wi * n + end];
                    for (x, &s) in acc.iter_mut().zip(col) {
                        *x |= s & not_w;
                    }
                }
                for (i, &x) in acc.iter().enumerate() {
                    if x == 0 {
                        f(o, (start + i) as u32);
                    }
                }
            }
            start = end;
        }
    }

    /// Matches a batch of events with the shard's strategy. `out[i]` receives the matching
    /// conjunction records of event `i` (unsorted; several per subscription possible).
    pub fn match_records(
        &self,
        events: &[Event],
        ctx: &mut EvalCtx,
        out: &mut [Vec<u32>],
    ) -> VerifyStats {
        self.match_records_with(self.strategy, events, ctx, out)
    }

    /// As [`Base::match_records`] with an explicit strategy (falls back to access when the
    /// Bloom tables are missing).
    pub fn match_records_with(
        &self,
        strategy: Strategy,
        events: &[Event],
        ctx: &mut EvalCtx,
        out: &mut [Vec<u32>],
    ) -> VerifyStats {
        let bloom = strategy == Strategy::Bloom && self.bloom_ready;
        // a cell shard has no access index: whatever is asked but Bloom runs the cells
        if let Some(cells) = &self.cells
            && (strategy == Strategy::Cells || (!self.access_ready && !bloom))
        {
            return self.match_cells(cells, events, ctx, out);
        }
        if strategy != Strategy::Bloom || !self.bloom_ready {
            let mut stats = VerifyStats::default();
            for (ev, o) in events.iter().zip(out.iter_mut()) {
                self.load(ev, ctx, false);
                stats.verified += self.match_access(ctx, o);
                ctx.reset();
            }
            return stats;
        }
        let w = self.words;
        let mut objs = vec![0u64; w * events.len()];
        for (i, ev) in events.iter().enumerate() {
            self.load(ev, ctx, true);
            self.object_filter(ctx, &mut objs[i * w..i * w + w]);
            ctx.reset();
        }
        let mut cands: Vec<Vec<u32>> = vec![Vec::new(); events.len()];
        self.bloom_candidates(&objs, |o, rec| cands[o].push(rec));
        self.verify_candidates(events, &cands, ctx, out)
    }

    /// The code range of a record.
    #[inline]
    fn code_range(&self, rec: u32) -> (usize, usize) {
        (
            self.code_start[rec as usize] as usize,
            self.code_start[rec as usize + 1] as usize,
        )
    }

    pub(super) fn match_cells(
        &self,
        cells: &CellIndex,
        events: &[Event],
        ctx: &mut EvalCtx,
        out: &mut [Vec<u32>],
    ) -> VerifyStats {
        let loaded = self.load_for_cells(cells, events, ctx);
        self.scan_cells(cells, &loaded, 0..cells.blocks(), ctx, out)
    }

    /// The batch's test results for the cell scan: each object's cells, its rows (dense,
    /// object x attribute, when not too many) and its snapshot for the general verifier.
    pub(super) fn load_for_cells(
        &self,
        cells: &CellIndex,
        events: &[Event],
        ctx: &mut EvalCtx,
    ) -> CellBatch {
        // each object's row per attribute, dense, so survivors made only of row intervals are
        // verified inside the scan while their block's codes are in cache
        let dense = self.dense_rows(events.len());
        self.load_cells_with(cells, events, ctx, dense)
    }

    /// Whether a batch of `events` keeps each object's rows dense.
    pub(super) fn dense_rows(&self, events: usize) -> bool {
        self.attr_names.len().saturating_mul(events) <= DENSE_ROWS_MAX
    }

    /// [`Base::load_for_cells`] with the rows dense or not as `dense` says (a batch loaded
    /// in parts keeps its whole's choice).
    pub(super) fn load_cells_with(
        &self,
        cells: &CellIndex,
        events: &[Event],
        ctx: &mut EvalCtx,
        dense: bool,
    ) -> CellBatch {
        let n_attrs = self.attr_names.len();
        let mut rows: Vec<u32> = if dense {
            vec![NO_ROW; n_attrs * events.len()]
        } else {
            Vec::new()
        };
        let mut per_event: Vec<Vec<u16>> = Vec::with_capacity(events.len());
        let mut loaded: Vec<Loaded> = Vec::with_capacity(events.len());
        for (i, ev) in events.iter().enumerate() {
            self.load(ev, ctx, false);
            let mut c = Vec::with_capacity(cells.attributes());
            cells.cells_of(|a| ctx.rows[a as usize], &mut c);
            per_event.push(c);
            if dense {
                for &a in &ctx.touched {
                    rows[i * n_attrs + a as usize] = ctx.rows[a as usize];
                }
            }
            loaded.push(ctx.snapshot());
            ctx.reset();
        }
        CellBatch {
            per_event,
            rows,
            dense,
            loaded,
        }
    }

    /// Scans the cell blocks `blocks` for a loaded batch and verifies their survivors:
    /// `out[i]` gets event `i`'s matching records among those blocks.
    pub(super) fn scan_cells(
        &self,
        cells: &CellIndex,
        b: &CellBatch,
        blocks: std::ops::Range<usize>,
        ctx: &mut EvalCtx,
        out: &mut [Vec<u32>],
    ) -> VerifyStats {
        let n_attrs = self.attr_names.len();
        let mut undecided: Vec<Vec<u32>> = vec![Vec::new(); b.loaded.len()];
        let mut stats = VerifyStats::default();
        cells.scan_blocks(&b.per_event, blocks, |found| {
            // ask for every survivor's codes first, so their cache misses overlap
            for s in found.iter().filter(|s| !s.impure) {
                let (a, e) = self.code_range(s.conj);
                crate::cells::prefetch(&self.codes[a..e]);
            }
            for s in found {
                let o = s.object as usize;
                if s.impure || !b.dense {
                    undecided[o].push(s.conj);
                    continue;
                }
                stats.verified += 1;
                let r = &b.rows[o * n_attrs..(o + 1) * n_attrs];
                let (a, e) = self.code_range(s.conj);
                let holds = self.codes[a..e].iter().fold(true, |acc, c| {
                    let v = r.get(c.attr() as usize).copied().unwrap_or(NO_ROW);
                    acc & (v >= c.a && v <= c.b)
                });
                if holds {
                    out[o].push(s.conj);
                }
            }
        });
        for ((l, cs), o) in b.loaded.iter().zip(&undecided).zip(out.iter_mut()) {
            if cs.is_empty() {
                continue;
            }
            stats.verified += cs.len() as u64;
            ctx.restore(l);
            ctx.verify_scattered(self, cs, |rec, ok| {
                if ok {
                    o.push(rec);
                }
            });
            ctx.reset();
        }
        stats
    }

    /// Exact verification of Bloom candidates (from the CPU scan or the GPU) by predicate
    /// codes.
    pub fn verify_candidates(
        &self,
        events: &[Event],
        cands: &[Vec<u32>],
        ctx: &mut EvalCtx,
        out: &mut [Vec<u32>],
    ) -> VerifyStats {
        let mut stats = VerifyStats::default();
        for ((ev, cs), o) in events.iter().zip(cands).zip(out.iter_mut()) {
            if cs.is_empty() {
                continue;
            }
            stats.verified += cs.len() as u64;
            self.load(ev, ctx, false);
            ctx.verify_scattered(self, cs, |rec, ok| {
                if ok {
                    o.push(rec);
                } else {
                    stats.bloom_rejected += 1;
                }
            });
            ctx.reset();
        }
        stats
    }

    /// The Bloom filter of an object (zero words if the tables are not built).
    pub fn event_filter(&self, ev: &Event, ctx: &mut EvalCtx) -> Vec<u64> {
        let mut out = vec![0u64; self.words];
        if self.bloom_ready {
            self.load(ev, ctx, true);
            self.object_filter(ctx, &mut out);
            ctx.reset();
        }
        out
    }
}
