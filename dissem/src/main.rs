//! The `dissem` command line. Thin by design: it parses arguments and calls into the library
//! crates; all behaviour lives there.

use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc instead of the system allocator: a delivery allocates and frees many small
/// buffers across threads (protobuf, HTTP, JSON), where glibc's malloc, free, consolidation and
/// chunk unlinking took about a fifth of the end-to-end CPU time.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::bail;
use bench::matchbench::{self, EngineChoice, MatchBenchOptions};
use bench::workload::{UniformSpec, Workload};
use bench::{Strategy, StrategyChoice};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

mod config;
mod embedded;

/// A storage-integrated content dissemination cluster.
#[derive(Parser, Debug)]
#[command(name = "dissem", version, about)]
struct Cli {
    /// A TOML file of settings, one [command] table of long-flag keys (see README); flags and
    /// DISSEM_* environment variables override it.
    #[arg(long, global = true, env = "DISSEM_CONFIG")]
    config: Option<PathBuf>,
    /// Logs as JSON lines (the filter comes from RUST_LOG, default info).
    #[arg(long, global = true, env = "DISSEM_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs an embedded single-node cluster: storage, the coordinator and one node daemon in
    /// one process, serving the public gRPC API (with server reflection).
    Up {
        #[command(flatten)]
        up: UpArgs,
        #[command(flatten)]
        workers: WorkerFlags,
    },
    /// Runs the coordinator of a multi-process cluster: the subscription registry (its data
    /// images), task scheduling for the node daemons, the public Subscriptions API and Admin.
    Coordinator(CoordinatorArgs),
    /// Runs a storage node of a multi-process cluster: the public API plus a node daemon whose
    /// elastic workers run test and match tasks on the coordinator's orders.
    Node(NodeArgs),
    /// Stores one object on a node (metadata as name=value; quote strings that look numeric).
    Put {
        #[command(flatten)]
        node: NodeArg,
        /// Metadata attribute, name=value (repeatable).
        #[arg(long = "attr")]
        attrs: Vec<String>,
        /// The object's bytes (UTF-8 text); empty by default.
        #[arg(long, default_value = "")]
        data: String,
        /// Priority 0..=7.
        #[arg(long, default_value_t = 0)]
        priority: u32,
    },
    /// Registers a subscription (text filter, or EventBridge JSON starting with `{`).
    Subscribe {
        #[command(flatten)]
        node: NodeArg,
        /// The filter, e.g. 'temp > 30 && site prefix "kr/"'.
        #[arg(long)]
        filter: String,
        /// Where to push: grpc:URL, webhook:URL or stream:NAME.
        #[arg(long)]
        target: String,
        /// 0 at most once, 1 at least once, 2 exactly once.
        #[arg(long, default_value_t = 1)]
        qos: u32,
        /// Priority 0..=7 of the deliveries.
        #[arg(long, default_value_t = 0)]
        priority: u32,
    },
    /// Deletes a subscription.
    Unsubscribe {
        #[command(flatten)]
        node: NodeArg,
        /// The subscription id.
        id: u64,
    },
    /// Lists subscriptions.
    Subscriptions {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Prints a node's counters (or, given the coordinator's URL, the cluster's).
    Stats {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Lists a node's dead letters (deliveries given up on), or redrives them.
    DeadLetters {
        #[command(flatten)]
        node: NodeArg,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Put every dead letter of the node back to pending.
        #[arg(long)]
        redrive_all: bool,
    },
    /// Lists a node's workers (or, given the coordinator's URL, every worker of the cluster).
    Workers {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Runs the whole system on this machine: an embedded cluster in a temporary directory,
    /// local subscriber endpoints of every kind, an iot subscription set, objects put at a
    /// target rate; prints what was delivered, lost, duplicated and how fast.
    Demo {
        /// Subscriptions (iot workload), spread over gRPC QoS 1, gRPC QoS 2, webhook QoS 1
        /// and stream QoS 0 endpoints.
        #[arg(long, default_value_t = 100_000)]
        subs: usize,
        /// Objects to put.
        #[arg(long, default_value_t = 2_000)]
        objects: usize,
        /// Objects per second.
        #[arg(long, default_value_t = 200.0)]
        rate: f64,
        /// Random seed of the workload.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write the summary as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Manages the tokens of an auth file.
    Token {
        #[command(subcommand)]
        which: TokenCmd,
    },
    /// Benchmarks that print figures and optionally write JSON.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(clap::Args, Debug)]
struct NodeArg {
    /// The node's gRPC address.
    #[arg(
        long = "node-url",
        default_value = "http://127.0.0.1:7700",
        env = "DISSEM_NODE_URL"
    )]
    url: String,
    /// The bearer token to present (a node with --auth-file requires one).
    #[arg(long, env = "DISSEM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The CA certificate (PEM) an `https://` node's certificate is verified against
    /// (default: the bundled web roots).
    #[arg(long, env = "DISSEM_TLS_CA")]
    tls_ca: Option<PathBuf>,
}

fn client<F, Fut>(node: &NodeArg, f: F) -> anyhow::Result<bool>
where
    F: FnOnce(worker::client::Channel) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<String>, runtime::ServiceError>>,
{
    let rt = tokio::runtime::Runtime::new()?;
    let lines = rt.block_on(async {
        let ch = worker::client::connect(&node.url, node.token.as_deref(), node.tls_ca.as_deref())
            .await?;
        f(ch).await
    })?;
    for l in lines {
        println!("{l}");
    }
    Ok(true)
}

#[derive(clap::Args, Debug)]
struct UpArgs {
    /// Address to serve the gRPC API on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: std::net::SocketAddr,
    /// Directory of the node's data (created if missing).
    #[arg(long, default_value = "./dissem-data")]
    data: PathBuf,
    /// This node's id (part of every object id it assigns).
    #[arg(long, default_value_t = 1)]
    node: u32,
    /// Largest object payload in bytes.
    #[arg(long, default_value_t = runtime::Limits::default().max_object_bytes)]
    max_object_bytes: usize,
    /// Most metadata attributes per object.
    #[arg(long, default_value_t = runtime::Limits::default().max_attributes)]
    max_attributes: usize,
    /// Requests per second one client connection may make.
    #[arg(long, default_value_t = runtime::Limits::default().max_requests_per_second_per_connection)]
    max_requests_per_second: u32,
    /// Delete objects whose dissemination is finished, acknowledged deliveries and dead
    /// letters once older than this many seconds (0 keeps them forever). Checked every minute.
    #[arg(long, default_value_t = 0)]
    retain_seconds: u64,
    /// Keep at most this many objects: the oldest finished ones go first (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_objects: usize,
    /// Serve Prometheus metrics (`GET /metrics`) on this address.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    listen_flags: ListenFlags,
}

/// Connection limits of a gRPC listener (`up`, `node`, `coordinator`).
#[derive(clap::Args, Debug)]
struct ListenFlags {
    /// Most client connections open at once (also bounded by the process's file descriptor
    /// limit); past it new connections are closed at once.
    #[arg(long, default_value_t = runtime::listen::ListenConfig::default().max_connections)]
    max_connections: usize,
    /// A new connection must send its first bytes (the HTTP/2 preface) within this many ms.
    #[arg(long, default_value_t = 10_000)]
    handshake_timeout_ms: u64,
    /// A connection with no request in flight for this many seconds is closed.
    #[arg(long, default_value_t = 300)]
    idle_timeout_s: u64,
    /// HTTP/2 pings to a quiet client this often (s); one unanswered for 20 s closes the
    /// connection (half-open peers).
    #[arg(long, default_value_t = 30)]
    keepalive_s: u64,
    /// Authenticate callers with the tokens of this file (TOML; `dissem token create` adds
    /// tokens). Without it every caller may do everything.
    #[arg(long, env = "DISSEM_AUTH_FILE")]
    auth_file: Option<PathBuf>,
    /// Serve on a non-loopback address without --auth-file (the public API is then open to
    /// anyone who can reach the address).
    #[arg(long)]
    insecure: bool,
    /// Serve only TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Demand client certificates signed by this CA (PEM): mutual TLS.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// The CA (PEM) that signed the other processes of the cluster, for this process's own
    /// calls to `https://` peers (it presents --tls-cert to them).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
}

impl ListenFlags {
    fn config(&self) -> anyhow::Result<runtime::listen::ListenConfig> {
        if self.max_connections == 0
            || self.handshake_timeout_ms == 0
            || self.idle_timeout_s == 0
            || self.keepalive_s == 0
        {
            bail!(
                "--max-connections, --handshake-timeout-ms, --idle-timeout-s and --keepalive-s \
                 must be at least 1"
            );
        }
        Ok(runtime::listen::ListenConfig {
            max_connections: self.max_connections,
            handshake_timeout: std::time::Duration::from_millis(self.handshake_timeout_ms),
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout_s),
            keepalive_interval: std::time::Duration::from_secs(self.keepalive_s),
            ..runtime::listen::ListenConfig::default()
        })
    }

    /// Refuses a non-loopback address without authentication unless `--insecure` was given.
    fn check_address(&self, addr: std::net::SocketAddr) -> anyhow::Result<()> {
        if addr.ip().is_loopback() || self.auth_file.is_some() {
            return Ok(());
        }
        if !self.insecure {
            bail!(
                "refusing to listen on {addr} without authentication: pass --auth-file FILE, \
                 listen on 127.0.0.1, or pass --insecure to serve this address to anyone"
            );
        }
        eprintln!("warning: serving {addr} with --insecure: callers are not authenticated");
        Ok(())
    }

    /// The guarded listener: connection limits and, with --auth-file, authentication.
    fn listener(
        &self,
        tcp: tokio::net::TcpListener,
        limits: &runtime::Limits,
    ) -> anyhow::Result<runtime::listen::Listener> {
        let auth = match &self.auth_file {
            None => None,
            Some(p) => {
                let a = runtime::auth::Auth::load(p)?;
                eprintln!(
                    "authenticating callers with {} tokens of {}",
                    a.len(),
                    p.display()
                );
                Some(std::sync::Arc::new(a))
            }
        };
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => {
                let id = runtime::tls::identity(c, k)?;
                let client_ca = self
                    .tls_client_ca
                    .as_deref()
                    .map(runtime::tls::ca)
                    .transpose()?;
                Some(runtime::tls::server(
                    id,
                    client_ca,
                    limits.listen.handshake_timeout,
                ))
            }
            _ => None,
        };
        // this process's calls to https:// peers of the cluster
        let peer_ca = self.tls_ca.as_deref().map(runtime::tls::ca).transpose()?;
        let own = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some(runtime::tls::identity(c, k)?),
            _ => None,
        };
        runtime::tls::set_client(runtime::tls::client(peer_ca, own));
        Ok(runtime::listen::Listener::new(tcp, limits.listen)
            .with_auth(auth)
            .with_tls(tls))
    }

    /// The scheme this listener is reached by.
    fn scheme(&self) -> &'static str {
        if self.tls_cert.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// Binds the metrics listener when asked for.
async fn metrics_listener(
    addr: Option<std::net::SocketAddr>,
) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    match addr {
        None => Ok(None),
        Some(a) => {
            let (l, bound) = runtime::bind(a).await?;
            eprintln!("metrics on http://{bound}/metrics");
            Ok(Some(l))
        }
    }
}

fn up(a: UpArgs, w: WorkerFlags) -> anyhow::Result<bool> {
    w.check()?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        std::fs::create_dir_all(&a.data).map_err(|e| {
            anyhow::anyhow!("creating the data directory {}: {e}", a.data.display())
        })?;
        let store = storage::Store::open(&a.data, a.node)
            .map_err(|e| anyhow::anyhow!("opening the store in {}: {e}", a.data.display()))?;
        let pending = store.outbox_len();
        a.listen_flags.check_address(a.listen)?;
        let (listener, addr) = runtime::bind(a.listen).await?;
        let limits = runtime::Limits {
            max_object_bytes: a.max_object_bytes,
            max_attributes: a.max_attributes,
            max_requests_per_second_per_connection: a.max_requests_per_second.max(1),
            allow_private_targets: w.allow_private_targets,
            listen: a.listen_flags.config()?,
            ..runtime::Limits::default()
        };
        if a.retain_seconds > 0 || a.max_objects > 0 {
            tokio::spawn(worker::retain(
                store.clone(),
                std::time::Duration::from_secs(a.retain_seconds),
                (a.max_objects > 0).then_some(a.max_objects),
                std::time::Duration::from_secs(60),
            ));
        }
        // the first line on stdout is the address, for scripts and tests
        println!(
            "dissem node {} listening on {addr} (data in {}, {pending} outbox records to replay)",
            a.node,
            a.data.display()
        );
        use std::io::Write;
        std::io::stdout().flush()?;
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        let daemon = w.daemon_config(a.node, String::new(), String::new())?;
        let metrics = metrics_listener(a.metrics_listen).await?;
        let listener = a.listen_flags.listener(listener, &limits)?;
        embedded::run(
            listener,
            store,
            limits,
            coordinator::server::ServerConfig::default(),
            daemon,
            metrics,
            shutdown,
        )
        .await?;
        Ok(true)
    })
}

#[derive(clap::Args, Debug)]
struct CoordinatorArgs {
    /// Address to serve gRPC on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7600")]
    listen: std::net::SocketAddr,
    /// Directory of the coordinator's data: subscriptions and their images.
    #[arg(long, default_value = "./dissem-coordinator")]
    data: PathBuf,
    /// Objects per test task (values of one attribute) and per match task.
    #[arg(long, default_value_t = coordinator::Config::default().test_batch)]
    batch: usize,
    /// A batch closes this many ms after its first object at the latest.
    #[arg(long, default_value_t = coordinator::Config::default().batch_deadline_ms)]
    batch_deadline_ms: u64,
    /// Close batches only on size or deadline. By default a batch also starts at once when a
    /// worker holding its block is idle, none of its tasks runs and its last batch closed at
    /// least a deadline ago (no batching wait at low load).
    #[arg(long)]
    always_batch: bool,
    /// A worker whose lease (renewed by its node's heartbeats) is older is not given tasks.
    #[arg(long, default_value_t = coordinator::Config::default().lease_ms)]
    lease_ms: u64,
    /// A task is reassigned after this multiple of its kind's mean completion time...
    #[arg(long, default_value_t = coordinator::Config::default().timeout_multiple)]
    timeout_multiple: f64,
    /// ...but never before this many ms.
    #[arg(long, default_value_t = coordinator::Config::default().min_timeout_ms)]
    min_timeout_ms: u64,
    /// Serve Prometheus metrics (`GET /metrics`) on this address.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The cluster secret that nodes present on internal calls (created with a random secret,
    /// mode 0600, if missing). Default: cluster.secret in the data directory.
    #[arg(long)]
    cluster_secret_file: Option<PathBuf>,
    /// Allow subscriptions whose targets are on loopback, private and link-local addresses.
    #[arg(long)]
    allow_private_targets: bool,
    #[command(flatten)]
    listen_flags: ListenFlags,
}

fn coordinator_cmd(a: CoordinatorArgs) -> anyhow::Result<bool> {
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if a.timeout_multiple.is_nan() || a.timeout_multiple < 1.0 {
        bail!(
            "--timeout-multiple must be at least 1, got {}",
            a.timeout_multiple
        );
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        std::fs::create_dir_all(&a.data).map_err(|e| {
            anyhow::anyhow!("creating the data directory {}: {e}", a.data.display())
        })?;
        let store = storage::Store::open(&a.data, 0)
            .map_err(|e| anyhow::anyhow!("opening the store in {}: {e}", a.data.display()))?;
        a.listen_flags.check_address(a.listen)?;
        let secret_file = a
            .cluster_secret_file
            .clone()
            .unwrap_or_else(|| a.data.join("cluster.secret"));
        let cluster_secret = runtime::cluster_secret::ClusterSecret::load_or_create(&secret_file)?;
        let limits = runtime::Limits {
            allow_private_targets: a.allow_private_targets,
            listen: a.listen_flags.config()?,
            ..runtime::Limits::default()
        };
        let (listener, addr) = runtime::bind(a.listen).await?;
        let cfg = coordinator::server::ServerConfig {
            sched: coordinator::Config {
                test_batch: a.batch,
                match_batch: a.batch,
                batch_deadline_ms: a.batch_deadline_ms,
                eager_close: !a.always_batch,
                lease_ms: a.lease_ms,
                timeout_multiple: a.timeout_multiple,
                min_timeout_ms: a.min_timeout_ms,
                ..coordinator::Config::default()
            },
            cluster_secret,
            ..coordinator::server::ServerConfig::default()
        };
        println!(
            "dissem coordinator listening on {addr} (data in {}, cluster secret in {})",
            a.data.display(),
            secret_file.display()
        );
        use std::io::Write;
        std::io::stdout().flush()?;
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        let metrics = metrics_listener(a.metrics_listen).await?;
        let listener = a.listen_flags.listener(listener, &limits)?;
        coordinator::server::serve(listener, store, limits, cfg, metrics, shutdown).await?;
        Ok(true)
    })
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum GpuArg {
    Auto,
    On,
    Off,
}

/// Settings of a node daemon's workers (`up` and `node`).
#[derive(clap::Args, Debug)]
struct WorkerFlags {
    /// Empty workers started at once.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Workers load regulation keeps even when the node is busy.
    #[arg(long, default_value_t = 2)]
    min_workers: usize,
    /// Workers never exceeded.
    #[arg(long, default_value_t = 16)]
    max_workers: usize,
    /// CPU utilisation (0..=1) above which every idle worker is terminated.
    #[arg(long, default_value_t = 0.85)]
    cpu_high: f64,
    /// CPU utilisation below which one empty worker is started per sample.
    #[arg(long, default_value_t = 0.60)]
    cpu_low: f64,
    /// How often the CPU is sampled, ms.
    #[arg(long, default_value_t = 1000)]
    regulate_ms: u64,
    /// Workers without a task for this many seconds are cleaned up.
    #[arg(long, default_value_t = 300)]
    idle_cleanup_s: u64,
    /// Outbox records older than this many ms are sent to the coordinator again.
    #[arg(long, default_value_t = 5000)]
    resend_ms: u64,
    /// Where match blocks run their subset scan: `auto` uses a hardware GPU when one opens
    /// (the CPU otherwise), `on` any adapter including software ones (Mesa's lavapipe),
    /// `off` always the CPU.
    #[arg(long, value_enum, default_value_t = GpuArg::Auto)]
    gpu: GpuArg,
    /// Allow delivery targets on loopback, private and link-local addresses (refused by
    /// default, so subscriptions cannot reach into the operator's network).
    #[arg(long)]
    allow_private_targets: bool,
    /// Calls in flight per target endpoint (each carries up to --push-batch deliveries).
    #[arg(long, default_value_t = 16)]
    in_flight_per_endpoint: usize,
    /// Most deliveries in one call to an endpoint: pushes that queue while every call to it
    /// is out go together in the next (a webhook POST as a CloudEvents batch, or one gRPC
    /// `Subscriber.DeliverBatch` for QoS 0/1); 1 sends each delivery on its own.
    #[arg(long, alias = "webhook-batch", default_value_t = 64)]
    push_batch: usize,
    /// Extra CA certificates (PEM) that HTTPS webhooks may be signed by, besides the bundled
    /// web roots.
    #[arg(long)]
    webhook_ca: Option<PathBuf>,
    /// Push to new webhook URLs without first asking them to consent (the CloudEvents
    /// abuse-protection handshake: OPTIONS with WebHook-Request-Origin), for receivers that
    /// cannot answer it.
    #[arg(long)]
    skip_webhook_validation: bool,
    /// Record matches as pending deliveries without pushing them (benchmarks of the matching
    /// pipeline, or when another system drains the delivery records).
    #[arg(long)]
    no_delivery: bool,
    /// Run all matching and pushing at one OS priority. By default, while the node has a
    /// backlog (300 objects in its outbox), objects below priority 7 are matched and pushed
    /// on threads of lower OS priority (nice +10), so the CPU serves writes and priority-7
    /// objects first.
    #[arg(long)]
    no_bulk_lane: bool,
}

impl WorkerFlags {
    fn check(&self) -> anyhow::Result<()> {
        if !(0.0..=1.0).contains(&self.cpu_low)
            || self.cpu_high.is_nan()
            || self.cpu_low > self.cpu_high
        {
            bail!(
                "--cpu-low ({}) must be in 0..=1 and at most --cpu-high ({})",
                self.cpu_low,
                self.cpu_high
            );
        }
        if self.min_workers > self.max_workers || self.max_workers == 0 {
            bail!(
                "--min-workers ({}) must not exceed --max-workers ({}), which must be at least 1",
                self.min_workers,
                self.max_workers
            );
        }
        if self.regulate_ms == 0 || self.resend_ms == 0 {
            bail!("--regulate-ms and --resend-ms must be at least 1");
        }
        Ok(())
    }

    fn daemon_config(
        &self,
        node: u32,
        coordinator: String,
        endpoint: String,
    ) -> anyhow::Result<worker::daemon::DaemonConfig> {
        let mut cfg = worker::daemon::DaemonConfig::new(node, coordinator, endpoint);
        if let Some(p) = &self.webhook_ca {
            let pem = std::fs::read(p)
                .map_err(|e| anyhow::anyhow!("reading --webhook-ca {}: {e}", p.display()))?;
            // checked now, so a bad file is named at start
            worker::push_http::webhook_tls(Some(&pem))?;
            cfg.delivery.webhook_ca_pem = Some(std::sync::Arc::new(pem));
        }
        cfg.delivery.skip_webhook_validation = self.skip_webhook_validation;
        cfg.initial_workers = self.workers;
        cfg.regulator = worker::regulate::RegulatorConfig {
            upper: self.cpu_high,
            lower: self.cpu_low,
            min_workers: self.min_workers,
            max_workers: self.max_workers,
            idle_cleanup_ms: self.idle_cleanup_s * 1000,
        };
        cfg.regulate_every = std::time::Duration::from_millis(self.regulate_ms);
        cfg.resend_after = std::time::Duration::from_millis(self.resend_ms);
        cfg.delivery.allow_private_targets = self.allow_private_targets;
        cfg.delivery.enabled = !self.no_delivery;
        cfg.delivery.in_flight_per_endpoint = self.in_flight_per_endpoint.max(1);
        cfg.delivery.push_batch = self.push_batch.max(1);
        cfg.bulk_lane = !self.no_bulk_lane;
        cfg.gpu = match self.gpu {
            GpuArg::Auto => worker::daemon::GpuUse::Hardware,
            GpuArg::On => worker::daemon::GpuUse::Any,
            GpuArg::Off => worker::daemon::GpuUse::Off,
        };
        Ok(cfg)
    }
}

#[derive(clap::Args, Debug)]
struct NodeArgs {
    #[command(flatten)]
    up: UpArgs,
    /// The coordinator's URL.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7600",
        env = "DISSEM_COORDINATOR_URL"
    )]
    coordinator: String,
    /// The URL other processes reach this node at (default: http:// + the listen address).
    #[arg(long)]
    advertise: Option<String>,
    /// The cluster secret that internal calls carry: the file the coordinator keeps
    /// (`cluster.secret` in its data directory, or its --cluster-secret-file).
    #[arg(long, env = "DISSEM_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    #[command(flatten)]
    workers: WorkerFlags,
}

fn node_cmd(a: NodeArgs) -> anyhow::Result<bool> {
    a.workers.check()?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let u = &a.up;
        std::fs::create_dir_all(&u.data).map_err(|e| {
            anyhow::anyhow!("creating the data directory {}: {e}", u.data.display())
        })?;
        let store = storage::Store::open(&u.data, u.node)
            .map_err(|e| anyhow::anyhow!("opening the store in {}: {e}", u.data.display()))?;
        u.listen_flags.check_address(u.listen)?;
        let secret_file = a.cluster_secret_file.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "a cluster node needs its coordinator's cluster secret: pass \
                 --cluster-secret-file (the coordinator writes it to cluster.secret in its data \
                 directory)"
            )
        })?;
        let (listener, addr) = runtime::bind(u.listen).await?;
        let limits = runtime::Limits {
            max_object_bytes: u.max_object_bytes,
            max_attributes: u.max_attributes,
            max_requests_per_second_per_connection: u.max_requests_per_second.max(1),
            allow_private_targets: a.workers.allow_private_targets,
            listen: u.listen_flags.config()?,
            ..runtime::Limits::default()
        };
        if u.retain_seconds > 0 || u.max_objects > 0 {
            tokio::spawn(worker::retain(
                store.clone(),
                std::time::Duration::from_secs(u.retain_seconds),
                (u.max_objects > 0).then_some(u.max_objects),
                std::time::Duration::from_secs(60),
            ));
        }
        let endpoint = a
            .advertise
            .clone()
            .unwrap_or_else(|| format!("{}://{addr}", u.listen_flags.scheme()));
        let mut cfg = a
            .workers
            .daemon_config(u.node, a.coordinator.clone(), endpoint)?;
        cfg.cluster_secret = runtime::cluster_secret::ClusterSecret::load(secret_file)?;
        println!(
            "dissem node {} listening on {addr} (data in {}, coordinator {})",
            u.node,
            u.data.display(),
            a.coordinator
        );
        use std::io::Write;
        std::io::stdout().flush()?;
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        let metrics = metrics_listener(u.metrics_listen).await?;
        let listener = u.listen_flags.listener(listener, &limits)?;
        worker::run_node(listener, store, limits, cfg, metrics, shutdown).await?;
        Ok(true)
    })
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Creates a token: prints it once and stores only its SHA-256 in the auth file (created,
    /// mode 0600, if missing). Nodes read the file at start.
    Create {
        /// The auth file (TOML).
        #[arg(long, env = "DISSEM_AUTH_FILE")]
        auth_file: PathBuf,
        /// The token's name (letters, digits, _ . -), unique in the file.
        #[arg(long)]
        name: String,
        /// The tenant it acts for.
        #[arg(long)]
        tenant: String,
        /// Comma-separated roles among ingest, subscribe, read, admin.
        #[arg(long, value_delimiter = ',', required = true)]
        roles: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// Matching throughput of each engine on a synthetic workload.
    Match(MatchArgs),
    /// Durable puts per second through the gRPC API vs sled with a flush per write.
    Ingest(IngestArgs),
    /// Objects per second through ingest -> test -> match with 1, 2, 4 node processes.
    Cluster(ClusterArgs),
    /// Durable put -> push delivered (gRPC and webhook): saturation, half load, 2x overload.
    E2e(E2eArgs),
}

#[derive(clap::Args, Debug)]
struct E2eArgs {
    /// Subscriptions of the iot workload.
    #[arg(long, default_value_t = 100_000)]
    subs: usize,
    /// Objects of the saturation phase.
    #[arg(long, default_value_t = 5_000)]
    objects: usize,
    /// Seconds of the half-load and overload phases.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Concurrent writers in the saturation phase.
    #[arg(long, default_value_t = 64)]
    writers: usize,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the latency plot (SVG) to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn bench_e2e(a: E2eArgs) -> anyhow::Result<bool> {
    let report = bench::e2e::run(&bench::e2e::E2eOptions {
        bin: std::env::current_exe()?,
        subs: a.subs,
        objects: a.objects,
        seconds: a.seconds,
        writers: a.writers,
        seed: a.seed,
    })?;
    bench::e2e::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    if let Some(path) = &a.svg {
        std::fs::write(path, bench::e2e::svg(&report))
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    Ok(report.lost == 0)
}

#[derive(clap::Args, Debug)]
struct ClusterArgs {
    /// Node process counts to run (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 2, 4])]
    nodes: Vec<u32>,
    /// Subscriptions of the iot workload.
    #[arg(long, default_value_t = 100_000)]
    subs: usize,
    /// Objects put per node count.
    #[arg(long, default_value_t = 20_000)]
    objects: usize,
    /// Concurrent writers.
    #[arg(long, default_value_t = 64)]
    writers: usize,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Objects also checked against the naive reference matcher.
    #[arg(long, default_value_t = 200)]
    check_objects: usize,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn demo(
    subs: usize,
    objects: usize,
    rate: f64,
    seed: u64,
    json: Option<PathBuf>,
) -> anyhow::Result<bool> {
    let report = bench::demo::run(&bench::demo::DemoOptions {
        bin: std::env::current_exe()?,
        subs,
        objects,
        rate,
        seed,
    })?;
    bench::demo::print(&report);
    if let Some(path) = &json {
        bench::write_json(path, &report)?;
    }
    Ok(report.lost == 0 && report.duplicates_by_qos.get(&2).is_none_or(|d| *d == 0))
}

fn bench_cluster(a: ClusterArgs) -> anyhow::Result<bool> {
    if a.subs == 0 || a.objects == 0 || a.writers == 0 || a.writers > 1024 {
        bail!("--subs and --objects must be at least 1, --writers between 1 and 1024");
    }
    let report = bench::clusterbench::run(&bench::clusterbench::ClusterOptions {
        bin: std::env::current_exe()?,
        nodes: a.nodes,
        subs: a.subs,
        objects: a.objects,
        writers: a.writers,
        seed: a.seed,
        check_objects: a.check_objects,
    })?;
    bench::clusterbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    Ok(report.identical_matches)
}

#[derive(clap::Args, Debug)]
struct IngestArgs {
    /// Object sizes in bytes (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 65536])]
    sizes: Vec<usize>,
    /// Concurrent writers (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64])]
    writers: Vec<usize>,
    /// Seconds per configuration and path.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Puts each writer keeps in flight on its PutStream in the pipelined row.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn bench_ingest(a: IngestArgs) -> anyhow::Result<bool> {
    if a.sizes
        .iter()
        .any(|&s| s == 0 || s > runtime::Limits::default().max_object_bytes)
    {
        bail!(
            "--sizes must be between 1 and {} bytes",
            runtime::Limits::default().max_object_bytes
        );
    }
    if a.writers.iter().any(|&w| w == 0 || w > 1024) {
        bail!("--writers must be between 1 and 1024");
    }
    if !(a.seconds > 0.0 && a.seconds <= 600.0) {
        bail!("--seconds must be in (0, 600], got {}", a.seconds);
    }
    if !(1..=4096).contains(&a.window) {
        bail!("--window must be between 1 and 4096, got {}", a.window);
    }
    let report = bench::ingestbench::run(&bench::ingestbench::IngestOptions {
        sizes: a.sizes,
        writers: a.writers,
        seconds: a.seconds,
        window: a.window,
    })?;
    bench::ingestbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    Ok(true)
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum WorkloadArg {
    Iot,
    Uniform,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum EngineArg {
    /// The match block with its per-shard strategy.
    Cpu,
    /// The match block forced onto the Bloom subset path (the GPU's path, run on the CPU).
    Bloom,
    /// The Bloom subset path with the scan on the GPU (wgpu; falls back to the CPU twin).
    Gpu,
    /// The naive reference matcher.
    Naive,
    /// Every engine above.
    All,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum StrategyArg {
    /// Chosen per shard from its statistics.
    Auto,
    /// Access-predicate index.
    Access,
    /// Bloom subset scan.
    Bloom,
    /// Negative cell bitsets.
    Cells,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum KindArg {
    Range,
    Eq,
}

#[derive(clap::Args, Debug)]
struct MatchArgs {
    /// Workload to generate.
    #[arg(long, value_enum, default_value_t = WorkloadArg::Iot)]
    workload: WorkloadArg,
    /// Number of subscriptions.
    #[arg(long, default_value_t = 100_000)]
    subs: usize,
    /// Number of events to match.
    #[arg(long, default_value_t = 2_000)]
    events: usize,
    /// Random seed (the same seed gives the same workload).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Engines to run; every engine's matches are compared.
    #[arg(long, value_enum, default_value_t = EngineArg::All)]
    engine: EngineArg,
    /// Events the naive reference runs; all engines are compared on these.
    #[arg(long, default_value_t = 200)]
    check_events: usize,
    /// Events per match batch.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Bloom filter bits (m): a multiple of 64, 64..=1024.
    #[arg(long, default_value_t = 256)]
    bloom_bits: u32,
    /// Match strategy of the `cpu` engine.
    #[arg(long, value_enum, default_value_t = StrategyArg::Auto)]
    strategy: StrategyArg,
    /// Cells per numeric attribute for the cell strategy.
    #[arg(long, default_value_t = 32)]
    cells: usize,
    /// Bloom bits per predicate (k), 1..=8.
    #[arg(long, default_value_t = 3)]
    bloom_k: u32,
    /// uniform: number of attributes.
    #[arg(long, default_value_t = 20)]
    attrs: usize,
    /// uniform: predicates per subscription (on distinct attributes).
    #[arg(long, default_value_t = 10)]
    preds: usize,
    /// uniform: predicate kind.
    #[arg(long, value_enum, default_value_t = KindArg::Range)]
    kind: KindArg,
    /// uniform, range: fraction of the domain each range covers.
    #[arg(long, default_value_t = 0.5)]
    width: f64,
    /// uniform, eq: distinct values per attribute.
    #[arg(long, default_value_t = 100)]
    cardinality: u64,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn bench_match(a: MatchArgs) -> anyhow::Result<bool> {
    let mut opts = MatchBenchOptions::new(match a.workload {
        WorkloadArg::Iot => "iot",
        WorkloadArg::Uniform => "uniform",
    })?;
    if a.workload == WorkloadArg::Uniform {
        if a.attrs == 0 || a.preds == 0 || a.preds > a.attrs {
            bail!(
                "--preds must be between 1 and --attrs ({}), got {}",
                a.attrs,
                a.preds
            );
        }
        if !(a.width > 0.0 && a.width <= 1.0) {
            bail!("--width must be in (0, 1], got {}", a.width);
        }
        if a.cardinality == 0 || a.cardinality > bench::workload::DOMAIN {
            bail!(
                "--cardinality must be between 1 and {}, got {}",
                bench::workload::DOMAIN,
                a.cardinality
            );
        }
        opts.workload = Workload::Uniform(UniformSpec {
            attrs: a.attrs,
            preds: a.preds,
            eq: a.kind == KindArg::Eq,
            width: a.width,
            cardinality: a.cardinality,
        });
    }
    opts.bloom = blocks_bloom(a.bloom_bits, a.bloom_k)?;
    opts.subs = a.subs;
    opts.events = a.events;
    opts.seed = a.seed;
    opts.check_events = a.check_events;
    opts.batch = a.batch;
    if a.cells == 0 || a.cells > 1024 {
        bail!("--cells must be between 1 and 1024, got {}", a.cells);
    }
    opts.cells = a.cells;
    opts.strategy = match a.strategy {
        StrategyArg::Auto => StrategyChoice::Auto,
        StrategyArg::Access => StrategyChoice::Fixed(Strategy::Access),
        StrategyArg::Bloom => StrategyChoice::Fixed(Strategy::Bloom),
        StrategyArg::Cells => StrategyChoice::Fixed(Strategy::Cells),
    };
    opts.engine = match a.engine {
        EngineArg::Cpu => EngineChoice::Cpu,
        EngineArg::Bloom => EngineChoice::Bloom,
        EngineArg::Naive => EngineChoice::Naive,
        EngineArg::Gpu => EngineChoice::Gpu,
        EngineArg::All => EngineChoice::All,
    };
    let report = matchbench::run(&opts)?;
    matchbench::print(&report);
    if let Some(path) = &a.json {
        bench::write_json(path, &report)?;
    }
    Ok(report.identical_matches)
}

fn blocks_bloom(bits: u32, k: u32) -> anyhow::Result<bench::BloomConfig> {
    Ok(bench::BloomConfig { bits, k }.validate()?)
}

fn main() -> ExitCode {
    let args = match config::apply(std::env::args_os().collect(), &Cli::command()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            // wgpu's backend probing logs errors for every API a machine lacks
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,wgpu_hal=off"))
    };
    let _ = if cli.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter())
            .with_writer(std::io::stderr)
            .try_init()
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_writer(std::io::stderr)
            .try_init()
    };
    let result = match cli.command {
        Command::Up { up: a, workers } => up(a, workers),
        Command::Coordinator(a) => coordinator_cmd(a),
        Command::Workers { node } => client(&node, worker::client::workers),
        Command::Token {
            which:
                TokenCmd::Create {
                    auth_file,
                    name,
                    tenant,
                    roles,
                },
        } => runtime::auth::create_token(&auth_file, &name, &tenant, &roles)
            .map(|token| {
                eprintln!(
                    "token {name:?} for tenant {tenant:?} added to {} (shown once; only its hash is stored)",
                    auth_file.display()
                );
                println!("{token}");
                true
            })
            .map_err(anyhow::Error::from),
        Command::Demo {
            subs,
            objects,
            rate,
            seed,
            json,
        } => demo(subs, objects, rate, seed, json),
        Command::DeadLetters {
            node,
            limit,
            redrive_all,
        } => client(&node, |ch| async move {
            if redrive_all {
                worker::client::redrive_all(ch).await
            } else {
                worker::client::dead_letters(ch, limit).await
            }
        }),
        Command::Node(a) => node_cmd(a),
        Command::Put {
            node,
            attrs,
            data,
            priority,
        } => client(&node, |ch| async move {
            Ok(vec![
                worker::client::put(ch, data.into_bytes(), &attrs, priority).await?,
            ])
        }),
        Command::Subscribe {
            node,
            filter,
            target,
            qos,
            priority,
        } => client(&node, |ch| async move {
            Ok(vec![
                worker::client::subscribe(ch, &filter, &target, qos, priority)
                    .await?
                    .to_string(),
            ])
        }),
        Command::Unsubscribe { node, id } => client(&node, |ch| async move {
            worker::client::unsubscribe(ch, id).await?;
            Ok(vec![format!("deleted {id}")])
        }),
        Command::Subscriptions { node } => client(&node, worker::client::subscriptions),
        Command::Stats { node } => client(&node, worker::client::stats),
        Command::Bench {
            which: Bench::Match(a),
        } => bench_match(a),
        Command::Bench {
            which: Bench::Cluster(a),
        } => bench_cluster(a),
        Command::Bench {
            which: Bench::E2e(a),
        } => bench_e2e(a),
        Command::Bench {
            which: Bench::Ingest(a),
        } => bench_ingest(a),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: engines disagree on the matches");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
