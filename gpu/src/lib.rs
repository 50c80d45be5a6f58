//! The final Bloom subset match of a shard on the GPU (wgpu, WGSL), and its CPU twin.
//!
//! Filter tables and object batches in, candidate (object, conjunction) pairs out: this crate
//! knows nothing of gRPC, sled, subscriptions or the coordinator. The filters of every
//! conjunction stay resident in GPU memory, split into chunks that each fit one storage
//! binding (so 10,000,000 conjunctions work); a batch of object filters is tested against all
//! of them in one dispatch per chunk. Candidates go back to the caller for exact verification
//! (in `blocks`), so GPU and CPU give identical final results.
//!
//! Calls that wait for the GPU block the calling thread; async callers run them on
//! `spawn_blocking` or a dedicated thread. [`SubsetMatcher`] falls back to the CPU path, logging
//! once, when there is no adapter or the device is lost.

mod cpu;
mod device;

pub use cpu::CpuSubset;
pub use device::{GpuInfo, GpuMatcher, GpuOptions, GpuTimings};

/// What went wrong on the GPU path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    #[error("could not open the GPU device: {0}")]
    Device(String),
    #[error("the GPU device was lost or failed: {0}")]
    Lost(String),
    #[error("filter table shape: {0}")]
    Shape(String),
}

/// The subset matcher a match block uses: the GPU when it works, the CPU otherwise.
#[derive(Debug)]
pub enum SubsetMatcher {
    Gpu(Box<GpuMatcher>),
    Cpu(CpuSubset),
}

impl SubsetMatcher {
    /// Uses the GPU if an adapter opens and accepts the table, else the CPU (logged once).
    pub fn new(
        filters: &[u64],
        n: usize,
        words: usize,
        opts: GpuOptions,
    ) -> Result<SubsetMatcher, GpuError> {
        match GpuMatcher::new(filters, n, words, opts) {
            Ok(g) => Ok(SubsetMatcher::Gpu(Box::new(g))),
            Err(GpuError::Shape(e)) => Err(GpuError::Shape(e)),
            Err(e) => {
                tracing::warn!("GPU path unavailable, matching on the CPU: {e}");
                Ok(SubsetMatcher::Cpu(CpuSubset::new(filters, n, words)?))
            }
        }
    }

    /// Whether the GPU is in use.
    pub fn on_gpu(&self) -> bool {
        matches!(self, SubsetMatcher::Gpu(_))
    }

    /// Candidates for each batch, in order: `out[b]` holds (object, conjunction) pairs of
    /// batch `b`, sorted. A GPU failure switches to the CPU for good (logged once) and the
    /// batch is redone there.
    pub fn candidates(&mut self, batches: &[&[u64]]) -> Vec<Vec<(u32, u32)>> {
        if let SubsetMatcher::Gpu(g) = self {
            match g.candidates(batches) {
                Ok(r) => return r,
                Err(e) => {
                    tracing::warn!("GPU failed, continuing on the CPU: {e}");
                    let cpu = g.to_cpu();
                    *self = SubsetMatcher::Cpu(cpu);
                }
            }
        }
        match self {
            SubsetMatcher::Cpu(c) => batches.iter().map(|b| c.candidates(b)).collect(),
            SubsetMatcher::Gpu(_) => Vec::new(),
        }
    }
}
