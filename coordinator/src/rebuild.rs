//! What a coordinator that just won the election does before it serves: rebuild the
//! subscription registry from the nodes' copies, and find the nodes from etcd.
//!
//! A subscription created through a node is stored on every live member of that node's
//! column quorum before Create returns (quorum replication), and node 0 and node n-1 belong
//! to every column quorum, so either holds all of them once it has caught up since it last
//! registered (it says so: `whole`; one just back may lack what changed while it was down).
//! The new leader asks both which is whole and lists that one (listing both cost a
//! million copies twice); if neither is whole it takes every member's copies. Every other
//! node that answers gives what changed since a Create: its tombstones (a delete reaches
//! every live node) and its copies of updated subscriptions (an update reaches every live
//! holder, which may not include node 0 or n-1 when they are down). What the leader keeps
//! follows `storage::Newest`: the highest revision of each subscription wins and a deletion
//! is final, so a node that was down while a subscription changed or went cannot bring the
//! old version back. Its own disk may hold a registry from an earlier leadership, changed
//! since: its records are replaced, its tombstones kept.
//!
//! Cluster membership (node ids = grid positions, endpoints, `owns_from`) lives in etcd under
//! `nodes/<id>`: the leader writes a node's record when it registers, and that is how the
//! next leader finds the nodes to rebuild from. Each node also keeps `live/<id>` under a
//! lease of its own while it runs; a new leader takes those as registered (with no workers
//! yet) before they register themselves, so its first membership answers hold every node
//! that is up.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proto::v1;
use proto::v1::daemon_client::DaemonClient;
use runtime::ServiceError;
use runtime::cluster_secret::ClusterSecret;
use runtime::etcd::Etcd;
use runtime::grid::{Grid, Layout};
use storage::{Newest, Store, SubCopy};

/// The etcd key prefix of node records.
pub const NODES: &str = "nodes/";

/// Copies asked per page.
const PAGE: u32 = 1024;

/// How long one node may take to answer one page.
const PAGE_TIMEOUT: Duration = Duration::from_secs(5);

pub use runtime::election::NodeRecord;
use runtime::election::Signed;

/// Writes a node's record (on registration), signed with the cluster secret.
pub async fn record_node(
    etcd: &Etcd,
    r: &NodeRecord,
    secret: &ClusterSecret,
) -> Result<(), ServiceError> {
    let value = serde_json::to_vec(&r.clone().signed(secret))
        .map_err(|e| ServiceError::Startup(e.to_string()))?;
    etcd.put(&format!("{NODES}{}", r.node), value, 0).await?;
    Ok(())
}

/// Every node etcd knows, by id (records that do not parse, or that the cluster secret did
/// not sign, are skipped with a warning: the leader sends the secret to these endpoints).
pub async fn nodes(
    etcd: &Etcd,
    secret: &ClusterSecret,
) -> Result<BTreeMap<u32, NodeRecord>, ServiceError> {
    records(etcd, NODES, secret).await
}

/// The nodes whose presence key is there (up now, as far as their etcd leases say).
pub async fn live_nodes(
    etcd: &Etcd,
    secret: &ClusterSecret,
) -> Result<BTreeMap<u32, NodeRecord>, ServiceError> {
    records(etcd, runtime::election::LIVE_PREFIX, secret).await
}

async fn records(
    etcd: &Etcd,
    prefix: &str,
    secret: &ClusterSecret,
) -> Result<BTreeMap<u32, NodeRecord>, ServiceError> {
    let mut out = BTreeMap::new();
    for kv in etcd.get_prefix(prefix).await? {
        let key = String::from_utf8_lossy(&kv.key);
        match serde_json::from_slice::<NodeRecord>(&kv.value) {
            Ok(r) if r.verifies(secret) => {
                out.insert(r.node, r);
            }
            Ok(r) => tracing::warn!(
                "etcd key {key}: node {} at {} is not signed with the cluster secret: skipped",
                r.node,
                r.endpoint
            ),
            Err(e) => tracing::warn!("etcd key {key}: not a node record: {e}"),
        }
    }
    Ok(out)
}

/// The etcd key of the cluster's grid.
pub const GRID: &str = "grid";

/// The etcd key of the grid an online resize moves to, until it is committed.
pub const GRID_NEXT: &str = "grid_next";

/// The etcd key that says the grid was resized (`"2x3 -> 3x3"`, the last move): from then
/// on a coordinator started with the old `--grid` takes etcd's.
pub const GRID_RESIZED: &str = "grid_resized";

/// Records `grid` as the cluster's grid, or checks it is the one recorded: every coordinator
/// of a cluster must lay the nodes out alike (positions, quorums, heirs). Once the cluster
/// was resized online, etcd's grid is the cluster's whatever `--grid` says. The answer is
/// the layout to lead with: the grid in force, and the one a resize under way moves to.
pub async fn agree_on_grid(etcd: &Etcd, grid: Grid) -> Result<Layout, ServiceError> {
    let mine = grid.to_string();
    match etcd.create(GRID, mine.clone().into_bytes(), 0).await? {
        Ok(_) => Ok(Layout::fixed(grid)),
        Err(kv) if kv.value == mine.as_bytes() => layout(etcd, grid).await,
        Err(kv) => {
            let theirs = String::from_utf8_lossy(&kv.value).to_string();
            if etcd.get(GRID_RESIZED).await?.is_some() {
                let g = theirs.parse::<Grid>().map_err(|e| {
                    ServiceError::invalid("grid", format!("etcd's grid {theirs:?}: {e}"))
                })?;
                tracing::warn!(
                    "the cluster was resized to {g}: --grid {mine} is out of date, leading {g}"
                );
                return layout(etcd, g).await;
            }
            Err(ServiceError::invalid(
                "grid",
                format!("this coordinator has {mine}, but the cluster in etcd has {theirs}"),
            ))
        }
    }
}

/// The layout etcd records (`grid` when it records none): the grid in force and the one a
/// resize under way moves to.
pub async fn layout(etcd: &Etcd, grid: Grid) -> Result<Layout, ServiceError> {
    let read = |v: Option<runtime::etcd::KeyValue>| -> Result<Option<Grid>, ServiceError> {
        v.map(|kv| {
            let s = String::from_utf8_lossy(&kv.value).to_string();
            s.parse::<Grid>().map_err(|e| {
                ServiceError::Startup(format!("etcd holds a grid that does not parse: {e}"))
            })
        })
        .transpose()
    };
    let now = read(etcd.get(GRID).await?)?.unwrap_or(grid);
    let next = read(etcd.get(GRID_NEXT).await?)?;
    Ok(Layout::new(now, next))
}

/// Records the start of a move to `to` (a leader that resumes it reads it back).
pub async fn record_resize(etcd: &Etcd, to: Grid) -> Result<(), ServiceError> {
    etcd.put(GRID_NEXT, to.to_string().into_bytes(), 0).await?;
    Ok(())
}

/// Records the commit of the move from `from` to `to`: the new grid first (a leader that
/// wins between the writes finds the move done), then the move's end; the records of nodes
/// outside `to` go (a rebuild would read their old copies).
pub async fn record_commit(etcd: &Etcd, from: Grid, to: Grid) -> Result<(), ServiceError> {
    etcd.put(GRID, to.to_string().into_bytes(), 0).await?;
    etcd.put(GRID_RESIZED, format!("{from} -> {to}").into_bytes(), 0)
        .await?;
    etcd.delete(GRID_NEXT).await?;
    for p in to.len()..from.len() {
        etcd.delete(&format!("{NODES}{p}")).await?;
    }
    Ok(())
}

/// [`pull`] of every node of `of` (whole: no cursor) side by side, each into a merge of
/// its own: (node, what it found, its merge). A node that failed part way gives what it
/// listed before.
async fn pull_each(
    of: &[&NodeRecord],
    secret: &ClusterSecret,
    max_record: usize,
    changed_only: bool,
) -> Vec<(u32, Result<Pulled, ServiceError>, Newest)> {
    let mut set = tokio::task::JoinSet::new();
    for r in of {
        let (node, endpoint, secret) = (r.node, r.endpoint.clone(), secret.clone());
        set.spawn(async move {
            let mut m = Newest::default();
            let p = pull(
                &endpoint,
                &secret,
                max_record,
                changed_only,
                None,
                usize::MAX,
                &mut m,
            )
            .await;
            (node, p, m)
        });
    }
    let mut out = Vec::with_capacity(of.len());
    while let Some(r) = set.join_next().await {
        match r {
            Ok(r) => out.push(r),
            Err(e) => tracing::warn!("a pull of subscription copies ended: {e}"),
        }
    }
    out.sort_by_key(|(node, _, _)| *node);
    out
}

/// What a rebuild's pulls found so far.
#[derive(Default)]
struct Found {
    /// Nodes that answered.
    answered: usize,
    cursors: BTreeMap<u32, Cursor>,
    /// Whole holders that listed every copy they hold and said whole throughout.
    whole: Vec<u32>,
    /// Nodes that listed every copy they hold (whole or not).
    listed: BTreeSet<u32>,
}

impl Found {
    /// `node` answered `p`; `listed_all`: every copy it holds (else what changed since
    /// Creates).
    fn note(&mut self, node: u32, p: Pulled, listed_all: bool) {
        self.answered += 1;
        self.cursors.insert(node, p.cursor);
        if !listed_all {
            return;
        }
        self.listed.insert(node);
        if p.whole {
            tracing::info!(
                "registry: {} copies and tombstones from node {node} (it holds them all)",
                p.listed
            );
            self.whole.push(node);
        } else {
            // back from being down and not caught up yet: what it lacks, another has
            tracing::info!(
                "registry: {} copies and tombstones from node {node}, which is still \
                 catching up its subscriptions (not trusted to hold them all)",
                p.listed
            );
        }
    }
}

/// Whether the node at `endpoint` says it holds every copy its position must hold (an
/// empty page).
async fn says_whole(endpoint: &str, secret: &ClusterSecret) -> Result<bool, ServiceError> {
    let mut client = DaemonClient::with_interceptor(runtime::channel(endpoint)?, secret.stamp());
    Ok(copies_page(&mut client, endpoint, u64::MAX, 1).await?.whole)
}

/// How long a standby's rebuild waits for a whole holder. After an election every node
/// catches its copies up (not whole for a moment), and a standby restarted then listed
/// every node in full (three million copies at a million subscriptions, 13 s of the
/// machine while the nodes caught up, and the next election found none whole); a
/// standby is in no hurry, a leader does not wait.
const STANDBY_PATIENCE: Duration = Duration::from_secs(10);

/// Waits until one of the nodes at `endpoints` says its copies are whole, for `patience`
/// at most.
async fn wait_for_whole(endpoints: &[&str], secret: &ClusterSecret, patience: Duration) {
    let until = tokio::time::Instant::now() + patience;
    loop {
        for ep in endpoints {
            if matches!(says_whole(ep, secret).await, Ok(true)) {
                return;
            }
        }
        if tokio::time::Instant::now() >= until {
            tracing::info!(
                "registry: no node says its copies are whole after {} s: listing them all",
                patience.as_secs()
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A node's daemon client, stamped with the cluster secret.
type NodeClient = DaemonClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        runtime::cluster_secret::Stamp,
    >,
>;

/// One page of `Daemon.SubscriptionCopies` by id, from `after_id` (every position), with
/// the page timeout and the node named in errors.
async fn copies_page(
    client: &mut NodeClient,
    endpoint: &str,
    after_id: u64,
    limit: u32,
) -> Result<v1::SubscriptionCopiesResponse, ServiceError> {
    let page = client.subscription_copies(v1::SubscriptionCopiesRequest {
        after_id,
        limit,
        placed_by: (0..runtime::grid::MAX_POSITIONS).collect(),
        changed_only: false,
        by_change: false,
        after_change: 0,
    });
    let r = tokio::time::timeout(PAGE_TIMEOUT, page)
        .await
        .map_err(|_| ServiceError::Unavailable(format!("{endpoint}: no answer")))?
        .map_err(|s| ServiceError::Unavailable(format!("{endpoint}: {}", s.message())))?
        .into_inner();
    Ok(r)
}

/// [`copies_page`] from a node that must answer whole.
async fn whole_page(
    client: &mut NodeClient,
    endpoint: &str,
    after_id: u64,
    limit: u32,
) -> Result<v1::SubscriptionCopiesResponse, ServiceError> {
    let r = copies_page(client, endpoint, after_id, limit).await?;
    if !r.whole {
        return Err(ServiceError::Unavailable(format!(
            "{endpoint}: not whole (catching up its subscriptions)"
        )));
    }
    Ok(r)
}

/// A listed copy (or tombstone), refused when its record is over `max_record` bytes.
fn taken(
    c: v1::SubscriptionCopy,
    endpoint: &str,
    max_record: usize,
) -> Result<SubCopy, ServiceError> {
    if c.record.len() > max_record {
        return Err(ServiceError::invalid(
            "copies.record",
            format!("{endpoint} sent a record over {max_record} bytes"),
        ));
    }
    Ok(SubCopy {
        id: c.id,
        revision: c.revision,
        placed_by: Some(c.placed_by),
        record: (!c.deleted).then_some(c.record),
    })
}

/// What the whole node at `endpoint` holds of each of `ids` (sorted), and (`from`) of
/// every id from there on (a leadership's Creates, and later ones): a copy, a tombstone
/// (`record: None`), or nothing (not in the answer). Fails unless the node answers whole
/// throughout (only then is "nothing" the cluster's answer).
pub(crate) async fn copies_of(
    endpoint: &str,
    secret: &ClusterSecret,
    max_record: usize,
    ids: &[u64],
    from: Option<u64>,
) -> Result<BTreeMap<u64, SubCopy>, ServiceError> {
    let mut client = DaemonClient::with_interceptor(runtime::channel(endpoint)?, secret.stamp())
        .max_decoding_message_size(64 << 20);
    let mut out = BTreeMap::new();
    let mut rest = ids;
    while let Some(&first) = rest.first() {
        // a run of consecutive ids, one page each
        let run = rest
            .iter()
            .enumerate()
            .take(PAGE as usize)
            .take_while(|&(i, &id)| first.checked_add(i as u64) == Some(id))
            .count();
        let (asked, next) = rest.split_at(run);
        rest = next;
        let r = whole_page(&mut client, endpoint, first.saturating_sub(1), run as u32).await?;
        for c in r.copies {
            if asked.contains(&c.id) {
                out.insert(c.id, taken(c, endpoint, max_record)?);
            }
        }
    }
    let Some(from) = from else { return Ok(out) };
    let mut after_id = from.saturating_sub(1);
    loop {
        let r = whole_page(&mut client, endpoint, after_id, PAGE).await?;
        let last = r.copies.last().map(|c| c.id);
        for c in r.copies {
            out.insert(c.id, taken(c, endpoint, max_record)?);
        }
        match last {
            Some(id) if r.more && id > after_id => after_id = id,
            _ => return Ok(out),
        }
    }
}

/// What one pull from a node found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pulled {
    /// Copies and tombstones listed.
    pub(crate) listed: usize,
    /// The node holds every copy its position must hold (`whole` in its answers).
    pub(crate) whole: bool,
    /// The node's store, and the change to tail it from next.
    pub(crate) cursor: Cursor,
    /// Asked from a cursor, the node answered from another store (a new disk): nothing
    /// was taken, and its copies must be pulled whole.
    pub(crate) other_store: bool,
    /// Asked from a cursor, the pull stopped at its budget with changes left after
    /// `cursor` (taken by the next pull).
    pub(crate) more: bool,
}

/// Where a tail of one node's change feed stands: its store, and the last change taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub(crate) store_id: u64,
    pub(crate) change: u64,
}

/// Every copy the node at `endpoint` holds (with `changed_only`, only its tombstones and
/// its copies of updated subscriptions), or (`after`: a cursor) what changed since, each
/// offered to `into`. From a cursor, the pull stops once it listed `budget` changes or
/// more (`Pulled::more`): the feed is in change order, so the cursor of its last page
/// says exactly what was taken.
pub(crate) async fn pull(
    endpoint: &str,
    secret: &ClusterSecret,
    max_record: usize,
    changed_only: bool,
    after: Option<Cursor>,
    budget: usize,
    into: &mut Newest,
) -> Result<Pulled, ServiceError> {
    let mut client = DaemonClient::with_interceptor(runtime::channel(endpoint)?, secret.stamp())
        .max_decoding_message_size(64 << 20);
    let mut after_id = 0;
    let mut after_change = after.map_or(0, |c| c.change);
    let mut listed = 0;
    let mut whole = true;
    let mut noted: Option<Cursor> = None;
    loop {
        let page = client.subscription_copies(v1::SubscriptionCopiesRequest {
            after_id,
            limit: PAGE,
            // every position: a node that left the grid placed copies that stay
            placed_by: (0..runtime::grid::MAX_POSITIONS).collect(),
            changed_only,
            by_change: after.is_some(),
            after_change,
        });
        let r = tokio::time::timeout(PAGE_TIMEOUT, page)
            .await
            .map_err(|_| ServiceError::Unavailable(format!("{endpoint}: no answer")))?
            .map_err(|s| ServiceError::Unavailable(format!("{endpoint}: {}", s.message())))?
            .into_inner();
        for c in &r.copies {
            if c.record.len() > max_record {
                return Err(ServiceError::invalid(
                    "copies.record",
                    format!("{endpoint} sent a record over {max_record} bytes"),
                ));
            }
        }
        if let Some(a) = after
            && a.store_id != r.store_id
        {
            return Ok(Pulled {
                listed: 0,
                whole: r.whole,
                cursor: a,
                other_store: true,
                more: false,
            });
        }
        // by id, the first page's last change (read before it); by change, the last page's
        let page_cursor = Cursor {
            store_id: r.store_id,
            change: r.last_change,
        };
        let cursor = match noted {
            Some(c) if after.is_none() => c,
            _ => *noted.insert(page_cursor),
        };
        let last = r.copies.last().map(|c| c.id);
        listed += r.copies.len();
        whole &= r.whole;
        for c in r.copies {
            into.offer(SubCopy {
                id: c.id,
                revision: c.revision,
                placed_by: Some(c.placed_by),
                record: (!c.deleted).then_some(c.record),
            });
        }
        let mut done = Pulled {
            listed,
            whole,
            cursor,
            other_store: false,
            more: false,
        };
        if after.is_some() {
            if !r.more || r.last_change <= after_change {
                return Ok(done);
            }
            if listed >= budget {
                done.more = true;
                return Ok(done);
            }
            after_change = r.last_change;
            continue;
        }
        match last {
            Some(id) if r.more && id > after_id => after_id = id,
            _ => return Ok(done),
        }
    }
}

/// Replaces the registry in `store` with the newest versions of the copies the nodes in
/// etcd hold: the answer is how many subscriptions it holds now. With no node recorded yet
/// (a new cluster) the store is left as it is. Fails when nodes are recorded but none
/// answers (the caller tries again: leading with an empty registry would match objects
/// against nothing). `tail` learns where each node's change feed stood, so the next
/// rounds ([`crate::tail::Tail::follow`]) take only what changed. `standby` (its limits)
/// when a standby's tail rebuilds: it parses the filters while the store writes them, and
/// keeps a listing no whole holder vouched for as the base of its later rounds (a leader
/// takes every member's copies instead: it serves this registry).
pub async fn rebuild(
    store: &Store,
    etcd: &Etcd,
    grid: Layout,
    secret: &ClusterSecret,
    max_record: usize,
    standby: Option<&runtime::Limits>,
    tail: &mut crate::tail::Tail,
) -> Result<usize, ServiceError> {
    tail.reset();
    let nodes = nodes(etcd, secret).await?;
    if nodes.is_empty() {
        let n = store.subscription_count();
        tracing::info!("no node recorded in etcd: keeping the {n} subscriptions on this disk");
        tail.nothing_to_follow();
        return Ok(n);
    }
    let full: Vec<u32> = grid
        .whole_holders()
        .into_iter()
        .filter(|n| nodes.contains_key(n))
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .collect();
    let started = std::time::Instant::now();
    let mut merged = Newest::default();
    let mut found = Found::default();
    // one whole holder's listing holds every subscription: asked first which says so (an
    // empty page each), only that one is listed in full, and the other holder gives what
    // changed since Creates like every node. Listing both side by side cost a million
    // copies twice, seconds of CPU on the nodes and here (a restarted standby was not
    // ready before the next election, `bench failover` 8.7 s); with none whole, both.
    if standby.is_some() {
        let endpoints: Vec<&str> = full.iter().map(|n| nodes[n].endpoint.as_str()).collect();
        wait_for_whole(&endpoints, secret, STANDBY_PATIENCE).await;
    }
    let mut listed = Vec::new();
    for &n in &full {
        if !matches!(says_whole(&nodes[&n].endpoint, secret).await, Ok(true)) {
            continue;
        }
        listed.push(n);
        let mut m = Newest::default();
        let p = pull(
            &nodes[&n].endpoint,
            secret,
            max_record,
            false,
            None,
            usize::MAX,
            &mut m,
        )
        .await;
        merged.absorb(m);
        match p {
            Ok(p) => {
                let vouched = p.whole;
                found.note(n, p, true);
                if vouched {
                    break;
                }
            }
            Err(e) => tracing::warn!("subscription copies from node {n}: {e}"),
        }
    }
    let holders: Vec<&NodeRecord> = full
        .iter()
        .filter(|n| !listed.contains(n))
        .map(|n| &nodes[n])
        .collect();
    // Without a whole holder, a leader takes every member's copies (it serves this
    // registry). A standby keeps the one listing it made as its base and goes on with
    // changes: a later round in which the holder it listed answers whole vouches for it
    // (after elections a second apart the holders were rarely whole throughout a listing
    // of seconds, and listing every node in full took 12 s, `bench failover`).
    let changed_only = !found.whole.is_empty() || (standby.is_some() && !found.listed.is_empty());
    for (node, p, m) in pull_each(&holders, secret, max_record, changed_only).await {
        merged.absorb(m);
        match p {
            Ok(p) => found.note(node, p, !changed_only),
            Err(e) => tracing::warn!("subscription copies from node {node}: {e}"),
        }
    }
    let others: Vec<&NodeRecord> = nodes.values().filter(|r| !full.contains(&r.node)).collect();
    for (node, p, m) in pull_each(&others, secret, max_record, changed_only).await {
        merged.absorb(m);
        match p {
            Ok(p) => found.note(node, p, false),
            Err(e) => tracing::debug!("subscription copies from node {node}: {e}"),
        }
    }
    let Found {
        answered,
        cursors,
        whole,
        listed,
    } = found;
    if answered == 0 {
        return Err(ServiceError::Unavailable(format!(
            "none of the {} recorded nodes gave its subscription copies",
            nodes.len()
        )));
    }
    if whole.is_empty() && standby.is_none() {
        tracing::warn!(
            "registry: {} subscriptions from {answered} of {} nodes (node 0 and node {} \
             hold them all, and neither answered whole)",
            merged.len(),
            nodes.len(),
            grid.whole_holders()[1]
        );
    }
    let pulled = started.elapsed();
    // this disk's own tombstones (an earlier leadership's deletions) are kept by the store
    let (records, deleted) = merged.into_parts();
    let records = std::sync::Arc::new(records);
    // a standby parses the filters while the store writes them (seconds each at a million)
    let parsing = standby.copied().map(|limits| {
        let records = records.clone();
        tokio::task::spawn_blocking(move || crate::tail::parse_records(&records, &limits))
    });
    let held = store.replace_subscriptions(&records, &deleted).await?;
    tracing::info!(
        "registry: {held} subscriptions from {answered} nodes, pulled in {} ms, stored in {} ms",
        pulled.as_millis(),
        (started.elapsed() - pulled).as_millis()
    );
    // tails go on from here; a round a whole holder vouches for makes the registry one to
    // serve (this rebuild, or a later round)
    tail.based(cursors, listed, !whole.is_empty());
    tail.save(store)?;
    store.commit().await?;
    if let Some(p) = parsing {
        let kept = p
            .await
            .map_err(|e| ServiceError::Startup(format!("parsing the registry: {e}")))??;
        tail.parsed(kept, held, store)?;
    }
    Ok(held)
}
