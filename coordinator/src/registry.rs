//! The cluster's subscription registry, kept by the coordinator: every subscription change
//! goes into an in-memory map at once, and a publisher turns the map into a versioned,
//! checksummed data image in storage (debounced, so registering 10,000 subscriptions one by
//! one does not write 10,000 images). Objects are matched against the
//! newest *published* version; workers load that version's image and hot-swap to newer ones.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use blocks::Dnf;
use runtime::{SHARD_IMAGE, cluster_shard_config};

pub use crate::protocol::Published;
use storage::Store;
use tokio::sync::{Notify, watch};

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
    /// Changes so far (each one counts), and how many of them the newest publication holds.
    generation: Arc<AtomicU64>,
    in_force: Arc<watch::Sender<u64>>,
    /// Someone waits for a change to be in force: publish at once.
    urgent: Arc<Notify>,
}

/// The longest a subscription call waits for its change to be published.
const IN_FORCE_WAIT: Duration = Duration::from_secs(10);

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
            generation: Arc::new(AtomicU64::new(0)),
            in_force: Arc::new(watch::Sender::new(0)),
            urgent: Arc::new(Notify::new()),
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
        // every change counted so far was made to the map before it was counted: the copy
        // below holds them all
        let generation = self.generation.load(Ordering::Acquire);
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
        self.in_force.send_if_modified(|g| {
            let newer = generation > *g;
            if newer {
                *g = generation;
            }
            newer
        });
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

    /// Returns once every change made so far is in the newest published version, so every
    /// object stamped after it is matched against it. A waiter makes the publisher publish at
    /// once; changes made while an image is built wait for the next one, so a flood of
    /// concurrent changes still shares publications.
    pub async fn in_force(&self) -> Result<(), ServiceError> {
        let want = self.generation.load(Ordering::Acquire);
        let mut rx = self.in_force.subscribe();
        if *rx.borrow_and_update() >= want {
            return Ok(());
        }
        self.urgent.notify_one();
        match tokio::time::timeout(IN_FORCE_WAIT, rx.wait_for(|g| *g >= want)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(ServiceError::Unavailable(
                "the coordinator is shutting down".into(),
            )),
            Err(_) => Err(ServiceError::Unavailable(format!(
                "the change is stored but not in force yet: no image was published within {} s \
                 (it will be; see the coordinator's log)",
                IN_FORCE_WAIT.as_secs()
            ))),
        }
    }

    /// Publishes changes until the task is dropped: at once when a caller waits for its
    /// change ([`Registry::in_force`]), else once no change came for `quiet`, or at the latest
    /// `max_delay` after the first unpublished change (a bulk registration nobody waits for
    /// writes an image per `max_delay`, not one per subscription).
    pub async fn publisher(self, quiet: Duration, max_delay: Duration) {
        let mut tick = tokio::time::interval((quiet / 4).max(Duration::from_millis(5)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let urgent = tokio::select! {
                _ = tick.tick() => false,
                () = self.urgent.notified() => true,
            };
            let due = match *self.changes.lock().unwrap_or_else(|p| p.into_inner()) {
                Some((first, last)) => {
                    urgent || last.elapsed() >= quiet || first.elapsed() >= max_delay
                }
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
        self.generation.fetch_add(1, Ordering::AcqRel);
        let now = std::time::Instant::now();
        let mut c = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        *c = Some((c.map_or(now, |(first, _)| first), now));
    }
}
