//! The cluster's subscription registry, kept by the coordinator: every subscription change
//! goes into an in-memory map at once, and a publisher turns the map into versioned,
//! checksummed data images, kept in memory (derived from the stored subscriptions). Objects
//! are matched against the newest *published*
//! version; workers load that version's image and hot-swap to newer ones.
//!
//! A change is in force once a version that holds it is published, and `Create`, `Update`
//! and `Delete` answer only then (read-your-writes: a put after the answer is matched with
//! the change). The publisher runs at once when idle; changes that come while it builds an
//! image wait for the next one together, so a flood of creates still writes one image per
//! build, not one per subscription.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use blocks::Dnf;
use runtime::{SHARD_IMAGE, cluster_shard_config};

pub use crate::protocol::Published;
use storage::Store;

use crate::kept::KeptSubscriptions;

use runtime::Limits;
use runtime::ServiceError;
use runtime::validate;

/// Image versions kept (in memory) for workers still loading older ones.
const KEEP_VERSIONS: usize = 4;

/// How long a change waits to be in force before its caller is told it is not yet.
const IN_FORCE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// One published image and its digest ([`blocks::Dnf::digest`] summed).
type KeptImage = (Arc<Vec<u8>>, u128);

/// The registry: current index, change counter, newest published version.
#[derive(Debug, Clone)]
pub struct Registry {
    store: Store,
    /// The subscriptions with their image bytes (a publication copies pointers).
    subs: Arc<Mutex<KeptSubscriptions>>,
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
    /// The newest images by version. They are derived data: the subscriptions are stored,
    /// and a start builds a new version from them; the store keeps only the newest version
    /// number (an empty marker), so versions never repeat across restarts.
    images: Arc<Mutex<BTreeMap<u64, KeptImage>>>,
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
            subs: Arc::new(Mutex::new(subs)),
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
        self.lock().upsert(id, dnf);
        self.changed();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptSubscriptions> {
        self.subs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A subscription was deleted.
    pub fn remove(&self, id: u64) {
        if self.lock().remove(id) {
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

    /// Builds a new image version if anything changed since the last one. Versions continue
    /// from the newest stored marker, so they never repeat across restarts.
    pub async fn publish(&self) -> Result<bool, ServiceError> {
        // the first publication after a start runs even with no change
        if self.published().version != 0 && !self.pending() {
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
        let snap = self.lock().snapshot();
        let (subscriptions, attributes, image, digest) = tokio::task::spawn_blocking(move || {
            let n = snap.bytes.len();
            let bloom = cluster_shard_config().bloom;
            let image = blocks::image::encode_shard_table(version, bloom, &snap.table, &snap.bytes);
            (n, snap.attributes, image, snap.digest)
        })
        .await
        .map_err(|e| ServiceError::Startup(format!("image build task: {e}")))?;
        let built = started.elapsed();
        let stored = async {
            store.put_image(SHARD_IMAGE, version, &[]).await?;
            store.prune_images(SHARD_IMAGE, version)?;
            Ok::<_, storage::StorageError>(())
        };
        if let Err(e) = stored.await {
            // still unpublished (`in_force` did not move): the next round tries again
            return Err(e.into());
        }
        let bytes = image.len();
        {
            let mut images = self.images.lock().unwrap_or_else(|p| p.into_inner());
            images.insert(version, (Arc::new(image), digest));
            while images.len() > KEEP_VERSIONS {
                images.pop_first();
            }
        }
        *self.published.write().unwrap_or_else(|p| p.into_inner()) = Published {
            version,
            subscriptions,
            attributes: Arc::new(attributes),
        };
        self.in_force.send_modify(|v| *v = (*v).max(holds));
        tracing::info!(
            "published shard image version {version} ({subscriptions} subscriptions, {} KiB) \
             in {} ms (built in {} ms)",
            bytes / 1024,
            started.elapsed().as_millis(),
            built.as_millis()
        );
        Ok(true)
    }

    /// One kept image version (0: the newest), and what its subscriptions are
    /// ([`blocks::Dnf::digest`] summed).
    pub fn image(&self, version: u64) -> Option<(u64, Arc<Vec<u8>>, u128)> {
        let images = self.images.lock().unwrap_or_else(|p| p.into_inner());
        if version == 0 {
            return images
                .last_key_value()
                .map(|(v, (i, d))| (*v, i.clone(), *d));
        }
        images.get(&version).map(|(i, d)| (version, i.clone(), *d))
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
