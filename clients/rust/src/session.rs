//! An attached stream: deliveries come down one gRPC stream, acks go up the same call. A
//! delivery not acked comes again (after the node's backoff, or to the next session).

use proto::v1;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

use crate::ClientError;

/// Acks (and the attach) waiting to go up, at most.
const UPLINK: usize = 256;

/// One attached stream ([`crate::Client::attach`]).
#[derive(Debug)]
pub struct StreamSession {
    up: mpsc::Sender<v1::StreamClientMessage>,
    down: tonic::Streaming<v1::Delivery>,
    stream: String,
}

impl StreamSession {
    pub(crate) async fn open(
        client: &mut v1::stream_client::StreamClient<crate::Channel>,
        stream: &str,
    ) -> Result<StreamSession, ClientError> {
        if stream.is_empty() {
            return Err(ClientError::invalid("stream", "a stream needs a name"));
        }
        let (up, rx) = mpsc::channel(UPLINK);
        let attach = v1::stream_client_message::Kind::Attach(stream.to_string());
        up.send(v1::StreamClientMessage { kind: Some(attach) })
            .await
            .map_err(|_| ClientError::invalid("stream", "the session closed"))?;
        let down = client
            .open(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(StreamSession {
            up,
            down,
            stream: stream.to_string(),
        })
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The next delivery; `None` when the node ended the stream.
    pub async fn next(&mut self) -> Option<Result<v1::Delivery, ClientError>> {
        self.down.next().await.map(|r| r.map_err(ClientError::from))
    }

    /// Acknowledges the delivery `delivery_id`: the node does not send it again.
    pub async fn ack(&self, delivery_id: &str) -> Result<(), ClientError> {
        let ack = v1::stream_client_message::Kind::Ack(delivery_id.to_string());
        self.up
            .send(v1::StreamClientMessage { kind: Some(ack) })
            .await
            .map_err(|_| ClientError::invalid("ack", "the session closed"))
    }
}
