//! A cluster that trusts etcd only over TLS with client certificates and etcd user auth
//! (issue 31, hole 4), with real processes: etcd serves only TLS and demands client
//! certificates signed by a test CA, auth is on (a `dissem` user with read and write on
//! `/dissem/` only), and two coordinators and three nodes reach it with `--etcd-ca`,
//! `--etcd-cert`, `--etcd-key`, `--etcd-user` and `--etcd-password-file`. They elect a leader
//! and deliver; etcd is restarted (its tokens die with it: everyone logs in again), the
//! leader is killed (the standby campaigns with its new token), and every acknowledged
//! object still reaches both subscribers. A client without a user is refused by etcd, a
//! wrong password stops a coordinator at start naming the flag, and a plain http:// etcd
//! URL with TLS flags is refused.
//!
//! Without an `etcd` binary the test says so and passes, unless `DISSEM_REQUIRE_ETCD` is set.

use std::time::Duration;

use bench::elected::{ElectedCluster, EtcdProc};
use bench::etcdtrust::EtcdTrust;
use bench::failoverbench::Traffic;
use runtime::etcd::{Etcd, EtcdSecurity};
use tests::{dissem_bin, runtime, small_node_flags, temp_dir};

#[test]
fn a_cluster_on_an_etcd_with_tls_client_certificates_and_user_auth_elects_and_delivers() {
    if !tests::have_etcd() {
        return;
    }
    let dir = temp_dir("etcd-trust");
    runtime().block_on(async {
        let trust = EtcdTrust::make(&dir.join("pki")).expect("certificates");
        let mut etcd = EtcdProc::start_with(&dir.join("etcd"), Some(trust.clone()))
            .await
            .expect("etcd over TLS");
        etcd.enable_auth("/dissem/").await.expect("auth on");

        // etcd enforces it: TLS and a client certificate, but no user, is refused
        let anonymous = Etcd::connect_with(
            &etcd.url,
            "/dissem/",
            &EtcdSecurity {
                user: None,
                ..trust.security().expect("security")
            },
        )
        .expect("client");
        let e = anonymous
            .put("x", b"y".to_vec(), 0)
            .await
            .expect_err("a write without a user");
        eprintln!("without a user: {e}");

        // a wrong password stops a coordinator at start, naming the flag
        let bad = dir.join("bad-password");
        std::fs::write(&bad, "not-it").expect("write");
        let mut args: Vec<String> = [
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--grid",
            "1x3",
            "--etcd",
            &etcd.url,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push("--data".into());
        args.push(dir.join("bad-coordinator").display().to_string());
        let mut flags = etcd.flags();
        let pw = flags
            .iter()
            .position(|f| f == "--etcd-password-file")
            .expect("password flag");
        flags[pw + 1] = bad.display().to_string();
        let all: Vec<String> = [args.clone(), flags].concat();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let (code, _, err) = tests::run_dissem(&all, Duration::from_secs(20));
        assert!(code.is_some_and(|c| c != 0), "exit {code:?}: {err}");
        assert!(err.contains("etcd-user"), "{err}");

        // TLS flags with a plain http:// URL: refused, the secret would cross in the clear
        let plain = etcd.url.replace("https://", "http://");
        let mut clear = args.clone();
        clear[6] = plain;
        let all: Vec<String> = [clear, etcd.flags()].concat();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let (code, _, err) = tests::run_dissem(&all, Duration::from_secs(20));
        assert!(code.is_some_and(|c| c != 0), "exit {code:?}: {err}");
        assert!(err.contains("in the clear"), "{err}");

        let mut cluster =
            ElectedCluster::start_on(&dissem_bin(), &dir, etcd, 2, (1, 3), 2, &small_node_flags())
                .await
                .expect("a cluster on the secured etcd");
        let mut traffic = Traffic::start(&cluster, 100).await.expect("traffic");
        tests::wait_acked(&traffic, 100).await;

        // etcd restarted: the tokens it gave are gone; everyone logs in again
        cluster.etcd.restart().await.expect("etcd back");
        tests::wait_acked(&traffic, traffic.acked().len() + 100).await;
        // the leader killed: the standby campaigns through the secured etcd
        let leader = cluster
            .wait_leader(Duration::from_secs(10))
            .await
            .expect("a leader");
        let new = cluster.kill_leader().await.expect("a new leader");
        assert_ne!(new.name, leader.name);
        tests::wait_acked(&traffic, traffic.acked().len() + 100).await;
        let n = tests::all_delivered_once(&mut traffic).await;
        eprintln!("{n} objects acknowledged on the secured etcd");
        drop(cluster);
    });
    let _ = std::fs::remove_dir_all(&dir);
}
