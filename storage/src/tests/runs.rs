//! Locator runs: a batch's locators under one key, holes for its duplicates, slots removed
//! and restored one at a time, and what a reopen finds of them.

use super::*;

/// The sled keys of the object locators.
fn runs(s: &Store) -> usize {
    s.data.range(key(b'd', 0)..=key(b'd', u64::MAX)).count()
}

/// Puts `batch` as one batch, every object expected to go in.
async fn put_all(s: &Store, batch: Vec<NewObject>) -> Vec<PutOutcome> {
    s.put_batch(batch)
        .await
        .expect("batch")
        .into_iter()
        .map(|r| r.expect("put"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_writes_one_run_and_its_slots_come_and_go_one_at_a_time() {
    let dir = temp_dir("runs");
    let ids: Vec<ObjectId>;
    {
        let s = Store::open(&dir, 3).expect("open");
        let first = s.put(obj(1, "m-1")).await.expect("put");
        assert_eq!(runs(&s), 1);
        // the third repeats a message id: a hole in the run
        let batch = (2..8)
            .map(|i| obj(i, if i == 4 { "m-1" } else { "" }))
            .collect();
        let outs = put_all(&s, batch).await;
        assert_eq!(runs(&s), 2, "the batch's locators are one run");
        assert_eq!(outs[2].id, first.id);
        ids = outs.iter().filter(|o| !o.duplicate).map(|o| o.id).collect();
        assert_eq!(ids.len(), 5);
        assert!(!s.has_locator(outs[1].id.seq + 1).expect("hole"));
        assert_eq!(s.object_count(), 6);
        // a slot removed leaves the others readable, and restored it reads again
        let middle = ids[2];
        let entry = s.locator(middle.seq).expect("locator").expect("has one");
        s.remove_locator(middle.seq).expect("remove");
        s.fresh.forget(middle.seq);
        assert_eq!(s.get(middle).expect("get"), None);
        for id in ids.iter().filter(|&&id| id != middle) {
            s.fresh.forget(id.seq);
            assert!(s.get(*id).expect("get").is_some(), "{id:?} lost");
        }
        s.set_locator(middle.seq, &entry).expect("restore");
        assert_eq!(runs(&s), 2, "restored into its run, not beside it");
        assert!(s.get(middle).expect("get").is_some());
        s.commit().await.expect("commit");
    }
    let s = Store::open(&dir, 3).expect("reopen");
    let pending: Vec<ObjectId> = s
        .outbox_pending()
        .expect("outbox")
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    for id in &ids {
        assert!(s.get(*id).expect("get").is_some(), "{id:?} lost");
        assert!(pending.contains(id), "{id:?} not owed after the reopen");
    }
    // a scan from inside the run starts there
    let from: Vec<u64> = s
        .locators_from(ids[3].seq)
        .map(|f| match f.expect("scan") {
            locators::Found::Object(seq, _) => seq,
            locators::Found::Damaged(k) => panic!("damaged run {k:?}"),
        })
        .collect();
    assert_eq!(from, vec![ids[3].seq, ids[4].seq]);
    // the last slot removed takes the run with it
    for id in &ids {
        s.remove_locator(id.seq).expect("remove");
    }
    assert_eq!(runs(&s), 1, "only the single put's run is left");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_id_repeated_within_a_batch_is_stored_once() {
    let dir = temp_dir("runs-dup");
    let s = Store::open(&dir, 3).expect("open");
    let batch = ["m-a", "m-b", "m-a", "", "m-b"]
        .iter()
        .zip(1..)
        .map(|(m, i)| obj(i, m))
        .collect();
    let outs = put_all(&s, batch).await;
    assert_eq!(
        outs.iter().map(|o| o.duplicate).collect::<Vec<_>>(),
        [false, false, true, false, true]
    );
    assert_eq!(outs[2].id, outs[0].id);
    assert_eq!(outs[4].id, outs[1].id);
    assert_eq!(s.object_count(), 3);
    assert_eq!(s.outbox_pending().expect("outbox").len(), 3);
    // and a later put of the same id finds the stored one
    let again = s.put(obj(9, "m-b")).await.expect("put");
    assert!(again.duplicate);
    assert_eq!(again.id, outs[1].id);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_removes_the_oldest_slots_of_a_run_and_keeps_the_rest() {
    let dir = temp_dir("runs-expire");
    let s = Store::open(&dir, 3).expect("open");
    let ids: Vec<ObjectId> = put_all(&s, (1..=6).map(|i| obj(i, "")).collect())
        .await
        .iter()
        .map(|o| o.id)
        .collect();
    for id in &ids[..5] {
        assert!(s.retire(*id).expect("retire"));
    }
    // the sixth is still owed: never deleted
    assert_eq!(s.expire_to_count(2).expect("expire"), 4);
    assert_eq!(s.object_count(), 2);
    assert_eq!(runs(&s), 1, "one run, rewritten");
    for (i, id) in ids.iter().enumerate() {
        s.fresh.forget(id.seq);
        assert_eq!(s.get(*id).expect("get").is_some(), i >= 4, "object {i}");
    }
    for id in &ids[5..] {
        assert!(s.retire(*id).expect("retire"));
    }
    assert_eq!(s.expire_to_count(0).expect("expire"), 2);
    assert_eq!(runs(&s), 0, "the emptied run is deleted");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_id_being_written_is_refused_to_a_second_writer_until_its_write_ends() {
    let dir = temp_dir("runs-claims");
    let s = Store::open(&dir, 3).expect("open");
    // what a write between its claim and its locator holds
    s.take_claim("m-busy", 1).expect("claim");
    match s.put(obj(1, "m-busy")).await {
        Err(StorageError::MessageIdInFlight { message_id }) => assert_eq!(message_id, "m-busy"),
        other => panic!("expected the message id in flight, got {other:?}"),
    }
    let outs = s.put_batch(vec![obj(2, "m-busy"), obj(3, "m-free")]).await;
    let outs = outs.expect("batch");
    assert!(matches!(
        outs[0],
        Err(StorageError::MessageIdInFlight { .. })
    ));
    assert!(
        outs[1].is_ok(),
        "the others in the batch go in: {:?}",
        outs[1]
    );
    s.release_claim("m-busy", 1);
    let stored = s.put(obj(4, "m-busy")).await.expect("put once released");
    assert!(!stored.duplicate);
    // every write ended, so no claim is left behind
    assert!(s.claims.lock().expect("claims").is_empty());
    assert!(s.put(obj(5, "m-busy")).await.expect("again").duplicate);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
