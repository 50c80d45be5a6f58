//! One push per delivery around the start's resume. After a restart two things push
//! delivery records: the resume of the durable records left open (at the first catch-up),
//! and fresh matches of objects still in the outbox (the new leader matches them again).
//! A fresh match writes a record only where none exists, but a record it writes *before*
//! the resume reads the store would be pushed by both, and a QoS 2 subscriber shown the
//! delivery twice (found by `bench chaos`, seeds 9090 and 10043).
//!
//! So until the resume, a fresh match registers the pairs it is about to record
//! ([`Deliverer::claim_fresh`]); the resume takes the registered pairs and reads the store
//! in one step and leaves those to their writer. A registered pair whose record existed
//! already (written before the restart) belongs to the resume, unless the resume ran in
//! between and left it out: then the match pushes it ([`Deliverer::settle_fresh`]).

use super::*;

impl Deliverer {
    /// Registers `pairs` as being recorded by a fresh match; `true` when the resume has not
    /// run yet (the answer goes to [`Deliverer::settle_fresh`]).
    pub(super) fn claim_fresh(&self, pairs: &[(u64, ObjectId)]) -> bool {
        match lock(&self.inner.before_resume).as_mut() {
            Some(set) => {
                set.extend(pairs.iter().copied());
                true
            }
            None => false,
        }
    }

    /// After the records were written: `existing` are the claimed pairs whose records
    /// existed already. The answer says whether the caller must push those itself (the
    /// resume ran since the claim and left them out); else they are the resume's.
    pub(super) fn settle_fresh(&self, claimed: bool, existing: &[(u64, ObjectId)]) -> bool {
        if !claimed {
            return false; // the resume ran before: it pushed the old records
        }
        match lock(&self.inner.before_resume).as_mut() {
            Some(set) => {
                for p in existing {
                    set.remove(p);
                }
                false
            }
            None => true,
        }
    }
}
