//! The HTTP(S) client of webhook pushes and the gRPC connector of subscriber pushes: every
//! connection resolves through the [`GuardedResolver`] (one checked lookup, connected to
//! exactly the addresses checked), HTTPS verifies the certificate and host name against the
//! bundled web roots plus any `--webhook-ca`, and redirects are never followed (a 3xx is a
//! failed attempt). Before the first event to a webhook URL the node asks it to consent with
//! the CloudEvents abuse-protection handshake (an `OPTIONS` request carrying
//! `WebHook-Request-Origin`, answered with `WebHook-Allowed-Origin`), as Azure Event Grid
//! does; its answer (consent or refusal) is remembered for [`CONSENT_TTL`], while a
//! receiver that could not be reached is asked again at the next attempt.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use runtime::error::ServiceError;
use runtime::lock;
use runtime::target_guard::GuardedResolver;

/// The origin a node names in the validation handshake.
pub const REQUEST_ORIGIN: &str = "dissem";
/// How long a webhook's consent (or refusal) is remembered.
pub const CONSENT_TTL: Duration = Duration::from_secs(600);

/// The connector of gRPC subscriber channels (plain HTTP/2 through the guarded resolver).
pub fn grpc_connector(allow_private: bool) -> HttpConnector<GuardedResolver> {
    let mut c = HttpConnector::new_with_resolver(GuardedResolver::new(allow_private));
    c.set_nodelay(true);
    c.set_connect_timeout(Some(Duration::from_secs(2)));
    c
}

/// The rustls client settings of HTTPS webhooks: web roots, plus the CAs in `extra_pem`.
pub fn webhook_tls(extra_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, ServiceError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_pem {
        let mut n = 0;
        for c in CertificateDer::pem_slice_iter(pem) {
            let c = c.map_err(|e| ServiceError::invalid("--webhook-ca", e.to_string()))?;
            roots
                .add(c)
                .map_err(|e| ServiceError::invalid("--webhook-ca", e.to_string()))?;
            n += 1;
        }
        if n == 0 {
            return Err(ServiceError::invalid(
                "--webhook-ca",
                "the file holds no PEM certificate",
            ));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServiceError::Startup(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The webhook client type.
pub type WebhookClient = Client<HttpsConnector<HttpConnector<GuardedResolver>>, Full<Bytes>>;

/// A webhook client under the address rule and TLS settings.
pub fn webhook_client(allow_private: bool, tls: rustls::ClientConfig) -> WebhookClient {
    let mut http = HttpConnector::new_with_resolver(GuardedResolver::new(allow_private));
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(2)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https)
}

/// What a webhook answered to the handshake, and when.
type Consent = (Instant, Result<(), String>);

/// Webhook URLs' answers to the validation handshake.
#[derive(Debug, Default)]
pub struct Consents {
    answers: Mutex<HashMap<String, Consent>>,
}

impl Consents {
    /// Whether `url` consents to events from this node, asking it (at most once per
    /// [`CONSENT_TTL`]) with `client`.
    pub async fn check(&self, client: &WebhookClient, url: &str) -> Result<(), String> {
        if let Some((at, answer)) = lock(&self.answers).get(url)
            && at.elapsed() < CONSENT_TTL
        {
            return answer.clone();
        }
        let (answer, answered) = match handshake(client, url).await {
            Handshake::Answered(a) => (a, true),
            Handshake::Unanswered(e) => (Err(e), false),
        };
        match &answer {
            // a refusal is the receiver's word; no answer is one more failed attempt (each
            // event retried, as for a failed POST), not a warning per event
            Err(e) if answered => tracing::warn!("webhook {url}: {e}"),
            Err(e) => tracing::debug!("webhook {url}: {e}"),
            Ok(()) => {}
        }
        // no answer is no refusal: a receiver down for a moment (its process restarting) is
        // asked again at the next attempt; remembered, it would fail every attempt for
        // CONSENT_TTL and its events would run out of retries (`bench chaos`, seed 44011)
        if answered {
            let mut answers = lock(&self.answers);
            if answers.len() > 100_000 {
                answers.retain(|_, (at, _)| at.elapsed() < CONSENT_TTL);
            }
            answers.insert(url.to_string(), (Instant::now(), answer.clone()));
        }
        answer
    }
}

/// What a handshake came to.
enum Handshake {
    /// The receiver's answer (consent or refusal), or a URL no request can be made of.
    Answered(Result<(), String>),
    /// No answer: the receiver could not be reached or did not answer in time.
    Unanswered(String),
}

/// One CloudEvents abuse-protection handshake.
async fn handshake(client: &WebhookClient, url: &str) -> Handshake {
    let req = hyper::Request::builder()
        .method(hyper::Method::OPTIONS)
        .uri(url)
        .header("WebHook-Request-Origin", REQUEST_ORIGIN)
        .header("user-agent", concat!("dissem/", env!("CARGO_PKG_VERSION")))
        .body(Full::new(Bytes::new()));
    let req = match req {
        Ok(r) => r,
        Err(e) => {
            return Handshake::Answered(Err(format!("building the validation request: {e}")));
        }
    };
    let resp = match tokio::time::timeout(Duration::from_secs(10), client.request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return Handshake::Unanswered(format!("webhook validation: OPTIONS {url}: {e}"));
        }
        Err(_) => {
            return Handshake::Unanswered(
                "webhook validation: no answer to OPTIONS within 10 s".into(),
            );
        }
    };
    Handshake::Answered(judge_consent(&resp))
}

/// Whether an answer to the handshake consents.
fn judge_consent<B>(resp: &hyper::Response<B>) -> Result<(), String> {
    if !resp.status().is_success() {
        return Err(format!(
            "webhook validation: OPTIONS answered HTTP {}; the receiver must consent with \
             WebHook-Allowed-Origin (or the node runs with --skip-webhook-validation)",
            resp.status()
        ));
    }
    let allowed = resp
        .headers()
        .get("WebHook-Allowed-Origin")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if allowed == "*" || allowed.eq_ignore_ascii_case(REQUEST_ORIGIN) {
        Ok(())
    } else {
        Err(format!(
            "webhook validation: the receiver did not consent (WebHook-Allowed-Origin {:?}, \
             expected {REQUEST_ORIGIN:?} or \"*\")",
            blocks::quote::clip(allowed)
        ))
    }
}

/// The receiver's side of the handshake, for Rust receivers (the demo's and the tests'): the
/// consenting answer when `req` is a validation request, `None` otherwise.
pub fn consent_response<B>(req: &hyper::Request<B>) -> Option<hyper::Response<Full<Bytes>>> {
    if req.method() != hyper::Method::OPTIONS {
        return None;
    }
    let origin = req.headers().get("WebHook-Request-Origin")?.clone();
    let mut resp = hyper::Response::new(Full::new(Bytes::new()));
    resp.headers_mut().insert("WebHook-Allowed-Origin", origin);
    Some(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves the consenting answer on `l` (every request, every connection).
    fn consenting(l: tokio::net::TcpListener) {
        tokio::spawn(async move {
            while let Ok((stream, _)) = l.accept().await {
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        |req: hyper::Request<hyper::body::Incoming>| async move {
                            let yes = consent_response(&req)
                                .unwrap_or_else(|| hyper::Response::new(Full::new(Bytes::new())));
                            Ok::<_, std::convert::Infallible>(yes)
                        },
                    );
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                });
            }
        });
    }

    #[tokio::test]
    async fn a_receiver_that_could_not_be_reached_is_asked_again_and_a_refusal_is_kept() {
        let tls = webhook_tls(None).expect("tls");
        let client = webhook_client(true, tls);
        let consents = Consents::default();
        // a port nothing listens on: the receiver is down
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        drop(l);
        let url = format!("http://{addr}/hook");
        let down = consents.check(&client, &url).await;
        assert!(down.is_err(), "nothing answers yet");
        assert!(
            !lock(&consents.answers).contains_key(&url),
            "no answer is not remembered as a refusal"
        );
        // it comes back: asked again, it consents
        let l = tokio::net::TcpListener::bind(addr).await.expect("rebind");
        consenting(l);
        assert_eq!(consents.check(&client, &url).await, Ok(()));

        // a receiver that answers without consent is refused, and remembered as such
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let refusing = format!("http://{}/hook", l.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((stream, _)) = l.accept().await {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::new())))
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            }
        });
        assert!(consents.check(&client, &refusing).await.is_err());
        assert!(lock(&consents.answers).contains_key(&refusing));
    }
}
