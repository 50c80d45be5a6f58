//! The layout phases of building a shard: each conjunction's access predicate and the record
//! order (4), the records with their codes and filters (5), the index by predicate id (6), the
//! probe runs of the posting lists (7) and the choice of strategy (8).

use super::build::Compiled;
use super::intern::Interned;
use super::*;

/// The access structure a conjunction is filed under.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Group {
    Num(u32),
    Flag(u32),
    Exists(u32),
    /// An [`OP_VALUES`] access predicate on the attribute: posted under each value index
    /// of its set ([`Order::value_post`]).
    Values(u32),
    Always,
}

/// Phase 4: each conjunction's access predicate and the record order (numeric posting lists
/// and interval indexes first, then flags, `exists`, and the always-visited), with records of
/// one posting list ordered by their probe.
pub(super) struct Order {
    /// (group, access predicate) per conjunction.
    pub(super) access: Vec<(Group, u32)>,
    pub(super) est_access_cost: f64,
    pub(super) num_index: Vec<Option<NumAccess>>,
    /// Conjunction of each record.
    pub(super) order: Vec<u32>,
    pub(super) flag_post: Vec<u32>,
    pub(super) exists_post: Vec<u32>,
    pub(super) flag_access: Vec<u64>,
    /// Per attribute, per value index `v`, its records are
    /// `value_recs[value_post[a][v]..value_post[a][v + 1]]` (empty for attributes without
    /// value indexes): the conjunctions whose access predicate is `in` a set holding it.
    pub(super) value_post: Vec<Vec<u32>>,
    pub(super) value_recs: Vec<u32>,
    pub(super) always: (u32, u32),
    /// Each conjunction's predicates in code order ([`sort_codes`]), laid out as
    /// `Interned::conj_preds`: sorted once here for the probes and read again by the
    /// records (sorting ten million predicates twice was a tenth of the W1 build).
    pub(super) sorted: Vec<u32>,
}

/// Phase 5: the records in order: their codes (access predicate first, the rest by
/// increasing selectivity), predicate ids, Bloom filters and probe slots.
pub(super) struct Records {
    pub(super) code_start: Vec<u32>,
    pub(super) codes: Vec<Code>,
    pub(super) new_preds: Vec<u32>,
    pub(super) filters: Vec<u64>,
    pub(super) recs: Vec<Rec>,
}

/// Phase 8: the strategy and the estimates it was chosen by.
pub(super) struct Chosen {
    pub(super) strategy: Strategy,
    pub(super) est_access_cost: f64,
    pub(super) est_bloom_cost: f64,
    pub(super) est_cells_cost: f64,
    pub(super) cells: Option<CellIndex>,
}

/// Conjunction `c`'s predicates in code order: its access predicate first, the rest by
/// increasing selectivity.
fn sort_codes(
    it: &Interned<'_>,
    pred_sel: &[f32],
    access: &[(Group, u32)],
    c: usize,
    buf: &mut Vec<u32>,
) {
    let ap = access[c].1;
    buf.clear();
    buf.extend_from_slice(&it.conj_preds[it.conj_start[c] as usize..it.conj_start[c + 1] as usize]);
    buf.sort_by(|&x, &y| {
        let kx = (x != ap, pred_sel[x as usize]);
        let ky = (y != ap, pred_sel[y as usize]);
        kx.partial_cmp(&ky).unwrap_or(std::cmp::Ordering::Equal)
    });
}

/// Phase 4: access predicates and the record order.
pub(super) fn order(it: &Interned<'_>, c: &Compiled) -> Order {
    let (conj_start, conj_preds) = (&it.conj_start, &it.conj_preds);
    let (pred_codes, pred_sel, attrs, n_flags) = (&c.pred_codes, &c.pred_sel, &c.attrs, c.n_flags);
    let c_lists = &c.value_lists;
    let n_attrs = it.attr_names.len();
    let n_conj = it.conj_sub.len();
    let mut access: Vec<(Group, u32)> = Vec::with_capacity(n_conj); // (group, access pred)
    let mut est_access_cost = 0.0f64;
    for c in 0..n_conj {
        let ps = &conj_preds[conj_start[c] as usize..conj_start[c + 1] as usize];
        let mut best: Option<(f32, u32)> = None;
        for &p in ps {
            let code = pred_codes[p as usize];
            if (matches!(code.op(), OP_ROWS | OP_FLAG | OP_EXISTS | OP_VALUE_LIST)
                || code.op() >= OP_VALUES)
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
                    OP_EXISTS => Group::Exists(code.attr()),
                    _ => Group::Values(code.attr()),
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
            Group::Exists(_) | Group::Values(_) | Group::Always | Group::Num(_) => {}
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
    // (attribute, value index, record) for each value of each `in` access set
    let mut by_value: Vec<(u32, u32, u32)> = Vec::new();
    for &(g, c) in &rest {
        if let Group::Values(a) = g {
            let code = pred_codes[access[c as usize].1 as usize];
            let rec = order.len() as u32;
            if code.op() == OP_VALUE_LIST {
                let set = &c_lists[code.a as usize..(code.a + code.b) as usize];
                by_value.extend(set.iter().map(|&v| (a, v, rec)));
            } else {
                let page = code.op() - OP_VALUES;
                let mut mask = u64::from(code.b) << 32 | u64::from(code.a);
                while mask != 0 {
                    by_value.push((a, page * 64 + mask.trailing_zeros(), rec));
                    mask &= mask - 1;
                }
            }
            order.push(c);
        }
    }
    by_value.sort_unstable();
    let mut value_post: Vec<Vec<u32>> = vec![Vec::new(); n_attrs];
    let mut value_recs: Vec<u32> = Vec::with_capacity(by_value.len());
    let mut i = 0;
    for (a, post) in value_post.iter_mut().enumerate() {
        let a = a as u32;
        if by_value.get(i).is_none_or(|x| x.0 != a) {
            continue;
        }
        let values = attrs[a as usize].values.len() as u32;
        for v in 0..=values {
            post.push(value_recs.len() as u32);
            while let Some(&(_, _, rec)) = by_value.get(i).filter(|x| x.0 == a && x.1 == v) {
                value_recs.push(rec);
                i += 1;
            }
        }
    }
    for &(g, c) in &rest {
        if g == Group::Always {
            always_list.push(c);
        }
    }
    let always = (order.len() as u32, (order.len() + always_list.len()) as u32);
    order.extend(always_list);
    debug_assert_eq!(order.len(), n_conj);

    // within each posting list, order conjunctions by their probe (first code after the
    // access predicate), so point probes form runs that a query can binary-search
    let mut probe_of: Vec<Code> = Vec::with_capacity(n_conj);
    let mut sorted: Vec<u32> = Vec::with_capacity(conj_preds.len());
    {
        let mut buf = Vec::new();
        for c in 0..n_conj {
            sort_codes(it, pred_sel, &access, c, &mut buf);
            probe_of.push(match buf.get(1) {
                Some(&p) => pred_codes[p as usize],
                None => Code::new(0, OP_TRUE, 0, 0),
            });
            sorted.extend_from_slice(&buf);
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
    Order {
        access,
        est_access_cost,
        num_index,
        order,
        flag_post,
        exists_post,
        flag_access,
        value_post,
        value_recs,
        always,
        sorted,
    }
}

/// Phase 5: lays out the records; `bloom` is (positions per predicate, k, words) when the
/// shard keeps Bloom filters.
pub(super) fn records(
    it: &Interned<'_>,
    c: &Compiled,
    o: &Order,
    bloom: Option<(&[u16], usize, usize)>,
) -> Records {
    let (conj_preds, conj_sub) = (&it.conj_preds, &it.conj_sub);
    let (pred_codes, order) = (&c.pred_codes, &o.order);
    let n_conj = conj_sub.len();
    let bloom_ready = bloom.is_some();
    let (pred_pos, k, words) = bloom.unwrap_or((&[], 0, 0));
    let mut code_start = Vec::with_capacity(n_conj + 1);
    let mut codes: Vec<Code> = Vec::with_capacity(conj_preds.len());
    let mut new_preds: Vec<u32> = Vec::with_capacity(conj_preds.len());
    let mut filters = if bloom_ready {
        vec![0u64; words * n_conj]
    } else {
        Vec::new()
    };
    code_start.push(0u32);
    let mut recs: Vec<Rec> = Vec::with_capacity(n_conj);
    for (rec, &c) in order.iter().enumerate() {
        let c = c as usize;
        let ps_sorted = &o.sorted[it.conj_start[c] as usize..it.conj_start[c + 1] as usize];
        for &p in ps_sorted {
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
    Records {
        code_start,
        codes,
        new_preds,
        filters,
        recs,
    }
}

/// Phase 6: records by access predicate id (match workers' candidates from test results).
pub(super) fn id_postings(n_preds: usize, o: &Order) -> (Vec<u32>, Vec<u32>) {
    let (access, order) = (&o.access, &o.order);
    let (id_post, id_recs) = {
        let key = |c: u32| match access[c as usize].1 {
            NONE => n_preds,
            ap => ap as usize,
        };
        let mut id_post = vec![0u32; n_preds + 2];
        for &c in order {
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
    };
    (id_post, id_recs)
}

/// Phase 7: the probe runs of the posting lists; (runs, flag runs, probe rows).
pub(super) fn probe_runs(recs: &[Rec], o: &mut Order) -> (Vec<Run>, Vec<u32>, Vec<u32>) {
    let (num_index, flag_post) = (&mut o.num_index, &o.flag_post);
    let probe_rows: Vec<u32> = recs.iter().map(|r| r.probe[0].a).collect();
    let mut runs: Vec<Run> = Vec::new();
    let segment_runs = |start: u32, end: u32, runs: &mut Vec<Run>| -> u32 {
        build_runs(recs, start, end, runs);
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
    (runs, flag_runs, probe_rows)
}

/// Phase 8: the strategy, from cost estimates over the shard's own statistics (or fixed by
/// the configuration).
pub(super) fn strategy(
    cfg: &ShardConfig,
    c: &Compiled,
    o: &Order,
    r: &Records,
    words: usize,
    bloom_ready: bool,
) -> Result<Chosen, BuildError> {
    let (codes, code_start, attrs) = (&r.codes, &r.code_start, &c.attrs);
    let n_conj = r.recs.len();
    let est_access_cost = o.est_access_cost;
    // cost estimates, in rough nanoseconds per object: an access visit streams a 32-byte
    // slot and checks a code or two; a Bloom scan touches every filter word (vectorised);
    // the cell scan ORs one bitset word per covered attribute per 64 conjunctions (measured:
    // about 0.25 ns a word on one core, eight words to a register), and verifies
    // conjunctions without row predicates always
    let est_access_cost = est_access_cost * 3.0;
    let est_bloom_cost = if bloom_ready {
        n_conj as f64 * words as f64 * 0.1 + est_access_cost * 0.05
    } else {
        f64::INFINITY
    };
    // one pass over the codes (ten million at W1): the attributes with row predicates, the
    // records with another code, and those with no row predicate
    let mut row_attr = vec![false; attrs.len()];
    let mut impure: Vec<bool> = Vec::with_capacity(n_conj);
    let mut no_rows = 0usize;
    for r in 0..n_conj {
        let (mut rows, mut other) = (false, false);
        for c in &codes[code_start[r] as usize..code_start[r + 1] as usize] {
            if c.op() == OP_ROWS {
                rows = true;
                if let Some(a) = row_attr.get_mut(c.attr() as usize) {
                    *a = true;
                }
            } else {
                other = true;
            }
        }
        impure.push(other);
        no_rows += usize::from(!rows);
    }
    let row_attrs = row_attr.iter().filter(|&&a| a).count();
    let cells_bytes = n_conj.div_ceil(64) * 8 * (row_attrs * (cfg.cells + 1) + 1);
    let cells_fit = cfg.cells_budget_bytes >= cells_bytes && row_attrs > 0;
    let est_cells_cost = if cells_fit {
        n_conj as f64 / 64.0 * row_attrs as f64 * 0.25 + no_rows as f64 * 10.0
    } else {
        f64::INFINITY
    };
    let strategy = match cfg.strategy {
        StrategyChoice::Fixed(Strategy::Bloom) if !bloom_ready => {
            return Err(BuildError::BloomUnavailable);
        }
        StrategyChoice::Fixed(Strategy::Cells) if !cells_fit && n_conj > 0 && row_attrs > 0 => {
            return Err(BuildError::CellsUnavailable);
        }
        StrategyChoice::Fixed(s) => s,
        StrategyChoice::Auto => {
            // the cell bitsets cost memory (a bit per conjunction per cell per covered
            // attribute), and the access estimate ignores its probe runs (far fewer visits
            // with equality): cells only when estimated at least twice as cheap
            let est_cells_cost = est_cells_cost * 2.0;
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
            |r, out: &mut Vec<RowPred>| {
                out.clear();
                out.extend(
                    codes[code_start[r] as usize..code_start[r + 1] as usize]
                        .iter()
                        .filter(|c| c.op() == OP_ROWS)
                        .map(|c| RowPred {
                            attr: c.attr(),
                            lo: c.a,
                            hi: c.b,
                        }),
                );
            },
            &impure,
        )
    });
    Ok(Chosen {
        strategy,
        est_access_cost,
        est_bloom_cost,
        est_cells_cost,
        cells,
    })
}

/// Cuts the records `start..end` of one posting list into runs of equal point probes (a list
/// too short to pay for runs is one plain run).
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
        let mut point = Code::op_of(head) == OP_ROWS;
        while j < end && recs[j as usize].probe[0].head == head {
            let p = recs[j as usize].probe[0];
            point &= p.a == p.b;
            j += 1;
        }
        runs.push(Run {
            attr: Code::attr_of(head),
            start: i,
            end: j,
            point,
        });
        i = j;
    }
}
