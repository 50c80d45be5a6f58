//! The journal of a leadership's registry writes and the tail state (`resume`): what a
//! coordinator's registry resumes from after a restart.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_while_leading_are_journaled_and_survive_a_reopen_with_the_tail_state() {
    let dir = temp_dir("resume");
    let from = {
        let s = Store::open(&dir, 0).expect("open");
        // a standby's writes are not journaled
        assert!(
            s.put_subscription(1, b"one".to_vec(), 1)
                .await
                .expect("put")
        );
        assert!(
            s.put_subscription(2, b"two".to_vec(), 2)
                .await
                .expect("put")
        );
        s.set_tail_state_unflushed(Some(b"cursors")).expect("state");
        s.commit().await.expect("commit");
        assert!(s.registry_journal().expect("journal").is_empty());
        s.raise_subscription_ids(100);
        s.journal_registry_writes().expect("journal");
        let id = s.next_subscription_id().expect("id");
        assert_eq!(
            s.put_subscriptions(&[(id, b"new".to_vec(), id)])
                .await
                .expect("puts"),
            [true]
        );
        let rev = s.next_subscription_revision().expect("rev");
        assert!(
            s.put_subscription(1, b"one'".to_vec(), rev)
                .await
                .expect("update")
        );
        s.registry_journal().expect("journal").from.expect("from")
    };
    assert!(from >= 100, "the leadership's first id is {from}");
    let s = Store::open(&dir, 0).expect("reopen");
    assert_eq!(
        s.tail_state().expect("state").as_deref(),
        Some(&b"cursors"[..])
    );
    let journal = s.registry_journal().expect("journal");
    assert_eq!(
        journal,
        Journal {
            from: Some(from),
            updated: vec![1]
        },
        "the Create is covered by the first id, the update of 1 listed"
    );
    assert_eq!(s.subscription_ids_from(from).expect("ids").len(), 1);
    // undone to what the nodes hold: 1 at its old revision, the Create never reached them
    assert!(
        s.set_subscription_unflushed(1, Some((1, b"one")))
            .expect("set")
    );
    for id in s.subscription_ids_from(from).expect("ids") {
        assert!(!s.set_subscription_unflushed(id, None).expect("set"));
    }
    s.clear_registry_journal_unflushed(&journal).expect("clear");
    s.commit().await.expect("commit");
    assert_eq!(
        s.get_subscription(1).expect("get").as_deref(),
        Some(&b"one"[..])
    );
    assert_eq!(s.subscription_held(1).expect("held"), Held::Revision(1));
    assert_eq!(s.subscription_held(2).expect("held"), Held::Revision(2));
    assert!(s.subscription_ids_from(from).expect("ids").is_empty());
    assert!(s.registry_journal().expect("journal").is_empty());
    // not leading now: writes are not journaled
    assert!(
        s.put_subscription(2, b"two'".to_vec(), 300)
            .await
            .expect("put")
    );
    assert!(s.registry_journal().expect("journal").is_empty());
    // a tombstone is never undone
    assert!(s.delete_subscription(2).await.expect("delete"));
    assert!(
        !s.set_subscription_unflushed(2, Some((2, b"two")))
            .expect("set")
    );
    assert_eq!(s.subscription_held(2).expect("held"), Held::Deleted);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_registry_has_no_tail_state_and_no_leaderships_creates_to_undo() {
    let dir = temp_dir("resume-replace");
    let s = Store::open(&dir, 0).expect("open");
    s.journal_registry_writes().expect("journal");
    assert!(s.registry_journal().expect("journal").from.is_some());
    s.set_tail_state_unflushed(Some(b"old")).expect("state");
    s.commit().await.expect("commit");
    let held = s
        .replace_subscriptions(&[(8, 8, b"eight".to_vec())], &[])
        .await
        .expect("replace");
    assert_eq!(held, 1);
    assert_eq!(s.tail_state().expect("state"), None);
    assert!(s.registry_journal().expect("journal").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
