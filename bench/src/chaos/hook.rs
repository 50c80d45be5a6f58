//! The webhook subscriber of `dissem bench chaos`: a QoS 1 subscription of every object
//! pushing signed CloudEvents to an HTTP endpoint on loopback (the demo's receiver, which
//! checks each signature), so the oracle sees the HTTP push path survive the faults too.

use std::time::Duration;

use proto::v1;
use storage::ObjectId;

use crate::demo::{self, Shared};
use crate::procs::try_wait_for;

/// The webhook subscription and what its endpoint was shown.
pub(super) struct Hook {
    pub(super) id: u64,
    seen: Shared,
}

impl Hook {
    /// Starts the endpoint and subscribes it, through the node at `via`, to every object.
    pub(super) async fn start(via: &str) -> anyhow::Result<Hook> {
        let seen = Shared::default();
        let url = demo::webhook_endpoint(seen.clone()).await?;
        let s = v1::Subscription {
            filter: Some(v1::subscription::Filter::Text("n >= 0".into())),
            target: Some(v1::Target {
                kind: Some(v1::target::Kind::Webhook(url)),
            }),
            qos: v1::Qos::AtLeastOnce as i32,
            webhook_secret: demo::SECRET.into(),
            ..v1::Subscription::default()
        };
        let id = super::retry(|| {
            let mut subs =
                v1::subscriptions_client::SubscriptionsClient::new(crate::procs::channel(via));
            let subscription = Some(s.clone());
            async move {
                subs.create(v1::CreateSubscriptionRequest { subscription })
                    .await
            }
        })
        .await?
        .id;
        Ok(Hook { id, seen })
    }

    /// Which of `objects` the endpoint was not shown within `limit`.
    pub(super) async fn missing(&self, objects: &[ObjectId], limit: Duration) -> Vec<ObjectId> {
        let missing = || -> Vec<ObjectId> {
            let seen = demo::lock(&self.seen);
            objects
                .iter()
                .filter(|id| !seen.pairs.contains_key(&(self.id, **id)))
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
}
