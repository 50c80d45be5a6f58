//! Phase 1 of building a shard: every attribute and every distinct predicate interned (ids
//! shared by all the conjunctions that use them), the subscriptions read in halves and the
//! predicates interned in parts by hash, a thread each where the machine has the cores.

use std::hash::{BuildHasher, BuildHasherDefault};

use hashbrown::HashTable;

use super::ranks::PredFacts;
use super::*;
use crate::Predicate;
use crate::hash::XxHasher;

/// One distinct predicate: (attribute, test, negated), the test borrowed from the
/// subscriptions being compiled (a copy of each of 10 million tests, 80 bytes apiece, was
/// most of the W1 build's page faults).
pub(super) type Pred<'a> = (u32, &'a Test, bool);

/// Phase 1: every attribute and every distinct predicate interned (ids shared by all the
/// conjunctions that use them), and the conjunctions as lists of predicate ids.
pub(super) struct Interned<'a> {
    pub(super) attr_ids: FastMap<String, u32>,
    pub(super) attr_names: Vec<String>,
    /// (attribute, test, negated) per predicate id.
    pub(super) preds: Vec<Pred<'a>>,
    /// What the passes over every predicate need of its test ([`PredFacts`], read at
    /// interning).
    pub(super) facts: Vec<PredFacts>,
    pub(super) conj_sub: Vec<u64>,
    /// Conjunction `c`'s predicates are `conj_preds[conj_start[c]..conj_start[c + 1]]`.
    pub(super) conj_start: Vec<u32>,
    pub(super) conj_preds: Vec<u32>,
}

/// Predicates are interned in this many parts, split by their hash, each part on a thread of
/// its own where the machine has the cores (a fixed count, so ids are the same everywhere);
/// the subscriptions are first read in as many halves.
const INTERN_PARTS: usize = 2;

/// One part of the interning: its distinct predicates, and the part-local id of each use of
/// the part's predicates, in the order of the uses.
struct Part<'a> {
    preds: Vec<Pred<'a>>,
    facts: Vec<PredFacts>,
    ids: Vec<u32>,
}

/// The buckets a part's uses are spread over by hash before they are interned, so that
/// each bucket's table stays in cache (one table of millions of predicates cost two cache
/// misses per use, the most of the W1 build's interning).
const BUCKETS: usize = 1024;

/// The mark of a use that is its predicate's first (the top bit of its distinct number).
const FIRST: u32 = 1 << 31;

/// The bucket of a hash (bits that neither [`part_of`] nor a small table's index uses).
fn bucket_of(h: u64) -> usize {
    (h >> 40) as usize % BUCKETS
}

/// The part a predicate's hash falls in (bits the table's index and tag do not use).
fn part_of(h: u64) -> usize {
    (h >> 32) as usize % INTERN_PARTS
}

/// One half of the subscriptions, read: its attributes (ids of its own, in order of first
/// use), its conjunctions, and every predicate use with its hash.
struct Half<'a> {
    attr_ids: FastMap<&'a str, u32>,
    attr_names: Vec<&'a str>,
    subs: std::collections::HashSet<u64, BuildHasherDefault<XxHasher>>,
    conj_sub: Vec<u64>,
    /// Conjunction `c`'s uses end at `conj_end[c]` (counted in this half).
    conj_end: Vec<u32>,
    uses: Vec<(u32, &'a Predicate)>,
    hashes: Vec<u64>,
    /// Each use's [`PredFacts`], read while its test is in cache for the hash.
    facts: Vec<PredFacts>,
}

/// Reads one half of the subscriptions.
fn read_half<'a>(subs: &[(u64, &'a Dnf)]) -> Result<Half<'a>, BuildError> {
    let hasher = BuildHasherDefault::<XxHasher>::default();
    let n_uses: usize = subs
        .iter()
        .map(|(_, d)| d.0.iter().map(|c| c.0.len()).sum::<usize>())
        .sum();
    let mut h = Half {
        attr_ids: FastMap::default(),
        attr_names: Vec::new(),
        subs: std::collections::HashSet::with_capacity_and_hasher(subs.len(), hasher.clone()),
        conj_sub: Vec::with_capacity(subs.len()),
        conj_end: Vec::with_capacity(subs.len()),
        uses: Vec::with_capacity(n_uses),
        hashes: Vec::with_capacity(n_uses),
        facts: Vec::with_capacity(n_uses),
    };
    for &(sub, dnf) in subs {
        if !h.subs.insert(sub) {
            return Err(BuildError::DuplicateSubscription(sub));
        }
        for conj in &dnf.0 {
            for p in &conj.0 {
                let attr = match h.attr_ids.get(p.attr.as_str()) {
                    Some(&a) => a,
                    None => {
                        let a = h.attr_names.len() as u32;
                        if a >= MAX_ATTRS {
                            return Err(BuildError::TooLarge("attributes", MAX_ATTRS as u64));
                        }
                        h.attr_ids.insert(&p.attr, a);
                        h.attr_names.push(&p.attr);
                        a
                    }
                };
                h.uses.push((attr, p));
                // by the name: the halves number attributes each their own way
                h.hashes
                    .push(hasher.hash_one((p.attr.as_str(), &p.test, p.negated)));
                h.facts.push(PredFacts::of(&p.test));
            }
            h.conj_sub.push(sub);
            h.conj_end.push(h.uses.len() as u32);
        }
    }
    Ok(h)
}

/// Interns the predicates of one part (of the uses of every half, in order): its distinct
/// predicates numbered in the order of their first use, and the id of each of its uses in
/// order. The uses are spread over [`BUCKETS`] by hash and each bucket is interned with a
/// table that stays in cache; the ids are then handed out in one pass in the order of the
/// uses, the same ids one table over the whole part gives.
fn intern_part<'a>(part: usize, room: usize, halves: &[Half<'a>]) -> Part<'a> {
    let hashes = || halves.iter().flat_map(|h| h.hashes.iter().copied());
    let mut start = vec![0u32; BUCKETS + 1];
    let mut mine = 0usize;
    for h in hashes() {
        if part_of(h) == part {
            start[bucket_of(h) + 1] += 1;
            mine += 1;
        }
    }
    for b in 0..BUCKETS {
        start[b + 1] += start[b];
    }
    // (the use's index among the part's, its index among all uses, its hash), bucket by
    // bucket: read in order below, the hash with it
    let mut spread: Vec<(u32, u32, u64)> = vec![(0, 0, 0); mine];
    let mut fill = start.clone();
    let mut k = 0u32;
    for (g, h) in hashes().enumerate() {
        if part_of(h) == part {
            let b = bucket_of(h);
            spread[fill[b] as usize] = (k, g as u32, h);
            fill[b] += 1;
            k += 1;
        }
    }
    let ends: Vec<usize> = halves
        .iter()
        .scan(0, |end, h| {
            *end += h.uses.len();
            Some(*end)
        })
        .collect();
    // the half and the index in it of use `g`
    let locate = |g: u32| -> (&Half<'a>, usize) {
        let g = g as usize;
        let half = ends.iter().position(|&e| g < e).unwrap_or(0);
        let before = if half == 0 { 0 } else { ends[half - 1] };
        (&halves[half], g - before)
    };
    let hash_at = |g: u32| {
        let (half, i) = locate(g);
        half.hashes[i]
    };
    let same = |g: u32, o: u32| {
        let (h1, i1) = locate(g);
        let (h2, i2) = locate(o);
        let ((a1, p1), (a2, p2)) = (h1.uses[i1], h2.uses[i2]);
        a1 == a2 && p1.negated == p2.negated && p1.test == p2.test
    };
    // each use's distinct predicate (numbered bucket after bucket), with [`FIRST`] when the
    // use is that predicate's first (one scattered write per use)
    let mut distinct_of: Vec<u32> = vec![0; mine];
    let mut n_distinct = 0u32;
    // (the first use of a distinct predicate, its number)
    let mut table: HashTable<(u32, u32)> = HashTable::new();
    for b in 0..BUCKETS {
        let slots = &spread[start[b] as usize..start[b + 1] as usize];
        table.clear();
        table.reserve(slots.len(), |&(o, _)| hash_at(o));
        for &(k, g, h) in slots {
            distinct_of[k as usize] = match table.find(h, |&(o, _)| same(g, o)) {
                Some(&(_, d)) => d,
                None => {
                    let d = n_distinct;
                    n_distinct += 1;
                    table.insert_unique(h, (g, d), |&(o, _)| hash_at(o));
                    d | FIRST
                }
            };
        }
    }
    drop(spread);
    // ids in the order of first use
    let mut id_of: Vec<u32> = vec![0; n_distinct as usize];
    let mut out = Part {
        preds: Vec::with_capacity(room.max(n_distinct as usize)),
        facts: Vec::with_capacity(room.max(n_distinct as usize)),
        ids: Vec::with_capacity(mine),
    };
    let mut k = 0usize;
    for (g, h) in hashes().enumerate() {
        if part_of(h) != part {
            continue;
        }
        let d = (distinct_of[k] & !FIRST) as usize;
        if distinct_of[k] & FIRST != 0 {
            id_of[d] = out.preds.len() as u32;
            let (half, i) = locate(g as u32);
            let (attr, p) = half.uses[i];
            out.preds.push((attr, &p.test, p.negated));
            out.facts.push(half.facts[i]);
        }
        out.ids.push(id_of[d]);
        k += 1;
    }
    out
}

/// Runs `f` for `0..INTERN_PARTS`, on a thread each when the machine has more than one core;
/// the answers in order.
fn on_threads<T: Send>(f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return (0..INTERN_PARTS).map(f).collect();
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..INTERN_PARTS).map(|i| s.spawn(move || f(i))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// Phase 1: interns attributes and predicates and collects the conjunctions: the
/// subscriptions read in halves, their attribute ids merged, then the distinct predicates
/// per part of their hashes, a thread each (10 million uses made this phase the longest of
/// the W1 build, 2.7 s on one thread).
pub(super) fn intern<'a, I>(subs: I) -> Result<Interned<'a>, BuildError>
where
    I: IntoIterator<Item = (u64, &'a Dnf)>,
{
    let subs: Vec<(u64, &Dnf)> = subs.into_iter().collect();
    let split = subs.len().div_ceil(INTERN_PARTS).max(1);
    let chunks: Vec<&[(u64, &Dnf)]> = subs.chunks(split).collect();
    let mut halves = Vec::with_capacity(INTERN_PARTS);
    for h in on_threads(|i| read_half(chunks.get(i).copied().unwrap_or(&[]))) {
        halves.push(h?);
    }
    let n_uses: usize = halves.iter().map(|h| h.uses.len()).sum();
    // (a part's distinct predicates are numbered below the top bit, [`FIRST`])
    if n_uses >= FIRST as usize {
        return Err(BuildError::TooLarge("predicate uses", u64::from(FIRST)));
    }
    // attribute ids in order of first use, the first half's kept; the conjunctions in order
    let mut attr_ids: FastMap<String, u32> = FastMap::default();
    let mut attr_names: Vec<String> = Vec::new();
    let mut conj_sub: Vec<u64> = Vec::with_capacity(subs.len());
    let mut conj_start: Vec<u32> = Vec::with_capacity(subs.len() + 1);
    conj_start.push(0);
    for k in 1..halves.len() {
        let (before, rest) = halves.split_at(k);
        if let Some(dup) = rest[0]
            .subs
            .iter()
            .find(|s| before.iter().any(|b| b.subs.contains(*s)))
        {
            return Err(BuildError::DuplicateSubscription(*dup));
        }
    }
    let mut base = 0u32;
    for h in halves.iter_mut() {
        let mut remap = Vec::with_capacity(h.attr_names.len());
        for name in &h.attr_names {
            let id = match attr_ids.get(*name) {
                Some(&a) => a,
                None => {
                    let a = attr_names.len() as u32;
                    if a >= MAX_ATTRS {
                        return Err(BuildError::TooLarge("attributes", MAX_ATTRS as u64));
                    }
                    attr_ids.insert(name.to_string(), a);
                    attr_names.push(name.to_string());
                    a
                }
            };
            remap.push(id);
        }
        if remap.iter().enumerate().any(|(i, &a)| i as u32 != a) {
            for u in h.uses.iter_mut() {
                u.0 = remap[u.0 as usize];
            }
        }
        conj_sub.extend_from_slice(&h.conj_sub);
        conj_start.extend(h.conj_end.iter().map(|&e| base + e));
        base += h.uses.len() as u32;
    }
    let hashes = || halves.iter().flat_map(|h| h.hashes.iter().copied());
    // room for every use in the first part (untouched room costs no memory): the others'
    // predicates go after its own where they lie
    let parts: Vec<Part<'a>> =
        on_threads(|part| intern_part(part, if part == 0 { n_uses } else { 0 }, &halves));
    // the parts' predicates one after the other; each use's id offset by its part's start
    let mut offset = Vec::with_capacity(INTERN_PARTS);
    let mut ids = Vec::with_capacity(INTERN_PARTS);
    let mut preds: Vec<Pred<'a>> = Vec::new();
    let mut facts: Vec<PredFacts> = Vec::new();
    for p in parts {
        offset.push(preds.len() as u32);
        if preds.is_empty() {
            preds = p.preds;
            facts = p.facts;
        } else {
            preds.extend_from_slice(&p.preds);
            facts.extend_from_slice(&p.facts);
        }
        ids.push(p.ids);
    }
    let mut next: Vec<std::slice::Iter<'_, u32>> = ids.iter().map(|v| v.iter()).collect();
    let conj_preds: Vec<u32> = hashes()
        .map(|h| {
            let part = part_of(h);
            next[part].next().map_or(0, |&id| id + offset[part])
        })
        .collect();
    Ok(Interned {
        attr_ids,
        attr_names,
        preds,
        facts,
        conj_sub,
        conj_start,
        conj_preds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bound, Conjunction, Num};

    fn pred(attr: u32, lo: i64, negated: bool) -> Predicate {
        Predicate {
            attr: format!("a{attr}"),
            test: Test::Interval {
                lo: Bound::Incl(Num::from(lo)),
                hi: Bound::Unbounded,
            },
            negated,
        }
    }

    /// The interning over buckets gives what one table in the order of the uses gives:
    /// each distinct predicate once, numbered by its first use, every use naming its own.
    #[test]
    fn predicates_are_interned_once_in_the_order_of_their_first_use() {
        // a fixed draw (splitmix64): the same uses every run
        let mut state = 7u64;
        let mut below = |n: u64| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % n
        };
        let dnfs: Vec<Dnf> = (0..3000)
            .map(|_| {
                let conjs = (0..1 + below(2))
                    .map(|_| {
                        Conjunction::new(
                            (0..1 + below(6))
                                .map(|_| {
                                    let a = below(5) as u32;
                                    pred(a, below(40) as i64, below(4) == 0)
                                })
                                .collect(),
                        )
                    })
                    .collect();
                Dnf(conjs)
            })
            .collect();
        let it = intern(dnfs.iter().enumerate().map(|(i, d)| (i as u64 + 1, d))).expect("intern");
        // the reference: one map, in the order of the uses (parts one after the other)
        let uses: Vec<&Predicate> = dnfs
            .iter()
            .flat_map(|d| d.0.iter().flat_map(|c| c.0.iter()))
            .collect();
        assert_eq!(it.conj_preds.len(), uses.len());
        let key = |p: &Predicate| (p.attr.clone(), p.test.clone(), p.negated);
        let distinct: std::collections::HashSet<_> = uses.iter().map(|p| key(p)).collect();
        assert_eq!(
            it.preds.len(),
            distinct.len(),
            "each distinct predicate once"
        );
        let mut seen = std::collections::HashMap::new();
        for (u, &id) in uses.iter().zip(&it.conj_preds) {
            let (a, t, n) = it.preds[id as usize];
            assert_eq!(
                (it.attr_names[a as usize].as_str(), t, n),
                (u.attr.as_str(), &u.test, u.negated),
                "a use names its own predicate"
            );
            assert_eq!(
                *seen.entry(key(u)).or_insert(id),
                id,
                "one id per predicate"
            );
        }
        // within each part, ids grow with the first uses
        let firsts: Vec<u32> = {
            let mut got = std::collections::HashSet::new();
            it.conj_preds
                .iter()
                .copied()
                .filter(|&id| got.insert(id))
                .collect()
        };
        for part in 0..INTERN_PARTS {
            let mine: Vec<u32> = firsts
                .iter()
                .copied()
                .filter(|&id| {
                    let (a, t, n) = it.preds[id as usize];
                    let h = BuildHasherDefault::<XxHasher>::default().hash_one((
                        it.attr_names[a as usize].as_str(),
                        t,
                        n,
                    ));
                    part_of(h) == part
                })
                .collect();
            assert!(
                mine.is_sorted(),
                "part {part}: ids in the order of first use"
            );
        }
    }
}
