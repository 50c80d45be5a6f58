//! The cluster's subscription registry, kept by the coordinator: every subscription change
//! goes into an in-memory map at once, and a publisher turns the changes into versions
//! (`crate::images`: each version records what it changed; a full, checksummed image is
//! encoded in the background only now and then), kept in memory (derived from the stored
//! subscriptions). Objects are matched against the newest *published* version; workers load
//! the change from the version they hold and hot-swap to newer ones.
//!
//! A change is in force once a version that holds it is published, and `Create`, `Update`
//! and `Delete` answer only then (read-your-writes: a put after the answer is matched with
//! the change). The publisher runs at once when idle; changes that come while it publishes
//! wait for the next version together, so a flood of creates makes a version per
//! publication, not one per subscription.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use blocks::Dnf;
use runtime::{SHARD_IMAGE, cluster_shard_config};

pub use crate::protocol::Published;
use storage::Store;

use crate::images::{Change, Images, Served};
use crate::kept::KeptSubscriptions;

use runtime::Limits;
use runtime::ServiceError;
use runtime::validate;

/// How long a change waits to be in force before its caller is told it is not yet.
const IN_FORCE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The subscriptions and the changes not yet in a published version (under one lock, so a
/// publication takes exactly the changes its snapshot holds).
#[derive(Debug, Default)]
struct Live {
    kept: KeptSubscriptions,
    log: Vec<Change>,
}

/// The registry: current index, change counter, newest published version.
#[derive(Debug, Clone)]
pub struct Registry {
    store: Store,
    /// The subscriptions with their image bytes (a publication copies pointers), and the
    /// changes since the last publication.
    subs: Arc<Mutex<Live>>,
    /// Changes made so far (each counted after it is in `subs`).
    changes: Arc<AtomicU64>,
    /// The change count the newest published version holds.
    in_force: Arc<tokio::sync::watch::Sender<u64>>,
    /// Publications that failed on a full disk so far, and the last one's error (naming
    /// the disk): a change waiting to be in force is refused at the next one.
    disk_full: Arc<tokio::sync::watch::Sender<(u64, String)>>,
    /// Wakes the publisher (a permit is kept when it is busy).
    wake: Arc<tokio::sync::Notify>,
    published: Arc<RwLock<Published>>,
    /// The published versions' changes and the full images. They are derived data: the
    /// subscriptions are stored, and a start builds a new version from them; the store keeps
    /// only the newest version number (an empty marker), so versions never repeat across
    /// restarts.
    images: Arc<Mutex<Images>>,
    /// Versions start above this (an elected leader's epoch, shifted: no two leaders
    /// publish one version number).
    floor: u64,
}

#[tonic::async_trait]
impl runtime::subscriptions::SubscriptionIndex for Registry {
    fn upsert(&self, id: u64, dnf: Dnf) {
        Registry::upsert(self, id, dnf)
    }

    fn remove(&self, id: u64) {
        Registry::remove(self, id)
    }

    async fn in_force(&self) -> Result<(), ServiceError> {
        Registry::in_force(self).await
    }
}

impl Registry {
    /// Loads every stored subscription and publishes a new version of the image, numbered
    /// above `floor` and above every version stored before.
    pub async fn load(store: Store, limits: &Limits, floor: u64) -> Result<Registry, ServiceError> {
        Registry::load_preloaded(store, limits, floor, None).await
    }

    /// [`Registry::load`], from the parsed registry a standby kept in step with `store`
    /// (`crate::tail`) when there is one: a new leader at a million subscriptions does not
    /// parse them all again.
    pub async fn load_preloaded(
        store: Store,
        limits: &Limits,
        floor: u64,
        preloaded: Option<crate::tail::Preloaded>,
    ) -> Result<Registry, ServiceError> {
        let subs = match preloaded {
            Some(p) => p.0,
            None => {
                let mut subs = KeptSubscriptions::default();
                for (id, d) in validate::stored_subscriptions(&store, limits)? {
                    subs.upsert(id, d);
                }
                subs
            }
        };
        let reg = Registry {
            store,
            subs: Arc::new(Mutex::new(Live {
                kept: subs,
                log: Vec::new(),
            })),
            changes: Arc::new(AtomicU64::new(0)),
            in_force: Arc::new(tokio::sync::watch::Sender::new(0)),
            disk_full: Arc::new(tokio::sync::watch::Sender::new((0, String::new()))),
            wake: Arc::new(tokio::sync::Notify::new()),
            published: Arc::new(RwLock::new(Published::default())),
            images: Arc::default(),
            floor,
        };
        reg.publish().await?;
        Ok(reg)
    }

    /// A subscription was created or replaced.
    pub fn upsert(&self, id: u64, dnf: Dnf) {
        {
            let mut g = self.lock();
            g.kept.upsert(id, dnf.clone());
            g.log.push((id, Some(dnf)));
        }
        self.changed();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Live> {
        self.subs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn images(&self) -> std::sync::MutexGuard<'_, Images> {
        self.images.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A subscription was deleted.
    pub fn remove(&self, id: u64) {
        let removed = {
            let mut g = self.lock();
            let removed = g.kept.remove(id);
            if removed {
                g.log.push((id, None));
            }
            removed
        };
        if removed {
            self.changed();
        }
    }

    /// Waits until every change made before the call is in a published version; a
    /// publication that keeps failing makes it `Unavailable` after [`IN_FORCE_WAIT`] (the
    /// change is stored and takes effect once a publication succeeds), and one that fails
    /// on a full disk `RESOURCE_EXHAUSTED` at once, naming the disk (before, a Create on a
    /// full disk hung past its caller's deadline).
    pub async fn in_force(&self) -> Result<(), ServiceError> {
        let want = self.changes.load(Ordering::SeqCst);
        let mut rx = self.in_force.subscribe();
        let mut full = self.disk_full.subscribe();
        let seen = full.borrow().0;
        let refused = async {
            let why = full.wait_for(|(n, _)| *n > seen).await.map(|f| f.1.clone());
            match why {
                Ok(why) => why,
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            r = tokio::time::timeout(IN_FORCE_WAIT, rx.wait_for(|&v| v >= want)) => match r {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(_)) | Err(_) => Err(ServiceError::Unavailable(
                    "the change is stored but no image holding it could be published yet".into(),
                )),
            },
            why = refused => Err(ServiceError::Quota(format!(
                "the change is stored, but no image holding it can be published: {why}"
            ))),
        }
    }

    /// The newest published version.
    pub fn published(&self) -> Published {
        self.published
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Publishes a new version if anything changed since the last one: it records the
    /// changes (a full image is encoded only at the first publication, then in the
    /// background when enough changed). Versions continue from the newest stored marker,
    /// so they never repeat across restarts.
    pub async fn publish(&self) -> Result<bool, ServiceError> {
        // the first publication after a start runs even with no change
        let first = self.published().version == 0;
        if !first && !self.pending() {
            return Ok(false);
        }
        let started = std::time::Instant::now();
        let store = self.store.clone();
        // the store is read only for the first publication after a start
        let version = match self.published().version {
            0 => store
                .latest_image(SHARD_IMAGE)?
                .map_or(0, |(v, _)| v)
                .max(self.floor),
            v => v,
        } + 1;
        // every change counted here is in the map read below (it is counted after it is in)
        let holds = self.changes.load(Ordering::SeqCst);
        let (changes, snap, subscriptions, attributes, digest) = {
            let mut g = self.lock();
            let snap = self
                .images()
                .wants_full(g.kept.len())
                .then(|| g.kept.snapshot());
            (
                std::mem::take(&mut g.log),
                snap,
                g.kept.len(),
                g.kept.attributes(),
                g.kept.digest(),
            )
        };
        let stored = async {
            store.put_image(SHARD_IMAGE, version, &[]).await?;
            store.prune_images(SHARD_IMAGE, version)?;
            Ok::<_, storage::StorageError>(())
        };
        if let Err(e) = stored.await {
            // still unpublished (`in_force` did not move): the changes go into the next round
            let mut g = self.lock();
            let later = std::mem::replace(&mut g.log, changes);
            g.log.extend(later);
            return Err(e.into());
        }
        let n_changes = changes.len();
        self.images()
            .published(version, digest, changes, subscriptions);
        if let Some(snap) = snap {
            self.images().encoding(version);
            let encode = move || {
                let bloom = cluster_shard_config().bloom;
                blocks::image::encode_shard_table(version, bloom, &snap.table, &snap.bytes)
            };
            if first {
                // nothing to serve a node from before it
                match tokio::task::spawn_blocking(encode).await {
                    Ok(image) => self.images().encoded(version, image),
                    Err(e) => {
                        self.images().not_encoded(version);
                        return Err(ServiceError::Startup(format!("image build task: {e}")));
                    }
                }
            } else {
                let me = self.clone();
                tokio::spawn(async move {
                    let t = std::time::Instant::now();
                    match tokio::task::spawn_blocking(encode).await {
                        Ok(image) => {
                            tracing::info!(
                                "full shard image of version {version} ({} KiB) encoded in {} ms",
                                image.len() / 1024,
                                t.elapsed().as_millis()
                            );
                            let mut images = me.images();
                            images.encoded(version, image);
                            images.rest_after(t.elapsed());
                        }
                        Err(e) => {
                            tracing::warn!("encoding the full image of version {version}: {e}");
                            me.images().not_encoded(version);
                        }
                    }
                });
            }
        }
        *self.published.write().unwrap_or_else(|p| p.into_inner()) = Published {
            version,
            subscriptions,
            attributes: Arc::new(attributes),
        };
        self.in_force.send_modify(|v| *v = (*v).max(holds));
        tracing::debug!(
            "published shard version {version} ({subscriptions} subscriptions, {n_changes} \
             changes) in {} us",
            started.elapsed().as_micros()
        );
        Ok(true)
    }

    /// The newest published version.
    pub fn newest_version(&self) -> u64 {
        self.images().newest().map_or(0, |(v, _)| v)
    }

    /// What a node needs for `version` when it holds `have_version` (0: none) and compiled
    /// the subscriptions of `have_digest`; `None` when `version` is not kept.
    pub(crate) fn serve(
        &self,
        version: u64,
        have_version: u64,
        have_digest: Option<u128>,
    ) -> Option<Served> {
        let images = self.images();
        let version = match version {
            0 => images.newest()?.0,
            v => v,
        };
        images.serve(version, have_version, have_digest)
    }

    /// Publishes changes until the task is dropped: at once when a change comes while it
    /// is idle; the changes that come during a publication go into the next one together.
    /// A failed publication is tried again after a pause.
    pub async fn publisher(self) {
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            if !self.pending() {
                self.wake.notified().await;
            }
            match self.publish().await {
                Ok(_) => pause = std::time::Duration::from_millis(50),
                Err(e) => {
                    tracing::warn!("publishing the shard image: {e}");
                    if matches!(&e, ServiceError::Storage(s) if s.is_disk_full()) {
                        let why = e.to_string();
                        self.disk_full.send_modify(|(n, m)| {
                            *n += 1;
                            *m = why;
                        });
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(2));
                }
            }
        }
    }

    /// Whether a change is not in a published version yet.
    fn pending(&self) -> bool {
        self.changes.load(Ordering::SeqCst) > *self.in_force.borrow()
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.wake.notify_one();
    }
}
