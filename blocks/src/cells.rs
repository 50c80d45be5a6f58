//! Negative cell bitsets: the match strategy for shards whose objects satisfy a large share of
//! all predicates (wide numeric ranges), where Bloom filters saturate and an access predicate
//! would visit half the shard.
//!
//! In the spirit of Rein and HEM, it marks what *fails* rather than what holds. Each numeric
//! attribute's rows are cut into `C` cells (equi-depth over the predicates' interval ends).
//! For every cell there is one `fail` bitset over the shard's conjunctions: the conjunction
//! has a row interval on this attribute that misses the whole cell, so any value in the cell
//! fails it. An object ORs, per attribute, the bitset of the cell its value falls in (or the
//! `absent` bitset: the conjunction tests the attribute). Conjunctions with no bit set are the
//! survivors; the caller verifies them exactly while their block is still in cache.
//!
//! Bitsets are laid out block by block (2048 conjunctions: about 170 KiB at 32 cells and 20
//! attributes), and a batch of objects passes over one block before the next, so every slice
//! an object ORs comes from the core's own cache. The OR runs eight words at a time in registers, compiled for
//! AVX-512 or AVX2 when the CPU has them (detected at run time), plain otherwise.

/// Conjunctions per block (32 words per bitset slice).
pub const BLOCK: usize = 2048;
const WORDS: usize = BLOCK / 64;

/// The cell index of one shard.
#[derive(Debug, Clone, Default)]
pub struct CellIndex {
    n: usize,
    cells: usize,
    /// Numeric attributes covered, and their cell boundaries (at most `cells + 1` rows each).
    attrs: Vec<u32>,
    bounds: Vec<Vec<u32>>,
    /// Per block: for each covered attribute, `cells` fail slices then one absent slice; then
    /// one slice of the conjunctions that have predicates other than row intervals.
    data: Vec<u64>,
    block_words: usize,
}

/// A conjunction's row interval on one attribute.
#[derive(Debug, Clone, Copy)]
pub struct RowPred {
    pub attr: u32,
    pub lo: u32,
    pub hi: u32,
}

/// Interval ends sampled per attribute to place the cell boundaries.
const BOUND_SAMPLES: usize = 1 << 16;

impl CellIndex {
    /// Builds the index for `n` conjunctions. `preds(i, out)` fills `out` with conjunction
    /// `i`'s row intervals; `impure[i]` says it has other predicates too. `max_rows[a]` is
    /// attribute `a`'s highest row.
    pub fn build(
        n: usize,
        cells: usize,
        max_rows: &[u32],
        preds: impl Fn(usize, &mut Vec<RowPred>),
        impure: &[bool],
    ) -> CellIndex {
        let cells = cells.clamp(1, u16::MAX as usize - 1);
        let mut buf = Vec::new();
        // which attributes appear; the interval ends of a sample of conjunctions per attribute
        let mut ends: Vec<Vec<u32>> = vec![Vec::new(); max_rows.len()];
        let mut present = vec![false; max_rows.len()];
        let stride = (n / BOUND_SAMPLES).max(1);
        for i in 0..n {
            preds(i, &mut buf);
            for p in &buf {
                present[p.attr as usize] = true;
                if i % stride == 0 && p.lo <= p.hi {
                    ends[p.attr as usize].push(p.lo);
                    ends[p.attr as usize].push(p.hi + 1);
                }
            }
        }
        let mut slot = vec![u32::MAX; max_rows.len()];
        let mut attrs = Vec::new();
        let mut bounds = Vec::new();
        for (a, mut e) in ends.into_iter().enumerate() {
            if !present[a] {
                continue;
            }
            e.sort_unstable();
            let top = max_rows[a] + 1;
            let mut b = vec![0u32];
            for k in 1..cells.min(e.len().max(1)) {
                let q = e[k * e.len() / cells].min(top);
                if q > *b.last().unwrap_or(&0) {
                    b.push(q);
                }
            }
            b.push(top);
            b.dedup();
            slot[a] = attrs.len() as u32;
            attrs.push(a as u32);
            bounds.push(b);
        }
        let per_attr = cells + 1;
        let block_words = (attrs.len() * per_attr + 1) * WORDS;
        let blocks = n.div_ceil(BLOCK);
        let mut data = vec![0u64; blocks * block_words];
        for (i, &imp) in impure.iter().enumerate().take(n) {
            let base = (i / BLOCK) * block_words;
            let (w, bit) = ((i % BLOCK) / 64, 1u64 << (i % 64));
            if imp {
                data[base + attrs.len() * per_attr * WORDS + w] |= bit;
            }
            preds(i, &mut buf);
            for p in &buf {
                let s = slot[p.attr as usize] as usize;
                let b = &bounds[s];
                let attr_base = base + s * per_attr * WORDS;
                data[attr_base + cells * WORDS + w] |= bit; // absent: fails
                let (first, last) = if p.lo > p.hi {
                    (b.len(), 0) // empty: fails everywhere
                } else {
                    (cell_of(b, p.lo), cell_of(b, p.hi))
                };
                // the interval meets cells first..=last; it misses every other one
                for k in (0..b.len() - 1).filter(|&k| k < first || k > last) {
                    data[attr_base + k * WORDS + w] |= bit;
                }
            }
        }
        CellIndex {
            n,
            cells,
            attrs,
            bounds,
            data,
            block_words,
        }
    }

    /// Heap bytes used.
    pub fn heap_bytes(&self) -> usize {
        8 * self.data.len() + self.bounds.iter().map(|b| 4 * b.len()).sum::<usize>()
    }

    /// Number of covered attributes.
    pub fn attributes(&self) -> usize {
        self.attrs.len()
    }

    /// The slice index per covered attribute for an object: a cell, or `cells` (absent) when
    /// the attribute has no numeric row (`row` > max row).
    pub fn cells_of(&self, rows: impl Fn(u32) -> u32, out: &mut Vec<u16>) {
        out.clear();
        for (s, &a) in self.attrs.iter().enumerate() {
            let r = rows(a);
            let b = &self.bounds[s];
            let top = *b.last().unwrap_or(&0);
            if r >= top {
                out.push(self.cells as u16);
            } else {
                out.push(cell_of(b, r) as u16);
            }
        }
    }

    /// Scans every block for a batch of objects (`cells[o]` from [`CellIndex::cells_of`]),
    /// calling `f(survivors)` once per block with every (object, conjunction) that no cell
    /// rules out. All objects pass over one block before the next, so `f` finds the block's
    /// conjunctions warm in cache, and gets all of the block's survivors together so it can
    /// fetch their data in parallel rather than one cache miss after another.
    pub fn scan(&self, cells: &[Vec<u16>], f: impl FnMut(&[Survivor])) {
        self.scan_blocks(cells, 0..self.blocks(), f);
    }

    /// Blocks of conjunctions (of [`BLOCK`] each; the last may be shorter).
    pub fn blocks(&self) -> usize {
        self.n.div_ceil(BLOCK)
    }

    /// [`CellIndex::scan`] over the blocks `range` only: threads that split one batch by
    /// blocks each read their share of the bitsets once.
    pub fn scan_blocks(
        &self,
        cells: &[Vec<u16>],
        range: std::ops::Range<usize>,
        mut f: impl FnMut(&[Survivor]),
    ) {
        let per_attr = self.cells + 1;
        let impure_off = self.attrs.len() * per_attr * WORDS;
        // each object's slice offsets within a block
        let offs: Vec<Vec<u32>> = cells
            .iter()
            .map(|oc| {
                oc.iter()
                    .enumerate()
                    .map(|(s, &c)| ((s * per_attr + c as usize) * WORDS) as u32)
                    .collect()
            })
            .collect();
        let or = pick_or();
        let mut fail = [0u64; WORDS];
        let mut found: Vec<Survivor> = Vec::new();
        let (start, end) = (range.start.min(self.blocks()), range.end.min(self.blocks()));
        let data = &self.data[start * self.block_words..end * self.block_words];
        for (bi, block) in data.chunks(self.block_words).enumerate() {
            let bi = start + bi;
            let impure = &block[impure_off..impure_off + WORDS];
            let first = bi * BLOCK;
            let len = (self.n - first).min(BLOCK);
            let words = len.div_ceil(64);
            found.clear();
            for (o, off) in offs.iter().enumerate() {
                or(block, off, &mut fail);
                for w in 0..words {
                    let mut live = !fail[w];
                    if w == len / 64 && !len.is_multiple_of(64) {
                        live &= (1u64 << (len % 64)) - 1;
                    }
                    while live != 0 {
                        let b = live.trailing_zeros();
                        live &= live - 1;
                        found.push(Survivor {
                            object: o as u32,
                            conj: (first + w * 64 + b as usize) as u32,
                            impure: impure[w] >> b & 1 == 1,
                        });
                    }
                }
            }
            if !found.is_empty() {
                f(&found);
            }
        }
    }
}

/// Asks the CPU to start loading the cache lines of `data` (a hint: nothing is read).
#[allow(unsafe_code)]
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = std::mem::size_of_val(data);
        let p = data.as_ptr() as *const i8;
        let lines = (0..bytes).step_by(64).chain((bytes > 0).then(|| bytes - 1));
        for off in lines {
            // SAFETY: a prefetch never faults and reads nothing architecturally; the address
            // is inside `data`, and SSE is part of every x86_64 CPU.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    p.wrapping_add(off),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// A conjunction no cell ruled out for an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Survivor {
    pub object: u32,
    pub conj: u32,
    /// It has predicates the cells do not see.
    pub impure: bool,
}

/// The cell of row `r` (below the top bound).
fn cell_of(bounds: &[u32], r: u32) -> usize {
    bounds.partition_point(|&x| x <= r).saturating_sub(1)
}

/// `out = OR of the slices at offs` over one block.
type OrFn = fn(&[u64], &[u32], &mut [u64; WORDS]);

/// Eight words at a time, accumulated in registers: one AVX-512 register, two AVX2 ones.
#[inline(always)]
fn or_slices(block: &[u64], offs: &[u32], out: &mut [u64; WORDS]) {
    for (c8, dst) in out.chunks_exact_mut(8).enumerate() {
        let mut acc = [0u64; 8];
        for &off in offs {
            let at = off as usize + c8 * 8;
            if let Some(src) = block.get(at..at + 8) {
                for j in 0..8 {
                    acc[j] |= src[j];
                }
            }
        }
        dst.copy_from_slice(&acc);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn or_slices_avx512(block: &[u64], offs: &[u32], out: &mut [u64; WORDS]) {
    or_slices(block, offs, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn or_slices_avx2(block: &[u64], offs: &[u32], out: &mut [u64; WORDS]) {
    or_slices(block, offs, out)
}

/// The widest OR this CPU runs.
#[allow(unsafe_code)]
fn pick_or() -> OrFn {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return |b, o, out| {
                // SAFETY: the CPU was just found to support AVX-512F, the only requirement of
                // this function beyond its safe signature.
                unsafe { or_slices_avx512(b, o, out) }
            };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return |b, o, out| {
                // SAFETY: the CPU was just found to support AVX2.
                unsafe { or_slices_avx2(b, o, out) }
            };
        }
    }
    or_slices
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every engine variant ORs the same words as the plain one.
    #[test]
    fn the_picked_or_matches_the_plain_one() {
        let block: Vec<u64> = (0..WORDS as u64 * 5)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let w = WORDS as u32;
        let offs = [0u32, w, 3 * w, 4 * w];
        let (mut a, mut b) = ([0u64; WORDS], [0u64; WORDS]);
        or_slices(&block, &offs, &mut a);
        pick_or()(&block, &offs, &mut b);
        assert_eq!(a, b);
        let w = WORDS;
        assert_eq!(
            a[3],
            block[3] | block[w + 3] | block[3 * w + 3] | block[4 * w + 3]
        );
    }

    /// Survivors are exactly the conjunctions whose intervals meet the object's cells.
    #[test]
    fn survivors_are_the_conjunctions_no_cell_rules_out() {
        // attribute 0 rows 0..=99; conjunction i has [i, i + 10] (i < 90), 90 has an empty
        // interval, 91 tests nothing (survives everything), 92 is impure
        let n = 93;
        let preds = |i: usize, out: &mut Vec<RowPred>| {
            out.clear();
            if i < 90 {
                out.push(RowPred {
                    attr: 0,
                    lo: i as u32,
                    hi: i as u32 + 10,
                });
            } else if i == 90 {
                out.push(RowPred {
                    attr: 0,
                    lo: 5,
                    hi: 4,
                });
            }
        };
        let mut impure = vec![false; n];
        impure[92] = true;
        let idx = CellIndex::build(n, 8, &[99], preds, &impure);
        for r in [0u32, 37, 99, 200] {
            let mut c = Vec::new();
            idx.cells_of(|_| r, &mut c);
            let mut got = Vec::new();
            idx.scan(&[c], |found| {
                got.extend(found.iter().map(|s| (s.conj, s.impure)))
            });
            for i in 0..90u32 {
                let holds = r >= i && r <= i + 10;
                let survives = got.iter().any(|&(g, _)| g == i);
                // a cell never rules out a conjunction that holds
                assert!(!holds || survives, "row {r}: conjunction {i} ruled out");
            }
            assert!(
                !got.iter().any(|&(g, _)| g == 90),
                "empty interval survived"
            );
            assert!(got.contains(&(91, false)));
            assert!(got.contains(&(92, true)));
            if r == 200 {
                // absent value: every interval fails
                assert_eq!(got.len(), 2);
            }
        }
    }
}
