//! `in {strings}` by value index (ARCHITECTURE: "Matching, in more detail"): the value
//! indexes of an attribute's strings, the code a set compiles to, and the string tests that
//! matching still runs once sets are checked by index.

use super::build::Compiled;
use super::*;

/// Value indexes per attribute for the strings of positive `in {strings}` predicates, the
/// most used first: sets of popular values (the most predicates, on skewed workloads) then
/// fall on the first page of 64 and compile to one [`OP_VALUES`] code each.
pub(super) fn value_indexes(
    preds: &[super::intern::Pred<'_>],
    facts: &[super::ranks::PredFacts],
    attrs: &mut [AttrBlock],
) {
    let mut uses: Vec<FastMap<&str, u32>> = vec![FastMap::default(); attrs.len()];
    for ((attr, test, negated), f) in preds.iter().zip(facts) {
        // the test is read only for string sets (the facts say which)
        if !f.str_in() || *negated {
            continue;
        }
        if let Test::StrIn(set) = test {
            for s in set {
                *uses[*attr as usize].entry(s.as_str()).or_default() += 1;
            }
        }
    }
    for (blk, u) in attrs.iter_mut().zip(uses) {
        let mut by_use: Vec<(&str, u32)> = u.into_iter().collect();
        by_use.sort_unstable_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(y.0)));
        let limit = (VALUE_PAGES * 64) as usize;
        blk.values = by_use
            .into_iter()
            .take(limit)
            .enumerate()
            .map(|(i, (s, _))| (s.to_string(), i as u32))
            .collect();
    }
}

/// The code of `attr in set` by value index, when every member has one: [`OP_VALUES`] when
/// they share a page, else [`OP_VALUE_LIST`] over their sorted indexes (appended to
/// `lists`).
pub(super) fn values_code(
    attr: u32,
    values: &FastMap<String, u32>,
    set: &[String],
    lists: &mut Vec<u32>,
) -> Option<Code> {
    let mut idx: Vec<u32> = set
        .iter()
        .map(|s| values.get(s.as_str()).copied())
        .collect::<Option<_>>()?;
    idx.sort_unstable();
    idx.dedup();
    let page = idx.first()? / 64;
    if idx.iter().all(|v| v / 64 == page) {
        let mask = idx.iter().fold(0u64, |m, v| m | 1 << (v % 64));
        return Some(Code::values(attr, page, mask));
    }
    let start = u32::try_from(lists.len()).ok()?;
    let len = idx.len() as u32;
    lists.extend(idx);
    Some(Code::new(attr, OP_VALUE_LIST, start, len))
}

/// Phase 4b: for matching, the string tests of each attribute without those only
/// [`OP_VALUES`] predicates that are no access predicate had (their codes read the value
/// index): an object on a skewed workload satisfies thousands of distinct `in` sets of a
/// popular attribute, and setting their flags was most of its matching time.
pub(super) fn code_strings(c: &mut Compiled, flag_access: &[u64]) {
    let mut needed = flag_access.to_vec();
    needed.resize((c.n_flags as usize).div_ceil(64), 0);
    for code in &c.pred_codes {
        if matches!(code.op(), OP_FLAG | OP_NOT_FLAG) {
            needed[(code.a / 64) as usize] |= 1 << (code.a % 64);
        }
    }
    let is_needed = |f: u32| needed[(f / 64) as usize] >> (f % 64) & 1 == 1;
    for (blk, tests) in c.attrs.iter_mut().zip(std::mem::take(&mut c.str_tests)) {
        if tests.iter().all(|(_, f)| is_needed(*f)) {
            continue;
        }
        let kept: Vec<(StrTest, u32)> = tests.into_iter().filter(|(_, f)| is_needed(*f)).collect();
        blk.codes_only = true;
        blk.code_strings = (!kept.is_empty()).then(|| StringBlock::build(&kept));
    }
}
