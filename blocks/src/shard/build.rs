//! Compiling subscriptions into a shard ([`Base::build`]), one function per phase: intern
//! attributes and predicates (1, `intern`), compile each predicate to a code and its test
//! block entry (2), give predicates Bloom positions (3); the layout phases (4-8) are `layout`.

use std::hash::{BuildHasher, BuildHasherDefault};

use hashbrown::HashTable;

use super::intern::{Interned, Pred, intern};
use super::layout;
use super::ranks::{PredFacts, RankedBounds, ranked_rows};
use super::values::{code_strings, value_indexes, values_code};
use super::*;
use crate::hash::XxHasher;

/// Phase 2: each predicate compiled to a code with a selectivity estimate, and the test
/// blocks: numeric constants, string tests and flags per attribute.
pub(super) struct Compiled {
    pub(super) attrs: Vec<AttrBlock>,
    pub(super) flag_pred: Vec<u32>,
    /// The sorted value indexes of the [`OP_VALUE_LIST`] codes.
    pub(super) value_lists: Vec<u32>,
    /// Every attribute's string tests (flag per test), for [`code_strings`].
    pub(super) str_tests: Vec<Vec<(StrTest, u32)>>,
    pub(super) n_flags: u32,
    pub(super) pred_codes: Vec<Code>,
    pub(super) pred_sel: Vec<f32>,
    pub(super) not_exists_attrs: Vec<u32>,
}

impl Base {
    /// Compiles subscriptions (id, conjunctions) into a shard, phase by phase.
    pub fn build<'a, I>(cfg: ShardConfig, subs: I) -> Result<Base, BuildError>
    where
        I: IntoIterator<Item = (u64, &'a Dnf)>,
    {
        let bloom = cfg.bloom.validate()?;
        let words = bloom.words();
        let mut phases = Phases::new();
        let mut it = intern(subs)?;
        phases.done("intern");
        // the id intervals serve test ids, and the Bloom row filters are swept from them
        let mut c = compile(
            &it.preds,
            &it.facts,
            it.attr_names.len(),
            cfg.test_ids || cfg.bloom_tables,
        );
        phases.done("compile");
        let (bloom_ready, pred_pos) = bloom_positions(&cfg, bloom, &it, &mut c);
        drop(std::mem::take(&mut it.preds));
        drop(std::mem::take(&mut it.facts));
        phases.done("bloom positions");
        let n_preds = c.pred_codes.len();
        let mut order = layout::order(&it, &c);
        code_strings(&mut c, &order.flag_access);
        phases.done("order");
        let k = bloom.k as usize;
        let mut recs = layout::records(
            &it,
            &c,
            &order,
            bloom_ready.then_some((&pred_pos[..], k, words)),
        );
        drop(std::mem::take(&mut order.sorted));
        phases.done("records");
        let (id_post, id_recs) = if cfg.test_ids {
            layout::id_postings(n_preds, &order)
        } else {
            (Vec::new(), Vec::new())
        };
        let (runs, flag_runs, probe_rows) = layout::probe_runs(&recs.recs, &mut order);
        let chosen = layout::strategy(&cfg, &c, &order, &recs, words, bloom_ready)?;
        phases.done("postings and strategy");
        // a cell shard never visits the access index: keep only each conjunction's subscription
        let access_ready = chosen.strategy != Strategy::Cells;
        let (recs_kept, conj_subs) = if access_ready {
            (recs.recs, Vec::new())
        } else {
            let subs = recs.recs.iter().map(|r| r.sub).collect();
            order.num_index = Vec::new();
            order.value_post = Vec::new();
            order.value_recs = Vec::new();
            (Vec::new(), subs)
        };
        let (runs, flag_runs, probe_rows) = if access_ready {
            (runs, flag_runs, probe_rows)
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };
        let mut attrs = c.attrs;
        if !cfg.test_ids {
            for blk in attrs.iter_mut() {
                blk.id_index = IntervalIndex::default();
            }
            recs.new_preds = Vec::new();
        }
        Ok(Base {
            cfg,
            words,
            attr_ids: it.attr_ids,
            attr_names: it.attr_names,
            attrs,
            n_flags: c.n_flags,
            n_preds: n_preds as u32,
            flag_pred: c.flag_pred,
            pred_pos,
            not_exists_attrs: c.not_exists_attrs,
            recs: recs_kept,
            conj_subs,
            access_ready,
            code_start: recs.code_start,
            codes: recs.codes,
            conj_preds: recs.new_preds,
            filters: recs.filters,
            bloom_ready,
            num_index: order.num_index,
            runs,
            flag_runs,
            probe_rows,
            flag_access: order.flag_access,
            value_lists: std::mem::take(&mut c.value_lists),
            value_post: order.value_post,
            value_recs: order.value_recs,
            flag_post: order.flag_post,
            exists_post: order.exists_post,
            always: order.always,
            id_post,
            id_recs,
            cells: chosen.cells,
            strategy: chosen.strategy,
            est_access_cost: chosen.est_access_cost,
            est_bloom_cost: chosen.est_bloom_cost,
            est_cells_cost: chosen.est_cells_cost,
        })
    }
}

/// The time of each phase of a build, printed on stderr when `DISSEM_BUILD_PHASES` is set
/// (what a profile of a slow build starts from).
struct Phases {
    on: bool,
    at: std::time::Instant,
}

impl Phases {
    fn new() -> Phases {
        Phases {
            on: std::env::var_os("DISSEM_BUILD_PHASES").is_some(),
            at: std::time::Instant::now(),
        }
    }

    fn done(&mut self, phase: &str) {
        if self.on {
            eprintln!(
                "build phase {phase}: {:.3} s",
                self.at.elapsed().as_secs_f64()
            );
            self.at = std::time::Instant::now();
        }
    }
}

/// The position of each constant of one attribute's table: a table of positions (4 bytes a
/// slot), each hashed through the constant it points at.
struct ConstIndex<'a> {
    table: Option<&'a Constants>,
    slots: HashTable<u32>,
    hasher: BuildHasherDefault<XxHasher>,
}

impl<'a> ConstIndex<'a> {
    fn new(table: Option<&'a Constants>) -> ConstIndex<'a> {
        let hasher = BuildHasherDefault::<XxHasher>::default();
        let n = table.map_or(0, Constants::len);
        let mut slots = HashTable::with_capacity(n);
        if let Some(t) = table {
            for i in 0..n {
                let h = hasher.hash_one(t.get(i).to_raw());
                slots.insert_unique(h, i as u32, |&j| {
                    hasher.hash_one(t.get(j as usize).to_raw())
                });
            }
        }
        ConstIndex {
            table,
            slots,
            hasher,
        }
    }

    /// The position of `c` among the constants, if it is one.
    fn get(&self, c: Num) -> Option<u32> {
        let t = self.table?;
        let raw = c.to_raw();
        self.slots
            .find(self.hasher.hash_one(raw), |&i| {
                t.get(i as usize).to_raw() == raw
            })
            .copied()
    }
}

/// Phase 2: numeric constants per attribute, flags for string and set tests, and each
/// predicate's code and selectivity estimate.
fn compile(
    preds: &[Pred<'_>],
    facts: &[PredFacts],
    n_attrs: usize,
    id_intervals: bool,
) -> Compiled {
    let n_preds = preds.len();
    let mut consts: Vec<Vec<Num>> = vec![Vec::new(); n_attrs];
    let mut numeric_attr = vec![false; n_attrs];
    debug_assert_eq!(facts.len(), preds.len());
    let ranked = RankedBounds::new(preds, facts, n_attrs);
    for ((attr, test, _), f) in preds.iter().zip(facts) {
        // the facts first: the test itself only where its constants are needed
        if !f.numeric() {
            continue;
        }
        numeric_attr[*attr as usize] = true;
        if ranked.table[*attr as usize].is_some() {
            continue; // its constants are ranked already
        }
        match test {
            Test::Interval { lo, hi } => {
                for b in [lo, hi] {
                    if let crate::predicate::Bound::Incl(c) | crate::predicate::Bound::Excl(c) = b {
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
    let RankedBounds {
        table: mut ranked_tables,
        index: bound_index,
    } = ranked;
    let ranked_attr: Vec<bool> = ranked_tables.iter().map(Option::is_some).collect();
    for (a, c) in consts.into_iter().enumerate() {
        if let Some(t) = ranked_tables[a].take() {
            attrs[a].consts = Some(Constants::Int32(t));
        } else if numeric_attr[a] {
            attrs[a].consts = Some(Constants::new(c));
        }
    }
    // constant -> index, so compiling millions of intervals costs a hash lookup each
    // instead of binary searches over tables that do not fit in cache
    // (the tables leave the blocks while the index borrows them, and go back after)
    let tables: Vec<Option<Constants>> = attrs.iter_mut().map(|b| b.consts.take()).collect();
    // (an attribute whose bounds are ranked needs none: a rare unranked lookup searches)
    let const_index: Vec<ConstIndex<'_>> = tables
        .iter()
        .zip(&ranked_attr)
        .map(|(t, &r)| ConstIndex::new(if r { None } else { t.as_ref() }))
        .collect();
    let mut flag_ids: FastMap<(u32, &Test), u32> = FastMap::default();
    let mut flag_pred: Vec<u32> = Vec::new();
    let mut str_tests: Vec<Vec<(StrTest, u32)>> = vec![Vec::new(); n_attrs];
    let mut num_hits: Vec<Vec<(u32, u32)>> = vec![Vec::new(); n_attrs];
    let mut pred_codes: Vec<Code> = Vec::with_capacity(n_preds);
    let mut pred_sel: Vec<f32> = Vec::with_capacity(n_preds);
    // distinct `=`/`in` string constants per attribute: the estimate of its cardinality
    let mut eq_counts: Vec<u32> = vec![0; n_attrs];
    {
        let mut distinct: Vec<std::collections::HashSet<&str>> = vec![Default::default(); n_attrs];
        for ((attr, test, _), f) in preds.iter().zip(facts) {
            if let (true, Test::StrIn(v)) = (f.str_in(), test) {
                distinct[*attr as usize].extend(v.iter().map(String::as_str));
            }
        }
        for (c, d) in eq_counts.iter_mut().zip(&distinct) {
            *c = d.len() as u32;
        }
    }
    value_indexes(preds, facts, &mut attrs);
    let mut value_lists: Vec<u32> = Vec::new();
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
                let table = tables[a as usize]
                    .as_ref()
                    .expect("interval bounds are constants");
                let (ra, rb) = match bound_index.get(2 * pid as usize..2 * pid as usize + 2) {
                    Some(&[li, hi_i]) if li != NONE || hi_i != NONE => {
                        ranked_rows(table, (*lo, li), (*hi, hi_i))
                    }
                    _ => rows_of(&const_index[a as usize], table, *lo, *hi),
                };
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
                    if id_intervals {
                        id_items[a as usize].push((ra, rb, pid));
                    }
                    (Code::new(a, OP_ROWS, ra, rb), sel)
                }
            }
            other => {
                let next = flag_pred.len() as u32;
                let flag = *flag_ids.entry((a, *other)).or_insert_with(|| {
                    flag_pred.push(NONE);
                    match other {
                        Test::NumIn(set) => {
                            let table = tables[a as usize]
                                .as_ref()
                                .expect("set members are constants");
                            for c in set {
                                num_hits[a as usize].push((table.row(*c), next));
                            }
                        }
                        t => {
                            if let Some(st) = StrTest::of(t) {
                                str_tests[a as usize].push((st, next))
                            }
                        }
                    }
                    next
                });
                let base_sel = match other {
                    Test::StrIn(v) => {
                        (v.len() as f32 / eq_counts[a as usize].max(1) as f32).min(0.5)
                    }
                    Test::NumIn(v) => {
                        let rows = tables[a as usize].as_ref().map_or(1, |t| t.max_row() + 1);
                        (v.len() as f32 / rows as f32 * 2.0).min(0.5)
                    }
                    Test::EqIgnoreCase(_) => (1.0 / eq_counts[a as usize].max(1) as f32).min(0.05),
                    t => crate::predicate::Predicate::new("", (*t).clone(), false)
                        .shape_selectivity() as f32,
                };
                if *negated {
                    blk.neg_flags.push((flag, pid));
                    (Code::new(a, OP_NOT_FLAG, flag, 0), 1.0 - base_sel)
                } else {
                    flag_pred[flag as usize] = pid;
                    let code = match other {
                        Test::StrIn(set) => values_code(a, &blk.values, set, &mut value_lists),
                        _ => None,
                    };
                    (code.unwrap_or(Code::new(a, OP_FLAG, flag, 0)), base_sel)
                }
            }
        };
        pred_codes.push(code);
        pred_sel.push(sel);
    }
    drop(const_index);
    for (b, t) in attrs.iter_mut().zip(tables) {
        b.consts = t;
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
    Compiled {
        attrs,
        flag_pred,
        value_lists,
        str_tests,
        n_flags,
        pred_codes,
        pred_sel,
        not_exists_attrs,
    }
}

/// Phase 3: Bloom positions per predicate (none for likely-satisfied ones) and the row
/// filters of the numeric test blocks, when the shard keeps Bloom tables and they fit.
fn bloom_positions(
    cfg: &ShardConfig,
    bloom: BloomConfig,
    it: &Interned<'_>,
    c: &mut Compiled,
) -> (bool, Vec<u16>) {
    let (preds, attr_names, n_preds, words) =
        (&it.preds, &it.attr_names, it.preds.len(), bloom.words());
    let (attrs, pred_sel) = (&mut c.attrs, &c.pred_sel);
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
                test: (*test).clone(),
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
    (bloom_ready, pred_pos)
}

/// The row interval of `lo..hi` whose finite bounds are constants of `table`.
fn rows_of(index: &ConstIndex<'_>, table: &Constants, lo: Bound, hi: Bound) -> (u32, u32) {
    let row = |c: Num| match index.get(c) {
        Some(i) => 2 * i + 1,
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
