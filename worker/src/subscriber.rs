//! The `dissem sub` loop: a subscriber on the command line. It attaches to a stream target,
//! creates a subscription that pushes to it, prints each delivery as one JSON line on stdout,
//! acknowledges it once printed, and deletes the subscription when it ends (Ctrl-C, SIGTERM,
//! `--count` reached, stdout closed) unless the stream is durable.
//!
//! The stream is attached before the subscription exists, so nothing matched after `Create`
//! answers (the subscription is in force for every later put) can miss the subscriber.

use proto::v1;

use crate::client::{Client, cli_error};
use runtime::error::ServiceError;

/// What `dissem sub` was asked for.
#[derive(Debug, Clone)]
pub struct SubOptions {
    /// The filter (text, or EventBridge JSON starting with `{`).
    pub filter: String,
    /// 0 at most once, 1 at least once (a stream has no exactly-once handshake).
    pub qos: u32,
    /// A durable stream name: the subscription outlives this process, and attaching again
    /// under the same name resumes it. `None`: a fresh stream, deleted at the end.
    pub durable: Option<String>,
    /// Exit after this many deliveries.
    pub count: Option<u64>,
}

/// How the loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubEnd {
    /// The subscription's id.
    pub subscription: u64,
    /// Deliveries printed.
    pub printed: u64,
    /// Whether the subscription was deleted (not durable; a run whose delete failed ends
    /// with an error naming the subscription instead).
    pub deleted: bool,
}

/// One delivery as the JSON line `dissem sub` prints: ids, subject, metadata, and the data
/// as text when it is UTF-8, else base64 (`data_base64`).
pub fn delivery_json(d: &v1::Delivery) -> String {
    serde_json::Value::Object(delivery_map(d)).to_string()
}

/// The fields of [`delivery_json`].
pub fn delivery_map(d: &v1::Delivery) -> serde_json::Map<String, serde_json::Value> {
    let o = d.object_id.unwrap_or_default();
    let mut m = serde_json::Map::new();
    m.insert("delivery_id".into(), d.delivery_id.clone().into());
    m.insert("subscription".into(), d.subscription_id.into());
    m.insert("subject".into(), format!("{}:{}", o.node, o.seq).into());
    m.insert("priority".into(), d.priority.into());
    m.insert("attempt".into(), d.attempt.into());
    if d.redelivered {
        // it may have been delivered before (a retry, or a resume after a crash)
        m.insert("redelivered".into(), true.into());
    }
    m.insert(
        "metadata".into(),
        serde_json::Value::Object(crate::deliver::metadata_json(&d.metadata)),
    );
    if !d.data.is_empty() {
        match std::str::from_utf8(&d.data) {
            Ok(t) => m.insert("data".into(), t.into()),
            Err(_) => m.insert("data_base64".into(), crate::deliver::base64(&d.data).into()),
        };
    }
    m
}

/// The stream of a `dissem sub` without `--durable`: unique per run.
fn fresh_stream() -> String {
    format!("sub-{:016x}", runtime::random_u64())
}

/// Runs the loop: `line` gets each JSON line (false: the reader went away, the loop ends),
/// `attached` is told once the subscription is in force. Ends on `stop` as well.
pub async fn run(
    c: Client,
    opts: &SubOptions,
    mut attached: impl FnMut(&str, u64),
    mut line: impl FnMut(&str) -> bool,
    stop: impl std::future::Future<Output = ()>,
) -> Result<SubEnd, ServiceError> {
    let qos = crate::client::parse_qos(opts.qos)?;
    if qos == v1::Qos::ExactlyOnce {
        return Err(ServiceError::invalid(
            "--qos",
            "a stream has no exactly-once handshake; `dissem sub` takes 0 or 1 (QoS 2 needs a \
             gRPC subscriber endpoint: `dissem subscribe --target grpc:URL --qos 2`)",
        ));
    }
    let stream = match &opts.durable {
        Some(name) => {
            runtime::validate::stream_name("--durable", name)?;
            name.clone()
        }
        None => fresh_stream(),
    };
    let mut session = c.attach(&stream).await.map_err(cli_error)?;
    // a create the node may have made without answering (it went away in between) leaves a
    // subscription nobody named: said, with how to find it
    let unanswered_create = |e: ServiceError| match e {
        // a lost connection: unreachable, or gRPC's "transport error" (Unknown)
        ServiceError::Unavailable(_)
        | ServiceError::Peer {
            code: tonic::Code::Unknown,
            ..
        } => ServiceError::Unavailable(format!(
            "creating the subscription: {e}; the node may have made it before it went away: \
             `dissem subscriptions` lists it on stream {stream:?}, `dissem unsubscribe ID` \
             deletes it"
        )),
        e => e,
    };
    let id = match durable_subscription(&c, &stream, opts).await? {
        Some(id) => id,
        None => {
            crate::client::create(
                c.clone(),
                v1::Subscription {
                    filter: Some(crate::client::filter_of(&opts.filter)),
                    target: Some(v1::Target {
                        kind: Some(v1::target::Kind::Stream(stream.clone())),
                    }),
                    qos: qos as i32,
                    ..v1::Subscription::default()
                },
            )
            .await
            .map_err(unanswered_create)?
            .id
        }
    };
    attached(&stream, id);
    let mut printed = 0u64;
    let result = {
        tokio::pin!(stop);
        loop {
            if opts.count.is_some_and(|c| printed >= c) {
                break Ok(());
            }
            let d = tokio::select! {
                _ = &mut stop => break Ok(()),
                d = session.next() => d,
            };
            match d {
                Some(Ok(d)) => {
                    if !line(&delivery_json(&d)) {
                        break Ok(()); // the reader went away: no ack, the node keeps it
                    }
                    printed += 1;
                    let _ = session.ack(&d.delivery_id).await;
                }
                Some(Err(e)) => break Err(cli_error(e)),
                None => {
                    break Err(ServiceError::Unavailable(
                        "the node closed the stream".into(),
                    ));
                }
            }
        }
    };
    // the subscription goes with the run, also when the stream failed
    let not_deleted = match &opts.durable {
        Some(_) => None,
        None => delete(&c, id).await.err(),
    };
    // acks sent, then the stream closes
    drop(session);
    let end = SubEnd {
        subscription: id,
        printed,
        deleted: opts.durable.is_none() && not_deleted.is_none(),
    };
    // before, the command said "deleted" whatever the delete answered, and the
    // subscription outlived it as an orphan (a delete cancelled by a node stopping)
    let orphan = |why: &str| {
        format!(
            "subscription {id} was NOT deleted ({why}): delete it with `dissem unsubscribe \
             {id}`"
        )
    };
    match (result, not_deleted) {
        (Err(e), None) if end.deleted => Err(ServiceError::Unavailable(format!(
            "{e}; subscription {id} deleted"
        ))),
        (Err(e), None) => Err(e),
        (Err(e), Some(why)) => Err(ServiceError::Unavailable(format!("{e}; {}", orphan(&why)))),
        (Ok(()), Some(why)) => Err(ServiceError::Unavailable(format!(
            "{} deliveries; {}",
            end.printed,
            orphan(&why)
        ))),
        (Ok(()), None) => Ok(end),
    }
}

/// How long the end of a run tries to delete its subscription.
const DELETE_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// Deletes subscription `id`, trying again for [`DELETE_FOR`] while the node is unavailable
/// (a node that is stopping, or one failing over); one already gone counts as deleted.
async fn delete(c: &Client, id: u64) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + DELETE_FOR;
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        match c.unsubscribe(id).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                let status = cli_error(e);
                let gone = matches!(status, ServiceError::NotFound(_))
                    || matches!(status, ServiceError::Peer { code, .. } if code == tonic::Code::NotFound);
                if gone {
                    return Ok(());
                }
                let again = matches!(status, ServiceError::Unavailable(_));
                if !again || tokio::time::Instant::now() + pause > deadline {
                    return Err(status.to_string());
                }
                tracing::warn!("deleting subscription {id}: {status}; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
        }
    }
}

/// The existing subscription of a durable stream name with the same filter, if any: `dissem
/// sub --durable NAME` run again resumes it instead of creating a second one.
async fn durable_subscription(
    c: &Client,
    stream: &str,
    opts: &SubOptions,
) -> Result<Option<u64>, ServiceError> {
    if opts.durable.is_none() {
        return Ok(None);
    }
    let want = crate::client::filter_of(&opts.filter);
    Ok(crate::client::list_subscriptions(c.clone())
        .await?
        .into_iter()
        .find(|s| {
            let same_stream = matches!(
                s.target.as_ref().and_then(|t| t.kind.as_ref()),
                Some(v1::target::Kind::Stream(n)) if n == stream
            );
            same_stream && s.filter.as_ref() == Some(&want)
        })
        .map(|s| s.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_is_one_json_line_with_text_or_base64_data() {
        let d = v1::Delivery {
            delivery_id: "7-1-42".into(),
            subscription_id: 7,
            object_id: Some(v1::ObjectId { node: 1, seq: 42 }),
            metadata: vec![v1::Attribute {
                name: "temp".into(),
                value: Some(v1::Value {
                    kind: Some(v1::value::Kind::Decimal("31.5".into())),
                }),
            }],
            data: b"hello".to_vec(),
            priority: 3,
            attempt: 1,
            redelivered: false,
        };
        let v: serde_json::Value = serde_json::from_str(&delivery_json(&d)).expect("json");
        assert_eq!(v["subject"], "1:42");
        assert_eq!(v["subscription"], 7);
        assert_eq!(v["metadata"]["temp"], 31.5);
        assert_eq!(v["data"], "hello");
        assert!(!delivery_json(&d).contains('\n'));
        let bin = v1::Delivery {
            data: vec![0xff, 0x00],
            ..d
        };
        let v: serde_json::Value = serde_json::from_str(&delivery_json(&bin)).expect("json");
        assert_eq!(v["data_base64"], "/wA=");
        assert!(v.get("data").is_none());
    }
}
