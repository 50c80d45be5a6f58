//! The CloudEvents 1.0 form of a delivery (structured JSON, one event or a batch), the RFC 3339
//! times and base64 data it carries, and the HMAC-SHA256 signature of a webhook body.

use super::*;

/// The content types of one event and of a batch of events.
pub(super) const CLOUDEVENT: &str = "application/cloudevents+json; charset=utf-8";

pub(super) const CLOUDEVENT_BATCH: &str = "application/cloudevents-batch+json; charset=utf-8";

/// Formats unix ms as RFC 3339 UTC (CloudEvents `time`).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // civil from days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        ms % 1000
    )
}

pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The CloudEvents 1.0 structured-mode JSON body of a webhook delivery.
pub fn cloudevent(d: &v1::Delivery, node: u32, received_unix_ms: u64) -> Vec<u8> {
    event_json(
        &EventParts::new(&d.metadata, &d.data, received_unix_ms),
        d,
        node,
    )
}

/// An object's metadata as a JSON object: numbers as JSON numbers, text as strings.
pub fn metadata_json(metadata: &[v1::Attribute]) -> serde_json::Map<String, serde_json::Value> {
    let mut meta = serde_json::Map::new();
    for a in metadata {
        let v = match a.value.as_ref().and_then(|v| v.kind.as_ref()) {
            Some(v1::value::Kind::Text(s)) => serde_json::Value::String(s.clone()),
            Some(v1::value::Kind::Decimal(s)) => serde_json::from_str::<serde_json::Number>(s)
                .map(serde_json::Value::Number)
                .unwrap_or_else(|_| serde_json::Value::String(s.clone())),
            Some(v1::value::Kind::Integer(i)) => serde_json::Value::from(*i),
            Some(v1::value::Kind::Number(f)) => serde_json::Value::from(*f),
            None => serde_json::Value::Null,
        };
        meta.insert(a.name.clone(), v);
    }
    meta
}

/// The parts of an object's CloudEvent that every delivery of it shares (JSON text), built
/// once per object.
#[derive(Debug)]
pub(super) struct EventParts {
    /// The attributes as a JSON object.
    pub(super) metadata: String,
    /// The bytes in base64 (no quotes), when they travel.
    pub(super) data_base64: Option<String>,
    /// RFC 3339.
    pub(super) time: String,
    /// `,"traceparent":..,"tracestate":..` when the object carries a W3C trace context
    /// (the CloudEvents distributed-tracing extension), else empty.
    pub(super) trace: String,
    /// The same context as HTTP headers (`traceparent`, and `tracestate` when it has one),
    /// for a POST that carries this one event.
    pub(super) trace_headers: Vec<(&'static str, String)>,
}

/// The longest `tracestate` carried (W3C Trace Context's limit).
const MAX_TRACESTATE: usize = 512;

/// An object's W3C trace context: its `traceparent` text attribute when well formed, and its
/// `tracestate` when that is at most [`MAX_TRACESTATE`] bytes of printable ASCII.
fn trace_context(metadata: &[v1::Attribute]) -> Vec<(&'static str, String)> {
    let text = |name: &str| {
        metadata.iter().find(|a| a.name == name).and_then(|a| {
            match a.value.as_ref()?.kind.as_ref()? {
                v1::value::Kind::Text(t) => Some(t.as_str()),
                _ => None,
            }
        })
    };
    let Some(tp) = text("traceparent").filter(|t| crate::trace::is_traceparent(t)) else {
        return Vec::new();
    };
    let mut out = vec![("traceparent", tp.to_string())];
    if let Some(ts) = text("tracestate").filter(|t| {
        !t.is_empty() && t.len() <= MAX_TRACESTATE && t.bytes().all(|b| (b' '..=b'~').contains(&b))
    }) {
        out.push(("tracestate", ts.to_string()));
    }
    out
}

/// The trace context as the CloudEvents extension's attributes (`,"traceparent":..`).
fn trace_fragment(context: &[(&'static str, String)]) -> String {
    let mut out = String::new();
    for (name, value) in context {
        out.push_str(&format!(
            ",\"{name}\":{}",
            serde_json::Value::String(value.clone())
        ));
    }
    out
}

impl EventParts {
    pub(super) fn new(
        metadata: &[v1::Attribute],
        data: &[u8],
        received_unix_ms: u64,
    ) -> EventParts {
        let meta = metadata_json(metadata);
        let context = trace_context(metadata);
        EventParts {
            metadata: serde_json::to_string(&meta).unwrap_or_else(|_| "{}".into()),
            data_base64: (!data.is_empty()).then(|| base64(data)),
            time: rfc3339(received_unix_ms),
            trace: trace_fragment(&context),
            trace_headers: context,
        }
    }
}

/// One delivery's CloudEvent from its object's shared parts: the JSON that serde_json
/// writes for the event (keys in order), without building it as a value per delivery.
pub(super) fn event_json(p: &EventParts, d: &v1::Delivery, node: u32) -> Vec<u8> {
    use std::fmt::Write;
    let obj = d.object_id.unwrap_or_default();
    let mut s = String::with_capacity(
        320 + p.metadata.len() + p.data_base64.as_ref().map_or(0, String::len),
    );
    let _ = write!(s, r#"{{"data":{{"attempt":{},"#, d.attempt);
    if let Some(b) = &p.data_base64 {
        let _ = write!(s, r#""data_base64":"{b}","#);
    }
    let _ = write!(
        s,
        r#""metadata":{},"object":{{"node":{},"seq":{}}},"priority":{},"subscription":{}}},"datacontenttype":"application/json","id":{}{},"source":"dissem://node/{node}","specversion":"1.0","subject":"{}:{}","time":"{}"{},"type":"dissem.object.matched"}}"#,
        p.metadata,
        obj.node,
        obj.seq,
        d.priority,
        d.subscription_id,
        serde_json::Value::String(d.delivery_id.clone()),
        // the extension attribute, only when true (CloudEvents extensions may be absent)
        if d.redelivered {
            r#","redelivered":true"#
        } else {
            ""
        },
        obj.node,
        obj.seq,
        p.time,
        p.trace
    );
    s.into_bytes()
}

/// The signature header value of a webhook body: `sha256=<hex>` of
/// HMAC-SHA256(secret, "<timestamp>.<body>").
pub fn sign(secret: &str, timestamp: u64, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = match Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(), // HMAC accepts any key length
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let out = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(7 + 64);
    hex.push_str("sha256=");
    for b in out {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// The header carrying the signature, and the one carrying its timestamp (unix seconds;
/// receivers reject old ones to stop replays).
pub const SIGNATURE_HEADER: &str = "x-dissem-signature";

pub const TIMESTAMP_HEADER: &str = "x-dissem-timestamp";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cloudevents_from_shared_parts_are_what_serde_json_writes() {
        let attr = |name: &str, kind| v1::Attribute {
            name: name.into(),
            value: Some(v1::Value { kind: Some(kind) }),
        };
        let mut d = v1::Delivery {
            delivery_id: "7-1-42".into(),
            subscription_id: 7,
            object_id: Some(v1::ObjectId { node: 1, seq: 42 }),
            metadata: vec![
                attr("temp", v1::value::Kind::Decimal("21.50".into())),
                attr("room", v1::value::Kind::Text("a \"quoted\" name".into())),
                attr("count", v1::value::Kind::Integer(-3)),
                attr("ratio", v1::value::Kind::Number(0.25)),
            ],
            data: b"hello".to_vec(),
            priority: 5,
            attempt: 2,
            redelivered: false,
        };
        // the event as serde_json builds it, field by field
        let reference = |d: &v1::Delivery| {
            let mut meta = serde_json::Map::new();
            let exact: serde_json::Number = serde_json::from_str("21.50").expect("decimal");
            meta.insert("temp".into(), serde_json::Value::Number(exact));
            meta.insert("room".into(), serde_json::json!("a \"quoted\" name"));
            meta.insert("count".into(), serde_json::json!(-3));
            meta.insert("ratio".into(), serde_json::json!(0.25));
            let mut data = serde_json::json!({
                "subscription": 7,
                "object": {"node": 1, "seq": 42},
                "metadata": meta,
                "priority": 5,
                "attempt": 2,
            });
            if !d.data.is_empty() {
                data["data_base64"] = serde_json::Value::String(base64(&d.data));
            }
            let mut event = serde_json::json!({
                "specversion": "1.0",
                "id": "7-1-42",
                "source": "dissem://node/1",
                "type": "dissem.object.matched",
                "subject": "1:42",
                "time": rfc3339(1_700_000_000_123),
                "datacontenttype": "application/json",
                "data": data,
            });
            if d.redelivered {
                event["redelivered"] = serde_json::Value::Bool(true);
            }
            serde_json::to_vec(&event).expect("json")
        };
        let got = cloudevent(&d, 1, 1_700_000_000_123);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&reference(&d))
        );
        d.data.clear();
        assert_eq!(cloudevent(&d, 1, 1_700_000_000_123), reference(&d));
        // a delivery that may have reached the subscriber before says so (an extension
        // attribute)
        d.redelivered = true;
        let got = cloudevent(&d, 1, 1_700_000_000_123);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&reference(&d))
        );
    }

    /// A put's W3C trace context travels into its CloudEvents as the distributed-tracing
    /// extension's attributes; a malformed traceparent is left out.
    #[test]
    fn a_trace_context_in_the_metadata_becomes_the_events_traceparent() {
        let text = |name: &str, t: &str| v1::Attribute {
            name: name.into(),
            value: Some(v1::Value {
                kind: Some(v1::value::Kind::Text(t.into())),
            }),
        };
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut d = v1::Delivery {
            delivery_id: "7-1-42".into(),
            subscription_id: 7,
            object_id: Some(v1::ObjectId { node: 1, seq: 42 }),
            metadata: vec![
                text("traceparent", tp),
                text("tracestate", "congo=t61rcWkgMzE"),
            ],
            ..Default::default()
        };
        let ev: serde_json::Value =
            serde_json::from_slice(&cloudevent(&d, 1, 0)).expect("valid JSON");
        assert_eq!(ev["traceparent"], tp);
        assert_eq!(ev["tracestate"], "congo=t61rcWkgMzE");
        assert_eq!(
            ev["data"]["metadata"]["traceparent"], tp,
            "still in the metadata"
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "not a trace",
        ] {
            d.metadata = vec![text("traceparent", bad)];
            let ev: serde_json::Value =
                serde_json::from_slice(&cloudevent(&d, 1, 0)).expect("valid JSON");
            assert!(ev.get("traceparent").is_none(), "{bad}: {ev}");
        }
    }

    #[test]
    fn signatures_and_times_are_as_documented() {
        // HMAC-SHA256 over "<ts>.<body>" (expected value from Python's hmac module)
        let sig = sign("Jefe", 1, b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=a9049465ce89cfb8e9aac62333abda66f80e3403f51f57f6bae3c3a4485eca38"
        );
        assert_ne!(sig, sign("Jefe", 2, b"what do ya want for nothing?"));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert_eq!(base64(b"hi!"), "aGkh");
    }
}
