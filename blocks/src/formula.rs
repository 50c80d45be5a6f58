//! Boolean formulas over predicates and their split into conjunctions (DNF).
//!
//! A subscription's filter is any and/or formula; the matching core only ever sees its
//! conjunctions, which share the subscription's id so an object matching several of them is
//! reported once.

use crate::predicate::{Event, Predicate};

/// Most conjunctions one subscription may expand to; beyond that the filter is rejected.
pub const MAX_CONJUNCTIONS: usize = 256;
/// Deepest nesting of and/or groups a filter may have (text parentheses, EventBridge objects
/// and `$or`): parsers recurse, and a filter of thousands of nested groups would overflow the
/// stack of the thread parsing it.
pub const MAX_NESTING: usize = 32;
/// Most predicates a filter may write down (before expansion and deduplication).
pub const MAX_FORMULA_PREDICATES: usize = 1024;
/// Most predicates in one conjunction.
pub const MAX_PREDICATES_PER_CONJUNCTION: usize = 64;

/// An and/or formula over predicates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Formula {
    Pred(Predicate),
    And(Vec<Formula>),
    Or(Vec<Formula>),
}

/// A set of predicates that must all hold; sorted and deduplicated.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Conjunction(pub Vec<Predicate>);

impl Conjunction {
    /// Normalises: sorts and deduplicates the predicates.
    pub fn new(mut preds: Vec<Predicate>) -> Conjunction {
        preds.sort();
        preds.dedup();
        Conjunction(preds)
    }

    /// Direct evaluation against an event (reference semantics).
    pub fn eval(&self, event: &Event) -> bool {
        self.0.iter().all(|p| p.eval(event.get(&p.attr)))
    }
}

/// A subscription's filter in disjunctive normal form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dnf(pub Vec<Conjunction>);

impl Dnf {
    /// Subscription `id` with this filter, as 128 bits: a registry's digest is the wrapping
    /// sum of its subscriptions' (kept up to date by adding and subtracting, and the same in
    /// any order). Two coordinators that hold the same subscriptions publish the same digest,
    /// so a node keeps the index it compiled instead of compiling a million subscriptions
    /// again after an election. Stable between processes of one build (the derived `Hash`
    /// of the predicates through XXH3), not between builds: a node of another build compiles
    /// again, which costs time, never a wrong match.
    pub fn digest(&self, id: u64) -> u128 {
        use std::hash::Hash;
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        id.hash(&mut h);
        self.0.hash(&mut h);
        h.digest128()
    }
}

/// Why a formula cannot be turned into conjunctions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnfError {
    #[error("the filter expands to more than {MAX_CONJUNCTIONS} conjunctions; simplify it")]
    TooManyConjunctions,
    #[error("a conjunction has more than {MAX_PREDICATES_PER_CONJUNCTION} predicates")]
    TooManyPredicates,
    #[error("the filter has more than {MAX_FORMULA_PREDICATES} predicates")]
    TooManyLeaves,
    #[error("the filter is empty; it must constrain at least one attribute")]
    Empty,
}

impl Formula {
    /// Expands the formula into DNF, deduplicating conjunctions.
    ///
    /// Predicates are interned first and the expansion works on their indices, keeping each
    /// conjunction deduplicated as it grows, so the work is bounded by the limits (at most
    /// [`MAX_FORMULA_PREDICATES`] leaves, [`MAX_CONJUNCTIONS`] conjunctions of
    /// [`MAX_PREDICATES_PER_CONJUNCTION`]) rather than by the length of the input: a long
    /// chain of one repeated predicate costs no more than a short one.
    pub fn to_dnf(&self) -> Result<Dnf, DnfError> {
        let mut interned = Interned::default();
        let conjs = expand(self, &mut interned)?;
        if conjs.iter().any(|c| c.is_empty()) || conjs.is_empty() {
            return Err(DnfError::Empty);
        }
        let mut out: Vec<Conjunction> = conjs
            .into_iter()
            .map(|c| Conjunction::new(c.iter().map(|&i| interned.preds[i].clone()).collect()))
            .collect();
        if out
            .iter()
            .any(|c| c.0.len() > MAX_PREDICATES_PER_CONJUNCTION)
        {
            return Err(DnfError::TooManyPredicates);
        }
        out.sort();
        out.dedup();
        Ok(Dnf(out))
    }
}

/// Distinct predicates of a formula, by index.
#[derive(Default)]
struct Interned<'a> {
    preds: Vec<&'a Predicate>,
    index: std::collections::HashMap<&'a Predicate, usize>,
    leaves: usize,
}

impl<'a> Interned<'a> {
    fn id(&mut self, p: &'a Predicate) -> Result<usize, DnfError> {
        self.leaves += 1;
        if self.leaves > MAX_FORMULA_PREDICATES {
            return Err(DnfError::TooManyLeaves);
        }
        let next = self.preds.len();
        let id = *self.index.entry(p).or_insert(next);
        if id == next {
            self.preds.push(p);
        }
        Ok(id)
    }
}

/// Sorts and deduplicates `c` once it grows past the per-conjunction limit; still past it
/// is an error.
fn bound(c: &mut Vec<usize>) -> Result<(), DnfError> {
    if c.len() > MAX_PREDICATES_PER_CONJUNCTION {
        c.sort_unstable();
        c.dedup();
        if c.len() > MAX_PREDICATES_PER_CONJUNCTION {
            return Err(DnfError::TooManyPredicates);
        }
    }
    Ok(())
}

fn expand<'a>(f: &'a Formula, ids: &mut Interned<'a>) -> Result<Vec<Vec<usize>>, DnfError> {
    match f {
        Formula::Pred(p) => Ok(vec![vec![ids.id(p)?]]),
        Formula::Or(items) => {
            let mut out = Vec::new();
            for it in items {
                out.extend(expand(it, ids)?);
                if out.len() > MAX_CONJUNCTIONS {
                    return Err(DnfError::TooManyConjunctions);
                }
            }
            Ok(out)
        }
        Formula::And(items) => {
            let mut acc: Vec<Vec<usize>> = vec![Vec::new()];
            for it in items {
                let right = expand(it, ids)?;
                if acc.len().saturating_mul(right.len()) > MAX_CONJUNCTIONS {
                    return Err(DnfError::TooManyConjunctions);
                }
                let mut next = Vec::with_capacity(acc.len() * right.len());
                for l in &acc {
                    for r in &right {
                        let mut c = l.clone();
                        c.extend_from_slice(r);
                        bound(&mut c)?;
                        next.push(c);
                    }
                }
                acc = next;
            }
            Ok(acc)
        }
    }
}

impl Dnf {
    /// Whether any conjunction holds (reference semantics).
    pub fn eval(&self, event: &Event) -> bool {
        self.0.iter().any(|c| c.eval(event))
    }

    /// The text form, which the text parser reads back.
    pub fn to_text(&self) -> String {
        self.0
            .iter()
            .map(|c| {
                c.0.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(" && ")
            })
            .collect::<Vec<_>>()
            .join(" || ")
    }
}
