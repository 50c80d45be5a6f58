//! Objects handed to an adopter: held in the outbox but not pending, their marks on disk
//! (one that had left the outbox, its delivery records written, is held again), taken back
//! or retired for good.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_objects_are_held_not_pending_and_their_marks_survive_reopen() {
    let dir = temp_dir("handed");
    let mut ids = Vec::new();
    {
        let s = Store::open(&dir, 7).expect("open");
        for i in 0..4 {
            ids.push(s.put(obj(i, "")).await.expect("put").id);
        }
        // ids[0] left the outbox (its records were written) before the heir adopted it
        assert!(s.retire(ids[0]).expect("retire"));
        assert!(
            !s.hand(ids[0].seq, None, (5, 1)).expect("hand"),
            "out of the outbox, no priority given: not held"
        );
        assert!(s.hand(ids[0].seq, Some(3), (5, 1)).expect("hand"));
        assert!(s.hand(ids[1].seq, None, (5, 1)).expect("hand"));
        assert!(s.hand(ids[2].seq, None, (6, 40)).expect("hand"));
        assert!(s.in_outbox(ids[0]) && s.is_handed(ids[0]));
        assert_eq!(pending_ids(&s), vec![ids[3]], "handed ones are not pending");
        assert_eq!(s.outbox_head(10), vec![ids[3].seq]);
        // ids[2] finished by its adopter: its mark goes
        assert!(s.retire(ids[2]).expect("retire"));
        assert!(!s.is_handed(ids[2]));
        // the floor passes ids[0] and ids[1]: only their marks bring them back
        ids.push(s.put(obj(4, "")).await.expect("put").id);
        s.commit().await.expect("commit");
    }
    let s = Store::open(&dir, 7).expect("reopen");
    assert!(
        s.in_outbox(ids[0]) && s.is_handed(ids[0]),
        "held again at open"
    );
    assert!(s.is_handed(ids[1]));
    // above the floor a retired object is owed again, as always, but not handed
    assert!(!s.is_handed(ids[2]), "its mark went with its retirement");
    assert_eq!(
        s.handings().expect("handings"),
        vec![(ids[0].seq, 5, 1), (ids[1].seq, 5, 1)]
    );
    assert!(!pending_ids(&s).contains(&ids[0]));
    // taken back: pending here again, the mark gone
    assert!(s.take_back(ids[0].seq).expect("take back"));
    assert!(!s.take_back(ids[0].seq).expect("take back"), "once");
    assert!(pending_ids(&s).contains(&ids[0]));
    s.commit().await.expect("commit");
    drop(s);
    let s = Store::open(&dir, 7).expect("reopen");
    assert_eq!(s.handings().expect("handings"), vec![(ids[1].seq, 5, 1)]);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
