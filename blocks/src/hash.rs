//! A fast hasher for the hot-path hash tables (attribute names, string constants, interned
//! predicates, numeric constants): xxh3 of the key's bytes, and a folded multiply for each
//! integer field (a derived `Hash` writes a key field by field; running xxh3 on every 4-byte
//! write made interning millions of predicates several times slower). Keys come from
//! subscriptions and objects, and the tables are per shard, so HashDoS resistance buys nothing
//! here while SipHash costs several times more per lookup.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes the written bytes with xxh3 (short keys are written in one call).
#[derive(Debug, Default, Clone)]
pub struct XxHasher {
    state: u64,
}

impl Hasher for XxHasher {
    fn finish(&self) -> u64 {
        self.state
    }

    fn write(&mut self, bytes: &[u8]) {
        self.state = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.state);
    }

    fn write_u8(&mut self, i: u8) {
        self.mix(i as u64);
    }

    fn write_u16(&mut self, i: u16) {
        self.mix(i as u64);
    }

    fn write_u32(&mut self, i: u32) {
        self.mix(i as u64);
    }

    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    fn write_u128(&mut self, i: u128) {
        self.mix(i as u64);
        self.mix((i >> 64) as u64);
    }

    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
}

impl XxHasher {
    /// Folds one integer into the state: a 64 x 64 -> 128-bit multiply, halves XORed (as in
    /// wyhash and foldhash), so every input bit reaches the high and the low bits.
    #[inline]
    fn mix(&mut self, x: u64) {
        const K: u64 = 0x9e37_79b9_7f4a_7c15;
        let m =
            ((self.state ^ x) as u128).wrapping_mul((K ^ self.state.rotate_left(23)) as u128 | 1);
        self.state = (m as u64) ^ ((m >> 64) as u64);
    }
}

/// A `HashMap` using [`XxHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<XxHasher>>;

/// A hash set with [`XxHasher`].
pub type FastSet<K> = std::collections::HashSet<K, BuildHasherDefault<XxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault};

    /// Nearby integers and field orders give different hashes (no trivial collisions).
    #[test]
    fn integer_keys_spread() {
        let b = BuildHasherDefault::<XxHasher>::default();
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000u64 {
            assert!(seen.insert(b.hash_one(i)), "collision at {i}");
        }
        assert_ne!(b.hash_one((1u32, 2u32)), b.hash_one((2u32, 1u32)));
        assert_ne!(b.hash_one(0u128), b.hash_one(1u128 << 64));
        // low bits pick buckets: consecutive keys must not share them all
        let low: std::collections::HashSet<u64> =
            (0..256u64).map(|i| b.hash_one(i) & 255).collect();
        assert!(low.len() > 128, "{} distinct low bytes", low.len());
    }
}
