//! A fast hasher for the hot-path hash tables (attribute names, string constants): xxh3 of
//! the key's bytes. Keys come from subscriptions and objects, and the tables are per shard, so
//! HashDoS resistance buys nothing here while SipHash costs several times more per lookup.

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
}

/// A `HashMap` using [`XxHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<XxHasher>>;
