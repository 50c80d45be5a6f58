//! TLS for the gRPC listeners and the cluster's own clients (rustls, no OpenSSL).
//!
//! A listener given a certificate and key (`--tls-cert`, `--tls-key`) speaks only TLS; with
//! `--tls-client-ca` it also demands a client certificate signed by that CA (mutual TLS). The
//! cluster's internal clients (node -> coordinator, coordinator -> node, node -> node) reach
//! `https://` endpoints with the process's client settings, set once at start by the binary
//! ([`set_client`]): the CA that signed the servers (`--tls-ca`) and, for mutual TLS, this
//! process's own certificate.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::error::ServiceError;

fn read(path: &Path, what: &str) -> Result<Vec<u8>, ServiceError> {
    std::fs::read(path)
        .map_err(|e| ServiceError::Startup(format!("reading the {what} {}: {e}", path.display())))
}

/// Checks that `pem` holds at least one PEM block of `label` (CERTIFICATE, PRIVATE KEY), so a
/// wrong file is named at start rather than failing every handshake.
fn check_pem(pem: &[u8], path: &Path, what: &str, label: &str) -> Result<(), ServiceError> {
    let text = String::from_utf8_lossy(pem);
    if text.contains("-----BEGIN ") && text.contains(label) {
        Ok(())
    } else {
        Err(ServiceError::Startup(format!(
            "the {what} {} holds no PEM {label}",
            path.display()
        )))
    }
}

/// A certificate chain and its key from PEM files, each checked to hold its PEM block.
fn pem_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), ServiceError> {
    let c = read(cert, "TLS certificate")?;
    check_pem(&c, cert, "TLS certificate", "CERTIFICATE")?;
    let k = read(key, "TLS key")?;
    check_pem(&k, key, "TLS key", "PRIVATE KEY")?;
    Ok((c, k))
}

/// A server's identity from PEM files.
pub fn identity(cert: &Path, key: &Path) -> Result<Identity, ServiceError> {
    let (c, k) = pem_pair(cert, key)?;
    Ok(Identity::from_pem(c, k))
}

/// A TLS acceptor for an HTTP/1.1 listener (the S3 event endpoint) from PEM files: the
/// certificate chain and its private key.
pub fn http_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, ServiceError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (c, k) = pem_pair(cert, key)?;
    let bad = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        ServiceError::Startup(format!("the {what} {}: {e}", path.display()))
    };
    let chain = CertificateDer::pem_slice_iter(&c)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("TLS certificate", cert, &e))?;
    let key_der = PrivateKeyDer::from_pem_slice(&k).map_err(|e| bad("TLS key", key, &e))?;
    let cfg = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ServiceError::Startup(format!("TLS: {e}")))?
    .with_no_client_auth()
    .with_single_cert(chain, key_der)
    .map_err(|e| bad("TLS certificate and key", cert, &e))?;
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg)))
}

/// A CA certificate from a PEM file.
pub fn ca(path: &Path) -> Result<Certificate, ServiceError> {
    let c = read(path, "CA certificate")?;
    check_pem(&c, path, "CA certificate", "CERTIFICATE")?;
    Ok(Certificate::from_pem(c))
}

/// Server TLS: `identity`, client certificates signed by `client_ca` required when given,
/// the handshake bounded by `handshake_timeout`.
pub fn server(
    identity: Identity,
    client_ca: Option<Certificate>,
    handshake_timeout: Duration,
) -> ServerTlsConfig {
    let mut cfg = ServerTlsConfig::new()
        .identity(identity)
        .timeout(handshake_timeout);
    if let Some(ca) = client_ca {
        cfg = cfg.client_ca_root(ca);
    }
    cfg
}

/// Client TLS: servers verified against `ca` (and the bundled web roots when `None`), this
/// process's `identity` presented for mutual TLS.
pub fn client(ca: Option<Certificate>, identity: Option<Identity>) -> ClientTlsConfig {
    let mut cfg = ClientTlsConfig::new().timeout(Duration::from_secs(10));
    cfg = match ca {
        Some(ca) => cfg.ca_certificate(ca),
        None => cfg.with_webpki_roots(),
    };
    if let Some(id) = identity {
        cfg = cfg.identity(id);
    }
    cfg
}

static CLIENT: OnceLock<ClientTlsConfig> = OnceLock::new();

/// Sets the TLS settings of this process's clients of `https://` endpoints (once; later calls
/// are ignored).
pub fn set_client(cfg: ClientTlsConfig) {
    let _ = CLIENT.set(cfg);
}

/// `endpoint` with TLS when `url` is `https://` (the process's settings, or the bundled web
/// roots if none were set).
pub fn apply(endpoint: Endpoint, url: &str) -> Result<Endpoint, ServiceError> {
    if !url.starts_with("https://") {
        return Ok(endpoint);
    }
    let cfg = CLIENT.get().cloned().unwrap_or_else(|| client(None, None));
    endpoint
        .tls_config(cfg)
        .map_err(|e| ServiceError::invalid("endpoint", format!("{url:?}: {e}")))
}
