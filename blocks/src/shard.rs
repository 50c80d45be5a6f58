//! One subscription shard compiled for matching: the test blocks of its attributes and its
//! match block, built together so they agree on one version of the predicate table.
//!
//! Building interns every distinct predicate (canonical ids shared across subscriptions),
//! gives it Bloom positions, compiles it to a 12-byte [`Code`] that can be checked against an
//! object in a few instructions, and lays out the conjunctions for two matching strategies:
//!
//! - **Bloom subset** (the path the GPU runs): every conjunction's filter is kept
//!   structure-of-arrays (word `w` of every conjunction contiguous); a batch of object filters
//!   is tested against blocks of conjunctions that stay in cache (`sub & !obj == 0`), then
//!   every candidate is verified exactly against its predicate codes.
//! - **Access predicate** (as in Siena's and BE-Tree's access predicates): every conjunction is
//!   filed under its most selective predicate; an object visits only the conjunctions whose
//!   access predicate it satisfies (numeric ones through an interval index over rows, string
//!   and set ones through posting lists of test flags), and verifies their other predicates,
//!   stored right after in the same order so verification streams through memory. This stays
//!   fast when Bloom filters saturate, i.e. when objects satisfy a large share of predicates.
//!
//! The strategy is chosen per shard from a cost estimate over the shard's own predicate
//! statistics (see [`Base::strategy`]); both give identical, exact results.

use roaring::RoaringBitmap;

use crate::bloom::{BloomConfig, BloomConfigError, PositionAllocator, or_into, set_positions};
use crate::cells::{CellIndex, RowPred};
use crate::formula::Dnf;
use crate::hash::FastMap;
use crate::interval::IntervalIndex;
use crate::num::Num;
use crate::numeric::{Constants, NO_ROW};
use crate::predicate::{Bound, Event, Test, Value};
use crate::strings::{StrTest, StringBlock};

/// Row of an attribute that is present with a non-numeric value.
pub const STR_ROW: u32 = u32::MAX - 1;
const NONE: u32 = u32::MAX;
/// Bloom position of a predicate that has no Bloom bits.
const NO_POS: u16 = u16::MAX;

/// How a shard matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Bloom subset scan over every conjunction, then exact verification.
    Bloom,
    /// Access-predicate index, then exact verification.
    Access,
    /// Negative cell bitsets over numeric attributes (see `cells`), then exact verification
    /// of the undecided.
    Cells,
}

/// Which strategy to use: a fixed one, or chosen per shard from its statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StrategyChoice {
    #[default]
    Auto,
    Fixed(Strategy),
}

/// Settings for compiling a shard.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardConfig {
    pub bloom: BloomConfig,
    pub strategy: StrategyChoice,
    /// Build the Bloom tables (conjunction filters, per-row filters). Without them only the
    /// access strategy is available; with them the GPU can run the shard.
    pub bloom_tables: bool,
    /// Largest total size of the numeric per-row filter tables; above it the Bloom tables are
    /// not built (the access strategy does not need them).
    pub row_filter_budget_bytes: usize,
    /// Predicates estimated to hold for more than this share of objects (negations, wide
    /// ranges) get no Bloom bits: they would saturate object filters. Exact verification
    /// checks them instead.
    pub bloom_max_selectivity: f32,
    /// Keep what test workers need to report exact predicate ids (`Base::test_attribute`,
    /// `Base::verify_by_ids`). A shard used only as a match block can drop it: in the
    /// cluster, test blocks and match blocks live in different workers.
    pub test_ids: bool,
    /// Cells per numeric attribute for the cell strategy.
    pub cells: usize,
    /// Largest size of the cell bitsets; above it the cell strategy is not built.
    pub cells_budget_bytes: usize,
}

impl Default for ShardConfig {
    fn default() -> ShardConfig {
        ShardConfig {
            bloom: BloomConfig::default(),
            strategy: StrategyChoice::Auto,
            bloom_tables: true,
            row_filter_budget_bytes: 256 << 20,
            bloom_max_selectivity: 0.05,
            test_ids: true,
            cells: 32,
            cells_budget_bytes: 1 << 30,
        }
    }
}

/// Why a shard could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("invalid bloom setting: {0}")]
    Bloom(#[from] BloomConfigError),
    #[error("subscription {0} appears twice")]
    DuplicateSubscription(u64),
    #[error("too many {0} for one shard (limit {1})")]
    TooLarge(&'static str, u64),
    #[error("the bloom strategy was requested but the bloom tables are disabled or over budget")]
    BloomUnavailable,
    #[error("the cell strategy was requested but its bitsets would exceed the budget")]
    CellsUnavailable,
}

// --- predicate codes -------------------------------------------------------------------------

const OP_ROWS: u32 = 0;
const OP_NOT_ROWS: u32 = 1;
const OP_FLAG: u32 = 2;
const OP_NOT_FLAG: u32 = 3;
const OP_EXISTS: u32 = 4;
const OP_NOT_EXISTS: u32 = 5;
const OP_TRUE: u32 = 6;
const MAX_ATTRS: u32 = 1 << 28;

/// A compiled predicate: attribute, operation and two operands, checked against an
/// [`EvalCtx`] in a few instructions. Rows refer to the attribute's numeric table; flags to
/// the attribute's string/set tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code {
    head: u32,
    a: u32,
    b: u32,
}

impl Code {
    fn new(attr: u32, op: u32, a: u32, b: u32) -> Code {
        Code {
            head: attr << 4 | op,
            a,
            b,
        }
    }

    /// The attribute id.
    pub fn attr(self) -> u32 {
        self.head >> 4
    }

    fn op(self) -> u32 {
        self.head & 15
    }
}

// --- evaluation context ----------------------------------------------------------------------

/// One object's test results, saved between the phases of a batch.
#[derive(Debug, Clone, Default)]
struct Loaded {
    rows: Vec<(u32, u32)>,
    flags: Vec<(u32, u64)>,
}

/// Per-thread scratch holding one object's test results: its row per attribute (or absent /
/// non-numeric) and the set of string and set tests it satisfies. Reused across objects.
#[derive(Debug, Clone, Default)]
pub struct EvalCtx {
    rows: Vec<u32>,
    touched: Vec<u32>,
    flags: Vec<u64>,
    flag_words: Vec<u32>,
    filter: Vec<u64>,
    scratch: Vec<u32>,
    /// Satisfied predicate ids of one attribute test ([`Base::test_attribute_with`]).
    ids: Vec<u32>,
}

impl EvalCtx {
    fn fit(&mut self, attrs: usize, flags: usize) {
        if self.rows.len() < attrs {
            self.rows.resize(attrs, NO_ROW);
        }
        let words = flags.div_ceil(64);
        if self.flags.len() < words {
            self.flags.resize(words, 0);
        }
    }

    #[inline]
    fn set_flag(&mut self, f: u32) {
        let w = (f / 64) as usize;
        if self.flags[w] == 0 {
            self.flag_words.push(w as u32);
        }
        self.flags[w] |= 1u64 << (f % 64);
    }

    #[inline]
    fn flag(&self, f: u32) -> bool {
        self.flags[(f / 64) as usize] >> (f % 64) & 1 == 1
    }

    fn reset(&mut self) {
        for &a in &self.touched {
            self.rows[a as usize] = NO_ROW;
        }
        self.touched.clear();
        for &w in &self.flag_words {
            self.flags[w as usize] = 0;
        }
        self.flag_words.clear();
    }

    /// The loaded test results, compact, to restore later without running the tests again.
    fn snapshot(&self) -> Loaded {
        Loaded {
            rows: self
                .touched
                .iter()
                .map(|&a| (a, self.rows[a as usize]))
                .collect(),
            flags: self
                .flag_words
                .iter()
                .map(|&w| (w, self.flags[w as usize]))
                .collect(),
        }
    }

    /// Restores a snapshot into a reset context.
    fn restore(&mut self, l: &Loaded) {
        for &(a, r) in &l.rows {
            self.rows[a as usize] = r;
            self.touched.push(a);
        }
        for &(w, v) in &l.flags {
            self.flags[w as usize] = v;
            self.flag_words.push(w);
        }
    }

    #[inline]
    fn check(&self, c: Code) -> bool {
        let r = self.rows[c.attr() as usize];
        match c.op() {
            OP_ROWS => r >= c.a && r <= c.b,
            OP_NOT_ROWS => r != NO_ROW && !(r >= c.a && r <= c.b),
            OP_FLAG => self.flag(c.a),
            OP_NOT_FLAG => r != NO_ROW && !self.flag(c.a),
            OP_EXISTS => r != NO_ROW,
            OP_NOT_EXISTS => r == NO_ROW,
            _ => true,
        }
    }

    #[inline]
    fn check_all(&self, codes: &[Code]) -> bool {
        codes.iter().all(|&c| self.check(c))
    }

    /// Checks many scattered conjunctions: all their code ranges are fetched first and every
    /// code is evaluated without early exit, so the loads of different conjunctions overlap
    /// instead of waiting on each other behind a mispredicted branch.
    fn verify_scattered(&self, base: &Base, recs: &[u32], mut pass: impl FnMut(u32, bool)) {
        const LANES: usize = 16;
        for chunk in recs.chunks(LANES) {
            let mut span = [(0u32, 0u32); LANES];
            for (s, &r) in span.iter_mut().zip(chunk) {
                *s = (base.code_start[r as usize], base.code_start[r as usize + 1]);
            }
            // touch each conjunction's first and last code: independent loads the CPU
            // issues together, so the evaluation below finds them in cache
            let mut touch = 0u32;
            for &(s, e) in &span[..chunk.len()] {
                if s < e {
                    touch ^= base.codes[s as usize].head ^ base.codes[e as usize - 1].head;
                }
            }
            std::hint::black_box(touch);
            let mut ok = [true; LANES];
            for (o, &(s, e)) in ok.iter_mut().zip(&span[..chunk.len()]) {
                *o = base.codes[s as usize..e as usize]
                    .iter()
                    .fold(true, |acc, &c| acc & self.check(c));
            }
            for (&r, &o) in chunk.iter().zip(&ok) {
                pass(r, o);
            }
        }
    }
}

// --- per-attribute test blocks ---------------------------------------------------------------

/// What one attribute's test blocks hold.
#[derive(Debug, Clone, Default)]
struct AttrBlock {
    consts: Option<Constants>,
    /// (row, flag) for `in {numbers}` tests: the flags set by a value on that row.
    hit_rows: Vec<u32>,
    hit_flags: Vec<u32>,
    strings: Option<StringBlock>,
    /// Positive numeric predicates by row interval (payload: predicate id), for exact ids.
    id_index: IntervalIndex,
    /// Negated numeric predicates: (a, b, predicate id).
    neg_rows: Vec<(u32, u32, u32)>,
    exists_pred: u32,
    not_exists_pred: u32,
    /// (base flag, predicate id) of negated string/set predicates.
    neg_flags: Vec<(u32, u32)>,
    /// Bloom: per-row filters (rows x words), the filter of a present non-numeric value
    /// (negated numeric predicates), of `exists`, and of `not exists`.
    row_filters: Vec<u64>,
    str_value_filter: Vec<u64>,
}

/// The exact test result of one attribute: its Bloom filter and satisfied predicate ids.
#[derive(Debug, Clone, PartialEq)]
pub struct TestOutput {
    pub filter: Vec<u64>,
    pub ids: RoaringBitmap,
}

// --- the compiled shard ----------------------------------------------------------------------

/// One conjunction's hot data for the access path.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
struct Rec {
    sub: u64,
    probe: [Code; 2],
}

/// The access index of one numeric attribute: posting lists for point predicates (`=`)
/// by row, and an interval index for the others.
#[derive(Debug, Clone, Default)]
struct NumAccess {
    point_rows: Vec<u32>,
    point_start: Vec<u32>,
    /// Per point list, its range in `Base::runs`.
    point_runs: Vec<u32>,
    spans: IntervalIndex,
}

/// A run of records in one posting list whose probes test the same attribute the same way.
/// In a `point` run every probe is `attribute = constant`, sorted by row, so a query visits
/// only the records whose probe holds.
#[derive(Debug, Clone, Copy)]
struct Run {
    attr: u32,
    start: u32,
    end: u32,
    point: bool,
}

/// Posting lists shorter than this are scanned whole (runs would not pay for themselves).
const MIN_RUN_LIST: u32 = 32;

fn build_runs(recs: &[Rec], start: u32, end: u32, runs: &mut Vec<Run>) {
    if end - start < MIN_RUN_LIST {
        if start < end {
            runs.push(Run {
                attr: 0,
                start,
                end,
                point: false,
            });
        }
        return;
    }
    let mut i = start;
    while i < end {
        let head = recs[i as usize].probe[0].head;
        let mut j = i;
        let mut point = head & 15 == OP_ROWS;
        while j < end && recs[j as usize].probe[0].head == head {
            let p = recs[j as usize].probe[0];
            point &= p.a == p.b;
            j += 1;
        }
        runs.push(Run {
            attr: head >> 4,
            start: i,
            end: j,
            point,
        });
        i = j;
    }
}

/// Work done by exact verification in one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyStats {
    /// Conjunctions checked exactly (access-index visits or Bloom candidates).
    pub verified: u64,
    /// Bloom candidates that verification rejected (Bloom false positives).
    pub bloom_rejected: u64,
}

/// A compiled shard (immutable; see `index` for versions and incremental changes).
#[derive(Debug, Clone)]
pub struct Base {
    cfg: ShardConfig,
    words: usize,
    attr_ids: FastMap<String, u32>,
    attr_names: Vec<String>,
    attrs: Vec<AttrBlock>,
    n_flags: u32,
    n_preds: u32,
    /// Predicate id of the positive predicate behind each flag (NONE if only used negated).
    flag_pred: Vec<u32>,
    /// Bloom positions of every predicate (`k` per predicate), when the tables are built.
    pred_pos: Vec<u16>,
    /// Attributes with `not exists` predicates.
    not_exists_attrs: Vec<u32>,
    // conjunctions, in record order
    /// Per record: its subscription and the first two codes after the access predicate,
    /// so the access path reads one 32-byte slot per visited conjunction, sequentially.
    recs: Vec<Rec>,
    code_start: Vec<u32>,
    codes: Vec<Code>,
    conj_preds: Vec<u32>,
    /// Word-major filters: word `w` of conjunction `i` at `w * n + i`.
    filters: Vec<u64>,
    bloom_ready: bool,
    // access index
    num_index: Vec<Option<NumAccess>>,
    /// Runs of equal probes within posting lists, and per flag list its runs.
    runs: Vec<Run>,
    flag_runs: Vec<u32>,
    /// Per record: the row its probe tests (for point probes), searched within a run.
    probe_rows: Vec<u32>,
    /// Flags that are some conjunction's access predicate (one bit each).
    flag_access: Vec<u64>,
    flag_post: Vec<u32>,
    exists_post: Vec<u32>,
    always: (u32, u32),
    /// With test ids: records by access predicate id (`id_post[p]..id_post[p + 1]` into
    /// `id_recs`; the last range holds the records without one), so a match worker finds
    /// candidates from test results without Bloom filters.
    id_post: Vec<u32>,
    id_recs: Vec<u32>,
    cells: Option<CellIndex>,
    strategy: Strategy,
    est_access_cost: f64,
    est_bloom_cost: f64,
    est_cells_cost: f64,
}

/// Figures describing a compiled shard.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardStats {
    pub conjunctions: usize,
    pub predicates: usize,
    pub attributes: usize,
    pub flags: usize,
    pub strategy: Strategy,
    pub bloom_ready: bool,
    pub heap_bytes: usize,
    pub est_access_cost: f64,
    pub est_bloom_cost: f64,
    pub est_cells_cost: f64,
}

#[derive(Hash, PartialEq, Eq)]
struct PredKey {
    attr: u32,
    test: Test,
    negated: bool,
}

impl Base {
    /// Compiles subscriptions (id, conjunctions) into a shard.
    pub fn build<'a, I>(cfg: ShardConfig, subs: I) -> Result<Base, BuildError>
    where
        I: IntoIterator<Item = (u64, &'a Dnf)>,
    {
        let bloom = cfg.bloom.validate()?;
        let words = bloom.words();
        // 1. intern attributes and predicates, collect conjunctions
        let mut attr_ids: FastMap<String, u32> = FastMap::default();
        let mut attr_names: Vec<String> = Vec::new();
        let mut pred_ids: FastMap<PredKey, u32> = FastMap::default();
        let mut preds: Vec<(u32, Test, bool)> = Vec::new();
        let mut conj_sub: Vec<u64> = Vec::new();
        let mut conj_start: Vec<u32> = vec![0];
        let mut conj_preds: Vec<u32> = Vec::new();
        let mut seen_subs: std::collections::HashSet<u64> = std::collections::HashSet::new();
        for (sub, dnf) in subs {
            if !seen_subs.insert(sub) {
                return Err(BuildError::DuplicateSubscription(sub));
            }
            for conj in &dnf.0 {
                for p in &conj.0 {
                    let attr = match attr_ids.get(&p.attr) {
                        Some(&a) => a,
                        None => {
                            let a = attr_names.len() as u32;
                            if a >= MAX_ATTRS {
                                return Err(BuildError::TooLarge("attributes", MAX_ATTRS as u64));
                            }
                            attr_ids.insert(p.attr.clone(), a);
                            attr_names.push(p.attr.clone());
                            a
                        }
                    };
                    let key = PredKey {
                        attr,
                        test: p.test.clone(),
                        negated: p.negated,
                    };
                    let next = preds.len() as u32;
                    let id = *pred_ids.entry(key).or_insert_with(|| {
                        preds.push((attr, p.test.clone(), p.negated));
                        next
                    });
                    conj_preds.push(id);
                }
                conj_sub.push(sub);
                if conj_preds.len() >= u32::MAX as usize {
                    return Err(BuildError::TooLarge("predicate uses", u32::MAX as u64));
                }
                conj_start.push(conj_preds.len() as u32);
            }
        }
        drop(pred_ids);
        drop(seen_subs);
        let n_attrs = attr_names.len();
        let n_preds = preds.len();
        let n_conj = conj_sub.len();

        // 2. numeric constants per attribute; flags for string and set tests
        let mut consts: Vec<Vec<Num>> = vec![Vec::new(); n_attrs];
        let mut numeric_attr = vec![false; n_attrs];
        for (attr, test, _) in &preds {
            numeric_attr[*attr as usize] |= test.is_numeric();
            match test {
                Test::Interval { lo, hi } => {
                    for b in [lo, hi] {
                        if let crate::predicate::Bound::Incl(c) | crate::predicate::Bound::Excl(c) =
                            b
                        {
                            consts[*attr as usize].push(*c);
                        }
                    }
                }
                Test::NumIn(set) => consts[*attr as usize].extend(set.iter().copied()),
                _ => {}
            }
        }
        let mut attrs: Vec<AttrBlock> = (0..n_attrs)
            .map(|_| AttrBlock {
                exists_pred: NONE,
                not_exists_pred: NONE,
                ..AttrBlock::default()
            })
            .collect();
        for (a, c) in consts.into_iter().enumerate() {
            if numeric_attr[a] {
                attrs[a].consts = Some(Constants::new(c));
            }
        }
        // constant -> index, so compiling millions of intervals costs a hash lookup each
        // instead of binary searches over tables that do not fit in cache
        let const_index: Vec<FastMap<i128, u32>> = attrs
            .iter()
            .map(|b| match &b.consts {
                Some(t) => (0..t.len())
                    .map(|i| (t.get(i).to_raw(), i as u32))
                    .collect(),
                None => FastMap::default(),
            })
            .collect();
        let mut flag_ids: FastMap<(u32, Test), u32> = FastMap::default();
        let mut flag_pred: Vec<u32> = Vec::new();
        let mut str_tests: Vec<Vec<(StrTest, u32)>> = vec![Vec::new(); n_attrs];
        let mut num_hits: Vec<Vec<(u32, u32)>> = vec![Vec::new(); n_attrs];
        let mut pred_codes: Vec<Code> = Vec::with_capacity(n_preds);
        let mut pred_sel: Vec<f32> = Vec::with_capacity(n_preds);
        // distinct `=`/`in` string constants per attribute: the estimate of its cardinality
        let mut eq_counts: Vec<u32> = vec![0; n_attrs];
        {
            let mut distinct: Vec<std::collections::HashSet<&str>> =
                vec![Default::default(); n_attrs];
            for (attr, test, _) in &preds {
                if let Test::StrIn(v) = test {
                    distinct[*attr as usize].extend(v.iter().map(String::as_str));
                }
            }
            for (c, d) in eq_counts.iter_mut().zip(&distinct) {
                *c = d.len() as u32;
            }
        }
        let mut id_items: Vec<Vec<(u32, u32, u32)>> = vec![Vec::new(); n_attrs];
        for (pid, (attr, test, negated)) in preds.iter().enumerate() {
            let pid = pid as u32;
            let a = *attr;
            let blk = &mut attrs[a as usize];
            let (code, sel) = match test {
                Test::Exists => {
                    if *negated {
                        blk.not_exists_pred = pid;
                        (Code::new(a, OP_NOT_EXISTS, 0, 0), 0.1)
                    } else {
                        blk.exists_pred = pid;
                        (Code::new(a, OP_EXISTS, 0, 0), 0.9)
                    }
                }
                Test::Interval { lo, hi } => {
                    let table = blk.consts.as_ref().expect("interval bounds are constants");
                    let (ra, rb) = rows_of(&const_index[a as usize], table, *lo, *hi);
                    let (ra, rb) = if ra > rb { (1, 0) } else { (ra, rb) };
                    let sel = if ra > rb {
                        0.0
                    } else {
                        (rb - ra + 1) as f32 / (table.max_row() + 1) as f32
                    };
                    if *negated {
                        blk.neg_rows.push((ra, rb, pid));
                        (Code::new(a, OP_NOT_ROWS, ra, rb), 1.0 - sel)
                    } else {
                        id_items[a as usize].push((ra, rb, pid));
                        (Code::new(a, OP_ROWS, ra, rb), sel)
                    }
                }
                other => {
                    let next = flag_pred.len() as u32;
                    let flag = *flag_ids.entry((a, other.clone())).or_insert_with(|| {
                        flag_pred.push(NONE);
                        match other {
                            Test::NumIn(set) => {
                                let table = blk.consts.as_ref().expect("set members are constants");
                                for c in set {
                                    num_hits[a as usize].push((table.row(*c), next));
                                }
                            }
                            Test::StrIn(set) => {
                                str_tests[a as usize].push((StrTest::In(set.clone()), next))
                            }
                            Test::Prefix(s) => {
                                str_tests[a as usize].push((StrTest::Prefix(s.clone()), next))
                            }
                            Test::Suffix(s) => {
                                str_tests[a as usize].push((StrTest::Suffix(s.clone()), next))
                            }
                            Test::Contains(s) => {
                                str_tests[a as usize].push((StrTest::Contains(s.clone()), next))
                            }
                            Test::EqIgnoreCase(s) => {
                                str_tests[a as usize].push((StrTest::Ieq(s.clone()), next))
                            }
                            Test::Exists | Test::Interval { .. } => {}
                        }
                        next
                    });
                    let base_sel = match other {
                        Test::StrIn(v) => {
                            (v.len() as f32 / eq_counts[a as usize].max(1) as f32).min(0.5)
                        }
                        Test::NumIn(v) => {
                            let rows = blk.consts.as_ref().map_or(1, |t| t.max_row() + 1);
                            (v.len() as f32 / rows as f32 * 2.0).min(0.5)
                        }
                        Test::EqIgnoreCase(_) => {
                            (1.0 / eq_counts[a as usize].max(1) as f32).min(0.05)
                        }
                        t => crate::predicate::Predicate::new("", t.clone(), false)
                            .shape_selectivity() as f32,
                    };
                    if *negated {
                        blk.neg_flags.push((flag, pid));
                        (Code::new(a, OP_NOT_FLAG, flag, 0), 1.0 - base_sel)
                    } else {
                        flag_pred[flag as usize] = pid;
                        (Code::new(a, OP_FLAG, flag, 0), base_sel)
                    }
                }
            };
            pred_codes.push(code);
            pred_sel.push(sel);
        }
        let n_flags = flag_pred.len() as u32;
        for (a, blk) in attrs.iter_mut().enumerate() {
            if !str_tests[a].is_empty() {
                blk.strings = Some(StringBlock::build(&str_tests[a]));
            }
            let mut hits = std::mem::take(&mut num_hits[a]);
            hits.sort_unstable();
            blk.hit_rows = hits.iter().map(|h| h.0).collect();
            blk.hit_flags = hits.iter().map(|h| h.1).collect();
            let max_row = blk.consts.as_ref().map_or(0, |t| t.max_row());
            blk.id_index = IntervalIndex::build(max_row, std::mem::take(&mut id_items[a]));
        }
        let not_exists_attrs: Vec<u32> = attrs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.not_exists_pred != NONE)
            .map(|(a, _)| a as u32)
            .collect();

        // 3. Bloom tables
        let row_table_bytes: usize = attrs
            .iter()
            .map(|b| {
                b.consts
                    .as_ref()
                    .map_or(0, |t| (t.max_row() as usize + 1) * words * 8)
            })
            .sum();
        let bloom_ready = cfg.bloom_tables && row_table_bytes <= cfg.row_filter_budget_bytes;
        let k = bloom.k as usize;
        let mut pred_pos: Vec<u16> = Vec::new();
        if bloom_ready {
            let mut alloc = PositionAllocator::new(bloom);
            pred_pos.reserve(n_preds * k);
            for (pid, (attr, test, negated)) in preds.iter().enumerate() {
                if pred_sel[pid] > cfg.bloom_max_selectivity {
                    // likely satisfied: Bloom bits would only saturate object filters; such
                    // predicates are left to exact verification
                    pred_pos.extend(std::iter::repeat_n(NO_POS, k));
                    continue;
                }
                let canonical = crate::predicate::Predicate {
                    attr: attr_names[*attr as usize].clone(),
                    test: test.clone(),
                    negated: *negated,
                }
                .canonical();
                let (_, pos) = alloc.allocate(&canonical);
                pred_pos.extend(pos.iter().map(|&p| p as u16));
            }
            for blk in attrs.iter_mut() {
                build_row_filters(blk, words, k, &pred_pos);
            }
        }
        drop(preds);

        // 4. access predicate per conjunction, records grouped by access structure
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        enum Group {
            Num(u32),
            Flag(u32),
            Exists(u32),
            Always,
        }
        let mut access: Vec<(Group, u32)> = Vec::with_capacity(n_conj); // (group, access pred)
        let mut est_access_cost = 0.0f64;
        for c in 0..n_conj {
            let ps = &conj_preds[conj_start[c] as usize..conj_start[c + 1] as usize];
            let mut best: Option<(f32, u32)> = None;
            for &p in ps {
                let code = pred_codes[p as usize];
                if matches!(code.op(), OP_ROWS | OP_FLAG | OP_EXISTS)
                    && best.is_none_or(|b| pred_sel[p as usize] < b.0)
                {
                    best = Some((pred_sel[p as usize], p));
                }
            }
            let (sel, group, ap) = match best {
                Some((sel, p)) => {
                    let code = pred_codes[p as usize];
                    let g = match code.op() {
                        OP_ROWS => Group::Num(code.attr()),
                        OP_FLAG => Group::Flag(code.a),
                        _ => Group::Exists(code.attr()),
                    };
                    (sel as f64, g, p)
                }
                None => (1.0, Group::Always, NONE),
            };
            est_access_cost += sel * (4.0 + ps.len() as f64);
            access.push((group, ap));
        }
        // numeric groups need the interval index order; build them first with conj payloads
        let mut num_items: Vec<Vec<(u32, u32, u32)>> = vec![Vec::new(); n_attrs];
        for (c, (g, ap)) in access.iter().enumerate() {
            if let Group::Num(a) = g {
                let code = pred_codes[*ap as usize];
                num_items[*a as usize].push((code.a, code.b, c as u32));
            }
        }
        let mut num_index: Vec<Option<NumAccess>> = Vec::with_capacity(n_attrs);
        let mut order: Vec<u32> = Vec::with_capacity(n_conj);
        for (a, items) in num_items.into_iter().enumerate() {
            if items.is_empty() {
                num_index.push(None);
                continue;
            }
            // point intervals (`=`) get posting lists by row: no interval scan at all
            let (mut points, spans): (Vec<_>, Vec<_>) = items.into_iter().partition(|x| x.0 == x.1);
            points.sort_unstable();
            let mut point_rows: Vec<u32> = Vec::new();
            let mut point_start: Vec<u32> = Vec::new();
            for (row, _, c) in points {
                if point_rows.last() != Some(&row) {
                    point_rows.push(row);
                    point_start.push(order.len() as u32);
                }
                order.push(c);
            }
            point_start.push(order.len() as u32);
            let max_row = attrs[a].consts.as_ref().map_or(0, |t| t.max_row());
            let mut spans = IntervalIndex::build(max_row, spans);
            for p in spans.payloads_mut() {
                let rec = order.len() as u32;
                order.push(*p);
                *p = rec;
            }
            num_index.push(Some(NumAccess {
                point_rows,
                point_start,
                point_runs: Vec::new(),
                spans,
            }));
        }
        // the rest sorted by group
        let mut rest: Vec<(Group, u32)> = access
            .iter()
            .enumerate()
            .filter(|(_, (g, _))| !matches!(g, Group::Num(_)))
            .map(|(c, (g, _))| (*g, c as u32))
            .collect();
        rest.sort_unstable();
        // conjunctions with an empty numeric access interval never match: they are simply
        // absent from `order` when the index dropped them; file them under Always to keep
        // them accounted for (they fail verification)
        let mut placed = vec![false; n_conj];
        for &c in &order {
            placed[c as usize] = true;
        }
        let mut flag_post = vec![0u32; n_flags as usize + 1];
        let mut exists_post = vec![0u32; n_attrs + 1];
        let mut always_list: Vec<u32> = Vec::new();
        for (c, (g, _)) in access.iter().enumerate() {
            if matches!(g, Group::Num(_)) && !placed[c] {
                always_list.push(c as u32);
            }
        }
        let flag_base = order.len() as u32;
        let mut flag_counts = vec![0u32; n_flags as usize];
        let mut exists_counts = vec![0u32; n_attrs];
        for &(g, c) in &rest {
            match g {
                Group::Flag(f) => {
                    flag_counts[f as usize] += 1;
                    order.push(c);
                }
                Group::Exists(_) | Group::Always | Group::Num(_) => {}
            }
        }
        let mut acc = flag_base;
        for f in 0..n_flags as usize {
            flag_post[f] = acc;
            acc += flag_counts[f];
        }
        flag_post[n_flags as usize] = acc;
        let mut flag_access = vec![0u64; (n_flags as usize).div_ceil(64)];
        for (f, &n) in flag_counts.iter().enumerate() {
            if n > 0 {
                flag_access[f / 64] |= 1 << (f % 64);
            }
        }
        for &(g, c) in &rest {
            if let Group::Exists(a) = g {
                exists_counts[a as usize] += 1;
                order.push(c);
            }
        }
        for a in 0..n_attrs {
            exists_post[a] = acc;
            acc += exists_counts[a];
        }
        exists_post[n_attrs] = acc;
        for &(g, c) in &rest {
            if g == Group::Always {
                always_list.push(c);
            }
        }
        let always = (order.len() as u32, (order.len() + always_list.len()) as u32);
        order.extend(always_list);
        debug_assert_eq!(order.len(), n_conj);

        // each conjunction's codes: access predicate first, the rest by increasing selectivity
        let sorted_preds = |c: usize, buf: &mut Vec<u32>| {
            let (_, ap) = access[c];
            buf.clear();
            buf.extend_from_slice(&conj_preds[conj_start[c] as usize..conj_start[c + 1] as usize]);
            buf.sort_by(|&x, &y| {
                let kx = (x != ap, pred_sel[x as usize]);
                let ky = (y != ap, pred_sel[y as usize]);
                kx.partial_cmp(&ky).unwrap_or(std::cmp::Ordering::Equal)
            });
        };
        // within each posting list, order conjunctions by their probe (first code after the
        // access predicate), so point probes form runs that a query can binary-search
        let mut probe_of: Vec<Code> = Vec::with_capacity(n_conj);
        {
            let mut buf = Vec::new();
            for c in 0..n_conj {
                sorted_preds(c, &mut buf);
                probe_of.push(match buf.get(1) {
                    Some(&p) => pred_codes[p as usize],
                    None => Code::new(0, OP_TRUE, 0, 0),
                });
            }
        }
        let key_of = |c: &u32| {
            let p = probe_of[*c as usize];
            (p.head, p.a, p.b)
        };
        for ix in num_index.iter().flatten() {
            for w in ix.point_start.windows(2) {
                order[w[0] as usize..w[1] as usize].sort_by_key(key_of);
            }
        }
        for w in flag_post.windows(2) {
            order[w[0] as usize..w[1] as usize].sort_by_key(key_of);
        }

        // 5. lay out conjunctions in record order: codes (access first, rest by selectivity)
        let mut code_start = Vec::with_capacity(n_conj + 1);
        let mut codes: Vec<Code> = Vec::with_capacity(conj_preds.len());
        let mut new_preds: Vec<u32> = Vec::with_capacity(conj_preds.len());
        let mut filters = if bloom_ready {
            vec![0u64; words * n_conj]
        } else {
            Vec::new()
        };
        code_start.push(0u32);
        let mut ps_sorted: Vec<u32> = Vec::new();
        let mut recs: Vec<Rec> = Vec::with_capacity(n_conj);
        for (rec, &c) in order.iter().enumerate() {
            let c = c as usize;
            sorted_preds(c, &mut ps_sorted);
            for &p in &ps_sorted {
                codes.push(pred_codes[p as usize]);
                new_preds.push(p);
                if bloom_ready {
                    for &pos in &pred_pos[p as usize * k..p as usize * k + k] {
                        if pos == NO_POS {
                            continue;
                        }
                        let pos = pos as usize;
                        filters[(pos / 64) * n_conj + rec] |= 1u64 << (pos % 64);
                    }
                }
            }
            code_start.push(codes.len() as u32);
            let slot = |i: usize| match ps_sorted.get(i) {
                Some(&p) => pred_codes[p as usize],
                None => Code::new(0, OP_TRUE, 0, 0),
            };
            recs.push(Rec {
                sub: conj_sub[c],
                probe: [slot(1), slot(2)],
            });
        }

        // records by access predicate id (match workers' candidates from test results)
        let (id_post, id_recs) = if cfg.test_ids {
            let key = |c: u32| match access[c as usize].1 {
                NONE => n_preds,
                ap => ap as usize,
            };
            let mut id_post = vec![0u32; n_preds + 2];
            for &c in &order {
                id_post[key(c) + 1] += 1;
            }
            for i in 1..id_post.len() {
                id_post[i] += id_post[i - 1];
            }
            let mut next = id_post.clone();
            let mut id_recs = vec![0u32; order.len()];
            for (rec, &c) in order.iter().enumerate() {
                let k = key(c);
                id_recs[next[k] as usize] = rec as u32;
                next[k] += 1;
            }
            (id_post, id_recs)
        } else {
            (Vec::new(), Vec::new())
        };

        // probe runs of the posting lists
        let probe_rows: Vec<u32> = recs.iter().map(|r| r.probe[0].a).collect();
        let mut runs: Vec<Run> = Vec::new();
        let segment_runs = |start: u32, end: u32, runs: &mut Vec<Run>| -> u32 {
            build_runs(&recs, start, end, runs);
            runs.len() as u32
        };
        for ix in num_index.iter_mut().flatten() {
            let mut starts = vec![runs.len() as u32];
            for w in ix.point_start.windows(2) {
                starts.push(segment_runs(w[0], w[1], &mut runs));
            }
            ix.point_runs = starts;
        }
        let mut flag_runs = vec![runs.len() as u32];
        for w in flag_post.windows(2) {
            flag_runs.push(segment_runs(w[0], w[1], &mut runs));
        }

        // cost estimates, in rough nanoseconds per object: an access visit streams a 32-byte
        // slot and checks a code or two; a Bloom scan touches every filter word (vectorised);
        // the cell scan ORs two bitset slices per covered attribute per 64 conjunctions, and
        // verifies conjunctions without row predicates always
        let est_access_cost = est_access_cost * 3.0;
        let est_bloom_cost = if bloom_ready {
            n_conj as f64 * words as f64 * 0.1 + est_access_cost * 0.05
        } else {
            f64::INFINITY
        };
        let row_attrs: std::collections::HashSet<u32> = codes
            .iter()
            .filter(|c| c.op() == OP_ROWS)
            .map(|c| c.attr())
            .collect();
        let impure: Vec<bool> = (0..n_conj)
            .map(|r| {
                codes[code_start[r] as usize..code_start[r + 1] as usize]
                    .iter()
                    .any(|c| c.op() != OP_ROWS)
            })
            .collect();
        let no_rows = (0..n_conj)
            .filter(|&r| {
                !codes[code_start[r] as usize..code_start[r + 1] as usize]
                    .iter()
                    .any(|c| c.op() == OP_ROWS)
            })
            .count();
        let cells_bytes = n_conj.div_ceil(64) * 8 * (row_attrs.len() * (2 * cfg.cells + 1) + 1);
        let cells_fit = cfg.cells_budget_bytes >= cells_bytes && !row_attrs.is_empty();
        let est_cells_cost = if cells_fit {
            n_conj as f64 / 64.0 * 2.0 * row_attrs.len() as f64 * 0.3 + no_rows as f64 * 10.0
        } else {
            f64::INFINITY
        };
        let strategy = match cfg.strategy {
            StrategyChoice::Fixed(Strategy::Bloom) if !bloom_ready => {
                return Err(BuildError::BloomUnavailable);
            }
            StrategyChoice::Fixed(Strategy::Cells)
                if !cells_fit && n_conj > 0 && !row_attrs.is_empty() =>
            {
                return Err(BuildError::CellsUnavailable);
            }
            StrategyChoice::Fixed(s) => s,
            StrategyChoice::Auto => {
                // the cell bitsets cost memory (two bits per conjunction per cell per covered
                // attribute): only worth it when they are estimated far cheaper
                let est_cells_cost = est_cells_cost * 3.0;
                let best = est_access_cost.min(est_bloom_cost).min(est_cells_cost);
                if best == est_access_cost {
                    Strategy::Access
                } else if best == est_bloom_cost {
                    Strategy::Bloom
                } else {
                    Strategy::Cells
                }
            }
        };
        let cells = (strategy == Strategy::Cells).then(|| {
            let max_rows: Vec<u32> = attrs
                .iter()
                .map(|b| b.consts.as_ref().map_or(0, |t| t.max_row()))
                .collect();
            CellIndex::build(
                n_conj,
                cfg.cells,
                &max_rows,
                |r| {
                    codes[code_start[r] as usize..code_start[r + 1] as usize]
                        .iter()
                        .filter(|c| c.op() == OP_ROWS)
                        .map(|c| RowPred {
                            attr: c.attr(),
                            lo: c.a,
                            hi: c.b,
                        })
                        .collect()
                },
                &impure,
            )
        });
        if !cfg.test_ids {
            for blk in attrs.iter_mut() {
                blk.id_index = IntervalIndex::default();
            }
            new_preds = Vec::new();
        }
        Ok(Base {
            cfg,
            words,
            attr_ids,
            attr_names,
            attrs,
            n_flags,
            n_preds: n_preds as u32,
            flag_pred,
            pred_pos,
            not_exists_attrs,
            recs,
            code_start,
            codes,
            conj_preds: new_preds,
            filters,
            bloom_ready,
            num_index,
            runs,
            flag_runs,
            probe_rows,
            flag_access,
            flag_post,
            exists_post,
            always,
            id_post,
            id_recs,
            cells,
            strategy,
            est_access_cost,
            est_bloom_cost,
            est_cells_cost,
        })
    }

    /// The strategy in use.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The settings the shard was built with.
    pub fn config(&self) -> ShardConfig {
        self.cfg
    }

    /// Whether the Bloom tables exist (needed by the Bloom strategy and the GPU).
    pub fn bloom_ready(&self) -> bool {
        self.bloom_ready
    }

    /// Words per Bloom filter.
    pub fn filter_words(&self) -> usize {
        self.words
    }

    /// Number of conjunctions.
    pub fn conjunctions(&self) -> usize {
        self.recs.len()
    }

    /// The word-major conjunction filters (`word * conjunctions() + index`), for the GPU.
    pub fn filters(&self) -> &[u64] {
        &self.filters
    }

    /// The subscription a conjunction belongs to.
    pub fn conjunction_subscription(&self, conj: u32) -> u64 {
        self.recs[conj as usize].sub
    }

    /// Attribute names known to the shard (objects' other attributes are dropped at once).
    pub fn attribute_names(&self) -> &[String] {
        &self.attr_names
    }

    /// Figures about the shard.
    pub fn stats(&self) -> ShardStats {
        ShardStats {
            conjunctions: self.recs.len(),
            predicates: self.n_preds as usize,
            attributes: self.attr_names.len(),
            flags: self.n_flags as usize,
            strategy: self.strategy,
            bloom_ready: self.bloom_ready,
            heap_bytes: self.heap_bytes(),
            est_access_cost: self.est_access_cost,
            est_bloom_cost: self.est_bloom_cost,
            est_cells_cost: self.est_cells_cost,
        }
    }

    /// Approximate heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        let attrs: usize = self
            .attrs
            .iter()
            .map(|b| {
                b.consts.as_ref().map_or(0, |t| t.heap_bytes())
                    + 8 * b.hit_rows.len()
                    + b.strings.as_ref().map_or(0, |s| s.heap_bytes())
                    + b.id_index.heap_bytes()
                    + 12 * b.neg_rows.len()
                    + 8 * b.neg_flags.len()
                    + 8 * (b.row_filters.len() + b.str_value_filter.len())
                    + 64
            })
            .sum();
        let names: usize = self.attr_names.iter().map(|n| 2 * n.len() + 64).sum();
        attrs
            + names
            + 4 * self.flag_pred.len()
            + 2 * self.pred_pos.len()
            + std::mem::size_of::<Rec>() * self.recs.len()
            + 4 * self.code_start.len()
            + 12 * self.codes.len()
            + 4 * self.conj_preds.len()
            + 4 * (self.id_post.len() + self.id_recs.len())
            + 8 * self.filters.len()
            + self
                .num_index
                .iter()
                .flatten()
                .map(|i| {
                    i.spans.heap_bytes()
                        + 4 * (i.point_rows.len() + i.point_start.len() + i.point_runs.len())
                })
                .sum::<usize>()
            + 8 * self.flag_access.len()
            + std::mem::size_of::<Run>() * self.runs.len()
            + 4 * (self.flag_runs.len() + self.probe_rows.len())
            + 4 * (self.flag_post.len() + self.exists_post.len())
            + self.cells.as_ref().map_or(0, |c| c.heap_bytes())
    }

    /// A scratch context sized for this shard.
    pub fn new_ctx(&self) -> EvalCtx {
        let mut ctx = EvalCtx::default();
        ctx.fit(self.attr_names.len(), self.n_flags as usize);
        ctx.filter = vec![0; self.words];
        ctx
    }

    /// Runs the test blocks of every attribute of the object into the context.
    fn load(&self, ev: &Event, ctx: &mut EvalCtx) {
        ctx.fit(self.attr_names.len(), self.n_flags as usize);
        for (name, v) in &ev.attrs {
            let Some(&a) = self.attr_ids.get(name) else {
                continue;
            };
            self.load_attr(a, v, ctx);
        }
    }

    /// Runs the test block of attribute `a` on `v` into a fitted context.
    fn load_attr(&self, a: u32, v: &Value, ctx: &mut EvalCtx) {
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
                if let Some(sb) = &blk.strings {
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
    fn rec_codes(&self, rec: u32) -> &[Code] {
        &self.codes
            [self.code_start[rec as usize] as usize..self.code_start[rec as usize + 1] as usize]
    }

    /// Access strategy for a loaded context: pushes matching conjunction records.
    fn match_access(&self, ctx: &EvalCtx, out: &mut Vec<u32>) -> u64 {
        let mut visited = 0u64;
        let mut verify_rest = |rec: u32, out: &mut Vec<u32>| {
            visited += 1;
            let slot = &self.recs[rec as usize];
            if !ctx.check(slot.probe[0]) || !ctx.check(slot.probe[1]) {
                return;
            }
            let codes = self.rec_codes(rec);
            if codes.len() <= 3 || ctx.check_all(&codes[3..]) {
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
            if ctx.check_all(self.rec_codes(rec)) {
                out.push(rec);
            }
        }
        visited + (self.always.1 - self.always.0) as u64
    }

    /// Visits the records of a posting list's runs; in a point run only those whose probe
    /// row equals the object's row on the run's attribute.
    #[inline]
    fn visit_runs(&self, ctx: &EvalCtx, runs: &[Run], f: &mut impl FnMut(u32)) {
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

    fn pred_filter_into(&self, pid: u32, out: &mut [u64]) {
        let k = self.cfg.bloom.k as usize;
        for &p in &self.pred_pos[pid as usize * k..pid as usize * k + k] {
            if p == NO_POS {
                continue;
            }
            out[(p / 64) as usize] |= 1u64 << (p % 64);
        }
    }

    /// The object's Bloom filter from a loaded context (requires the Bloom tables).
    fn object_filter(&self, ctx: &EvalCtx, out: &mut [u64]) {
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
            self.load_attr(a, v, ctx);
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
        let n = self.recs.len();
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
        if strategy == Strategy::Cells
            && let Some(cells) = &self.cells
        {
            return self.match_cells(cells, events, ctx, out);
        }
        if strategy != Strategy::Bloom || !self.bloom_ready {
            let mut stats = VerifyStats::default();
            for (ev, o) in events.iter().zip(out.iter_mut()) {
                self.load(ev, ctx);
                stats.verified += self.match_access(ctx, o);
                ctx.reset();
            }
            return stats;
        }
        let w = self.words;
        let mut objs = vec![0u64; w * events.len()];
        for (i, ev) in events.iter().enumerate() {
            self.load(ev, ctx);
            self.object_filter(ctx, &mut objs[i * w..i * w + w]);
            ctx.reset();
        }
        let mut cands: Vec<Vec<u32>> = vec![Vec::new(); events.len()];
        self.bloom_candidates(&objs, |o, rec| cands[o].push(rec));
        self.verify_candidates(events, &cands, ctx, out)
    }

    fn match_cells(
        &self,
        cells: &CellIndex,
        events: &[Event],
        ctx: &mut EvalCtx,
        out: &mut [Vec<u32>],
    ) -> VerifyStats {
        let mut per_event: Vec<Vec<u16>> = Vec::with_capacity(events.len());
        let mut loaded: Vec<Loaded> = Vec::with_capacity(events.len());
        for ev in events {
            self.load(ev, ctx);
            let mut c = Vec::with_capacity(cells.attributes());
            cells.cells_of(|a| ctx.rows[a as usize], &mut c);
            per_event.push(c);
            loaded.push(ctx.snapshot());
            ctx.reset();
        }
        let mut undecided: Vec<Vec<u32>> = vec![Vec::new(); events.len()];
        cells.scan(&per_event, |o, rec, certain| {
            if certain {
                out[o].push(rec);
            } else {
                undecided[o].push(rec);
            }
        });
        let mut stats = VerifyStats::default();
        for ((l, cs), o) in loaded.iter().zip(&undecided).zip(out.iter_mut()) {
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
            self.load(ev, ctx);
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
            self.load(ev, ctx);
            self.object_filter(ctx, &mut out);
            ctx.reset();
        }
        out
    }
}

/// The row interval of `lo..hi` whose finite bounds are constants of `table`.
fn rows_of(index: &FastMap<i128, u32>, table: &Constants, lo: Bound, hi: Bound) -> (u32, u32) {
    let row = |c: Num| match index.get(&c.to_raw()) {
        Some(&i) => 2 * i + 1,
        None => table.row(c),
    };
    let a = match lo {
        Bound::Unbounded => 0,
        Bound::Incl(c) => row(c),
        Bound::Excl(c) => row(c) + 1,
    };
    let b = match hi {
        Bound::Unbounded => table.max_row(),
        Bound::Incl(c) => row(c),
        Bound::Excl(c) => match row(c) {
            0 => return (1, 0),
            r => r - 1,
        },
    };
    (a, b)
}

/// Fills one attribute's per-row filters and its non-numeric-value filter.
fn build_row_filters(blk: &mut AttrBlock, words: usize, k: usize, pred_pos: &[u16]) {
    let pos = |p: u32| {
        let s = &pred_pos[p as usize * k..p as usize * k + k];
        if s.first() == Some(&NO_POS) {
            &s[..0]
        } else {
            s
        }
    };
    if !blk.neg_rows.is_empty() {
        let mut f = vec![0u64; words];
        for &(_, _, p) in &blk.neg_rows {
            set_positions(
                &mut f,
                &pos(p).iter().map(|&x| x as u32).collect::<Vec<_>>(),
            );
        }
        blk.str_value_filter = f;
    }
    let Some(table) = &blk.consts else {
        return;
    };
    let rows = table.max_row() as usize + 1;
    // sweep: +1 per bit where an interval starts, -1 after it ends
    let mut events: Vec<(u32, i32, u16)> = Vec::new();
    let mut add = |a: u32, b: u32, p: u32| {
        if a <= b {
            for &x in pos(p) {
                events.push((a, 1, x));
                events.push((b + 1, -1, x));
            }
        }
    };
    for (a, b, p) in blk.id_index.entries() {
        add(a, b, p);
    }
    for &(a, b, p) in &blk.neg_rows {
        if a <= b {
            if a > 0 {
                add(0, a - 1, p);
            }
            add(b + 1, rows as u32 - 1, p);
        } else {
            add(0, rows as u32 - 1, p);
        }
    }
    events.sort_unstable();
    let mut counts = vec![0i32; words * 64];
    let mut out = vec![0u64; rows * words];
    let mut e = 0;
    let mut current = vec![0u64; words];
    for r in 0..rows as u32 {
        let mut changed = false;
        while e < events.len() && events[e].0 == r {
            let (_, d, bit) = events[e];
            counts[bit as usize] += d;
            changed = true;
            e += 1;
        }
        if changed {
            for (wi, cw) in current.iter_mut().enumerate() {
                let mut v = 0u64;
                for b in 0..64 {
                    if counts[wi * 64 + b] > 0 {
                        v |= 1 << b;
                    }
                }
                *cw = v;
            }
        }
        out[r as usize * words..(r as usize + 1) * words].copy_from_slice(&current);
    }
    blk.row_filters = out;
}
