//! An object's test results as the match loops check them ([`EvalCtx`]): the row of each
//! numeric attribute, the test flags that hold, and the exact check of a record's codes.

use super::*;

/// One object's test results, saved between the phases of a batch.
#[derive(Debug, Clone, Default)]
pub(super) struct Loaded {
    pub(super) rows: Vec<(u32, u32)>,
    pub(super) flags: Vec<(u32, u64)>,
    pub(super) values: Vec<(u32, u32)>,
}

/// Per-thread scratch holding one object's test results: its row per attribute (or absent /
/// non-numeric) and the set of string and set tests it satisfies. Reused across objects.
#[derive(Debug, Clone, Default)]
pub struct EvalCtx {
    pub(super) rows: Vec<u32>,
    /// The value index per attribute ([`AttrBlock::values`]; [`NO_VALUE`] when absent, not
    /// a string, or named by no code).
    pub(super) values: Vec<u32>,
    pub(super) touched: Vec<u32>,
    pub(super) flags: Vec<u64>,
    pub(super) flag_words: Vec<u32>,
    pub(super) filter: Vec<u64>,
    pub(super) scratch: Vec<u32>,
    /// Satisfied predicate ids of one attribute test ([`Base::test_attribute_with`]).
    pub(super) ids: Vec<u32>,
}

impl EvalCtx {
    pub(super) fn fit(&mut self, attrs: usize, flags: usize) {
        if self.rows.len() < attrs {
            self.rows.resize(attrs, NO_ROW);
            self.values.resize(attrs, NO_VALUE);
        }
        let words = flags.div_ceil(64);
        if self.flags.len() < words {
            self.flags.resize(words, 0);
        }
    }

    #[inline]
    pub(super) fn set_flag(&mut self, f: u32) {
        let w = (f / 64) as usize;
        if self.flags[w] == 0 {
            self.flag_words.push(w as u32);
        }
        self.flags[w] |= 1u64 << (f % 64);
    }

    #[inline]
    pub(super) fn flag(&self, f: u32) -> bool {
        self.flags[(f / 64) as usize] >> (f % 64) & 1 == 1
    }

    pub(super) fn reset(&mut self) {
        for &a in &self.touched {
            self.rows[a as usize] = NO_ROW;
            self.values[a as usize] = NO_VALUE;
        }
        self.touched.clear();
        for &w in &self.flag_words {
            self.flags[w as usize] = 0;
        }
        self.flag_words.clear();
    }

    /// The loaded test results, compact, to restore later without running the tests again.
    pub(super) fn snapshot(&self) -> Loaded {
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
            values: self
                .touched
                .iter()
                .filter(|&&a| self.values[a as usize] != NO_VALUE)
                .map(|&a| (a, self.values[a as usize]))
                .collect(),
        }
    }

    /// Restores a snapshot into a reset context.
    pub(super) fn restore(&mut self, l: &Loaded) {
        for &(a, r) in &l.rows {
            self.rows[a as usize] = r;
            self.touched.push(a);
        }
        for &(w, v) in &l.flags {
            self.flags[w as usize] = v;
            self.flag_words.push(w);
        }
        for &(a, v) in &l.values {
            self.values[a as usize] = v;
        }
    }

    /// Whether the object satisfies `c` (`lists`: the shard's value lists).
    #[inline]
    pub(super) fn check(&self, c: Code, lists: &[u32]) -> bool {
        let r = self.rows[c.attr() as usize];
        match c.op() {
            OP_ROWS => r >= c.a && r <= c.b,
            OP_NOT_ROWS => r != NO_ROW && !(r >= c.a && r <= c.b),
            OP_FLAG => self.flag(c.a),
            OP_NOT_FLAG => r != NO_ROW && !self.flag(c.a),
            OP_EXISTS => r != NO_ROW,
            OP_NOT_EXISTS => r == NO_ROW,
            OP_TRUE => true,
            OP_VALUE_LIST => {
                let v = self.values[c.attr() as usize];
                let set = lists
                    .get(c.a as usize..(c.a as usize).saturating_add(c.b as usize))
                    .unwrap_or_default();
                if set.len() <= 8 {
                    set.contains(&v)
                } else {
                    set.binary_search(&v).is_ok()
                }
            }
            op => {
                let v = self.values[c.attr() as usize];
                let mask = u64::from(c.b) << 32 | u64::from(c.a);
                v >> 6 == op.wrapping_sub(OP_VALUES) && mask >> (v & 63) & 1 == 1
            }
        }
    }

    #[inline]
    pub(super) fn check_all(&self, codes: &[Code], lists: &[u32]) -> bool {
        codes.iter().all(|&c| self.check(c, lists))
    }

    /// Checks many scattered conjunctions: all their code ranges are fetched first and every
    /// code is evaluated without early exit, so the loads of different conjunctions overlap
    /// instead of waiting on each other behind a mispredicted branch.
    pub(super) fn verify_scattered(
        &self,
        base: &Base,
        recs: &[u32],
        mut pass: impl FnMut(u32, bool),
    ) {
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
                    .fold(true, |acc, &c| acc & self.check(c, &base.value_lists));
            }
            for (&r, &o) in chunk.iter().zip(&ok) {
                pass(r, o);
            }
        }
    }
}
