//! `dissem bench resize`: an online grid resize under load (issue 33), with real processes.
//! etcd, two coordinators and a 2x3 grid of nodes (`--grid`) take steady puts (a QoS 1 and a
//! QoS 2 subscriber check every object) while the grid grows to 3x3 (`--to`; nodes 6, 7 and
//! 8 join) and shrinks back to 2x3 (they drain and exit): the grow through `dissem grid resize`, the
//! shrink through `Admin.ResizeGrid`. A node is SIGKILLed and started again during each
//! move, and the leading coordinator is SIGKILLed during the shrink (the next resumes it).
//! Every acknowledged object must reach both subscribers, the QoS 2 one exactly once.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::v1;
use serde::Serialize;

use runtime::grid::Grid;

use crate::elected::ElectedCluster;
use crate::failoverbench::{Finished, Traffic};
use crate::procs::{self, try_wait_for};

/// What the benchmark runs.
#[derive(Debug, Clone)]
pub struct ResizeOptions {
    pub bin: PathBuf,
    /// The grid the cluster starts on and returns to.
    pub from: Grid,
    /// The grid it grows to (more positions than `from`).
    pub to: Grid,
    /// Puts per second.
    pub rate: u32,
    /// Subscriptions besides the two checking ones (their copies move too).
    pub subs: usize,
    /// How long the load runs before, between and after the moves.
    pub settle: Duration,
}

/// One move.
#[derive(Debug, Clone, Serialize)]
pub struct Move {
    pub from: String,
    pub to: String,
    /// What was SIGKILLed (and started again) during the move.
    pub killed: String,
    /// From the `ResizeGrid` call to the new grid in force.
    pub seconds: f64,
    /// Copies the nodes received at their catch-ups during the move.
    pub moved_copies: u64,
}

/// The figures, as `--json` writes them.
#[derive(Debug, Clone, Serialize)]
pub struct ResizeReport {
    pub rate: u32,
    pub subscriptions: usize,
    pub from: String,
    pub to: String,
    pub moves: Vec<Move>,
    pub resize_seconds: Vec<f64>,
    pub moved_copies: u64,
    pub acknowledged: usize,
    pub delivered: usize,
    pub lost: usize,
    pub qos2_duplicates: u64,
    pub qos1_repeats: u64,
    pub pass: bool,
}

/// Runs the benchmark on a runtime of its own.
pub fn run(o: &ResizeOptions) -> anyhow::Result<ResizeReport> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run_async(o))
}

async fn run_async(o: &ResizeOptions) -> anyhow::Result<ResizeReport> {
    if !crate::elected::etcd_available() {
        bail!("the resize benchmark needs etcd (apt-get install etcd-server)");
    }
    let (from, to) = (o.from, o.to);
    if to.len() <= from.len() || from.len() < 3 {
        bail!(
            "the grid grown to ({to}) must have more positions than {from}, which needs at \
             least 3 (a node is killed in each move)"
        );
    }
    let (old_n, new_n) = (from.len() as usize, to.len() as usize);
    let dir = procs::temp_dir("resize");
    eprintln!("starting etcd, 2 coordinators and a {from} grid of nodes");
    let mut c = ElectedCluster::start_grid(
        &o.bin,
        &dir,
        2,
        (from.rows, from.cols),
        2,
        &procs::small_node_flags(),
    )
    .await?;
    crate::failoverbench::register_extra(&c, o.subs).await?;
    if o.subs > 0 {
        crate::failoverbench::wait_compiled(&c).await?;
    }
    let mut traffic = Traffic::start(&c, o.rate).await?;
    tokio::time::sleep(o.settle).await;
    // a node that stays, killed during each move
    let (victim_grow, victim_shrink) = (old_n - 2, 1);

    let mut moves = Vec::new();
    // grow: the new positions join; a node is killed during the move
    let before = copies_pulled(&c).await;
    let started = Instant::now();
    let leader = c.wait_leader(Duration::from_secs(15)).await?;
    // the grow through the command line, as an operator runs it
    eprintln!("dissem grid resize {to}; starting nodes {old_n}..{new_n}");
    let cli = {
        let (bin, url, to) = (o.bin.clone(), leader.url.clone(), to.to_string());
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(bin)
                .args(["grid", "resize", &to, "--node-url", &url])
                .args(["--timeout", "180"])
                .output()
        })
    };
    for id in old_n..new_n {
        let p = c.start_node(id as u32);
        c.nodes.push(p);
    }
    kill_and_restart(&mut c, victim_grow).await;
    set_targets(&traffic, &c, new_n);
    let out = cli.await?.context("running dissem grid resize")?;
    let said = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !said.contains(&format!("the grid is {to}")) {
        bail!(
            "dissem grid resize {to} exited with {}: {said}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    let moved = pulled_between(&before, &copies_pulled(&c).await);
    eprintln!("{to} in force after {seconds:.1} s ({moved} copies moved)");
    moves.push(Move {
        from: from.to_string(),
        to: to.to_string(),
        killed: format!("node {victim_grow}"),
        seconds,
        moved_copies: moved,
    });
    tokio::time::sleep(o.settle).await;

    // shrink: back to the first grid, the new nodes drain and exit; a node is killed
    // during it, and the leading coordinator too (the next leader resumes the move)
    set_targets(&traffic, &c, old_n);
    let before = copies_pulled(&c).await;
    let started = Instant::now();
    let leader = c.wait_leader(Duration::from_secs(15)).await?;
    resize(&leader.url, from.rows, from.cols).await?;
    eprintln!("resizing {to} -> {from}: nodes {old_n}..{new_n} drain");
    kill_and_restart(&mut c, victim_shrink).await;
    let new = c.kill_leader().await?;
    eprintln!(
        "  SIGKILL the leader {}: {} leads (epoch {})",
        leader.name, new.name, new.epoch
    );
    wait_done(&c, from.rows, from.cols).await?;
    let seconds = started.elapsed().as_secs_f64();
    let moved = pulled_between(&before, &copies_pulled(&c).await);
    for id in old_n..new_n {
        let status = try_wait_for(Duration::from_secs(30), || {
            let s = c.nodes[id].try_wait();
            async move { s }
        })
        .await
        .with_context(|| format!("node {id} left the grid but did not exit within 30 s"))?;
        if !status.success() {
            bail!("node {id} left the grid and exited with {status}");
        }
    }
    eprintln!("{from} in force after {seconds:.1} s ({moved} copies moved); the leavers exited");
    moves.push(Move {
        from: to.to_string(),
        to: from.to_string(),
        killed: format!("node {victim_shrink}, leader {}", leader.name),
        seconds,
        moved_copies: moved,
    });
    tokio::time::sleep(o.settle).await;

    let Finished {
        objects,
        lost,
        qos2_duplicates,
        qos1_repeats,
    } = traffic.finish(Duration::from_secs(60)).await?;
    let report = ResizeReport {
        rate: o.rate,
        subscriptions: o.subs + 2,
        from: from.to_string(),
        to: to.to_string(),
        resize_seconds: moves.iter().map(|m| m.seconds).collect(),
        moved_copies: moves.iter().map(|m| m.moved_copies).sum(),
        moves,
        acknowledged: objects.len(),
        delivered: objects.len() - lost,
        lost,
        qos2_duplicates,
        qos1_repeats,
        pass: lost == 0 && qos2_duplicates == 0 && !objects.is_empty(),
    };
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}

/// Asks the coordinator at `url` to resize to `rows x cols` (what `dissem grid resize` does
/// first).
async fn resize(url: &str, rows: u32, cols: u32) -> anyhow::Result<v1::ResizeGridResponse> {
    let r = v1::admin_client::AdminClient::new(procs::channel(url))
        .resize_grid(v1::ResizeGridRequest { rows, cols })
        .await
        .with_context(|| format!("resizing to {rows}x{cols} at {url}"))?;
    Ok(r.into_inner())
}

/// Follows the move until `rows x cols` is in force (asking whichever coordinator leads),
/// printing what it waits for when that changes; fails after 3 minutes.
async fn wait_done(c: &ElectedCluster, rows: u32, cols: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut said = Vec::new();
    while Instant::now() < deadline {
        if let Some(l) = c.leader().await
            && let Ok(r) = resize(&l.url, rows, cols).await
        {
            if r.done {
                return Ok(());
            }
            if r.waiting != said {
                eprintln!("  waiting for: {}", r.waiting.join("; "));
                said = r.waiting;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("{rows}x{cols} not in force within 3 minutes; still waiting for {said:?}")
}

/// SIGKILLs node `id` and starts it again on its disk and address.
async fn kill_and_restart(c: &mut ElectedCluster, id: usize) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    eprintln!("  SIGKILL node {id}, and start it again");
    c.nodes[id].kill();
    c.nodes[id].restart();
}

/// Puts go to the first `n` nodes.
fn set_targets(t: &Traffic, c: &ElectedCluster, n: usize) {
    *runtime::lock(&t.targets) = c.nodes.iter().take(n).map(|p| p.url()).collect();
}

/// Each node's count of copies it received at its catch-ups since it started (`None`: it
/// did not answer).
async fn copies_pulled(c: &ElectedCluster) -> Vec<Option<u64>> {
    let mut counts = Vec::with_capacity(c.nodes.len());
    for n in &c.nodes {
        counts.push(procs::stats(&n.url()).await.ok().map(|s| s.copies_pulled));
    }
    counts
}

/// Copies pulled between two [`copies_pulled`] readings. A node whose count went down was
/// restarted in between (the move kills one): all it pulled since counts. Summed before and
/// after instead, the victim's lost count could hide the whole move (0 moved, while the
/// nodes pulled hundreds; `tests/resize.rs` failed so once).
fn pulled_between(before: &[Option<u64>], after: &[Option<u64>]) -> u64 {
    after
        .iter()
        .enumerate()
        .map(|(i, a)| match (before.get(i).copied().flatten(), *a) {
            (Some(b), Some(a)) if a >= b => a - b,
            (_, Some(a)) => a,
            (_, None) => 0,
        })
        .sum()
}

/// Prints the figures.
pub fn print(r: &ResizeReport) {
    println!(
        "resize: {} puts/s, {} subscriptions",
        r.rate, r.subscriptions
    );
    println!(
        "{:>5}  {:>4}  {:>20}  {:>9}  {:>12}",
        "from", "to", "killed", "seconds", "moved copies"
    );
    for m in &r.moves {
        println!(
            "{:>5}  {:>4}  {:>20}  {:>9.1}  {:>12}",
            m.from, m.to, m.killed, m.seconds, m.moved_copies
        );
    }
    println!(
        "objects: {} acknowledged, {} delivered, {} lost; QoS 2 duplicates {}, QoS 1 repeats \
         {}: {}",
        r.acknowledged,
        r.delivered,
        r.lost,
        r.qos2_duplicates,
        r.qos1_repeats,
        if r.pass { "PASS" } else { "FAIL" }
    );
}

#[cfg(test)]
mod tests {
    use super::pulled_between;

    #[test]
    fn a_restarted_node_counts_what_it_pulled_since_and_a_new_one_all() {
        // node 1 restarted (400 -> 30), node 2 did not answer after, node 3 joined
        let before = [Some(100), Some(400), Some(50)];
        let after = [Some(180), Some(30), None, Some(70)];
        assert_eq!(pulled_between(&before, &after), 80 + 30 + 70);
    }
}
