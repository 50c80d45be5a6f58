//! Named streams: subscribers open a stream to the node (`Stream.Open`) and ack upstream;
//! deliveries to a stream go to one of its open sessions, and wait for one while none is
//! open (`backlog`).

use super::*;

/// One attached stream subscriber.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) id: u64,
    pub(super) tx: mpsc::Sender<Result<v1::Delivery, Status>>,
    pub(super) acks: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
}

/// The key of a tenant's named stream (the name itself without authentication).
pub fn stream_key(tenant: &str, name: &str) -> String {
    if tenant.is_empty() {
        name.to_string()
    } else {
        format!("{tenant}\u{0}{name}")
    }
}

impl Deliverer {
    /// Pushes `d` to one of the stream's sessions and waits for its ack; `Detached` when
    /// nobody has the stream open (the delivery waits for a subscriber, see `backlog`).
    pub(super) async fn to_stream(&self, name: &str, d: v1::Delivery) -> Result<Outcome, String> {
        let (tx, acks) = {
            let streams = lock(&self.inner.streams);
            let Some(sessions) = streams.get(name).filter(|v| !v.is_empty()) else {
                return Ok(Outcome::Detached(name.to_string()));
            };
            let i = (self.inner.seq.load(Ordering::Relaxed) as usize) % sessions.len();
            (sessions[i].tx.clone(), sessions[i].acks.clone())
        };
        let (ack_tx, ack_rx) = oneshot::channel();
        lock(&acks).insert(d.delivery_id.clone(), ack_tx);
        let id = d.delivery_id.clone();
        if tx.send(Ok(d)).await.is_err() {
            lock(&acks).remove(&id);
            return Err(format!("stream {name:?} closed"));
        }
        ack_rx
            .await
            .map_err(|_| format!("stream {name:?} closed before the ack"))?;
        Ok(Outcome::Done)
    }
}

#[tonic::async_trait]
impl v1::stream_server::Stream for Deliverer {
    type OpenStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::Delivery, Status>> + Send>>;

    async fn open(
        &self,
        request: Request<Streaming<v1::StreamClientMessage>>,
    ) -> Result<Response<Self::OpenStream>, Status> {
        use tokio_stream::StreamExt;
        let caller = runtime::auth::caller(&request);
        let mut input = request.into_inner();
        let name = match input.next().await {
            Some(Ok(v1::StreamClientMessage {
                kind: Some(v1::stream_client_message::Kind::Attach(name)),
            })) => {
                runtime::validate::stream_name("attach", &name)?;
                // a tenant's streams are its own: the same name of another tenant is another
                // stream
                stream_key(caller.tenant(), &name)
            }
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(Status::invalid_argument(
                    "attach: the first message must name the stream to attach to",
                ));
            }
        };
        let (tx, rx) = mpsc::channel(256);
        let acks: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>> = Arc::default();
        let id = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.streams)
            .entry(name.clone())
            .or_default()
            .push(Session {
                id,
                tx,
                acks: acks.clone(),
            });
        tracing::info!("stream {name:?} attached");
        self.attached(&name);
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(Ok(m)) = input.next().await {
                if let Some(v1::stream_client_message::Kind::Ack(d)) = m.kind
                    && let Some(t) = lock(&acks).remove(&d)
                {
                    let _ = t.send(());
                }
            }
            let mut streams = lock(&me.inner.streams);
            if let Some(v) = streams.get_mut(&name) {
                v.retain(|s| s.id != id);
            }
            tracing::info!("stream {name:?} detached");
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
