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

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

mod benches;
mod client;
mod config;
mod elected;
mod embedded;
mod etcdtrust;
mod links;
mod receive;
mod reopen;
mod serve;
mod thp;

use benches::{
    Bench, bench_chaos, bench_churn, bench_cluster, bench_cost, bench_e2e, bench_failover,
    bench_federation, bench_ingest, bench_latency, bench_match, bench_quorum, bench_resize,
    bench_subs_churn, demo,
};
use client::{LinkCmd, NodeArg, TokenCmd, client};
use serve::{CoordinatorArgs, NodeArgs, UpArgs, WorkerFlags, coordinator_cmd, node_cmd, up};

/// A storage-integrated content dissemination cluster.
#[derive(Parser, Debug)]
#[command(name = "dissem", version, about)]
struct Cli {
    /// A TOML file of settings, one [command] table of long-flag keys (see docs/reference.md); flags and
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
    Node(Box<NodeArgs>),
    /// Stores one object on a node (metadata as name=value; quote strings that look numeric).
    Put(client::PutArgs),
    /// Registers a subscription (text filter, or EventBridge JSON starting with `{`).
    Subscribe(client::SubscribeArgs),
    /// Subscribes on the command line: prints each delivery as a JSON line on stdout, acks it,
    /// and deletes the subscription at the end (Ctrl-C, --count) unless --durable.
    Sub(client::SubArgs),
    /// Serves a gRPC push endpoint that keeps each delivery in a journal file, durably,
    /// before it acknowledges it; QoS 2 subscriptions named with --exactly-once are shown
    /// once across kills and restarts.
    Receive(receive::ReceiveArgs),
    /// Shows one subscription.
    Get {
        #[command(flatten)]
        node: NodeArg,
        /// The subscription id.
        id: u64,
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
    /// Says whether a JSON event matches a filter (text or EventBridge pattern), as
    /// EventBridge's TestEventPattern does; exit code 0 if it matches, 1 if not.
    TestPattern(client::TestPatternArgs),
    /// Prints a shell completion script: `dissem completions bash > /etc/bash_completion.d/dissem`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
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
    /// A node's links to peer clusters (federation): list them, or promote a standby.
    Link {
        #[command(subcommand)]
        which: LinkCmd,
    },
    /// The cluster's quorum grid: resize it while it runs.
    Grid {
        #[command(subcommand)]
        which: GridCmd,
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

#[derive(Subcommand, Debug)]
enum GridCmd {
    /// Resizes the grid of a running cluster to ROWSxCOLS (admin; --node-url is the leading
    /// coordinator): nodes at new positions must be started (each with --node at its
    /// position), copies move to the new quorums, nodes outside the new grid drain and exit;
    /// prints what the move waits for until the new grid is in force. Writers and
    /// subscribers go on throughout; a kill of the leader or of a node resumes the move.
    Resize {
        #[command(flatten)]
        node: NodeArg,
        /// The grid to move to, e.g. 3x3.
        grid: runtime::grid::Grid,
        /// How long to follow the move, in seconds (it goes on after).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
}

/// The command line with the environment variable of every server flag named (`--help`
/// shows them).
fn cli_command() -> clap::Command {
    config::with_env_names(Cli::command())
}

/// Re-executes this process with a private `XDG_RUNTIME_DIR` when none is set: the Vulkan
/// loader and Mesa print "XDG_RUNTIME_DIR is invalid or not set in the environment" on
/// stderr for every GPU probe without one (a container, a CI job, a `sudo` shell), which
/// reads as an error of ours. The directory is `dissem-runtime-<uid>` in the temporary
/// directory, mode 0700; one that exists and is not this user's is not used.
fn ensure_runtime_dir() {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("dissem-runtime-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let ours = std::fs::symlink_metadata(&dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o077 == 0);
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    if !ours {
        return;
    }
    // returns only when the exec failed: then run on as we are
    let _ = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("XDG_RUNTIME_DIR", &dir)
        .exec();
}

fn main() -> ExitCode {
    thp::configure();
    ensure_runtime_dir();
    let command = cli_command();
    let args = match config::apply(std::env::args_os().collect(), &command) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let matches = command.get_matches_from(args);
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
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
        // colour codes only for a terminal: a log file or a pipe gets plain text
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .try_init()
    };
    let result = match cli.command {
        Command::Up { up: a, workers } => up(a, workers),
        Command::Coordinator(a) => coordinator_cmd(a),
        Command::Workers { node } => client(&node, worker::client::workers),
        Command::Grid {
            which:
                GridCmd::Resize {
                    node,
                    grid,
                    timeout,
                },
        } => client(&node, |ch| {
            worker::client::resize_grid(ch, grid, std::time::Duration::from_secs(timeout))
        }),
        Command::Link {
            which: LinkCmd::List { node },
        } => client(&node, worker::client::links),
        Command::Link {
            which: LinkCmd::Promote { node },
        } => client(&node, worker::client::promote),
        Command::Link {
            which:
                LinkCmd::Add {
                    node,
                    name,
                    peer,
                    mode,
                    ttl,
                    token_file,
                    filter,
                },
        } => match client::add_link_request(name, peer, mode, ttl, token_file, filter) {
            Ok(r) => client(&node, |ch| worker::client::add_link(ch, r)),
            Err(e) => Err(e),
        },
        Command::Link {
            which: LinkCmd::Remove { node, name },
        } => client(&node, |ch| worker::client::remove_link(ch, name)),
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
        Command::Node(a) => node_cmd(*a),
        Command::Put(a) => client::put(a),
        Command::Subscribe(a) => client::subscribe(a),
        Command::Sub(a) => client::sub(a),
        Command::Receive(a) => receive::receive(a),
        Command::TestPattern(a) => client::test_pattern(a),
        Command::Get { node, id } => client(&node, |ch| async move {
            let s = worker::client::get(ch, id).await?;
            Ok(worker::client::Printed::new(
                worker::client::subscription_lines(&s),
                worker::client::subscription_json(&s),
            ))
        }),
        Command::Unsubscribe { node, id } => {
            client(&node, |ch| async move { worker::client::unsubscribe(ch, id).await })
        }
        Command::Completions { shell } => {
            // written whole, so a reader that goes away ends it quietly, not in a panic
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cli_command(), "dissem", &mut script);
            client::print_lines(&[String::from_utf8_lossy(&script).trim_end().to_string()])
                .map(|()| true)
                .map_err(anyhow::Error::from)
        }
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
            which: Bench::SubsChurn(a),
        } => bench_subs_churn(a),
        Command::Bench {
            which: Bench::Cost(a),
        } => bench_cost(a),
        Command::Bench {
            which: Bench::Latency(a),
        } => bench_latency(a),
        Command::Bench {
            which: Bench::Ingest(a),
        } => bench_ingest(a),
        Command::Bench {
            which: Bench::Quorum(a),
        } => bench_quorum(a),
        Command::Bench {
            which: Bench::Churn(a),
        } => bench_churn(a),
        Command::Bench {
            which: Bench::Failover(a),
        } => bench_failover(a),
        Command::Bench {
            which: Bench::Federation(a),
        } => bench_federation(a),
        Command::Bench {
            which: Bench::Chaos(a),
        } => bench_chaos(a),
        Command::Bench {
            which: Bench::Resize(a),
        } => bench_resize(a),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: engines disagree on the matches");
            ExitCode::FAILURE
        }
        Err(e) if e.is::<client::NoMatch>() => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code(&e)
        }
    }
}

/// 1 for what went wrong at run time (not found, unreachable, refused), 2 for input to fix
/// (a bad flag or a request the node refused as invalid).
fn exit_code(e: &anyhow::Error) -> ExitCode {
    match e.downcast_ref::<runtime::ServiceError>() {
        Some(runtime::ServiceError::InvalidArgument { .. }) => ExitCode::from(2),
        Some(runtime::ServiceError::Peer { code, .. }) if *code == tonic::Code::InvalidArgument => {
            ExitCode::from(2)
        }
        Some(_) => ExitCode::FAILURE,
        None => ExitCode::from(2),
    }
}
