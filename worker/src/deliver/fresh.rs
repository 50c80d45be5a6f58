//! One push per delivery around the start's resume. After a restart two things push
//! delivery records: the resume of the durable records left open (at the first catch-up),
//! and fresh matches of objects still in the outbox (the new leader matches them again).
//! A fresh match writes a record only where none exists, but a record it writes *before*
//! the resume reads the store would be pushed by both, and a QoS 2 subscriber shown the
//! delivery twice (found by `bench chaos`, seeds 9090 and 10043). A QoS 2 attempt also runs
//! alone on its delivery (`attempt::Attempting`).
//!
//! So until the resume, a fresh match registers the pairs it is about to record
//! ([`Deliverer::claim_fresh`]); the resume takes the registered pairs and reads the store
//! in one step and leaves those to their writer. A pair whose record existed already
//! belongs to the match that claimed it first (another match of this start wrote it), or,
//! when none did, to the resume: written before the restart. Unless the resume ran in
//! between and left it out: then the match that claimed it pushes it
//! ([`Deliverer::settle_fresh`]).

use super::*;

/// The pairs one fresh match claimed first (before the resume; `None` after it).
pub(super) type Claimed = Option<std::collections::HashSet<(u64, ObjectId)>>;

impl Deliverer {
    /// Registers `pairs` as being recorded by a fresh match. The answer, for
    /// [`Deliverer::settle_fresh`]: `None` once the resume ran; else the pairs this match
    /// claimed first (a pair another match of this start claimed already is that one's).
    pub(super) fn claim_fresh(&self, pairs: &[(u64, ObjectId)]) -> Claimed {
        lock(&self.inner.before_resume)
            .as_mut()
            .map(|set| pairs.iter().copied().filter(|p| set.insert(*p)).collect())
    }

    /// After the records were written: `existing` are the pairs whose records existed
    /// already. The answer is those the caller must push itself: the ones it claimed first
    /// when the resume ran since and left them out. Otherwise the ones it claimed first go
    /// back to the resume (records from before the restart), and the rest are another
    /// match's.
    pub(super) fn settle_fresh(
        &self,
        claimed: &Claimed,
        existing: &[(u64, ObjectId)],
    ) -> Vec<(u64, ObjectId)> {
        let Some(mine) = claimed else {
            return Vec::new(); // the resume ran before: it pushed the old records
        };
        let mine: Vec<_> = existing
            .iter()
            .filter(|p| mine.contains(p))
            .copied()
            .collect();
        match lock(&self.inner.before_resume).as_mut() {
            Some(set) => {
                for p in &mine {
                    set.remove(p);
                }
                Vec::new()
            }
            None => mine,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoSubscriptions;

    #[tonic::async_trait]
    impl SubscriptionSource for NoSubscriptions {
        async fn subscription(&self, _id: u64) -> Result<Option<v1::Subscription>, Status> {
            Ok(None)
        }
    }

    fn deliverer(tag: &str) -> (Deliverer, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "dissem-fresh-{tag}-{}-{}",
            std::process::id(),
            runtime::random_u64()
        ));
        let store = storage::Store::open(&dir, 1).expect("store");
        let d = Deliverer::new(
            DeliveryConfig::default(),
            store,
            Arc::new(NoSubscriptions),
            crate::lanes::Lanes::new(false),
        )
        .expect("deliverer");
        (d, dir)
    }

    fn pair(seq: u64) -> (u64, ObjectId) {
        (7, ObjectId { node: 1, seq })
    }

    /// The resume taking the claimed pairs, as `resume_except` does.
    fn resume(d: &Deliverer) -> std::collections::HashSet<(u64, ObjectId)> {
        lock(&d.inner.before_resume).take().unwrap_or_default()
    }

    #[test]
    fn a_pair_belongs_to_the_match_that_claimed_it_first() {
        let (d, dir) = deliverer("first");
        let a = d.claim_fresh(&[pair(1), pair(2)]);
        let b = d.claim_fresh(&[pair(2), pair(3)]);
        assert_eq!(a.as_ref().map(|s| s.len()), Some(2));
        assert_eq!(b, Some([pair(3)].into_iter().collect()));
        // the resume runs: it leaves every claimed pair to its matches
        assert_eq!(resume(&d).len(), 3);
        // b found pair 2 recorded (by a): not b's to push, though the resume left it out
        assert!(d.settle_fresh(&b, &[pair(2)]).is_empty());
        // a found pair 1 recorded before the restart: the resume left it out, a pushes it
        assert_eq!(d.settle_fresh(&a, &[pair(1)]), vec![pair(1)]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_record_from_before_the_restart_goes_back_to_the_resume() {
        let (d, dir) = deliverer("back");
        let a = d.claim_fresh(&[pair(1), pair(2)]);
        // pair 1 existed: settled before the resume, so the resume pushes it
        assert!(d.settle_fresh(&a, &[pair(1)]).is_empty());
        let left = resume(&d);
        assert!(
            !left.contains(&pair(1)) && left.contains(&pair(2)),
            "{left:?}"
        );
        // after the resume nothing is claimed, and nothing is the match's to push
        let late = d.claim_fresh(&[pair(3)]);
        assert!(late.is_none());
        assert!(d.settle_fresh(&late, &[pair(3)]).is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn one_attempt_at_a_time_per_qos2_delivery() {
        let (d, dir) = deliverer("attempting");
        let o = ObjectId { node: 1, seq: 3 };
        let first = super::super::attempt::Attempting::take(&d, 7, o).expect("the first");
        let again = super::super::attempt::Attempting::take(&d, 7, o);
        assert!(again.is_none(), "a second attempt of the delivery waits");
        let other = super::super::attempt::Attempting::take(&d, 8, o);
        assert!(
            other.is_some(),
            "another subscription's delivery is its own"
        );
        drop(first);
        let later = super::super::attempt::Attempting::take(&d, 7, o);
        assert!(later.is_some(), "free again once the first ended");
        let _ = std::fs::remove_dir_all(dir);
    }
}
