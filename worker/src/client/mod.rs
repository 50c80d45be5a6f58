//! Client-side helpers behind the `dissem` CLI's API commands (`put`, `subscribe`, `get`,
//! `unsubscribe`, `subscriptions`, `stats`, ...): the connection with its token, argument
//! forms to API messages, and each call's answer as text lines and as JSON ([`Printed`],
//! rendered by `render`).

pub mod bulk;
mod render;

pub use render::{Printed, subscription_json, subscription_lines};

use proto::v1;

use runtime::error::ServiceError;

pub use dissem_client::{Bearer, Channel, Client};

/// A client error as the CLI reports it: the client's argument names become the CLI's flags.
pub fn cli_error(e: dissem_client::ClientError) -> ServiceError {
    match e {
        dissem_client::ClientError::Invalid { field, reason } => {
            let flag = match field.as_str() {
                "url" => "--node-url",
                "token" => "--token",
                "tls_ca" => "--tls-ca",
                other => other,
            };
            ServiceError::invalid(flag, reason)
        }
        dissem_client::ClientError::Unreachable { url, reason } => {
            ServiceError::Unavailable(format!("cannot reach {url}: {reason}"))
        }
        dissem_client::ClientError::Refused(s) => ServiceError::from(s),
    }
}

/// Connects to a node (e.g. `http://127.0.0.1:7700`, or `https://` verified against `ca`,
/// else the bundled web roots), presenting `token` if given.
pub async fn connect(
    url: &str,
    token: Option<&str>,
    ca: Option<&std::path::Path>,
) -> Result<Client, ServiceError> {
    Client::connect(url, token, ca).await.map_err(cli_error)
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

/// What `dissem put` stores: the bytes, the metadata arguments, the priority and an
/// optional message id (a repeat of the id within the dedup window is acknowledged once).
#[derive(Debug, Clone, Default)]
pub struct PutSpec {
    pub data: Vec<u8>,
    pub attrs: Vec<String>,
    pub priority: u32,
    pub message_id: Option<String>,
}

/// Puts one object; prints its id `node:seq`.
pub async fn put(c: Client, spec: PutSpec) -> Result<Printed, ServiceError> {
    let metadata = spec
        .attrs
        .iter()
        .map(|a| parse_attribute(a))
        .collect::<Result<Vec<_>, _>>()?;
    let r = c
        .put(v1::PutRequest {
            data: spec.data,
            metadata,
            priority: spec.priority,
            message_id: spec.message_id.unwrap_or_default(),
        })
        .await
        .map_err(cli_error)?;
    let id = r.id.unwrap_or_default();
    Ok(Printed::new(
        vec![format!("{}:{}", id.node, id.seq)],
        serde_json::json!({"id": format!("{}:{}", id.node, id.seq), "node": id.node, "seq": id.seq}),
    ))
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

/// A filter argument as the API's filter: EventBridge JSON when it starts with `{`, else
/// the text syntax.
pub fn filter_of(arg: &str) -> v1::subscription::Filter {
    if arg.trim_start().starts_with('{') {
        v1::subscription::Filter::Eventbridge(arg.to_string())
    } else {
        v1::subscription::Filter::Text(arg.to_string())
    }
}

/// A `--qos` argument: 0 at most once, 1 at least once, 2 exactly once.
pub fn parse_qos(qos: u32) -> Result<v1::Qos, ServiceError> {
    match qos {
        0 => Ok(v1::Qos::AtMostOnce),
        1 => Ok(v1::Qos::AtLeastOnce),
        2 => Ok(v1::Qos::ExactlyOnce),
        q => Err(ServiceError::invalid(
            "--qos",
            format!("{q} is not 0, 1 or 2"),
        )),
    }
}

/// What `dissem subscribe` registers.
#[derive(Debug, Clone, Default)]
pub struct SubscribeSpec {
    /// Text filter, or EventBridge JSON starting with `{`.
    pub filter: String,
    /// `grpc:URL`, `webhook:URL` or `stream:NAME`.
    pub target: String,
    /// Unset: the server's default (at least once).
    pub qos: Option<u32>,
    pub priority: u32,
    /// The webhook signing secret (write-only).
    pub secret: Option<String>,
    /// Attempts before dead-lettering.
    pub max_attempts: Option<u32>,
    /// Give up after this many milliseconds.
    pub ttl_ms: Option<u64>,
    /// Webhook deliveries per POST (a CloudEvents batch); unset: one event per POST.
    pub push_batch: Option<u32>,
    /// Extra webhook request headers, `Name: value` (write-only).
    pub headers: Vec<String>,
    /// The name spillover links deliver dead letters to in a peer cluster.
    pub name: Option<String>,
    /// Deliveries in the order the node took their objects, one call at a time.
    pub ordered: bool,
}

/// A `--header 'Name: value'` argument.
pub fn parse_header(arg: &str) -> Result<(String, String), ServiceError> {
    let (name, value) = arg.split_once(':').ok_or_else(|| {
        ServiceError::invalid("--header", format!("{arg:?} is not `Name: value`"))
    })?;
    Ok((name.trim().to_string(), value.trim().to_string()))
}

impl SubscribeSpec {
    /// The subscription to create.
    pub fn to_subscription(&self) -> Result<v1::Subscription, ServiceError> {
        let retry =
            (self.max_attempts.is_some() || self.ttl_ms.is_some()).then(|| v1::RetryPolicy {
                max_attempts: self.max_attempts.unwrap_or(0),
                ttl_ms: self.ttl_ms.unwrap_or(0),
                ..v1::RetryPolicy::default()
            });
        Ok(v1::Subscription {
            filter: Some(filter_of(&self.filter)),
            target: Some(parse_target(&self.target)?),
            qos: self
                .qos
                .map(parse_qos)
                .transpose()?
                .unwrap_or(v1::Qos::Unspecified) as i32,
            priority: self.priority,
            webhook_secret: self.secret.clone().unwrap_or_default(),
            retry,
            push_batch: self.push_batch.unwrap_or(0),
            webhook_headers: self
                .headers
                .iter()
                .map(|h| parse_header(h))
                .collect::<Result<_, _>>()?,
            name: self.name.clone().unwrap_or_default(),
            ordered: self.ordered,
            ..v1::Subscription::default()
        })
    }
}

/// Creates a subscription; returns it as stored (without its write-only parts).
pub async fn create(c: Client, s: v1::Subscription) -> Result<v1::Subscription, ServiceError> {
    c.subscribe(s).await.map_err(cli_error)
}

/// Registers a subscription; returns it as stored.
pub async fn subscribe(c: Client, spec: &SubscribeSpec) -> Result<v1::Subscription, ServiceError> {
    create(c, spec.to_subscription()?).await
}

/// One subscription.
pub async fn get(c: Client, id: u64) -> Result<v1::Subscription, ServiceError> {
    c.subscription(id).await.map_err(cli_error)
}

/// Deletes a subscription.
pub async fn unsubscribe(c: Client, id: u64) -> Result<Printed, ServiceError> {
    c.unsubscribe(id).await.map_err(cli_error)?;
    Ok(Printed::new(
        vec![format!("deleted {id}")],
        serde_json::json!({ "deleted": id }),
    ))
}

/// Every subscription the caller may see.
pub async fn list_subscriptions(c: Client) -> Result<Vec<v1::Subscription>, ServiceError> {
    c.subscriptions().await.map_err(cli_error)
}

/// Every subscription, one line each: `id  filter  -> target`.
pub async fn subscriptions(c: Client) -> Result<Printed, ServiceError> {
    let subs = list_subscriptions(c).await?;
    Ok(render::subscription_list(&subs))
}

/// The node's counters.
pub async fn stats(c: Client) -> Result<Printed, ServiceError> {
    let s = c.stats().await.map_err(cli_error)?;
    Ok(render::stats(&s))
}

/// The workers a node hosts, or (asked of the coordinator) every worker of the cluster.
pub async fn workers(c: Client) -> Result<Printed, ServiceError> {
    let w = c.workers().await.map_err(cli_error)?;
    let lines = w
        .workers
        .iter()
        .map(|w| {
            let reserve = if w.urgent { " (urgent reserve)" } else { "" };
            format!("{} node {} {} {}{reserve}", w.id, w.node, w.state, w.block)
        })
        .collect();
    let json = w
        .workers
        .iter()
        .map(|w| {
            serde_json::json!({"id": w.id, "node": w.node, "state": w.state, "block": w.block,
                "urgent": w.urgent})
        })
        .collect();
    Ok(Printed::new(lines, serde_json::Value::Array(json)))
}

/// A node's dead letters, one line each: subscription, object, when, why.
pub async fn dead_letters(c: Client, limit: u32) -> Result<Printed, ServiceError> {
    let letters = c.dead_letters(limit).await.map_err(cli_error)?;
    let mut lines = Vec::new();
    let mut json = Vec::new();
    for d in &letters {
        let o = d.object_id.unwrap_or_default();
        let at = crate::deliver::rfc3339(d.at_unix_ms);
        lines.push(format!(
            "subscription {} object {}:{} at {at} {}",
            d.subscription_id, o.node, o.seq, d.reason
        ));
        json.push(serde_json::json!({
            "subscription": d.subscription_id,
            "object": format!("{}:{}", o.node, o.seq),
            "at": at,
            "reason": d.reason,
        }));
    }
    if lines.is_empty() {
        lines.push("no dead letters".into());
    }
    Ok(Printed::new(lines, serde_json::Value::Array(json)))
}

/// Redrives every dead letter of a node.
pub async fn redrive_all(c: Client) -> Result<Printed, ServiceError> {
    let redriven = c.redrive_all().await.map_err(cli_error)?;
    Ok(Printed::new(
        vec![format!("redriven {redriven}")],
        serde_json::json!({ "redriven": redriven }),
    ))
}

/// Drains a node (`dissem node drain`): asks it every half second, printing what it still
/// owes on stderr, until it owes nothing (and, with `exit`, stops answering: it exited);
/// `Unavailable` naming what is left when `timeout` passes first.
pub async fn drain(
    c: Client,
    timeout: std::time::Duration,
    exit: bool,
) -> Result<Printed, ServiceError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        match c.drain(exit).await {
            Ok(r) => {
                eprintln!(
                    "draining: outbox {}, open deliveries {}, queued {}, owed to links {}",
                    r.outbox_pending, r.deliveries_open, r.deliveries_queued, r.owed_to_links
                );
                if r.drained && !exit {
                    return Ok(render::drained(&r, false));
                }
                last = Some(r);
            }
            // the drained node exited: the call finds nobody
            Err(e) if exit && last.as_ref().is_some_and(|r| r.drained) => {
                let r = last.unwrap_or_default();
                tracing::debug!("the drained node stopped answering: {e}");
                return Ok(render::drained(&r, true));
            }
            Err(e) => return Err(cli_error(e)),
        }
        if tokio::time::Instant::now() >= deadline {
            let r = last.unwrap_or_default();
            return Err(ServiceError::Unavailable(format!(
                "not drained within {timeout:?}: outbox {}, open deliveries {}, queued {} \
                 (the node still refuses puts; run again to wait longer, or restart it: what \
                 it owes is on its disk)",
                r.outbox_pending, r.deliveries_open, r.deliveries_queued
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Resizes the grid (`dissem grid resize`): asks the leading coordinator every half second,
/// printing what the move waits for on stderr when it changes, until `to` is in force;
/// `Unavailable` naming what is left when `timeout` passes first (the move goes on: run
/// again to follow it).
pub async fn resize_grid(
    c: Client,
    to: runtime::grid::Grid,
    timeout: std::time::Duration,
) -> Result<Printed, ServiceError> {
    let started = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut said = Vec::new();
    loop {
        let r = c.resize_grid(to.rows, to.cols).await.map_err(cli_error)?;
        if r.done {
            let secs = started.elapsed().as_secs_f64();
            return Ok(Printed::new(
                vec![format!("the grid is {} ({secs:.1} s)", r.grid)],
                serde_json::json!({ "grid": r.grid, "seconds": secs }),
            ));
        }
        let now = std::iter::once(format!("moving {} -> {}", r.grid, r.moving_to))
            .chain(r.waiting.iter().map(|w| format!("  waiting for {w}")))
            .collect::<Vec<_>>();
        if now != said {
            eprintln!("{}", now.join("\n"));
            said = now;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ServiceError::Unavailable(format!(
                "{to} not in force within {timeout:?} (the move goes on; run again to follow \
                 it): {}",
                r.waiting.join("; ")
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// A node's federation links and its active-passive role (`dissem link list`).
pub async fn links(c: Client) -> Result<Printed, ServiceError> {
    let r = c.links().await.map_err(cli_error)?;
    Ok(render::links(&r))
}

/// Adds a link to a peer cluster (`dissem link add`).
pub async fn add_link(c: Client, r: v1::AddLinkRequest) -> Result<Printed, ServiceError> {
    let l = c.add_link(r).await.map_err(cli_error)?;
    Ok(Printed::new(
        vec![format!("link {} to {} added ({})", l.name, l.peer, l.mode)],
        serde_json::json!({ "name": l.name, "peer": l.peer, "mode": l.mode, "ttl_ms": l.ttl_ms }),
    ))
}

/// Removes a link added with `dissem link add` (`dissem link remove`).
pub async fn remove_link(c: Client, name: String) -> Result<Printed, ServiceError> {
    let dropped = c.remove_link(&name).await.map_err(cli_error)?;
    Ok(Printed::new(
        vec![format!(
            "link {name} removed; {dropped} entries it still owed were dropped"
        )],
        serde_json::json!({ "name": name, "dropped": dropped }),
    ))
}

/// Promotes a standby node (`dissem link promote`).
pub async fn promote(c: Client) -> Result<Printed, ServiceError> {
    let r = c.promote().await.map_err(cli_error)?;
    Ok(Printed::new(
        vec![format!(
            "active at epoch {}: {} standby copies disseminated, {} expired",
            r.epoch, r.disseminated, r.expired
        )],
        serde_json::json!({
            "epoch": r.epoch,
            "disseminated": r.disseminated,
            "expired": r.expired,
        }),
    ))
}
