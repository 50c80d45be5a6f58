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

impl From<NodeError> for tonic::Status {
    fn from(e: NodeError) -> tonic::Status {
        match &e {
            NodeError::InvalidArgument { .. } => tonic::Status::invalid_argument(e.to_string()),
            NodeError::NotFound(_) => tonic::Status::not_found(e.to_string()),
            NodeError::RateLimited(_) => tonic::Status::resource_exhausted(e.to_string()),
            NodeError::Storage(_) => {
                tracing::error!("storage failure: {e}");
                tonic::Status::unavailable(e.to_string())
            }
            NodeError::Startup(_) => tonic::Status::internal(e.to_string()),
            NodeError::Unavailable(_) => tonic::Status::unavailable(e.to_string()),
        }
    }
}
