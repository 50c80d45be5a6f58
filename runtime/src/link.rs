//! The links between the roles. A node daemon reaches its coordinator, and the coordinator
//! its node daemons, either over gRPC (separate processes) or by calling the other role's
//! service in the same process (`dissem up`). Each side sees only the generated service trait
//! of the other (`Cluster` for the coordinator, `Daemon` for a node), so neither role's crate
//! depends on the other's.

use std::sync::Arc;

use proto::v1;
use proto::v1::cluster_client::ClusterClient;
use proto::v1::daemon_client::DaemonClient;
use tonic::{Request, Status};

use crate::cluster_secret::Internal;

/// The endpoint name of the node daemon that shares the coordinator's process.
pub const LOCAL_ENDPOINT: &str = "local:";

/// How a node daemon reaches its coordinator.
#[derive(Clone)]
pub enum ToCoordinator {
    Grpc(ClusterClient<Internal>),
    Local(Arc<dyn v1::cluster_server::Cluster>),
    /// Whichever coordinator the etcd leader key names (`dissem node --etcd`).
    Elected(Arc<Elected>),
}

/// The coordinator an election chose, followed through etcd: calls go to the leader the key
/// names now, over one channel per leader address.
pub struct Elected {
    leader: crate::election::LeaderWatch,
    stamp: crate::cluster_secret::Stamp,
    channel: std::sync::Mutex<Option<(String, tonic::transport::Channel)>>,
}

impl std::fmt::Debug for Elected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elected")
            .field("leader", &self.leader.current())
            .finish()
    }
}

impl Elected {
    pub fn new(
        leader: crate::election::LeaderWatch,
        stamp: crate::cluster_secret::Stamp,
    ) -> Elected {
        Elected {
            leader,
            stamp,
            channel: std::sync::Mutex::new(None),
        }
    }

    /// The leader's nonce, when one leads and serves: the only coordinator whose
    /// assignments a node takes.
    pub fn nonce(&self) -> Option<u64> {
        self.leader.current().map(|l| l.nonce)
    }

    /// The leader as the etcd key names it.
    pub fn leader(&self) -> &crate::election::LeaderWatch {
        &self.leader
    }

    /// A channel to the leader that serves now.
    pub fn channel(&self) -> Result<tonic::transport::Channel, Status> {
        let Some(l) = self.leader.current() else {
            return Err(Status::unavailable(
                "no coordinator leads yet (the etcd leader key names none that serves)",
            ));
        };
        let mut c = crate::lock(&self.channel);
        if let Some((url, ch)) = &*c
            && *url == l.url
        {
            return Ok(ch.clone());
        }
        let ch = crate::channel(&l.url).map_err(Status::from)?;
        *c = Some((l.url, ch.clone()));
        Ok(ch)
    }

    fn client(&self) -> Result<ClusterClient<Internal>, Status> {
        Ok(
            ClusterClient::with_interceptor(self.channel()?, self.stamp.clone())
                .max_decoding_message_size(1 << 30)
                .max_encoding_message_size(64 << 20),
        )
    }
}

impl std::fmt::Debug for ToCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ToCoordinator::Grpc(_) => "ToCoordinator::Grpc",
            ToCoordinator::Local(_) => "ToCoordinator::Local",
            ToCoordinator::Elected(_) => "ToCoordinator::Elected",
        })
    }
}

macro_rules! coord_call {
    ($name:ident, $req:ty, $resp:ty) => {
        pub async fn $name(&self, r: $req) -> Result<$resp, Status> {
            match self {
                ToCoordinator::Grpc(c) => c.clone().$name(r).await.map(|x| x.into_inner()),
                ToCoordinator::Local(h) => h.$name(Request::new(r)).await.map(|x| x.into_inner()),
                ToCoordinator::Elected(e) => e.client()?.$name(r).await.map(|x| x.into_inner()),
            }
        }
    };
}

impl ToCoordinator {
    /// The nonce of the coordinator that leads, when an election decides it (`None`: any
    /// coordinator this node registered with may assign).
    pub fn leader_nonce(&self) -> Option<u64> {
        match self {
            ToCoordinator::Elected(e) => Some(e.nonce().unwrap_or(0)),
            _ => None,
        }
    }
    coord_call!(register, v1::RegisterRequest, v1::RegisterResponse);
    coord_call!(heartbeat, v1::HeartbeatRequest, v1::HeartbeatResponse);
    coord_call!(arrived, v1::ArrivedRequest, v1::ArrivedResponse);
    coord_call!(done, v1::DoneRequest, v1::DoneResponse);
    coord_call!(image, v1::ImageRequest, v1::ImageResponse);
    coord_call!(
        subscription,
        v1::SubscriptionRecordRequest,
        v1::Subscription
    );
    coord_call!(
        subscription_records,
        v1::SubscriptionRecordsRequest,
        v1::SubscriptionRecordsResponse
    );
    coord_call!(
        named,
        v1::NamedSubscriptionsRequest,
        v1::NamedSubscriptionsResponse
    );
}

/// How the coordinator reaches a node daemon.
#[derive(Clone)]
pub enum ToNode {
    Grpc(DaemonClient<Internal>),
    Local(Arc<LocalDaemon>),
}

impl std::fmt::Debug for ToNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ToNode::Grpc(_) => "ToNode::Grpc",
            ToNode::Local(_) => "ToNode::Local",
        })
    }
}

impl ToNode {
    /// Hands a task to one of the node's workers.
    pub async fn assign(&self, r: v1::AssignRequest) -> Result<(), Status> {
        match self {
            ToNode::Grpc(c) => c.clone().assign(r).await.map(|_| ()),
            ToNode::Local(d) => d.assign(Request::new(r)).await.map(|_| ()),
        }
    }

    /// Tells the node a (new) coordinator is there.
    pub async fn hello(&self, r: v1::HelloRequest) -> Result<(), Status> {
        match self {
            ToNode::Grpc(c) => c.clone().hello(r).await.map(|_| ()),
            ToNode::Local(d) => d.hello(Request::new(r)).await.map(|_| ()),
        }
    }
}

/// The deliveries of a stream session (what `Stream.Open` and `Daemon.Relay` answer).
pub type DeliveryStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::Delivery, tonic::Status>> + Send>>;

/// A node daemon in the coordinator's own process (embedded mode).
pub type LocalDaemon = dyn v1::daemon_server::Daemon<RelayStream = DeliveryStream>;
