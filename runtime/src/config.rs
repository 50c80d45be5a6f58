//! Limits on what one request and one connection may carry, with defaults; every one is a
//! setting.

/// Per-request limits enforced before anything is stored, and the connection limits of the
/// listener serving them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest object payload, bytes.
    pub max_object_bytes: usize,
    /// Most metadata attributes per object.
    pub max_attributes: usize,
    /// Longest attribute name, bytes.
    pub max_name_bytes: usize,
    /// Longest string value, bytes.
    pub max_string_bytes: usize,
    /// Longest message id, bytes.
    pub max_message_id_bytes: usize,
    /// Longest external id, bytes.
    pub max_external_id_bytes: usize,
    /// Longest subscription filter, bytes.
    pub max_filter_bytes: usize,
    /// Requests per second one client connection may make (puts, announces, stream
    /// messages); above it requests get `ResourceExhausted`.
    pub max_requests_per_second_per_connection: u32,
    /// Whether subscriptions may target loopback, private and link-local addresses (refused at
    /// subscribe time otherwise, as delivery would refuse them).
    pub allow_private_targets: bool,
    /// Connection cap and timeouts of the listener.
    pub listen: crate::listen::ListenConfig,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_object_bytes: 16 << 20,
            max_attributes: 64,
            max_name_bytes: 128,
            max_string_bytes: 4096,
            max_message_id_bytes: 256,
            max_external_id_bytes: 1024,
            max_filter_bytes: 64 << 10,
            max_requests_per_second_per_connection: 50_000,
            allow_private_targets: false,
            listen: crate::listen::ListenConfig::default(),
        }
    }
}
