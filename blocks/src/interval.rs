//! Stabbing queries over integer intervals: "which intervals contain row r?".
//!
//! Numeric predicates become intervals of rows in their attribute's sorted constant table
//! (see `numeric`). Intervals open at the bottom are kept sorted by their upper end (the
//! satisfied ones are a suffix), those open at the top by their lower end (a prefix), and
//! bounded ones in width classes sorted by their lower end, so a query touches little more
//! than the intervals it reports. Used for the numeric test block's exact predicate ids and for
//! the match block's access index.

/// Intervals `[a, b]` over rows `0..=max_row`, each with a `u32` payload.
#[derive(Debug, Clone, Default)]
pub struct IntervalIndex {
    max_row: u32,
    low_b: Vec<u32>,
    low_p: Vec<u32>,
    high_a: Vec<u32>,
    high_p: Vec<u32>,
    classes: Vec<WidthClass>,
}

#[derive(Debug, Clone, Default)]
struct WidthClass {
    max_width: u32,
    a: Vec<u32>,
    b: Vec<u32>,
    p: Vec<u32>,
    dir: Directory,
}

/// A coarse lookup table over a sorted array: bucket `x >> shift` gives the slice where the
/// lower bound of `x` lies, so a query binary-searches a few dozen entries instead of all.
#[derive(Debug, Clone, Default)]
struct Directory {
    shift: u32,
    starts: Vec<u32>,
}

impl Directory {
    fn build(sorted: &[u32]) -> Directory {
        let Some(&max) = sorted.last() else {
            return Directory::default();
        };
        let target_buckets = (sorted.len() / 16).max(1) as u64;
        let mut shift = 0;
        while ((max as u64) >> shift) + 1 > target_buckets {
            shift += 1;
        }
        let buckets = ((max >> shift) + 1) as usize;
        let mut starts = Vec::with_capacity(buckets + 1);
        let mut i = 0;
        for j in 0..=buckets as u64 {
            let bound = j << shift;
            while i < sorted.len() && (sorted[i] as u64) < bound {
                i += 1;
            }
            starts.push(i as u32);
        }
        Directory { shift, starts }
    }

    /// First index with `sorted[i] >= x`.
    #[inline]
    fn lower_bound(&self, sorted: &[u32], x: u32) -> usize {
        let j = (x >> self.shift) as usize;
        if j + 1 >= self.starts.len() {
            return sorted.len();
        }
        let (s, e) = (self.starts[j] as usize, self.starts[j + 1] as usize);
        s + sorted[s..e].partition_point(|&v| v < x)
    }

    fn heap_bytes(&self) -> usize {
        4 * self.starts.len()
    }
}

impl IntervalIndex {
    /// Builds the index; empty intervals (`a > b`) are dropped.
    pub fn build(max_row: u32, mut items: Vec<(u32, u32, u32)>) -> IntervalIndex {
        items.retain(|&(a, b, _)| a <= b);
        let mut idx = IntervalIndex {
            max_row,
            ..IntervalIndex::default()
        };
        let mut low: Vec<(u32, u32)> = Vec::new();
        let mut high: Vec<(u32, u32)> = Vec::new();
        let mut by_class: Vec<Vec<(u32, u32, u32)>> = Vec::new();
        for (a, b, p) in items {
            if a == 0 {
                low.push((b, p));
            } else if b >= max_row {
                high.push((a, p));
            } else {
                let w = b - a;
                let class = (32 - w.leading_zeros()) as usize;
                if by_class.len() <= class {
                    by_class.resize(class + 1, Vec::new());
                }
                by_class[class].push((a, b, p));
            }
        }
        low.sort_unstable();
        high.sort_unstable();
        idx.low_b = low.iter().map(|x| x.0).collect();
        idx.low_p = low.iter().map(|x| x.1).collect();
        idx.high_a = high.iter().map(|x| x.0).collect();
        idx.high_p = high.iter().map(|x| x.1).collect();
        for mut items in by_class.into_iter().filter(|c| !c.is_empty()) {
            items.sort_unstable();
            let max_width = items.iter().map(|&(a, b, _)| b - a).max().unwrap_or(0);
            let a: Vec<u32> = items.iter().map(|x| x.0).collect();
            idx.classes.push(WidthClass {
                max_width,
                dir: Directory::build(&a),
                a,
                b: items.iter().map(|x| x.1).collect(),
                p: items.iter().map(|x| x.2).collect(),
            });
        }
        idx
    }

    /// Number of intervals held.
    pub fn len(&self) -> usize {
        self.low_p.len() + self.high_p.len() + self.classes.iter().map(|c| c.p.len()).sum::<usize>()
    }

    /// Whether the index holds no interval.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` with the payload of every interval containing `row`.
    #[inline]
    pub fn query(&self, row: u32, mut f: impl FnMut(u32)) {
        let start = self.low_b.partition_point(|&b| b < row);
        for &p in &self.low_p[start..] {
            f(p);
        }
        let end = self.high_a.partition_point(|&a| a <= row);
        for &p in &self.high_p[..end] {
            f(p);
        }
        for c in &self.classes {
            let lo = row.saturating_sub(c.max_width);
            let mut i = c.dir.lower_bound(&c.a, lo);
            while i < c.a.len() && c.a[i] <= row {
                if c.b[i] >= row {
                    f(c.p[i]);
                }
                i += 1;
            }
        }
    }

    /// Every interval as `(a, b, payload)`.
    pub fn entries(&self) -> Vec<(u32, u32, u32)> {
        let mut out = Vec::with_capacity(self.len());
        out.extend(self.low_b.iter().zip(&self.low_p).map(|(&b, &p)| (0, b, p)));
        out.extend(
            self.high_a
                .iter()
                .zip(&self.high_p)
                .map(|(&a, &p)| (a, self.max_row, p)),
        );
        for c in &self.classes {
            out.extend(
                c.a.iter()
                    .zip(&c.b)
                    .zip(&c.p)
                    .map(|((&a, &b), &p)| (a, b, p)),
            );
        }
        out
    }

    /// Every payload, in storage order (the order queries visit them).
    pub fn payloads_mut(&mut self) -> impl Iterator<Item = &mut u32> {
        self.low_p
            .iter_mut()
            .chain(self.high_p.iter_mut())
            .chain(self.classes.iter_mut().flat_map(|c| c.p.iter_mut()))
    }

    /// Heap bytes used.
    pub fn heap_bytes(&self) -> usize {
        4 * (2 * self.low_p.len() + 2 * self.high_p.len())
            + self
                .classes
                .iter()
                .map(|c| 12 * c.p.len() + c.dir.heap_bytes())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_brute_force() {
        let max_row = 100;
        let mut items = Vec::new();
        let mut seed = 7u64;
        for p in 0..500 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let a = ((seed >> 33) % 101) as u32;
            let b = ((seed >> 17) % 101) as u32;
            let (a, b) = match p % 4 {
                0 => (0, b),
                1 => (a, max_row),
                _ => (a, b),
            };
            items.push((a, b, p));
        }
        let idx = IntervalIndex::build(max_row, items.clone());
        for row in 0..=max_row {
            let mut got = Vec::new();
            idx.query(row, |p| got.push(p));
            got.sort_unstable();
            let want: Vec<u32> = items
                .iter()
                .filter(|&&(a, b, _)| a <= row && row <= b)
                .map(|x| x.2)
                .collect();
            assert_eq!(got, want, "row {row}");
        }
    }
}
