//! The node's errors and their one mapping to gRPC status codes.

use storage::StorageError;

/// Everything a node request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Bad input: names the field and what is wrong with it.
    #[error("{field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("{0} not found")]
    NotFound(String),
    #[error(
        "this connection exceeds {0} requests per second; slow down or open another connection"
    )]
    RateLimited(u32),
    /// A tenant's quota (subscriptions, puts per second) is used up.
    #[error("{0}")]
    Quota(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("startup: {0}")]
    Startup(String),
    /// Another process of the cluster (coordinator, peer node) cannot be reached.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl NodeError {
    /// Shorthand for an invalid field.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> NodeError {
        NodeError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Longest message a status carries: it travels in a header, and a client cannot read a
/// multi-megabyte one (values are quoted short where they are named; this is the backstop).
pub const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

fn bounded(e: &NodeError) -> String {
    let mut m = e.to_string();
    if m.len() > MAX_STATUS_MESSAGE_BYTES {
        let cut = m.floor_char_boundary(MAX_STATUS_MESSAGE_BYTES);
        m.truncate(cut);
        m.push_str("...");
    }
    m
}

impl From<NodeError> for tonic::Status {
    fn from(e: NodeError) -> tonic::Status {
        let m = bounded(&e);
        match &e {
            NodeError::InvalidArgument { .. } => tonic::Status::invalid_argument(m),
            NodeError::NotFound(_) => tonic::Status::not_found(m),
            NodeError::RateLimited(_) | NodeError::Quota(_) => tonic::Status::resource_exhausted(m),
            NodeError::Storage(_) => {
                tracing::error!("storage failure: {m}");
                tonic::Status::unavailable(m)
            }
            NodeError::Startup(_) => tonic::Status::internal(m),
            NodeError::Unavailable(_) => tonic::Status::unavailable(m),
        }
    }
}
