//! The client's one error type: what the caller got wrong (naming the argument), a node that
//! cannot be reached, or a node's refusal with its gRPC code and message.

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An argument the client cannot use (`field` names it).
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    /// The node cannot be reached (connecting failed, or the connection broke).
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The node answered with an error (its code and message).
    #[error("{}", .0.message())]
    Refused(tonic::Status),
}

impl ClientError {
    pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> ClientError {
        ClientError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The gRPC code of a refusal (`Unavailable` when the node could not be reached,
    /// `InvalidArgument` for an argument the client refused itself).
    pub fn code(&self) -> tonic::Code {
        match self {
            ClientError::Invalid { .. } => tonic::Code::InvalidArgument,
            ClientError::Unreachable { .. } => tonic::Code::Unavailable,
            ClientError::Refused(s) => s.code(),
        }
    }
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> ClientError {
        ClientError::Refused(s)
    }
}
