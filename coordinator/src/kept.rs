//! The registry's subscriptions as a publication needs them: each filter with its image
//! bytes encoded once, when it is registered, and a count of the subscriptions naming each
//! attribute. Publishing a version then copies pointers under the lock and concatenates
//! bytes outside it, instead of encoding every filter again for every version (which made
//! registering N subscriptions cost O(N²) once each `Create` waits for its version).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use blocks::Dnf;
use blocks::image::SubEncoder;

/// One subscription: its filter and its bytes in the encoder's table.
#[derive(Debug)]
struct Kept {
    dnf: Dnf,
    bytes: Arc<[u8]>,
}

/// What one publication takes: the bytes in id order and the attribute table they use.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) bytes: Vec<Arc<[u8]>>,
    pub(crate) table: Vec<String>,
}

/// Every registered subscription, encoded.
#[derive(Debug, Default)]
pub(crate) struct KeptSubscriptions {
    subs: BTreeMap<u64, Kept>,
    encoder: SubEncoder,
    /// Subscriptions per attribute name.
    attrs: HashMap<String, usize>,
    /// The wrapping sum of the subscriptions' [`Dnf::digest`]s.
    digest: u128,
}

fn names(dnf: &Dnf) -> HashSet<&str> {
    dnf.0
        .iter()
        .flat_map(|c| c.0.iter().map(|p| p.attr.as_str()))
        .collect()
}

impl KeptSubscriptions {
    /// Adds or replaces subscription `id`.
    pub(crate) fn upsert(&mut self, id: u64, dnf: Dnf) {
        self.remove(id);
        for n in names(&dnf) {
            *self.attrs.entry(n.to_string()).or_insert(0) += 1;
        }
        self.digest = self.digest.wrapping_add(dnf.digest(id));
        let bytes: Arc<[u8]> = self.encoder.encode(id, &dnf).into();
        self.subs.insert(id, Kept { dnf, bytes });
        // names that no subscription uses any more stay in the table until it is twice what
        // is in use; then every filter is encoded again against a fresh one
        let table = self.encoder.table().len();
        if table > 1024 && table > 2 * self.attrs.len() {
            self.reencode();
        }
    }

    /// The ids registered, in order.
    pub(crate) fn ids(&self) -> Vec<u64> {
        self.subs.keys().copied().collect()
    }

    /// How many subscriptions are registered.
    pub(crate) fn len(&self) -> usize {
        self.subs.len()
    }

    /// Removes subscription `id`; whether it was there.
    pub(crate) fn remove(&mut self, id: u64) -> bool {
        let Some(old) = self.subs.remove(&id) else {
            return false;
        };
        self.digest = self.digest.wrapping_sub(old.dnf.digest(id));
        for n in names(&old.dnf) {
            if let Some(c) = self.attrs.get_mut(n) {
                *c -= 1;
                if *c == 0 {
                    self.attrs.remove(n);
                }
            }
        }
        true
    }

    fn reencode(&mut self) {
        self.encoder = SubEncoder::default();
        for (id, k) in self.subs.iter_mut() {
            k.bytes = self.encoder.encode(*id, &k.dnf).into();
        }
    }

    /// The attribute names the subscriptions use.
    pub(crate) fn attributes(&self) -> HashSet<String> {
        self.attrs.keys().cloned().collect()
    }

    /// What the subscriptions are ([`Dnf::digest`], summed).
    pub(crate) fn digest(&self) -> u128 {
        self.digest
    }

    /// Pointers to everything a publication writes.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            bytes: self.subs.values().map(|k| k.bytes.clone()).collect(),
            table: self.encoder.table().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dnf(t: &str) -> Dnf {
        blocks::text::parse_text(t).expect("valid")
    }

    #[test]
    fn a_snapshot_is_the_image_of_what_is_registered() {
        let mut k = KeptSubscriptions::default();
        k.upsert(1, dnf("a = 1 && b > 2"));
        k.upsert(2, dnf("c prefix \"x\""));
        k.upsert(1, dnf("d = 4")); // replaced: a and b are no longer named
        k.upsert(3, dnf("c = 1 || e exists"));
        assert!(k.remove(2));
        assert!(!k.remove(2));
        let s = k.snapshot();
        let want: HashSet<String> = ["c", "d", "e"].iter().map(|s| s.to_string()).collect();
        assert_eq!(k.attributes(), want);
        let bloom = blocks::bloom::BloomConfig::default();
        let img = blocks::image::encode_shard_table(5, bloom, &s.table, &s.bytes);
        let got = blocks::image::decode_shard(&img).expect("decodes");
        assert_eq!(
            got.subs,
            vec![(1, dnf("d = 4")), (3, dnf("c = 1 || e exists"))]
        );
    }

    #[test]
    fn the_digest_names_the_subscriptions_whatever_the_order_of_changes() {
        let mut a = KeptSubscriptions::default();
        a.upsert(1, dnf("a = 1"));
        a.upsert(2, dnf("b > 2"));
        a.upsert(3, dnf("c = 3"));
        a.upsert(2, dnf("b > 5"));
        a.remove(3);
        let mut b = KeptSubscriptions::default();
        b.upsert(2, dnf("b > 5"));
        b.upsert(1, dnf("a = 1"));
        assert_eq!(a.digest(), b.digest());
        let fresh = dnf("a = 1").digest(1).wrapping_add(dnf("b > 5").digest(2));
        assert_eq!(a.digest(), fresh);
        // another filter, or the same filter under another id, is another registry
        b.upsert(2, dnf("b > 6"));
        assert_ne!(a.digest(), b.digest());
        let mut c = KeptSubscriptions::default();
        c.upsert(1, dnf("a = 1"));
        c.upsert(4, dnf("b > 5"));
        assert_ne!(a.digest(), c.digest());
        assert_eq!(KeptSubscriptions::default().digest(), 0);
    }

    #[test]
    fn unused_names_are_dropped_from_the_table_once_they_dominate() {
        let mut k = KeptSubscriptions::default();
        for i in 0..3000u64 {
            k.upsert(i, dnf(&format!("n{i} = 1")));
            k.remove(i);
        }
        k.upsert(9, dnf("kept = 1"));
        assert!(
            k.snapshot().table.len() <= 2048,
            "{}",
            k.snapshot().table.len()
        );
        let s = k.snapshot();
        let img = blocks::image::encode_shard_table(
            1,
            blocks::bloom::BloomConfig::default(),
            &s.table,
            &s.bytes,
        );
        assert_eq!(
            blocks::image::decode_shard(&img).expect("decodes").subs,
            vec![(9, dnf("kept = 1"))]
        );
    }
}
