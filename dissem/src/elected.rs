//! `dissem coordinator --etcd`: a coordinator that leads only when etcd elects it. It stands
//! by until it wins (`runtime::election`), keeping its registry in step with the nodes'
//! copies meanwhile (`coordinator::tail`), takes the last changes (or rebuilds the registry
//! from the nodes' copies, `coordinator::rebuild`), serves with its epoch and a fence,
//! announces its address and nonce in the leader key. While it is unsure of its lease (etcd down, a pause) it sends
//! nothing; once etcd says the lease is gone it goes back to standing by (its services are
//! dropped, so nothing of the old leadership acts on).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::bail;
use runtime::election::Signed;

use crate::serve::{CoordinatorArgs, announce, metrics_listener, shutdown};

/// The default key prefix in etcd.
pub(super) const DEFAULT_PREFIX: &str = "/dissem/";

/// How often a leader checks whether its leadership is lost for good (it checks that it
/// surely leads before every message anyway).
const FENCE_CHECK: Duration = Duration::from_millis(20);

/// How long a new leader tries to rebuild its registry before it gives leadership up.
const REBUILD_LIMIT: Duration = Duration::from_secs(20);

/// How often a standby takes the changes of the nodes' subscription copies.
const TAIL_EVERY: Duration = Duration::from_millis(500);

/// How long a new leader whose standby registry no whole holder vouches for tries again
/// before it rebuilds in full (`bench failover --subs 1000000`: an election 6 s after the
/// last found the nodes still catching up, and the rebuild took 13 s).
const WHOLE_PATIENCE: Duration = Duration::from_secs(4);

/// How long a standby without a registry yet lets the others campaign first.
const CAMPAIGN_DEFER: Duration = Duration::from_secs(15);

#[derive(clap::Args, Debug)]
pub(super) struct ElectionFlags {
    /// Campaign for leadership through etcd (its members' client URLs, comma-separated): any
    /// number of coordinators run, exactly one leads, and nodes follow it (`dissem node
    /// --etcd`). Needs --grid (a new leader rebuilds subscriptions from the nodes' copies).
    #[arg(long)]
    pub(super) etcd: Option<String>,
    /// This coordinator's name in the leader key (default: the host name and process id).
    #[arg(long)]
    pub(super) name: Option<String>,
    /// The prefix of every key the cluster keeps in etcd.
    #[arg(long, default_value = DEFAULT_PREFIX)]
    pub(super) etcd_prefix: String,
    /// The leader's etcd lease in seconds: a dead leader is replaced after at most this
    /// (etcd's minimum is about 2).
    #[arg(long, default_value_t = 2)]
    pub(super) lease_ttl: u64,
    /// The URL nodes reach this coordinator at (default: http:// + the listen address).
    #[arg(long)]
    pub(super) advertise: Option<String>,
    #[command(flatten)]
    pub(super) trust: crate::etcdtrust::EtcdTrustFlags,
}

fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "coordinator".into());
    format!("{host}-{}", std::process::id())
}

/// Campaigns, leads while elected, stands by again when deposed; returns on Ctrl-C.
pub(super) async fn coordinate(
    a: &CoordinatorArgs,
    store: storage::Store,
    limits: runtime::Limits,
    base: coordinator::server::ServerConfig,
    secret_file: &Path,
) -> anyhow::Result<bool> {
    let e = &a.election;
    let Some(urls) = &e.etcd else {
        bail!("--etcd is required here")
    };
    let Some(grid) = a.grid else {
        bail!(
            "--etcd needs --grid: a new leader rebuilds the subscriptions from the copies the \
             grid's nodes hold"
        )
    };
    if !(1..=60).contains(&e.lease_ttl) {
        bail!("--lease-ttl must be 1..=60 seconds, got {}", e.lease_ttl);
    }
    let etcd = e.trust.connect(urls, &e.etcd_prefix).await?;
    let name = e.name.clone().unwrap_or_else(default_name);
    announce(format!(
        "dissem coordinator {name} campaigning through etcd {urls} (data in {}, cluster secret \
         in {}, grid {grid})",
        a.data.display(),
        secret_file.display()
    ))?;
    let mut stop = std::pin::pin!(shutdown());
    // the grid must be the cluster's; etcd may not be up yet (then: wait for it)
    let grid = loop {
        match coordinator::rebuild::agree_on_grid(&etcd, grid).await {
            Ok(layout) => break layout.grid,
            Err(e @ runtime::ServiceError::InvalidArgument { .. }) => bail!("--{e}"),
            Err(e) => tracing::warn!("checking the cluster's grid in etcd: {e}; trying again"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = &mut stop => return Ok(true),
        }
    };
    let mut tail = coordinator::tail::Tail::default();
    loop {
        // the tail runs in a task of its own: its rounds never hold the campaign up, and a
        // won campaign lets the round under way end (bounded) instead of dropping it
        let synced = Arc::new(AtomicBool::new(tail.ready()));
        let rebuilding = Arc::new(AtomicBool::new(false));
        let (end_tx, end_rx) = tokio::sync::watch::channel(false);
        let standing = tokio::spawn(stand_by(
            tail,
            Following {
                store: store.clone(),
                etcd: etcd.clone(),
                grid,
                secret: base.cluster_secret.clone(),
                limits,
            },
            synced.clone(),
            rebuilding.clone(),
            end_rx,
        ));
        let leadership = tokio::select! {
            l = async {
                defer_campaign(&synced).await;
                runtime::election::campaign(&etcd, &name, e.lease_ttl as i64).await
            } => l,
            _ = &mut stop => {
                standing.abort();
                return Ok(true);
            }
        };
        let _ = end_tx.send(true);
        if rebuilding.load(Ordering::Acquire) {
            // a standby's rebuild (it may wait seconds for a whole holder): the leader's
            // own rebuild does not wait
            standing.abort();
        }
        tail = match standing.await {
            Ok(t) => t,
            Err(e) => {
                if !e.is_cancelled() {
                    tracing::warn!("the standby registry's tail ended: {e}; rebuilding");
                }
                coordinator::tail::Tail::default()
            }
        };
        let fence = leadership.fence.clone();
        let led = tokio::select! {
            r = lead(a, &name, &store, &limits, &base, &etcd, &leadership, grid, &mut tail) => r,
            _ = fence.lost(FENCE_CHECK) => Ok(()),
            _ = &mut stop => {
                leadership.resign().await;
                return Ok(true);
            }
        };
        if let Err(e) = led {
            tracing::error!("leading: {e:#}");
        }
        tracing::warn!(
            "no longer leading (epoch {}): standing by again",
            leadership.epoch
        );
        leadership.resign().await;
        // this leadership wrote the store: the standby's tail resumes from the state it
        // saved before, with the journaled writes set to the nodes' copies
        tail.reset();
    }
}

/// Keeps the registry on this disk in step with the nodes' copies while standing by: a
/// rebuild first, then every [`TAIL_EVERY`] what changed (`coordinator::tail`).
/// Holds a standby's campaign back until its tail has a registry (its first round, a
/// rebuild, is done; or no node is recorded yet), for at most [`CAMPAIGN_DEFER`]: a coordinator restarted a moment ago
/// that won the next election rebuilt a million subscriptions in full (20 s and more)
/// while a standby that had followed the nodes all along stood by. When no standby has a
/// registry (etcd or the nodes out of reach), the election waits this long at most.
async fn defer_campaign(synced: &AtomicBool) {
    let until = tokio::time::Instant::now() + CAMPAIGN_DEFER;
    let mut said = false;
    while !synced.load(Ordering::Acquire) && tokio::time::Instant::now() < until {
        if !said {
            said = true;
            tracing::info!(
                "campaigning once the standby registry is built (at most {} s from now)",
                CAMPAIGN_DEFER.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a standby's tail follows the nodes with.
struct Following {
    store: storage::Store,
    etcd: runtime::etcd::Etcd,
    grid: runtime::grid::Grid,
    secret: runtime::cluster_secret::ClusterSecret,
    limits: runtime::Limits,
}

/// Runs the tail's rounds until `end` says so (the campaign was won), then hands the tail
/// back: a round under way ends first (rounds are bounded, `coordinator::tail::ROUND_BUDGET`).
/// A round that stopped at its budget is followed by the next at once. `rebuilding` says
/// that the round under way is a rebuild (or a resume), which a new leader drops instead.
async fn stand_by(
    mut tail: coordinator::tail::Tail,
    f: Following,
    synced: Arc<AtomicBool>,
    rebuilding: Arc<AtomicBool>,
    mut end: tokio::sync::watch::Receiver<bool>,
) -> coordinator::tail::Tail {
    let mut following = false;
    while !*end.borrow() {
        rebuilding.store(!tail.is_based(), Ordering::Release);
        let round = match coordinator::rebuild::layout(&f.etcd, f.grid).await {
            Ok(layout) => {
                tail.follow(&f.store, &f.etcd, layout, &f.secret, &f.limits)
                    .await
            }
            Err(e) => Err(e),
        };
        synced.store(tail.ready(), Ordering::Release);
        rebuilding.store(false, Ordering::Release);
        let mut more = false;
        match round {
            Ok(Some(r)) if !following => {
                following = true;
                more = r.more;
                tracing::info!(
                    "standby registry: {} subscriptions, following the nodes' changes",
                    r.subscriptions
                );
            }
            Ok(Some(r)) => more = r.more,
            Ok(None) => following = false,
            Err(e) => {
                following = false;
                tracing::debug!("standby registry: {e}; trying again");
            }
        }
        if !more {
            tokio::select! {
                _ = tokio::time::sleep(TAIL_EVERY) => {}
                _ = end.changed() => {}
            }
        }
    }
    tail
}

/// One leadership: rebuild, serve, announce; returns when serving ends or fails.
#[allow(clippy::too_many_arguments)]
async fn lead(
    a: &CoordinatorArgs,
    name: &str,
    store: &storage::Store,
    limits: &runtime::Limits,
    base: &coordinator::server::ServerConfig,
    etcd: &runtime::etcd::Etcd,
    leadership: &runtime::election::Leadership,
    grid: runtime::grid::Grid,
    tail: &mut coordinator::tail::Tail,
) -> anyhow::Result<()> {
    let started_at = std::time::Instant::now();
    let mut pause = Duration::from_millis(50);
    // a standby that followed the nodes takes their last changes; else a full rebuild
    let followed = match coordinator::rebuild::layout(etcd, grid).await {
        Ok(layout) if tail.is_based() => loop {
            match tail
                .follow(store, etcd, layout, &base.cluster_secret, limits)
                .await
            {
                Ok(Some(r)) if r.more => {}
                Ok(Some(r)) => break Some((layout, r.subscriptions)),
                // no whole holder yet: the nodes catch up after every election (under a
                // second, usually), and a full rebuild at a million takes 13 s and more
                Ok(None) if tail.is_based() && started_at.elapsed() < WHOLE_PATIENCE => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(None) => break None,
                Err(e) => {
                    tracing::warn!("the standby registry's last changes: {e}; rebuilding");
                    break None;
                }
            }
        },
        _ => None,
    };
    if let Some((_, n)) = followed {
        tracing::info!(
            "registry: {n} subscriptions kept while standing by, with the nodes' last changes \
             ({} ms)",
            started_at.elapsed().as_millis()
        );
    }
    let (layout, subscriptions) = loop {
        if let Some(f) = followed {
            break f;
        }
        // the grid as etcd has it now: an online resize may have moved it, or be under way
        let layout = match coordinator::rebuild::layout(etcd, grid).await {
            Ok(l) => l,
            Err(e) if started_at.elapsed() < REBUILD_LIMIT => {
                tracing::warn!("reading the grid from etcd: {e}; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
            Err(e) => bail!("reading the grid from etcd: {e}"),
        };
        match coordinator::rebuild::rebuild(
            store,
            etcd,
            layout,
            &base.cluster_secret,
            limits.max_object_bytes,
            None,
            tail,
        )
        .await
        {
            Ok(n) => break (layout, n),
            Err(e) if started_at.elapsed() < REBUILD_LIMIT => {
                tracing::warn!("rebuilding the registry: {e}; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => bail!("rebuilding the registry: {e}"),
        }
    };
    let registry_ready = started_at.elapsed();
    let live: Vec<_> = match coordinator::rebuild::live_nodes(etcd, &base.cluster_secret).await {
        Ok(l) => l.into_values().collect(),
        Err(e) => {
            tracing::warn!("reading which nodes are up: {e}");
            Vec::new()
        }
    };
    let (listener, addr) = runtime::bind(a.listen).await?;
    let url = a
        .election
        .advertise
        .clone()
        .unwrap_or_else(|| format!("{}://{addr}", a.listen_flags.scheme()));
    let cfg = coordinator::server::ServerConfig {
        elected: Some(coordinator::server::ElectedRole {
            fence: leadership.fence.clone(),
            epoch: leadership.epoch,
            name: name.to_string(),
            etcd: etcd.clone(),
            live,
            registry_kept: followed.is_some(),
            registry_ready_ms: registry_ready.as_millis() as u64,
        }),
        grid: Some(layout.grid),
        resizing: layout.next,
        ..base.clone()
    };
    let started =
        coordinator::server::start_preloaded(store.clone(), *limits, cfg, tail.take_preloaded())
            .await?;
    let nonce = started.nonce();
    let metrics = metrics_listener(a.metrics_listen).await?;
    let listener = a.listen_flags.listener(listener, limits)?;
    leadership
        .announce(
            &runtime::election::LeaderInfo {
                name: name.to_string(),
                url: url.clone(),
                nonce,
                epoch: leadership.epoch,
                sig: String::new(),
            }
            .signed(&base.cluster_secret),
        )
        .await?;
    tracing::info!(
        "leading (epoch {}) on {url} with {subscriptions} subscriptions, {} ms after winning",
        leadership.epoch,
        started_at.elapsed().as_millis()
    );
    coordinator::server::serve_started(started, listener, metrics, std::future::pending()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_campaign_waits_for_the_standby_registry_at_most_the_deferral() {
        let start = tokio::time::Instant::now();
        defer_campaign(&AtomicBool::new(true)).await;
        assert_eq!(tokio::time::Instant::now(), start, "ready: at once");
        defer_campaign(&AtomicBool::new(false)).await;
        let waited = tokio::time::Instant::now() - start;
        assert!(
            waited >= CAMPAIGN_DEFER && waited < CAMPAIGN_DEFER + Duration::from_millis(100),
            "never ready: the deferral, {waited:?}"
        );
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            flag.store(true, Ordering::Release);
        });
        let start = tokio::time::Instant::now();
        defer_campaign(&synced).await;
        let waited = tokio::time::Instant::now() - start;
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_millis(2100),
            "ready after 2 s: {waited:?}"
        );
    }
}
