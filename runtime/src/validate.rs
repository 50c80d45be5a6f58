//! Turns API messages into domain values, checking every limit; errors name the field
//! (`metadata[2].name`, `subscription.filter`, ...) and the rule broken. Nothing is stored
//! for a request that fails here.

use blocks::{Dnf, Num, Value};
use proto::v1;
use storage::NewObject;

use crate::config::Limits;
use crate::error::ServiceError;

/// Whether an attribute name is allowed: 1.. bytes of letters, digits, `_ . - / :`,
/// starting with a letter or `_`.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':'))
}

pub fn value(v: Option<&v1::Value>, field: &str, limits: &Limits) -> Result<Value, ServiceError> {
    use v1::value::Kind;
    let kind = v
        .and_then(|v| v.kind.as_ref())
        .ok_or_else(|| ServiceError::invalid(field, "a value is required"))?;
    Ok(match kind {
        Kind::Decimal(s) => {
            Value::Num(Num::parse(s).map_err(|e| ServiceError::invalid(field, e.to_string()))?)
        }
        Kind::Number(f) => {
            Value::Num(Num::from_f64(*f).map_err(|e| ServiceError::invalid(field, e.to_string()))?)
        }
        Kind::Integer(i) => Value::Num(Num::from(*i)),
        Kind::Text(s) => {
            if s.len() > limits.max_string_bytes {
                return Err(ServiceError::invalid(
                    field,
                    format!(
                        "string of {} bytes exceeds the limit of {}",
                        s.len(),
                        limits.max_string_bytes
                    ),
                ));
            }
            Value::Str(s.clone())
        }
    })
}

/// Validates metadata: count, names (charset, length, uniqueness), values.
pub fn metadata(
    attrs: &[v1::Attribute],
    limits: &Limits,
) -> Result<Vec<(String, Value)>, ServiceError> {
    if attrs.len() > limits.max_attributes {
        return Err(ServiceError::invalid(
            "metadata",
            format!(
                "{} attributes exceed the limit of {}",
                attrs.len(),
                limits.max_attributes
            ),
        ));
    }
    let mut out: Vec<(String, Value)> = Vec::with_capacity(attrs.len());
    for (i, a) in attrs.iter().enumerate() {
        let field = format!("metadata[{i}].name");
        if a.name.is_empty() {
            return Err(ServiceError::invalid(
                field,
                "attribute names cannot be empty",
            ));
        }
        if a.name.len() > limits.max_name_bytes {
            return Err(ServiceError::invalid(
                field,
                format!(
                    "name of {} bytes exceeds the limit of {}",
                    a.name.len(),
                    limits.max_name_bytes
                ),
            ));
        }
        if !valid_name(&a.name) {
            return Err(ServiceError::invalid(
                field,
                format!(
                    "{:?}: names start with a letter or `_` and use letters, digits and `_ . - / :`",
                    a.name
                ),
            ));
        }
        if out.iter().any(|(n, _)| *n == a.name) {
            return Err(ServiceError::invalid(
                field,
                format!("duplicate attribute name {:?}", a.name),
            ));
        }
        let v = value(a.value.as_ref(), &format!("metadata[{i}].value"), limits)?;
        out.push((a.name.clone(), v));
    }
    Ok(out)
}

fn priority(p: u32) -> Result<u8, ServiceError> {
    u8::try_from(p)
        .ok()
        .filter(|p| *p <= 7)
        .ok_or_else(|| ServiceError::invalid("priority", format!("{p} is not in 0..=7")))
}

fn message_id(m: &str, limits: &Limits) -> Result<String, ServiceError> {
    if m.len() > limits.max_message_id_bytes {
        return Err(ServiceError::invalid(
            "message_id",
            format!(
                "{} bytes exceed the limit of {}",
                m.len(),
                limits.max_message_id_bytes
            ),
        ));
    }
    if let Some(p) = RESERVED_MESSAGE_ID_PREFIXES
        .iter()
        .find(|p| m.starts_with(**p))
    {
        return Err(ServiceError::invalid(
            "message_id",
            format!("the prefix {p:?} is reserved for objects from peer clusters"),
        ));
    }
    Ok(m.to_string())
}

/// Message ids of objects from peer clusters (federation) start with these; a writer's may
/// not, so no writer can take an id a peer's object will be stored under.
pub const RESERVED_MESSAGE_ID_PREFIXES: [&str; 2] = ["fed:", "spill:"];

/// A put request.
pub fn put(r: v1::PutRequest, limits: &Limits) -> Result<NewObject, ServiceError> {
    if r.data.len() > limits.max_object_bytes {
        return Err(ServiceError::invalid(
            "data",
            format!(
                "object of {} bytes exceeds the limit of {}",
                r.data.len(),
                limits.max_object_bytes
            ),
        ));
    }
    Ok(NewObject {
        metadata: metadata(&r.metadata, limits)?,
        priority: priority(r.priority)?,
        message_id: message_id(&r.message_id, limits)?,
        data: r.data,
        external_id: String::new(),
    })
}

/// An announce request.
pub fn announce(r: v1::AnnounceRequest, limits: &Limits) -> Result<NewObject, ServiceError> {
    if r.external_id.is_empty() {
        return Err(ServiceError::invalid(
            "external_id",
            "required for an announced object",
        ));
    }
    if r.external_id.len() > limits.max_external_id_bytes {
        return Err(ServiceError::invalid(
            "external_id",
            format!(
                "{} bytes exceed the limit of {}",
                r.external_id.len(),
                limits.max_external_id_bytes
            ),
        ));
    }
    Ok(NewObject {
        metadata: metadata(&r.metadata, limits)?,
        priority: priority(r.priority)?,
        message_id: message_id(&r.message_id, limits)?,
        data: Vec::new(),
        external_id: r.external_id,
    })
}

/// A subscription's filter, parsed into conjunctions.
pub fn filter(s: &v1::Subscription, limits: &Limits) -> Result<Dnf, ServiceError> {
    use v1::subscription::Filter;
    let f = s.filter.as_ref().ok_or_else(|| {
        ServiceError::invalid(
            "subscription.filter",
            "a text or eventbridge filter is required",
        )
    })?;
    let text = match f {
        Filter::Text(t) | Filter::Eventbridge(t) => t,
    };
    if text.len() > limits.max_filter_bytes {
        return Err(ServiceError::invalid(
            "subscription.filter",
            format!(
                "{} bytes exceed the limit of {}",
                text.len(),
                limits.max_filter_bytes
            ),
        ));
    }
    match f {
        Filter::Text(t) => blocks::text::parse_text(t)
            .map_err(|e| ServiceError::invalid("subscription.filter.text", e.to_string())),
        Filter::Eventbridge(j) => blocks::eventbridge::parse_pattern(j)
            .map_err(|e| ServiceError::invalid("subscription.filter.eventbridge", e.to_string())),
    }
}

/// Longest target URL, bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// Longest stream name, bytes (subscriptions and `Stream.Open` alike).
pub const MAX_STREAM_NAME_BYTES: usize = 256;
/// Longest webhook secret, bytes.
pub const MAX_SECRET_BYTES: usize = 1024;

/// A stream name as a subscription targets it and a subscriber attaches to it.
pub fn stream_name(field: &str, name: &str) -> Result<(), ServiceError> {
    if name.is_empty() || name.len() > MAX_STREAM_NAME_BYTES {
        return Err(ServiceError::invalid(
            field,
            format!(
                "a stream name of 1..={MAX_STREAM_NAME_BYTES} bytes is required, got {} bytes",
                name.len()
            ),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(ServiceError::invalid(
            field,
            "stream names cannot hold control characters",
        ));
    }
    Ok(())
}

/// A URL target: a host, bounded length; `http://` or, for webhooks, `https://` (gRPC
/// subscribers are reached over plain HTTP/2 only, so an `https://` one could never be
/// reached).
fn url_target(field: &str, u: &str, https: bool) -> Result<(), ServiceError> {
    if u.len() > MAX_URL_BYTES {
        return Err(ServiceError::invalid(
            field,
            format!(
                "URL of {} bytes exceeds the limit of {MAX_URL_BYTES}",
                u.len()
            ),
        ));
    }
    if u.starts_with("https://") && !https {
        return Err(ServiceError::invalid(
            field,
            "https gRPC targets are not supported yet (plain http:// only; webhooks may be https)",
        ));
    }
    if !(u.starts_with("http://") || (https && u.starts_with("https://"))) {
        return Err(ServiceError::invalid(
            field,
            format!("{} is not an http(s):// URL", blocks::quote::quoted(u)),
        ));
    }
    let uri: hyper::Uri = u.parse().map_err(|e| {
        ServiceError::invalid(
            field,
            format!("{} is not a URL: {e}", blocks::quote::quoted(u)),
        )
    })?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(ServiceError::invalid(field, "the URL has no host"));
    }
    Ok(())
}

/// Every attribute a filter names must be one a `Put` could carry (same charset and length),
/// or the subscription could never match.
fn filter_names(dnf: &Dnf, field: &str, limits: &Limits) -> Result<(), ServiceError> {
    for p in dnf.0.iter().flat_map(|c| c.0.iter()) {
        if p.attr.len() > limits.max_name_bytes {
            return Err(ServiceError::invalid(
                field,
                format!(
                    "attribute name of {} bytes exceeds the limit of {} that puts allow",
                    p.attr.len(),
                    limits.max_name_bytes
                ),
            ));
        }
        if !valid_name(&p.attr) {
            return Err(ServiceError::invalid(
                field,
                format!(
                    "attribute name {} can never be put (letters, digits, `_ . - / :`, \
                     starting with a letter or `_`)",
                    blocks::quote::quoted(&p.attr)
                ),
            ));
        }
    }
    Ok(())
}

/// The delivery guarantee of a subscription: an unset level is at least once (QoS 1), the
/// one default of the API and the CLI.
pub fn qos(s: &v1::Subscription) -> v1::Qos {
    match v1::Qos::try_from(s.qos) {
        Ok(v1::Qos::Unspecified) | Err(_) => v1::Qos::AtLeastOnce,
        Ok(q) => q,
    }
}

/// The MQTT-style number of a level: 0 at most once, 1 at least once, 2 exactly once.
pub fn qos_number(q: v1::Qos) -> u8 {
    match q {
        v1::Qos::AtMostOnce => 0,
        v1::Qos::Unspecified | v1::Qos::AtLeastOnce => 1,
        v1::Qos::ExactlyOnce => 2,
    }
}

/// The rest of a subscription: target, QoS, priority, retry policy, secret, and the names
/// its filter uses.
/// The longest subscription name.
pub const MAX_SUBSCRIPTION_NAME: usize = 128;

/// Whether `name` is a usable subscription name: empty (none), or at most
/// [`MAX_SUBSCRIPTION_NAME`] letters, digits, `_ . - /`.
pub fn subscription_name_ok(name: &str) -> bool {
    name.len() <= MAX_SUBSCRIPTION_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/'))
}

pub fn subscription(s: &v1::Subscription, limits: &Limits) -> Result<Dnf, ServiceError> {
    let dnf = filter(s, limits)?;
    let filter_field = match s.filter {
        Some(v1::subscription::Filter::Eventbridge(_)) => "subscription.filter.eventbridge",
        _ => "subscription.filter.text",
    };
    filter_names(&dnf, filter_field, limits)?;
    use v1::target::Kind;
    match s.target.as_ref().and_then(|t| t.kind.as_ref()) {
        None => {
            return Err(ServiceError::invalid(
                "subscription.target",
                "a grpc, webhook or stream target is required",
            ));
        }
        Some(Kind::Grpc(u)) => url_target("subscription.target.grpc", u, false)?,
        Some(Kind::Webhook(u)) => url_target("subscription.target.webhook", u, true)?,
        Some(Kind::Stream(n)) => stream_name("subscription.target.stream", n)?,
    }
    if !subscription_name_ok(&s.name) {
        return Err(ServiceError::invalid(
            "subscription.name",
            format!("at most {MAX_SUBSCRIPTION_NAME} letters, digits, `_ . - /`"),
        ));
    }
    if v1::Qos::try_from(s.qos).is_err() {
        return Err(ServiceError::invalid(
            "subscription.qos",
            format!(
                "{} is not a QoS level (0 unset: at least once, 1 at least once, 2 exactly \
                 once, 3 at most once)",
                s.qos
            ),
        ));
    }
    // exactly once is the gRPC release handshake; a webhook or stream has no second
    // acknowledgement, so QoS 2 there would silently be QoS 1
    if s.qos == v1::Qos::ExactlyOnce as i32
        && !matches!(
            s.target.as_ref().and_then(|t| t.kind.as_ref()),
            Some(Kind::Grpc(_))
        )
    {
        return Err(ServiceError::invalid(
            "subscription.qos",
            "QoS 2 (exactly once) needs a grpc target (its Release handshake); webhooks and \
             streams deliver at least once: use QoS 1",
        ));
    }
    webhook_options(s)?;
    if s.priority > 7 {
        return Err(ServiceError::invalid(
            "subscription.priority",
            format!("{} is not in 0..=7", s.priority),
        ));
    }
    if s.webhook_secret.len() > MAX_SECRET_BYTES {
        return Err(ServiceError::invalid(
            "subscription.webhook_secret",
            format!(
                "{} bytes exceed the limit of {MAX_SECRET_BYTES}",
                s.webhook_secret.len()
            ),
        ));
    }
    if let Some(r) = &s.retry
        && r.max_backoff_ms > 0
        && r.initial_backoff_ms > r.max_backoff_ms
    {
        return Err(ServiceError::invalid(
            "subscription.retry.initial_backoff_ms",
            "must not exceed max_backoff_ms",
        ));
    }
    Ok(dnf)
}

/// The address rule for a subscription's URL target, checked when it is created or updated:
/// a target that resolves to a loopback, private or link-local address is refused unless
/// the node allows private targets (delivery would refuse it on every attempt).
pub async fn target_address(s: &v1::Subscription, limits: &Limits) -> Result<(), ServiceError> {
    use v1::target::Kind;
    let (field, url) = match s.target.as_ref().and_then(|t| t.kind.as_ref()) {
        Some(Kind::Grpc(u)) => ("subscription.target.grpc", u),
        Some(Kind::Webhook(u)) => ("subscription.target.webhook", u),
        _ => return Ok(()),
    };
    crate::target_guard::check_target(url, limits.allow_private_targets)
        .await
        .map_err(|e| ServiceError::invalid(field, e))
}

/// A metadata value as sent on the wire (numbers as exact decimal text).
pub fn value_to_proto(v: &Value) -> v1::Value {
    v1::Value {
        kind: Some(match v {
            Value::Num(n) => v1::value::Kind::Decimal(n.to_string()),
            Value::Str(s) => v1::value::Kind::Text(s.clone()),
        }),
    }
}

/// The filter of subscription `id`'s stored record.
pub fn stored_filter(id: u64, record: &[u8], limits: &Limits) -> Result<blocks::Dnf, ServiceError> {
    use prost::Message;
    let s = v1::Subscription::decode(record).map_err(|e| {
        ServiceError::Startup(format!("stored subscription {id} does not decode: {e}"))
    })?;
    filter(&s, limits)
}

/// Every stored subscription's filter, in id order (at start: the registry, the index).
pub fn stored_subscriptions(
    store: &storage::Store,
    limits: &Limits,
) -> Result<Vec<(u64, blocks::Dnf)>, ServiceError> {
    let mut subs = Vec::new();
    let mut after = 0;
    loop {
        let page = store.list_subscriptions(after, 1000)?;
        let Some(last) = page.last().map(|p| p.0) else {
            break;
        };
        for (id, bytes) in page {
            subs.push((id, stored_filter(id, &bytes, limits)?));
        }
        after = last;
    }
    Ok(subs)
}

/// Metadata as sent on the wire.
pub fn attributes_to_proto(metadata: &[(String, Value)]) -> Vec<v1::Attribute> {
    metadata
        .iter()
        .map(|(n, v)| v1::Attribute {
            name: n.clone(),
            value: Some(value_to_proto(v)),
        })
        .collect()
}

/// Most extra webhook headers a subscription may carry, and the longest value.
const MAX_WEBHOOK_HEADERS: usize = 16;
const MAX_HEADER_VALUE: usize = 1024;
/// The largest `push_batch` a subscription may ask for (the node caps it at its own).
const MAX_PUSH_BATCH: u32 = 1000;

/// Headers the node sets itself, or that would change how the request is framed.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "user-agent",
    "traceparent",
    "tracestate",
    "webhook-request-origin",
];

/// `push_batch` and `webhook_headers`: only for webhook targets, bounded, and headers that
/// cannot smuggle a second request or override what the node signs and frames.
fn webhook_options(s: &v1::Subscription) -> Result<(), ServiceError> {
    let webhook = matches!(
        s.target.as_ref().and_then(|t| t.kind.as_ref()),
        Some(v1::target::Kind::Webhook(_))
    );
    if s.push_batch > MAX_PUSH_BATCH {
        return Err(ServiceError::invalid(
            "subscription.push_batch",
            format!("{} exceeds {MAX_PUSH_BATCH}", s.push_batch),
        ));
    }
    if s.push_batch > 1 && !webhook {
        return Err(ServiceError::invalid(
            "subscription.push_batch",
            "batches are for webhook targets (gRPC subscribers take DeliverBatch on their own)",
        ));
    }
    if s.webhook_headers.is_empty() {
        return Ok(());
    }
    if !webhook {
        return Err(ServiceError::invalid(
            "subscription.webhook_headers",
            "headers are for webhook targets",
        ));
    }
    if s.webhook_headers.len() > MAX_WEBHOOK_HEADERS {
        return Err(ServiceError::invalid(
            "subscription.webhook_headers",
            format!(
                "{} headers exceed the limit of {MAX_WEBHOOK_HEADERS}",
                s.webhook_headers.len()
            ),
        ));
    }
    for (name, value) in &s.webhook_headers {
        let field = "subscription.webhook_headers";
        let token = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(ServiceError::invalid(
                field,
                format!("{:?} is not an HTTP header name", blocks::quote::clip(name)),
            ));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str())
            || lower.starts_with("ce-")
            || lower.starts_with("x-dissem-")
        {
            return Err(ServiceError::invalid(
                field,
                format!("{name} is set by the node and cannot be overridden"),
            ));
        }
        if value.len() > MAX_HEADER_VALUE
            || value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return Err(ServiceError::invalid(
                field,
                format!(
                    "the value of {name} must be printable text of at most {MAX_HEADER_VALUE} bytes"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    /// QoS 2 is the gRPC release handshake: on a webhook or stream target it is refused at
    /// Create instead of quietly delivering at least once.
    #[test]
    fn exactly_once_needs_a_grpc_target() {
        let sub = |kind: v1::target::Kind, qos: v1::Qos| v1::Subscription {
            filter: Some(v1::subscription::Filter::Text("a = 1".into())),
            target: Some(v1::Target { kind: Some(kind) }),
            qos: qos as i32,
            ..v1::Subscription::default()
        };
        let limits = Limits::default();
        for kind in [
            v1::target::Kind::Webhook("https://example.com/hook".into()),
            v1::target::Kind::Stream("s".into()),
        ] {
            let e = subscription(&sub(kind.clone(), v1::Qos::ExactlyOnce), &limits)
                .expect_err("QoS 2 refused");
            let m = e.to_string();
            assert!(m.starts_with("subscription.qos: QoS 2"), "{m}");
            assert!(subscription(&sub(kind, v1::Qos::AtLeastOnce), &limits).is_ok());
        }
        let grpc = v1::target::Kind::Grpc("http://example.com:7000".into());
        assert!(subscription(&sub(grpc, v1::Qos::ExactlyOnce), &limits).is_ok());
    }

    /// A subscription's name is bounded and plain; a writer's message id may not take the
    /// prefixes objects from peer clusters are stored under.
    #[test]
    fn names_and_reserved_message_ids_are_checked() {
        let limits = Limits::default();
        let named = |name: &str| v1::Subscription {
            filter: Some(v1::subscription::Filter::Text("a = 1".into())),
            target: Some(v1::Target {
                kind: Some(v1::target::Kind::Stream("s".into())),
            }),
            name: name.into(),
            ..v1::Subscription::default()
        };
        assert!(subscription(&named("orders/eu-1.v2"), &limits).is_ok());
        assert!(subscription(&named(""), &limits).is_ok());
        for bad in ["a b", "ü", &"x".repeat(MAX_SUBSCRIPTION_NAME + 1)] {
            let e = subscription(&named(bad), &limits).expect_err("refused");
            assert!(e.to_string().starts_with("subscription.name"), "{e}");
        }
        for reserved in ["fed:eu:1", "spill:a:1:2"] {
            let r = v1::PutRequest {
                message_id: reserved.into(),
                ..Default::default()
            };
            let e = put(r, &limits).expect_err("reserved");
            assert!(e.to_string().contains("reserved"), "{e}");
        }
    }

    /// Deeply nested protobuf (unknown groups inside groups, nested messages of nested
    /// messages) is refused by the decoder's recursion limit, on a small stack.
    #[test]
    fn deeply_nested_protobuf_is_refused_on_a_small_stack() {
        let out = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(|| {
                // field 15, wire type 3 (start group), 100,000 times
                let groups = vec![0x7bu8; 100_000];
                let a = v1::PutRequest::decode(groups.as_slice()).is_err();
                let b = v1::Subscription::decode(groups.as_slice()).is_err();
                // metadata[0].value.kind ... nested length-delimited fields, each claiming the
                // rest of the buffer
                let mut nested = Vec::new();
                for _ in 0..10_000 {
                    let mut outer = vec![0x12u8]; // field 2 (metadata), length-delimited
                    let mut len = nested.len() as u64;
                    loop {
                        let byte = (len & 0x7f) as u8;
                        len >>= 7;
                        if len == 0 {
                            outer.push(byte);
                            break;
                        }
                        outer.push(byte | 0x80);
                    }
                    outer.extend_from_slice(&nested);
                    nested = outer;
                }
                let c = v1::PutRequest::decode(nested.as_slice()).is_err();
                (a, b, c)
            })
            .expect("spawn")
            .join()
            .expect("the decoder did not overflow its stack");
        assert_eq!(out, (true, true, true));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Garbage and truncated protobuf never panics the decode + validation path.
        #[test]
        fn decode_and_validate_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(req) = v1::PutRequest::decode(bytes.as_slice()) {
                let _ = put(req, &Limits::default());
            }
            if let Ok(req) = v1::AnnounceRequest::decode(bytes.as_slice()) {
                let _ = announce(req, &Limits::default());
            }
            if let Ok(s) = v1::Subscription::decode(bytes.as_slice()) {
                let _ = subscription(&s, &Limits::default());
            }
        }

        /// Truncations of a valid request are rejected by the decoder or validated, never panic.
        #[test]
        fn truncated_valid_requests(cut in 0usize..200, name in "[a-z_][a-z0-9_./:-]{0,10}", text in ".{0,20}", dec in "-?[0-9]{1,25}(\\.[0-9]{0,20})?") {
            let req = v1::PutRequest {
                data: b"payload".to_vec(),
                metadata: vec![
                    v1::Attribute { name: name.clone(), value: Some(v1::Value { kind: Some(v1::value::Kind::Text(text)) }) },
                    v1::Attribute { name: format!("{name}2"), value: Some(v1::Value { kind: Some(v1::value::Kind::Decimal(dec)) }) },
                ],
                priority: 1,
                message_id: "m".into(),
            };
            let bytes = req.encode_to_vec();
            let cut = cut.min(bytes.len());
            if let Ok(r) = v1::PutRequest::decode(&bytes[..cut]) {
                match put(r, &Limits::default()) {
                    Ok(_) => {}
                    Err(ServiceError::InvalidArgument { .. }) => {}
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                }
            }
        }
    }
}
