//! Boolean formulas over predicates and their split into conjunctions (DNF).
//!
//! A subscription's filter is any and/or formula; the matching core only ever sees its
//! conjunctions, which share the subscription's id so an object matching several of them is
//! reported once.

use crate::predicate::{Event, Predicate};

/// Most conjunctions one subscription may expand to; beyond that the filter is rejected.
pub const MAX_CONJUNCTIONS: usize = 256;
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

/// Why a formula cannot be turned into conjunctions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnfError {
    #[error("the filter expands to more than {MAX_CONJUNCTIONS} conjunctions; simplify it")]
    TooManyConjunctions,
    #[error("a conjunction has more than {MAX_PREDICATES_PER_CONJUNCTION} predicates")]
    TooManyPredicates,
    #[error("the filter is empty; it must constrain at least one attribute")]
    Empty,
}

impl Formula {
    /// Expands the formula into DNF, deduplicating conjunctions.
    pub fn to_dnf(&self) -> Result<Dnf, DnfError> {
        let mut conjs = expand(self)?;
        if conjs.iter().any(|c| c.is_empty()) || conjs.is_empty() {
            return Err(DnfError::Empty);
        }
        let mut out: Vec<Conjunction> = conjs.drain(..).map(Conjunction::new).collect();
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

fn expand(f: &Formula) -> Result<Vec<Vec<Predicate>>, DnfError> {
    match f {
        Formula::Pred(p) => Ok(vec![vec![p.clone()]]),
        Formula::Or(items) => {
            let mut out = Vec::new();
            for it in items {
                out.extend(expand(it)?);
                if out.len() > MAX_CONJUNCTIONS {
                    return Err(DnfError::TooManyConjunctions);
                }
            }
            Ok(out)
        }
        Formula::And(items) => {
            let mut acc: Vec<Vec<Predicate>> = vec![Vec::new()];
            for it in items {
                let right = expand(it)?;
                if acc.len().saturating_mul(right.len()) > MAX_CONJUNCTIONS {
                    return Err(DnfError::TooManyConjunctions);
                }
                let mut next = Vec::with_capacity(acc.len() * right.len());
                for l in &acc {
                    for r in &right {
                        let mut c = l.clone();
                        c.extend(r.iter().cloned());
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
