//! The `Federation` service of a node: a peer cluster's `Replicate` (all-active objects are
//! stored and disseminated once each; active-passive copies are kept by a standby; spilled
//! deliveries go to the subscriptions of their tenant and name), and the operator's `Links`
//! and `Promote`.

use super::standby::Meets;
use super::*;
use crate::services::Node;
use tonic::{Request, Response, Status};

impl Node {
    /// A peer's object as this node stores it: under a message id of its origin, with its
    /// external id; checked like a put.
    pub(crate) fn replicated_object(
        &self,
        o: v1::FederatedObject,
    ) -> Result<storage::NewObject, ServiceError> {
        let message_id = replicated_message_id(&o, self.limits.max_message_id_bytes);
        let external_id = o.external_id;
        let put = v1::PutRequest {
            data: o.data,
            metadata: o.metadata,
            priority: o.priority,
            // a writer's message id may not take the reserved prefix: set after the check
            message_id: String::new(),
        };
        let max = self.limits.max_external_id_bytes;
        runtime::validate::put(put, &self.limits).and_then(|mut n| {
            n.message_id = message_id;
            if external_id.len() > max {
                return Err(ServiceError::invalid(
                    "external_id",
                    format!("{} bytes exceed the limit of {max}", external_id.len()),
                ));
            }
            n.external_id = external_id;
            Ok(n)
        })
    }

    /// A primary's standby copies (and its finished-watermark): kept durably, not
    /// disseminated.
    async fn keep_copies(
        &self,
        from: &str,
        standby: v1::Standby,
        objects: Vec<v1::FederatedObject>,
    ) -> Result<v1::FederateResponse, ServiceError> {
        let f = self.federation_settings()?;
        match f.meet_primary(from, standby.epoch).await? {
            Meets::Standby => {}
            Meets::Superseded(epoch) => {
                return Ok(v1::FederateResponse {
                    superseded: true,
                    epoch,
                    ..Default::default()
                });
            }
            Meets::BothActive(epoch) => {
                return Err(ServiceError::FailedPrecondition(format!(
                    "this cluster is active at epoch {epoch} too: start the secondary with \
                     --standby"
                )));
            }
        }
        let store = &f.inner.store;
        let node = standby.origin_node;
        let now = runtime::now_ms();
        store.standby_finished(from, node, standby.finished_below)?;
        let mut copies = Vec::with_capacity(objects.len());
        for (i, o) in objects.into_iter().enumerate() {
            let id = o.origin_id.unwrap_or_default();
            if id.node != node {
                return Err(ServiceError::invalid(
                    format!("objects[{i}].origin_id.node"),
                    format!("{} is not the sending node {node}", id.node),
                ));
            }
            if o.expires_unix_ms == 0 {
                return Err(ServiceError::invalid(
                    format!("objects[{i}].expires_unix_ms"),
                    "required on an active-passive link",
                ));
            }
            // a copy is kept at most MAX_LINK_TTL, whatever the primary asks
            let expires = o
                .expires_unix_ms
                .min(now.saturating_add(MAX_LINK_TTL.as_millis() as u64));
            copies.push((id.seq, expires, o.encode_to_vec()));
        }
        let kept: Vec<storage::StandbyCopy<'_>> = copies
            .iter()
            .map(|(seq, expires_unix_ms, bytes)| storage::StandbyCopy {
                seq: *seq,
                expires_unix_ms: *expires_unix_ms,
                bytes,
            })
            .collect();
        let (stored, duplicates) = store.standby_keep(from, node, &kept, now)?;
        store.commit().await?;
        Ok(v1::FederateResponse {
            stored,
            duplicates,
            ..Default::default()
        })
    }

    /// The node's federation, or the error that says how to start it with one.
    pub(super) fn federation_settings(&self) -> Result<&Federation, ServiceError> {
        self.federation.as_ref().ok_or_else(|| {
            ServiceError::FailedPrecondition(
                "this node was started without federation settings".into(),
            )
        })
    }
}

#[tonic::async_trait]
impl v1::federation_server::Federation for Node {
    /// Objects a peer cluster ingested: stored once each (by origin and message id), never
    /// owed on to this cluster's own links; or, from an active-passive primary, kept as
    /// standby copies.
    async fn replicate(
        &self,
        request: Request<v1::FederateRequest>,
    ) -> Result<Response<v1::FederateResponse>, Status> {
        let caller = runtime::auth::caller(&request);
        let req = request.into_inner();
        if req.objects.len() + req.spilled.len() > BATCH {
            return Err(ServiceError::invalid(
                "objects",
                format!(
                    "{} objects and spilled deliveries exceed the limit of {BATCH}",
                    req.objects.len() + req.spilled.len()
                ),
            )
            .into());
        }
        if !valid_name(&req.from_cluster) {
            return Err(
                ServiceError::invalid("from_cluster", "1 to 64 letters, digits, `_ . -`").into(),
            );
        }
        caller.tenant.charge_puts(req.objects.len() as u32)?;
        let own = self.federation.as_ref().map(|f| f.cluster().to_string());
        if own.as_deref() == Some(req.from_cluster.as_str()) {
            return Err(ServiceError::invalid(
                "from_cluster",
                format!("{:?} is this cluster's own name", req.from_cluster),
            )
            .into());
        }
        for (i, o) in req.objects.iter().enumerate() {
            if !valid_name(&o.origin_cluster) {
                return Err(ServiceError::invalid(
                    format!("objects[{i}].origin_cluster"),
                    "1 to 64 letters, digits, `_ . -`",
                )
                .into());
            }
            if o.origin_id.is_none() {
                return Err(ServiceError::invalid(
                    format!("objects[{i}].origin_id"),
                    "required (it keys the object's deduplication)",
                )
                .into());
            }
        }
        if !req.spilled.is_empty() {
            if !req.objects.is_empty() || req.standby.is_some() {
                return Err(ServiceError::invalid(
                    "spilled",
                    "spilled deliveries travel alone (no objects, no standby)",
                )
                .into());
            }
            let r = self.take_spilled(&req.from_cluster, req.spilled).await?;
            return Ok(Response::new(r));
        }
        if let Some(standby) = req.standby {
            if let Some(i) = req
                .objects
                .iter()
                .position(|o| o.origin_cluster != req.from_cluster)
            {
                return Err(ServiceError::invalid(
                    format!("objects[{i}].origin_cluster"),
                    "a standby copy comes from its origin cluster",
                )
                .into());
            }
            let r = self
                .keep_copies(&req.from_cluster, standby, req.objects)
                .await?;
            return Ok(Response::new(r));
        }
        let mut objs = Vec::with_capacity(req.objects.len());
        for (i, o) in req.objects.into_iter().enumerate() {
            if own.as_deref() == Some(o.origin_cluster.as_str()) {
                // this cluster's own object come back (a misconfigured peer): stored already
                continue;
            }
            objs.push(self.replicated_object(o).map_err(|e| match e {
                ServiceError::InvalidArgument { field, reason } => {
                    ServiceError::invalid(format!("objects[{i}].{field}"), reason)
                }
                e => e,
            }));
        }
        let mut stored = 0;
        let mut duplicates = 0;
        for r in self.store_objects(objs, false).await {
            match r {
                Ok(p) if p.duplicate => duplicates += 1,
                Ok(_) => stored += 1,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Response::new(v1::FederateResponse {
            stored,
            duplicates,
            ..Default::default()
        }))
    }

    async fn links(
        &self,
        _request: Request<v1::LinksRequest>,
    ) -> Result<Response<v1::LinksResponse>, Status> {
        Ok(Response::new(self.federation_settings()?.links()))
    }

    async fn promote(
        &self,
        _request: Request<v1::PromoteRequest>,
    ) -> Result<Response<v1::PromoteResponse>, Status> {
        Ok(Response::new(Node::promote(self).await?))
    }

    async fn add_link(
        &self,
        request: Request<v1::AddLinkRequest>,
    ) -> Result<Response<v1::LinkInfo>, Status> {
        let f = self.federation_settings()?;
        Ok(Response::new(f.add_link(request.into_inner()).await?))
    }

    async fn remove_link(
        &self,
        request: Request<v1::RemoveLinkRequest>,
    ) -> Result<Response<v1::RemoveLinkResponse>, Status> {
        let f = self.federation_settings()?;
        let dropped = f.remove_link(&request.into_inner().name).await?;
        Ok(Response::new(v1::RemoveLinkResponse { dropped }))
    }
}
