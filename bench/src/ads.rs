//! The `ads` workload of `dissem bench match`: ad targeting, the shape of a real user's
//! skewed categorical workload (issue #32, the A-Tree and PS-Tree papers' setting). About 120
//! attributes, most categorical (`c0`, `c1`, ...; a few numeric, `n0`, `n1`, ...), used with
//! Zipf-skewed popularity: a handful of attributes (country, device, os, ...) appear in most
//! subscriptions and every event, the long tail rarely. Each categorical attribute has
//! `values` values, chosen with Zipf-skewed popularity too, by events and subscriptions alike.
//!
//! - A subscription has 1 to `max_preds` predicates (a geometric count with mean
//!   `mean_preds`: many short ones, a long tail of long ones), on distinct attributes drawn
//!   by popularity: a categorical predicate is membership in 1 to 5 values (`StrIn`), a
//!   numeric one a range over a fifth to a half of its domain.
//! - An event carries `event_attrs` attributes: the `core` most popular always, the rest
//!   drawn by popularity from the others.
//!
//! So an event matches hundreds of subscriptions at 20,000 (the short ones on popular values),
//! and the predicates share few distinct (attribute, value) tests: the opposite of `uniform`.

use blocks::{Bound, Conjunction, Dnf, Event, Num, Predicate, Test, Value};

use crate::workload::Rng;

/// The numeric attributes' domain: `[0, NUM_DOMAIN)`.
const NUM_DOMAIN: i64 = 1_000;

/// Shape of an `ads` workload.
#[derive(Debug, Clone, PartialEq)]
pub struct AdsSpec {
    /// Attributes in all (`numeric` of them numeric).
    pub attrs: usize,
    pub numeric: usize,
    /// Values per categorical attribute.
    pub values: usize,
    /// Zipf exponent of attribute and value popularity (0: uniform).
    pub zipf: f64,
    /// Predicates per subscription: mean and most.
    pub mean_preds: f64,
    pub max_preds: usize,
    /// Attributes per event, and how many of the most popular every event has.
    pub event_attrs: usize,
    pub core: usize,
}

impl Default for AdsSpec {
    fn default() -> AdsSpec {
        AdsSpec {
            attrs: 120,
            numeric: 8,
            values: 200,
            zipf: 1.0,
            mean_preds: 8.0,
            max_preds: 56,
            event_attrs: 20,
            core: 12,
        }
    }
}

impl AdsSpec {
    /// Checks the shape; the error names the flag.
    pub fn check(&self) -> Result<(), String> {
        if self.attrs < 2 || self.attrs > 10_000 {
            return Err(format!("--ads-attrs must be 2..=10000, got {}", self.attrs));
        }
        if self.numeric >= self.attrs {
            return Err(format!(
                "--ads-numeric must be below --ads-attrs ({}), got {}",
                self.attrs, self.numeric
            ));
        }
        if self.values == 0 || self.values > 1_000_000 {
            return Err(format!(
                "--ads-values must be 1..=1000000, got {}",
                self.values
            ));
        }
        if !(0.0..=4.0).contains(&self.zipf) {
            return Err(format!("--ads-zipf must be in [0, 4], got {}", self.zipf));
        }
        if self.max_preds == 0 || self.max_preds > self.attrs {
            return Err(format!(
                "--ads-max-preds must be 1..=--ads-attrs ({}), got {}",
                self.attrs, self.max_preds
            ));
        }
        if !(self.mean_preds >= 1.0 && self.mean_preds <= self.max_preds as f64) {
            return Err(format!(
                "--ads-mean-preds must be in [1, --ads-max-preds ({})], got {}",
                self.max_preds, self.mean_preds
            ));
        }
        if self.event_attrs == 0 || self.event_attrs > self.attrs {
            return Err(format!(
                "--ads-event-attrs must be 1..=--ads-attrs ({}), got {}",
                self.attrs, self.event_attrs
            ));
        }
        if self.core > self.event_attrs {
            return Err(format!(
                "--ads-core must be at most --ads-event-attrs ({}), got {}",
                self.event_attrs, self.core
            ));
        }
        Ok(())
    }

    /// The generator of this shape.
    pub fn generator(&self) -> Ads {
        Ads {
            attr_cdf: zipf_cdf(self.attrs, self.zipf),
            value_cdf: zipf_cdf(self.values, self.zipf),
            spec: self.clone(),
        }
    }
}

/// Cumulative Zipf weights of ranks `0..n` (rank 0 the most popular).
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|r| {
            acc += 1.0 / (r as f64).powf(s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

fn draw(cdf: &[f64], rng: &mut Rng) -> usize {
    let u = rng.unit();
    cdf.partition_point(|c| *c < u).min(cdf.len() - 1)
}

/// Attribute rank `r`'s name: the numeric ones are spread over the popularity ranks.
fn name(spec: &AdsSpec, r: usize) -> (String, bool) {
    let every = (spec.attrs / spec.numeric.max(1)).max(1);
    if spec.numeric > 0 && r % every == every - 1 && r / every < spec.numeric {
        (format!("n{}", r / every), true)
    } else {
        (format!("c{r}"), false)
    }
}

/// An `ads` generator (its Zipf tables built once).
#[derive(Debug, Clone)]
pub struct Ads {
    spec: AdsSpec,
    attr_cdf: Vec<f64>,
    value_cdf: Vec<f64>,
}

impl Ads {
    fn value(&self, rng: &mut Rng) -> String {
        format!("v{}", draw(&self.value_cdf, rng))
    }

    /// `k` distinct attribute ranks drawn by popularity (from `skip` on).
    fn attributes(&self, k: usize, skip: usize, rng: &mut Rng) -> Vec<usize> {
        let mut got: Vec<usize> = Vec::with_capacity(k);
        let free = self.spec.attrs - skip;
        let k = k.min(free);
        let mut tries = 0;
        while got.len() < k {
            let r = draw(&self.attr_cdf, rng);
            tries += 1;
            // the tail is drawn uniformly once popularity keeps repeating itself
            let r = if tries > 8 * k {
                skip + rng.below(free as u64) as usize
            } else {
                r
            };
            if r >= skip && !got.contains(&r) {
                got.push(r);
            }
        }
        got
    }

    /// One subscription.
    pub fn subscription(&self, rng: &mut Rng) -> Dnf {
        let s = &self.spec;
        // geometric on 1.. with mean `mean_preds`, capped
        let p = 1.0 / s.mean_preds;
        let u = rng.unit().max(f64::MIN_POSITIVE);
        let k = if p >= 1.0 {
            1
        } else {
            1 + (u.ln() / (1.0 - p).ln()).floor() as usize
        };
        let k = k.clamp(1, s.max_preds);
        let preds = self
            .attributes(k, 0, rng)
            .into_iter()
            .map(|r| {
                let (attr, numeric) = name(s, r);
                let test = if numeric {
                    let w = NUM_DOMAIN / 5 + rng.below((NUM_DOMAIN * 3 / 10) as u64) as i64;
                    let lo = rng.below((NUM_DOMAIN - w + 1) as u64) as i64;
                    Test::Interval {
                        lo: Bound::Incl(Num::from(lo)),
                        hi: Bound::Excl(Num::from(lo + w)),
                    }
                } else {
                    let n = 1 + rng.below(5) as usize;
                    let mut set: Vec<String> = (0..n).map(|_| self.value(rng)).collect();
                    set.sort();
                    set.dedup();
                    Test::StrIn(set)
                };
                Predicate::new(attr, test, false)
            })
            .collect();
        Dnf(vec![Conjunction::new(preds)])
    }

    /// One event.
    pub fn event(&self, rng: &mut Rng) -> Event {
        let s = &self.spec;
        let mut ranks: Vec<usize> = (0..s.core).collect();
        ranks.extend(self.attributes(s.event_attrs - s.core, s.core, rng));
        Event {
            attrs: ranks
                .into_iter()
                .map(|r| {
                    let (attr, numeric) = name(s, r);
                    let v = if numeric {
                        Value::Num(Num::from(rng.below(NUM_DOMAIN as u64) as i64))
                    } else {
                        Value::Str(self.value(rng))
                    };
                    (attr, v)
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_is_skewed_and_within_its_bounds() {
        let spec = AdsSpec::default();
        spec.check().expect("the defaults are valid");
        let g = spec.generator();
        let mut rng = Rng::new(7);
        let subs: Vec<Dnf> = (0..2_000).map(|_| g.subscription(&mut rng)).collect();
        let lens: Vec<usize> = subs.iter().map(|d| d.0[0].0.len()).collect();
        let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
        assert!((6.0..10.0).contains(&mean), "mean predicates {mean}");
        assert!(lens.iter().all(|l| (1..=56).contains(l)));
        assert!(
            lens.iter().filter(|l| **l == 1).count() > 100,
            "many short ones"
        );
        let e = g.event(&mut rng);
        assert_eq!(e.attrs.len(), 20);
        let names: std::collections::BTreeSet<_> = e.attrs.iter().map(|(a, _)| a).collect();
        assert_eq!(names.len(), 20, "distinct attributes");
        // the most popular attribute is in most subscriptions, the last in few
        let uses = |a: &str| {
            subs.iter()
                .filter(|d| d.0[0].0.iter().any(|p| p.attr == a))
                .count()
        };
        assert!(uses("c0") > 5 * uses("c100").max(1), "attribute skew");
        let bad = AdsSpec {
            core: 30,
            ..AdsSpec::default()
        };
        assert!(
            bad.check()
                .expect_err("core past event_attrs")
                .contains("--ads-core")
        );
    }
}
