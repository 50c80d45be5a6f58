//! OpenTelemetry spans of a traced object's way through the cluster, exported as OTLP/HTTP
//! JSON when a node is given `--otlp-endpoint` (nothing is recorded otherwise).
//!
//! An object is traced when its put carries a W3C `traceparent` attribute whose sampled flag
//! is set. Its origin node (where its delivery records live) records four kinds of span, all
//! in the put's trace:
//! - `dissem.put` (server): from the put's arrival to its durable acknowledgement; a child of
//!   the traceparent's span;
//! - `dissem.test` (internal): from the acknowledgement until the object's match task starts:
//!   its attribute tests on the test workers, and the scheduling around them;
//! - `dissem.match` (internal): the match task, on the match worker's clock;
//! - `dissem.push` (producer): one per delivery attempt, with the subscription, target kind,
//!   attempt and outcome.
//!
//! The last three are children of `dissem.put`. Span ids are derived from the trace, the
//! object and the step, so every step names its parent without any state kept per object.
//! Spans wait in a bounded queue ([`QUEUE`]; past it they are dropped and counted) and go out
//! in batches of at most [`BATCH`], at least every second; a batch the collector refuses is
//! dropped (counted), never retried, so a dead collector costs the node nothing but the
//! queue.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use proto::v1;
use runtime::error::ServiceError;
use tokio::sync::mpsc;

/// Spans waiting for export at most.
pub const QUEUE: usize = 8192;
/// Spans in one export at most.
pub const BATCH: usize = 512;

/// A traced object's context: its trace and the span its put was made in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits: the caller's span (the put span's parent).
    pub parent_id: String,
}

/// Whether `s` is a W3C `traceparent`: `vv-<32 hex>-<16 hex>-<2 hex>`, lowercase, version
/// not `ff`, neither id all zeros.
pub fn is_traceparent(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let hex = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
        && parts[1].bytes().any(|b| b != b'0')
        && parts[2].bytes().any(|b| b != b'0')
}

impl TraceContext {
    /// The context of a `traceparent` value, when well formed and sampled.
    pub fn parse(traceparent: &str) -> Option<TraceContext> {
        let parts: Vec<&str> = traceparent.split('-').collect();
        let sampled = is_traceparent(traceparent)
            && u8::from_str_radix(parts[3], 16).is_ok_and(|f| f & 1 == 1);
        sampled.then(|| TraceContext {
            trace_id: parts[1].to_string(),
            parent_id: parts[2].to_string(),
        })
    }

    /// The context of an object's metadata (its `traceparent` text attribute).
    pub fn of_attributes(metadata: &[v1::Attribute]) -> Option<TraceContext> {
        let a = metadata.iter().find(|a| a.name == "traceparent")?;
        match a.value.as_ref()?.kind.as_ref()? {
            v1::value::Kind::Text(t) => TraceContext::parse(t),
            _ => None,
        }
    }

    /// The context of stored metadata.
    pub fn of_values(metadata: &[(String, blocks::Value)]) -> Option<TraceContext> {
        metadata.iter().find_map(|(k, v)| match v {
            blocks::Value::Str(t) if k == "traceparent" => TraceContext::parse(t),
            _ => None,
        })
    }

    /// The id of one step's span: derived from the trace, the object and the step.
    pub fn span_id(&self, step: &str, object: (u32, u64), extra: u64) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&self.trace_id, step, object, extra).hash(&mut h);
        let id = h.finish().max(1); // an all-zero span id is invalid
        format!("{id:016x}")
    }

    /// The id of the object's `dissem.put` span, the parent of its later steps.
    pub fn put_span(&self, object: (u32, u64)) -> String {
        self.span_id("put", object, 0)
    }
}

/// An attribute value of a span.
#[derive(Debug, Clone)]
pub enum AttrValue {
    Str(String),
    Int(i64),
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent_id: String,
    pub name: &'static str,
    /// OTLP's span kind: 1 internal, 2 server, 4 producer.
    pub kind: u8,
    pub start_unix_us: u64,
    pub end_unix_us: u64,
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// Why the step failed (status ERROR), or `None` (status OK).
    pub error: Option<String>,
}

impl Span {
    /// A step of `object` in `ctx`'s trace, a child of the object's put span.
    pub fn step(
        ctx: &TraceContext,
        name: &'static str,
        kind: u8,
        object: (u32, u64),
        extra: u64,
        (start_unix_us, end_unix_us): (u64, u64),
    ) -> Span {
        Span {
            trace_id: ctx.trace_id.clone(),
            span_id: ctx.span_id(name, object, extra),
            parent_id: ctx.put_span(object),
            name,
            kind,
            start_unix_us,
            end_unix_us: end_unix_us.max(start_unix_us),
            attributes: vec![(
                "dissem.object",
                AttrValue::Str(format!("{}:{}", object.0, object.1)),
            )],
            error: None,
        }
    }

    fn json(&self) -> serde_json::Value {
        let attrs: Vec<serde_json::Value> = self
            .attributes
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    AttrValue::Str(s) => serde_json::json!({"stringValue": s}),
                    // OTLP's JSON carries 64-bit integers as strings
                    AttrValue::Int(i) => serde_json::json!({"intValue": i.to_string()}),
                };
                serde_json::json!({"key": k, "value": value})
            })
            .collect();
        let status = match &self.error {
            None => serde_json::json!({"code": 1}),
            Some(m) => serde_json::json!({"code": 2, "message": m}),
        };
        serde_json::json!({
            "traceId": self.trace_id,
            "spanId": self.span_id,
            "parentSpanId": self.parent_id,
            "name": self.name,
            "kind": self.kind,
            "startTimeUnixNano": (self.start_unix_us * 1000).to_string(),
            "endTimeUnixNano": (self.end_unix_us * 1000).to_string(),
            "attributes": attrs,
            "status": status,
        })
    }
}

/// An OTLP/HTTP export request of `spans` from node `node`.
pub fn export_body(node: u32, spans: &[Span]) -> Vec<u8> {
    let spans: Vec<serde_json::Value> = spans.iter().map(Span::json).collect();
    serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "dissem"}},
            {"key": "service.version", "value": {"stringValue": env!("CARGO_PKG_VERSION")}},
            {"key": "dissem.node", "value": {"intValue": node.to_string()}},
        ]},
        "scopeSpans": [{"scope": {"name": "dissem", "version": env!("CARGO_PKG_VERSION")},
                        "spans": spans}],
    }]})
    .to_string()
    .into_bytes()
}

/// Exported, dropped (queue full) and failed (collector refused or unreachable) spans.
#[derive(Debug, Default)]
pub struct TraceCounters {
    pub exported: AtomicU64,
    pub dropped: AtomicU64,
    pub failed: AtomicU64,
}

/// Where a node's spans go (cheap to clone).
#[derive(Debug, Clone)]
pub struct Tracer {
    tx: mpsc::Sender<Span>,
    counters: Arc<TraceCounters>,
}

impl Tracer {
    /// A tracer exporting to the OTLP/HTTP collector at `endpoint` (its base URL, to which
    /// `/v1/traces` is added unless it ends so already). Spawns the exporter on the current
    /// runtime.
    pub fn start(endpoint: &str, node: u32) -> Result<Tracer, ServiceError> {
        let base = endpoint.trim_end_matches('/');
        let url = if base.ends_with("/v1/traces") {
            base.to_string()
        } else {
            format!("{base}/v1/traces")
        };
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| ServiceError::invalid("--otlp-endpoint", format!("{url}: {e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(ServiceError::invalid(
                "--otlp-endpoint",
                format!("{url}: expected an http:// or https:// URL"),
            ));
        }
        // the collector is the operator's own: a private address is what it usually has
        let client = crate::push_http::webhook_client(true, crate::push_http::webhook_tls(None)?);
        let (tx, rx) = mpsc::channel(QUEUE);
        let counters = Arc::new(TraceCounters::default());
        tokio::spawn(export(rx, client, uri, node, counters.clone()));
        Ok(Tracer { tx, counters })
    }

    /// Queues a finished span (dropped, and counted, when the queue is full).
    pub fn record(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn counters(&self) -> &TraceCounters {
        &self.counters
    }
}

async fn export(
    mut rx: mpsc::Receiver<Span>,
    client: crate::push_http::WebhookClient,
    uri: hyper::Uri,
    node: u32,
    counters: Arc<TraceCounters>,
) {
    let mut batch: Vec<Span> = Vec::with_capacity(BATCH);
    loop {
        // the first span of a batch waits as long as it takes; the rest at most a second
        match rx.recv().await {
            Some(s) => batch.push(s),
            None => return,
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(s)) => batch.push(s),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let body = export_body(node, &batch);
        batch.clear();
        let req = hyper::Request::post(uri.clone())
            .header("content-type", "application/json")
            .header("user-agent", concat!("dissem/", env!("CARGO_PKG_VERSION")))
            .body(Full::new(Bytes::from(body)));
        let sent = match req {
            Ok(req) => {
                match tokio::time::timeout(Duration::from_secs(10), client.request(req)).await {
                    Ok(Ok(resp)) if resp.status().is_success() => Ok(()),
                    Ok(Ok(resp)) => Err(format!("the collector answered {}", resp.status())),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("no answer within 10 s".to_string()),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        match sent {
            Ok(()) => counters.exported.fetch_add(n, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!("exporting {n} spans to {uri}: {e} (dropped)");
                counters.failed.fetch_add(n, Ordering::Relaxed)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_sampled_contexts_are_traced() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = TraceContext::parse(tp).expect("sampled");
        assert_eq!(c.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.parent_id, "00f067aa0ba902b7");
        assert!(
            TraceContext::parse(&tp.replace("-01", "-00")).is_none(),
            "not sampled"
        );
        assert!(
            TraceContext::parse(&tp.replace("4bf9", "4BF9")).is_none(),
            "upper case"
        );
        assert!(
            TraceContext::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01")
                .is_none()
        );
        assert!(TraceContext::parse("garbage").is_none());
        // ids are stable, distinct per step and never zero
        let o = (1, 7);
        assert_eq!(c.put_span(o), c.put_span(o));
        assert_ne!(c.span_id("test", o, 0), c.span_id("match", o, 0));
        assert_ne!(c.span_id("push", o, 1), c.span_id("push", o, 2));
        assert_eq!(c.put_span(o).len(), 16);
    }

    #[test]
    fn the_export_is_otlp_json() {
        let c = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("ctx");
        let mut s = Span::step(&c, "dissem.push", 4, (1, 7), 3, (10, 25));
        s.attributes.push(("dissem.attempt", AttrValue::Int(2)));
        s.error = Some("refused".into());
        let v: serde_json::Value = serde_json::from_slice(&export_body(1, &[s])).expect("JSON");
        let span = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span["parentSpanId"], c.put_span((1, 7)));
        assert_eq!(span["startTimeUnixNano"], "10000");
        assert_eq!(span["endTimeUnixNano"], "25000");
        assert_eq!(span["kind"], 4);
        assert_eq!(span["status"]["code"], 2);
        assert_eq!(span["attributes"][1]["value"]["intValue"], "2");
        assert_eq!(
            v["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "dissem"
        );
    }
}
