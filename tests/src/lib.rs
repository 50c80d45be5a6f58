//! Cluster-level tests with real processes: the process harness lives in `bench::procs`
//! (the cluster benchmark uses it too); this crate adds where the `dissem` binary is and the
//! tests themselves (`tests/cluster.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

pub use bench::procs::*;

pub mod browser;
pub mod ceph;

/// The `dissem` binary of this build (built on demand when a test runs alone).
pub fn dissem_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/dissem
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf();
    let bin = dir.join("dissem");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-p", "dissem"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok && bin.exists(), "could not build {}", bin.display());
    }
    bin
}

/// Starts a coordinator and `n` nodes of this build's `dissem`.
pub fn start_cluster(dir: &Path, n: u32, coord_args: &[&str], node_args: &[&str]) -> Cluster {
    Cluster::start(&dissem_bin(), dir, n, coord_args, node_args)
}

/// The runtime a test drives its clients on: two worker threads, like the machine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs `dissem token create` on `file` and returns the printed token.
pub fn token_create(file: &Path, name: &str, tenant: &str, roles: &str) -> String {
    let out = Command::new(dissem_bin())
        .args(["token", "create", "--auth-file"])
        .arg(file)
        .args(["--name", name, "--tenant", tenant, "--roles", roles])
        .output()
        .expect("dissem token create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(t.starts_with("dsm_"), "{t}");
    t
}

/// `msg` carrying `token` as a bearer token (none for `""`).
pub fn bearer<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if !token.is_empty() {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
    }
    r
}

/// Waits until the image of the node behind `ch` holds `n` subscriptions (asked with the
/// admin token `admin`).
pub async fn wait_image(ch: tonic::transport::Channel, admin: &str, n: u64) {
    wait_for(
        "the subscriptions to be published",
        std::time::Duration::from_secs(30),
        || {
            let ch = ch.clone();
            let admin = admin.to_string();
            async move {
                let st = proto::v1::admin_client::AdminClient::new(ch)
                    .stats(bearer(proto::v1::StatsRequest {}, &admin))
                    .await
                    .ok()?
                    .into_inner();
                (st.cluster?.image_subscriptions == n).then_some(())
            }
        },
    )
    .await;
}

/// A put of one object with `temp` = `t`.
pub fn temp_put(t: i64) -> proto::v1::PutRequest {
    proto::v1::PutRequest {
        metadata: vec![proto::v1::Attribute {
            name: "temp".into(),
            value: Some(proto::v1::Value {
                kind: Some(proto::v1::value::Kind::Integer(t)),
            }),
        }],
        ..Default::default()
    }
}

/// What a stream subscriber saw, by the integer attribute `n` of each object (-1: none): the
/// subscriptions each object was delivered to, in order.
pub type ByN = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<i64, Vec<u64>>>>;

/// Attaches to stream `name` on the node at `url` and records every delivery by its
/// object's `n` ([`ByN`]), acknowledging each, until the stream ends.
pub async fn collect_by_n(url: &str, name: &str) -> ByN {
    use proto::v1;
    let (tx, mut down) = attach(url, name).await;
    let got = ByN::default();
    let g2 = got.clone();
    tokio::spawn(async move {
        while let Ok(Some(d)) = down.message().await {
            let n = d
                .metadata
                .iter()
                .find(|a| a.name == "n")
                .and_then(|a| match a.value.as_ref()?.kind.as_ref()? {
                    v1::value::Kind::Integer(i) => Some(*i),
                    v1::value::Kind::Decimal(d) => d.parse().ok(),
                    _ => None,
                })
                .unwrap_or(-1);
            g2.lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(n)
                .or_default()
                .push(d.subscription_id);
            let ack = v1::stream_client_message::Kind::Ack(d.delivery_id);
            let _ = tx.send(v1::StreamClientMessage { kind: Some(ack) }).await;
        }
    });
    got
}

/// Opens stream `name` on the node at `url`: the sender for acks, and the deliveries.
pub async fn attach(
    url: &str,
    name: &str,
) -> (
    tokio::sync::mpsc::Sender<proto::v1::StreamClientMessage>,
    tonic::Streaming<proto::v1::Delivery>,
) {
    attach_as(url, name, "").await
}

/// [`attach`] presenting `token` (none when empty).
pub async fn attach_as(
    url: &str,
    name: &str,
    token: &str,
) -> (
    tokio::sync::mpsc::Sender<proto::v1::StreamClientMessage>,
    tonic::Streaming<proto::v1::Delivery>,
) {
    use proto::v1;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tx.send(v1::StreamClientMessage {
        kind: Some(v1::stream_client_message::Kind::Attach(name.into())),
    })
    .await
    .expect("attach");
    let down = v1::stream_client::StreamClient::new(channel(url))
        .open(bearer(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            token,
        ))
        .await
        .expect("open stream")
        .into_inner();
    (tx, down)
}

/// `dissem receive` on `at` journaling to `journal`, subscription `exactly_once` shown
/// exactly once.
pub fn start_receiver(at: std::net::SocketAddr, journal: &Path, exactly_once: u64) -> Proc {
    let args: Vec<String> = [
        "receive",
        "--listen",
        &at.to_string(),
        "--journal",
        &journal.display().to_string(),
        "--exactly-once",
        &exactly_once.to_string(),
    ]
    .map(String::from)
    .to_vec();
    Proc::start(&dissem_bin(), &args)
}

/// (subscription, subject) -> times a `dissem receive` showed it, from its journal.
pub fn shown(journal: &Path) -> std::collections::BTreeMap<(u64, String), u32> {
    let mut out = std::collections::BTreeMap::new();
    let text = std::fs::read_to_string(journal).unwrap_or_default();
    for (event, v) in text.lines().filter_map(worker::receiver::journal_line) {
        if event != "shown" {
            continue;
        }
        let (Some(sub), Some(subject)) = (v["subscription"].as_u64(), v["subject"].as_str()) else {
            continue;
        };
        *out.entry((sub, subject.to_string())).or_insert(0) += 1;
    }
    out
}

/// `dissem up` on a free port with its data in `dir`, the GPU off, and `extra` flags.
pub fn start_up(dir: &Path, extra: &[&str]) -> Proc {
    let mut args = vec![
        "up".to_string(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--gpu".into(),
        "off".into(),
        "--data".into(),
        dir.join("data").display().to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    Proc::start(&dissem_bin(), &args)
}

/// [`start_up`] with the tokens of `auth_file` and the S3 event endpoint on `s3`, over TLS
/// with `tls` (a certificate and its key, PEM files).
pub fn start_up_with_s3(
    dir: &Path,
    auth_file: &Path,
    s3: std::net::SocketAddr,
    tls: Option<(&Path, &Path)>,
) -> Proc {
    let mut args = vec![
        "--auth-file".to_string(),
        auth_file.display().to_string(),
        "--s3-events-listen".into(),
        s3.to_string(),
    ];
    if let Some((cert, key)) = tls {
        args.extend([
            "--s3-events-tls-cert".to_string(),
            cert.display().to_string(),
            "--s3-events-tls-key".into(),
            key.display().to_string(),
        ]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_up(dir, &args)
}

/// `dissem up` of this build of a cluster named `name` listening on `listen`, with its data
/// in `dir/name`, the GPU off, and `extra` flags.
pub fn cluster_up(dir: &Path, name: &str, listen: &str, extra: &[String]) -> Proc {
    bench::procs::cluster_up(&dissem_bin(), dir, name, listen, extra)
}

/// A CA and a certificate for `localhost` signed by it, as PEM files in `dir`:
/// (ca.pem, cert.pem, key.pem).
pub fn make_certs(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // names of their own: OpenSSL (Python's, Ceph's) takes a certificate whose subject is
    // its issuer's, both empty, for self-signed
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "dissem test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &issuer).expect("cert");
    let (ca, c, k) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&ca, ca_cert.pem()).expect("write ca");
    std::fs::write(&c, cert.pem()).expect("write cert");
    std::fs::write(&k, key.serialize_pem()).expect("write key");
    (ca, c, k)
}

/// One HTTP/1.1 request over TLS on `addr`, the server verified as `localhost` against the
/// CA in `ca` (PEM): (status, body).
pub async fn https(
    addr: std::net::SocketAddr,
    ca: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).map_err(std::io::Error::other)? {
        roots
            .add(c.map_err(std::io::Error::other)?)
            .map_err(std::io::Error::other)?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name =
        rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(name, tcp)
        .await?;
    http_on(tls, method, path, headers, body).await
}

/// One HTTP/1.1 request on `addr`: (status, body).
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    http_on(
        tokio::net::TcpStream::connect(addr).await?,
        method,
        path,
        headers,
        body,
    )
    .await
}

/// One HTTP/1.1 request on the connection `s`: (status, body).
async fn http_on<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

/// A stream subscriber on the node at `url`: attached to `stream`, then subscribed with
/// `filter`. The sender for acks, the deliveries and the subscription's id.
pub async fn stream_subscriber(
    url: &str,
    stream: &str,
    filter: proto::v1::subscription::Filter,
) -> (
    tokio::sync::mpsc::Sender<proto::v1::StreamClientMessage>,
    tonic::Streaming<proto::v1::Delivery>,
    u64,
) {
    let (tx, down) = attach(url, stream).await;
    let sub = proto::v1::subscriptions_client::SubscriptionsClient::new(channel(url))
        .create(proto::v1::CreateSubscriptionRequest {
            subscription: Some(proto::v1::Subscription {
                filter: Some(filter),
                target: Some(proto::v1::Target {
                    kind: Some(proto::v1::target::Kind::Stream(stream.into())),
                }),
                ..Default::default()
            }),
        })
        .await
        .expect("create")
        .into_inner()
        .id;
    (tx, down, sub)
}

/// Receives (and acks) deliveries until `want` distinct (publisher, n) pairs with `n` at
/// least `from` arrived; then until nothing more comes for a second. Returns how often each
/// pair arrived.
pub async fn receive_numbered(
    who: &str,
    tx: &tokio::sync::mpsc::Sender<proto::v1::StreamClientMessage>,
    down: &mut tonic::Streaming<proto::v1::Delivery>,
    want: usize,
    from: i64,
) -> std::collections::BTreeMap<(String, i64), usize> {
    let mut got: std::collections::BTreeMap<(String, i64), usize> = Default::default();
    let key = |d: &proto::v1::Delivery| {
        bench::recorder::numbered_key(d).unwrap_or_else(|| (String::new(), -1))
    };
    let mut settle = false;
    loop {
        let wait = if settle {
            std::time::Duration::from_secs(1)
        } else {
            std::time::Duration::from_secs(30)
        };
        match tokio::time::timeout(wait, down.message()).await {
            Ok(Ok(Some(d))) => {
                *got.entry(key(&d)).or_default() += 1;
                let ack = proto::v1::stream_client_message::Kind::Ack(d.delivery_id);
                tx.send(proto::v1::StreamClientMessage { kind: Some(ack) })
                    .await
                    .expect("ack");
                settle = got.keys().filter(|(_, n)| *n >= from).count() >= want;
            }
            Ok(other) => panic!("{who}: the stream ended: {other:?}"),
            Err(_) if settle => return got,
            Err(_) => panic!(
                "{who}: {} of {want} objects within 30 s: {:?}",
                got.len(),
                got.keys().collect::<Vec<_>>()
            ),
        }
    }
}

/// A `Federation` client of the node at `url`.
pub fn federation(
    url: &str,
) -> proto::v1::federation_client::FederationClient<tonic::transport::Channel> {
    proto::v1::federation_client::FederationClient::new(channel(url))
}

/// Puts `publisher`'s numbered objects `ns` ([`numbered_put`]) on the node at `url`, one
/// after another, each acknowledged.
pub async fn put_numbered(url: &str, publisher: &str, ns: std::ops::Range<i64>) {
    let mut c = proto::v1::ingest_client::IngestClient::new(channel(url));
    for n in ns {
        c.put(numbered_put(publisher, n)).await.expect("put");
    }
}

/// Runs `dissem <args> --json <json>` and reads the JSON it wrote: (the JSON, stdout, and
/// whether it exited 0). A missing or unreadable file fails with both outputs.
pub fn bench_json(args: &[&str], json: &Path) -> (serde_json::Value, String, bool) {
    let out = Command::new(dissem_bin())
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .expect("dissem runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let r = serde_json::from_str(&std::fs::read_to_string(json).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    }))
    .expect("JSON");
    (r, text, out.status.success())
}

/// Runs `dissem <args>` to its end (killed after `limit`): exit code (`None` if killed),
/// stdout and stderr.
pub fn run_dissem(args: &[&str], limit: std::time::Duration) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(dissem_bin());
    cmd.args(args);
    run_to_end(cmd, limit)
}

/// Runs `cmd` to its end (killed after `limit`), reading its output while it runs: exit
/// code (`None` if killed), stdout and stderr.
pub fn run_to_end(mut cmd: Command, limit: std::time::Duration) -> (Option<i32>, String, String) {
    use std::io::Read;
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    // read while it runs: a full pipe would block it
    let mut out_pipe = child.stdout.take().expect("stdout");
    let mut err_pipe = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let started = std::time::Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s.code();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    (
        code,
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// Stops `traffic`'s puts, then checks that every acknowledged object reached both of its
/// subscribers within a minute and that the QoS 2 one saw none twice; the answer is how
/// many objects were acknowledged.
pub async fn all_delivered_once(traffic: &mut bench::failoverbench::Traffic) -> usize {
    let objects = traffic.stop().await.expect("putter");
    let lost = traffic
        .undelivered(&objects, std::time::Duration::from_secs(60))
        .await;
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged objects undelivered, e.g. {:?}",
        lost.len(),
        objects.len(),
        &lost[..lost.len().min(5)]
    );
    assert_eq!(traffic.repeats().0, 0, "QoS 2 deliveries shown twice");
    objects.len()
}

/// Whether an `etcd` binary is here; without one a test says so and passes, unless
/// `DISSEM_REQUIRE_ETCD` is set (CI installs etcd and sets it), which fails it.
pub fn have_etcd() -> bool {
    if bench::elected::etcd_available() {
        return true;
    }
    assert!(
        std::env::var_os("DISSEM_REQUIRE_ETCD").is_none(),
        "DISSEM_REQUIRE_ETCD is set but there is no etcd binary (apt-get install etcd-server)"
    );
    eprintln!("skipped: no etcd binary on the PATH (apt-get install etcd-server)");
    false
}

/// Waits (up to 30 s) until `traffic` has `n` acknowledged puts.
pub async fn wait_acked(traffic: &bench::failoverbench::Traffic, n: usize) {
    wait_for(
        &format!("{n} acknowledged puts"),
        std::time::Duration::from_secs(30),
        || {
            let have = traffic.acked().len();
            async move { (have >= n).then_some(()) }
        },
    )
    .await;
}

/// Whether `python3` can import grpc and grpc_tools (`pip install grpcio grpcio-tools`).
pub fn have_python_grpc() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("DISSEM_REQUIRE_PYTHON").is_none(),
            "DISSEM_REQUIRE_PYTHON is set but python3 cannot import grpc and grpc_tools"
        );
        eprintln!("skipped: python3 with grpcio and grpcio-tools is not installed");
    }
    ok
}
