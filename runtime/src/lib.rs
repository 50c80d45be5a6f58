//! What the coordinator and the node share, so that neither role's crate depends on the
//! other's and the binary wires them together from above: the service error with its one
//! mapping to `tonic::Status` and back (`error`), limits (`config`) and proto-to-domain
//! validation (`validate`), the guarded listener (`listen`) and the server assembly written
//! once (`serve`), callers and tenants (`auth`), the cluster secret of internal calls
//! (`cluster_secret`), TLS settings (`tls`), per-connection rates (`rate`), the outbound
//! address rule (`target_guard`), the Prometheus endpoint (`metrics`), the public
//! `Subscriptions` service over a subscription index (`subscriptions`) and the links between
//! the roles (`link`), the xS-grid of quorum replication (`grid`), and coordinator election
//! on etcd (`etcd`, a small client; `election`).

pub mod auth;
pub mod cluster_secret;
pub mod config;
pub mod console;
pub mod election;
pub mod error;
pub mod etcd;
pub mod grid;
pub mod histogram;
pub mod http_serve;
pub mod link;
pub mod listen;
pub mod metrics;
pub mod rate;
pub mod rng;
pub mod serve;
pub mod subscriptions;
pub mod target_guard;
pub mod test_pattern;
pub mod tls;
pub mod validate;

use std::net::SocketAddr;
use std::time::Duration;

use blocks::ShardConfig;
use tokio::net::TcpListener;
use tonic::transport::{Channel, Endpoint};

pub use config::Limits;
pub use error::ServiceError;

/// The public services a node serves (and server reflection describes).
pub const PUBLIC_SERVICES: &[&str] = &[
    "dissem.v1.Ingest",
    "dissem.v1.Federation",
    "dissem.v1.Objects",
    "dissem.v1.Subscriptions",
    "dissem.v1.Admin",
];
/// The stream-subscriber service (a node with delivery serves it).
pub const STREAM_SERVICE: &str = "dissem.v1.Stream";
/// The public services of the coordinator.
pub const COORDINATOR_SERVICES: &[&str] = &["dissem.v1.Subscriptions", "dissem.v1.Admin"];

/// The highest priority an object has: an urgent one, which the coordinator schedules and
/// a node matches and pushes ahead of the rest (on the node's own threads at normal OS
/// priority while a backlog runs on the bulk lane).
pub const URGENT_PRIORITY: u8 = 7;

/// The name images of the (single) subscription shard are stored under.
pub const SHARD_IMAGE: &str = "shard";

/// The settings every worker compiles a shard image with (and the registry publishes for):
/// Bloom tables for the subset scan, exact predicate ids for the test blocks and verification.
pub fn cluster_shard_config() -> ShardConfig {
    ShardConfig {
        bloom_tables: true,
        test_ids: true,
        ..ShardConfig::default()
    }
}

/// Wall-clock time in unix milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Now, in unix microseconds (0 before the epoch).
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Locks a mutex, carrying on past a poisoned one (its data stays consistent here: every
/// critical section is a plain update).
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A random 64-bit value (std's randomly keyed hasher; no extra dependency).
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// A lazily connected channel to another process of the cluster (TLS for `https://`, with
/// the process's client settings of [`crate::tls`]).
pub fn channel(url: &str) -> Result<Channel, ServiceError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| ServiceError::invalid("endpoint", format!("{url:?}: {e}")))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .tcp_nodelay(true);
    Ok(tls::apply(endpoint, url)?.connect_lazy())
}

/// The largest request the public API accepts under `limits`.
pub fn max_message(limits: &Limits) -> usize {
    limits.max_object_bytes + 64 * 1024 + limits.max_attributes * (limits.max_string_bytes + 256)
}

/// Binds `addr` (port 0 picks a free one) and returns the listener and its address.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServiceError> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| ServiceError::Startup(format!("binding {addr}: {e}")))?;
    let a = l
        .local_addr()
        .map_err(|e| ServiceError::Startup(e.to_string()))?;
    Ok((l, a))
}
