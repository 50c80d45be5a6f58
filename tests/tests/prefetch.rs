//! A node compiles a newly published image of the subscription shard ahead of the first
//! task that names it (the coordinator's heartbeat answer names the newest version), so the
//! first objects after a subscription change do not wait for the compile.

use std::time::Duration;

use tests::{runtime, start_up, temp_dir, wait_for};

#[test]
fn a_published_image_is_compiled_before_any_object_needs_it() {
    let dir = temp_dir("prefetch");
    let node = start_up(&dir, &["--allow-private-targets"]);
    let rt = runtime();
    rt.block_on(async {
        let url = node.url();
        let s = tests::grpc_subscription("n >= 0", "http://127.0.0.1:9");
        tests::create_subscription(&url, s).await.expect("create");
        let (published, loaded) = wait_for(
            "the image compiled ahead",
            Duration::from_secs(20),
            || async {
                let s = tests::stats(&url).await.ok()?;
                let v = s.cluster?.image_version;
                (v > 0 && s.image_loaded >= v).then_some((v, s.image_loaded))
            },
        )
        .await;
        assert_eq!(loaded, published);
        let s = tests::stats(&url).await.expect("stats");
        assert_eq!(
            s.puts_accepted, 0,
            "no object was put: the compile came first"
        );
    });
}
