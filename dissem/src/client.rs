//! The client commands' common flags (which node, which token, which CA) and their runner.

use super::*;

#[derive(clap::Args, Debug)]
pub(super) struct NodeArg {
    /// The node's gRPC address.
    #[arg(
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
}

pub(super) fn client<F, Fut>(node: &NodeArg, f: F) -> anyhow::Result<bool>
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
    print_lines(&lines)?;
    Ok(true)
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
        /// Comma-separated roles among ingest, subscribe, read, admin.
        #[arg(long, value_delimiter = ',', required = true)]
        roles: Vec<String>,
    },
}
