//! `dissem bench ingest`: durable puts per second through the real gRPC API, against a
//! baseline in the same run: the same writes straight into sled with a flush per write.
//!
//! For each object size and writer count, a fresh node is started in-process on
//! 127.0.0.1:0 over a fresh sled directory; `writers` concurrent clients put objects until
//! the time is up; every put counts only once acknowledged (durable). Latency is measured per
//! put, from send to acknowledgement.
//!
//! The secured rows run the same paths against a node that serves only TLS (a certificate
//! of a CA made for the run) and authenticates every call (a bearer token of an auth file
//! made for the run): their ratio to the plain rows is what TLS and authentication cost.

use std::time::{Duration, Instant};

use anyhow::Context;
use proto::v1;
use serde::Serialize;

/// Options of the ingest benchmark.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    pub sizes: Vec<usize>,
    pub writers: Vec<usize>,
    pub seconds: f64,
    /// Puts each writer keeps in flight on its `PutStream` (the pipelined row; 1 = one at a
    /// time, which the plain PutStream row always measures).
    pub window: usize,
}

impl Default for IngestOptions {
    fn default() -> IngestOptions {
        IngestOptions {
            sizes: vec![1024, 64 * 1024],
            writers: vec![1, 64],
            seconds: 3.0,
            window: 32,
        }
    }
}

/// Figures of one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct IngestRow {
    pub object_bytes: usize,
    pub writers: usize,
    pub path: String,
    pub objects: u64,
    pub objects_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Flushes (fsyncs) per acknowledged object: group commit keeps it well under 1.
    pub flushes_per_object: Option<f64>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    pub rows: Vec<IngestRow>,
    /// (object bytes, writers, dissem objects/s divided by the sled flush-per-write baseline)
    pub ratios: Vec<(usize, usize, f64)>,
    /// The same for the PutStream path, one put in flight per writer.
    pub stream_ratios: Vec<(usize, usize, f64)>,
    /// The same for the PutStream path with `window` puts in flight per writer.
    pub pipelined_ratios: Vec<(usize, usize, f64)>,
    /// (object bytes, writers, path, secured objects/s divided by plain objects/s).
    pub secure_ratios: Vec<(usize, usize, String, f64)>,
    pub window: usize,
    /// The replicated rows (a grid of node processes, by `--write-copies`), when run.
    pub replicated: Option<crate::replbench::ReplicatedReport>,
}

/// What the secured rows need: a directory with a CA, a server certificate for `localhost`,
/// and an auth file holding one ingest token.
#[derive(Debug)]
struct Secure {
    dir: std::path::PathBuf,
    ca_pem: Vec<u8>,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    auth: std::sync::Arc<runtime::auth::Auth>,
    token: String,
}

impl Secure {
    fn make() -> anyhow::Result<Secure> {
        let dir = temp_dir("secure");
        std::fs::create_dir_all(&dir)?;
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate()?;
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])?
            .signed_by(&key, &issuer)?;
        let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        let auth_path = dir.join("auth.toml");
        let token =
            runtime::auth::create_token(&auth_path, "bench", "bench", &["ingest".to_string()])?;
        Ok(Secure {
            ca_pem: ca_cert.pem().into_bytes(),
            cert: cert_path,
            key: key_path,
            auth: std::sync::Arc::new(runtime::auth::Auth::load(&auth_path)?),
            token,
            dir,
        })
    }
}

impl Drop for Secure {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn row(size: usize, writers: usize, path: &str, mut lat: Vec<Duration>, secs: f64) -> IngestRow {
    lat.sort_unstable();
    IngestRow {
        object_bytes: size,
        writers,
        path: path.to_string(),
        objects: lat.len() as u64,
        objects_per_second: lat.len() as f64 / secs,
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        flushes_per_object: None,
    }
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "dissem-bench-ingest-{tag}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// One path through the node: unary `Ingest.Put` per object, or each writer's objects on its
/// own `Ingest.PutStream` (no HTTP/2 stream per object) with up to `window` puts in flight
/// (the node stores what a stream has in flight under one flush).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Put,
    PutStream { window: usize },
}

fn put_request(writer: usize, i: u64, data: &[u8]) -> v1::PutRequest {
    v1::PutRequest {
        data: data.to_vec(),
        metadata: vec![
            v1::Attribute {
                name: "writer".into(),
                value: Some(v1::Value {
                    kind: Some(v1::value::Kind::Integer(writer as i64)),
                }),
            },
            v1::Attribute {
                name: "seq".into(),
                value: Some(v1::Value {
                    kind: Some(v1::value::Kind::Integer(i as i64)),
                }),
            },
        ],
        priority: 0,
        message_id: String::new(),
    }
}

/// One writer on unary puts until `end`: each put's latency.
/// The writers' client: a channel whose calls carry the bench's token (if any).
type Client = v1::ingest_client::IngestClient<worker::client::Channel>;

async fn unary_writer(
    mut client: Client,
    writer: usize,
    data: Vec<u8>,
    end: Instant,
) -> Result<Vec<Duration>, tonic::Status> {
    let mut lat = Vec::new();
    let mut i = 0u64;
    while Instant::now() < end {
        let t = Instant::now();
        client.put(put_request(writer, i, &data)).await?;
        lat.push(t.elapsed());
        i += 1;
    }
    Ok(lat)
}

/// One writer on its own `PutStream` until `end`, keeping up to `window` puts unanswered:
/// each put's latency from send to acknowledgement (acks come back in order).
async fn stream_writer(
    mut client: Client,
    writer: usize,
    data: Vec<u8>,
    end: Instant,
    window: usize,
) -> Result<Vec<Duration>, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel::<v1::PutRequest>(window);
    let mut acks = client
        .put_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(window));
    let (sent_tx, mut sent_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let sender = {
        let permits = permits.clone();
        tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < end {
                let Ok(permit) = permits.acquire().await else {
                    break;
                };
                permit.forget();
                if sent_tx.send(Instant::now()).is_err()
                    || tx.send(put_request(writer, i, &data)).await.is_err()
                {
                    break;
                }
                i += 1;
            }
            // dropping `tx` ends the stream: the node answers what is in flight, then closes
        })
    };
    let mut lat = Vec::new();
    while let Some(ack) = acks.message().await? {
        match ack.result {
            Some(v1::put_stream_response::Result::Ok(_)) => {}
            other => {
                sender.abort();
                return Err(tonic::Status::internal(format!(
                    "put stream answered {other:?}"
                )));
            }
        }
        let Some(t) = sent_rx.recv().await else {
            break;
        };
        lat.push(t.elapsed());
        permits.add_permits(1);
    }
    let _ = sender.await;
    Ok(lat)
}

async fn run_dissem(
    size: usize,
    writers: usize,
    seconds: f64,
    api: Api,
    secure: Option<&Secure>,
) -> anyhow::Result<IngestRow> {
    let dir = temp_dir(&format!("node-{size}-{writers}"));
    let store = storage::Store::open(&dir, 1).context("opening the store")?;
    let flush_counter = store.clone();
    let (listener, addr) = runtime::bind("127.0.0.1:0".parse()?).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = runtime::Limits::default();
    let mut listener = runtime::listen::Listener::new(listener, limits.listen);
    if let Some(sec) = secure {
        let id = runtime::tls::identity(&sec.cert, &sec.key)?;
        listener = listener
            .with_tls(Some(runtime::tls::server(
                id,
                None,
                limits.listen.handshake_timeout,
            )))
            .with_auth(Some(sec.auth.clone()));
    }
    let server = tokio::spawn(worker::run(
        listener,
        store,
        runtime::Limits::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let url = match secure {
        None => format!("http://{addr}"),
        Some(_) => format!("https://localhost:{}", addr.port()),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut channels = Vec::new();
    for _ in 0..writers.clamp(1, 8) {
        let ch = loop {
            let mut endpoint = tonic::transport::Channel::from_shared(url.clone())?
                .tcp_nodelay(true)
                .initial_stream_window_size(Some(4 << 20))
                .initial_connection_window_size(Some(16 << 20));
            if let Some(sec) = secure {
                endpoint = endpoint.tls_config(
                    tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(&sec.ca_pem))
                        .domain_name("localhost"),
                )?;
            }
            match endpoint.connect().await {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => {
                    return Err(e).context("connecting to the node");
                }
                Err(_) => tokio::task::yield_now().await,
            }
        };
        channels.push(ch);
    }
    let data = vec![0x5au8; size];
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    let bearer = worker::client::Bearer::new(secure.map(|s| s.token.as_str()))
        .map_err(anyhow::Error::from)?;
    for w in 0..writers {
        let client = v1::ingest_client::IngestClient::with_interceptor(
            channels[w % channels.len()].clone(),
            bearer.clone(),
        )
        .max_encoding_message_size(usize::MAX);
        let data = data.clone();
        tasks.push(tokio::spawn(async move {
            match api {
                Api::Put => unary_writer(client, w, data, end).await,
                Api::PutStream { window } => stream_writer(client, w, data, end, window).await,
            }
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await?.context("a put failed")?);
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = stop.send(());
    let _ = server.await;
    let flushes = flush_counter.flushes();
    let mut path = match api {
        Api::Put => "dissem gRPC Put (durable)".to_string(),
        Api::PutStream { window } => format!("dissem gRPC PutStream x{window} (durable)"),
    };
    if secure.is_some() {
        path = path.replace("(durable)", "+ TLS + auth");
    }
    let mut r = row(size, writers, &path, lat, secs);
    r.flushes_per_object = Some(flushes as f64 / r.objects.max(1) as f64);
    drop(flush_counter);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(r)
}

fn run_baseline(size: usize, writers: usize, seconds: f64) -> anyhow::Result<IngestRow> {
    let dir = temp_dir(&format!("sled-{size}-{writers}"));
    let db = sled::open(&dir).context("opening sled")?;
    let data = vec![0x5au8; size];
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let counter = std::sync::atomic::AtomicU64::new(0);
    let lat: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|_| {
                let db = &db;
                let data = &data;
                let counter = &counter;
                s.spawn(move || {
                    let mut lat = Vec::new();
                    while Instant::now() < end {
                        let k = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let t = Instant::now();
                        if db.insert(k.to_be_bytes(), data.as_slice()).is_err()
                            || db.flush().is_err()
                        {
                            break;
                        }
                        lat.push(t.elapsed());
                    }
                    lat
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(row(
        size,
        writers,
        "sled insert + flush per write (baseline)",
        lat,
        secs,
    ))
}

/// Runs every configuration.
pub fn run(opts: &IngestOptions) -> anyhow::Result<IngestReport> {
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    let mut stream_ratios = Vec::new();
    let mut pipelined_ratios = Vec::new();
    let mut secure_ratios = Vec::new();
    let secure = Secure::make()?;
    for &size in &opts.sizes {
        for &writers in &opts.writers {
            eprintln!(
                "ingest: {size} B objects, {writers} writers, {:.0} s each path",
                opts.seconds
            );
            let ours = rt.block_on(run_dissem(size, writers, opts.seconds, Api::Put, None))?;
            let streamed = rt.block_on(run_dissem(
                size,
                writers,
                opts.seconds,
                Api::PutStream { window: 1 },
                None,
            ))?;
            let piped = Api::PutStream {
                window: opts.window,
            };
            let pipelined = rt.block_on(run_dissem(size, writers, opts.seconds, piped, None))?;
            let mut secured = Vec::new();
            for (plain, api) in [(&ours, Api::Put), (&pipelined, piped)] {
                let sec =
                    rt.block_on(run_dissem(size, writers, opts.seconds, api, Some(&secure)))?;
                secure_ratios.push((
                    size,
                    writers,
                    plain.path.clone(),
                    sec.objects_per_second / plain.objects_per_second.max(1e-9),
                ));
                secured.push(sec);
            }
            let base = run_baseline(size, writers, opts.seconds)?;
            let b = base.objects_per_second.max(1e-9);
            ratios.push((size, writers, ours.objects_per_second / b));
            stream_ratios.push((size, writers, streamed.objects_per_second / b));
            pipelined_ratios.push((size, writers, pipelined.objects_per_second / b));
            rows.push(ours);
            rows.push(streamed);
            rows.push(pipelined);
            rows.extend(secured);
            rows.push(base);
        }
    }
    Ok(IngestReport {
        rows,
        ratios,
        stream_ratios,
        pipelined_ratios,
        secure_ratios,
        window: opts.window,
        replicated: None,
    })
}

/// Prints the report.
pub fn print(r: &IngestReport) {
    println!(
        "{:>8} {:>8} {:<42} {:>9} {:>12} {:>9} {:>9} {:>12}",
        "bytes", "writers", "path", "objects", "objects/s", "p50 ms", "p99 ms", "flushes/obj"
    );
    for x in &r.rows {
        println!(
            "{:>8} {:>8} {:<42} {:>9} {:>12.0} {:>9.2} {:>9.2} {:>12}",
            x.object_bytes,
            x.writers,
            x.path,
            x.objects,
            x.objects_per_second,
            x.p50_ms,
            x.p99_ms,
            x.flushes_per_object
                .map_or("1".to_string(), |f| format!("{f:.3}"))
        );
    }
    for (((size, writers, ratio), (_, _, stream)), (_, _, piped)) in r
        .ratios
        .iter()
        .zip(&r.stream_ratios)
        .zip(&r.pipelined_ratios)
    {
        println!(
            "{size} B, {writers} writers: dissem Put {ratio:.2}x, PutStream {stream:.2}x, \
             PutStream x{} {piped:.2}x the flush-per-write baseline",
            r.window
        );
    }
    for (size, writers, path, ratio) in &r.secure_ratios {
        println!(
            "{size} B, {writers} writers: {path} with TLS + auth runs at {ratio:.2}x its plain rate \
             (costs {:.0}%)",
            (1.0 - ratio) * 100.0
        );
    }
    if let Some(rep) = &r.replicated {
        crate::replbench::print(rep);
    }
}
