//! The write path's admission as the `Ingest` service uses it: a put waits for a slot once
//! all are taken, a priority-7 put takes the reserve meanwhile, and the waiting put is
//! written once a slot comes free.

use std::time::Duration;

use proto::v1;
use proto::v1::ingest_server::Ingest;
use tonic::Request;

use super::{Node, Sink};

fn put(priority: u32) -> v1::PutRequest {
    v1::PutRequest {
        data: b"x".to_vec(),
        priority,
        ..v1::PutRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_waits_for_a_slot_while_an_urgent_one_takes_the_reserve() {
    let dir = std::env::temp_dir().join(format!("dissem-admission-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = storage::Store::open(&dir, 1).expect("open store");
    let limits = runtime::Limits::default();
    let dissem = crate::disseminate::Disseminator::load(store.clone(), &limits).expect("load");
    let node = Node::new(store, limits, Sink::Embedded(dissem));
    // every slot but the urgent reserve is busy
    let gate = node.admission().clone();
    let mut held = Vec::new();
    for _ in 0..crate::admission::DEFAULT_SLOTS - crate::admission::DEFAULT_RESERVE {
        held.push(gate.enter(0).await.expect("a free slot"));
    }
    let low = {
        let n = node.clone();
        tokio::spawn(async move { n.put(Request::new(put(3))).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while gate.waiting() != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the put never waited"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let urgent = tokio::time::timeout(Duration::from_secs(10), node.put(Request::new(put(7))))
        .await
        .expect("the urgent put is written while the other waits")
        .expect("stored");
    assert!(urgent.into_inner().id.is_some());
    assert!(!low.is_finished(), "priority 3 must wait for a slot");
    drop(held);
    let low = tokio::time::timeout(Duration::from_secs(10), low)
        .await
        .expect("written once a slot came free")
        .expect("task")
        .expect("stored");
    assert!(low.into_inner().id.is_some());
    assert_eq!(gate.counts(), (1, 0));
    let _ = std::fs::remove_dir_all(&dir);
}
