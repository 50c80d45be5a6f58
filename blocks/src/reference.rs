//! The naive reference matcher: evaluates every subscription's formula directly.
//!
//! Slow by design and obviously right; tests and benchmarks compare every engine against it.

use std::collections::BTreeMap;

use crate::formula::Dnf;
use crate::predicate::Event;

/// Subscriptions kept as plain DNF, matched by direct evaluation.
#[derive(Debug, Default, Clone)]
pub struct ReferenceMatcher {
    subs: BTreeMap<u64, Dnf>,
}

impl ReferenceMatcher {
    /// An empty matcher.
    pub fn new() -> ReferenceMatcher {
        ReferenceMatcher::default()
    }

    /// Adds (or replaces) a subscription.
    pub fn insert(&mut self, id: u64, dnf: Dnf) {
        self.subs.insert(id, dnf);
    }

    /// Removes a subscription; returns whether it existed.
    pub fn remove(&mut self, id: u64) -> bool {
        self.subs.remove(&id).is_some()
    }

    /// Number of subscriptions.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// Whether there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// The ids of every subscription the event matches, sorted, each once.
    pub fn match_event(&self, event: &Event) -> Vec<u64> {
        self.subs
            .iter()
            .filter(|(_, d)| d.eval(event))
            .map(|(id, _)| *id)
            .collect()
    }
}
