//! The services' errors and their one mapping to gRPC status codes, and back (a peer's status
//! passes through a node with its code).

use std::sync::atomic::{AtomicU64, Ordering};

use storage::StorageError;

/// Everything a request to a coordinator or a node can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Bad input: names the field and what is wrong with it.
    #[error("{field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("{0} not found")]
    NotFound(String),
    #[error(
        "this connection exceeds {0} requests per second; slow down or open another connection"
    )]
    RateLimited(u32),
    /// A tenant's quota (subscriptions, puts per second) is used up, or the disk a change
    /// needs is full (the message names it).
    #[error("{0}")]
    Quota(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("startup: {0}")]
    Startup(String),
    /// Another process of the cluster (coordinator, peer node) cannot be reached.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The request cannot be served in this node's state (the message says what to change).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Another process's answer, passed on with its code (a node relaying the coordinator).
    #[error("{message}")]
    Peer { code: tonic::Code, message: String },
}

impl ServiceError {
    /// Shorthand for an invalid field.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ServiceError {
        ServiceError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Longest message a status carries: it travels in a header, and a client cannot read a
/// multi-megabyte one (values are quoted short where they are named; this is the backstop).
pub const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

fn bounded(e: &ServiceError) -> String {
    let mut m = e.to_string();
    if m.len() > MAX_STATUS_MESSAGE_BYTES {
        let cut = m.floor_char_boundary(MAX_STATUS_MESSAGE_BYTES);
        m.truncate(cut);
        m.push_str("...");
    }
    m
}

/// A log line said at most once a second, with how many were left unsaid: a full disk
/// refuses every request that writes, and a line for each would be a node's busiest work.
struct Quiet {
    said_ms: AtomicU64,
    unsaid: AtomicU64,
}

impl Quiet {
    const fn new() -> Quiet {
        Quiet {
            said_ms: AtomicU64::new(0),
            unsaid: AtomicU64::new(0),
        }
    }

    /// `Some(lines left unsaid since the last)` when this one is to be said.
    fn say(&self) -> Option<u64> {
        let now = crate::now_ms();
        let said = self.said_ms.load(Ordering::Relaxed);
        if now >= said.saturating_add(1000)
            && self
                .said_ms
                .compare_exchange(said, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.unsaid.swap(0, Ordering::Relaxed));
        }
        self.unsaid.fetch_add(1, Ordering::Relaxed);
        None
    }
}

static DISK_FULL: Quiet = Quiet::new();
static STORAGE_FAILED: Quiet = Quiet::new();

fn also(unsaid: u64) -> String {
    if unsaid == 0 {
        String::new()
    } else {
        format!(" ({unsaid} more like it since the last one logged)")
    }
}

impl From<ServiceError> for tonic::Status {
    fn from(e: ServiceError) -> tonic::Status {
        let m = bounded(&e);
        match &e {
            ServiceError::InvalidArgument { .. } => tonic::Status::invalid_argument(m),
            ServiceError::NotFound(_) => tonic::Status::not_found(m),
            ServiceError::RateLimited(_) | ServiceError::Quota(_) => {
                tonic::Status::resource_exhausted(m)
            }
            // the disk is full: the caller's request was not stored, and asking again once
            // space is freed (or at another node) works
            ServiceError::Storage(s) if s.is_disk_full() => {
                // sled, once it failed on the full disk, refuses every operation with its
                // bare I/O error: said as a full disk too (`tests/disk.rs` saw "storage I/O:
                // ... No space left on device" for a subscription's Create)
                let m = if matches!(s, storage::StorageError::DiskFull { .. }) {
                    m
                } else {
                    format!("the disk is full ({m}): writes are refused until space is freed")
                };
                if let Some(unsaid) = DISK_FULL.say() {
                    tracing::warn!("refused: {m}{}", also(unsaid));
                }
                tonic::Status::resource_exhausted(m)
            }
            // another put of the same message id is being written: nothing failed, retry
            ServiceError::Storage(storage::StorageError::MessageIdInFlight { .. }) => {
                tonic::Status::unavailable(m)
            }
            ServiceError::Storage(_) => {
                if let Some(unsaid) = STORAGE_FAILED.say() {
                    tracing::error!("storage failure: {m}{}", also(unsaid));
                }
                tonic::Status::unavailable(m)
            }
            ServiceError::Startup(_) => tonic::Status::internal(m),
            ServiceError::Unavailable(_) => tonic::Status::unavailable(m),
            ServiceError::FailedPrecondition(_) => tonic::Status::failed_precondition(m),
            ServiceError::Peer { code, .. } => tonic::Status::new(*code, m),
        }
    }
}

impl From<tonic::Status> for ServiceError {
    /// A peer's status: unreachable peers are [`ServiceError::Unavailable`], every other
    /// answer keeps its code and message.
    fn from(s: tonic::Status) -> ServiceError {
        match s.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                ServiceError::Unavailable(s.message().to_string())
            }
            code => ServiceError::Peer {
                code,
                message: s.message().to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_there_and_back() {
        let e = ServiceError::invalid("filter", "no predicate");
        let s = tonic::Status::from(e);
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        let back = ServiceError::from(s);
        let again = tonic::Status::from(back);
        assert_eq!(again.code(), tonic::Code::InvalidArgument);
        assert_eq!(again.message(), "filter: no predicate");
        let gone = ServiceError::from(tonic::Status::unavailable("coordinator down"));
        assert!(matches!(gone, ServiceError::Unavailable(ref m) if m == "coordinator down"));
        let full = ServiceError::Storage(storage::StorageError::Log(
            std::io::Error::from_raw_os_error(28),
        ));
        let full = tonic::Status::from(full);
        assert_eq!(full.code(), tonic::Code::ResourceExhausted);
        assert!(full.message().contains("is full"), "{}", full.message());
        let busy = tonic::Status::from(ServiceError::Storage(
            storage::StorageError::MessageIdInFlight {
                message_id: "m-1".into(),
            },
        ));
        assert_eq!(busy.code(), tonic::Code::Unavailable);
        assert!(busy.message().contains("retry"), "{}", busy.message());
        let q = Quiet::new();
        assert_eq!(q.say(), Some(0));
        assert_eq!(q.say(), None);
        assert_eq!(q.say(), None);
        q.said_ms.store(0, Ordering::Relaxed);
        assert_eq!(q.say(), Some(2), "the lines left unsaid are counted");
        let long = ServiceError::NotFound("x".repeat(5000));
        assert!(tonic::Status::from(long).message().len() <= MAX_STATUS_MESSAGE_BYTES + 3);
    }
}
