//! Links changed at run time: `dissem link add` starts a link without a restart, the node
//! keeps it across one, and `dissem link remove` stops it and drops what it owed; a link from
//! the flags is changed there, a second link of one name and a bad mode are refused naming
//! the field, and the token given is never shown.

use std::time::Duration;

use proto::v1;
use tests::{
    cluster_up, dissem_bin, federation, free_port, receive_numbered as receive, runtime,
    stream_subscriber, temp_dir, wait_for,
};

/// Runs the `dissem` CLI against the node at `url`: (success, stdout + stderr).
fn cli(url: &str, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(dissem_bin())
        .args(args)
        .args(["--node-url", url])
        .output()
        .expect("dissem runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

async fn link_names(url: &str) -> Vec<(String, bool)> {
    federation(url)
        .links(v1::LinksRequest {})
        .await
        .map(|r| {
            r.into_inner()
                .links
                .into_iter()
                .map(|l| (l.name, l.added))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn links_are_added_kept_and_removed_at_run_time() {
    let dir = temp_dir("link-admin");
    let (a_addr, b_addr, c_addr) = (free_port(), free_port(), free_port());
    // a has one link from its flags (to c, which never runs); b has none
    let mut a = cluster_up(
        &dir,
        "a",
        &a_addr.to_string(),
        &["--link".into(), format!("to-c=http://{c_addr}")],
    );
    let b = cluster_up(&dir, "b", &b_addr.to_string(), &[]);
    let (a_url, b_url) = (a.url(), b.url());
    let token = dir.join("b.token");
    std::fs::write(&token, "not-a-secret-b-checks\n").expect("token file");
    let peer = format!("http://{b_addr}");
    let (ok, out) = cli(
        &a_url,
        &[
            "link",
            "add",
            "to-b",
            &peer,
            "--token-file",
            &token.display().to_string(),
            "--filter",
            "n >= 0",
        ],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("link to-b to") && out.contains("added"),
        "{out}"
    );
    let (ok, out) = cli(&a_url, &["link", "add", "to-b", &peer]);
    assert!(!ok && out.contains("exists"), "a second to-b: {out}");
    let (ok, out) = cli(&a_url, &["link", "add", "x", &peer, "--mode", "mirror"]);
    assert!(!ok && out.contains("mode"), "a bad mode: {out}");
    let (ok, out) = cli(&a_url, &["link", "list"]);
    assert!(
        ok && out.contains("to-b") && out.contains("(added)"),
        "{out}"
    );
    assert!(
        !out.contains("not-a-secret"),
        "the token is never shown: {out}"
    );
    let (ok, out) = cli(&a_url, &["link", "remove", "to-c"]);
    assert!(!ok && out.contains("--link"), "a flag's link: {out}");

    let rt = runtime();
    rt.block_on(async {
        let filter = || v1::subscription::Filter::Text("n >= 0".into());
        let (tx, mut down, _) = stream_subscriber(&b_url, "all", filter()).await;
        tests::put_numbered(&a_url, "a", 0..5).await;
        let got = receive("b", &tx, &mut down, 5, 0).await;
        assert_eq!(got.values().copied().collect::<Vec<_>>(), vec![1; 5]);
        // kept across a restart
        a.restart();
        let a_url = a.url();
        let names = wait_for(
            "a's links after its restart",
            Duration::from_secs(20),
            || async { Some(link_names(&a_url).await).filter(|n| n.len() == 2) },
        )
        .await;
        assert_eq!(
            names,
            vec![("to-c".to_string(), false), ("to-b".to_string(), true)]
        );
        tests::put_numbered(&a_url, "a", 5..10).await;
        let got = receive("b after a's restart", &tx, &mut down, 5, 5).await;
        assert_eq!(got.len(), 5, "{got:?}");
        // removed: it stops, and stays removed across a restart
        let (ok, out) = cli(&a_url, &["link", "remove", "to-b"]);
        assert!(ok && out.contains("removed"), "{out}");
        tests::put_numbered(&a_url, "a", 10..13).await;
        a.restart();
        let a_url = a.url();
        let names = wait_for("a's links", Duration::from_secs(20), || async {
            Some(link_names(&a_url).await).filter(|n| !n.is_empty())
        })
        .await;
        assert_eq!(names, vec![("to-c".to_string(), false)]);
        tests::put_numbered(&a_url, "a", 13..15).await;
        let quiet = tokio::time::timeout(Duration::from_secs(2), down.message()).await;
        assert!(
            quiet.is_err(),
            "b got something after the link went: {quiet:?}"
        );
    });
}
