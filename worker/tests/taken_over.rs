//! A QoS 2 delivery of an object a node took over, whose subscriber had "received" it from the
//! owner that died (a holder's mark came with the copy), owes only its release: a first phase
//! sent again would reach a subscriber that may have released it already, and show it twice.
//! The node must know this whether or not it has looked the subscription up yet: right after
//! a start its cache is cold, and that path sent the first phase again (`bench chaos` seed
//! 54168: an heir restarted just before its takeover). Real gRPC subscriber, real sled store.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::v1;
use storage::{ObjectId, Store, StoredObject};
use tonic::{Request, Response, Status};
use worker::deliver::{Deliverer, DeliveryConfig, SubscriptionSource, delivery_id};
use worker::lanes::Lanes;

/// One subscription, as the coordinator's registry would answer it.
struct One(v1::Subscription);

#[tonic::async_trait]
impl SubscriptionSource for One {
    async fn subscription(&self, id: u64) -> Result<Option<v1::Subscription>, Status> {
        Ok((id == self.0.id).then(|| self.0.clone()))
    }
}

/// A subscriber that notes every first phase and every release by delivery id.
#[derive(Clone, Default)]
struct Calls {
    delivered: Arc<Mutex<Vec<String>>>,
    released: Arc<Mutex<Vec<String>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[tonic::async_trait]
impl v1::subscriber_server::Subscriber for Calls {
    async fn deliver(
        &self,
        request: Request<v1::Delivery>,
    ) -> Result<Response<v1::DeliverAck>, Status> {
        lock(&self.delivered).push(request.into_inner().delivery_id);
        Ok(Response::new(v1::DeliverAck {}))
    }

    async fn deliver_batch(
        &self,
        request: Request<v1::DeliveryBatch>,
    ) -> Result<Response<v1::DeliverBatchAck>, Status> {
        let ds = request.into_inner().deliveries;
        lock(&self.delivered).extend(ds.into_iter().map(|d| d.delivery_id));
        Ok(Response::new(v1::DeliverBatchAck::default()))
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseAck>, Status> {
        lock(&self.released).push(request.into_inner().delivery_id);
        Ok(Response::new(v1::ReleaseAck {}))
    }
}

/// Adopts a copy of node 2's object `seq` at `store` (node 1), with a "received" mark for
/// `sub` when `marked`, durably, as a takeover leaves it.
async fn take_over(store: &Store, seq: u64, sub: u64, marked: bool) -> ObjectId {
    let id = ObjectId { node: 2, seq };
    let copy = StoredObject {
        id,
        data: b"x".to_vec(),
        external_id: String::new(),
        metadata: Vec::new(),
        priority: 0,
        message_id: String::new(),
        received_unix_ms: 0,
    };
    store.put_replicas_unflushed(&[copy]).expect("copy");
    if marked {
        store.mark_received_unflushed(&[(id, sub)]).expect("mark");
    }
    assert!(store.adopt(id).expect("adopt"), "adopted");
    store.commit().await.expect("commit");
    store.adopted(&[(id, 0)]);
    id
}

/// Waits until `calls` has a release of each of `ids`.
async fn until_released(calls: &Calls, ids: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let released = lock(&calls.released).clone();
        if ids.iter().all(|id| released.contains(id)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not released within 20 s: {ids:?}; released {released:?}, first phases {:?}",
            lock(&calls.delivered)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_taken_over_delivery_the_subscriber_received_gets_only_its_release() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let calls = Calls::default();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::subscriber_server::SubscriberServer::new(calls.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let dir = std::env::temp_dir().join(format!("dissem-taken-over-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir, 1).expect("store");
    let sub = 7;
    let d = Deliverer::new(
        DeliveryConfig {
            allow_private_targets: true,
            ..DeliveryConfig::default()
        },
        store.clone(),
        Arc::new(One(v1::Subscription {
            id: sub,
            filter: Some(v1::subscription::Filter::Text("a > 1".into())),
            target: Some(v1::Target {
                kind: Some(v1::target::Kind::Grpc(format!("http://{addr}"))),
            }),
            qos: v1::Qos::ExactlyOnce as i32,
            ..v1::Subscription::default()
        })),
        Lanes::new(false),
    )
    .expect("deliverer");

    // the subscription not looked up yet (a node just started), then cached
    let cold = take_over(&store, 10, sub, true).await;
    d.accept(vec![(cold, vec![sub])]).await.1.expect("accept");
    until_released(&calls, &[delivery_id(sub, cold)]).await;
    let warm = take_over(&store, 11, sub, true).await;
    d.accept(vec![(warm, vec![sub])]).await.1.expect("accept");
    until_released(&calls, &[delivery_id(sub, warm)]).await;
    // and one no subscriber received: both phases
    let fresh = take_over(&store, 12, sub, false).await;
    d.accept(vec![(fresh, vec![sub])]).await.1.expect("accept");
    until_released(&calls, &[delivery_id(sub, fresh)]).await;

    let delivered = lock(&calls.delivered).clone();
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        delivered,
        vec![delivery_id(sub, fresh)],
        "a first phase went only to the delivery no subscriber had received"
    );
}
