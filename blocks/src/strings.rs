//! The string test block: which string predicates of one attribute does a value satisfy?
//!
//! A ternary search tree holds every `prefix` constant. Walking it along the value visits, in
//! O(length + tree height), exactly the nodes whose path is a prefix of the value, each
//! carrying the `prefix` predicates of that path. Suffixes use a second tree over reversed
//! strings. The `=`/`in` constants (the paper's end-marker nodes) are kept in a hash table
//! instead: with 100,000 device ids a tree walk costs dozens of cache misses, a hash lookup one
//! or two, and the answer is the same. `contains` uses an Aho-Corasick automaton over all the
//! substrings (one pass over the value finds every one that occurs); `ieq` is a hash lookup of
//! the lowercased value, and `iprefix`/`isuffix` walk two more trees with it. Wildcards and
//! CIDR ranges (`crate::pattern`) are parsed once here and tried one by one: a block holds few
//! of them in the workloads we know, and an index over globs is left for when one holds many.
//! Results are "flags": dense ids of positive string tests, which the match block and the
//! Bloom encoding turn into predicates.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, MatchKind};

use crate::hash::FastMap;
use crate::pattern::{Cidr, Glob};

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node {
    ch: char,
    lo: u32,
    eq: u32,
    hi: u32,
    /// Range in `Tst::lists` of flags for "value starts with this path".
    prefix: (u32, u32),
}

/// A ternary search tree whose nodes carry flag lists.
#[derive(Debug, Clone, Default)]
pub struct Tst {
    nodes: Vec<Node>,
    lists: Vec<u32>,
    /// Flags of the empty prefix (every string).
    empty_prefix: Vec<u32>,
}

#[derive(Default)]
struct TstBuilder {
    nodes: Vec<Node>,
    prefix: Vec<Vec<u32>>,
    empty_prefix: Vec<u32>,
}

impl TstBuilder {
    fn new_node(&mut self, ch: char) -> u32 {
        self.nodes.push(Node {
            ch,
            lo: NONE,
            eq: NONE,
            hi: NONE,
            prefix: (0, 0),
        });
        self.prefix.push(Vec::new());
        (self.nodes.len() - 1) as u32
    }

    /// Returns the node of the last character (creating the path), or NONE for "".
    fn insert(&mut self, s: impl Iterator<Item = char>) -> u32 {
        let chars: Vec<char> = s.collect();
        if chars.is_empty() {
            return NONE;
        }
        if self.nodes.is_empty() {
            self.new_node(chars[0]);
        }
        let mut node = 0u32;
        let mut i = 0;
        loop {
            let c = chars[i];
            let (ch, lo, eq, hi) = {
                let n = &self.nodes[node as usize];
                (n.ch, n.lo, n.eq, n.hi)
            };
            if c < ch {
                if lo == NONE {
                    let nn = self.new_node(c);
                    self.nodes[node as usize].lo = nn;
                }
                node = self.nodes[node as usize].lo;
            } else if c > ch {
                if hi == NONE {
                    let nn = self.new_node(c);
                    self.nodes[node as usize].hi = nn;
                }
                node = self.nodes[node as usize].hi;
            } else {
                i += 1;
                if i == chars.len() {
                    return node;
                }
                if eq == NONE {
                    let nn = self.new_node(chars[i]);
                    self.nodes[node as usize].eq = nn;
                }
                node = self.nodes[node as usize].eq;
            }
        }
    }

    fn add_prefix(&mut self, s: impl Iterator<Item = char>, flag: u32) {
        match self.insert(s) {
            NONE => self.empty_prefix.push(flag),
            n => self.prefix[n as usize].push(flag),
        }
    }

    fn finish(mut self) -> Tst {
        let mut lists = Vec::new();
        for i in 0..self.nodes.len() {
            let p0 = lists.len() as u32;
            lists.extend_from_slice(&self.prefix[i]);
            self.nodes[i].prefix = (p0, lists.len() as u32);
        }
        Tst {
            nodes: self.nodes,
            lists,
            empty_prefix: self.empty_prefix,
        }
    }
}

impl Tst {
    /// Walks the tree along `s`, reporting the flags of every prefix of `s` in the tree.
    #[inline]
    pub fn walk(&self, s: impl Iterator<Item = char>, f: &mut impl FnMut(u32)) {
        self.empty_prefix.iter().for_each(|&x| f(x));
        let mut node = if self.nodes.is_empty() { NONE } else { 0 };
        for c in s {
            // find c among the siblings starting at `node`
            while node != NONE {
                let n = &self.nodes[node as usize];
                if c < n.ch {
                    node = n.lo;
                } else if c > n.ch {
                    node = n.hi;
                } else {
                    break;
                }
            }
            if node == NONE {
                return;
            }
            let n = &self.nodes[node as usize];
            for &x in &self.lists[n.prefix.0 as usize..n.prefix.1 as usize] {
                f(x);
            }
            node = n.eq;
        }
    }

    fn heap_bytes(&self) -> usize {
        self.nodes.len() * std::mem::size_of::<Node>() + 4 * self.lists.len()
    }

    fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.empty_prefix.is_empty()
    }
}

/// A positive string test registered in a block, with its flag id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrTest {
    /// Equal to one of these strings (`=` and `in`).
    In(Vec<String>),
    Prefix(String),
    Suffix(String),
    Contains(String),
    /// Equal ignoring case; the constant is lowercase.
    Ieq(String),
    /// Starts with, ignoring case; the constant is lowercase.
    IPrefix(String),
    /// Ends with, ignoring case; the constant is lowercase.
    ISuffix(String),
    /// An EventBridge wildcard (checked before it gets here; a malformed one never matches).
    Wildcard(String),
    /// A CIDR range in canonical form (checked before it gets here).
    Cidr(String),
}

impl StrTest {
    /// The string test of a positive predicate test (`None` for numeric tests and `exists`).
    pub fn of(t: &crate::predicate::Test) -> Option<StrTest> {
        use crate::predicate::Test;
        Some(match t {
            Test::StrIn(set) => StrTest::In(set.clone()),
            Test::Prefix(s) => StrTest::Prefix(s.clone()),
            Test::Suffix(s) => StrTest::Suffix(s.clone()),
            Test::Contains(s) => StrTest::Contains(s.clone()),
            Test::EqIgnoreCase(s) => StrTest::Ieq(s.clone()),
            Test::PrefixIgnoreCase(s) => StrTest::IPrefix(s.clone()),
            Test::SuffixIgnoreCase(s) => StrTest::ISuffix(s.clone()),
            Test::Wildcard(s) => StrTest::Wildcard(s.clone()),
            Test::Cidr(s) => StrTest::Cidr(s.clone()),
            Test::Exists | Test::Interval { .. } | Test::NumIn(_) => return None,
        })
    }
}

/// The string test block of one attribute.
#[derive(Debug, Clone, Default)]
pub struct StringBlock {
    eq: FastMap<String, Vec<u32>>,
    fwd: Tst,
    rev: Tst,
    contains: Option<(AhoCorasick, Vec<Vec<u32>>)>,
    contains_empty: Vec<u32>,
    ieq: FastMap<String, Vec<u32>>,
    ci_fwd: Tst,
    ci_rev: Tst,
    globs: Vec<(Glob, Vec<u32>)>,
    cidrs: Vec<(Cidr, Vec<u32>)>,
}

/// Adds `flag` to the entry of `key` in `list`, parsing `key` the first time it is seen
/// (`seen`: key -> index in `list`); a key that does not parse is left out (the tests were
/// checked when they were made, so only a damaged image gets here).
fn intern<'a, T, E>(
    seen: &mut HashMap<&'a str, usize>,
    list: &mut Vec<(T, Vec<u32>)>,
    key: &'a str,
    parse: impl FnOnce(&str) -> Result<T, E>,
    flag: u32,
) {
    if let Some(&i) = seen.get(key) {
        list[i].1.push(flag);
    } else if let Ok(v) = parse(key) {
        seen.insert(key, list.len());
        list.push((v, vec![flag]));
    }
}

impl StringBlock {
    /// Builds the block from (test, flag) pairs.
    pub fn build(tests: &[(StrTest, u32)]) -> StringBlock {
        let mut fwd = TstBuilder::default();
        let mut rev = TstBuilder::default();
        let mut patterns: Vec<String> = Vec::new();
        let mut pattern_ids: HashMap<String, usize> = HashMap::new();
        let mut pattern_flags: Vec<Vec<u32>> = Vec::new();
        let mut contains_empty = Vec::new();
        let mut ieq: FastMap<String, Vec<u32>> = FastMap::default();
        let mut eq: FastMap<String, Vec<u32>> = FastMap::default();
        let mut ci_fwd = TstBuilder::default();
        let mut ci_rev = TstBuilder::default();
        let mut globs: HashMap<&str, usize> = HashMap::new();
        let mut glob_list: Vec<(Glob, Vec<u32>)> = Vec::new();
        let mut cidrs: HashMap<&str, usize> = HashMap::new();
        let mut cidr_list: Vec<(Cidr, Vec<u32>)> = Vec::new();
        for (t, flag) in tests {
            let flag = *flag;
            match t {
                StrTest::In(set) => {
                    for s in set {
                        eq.entry(s.clone()).or_default().push(flag);
                    }
                }
                StrTest::Prefix(p) => fwd.add_prefix(p.chars(), flag),
                StrTest::Suffix(p) => rev.add_prefix(p.chars().rev(), flag),
                StrTest::Contains(p) if p.is_empty() => contains_empty.push(flag),
                StrTest::Contains(p) => {
                    let id = *pattern_ids.entry(p.clone()).or_insert_with(|| {
                        patterns.push(p.clone());
                        pattern_flags.push(Vec::new());
                        patterns.len() - 1
                    });
                    pattern_flags[id].push(flag);
                }
                StrTest::Ieq(p) => ieq.entry(p.clone()).or_default().push(flag),
                StrTest::IPrefix(p) => ci_fwd.add_prefix(p.chars(), flag),
                StrTest::ISuffix(p) => ci_rev.add_prefix(p.chars().rev(), flag),
                StrTest::Wildcard(p) => intern(&mut globs, &mut glob_list, p, Glob::parse, flag),
                StrTest::Cidr(c) => intern(&mut cidrs, &mut cidr_list, c, Cidr::parse, flag),
            }
        }
        let contains = if patterns.is_empty() {
            None
        } else {
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(&patterns)
                .ok()
                .map(|ac| (ac, pattern_flags))
        };
        StringBlock {
            eq,
            fwd: fwd.finish(),
            rev: rev.finish(),
            contains,
            contains_empty,
            ieq,
            ci_fwd: ci_fwd.finish(),
            ci_rev: ci_rev.finish(),
            globs: glob_list,
            cidrs: cidr_list,
        }
    }

    /// Reports the flag of every test the value satisfies (a flag may repeat).
    #[inline]
    pub fn test(&self, s: &str, mut f: impl FnMut(u32)) {
        if let Some(flags) = self.eq.get(s) {
            flags.iter().for_each(|&x| f(x));
        }
        self.fwd.walk(s.chars(), &mut f);
        self.rev.walk(s.chars().rev(), &mut f);
        self.contains_empty.iter().for_each(|&x| f(x));
        if let Some((ac, flags)) = &self.contains {
            for m in ac.find_overlapping_iter(s) {
                flags[m.pattern().as_usize()].iter().for_each(|&x| f(x));
            }
        }
        let ci_trees = !self.ci_fwd.is_empty() || !self.ci_rev.is_empty();
        if !self.ieq.is_empty() || ci_trees {
            let lower = s.to_lowercase();
            if let Some(flags) = self.ieq.get(&lower) {
                flags.iter().for_each(|&x| f(x));
            }
            if ci_trees {
                self.ci_fwd.walk(lower.chars(), &mut f);
                self.ci_rev.walk(lower.chars().rev(), &mut f);
            }
        }
        for (g, flags) in &self.globs {
            if g.matches(s) {
                flags.iter().for_each(|&x| f(x));
            }
        }
        if !self.cidrs.is_empty()
            && let Ok(addr) = s.parse::<std::net::IpAddr>()
        {
            for (c, flags) in &self.cidrs {
                if c.contains(addr) {
                    flags.iter().for_each(|&x| f(x));
                }
            }
        }
    }

    /// Heap bytes used (approximate for the automaton).
    pub fn heap_bytes(&self) -> usize {
        self.fwd.heap_bytes()
            + self.rev.heap_bytes()
            + self.ci_fwd.heap_bytes()
            + self.ci_rev.heap_bytes()
            + 64 * (self.globs.len() + self.cidrs.len())
            + self
                .contains
                .as_ref()
                .map_or(0, |(ac, _)| ac.memory_usage())
            + self
                .ieq
                .iter()
                .map(|(k, v)| k.len() + 4 * v.len() + 48)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(t: &StrTest, s: &str) -> bool {
        match t {
            StrTest::In(set) => set.iter().any(|x| x == s),
            StrTest::Prefix(p) => s.starts_with(p.as_str()),
            StrTest::Suffix(p) => s.ends_with(p.as_str()),
            StrTest::Contains(p) => s.contains(p.as_str()),
            StrTest::Ieq(p) => s.to_lowercase() == *p,
            StrTest::IPrefix(p) => s.to_lowercase().starts_with(p.as_str()),
            StrTest::ISuffix(p) => s.to_lowercase().ends_with(p.as_str()),
            StrTest::Wildcard(p) => crate::pattern::wildcard_matches(p, s),
            StrTest::Cidr(c) => crate::pattern::cidr_matches(c, s),
        }
    }

    #[test]
    fn agrees_with_direct_evaluation() {
        let words = [
            "",
            "a",
            "ab",
            "abc",
            "b",
            "ba",
            "kr/seoul/",
            "kr/",
            "é",
            "éa",
            "ＡＢ",
            "xyz",
        ];
        let mut tests = Vec::new();
        for (i, w) in words.iter().enumerate() {
            let w = w.to_string();
            tests.push(StrTest::In(vec![w.clone(), format!("{w}z")]));
            tests.push(StrTest::Prefix(w.clone()));
            tests.push(StrTest::Suffix(w.clone()));
            tests.push(StrTest::Contains(w.clone()));
            tests.push(StrTest::Ieq(w.to_lowercase()));
            tests.push(StrTest::IPrefix(w.to_lowercase()));
            tests.push(StrTest::ISuffix(w.to_lowercase()));
            tests.push(StrTest::Wildcard(format!("*{w}*")));
            tests.push(StrTest::Wildcard(format!("{w}*")));
            let _ = i;
        }
        tests.push(StrTest::Cidr("10.0.0.0/8".into()));
        tests.push(StrTest::Cidr("2001:db8::/32".into()));
        tests.push(StrTest::Cidr("10.0.0.0/8".into()));
        let pairs: Vec<(StrTest, u32)> = tests
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, t)| (t, i as u32))
            .collect();
        let block = StringBlock::build(&pairs);
        let probes = [
            "",
            "a",
            "ab",
            "abc",
            "abcd",
            "zab",
            "kr/seoul/b12",
            "kr",
            "é",
            "éa",
            "AB",
            "ＡＢ",
            "q",
            "Kr/Seoul/X",
            "ABC",
            "10.1.2.3",
            "11.0.0.1",
            "2001:db8::5",
        ];
        for p in probes {
            let mut got = Vec::new();
            block.test(p, |f| got.push(f));
            got.sort_unstable();
            got.dedup();
            let want: Vec<u32> = pairs
                .iter()
                .filter(|(t, _)| eval(t, p))
                .map(|(_, f)| *f)
                .collect();
            assert_eq!(got, want, "probe {p:?}");
        }
    }
}
