//! The change feed of subscription copies: what a standby coordinator tails.

use super::*;

fn everyone() -> std::collections::HashSet<u32> {
    (0..16).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_feed_lists_each_change_once_in_order_and_survives_reopen() {
    let dir = temp_dir("changes");
    let (id, after_two) = {
        let s = Store::open(&dir, 1).expect("open");
        assert_eq!(s.last_subscription_change(), 0);
        for (id, rev) in [(5u64, 5u64), (6, 6), (7, 7)] {
            assert!(
                s.apply_subscription_copy_unflushed(id, b"r", rev, Some(0), false)
                    .expect("copy")
            );
        }
        let two = s
            .subscription_changes(0, 2, &everyone(), false)
            .expect("page");
        assert_eq!(two.copies.iter().map(|c| c.id).collect::<Vec<_>>(), [5, 6]);
        assert!(two.more);
        // 5 is updated, 6 deleted: each listed once more, at its newest change, and 7 (not
        // changed since) not again
        assert!(
            s.apply_subscription_copy_unflushed(5, b"r2", 9, None, false)
                .expect("update")
        );
        assert!(s.remove_subscription_unflushed(6).expect("delete"));
        s.commit().await.expect("commit");
        (s.store_id(), two.last)
    };
    let s = Store::open(&dir, 1).expect("reopen");
    assert_eq!(s.store_id(), id, "the identity outlives a restart");
    let rest = s
        .subscription_changes(after_two, 100, &everyone(), false)
        .expect("rest");
    assert!(!rest.more);
    let listed: Vec<_> = rest
        .copies
        .iter()
        .map(|c| (c.id, c.revision, c.record.is_some()))
        .collect();
    assert_eq!(listed, [(7, 7, true), (5, 9, true), (6, 0, false)]);
    assert_eq!(rest.last, s.last_subscription_change());
    // numbers go on from where they were
    assert!(
        s.apply_subscription_copy_unflushed(8, b"r", 8, Some(1), false)
            .expect("copy")
    );
    let next = s
        .subscription_changes(rest.last, 100, &everyone(), false)
        .expect("next");
    assert_eq!(next.copies.iter().map(|c| c.id).collect::<Vec<_>>(), [8]);
    // the filters apply: placed by node 1 only, or changed since the Create only
    let only_1: std::collections::HashSet<u32> = [1].into();
    let by_1 = s
        .subscription_changes(0, 100, &only_1, false)
        .expect("by 1");
    assert_eq!(
        by_1.copies.iter().map(|c| c.id).collect::<Vec<_>>(),
        [6, 8],
        "the tombstone of 6 is listed whoever placed it"
    );
    let changed = s
        .subscription_changes(0, 100, &everyone(), true)
        .expect("changed");
    assert_eq!(
        changed.copies.iter().map(|c| c.id).collect::<Vec<_>>(),
        [5, 6]
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_registry_has_a_new_identity_and_an_empty_feed() {
    let dir = temp_dir("changes-replaced");
    let s = Store::open(&dir, 1).expect("open");
    s.put_subscription(3, b"r".to_vec(), 3).await.expect("put");
    let before = s.store_id();
    s.replace_subscriptions(&[(4, 4, b"r".to_vec())], &[])
        .await
        .expect("replace");
    assert_ne!(s.store_id(), before);
    let all = s
        .subscription_changes(0, 100, &everyone(), false)
        .expect("feed");
    assert!(all.copies.is_empty(), "{all:?}");
    assert_eq!(
        s.changes.after(0, 100).expect("feed"),
        [],
        "the feed is empty"
    );
    // and so it stays on the disk; what changes next is in it
    drop(s);
    let s = Store::open(&dir, 1).expect("reopen");
    assert_eq!(
        s.changes.after(0, 100).expect("feed"),
        [],
        "empty after reopening"
    );
    s.put_subscription(5, b"r".to_vec(), 5).await.expect("put");
    let feed: Vec<u64> = s
        .changes
        .after(0, 100)
        .expect("feed")
        .iter()
        .map(|c| c.1)
        .collect();
    assert_eq!(feed, [5]);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
