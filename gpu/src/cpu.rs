//! The CPU twin of the subset kernel: the same table layout, the same answer, used when no
//! GPU is available and as the reference the GPU is tested against.

use crate::GpuError;

/// Word-major 64-bit filters of `n` conjunctions, tested on the CPU.
#[derive(Debug, Clone)]
pub struct CpuSubset {
    filters: Vec<u64>,
    n: usize,
    words: usize,
}

/// Checks a word-major table's shape.
pub(crate) fn check_shape(filters: &[u64], n: usize, words: usize) -> Result<(), GpuError> {
    if words == 0 || words > 16 {
        return Err(GpuError::Shape(format!(
            "{words} words per filter (1..=16 supported)"
        )));
    }
    if filters.len() != n * words {
        return Err(GpuError::Shape(format!(
            "{} words for {n} conjunctions of {words} words",
            filters.len()
        )));
    }
    Ok(())
}

impl CpuSubset {
    /// Keeps a copy of the table.
    pub fn new(filters: &[u64], n: usize, words: usize) -> Result<CpuSubset, GpuError> {
        check_shape(filters, n, words)?;
        Ok(CpuSubset {
            filters: filters.to_vec(),
            n,
            words,
        })
    }

    /// Replaces one conjunction's filter (`words` words).
    pub fn update(&mut self, i: usize, filter: &[u64]) -> Result<(), GpuError> {
        if i >= self.n || filter.len() != self.words {
            return Err(GpuError::Shape(format!(
                "update of conjunction {i} with {} words",
                filter.len()
            )));
        }
        for (w, &v) in filter.iter().enumerate() {
            self.filters[w * self.n + i] = v;
        }
        Ok(())
    }

    /// (object, conjunction) pairs with `filter & !object == 0`, sorted.
    pub fn candidates(&self, objects: &[u64]) -> Vec<(u32, u32)> {
        let w = self.words;
        let mut out = Vec::new();
        const BLOCK: usize = 2048;
        let mut acc = vec![0u64; BLOCK];
        let n_obj = objects.len() / w;
        let mut start = 0;
        while start < self.n {
            let end = (start + BLOCK).min(self.n);
            for o in 0..n_obj {
                let obj = &objects[o * w..o * w + w];
                let acc = &mut acc[..end - start];
                acc.iter_mut().for_each(|x| *x = 0);
                for (wi, &ow) in obj.iter().enumerate() {
                    let col = &self.filters[wi * self.n + start..wi * self.n + end];
                    for (x, &s) in acc.iter_mut().zip(col) {
                        *x |= s & !ow;
                    }
                }
                out.extend(
                    acc.iter()
                        .enumerate()
                        .filter(|(_, x)| **x == 0)
                        .map(|(i, _)| (o as u32, (start + i) as u32)),
                );
            }
            start = end;
        }
        out.sort_unstable();
        out
    }
}
