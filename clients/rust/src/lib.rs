//! `dissem-client`: the Rust client of a dissem node, which the `dissem` CLI itself uses.
//! It connects with a bearer token and TLS, and wraps the verbs of producers (put,
//! put-stream), subscribers (subscribe, attach to a stream and ack) and operators (dead
//! letters and redrive, stats, drain, federation links). Anything it does not wrap is a call
//! on [`Client::channel`] with the generated stubs in [`v1`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), dissem_client::ClientError> {
//! use dissem_client::{Client, v1};
//! let c = Client::connect("http://127.0.0.1:7700", None, None).await?;
//! let sub = c.subscribe(dissem_client::stream_subscription("temp > 30", "alerts")).await?;
//! let mut session = c.attach("alerts").await?;
//! c.put(dissem_client::put_request(b"hot".to_vec(), &[("temp", v1::value::Kind::Integer(35))])).await?;
//! if let Some(d) = session.next().await {
//!     let d = d?;
//!     println!("subscription {} got {:?}", sub.id, d.data);
//!     session.ack(&d.delivery_id).await?;
//! }
//! # Ok(()) }
//! ```

mod error;
mod session;

use std::time::Duration;

pub use error::ClientError;
pub use proto::v1;
pub use session::StreamSession;
use tonic::metadata::{Ascii, MetadataValue};

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
    pub fn new(token: Option<&str>) -> Result<Bearer, ClientError> {
        token
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {}", t.trim()))
                    .map_err(|_| ClientError::invalid("token", "not a valid header value"))
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

/// How long connecting (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Subscriptions per `List` page.
const LIST_PAGE: u32 = 1000;

/// A connection to one dissem node. Cheap to clone (the clones share the connection).
#[derive(Debug, Clone)]
pub struct Client {
    ch: Channel,
}

impl Client {
    /// Connects to `url` (`http://host:port`, or `https://` verified against the PEM file
    /// `tls_ca`, else the bundled web roots), presenting `token` on every call if given.
    pub async fn connect(
        url: &str,
        token: Option<&str>,
        tls_ca: Option<&std::path::Path>,
    ) -> Result<Client, ClientError> {
        let bearer = Bearer::new(token)?;
        let mut endpoint = tonic::transport::Channel::from_shared(url.to_string())
            .map_err(|e| ClientError::invalid("url", format!("{url:?}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT);
        if url.starts_with("https://") {
            let tls = tonic::transport::ClientTlsConfig::new().timeout(CONNECT_TIMEOUT);
            let tls = match tls_ca {
                Some(path) => {
                    let pem = std::fs::read(path).map_err(|e| {
                        ClientError::invalid("tls_ca", format!("{}: {e}", path.display()))
                    })?;
                    tls.ca_certificate(tonic::transport::Certificate::from_pem(pem))
                }
                None => tls.with_webpki_roots(),
            };
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| ClientError::invalid("url", e.to_string()))?;
        } else if let Some(path) = tls_ca {
            return Err(ClientError::invalid(
                "tls_ca",
                format!(
                    "{} is given but {url} is not https://: the token would cross in the clear",
                    path.display()
                ),
            ));
        }
        let ch = endpoint
            .connect()
            .await
            .map_err(|e| ClientError::Unreachable {
                url: url.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Client {
            ch: tonic::service::interceptor::InterceptedService::new(ch, bearer),
        })
    }

    /// The connection, for calls this client does not wrap (`v1::*_client::*::new(c.channel())`).
    pub fn channel(&self) -> Channel {
        self.ch.clone()
    }

    fn ingest(&self) -> v1::ingest_client::IngestClient<Channel> {
        v1::ingest_client::IngestClient::new(self.channel())
    }

    fn subs(&self) -> v1::subscriptions_client::SubscriptionsClient<Channel> {
        // a CreateMany's answer can be a little larger than the 4 MiB its request may be
        v1::subscriptions_client::SubscriptionsClient::new(self.channel())
            .max_decoding_message_size(64 << 20)
    }

    fn admin(&self) -> v1::admin_client::AdminClient<Channel> {
        v1::admin_client::AdminClient::new(self.channel())
    }

    fn federation(&self) -> v1::federation_client::FederationClient<Channel> {
        v1::federation_client::FederationClient::new(self.channel())
    }

    /// Stores one object; answers once it is durable (and replicated, in a cluster).
    pub async fn put(&self, req: v1::PutRequest) -> Result<v1::PutResponse, ClientError> {
        Ok(self.ingest().put(req).await?.into_inner())
    }

    /// Puts many objects over one stream (pipelined); one result per object, in order: the
    /// stored id, or the node's reason for refusing that object (the rest are stored).
    pub async fn put_stream(
        &self,
        reqs: Vec<v1::PutRequest>,
    ) -> Result<Vec<Result<v1::PutResponse, v1::Rejection>>, ClientError> {
        let n = reqs.len();
        let mut replies = self
            .ingest()
            .put_stream(tokio_stream::iter(reqs))
            .await?
            .into_inner();
        let mut out = Vec::with_capacity(n);
        while let Some(r) = replies.message().await? {
            out.push(match r.result {
                Some(v1::put_stream_response::Result::Ok(ok)) => Ok(ok),
                Some(v1::put_stream_response::Result::Rejected(why)) => Err(why),
                None => Err(v1::Rejection {
                    code: tonic::Code::Unknown as i32,
                    message: "the node answered neither a result nor a rejection".into(),
                }),
            });
        }
        Ok(out)
    }

    /// Creates a subscription; answers it as stored (without its write-only parts).
    pub async fn subscribe(&self, s: v1::Subscription) -> Result<v1::Subscription, ClientError> {
        let req = v1::CreateSubscriptionRequest {
            subscription: Some(s),
        };
        Ok(self.subs().create(req).await?.into_inner())
    }

    /// Creates many subscriptions, [`MAX_CREATE_MANY`] per request (each request all or
    /// none); answers them as stored, in order.
    pub async fn subscribe_many(
        &self,
        subs: Vec<v1::Subscription>,
    ) -> Result<Vec<v1::Subscription>, ClientError> {
        let mut client = self.subs();
        let mut out = Vec::with_capacity(subs.len());
        for chunk in subs.chunks(MAX_CREATE_MANY) {
            let req = v1::CreateSubscriptionsRequest {
                subscriptions: chunk.to_vec(),
            };
            out.extend(client.create_many(req).await?.into_inner().subscriptions);
        }
        Ok(out)
    }

    /// One subscription.
    pub async fn subscription(&self, id: u64) -> Result<v1::Subscription, ClientError> {
        let req = v1::GetSubscriptionRequest { id };
        Ok(self.subs().get(req).await?.into_inner())
    }

    /// Every subscription the caller may see, page by page.
    pub async fn subscriptions(&self) -> Result<Vec<v1::Subscription>, ClientError> {
        let mut client = self.subs();
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let req = v1::ListSubscriptionsRequest {
                after_id: after,
                limit: LIST_PAGE,
            };
            let page = client.list(req).await?.into_inner();
            out.extend(page.subscriptions);
            if page.next_after_id == 0 {
                return Ok(out);
            }
            after = page.next_after_id;
        }
    }

    /// Deletes a subscription.
    pub async fn unsubscribe(&self, id: u64) -> Result<(), ClientError> {
        self.subs()
            .delete(v1::DeleteSubscriptionRequest { id })
            .await?;
        Ok(())
    }

    /// Attaches to the stream `stream` (its subscriptions deliver into it): read deliveries
    /// with [`StreamSession::next`] and ack each one handled.
    pub async fn attach(&self, stream: &str) -> Result<StreamSession, ClientError> {
        let mut c = v1::stream_client::StreamClient::new(self.channel());
        StreamSession::open(&mut c, stream).await
    }

    /// The node's dead letters (at most `limit`).
    pub async fn dead_letters(&self, limit: u32) -> Result<Vec<v1::DeadLetter>, ClientError> {
        let req = v1::DeadLettersRequest { limit };
        Ok(self
            .admin()
            .dead_letters(req)
            .await?
            .into_inner()
            .dead_letters)
    }

    /// Puts the given dead letters back to pending; answers how many.
    pub async fn redrive(&self, letters: Vec<v1::DeadLetter>) -> Result<u64, ClientError> {
        if letters.is_empty() {
            return Err(ClientError::invalid(
                "dead_letters",
                "none given (redrive_all redrives every one)",
            ));
        }
        let req = v1::RedriveRequest {
            dead_letters: letters,
            all: false,
        };
        Ok(self.admin().redrive(req).await?.into_inner().redriven)
    }

    /// Puts every dead letter of the node back to pending; answers how many.
    pub async fn redrive_all(&self) -> Result<u64, ClientError> {
        let req = v1::RedriveRequest {
            dead_letters: Vec::new(),
            all: true,
        };
        Ok(self.admin().redrive(req).await?.into_inner().redriven)
    }

    /// The node's counters.
    pub async fn stats(&self) -> Result<v1::StatsResponse, ClientError> {
        Ok(self.admin().stats(v1::StatsRequest {}).await?.into_inner())
    }

    /// The workers a node hosts (asked of a coordinator: every worker of the cluster).
    pub async fn workers(&self) -> Result<v1::WorkersResponse, ClientError> {
        Ok(self
            .admin()
            .workers(v1::WorkersRequest {})
            .await?
            .into_inner())
    }

    /// Asks the node to drain (refuse puts, finish what it owes; with `exit`, then stop):
    /// answers what it still owes. Ask again until `drained`.
    pub async fn drain(&self, exit: bool) -> Result<v1::DrainResponse, ClientError> {
        Ok(self
            .admin()
            .drain(v1::DrainRequest { exit })
            .await?
            .into_inner())
    }

    /// Asks the leading coordinator to resize the quorum grid to `rows x cols` (the first
    /// call starts the move): answers where it stands. Ask again until `done`.
    pub async fn resize_grid(
        &self,
        rows: u32,
        cols: u32,
    ) -> Result<v1::ResizeGridResponse, ClientError> {
        Ok(self
            .admin()
            .resize_grid(v1::ResizeGridRequest { rows, cols })
            .await?
            .into_inner())
    }

    /// The node's federation links and its active-passive role.
    pub async fn links(&self) -> Result<v1::LinksResponse, ClientError> {
        Ok(self
            .federation()
            .links(v1::LinksRequest {})
            .await?
            .into_inner())
    }

    /// Adds a link to a peer cluster.
    pub async fn add_link(&self, r: v1::AddLinkRequest) -> Result<v1::LinkInfo, ClientError> {
        Ok(self.federation().add_link(r).await?.into_inner())
    }

    /// Removes a link added at run time; answers how many owed entries were dropped.
    pub async fn remove_link(&self, name: &str) -> Result<u64, ClientError> {
        let req = v1::RemoveLinkRequest { name: name.into() };
        Ok(self
            .federation()
            .remove_link(req)
            .await?
            .into_inner()
            .dropped)
    }

    /// Promotes a standby node to active.
    pub async fn promote(&self) -> Result<v1::PromoteResponse, ClientError> {
        Ok(self
            .federation()
            .promote(v1::PromoteRequest {})
            .await?
            .into_inner())
    }
}

/// Most subscriptions one `CreateMany` request registers (the server's bound).
pub const MAX_CREATE_MANY: usize = 1000;

/// A put of `data` with `attributes` (name, value), priority 0 and no message id.
pub fn put_request(data: Vec<u8>, attributes: &[(&str, v1::value::Kind)]) -> v1::PutRequest {
    v1::PutRequest {
        data,
        metadata: attributes
            .iter()
            .map(|(name, kind)| v1::Attribute {
                name: (*name).to_string(),
                value: Some(v1::Value {
                    kind: Some(kind.clone()),
                }),
            })
            .collect(),
        ..v1::PutRequest::default()
    }
}

/// A subscription of the text filter `filter` delivering into the stream `stream` (QoS 1).
pub fn stream_subscription(filter: &str, stream: &str) -> v1::Subscription {
    v1::Subscription {
        filter: Some(v1::subscription::Filter::Text(filter.to_string())),
        target: Some(v1::Target {
            kind: Some(v1::target::Kind::Stream(stream.to_string())),
        }),
        ..v1::Subscription::default()
    }
}
