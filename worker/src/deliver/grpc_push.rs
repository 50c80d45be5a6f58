//! gRPC subscriber pushes: `DeliverBatch` with each object's fields encoded once (`BatchOut`),
//! a fallback to one `Deliver` each for subscribers without it, QoS 2's release, and the
//! clients per endpoint and lane.

use super::*;

/// Most bytes of deliveries in one batched call past its first delivery (below the 4 MiB a
/// gRPC server takes by default); a larger batch goes in several calls.
pub(super) const MAX_BATCH_BYTES: usize = 2 << 20;

/// Splits items of these sizes, in order, into runs of at most `max` bytes (an item larger
/// than `max` alone).
pub(super) fn runs_by_size(sizes: &[usize], max: usize) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, n) in sizes.iter().enumerate() {
        if i > start && bytes.saturating_add(*n) > max {
            runs.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(*n);
    }
    if start < sizes.len() {
        runs.push(start..sizes.len());
    }
    runs
}

/// Whether a gRPC subscriber endpoint takes `DeliverBatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchSupport {
    Unknown,
    Yes,
    No,
}

impl Deliverer {
    /// Whether deliveries to `s` go in `DeliverBatch` calls (gRPC, QoS 0/1, batching on).
    pub(super) fn batched_grpc(&self, s: &Sub) -> bool {
        matches!(
            s.target.as_ref().and_then(|t| t.kind.as_ref()),
            Some(v1::target::Kind::Grpc(_))
        ) && !s.exactly_once()
            && self.inner.cfg.push_batch > 1
    }

    /// QoS 0/1 deliveries to one gRPC endpoint in one `DeliverBatch` (one `Deliver` each
    /// where the endpoint does not take batches).
    pub(super) async fn grpc_batch(&self, url: &str, mut ps: Vec<Prepared>) {
        let deliveries: Vec<(v1::Delivery, Bytes)> = ps
            .iter_mut()
            .map(|p| (std::mem::take(&mut p.delivery), p.object.grpc_shared()))
            .collect();
        let sizes: Vec<usize> = deliveries
            .iter()
            .map(|(d, shared)| prost::Message::encoded_len(d) + shared.len())
            .collect();
        let mut outcomes = Vec::with_capacity(ps.len());
        let mut deliveries = deliveries.into_iter();
        for run in runs_by_size(&sizes, MAX_BATCH_BYTES) {
            let part: Vec<_> = deliveries.by_ref().take(run.len()).collect();
            match tokio::time::timeout(
                self.inner.cfg.attempt_timeout,
                self.send_grpc_batch(url, part),
            )
            .await
            {
                Ok(o) => outcomes.extend(o),
                Err(_) => outcomes.extend(vec![Err(self.no_answer()); run.len()]),
            }
        }
        for (p, r) in ps.into_iter().zip(outcomes) {
            self.settle(p, r.map(|()| Outcome::Done)).await;
        }
    }

    /// The outcome of each delivery, in order.
    pub(super) async fn send_grpc_batch(
        &self,
        url: &str,
        deliveries: Vec<(v1::Delivery, Bytes)>,
    ) -> Vec<Result<(), String>> {
        let n = deliveries.len();
        if let Err(e) = check_literal(url, self.inner.cfg.allow_private_targets) {
            return vec![Err(e); n];
        }
        let ch = match self.grpc_channel(url) {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let c = SubscriberClient::new(ch.clone());
        let support = lock(&self.inner.batch_support)
            .get(url)
            .copied()
            .unwrap_or(BatchSupport::Unknown);
        if support == BatchSupport::No || n == 1 {
            return deliver_each(&c, deliveries.into_iter().map(whole).collect()).await;
        }
        // until the endpoint is known to take batches, keep the deliveries for one Deliver
        // each
        let fallback = (support != BatchSupport::Yes).then(|| deliveries.clone());
        match deliver_batch(ch, BatchOut(deliveries)).await {
            Ok(ack) => {
                if support != BatchSupport::Yes {
                    lock(&self.inner.batch_support).insert(url.to_string(), BatchSupport::Yes);
                }
                let mut outcomes = vec![Ok(()); n];
                for rej in ack.into_inner().rejected {
                    if let Some(o) = outcomes.get_mut(rej.index as usize) {
                        *o = Err(format!("the subscriber rejected it: {}", rej.reason));
                    }
                }
                outcomes
            }
            Err(e) if e.code() == tonic::Code::Unimplemented && fallback.is_some() => {
                tracing::info!("{url} does not take DeliverBatch; one Deliver per delivery");
                lock(&self.inner.batch_support).insert(url.to_string(), BatchSupport::No);
                let each = fallback.unwrap_or_default().into_iter().map(whole);
                deliver_each(&c, each.collect()).await
            }
            Err(e) => vec![Err(format!("DeliverBatch: {e}")); n],
        }
    }

    pub(super) fn grpc_client(&self, url: &str) -> Result<SubscriberClient<Channel>, String> {
        self.grpc_channel(url).map(SubscriberClient::new)
    }

    pub(super) fn grpc_channel(&self, url: &str) -> Result<Channel, String> {
        let key = (url.to_string(), on_bulk());
        let mut g = lock(&self.inner.grpc);
        if let Some(c) = g.get(&key) {
            return Ok(c.clone());
        }
        let ch = tonic::transport::Endpoint::from_shared(url.to_string())
            .map_err(|e| format!("target {}: {e}", blocks::quote::quoted(url)))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .connect_with_connector_lazy(crate::push_http::grpc_connector(
                self.inner.cfg.allow_private_targets,
            ));
        g.insert(key, ch.clone());
        Ok(ch)
    }
}

/// One `Deliver` per delivery, all at once (an endpoint without `DeliverBatch`); the
/// outcomes in the deliveries' order.
/// A `DeliveryBatch` on the wire, written from deliveries without their object fields plus
/// each object's shared encoding of them (protobuf concatenates the fields of one message),
/// so a batch copies no object per delivery. The subscriber decodes a plain `DeliveryBatch`.
#[derive(Debug, Default)]
pub(super) struct BatchOut(Vec<(v1::Delivery, Bytes)>);

impl BatchOut {
    pub(super) fn item_len((d, shared): &(v1::Delivery, Bytes)) -> usize {
        prost::Message::encoded_len(d) + shared.len()
    }
}

impl prost::Message for BatchOut {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        for item in &self.0 {
            prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(BatchOut::item_len(item) as u64, buf);
            item.0.encode_raw(buf);
            buf.put_slice(&item.1);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // only ever encoded
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0
            .iter()
            .map(|item| {
                let l = BatchOut::item_len(item);
                prost::encoding::key_len(1) + prost::encoding::encoded_len_varint(l as u64) + l
            })
            .sum()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// `Subscriber.DeliverBatch` with a [`BatchOut`] as the request.
pub(super) async fn deliver_batch(
    ch: Channel,
    batch: BatchOut,
) -> Result<Response<v1::DeliverBatchAck>, Status> {
    let mut g = tonic::client::Grpc::new(ch);
    g.ready()
        .await
        .map_err(|e| Status::unavailable(format!("the subscriber is not reachable: {e}")))?;
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/dissem.v1.Subscriber/DeliverBatch");
    let codec = proto::codec::DissemCodec::<BatchOut, v1::DeliverBatchAck>::default();
    g.unary(Request::new(batch), path, codec).await
}

/// A delivery with its object fields merged back from their shared encoding.
pub(super) fn whole((mut d, shared): (v1::Delivery, Bytes)) -> v1::Delivery {
    if let Err(e) = prost::Message::merge(&mut d, shared) {
        tracing::warn!("rebuilding delivery {}: {e}", d.delivery_id);
    }
    d
}

pub(super) async fn deliver_each(
    c: &SubscriberClient<Channel>,
    deliveries: Vec<v1::Delivery>,
) -> Vec<Result<(), String>> {
    let mut set = tokio::task::JoinSet::new();
    let n = deliveries.len();
    for (i, d) in deliveries.into_iter().enumerate() {
        let mut c = c.clone();
        set.spawn(async move { (i, c.deliver(d).await.map_err(|e| format!("Deliver: {e}"))) });
    }
    let mut outcomes = vec![Err("Deliver: the call was lost".to_string()); n];
    while let Some(r) = set.join_next().await {
        if let Ok((i, r)) = r
            && let Some(o) = outcomes.get_mut(i)
        {
            *o = r.map(|_| ());
        }
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_split_by_size_and_an_oversized_item_goes_alone() {
        assert_eq!(runs_by_size(&[], 10), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(runs_by_size(&[4, 4, 4], 10), vec![0..2, 2..3]);
        assert_eq!(runs_by_size(&[20, 1, 1], 10), vec![0..1, 1..3]);
        assert_eq!(runs_by_size(&[1, 20, 1], 10), vec![0..1, 1..2, 2..3]);
        assert_eq!(runs_by_size(&[5, 5], 10), vec![0..2]);
    }

    #[test]
    fn a_batch_with_shared_object_fields_decodes_as_the_whole_deliveries() {
        use prost::Message;
        let metadata = vec![
            v1::Attribute {
                name: "temp".into(),
                value: Some(v1::Value {
                    kind: Some(v1::value::Kind::Number(21.5)),
                }),
            },
            v1::Attribute {
                name: "site".into(),
                value: Some(v1::Value {
                    kind: Some(v1::value::Kind::Text("lab".into())),
                }),
            },
        ];
        let shared = Bytes::from(
            v1::Delivery {
                metadata: metadata.clone(),
                data: b"payload".to_vec(),
                ..v1::Delivery::default()
            }
            .encode_to_vec(),
        );
        let bare = |sub: u64, seq: u64| v1::Delivery {
            delivery_id: delivery_id(sub, ObjectId { node: 1, seq }),
            subscription_id: sub,
            object_id: Some(v1::ObjectId { node: 1, seq }),
            priority: 7,
            attempt: 2,
            ..v1::Delivery::default()
        };
        let full = |sub, seq| v1::Delivery {
            metadata: metadata.clone(),
            data: b"payload".to_vec(),
            ..bare(sub, seq)
        };
        let out = BatchOut(vec![
            (bare(3, 10), shared.clone()),
            (bare(4, 10), shared.clone()),
            (bare(5, 11), Bytes::new()),
        ]);
        let wire = out.encode_to_vec();
        assert_eq!(wire.len(), out.encoded_len());
        let got = v1::DeliveryBatch::decode(wire.as_slice()).expect("decodes");
        assert_eq!(got.deliveries, vec![full(3, 10), full(4, 10), bare(5, 11)]);
        assert_eq!(whole((bare(3, 10), shared)), full(3, 10));
    }
}
