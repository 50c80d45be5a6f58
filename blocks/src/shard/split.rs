//! One batch matched on several threads. A cell shard splits its conjunction blocks between
//! the threads, so each reads its share of the bitsets once per batch: dealing whole batches
//! out instead has every thread stream all of them, and two threads then share the memory
//! bandwidth one thread already uses up (W1 at 1M: 5,780 events/s on one thread, 9,386 on
//! two split by blocks); the batch's loading is split by events. The other strategies split
//! the batch's events.

use super::matching::CellBatch;
use super::*;

/// A split batch's blocks are dealt out in about this many runs per thread.
const SPLIT_RUNS_PER_THREAD: usize = 8;

impl Base {
    /// Matches a batch with the shard's strategy on up to `threads` threads (scoped; the
    /// calling thread alone when 1): `out[i]` receives the matching conjunction records of
    /// event `i` (unsorted; several per subscription possible).
    pub fn match_records_split(
        &self,
        events: &[Event],
        threads: usize,
        out: &mut [Vec<u32>],
    ) -> VerifyStats {
        let threads = threads.clamp(1, events.len().max(1));
        let cells = self.cells.as_ref().filter(|_| {
            self.strategy == Strategy::Cells || (!self.access_ready && !self.bloom_ready)
        });
        if let Some(cells) = cells {
            return self.split_blocks(cells, events, threads, out);
        }
        if threads == 1 {
            let mut ctx = self.new_ctx();
            return self.match_records(events, &mut ctx, out);
        }
        let per = events.len().div_ceil(threads);
        std::thread::scope(|s| {
            let parts: Vec<_> = events
                .chunks(per)
                .zip(out.chunks_mut(per))
                .map(|(evs, o)| {
                    s.spawn(move || {
                        let mut ctx = self.new_ctx();
                        self.match_records(evs, &mut ctx, o)
                    })
                })
                .collect();
            let mut stats = VerifyStats::default();
            for h in parts {
                stats += h.join().unwrap_or_default();
            }
            stats
        })
    }

    /// Loads a batch for the cell scan with its events split between `threads` threads
    /// (each event's tests are its own), the parts joined in order.
    fn load_split(&self, cells: &CellIndex, events: &[Event], threads: usize) -> CellBatch {
        let dense = self.dense_rows(events.len());
        let per = events.len().div_ceil(threads).max(1);
        let parts: Vec<CellBatch> = std::thread::scope(|s| {
            let handles: Vec<_> = events
                .chunks(per)
                .map(|evs| {
                    s.spawn(move || {
                        let mut ctx = self.new_ctx();
                        self.load_cells_with(cells, evs, &mut ctx, dense)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        let mut batch = CellBatch {
            per_event: Vec::with_capacity(events.len()),
            rows: Vec::new(),
            dense,
            loaded: Vec::with_capacity(events.len()),
        };
        for p in parts {
            batch.per_event.extend(p.per_event);
            batch.rows.extend(p.rows);
            batch.loaded.extend(p.loaded);
        }
        batch
    }

    /// The cell scan of one batch with its blocks split into `threads` ranges.
    fn split_blocks(
        &self,
        cells: &CellIndex,
        events: &[Event],
        threads: usize,
        out: &mut [Vec<u32>],
    ) -> VerifyStats {
        let mut ctx = self.new_ctx();
        let batch = if threads == 1 {
            self.load_for_cells(cells, events, &mut ctx)
        } else {
            self.load_split(cells, events, threads)
        };
        let blocks = cells.blocks();
        let threads = threads.min(blocks.max(1));
        if threads == 1 {
            return self.scan_cells(cells, &batch, 0..blocks, &mut ctx, out);
        }
        // the blocks are taken a run at a time as each thread is ready for more: blocks
        // differ in how many of their conjunctions survive, and halves fixed in advance left
        // one thread waiting on the other
        let run = blocks.div_ceil(threads * SPLIT_RUNS_PER_THREAD).max(1);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (batch, next) = (&batch, &next);
        let parts: Vec<(Vec<Vec<u32>>, VerifyStats)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(move || {
                        let mut ctx = self.new_ctx();
                        let mut found = vec![Vec::new(); events.len()];
                        let mut stats = VerifyStats::default();
                        loop {
                            let at = next.fetch_add(run, std::sync::atomic::Ordering::Relaxed);
                            if at >= blocks {
                                break;
                            }
                            let range = at..(at + run).min(blocks);
                            stats += self.scan_cells(cells, batch, range, &mut ctx, &mut found);
                        }
                        (found, stats)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let mut stats = VerifyStats::default();
        for (found, v) in parts {
            for (o, f) in out.iter_mut().zip(found) {
                o.extend(f);
            }
            stats += v;
        }
        stats
    }
}
