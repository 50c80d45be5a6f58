//! A Prometheus histogram with fixed buckets in seconds: lock-free to observe (one atomic add
//! per observation and bucket), rendered as cumulative `_bucket{le=..}`, `_sum` and `_count`
//! series. Quantiles are the scraper's to compute (`histogram_quantile`), so they aggregate
//! across nodes, which a per-process quantile gauge never does.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets in seconds, from 0.5 ms to one minute (`+Inf` follows).
pub const BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Observations of durations.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket (not cumulative); the last one is `+Inf`.
    counts: [AtomicU64; BUCKETS.len() + 1],
    /// The sum in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Writes the series of this histogram with `labels` (`a="x",b="y"`, or empty) added to
    /// each; the `# HELP`/`# TYPE` lines are the caller's (one per family).
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = BUCKETS
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        if labels.is_empty() {
            let _ = writeln!(out, "{name}_sum {sum}");
            let _ = writeln!(out, "{name}_count {cumulative}");
        } else {
            let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
        }
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a histogram family.
pub fn header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_sum_is_in_seconds() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300)); // 0.0005
        h.observe(Duration::from_millis(3)); // 0.005
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(120)); // +Inf
        let mut out = String::new();
        header(&mut out, "x_seconds", "X.");
        h.render(&mut out, "x_seconds", "kind=\"grpc\"");
        assert!(out.contains("# TYPE x_seconds histogram"), "{out}");
        assert!(
            out.contains("x_seconds_bucket{kind=\"grpc\",le=\"0.0005\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{kind=\"grpc\",le=\"0.0025\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{kind=\"grpc\",le=\"0.005\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{kind=\"grpc\",le=\"60\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{kind=\"grpc\",le=\"+Inf\"} 4\n"),
            "{out}"
        );
        assert!(out.contains("x_seconds_count{kind=\"grpc\"} 4\n"), "{out}");
        assert!(
            out.contains("x_seconds_sum{kind=\"grpc\"} 120.0063\n"),
            "{out}"
        );
        assert_eq!(h.count(), 4);
        let mut bare = String::new();
        h.render(&mut bare, "y", "");
        assert!(bare.contains("y_bucket{le=\"+Inf\"} 4\n"), "{bare}");
        assert!(bare.contains("y_count 4\n"), "{bare}");
    }
}
