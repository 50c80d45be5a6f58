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
    if n_uses >= u32::MAX as usize {
        return Err(BuildError::TooLarge("predicate uses", u32::MAX as u64));
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
    let uses = || halves.iter().flat_map(|h| h.uses.iter());
    let hashes = || halves.iter().flat_map(|h| h.hashes.iter().copied());
    let facts = || halves.iter().flat_map(|h| h.facts.iter().copied());
    let parts: Vec<Part<'a>> = on_threads(|part| {
        let mine = hashes().filter(|&h| part_of(h) == part).count();
        let mut table: HashTable<u32> = HashTable::with_capacity(mine);
        // room for every use up front (untouched room costs no memory): no copies as it
        // grows, and the first part's takes the others' after it where it lies
        let room = if part == 0 { n_uses } else { mine };
        let mut out = Part {
            preds: Vec::with_capacity(room),
            facts: Vec::with_capacity(room),
            ids: Vec::with_capacity(mine),
        };
        for ((&(attr, p), h), f) in uses().zip(hashes()).zip(facts()) {
            if part_of(h) != part {
                continue;
            }
            let preds = &mut out.preds;
            let found = table.find(h, |&id| {
                let (a, t, n) = preds[id as usize];
                a == attr && n == p.negated && *t == p.test
            });
            let id = match found {
                Some(&id) => id,
                None => {
                    let id = preds.len() as u32;
                    preds.push((attr, &p.test, p.negated));
                    out.facts.push(f);
                    // sized for every use of the part: the table never grows, so the
                    // hasher is never asked
                    table.insert_unique(h, id, |_| h);
                    id
                }
            };
            out.ids.push(id);
        }
        out
    });
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
