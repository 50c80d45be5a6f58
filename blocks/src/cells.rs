//! Negative cell bitsets: the match strategy for shards whose objects satisfy a large share of
//! all predicates (wide numeric ranges), where Bloom filters saturate and an access predicate
//! would visit half the shard.
//!
//! In the spirit of Rein and HEM, it marks what *fails* rather than what holds. Each numeric
//! attribute's rows are cut into `C` cells (equi-depth over the predicates' interval ends).
//! For every cell there are two bitsets over the shard's conjunctions: `fail` (the conjunction
//! has a row interval on this attribute that misses the whole cell: any value in the cell
//! fails it) and `edge` (an interval that only partly covers the cell: undecided). An object
//! ORs, per attribute, the bitsets of the cell its value falls in (or the `absent` bitset).
//! Conjunctions with no `fail` bit match, certainly if no `edge` bit is set and every one of
//! their predicates is a row interval, otherwise after exact verification. Bitsets are laid out
//! block by block (4096 conjunctions) so a batch of objects streams each block from cache.

/// Conjunctions per block (64 words per bitset slice).
pub const BLOCK: usize = 4096;
const WORDS: usize = BLOCK / 64;

/// The cell index of one shard.
#[derive(Debug, Clone, Default)]
pub struct CellIndex {
    n: usize,
    cells: usize,
    /// Numeric attributes covered, and their cell boundaries (`cells + 1` rows each).
    attrs: Vec<u32>,
    bounds: Vec<Vec<u32>>,
    /// Position of an attribute in `attrs`, per attribute id.
    slot: Vec<u32>,
    /// Per block: for each covered attribute, `cells` fail slices, `cells` edge slices, then
    /// one absent slice; then one slice of conjunctions that need verification regardless.
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

const NO_SLOT: u32 = u32::MAX;

/// `dst |= src` over one slice; fixed length so it compiles to wide vector ORs.
#[inline(always)]
fn or_words(dst: &mut [u64; WORDS], src: &[u64; WORDS]) {
    for i in 0..WORDS {
        dst[i] |= src[i];
    }
}

impl CellIndex {
    /// Builds the index for `n` conjunctions. `preds(i)` lists conjunction `i`'s row
    /// intervals; `impure[i]` says it has other predicates too. `max_rows[a]` is attribute
    /// `a`'s highest row.
    pub fn build(
        n: usize,
        cells: usize,
        max_rows: &[u32],
        preds: impl Fn(usize) -> Vec<RowPred>,
        impure: &[bool],
    ) -> CellIndex {
        let cells = cells.max(1);
        // which attributes appear, and the interval ends per attribute
        let mut ends: Vec<Vec<u32>> = vec![Vec::new(); max_rows.len()];
        let mut present = vec![false; max_rows.len()];
        for i in 0..n {
            for p in preds(i) {
                present[p.attr as usize] = true;
                if p.lo <= p.hi {
                    ends[p.attr as usize].push(p.lo);
                    ends[p.attr as usize].push(p.hi + 1);
                }
            }
        }
        let mut slot = vec![NO_SLOT; max_rows.len()];
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
        let per_attr = 2 * cells + 1;
        let block_words = (attrs.len() * per_attr + 1) * WORDS;
        let blocks = n.div_ceil(BLOCK);
        let mut data = vec![0u64; blocks * block_words];
        for (i, &imp) in impure.iter().enumerate().take(n) {
            let base = (i / BLOCK) * block_words;
            let (w, bit) = ((i % BLOCK) / 64, 1u64 << (i % 64));
            if imp {
                data[base + attrs.len() * per_attr * WORDS + w] |= bit;
            }
            for p in preds(i) {
                let s = slot[p.attr as usize] as usize;
                let b = &bounds[s];
                let attr_base = base + s * per_attr * WORDS;
                data[attr_base + 2 * cells * WORDS + w] |= bit; // absent: fails
                for k in 0..b.len() - 1 {
                    let (c0, c1) = (b[k], b[k + 1] - 1);
                    let slice = if p.lo > p.hi || p.hi < c0 || p.lo > c1 {
                        k // fail
                    } else if p.lo <= c0 && p.hi >= c1 {
                        continue; // fully covered: holds for every value in the cell
                    } else {
                        cells + k // edge
                    };
                    data[attr_base + slice * WORDS + w] |= bit;
                }
            }
        }
        CellIndex {
            n,
            cells,
            attrs,
            bounds,
            slot,
            data,
            block_words,
        }
    }

    /// Heap bytes used.
    pub fn heap_bytes(&self) -> usize {
        8 * self.data.len()
            + self.bounds.iter().map(|b| 4 * b.len()).sum::<usize>()
            + 4 * self.slot.len()
    }

    /// Number of covered attributes.
    pub fn attributes(&self) -> usize {
        self.attrs.len()
    }

    /// The slice index per covered attribute for an object: a cell, or `2 * cells` (absent)
    /// when the attribute has no numeric row (`row` > max row).
    pub fn cells_of(&self, rows: impl Fn(u32) -> u32, out: &mut Vec<u16>) {
        out.clear();
        for (s, &a) in self.attrs.iter().enumerate() {
            let r = rows(a);
            let b = &self.bounds[s];
            let top = *b.last().unwrap_or(&0);
            if r >= top {
                out.push((2 * self.cells) as u16);
            } else {
                out.push((b.partition_point(|&x| x <= r) - 1) as u16);
            }
        }
    }

    /// Scans every block for a batch of objects (`cells[o]` from [`CellIndex::cells_of`]),
    /// calling `f(object, conjunction, certain)` for each conjunction that may match.
    pub fn scan(&self, cells: &[Vec<u16>], mut f: impl FnMut(usize, u32, bool)) {
        let na = self.attrs.len();
        let per_attr = 2 * self.cells + 1;
        let edge_off = self.cells;
        let mut fail = [0u64; WORDS];
        for (bi, block) in self.data.chunks(self.block_words).enumerate() {
            let verify_always = &block[na * per_attr * WORDS..(na * per_attr + 1) * WORDS];
            let first = bi * BLOCK;
            let len = (self.n - first).min(BLOCK);
            for (o, oc) in cells.iter().enumerate() {
                fail.iter_mut().for_each(|x| *x = 0);
                for (s, &c) in oc.iter().enumerate() {
                    let base = s * per_attr * WORDS + c as usize * WORDS;
                    if let Ok(slice) = <&[u64; WORDS]>::try_from(&block[base..base + WORDS]) {
                        or_words(&mut fail, slice);
                    }
                }
                // few conjunctions survive: fetch the edge words only where some did
                for w in 0..len.div_ceil(64) {
                    let mut live = !fail[w];
                    if w == len / 64 && !len.is_multiple_of(64) {
                        live &= (1u64 << (len % 64)) - 1;
                    }
                    if live == 0 {
                        continue;
                    }
                    let mut edge = verify_always[w];
                    for (s, &c) in oc.iter().enumerate() {
                        let c = c as usize;
                        if c < self.cells {
                            edge |= block[s * per_attr * WORDS + (edge_off + c) * WORDS + w];
                        }
                    }
                    while live != 0 {
                        let b = live.trailing_zeros();
                        live &= live - 1;
                        let certain = edge >> b & 1 == 0;
                        f(o, (first + w * 64 + b as usize) as u32, certain);
                    }
                }
            }
        }
    }
}
