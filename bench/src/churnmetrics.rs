//! The delivery measures of the churn experiment, as seed 004 defines them, over one
//! publication and its confirmed targets: the subscribers known subscribed when it was
//! published. A target is *stable* when it stayed subscribed through the whole delivery
//! window; the others left during it.
//!
//! - stable delivery ratio: stable targets reached / stable targets;
//! - initial delivery ratio: confirmed targets reached (a leaver's early success counts) /
//!   confirmed targets;
//! - coverage: stable targets / confirmed targets;
//! - duplicates per reached pair: copies beyond the first, per stable target reached.
//!
//! Over many publications the counts are summed before dividing. Pure arithmetic, so the
//! seed's worked example is a unit test.

use serde::Serialize;

/// One (publication, confirmed target) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    /// The target stayed subscribed until the window closed.
    pub stayed: bool,
    /// It was shown the publication within the window.
    pub received: bool,
    /// How often it was shown it (0 when not received).
    pub copies: u32,
}

/// The summed counts of many pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub confirmed: u64,
    pub stable: u64,
    pub stable_reached: u64,
    pub reached: u64,
    pub extra_copies: u64,
}

/// The measures of [`Counts`] (`None` where the denominator is 0: N/A).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Measures {
    pub stable_delivery_ratio: Option<f64>,
    pub initial_delivery_ratio: Option<f64>,
    pub coverage: Option<f64>,
    pub duplicates_per_pair: Option<f64>,
}

impl Counts {
    /// Adds one pair.
    pub fn add(&mut self, p: Pair) {
        self.confirmed += 1;
        self.reached += u64::from(p.received);
        if p.stayed {
            self.stable += 1;
            if p.received {
                self.stable_reached += 1;
                self.extra_copies += u64::from(p.copies.saturating_sub(1));
            }
        }
    }

    /// The seed's measures.
    pub fn measures(&self) -> Measures {
        let ratio = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
        Measures {
            stable_delivery_ratio: ratio(self.stable_reached, self.stable),
            initial_delivery_ratio: ratio(self.reached, self.confirmed),
            coverage: ratio(self.stable, self.confirmed),
            duplicates_per_pair: ratio(self.extra_copies, self.stable_reached),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_worked_example() {
        // 10 confirmed targets; 2 leave, one of them after it had received; 7 of the 8
        // stable ones succeed
        let mut c = Counts::default();
        let pair = |stayed, received| Pair {
            stayed,
            received,
            copies: u32::from(received),
        };
        c.add(pair(false, true));
        c.add(pair(false, false));
        for i in 0..8 {
            c.add(pair(true, i < 7));
        }
        let m = c.measures();
        assert_eq!(m.stable_delivery_ratio, Some(7.0 / 8.0));
        assert_eq!(m.initial_delivery_ratio, Some(8.0 / 10.0));
        assert_eq!(m.coverage, Some(0.8));
        assert_eq!(m.duplicates_per_pair, Some(0.0));
    }

    #[test]
    fn duplicates_count_per_stable_reached_pair_and_empty_is_not_applicable() {
        let mut c = Counts::default();
        assert_eq!(c.measures().coverage, None);
        c.add(Pair {
            stayed: true,
            received: true,
            copies: 3,
        });
        c.add(Pair {
            stayed: true,
            received: true,
            copies: 1,
        });
        // a leaver's copies do not count
        c.add(Pair {
            stayed: false,
            received: true,
            copies: 5,
        });
        assert_eq!(c.measures().duplicates_per_pair, Some(1.0));
    }
}
