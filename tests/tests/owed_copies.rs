//! What a put owes a peer cluster survives the loss of the node that took it (issue #31, hole
//! 2): a 1x3 grid (every node holds every other's copies) with an all-active link to a peer
//! cluster that is down. Objects put on one node match nothing in their own cluster, so they
//! are delivered there at once, but the link still owes them: their copies stay (forwarding).
//! The node is then SIGKILLed and its data directory deleted; its heir owes the copies to its
//! own link, and once the peer is up it gets every acknowledged object, and the copies end.

use std::time::Duration;

use proto::v1;
use tests::{
    Cluster, attach, cluster_up, dissem_bin, free_port, numbered_put, receive_numbered, runtime,
    stats, stream_subscriber, temp_dir, wait_for,
};

const OBJECTS: i64 = 25;

#[test]
fn a_lost_disk_does_not_lose_what_a_peer_cluster_was_owed() {
    let dir = temp_dir("owed-copies");
    let peer = free_port();
    let link = format!("us=http://{peer}");
    let node_args = [
        "--gpu",
        "off",
        "--resend-ms",
        "1000",
        "--workers",
        "1",
        "--cluster-name",
        "eu",
        "--link",
        &link,
    ];
    let coord = ["--grid", "1x3", "--lease-ms", "1500"];
    let mut c = Cluster::start_ids(&dissem_bin(), &dir, 0..3, &coord, &node_args);
    // the peer, with a stream subscriber for every object, then down
    let mut peer_proc = cluster_up(&dir, "us", &peer.to_string(), &[]);
    let rt = runtime();
    rt.block_on(async {
        let purl = peer_proc.url();
        let filter = v1::subscription::Filter::Text("n >= 0".into());
        drop(stream_subscriber(&purl, "all", filter).await);
        peer_proc.kill();
        let curl = c.coordinator.url();
        wait_for("three nodes registered", Duration::from_secs(60), || {
            let curl = curl.clone();
            async move { (stats(&curl).await.ok()?.cluster?.nodes == 3).then_some(()) }
        })
        .await;
        let urls: Vec<String> = c.nodes.iter().map(|p| p.url()).collect();
        // a subscription here that none of them matches: each is finished once matched
        let none = v1::subscription::Filter::Text("n < 0".into());
        let _quiet = stream_subscriber(&urls[1], "none", none).await;
        wait_for("the subscription published", Duration::from_secs(30), || {
            let curl = curl.clone();
            async move { (stats(&curl).await.ok()?.cluster?.image_subscriptions == 1).then_some(()) }
        })
        .await;
        let ingest = v1::ingest_client::IngestClient::new(tests::channel(&urls[0]));
        for n in 0..OBJECTS {
            // retried while the node's view of its quorum settles (same message id)
            wait_for("a put acknowledged", Duration::from_secs(30), || {
                let mut ingest = ingest.clone();
                async move { ingest.put(numbered_put("eu", n)).await.ok() }
            })
            .await;
        }
        // delivered here, still owed to the link: the two holders keep them, forwarding
        for u in &urls[1..] {
            wait_for(
                "the holders' copies forwarding",
                Duration::from_secs(60),
                || async move {
                    let s = stats(u).await.ok()?;
                    (s.copies_forwarding == OBJECTS as u64).then_some(())
                },
            )
            .await;
        }
        // the node that took them is lost with its disk
        c.nodes[0].kill();
        std::fs::remove_dir_all(c.node_data(0)).expect("delete node 0's data");
        eprintln!("node 0 killed and its data directory deleted");
        // the peer comes back: every object arrives, once the heir owes them
        peer_proc = cluster_up(&dir, "us", &peer.to_string(), &[]);
        let (tx, mut down) = attach(&peer_proc.url(), "all").await;
        let got = receive_numbered("us", &tx, &mut down, OBJECTS as usize, 0).await;
        let missing: Vec<i64> = (0..OBJECTS)
            .filter(|n| !got.contains_key(&("eu".to_string(), *n)))
            .collect();
        assert!(missing.is_empty(), "the peer never got {missing:?}");
        assert!(got.values().all(|c| *c == 1), "repeated: {got:?}");
        // and the copies end once nothing owes them
        for u in &urls[1..] {
            wait_for(
                "the forwarding copies ended",
                Duration::from_secs(60),
                || async move { (stats(u).await.ok()?.copies_forwarding == 0).then_some(()) },
            )
            .await;
        }
    });
    peer_proc.kill();
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
