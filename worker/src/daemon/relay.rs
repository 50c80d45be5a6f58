//! Streams that span the cluster: while a subscriber of this node has a stream open, this
//! node keeps a relay (`Daemon.Relay`) attached to the same stream on every other live node,
//! so the deliveries those nodes make (for the objects put through them) reach it; the
//! subscriber's acks go back the same way. A relay whose subscriber is gone, or whose node
//! left the membership, is closed; one that breaks is opened again on the next round.

use super::*;

/// How often the relays are brought in line with the streams and the membership.
const RELAY_ROUND: Duration = Duration::from_millis(250);

impl Daemon {
    /// Keeps one relay per (stream with a subscriber here, other live node).
    pub(super) async fn relays(self) {
        let mut running: HashMap<(String, String), tokio::task::JoinHandle<()>> = HashMap::new();
        let mut tick = tokio::time::interval(RELAY_ROUND);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let streams = self.inner.deliverer.local_streams();
            let me = self.inner.cfg.node;
            let peers: Vec<String> = {
                let view = self.view();
                view.live_endpoints(view.members.keys().copied().collect::<Vec<_>>(), &[me])
                    .into_iter()
                    .map(|(_, ep)| ep)
                    .filter(|ep| *ep != self.inner.cfg.endpoint)
                    .collect()
            };
            let wanted: HashSet<(String, String)> = streams
                .iter()
                .flat_map(|k| peers.iter().map(move |p| (k.clone(), p.clone())))
                .collect();
            running.retain(|key, task| {
                let keep = wanted.contains(key) && !task.is_finished();
                if !keep {
                    task.abort();
                }
                keep
            });
            for key in wanted {
                if let std::collections::hash_map::Entry::Vacant(e) = running.entry(key) {
                    let (stream, peer) = e.key().clone();
                    e.insert(tokio::spawn(self.clone().relay(stream, peer)));
                }
            }
        }
    }

    /// One relay: attached to `stream` on `peer`, each delivery handed to a subscriber here
    /// and acked back once it acks. Ends when the peer closes it, or when no subscriber here
    /// takes a delivery (the peer then retries it elsewhere).
    async fn relay(self, stream: String, peer: String) {
        use tokio_stream::StreamExt;
        let Ok(mut client) = self.peer(&peer) else {
            return;
        };
        let (up, rx) = mpsc::channel(256);
        let attach = v1::StreamClientMessage {
            kind: Some(v1::stream_client_message::Kind::Attach(stream.clone())),
        };
        if up.send(attach).await.is_err() {
            return;
        }
        let mut down = match client
            .relay(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(e) => {
                tracing::debug!("relay of stream {stream:?} from {peer}: {e}");
                return;
            }
        };
        tracing::debug!("relaying stream {stream:?} from {peer}");
        let mut acking = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                d = down.next() => {
                    let Some(Ok(d)) = d else { break };
                    let (me, up, stream) = (self.clone(), up.clone(), stream.clone());
                    acking.spawn(async move {
                        let id = d.delivery_id.clone();
                        me.inner.deliverer.deliver_relayed(&stream, d).await?;
                        let ack = v1::stream_client_message::Kind::Ack(id);
                        up.send(v1::StreamClientMessage { kind: Some(ack) })
                            .await
                            .map_err(|_| "the relay closed".to_string())
                    });
                }
                Some(done) = acking.join_next(), if !acking.is_empty() => {
                    if let Ok(Err(e)) = done {
                        // nobody here takes it: close, so the peer delivers elsewhere
                        tracing::debug!("relay of stream {stream:?} from {peer}: {e}");
                        break;
                    }
                }
            }
        }
    }
}
