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

mod build;
mod eval;
mod intern;
mod layout;
mod matching;
mod ranks;
mod split;
mod values;

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

pub use eval::EvalCtx;
use eval::Loaded;

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

const OP_ROWS: u32 = 0;

const OP_NOT_ROWS: u32 = 1;

const OP_FLAG: u32 = 2;

const OP_NOT_FLAG: u32 = 3;

const OP_EXISTS: u32 = 4;

const OP_NOT_EXISTS: u32 = 5;

const OP_TRUE: u32 = 6;

/// `in {strings}` whose value indexes span pages: the object's value index is one of
/// `value_lists[a..a + b]` (sorted).
const OP_VALUE_LIST: u32 = 7;

/// `in {strings}` by the object's value index on its attribute: ops `OP_VALUES + page` test
/// whether the index is on that page of 64 and its bit is set in the 64-bit mask `b:a`
/// ([`AttrBlock::values`]). No test flag is set for such a predicate unless it is a
/// conjunction's access predicate.
const OP_VALUES: u32 = 16;

/// Pages of value indexes a code can name (the op is 8 bits).
const VALUE_PAGES: u32 = 256 - OP_VALUES;

/// An object's value index on an attribute whose value no `in {strings}` code names.
const NO_VALUE: u32 = u32::MAX;

const MAX_ATTRS: u32 = 1 << 24;

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
            head: attr << 8 | op,
            a,
            b,
        }
    }

    /// `value index in mask` on `page` (see [`OP_VALUES`]).
    fn values(attr: u32, page: u32, mask: u64) -> Code {
        Code::new(attr, OP_VALUES + page, mask as u32, (mask >> 32) as u32)
    }

    /// The attribute id.
    pub fn attr(self) -> u32 {
        Code::attr_of(self.head)
    }

    fn op(self) -> u32 {
        Code::op_of(self.head)
    }

    fn attr_of(head: u32) -> u32 {
        head >> 8
    }

    fn op_of(head: u32) -> u32 {
        head & 255
    }
}

/// What one attribute's test blocks hold.
#[derive(Debug, Clone, Default)]
struct AttrBlock {
    consts: Option<Constants>,
    /// (row, flag) for `in {numbers}` tests: the flags set by a value on that row.
    hit_rows: Vec<u32>,
    hit_flags: Vec<u32>,
    strings: Option<StringBlock>,
    /// The value index of each string named by a positive `in {strings}` predicate, the most
    /// used first (so most sets fall on one page of 64 and compile to [`OP_VALUES`] codes).
    values: FastMap<String, u32>,
    /// With `codes_only`, the string tests the codes and the access index need (those of
    /// [`OP_VALUES`] predicates that are no access predicate left out): what matching runs,
    /// while Bloom filters and test ids run `strings`, every test.
    codes_only: bool,
    code_strings: Option<StringBlock>,
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

/// Work done by exact verification in one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyStats {
    /// Conjunctions checked exactly (access-index visits or Bloom candidates).
    pub verified: u64,
    /// Bloom candidates that verification rejected (Bloom false positives).
    pub bloom_rejected: u64,
}

impl std::ops::AddAssign for VerifyStats {
    fn add_assign(&mut self, o: VerifyStats) {
        self.verified += o.verified;
        self.bloom_rejected += o.bloom_rejected;
    }
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
    /// Per conjunction its subscription, kept instead of `recs` when the shard matches by
    /// cells and drops the access index (`recs`, `num_index`, runs); exactly one of the two
    /// is filled.
    conj_subs: Vec<u64>,
    /// The access index is kept (not derivable from `conj_subs`: an empty cell shard has
    /// neither).
    access_ready: bool,
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
    /// The sorted value indexes of [`OP_VALUE_LIST`] codes.
    value_lists: Vec<u32>,
    /// Records by value index of `in {strings}` access predicates (see `layout::Order`).
    value_post: Vec<Vec<u32>>,
    value_recs: Vec<u32>,
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

impl Base {
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
        self.recs.len() + self.conj_subs.len()
    }

    /// The word-major conjunction filters (`word * conjunctions() + index`), for the GPU.
    pub fn filters(&self) -> &[u64] {
        &self.filters
    }

    /// The subscription a conjunction belongs to.
    pub fn conjunction_subscription(&self, conj: u32) -> u64 {
        match self.recs.get(conj as usize) {
            Some(r) => r.sub,
            None => self.conj_subs[conj as usize],
        }
    }

    /// Whether some predicate of the shard tests attribute `attr`.
    pub fn has_attribute(&self, attr: &str) -> bool {
        self.attr_ids.contains_key(attr)
    }

    /// Attribute names known to the shard (objects' other attributes are dropped at once).
    pub fn attribute_names(&self) -> &[String] {
        &self.attr_names
    }

    /// Figures about the shard.
    pub fn stats(&self) -> ShardStats {
        ShardStats {
            conjunctions: self.conjunctions(),
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
                    + b.code_strings.as_ref().map_or(0, |s| s.heap_bytes())
                    + b.values.keys().map(|k| k.len() + 32).sum::<usize>()
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
            + 8 * self.conj_subs.len()
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
            + 4 * (self.value_recs.len() + self.value_lists.len())
            + self
                .value_post
                .iter()
                .map(|p| 4 * p.len() + 24)
                .sum::<usize>()
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
}
