//! The client commands: their common flags (which node, which token, which CA, which output
//! form), their own arguments, and the runner that prints the answer as text or JSON.

use super::*;

/// How a client command prints its answer.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Output {
    /// Lines for people.
    #[default]
    Text,
    /// One JSON document for scripts.
    Json,
}

#[derive(clap::Args, Debug)]
pub(super) struct NodeArg {
    /// The node's gRPC address.
    #[arg(
        short = 'u',
        long = "node-url",
        default_value = "http://127.0.0.1:7700",
        env = "DISSEM_NODE_URL"
    )]
    pub(super) url: String,
    /// The bearer token to present (a node with --auth-file requires one).
    #[arg(long, env = "DISSEM_TOKEN", hide_env_values = true)]
    pub(super) token: Option<String>,
    /// The CA certificate (PEM) an `https://` node's certificate is verified against
    /// (default: the bundled web roots).
    #[arg(long, env = "DISSEM_TLS_CA")]
    pub(super) tls_ca: Option<PathBuf>,
    /// Print the answer as text lines or as one JSON document.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub(super) output: Output,
}

pub(super) fn client<F, Fut>(node: &NodeArg, f: F) -> anyhow::Result<bool>
where
    F: FnOnce(worker::client::Client) -> Fut,
    Fut: std::future::Future<Output = Result<worker::client::Printed, runtime::ServiceError>>,
{
    let rt = tokio::runtime::Runtime::new()?;
    let printed = rt.block_on(async {
        let ch = connect(node).await?;
        f(ch).await
    })?;
    match node.output {
        Output::Text => print_lines(&printed.lines)?,
        Output::Json => print_lines(&[printed.json.to_string()])?,
    }
    Ok(true)
}

async fn connect(node: &NodeArg) -> Result<worker::client::Client, runtime::ServiceError> {
    worker::client::connect(&node.url, node.token.as_deref(), node.tls_ca.as_deref()).await
}

/// The largest `--file` that `put` reads (the node's own object limit is usually lower and
/// answers with a clear error).
const MAX_PUT_FILE: u64 = 256 << 20;

#[derive(clap::Args, Debug)]
pub(super) struct PutArgs {
    #[command(flatten)]
    node: NodeArg,
    /// Metadata attribute, name=value (repeatable).
    #[arg(short = 'a', long = "attr")]
    attrs: Vec<String>,
    /// The object's bytes as UTF-8 text; empty by default.
    #[arg(short = 'd', long, conflicts_with = "file")]
    data: Option<String>,
    /// Read the object's bytes from this file (`-`: standard input).
    #[arg(short = 'F', long)]
    file: Option<PathBuf>,
    /// Priority 0..=7.
    #[arg(short = 'p', long, default_value_t = 0)]
    priority: u32,
    /// A message id: a put repeating one within the node's dedup window is acknowledged
    /// with the first object's id and stored once.
    #[arg(long)]
    message_id: Option<String>,
}

/// The bytes of `--file` (or standard input for `-`), bounded.
fn read_put_file(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let mut data = Vec::new();
    let read = if path == std::path::Path::new("-") {
        std::io::stdin()
            .lock()
            .take(MAX_PUT_FILE + 1)
            .read_to_end(&mut data)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_PUT_FILE + 1).read_to_end(&mut data))
    };
    read.map_err(|e| runtime::ServiceError::invalid("--file", format!("{}: {e}", path.display())))?;
    if data.len() as u64 > MAX_PUT_FILE {
        return Err(runtime::ServiceError::invalid(
            "--file",
            format!(
                "{} is larger than {} MiB",
                path.display(),
                MAX_PUT_FILE >> 20
            ),
        )
        .into());
    }
    Ok(data)
}

pub(super) fn put(a: PutArgs) -> anyhow::Result<bool> {
    let data = match (&a.file, a.data) {
        (Some(f), _) => read_put_file(f)?,
        (None, Some(d)) => d.into_bytes(),
        (None, None) => Vec::new(),
    };
    let spec = worker::client::PutSpec {
        data,
        attrs: a.attrs,
        priority: a.priority,
        message_id: a.message_id,
    };
    client(&a.node, |ch| worker::client::put(ch, spec))
}

#[derive(clap::Args, Debug)]
pub(super) struct SubscribeArgs {
    #[command(flatten)]
    node: NodeArg,
    /// The filter, e.g. 'temp > 30 && site prefix "kr/"', or an EventBridge pattern.
    #[arg(short = 'f', long, required_unless_present = "file")]
    filter: Option<String>,
    /// Where to push: grpc:URL, webhook:URL or stream:NAME.
    #[arg(short = 't', long, required_unless_present = "file")]
    target: Option<String>,
    /// Create many subscriptions from a JSON Lines file instead: one per line, the other
    /// flags as keys (`{"filter": "temp > 30", "target": "stream:s", "qos": 0}`; also
    /// `priority`, `secret`, `max_attempts`, `ttl_ms`, `push_batch`, `headers`, `name`,
    /// `ordered`; `#` lines are skipped). Every line is checked before the first is sent;
    /// then a thousand per call, with progress on stderr.
    #[arg(long, conflicts_with_all = ["filter", "target"])]
    file: Option<std::path::PathBuf>,
    /// 0 at most once, 1 at least once, 2 exactly once (gRPC targets); unset: the server's
    /// default, at least once.
    #[arg(short = 'q', long)]
    qos: Option<u32>,
    /// Priority 0..=7 of the deliveries.
    #[arg(short = 'p', long, default_value_t = 0)]
    priority: u32,
    /// The webhook signing secret (HMAC-SHA256; write-only, never shown again).
    #[arg(long, hide_env_values = true)]
    secret: Option<String>,
    /// Attempts before a delivery is dead-lettered (QoS 1 and 2; default 10).
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Give up on a delivery this long after its object arrived, e.g. 90s, 10m, 24h.
    #[arg(long, value_parser = parse_duration_ms)]
    ttl: Option<u64>,
    /// Webhooks: up to this many events per POST as a CloudEvents batch (default 1: one
    /// event per POST).
    #[arg(long)]
    push_batch: Option<u32>,
    /// Webhooks: an extra request header, 'Name: value' (repeatable; write-only).
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// A name (letters, digits, `_ . - /`): a spillover link hands this subscription's dead
    /// letters to the peer cluster's subscriptions of the same tenant and name.
    #[arg(long)]
    name: Option<String>,
    /// Deliver in the order the node took the objects (a publisher's order), one call at a
    /// time; slower.
    #[arg(long)]
    ordered: bool,
}

/// `500ms`, `90s`, `10m`, `24h`, `7d` as milliseconds.
pub(super) fn parse_duration_ms(v: &str) -> Result<u64, String> {
    let v = v.trim();
    let split = v
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{v:?} needs a unit: ms, s, m, h or d (e.g. 90s)"))?;
    let (n, unit) = v.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{v:?} is not a number with a unit (e.g. 90s)"))?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        u => return Err(format!("unknown unit {u:?} in {v:?}: use ms, s, m, h or d")),
    };
    n.checked_mul(ms)
        .filter(|ms| *ms > 0)
        .ok_or_else(|| format!("{v:?} is out of range"))
}

pub(super) fn subscribe(a: SubscribeArgs) -> anyhow::Result<bool> {
    if let Some(path) = a.file {
        return client(&a.node, |ch| async move {
            let step = std::sync::atomic::AtomicUsize::new(0);
            worker::client::bulk::subscribe_file(ch, &path, |done, total| {
                // a line about every tenth of the file, and the last
                let tenth = (total / 10).max(1);
                let seen = step.fetch_max(done / tenth, std::sync::atomic::Ordering::Relaxed);
                if done / tenth > seen || done == total {
                    eprintln!("{done} of {total} subscriptions created");
                }
            })
            .await
        });
    }
    let spec = worker::client::SubscribeSpec {
        filter: a.filter.unwrap_or_default(),
        target: a.target.unwrap_or_default(),
        qos: a.qos,
        priority: a.priority,
        secret: a.secret,
        max_attempts: a.max_attempts,
        ttl_ms: a.ttl,
        push_batch: a.push_batch,
        headers: a.headers,
        name: a.name,
        ordered: a.ordered,
    };
    client(&a.node, |ch| async move {
        let s = worker::client::subscribe(ch, &spec).await?;
        Ok(worker::client::Printed::new(
            vec![s.id.to_string()],
            worker::client::subscription_json(&s),
        ))
    })
}

#[derive(clap::Args, Debug)]
pub(super) struct SubArgs {
    #[command(flatten)]
    node: NodeArg,
    /// The filter (text, or an EventBridge pattern starting with `{`).
    #[arg(short = 'f', long)]
    filter: String,
    /// 0 at most once, 1 at least once.
    #[arg(short = 'q', long, default_value_t = 1)]
    qos: u32,
    /// Keep the subscription (a stream of this name) when the command ends; running it again
    /// with the same name and filter resumes it.
    #[arg(long)]
    durable: Option<String>,
    /// Exit after this many deliveries.
    #[arg(short = 'c', long)]
    count: Option<u64>,
}

pub(super) fn sub(a: SubArgs) -> anyhow::Result<bool> {
    use std::io::Write;
    let opts = worker::subscriber::SubOptions {
        filter: a.filter,
        qos: a.qos,
        durable: a.durable,
        count: a.count,
    };
    let rt = tokio::runtime::Runtime::new()?;
    let end = rt.block_on(async {
        let ch = connect(&a.node).await?;
        worker::subscriber::run(
            ch,
            &opts,
            |stream, id| eprintln!("attached: subscription {id} on stream {stream:?}"),
            |line| {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
            },
            crate::serve::shutdown(),
        )
        .await
    })?;
    eprintln!(
        "{} deliveries; subscription {} {}",
        end.printed,
        end.subscription,
        if end.deleted {
            "deleted"
        } else {
            "kept (durable)"
        }
    );
    Ok(true)
}

/// `dissem test-pattern` found no match (exit code 1, nothing more to say).
#[derive(Debug)]
pub(super) struct NoMatch;

impl std::fmt::Display for NoMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no match")
    }
}

impl std::error::Error for NoMatch {}

#[derive(clap::Args, Debug)]
pub(super) struct TestPatternArgs {
    /// The filter: an EventBridge pattern (JSON) or the text syntax.
    #[arg(short = 'f', long = "pattern")]
    pattern: String,
    /// The event: a JSON object (nested objects name attributes by their dotted path).
    #[arg(short = 'e', long)]
    event: String,
}

pub(super) fn test_pattern(a: TestPatternArgs) -> anyhow::Result<bool> {
    let limits = runtime::Limits::default();
    let matched = runtime::test_pattern::test_pattern(&a.pattern, &a.event, &limits)?;
    print_lines(&[if matched { "match" } else { "no match" }.to_string()])?;
    if matched {
        Ok(true)
    } else {
        Err(NoMatch.into())
    }
}

/// Prints `lines` on stdout. A reader that went away (`dissem subscriptions | head -1`) ends
/// the output quietly, as with other command-line tools, instead of a panic.
pub(super) fn print_lines(lines: &[String]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for l in lines {
        match writeln!(out, "{l}") {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            r => r?,
        }
    }
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

#[derive(Subcommand, Debug)]
pub(super) enum LinkCmd {
    /// This node's links (mode, what each owes, sent, acknowledged, lag) and its
    /// active-passive role; never a token.
    List {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Promotes a standby: it becomes active at a new epoch and disseminates the copies it
    /// keeps that have not expired (the primary's finished ones were already dropped).
    Promote {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Adds a link to a peer cluster without a restart; the node keeps it in its data
    /// directory. It owes the peer what the node takes from then on.
    Add {
        #[command(flatten)]
        node: NodeArg,
        /// The link's name (letters, digits, `_ . -`).
        name: String,
        /// A node of the peer cluster, e.g. http://10.1.0.5:7700.
        peer: String,
        /// all-active (the default), active-passive or spillover.
        #[arg(long, default_value = "all-active")]
        mode: String,
        /// Active-passive: how long the standby keeps a copy (default 60s); spillover: how
        /// long the peer may take (default half the subscription's delivery TTL).
        #[arg(long, value_parser = parse_duration_ms)]
        ttl: Option<u64>,
        /// The file holding the peer's token with the `federate` role.
        #[arg(long)]
        token_file: Option<String>,
        /// Only objects this filter matches go (text syntax or an EventBridge pattern).
        #[arg(long)]
        filter: Option<String>,
    },
    /// Removes a link added with `link add`, dropping what it still owes (a link from
    /// --link or the config file is removed there).
    Remove {
        #[command(flatten)]
        node: NodeArg,
        /// The link's name.
        name: String,
    },
}

/// `dissem link add`'s request (the token read from its file).
pub(super) fn add_link_request(
    name: String,
    peer: String,
    mode: String,
    ttl: Option<u64>,
    token_file: Option<String>,
    filter: Option<String>,
) -> anyhow::Result<proto::v1::AddLinkRequest> {
    Ok(proto::v1::AddLinkRequest {
        name,
        peer,
        mode,
        ttl_ms: ttl.unwrap_or(0),
        token: token_file
            .map(|f| crate::links::read_token(&f))
            .transpose()?
            .unwrap_or_default(),
        filter: filter.unwrap_or_default(),
    })
}

#[derive(Subcommand, Debug)]
pub(super) enum TokenCmd {
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
        /// Comma-separated roles among ingest, subscribe, read, admin, federate (a peer cluster).
        #[arg(long, value_delimiter = ',', required = true)]
        roles: Vec<String>,
    },
}
