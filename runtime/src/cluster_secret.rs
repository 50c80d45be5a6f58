//! The cluster secret: how the internal services (`Cluster` on the coordinator, `Daemon` on
//! each node) know a caller is a member of the cluster. Every internal call carries the
//! secret in the `x-dissem-cluster-secret` header; the servers of those services check it
//! (compared as SHA-256 digests, in constant time) and answer `UNAUTHENTICATED` without it, so
//! an outside client that knows a node's address gets nothing from them, webhook secrets
//! included.
//!
//! The coordinator keeps the secret in a file (created with a random secret, mode 0600, the
//! first time); nodes are given the same file.

use std::path::Path;
use std::sync::Arc;

use hmac::Mac;
use sha2::{Digest, Sha256};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::error::ServiceError;

/// The metadata key internal calls carry the secret in.
pub const HEADER: &str = "x-dissem-cluster-secret";

/// Shortest secret accepted from a file, in bytes.
const MIN_SECRET_BYTES: usize = 16;

/// The cluster's shared secret (never printed: `Debug` shows only that it is set).
#[derive(Clone)]
pub struct ClusterSecret {
    value: MetadataValue<tonic::metadata::Ascii>,
    digest: Arc<[u8; 32]>,
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl Default for ClusterSecret {
    /// A fresh random secret nobody else knows (an embedded cluster has no members to share
    /// it with).
    fn default() -> ClusterSecret {
        ClusterSecret::random()
    }
}

fn digest(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// 32 random bytes as hex (the kernel's generator; std's randomly keyed hasher if it fails).
pub(crate) fn random_hex() -> String {
    use std::io::Read;
    let mut b = [0u8; 32];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok();
    if !ok {
        for (i, chunk) in b.chunks_mut(8).enumerate() {
            let r = crate::random_u64() ^ (i as u64).rotate_left(17);
            chunk.copy_from_slice(&r.to_le_bytes());
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes from lowercase or uppercase hex (at most 64 bytes); `None` if it is not hex.
fn from_hex(h: &str) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) || h.len() > 128 {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

impl ClusterSecret {
    /// A secret from its text (printable ASCII, at least 16 bytes).
    pub fn new(text: &str) -> Result<ClusterSecret, ServiceError> {
        let text = text.trim();
        if text.len() < MIN_SECRET_BYTES {
            return Err(ServiceError::invalid(
                "cluster secret",
                format!("must be at least {MIN_SECRET_BYTES} bytes"),
            ));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ServiceError::invalid(
                "cluster secret",
                "must be printable ASCII without spaces",
            ));
        }
        let value = MetadataValue::try_from(text)
            .map_err(|e| ServiceError::invalid("cluster secret", e.to_string()))?;
        Ok(ClusterSecret {
            value,
            digest: Arc::new(digest(text.as_bytes())),
        })
    }

    /// The HMAC-SHA256 of `msg` under the secret, as hex: what a member signs for the
    /// others (the leader key in etcd), so a store outside the cluster's trust cannot
    /// forge it.
    pub fn sign(&self, msg: &[u8]) -> String {
        self.mac(msg).map_or_else(String::new, |m| {
            m.finalize()
                .into_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
    }

    /// Whether `sig_hex` is [`ClusterSecret::sign`] of `msg` (compared in constant time).
    pub fn verify(&self, msg: &[u8], sig_hex: &str) -> bool {
        let Some(sig) = from_hex(sig_hex) else {
            return false;
        };
        self.mac(msg).is_some_and(|m| m.verify_slice(&sig).is_ok())
    }

    /// The MAC of `msg` (HMAC accepts keys of every length: `None` does not happen).
    fn mac(&self, msg: &[u8]) -> Option<hmac::Hmac<Sha256>> {
        let mut m = <hmac::Hmac<Sha256> as Mac>::new_from_slice(self.value.as_bytes()).ok()?;
        m.update(msg);
        Some(m)
    }

    /// A fresh random secret.
    pub fn random() -> ClusterSecret {
        let hex = random_hex();
        let value = MetadataValue::try_from(hex.as_str()).unwrap_or_else(|_| {
            // hex digits are always valid metadata
            MetadataValue::from_static("0000000000000000")
        });
        ClusterSecret {
            value,
            digest: Arc::new(digest(hex.as_bytes())),
        }
    }

    /// Reads the secret from `path`.
    pub fn load(path: &Path) -> Result<ClusterSecret, ServiceError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ServiceError::Startup(format!(
                "reading the cluster secret {}: {e}",
                path.display()
            ))
        })?;
        ClusterSecret::new(&text).map_err(|e| {
            ServiceError::Startup(format!("the cluster secret in {}: {e}", path.display()))
        })
    }

    /// Reads the secret from `path`, first writing a random one there (mode 0600) if the file
    /// does not exist.
    pub fn load_or_create(path: &Path) -> Result<ClusterSecret, ServiceError> {
        if !path.exists() {
            use std::io::Write;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            match opts.open(path) {
                Ok(mut f) => {
                    f.write_all(format!("{}\n", random_hex()).as_bytes())
                        .and_then(|()| f.sync_all())
                        .map_err(|e| {
                            ServiceError::Startup(format!("writing {}: {e}", path.display()))
                        })?;
                }
                // another process created it first: read theirs
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(ServiceError::Startup(format!(
                        "creating the cluster secret {}: {e}",
                        path.display()
                    )));
                }
            }
        }
        ClusterSecret::load(path)
    }

    /// Whether `presented` is this secret.
    fn matches(&self, presented: &[u8]) -> bool {
        let d = digest(presented);
        d.iter()
            .zip(self.digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// Whether `metadata` carries this secret (a call from a member of the cluster).
    pub fn presented_in(&self, metadata: &tonic::metadata::MetadataMap) -> bool {
        metadata
            .get(HEADER)
            .is_some_and(|v| self.matches(v.as_bytes()))
    }

    /// The interceptor that internal clients add (stamps every call with the secret).
    pub fn stamp(&self) -> Stamp {
        Stamp {
            value: self.value.clone(),
        }
    }

    /// The interceptor that internal servers check (refuses calls without the secret).
    pub fn check(&self) -> Check {
        Check {
            secret: self.clone(),
        }
    }
}

/// Adds the cluster secret to outgoing internal calls.
#[derive(Clone)]
pub struct Stamp {
    value: MetadataValue<tonic::metadata::Ascii>,
}

impl std::fmt::Debug for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stamp(..)")
    }
}

impl Interceptor for Stamp {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(HEADER, self.value.clone());
        Ok(req)
    }
}

/// Refuses internal calls that do not carry the cluster secret.
#[derive(Clone, Debug)]
pub struct Check {
    secret: ClusterSecret,
}

impl Interceptor for Check {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        match req.metadata().get(HEADER) {
            Some(v) if self.secret.matches(v.as_bytes()) => Ok(req),
            Some(_) => Err(Status::unauthenticated(
                "internal service: the cluster secret is wrong",
            )),
            None => Err(Status::unauthenticated(
                "internal service: only members of the cluster may call it",
            )),
        }
    }
}

/// A channel whose calls carry the cluster secret.
pub type Internal =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Stamp>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_what_only_holders_of_the_secret_can_verify() {
        let s = ClusterSecret::new("0123456789abcdef-secret").expect("secret");
        let sig = s.sign(b"leader c1");
        assert_eq!(sig.len(), 64);
        assert!(s.verify(b"leader c1", &sig));
        assert!(!s.verify(b"leader c2", &sig), "another message");
        assert!(
            !ClusterSecret::random().verify(b"leader c1", &sig),
            "another secret"
        );
        assert!(!s.verify(b"leader c1", "zz"), "not hex");
        assert!(!s.verify(b"leader c1", ""), "unsigned");
    }

    #[test]
    fn checks_the_secret_and_never_prints_it() {
        let s = ClusterSecret::new("0123456789abcdef-secret").expect("secret");
        assert!(!format!("{s:?}").contains("0123"));
        let mut stamped = s.stamp().call(Request::new(())).expect("stamp");
        assert!(s.check().call(stamped).is_ok());
        stamped = ClusterSecret::random()
            .stamp()
            .call(Request::new(()))
            .expect("stamp");
        let e = s.check().call(stamped).expect_err("wrong secret");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = s.check().call(Request::new(())).expect_err("no secret");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(ClusterSecret::new("short").is_err());
        assert!(ClusterSecret::new("has a space in it here").is_err());
    }

    #[test]
    fn the_file_is_created_once_and_read_back() {
        let dir = std::env::temp_dir().join(format!("dissem-secret-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let p = dir.join("cluster.secret");
        let _ = std::fs::remove_file(&p);
        let a = ClusterSecret::load_or_create(&p).expect("create");
        let b = ClusterSecret::load(&p).expect("load");
        let stamped = a.stamp().call(Request::new(())).expect("stamp");
        assert!(b.check().call(stamped).is_ok());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).expect("meta").permissions().mode();
            assert_eq!(mode & 0o077, 0, "mode {mode:o}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
