//! Real etcd and elected clusters on loopback, for the failover benchmark and tests: an
//! `etcd` process (Debian's `etcd-server`) on free ports with its own data directory, that
//! can be killed and restarted on the same ports and data; and a cluster of several
//! `dissem coordinator --etcd` processes (one leads, the others stand by) and `dissem node
//! --etcd` processes in a one-row grid.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use runtime::election::LeaderInfo;
use runtime::etcd::Etcd;

use crate::procs::{Proc, try_wait_for};

/// Whether an `etcd` binary is on the PATH.
pub fn etcd_available() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One etcd member.
#[derive(Debug)]
pub struct EtcdProc {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    /// Its client URL.
    pub url: String,
    /// TLS with client certificates (and user auth once turned on), when secured.
    pub trust: Option<crate::etcdtrust::EtcdTrust>,
}

impl EtcdProc {
    /// Starts etcd with its data in `dir` on two free ports and waits until it answers.
    pub async fn start(dir: &Path) -> anyhow::Result<EtcdProc> {
        Self::start_with(dir, None).await
    }

    /// The same, serving only TLS and demanding client certificates when `trust` is given.
    pub async fn start_with(
        dir: &Path,
        trust: Option<crate::etcdtrust::EtcdTrust>,
    ) -> anyhow::Result<EtcdProc> {
        let scheme = if trust.is_some() { "https" } else { "http" };
        let mut e = EtcdProc {
            child: None,
            dir: dir.to_path_buf(),
            client_port: 0,
            peer_port: 0,
            url: String::new(),
            trust,
        };
        // a free port can be taken by another process before etcd binds it (the full
        // suite once lost a test so): etcd then exits at once, and new ports are tried
        let mut tries = 0;
        loop {
            tries += 1;
            e.client_port = free_port()?;
            e.peer_port = free_port()?;
            e.url = format!("{scheme}://127.0.0.1:{}", e.client_port);
            match e.spawn().await {
                Ok(()) => return Ok(e),
                Err(err) if tries < 3 && e.lost_a_port() => {
                    eprintln!("{err:#}; trying other ports");
                    e.kill();
                    let _ = std::fs::remove_dir_all(&e.dir);
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Whether etcd's log says a port was taken before it bound it.
    fn lost_a_port(&self) -> bool {
        std::fs::read_to_string(self.dir.with_extension("log"))
            .is_ok_and(|l| l.contains("address already in use"))
    }

    /// A client of it under `prefix`, secured as it is.
    pub fn client(&self, prefix: &str) -> anyhow::Result<Etcd> {
        Ok(match &self.trust {
            Some(t) => Etcd::connect_with(&self.url, prefix, &t.security()?)?,
            None => Etcd::connect(&self.url, prefix)?,
        })
    }

    /// Turns user auth on (a secured etcd only): see [`crate::etcdtrust`].
    pub async fn enable_auth(&mut self, prefix: &str) -> anyhow::Result<()> {
        let url = self.url.clone();
        let t = self.trust.as_mut().context("auth needs a secured etcd")?;
        t.enable_auth(&url, prefix).await
    }

    /// The flags a coordinator or node needs to reach it (none when not secured).
    pub fn flags(&self) -> Vec<String> {
        self.trust.as_ref().map(|t| t.flags()).unwrap_or_default()
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.with_extension("log"))?;
        let tls = self
            .trust
            .as_ref()
            .map(|t| t.etcd_flags())
            .unwrap_or_default();
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--name", "dissem-test"])
            .args(["--listen-client-urls", &self.url])
            .args(["--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("dissem-test={peer}")])
            .args(&tls)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting etcd (Debian's etcd-server package)")?;
        self.child = Some(child);
        // under auth, the probe's key is outside what the `dissem` user may read: logging
        // in is the probe then
        let auth = self.trust.as_ref().is_some_and(|t| t.auth);
        let client = self.client("/probe/")?;
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut up = false;
        while Instant::now() < deadline {
            up = if auth {
                client.login().await.is_ok()
            } else {
                client.get("x").await.is_ok()
            };
            if up {
                break;
            }
            // gone already (a port taken, a bad flag): no use waiting out the deadline
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                bail!(
                    "etcd at {} exited ({status}) (log: {})",
                    self.url,
                    self.dir.with_extension("log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !up {
            bail!(
                "etcd at {} did not answer within 15 s (log: {})",
                self.url,
                self.dir.with_extension("log").display()
            );
        }
        Ok(())
    }

    /// SIGKILL, and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data (after [`EtcdProc::kill`]).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn().await
    }
}

impl Drop for EtcdProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// etcd, coordinators campaigning through it, and nodes following the leader.
#[derive(Debug)]
pub struct ElectedCluster {
    /// Coordinator `k` is named `c<k>`.
    pub coordinators: Vec<Proc>,
    pub nodes: Vec<Proc>,
    pub client: Etcd,
    /// Last: dropped (killed) after the processes that use it.
    pub etcd: EtcdProc,
    pub dir: PathBuf,
    bin: PathBuf,
    lease_ttl: u64,
    /// The grid: rows, columns.
    grid: (u32, u32),
    /// What every node is started with besides its own flags.
    node_args: Vec<String>,
}

fn s(x: &str) -> String {
    x.to_string()
}

impl ElectedCluster {
    /// Starts etcd, `coordinators` coordinators (the first leads once it wins) and `nodes`
    /// nodes in a `1 x nodes` grid, each with `node_args` added, and waits until every
    /// node is registered with the leader.
    pub async fn start(
        bin: &Path,
        dir: &Path,
        coordinators: usize,
        nodes: u32,
        lease_ttl: u64,
        node_args: &[String],
    ) -> anyhow::Result<ElectedCluster> {
        Self::start_grid(bin, dir, coordinators, (1, nodes), lease_ttl, node_args).await
    }

    /// [`ElectedCluster::start`] with a grid of `rows x cols` nodes.
    pub async fn start_grid(
        bin: &Path,
        dir: &Path,
        coordinators: usize,
        (rows, cols): (u32, u32),
        lease_ttl: u64,
        node_args: &[String],
    ) -> anyhow::Result<ElectedCluster> {
        let etcd = EtcdProc::start(&dir.join("etcd")).await?;
        Self::start_on(
            bin,
            dir,
            etcd,
            coordinators,
            (rows, cols),
            lease_ttl,
            node_args,
        )
        .await
    }

    /// [`ElectedCluster::start_grid`] on an etcd already started (a secured one: every
    /// process gets its flags).
    pub async fn start_on(
        bin: &Path,
        dir: &Path,
        etcd: EtcdProc,
        coordinators: usize,
        (rows, cols): (u32, u32),
        lease_ttl: u64,
        node_args: &[String],
    ) -> anyhow::Result<ElectedCluster> {
        let nodes = rows * cols;
        let client = etcd.client("/dissem/")?;
        client.login().await?;
        let mut c = ElectedCluster {
            client,
            etcd,
            coordinators: Vec::new(),
            nodes: Vec::new(),
            dir: dir.to_path_buf(),
            bin: bin.to_path_buf(),
            lease_ttl,
            grid: (rows, cols),
            node_args: node_args.to_vec(),
        };
        std::fs::create_dir_all(dir)?;
        runtime::cluster_secret::ClusterSecret::load_or_create(&c.secret_file())?;
        for k in 0..coordinators {
            let p = c.start_coordinator(k);
            c.coordinators.push(p);
            if k == 0 {
                c.wait_leader(Duration::from_secs(15)).await?;
            }
        }
        for id in 0..nodes {
            let p = c.start_node(id);
            c.nodes.push(p);
        }
        let leader = c.wait_leader(Duration::from_secs(15)).await?;
        let want = nodes;
        let ok = try_wait_for(Duration::from_secs(20), || {
            let url = leader.url.clone();
            async move {
                let s = crate::procs::stats(&url).await.ok()?;
                (s.cluster?.nodes >= want).then_some(())
            }
        })
        .await;
        if ok.is_none() {
            bail!("the {want} nodes did not all register with the leader within 20 s");
        }
        Ok(c)
    }

    /// Starts a node at position `id` (on `node<id>` in the cluster's directory), following
    /// the leader through etcd.
    pub fn start_node(&self, id: u32) -> Proc {
        let mut args = vec![
            s("node"),
            s("--listen"),
            s("127.0.0.1:0"),
            s("--data"),
            self.dir.join(format!("node{id}")).display().to_string(),
            s("--node"),
            id.to_string(),
            s("--etcd"),
            self.etcd.url.clone(),
            s("--cluster-secret-file"),
            self.secret_file().display().to_string(),
        ];
        args.extend(self.etcd.flags());
        args.extend(self.node_args.iter().cloned());
        Proc::start(&self.bin, &args)
    }

    fn secret_file(&self) -> PathBuf {
        self.dir.join("cluster.secret")
    }

    /// Starts coordinator `k` (a standby until it wins).
    pub fn start_coordinator(&self, k: usize) -> Proc {
        let mut args = vec![
            s("coordinator"),
            s("--listen"),
            s("127.0.0.1:0"),
            s("--data"),
            self.dir
                .join(format!("coordinator{k}"))
                .display()
                .to_string(),
            s("--etcd"),
            self.etcd.url.clone(),
            s("--name"),
            format!("c{k}"),
            s("--grid"),
            format!("{}x{}", self.grid.0, self.grid.1),
            s("--lease-ttl"),
            self.lease_ttl.to_string(),
            s("--allow-private-targets"),
            s("--cluster-secret-file"),
            self.secret_file().display().to_string(),
        ];
        args.extend(self.etcd.flags());
        Proc::start(&self.bin, &args)
    }

    /// The leader the key names now, if it serves.
    pub async fn leader(&self) -> Option<LeaderInfo> {
        let kv = self
            .client
            .get(runtime::election::LEADER_KEY)
            .await
            .ok()??;
        let mut l: LeaderInfo = serde_json::from_slice(&kv.value).ok()?;
        l.epoch = kv.create_revision as u64;
        (!l.url.is_empty()).then_some(l)
    }

    /// Waits up to `limit` for a leader that serves.
    pub async fn wait_leader(&self, limit: Duration) -> anyhow::Result<LeaderInfo> {
        match try_wait_for(limit, || self.leader()).await {
            Some(l) => Ok(l),
            None => bail!("no coordinator leads within {limit:?}"),
        }
    }

    /// Waits up to `limit` for a serving leader of another epoch than `epoch`.
    pub async fn wait_new_leader(&self, epoch: u64, limit: Duration) -> anyhow::Result<LeaderInfo> {
        let started = Instant::now();
        match try_wait_for(limit, || async {
            self.leader().await.filter(|l| l.epoch != epoch)
        })
        .await
        {
            Some(l) => Ok(l),
            None => bail!(
                "no new leader after epoch {epoch} within {:?}",
                started.elapsed()
            ),
        }
    }

    /// SIGKILLs the leading coordinator, waits (up to 20 s) for the next leader, and starts
    /// the killed one again as a standby.
    pub async fn kill_leader(&mut self) -> anyhow::Result<LeaderInfo> {
        let l = self.wait_leader(Duration::from_secs(20)).await?;
        let k = Self::index_of(&l.name)
            .filter(|&k| k < self.coordinators.len())
            .with_context(|| format!("the leader {:?} is none of ours", l.name))?;
        self.coordinators[k].kill();
        let new = self
            .wait_new_leader(l.epoch, Duration::from_secs(20))
            .await?;
        self.coordinators[k] = self.start_coordinator(k);
        Ok(new)
    }

    /// The index of the coordinator named `name` (`c<k>`).
    pub fn index_of(name: &str) -> Option<usize> {
        name.strip_prefix('c')?.parse().ok()
    }
}
