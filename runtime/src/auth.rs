//! Who may call the public API, and as which tenant. The one place callers are authenticated
//! is [`AuthLayer`], a tower layer on every public listener: it reads `authorization: Bearer
//! <token>`, looks the token's SHA-256 up in the auth file (tokens themselves are never
//! stored), checks the role the method needs, and hands the handler a [`Caller`] in the
//! request's extensions. Handlers only ask the caller which tenant it is (subscriptions,
//! streams and dead letters are scoped by it) and charge its tenant's quotas.
//!
//! The auth file (`--auth-file`, TOML):
//!
//! ```toml
//! [[tokens]]
//! name = "sensor-gateway"
//! tenant = "acme"
//! roles = ["ingest"]
//! sha256 = "9f86d08..."          # of the token; `dissem token create` writes these
//!
//! [tenants.acme]
//! max_subscriptions = 10000
//! max_puts_per_second = 5000
//! ```
//!
//! Roles: `ingest` (Put, PutStream, Announce), `federate` (a peer cluster's
//! `Federation.Replicate`), `subscribe` (the tenant's own subscriptions,
//! streams, dead letters and redrive), `read` (Objects.Get), `admin` (everything, every
//! tenant). Without an auth file every caller is an admin of the unnamed tenant (a loopback
//! development node; the binary refuses other addresses without `--insecure`).
//!
//! Internal services (`Cluster`, `Daemon`) are not checked here: they take the cluster secret
//! ([`crate::cluster_secret`]).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use sha2::{Digest, Sha256};
use tonic::Status;

use crate::error::ServiceError;
use crate::lock;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Ingest,
    Subscribe,
    Read,
    Admin,
    /// A peer cluster replicating its objects here (`Federation`).
    Federate,
}

impl Role {
    /// Every role, by its name in the auth file.
    pub const ALL: [(&'static str, Role); 5] = [
        ("ingest", Role::Ingest),
        ("subscribe", Role::Subscribe),
        ("read", Role::Read),
        ("admin", Role::Admin),
        ("federate", Role::Federate),
    ];

    /// The role named `s`.
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.iter().find(|(n, _)| *n == s).map(|(_, r)| *r)
    }

    fn name(self) -> &'static str {
        Role::ALL
            .iter()
            .find(|(_, r)| *r == self)
            .map_or("?", |(n, _)| n)
    }

    fn bit(self) -> u8 {
        match self {
            Role::Ingest => 1,
            Role::Subscribe => 2,
            Role::Read => 4,
            Role::Admin => 8,
            Role::Federate => 16,
        }
    }
}

/// A tenant's quotas (`None`: unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    pub max_subscriptions: Option<u64>,
    pub max_puts_per_second: Option<u32>,
}

/// A tenant's quotas and the state that charges them (shared by all its tokens).
#[derive(Debug)]
pub struct Tenant {
    pub name: String,
    pub quota: Quota,
    /// Token bucket of puts: (tokens left, last refill).
    puts: Mutex<(f64, Instant)>,
}

impl Tenant {
    fn new(name: String, quota: Quota) -> Tenant {
        let burst = quota.max_puts_per_second.map_or(0.0, f64::from);
        Tenant {
            name,
            quota,
            puts: Mutex::new((burst, Instant::now())),
        }
    }

    /// Charges `n` puts to the tenant's rate; `ResourceExhausted` past it.
    pub fn charge_puts(&self, n: u32) -> Result<(), ServiceError> {
        let Some(rate) = self.quota.max_puts_per_second else {
            return Ok(());
        };
        let rate = f64::from(rate);
        let mut b = lock(&self.puts);
        let now = Instant::now();
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * rate).min(rate);
        b.1 = now;
        if b.0 >= f64::from(n) {
            b.0 -= f64::from(n);
            Ok(())
        } else {
            Err(ServiceError::Quota(format!(
                "tenant {:?} exceeds its quota of {rate} puts per second",
                self.name
            )))
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's name (for logs; never the token).
    pub name: String,
    pub tenant: Arc<Tenant>,
    roles: u8,
}

impl Caller {
    /// The caller of a node without an auth file: an admin of the unnamed tenant.
    pub fn open() -> Caller {
        Caller {
            name: "anonymous".into(),
            tenant: Arc::new(Tenant::new(String::new(), Quota::default())),
            roles: Role::Admin.bit(),
        }
    }

    /// The caller of an unauthenticated health probe: no role at all.
    pub fn probe() -> Caller {
        Caller {
            name: "health probe".into(),
            tenant: Arc::new(Tenant::new(String::new(), Quota::default())),
            roles: 0,
        }
    }

    /// Whether the caller holds `role` (admins hold every role).
    pub fn has(&self, role: Role) -> bool {
        self.roles & (role.bit() | Role::Admin.bit()) != 0
    }

    pub fn is_admin(&self) -> bool {
        self.has(Role::Admin)
    }

    /// The caller's tenant name.
    pub fn tenant(&self) -> &str {
        &self.tenant.name
    }

    /// Whether the caller may see what `tenant` owns.
    pub fn sees(&self, tenant: &str) -> bool {
        self.is_admin() || self.tenant.name == tenant
    }
}

/// The caller of a request: what [`AuthLayer`] put there, or (a service called without the
/// layer, as in-process tests do) an open caller.
pub fn caller<T>(req: &tonic::Request<T>) -> Arc<Caller> {
    req.extensions()
        .get::<Arc<Caller>>()
        .cloned()
        .unwrap_or_else(|| Arc::new(Caller::open()))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    tokens: Vec<TokenDoc>,
    #[serde(default)]
    tenants: BTreeMap<String, Quota>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenDoc {
    name: String,
    tenant: String,
    roles: Vec<String>,
    sha256: String,
}

/// Whether `s` is a usable token or tenant name: 1..=64 of letters, digits, `_ . -`.
fn valid_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The SHA-256 of `bytes` in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The hex SHA-256 of a token, as the auth file stores it.
pub fn token_hash(token: &str) -> String {
    sha256_hex(token.as_bytes())
}

/// The loaded auth file.
#[derive(Debug)]
pub struct Auth {
    by_hash: HashMap<String, Arc<Caller>>,
}

impl Auth {
    /// Parses an auth file's text; errors name the entry and field.
    pub fn parse(text: &str, path: &str) -> Result<Auth, ServiceError> {
        let doc: FileDoc = toml::from_str(text)
            .map_err(|e| ServiceError::invalid(format!("auth file {path}"), e.to_string()))?;
        let bad = |i: usize, field: &str, why: String| {
            ServiceError::invalid(format!("auth file {path}: tokens[{i}].{field}"), why)
        };
        let mut tenants: HashMap<String, Arc<Tenant>> = HashMap::new();
        let mut by_hash = HashMap::new();
        let mut names = std::collections::HashSet::new();
        for (name, _) in doc.tenants.iter() {
            if !valid_label(name) {
                return Err(ServiceError::invalid(
                    format!("auth file {path}: tenants"),
                    format!("{name:?} is not a tenant name (1..=64 of letters, digits, _ . -)"),
                ));
            }
        }
        for (i, t) in doc.tokens.into_iter().enumerate() {
            if !valid_label(&t.name) {
                return Err(bad(i, "name", "1..=64 of letters, digits, _ . -".into()));
            }
            if !names.insert(t.name.clone()) {
                return Err(bad(i, "name", format!("{:?} is used twice", t.name)));
            }
            if !valid_label(&t.tenant) {
                return Err(bad(i, "tenant", "1..=64 of letters, digits, _ . -".into()));
            }
            let hash = t.sha256.to_ascii_lowercase();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(i, "sha256", "64 hex digits are required".into()));
            }
            let mut roles = 0u8;
            for r in &t.roles {
                roles |= Role::parse(r)
                    .ok_or_else(|| {
                        bad(
                            i,
                            "roles",
                            format!("{r:?} is not one of ingest, subscribe, read, admin, federate"),
                        )
                    })?
                    .bit();
            }
            if roles == 0 {
                return Err(bad(i, "roles", "at least one role is required".into()));
            }
            let tenant = tenants
                .entry(t.tenant.clone())
                .or_insert_with(|| {
                    let quota = doc.tenants.get(&t.tenant).copied().unwrap_or_default();
                    Arc::new(Tenant::new(t.tenant.clone(), quota))
                })
                .clone();
            let caller = Arc::new(Caller {
                name: t.name,
                tenant,
                roles,
            });
            if by_hash.insert(hash, caller).is_some() {
                return Err(bad(i, "sha256", "two tokens have the same hash".into()));
            }
        }
        Ok(Auth { by_hash })
    }

    /// Loads the auth file at `path`.
    pub fn load(path: &Path) -> Result<Auth, ServiceError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ServiceError::Startup(format!("reading the auth file {}: {e}", path.display()))
        })?;
        Auth::parse(&text, &path.display().to_string())
    }

    /// Tokens in the file.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The caller presenting `headers`' bearer token.
    pub fn authenticate(&self, headers: &http::HeaderMap) -> Result<Arc<Caller>, Status> {
        let value = headers
            .get(http::header::AUTHORIZATION)
            .ok_or_else(|| {
                Status::unauthenticated("a token is required: authorization: Bearer <token>")
            })?
            .to_str()
            .map_err(|_| Status::unauthenticated("the authorization header is not text"))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| Status::unauthenticated("authorization must be `Bearer <token>`"))?;
        self.caller(token)
    }

    /// The caller of `token` however it was presented (a bearer header, or where a plain
    /// HTTP listener takes it: Basic auth's password, the URL).
    pub fn caller(&self, token: &str) -> Result<Arc<Caller>, Status> {
        self.by_hash
            .get(&token_hash(token.trim()))
            .cloned()
            .ok_or_else(|| Status::unauthenticated("the token is not valid"))
    }
}

/// A new random token (`dsm_` and 64 hex digits).
pub fn new_token() -> String {
    format!("dsm_{}", crate::cluster_secret::random_hex())
}

/// Adds a token named `name` for `tenant` with `roles` to the auth file at `path` (created,
/// mode 0600, if missing) and returns the token, which is not stored anywhere.
pub fn create_token(
    path: &Path,
    name: &str,
    tenant: &str,
    roles: &[String],
) -> Result<String, ServiceError> {
    let existing = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return Err(ServiceError::Startup(format!(
                "reading the auth file {}: {e}",
                path.display()
            )));
        }
    };
    let token = new_token();
    let roles_toml = roles
        .iter()
        .map(|r| format!("{:?}", r.trim()))
        .collect::<Vec<_>>()
        .join(", ");
    let entry = format!(
        "\n[[tokens]]\nname = {name:?}\ntenant = {tenant:?}\nroles = [{roles_toml}]\nsha256 = \"{}\"\n",
        token_hash(&token)
    );
    let updated = format!("{existing}{entry}");
    // the whole file must still load: names, roles and tenants are checked here
    Auth::parse(&updated, &path.display().to_string())?;
    write_private(path, &updated)?;
    Ok(token)
}

/// Writes `text` to `path` through a temporary file renamed into place, mode 0600.
fn write_private(path: &Path, text: &str) -> Result<(), ServiceError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let io = |e: std::io::Error| ServiceError::Startup(format!("writing {}: {e}", path.display()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp).map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The role a public method needs (`None`: any authenticated caller, e.g. reflection).
fn required_role(path: &str) -> Option<Role> {
    let service = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let method = path.rsplit('/').next().unwrap_or("");
    match service {
        "dissem.v1.Ingest" => Some(Role::Ingest),
        "dissem.v1.Federation" => match method {
            "Replicate" => Some(Role::Federate),
            _ => Some(Role::Admin),
        },
        "dissem.v1.Objects" => Some(Role::Read),
        "dissem.v1.Subscriptions" | "dissem.v1.Stream" => Some(Role::Subscribe),
        "dissem.v1.Admin" => match method {
            "DeadLetters" | "Redrive" => Some(Role::Subscribe),
            _ => Some(Role::Admin),
        },
        s if s.starts_with("grpc.reflection.") => None,
        // anything else (unknown services) is for admins only
        _ => Some(Role::Admin),
    }
}

/// Internal services: authenticated by the cluster secret, not by tokens.
fn internal(path: &str) -> bool {
    path.starts_with("/dissem.v1.Cluster/") || path.starts_with("/dissem.v1.Daemon/")
}

/// The health service (`grpc.health.v1.Health`): open to anyone, as load balancers and
/// orchestrators probe without credentials; it says only whether the port serves.
fn health(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/")
}

/// Tower layer: authenticates every public call (see the module doc).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: Option<Arc<Auth>>,
}

impl AuthLayer {
    /// Checks tokens against `auth`; `None`: every caller is an open admin.
    pub fn new(auth: Option<Arc<Auth>>) -> AuthLayer {
        AuthLayer { auth }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = AuthService<S>;
    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            auth: self.auth.clone(),
            open: Arc::new(Caller::open()),
            open_probe: Arc::new(Caller::probe()),
        }
    }
}

/// See [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Option<Arc<Auth>>,
    open: Arc<Caller>,
    /// The caller of a health probe: no tenant, no role.
    open_probe: Arc<Caller>,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower_service::Service<http::Request<B>> for AuthService<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().to_string();
        if health(&path) {
            req.extensions_mut().insert(self.open_probe.clone());
        } else if !internal(&path) {
            let caller = match &self.auth {
                None => self.open.clone(),
                Some(a) => match a.authenticate(req.headers()) {
                    Ok(c) => c,
                    Err(s) => return Box::pin(std::future::ready(Ok(s.into_http()))),
                },
            };
            if let Some(role) = required_role(&path)
                && !caller.has(role)
            {
                let s = Status::permission_denied(format!(
                    "token {:?} lacks the {} role that {path} needs",
                    caller.name,
                    role.name()
                ));
                return Box::pin(std::future::ready(Ok(s.into_http())));
            }
            req.extensions_mut().insert(caller);
        }
        Box::pin(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(token: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("header"),
        );
        h
    }

    #[test]
    fn tokens_are_created_hashed_and_checked() {
        let dir = std::env::temp_dir().join(format!("dissem-auth-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let p = dir.join("auth.toml");
        let _ = std::fs::remove_file(&p);
        let t1 = create_token(&p, "gw", "acme", &["ingest".into()]).expect("create");
        let t2 = create_token(&p, "ops", "acme", &["admin".into()]).expect("create");
        let text = std::fs::read_to_string(&p).expect("read");
        assert!(
            !text.contains(&t1) && !text.contains(&t2),
            "only hashes are stored"
        );
        let auth = Auth::load(&p).expect("load");
        let c = auth.authenticate(&headers(&t1)).expect("valid");
        assert_eq!((c.name.as_str(), c.tenant()), ("gw", "acme"));
        assert!(c.has(Role::Ingest) && !c.has(Role::Subscribe) && !c.is_admin());
        assert!(
            auth.authenticate(&headers(&t2))
                .expect("admin")
                .has(Role::Read)
        );
        let e = auth.authenticate(&headers("dsm_wrong")).expect_err("wrong");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = auth
            .authenticate(&http::HeaderMap::new())
            .expect_err("none");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = create_token(&p, "gw", "acme", &["ingest".into()]).expect_err("dup name");
        assert!(e.to_string().contains("used twice"), "{e}");
        let e = create_token(&p, "x", "acme", &["root".into()]).expect_err("bad role");
        assert!(e.to_string().contains("roles"), "{e}");
        let e = create_token(&p, "y", "no spaces", &["read".into()]).expect_err("bad tenant");
        assert!(e.to_string().contains("tenant"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_files_name_the_field() {
        let e = Auth::parse("[[tokens]]\nname = \"a\"\n", "f").expect_err("missing");
        assert!(e.to_string().contains("auth file f"), "{e}");
        let e = Auth::parse("bogus = 1\n", "f").expect_err("unknown key");
        assert!(e.to_string().contains("bogus"), "{e}");
        let text =
            "[[tokens]]\nname = \"a\"\ntenant = \"t\"\nroles = [\"read\"]\nsha256 = \"xyz\"\n";
        let e = Auth::parse(text, "f").expect_err("hash");
        assert!(e.to_string().contains("tokens[0].sha256"), "{e}");
    }

    #[test]
    fn put_quota_is_a_token_bucket_per_tenant() {
        let t = Tenant::new(
            "t".into(),
            Quota {
                max_subscriptions: None,
                max_puts_per_second: Some(10),
            },
        );
        assert!(t.charge_puts(10).is_ok());
        let e = t.charge_puts(5).expect_err("over");
        assert!(e.to_string().contains("10 puts per second"), "{e}");
    }

    #[test]
    fn methods_need_their_roles() {
        assert_eq!(required_role("/dissem.v1.Ingest/Put"), Some(Role::Ingest));
        assert_eq!(
            required_role("/dissem.v1.Federation/Replicate"),
            Some(Role::Federate)
        );
        assert_eq!(
            required_role("/dissem.v1.Federation/Promote"),
            Some(Role::Admin)
        );
        assert_eq!(
            required_role("/dissem.v1.Federation/Links"),
            Some(Role::Admin)
        );
        for m in ["AddLink", "RemoveLink"] {
            assert_eq!(
                required_role(&format!("/dissem.v1.Federation/{m}")),
                Some(Role::Admin)
            );
        }
        assert_eq!(required_role("/dissem.v1.Objects/Get"), Some(Role::Read));
        assert_eq!(
            required_role("/dissem.v1.Subscriptions/List"),
            Some(Role::Subscribe)
        );
        assert_eq!(
            required_role("/dissem.v1.Admin/Redrive"),
            Some(Role::Subscribe)
        );
        assert_eq!(required_role("/dissem.v1.Admin/Stats"), Some(Role::Admin));
        assert_eq!(required_role("/nope.Svc/X"), Some(Role::Admin));
        assert_eq!(
            required_role("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            None
        );
        assert!(internal("/dissem.v1.Cluster/Subscription"));
    }
}
