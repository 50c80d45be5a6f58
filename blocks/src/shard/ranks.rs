//! The bounds of integer ranges ranked by sorting, for the build of a shard's numeric test
//! blocks: the sorted distinct constants of an attribute and, per predicate, where its bounds
//! fall among them.

use super::*;

/// The bounds of the interval predicates of attributes whose constants are all integers
/// that fit in 32 bits (and have no `in {numbers}` test), ranked by sorting rather than one
/// hash lookup each: a million predicates' bounds on an attribute are two radix passes over
/// 8-byte keys, where the lookups were a cache miss apiece (12% of the 1M-subscription W1
/// build).
pub(super) struct RankedBounds {
    /// Per attribute, its sorted distinct constants (`None`: not ranked here).
    pub(super) table: Vec<Option<Vec<i32>>>,
    /// Per predicate, the ranks of its lower and upper bound in its attribute's table
    /// ([`NONE`]: unbounded, or not ranked here); empty when nothing was ranked.
    pub(super) index: Vec<u32>,
}

/// What the build's passes over every predicate need of its test, read at interning, where
/// the test is in cache already: reading the 10 million tests again for the ranking (twice)
/// and for the constants and string sets, scattered over the subscriptions, was a cache
/// miss each (the ranking alone 1.0 s of the 6 s W1 build).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PredFacts {
    lo: i32,
    hi: i32,
    flags: u8,
}

/// An interval whose finite bounds are integers that fit in 32 bits.
const RANKABLE: u8 = 1;
/// An interval with another bound, or an `in {numbers}` test: its attribute is not ranked.
const SPOILS: u8 = 2;
const LO_FINITE: u8 = 4;
const HI_FINITE: u8 = 8;
/// An `in {strings}` test (or `=` a string).
const STR_IN: u8 = 16;

impl PredFacts {
    pub(super) fn of(t: &Test) -> PredFacts {
        let small = |b: &Bound| match b {
            Bound::Incl(c) | Bound::Excl(c) => c.as_i64().and_then(|v| i32::try_from(v).ok()),
            Bound::Unbounded => Some(0),
        };
        match t {
            Test::Interval { lo, hi } => match (small(lo), small(hi)) {
                (Some(l), Some(h)) => {
                    let mut flags = RANKABLE;
                    if !matches!(lo, Bound::Unbounded) {
                        flags |= LO_FINITE;
                    }
                    if !matches!(hi, Bound::Unbounded) {
                        flags |= HI_FINITE;
                    }
                    PredFacts {
                        lo: l,
                        hi: h,
                        flags,
                    }
                }
                _ => PredFacts {
                    flags: SPOILS,
                    ..PredFacts::default()
                },
            },
            Test::NumIn(_) => PredFacts {
                flags: SPOILS,
                ..PredFacts::default()
            },
            Test::StrIn(_) => PredFacts {
                flags: STR_IN,
                ..PredFacts::default()
            },
            _ => PredFacts::default(),
        }
    }

    /// The test is numeric ([`Test::is_numeric`]).
    pub(super) fn numeric(self) -> bool {
        self.flags & (RANKABLE | SPOILS) != 0
    }

    /// The test is a [`Test::StrIn`].
    pub(super) fn str_in(self) -> bool {
        self.flags & STR_IN != 0
    }
}

impl RankedBounds {
    /// Ranks the bounds of `preds`, whose [`PredFacts`] are `facts` (one each).
    pub(super) fn new(
        preds: &[super::intern::Pred<'_>],
        facts: &[PredFacts],
        n_attrs: usize,
    ) -> RankedBounds {
        let mut ok = vec![true; n_attrs];
        let mut used = vec![0usize; n_attrs];
        for ((a, _, _), s) in preds.iter().zip(facts) {
            let a = *a as usize;
            if s.flags & RANKABLE != 0 {
                used[a] += 2;
            } else if s.flags & SPOILS != 0 {
                ok[a] = false;
            }
        }
        let mut table: Vec<Option<Vec<i32>>> = vec![None; n_attrs];
        if preds.len() >= (u32::MAX / 2) as usize
            || facts.len() != preds.len()
            || !(0..n_attrs).any(|a| ok[a] && used[a] > 0)
        {
            return RankedBounds {
                table,
                index: Vec::new(),
            };
        }
        // per attribute: (value biased to unsigned) << 32 | slot, slot = 2 * pred + bound
        let mut keys: Vec<Vec<u64>> = (0..n_attrs)
            .map(|a| Vec::with_capacity(if ok[a] { used[a] } else { 0 }))
            .collect();
        for (pid, ((a, _, _), s)) in preds.iter().zip(facts).enumerate() {
            let a = *a as usize;
            if !ok[a] || s.flags & RANKABLE == 0 {
                continue;
            }
            for (slot, v, finite) in [
                (2 * pid, s.lo, s.flags & LO_FINITE != 0),
                (2 * pid + 1, s.hi, s.flags & HI_FINITE != 0),
            ] {
                if finite {
                    let biased = (i64::from(v) - i64::from(i32::MIN)) as u64;
                    keys[a].push(biased << 32 | slot as u64);
                }
            }
        }
        let mut index = vec![NONE; 2 * preds.len()];
        let mut scratch = Vec::new();
        for (a, mut k) in keys.into_iter().enumerate() {
            if !ok[a] || k.is_empty() {
                continue;
            }
            radix_sort_high(&mut k, &mut scratch);
            let mut distinct: Vec<i32> = Vec::new();
            for key in k {
                let v = ((key >> 32) as i64 + i64::from(i32::MIN)) as i32;
                if distinct.last() != Some(&v) {
                    distinct.push(v);
                }
                index[(key & 0xffff_ffff) as usize] = (distinct.len() - 1) as u32;
            }
            table[a] = Some(distinct);
        }
        RankedBounds { table, index }
    }
}

/// Sorts by the high 32 bits (two passes of 16 bits; the low half, a slot, in any order).
fn radix_sort_high(keys: &mut Vec<u64>, scratch: &mut Vec<u64>) {
    scratch.clear();
    scratch.resize(keys.len(), 0);
    for shift in [32u32, 48] {
        let mut count = vec![0usize; 1 << 16];
        for &k in keys.iter() {
            count[(k >> shift & 0xffff) as usize] += 1;
        }
        let mut at = 0;
        for c in count.iter_mut() {
            let n = *c;
            *c = at;
            at += n;
        }
        for &k in keys.iter() {
            let d = (k >> shift & 0xffff) as usize;
            scratch[count[d]] = k;
            count[d] += 1;
        }
        std::mem::swap(keys, scratch);
    }
}

/// The row interval of an interval whose finite bounds are ranked (`lo.1`, `hi.1`: their
/// indexes in `table`, whose row is `2i + 1`); `a > b` when empty.
pub(super) fn ranked_rows(table: &Constants, lo: (Bound, u32), hi: (Bound, u32)) -> (u32, u32) {
    let a = match lo.0 {
        Bound::Unbounded => 0,
        Bound::Incl(_) => 2 * lo.1 + 1,
        Bound::Excl(_) => 2 * lo.1 + 2,
    };
    let b = match hi.0 {
        Bound::Unbounded => table.max_row(),
        Bound::Incl(_) => 2 * hi.1 + 1,
        Bound::Excl(_) => 2 * hi.1,
    };
    (a, b)
}
