//! The JSON filter syntax: Amazon EventBridge event patterns, for everything that maps.
//!
//! Nested objects name attributes by their dotted path (`{"detail": {"temp": ...}}` constrains
//! `detail.temp`). Each leaf is an array of matchers, any one of which may match; the keys of an
//! object must all match. Supported matchers: exact strings and numbers, `null`, `true` and
//! `false`, `prefix` and `suffix` (also with `{"equals-ignore-case": ..}`), `anything-but` (a
//! value, a list of values, or `{"prefix" | "suffix" | "wildcard" | "equals-ignore-case": ..}`,
//! the last two also with a list), `numeric` (one or two comparisons), `exists`,
//! `equals-ignore-case`, `wildcard`, `cidr` (IPv4 and IPv6), and `$or` (a list of patterns).
//! Errors give the JSON path of the offending element.
//!
//! Object metadata holds numbers and strings only, so JSON's `true`, `false` and `null` are
//! the texts `"true"`, `"false"` and `"null"` there (what `dissem test-pattern` and `bench
//! match --events` make of a JSON event); the pattern matchers `true`, `false` and `null` match
//! those texts.
//!
//! As AWS does, a pattern whose object repeats a key is refused (a JSON decoder would silently
//! keep the last one). Objects and `$or` nest at most [`MAX_NESTING`] deep.

use serde_json::Value as Json;

use std::collections::HashSet;

use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};

use crate::formula::{Dnf, DnfError, Formula, MAX_NESTING};
use crate::num::Num;
use crate::predicate::{Bound, Predicate, Test};

/// Why a JSON pattern was rejected; `path` is where (e.g. `$.detail.temp[0].numeric[1]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("invalid JSON at line {line}, column {column}: {msg}")]
    Json {
        line: usize,
        column: usize,
        msg: String,
    },
    #[error("at {path}: expected {expected}, found {found}")]
    Unexpected {
        path: String,
        expected: String,
        found: String,
    },
    #[error("at {path}: patterns nest at most {MAX_NESTING} levels deep (the nesting limit)")]
    TooDeep { path: String },
    #[error("{0}")]
    Dnf(#[from] DnfError),
}

fn describe(v: &Json) -> String {
    let s = v.to_string();
    if s.len() > 40 {
        format!("{}...", &s[..s.floor_char_boundary(40)])
    } else {
        s
    }
}

fn unexpected<T>(path: &str, expected: &str, found: &Json) -> Result<T, PatternError> {
    Err(PatternError::Unexpected {
        path: path.to_string(),
        expected: expected.to_string(),
        found: describe(found),
    })
}

fn num_of(path: &str, v: &Json) -> Result<Num, PatternError> {
    match v {
        Json::Number(n) => Num::parse(&n.to_string()).map_err(|e| PatternError::Unexpected {
            path: path.to_string(),
            expected: "an exactly representable number".into(),
            found: e.to_string(),
        }),
        other => unexpected(path, "a number", other),
    }
}

fn str_of<'a>(path: &str, v: &'a Json) -> Result<&'a str, PatternError> {
    match v {
        Json::String(s) => Ok(s),
        other => unexpected(path, "a string", other),
    }
}

/// Parses an EventBridge pattern into conjunctions.
pub fn parse_pattern(input: &str) -> Result<Dnf, PatternError> {
    let json_error = |e: serde_json::Error| PatternError::Json {
        line: e.line(),
        column: e.column(),
        msg: e.to_string(),
    };
    // serde_json bounds nesting itself (128 levels) before either pass recurses far
    let mut de = serde_json::Deserializer::from_str(input);
    UniqueKeys.deserialize(&mut de).map_err(json_error)?;
    de.end().map_err(json_error)?;
    let json: Json = serde_json::from_str(input).map_err(json_error)?;
    Ok(pattern_formula(&json)?.to_dnf()?)
}

/// Parses an already-decoded pattern into a formula.
pub fn pattern_formula(json: &Json) -> Result<Formula, PatternError> {
    object(json, "", "$", 0)
}

/// A pass over the raw JSON that refuses an object repeating a key (decoding into a map keeps
/// only the last one, silently).
struct UniqueKeys;

impl<'de> DeserializeSeed<'de> for UniqueKeys {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(UniqueKeys)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(A::Error::custom(format!(
                    "duplicate key {}",
                    crate::quote::quoted(&key)
                )));
            }
            map.next_value_seed(UniqueKeys)?;
        }
        Ok(())
    }
}

fn object(json: &Json, prefix: &str, path: &str, depth: usize) -> Result<Formula, PatternError> {
    if depth >= MAX_NESTING {
        return Err(PatternError::TooDeep {
            path: crate::quote::clip(path),
        });
    }
    let Json::Object(map) = json else {
        return unexpected(path, "an object of attribute patterns", json);
    };
    if map.is_empty() {
        return unexpected(path, "at least one attribute", json);
    }
    let mut items = Vec::new();
    for (key, val) in map {
        if key == "$or" {
            let sub_path = format!("{path}.$or");
            let Json::Array(alts) = val else {
                return unexpected(&sub_path, "an array of patterns", val);
            };
            if alts.len() < 2 {
                return unexpected(&sub_path, "at least two patterns", val);
            }
            let mut ors = Vec::new();
            for (i, alt) in alts.iter().enumerate() {
                ors.push(object(alt, prefix, &format!("{sub_path}[{i}]"), depth + 1)?);
            }
            items.push(Formula::Or(ors));
            continue;
        }
        if key.is_empty() {
            return unexpected(
                path,
                "a non-empty attribute name",
                &Json::String(key.clone()),
            );
        }
        let attr = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let sub_path = format!("{path}.{key}");
        match val {
            Json::Object(_) => items.push(object(val, &attr, &sub_path, depth + 1)?),
            Json::Array(list) => items.push(leaf(&attr, list, &sub_path)?),
            other => {
                return unexpected(&sub_path, "an array of matchers or a nested object", other);
            }
        }
    }
    Ok(if items.len() == 1 {
        items.remove(0)
    } else {
        Formula::And(items)
    })
}

fn leaf(attr: &str, list: &[Json], path: &str) -> Result<Formula, PatternError> {
    if list.is_empty() {
        return unexpected(path, "at least one matcher", &Json::Array(vec![]));
    }
    let mut strs = Vec::new();
    let mut nums = Vec::new();
    let mut others = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let p = format!("{path}[{i}]");
        match m {
            Json::String(s) => strs.push(s.clone()),
            Json::Number(_) => nums.push(num_of(&p, m)?),
            Json::Object(_) => others.push(matcher(attr, m, &p)?),
            Json::Null => strs.push("null".to_string()),
            Json::Bool(b) => strs.push(b.to_string()),
            Json::Array(_) => return unexpected(&p, "a value or a matcher object", m),
        }
    }
    let mut alts: Vec<Formula> = Vec::new();
    if !strs.is_empty() {
        alts.push(Formula::Pred(Predicate::new(
            attr,
            Test::StrIn(strs),
            false,
        )));
    }
    if !nums.is_empty() {
        alts.push(Formula::Pred(Predicate::new(
            attr,
            Test::NumIn(nums),
            false,
        )));
    }
    alts.extend(others);
    Ok(if alts.len() == 1 {
        alts.remove(0)
    } else {
        Formula::Or(alts)
    })
}

fn matcher(attr: &str, m: &Json, path: &str) -> Result<Formula, PatternError> {
    let Json::Object(obj) = m else {
        return unexpected(path, "a matcher object", m);
    };
    if obj.len() != 1 {
        return unexpected(path, "exactly one matcher key", m);
    }
    let Some((key, arg)) = obj.iter().next() else {
        return unexpected(path, "exactly one matcher key", m);
    };
    let p = format!("{path}.{key}");
    let pred = |test, negated| Ok(Formula::Pred(Predicate::new(attr, test, negated)));
    match key.as_str() {
        "prefix" => match arg {
            Json::String(s) => pred(Test::Prefix(s.clone()), false),
            Json::Object(_) => pred(Test::PrefixIgnoreCase(ignore_case(arg, &p)?), false),
            other => unexpected(&p, "a string or {\"equals-ignore-case\": ..}", other),
        },
        "suffix" => match arg {
            Json::String(s) => pred(Test::Suffix(s.clone()), false),
            Json::Object(_) => pred(Test::SuffixIgnoreCase(ignore_case(arg, &p)?), false),
            other => unexpected(&p, "a string or {\"equals-ignore-case\": ..}", other),
        },
        "equals-ignore-case" => pred(Test::EqIgnoreCase(str_of(&p, arg)?.to_string()), false),
        "wildcard" => pred(wildcard(&p, arg)?, false),
        "cidr" => {
            let text = str_of(&p, arg)?;
            match crate::pattern::canonical_cidr(text) {
                Ok(c) => pred(Test::Cidr(c), false),
                Err(e) => unexpected(&p, &format!("a CIDR range ({e})"), arg),
            }
        }
        "exists" => match arg {
            Json::Bool(b) => pred(Test::Exists, !*b),
            other => unexpected(&p, "true or false", other),
        },
        "anything-but" => anything_but(attr, arg, &p),
        "numeric" => numeric(attr, arg, &p),
        _ => unexpected(
            path,
            "one of prefix, suffix, anything-but, numeric, exists, equals-ignore-case, \
             wildcard, cidr",
            &Json::String(key.clone()),
        ),
    }
}

/// The string of `{"equals-ignore-case": "..."}` (a case-insensitive prefix or suffix).
fn ignore_case(arg: &Json, path: &str) -> Result<String, PatternError> {
    match arg {
        Json::Object(obj) if obj.len() == 1 && obj.contains_key("equals-ignore-case") => {
            Ok(str_of(
                &format!("{path}.equals-ignore-case"),
                &obj["equals-ignore-case"],
            )?
            .to_string())
        }
        other => unexpected(path, "{\"equals-ignore-case\": \"...\"}", other),
    }
}

/// A wildcard test from its JSON string, checked.
fn wildcard(path: &str, arg: &Json) -> Result<Test, PatternError> {
    let text = str_of(path, arg)?;
    match crate::pattern::check_wildcard(text) {
        Ok(()) => Ok(Test::Wildcard(text.to_string())),
        Err(e) => unexpected(path, &format!("a wildcard ({e})"), arg),
    }
}

fn anything_but(attr: &str, arg: &Json, path: &str) -> Result<Formula, PatternError> {
    let neg = |test| Ok(Formula::Pred(Predicate::new(attr, test, true)));
    // `anything-but` a list of tests: none of them holds, so each negation holds
    let none_of = |tests: Vec<Test>| {
        let mut all: Vec<Formula> = tests
            .into_iter()
            .map(|t| Formula::Pred(Predicate::new(attr, t, true)))
            .collect();
        Ok(if all.len() == 1 {
            all.remove(0)
        } else {
            Formula::And(all)
        })
    };
    match arg {
        Json::String(s) => neg(Test::StrIn(vec![s.clone()])),
        Json::Number(_) => {
            let n = num_of(path, arg)?;
            neg(Test::Interval {
                lo: Bound::Incl(n),
                hi: Bound::Incl(n),
            })
        }
        Json::Array(list) if !list.is_empty() => {
            if list.iter().all(|v| v.is_string()) {
                neg(Test::StrIn(
                    list.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect(),
                ))
            } else if list.iter().all(|v| v.is_number()) {
                let mut nums = Vec::new();
                for (i, v) in list.iter().enumerate() {
                    nums.push(num_of(&format!("{path}[{i}]"), v)?);
                }
                neg(Test::NumIn(nums))
            } else {
                unexpected(path, "a list of only strings or only numbers", arg)
            }
        }
        Json::Object(obj) if obj.len() == 1 => {
            let (k, v) = obj
                .iter()
                .next()
                .map(|(k, v)| (k.as_str(), v))
                .unwrap_or(("", arg));
            let p = format!("{path}.{k}");
            match k {
                "prefix" => neg(Test::Prefix(str_of(&p, v)?.to_string())),
                "suffix" => neg(Test::Suffix(str_of(&p, v)?.to_string())),
                "equals-ignore-case" | "wildcard" => {
                    let items: Vec<(String, &Json)> = match v {
                        Json::Array(list) if !list.is_empty() => list
                            .iter()
                            .enumerate()
                            .map(|(i, x)| (format!("{p}[{i}]"), x))
                            .collect(),
                        Json::Array(_) => return unexpected(&p, "a non-empty list", v),
                        _ => vec![(p.clone(), v)],
                    };
                    let mut tests = Vec::new();
                    for (ip, x) in items {
                        tests.push(if k == "wildcard" {
                            wildcard(&ip, x)?
                        } else {
                            Test::EqIgnoreCase(str_of(&ip, x)?.to_string())
                        });
                    }
                    none_of(tests)
                }
                _ => unexpected(path, "prefix, suffix, wildcard or equals-ignore-case", arg),
            }
        }
        other => unexpected(
            path,
            "a value, a non-empty list or a prefix/suffix/wildcard/equals-ignore-case object",
            other,
        ),
    }
}

fn numeric(attr: &str, arg: &Json, path: &str) -> Result<Formula, PatternError> {
    let Json::Array(items) = arg else {
        return unexpected(path, r#"an array such as [">", 0, "<=", 5]"#, arg);
    };
    if items.len() != 2 && items.len() != 4 {
        return unexpected(path, "one or two (operator, number) pairs", arg);
    }
    let mut lo = Bound::Unbounded;
    let mut hi = Bound::Unbounded;
    let mut eq = None;
    for pair in 0..items.len() / 2 {
        let op_path = format!("{path}[{}]", pair * 2);
        let n = num_of(&format!("{path}[{}]", pair * 2 + 1), &items[pair * 2 + 1])?;
        match str_of(&op_path, &items[pair * 2])? {
            ">" if lo == Bound::Unbounded => lo = Bound::Excl(n),
            ">=" if lo == Bound::Unbounded => lo = Bound::Incl(n),
            "<" if hi == Bound::Unbounded => hi = Bound::Excl(n),
            "<=" if hi == Bound::Unbounded => hi = Bound::Incl(n),
            "=" if items.len() == 2 => eq = Some(n),
            _ => {
                return unexpected(
                    &op_path,
                    "one lower (> >=) and/or one upper (< <=) bound, or a lone =",
                    &items[pair * 2],
                );
            }
        }
    }
    let test = match eq {
        Some(n) => Test::Interval {
            lo: Bound::Incl(n),
            hi: Bound::Incl(n),
        },
        None => {
            if let (Bound::Incl(a) | Bound::Excl(a), Bound::Incl(b) | Bound::Excl(b)) = (lo, hi)
                && a > b
            {
                return unexpected(path, "a lower bound not above the upper bound", arg);
            }
            Test::Interval { lo, hi }
        }
    };
    Ok(Formula::Pred(Predicate::new(attr, test, false)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(json: &str, text: &str) {
        let dnf = parse_pattern(json).unwrap_or_else(|e| panic!("{json}: {e}"));
        assert_eq!(dnf.to_text(), text, "{json}");
    }

    fn bad(json: &str, needle: &str) {
        match parse_pattern(json) {
            Err(e) => assert!(e.to_string().contains(needle), "{json}: {e}"),
            Ok(d) => panic!("{json}: accepted as {}", d.to_text()),
        }
    }

    #[test]
    fn maps_eventbridge_patterns() {
        ok(
            r#"{"type": ["cam", "lidar"]}"#,
            r#"type in ["cam", "lidar"]"#,
        );
        ok(
            r#"{"detail": {"temp": [{"numeric": [">", 30, "<=", 40.5]}]}}"#,
            "detail.temp range (30, 40.5]",
        );
        ok(r#"{"t": [{"numeric": ["=", 3]}]}"#, "t = 3");
        ok(r#"{"s": [{"prefix": "kr/"}]}"#, r#"s prefix "kr/""#);
        ok(r#"{"s": [{"suffix": ".jpg"}]}"#, r#"s suffix ".jpg""#);
        ok(
            r#"{"s": [{"anything-but": ["a", "b"]}]}"#,
            r#"s not in ["a", "b"]"#,
        );
        ok(r#"{"s": [{"anything-but": 5}]}"#, "s != 5");
        ok(
            r#"{"s": [{"anything-but": {"prefix": "x"}}]}"#,
            r#"s not prefix "x""#,
        );
        ok(r#"{"s": [{"exists": false}]}"#, "s not exists");
        ok(
            r#"{"s": [{"equals-ignore-case": "AbC"}]}"#,
            r#"s ieq "abc""#,
        );
        ok(r#"{"n": [1, 2, 2]}"#, "n in [1, 2]");
        ok(r#"{"n": [1, "x"]}"#, r#"n = 1 || n = "x""#);
        ok(
            r#"{"a": ["x"], "$or": [{"b": [1]}, {"c": [{"exists": true}]}]}"#,
            r#"a = "x" && b = 1 || a = "x" && c exists"#,
        );
        ok(
            r#"{"n": [123456789012345678901]}"#,
            "n = 123456789012345678901",
        );
        ok(r#"{"u": [null, true]}"#, r#"u in ["null", "true"]"#);
        ok(
            r#"{"s": [{"prefix": {"equals-ignore-case": "EventB"}}]}"#,
            r#"s iprefix "eventb""#,
        );
        ok(
            r#"{"s": [{"suffix": {"equals-ignore-case": ".PNG"}}]}"#,
            r#"s isuffix ".png""#,
        );
        ok(
            r#"{"s": [{"wildcard": "dir/*.png"}]}"#,
            r#"s wildcard "dir/*.png""#,
        );
        ok(
            r#"{"ip": [{"cidr": "10.0.0.9/24"}]}"#,
            r#"ip cidr "10.0.0.0/24""#,
        );
        ok(
            r#"{"s": [{"anything-but": {"wildcard": "*/lib/*"}}]}"#,
            r#"s not wildcard "*/lib/*""#,
        );
        ok(
            r#"{"s": [{"anything-but": {"equals-ignore-case": ["A", "b"]}}]}"#,
            r#"s not ieq "a" && s not ieq "b""#,
        );
    }

    #[test]
    fn rejects_with_paths() {
        bad(r#"{"a": "x"}"#, "at $.a: expected an array of matchers");
        bad(
            r#"{"a": [{"numeric": [">", "x"]}]}"#,
            "at $.a[0].numeric[1]: expected a number",
        );
        bad(r#"{"a": [{"numeric": ["~", 1]}]}"#, "at $.a[0].numeric[0]");
        bad(r#"{"a": [{"numeric": [">", 5, "<", 1]}]}"#, "lower bound");
        bad(
            r#"{"a": [{"wildcard": "x**"}]}"#,
            "at $.a[0].wildcard: expected a wildcard",
        );
        bad(
            r#"{"a": [{"cidr": "10.0.0.0/40"}]}"#,
            "at $.a[0].cidr: expected a CIDR range (the prefix length 40 is longer",
        );
        bad(
            r#"{"a": [{"cidr": "10.0.0.0"}]}"#,
            "at $.a[0].cidr: expected a CIDR range (not of the form address/prefix-length",
        );
        bad(
            r#"{"a": [{"prefix": {"ignore": "x"}}]}"#,
            "at $.a[0].prefix: expected {\"equals-ignore-case\"",
        );
        bad(
            r#"{"a": [{"anything-but": {"wildcard": []}}]}"#,
            "at $.a[0].anything-but.wildcard: expected a non-empty list",
        );
        bad(
            r#"{"a": [{"anything-but": {"wildcard": ["ok*", "x**"]}}]}"#,
            "at $.a[0].anything-but.wildcard[1]",
        );
        bad(r#"{"a": [{"bogus": 1}]}"#, "expected one of prefix");
        bad(r#"{"a": [1.5e400]}"#, "exactly representable");
        bad(r#"{}"#, "at least one attribute");
        bad(r#"{"a": [1"#, "invalid JSON at line 1");
        bad(r#"{"$or": [{"a": [1]}]}"#, "at least two patterns");
    }
}
