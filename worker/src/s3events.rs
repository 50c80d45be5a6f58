//! The S3 event-notification endpoint: an existing object store becomes a write path by
//! configuration alone. Amazon S3, MinIO and Ceph RGW POST their bucket notifications to a
//! webhook as JSON (`{"Records": [...]}`); each record becomes one `Ingest.Announce` of this
//! node, so the object is matched and delivered like any other.
//!
//! A record's attributes (all text but `s3.size`): `s3.event` (`ObjectCreated:Put`; MinIO's
//! and old Ceph's `s3:` prefix dropped), `s3.source` (`aws:s3`, `minio:s3`, `ceph:s3`),
//! `s3.region`, `s3.time`, `s3.bucket`, `s3.key` (URL-decoded for S3 and MinIO, which encode
//! it), `s3.size`, `s3.etag`, `s3.version_id`, `s3.content_type`, `s3.source_ip`, each user
//! metadata entry as `s3.meta.<name>` (only `x-amz-meta-*` entries: Ceph lists request
//! headers beside them; the prefix dropped, lowercased) and each Ceph tag as `s3.tag.<name>`; absent or empty fields are left out. The object's external id
//! is `s3://bucket/key`; its message id is derived from the record (source, bucket, key,
//! version, sequencer, event and time), so a notification the store sends twice is stored
//! once.
//!
//! The answer: 200 when every record is stored (JSON: each id, and whether the record was a
//! duplicate of one stored before), 400 when a record can never
//! be stored (naming it and the field; the others are stored), 429 or 503 when one may be
//! later (the store retries, and the records already stored are deduplicated). With an auth
//! file, the POST needs a token of the `ingest` role, presented wherever the store can put
//! it ([`presented_token`]): a bearer header (MinIO), Basic auth's password, or the URL's
//! path or query (Ceph, whose topics add no headers). With a certificate the listener
//! speaks only TLS. It is guarded as every HTTP listener is ([`runtime::http_serve`]); a
//! body is at most [`MAX_BODY`] bytes.

use std::net::SocketAddr;
use std::sync::Arc;

use proto::v1;
use proto::v1::ingest_server::Ingest;
use runtime::auth::{Auth, Role};
use runtime::http_serve::{Answer, HttpLimits, read_body};
use serde_json::Value as Json;

/// The largest notification body read.
pub const MAX_BODY: usize = 4 << 20;
/// The most records in one notification.
pub const MAX_RECORDS: usize = 1000;

/// A record that can never become an announce: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {why}")]
pub struct RecordError {
    pub path: String,
    pub why: String,
}

fn err<T>(path: &str, why: impl Into<String>) -> Result<T, RecordError> {
    Err(RecordError {
        path: path.to_string(),
        why: why.into(),
    })
}

/// The records of a notification body, each as an announce or why it cannot be one. `Err`
/// when the body as a whole is not a notification.
pub fn announces(
    body: &[u8],
) -> Result<Vec<Result<v1::AnnounceRequest, RecordError>>, RecordError> {
    let doc: Json =
        serde_json::from_slice(body).or_else(|e| err("body", format!("not JSON: {e}")))?;
    let Some(records) = doc.get("Records") else {
        return err("Records", "missing: not an S3 event notification");
    };
    let Json::Array(records) = records else {
        return err("Records", "expected an array of event records");
    };
    if records.len() > MAX_RECORDS {
        return err(
            "Records",
            format!(
                "{} records exceed the limit of {MAX_RECORDS}",
                records.len()
            ),
        );
    }
    Ok(records
        .iter()
        .enumerate()
        .map(|(i, r)| record(r, &format!("Records[{i}]")))
        .collect())
}

fn text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) if !s.is_empty() => Some(s.clone()),
        Json::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn field<'a>(v: &'a Json, path: &[&str]) -> Option<&'a Json> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

/// Decodes S3's form encoding of keys (`%XX`, `+` for a space); `None` for a broken escape
/// or bytes that are not UTF-8.
fn url_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// A user metadata or tag name as an attribute name's last part: lowercased, characters
/// attribute names do not take as `_`.
fn name_part(s: &str) -> String {
    s.to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn attr(name: String, kind: v1::value::Kind) -> v1::Attribute {
    v1::Attribute {
        name,
        value: Some(v1::Value { kind: Some(kind) }),
    }
}

fn record(r: &Json, path: &str) -> Result<v1::AnnounceRequest, RecordError> {
    if !r.is_object() {
        return err(path, "expected an event record object");
    }
    let source = field(r, &["eventSource"])
        .and_then(text)
        .unwrap_or_default();
    let event = field(r, &["eventName"])
        .and_then(text)
        .map(|e| e.strip_prefix("s3:").map(str::to_string).unwrap_or(e));
    let Some(event) = event else {
        return err(&format!("{path}.eventName"), "missing");
    };
    let Some(bucket) = field(r, &["s3", "bucket", "name"]).and_then(text) else {
        return err(&format!("{path}.s3.bucket.name"), "missing");
    };
    let Some(raw_key) = field(r, &["s3", "object", "key"]).and_then(text) else {
        return err(&format!("{path}.s3.object.key"), "missing");
    };
    // S3 and MinIO URL-encode the key; Ceph sends it as it is
    let key = if source.starts_with("ceph") {
        raw_key
    } else {
        match url_decode(&raw_key) {
            Some(k) => k,
            None => return err(&format!("{path}.s3.object.key"), "a broken URL encoding"),
        }
    };
    let mut attrs = vec![
        attr("s3.event".into(), v1::value::Kind::Text(event.clone())),
        attr("s3.bucket".into(), v1::value::Kind::Text(bucket.clone())),
        attr("s3.key".into(), v1::value::Kind::Text(key.clone())),
    ];
    let mut put_text = |name: &str, at: &[&str]| {
        if let Some(v) = field(r, at).and_then(text) {
            attrs.push(attr(name.into(), v1::value::Kind::Text(v)));
        }
    };
    put_text("s3.source", &["eventSource"]);
    put_text("s3.region", &["awsRegion"]);
    put_text("s3.time", &["eventTime"]);
    put_text("s3.etag", &["s3", "object", "eTag"]);
    put_text("s3.version_id", &["s3", "object", "versionId"]);
    put_text("s3.content_type", &["s3", "object", "contentType"]);
    put_text("s3.source_ip", &["requestParameters", "sourceIPAddress"]);
    // a number in S3 and MinIO, a string in Ceph
    match field(r, &["s3", "object", "size"]) {
        None | Some(Json::Null) => {}
        Some(v) => match text(v)
            .and_then(|t| t.parse::<i64>().ok())
            .filter(|n| *n >= 0)
        {
            Some(n) => attrs.push(attr("s3.size".into(), v1::value::Kind::Integer(n))),
            None => return err(&format!("{path}.s3.object.size"), "expected a byte count"),
        },
    }
    // MinIO: a map; Ceph: a list of {key, val}
    let mut extra = Vec::new();
    if let Some(Json::Object(m)) = field(r, &["s3", "object", "userMetadata"]) {
        for (k, v) in m {
            let lower = k.to_lowercase();
            if let (Some(name), Some(v)) = (lower.strip_prefix("x-amz-meta-"), text(v)) {
                extra.push((format!("s3.meta.{}", name_part(name)), v));
            }
        }
    }
    // Ceph lists the request's headers (`x-amz-date`, `x-amz-content-sha256`,
    // `x-amz-tagging`, ...) in `metadata` beside the user's: only `x-amz-meta-*` entries are
    // user metadata (before, the headers became `s3.meta.x-amz-date` and so on, and a user
    // key `x-amz-meta-x-amz-date` clashed with the header). Tags are the user's as they are.
    for (list, prefix, user_only) in [("metadata", "s3.meta.", true), ("tags", "s3.tag.", false)] {
        if let Some(Json::Array(items)) = field(r, &["s3", "object", list]) {
            for it in items {
                let (Some(k), Some(v)) = (
                    it.get("key").and_then(text),
                    it.get("val").or_else(|| it.get("value")).and_then(text),
                ) else {
                    continue;
                };
                let lower = k.to_lowercase();
                let name = match lower.strip_prefix("x-amz-meta-") {
                    Some(n) => n,
                    None if user_only => continue,
                    None => &lower,
                };
                extra.push((format!("{prefix}{}", name_part(name)), v));
            }
        }
    }
    extra.sort();
    extra.dedup_by(|a, b| a.0 == b.0);
    // `s3.meta.*` and `s3.tag.*` never clash with the fixed names
    attrs.extend(
        extra
            .into_iter()
            .map(|(n, v)| attr(n, v1::value::Kind::Text(v))),
    );
    // the record's identity, its parts separated by NULs
    let mut identity = Vec::new();
    for part in [
        source.as_str(),
        &bucket,
        &key,
        &field(r, &["s3", "object", "versionId"])
            .and_then(text)
            .unwrap_or_default(),
        &field(r, &["s3", "object", "sequencer"])
            .and_then(text)
            .unwrap_or_default(),
        &event,
        &field(r, &["eventTime"]).and_then(text).unwrap_or_default(),
        &field(r, &["s3", "object", "eTag"])
            .and_then(text)
            .unwrap_or_default(),
    ] {
        identity.extend_from_slice(part.as_bytes());
        identity.push(0);
    }
    let digest = runtime::auth::sha256_hex(&identity);
    Ok(v1::AnnounceRequest {
        external_id: format!("s3://{bucket}/{key}"),
        metadata: attrs,
        priority: 0,
        message_id: format!("s3:{digest}"),
    })
}

/// Announces each record of one notification through `node`, as `caller` from `peer` (whose
/// connection's rate limit and tenant's quota apply as to any put).
async fn handle(
    node: &crate::services::Node,
    caller: Arc<runtime::auth::Caller>,
    peer: SocketAddr,
    body: &[u8],
) -> Answer {
    let records = match announces(body) {
        Ok(r) => r,
        Err(e) => return (400, "text/plain", format!("{e}\n")),
    };
    let mut ids = Vec::new();
    let mut refused = Vec::new();
    let mut later: Option<(u16, String)> = None;
    for (i, r) in records.into_iter().enumerate() {
        let req = match r {
            Ok(req) => req,
            Err(e) => {
                refused.push(e.to_string());
                continue;
            }
        };
        let mut request = tonic::Request::new(req);
        request.extensions_mut().insert(caller.clone());
        request
            .extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some(peer),
            });
        match node.announce(request).await {
            Ok(resp) => {
                let resp = resp.into_inner();
                let id = resp.id.unwrap_or_default();
                ids.push(serde_json::json!({
                    "node": id.node,
                    "seq": id.seq,
                    "duplicate": resp.duplicate,
                }));
            }
            Err(s) => match s.code() {
                tonic::Code::InvalidArgument | tonic::Code::PermissionDenied => {
                    refused.push(format!("Records[{i}]: {}", s.message()))
                }
                tonic::Code::ResourceExhausted => {
                    later = Some((429, format!("Records[{i}]: {}", s.message())))
                }
                _ => later = later.or(Some((503, format!("Records[{i}]: {}", s.message())))),
            },
        }
    }
    let body = serde_json::json!({"announced": ids, "refused": refused}).to_string() + "\n";
    match (later, refused.is_empty()) {
        (Some((code, why)), _) => (code, "text/plain", format!("{why}\n")),
        (None, false) => (400, "application/json", body),
        (None, true) => (200, "application/json", body),
    }
}

/// The token a request presents, wherever an object store can put it: `authorization:
/// Bearer T` (MinIO's `auth_token`, a forwarder), `authorization: Basic` with T as the
/// password and any user name (an endpoint URL `https://any:T@host/`), the path
/// `/s3-events/T`, or the query `?token=T` (a Ceph topic's push endpoint, which can add no
/// header and sends no password over plain HTTP). `Err` for a malformed credential;
/// `Ok(None)` for none.
pub fn presented_token(
    headers: &http::HeaderMap,
    uri: &http::Uri,
) -> Result<Option<String>, &'static str> {
    use base64::Engine;
    if let Some(v) = headers.get(http::header::AUTHORIZATION) {
        let v = v
            .to_str()
            .map_err(|_| "the authorization header is not text")?;
        let (scheme, rest) = v.trim().split_once(' ').unwrap_or((v, ""));
        return match scheme.to_ascii_lowercase().as_str() {
            "bearer" => Ok(Some(rest.trim().to_string())),
            "basic" => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(rest.trim())
                    .map_err(|_| "authorization: Basic must be base64 of user:token")?;
                let text =
                    String::from_utf8(raw).map_err(|_| "authorization: Basic is not text")?;
                match text.split_once(':') {
                    Some((_, token)) => Ok(Some(token.to_string())),
                    None => Err("authorization: Basic must be base64 of user:token"),
                }
            }
            _ => Err("authorization must be `Bearer <token>` or `Basic <base64 of user:token>`"),
        };
    }
    if let Some(t) = uri.path().strip_prefix("/s3-events/")
        && !t.is_empty()
    {
        return Ok(Some(
            url_decode(t).ok_or("the token in the path is not URL-encoded text")?,
        ));
    }
    for pair in uri.query().unwrap_or_default().split('&') {
        if let Some(t) = pair.strip_prefix("token=") {
            return Ok(Some(
                url_decode(t).ok_or("the token in the query is not URL-encoded text")?,
            ));
        }
    }
    Ok(None)
}

/// Whether `path` is one the endpoint answers: `/`, `/s3-events`, `/s3-events/<token>`.
fn endpoint_path(path: &str) -> bool {
    matches!(path, "/" | "/s3-events")
        || path
            .strip_prefix("/s3-events/")
            .is_some_and(|t| !t.is_empty() && !t.contains('/'))
}

/// The caller of a request: anyone without an auth file, else the holder of the token it
/// presents ([`presented_token`]), who must have the `ingest` role. `Err` is the answer.
fn caller_of(
    auth: Option<&Auth>,
    headers: &http::HeaderMap,
    uri: &http::Uri,
) -> Result<Arc<runtime::auth::Caller>, Answer> {
    let Some(a) = auth else {
        return Ok(Arc::new(runtime::auth::Caller::open()));
    };
    let token = match presented_token(headers, uri) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Err((
                401,
                "text/plain",
                "a token of the ingest role is required: authorization: Bearer <token>, \
                 Basic auth with the token as the password, POST /s3-events/<token>, or \
                 ?token=<token>\n"
                    .into(),
            ));
        }
        Err(why) => return Err((401, "text/plain", format!("{why}\n"))),
    };
    match a.caller(&token) {
        Ok(c) if c.has(Role::Ingest) => Ok(c),
        Ok(c) => Err((
            403,
            "text/plain",
            format!("token {} lacks the ingest role\n", c.name),
        )),
        Err(s) => Err((401, "text/plain", format!("{}\n", s.message()))),
    }
}

/// Where the endpoint listens: the bound listener, and the TLS it speaks (`None`: plain
/// HTTP).
pub struct Endpoint {
    pub listener: tokio::net::TcpListener,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("listener", &self.listener)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Serves the endpoint (`POST /`, `POST /s3-events`, or `POST /s3-events/<token>`) on
/// `at` until the task is dropped.
pub async fn serve(at: Endpoint, node: crate::services::Node, auth: Option<Arc<Auth>>) {
    runtime::http_serve::serve(
        at.listener,
        HttpLimits::default(),
        at.tls,
        move |peer: SocketAddr, req: hyper::Request<hyper::body::Incoming>| {
            let node = node.clone();
            let auth = auth.clone();
            async move {
                if !endpoint_path(req.uri().path()) {
                    return (
                        404,
                        "text/plain",
                        "not found: POST to /, /s3-events or /s3-events/<token>\n".into(),
                    );
                }
                if req.method() != hyper::Method::POST {
                    return (405, "text/plain", "POST an S3 event notification\n".into());
                }
                let caller = match caller_of(auth.as_deref(), req.headers(), req.uri()) {
                    Ok(c) => c,
                    Err(a) => return a,
                };
                match read_body(req.into_body(), MAX_BODY).await {
                    Ok(body) => handle(&node, caller, peer, &body).await,
                    Err(a) => a,
                }
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests;
