//! The store's own tests: reopen, group commit, retention, the outbox floor, deliveries, replicas,
//! standby copies, spilled deliveries (`lost`: what outlives a lost node or a damaged disk).

use super::objects::Entry;
use super::*;

mod changes;
mod handed;
mod lost;
mod resume;
mod runs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_and_delivery_state_survive_reopen() {
    let dir = temp_dir("img");
    let o1 = ObjectId { node: 1, seq: 10 };
    let o2 = ObjectId { node: 1, seq: 11 };
    {
        let s = Store::open(&dir, 1).expect("open");
        for v in [1u64, 2, 300] {
            s.put_image("match/0", v, &v.to_le_bytes())
                .await
                .expect("image");
        }
        s.put_image("test/temp", 7, b"t").await.expect("image");
        s.set_delivery(
            5,
            o1,
            &DeliveryState::Pending {
                attempts: 2,
                next_attempt_unix_ms: 99,
            },
        )
        .await
        .expect("set");
        s.set_delivery(
            5,
            o2,
            &DeliveryState::DeadLetter {
                reason: "max attempts (10)".into(),
                at_unix_ms: 50,
            },
        )
        .await
        .expect("set");
        s.set_delivery(6, o1, &DeliveryState::Acked { at_unix_ms: 40 })
            .await
            .expect("set");
    }
    let s = Store::open(&dir, 1).expect("reopen");
    assert_eq!(
        s.latest_image("match/0").expect("latest"),
        Some((300, 300u64.to_le_bytes().to_vec()))
    );
    assert_eq!(
        s.get_image("match/0", 2).expect("get"),
        Some(2u64.to_le_bytes().to_vec())
    );
    assert_eq!(s.latest_image("match/1").expect("latest"), None);
    assert_eq!(s.prune_images("match/0", 300).expect("prune"), 2);
    assert_eq!(s.get_image("match/0", 2).expect("get"), None);
    assert_eq!(
        s.latest_image("test/temp").expect("latest").map(|x| x.0),
        Some(7)
    );
    assert_eq!(s.pending_deliveries(10).expect("pending").len(), 1);
    let dead = s.dead_letters(10).expect("dead");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].0, 5);
    assert_eq!(dead[0].1, o2);
    assert!(s.redrive(5, o2, 123).await.expect("redrive"));
    assert!(
        !s.redrive(5, o2, 124).await.expect("redrive twice"),
        "no longer a dead letter"
    );
    assert_eq!(
        s.delivery(5, o2).expect("get"),
        Some(DeliveryState::Pending {
            attempts: 0,
            next_attempt_unix_ms: 123
        })
    );
    // retention removes old acknowledged deliveries and dead letters, never pending ones
    assert_eq!(s.expire_deliveries_before(45).expect("expire"), 1);
    assert_eq!(s.delivery(6, o1).expect("get"), None);
    assert_eq!(s.pending_deliveries(10).expect("pending").len(), 2);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

fn obj(i: u64, msg: &str) -> NewObject {
    NewObject {
        data: vec![i as u8; 10],
        metadata: vec![
            ("n".into(), Value::from(i as i64)),
            ("s".into(), Value::from("x")),
        ],
        priority: (i % 8) as u8,
        message_id: msg.to_string(),
        ..NewObject::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_shares_one_flush_and_survives_reopen() {
    let dir = temp_dir("batch");
    let ids: Vec<ObjectId>;
    {
        let s = Store::open(&dir, 4).expect("open");
        let first = s.put(obj(1, "m-1")).await.expect("put");
        let before = s.flushes();
        let batch = (2..12)
            .map(|i| obj(i, if i == 5 { "m-1" } else { "" }))
            .collect();
        let outs = s.put_batch(batch).await.expect("batch");
        assert_eq!(s.flushes() - before, 1, "one flush for the whole batch");
        let outs: Vec<PutOutcome> = outs.into_iter().map(|r| r.expect("put")).collect();
        assert_eq!(outs.len(), 10);
        // the repeated message id answers with the first object, marked duplicate
        assert!(outs[3].duplicate);
        assert_eq!(outs[3].id, first.id);
        assert_eq!(outs.iter().filter(|o| o.duplicate).count(), 1);
        ids = outs.iter().filter(|o| !o.duplicate).map(|o| o.id).collect();
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), 9);
        // an empty batch is no flush
        let before = s.flushes();
        assert!(s.put_batch(Vec::new()).await.expect("empty").is_empty());
        assert_eq!(s.flushes(), before);
    }
    let s = Store::open(&dir, 4).expect("reopen");
    for id in &ids {
        assert!(s.get(*id).expect("get").is_some(), "{id:?} lost");
    }
    assert_eq!(s.outbox_pending().expect("outbox").len(), 10);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory for one test's store.
fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("dissem-store-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn pending_ids(s: &Store) -> Vec<ObjectId> {
    let pending = s.outbox_pending().expect("outbox");
    pending.into_iter().map(|(id, _)| id).collect()
}

fn log_segments(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("objects"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_pending_objects_and_deletes_unused_log_segments() {
    let dir = temp_dir("ret");
    let mut ids = Vec::new();
    // three runs of the process: three log segments
    for run in 0..3u64 {
        let s = Store::open(&dir, 5).expect("open");
        for i in 0..4 {
            ids.push(
                s.put(obj(run * 10 + i, &format!("r{run}-{i}")))
                    .await
                    .expect("put")
                    .id,
            );
        }
    }
    assert_eq!(log_segments(&dir), 3);
    let s = Store::open(&dir, 5).expect("open");
    assert_eq!(log_segments(&dir), 4, "three written and the fresh one");
    // everything but the last object is finished
    for id in &ids[..ids.len() - 1] {
        assert!(s.retire(*id).expect("retire"));
    }
    assert_eq!(s.expire_to_count(6).expect("expire"), 6);
    assert_eq!(s.object_count(), 6);
    assert!(s.get(ids[5]).expect("get").is_none());
    assert!(s.get(ids[6]).expect("get").is_some());
    // the first run's segment is unused now and gone; the second's is still read
    assert_eq!(log_segments(&dir), 3);
    assert_eq!(s.expire_to_count(6).expect("again"), 0);
    assert_eq!(s.expire_before(u64::MAX).expect("expire all"), 5);
    // the pending object is kept, and with it its segment and the one being written
    assert_eq!(s.object_count(), 1);
    assert!(s.get(ids[11]).expect("get").is_some());
    assert_eq!(log_segments(&dir), 2);
    // an expired message id may be used again
    let again = s.put(obj(1, "r0-1")).await.expect("put");
    assert!(!again.duplicate);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_object_reads_back_whole_until_it_is_deleted() {
    let dir = temp_dir("fresh");
    let s = Store::open(&dir, 5).expect("open");
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(s.put(obj(i, &format!("m{i}"))).await.expect("put").id);
    }
    // read from memory
    let fresh = s.get(ids[3]).expect("get").expect("kept");
    assert_eq!(fresh.data, obj(3, "m3").data);
    assert_eq!(fresh.message_id, "m3");
    for id in &ids[..2] {
        assert!(s.retire(*id).expect("retire"));
    }
    assert_eq!(s.expire_before(u64::MAX).expect("expire"), 2);
    for id in &ids[..2] {
        assert!(
            s.get(*id).expect("get").is_none(),
            "deleted objects are not answered"
        );
    }
    drop(s);
    // what memory answered is what sled and the log answer
    let s = Store::open(&dir, 5).expect("reopen");
    assert_eq!(s.get(ids[3]).expect("get"), Some(fresh));
    assert!(s.get(ids[0]).expect("get").is_none());
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_whose_bytes_never_reached_the_log_is_dropped_at_open() {
    let dir = temp_dir("torn");
    let kept;
    {
        let s = Store::open(&dir, 6).expect("open");
        kept = s.put(obj(1, "")).await.expect("put").id;
        // what sled can hold after a crash: a locator whose log record was never written
        let at = Locator {
            segment: 1,
            offset: 1 << 20,
            len: 10,
        };
        let entry = Store::encode_entry(&Entry {
            at,
            received_unix_ms: 1,
            has_message_id: false,
            priority: 0,
            targeted: false,
        });
        s.data
            .insert(key(b'd', kept.seq + 999), entry)
            .expect("insert");
        s.db.flush().expect("flush");
    }
    let s = Store::open(&dir, 6).expect("reopen");
    let pending = pending_ids(&s);
    assert_eq!(pending, vec![kept]);
    assert_eq!(s.object_count(), 1);
    assert!(s.get(kept).expect("get").is_some());
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_replays_from_its_durable_floor() {
    let dir = temp_dir("floor");
    let mut ids = Vec::new();
    {
        let s = Store::open(&dir, 7).expect("open");
        for i in 0..5 {
            ids.push(s.put(obj(i, "")).await.expect("put").id);
        }
        for i in [0, 1, 3] {
            assert!(s.retire(ids[i]).expect("retire"));
        }
        assert!(!s.retire(ids[0]).expect("retire"), "retired once");
        assert_eq!(s.outbox_len(), 2);
        // the next flush writes the floor: the lowest object still owed (ids[2])
        ids.push(s.put(obj(5, "")).await.expect("put").id);
    }
    let s = Store::open(&dir, 7).expect("reopen");
    let pending = pending_ids(&s);
    // below the floor nothing is replayed; above it a retired object is owed again
    // (matching twice leaves existing delivery records as they are)
    assert_eq!(pending, vec![ids[2], ids[3], ids[4], ids[5]]);
    let priorities: Vec<u8> = s
        .outbox_pending()
        .expect("outbox")
        .iter()
        .map(|p| p.1)
        .collect();
    assert_eq!(priorities, vec![2, 3, 4, 5], "priorities survive too");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_deliveries_are_added_once_and_never_reset() {
    let dir = temp_dir("pending");
    let s = Store::open(&dir, 8).expect("open");
    let id = s.put(obj(1, "")).await.expect("put").id;
    let added = s
        .add_pending_deliveries(&[(1, id), (2, id)])
        .await
        .expect("add");
    assert_eq!(added, vec![(1, id), (2, id)]);
    s.set_delivery(1, id, &DeliveryState::Acked { at_unix_ms: 5 })
        .await
        .expect("ack");
    // matched again (a replay): only the new pair is added, the acked one stays acked
    let added = s
        .add_pending_deliveries(&[(1, id), (2, id), (3, id)])
        .await
        .expect("add");
    assert_eq!(added, vec![(3, id)]);
    assert_eq!(
        s.delivery(1, id).expect("read"),
        Some(DeliveryState::Acked { at_unix_ms: 5 })
    );
    assert!(matches!(
        s.delivery(2, id).expect("read"),
        Some(DeliveryState::Pending { attempts: 0, .. })
    ));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_outbox_dedup_and_reopen() {
    let dir = temp_dir("main");
    let ids;
    {
        let s = Store::open(&dir, 3).expect("open");
        let a = s.put(obj(1, "m1")).await.expect("put");
        let b = s.put(obj(2, "")).await.expect("put");
        let again = s.put(obj(9, "m1")).await.expect("put");
        assert_eq!(
            again,
            PutOutcome {
                id: a.id,
                duplicate: true
            }
        );
        assert_eq!(a.id.node, 3);
        assert!(b.id.seq > a.id.seq);
        let got = s.get(a.id).expect("get").expect("exists");
        assert_eq!(got.data, vec![1u8; 10]);
        assert_eq!(got.metadata[0], ("n".to_string(), Value::from(1)));
        assert_eq!(s.outbox_pending().expect("outbox").len(), 2);
        assert!(s.retire(a.id).expect("retire"));
        // concurrent puts share flushes and all get distinct ids
        let mut tasks = Vec::new();
        for i in 0..64 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move { s.put(obj(100 + i, "")).await }));
        }
        let flushes_before = s.flushes();
        let mut seen = std::collections::HashSet::new();
        for t in tasks {
            assert!(seen.insert(t.await.expect("join").expect("put").id));
        }
        let flushes = s.flushes() - flushes_before;
        assert!(
            flushes < 64,
            "64 concurrent puts took {flushes} flushes: no group commit"
        );
        ids = (a.id, b.id);
    }
    let s = Store::open(&dir, 3).expect("reopen");
    assert!(
        s.owns_from() > 0 && s.owns_from() <= ids.0.seq,
        "owns its own ids"
    );
    assert!(s.get(ids.0).expect("get").is_some());
    assert_eq!(s.outbox_pending().expect("outbox").len(), 65);
    let c = s.put(obj(5, "")).await.expect("put");
    assert!(
        c.id.seq > ids.1.seq + 64,
        "ids are never reused after a restart"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn copy(node: u32, seq: u64) -> StoredObject {
    StoredObject {
        id: ObjectId { node, seq },
        data: vec![seq as u8; 3],
        external_id: format!("k{seq}"),
        metadata: vec![("t".into(), Value::from(seq as i64))],
        priority: 2,
        message_id: String::new(),
        received_unix_ms: 7,
    }
}

#[tokio::test]
async fn replicas_are_paged_by_origin_finished_for_good_and_survive_reopen() {
    let dir = temp_dir("replicas");
    {
        let s = Store::open(&dir, 0).expect("open");
        let copies: Vec<_> = (1..=5).map(|q| copy(4, q)).chain([copy(5, 1)]).collect();
        assert_eq!(s.put_replicas_unflushed(&copies).expect("put"), 6);
        // a second copy of the same object changes nothing
        assert_eq!(s.put_replicas_unflushed(&copies[..2]).expect("again"), 0);
        let two = ObjectId { node: 4, seq: 2 };
        s.mark_received_unflushed(&[(two, 9), (two, 3), (ObjectId { node: 4, seq: 3 }, 9)])
            .expect("marks");
        assert_eq!(s.received_marks(two).expect("marks"), [3, 9]);
        s.finish_replicas(&[two]).expect("finish");
        assert!(s.received_marks(two).expect("marks").is_empty());
        assert_eq!(
            s.received_marks(ObjectId { node: 4, seq: 3 })
                .expect("marks"),
            [9]
        );
        // a late copy does not bring a finished one back
        assert_eq!(s.put_replicas_unflushed(&[copy(4, 2)]).expect("late"), 0);
        s.commit().await.expect("commit");
        let page = s.unfinished_replicas(4, 0, 2).expect("page");
        assert_eq!(page.iter().map(|o| o.id.seq).collect::<Vec<_>>(), [1, 3]);
        let rest = s.unfinished_replicas(4, 3, 10).expect("rest");
        assert_eq!(rest.iter().map(|o| o.id.seq).collect::<Vec<_>>(), [4, 5]);
        assert_eq!(rest[0], copy(4, 4));
        assert_eq!(s.finished_replicas(4, 0, 10).expect("finished"), [2]);
    }
    let s = Store::open(&dir, 0).expect("reopen");
    assert_eq!(
        s.replica_counts().expect("counts"),
        ReplicaCounts {
            unfinished: 5,
            finished: 1,
            forwarding: 0
        }
    );
    assert!(
        s.replica(ObjectId { node: 4, seq: 2 })
            .expect("get")
            .is_none()
    );
    assert!(
        s.knows_replica(ObjectId { node: 4, seq: 2 })
            .expect("knows")
    );
    assert_eq!(
        s.replica(ObjectId { node: 5, seq: 1 }).expect("get"),
        Some(copy(5, 1))
    );
    assert_eq!(
        s.unfinished_replicas_by_origin().expect("by origin"),
        [(4, 4), (5, 1)].into_iter().collect()
    );
    // a takeover claims copies, then (durable) adopts them into the outbox; a finished one
    // cannot be claimed
    let (a, b) = (ObjectId { node: 4, seq: 1 }, ObjectId { node: 5, seq: 1 });
    assert!(s.adopt(a).expect("adopt") && s.adopt(b).expect("adopt"));
    assert!(!s.adopt(a).expect("adopt"), "adopted twice");
    assert!(!s.adopt(ObjectId { node: 4, seq: 2 }).expect("finished"));
    assert!(!s.in_outbox(a), "claimed, not yet durable");
    s.commit().await.expect("commit");
    s.adopted(&[(a, 0), (b, 0)]);
    assert!(s.in_outbox(a));
    assert_eq!(s.outbox_pending().expect("pending").len(), 2);
    assert_eq!(s.get(a).expect("get").map(|o| o.id), Some(a));
    // the adoptions outlive a restart
    drop(s);
    let s = Store::open(&dir, 0).expect("reopen");
    assert!(s.in_outbox(a) && s.in_outbox(b), "adoptions lost at reopen");
    assert!(!s.adopt(a).expect("adopt"), "claimed before the restart");
    assert!(s.retire(a).expect("retire") && !s.in_outbox(a));
    assert_eq!(s.unadopt(5).expect("unadopt"), 1);
    assert_eq!(s.outbox_len(), 0);
    s.commit().await.expect("commit");
    drop(s);
    let s = Store::open(&dir, 0).expect("reopen");
    assert_eq!(
        s.outbox_len(),
        0,
        "a retired or given back adoption came back"
    );
    // a claim whose copy was finished meanwhile is dropped at open
    assert!(
        s.adopt(a)
            .expect("adopt again: its copy is still unfinished")
    );
    s.finish_replicas(&[a]).expect("finish");
    s.commit().await.expect("commit");
    drop(s);
    let s = Store::open(&dir, 0).expect("reopen");
    assert!(!s.in_outbox(a));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_copies_are_listed_by_the_node_that_placed_them() {
    let dir = temp_dir("placed");
    let s = Store::open(&dir, 1).expect("open");
    for (id, by) in [(1u64, 3u32), (2, 5), (3, 3), (4, 7)] {
        assert!(
            s.apply_subscription_copy_unflushed(
                id,
                format!("s{id}").as_bytes(),
                id,
                Some(by),
                false
            )
            .expect("put")
        );
    }
    s.commit().await.expect("commit");
    let want: std::collections::HashSet<u32> = [3, 7].into_iter().collect();
    let all = s.subscription_copies(0, 10, &want, false).expect("list");
    let ids: Vec<(u64, Option<u32>)> = all.iter().map(|c| (c.id, c.placed_by)).collect();
    assert_eq!(ids, [(1, Some(3)), (3, Some(3)), (4, Some(7))]);
    assert_eq!(all[0].record.as_deref(), Some(&b"s1"[..]));
    // paged, and a removed copy is listed as its tombstone
    let page = s.subscription_copies(1, 1, &want, false).expect("page");
    assert_eq!(page.iter().map(|c| c.id).collect::<Vec<_>>(), [3]);
    assert!(s.remove_subscription_unflushed(3).expect("remove"));
    let listed: Vec<(u64, bool)> = s
        .subscription_copies(0, 10, &want, false)
        .expect("list")
        .iter()
        .map(|c| (c.id, c.record.is_some()))
        .collect();
    assert_eq!(listed, [(1, true), (3, false), (4, true)]);
    // what changed since the Creates: the tombstone, and the one copy updated since
    assert!(
        s.apply_subscription_copy_unflushed(4, b"s4'", 9, None, true)
            .expect("update")
    );
    let changed: Vec<(u64, u64, bool)> = s
        .subscription_copies(0, 10, &want, true)
        .expect("changed")
        .iter()
        .map(|c| (c.id, c.revision, c.record.is_some()))
        .collect();
    assert_eq!(changed, [(3, 0, false), (4, 9, true)]);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_is_taken_only_if_newer_and_never_after_its_deletion_across_a_reopen() {
    let dir = temp_dir("versions");
    {
        let s = Store::open(&dir, 1).expect("open");
        assert!(
            s.apply_subscription_copy_unflushed(7, b"v5", 5, Some(2), false)
                .expect("put")
        );
        // an older version does not replace a newer one; the same or a newer one does
        assert!(
            !s.apply_subscription_copy_unflushed(7, b"v4", 4, Some(2), false)
                .expect("old")
        );
        assert!(
            s.apply_subscription_copy_unflushed(7, b"v9", 9, None, true)
                .expect("new")
        );
        assert_eq!(s.subscription_held(7).expect("held"), Held::Revision(9));
        // an update never adds a copy
        assert!(
            !s.apply_subscription_copy_unflushed(8, b"u", 3, None, true)
                .expect("upd")
        );
        assert_eq!(s.subscription_held(8).expect("held"), Held::Absent);
        assert!(s.remove_subscription_unflushed(7).expect("remove"));
        s.commit().await.expect("commit");
    }
    let s = Store::open(&dir, 1).expect("reopen");
    assert_eq!(s.subscription_held(7).expect("held"), Held::Deleted);
    assert!(
        !s.apply_subscription_copy_unflushed(7, b"late", u64::MAX, Some(2), false)
            .expect("after delete"),
        "a deleted subscription came back"
    );
    assert_eq!(s.get_subscription(7).expect("get"), None);
    // a rebuild keeps tombstones and skips records they name
    s.replace_subscriptions(&[(7, 10, b"r".to_vec()), (9, 10, b"n".to_vec())], &[11])
        .await
        .expect("replace");
    assert_eq!(s.subscription_held(7).expect("held"), Held::Deleted);
    assert_eq!(s.subscription_held(9).expect("held"), Held::Revision(10));
    assert_eq!(s.subscription_held(11).expect("held"), Held::Deleted);
    // tombstones are forgotten only by age
    assert_eq!(s.prune_subscription_tombstones(0).expect("prune"), 0);
    assert_eq!(s.prune_subscription_tombstones(u64::MAX).expect("prune"), 2);
    assert_eq!(s.subscription_held(7).expect("held"), Held::Absent);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_replaced_registry_holds_exactly_the_records_given_whatever_was_there() {
    let dir = temp_dir("replace-sync");
    let s = Store::open(&dir, 1).expect("open");
    let rec = |i: u64, r: &str| (i, i * 10, r.as_bytes().to_vec());
    // ids around and between the new ones, some records equal, some not
    let old: Vec<(u64, Vec<u8>, u64)> = [1u64, 3, 4, 6, 9, 12]
        .iter()
        .map(|&i| (i, format!("r{i}").into_bytes(), i * 10))
        .collect();
    s.put_subscriptions(&old).await.expect("put");
    // unsorted, with a repeat: the first of an id wins
    let new = [
        rec(4, "r4"),
        rec(2, "new"),
        rec(6, "changed"),
        rec(4, "repeat"),
        rec(13, "last"),
    ];
    let held = s.replace_subscriptions(&new, &[]).await.expect("replace");
    assert_eq!(held, 4);
    let got = s.list_subscriptions(0, 100).expect("list");
    let want: Vec<(u64, Vec<u8>)> = [(2, "new"), (4, "r4"), (6, "changed"), (13, "last")]
        .iter()
        .map(|(i, r)| (*i, r.as_bytes().to_vec()))
        .collect();
    assert_eq!(got, want);
    for (i, _) in &want {
        assert_eq!(
            s.subscription_held(*i).expect("held"),
            Held::Revision(i * 10),
            "revision of {i}"
        );
    }
    for i in [1, 3, 9, 12] {
        assert_eq!(s.subscription_held(i).expect("held"), Held::Absent, "{i}");
    }
    assert_eq!(s.subscription_count(), 4);
    // an empty registry empties the store
    s.replace_subscriptions(&[], &[]).await.expect("replace");
    assert_eq!(s.subscription_count(), 0);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn standby_copies_follow_the_watermark_and_expiry_and_survive_reopen() {
    let dir = temp_dir("standby");
    let c = |seq, expires_unix_ms| StandbyCopy {
        seq,
        expires_unix_ms,
        bytes: b"obj",
    };
    {
        let s = Store::open(&dir, 1).expect("open");
        assert_eq!(s.federation_role().expect("role"), (true, 0, String::new()));
        s.set_federation_role(false, 3, "eu").expect("role");
        // 4 is expired on arrival; 1 arrives twice
        let (new, not) = s
            .standby_keep("eu", 2, &[c(1, 500), c(2, 500), c(3, 900), c(4, 90)], 100)
            .expect("keep");
        assert_eq!((new, not), (3, 1));
        assert_eq!(
            s.standby_keep("eu", 2, &[c(1, 500)], 100).expect("again"),
            (0, 1)
        );
        // another origin node and cluster are other ranges
        s.standby_keep("eu", 3, &[c(1, 500)], 100).expect("keep");
        s.standby_keep("us", 2, &[c(1, 500)], 100).expect("keep");
        // eu's node 2 finished everything below 3: its 1 and 2 go, and do not come back
        assert_eq!(s.standby_finished("eu", 2, 3).expect("finished"), 2);
        assert_eq!(s.standby_finished("eu", 2, 2).expect("lower"), 0);
        assert_eq!(
            s.standby_keep("eu", 2, &[c(2, 500)], 100).expect("late"),
            (0, 1)
        );
        assert_eq!(s.standby_len(), 3);
        s.commit().await.expect("commit");
    }
    let s = Store::open(&dir, 1).expect("reopen");
    assert_eq!(s.federation_role().expect("role"), (false, 3, "eu".into()));
    assert_eq!(s.standby_watermark("eu", 2).expect("watermark"), 3);
    assert_eq!(s.standby_len(), 3);
    // at 600 only eu's node 2 seq 3 (expires at 900) is live
    let live = s.standby_live(600, 10).expect("live");
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].1, b"obj");
    assert_eq!(s.standby_expire(600).expect("expire"), 2);
    s.standby_remove(&[live[0].0.clone()]).expect("remove");
    assert_eq!(s.standby_len(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn targeted_objects_are_never_in_the_outbox_and_spills_are_remembered_across_reopen() {
    let dir = temp_dir("spilled");
    let key = |seq, subscription| SpillKey {
        cluster: "a",
        origin: ObjectId { node: 1, seq },
        subscription,
    };
    let (plain, targeted) = {
        let s = Store::open(&dir, 1).expect("open");
        let plain = s.put(obj(1, "")).await.expect("put").id;
        let targeted = s.write_targeted(obj(2, "spill:a:1:5")).expect("targeted");
        assert!(!targeted.duplicate);
        // one copy per message id, like a put
        let again = s.write_targeted(obj(2, "spill:a:1:5")).expect("again");
        assert_eq!((again.id, again.duplicate), (targeted.id, true));
        assert!(!s.spill_seen(&key(5, 7)).expect("seen"));
        s.spill_taken(&key(5, 7), 900, Some(targeted.id))
            .expect("taken");
        s.spill_taken(&key(5, 8), 1_200, Some(targeted.id))
            .expect("taken");
        s.spill_taken(&key(6, 7), 300, None).expect("unclaimed");
        s.commit().await.expect("commit");
        assert_eq!(pending_ids(&s), vec![plain], "only the put is owed");
        (plain, targeted.id)
    };
    let s = Store::open(&dir, 1).expect("reopen");
    assert_eq!(
        pending_ids(&s),
        vec![plain],
        "the targeted copy is not replayed"
    );
    assert_eq!(
        s.get(targeted).expect("get").map(|o| o.data),
        Some(obj(2, "").data)
    );
    assert!(s.spill_seen(&key(5, 7)).expect("seen") && s.spill_seen(&key(6, 7)).expect("seen"));
    assert!(!s.spill_seen(&key(5, 9)).expect("another subscription"));
    // the latest deadline of the copy; the unclaimed one has none
    assert_eq!(
        s.spill_deadlines().expect("deadlines"),
        vec![(targeted, 1_200)]
    );
    assert_eq!(s.spill_forget_before(1_000).expect("forget"), 2);
    assert_eq!(s.spill_len(), 1);
    assert!(s.next_link_entry().expect("key") < s.next_link_entry().expect("key"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn copies_of_unfinished_objects_are_remembered_until_the_objects_finish() {
    let dir = temp_dir("copied");
    let s = Store::open(&dir, 1).expect("open");
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(s.put(obj(i, "")).await.expect("put").id);
    }
    // the first finished before its copy was acknowledged: not marked
    s.retire(ids[0]).expect("retire");
    s.note_copies(&[ids[0].seq, ids[1].seq, ids[2].seq])
        .expect("note");
    s.commit().await.expect("commit");
    assert_eq!(s.copied_unfinished().expect("copied"), vec![ids[1], ids[2]]);
    s.retire(ids[1]).expect("retire");
    assert_eq!(s.copied_unfinished().expect("copied"), vec![ids[2]]);
    s.commit().await.expect("commit");
    drop(s);
    let s = Store::open(&dir, 1).expect("reopen");
    assert_eq!(s.copied_unfinished().expect("copied"), vec![ids[2]]);
    // links' own entries are another keyspace
    assert_eq!(s.link_owed_len("x"), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A full disk is recognised in sled's clones of its I/O errors too (they keep the kind and
/// lose the OS code): a node names the disk and answers RESOURCE_EXHAUSTED, not a failure.
#[test]
fn a_full_disk_is_recognised_through_sleds_cloned_errors() {
    let raw = sled::Error::Io(std::io::Error::from_raw_os_error(28));
    assert!(StorageError::Sled(raw.clone()).is_disk_full());
    assert!(StorageError::Sled(raw).is_disk_full());
    let other = sled::Error::Io(std::io::Error::from_raw_os_error(5)).clone();
    assert!(!StorageError::Sled(other).is_disk_full());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_of_own_objects_names_the_first_one_handed_out_but_not_yet_written() {
    let dir = temp_dir("unwritten");
    let s = Store::open(&dir, 2).expect("open");
    let a = s.put(obj(1, "a")).await.expect("put").id;
    // a put holds its sequence number (in the outbox) before its write lands
    let held = s.next_seq(3, true).expect("a sequence number");
    let b = s.put(obj(2, "b")).await.expect("put").id;
    let (read, unwritten) = s.read_own([a.seq, held, b.seq]).expect("read");
    assert_eq!(
        read.iter().map(|o| o.id).collect::<Vec<_>>(),
        vec![a, b],
        "only what can be read is answered"
    );
    assert_eq!(unwritten, Some(held), "the unwritten put is named");
    // a write that failed leaves the outbox: nothing is owed for it
    s.lock_outbox().remove(&held);
    assert_eq!(s.read_own([held, b.seq]).expect("read").1, None);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `count` writers of a QoS 2 "received" phase wait for one shared flush (a flush is
/// running, so they all wait for the next), which `fail` (a test switch of the commit)
/// makes fail: each writer must be told it failed, as a full disk, within a deadline.
async fn each_writer_is_told_the_shared_flush_failed(
    s: &Store,
    count: usize,
    fail: &std::sync::atomic::AtomicBool,
) {
    let running = s.commit.running.lock().await;
    let mut tasks = Vec::new();
    for i in 0..count as u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let state = DeliveryState::Received {
                attempts: 0,
                next_attempt_unix_ms: 0,
            };
            s.set_delivery(7, ObjectId { node: 4, seq: i }, &state)
                .await
        }));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.commit.waiting.load(Ordering::SeqCst) < count {
        assert!(
            std::time::Instant::now() < deadline,
            "the writers did not wait"
        );
        tokio::task::yield_now().await;
    }
    fail.store(true, Ordering::SeqCst);
    drop(running);
    s.commit.done.notify_waiters();
    for t in tasks {
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), t)
            .await
            .expect("a writer of the shared flush was left waiting")
            .expect("join");
        let e = answer.expect_err("a writer of the failed flush was answered Ok");
        assert!(e.is_disk_full(), "named as a full disk: {e}");
    }
}

/// After a failed flush the next one succeeds, and so do its writers.
async fn a_later_write_succeeds(s: &Store) {
    s.set_delivery(
        7,
        ObjectId { node: 4, seq: 99 },
        &DeliveryState::Acked { at_unix_ms: 1 },
    )
    .await
    .expect("a later write");
}

/// Every writer whose writes a failed flush covered is told it failed, not only the writer
/// that ran the flush: a put is never acknowledged, and a QoS 2 "received" phase never taken
/// as stored, on a write that did not reach the disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_writer_of_a_failed_flush_is_told_it_failed() {
    let dir = temp_dir("failed-flush");
    let s = Store::open(&dir, 4).expect("open");
    // the shared flush fails as on a full disk
    each_writer_is_told_the_shared_flush_failed(&s, 16, &s.commit.fail_next).await;
    a_later_write_succeeds(&s).await;
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A flush that stops before it flushes (its outbox floor refused by a sled that failed on
/// its own) is a failed flush: each of its writers is told so, none is left waiting, and
/// none is answered Ok when the next flush fails too (`bench chaos` seed 32 in CI: two QoS 2
/// deliveries released on a "received" phase that never reached the disk, shown twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writers_of_a_flush_that_stopped_short_are_told_it_failed() {
    let dir = temp_dir("aborted-flush");
    let s = Store::open(&dir, 4).expect("open");
    // the shared flush stops short
    each_writer_is_told_the_shared_flush_failed(&s, 8, &s.commit.abort_next).await;
    // a failed flush after it answers its own writer so
    s.commit.fail_next.store(true, Ordering::SeqCst);
    let late = s
        .set_delivery(
            7,
            ObjectId { node: 4, seq: 50 },
            &DeliveryState::Acked { at_unix_ms: 1 },
        )
        .await;
    assert!(late.is_err(), "the late writer's flush failed: {late:?}");
    a_later_write_succeeds(&s).await;
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A delivery record only moves forward: a stale attempt's pending state does not undo a
/// "received" phase or an acknowledgement, and only a redrive takes a dead letter back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_record_never_moves_back() {
    let dir = temp_dir("forward");
    let s = Store::open(&dir, 1).expect("open");
    let o = ObjectId { node: 1, seq: 5 };
    let pending = DeliveryState::Pending {
        attempts: 0,
        next_attempt_unix_ms: 0,
    };
    let received = DeliveryState::Received {
        attempts: 1,
        next_attempt_unix_ms: 0,
    };
    let acked = DeliveryState::Acked { at_unix_ms: 9 };
    let dead = DeliveryState::DeadLetter {
        reason: "r".into(),
        at_unix_ms: 9,
    };
    assert!(s.set_delivery(1, o, &pending).await.expect("pending"));
    assert!(s.set_delivery(1, o, &received).await.expect("received"));
    assert!(!s.set_delivery(1, o, &pending).await.expect("stale pending"));
    assert_eq!(s.delivery(1, o).expect("read"), Some(received.clone()));
    assert!(s.set_delivery_unflushed(1, o, &acked).expect("acked"));
    for stale in [&pending, &received, &dead] {
        assert!(!s.set_delivery_unflushed(1, o, stale).expect("stale"));
    }
    assert_eq!(s.delivery(1, o).expect("read"), Some(acked));
    // a dead letter goes back to pending by a redrive only
    assert!(s.set_delivery(2, o, &dead).await.expect("dead"));
    assert!(!s.set_delivery(2, o, &pending).await.expect("stale pending"));
    assert!(s.redrive(2, o, 7).await.expect("redrive"));
    assert!(matches!(
        s.delivery(2, o).expect("read"),
        Some(DeliveryState::Pending { .. })
    ));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
