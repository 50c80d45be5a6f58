//! Client-side helpers behind the `dissem` CLI's API commands (`put`, `subscribe`,
//! `unsubscribe`, `subscriptions`, `stats`): argument forms to API messages and back to text.

use proto::v1;
use tonic::metadata::{Ascii, MetadataValue};

use runtime::error::ServiceError;

/// Adds the caller's bearer token (if any) to every call.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Bearer(..)"
        } else {
            "Bearer(none)"
        })
    }
}

impl Bearer {
    /// `token` as an `authorization: Bearer` header (`None`: no header).
    pub fn new(token: Option<&str>) -> Result<Bearer, ServiceError> {
        token
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {}", t.trim()))
                    .map_err(|_| ServiceError::invalid("--token", "not a valid header value"))
            })
            .transpose()
            .map(Bearer)
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A connection whose calls carry the caller's token.
pub type Channel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>;

/// Connects to a node (e.g. `http://127.0.0.1:7700`, or `https://` verified against `ca`,
/// else the bundled web roots), presenting `token` if given.
pub async fn connect(
    url: &str,
    token: Option<&str>,
    ca: Option<&std::path::Path>,
) -> Result<Channel, ServiceError> {
    let bearer = Bearer::new(token)?;
    let mut endpoint = tonic::transport::Channel::from_shared(url.to_string())
        .map_err(|e| ServiceError::invalid("--node-url", e.to_string()))?;
    if url.starts_with("https://") {
        let ca = ca.map(runtime::tls::ca).transpose()?;
        endpoint = endpoint
            .tls_config(runtime::tls::client(ca, None))
            .map_err(|e| ServiceError::invalid("--node-url", e.to_string()))?;
    }
    let ch = endpoint
        .connect()
        .await
        .map_err(|e| ServiceError::Unavailable(format!("cannot reach {url}: {e}")))?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        ch, bearer,
    ))
}

/// Parses `name=value` metadata: numbers (exact decimals) unless quoted or not numeric.
pub fn parse_attribute(arg: &str) -> Result<v1::Attribute, ServiceError> {
    let (name, value) = arg
        .split_once('=')
        .ok_or_else(|| ServiceError::invalid("--attr", format!("{arg:?} is not name=value")))?;
    let kind = if let Some(q) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        v1::value::Kind::Text(q.to_string())
    } else if blocks::Num::parse(value).is_ok() {
        v1::value::Kind::Decimal(value.to_string())
    } else {
        v1::value::Kind::Text(value.to_string())
    };
    Ok(v1::Attribute {
        name: name.to_string(),
        value: Some(v1::Value { kind: Some(kind) }),
    })
}

/// Puts one object; returns "node:seq".
pub async fn put(
    ch: Channel,
    data: Vec<u8>,
    attrs: &[String],
    priority: u32,
) -> Result<String, ServiceError> {
    let metadata = attrs
        .iter()
        .map(|a| parse_attribute(a))
        .collect::<Result<Vec<_>, _>>()?;
    let r = v1::ingest_client::IngestClient::new(ch)
        .put(v1::PutRequest {
            data,
            metadata,
            priority,
            message_id: String::new(),
        })
        .await
        .map_err(ServiceError::from)?
        .into_inner();
    let id = r.id.unwrap_or_default();
    Ok(format!("{}:{}", id.node, id.seq))
}

/// A subscription target from `grpc:URL`, `webhook:URL` or `stream:NAME`.
pub fn parse_target(arg: &str) -> Result<v1::Target, ServiceError> {
    let (kind, rest) = arg.split_once(':').ok_or_else(|| {
        ServiceError::invalid("--target", "expected grpc:URL, webhook:URL or stream:NAME")
    })?;
    let kind = match kind {
        "grpc" => v1::target::Kind::Grpc(rest.to_string()),
        "webhook" => v1::target::Kind::Webhook(rest.to_string()),
        "stream" => v1::target::Kind::Stream(rest.to_string()),
        other => {
            return Err(ServiceError::invalid(
                "--target",
                format!("unknown target kind {other:?}: expected grpc, webhook or stream"),
            ));
        }
    };
    Ok(v1::Target { kind: Some(kind) })
}

/// Registers a subscription (text filter, or EventBridge JSON when it starts with `{`);
/// returns its id.
pub async fn subscribe(
    ch: Channel,
    filter: &str,
    target: &str,
    qos: u32,
    priority: u32,
) -> Result<u64, ServiceError> {
    let filter = if filter.trim_start().starts_with('{') {
        v1::subscription::Filter::Eventbridge(filter.to_string())
    } else {
        v1::subscription::Filter::Text(filter.to_string())
    };
    let qos = match qos {
        0 => v1::Qos::AtMostOnce,
        1 => v1::Qos::AtLeastOnce,
        2 => v1::Qos::ExactlyOnce,
        q => {
            return Err(ServiceError::invalid(
                "--qos",
                format!("{q} is not 0, 1 or 2"),
            ));
        }
    };
    let s = v1::subscriptions_client::SubscriptionsClient::new(ch)
        .create(v1::CreateSubscriptionRequest {
            subscription: Some(v1::Subscription {
                filter: Some(filter),
                target: Some(parse_target(target)?),
                qos: qos as i32,
                priority,
                ..v1::Subscription::default()
            }),
        })
        .await
        .map_err(ServiceError::from)?
        .into_inner();
    Ok(s.id)
}

/// Deletes a subscription.
pub async fn unsubscribe(ch: Channel, id: u64) -> Result<(), ServiceError> {
    v1::subscriptions_client::SubscriptionsClient::new(ch)
        .delete(v1::DeleteSubscriptionRequest { id })
        .await
        .map_err(ServiceError::from)?;
    Ok(())
}

/// Every subscription, one line each: `id  filter  -> target`.
pub async fn subscriptions(ch: Channel) -> Result<Vec<String>, ServiceError> {
    let mut client = v1::subscriptions_client::SubscriptionsClient::new(ch);
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = client
            .list(v1::ListSubscriptionsRequest {
                after_id: after,
                limit: 1000,
            })
            .await
            .map_err(ServiceError::from)?
            .into_inner();
        for s in page.subscriptions {
            let filter = match s.filter {
                Some(v1::subscription::Filter::Text(t)) => t,
                Some(v1::subscription::Filter::Eventbridge(j)) => j,
                None => String::new(),
            };
            let target = match s.target.and_then(|t| t.kind) {
                Some(v1::target::Kind::Grpc(u)) => format!("grpc:{u}"),
                Some(v1::target::Kind::Webhook(u)) => format!("webhook:{u}"),
                Some(v1::target::Kind::Stream(n)) => format!("stream:{n}"),
                None => "-".into(),
            };
            out.push(format!("{}\t{filter}\t-> {target}", s.id));
        }
        if page.next_after_id == 0 {
            return Ok(out);
        }
        after = page.next_after_id;
    }
}

/// The node's counters as `name value` lines.
pub async fn stats(ch: Channel) -> Result<Vec<String>, ServiceError> {
    let s = v1::admin_client::AdminClient::new(ch)
        .stats(v1::StatsRequest {})
        .await
        .map_err(ServiceError::from)?
        .into_inner();
    let mut lines = vec![
        format!("role {}", s.role),
        format!("node {}", s.node),
        format!("subscriptions {}", s.subscriptions),
    ];
    if s.role != "coordinator" {
        lines.extend([
            format!("objects_stored {}", s.objects_stored),
            format!("puts_accepted {}", s.puts_accepted),
            format!("puts_rejected {}", s.puts_rejected),
            format!("outbox_pending {}", s.outbox_pending),
            format!("matches_handed {}", s.matches_handed),
            format!("matches_repeated {}", s.matches_repeated),
            format!("deliveries {}", s.deliveries),
            format!("deliveries_acked {}", s.deliveries_acked),
            format!("delivery_failures {}", s.delivery_failures),
            format!("dead_lettered {}", s.dead_lettered),
            format!("deliveries_queued {}", s.deliveries_queued),
        ]);
    }
    if let Some(c) = s.cluster {
        lines.extend([
            format!("nonce {:016x}", c.nonce),
            format!("image_version {}", c.image_version),
            format!("image_subscriptions {}", c.image_subscriptions),
            format!("nodes {}", c.nodes),
            format!("waiting_tasks {}", c.waiting_tasks),
            format!("open_batches {}", c.open_batches),
            format!("mean_test_ms {:.2}", c.mean_test_ms),
            format!("mean_match_ms {:.2}", c.mean_match_ms),
            format!("reassignments {}", c.reassignments),
            format!("dead_workers {}", c.dead_workers),
            format!("objects_arrived {}", c.objects_arrived),
            format!("objects_matched {}", c.objects_matched),
            format!("objects_in_flight {}", c.objects_in_flight),
            format!("messages {}", c.messages),
            format!("loads {}", c.loads),
            format!("match_latency_p50_ms {:.1}", c.match_latency_p50_ms),
            format!("match_latency_p99_ms {:.1}", c.match_latency_p99_ms),
        ]);
        let mut w: Vec<_> = c.workers.into_iter().collect();
        w.sort();
        for (k, n) in w {
            lines.push(format!("workers {k} {n}"));
        }
    }
    Ok(lines)
}

/// The workers a node hosts, or (asked of the coordinator) every worker of the cluster.
pub async fn workers(ch: Channel) -> Result<Vec<String>, ServiceError> {
    let w = v1::admin_client::AdminClient::new(ch)
        .workers(v1::WorkersRequest {})
        .await
        .map_err(ServiceError::from)?
        .into_inner();
    Ok(w.workers
        .into_iter()
        .map(|w| format!("{} node {} {} {}", w.id, w.node, w.state, w.block))
        .collect())
}

/// A node's dead letters, one line each: subscription, object, when, why.
pub async fn dead_letters(ch: Channel, limit: u32) -> Result<Vec<String>, ServiceError> {
    let r = v1::admin_client::AdminClient::new(ch)
        .dead_letters(v1::DeadLettersRequest { limit })
        .await
        .map_err(ServiceError::from)?
        .into_inner();
    if r.dead_letters.is_empty() {
        return Ok(vec!["no dead letters".into()]);
    }
    Ok(r.dead_letters
        .into_iter()
        .map(|d| {
            let o = d.object_id.unwrap_or_default();
            format!(
                "subscription {} object {}:{} at {} {}",
                d.subscription_id,
                o.node,
                o.seq,
                crate::deliver::rfc3339(d.at_unix_ms),
                d.reason
            )
        })
        .collect())
}

/// Redrives every dead letter of a node.
pub async fn redrive_all(ch: Channel) -> Result<Vec<String>, ServiceError> {
    let r = v1::admin_client::AdminClient::new(ch)
        .redrive(v1::RedriveRequest {
            dead_letters: Vec::new(),
            all: true,
        })
        .await
        .map_err(ServiceError::from)?
        .into_inner();
    Ok(vec![format!("redriven {}", r.redriven)])
}
