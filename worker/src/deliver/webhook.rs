//! Webhook pushes: CloudEvents POSTs (one event or a batch per secret), signed, to targets
//! that consented to the validation handshake.

use super::*;

impl Deliverer {
    /// Whether webhook `url` consents to this node's events (the validation handshake, unless
    /// skipped).
    pub(super) async fn consented(&self, url: &str) -> Result<(), String> {
        if self.inner.cfg.skip_webhook_validation {
            return Ok(());
        }
        self.inner
            .consents
            .check(&self.inner.http[usize::from(on_bulk())], url)
            .await
    }

    /// Webhook events to one URL with one secret in one POST (several past
    /// `MAX_BATCH_BYTES`): structured mode for one event, CloudEvents' batched mode for
    /// several; a 2xx acks them all.
    pub(super) async fn webhook_batch(&self, url: &str, secret: &str, ps: Vec<Prepared>) {
        let events: Vec<Vec<u8>> = ps
            .iter()
            .map(|p| {
                let node = p.delivery.object_id.map_or(0, |o| o.node);
                event_json(&p.object.event, &p.delivery, node)
            })
            .collect();
        let sizes: Vec<usize> = events.iter().map(Vec::len).collect();
        let mut ps = ps.into_iter();
        for run in runs_by_size(&sizes, MAX_BATCH_BYTES) {
            let part = &events[run.clone()];
            let send = async {
                check_literal(url, self.inner.cfg.allow_private_targets)?;
                self.consented(url).await?;
                let (body, ctype) = if part.len() == 1 {
                    (part[0].clone(), CLOUDEVENT)
                } else {
                    let mut body = Vec::with_capacity(part.iter().map(|e| e.len() + 1).sum());
                    body.push(b'[');
                    for (i, e) in part.iter().enumerate() {
                        if i > 0 {
                            body.push(b',');
                        }
                        body.extend_from_slice(e);
                    }
                    body.push(b']');
                    (body, CLOUDEVENT_BATCH)
                };
                self.send_post(url, secret, body, ctype).await
            };
            let r = match tokio::time::timeout(self.inner.cfg.attempt_timeout, send).await {
                Ok(r) => r,
                Err(_) => Err(format!("POST {url}: {}", self.no_answer())),
            };
            for p in ps.by_ref().take(run.len()) {
                self.settle(p, r.clone().map(|()| Outcome::Done)).await;
            }
        }
    }

    /// One signed POST.
    pub(super) async fn send_post(
        &self,
        url: &str,
        secret: &str,
        body: Vec<u8>,
        ctype: &str,
    ) -> Result<(), String> {
        let ts = runtime::now_ms() / 1000; // receivers compare it with their wall clock
        let mut req = hyper::Request::post(url)
            .header("content-type", ctype)
            .header(TIMESTAMP_HEADER, ts.to_string());
        if !secret.is_empty() {
            req = req.header(SIGNATURE_HEADER, sign(secret, ts, &body));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("building the request: {e}"))?;
        let resp = self.inner.http[usize::from(on_bulk())]
            .request(req)
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("POST {url}: HTTP {}", resp.status()))
        }
    }
}
