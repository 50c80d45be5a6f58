//! A secured etcd for tests and benchmarks (issue 31, hole 4): a CA, a server certificate
//! for 127.0.0.1, and a client certificate, so etcd serves only TLS and demands client
//! certificates; and etcd user auth turned on through etcd's own Auth API, with a `dissem`
//! user allowed read and write on `/dissem/` only. [`EtcdTrust::flags`] are what a
//! coordinator or node is given to reach it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use proto::etcd;
use proto::etcd::auth_client::AuthClient;
use runtime::etcd::EtcdSecurity;

/// The files and names of a secured etcd.
#[derive(Debug, Clone)]
pub struct EtcdTrust {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// The `dissem` user's password, in a file.
    pub password_file: PathBuf,
    password: String,
    root_password: String,
    /// Whether [`EtcdTrust::enable_auth`] ran (clients then log in).
    pub auth: bool,
}

/// The user the cluster's processes authenticate as.
pub const USER: &str = "dissem";

fn pem_pair(
    dir: &Path,
    name: &str,
    names: Vec<String>,
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(names)?.signed_by(&key, issuer)?;
    let (c, k) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&c, cert.pem())?;
    std::fs::write(&k, key.serialize_pem())?;
    Ok((c, k))
}

impl EtcdTrust {
    /// Writes a fresh CA, server and client certificates and passwords into `dir`.
    pub fn make(dir: &Path) -> anyhow::Result<EtcdTrust> {
        std::fs::create_dir_all(dir)?;
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = dir.join("etcd-ca.pem");
        std::fs::write(&ca, ca_cert.pem())?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let (server_cert, server_key) = pem_pair(
            dir,
            "etcd-server",
            vec!["127.0.0.1".to_string(), "localhost".to_string()],
            &issuer,
        )?;
        let (client_cert, client_key) =
            pem_pair(dir, "etcd-client", vec!["dissem-node".to_string()], &issuer)?;
        let password = format!("pw-{:016x}", runtime::random_u64());
        let password_file = dir.join("etcd-password");
        std::fs::write(&password_file, format!("{password}\n"))?;
        Ok(EtcdTrust {
            ca,
            server_cert,
            server_key,
            client_cert,
            client_key,
            password_file,
            password,
            root_password: format!("root-{:016x}", runtime::random_u64()),
            auth: false,
        })
    }

    /// etcd's flags for TLS with client certificates.
    pub fn etcd_flags(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        vec![
            "--cert-file".into(),
            p(&self.server_cert),
            "--key-file".into(),
            p(&self.server_key),
            "--client-cert-auth".into(),
            "--trusted-ca-file".into(),
            p(&self.ca),
        ]
    }

    /// A coordinator's or node's flags to reach the secured etcd.
    pub fn flags(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        let mut f = vec![
            "--etcd-ca".into(),
            p(&self.ca),
            "--etcd-cert".into(),
            p(&self.client_cert),
            "--etcd-key".into(),
            p(&self.client_key),
        ];
        if self.auth {
            f.extend([
                "--etcd-user".into(),
                USER.into(),
                "--etcd-password-file".into(),
                p(&self.password_file),
            ]);
        }
        f
    }

    fn tls(&self) -> anyhow::Result<(tonic::transport::Certificate, tonic::transport::Identity)> {
        Ok((
            runtime::tls::ca(&self.ca)?,
            runtime::tls::identity(&self.client_cert, &self.client_key)?,
        ))
    }

    /// An in-process client's security: TLS, and (once auth is on) the `dissem` user.
    pub fn security(&self) -> anyhow::Result<EtcdSecurity> {
        let (ca, id) = self.tls()?;
        Ok(EtcdSecurity {
            ca: Some(ca),
            identity: Some(id),
            user: self.auth.then(|| (USER.to_string(), self.password.clone())),
        })
    }

    /// Turns etcd's user auth on at `url`: a root user, a `dissem` role with read and
    /// write on `prefix` only, the `dissem` user with it; from then on every call needs a
    /// token.
    pub async fn enable_auth(&mut self, url: &str, prefix: &str) -> anyhow::Result<()> {
        let (ca, id) = self.tls()?;
        let ch = tonic::transport::Endpoint::from_shared(url.to_string())?
            .tls_config(runtime::tls::client(Some(ca), Some(id)))?
            .connect()
            .await
            .context("connecting to etcd to turn auth on")?;
        let mut a = AuthClient::new(ch);
        a.user_add(etcd::AuthUserAddRequest {
            name: "root".into(),
            password: self.root_password.clone(),
        })
        .await?;
        a.user_grant_role(etcd::AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        })
        .await?;
        a.role_add(etcd::AuthRoleAddRequest { name: USER.into() })
            .await?;
        let key = prefix.as_bytes().to_vec();
        let end = runtime::etcd::prefix_end(&key);
        a.role_grant_permission(etcd::AuthRoleGrantPermissionRequest {
            name: USER.into(),
            perm: Some(etcd::Permission {
                perm_type: etcd::permission::Type::Readwrite as i32,
                key,
                range_end: end,
            }),
        })
        .await?;
        a.user_add(etcd::AuthUserAddRequest {
            name: USER.into(),
            password: self.password.clone(),
        })
        .await?;
        a.user_grant_role(etcd::AuthUserGrantRoleRequest {
            user: USER.into(),
            role: USER.into(),
        })
        .await?;
        a.auth_enable(etcd::AuthEnableRequest {}).await?;
        self.auth = true;
        Ok(())
    }
}
