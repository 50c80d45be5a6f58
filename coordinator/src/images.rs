//! The published versions as nodes fetch them: what each version changed, and a few full
//! images. A version costs what it changes: publishing one records its changes (no image is
//! encoded), and a node that holds an earlier version gets only the net change from it. A
//! full image is encoded only at a compaction point (the first publication, then each time
//! the changes since the newest full image pass a share of the subscriptions), in the
//! background, and a node without an earlier version (a new one, a restarted one) gets the
//! newest full image at or before the version it asks for, with the change from there.

use std::collections::BTreeMap;
use std::sync::Arc;

use blocks::Dnf;
use blocks::image::{DeltaImage, encode_delta};

/// Full images kept (the newest first; the older one serves nodes still loading it).
const KEEP_FULLS: usize = 2;

/// Changes kept from before the oldest full image kept, at least (nodes that hold such a
/// version get the change from it instead of a full image to compile); past this and half
/// of the subscriptions, the oldest versions go (a node so far behind is as well served by
/// a full image).
const KEEP_CHANGES: usize = 4 * MAX_FULL_CHANGES;

/// Changes that always wait for a full image, and changes after which one is always encoded
/// (between the two, a share of the subscriptions: see [`blocks::index::COMPACT_SHARE`]).
const MIN_FULL_CHANGES: usize = blocks::index::MIN_COMPACT_DELTA;
const MAX_FULL_CHANGES: usize = blocks::index::MAX_COMPACT_DELTA;

/// How long after a full image's encoding the next may start, in multiples of its time.
/// A bulk load passes the share of changes in a fraction of a second, and full images of a
/// million subscriptions (0.4 s each) were encoded back to back for the whole load (280 in
/// two minutes, a core of the machine); a node that needs one meanwhile gets the older full
/// image and the longer change from it.
const FULL_REST: u32 = 8;

/// One change: a subscription's filter after it, or `None` when it was deleted.
pub(crate) type Change = (u64, Option<Dnf>);

/// One published version: what its subscriptions are and what it changed.
#[derive(Debug)]
struct Version {
    digest: u128,
    changes: Arc<Vec<Change>>,
}

/// What a node is sent for one version.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Served {
    pub(crate) version: u64,
    /// A full image (of `version` or an earlier one); empty when none is needed.
    pub(crate) image: Vec<u8>,
    /// The delta image from the image's version (or the node's) to `version`; empty when
    /// none is needed.
    pub(crate) delta: Vec<u8>,
    pub(crate) digest: u128,
}

/// Published versions, their changes and the full images.
#[derive(Debug, Default)]
pub(crate) struct Images {
    versions: BTreeMap<u64, Version>,
    fulls: BTreeMap<u64, Arc<Vec<u8>>>,
    /// Changes published since the newest full image (or the one being encoded).
    since_full: usize,
    /// The version whose full image is being encoded.
    encoding: Option<u64>,
    /// Changes held in `versions`, and the subscriptions of the newest version.
    logged: usize,
    subscriptions: usize,
    /// No full image is encoded before then ([`FULL_REST`]).
    rest_until: Option<std::time::Instant>,
}

impl Images {
    /// Records published version `version` (of `subscriptions` subscriptions).
    pub(crate) fn published(
        &mut self,
        version: u64,
        digest: u128,
        changes: Vec<Change>,
        subscriptions: usize,
    ) {
        self.since_full += changes.len();
        self.logged += changes.len();
        self.subscriptions = subscriptions;
        self.versions.insert(
            version,
            Version {
                digest,
                changes: Arc::new(changes),
            },
        );
    }

    /// Whether the next publication (of `subscriptions` subscriptions) should encode a full
    /// image: none exists or is being encoded, or enough changed since the newest.
    pub(crate) fn wants_full(&self, subscriptions: usize) -> bool {
        if self.encoding.is_some() {
            return false;
        }
        if self.fulls.is_empty() {
            return true;
        }
        if self
            .rest_until
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            return false;
        }
        let bound = (subscriptions / blocks::index::COMPACT_SHARE)
            .clamp(MIN_FULL_CHANGES, MAX_FULL_CHANGES);
        self.since_full >= bound
    }

    /// A full image of `version` is being encoded (its changes count towards it).
    pub(crate) fn encoding(&mut self, version: u64) {
        self.encoding = Some(version);
        self.since_full = 0;
    }

    /// The full image of `version` is encoded: it is kept, and the versions before the
    /// oldest full image kept are dropped.
    pub(crate) fn encoded(&mut self, version: u64, image: Vec<u8>) {
        if self.encoding == Some(version) {
            self.encoding = None;
        }
        self.fulls.insert(version, Arc::new(image));
        while self.fulls.len() > KEEP_FULLS {
            self.fulls.pop_first();
        }
        self.trim();
    }

    /// Drops the oldest versions before the oldest full image while more than
    /// [`KEEP_CHANGES`] (or half of the subscriptions) are held.
    fn trim(&mut self) {
        let Some((&oldest, _)) = self.fulls.first_key_value() else {
            return;
        };
        let budget = KEEP_CHANGES.max(self.subscriptions / 2);
        while self.logged > budget
            && let Some(entry) = self.versions.first_entry()
            && *entry.key() < oldest
        {
            self.logged -= entry.remove().changes.len();
        }
    }

    /// A full image took `took` to encode: the next waits [`FULL_REST`] times as long.
    pub(crate) fn rest_after(&mut self, took: std::time::Duration) {
        self.rest_until = Some(std::time::Instant::now() + took * FULL_REST);
    }

    /// Encoding the full image of `version` failed: the next publication tries again.
    pub(crate) fn not_encoded(&mut self, version: u64) {
        if self.encoding == Some(version) {
            self.encoding = None;
            self.since_full = usize::MAX / 2;
        }
    }

    /// The newest published version, with its digest.
    pub(crate) fn newest(&self) -> Option<(u64, u128)> {
        self.versions.last_key_value().map(|(v, e)| (*v, e.digest))
    }

    /// What a node that holds `have_version` (0: none) and compiled the subscriptions of
    /// `have_digest` needs for `version`; `None` when `version` is not kept.
    pub(crate) fn serve(
        &self,
        version: u64,
        have_version: u64,
        have_digest: Option<u128>,
    ) -> Option<Served> {
        let digest = self.versions.get(&version)?.digest;
        if have_digest == Some(digest) {
            return Some(Served {
                version,
                digest,
                ..Served::default()
            });
        }
        // versions of one leader are consecutive: holding the node's version means holding
        // every change since
        if have_version != 0 && have_version < version && self.versions.contains_key(&have_version)
        {
            return Some(Served {
                version,
                delta: self.delta(have_version, version),
                digest,
                ..Served::default()
            });
        }
        let (&from, image) = self.fulls.range(..=version).next_back()?;
        Some(Served {
            version,
            image: image.to_vec(),
            delta: if from == version {
                Vec::new()
            } else {
                self.delta(from, version)
            },
            digest,
        })
    }

    /// The net change from version `from` to `to` (both kept), encoded.
    fn delta(&self, from: u64, to: u64) -> Vec<u8> {
        let mut net: BTreeMap<u64, Option<&Dnf>> = BTreeMap::new();
        for (_, v) in self.versions.range(from + 1..=to) {
            for (id, state) in v.changes.iter() {
                net.insert(*id, state.as_ref());
            }
        }
        let mut img = DeltaImage {
            version: to,
            base_version: from,
            ..DeltaImage::default()
        };
        for (id, state) in net {
            match state {
                Some(d) => img.upserts.push((id, d.clone())),
                None => img.removes.push(id),
            }
        }
        encode_delta(&img)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blocks::image::{decode_delta, decode_shard};

    fn dnf(t: &str) -> Dnf {
        blocks::text::parse_text(t).expect("valid")
    }

    fn full(version: u64, subs: Vec<(u64, Dnf)>) -> Vec<u8> {
        blocks::image::encode_shard(&blocks::image::ShardImage {
            version,
            bloom: runtime::cluster_shard_config().bloom,
            subs,
        })
    }

    #[test]
    fn a_node_gets_the_net_change_from_what_it_holds_or_a_full_image_and_the_change() {
        let mut im = Images::default();
        assert!(im.wants_full(0));
        im.published(5, 50, vec![(1, Some(dnf("a = 1")))], 10);
        im.encoding(5);
        assert!(!im.wants_full(0));
        im.encoded(5, full(5, vec![(1, dnf("a = 1"))]));
        im.published(6, 60, vec![(2, Some(dnf("b = 2")))], 10);
        im.published(7, 70, vec![(2, None), (1, Some(dnf("a = 3")))], 10);
        im.published(8, 80, vec![(3, Some(dnf("c = 4")))], 10);

        // from version 6: 1 replaced, 2 deleted, 3 created
        let s = im.serve(8, 6, None).expect("kept");
        assert!(s.image.is_empty());
        let d = decode_delta(&s.delta).expect("delta");
        assert_eq!((d.base_version, d.version), (6, 8));
        assert_eq!(d.upserts, vec![(1, dnf("a = 3")), (3, dnf("c = 4"))]);
        assert_eq!(d.removes, vec![2]);

        // a new node: the full image of 5 and the change since
        let s = im.serve(7, 0, None).expect("kept");
        assert_eq!(decode_shard(&s.image).expect("image").version, 5);
        let d = decode_delta(&s.delta).expect("delta");
        assert_eq!((d.base_version, d.version), (5, 7));
        assert_eq!(d.upserts, vec![(1, dnf("a = 3"))]);
        assert_eq!(d.removes, vec![2]);

        // the full image's own version: no delta; the same subscriptions: nothing at all
        assert!(im.serve(5, 0, None).expect("kept").delta.is_empty());
        let s = im.serve(8, 3, Some(80)).expect("kept");
        assert!(s.image.is_empty() && s.delta.is_empty());
        // a version of another leader, or one never published
        assert!(!im.serve(8, 4, None).expect("kept").image.is_empty());
        assert!(im.serve(9, 8, None).is_none());
    }

    #[test]
    fn a_full_image_is_wanted_once_enough_changed_and_old_versions_go_with_old_images() {
        let mut im = Images::default();
        im.published(1, 1, Vec::new(), 10);
        im.encoding(1);
        im.encoded(1, full(1, Vec::new()));
        let many = |n: u64| (0..n).map(|i| (i, Some(dnf("a = 1")))).collect::<Vec<_>>();
        im.published(2, 2, many(MIN_FULL_CHANGES as u64 - 1), 10);
        assert!(!im.wants_full(10));
        im.published(3, 3, many(1), 10);
        assert!(im.wants_full(10));
        // a million subscriptions wait for more changes
        assert!(!im.wants_full(1_000_000));
        im.encoding(3);
        im.encoded(3, full(3, Vec::new()));
        im.published(4, 4, many(MAX_FULL_CHANGES as u64), 10);
        assert!(im.wants_full(1_000_000));
        // not while the last full image's rest lasts (a bulk load)
        im.rest_after(std::time::Duration::from_secs(60));
        assert!(!im.wants_full(1_000_000));
        im.rest_until = None;
        im.encoding(4);
        im.encoded(4, full(4, Vec::new()));
        // two full images kept (3 and 4): version 2 has none at or before it, but a node
        // holding version 1 still gets the change from it
        assert!(im.serve(2, 0, None).is_none());
        let s = im.serve(2, 1, None).expect("kept");
        assert!(s.image.is_empty() && !s.delta.is_empty());
        assert!(im.serve(3, 0, None).is_some());
        assert_eq!(im.newest(), Some((4, 4)));
        // past the changes kept, the versions before the oldest full image go
        for v in 5..10 {
            im.published(v, v as u128, many(MAX_FULL_CHANGES as u64), 10);
        }
        im.encoding(9);
        im.encoded(9, full(9, Vec::new()));
        assert!(im.serve(2, 1, None).is_none());
        // the oldest full image's version stays (its change is what a node loading it needs)
        assert_eq!(im.versions.first_key_value().map(|(v, _)| *v), Some(4));
        let s = im.serve(9, 8, None).expect("kept");
        assert!(s.image.is_empty() && !s.delta.is_empty());
        // a failed encoding is tried again at the next publication
        im.published(10, 10, many(1), 10);
        im.encoding(10);
        im.not_encoded(10);
        assert!(im.wants_full(1_000_000));
    }
}
