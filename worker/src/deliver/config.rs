//! Delivery's settings and their defaults.

use super::*;

/// Settings of delivery.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// Push matches to subscribers. Off, matches are only recorded as pending delivery
    /// records (benchmarks of the matching pipeline, or another system drains the records).
    pub enabled: bool,
    /// Allow targets on loopback, private and link-local addresses (tests, private networks).
    pub allow_private_targets: bool,
    /// Calls in flight per endpoint (each carries up to `push_batch` deliveries).
    pub in_flight_per_endpoint: usize,
    /// One attempt (both phases of QoS 2) gives up after this long.
    pub attempt_timeout: Duration,
    /// Objects up to this size travel with the push; larger ones as metadata and id only.
    pub max_data_bytes: usize,
    /// Most deliveries in one call to an endpoint. Pushes that queue for one endpoint while
    /// all its calls are out go together in the next one: a webhook POST in CloudEvents'
    /// batched mode (`application/cloudevents-batch+json`; a lone event goes in structured
    /// mode), or one `Subscriber.DeliverBatch` for gRPC QoS 0/1. 1 sends every delivery on
    /// its own.
    pub push_batch: usize,
    /// Extra CAs (PEM) that HTTPS webhooks may be signed by, besides the bundled web roots.
    pub webhook_ca_pem: Option<Arc<Vec<u8>>>,
    /// Send events to a new webhook URL without first asking it to consent (the CloudEvents
    /// abuse-protection handshake), for receivers that cannot answer it.
    pub skip_webhook_validation: bool,
    /// Subscriptions with their own series in `/metrics` (those with the most failures);
    /// 0, the default, keeps the scrape's size independent of the subscriptions.
    pub metrics_top_subscriptions: usize,
}

impl Default for DeliveryConfig {
    fn default() -> DeliveryConfig {
        DeliveryConfig {
            enabled: true,
            allow_private_targets: false,
            in_flight_per_endpoint: 16,
            attempt_timeout: Duration::from_secs(5),
            max_data_bytes: 1 << 20,
            push_batch: 64,
            webhook_ca_pem: None,
            skip_webhook_validation: false,
            metrics_top_subscriptions: 0,
        }
    }
}

pub(super) const DEFAULT_MAX_ATTEMPTS: u32 = 10;

pub(super) const DEFAULT_TTL_MS: u64 = 24 * 3600 * 1000;

pub(super) const DEFAULT_INITIAL_BACKOFF_MS: u64 = 100;

pub(super) const DEFAULT_MAX_BACKOFF_MS: u64 = 60_000;

/// Subscriptions are looked up again after this long (updates reach delivery this fast).
pub(super) const SUB_CACHE: Duration = Duration::from_secs(5);

/// Objects kept in memory while their deliveries go out (one object goes to many
/// subscribers; stored objects never change).
pub(super) const OBJECT_CACHE: usize = 1024;
