//! The HTTP and stream subscribers of `dissem bench chaos`, beside the gRPC ones of the
//! failover traffic: a QoS 1 webhook of every object pushing signed CloudEvents to an
//! endpoint on loopback (the demo's receiver, which checks each signature), and a QoS 1
//! stream subscriber that attaches to a node, acks every delivery, and attaches to the next
//! node whenever its stream ends (its node killed), as a client of a cluster would. The
//! oracle asks both for every acknowledged object, so the HTTP push path and the relayed
//! streams survive the faults too. A subscriber crash takes both down with the gRPC ones:
//! the webhook's relay breaks every connection, and the stream's client drops its stream
//! mid-flight (unacked deliveries with it) and attaches again once the crash is over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proto::v1;
use storage::ObjectId;

use crate::cut::Cut;
use crate::demo::{self, Shared};
use crate::failoverbench::Numbers;
use crate::procs::{channel, try_wait_for};

/// The stream the stream subscriber attaches to.
const STREAM: &str = "chaos";

/// Creates a QoS 1 subscription of every object to `target` through the node at `via`.
async fn subscribe(via: &str, target: v1::target::Kind) -> Result<u64, tonic::Status> {
    let s = v1::Subscription {
        filter: Some(v1::subscription::Filter::Text("n >= 0".into())),
        target: Some(v1::Target { kind: Some(target) }),
        qos: v1::Qos::AtLeastOnce as i32,
        webhook_secret: demo::SECRET.into(),
        ..v1::Subscription::default()
    };
    Ok(super::calls::create_retrying(via, s).await?.id)
}

/// Which of `objects` subscription `sub` was not shown (in `seen`) within `limit`, of
/// those put after it was created (numbers from `from` on: one put while the Create was
/// under way is not owed to it).
async fn unseen(
    seen: &Shared,
    sub: (u64, usize),
    numbers: &Numbers,
    objects: &[ObjectId],
    limit: Duration,
) -> Vec<ObjectId> {
    let (sub, from) = sub;
    let owed: Vec<ObjectId> = {
        let of = runtime::lock(&numbers.of);
        objects
            .iter()
            .filter(|id| of.get(id).is_some_and(|&n| n >= from))
            .copied()
            .collect()
    };
    let missing = || -> Vec<ObjectId> {
        let seen = demo::lock(seen);
        owed.iter()
            .filter(|id| !seen.pairs.contains_key(&(sub, **id)))
            .copied()
            .collect()
    };
    try_wait_for(limit, || {
        let done = missing().is_empty();
        async move { done.then_some(()) }
    })
    .await;
    missing()
}

/// The webhook subscription and what its endpoint was shown.
pub(super) struct Hook {
    /// The subscription, and the first object number put after it was created.
    sub: (u64, usize),
    seen: Shared,
    numbers: Numbers,
    /// In front of the endpoint: cut, it is the endpoint's process killed.
    relay: Cut,
}

impl Hook {
    /// Starts the endpoint behind a relay and subscribes it, through the node at `via`, to
    /// every object (of the puts numbered by `numbers`).
    pub(super) async fn start(via: &str, numbers: Numbers) -> anyhow::Result<Hook> {
        let seen = Shared::default();
        let direct = demo::webhook_endpoint(seen.clone()).await?;
        let (relay, url) = Cut::in_front_of(&direct).await?;
        let id = subscribe(via, v1::target::Kind::Webhook(url)).await?;
        let sub = (id, numbers.next.load(Ordering::SeqCst));
        Ok(Hook {
            sub,
            seen,
            numbers,
            relay,
        })
    }

    /// Crashes the endpoint (every connection to it broken, new ones closed) or brings it
    /// back; what it was shown it keeps.
    pub(super) fn set_down(&self, down: bool) {
        self.relay.set_down(down);
    }

    /// Which of `objects` the endpoint was not shown within `limit`.
    pub(super) async fn missing(&self, objects: &[ObjectId], limit: Duration) -> Vec<ObjectId> {
        unseen(&self.seen, self.sub, &self.numbers, objects, limit).await
    }
}

/// The stream subscription and its client, attached to one node at a time.
pub(super) struct StreamSub {
    /// The subscription, and the first object number put after it was created.
    sub: (u64, usize),
    numbers: Numbers,
    seen: Shared,
    nodes: Vec<String>,
    stop: Arc<AtomicBool>,
    /// The client; none while it is crashed.
    client: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl StreamSub {
    /// Subscribes the stream to every object through `nodes[0]` and attaches a client,
    /// which moves to the next of `nodes` whenever its stream ends.
    pub(super) async fn start(nodes: Vec<String>, numbers: Numbers) -> anyhow::Result<StreamSub> {
        anyhow::ensure!(!nodes.is_empty(), "no node to attach the stream to");
        let id = subscribe(&nodes[0], v1::target::Kind::Stream(STREAM.into())).await?;
        let sub = (id, numbers.next.load(Ordering::SeqCst));
        let stream = StreamSub {
            sub,
            numbers,
            seen: Shared::default(),
            nodes,
            stop: Arc::new(AtomicBool::new(false)),
            client: std::sync::Mutex::new(None),
        };
        stream.set_down(false);
        Ok(stream)
    }

    /// Crashes the client (its stream dropped mid-flight, unacked deliveries with it) or
    /// starts it again; what it was shown it keeps.
    pub(super) fn set_down(&self, down: bool) {
        let mut client = runtime::lock(&self.client);
        if let Some(c) = client.take() {
            c.abort();
        }
        if down {
            return;
        }
        let (nodes, s, st) = (self.nodes.clone(), self.seen.clone(), self.stop.clone());
        *client = Some(tokio::spawn(async move {
            for url in nodes.iter().cycle() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                attached(url, &s).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }

    /// Which of `objects` the stream's client was not shown within `limit`.
    pub(super) async fn missing(&self, objects: &[ObjectId], limit: Duration) -> Vec<ObjectId> {
        unseen(&self.seen, self.sub, &self.numbers, objects, limit).await
    }
}

impl Drop for StreamSub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(c) = runtime::lock(&self.client).take() {
            c.abort();
        }
    }
}

/// One attachment to the node at `url`: every delivery shown in `seen` and acked, until
/// the stream ends (or cannot be opened).
async fn attached(url: &str, seen: &Shared) {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let attach = v1::StreamClientMessage {
        kind: Some(v1::stream_client_message::Kind::Attach(STREAM.into())),
    };
    if tx.send(attach).await.is_err() {
        return;
    }
    let opened = v1::stream_client::StreamClient::new(channel(url))
        .open(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    let Ok(down) = opened else {
        return;
    };
    let mut down = down.into_inner();
    while let Ok(Some(d)) = down.message().await {
        if let Some(o) = d.object_id {
            let now = std::time::Instant::now();
            let key = (
                d.subscription_id,
                ObjectId {
                    node: o.node,
                    seq: o.seq,
                },
            );
            demo::lock(seen).pairs.entry(key).or_insert((0, now)).0 += 1;
        }
        let ack = v1::StreamClientMessage {
            kind: Some(v1::stream_client_message::Kind::Ack(d.delivery_id)),
        };
        if tx.send(ack).await.is_err() {
            return;
        }
    }
}
