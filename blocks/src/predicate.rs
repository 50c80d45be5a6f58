//! The predicate model: values, the tests one attribute can be put to, and their canonical form.
//!
//! Every operator of DESIGN §2 is a positive [`Test`] plus a `negated` flag. Semantics, used by
//! the reference matcher and the blocks alike:
//! - attribute absent: only `not exists` (negated [`Test::Exists`]) is satisfied;
//! - attribute present: satisfied iff `test(value) != negated`. A numeric test on a string value
//!   (or the reverse) is simply false, so `x != 5` holds for `x = "abc"`.
//!
//! The canonical form of a predicate is its text syntax ([`fmt::Display`]); it names the
//! predicate across subscriptions and seeds its Bloom positions.

use std::fmt;

use crate::num::Num;

/// A metadata value: a number or a string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Num(Num),
    Str(String),
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(s)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Num(Num::from(v))
    }
}

impl From<Num> for Value {
    fn from(v: Num) -> Value {
        Value::Num(v)
    }
}

/// An object's metadata as the matching core sees it: attribute name -> value, names unique.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    pub attrs: Vec<(String, Value)>,
}

impl Event {
    /// Builds an event from pairs (names are assumed unique; the ingest path validates that).
    pub fn new<I, K, V>(pairs: I) -> Event
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<Value>,
    {
        Event {
            attrs: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The value of one attribute.
    pub fn get(&self, attr: &str) -> Option<&Value> {
        self.attrs.iter().find(|(k, _)| k == attr).map(|(_, v)| v)
    }
}

/// One end of a numeric interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bound {
    Unbounded,
    Incl(Num),
    Excl(Num),
}

/// A positive test on one attribute's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Test {
    /// The value is present (any type).
    Exists,
    /// A number inside an interval: `<`, `<=`, `>`, `>=`, `=` and ranges are all intervals.
    Interval { lo: Bound, hi: Bound },
    /// A number equal to one of a sorted, deduplicated set.
    NumIn(Vec<Num>),
    /// A string equal to one of a sorted, deduplicated set (one element: plain `=`).
    StrIn(Vec<String>),
    /// A string starting with the constant.
    Prefix(String),
    /// A string ending with the constant.
    Suffix(String),
    /// A string containing the constant.
    Contains(String),
    /// A string equal to the constant ignoring case (the constant is stored lowercased).
    EqIgnoreCase(String),
    /// A string starting with the constant ignoring case (stored lowercased).
    PrefixIgnoreCase(String),
    /// A string ending with the constant ignoring case (stored lowercased).
    SuffixIgnoreCase(String),
    /// A string matching an EventBridge wildcard (`*` any run; `\*` and `\\` escape);
    /// see [`crate::pattern`].
    Wildcard(String),
    /// A string that is an IP address inside a CIDR range, kept in canonical form
    /// (`10.0.0.0/24`); see [`crate::pattern`].
    Cidr(String),
}

/// A constraint on one attribute.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Predicate {
    pub attr: String,
    pub test: Test,
    pub negated: bool,
}

impl Test {
    /// Evaluates the positive test on a present value.
    pub fn eval(&self, v: &Value) -> bool {
        match (self, v) {
            (Test::Exists, _) => true,
            (Test::Interval { lo, hi }, Value::Num(x)) => in_interval(*lo, *hi, *x),
            (Test::NumIn(set), Value::Num(x)) => set.binary_search(x).is_ok(),
            (Test::StrIn(set), Value::Str(s)) => set.binary_search(s).is_ok(),
            (Test::Prefix(p), Value::Str(s)) => s.starts_with(p.as_str()),
            (Test::Suffix(p), Value::Str(s)) => s.ends_with(p.as_str()),
            (Test::Contains(p), Value::Str(s)) => s.contains(p.as_str()),
            (Test::EqIgnoreCase(p), Value::Str(s)) => s.to_lowercase() == *p,
            (Test::PrefixIgnoreCase(p), Value::Str(s)) => s.to_lowercase().starts_with(p.as_str()),
            (Test::SuffixIgnoreCase(p), Value::Str(s)) => s.to_lowercase().ends_with(p.as_str()),
            (Test::Wildcard(p), Value::Str(s)) => crate::pattern::wildcard_matches(p, s),
            (Test::Cidr(c), Value::Str(s)) => crate::pattern::cidr_matches(c, s),
            _ => false,
        }
    }

    /// A test of one string constant: the text syntax's word for it, and the constant.
    pub fn word_constant(&self) -> Option<(&'static str, &str)> {
        Some(match self {
            Test::Prefix(s) => ("prefix", s),
            Test::Suffix(s) => ("suffix", s),
            Test::Contains(s) => ("contains", s),
            Test::EqIgnoreCase(s) => ("ieq", s),
            Test::PrefixIgnoreCase(s) => ("iprefix", s),
            Test::SuffixIgnoreCase(s) => ("isuffix", s),
            Test::Wildcard(s) => ("wildcard", s),
            Test::Cidr(s) => ("cidr", s),
            Test::Exists | Test::Interval { .. } | Test::NumIn(_) | Test::StrIn(_) => return None,
        })
    }

    /// Whether the test applies to numbers (true) or strings (false); `Exists` to both.
    pub fn is_numeric(&self) -> bool {
        matches!(self, Test::Interval { .. } | Test::NumIn(_))
    }
}

/// Whether `x` lies inside the interval `(lo, hi)` with the given bounds.
pub fn in_interval(lo: Bound, hi: Bound, x: Num) -> bool {
    let lo_ok = match lo {
        Bound::Unbounded => true,
        Bound::Incl(c) => x >= c,
        Bound::Excl(c) => x > c,
    };
    let hi_ok = match hi {
        Bound::Unbounded => true,
        Bound::Incl(c) => x <= c,
        Bound::Excl(c) => x < c,
    };
    lo_ok && hi_ok
}

impl Predicate {
    /// A predicate from its parts; sets are normalised (sorted, deduplicated).
    pub fn new(attr: impl Into<String>, test: Test, negated: bool) -> Predicate {
        let test = match test {
            Test::NumIn(mut v) => {
                v.sort();
                v.dedup();
                if v.len() == 1 {
                    Test::Interval {
                        lo: Bound::Incl(v[0]),
                        hi: Bound::Incl(v[0]),
                    }
                } else {
                    Test::NumIn(v)
                }
            }
            Test::StrIn(mut v) => {
                v.sort();
                v.dedup();
                Test::StrIn(v)
            }
            Test::EqIgnoreCase(s) => Test::EqIgnoreCase(s.to_lowercase()),
            Test::PrefixIgnoreCase(s) => Test::PrefixIgnoreCase(s.to_lowercase()),
            Test::SuffixIgnoreCase(s) => Test::SuffixIgnoreCase(s.to_lowercase()),
            Test::Cidr(s) => Test::Cidr(crate::pattern::canonical_cidr(&s).unwrap_or(s)),
            t => t,
        };
        Predicate {
            attr: attr.into(),
            test,
            negated,
        }
    }

    /// Evaluates the predicate against an object (the reference semantics).
    pub fn eval(&self, value: Option<&Value>) -> bool {
        match value {
            None => self.negated && self.test == Test::Exists,
            Some(v) => self.test.eval(v) != self.negated,
        }
    }

    /// The canonical form: the text syntax, which the text parser reads back.
    pub fn canonical(&self) -> String {
        self.to_string()
    }

    /// Rough probability that a random object satisfies this predicate, from its shape only.
    /// Used to order checks; the blocks refine it with the constants they see.
    pub fn shape_selectivity(&self) -> f64 {
        let base = match &self.test {
            Test::Exists => 0.9,
            Test::Interval { lo, hi } => match (lo, hi) {
                (Bound::Incl(a), Bound::Incl(b)) if a == b => 0.01,
                (Bound::Unbounded, _) | (_, Bound::Unbounded) => 0.5,
                _ => 0.2,
            },
            Test::NumIn(v) => (0.01 * v.len() as f64).min(0.5),
            Test::StrIn(v) => (0.01 * v.len() as f64).min(0.5),
            Test::Prefix(p) | Test::Suffix(p) => 0.5 / (1.0 + p.len() as f64),
            Test::Contains(p) => 0.5 / (1.0 + p.len() as f64),
            Test::EqIgnoreCase(_) => 0.01,
            Test::PrefixIgnoreCase(p) | Test::SuffixIgnoreCase(p) => 0.5 / (1.0 + p.len() as f64),
            Test::Wildcard(p) => 0.5 / (1.0 + p.len() as f64),
            Test::Cidr(_) => 0.1,
        };
        if self.negated { 1.0 - base } else { base }
    }
}

fn write_str_lit(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    // JSON string escaping is a strict subset of what the text parser accepts.
    f.write_str(&serde_json::Value::String(s.to_string()).to_string())
}

fn is_plain_ident(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    !crate::text::is_keyword(s)
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':'))
}

impl fmt::Display for Predicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if is_plain_ident(&self.attr) {
            f.write_str(&self.attr)?;
        } else {
            write_str_lit(f, &self.attr)?;
        }
        let neg = self.negated;
        match &self.test {
            Test::Exists => f.write_str(if neg { " not exists" } else { " exists" }),
            Test::Interval { lo, hi } => {
                let op = |pos: &str, negop: &str| {
                    if neg {
                        negop.to_string()
                    } else {
                        pos.to_string()
                    }
                };
                match (lo, hi) {
                    (Bound::Incl(a), Bound::Incl(b)) if a == b => {
                        write!(f, " {} {a}", op("=", "!="))
                    }
                    (Bound::Unbounded, Bound::Excl(b)) if !neg => write!(f, " < {b}"),
                    (Bound::Unbounded, Bound::Incl(b)) if !neg => write!(f, " <= {b}"),
                    (Bound::Excl(a), Bound::Unbounded) if !neg => write!(f, " > {a}"),
                    (Bound::Incl(a), Bound::Unbounded) if !neg => write!(f, " >= {a}"),
                    _ => {
                        f.write_str(if neg { " not range " } else { " range " })?;
                        match lo {
                            Bound::Unbounded => f.write_str("(*")?,
                            Bound::Incl(a) => write!(f, "[{a}")?,
                            Bound::Excl(a) => write!(f, "({a}")?,
                        }
                        f.write_str(", ")?;
                        match hi {
                            Bound::Unbounded => f.write_str("*)"),
                            Bound::Incl(b) => write!(f, "{b}]"),
                            Bound::Excl(b) => write!(f, "{b})"),
                        }
                    }
                }
            }
            Test::NumIn(set) => {
                if set.len() == 1 {
                    return write!(f, " {} {}", if neg { "!=" } else { "=" }, set[0]);
                }
                f.write_str(if neg { " not in [" } else { " in [" })?;
                for (i, n) in set.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{n}")?;
                }
                f.write_str("]")
            }
            Test::StrIn(set) => {
                if set.len() == 1 {
                    f.write_str(if neg { " != " } else { " = " })?;
                    return write_str_lit(f, &set[0]);
                }
                f.write_str(if neg { " not in [" } else { " in [" })?;
                for (i, s) in set.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write_str_lit(f, s)?;
                }
                f.write_str("]")
            }
            other => {
                let (word, s) = other.word_constant().unwrap_or(("ieq", ""));
                write!(f, " {}{word} ", if neg { "not " } else { "" })?;
                write_str_lit(f, s)
            }
        }
    }
}
