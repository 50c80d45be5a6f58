//! How a coordinator or node trusts etcd and is trusted by it (issue 31, hole 4): TLS to
//! `https://` members verified against `--etcd-ca`, a client certificate for an etcd that
//! demands one (`--etcd-cert`, `--etcd-key`), and etcd user authentication (`--etcd-user`
//! with the password in `--etcd-password-file`, never on the command line). The leader key
//! and node records are signed with the cluster secret besides (`runtime::election`), so a
//! process with write access to etcd still cannot redirect the nodes.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use runtime::ServiceError;
use runtime::etcd::{Etcd, EtcdSecurity};

/// The etcd trust flags, shared by `dissem coordinator` and `dissem node`.
#[derive(clap::Args, Debug, Clone, Default)]
pub(super) struct EtcdTrustFlags {
    /// The CA certificate (PEM) that signed the etcd members' server certificates; the
    /// members must then be given as https:// URLs.
    #[arg(long)]
    pub(super) etcd_ca: Option<PathBuf>,
    /// This process's client certificate (PEM), for an etcd started with
    /// --client-cert-auth (with --etcd-key).
    #[arg(long, requires = "etcd_key")]
    pub(super) etcd_cert: Option<PathBuf>,
    /// The key (PEM) of --etcd-cert.
    #[arg(long, requires = "etcd_cert")]
    pub(super) etcd_key: Option<PathBuf>,
    /// Authenticate to etcd as this user (etcd's `auth enable`; the user needs read and
    /// write on --etcd-prefix). The password is read from --etcd-password-file.
    #[arg(long, requires = "etcd_password_file")]
    pub(super) etcd_user: Option<String>,
    /// A file holding the password of --etcd-user (surrounding white space is ignored).
    #[arg(long, requires = "etcd_user")]
    pub(super) etcd_password_file: Option<PathBuf>,
}

/// The longest password file read.
const MAX_PASSWORD_FILE: u64 = 4096;

impl EtcdTrustFlags {
    fn security(&self) -> anyhow::Result<EtcdSecurity> {
        let ca = self.etcd_ca.as_deref().map(runtime::tls::ca).transpose()?;
        let identity = match (&self.etcd_cert, &self.etcd_key) {
            (Some(c), Some(k)) => Some(runtime::tls::identity(c, k)?),
            _ => None,
        };
        let user = match (&self.etcd_user, &self.etcd_password_file) {
            (Some(u), Some(f)) => {
                let len = std::fs::metadata(f)
                    .with_context(|| format!("--etcd-password-file {}", f.display()))?
                    .len();
                if len > MAX_PASSWORD_FILE {
                    bail!(
                        "--etcd-password-file {}: {len} bytes, at most {MAX_PASSWORD_FILE}",
                        f.display()
                    );
                }
                let p = std::fs::read_to_string(f)
                    .with_context(|| format!("--etcd-password-file {}", f.display()))?;
                let p = p.trim();
                if p.is_empty() {
                    bail!("--etcd-password-file {} is empty", f.display());
                }
                Some((u.clone(), p.to_string()))
            }
            _ => None,
        };
        Ok(EtcdSecurity { ca, identity, user })
    }

    /// A client of the etcd members at `urls` under `prefix`, logged in when a user is
    /// given: etcd down is waited for (with a warning every few seconds); a refused user
    /// or password fails at once, naming the flag.
    pub(super) async fn connect(&self, urls: &str, prefix: &str) -> anyhow::Result<Etcd> {
        let etcd = Etcd::connect_with(urls, prefix, &self.security()?)?;
        if self.etcd_user.is_none() {
            return Ok(etcd);
        }
        let mut tries = 0u32;
        loop {
            match etcd.login().await {
                Ok(()) => return Ok(etcd),
                Err(e @ ServiceError::InvalidArgument { .. }) => return Err(e.into()),
                Err(e) => {
                    if tries.is_multiple_of(10) {
                        tracing::warn!("logging in to etcd: {e}; trying again");
                    }
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}
