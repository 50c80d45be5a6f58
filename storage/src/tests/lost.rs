//! What outlives a lost node or a damaged disk: forwarding copies (delivered, still owed to a
//! federation link), link entries owed for other nodes' objects, and objects lost at open
//! remembered until restored from a copy.

use super::*;

#[tokio::test]
async fn forwarding_copies_keep_their_bytes_until_finished_and_are_never_unfinished_again() {
    let dir = temp_dir("forwarding");
    let s = Store::open(&dir, 0).expect("open");
    let copies: Vec<_> = (1..=3).map(|q| copy(4, q)).collect();
    s.put_replicas_unflushed(&copies).expect("put");
    let (one, two, three) = (copies[0].id, copies[1].id, copies[2].id);
    s.mark_received_unflushed(&[(two, 9)]).expect("mark");
    s.finish_replicas(&[one]).expect("finish");
    // a finished copy stays finished; an absent one stays absent
    let absent = ObjectId { node: 4, seq: 7 };
    s.forward_replicas(&[one, two, absent]).expect("forward");
    assert!(!s.knows_replica(absent).expect("knows"));
    let delivered = |id| s.delivered_replica(id).expect("delivered");
    assert_eq!(delivered(one), Some(false), "finished");
    assert_eq!(delivered(two), Some(true), "forwarding");
    assert_eq!(delivered(three), None, "unfinished");
    assert_eq!(delivered(absent), None, "unknown");
    assert!(
        s.received_marks(two).expect("marks").is_empty(),
        "delivered"
    );
    assert_eq!(
        s.forwarding_replicas(4, 0, 10).expect("forwarding"),
        vec![copies[1].clone()]
    );
    assert_eq!(s.forwarding_seqs(4, 0, 10).expect("seqs"), [2]);
    assert_eq!(s.finished_replicas(4, 0, 10).expect("delivered"), [1, 2]);
    let unfinished = s.unfinished_replicas(4, 0, 10).expect("unfinished");
    assert_eq!(unfinished.iter().map(|o| o.id).collect::<Vec<_>>(), [three]);
    assert_eq!(s.replica(two).expect("get"), None, "not to disseminate");
    assert!(!s.adopt(two).expect("adopt"));
    // a late copy does not make it unfinished again
    assert_eq!(s.put_replicas_unflushed(&copies[1..2]).expect("late"), 0);
    s.commit().await.expect("commit");
    drop(s);
    let s = Store::open(&dir, 0).expect("reopen");
    assert_eq!(
        s.replica_counts().expect("counts"),
        ReplicaCounts {
            unfinished: 1,
            finished: 1,
            forwarding: 1
        }
    );
    s.finish_replicas(&[two]).expect("finish");
    assert!(s.forwarding_seqs(4, 0, 10).expect("seqs").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn entries_owed_for_other_nodes_objects_sort_with_the_rest_and_are_indexed() {
    let dir = temp_dir("foreign");
    let s = Store::open(&dir, 1).expect("open");
    let own = s.put(obj(1, "")).await.expect("put").id;
    s.link_owe("eu", own.seq, b"own").expect("owe");
    let theirs = ObjectId {
        node: 4,
        seq: own.seq,
    };
    assert!(s.link_owe_foreign("eu", theirs, b"theirs").expect("owe"));
    assert!(!s.link_owe_foreign("eu", theirs, b"theirs").expect("again"));
    assert!(s.link_owe_foreign("us", theirs, b"theirs").expect("owe"));
    s.commit().await.expect("commit");
    drop(s);
    let s = Store::open(&dir, 1).expect("reopen");
    let eu = s.link_owed("eu", 10).expect("owed");
    assert_eq!(eu.len(), 2);
    assert_eq!(
        (eu[0].key, eu[0].foreign, eu[0].bytes.as_slice()),
        (own.seq, None, &b"own"[..])
    );
    assert_eq!(eu[0].object(1), own);
    assert!(eu[1].key > own.seq, "after what was owed before");
    assert_eq!((eu[1].foreign, eu[1].object(1)), (Some(theirs), theirs));
    assert!(s.link_owes_own("eu", own.seq).expect("owes"));
    assert!(
        !s.link_owes_own("eu", eu[1].key)
            .expect("an entry, not an object")
    );
    assert_eq!(s.link_owed_own_after("eu", 0, 10).expect("own"), [own.seq]);
    assert!(
        s.link_owed_own_after("eu", own.seq, 10)
            .expect("own")
            .is_empty()
    );
    assert!(s.link_owes_foreign(theirs).expect("owes"));
    // still owed on "us" after "eu" acknowledged it
    s.link_acked("eu", &[(eu[0].key, None), (eu[1].key, eu[1].foreign)])
        .expect("ack");
    assert_eq!(s.link_owed_len("eu"), 0);
    assert!(!s.link_owes_own("eu", own.seq).expect("owes"));
    assert!(s.link_owes_foreign(theirs).expect("owes"));
    // a removed link's entries leave the index too
    assert_eq!(s.forget_link("us").expect("forget"), 1);
    assert!(!s.link_owes_foreign(theirs).expect("owes"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_lost_at_open_is_remembered_until_restored_from_a_copy() {
    let dir = temp_dir("repair");
    let (kept, lost, gone);
    let lost_copy;
    {
        let s = Store::open(&dir, 6).expect("open");
        kept = s.put(obj(1, "")).await.expect("put").id;
        lost = s.put(obj(2, "m-2")).await.expect("put").id;
        lost_copy = s.get(lost).expect("get").expect("stored");
        // a locator whose record is missing: another object lost the same way
        gone = ObjectId {
            node: 6,
            seq: lost.seq + 1,
        };
        let entry = Store::encode_entry(&Entry {
            at: Locator {
                segment: 1,
                offset: 1 << 20,
                len: 10,
            },
            received_unix_ms: 1,
            has_message_id: false,
            priority: 0,
            targeted: false,
        });
        s.data.insert(key(b'd', gone.seq), entry).expect("insert");
        s.db.flush().expect("flush");
    }
    // a byte of the second object's record changes on disk
    let seg = newest_segment(&dir);
    let mut bytes = std::fs::read(&seg).expect("segment");
    let last = bytes.len() - 3;
    bytes[last] ^= 0xff;
    std::fs::write(&seg, &bytes).expect("damage");
    {
        let s = Store::open(&dir, 6).expect("reopen");
        assert_eq!(pending_ids(&s), vec![kept]);
        assert_eq!(s.to_repair(), vec![lost.seq, gone.seq]);
        s.commit().await.expect("commit");
        // the floor stays below what is still to repair
        assert!(s.outbox_floor() <= lost.seq);
    }
    let s = Store::open(&dir, 6).expect("reopen");
    assert_eq!(s.to_repair(), vec![lost.seq, gone.seq], "durable");
    assert!(s.awaits_repair(lost.seq) && s.awaits_repair(gone.seq) && !s.awaits_repair(kept.seq));
    // a copy of another node's object, or of one not lost, restores nothing
    assert_eq!(s.restore_own(&[copy(4, lost.seq)]).expect("restore"), 0);
    assert_eq!(
        s.restore_own(std::slice::from_ref(&lost_copy))
            .expect("restore"),
        1
    );
    assert_eq!(
        s.restore_own(std::slice::from_ref(&lost_copy))
            .expect("again"),
        0
    );
    assert!(!s.awaits_repair(lost.seq), "restored");
    s.give_up_repair(&[gone.seq]).expect("give up");
    assert!(!s.awaits_repair(gone.seq), "given up");
    s.commit().await.expect("commit");
    drop(s);
    let s = Store::open(&dir, 6).expect("reopen");
    assert!(s.to_repair().is_empty());
    assert_eq!(pending_ids(&s), vec![kept, lost]);
    assert_eq!(s.get(lost).expect("get"), Some(lost_copy));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matched_object_damaged_on_disk_is_restored_in_place_not_matched_again() {
    let dir = temp_dir("repair-matched");
    let (first, damaged, lost_copy);
    {
        let s = Store::open(&dir, 6).expect("open");
        first = s.put(obj(1, "")).await.expect("put").id;
        damaged = s.put(obj(2, "")).await.expect("put").id;
        lost_copy = s.get(damaged).expect("get").expect("stored");
        // both matched: out of the outbox, the floor past them
        s.retire(first).expect("retire");
        s.retire(damaged).expect("retire");
        s.commit().await.expect("commit");
    }
    let seg = newest_segment(&dir);
    flip_last_byte(&seg);
    let s = Store::open(&dir, 6).expect("reopen");
    assert_eq!(s.get(damaged).expect("get"), None, "reads as absent");
    assert_eq!(s.to_repair(), vec![damaged.seq]);
    assert!(pending_ids(&s).is_empty());
    assert!(s.outbox_floor() > damaged.seq, "the floor is not held back");
    assert_eq!(
        s.restore_own(std::slice::from_ref(&lost_copy))
            .expect("restore"),
        1
    );
    assert!(pending_ids(&s).is_empty(), "not matched again");
    assert_eq!(s.get(damaged).expect("get"), Some(lost_copy));
    assert!(s.get(first).expect("get").is_some());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A damaged tail behind an empty segment (a start killed before it wrote anything) is still
/// found at open: the object is to be restored, not read as absent for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_tail_behind_an_empty_segment_is_found_at_open() {
    let dir = temp_dir("repair-behind-empty");
    let damaged;
    {
        let s = Store::open(&dir, 6).expect("open");
        damaged = s.put(obj(1, "")).await.expect("put").id;
        s.retire(damaged).expect("retire");
        s.commit().await.expect("commit");
    }
    let seg = newest_segment(&dir);
    // a start that writes nothing: its fresh segment stays empty
    drop(Store::open(&dir, 6).expect("an empty start"));
    flip_last_byte(&seg);
    let s = Store::open(&dir, 6).expect("reopen");
    assert_eq!(s.get(damaged).expect("get"), None, "reads as absent");
    assert_eq!(s.to_repair(), vec![damaged.seq], "to be restored");
    assert!(s.awaits_repair(damaged.seq));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Damages the last record of segment `seg` (its payload's last byte flipped), as a failing
/// disk would.
fn flip_last_byte(seg: &std::path::Path) {
    let mut bytes = std::fs::read(seg).expect("segment");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(seg, &bytes).expect("damage");
}

/// The newest object-log segment with records in the store at `dir`.
fn newest_segment(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::read_dir(dir.join("objects"))
        .expect("log")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
        .max()
        .expect("a segment")
}
