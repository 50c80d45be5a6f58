//! Coordinator election on etcd (`dissem coordinator --etcd`), and how nodes follow the
//! leader. Any number of coordinators campaign; the one that creates the leader key under
//! its lease leads, until its lease ends. The key's creation revision is the leadership's
//! *epoch*: it only grows, so whatever a leader numbers (image versions, subscription ids)
//! can start from it and never repeats an earlier leader's numbers.
//!
//! A leader acts only while it surely holds its lease: until the TTL etcd granted, counted
//! from when its last answered keep-alive was *sent*. A leader that was paused (SIGSTOP, a
//! stalled machine) or cut off from etcd stops acting by its own clock (the [`Fence`])
//! before any standby can have taken over, without waiting to hear so from etcd. When etcd
//! answers again, a lease that lived on means no one else was elected (an etcd restart
//! keeps leases), and the leader goes on; a lease that is gone ends the leadership. Nodes follow the leader key ([`LeaderWatch`]) and take assignments only from the
//! leader it names (by nonce), so a deposed leader that still sends is ignored.
//!
//! The leader key's value says who leads and where: `{"name", "url", "nonce", "sig"}`. A
//! new leader first writes it with no `url` (it is rebuilding its registry), then with its
//! address once it serves; nodes connect only to a leader with an address. etcd is not
//! trusted with the cluster secret's power: the announcement is signed with the secret
//! (HMAC-SHA256 over name, url, nonce and the epoch, so an old announcement copied into a
//! new key does not verify), and a node follows only a leader key that verifies, so
//! whoever can write to etcd cannot make the nodes send their secret to an address of
//! their choosing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::ServiceError;
use crate::cluster_secret::ClusterSecret;
use crate::etcd::{Change, Etcd};

/// The leader key's name under the etcd prefix.
pub const LEADER_KEY: &str = "leader";

/// The prefix of the nodes' presence keys (`live/<id>`, each under its node's own lease,
/// `{"node","endpoint","owns_from"}`): who is up, for a new leader before they register.
pub const LIVE_PREFIX: &str = "live/";

/// What the leader key says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LeaderInfo {
    /// The coordinator's `--name`.
    pub name: String,
    /// Where it serves `Cluster` (empty while it rebuilds its registry).
    #[serde(default)]
    pub url: String,
    /// Its nonce (the seed's hello nonce); 0 while it rebuilds.
    #[serde(default)]
    pub nonce: u64,
    /// The leadership's epoch: the key's creation revision (not stored in the value).
    #[serde(skip)]
    pub epoch: u64,
    /// [`LeaderInfo::signed`]: the cluster secret's signature of the rest, epoch included.
    #[serde(default)]
    pub sig: String,
}

impl LeaderInfo {
    fn parse(kv: &crate::etcd::KeyValue) -> Option<LeaderInfo> {
        let mut l: LeaderInfo = serde_json::from_slice(&kv.value).ok()?;
        l.epoch = u64::try_from(kv.create_revision).ok()?;
        Some(l)
    }
}

/// What the cluster writes to etcd, signed with the cluster secret: whoever can write to
/// etcd but lacks the secret cannot forge it.
pub trait Signed: Sized {
    /// What the signature covers (a tag naming the kind of record first).
    fn signed_bytes(&self) -> Vec<u8>;
    fn sig_mut(&mut self) -> &mut String;
    fn sig(&self) -> &str;

    /// The same, signed with the cluster secret.
    fn signed(mut self, secret: &ClusterSecret) -> Self {
        *self.sig_mut() = secret.sign(&self.signed_bytes());
        self
    }

    /// Whether the cluster secret signed it.
    fn verifies(&self, secret: &ClusterSecret) -> bool {
        secret.verify(&self.signed_bytes(), self.sig())
    }
}

impl Signed for LeaderInfo {
    /// The epoch too: an announcement copied into a later leadership's key does not verify.
    fn signed_bytes(&self) -> Vec<u8> {
        format!(
            "dissem leader\n{}\n{}\n{}\n{}",
            self.name, self.url, self.nonce, self.epoch
        )
        .into_bytes()
    }

    fn sig_mut(&mut self) -> &mut String {
        &mut self.sig
    }

    fn sig(&self) -> &str {
        &self.sig
    }
}

/// A node as etcd records it: `nodes/<id>` (written by the leader when the node
/// registers) and `live/<id>` (the node's presence). Signed with the cluster secret, since
/// a new leader sends the secret to the endpoints these name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node: u32,
    pub endpoint: String,
    #[serde(default)]
    pub owns_from: u64,
    #[serde(default)]
    pub sig: String,
}

impl Signed for NodeRecord {
    fn signed_bytes(&self) -> Vec<u8> {
        format!(
            "dissem node\n{}\n{}\n{}",
            self.node, self.endpoint, self.owns_from
        )
        .into_bytes()
    }

    fn sig_mut(&mut self) -> &mut String {
        &mut self.sig
    }

    fn sig(&self) -> &str {
        &self.sig
    }
}

/// Whether this process surely leads (cheap to clone; the coordinator checks it before
/// every message it sends and every answer that would make a node follow it).
///
/// Not held is either *suspended* (no keep-alive answered for a TTL: etcd restarting, a
/// pause, a partition; nothing may go out, but a later answer that finds the lease alive and
/// the key still under it resumes, since no one else can have been elected meanwhile) or
/// *lost* (etcd said the lease is gone, or the key is someone else's: final).
#[derive(Debug, Clone)]
pub struct Fence {
    state: Arc<Mutex<FenceState>>,
}

#[derive(Debug)]
struct FenceState {
    /// Leadership is surely held until then.
    until: Instant,
    /// etcd said the lease is gone, or the key was taken: it never comes back.
    lost: bool,
    /// The leader key was created under this lease (a standby's lease guards no key).
    leads: bool,
}

impl Fence {
    fn new(until: Instant) -> Fence {
        Fence {
            state: Arc::new(Mutex::new(FenceState {
                until,
                lost: false,
                leads: false,
            })),
        }
    }

    /// This process leads now (its lease cannot have run out yet).
    pub fn held(&self) -> bool {
        let s = crate::lock(&self.state);
        !s.lost && Instant::now() < s.until
    }

    /// Leadership is over for good.
    pub fn is_lost(&self) -> bool {
        crate::lock(&self.state).lost
    }

    fn renew(&self, until: Instant) {
        let mut s = crate::lock(&self.state);
        if until > s.until {
            s.until = until;
        }
    }

    fn lose(&self) {
        crate::lock(&self.state).lost = true;
    }

    fn leads(&self) -> bool {
        crate::lock(&self.state).leads
    }

    /// Resolves once leadership is lost for good (checked every `every`).
    pub async fn lost(&self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            if self.is_lost() {
                return;
            }
        }
    }
}

/// A won election: the epoch, the lease, and the keep-alive that renews the [`Fence`].
#[derive(Debug)]
pub struct Leadership {
    pub epoch: u64,
    pub fence: Fence,
    etcd: Etcd,
    lease: i64,
    keep_alive: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Writes the leader key's value (only while this lease still holds the key).
    pub async fn announce(&self, info: &LeaderInfo) -> Result<(), ServiceError> {
        let value = serde_json::to_vec(info).map_err(|e| ServiceError::Startup(e.to_string()))?;
        if self.etcd.put_if_held(LEADER_KEY, value, self.lease).await? {
            Ok(())
        } else {
            self.fence.lose();
            Err(ServiceError::Unavailable(
                "the leader key is no longer this coordinator's".into(),
            ))
        }
    }

    /// Gives leadership up now (the key goes with the lease), so a standby need not wait for
    /// the lease to run out.
    pub async fn resign(self) {
        self.fence.lose();
        self.keep_alive.abort();
        if let Err(e) = self.etcd.revoke(self.lease).await {
            tracing::debug!("revoking the leader lease: {e}");
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.fence.lose();
        self.keep_alive.abort();
    }
}

/// Keeps `lease` alive every `every`, moving the fence to (send time + granted TTL) at each
/// answer; a lease etcd says is gone loses the fence for good.
async fn keep_alive(etcd: Etcd, lease: i64, every: Duration, fence: Fence) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let sent = Instant::now();
        match etcd.keep_alive_once(lease).await {
            Ok(ttl) if ttl > 0 => {
                if fence.leads() && !fence.held() {
                    // resuming after a gap: the lease lived on, so no one else can have
                    // created the key; still, it must be under this lease
                    match etcd.get(LEADER_KEY).await {
                        Ok(Some(kv)) if kv.lease == lease => {
                            tracing::info!("the leader lease held through a gap: leading on");
                        }
                        Ok(_) => {
                            tracing::warn!("the leader key is no longer under this lease");
                            fence.lose();
                            return;
                        }
                        Err(e) => {
                            tracing::debug!("checking the leader key: {e}");
                            continue;
                        }
                    }
                }
                fence.renew(sent + Duration::from_secs(ttl as u64));
            }
            Ok(_) => {
                tracing::warn!("etcd says the leader lease is gone");
                fence.lose();
                return;
            }
            Err(e) => tracing::debug!("keeping the lease alive: {e}"),
        }
    }
}

/// Campaigns until this process leads: stands by while another holds the leader key
/// (watching for it to go), and returns once the key is created under a fresh lease of
/// `ttl_s` seconds. `name` is written into the key (with no address yet).
pub async fn campaign(etcd: &Etcd, name: &str, ttl_s: i64) -> Leadership {
    let mut pause = Duration::from_millis(100);
    let mut logged_holder = String::new();
    loop {
        match try_campaign(etcd, name, ttl_s, &mut logged_holder).await {
            Ok(Some(l)) => return l,
            Ok(None) => pause = Duration::from_millis(100),
            Err(e) => {
                tracing::warn!("campaigning for coordinator leadership: {e}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// One round: a lease, then create the key or watch its holder until it goes.
async fn try_campaign(
    etcd: &Etcd,
    name: &str,
    ttl_s: i64,
    logged_holder: &mut String,
) -> Result<Option<Leadership>, ServiceError> {
    // the lease may start counting as soon as etcd has the request: time it from the ask
    let asked = Instant::now();
    let (lease, ttl) = etcd.grant(ttl_s).await?;
    let ttl = Duration::from_secs(ttl.max(1) as u64);
    let fence = Fence::new(asked + ttl);
    // renewed about six times per TTL, so the fence stays well ahead of the lease's end
    let every = (ttl / 6).max(Duration::from_millis(100));
    let keep = tokio::spawn(keep_alive(etcd.clone(), lease, every, fence.clone()));
    let value = serde_json::to_vec(&LeaderInfo {
        name: name.to_string(),
        ..LeaderInfo::default()
    })
    .map_err(|e| ServiceError::Startup(e.to_string()))?;
    let give_up = |keep: tokio::task::JoinHandle<()>| async move {
        keep.abort();
        let _ = etcd.revoke(lease).await;
    };
    loop {
        if !fence.held() {
            give_up(keep).await;
            return Ok(None); // our own lease lapsed while standing by: a fresh one
        }
        let holder = match etcd.create(LEADER_KEY, value.clone(), lease).await {
            Ok(Ok(revision)) => {
                tracing::info!("leading the cluster (epoch {revision})");
                crate::lock(&fence.state).leads = true;
                return Ok(Some(Leadership {
                    epoch: revision as u64,
                    fence,
                    etcd: etcd.clone(),
                    lease,
                    keep_alive: keep,
                }));
            }
            Ok(Err(holder)) => holder,
            Err(e) => {
                give_up(keep).await;
                return Err(e);
            }
        };
        let who = LeaderInfo::parse(&holder).map_or_else(|| "?".into(), |l| l.name);
        if *logged_holder != who {
            tracing::info!("standing by: {who} leads");
            *logged_holder = who;
        }
        // wait for the holder's key to go (deleted, or its lease ran out)
        let mut w = match etcd.watch(LEADER_KEY, false, holder.mod_revision + 1).await {
            Ok(w) => w,
            Err(e) => {
                give_up(keep).await;
                return Err(e);
            }
        };
        loop {
            let next = tokio::time::timeout(ttl, w.next()).await;
            match next {
                Ok(Some(changes)) => {
                    if changes.iter().any(|c| matches!(c, Change::Delete(_))) {
                        break;
                    }
                }
                Ok(None) => break, // the watch ended: look again
                Err(_) if !fence.held() => break,
                Err(_) => {}
            }
        }
    }
}

/// The leader as nodes and clients follow it: reads the leader key, then watches it, and
/// reads again whenever the watch ends (etcd restarted).
#[derive(Debug, Clone)]
pub struct LeaderWatch {
    rx: watch::Receiver<Option<LeaderInfo>>,
}

impl LeaderWatch {
    /// Starts following the leader key (a task that runs until the runtime stops). A leader
    /// with an address counts only if `secret` signed it; one that does not verify is
    /// taken as no leader, and logged.
    pub fn start(etcd: Etcd, secret: ClusterSecret) -> LeaderWatch {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(follow(etcd, secret, tx));
        LeaderWatch { rx }
    }

    /// The leader the key names now (`None`: none, or none that serves yet).
    pub fn current(&self) -> Option<LeaderInfo> {
        self.rx.borrow().clone().filter(|l| !l.url.is_empty())
    }

    /// A receiver that sees every change of the leader from now on (`changed()` waits for
    /// the next one).
    pub fn changes(&self) -> watch::Receiver<Option<LeaderInfo>> {
        let mut rx = self.rx.clone();
        rx.mark_unchanged();
        rx
    }
}

/// The leader a key value names, if it may be followed: one still without an address, or
/// one the cluster secret signed.
fn trusted(kv: &crate::etcd::KeyValue, secret: &ClusterSecret) -> Option<LeaderInfo> {
    let l = LeaderInfo::parse(kv)?;
    if l.url.is_empty() || l.verifies(secret) {
        return Some(l);
    }
    tracing::warn!(
        "the etcd leader key names {:?} at {} (epoch {}) without a valid signature of the \
         cluster secret: not followed (a coordinator with another secret, or a forged key)",
        l.name,
        l.url,
        l.epoch
    );
    None
}

async fn follow(etcd: Etcd, secret: ClusterSecret, tx: watch::Sender<Option<LeaderInfo>>) {
    let mut pause = Duration::from_millis(50);
    loop {
        let round = async {
            let kv = etcd.get(LEADER_KEY).await?;
            let from = match &kv {
                Some(kv) => kv.mod_revision + 1,
                None => 0,
            };
            tx.send_if_modified(|cur| {
                replace(cur, kv.as_ref().and_then(|kv| trusted(kv, &secret)))
            });
            let mut w = etcd.watch(LEADER_KEY, false, from).await?;
            while let Some(changes) = w.next().await {
                for c in changes {
                    let next = match &c {
                        Change::Put(kv) => trusted(kv, &secret),
                        Change::Delete(_) => None,
                    };
                    tx.send_if_modified(|cur| replace(cur, next));
                }
            }
            Ok::<_, ServiceError>(())
        };
        match round.await {
            Ok(()) => pause = Duration::from_millis(50),
            Err(e) => {
                tracing::debug!("following the leader key: {e}");
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(pause).await;
    }
}

fn replace(cur: &mut Option<LeaderInfo>, next: Option<LeaderInfo>) -> bool {
    if *cur == next {
        return false;
    }
    if let Some(l) = &next {
        tracing::info!(
            "coordinator leader: {} at {} (epoch {}, nonce {:016x})",
            l.name,
            if l.url.is_empty() { "-" } else { &l.url },
            l.epoch,
            l.nonce
        );
    }
    *cur = next;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(value: &[u8], create_revision: i64) -> crate::etcd::KeyValue {
        crate::etcd::KeyValue {
            key: LEADER_KEY.as_bytes().to_vec(),
            create_revision,
            value: value.to_vec(),
            ..Default::default()
        }
    }

    fn leader(url: &str, epoch: u64) -> LeaderInfo {
        LeaderInfo {
            name: "c1".into(),
            url: url.into(),
            nonce: 7,
            epoch,
            sig: String::new(),
        }
    }

    #[test]
    fn nodes_follow_only_a_leader_key_the_cluster_secret_signed_for_its_epoch() {
        let secret = ClusterSecret::random();
        let good = leader("http://10.0.0.1:7600", 42).signed(&secret);
        let value = serde_json::to_vec(&good).expect("json");
        assert_eq!(
            trusted(&kv(&value, 42), &secret).map(|l| l.url),
            Some(good.url.clone())
        );
        // the same value under a key created later (copied into a new leadership)
        assert_eq!(trusted(&kv(&value, 43), &secret), None);
        // another secret, or none at all
        assert_eq!(trusted(&kv(&value, 42), &ClusterSecret::random()), None);
        let forged = serde_json::to_vec(&leader("http://evil:1", 42)).expect("json");
        assert_eq!(trusted(&kv(&forged, 42), &secret), None);
        // a leader still rebuilding (no address) is named but not connected to
        let rebuilding = serde_json::to_vec(&leader("", 42)).expect("json");
        assert!(trusted(&kv(&rebuilding, 42), &secret).is_some());
        // a changed address breaks the signature
        let mut moved = good.clone();
        moved.url = "http://evil:1".into();
        let moved = serde_json::to_vec(&moved).expect("json");
        assert_eq!(trusted(&kv(&moved, 42), &secret), None);
    }

    #[test]
    fn a_node_record_verifies_only_as_signed() {
        let secret = ClusterSecret::random();
        let r = NodeRecord {
            node: 3,
            endpoint: "http://127.0.0.1:7703".into(),
            owns_from: 9,
            sig: String::new(),
        };
        assert!(!r.verifies(&secret), "unsigned");
        let signed = r.clone().signed(&secret);
        assert!(signed.verifies(&secret));
        let mut moved = signed.clone();
        moved.endpoint = "http://evil:1".into();
        assert!(!moved.verifies(&secret), "another endpoint");
        assert!(!signed.verifies(&ClusterSecret::random()), "another secret");
    }
}
