//! Synthetic workloads for the match benchmark, deterministic for a seed.
//!
//! - `uniform`, the workload of the matching literature: integer values in [0, 1,000,000);
//!   each subscription constrains `preds` distinct random attributes out of `attrs`. A `range`
//!   predicate covers `width` of the domain at a uniform random position (`[lo, lo + w)`); an
//!   `eq` predicate is equality with one of `cardinality` evenly spaced values, and events then
//!   draw every attribute from those same values. Every event gives every attribute a value.
//! - `iot`, realistic sensor metadata. Every event has ten attributes: `device` (one of 100,000
//!   ids, popularity skewed: the busiest devices publish most), `type` (one of 20 sensor
//!   types), `site` (a path `region/city/bN/fN`), `fw` (firmware `1.minor.patch`), `temp`
//!   (-20.0..50.0, one decimal), `humidity` (0..100), `battery` (0..100), `rssi` (-120..-30),
//!   `ts` (epoch seconds) and `key` (the object key `site/type/device-n.ext`). Subscriptions
//!   have 1 to 6 predicates: an anchor (device equality 50%, a building's site prefix 30%, a
//!   set of types in a building 20%) plus 0 to 4 of: reading thresholds and ranges (`temp`,
//!   `humidity`, `battery`, `rssi`, `ts`), firmware `!=`/prefix, key `contains`/suffix, a type
//!   set, and `alarm not exists`.
//! - `ads`, ad targeting with Zipf-skewed categorical attributes ([`crate::ads`]).

use blocks::{Bound, Conjunction, Dnf, Event, Num, Predicate, Test, Value};

pub use runtime::rng::Rng;

/// Shape of a `uniform` workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UniformSpec {
    pub attrs: usize,
    pub preds: usize,
    pub eq: bool,
    pub width: f64,
    pub cardinality: u64,
}

/// The value domain of `uniform`.
pub const DOMAIN: u64 = 1_000_000;

fn attr_name(i: usize) -> String {
    format!("a{i}")
}

fn pred(attr: impl Into<String>, test: Test) -> Predicate {
    Predicate::new(attr, test, false)
}

fn interval(lo: Bound, hi: Bound) -> Test {
    Test::Interval { lo, hi }
}

fn eq_num(v: i64) -> Test {
    interval(Bound::Incl(Num::from(v)), Bound::Incl(Num::from(v)))
}

impl UniformSpec {
    fn eq_value(&self, j: u64) -> i64 {
        (j * (DOMAIN / self.cardinality.max(1))) as i64
    }

    /// One subscription.
    pub fn subscription(&self, rng: &mut Rng) -> Dnf {
        let w = ((self.width * DOMAIN as f64).round() as u64).clamp(1, DOMAIN);
        let preds = rng
            .distinct(self.preds, self.attrs)
            .into_iter()
            .map(|a| {
                if self.eq {
                    pred(
                        attr_name(a),
                        eq_num(self.eq_value(rng.below(self.cardinality))),
                    )
                } else {
                    let lo = rng.below(DOMAIN - w + 1) as i64;
                    pred(
                        attr_name(a),
                        interval(
                            Bound::Incl(Num::from(lo)),
                            Bound::Excl(Num::from(lo + w as i64)),
                        ),
                    )
                }
            })
            .collect();
        Dnf(vec![Conjunction::new(preds)])
    }

    /// One event.
    pub fn event(&self, rng: &mut Rng) -> Event {
        Event {
            attrs: (0..self.attrs)
                .map(|a| {
                    let v = if self.eq {
                        self.eq_value(rng.below(self.cardinality))
                    } else {
                        rng.below(DOMAIN) as i64
                    };
                    (attr_name(a), Value::Num(Num::from(v)))
                })
                .collect(),
        }
    }
}

const TYPES: [&str; 20] = [
    "temp",
    "humidity",
    "camera",
    "lidar",
    "radar",
    "gps",
    "accel",
    "gyro",
    "pressure",
    "light",
    "sound",
    "co2",
    "pm25",
    "voc",
    "door",
    "motion",
    "water",
    "power",
    "vibration",
    "smoke",
];
const REGIONS: [&str; 5] = ["kr", "us", "jp", "de", "fr"];
const CITIES: [[&str; 4]; 5] = [
    ["seoul", "busan", "incheon", "daegu"],
    ["nyc", "sf", "austin", "seattle"],
    ["tokyo", "osaka", "nagoya", "sapporo"],
    ["berlin", "munich", "hamburg", "cologne"],
    ["paris", "lyon", "lille", "nice"],
];
const EXTS: [&str; 5] = ["jpg", "png", "json", "csv", "bin"];
const DEVICES: u64 = 100_000;

/// The `iot` workload.
#[derive(Debug, Clone, Copy, Default)]
pub struct IotSpec;

impl IotSpec {
    fn device(rng: &mut Rng) -> u64 {
        // skewed popularity: a cube of a uniform puts most mass on low ids
        let u = rng.unit();
        ((u * u * u) * DEVICES as f64) as u64
    }

    fn site(rng: &mut Rng) -> (usize, usize, u64, u64) {
        let r = rng.below(5) as usize;
        (
            r,
            rng.below(4) as usize,
            1 + rng.below(40),
            1 + rng.below(20),
        )
    }

    /// One subscription.
    pub fn subscription(&self, rng: &mut Rng) -> Dnf {
        let mut preds: Vec<Predicate> = Vec::new();
        let anchor = rng.unit();
        let (r, c, b, _) = Self::site(rng);
        let building = format!("{}/{}/b{}/", REGIONS[r], CITIES[r][c], b);
        if anchor < 0.50 {
            preds.push(pred(
                "device",
                Test::StrIn(vec![format!("dev-{:06}", Self::device(rng))]),
            ));
        } else if anchor < 0.80 {
            preds.push(pred("site", Test::Prefix(building)));
        } else {
            let n = 1 + rng.below(3) as usize;
            let set = rng
                .distinct(n, TYPES.len())
                .into_iter()
                .map(|i| TYPES[i].to_string())
                .collect();
            preds.push(pred("type", Test::StrIn(set)));
            preds.push(pred("site", Test::Prefix(building)));
        }
        let extra = rng.below(5) as usize;
        for _ in 0..extra {
            let p = match rng.below(10) {
                0 => pred(
                    "temp",
                    interval(
                        Bound::Excl(Num::from(20 + rng.below(26) as i64)),
                        Bound::Unbounded,
                    ),
                ),
                1 => {
                    let lo = -20 + rng.below(50) as i64;
                    pred(
                        "temp",
                        interval(
                            Bound::Incl(Num::from(lo)),
                            Bound::Incl(Num::from(lo + 5 + rng.below(15) as i64)),
                        ),
                    )
                }
                2 => pred(
                    "humidity",
                    interval(
                        Bound::Unbounded,
                        Bound::Excl(Num::from(10 + rng.below(30) as i64)),
                    ),
                ),
                3 => pred(
                    "battery",
                    interval(
                        Bound::Unbounded,
                        Bound::Incl(Num::from(5 + rng.below(20) as i64)),
                    ),
                ),
                4 => pred(
                    "rssi",
                    interval(
                        Bound::Unbounded,
                        Bound::Excl(Num::from(-100 + rng.below(20) as i64)),
                    ),
                ),
                5 => Predicate::new(
                    "fw",
                    Test::StrIn(vec![format!("1.{}.{}", rng.below(10), rng.below(20))]),
                    true,
                ),
                6 => pred("fw", Test::Prefix(format!("1.{}.", rng.below(10)))),
                7 => {
                    if rng.chance(0.5) {
                        pred(
                            "key",
                            Test::Contains(TYPES[rng.below(20) as usize].to_string()),
                        )
                    } else {
                        pred(
                            "key",
                            Test::Suffix(format!(".{}", EXTS[rng.below(5) as usize])),
                        )
                    }
                }
                8 => {
                    let n = 1 + rng.below(4) as usize;
                    let set = rng
                        .distinct(n, TYPES.len())
                        .into_iter()
                        .map(|i| TYPES[i].to_string())
                        .collect();
                    pred("type", Test::StrIn(set))
                }
                _ => {
                    if rng.chance(0.5) {
                        Predicate::new("alarm", Test::Exists, true)
                    } else {
                        pred(
                            "ts",
                            interval(Bound::Incl(Num::from(1_800_000_000i64)), Bound::Unbounded),
                        )
                    }
                }
            };
            preds.push(p);
        }
        Dnf(vec![Conjunction::new(preds)])
    }

    /// One event.
    pub fn event(&self, rng: &mut Rng, seq: u64) -> Event {
        let dev = Self::device(rng);
        let (r, c, b, f) = Self::site(rng);
        let site = format!("{}/{}/b{}/f{}", REGIONS[r], CITIES[r][c], b, f);
        let ty = TYPES[rng.below(20) as usize];
        let temp_tenths = -200 + rng.below(701) as i64;
        // one decimal, exactly: tenths are 10^17 units of 10^-18
        let temp = Num::from_raw(temp_tenths as i128 * 100_000_000_000_000_000);
        let key = format!(
            "{site}/{ty}/dev-{dev:06}-{seq}.{}",
            EXTS[rng.below(5) as usize]
        );
        Event {
            attrs: vec![
                ("device".into(), Value::Str(format!("dev-{dev:06}"))),
                ("type".into(), Value::Str(ty.into())),
                ("site".into(), Value::Str(site)),
                (
                    "fw".into(),
                    Value::Str(format!("1.{}.{}", rng.below(10), rng.below(20))),
                ),
                ("temp".into(), Value::Num(temp)),
                (
                    "humidity".into(),
                    Value::Num(Num::from(rng.below(101) as i64)),
                ),
                (
                    "battery".into(),
                    Value::Num(Num::from(rng.below(101) as i64)),
                ),
                (
                    "rssi".into(),
                    Value::Num(Num::from(-120 + rng.below(91) as i64)),
                ),
                (
                    "ts".into(),
                    Value::Num(Num::from(1_799_990_000 + seq as i64)),
                ),
                ("key".into(), Value::Str(key)),
            ],
        }
    }
}

/// A workload choice.
#[derive(Debug, Clone)]
pub enum Workload {
    Uniform(UniformSpec),
    Iot(IotSpec),
    Ads(crate::ads::Ads),
    /// A user's own filters and events (`--patterns FILE --events FILE`).
    Given(std::sync::Arc<crate::given::Given>),
}

impl Workload {
    /// `n` subscriptions with ids `0..n` (a given workload: its own, `n` at most).
    pub fn subscriptions(
        &self,
        seed: u64,
        n: usize,
        mut progress: impl FnMut(usize),
    ) -> Vec<(u64, Dnf)> {
        let mut rng = Rng::new(seed);
        let mut next: Box<dyn FnMut(&mut Rng) -> Dnf + '_> = match self {
            Workload::Uniform(u) => Box::new(move |r: &mut Rng| u.subscription(r)),
            Workload::Iot(t) => Box::new(move |r: &mut Rng| t.subscription(r)),
            Workload::Ads(a) => Box::new(move |r: &mut Rng| a.subscription(r)),
            Workload::Given(g) => {
                return g
                    .subscriptions
                    .iter()
                    .take(n)
                    .enumerate()
                    .map(|(i, d)| (i as u64, d.clone()))
                    .collect();
            }
        };
        (0..n)
            .map(|i| {
                if i % 65536 == 0 {
                    progress(i);
                }
                (i as u64, next(&mut rng))
            })
            .collect()
    }

    /// `n` events (a given workload: its own, repeated in order up to `n`).
    pub fn events(&self, seed: u64, n: usize) -> Vec<Event> {
        let mut rng = Rng::new(seed.wrapping_add(0x5eed));
        match self {
            Workload::Uniform(u) => (0..n).map(|_| u.event(&mut rng)).collect(),
            Workload::Iot(t) => (0..n as u64).map(|i| t.event(&mut rng, i)).collect(),
            Workload::Ads(a) => (0..n).map(|_| a.event(&mut rng)).collect(),
            Workload::Given(g) => g.events.iter().cycle().take(n).cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_shaped() {
        let w = Workload::Uniform(UniformSpec {
            attrs: 20,
            preds: 10,
            eq: false,
            width: 0.5,
            cardinality: 100,
        });
        let a = w.subscriptions(1, 50, |_| {});
        assert_eq!(a, w.subscriptions(1, 50, |_| {}));
        assert!(
            a.iter()
                .all(|(_, d)| d.0.len() == 1 && d.0[0].0.len() == 10)
        );
        let e = w.events(1, 10);
        assert!(e.iter().all(|e| e.attrs.len() == 20));
        let iot = Workload::Iot(IotSpec);
        let s = iot.subscriptions(3, 200, |_| {});
        assert!(s.iter().all(|(_, d)| (1..=6).contains(&d.0[0].0.len())));
        let ev = iot.events(3, 100);
        assert!(ev.iter().all(|e| e.attrs.len() == 10));
        assert!(
            ev.iter()
                .any(|e| matches!(e.get("temp"), Some(Value::Num(n)) if n.as_i64().is_none()))
        );
    }
}
