//! The cluster's subscription registry, kept by the coordinator: every subscription change
//! goes into an in-memory map at once, and a publisher turns the map into a versioned,
//! checksummed data image in storage (debounced, so registering 10,000 subscriptions one by
//! one does not write 10,000 images). Objects are matched against the
//! newest *published* version; workers load that version's image and hot-swap to newer ones.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use blocks::Dnf;
use runtime::{SHARD_IMAGE, cluster_shard_config};

pub use crate::protocol::Published;
use storage::Store;

use runtime::Limits;
use runtime::ServiceError;
use runtime::validate;

/// Image versions kept in storage for workers still loading older ones.
const KEEP_VERSIONS: u64 = 8;

/// The registry: current index, dirty flag, newest published version.
#[derive(Debug, Clone)]
pub struct Registry {
    store: Store,
    subs: Arc<Mutex<BTreeMap<u64, Dnf>>>,
    dirty: Arc<AtomicBool>,
    /// First and last change since the last publication.
    changes: Arc<Mutex<Option<(std::time::Instant, std::time::Instant)>>>,
    published: Arc<RwLock<Published>>,
}

impl runtime::subscriptions::SubscriptionIndex for Registry {
    fn upsert(&self, id: u64, dnf: Dnf) {
        Registry::upsert(self, id, dnf)
    }

    fn remove(&self, id: u64) {
        Registry::remove(self, id)
    }
}

impl Registry {
    /// Loads every stored subscription and publishes a new version of the image.
    pub async fn load(store: Store, limits: &Limits) -> Result<Registry, ServiceError> {
        let subs: BTreeMap<u64, Dnf> = validate::stored_subscriptions(&store, limits)?
            .into_iter()
            .collect();
        let reg = Registry {
            store,
            subs: Arc::new(Mutex::new(subs)),
            dirty: Arc::new(AtomicBool::new(true)),
            changes: Arc::new(Mutex::new(None)),
            published: Arc::new(RwLock::new(Published::default())),
        };
        reg.publish().await?;
        Ok(reg)
    }

    /// A subscription was created or replaced.
    pub fn upsert(&self, id: u64, dnf: Dnf) {
        self.lock().insert(id, dnf);
        self.changed();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Dnf>> {
        self.subs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A subscription was deleted.
    pub fn remove(&self, id: u64) {
        if self.lock().remove(&id).is_some() {
            self.changed();
        }
    }

    /// The newest published version.
    pub fn published(&self) -> Published {
        self.published
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Writes a new image version if anything changed since the last one. Versions continue
    /// from the newest stored one, so they never repeat across restarts.
    pub async fn publish(&self) -> Result<bool, ServiceError> {
        if !self.dirty.load(Ordering::Acquire) {
            return Ok(false);
        }
        let store = self.store.clone();
        // the store is read only for the first publication after a start
        let version = match self.published().version {
            0 => store.latest_image(SHARD_IMAGE)?.map_or(0, |(v, _)| v),
            v => v,
        } + 1;
        self.dirty.store(false, Ordering::Release);
        let subs: Vec<(u64, Dnf)> = self.lock().iter().map(|(k, v)| (*k, v.clone())).collect();
        let (subscriptions, attributes, image) = tokio::task::spawn_blocking(move || {
            let attributes: HashSet<String> = subs
                .iter()
                .flat_map(|(_, d)| d.0.iter().flat_map(|c| c.0.iter().map(|p| p.attr.clone())))
                .collect();
            let n = subs.len();
            let image = blocks::image::encode_shard(&blocks::image::ShardImage {
                version,
                bloom: cluster_shard_config().bloom,
                subs,
            });
            (n, attributes, image)
        })
        .await
        .map_err(|e| ServiceError::Startup(format!("image build task: {e}")))?;
        let stored = async {
            store.put_image(SHARD_IMAGE, version, &image).await?;
            if version > KEEP_VERSIONS {
                store.prune_images(SHARD_IMAGE, version - KEEP_VERSIONS)?;
            }
            Ok::<_, storage::StorageError>(())
        };
        if let Err(e) = stored.await {
            // still unpublished: the next round tries again
            self.dirty.store(true, Ordering::Release);
            return Err(e.into());
        }
        *self.published.write().unwrap_or_else(|p| p.into_inner()) = Published {
            version,
            subscriptions,
            attributes: Arc::new(attributes),
        };
        tracing::info!("published shard image version {version} ({subscriptions} subscriptions)");
        Ok(true)
    }

    /// One stored image version (0: the newest).
    pub fn image(&self, version: u64) -> Result<Option<(u64, Vec<u8>)>, ServiceError> {
        if version == 0 {
            return Ok(self.store.latest_image(SHARD_IMAGE)?);
        }
        Ok(self
            .store
            .get_image(SHARD_IMAGE, version)?
            .map(|b| (version, b)))
    }

    /// Publishes changes until the task is dropped: once no change came for `quiet`, or
    /// at the latest `max_delay` after the first unpublished change (a bulk registration
    /// writes an image per `max_delay`, not one per subscription).
    pub async fn publisher(self, quiet: std::time::Duration, max_delay: std::time::Duration) {
        let mut tick = tokio::time::interval((quiet / 4).max(std::time::Duration::from_millis(5)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let due = match *self.changes.lock().unwrap_or_else(|p| p.into_inner()) {
                Some((first, last)) => last.elapsed() >= quiet || first.elapsed() >= max_delay,
                None => self.dirty.load(Ordering::Acquire),
            };
            if !due {
                continue;
            }
            *self.changes.lock().unwrap_or_else(|p| p.into_inner()) = None;
            if let Err(e) = self.publish().await {
                tracing::warn!("publishing the shard image: {e}");
            }
        }
    }

    fn changed(&self) {
        self.dirty.store(true, Ordering::Release);
        let now = std::time::Instant::now();
        let mut c = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        *c = Some((c.map_or(now, |(first, _)| first), now));
    }
}
