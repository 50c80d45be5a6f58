//! The numeric test block's table: one attribute's sorted constants and the rows they define.
//!
//! With sorted distinct constants `c_0 < .. < c_{n-1}`, a value falls on one of `2n + 1` rows:
//! row `2i + 1` is "exactly `c_i`", row `2i` is "strictly between `c_{i-1}` and `c_i`". One
//! binary search gives the row, and every numeric predicate (`<`, `<=`, `>`, `>=`, `=`,
//! ranges, and their negations) is a row interval, so strict and non-strict operators are exact
//! at the constants themselves. Each row carries the OR of the Bloom filters of every predicate
//! it satisfies: the paper's per-operator cumulative columns folded into one, because the
//! object's filter is their OR anyway. Constants are stored as `i32` or `i64` when all are
//! integers that fit (a quarter or half the memory, and integer compares), else as exact
//! [`Num`]s.

use crate::num::Num;
use crate::predicate::Bound;

/// Sorted distinct constants of one attribute.
#[derive(Debug, Clone)]
pub enum Constants {
    Int32(Vec<i32>),
    Int(Vec<i64>),
    Exact(Vec<Num>),
}

/// Row value meaning "no numeric value" (absent, or a string).
pub const NO_ROW: u32 = u32::MAX;

impl Constants {
    /// Builds from any constants (sorted and deduplicated here).
    pub fn new(mut all: Vec<Num>) -> Constants {
        all.sort_unstable();
        all.dedup();
        let ints: Option<Vec<i64>> = all.iter().map(|n| n.as_i64()).collect();
        if let Some(ints) = ints {
            match ints.iter().map(|&i| i32::try_from(i)).collect() {
                Ok(small) => Constants::Int32(small),
                Err(_) => Constants::Int(ints),
            }
        } else {
            Constants::Exact(all)
        }
    }

    /// Number of distinct constants.
    pub fn len(&self) -> usize {
        match self {
            Constants::Int32(v) => v.len(),
            Constants::Int(v) => v.len(),
            Constants::Exact(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The highest row (`2n`).
    pub fn max_row(&self) -> u32 {
        2 * self.len() as u32
    }

    /// The constant at an index.
    pub fn get(&self, i: usize) -> Num {
        match self {
            Constants::Int32(v) => Num::from(v[i] as i64),
            Constants::Int(v) => Num::from(v[i]),
            Constants::Exact(v) => v[i],
        }
    }

    /// (number of constants below `x`, whether `x` equals the next one).
    #[inline]
    fn locate(&self, x: Num) -> (usize, bool) {
        match self {
            Constants::Exact(v) => {
                let i = v.partition_point(|c| *c < x);
                (i, i < v.len() && v[i] == x)
            }
            Constants::Int(v) => locate_int(v, x),
            Constants::Int32(v) => locate_int(v, x),
        }
    }

    /// The row of a value.
    #[inline]
    pub fn row(&self, x: Num) -> u32 {
        let (i, eq) = self.locate(x);
        2 * i as u32 + eq as u32
    }

    /// The row interval `[a, b]` of an interval whose finite bounds are constants of this table.
    /// Returns `a > b` for an empty interval.
    pub fn rows(&self, lo: Bound, hi: Bound) -> (u32, u32) {
        let a = match lo {
            Bound::Unbounded => 0,
            Bound::Incl(c) => self.row(c),
            Bound::Excl(c) => self.row(c) + 1,
        };
        let b = match hi {
            Bound::Unbounded => self.max_row(),
            Bound::Incl(c) => self.row(c),
            Bound::Excl(c) => self.row(c).saturating_sub(1),
        };
        match hi {
            Bound::Excl(c) if self.row(c) == 0 => (1, 0),
            _ => (a, b),
        }
    }

    /// Heap bytes used.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Constants::Int32(v) => 4 * v.len(),
            Constants::Int(v) => 8 * v.len(),
            Constants::Exact(v) => 16 * v.len(),
        }
    }
}

/// `locate` over integer constants: integer compares when `x` is an integer, else the
/// constants below `x` are those not above its floor (and none equals it).
#[inline]
fn locate_int<T: Copy + Ord + TryFrom<i128>>(v: &[T], x: Num) -> (usize, bool) {
    let int = x.as_i64();
    let key = int.map_or_else(|| x.floor_int(), i128::from);
    match T::try_from(key) {
        Ok(k) if int.is_some() => {
            let i = v.partition_point(|c| *c < k);
            (i, i < v.len() && v[i] == k)
        }
        Ok(k) => (v.partition_point(|c| *c <= k), false),
        // beyond the type's range: below or above every constant
        Err(_) if key < 0 => (0, false),
        Err(_) => (v.len(), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predicate::in_interval;

    fn n(s: &str) -> Num {
        Num::parse(s).expect(s)
    }

    #[test]
    fn rows_agree_with_direct_comparison() {
        for consts in [
            vec![n("1"), n("5"), n("10")],
            vec![n("0.5"), n("1"), n("-3.25")],
            vec![n("9223372036854775807"), n("-9223372036854775808")],
            vec![n("18446744073709551615"), n("0")],
            vec![n("-7"), n("3"), n("2147483647"), n("-2147483648")],
        ] {
            let table = Constants::new(consts.clone());
            let mut probes = consts.clone();
            for c in &consts {
                probes.push(Num::from_raw(c.to_raw() - 1));
                probes.push(Num::from_raw(c.to_raw() + 1));
            }
            probes.extend([n("-1e20"), n("1e20"), n("0"), n("7.5")]);
            let bounds: Vec<Bound> = consts
                .iter()
                .flat_map(|&c| [Bound::Incl(c), Bound::Excl(c)])
                .chain([Bound::Unbounded])
                .collect();
            for &lo in &bounds {
                for &hi in &bounds {
                    let (a, b) = table.rows(lo, hi);
                    for &x in &probes {
                        let r = table.row(x);
                        assert_eq!(
                            a <= r && r <= b,
                            in_interval(lo, hi, x),
                            "{lo:?}..{hi:?} at {x} (row {r}, rows {a}..={b})"
                        );
                    }
                }
            }
        }
    }
}
