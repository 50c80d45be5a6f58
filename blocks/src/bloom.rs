//! Bloom encoding of predicates: `m`-bit filters with `k` positions per predicate.
//!
//! Positions come from xxh3 of the predicate's canonical form (double hashing gives `k`
//! distinct bits). At registration the [`PositionAllocator`] tries a few salts and keeps the
//! candidate whose bits are least used so far and whose bit set no other predicate already has:
//! fewer Bloom candidates to verify later. The salt chosen is part of the data image, so
//! positions are stable once assigned.

use std::collections::HashSet;

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Filter size and bits per predicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BloomConfig {
    /// Filter width `m` in bits: a multiple of 64 in 64..=1024.
    pub bits: u32,
    /// Bits set per predicate (`k`), 1..=8.
    pub k: u32,
}

impl Default for BloomConfig {
    /// 256 bits, k = 3: see ARCHITECTURE.md ("Bloom defaults") for the measurements behind it.
    fn default() -> BloomConfig {
        BloomConfig { bits: 256, k: 3 }
    }
}

/// A Bloom setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BloomConfigError {
    #[error("bloom bits must be a multiple of 64 between 64 and 1024, got {0}")]
    Bits(u32),
    #[error("bloom k must be between 1 and 8, got {0}")]
    K(u32),
}

impl BloomConfig {
    /// Checks the setting.
    pub fn validate(self) -> Result<BloomConfig, BloomConfigError> {
        if self.bits == 0 || self.bits > 1024 || !self.bits.is_multiple_of(64) {
            return Err(BloomConfigError::Bits(self.bits));
        }
        if self.k == 0 || self.k > 8 {
            return Err(BloomConfigError::K(self.k));
        }
        Ok(self)
    }

    /// Number of 64-bit words per filter.
    pub fn words(self) -> usize {
        (self.bits / 64) as usize
    }

    /// The `k` distinct bit positions of a canonical form under one salt.
    pub fn positions(self, canonical: &str, salt: u32) -> Vec<u32> {
        let h = xxh3_64_with_seed(canonical.as_bytes(), salt as u64);
        let h1 = (h & 0xffff_ffff) as u32;
        let h2 = ((h >> 32) as u32) | 1;
        let mut out: Vec<u32> = Vec::with_capacity(self.k as usize);
        let mut i = 0u32;
        while out.len() < self.k as usize {
            let p = h1.wrapping_add(i.wrapping_mul(h2)) % self.bits;
            if !out.contains(&p) {
                out.push(p);
            }
            i += 1;
            if i > 4 * self.bits {
                // degenerate stride; fall back to a linear walk (always terminates: k <= bits)
                let mut q = h1 % self.bits;
                while out.contains(&q) {
                    q = (q + 1) % self.bits;
                }
                out.push(q);
            }
        }
        out.sort_unstable();
        out
    }
}

/// Sets the given positions in a filter of `words` words.
pub fn set_positions(filter: &mut [u64], positions: &[u32]) {
    for &p in positions {
        filter[(p / 64) as usize] |= 1u64 << (p % 64);
    }
}

/// `dst |= src`, word by word.
pub fn or_into(dst: &mut [u64], src: &[u64]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d |= *s;
    }
}

/// Whether `sub` is a subset of `obj` (`sub & !obj == 0`).
pub fn is_subset(sub: &[u64], obj: &[u64]) -> bool {
    sub.iter().zip(obj).all(|(s, o)| s & !o == 0)
}

/// Salts tried per predicate by the collision-aware allocator.
pub const SALTS_TRIED: u32 = 4;

/// Chooses positions at registration, avoiding exact collisions and crowded bits.
#[derive(Debug, Clone)]
pub struct PositionAllocator {
    cfg: BloomConfig,
    usage: Vec<u32>,
    taken: HashSet<u64>,
}

impl PositionAllocator {
    /// An allocator with no predicates placed yet.
    pub fn new(cfg: BloomConfig) -> PositionAllocator {
        PositionAllocator {
            cfg,
            usage: vec![0; cfg.bits as usize],
            taken: HashSet::new(),
        }
    }

    fn signature(positions: &[u32]) -> u64 {
        positions.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &p| {
            (h ^ p as u64).wrapping_mul(0x100_0000_01b3)
        })
    }

    /// Picks a salt for a new predicate and records its bits; returns (salt, positions).
    pub fn allocate(&mut self, canonical: &str) -> (u32, Vec<u32>) {
        let mut best: Option<(u64, u32, Vec<u32>)> = None;
        for salt in 0..SALTS_TRIED {
            let pos = self.cfg.positions(canonical, salt);
            let dup = self.taken.contains(&Self::signature(&pos));
            let load: u64 = pos.iter().map(|&p| self.usage[p as usize] as u64).sum();
            let score = if dup { u64::MAX / 2 + load } else { load };
            if best.as_ref().is_none_or(|b| score < b.0) {
                best = Some((score, salt, pos));
            }
            if score == 0 {
                break;
            }
        }
        let (_, salt, pos) = best.unwrap_or_else(|| (0, 0, self.cfg.positions(canonical, 0)));
        self.record(&pos);
        (salt, pos)
    }

    /// Records positions chosen earlier (when rebuilding from an image).
    pub fn record(&mut self, positions: &[u32]) {
        for &p in positions {
            self.usage[p as usize] += 1;
        }
        self.taken.insert(Self::signature(positions));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_distinct_and_stable() {
        let cfg = BloomConfig::default();
        let a = cfg.positions("temp > 30", 0);
        assert_eq!(a.len(), 3);
        assert_eq!(a, cfg.positions("temp > 30", 0));
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        assert!(a.iter().all(|&p| p < 256));
        let tiny = BloomConfig { bits: 64, k: 8 };
        for i in 0..200 {
            let p = tiny.positions(&format!("x = {i}"), 0);
            assert_eq!(p.len(), 8);
        }
    }

    #[test]
    fn allocator_avoids_exact_collisions_when_it_can() {
        let cfg = BloomConfig { bits: 64, k: 1 };
        let mut alloc = PositionAllocator::new(cfg);
        let mut seen = HashSet::new();
        // with 64 single-bit slots, the first predicates get fresh bits far more often than
        // plain hashing would give (birthday bound: ~50% collision by 10 items)
        let mut fresh = 0;
        for i in 0..32 {
            let (_, pos) = alloc.allocate(&format!("a = {i}"));
            if seen.insert(pos[0]) {
                fresh += 1;
            }
        }
        assert!(fresh >= 28, "only {fresh} fresh bits");
    }

    #[test]
    fn validates() {
        assert!(BloomConfig { bits: 100, k: 3 }.validate().is_err());
        assert!(BloomConfig { bits: 256, k: 0 }.validate().is_err());
        assert!(BloomConfig { bits: 512, k: 4 }.validate().is_ok());
    }
}
