//! A small seeded random generator (SplitMix64) for everything that must replay from a
//! seed: the benchmarks' workloads and fault schedules, and the simulations' schedules.

/// The first seed of a simulation's schedules: `DISSEM_SIM_SEED` when set (a failure names
/// the seed that replays it), else `default`.
pub fn sim_seed(default: u64) -> u64 {
    std::env::var("DISSEM_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// SplitMix64: tiny, fast and reproducible across platforms and crate versions.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// `k` distinct values of `0..n`.
    pub fn distinct(&mut self, k: usize, n: usize) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::with_capacity(k);
        while out.len() < k.min(n) {
            let x = self.below(n as u64) as usize;
            if !out.contains(&x) {
                out.push(x);
            }
        }
        out
    }

    /// One of `v`, if it has any.
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        (!v.is_empty()).then(|| v[self.below(v.len() as u64) as usize])
    }
}
