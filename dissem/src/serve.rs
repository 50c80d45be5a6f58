//! The commands that run the system: `up` (an embedded single-node cluster), `coordinator`
//! and `node`, with the flags they share and the start-up they share.

use super::*;

#[derive(clap::Args, Debug)]
pub(super) struct UpArgs {
    /// Address to serve the gRPC API on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub(super) listen: std::net::SocketAddr,
    /// Directory of the node's data (created if missing).
    #[arg(long, default_value = "./dissem-data")]
    pub(super) data: PathBuf,
    /// This node's id (part of every object id it assigns).
    #[arg(long, default_value_t = 1)]
    pub(super) node: u32,
    /// Largest object payload in bytes.
    #[arg(long, default_value_t = runtime::Limits::default().max_object_bytes)]
    pub(super) max_object_bytes: usize,
    /// Most metadata attributes per object.
    #[arg(long, default_value_t = runtime::Limits::default().max_attributes)]
    pub(super) max_attributes: usize,
    /// Requests per second one client connection may make.
    #[arg(long, default_value_t = runtime::Limits::default().max_requests_per_second_per_connection)]
    pub(super) max_requests_per_second: u32,
    /// Delete objects whose dissemination is finished, acknowledged deliveries and dead
    /// letters once older than this many seconds (0 keeps them forever). Checked every minute.
    #[arg(long, default_value_t = 0)]
    pub(super) retain_seconds: u64,
    /// Keep at most this many objects: the oldest finished ones go first (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub(super) max_objects: usize,
    /// Free space, in MiB, that puts leave on the data directory's disk: below it puts are
    /// refused with RESOURCE_EXHAUSTED. Default: 1% of the file system, at least 16 MiB, at
    /// most 1 GiB.
    #[arg(long, env = "DISSEM_DISK_RESERVE_MIB", value_name = "MIB")]
    pub(super) disk_reserve_mib: Option<u64>,
    /// Serve Prometheus metrics (`GET /metrics`) on this address.
    #[arg(long)]
    pub(super) metrics_listen: Option<std::net::SocketAddr>,
    /// This cluster's name: the origin its objects carry to peer clusters (--link).
    #[arg(long, default_value = "dissem")]
    pub(super) cluster_name: String,
    /// A link to a peer cluster, durable and in order.
    /// `NAME=URL[,mode=all-active|active-passive|spillover][,ttl=DUR][,token-file=PATH][,filter=FILTER]`:
    /// the link's name, a node of the peer cluster, the mode (all-active: every object
    /// ingested here goes, and the peer disseminates it; active-passive: the peer is a standby
    /// that keeps each copy for `ttl`, 60s by default; spillover: only deliveries that
    /// dead-letter here go, to the peer's subscriptions of the same tenant and name, which
    /// have `ttl` to deliver, by default half the subscription's delivery TTL), the file
    /// holding the peer's token with the `federate` role, and a filter (the rest of the
    /// value) objects must pass. Repeatable.
    #[arg(long = "link", value_name = "SPEC")]
    pub(super) links: Vec<String>,
    /// Active-passive: this node is (or steps down to) a standby. It keeps what a primary
    /// sends without disseminating it until promoted (`dissem link promote`); the role is
    /// kept in the data directory.
    #[arg(long)]
    pub(super) standby: bool,
    /// Active-passive: a standby promotes itself once its primary, heard from since start,
    /// has been silent this long (e.g. 30s). Off by default.
    #[arg(long, value_parser = crate::client::parse_duration_ms, value_name = "DUR")]
    pub(super) promote_after: Option<u64>,
    /// Accept S3 event notifications (the JSON that Amazon S3, MinIO and Ceph RGW POST to a
    /// webhook) on this address: each record becomes an announced object. With --auth-file
    /// a POST needs an ingest token: a bearer header, Basic auth with the token as the
    /// password, or the URL (`/s3-events/TOKEN`, `?token=TOKEN`) for stores that add no
    /// headers (Ceph). Plain HTTP unless --s3-events-tls-cert is given.
    #[arg(long)]
    pub(super) s3_events_listen: Option<std::net::SocketAddr>,
    /// Serve the S3 event endpoint only over TLS with this certificate chain (PEM); needs
    /// --s3-events-tls-key.
    #[arg(long, requires = "s3_events_tls_key", requires = "s3_events_listen")]
    pub(super) s3_events_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --s3-events-tls-cert.
    #[arg(long, requires = "s3_events_tls_cert")]
    pub(super) s3_events_tls_key: Option<PathBuf>,
    #[command(flatten)]
    pub(super) listen_flags: ListenFlags,
}

/// Connection limits of a gRPC listener (`up`, `node`, `coordinator`).
#[derive(clap::Args, Debug)]
pub(super) struct ListenFlags {
    /// Most client connections open at once (also bounded by the process's file descriptor
    /// limit); past it new connections are closed at once.
    #[arg(long, default_value_t = runtime::listen::ListenConfig::default().max_connections)]
    pub(super) max_connections: usize,
    /// A new connection must send its first bytes (the HTTP/2 preface) within this many ms.
    #[arg(long, default_value_t = 10_000)]
    pub(super) handshake_timeout_ms: u64,
    /// A connection with no request in flight for this many seconds is closed.
    #[arg(long, default_value_t = 300)]
    pub(super) idle_timeout_s: u64,
    /// HTTP/2 pings to a quiet client this often (s); one unanswered for 20 s closes the
    /// connection (half-open peers).
    #[arg(long, default_value_t = 30)]
    pub(super) keepalive_s: u64,
    /// On SIGTERM (or Ctrl-C), how long the process lets deliveries under way finish and
    /// open calls and subscriber streams end (each stream ends with UNAVAILABLE, so its
    /// subscriber attaches again elsewhere or later) before it stops anyway. Keep it under
    /// the orchestrator's grace period (Kubernetes: 30 s).
    #[arg(long, default_value_t = 10)]
    pub(super) shutdown_grace_s: u64,
    /// Authenticate callers with the tokens of this file (TOML; `dissem token create` adds
    /// tokens). Without it every caller may do everything.
    #[arg(long, env = "DISSEM_AUTH_FILE")]
    pub(super) auth_file: Option<PathBuf>,
    /// Serve on a non-loopback address without --auth-file (the public API is then open to
    /// anyone who can reach the address).
    #[arg(long)]
    pub(super) insecure: bool,
    /// Serve only TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub(super) tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub(super) tls_key: Option<PathBuf>,
    /// Demand client certificates signed by this CA (PEM): mutual TLS.
    #[arg(long, requires = "tls_cert")]
    pub(super) tls_client_ca: Option<PathBuf>,
    /// The CA (PEM) that signed the other processes of the cluster, for this process's own
    /// calls to `https://` peers (it presents --tls-cert to them).
    #[arg(long)]
    pub(super) tls_ca: Option<PathBuf>,
}

impl ListenFlags {
    pub(super) fn config(&self) -> anyhow::Result<runtime::listen::ListenConfig> {
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
            shutdown_grace: std::time::Duration::from_secs(self.shutdown_grace_s),
            ..runtime::listen::ListenConfig::default()
        })
    }

    /// Refuses a non-loopback address without authentication unless `--insecure` was given.
    pub(super) fn check_address(&self, addr: std::net::SocketAddr) -> anyhow::Result<()> {
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
    pub(super) fn listener(
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
    pub(super) fn scheme(&self) -> &'static str {
        if self.tls_cert.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// Binds the node's HTTP listeners that were asked for, and reads its federation links.
pub(super) async fn node_extras(u: &UpArgs) -> anyhow::Result<worker::NodeExtras> {
    let s3_events = match u.s3_events_listen {
        None => None,
        Some(a) => {
            u.listen_flags.check_address(a)?;
            let tls = match (&u.s3_events_tls_cert, &u.s3_events_tls_key) {
                (Some(c), Some(k)) => Some(runtime::tls::http_acceptor(c, k)?),
                _ => None,
            };
            let (l, bound) = runtime::bind(a).await?;
            let scheme = if tls.is_some() { "https" } else { "http" };
            eprintln!("S3 event notifications on {scheme}://{bound}/s3-events");
            Some(worker::s3events::Endpoint { listener: l, tls })
        }
    };
    Ok(worker::NodeExtras {
        metrics: metrics_listener(u.metrics_listen).await?,
        s3_events,
        federation: Some(crate::links::federation(
            &u.cluster_name,
            &u.links,
            u.standby,
            u.promote_after.map(std::time::Duration::from_millis),
        )?),
    })
}

/// Binds the metrics listener when asked for.
pub(super) async fn metrics_listener(
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

pub(super) fn up(a: UpArgs, w: WorkerFlags) -> anyhow::Result<bool> {
    w.check()?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let n = a.start(w.allow_private_targets).await?;
        announce(format!(
            "dissem node {} listening on {} (data in {}, {} outbox records to replay)",
            a.node,
            n.addr,
            a.data.display(),
            n.store.outbox_len()
        ))?;
        let daemon = w.daemon_config(a.node, String::new(), String::new())?;
        let extras = node_extras(&a).await?;
        let listener = a.listen_flags.listener(n.listener, &n.limits)?;
        embedded::run(
            listener,
            n.store,
            n.limits,
            coordinator::server::ServerConfig::default(),
            daemon,
            extras,
            shutdown(),
        )
        .await?;
        Ok(true)
    })
}

/// What `up` and `node` start alike: the data directory and its store, the checked and bound
/// listener, the limits, and retention.
struct NodeStart {
    store: storage::Store,
    listener: tokio::net::TcpListener,
    addr: std::net::SocketAddr,
    limits: runtime::Limits,
}

impl UpArgs {
    async fn start(&self, allow_private_targets: bool) -> anyhow::Result<NodeStart> {
        std::fs::create_dir_all(&self.data).map_err(|e| {
            anyhow::anyhow!("creating the data directory {}: {e}", self.data.display())
        })?;
        let store = crate::reopen::open_store(&self.data, self.node).await?;
        if let Some(mib) = self.disk_reserve_mib {
            store.set_disk_reserve(Some(mib.saturating_mul(1 << 20)));
        }
        self.listen_flags.check_address(self.listen)?;
        let (listener, addr) = runtime::bind(self.listen).await?;
        let limits = runtime::Limits {
            max_object_bytes: self.max_object_bytes,
            max_attributes: self.max_attributes,
            max_requests_per_second_per_connection: self.max_requests_per_second.max(1),
            allow_private_targets,
            listen: self.listen_flags.config()?,
            ..runtime::Limits::default()
        };
        crate::reopen::when_sled_fails(store.clone(), addr);
        if self.retain_seconds > 0 || self.max_objects > 0 {
            tokio::spawn(worker::retain(
                store.clone(),
                std::time::Duration::from_secs(self.retain_seconds),
                (self.max_objects > 0).then_some(self.max_objects),
                std::time::Duration::from_secs(60),
            ));
        }
        Ok(NodeStart {
            store,
            listener,
            addr,
            limits,
        })
    }
}

/// Prints the first line on stdout (the address, for scripts and tests) at once.
pub(super) fn announce(line: String) -> anyhow::Result<()> {
    use std::io::Write;
    println!("{line}");
    std::io::stdout().flush()?;
    Ok(())
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM (what systemd and Kubernetes send to stop a
/// process): the servers stop and the process exits 0. What it still owes is on its disk.
pub(super) async fn shutdown() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

#[derive(clap::Args, Debug)]
pub(super) struct CoordinatorArgs {
    /// Address to serve gRPC on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7600")]
    pub(super) listen: std::net::SocketAddr,
    /// Directory of the coordinator's data: subscriptions and their images.
    #[arg(long, default_value = "./dissem-coordinator")]
    pub(super) data: PathBuf,
    /// Objects per test task (values of one attribute) and per match task.
    #[arg(long, default_value_t = coordinator::Config::default().test_batch)]
    pub(super) batch: usize,
    /// A batch closes this many ms after its first object at the latest.
    #[arg(long, default_value_t = coordinator::Config::default().batch_deadline_ms)]
    pub(super) batch_deadline_ms: u64,
    /// Close batches only on size or deadline. By default a batch also starts at once when a
    /// worker holding its block is idle, none of its tasks runs and its last batch held one
    /// object or closed at least a deadline ago (no batching wait at low load).
    #[arg(long)]
    pub(super) always_batch: bool,
    /// A worker whose lease (renewed by its node's heartbeats) is older is not given tasks.
    #[arg(long, default_value_t = coordinator::Config::default().lease_ms)]
    pub(super) lease_ms: u64,
    /// A task is reassigned after this multiple of its kind's mean completion time...
    #[arg(long, default_value_t = coordinator::Config::default().timeout_multiple)]
    pub(super) timeout_multiple: f64,
    /// ...but never before this many ms.
    #[arg(long, default_value_t = coordinator::Config::default().min_timeout_ms)]
    pub(super) min_timeout_ms: u64,
    /// Serve Prometheus metrics (`GET /metrics`) on this address.
    #[arg(long)]
    pub(super) metrics_listen: Option<std::net::SocketAddr>,
    /// The cluster secret that nodes present on internal calls (created with a random secret,
    /// mode 0600, if missing). Default: cluster.secret in the data directory.
    #[arg(long)]
    pub(super) cluster_secret_file: Option<PathBuf>,
    /// Allow subscriptions whose targets are on loopback, private and link-local addresses.
    #[arg(long)]
    pub(super) allow_private_targets: bool,
    /// Lay the nodes out in a ROWSxCOLS grid for quorum replication (DESIGN §7): node ids
    /// are grid positions (0..ROWS*COLS), and each object is copied to the row quorum of the
    /// node that took it. Without it an object lives only on the node that took it.
    #[arg(long)]
    pub(super) grid: Option<runtime::grid::Grid>,
    #[command(flatten)]
    pub(super) election: crate::elected::ElectionFlags,
    #[command(flatten)]
    pub(super) listen_flags: ListenFlags,
}

pub(super) fn coordinator_cmd(a: CoordinatorArgs) -> anyhow::Result<bool> {
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
        let store = crate::reopen::open_store(&a.data, 0).await?;
        // nothing tails a coordinator's registry (standbys tail the nodes)
        store.without_change_feed();
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
            grid: a.grid,
            ..coordinator::server::ServerConfig::default()
        };
        if a.election.etcd.is_some() {
            return crate::elected::coordinate(&a, store, limits, cfg, &secret_file).await;
        }
        let (listener, addr) = runtime::bind(a.listen).await?;
        let grid = a.grid.map(|g| format!(", grid {g}")).unwrap_or_default();
        announce(format!(
            "dissem coordinator listening on {addr} (data in {}, cluster secret in {}{grid})",
            a.data.display(),
            secret_file.display()
        ))?;
        let metrics = metrics_listener(a.metrics_listen).await?;
        let listener = a.listen_flags.listener(listener, &limits)?;
        coordinator::server::serve(listener, store, limits, cfg, metrics, shutdown()).await?;
        Ok(true)
    })
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GpuArg {
    Auto,
    On,
    Off,
}

/// Settings of a node daemon's workers (`up` and `node`).
#[derive(clap::Args, Debug)]
pub(super) struct WorkerFlags {
    /// Empty workers started at once.
    #[arg(long, default_value_t = 4)]
    pub(super) workers: usize,
    /// Workers load regulation keeps even when the node is busy.
    #[arg(long, default_value_t = 2)]
    pub(super) min_workers: usize,
    /// Workers never exceeded (the urgent reserve aside).
    #[arg(long, default_value_t = 16)]
    pub(super) max_workers: usize,
    /// Workers kept for priority-7 tasks only (the urgent reserve): load regulation never
    /// terminates them and the coordinator hands them no other task, so an urgent object
    /// never waits for a worker a backlog holds. 0 turns the reserve off.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=16))]
    pub(super) urgent_workers: u8,
    /// Puts written at once (the store's write and its flush); once all slots are taken,
    /// puts wait highest priority first.
    #[arg(long, default_value_t = worker::admission::DEFAULT_SLOTS as u16,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub(super) write_slots: u16,
    /// Of the write slots, those kept for priority-7 puts (fewer than --write-slots).
    #[arg(long, default_value_t = worker::admission::DEFAULT_RESERVE as u16,
          value_parser = clap::value_parser!(u16).range(0..=4095))]
    pub(super) urgent_write_slots: u16,
    /// CPU utilisation (0..=1) above which every idle worker is terminated.
    #[arg(long, default_value_t = 0.85)]
    pub(super) cpu_high: f64,
    /// CPU utilisation below which one empty worker is started per sample.
    #[arg(long, default_value_t = 0.60)]
    pub(super) cpu_low: f64,
    /// How often the CPU is sampled, ms.
    #[arg(long, default_value_t = 1000)]
    pub(super) regulate_ms: u64,
    /// Workers without a task for this many seconds are cleaned up.
    #[arg(long, default_value_t = 300)]
    pub(super) idle_cleanup_s: u64,
    /// Outbox records older than this many ms are sent to the coordinator again.
    #[arg(long, default_value_t = 5000)]
    pub(super) resend_ms: u64,
    /// Where match blocks run their subset scan: `auto` uses a hardware GPU when one opens
    /// (the CPU otherwise), `on` any adapter including software ones (Mesa's lavapipe),
    /// `off` always the CPU.
    #[arg(long, value_enum, default_value_t = GpuArg::Auto)]
    pub(super) gpu: GpuArg,
    /// Allow delivery targets on loopback, private and link-local addresses (refused by
    /// default, so subscriptions cannot reach into the operator's network).
    #[arg(long)]
    pub(super) allow_private_targets: bool,
    /// Calls in flight per target endpoint (each carries up to --push-batch deliveries).
    #[arg(long, default_value_t = 16)]
    pub(super) in_flight_per_endpoint: usize,
    /// Most deliveries in one call to an endpoint: pushes that queue while every call to it
    /// is out go together in the next (a webhook POST as a CloudEvents batch, or one gRPC
    /// `Subscriber.DeliverBatch` for QoS 0/1); 1 sends each delivery on its own.
    #[arg(long, alias = "webhook-batch", default_value_t = 64)]
    pub(super) push_batch: usize,
    /// Extra CA certificates (PEM) that HTTPS webhooks may be signed by, besides the bundled
    /// web roots.
    #[arg(long)]
    pub(super) webhook_ca: Option<PathBuf>,
    /// Push to new webhook URLs without first asking them to consent (the CloudEvents
    /// abuse-protection handshake: OPTIONS with WebHook-Request-Origin), for receivers that
    /// cannot answer it.
    #[arg(long)]
    pub(super) skip_webhook_validation: bool,
    /// Record matches as pending deliveries without pushing them (benchmarks of the matching
    /// pipeline, or when another system drains the delivery records).
    #[arg(long)]
    pub(super) no_delivery: bool,
    /// Run all matching and pushing at one OS priority. By default, while the node has a
    /// backlog (300 objects in its outbox), objects below priority 7 are matched and pushed
    /// on threads of lower OS priority (nice +10), so the CPU serves writes and priority-7
    /// objects first.
    #[arg(long)]
    pub(super) no_bulk_lane: bool,
    /// Subscriptions that get their own delivery series in /metrics: the k with the most
    /// failed and dead-lettered pushes. 0 (the default) keeps per-tenant and per-target-kind
    /// totals only, so a scrape's size does not grow with the subscriptions.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1000))]
    pub(super) metrics_top_subscriptions: u16,
    /// Export OpenTelemetry spans (put, test, match, push) of objects whose put carries a
    /// sampled W3C `traceparent` attribute to this OTLP/HTTP collector (e.g.
    /// http://127.0.0.1:4318; `/v1/traces` is added). Off by default.
    #[arg(long)]
    pub(super) otlp_endpoint: Option<String>,
}

impl WorkerFlags {
    pub(super) fn check(&self) -> anyhow::Result<()> {
        if self.urgent_write_slots >= self.write_slots {
            bail!(
                "--urgent-write-slots ({}) must be fewer than --write-slots ({}): lower \
                 priorities need at least one slot",
                self.urgent_write_slots,
                self.write_slots
            );
        }
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

    pub(super) fn daemon_config(
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
        cfg.urgent_workers = usize::from(self.urgent_workers);
        cfg.write_slots = usize::from(self.write_slots);
        cfg.urgent_write_slots = usize::from(self.urgent_write_slots);
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
        cfg.delivery.metrics_top_subscriptions = usize::from(self.metrics_top_subscriptions);
        cfg.otlp_endpoint = self.otlp_endpoint.clone();
        cfg.gpu = match self.gpu {
            GpuArg::Auto => worker::daemon::GpuUse::Hardware,
            GpuArg::On => worker::daemon::GpuUse::Any,
            GpuArg::Off => worker::daemon::GpuUse::Off,
        };
        Ok(cfg)
    }
}

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(super) struct NodeArgs {
    /// Acts on a running node instead of running one.
    #[command(subcommand)]
    pub(super) action: Option<NodeAction>,
    #[command(flatten)]
    pub(super) up: UpArgs,
    /// The coordinator's URL (without --etcd).
    #[arg(
        long,
        default_value = "http://127.0.0.1:7600",
        env = "DISSEM_COORDINATOR_URL"
    )]
    pub(super) coordinator: String,
    /// Follow the coordinator that etcd elects instead of --coordinator: the etcd members'
    /// client URLs, comma-separated (the coordinators' --etcd).
    #[arg(long)]
    pub(super) etcd: Option<String>,
    /// The prefix of every key the cluster keeps in etcd (the coordinators' --etcd-prefix).
    #[arg(long, default_value = crate::elected::DEFAULT_PREFIX)]
    pub(super) etcd_prefix: String,
    #[command(flatten)]
    pub(super) etcd_trust: crate::etcdtrust::EtcdTrustFlags,
    /// The URL other processes reach this node at (default: http:// + the listen address).
    #[arg(long)]
    pub(super) advertise: Option<String>,
    /// The cluster secret that internal calls carry: the file the coordinator keeps
    /// (`cluster.secret` in its data directory, or its --cluster-secret-file).
    #[arg(long, env = "DISSEM_CLUSTER_SECRET_FILE")]
    pub(super) cluster_secret_file: Option<PathBuf>,
    /// With the coordinator's --grid: a put is acknowledged once this many nodes of the
    /// object's quorum hold it durably, this one included (at most the whole quorum; the
    /// other members get their copy asynchronously). 1: acknowledged at once.
    #[arg(long, default_value_t = 3)]
    pub(super) write_copies: usize,
    /// Objects of this priority (0..=7) or more are copied to the row and column quorums
    /// together (R ∪ C), the rest to the row quorum.
    #[arg(long, default_value_t = 6)]
    pub(super) critical_priority: u8,
    #[command(flatten)]
    pub(super) workers: WorkerFlags,
}

/// What `dissem node` does to a running node.
#[derive(clap::Subcommand, Debug)]
pub(super) enum NodeAction {
    /// Drains a node before a restart or an upgrade: it refuses puts from now on (writers
    /// go to other nodes), disseminates what it took, and exits 0 once it owes nothing;
    /// prints the progress and returns when the node is gone (exit 1 if not drained in
    /// --timeout).
    Drain(DrainArgs),
}

#[derive(clap::Args, Debug)]
pub(super) struct DrainArgs {
    #[command(flatten)]
    pub(super) node: crate::client::NodeArg,
    /// How long to wait for the node to owe nothing, in seconds.
    #[arg(long, default_value_t = 120)]
    pub(super) timeout: u64,
    /// Leave the drained node running (refusing puts) instead of making it exit.
    #[arg(long)]
    pub(super) no_exit: bool,
}

pub(super) fn node_cmd(a: NodeArgs) -> anyhow::Result<bool> {
    if let Some(NodeAction::Drain(d)) = a.action {
        let timeout = std::time::Duration::from_secs(d.timeout);
        let exit = !d.no_exit;
        return crate::client::client(&d.node, |ch| async move {
            worker::client::drain(ch, timeout, exit).await
        });
    }
    a.workers.check()?;
    if a.write_copies == 0 {
        bail!("--write-copies must be at least 1 (the node that takes the put)");
    }
    if a.critical_priority > 8 {
        bail!(
            "--critical-priority must be 0..=8 (8: none is critical), got {}",
            a.critical_priority
        );
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let u = &a.up;
        let secret_file = a.cluster_secret_file.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "a cluster node needs its coordinator's cluster secret: pass \
                 --cluster-secret-file (the coordinator writes it to cluster.secret in its data \
                 directory)"
            )
        })?;
        let n = u.start(a.workers.allow_private_targets).await?;
        let endpoint = a
            .advertise
            .clone()
            .unwrap_or_else(|| format!("{}://{}", u.listen_flags.scheme(), n.addr));
        let mut cfg = a
            .workers
            .daemon_config(u.node, a.coordinator.clone(), endpoint)?;
        cfg.cluster_secret = runtime::cluster_secret::ClusterSecret::load(secret_file)?;
        cfg.write_copies = a.write_copies;
        cfg.critical_priority = a.critical_priority;
        let coordinator = match &a.etcd {
            Some(urls) => {
                cfg.etcd = Some(a.etcd_trust.connect(urls, &a.etcd_prefix).await?);
                format!("elected through etcd {urls}")
            }
            None => a.coordinator.clone(),
        };
        announce(format!(
            "dissem node {} listening on {} (data in {}, coordinator {coordinator})",
            u.node,
            n.addr,
            u.data.display(),
        ))?;
        let extras = node_extras(u).await?;
        let listener = u.listen_flags.listener(n.listener, &n.limits)?;
        worker::run_node(listener, n.store, n.limits, cfg, extras, shutdown()).await?;
        Ok(true)
    })
}
