//! Real cluster processes on loopback, for the cluster benchmark and the cluster tests: it
//! starts `dissem coordinator` and `dissem node` as child processes (free ports, their own
//! data directories), kills them with SIGKILL, restarts them on the same address and data,
//! and waits on conditions with deadlines; plus the client calls both need.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proto::v1;
use tonic::transport::Channel;

/// One running process.
#[derive(Debug)]
pub struct Proc {
    child: Child,
    bin: PathBuf,
    /// `host:port` it listens on.
    pub addr: String,
    args: Vec<String>,
}

/// The log file of a child started with `args`, when `DISSEM_TEST_LOG_DIR` names a folder
/// (one per data directory, appended to across restarts).
fn log_file(args: &[String]) -> Option<std::fs::File> {
    let dir = PathBuf::from(std::env::var_os("DISSEM_TEST_LOG_DIR")?);
    let data = args
        .iter()
        .position(|a| a == "--data")
        .and_then(|i| args.get(i + 1))?;
    // the run's folder and the process's own: tests that run one after the other do not
    // write over each other's logs
    let data = Path::new(data);
    let run = data.parent().and_then(Path::file_name).unwrap_or_default();
    let name = format!(
        "{}-{}",
        run.to_string_lossy(),
        data.file_name()?.to_string_lossy()
    );
    std::fs::create_dir_all(&dir).ok()?;
    // appended to: a restarted process keeps what it logged before
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .ok()
}

impl Proc {
    /// Starts `<bin> <args>` (the dissem binary) and waits (up to 30 s) for its
    /// "listening on ADDR" line (or an elected coordinator's "campaigning" line: no address). Children log at `warn` unless `DISSEM_TEST_LOG` says more,
    /// to this process's stderr, or with `DISSEM_TEST_LOG_DIR` each to its own file there
    /// (named after its `--data` folder and the folder above it).
    pub fn start(bin: &Path, args: &[String]) -> Proc {
        let mut child = Command::new(bin)
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("DISSEM_TEST_LOG").unwrap_or("warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(log_file(args).map_or_else(Stdio::inherit, Stdio::from))
            .spawn()
            .expect("spawning dissem");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(l)) = lines.next() {
                let _ = tx.send(l);
            }
            for _ in lines {} // keep the pipe drained
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("dissem {args:?} did not report its address"));
        // an elected coordinator listens only once it leads (etcd names its address)
        let addr = if line.contains("campaigning through etcd") {
            String::new()
        } else {
            line.split("listening on ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
                .to_string()
        };
        Proc {
            child,
            bin: bin.to_path_buf(),
            addr,
            args: args.to_vec(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILL, and wait until it is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its exit status once it has ended (`None` while it runs).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends it a signal by name (`STOP`, `CONT`): a paused process keeps its sockets but
    /// answers nothing, as an overloaded or partitioned one.
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{name} {}", self.child.id());
    }

    /// Starts the same command again on the same address (after [`Proc::kill`]).
    pub fn restart(&mut self) {
        self.restart_with(&[]);
    }

    /// [`Proc::restart`] with `extra` arguments added (after [`Proc::kill`], which it does
    /// first if the process still runs).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.kill();
        let mut args = self.args.clone();
        args.extend(extra.iter().map(|a| a.to_string()));
        if let Some(i) = args.iter().position(|a| a == "--listen") {
            args[i + 1] = self.addr.clone();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // the port may linger for a moment after the kill
            if std::net::TcpListener::bind(&self.addr).is_ok() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        *self = Proc::start(&self.bin.clone(), &args);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A coordinator and `n` nodes, each with its own data directory under `dir`.
#[derive(Debug)]
pub struct Cluster {
    pub coordinator: Proc,
    pub nodes: Vec<Proc>,
    pub dir: PathBuf,
}

fn s(x: &str) -> String {
    x.to_string()
}

impl Cluster {
    /// Starts the coordinator, then `n` nodes (ids 1..=n) with `node_args` added.
    pub fn start(
        bin: &Path,
        dir: &Path,
        n: u32,
        coord_args: &[&str],
        node_args: &[&str],
    ) -> Cluster {
        Cluster::start_ids(bin, dir, 1..=n, coord_args, node_args)
    }

    /// Starts the coordinator, then one node per id of `ids` (in order) with `node_args`
    /// added: `nodes[k]` is the k-th id.
    pub fn start_ids(
        bin: &Path,
        dir: &Path,
        ids: impl IntoIterator<Item = u32>,
        coord_args: &[&str],
        node_args: &[&str],
    ) -> Cluster {
        let mut args = vec![
            s("coordinator"),
            s("--listen"),
            s("127.0.0.1:0"),
            s("--data"),
            dir.join("coordinator").display().to_string(),
        ];
        args.extend(coord_args.iter().map(|a| s(a)));
        let coordinator = Proc::start(bin, &args);
        let mut c = Cluster {
            coordinator,
            nodes: Vec::new(),
            dir: dir.to_path_buf(),
        };
        for i in ids {
            let p = c.start_node(bin, i, node_args);
            c.nodes.push(p);
        }
        c
    }

    /// Starts node `id` of this cluster (its data in `node<id>` under the cluster's
    /// directory), not yet in `nodes`.
    pub fn start_node(&self, bin: &Path, id: u32, node_args: &[&str]) -> Proc {
        let mut args = vec![
            s("node"),
            s("--listen"),
            s("127.0.0.1:0"),
            s("--data"),
            self.dir.join(format!("node{id}")).display().to_string(),
            s("--node"),
            id.to_string(),
            s("--coordinator"),
            self.coordinator.url(),
            s("--cluster-secret-file"),
            self.dir
                .join("coordinator")
                .join("cluster.secret")
                .display()
                .to_string(),
        ];
        args.extend(node_args.iter().map(|a| s(a)));
        Proc::start(bin, &args)
    }

    /// The data directory of node id `i`.
    pub fn node_data(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node{i}"))
    }
}

/// A fresh temporary directory (removed by the caller if it wants).
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "dissem-{name}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A lazily connected channel.
pub fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_string())
        .unwrap_or_else(|e| panic!("bad url {url:?}: {e}"))
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect_lazy()
}

/// Admin stats of a process.
pub async fn stats(url: &str) -> Result<v1::StatsResponse, tonic::Status> {
    v1::admin_client::AdminClient::new(channel(url))
        .stats(v1::StatsRequest {})
        .await
        .map(|r| r.into_inner())
}

/// Admin workers of a process.
pub async fn workers(url: &str) -> Result<Vec<v1::WorkerInfo>, tonic::Status> {
    v1::admin_client::AdminClient::new(channel(url))
        .workers(v1::WorkersRequest {})
        .await
        .map(|r| r.into_inner().workers)
}

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match try_wait_for(timeout, f).await {
        Some(t) => t,
        None => panic!("timed out waiting for {what}"),
    }
}

/// Polls `f` (every 20 ms) until it returns `Some`; `None` after `timeout`.
pub async fn try_wait_for<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = f().await {
            return Some(t);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates `subs` through `url` with `concurrency` calls in flight, calling `done` after
/// each; returns the assigned ids in order.
pub async fn create_all(
    url: &str,
    subs: Vec<v1::Subscription>,
    concurrency: usize,
    done: impl Fn(),
) -> Result<Vec<u64>, tonic::Status> {
    let client = v1::subscriptions_client::SubscriptionsClient::new(channel(url));
    let mut ids = vec![0u64; subs.len()];
    let mut todo = subs.into_iter().enumerate();
    let mut set = tokio::task::JoinSet::new();
    loop {
        while set.len() < concurrency.max(1)
            && let Some((i, s)) = todo.next()
        {
            let mut c = client.clone();
            let req = v1::CreateSubscriptionRequest {
                subscription: Some(s),
            };
            set.spawn(async move { (i, c.create(req).await) });
        }
        let Some(r) = set.join_next().await else {
            return Ok(ids);
        };
        let (i, r) = r.map_err(|e| tonic::Status::internal(format!("create task: {e}")))?;
        ids[i] = r?.into_inner().id;
        done();
    }
}

/// Registers `subs` through `url` by `CreateMany`, a thousand a call with `concurrency`
/// calls in flight; `done(n)` after each call with the number it created. Returns the
/// assigned ids in order.
pub async fn create_many(
    url: &str,
    subs: Vec<v1::Subscription>,
    concurrency: usize,
    done: impl Fn(u64),
) -> Result<Vec<u64>, tonic::Status> {
    let client = v1::subscriptions_client::SubscriptionsClient::new(channel(url));
    let chunks: Vec<Vec<v1::Subscription>> = subs
        .chunks(runtime::subscriptions::MAX_CREATE_MANY)
        .map(|c| c.to_vec())
        .collect();
    let mut ids = vec![Vec::new(); chunks.len()];
    let mut todo = chunks.into_iter().enumerate();
    let mut set = tokio::task::JoinSet::new();
    loop {
        while set.len() < concurrency.max(1)
            && let Some((i, subscriptions)) = todo.next()
        {
            let mut c = client.clone();
            let req = v1::CreateSubscriptionsRequest { subscriptions };
            set.spawn(async move { (i, c.create_many(req).await) });
        }
        let Some(r) = set.join_next().await else {
            return Ok(ids.into_iter().flatten().collect());
        };
        let (i, r) = r.map_err(|e| tonic::Status::internal(format!("create task: {e}")))?;
        ids[i] = r?.into_inner().subscriptions.iter().map(|s| s.id).collect();
        done(ids[i].len() as u64);
    }
}

/// Registers subscriptions (text filters, QoS 0 to stream "test") through `url` with
/// `concurrency` calls in flight; returns the assigned ids in order.
pub async fn subscribe_all(url: &str, filters: &[String], concurrency: usize) -> Vec<u64> {
    let subs = filters
        .iter()
        .map(|f| v1::Subscription {
            filter: Some(v1::subscription::Filter::Text(f.clone())),
            target: Some(v1::Target {
                kind: Some(v1::target::Kind::Stream("test".into())),
            }),
            qos: v1::Qos::AtMostOnce as i32,
            ..v1::Subscription::default()
        })
        .collect();
    create_all(url, subs, concurrency, || {})
        .await
        .expect("create subscription")
}

/// One object to put: metadata as (name, value) and a message id for deduplication.
pub fn put_request(event: &blocks::Event, message_id: String) -> v1::PutRequest {
    v1::PutRequest {
        data: Vec::new(),
        metadata: runtime::validate::attributes_to_proto(&event.attrs),
        priority: 0,
        message_id,
    }
}

/// Puts one object on the node at `url`, retrying (same message id, so at most one object
/// is stored) until it is acknowledged or `timeout` passes.
pub async fn put_retrying(
    url: &str,
    req: v1::PutRequest,
    timeout: Duration,
) -> Result<storage::ObjectId, tonic::Status> {
    let deadline = Instant::now() + timeout;
    let mut client = v1::ingest_client::IngestClient::new(channel(url));
    loop {
        match client.put(req.clone()).await {
            Ok(r) => {
                let id = r.into_inner().id.unwrap_or_default();
                return Ok(storage::ObjectId {
                    node: id.node,
                    seq: id.seq,
                });
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                client = v1::ingest_client::IngestClient::new(channel(url));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The flags of the small node processes that many-node benchmarks start (a grid of 30 on
/// two cores): CPU scan, loopback targets allowed, one or two workers, a 1 s outbox resend.
pub fn small_node_flags() -> Vec<String> {
    [
        "--gpu",
        "off",
        "--allow-private-targets",
        "--workers",
        "1",
        "--min-workers",
        "1",
        "--max-workers",
        "2",
        "--resend-ms",
        "1000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// [`try_wait_for`] for the benchmarks: a timeout is an error naming `what`.
pub async fn wait<T, F, Fut>(what: &str, timeout: Duration, f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match try_wait_for(timeout, f).await {
        Some(t) => Ok(t),
        None => anyhow::bail!("timed out waiting for {what}"),
    }
}

/// A QoS 1 subscription of `filter` (text syntax) pushing to the gRPC endpoint `target`, for
/// the caller to adjust.
pub fn grpc_subscription(filter: &str, target: &str) -> v1::Subscription {
    v1::Subscription {
        filter: Some(v1::subscription::Filter::Text(filter.into())),
        target: Some(v1::Target {
            kind: Some(v1::target::Kind::Grpc(target.to_string())),
        }),
        qos: v1::Qos::AtLeastOnce as i32,
        ..v1::Subscription::default()
    }
}

/// Creates `s` through the node (or coordinator) at `url`; the answer is its id.
pub async fn create_subscription(url: &str, s: v1::Subscription) -> Result<u64, tonic::Status> {
    Ok(
        v1::subscriptions_client::SubscriptionsClient::new(channel(url))
            .create(v1::CreateSubscriptionRequest {
                subscription: Some(s),
            })
            .await?
            .into_inner()
            .id,
    )
}

/// Creates a subscription with a gRPC push target through the node (or coordinator) at
/// `url`; the answer is its id.
pub async fn create_grpc_subscription(
    url: &str,
    filter: String,
    target: &str,
    qos: v1::Qos,
    retry: Option<v1::RetryPolicy>,
) -> Result<u64, tonic::Status> {
    let s = v1::Subscription {
        qos: qos as i32,
        retry,
        ..grpc_subscription(&filter, target)
    };
    create_subscription(url, s).await
}

/// Every delivery record (subscription, object) in a stopped node's store.
pub fn delivery_records(data: &Path, node: u32) -> Vec<(u64, storage::ObjectId)> {
    let store = storage::Store::open(data, node).expect("opening a stopped node's store");
    store.delivery_keys().expect("reading delivery records")
}

/// A put from `publisher` numbered `n` (attributes `pub` and `n`; message id `publisher-n`).
pub fn numbered_put(publisher: &str, n: i64) -> v1::PutRequest {
    let attr = |name: &str, kind| v1::Attribute {
        name: name.into(),
        value: Some(v1::Value { kind: Some(kind) }),
    };
    v1::PutRequest {
        metadata: vec![
            attr("pub", v1::value::Kind::Text(publisher.into())),
            attr("n", v1::value::Kind::Integer(n)),
        ],
        message_id: format!("{publisher}-{n}"),
        ..Default::default()
    }
}

/// A loopback address with a port free now (for a process that must know its peers'
/// addresses before they start).
pub fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// `dissem up` (the binary `bin`) of a cluster named `name` listening on `listen`, with its
/// data in `dir/name`, the GPU off, and `extra` flags.
pub fn cluster_up(bin: &Path, dir: &Path, name: &str, listen: &str, extra: &[String]) -> Proc {
    let mut args: Vec<String> = [
        "up",
        "--listen",
        listen,
        "--gpu",
        "off",
        "--cluster-name",
        name,
        "--data",
        &dir.join(name).display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().cloned());
    Proc::start(bin, &args)
}
