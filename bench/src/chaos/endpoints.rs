//! The HTTP and stream subscribers of `dissem bench chaos`, beside the gRPC ones of the
//! failover traffic: a QoS 1 webhook of every object pushing signed CloudEvents to an
//! endpoint on loopback (the demo's receiver, which checks each signature), and a QoS 1
//! stream subscriber, a `dissem sub --durable` process, that attaches to a node, acks every
//! delivery, and is started against the next node whenever its stream ends (its node
//! killed), as a user of a cluster would run it. The oracle asks both for every
//! acknowledged object, so the HTTP push path and the relayed streams survive the faults
//! too. A subscriber crash takes both down with the gRPC ones: the webhook's relay breaks
//! every connection, and the stream's process is SIGKILLed mid-stream (unacked deliveries
//! with it) and started again once the crash is over. The gRPC subscriber that runs as a
//! process of its own is in `receiver`.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;

use proto::v1;
use storage::ObjectId;

use crate::cut::Cut;
use crate::demo::{self, Shared};
use crate::failoverbench::Numbers;
use crate::procs::try_wait_for;

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
pub(super) async fn unseen(
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

/// The stream subscriber: a `dissem sub --durable` process attached to one node at a time,
/// as a user would run it. It creates the stream's subscription itself, prints each
/// delivery as a JSON line (read here) and acks it once printed. Crashed, it is SIGKILLed
/// (its unacked deliveries with it) and started again once the crash is over; it resumes
/// the same durable subscription. When its node dies its stream ends and it exits: it is
/// started again against the next node.
pub(super) struct StreamSub {
    /// The subscription, and the first object number put after it was created.
    sub: (u64, usize),
    numbers: Numbers,
    seen: Shared,
    /// Whether the subscriber is crashed: its process is killed, and none runs until
    /// this turns false again.
    down: tokio::sync::watch::Sender<bool>,
    /// Runs the processes, one after the other.
    task: tokio::task::JoinHandle<()>,
}

impl StreamSub {
    /// Starts the subscriber process against `nodes[0]` (it subscribes the stream to every
    /// object) and keeps one running, moving to the next of `nodes` whenever it exits.
    pub(super) async fn start(
        bin: &Path,
        nodes: Vec<String>,
        numbers: Numbers,
    ) -> anyhow::Result<StreamSub> {
        anyhow::ensure!(!nodes.is_empty(), "no node to attach the stream to");
        let seen = Shared::default();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (down, down_rx) = tokio::sync::watch::channel(false);
        let task = supervise(bin, nodes, seen.clone(), down_rx, tx);
        let id = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .ok()
            .flatten()
            .context("`dissem sub` did not attach its stream within 60 s")?;
        Ok(StreamSub {
            sub: (id, numbers.next.load(Ordering::SeqCst)),
            numbers,
            seen,
            down,
            task,
        })
    }

    /// Crashes the subscriber process (SIGKILL) or starts it again; what it printed before
    /// it died is kept (read to the end of its output, as its reader would have).
    pub(super) fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }

    /// Which of `objects` the stream's subscriber was not shown within `limit`.
    pub(super) async fn missing(&self, objects: &[ObjectId], limit: Duration) -> Vec<ObjectId> {
        unseen(&self.seen, self.sub, &self.numbers, objects, limit).await
    }
}

impl Drop for StreamSub {
    fn drop(&mut self) {
        self.task.abort(); // the process goes with it (killed on drop)
    }
}

/// Runs `dissem sub` against each of `nodes` in turn (the next when it exits) while `down`
/// says it is not crashed, recording what it prints in `seen`; its subscription's id goes
/// to `attached` once known.
fn supervise(
    bin: &Path,
    nodes: Vec<String>,
    seen: Shared,
    mut down: tokio::sync::watch::Receiver<bool>,
    attached: tokio::sync::mpsc::UnboundedSender<u64>,
) -> tokio::task::JoinHandle<()> {
    let bin = bin.to_path_buf();
    tokio::spawn(async move {
        let mut attached = Some(attached);
        for url in nodes.iter().cycle() {
            if down.wait_for(|d| !*d).await.is_err() {
                return; // the subscriber is gone
            }
            if let Err(e) = run_sub(&bin, url, &seen, &mut attached, down.clone()).await {
                eprintln!("the stream subscriber at {url}: {e:#}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// One `dissem sub` process attached through the node at `url`, until it exits (killed
/// when `down` turns true; what it printed is read to the end); an error: it could not be
/// started or read.
async fn run_sub(
    bin: &Path,
    url: &str,
    seen: &Shared,
    attached: &mut Option<tokio::sync::mpsc::UnboundedSender<u64>>,
    mut down: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(bin)
        .args(["sub", "--node-url", url, "--filter", "n >= 0", "--qos", "1"])
        .args(["--durable", STREAM])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let out = child.stdout.take().context("no stdout")?;
    let err = child.stderr.take().context("no stderr")?;
    // "attached: subscription {id} on stream ..." names the subscription it resumed or made
    let tell = attached.take();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(err).lines();
        let mut tell = tell;
        while let Ok(Some(l)) = lines.next_line().await {
            let id = l
                .strip_prefix("attached: subscription ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok());
            if let (Some(id), Some(t)) = (id, tell.take()) {
                let _ = t.send(id);
            }
        }
    });
    let mut lines = tokio::io::BufReader::new(out).lines();
    let mut killed = false;
    loop {
        let line = tokio::select! {
            l = lines.next_line() => l?,
            _ = down.wait_for(|d| *d), if !killed => {
                // crashed: SIGKILL, mid-stream; what it printed before is still in the pipe
                child.start_kill()?;
                killed = true;
                continue;
            }
        };
        let Some(l) = line else { break };
        if let Some(key) = printed(&l) {
            let now = std::time::Instant::now();
            demo::lock(seen).pairs.entry(key).or_insert((0, now)).0 += 1;
        }
    }
    // it exits when its node dies (its stream ends): started again, against the next
    child.wait().await?;
    Ok(())
}

/// The (subscription, object) of one line `dissem sub` printed.
fn printed(line: &str) -> Option<(u64, ObjectId)> {
    pair_of(&serde_json::from_str(line).ok()?)
}

/// The (subscription, object) of a delivery's JSON fields (a `dissem sub` line, a
/// `dissem receive` journal line).
pub(super) fn pair_of(v: &serde_json::Value) -> Option<(u64, ObjectId)> {
    let sub = v.get("subscription")?.as_u64()?;
    let (node, seq) = v.get("subject")?.as_str()?.split_once(':')?;
    Some((
        sub,
        ObjectId {
            node: node.parse().ok()?,
            seq: seq.parse().ok()?,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_delivery_names_its_subscription_and_object() {
        let d = v1::Delivery {
            delivery_id: "7-1-42".into(),
            subscription_id: 7,
            object_id: Some(v1::ObjectId { node: 3, seq: 42 }),
            ..v1::Delivery::default()
        };
        let line = worker::subscriber::delivery_json(&d);
        assert_eq!(printed(&line), Some((7, ObjectId { node: 3, seq: 42 })));
        assert_eq!(printed("attached"), None);
        assert_eq!(printed(r#"{"subscription":7,"subject":"x"}"#), None);
    }
}
