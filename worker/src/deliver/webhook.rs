//! Webhook pushes: CloudEvents POSTs (one event, or a batch where the subscription asks for
//! one), signed, with the subscription's headers, to targets that consented to the
//! validation handshake.

use super::http_answer::{USER_AGENT, Verdict, judge};
use super::*;

/// What webhook deliveries share to go in one POST: URL, secret, extra headers and the
/// largest batch the subscription takes. Its `Debug` shows neither the secret nor header
/// values.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct HookKey {
    pub(super) url: String,
    pub(super) secret: String,
    /// Sorted by name.
    pub(super) headers: Vec<(String, String)>,
    pub(super) batch: usize,
}

impl std::fmt::Debug for HookKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookKey")
            .field("url", &self.url)
            .field("signed", &!self.secret.is_empty())
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|h| h.0.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("batch", &self.batch)
            .finish()
    }
}

impl HookKey {
    pub(super) fn of(url: &str, s: &v1::Subscription) -> HookKey {
        let mut headers: Vec<(String, String)> = s
            .webhook_headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        headers.sort();
        HookKey {
            url: url.to_string(),
            secret: s.webhook_secret.clone(),
            headers,
            batch: s.push_batch as usize,
        }
    }
}

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

    /// How many webhook events may go in one POST: what the subscription asked
    /// (`push_batch`; off by default: CloudEvents SDKs parse single events), at most the
    /// node's.
    pub(super) fn webhook_batch_size(&self, asked: usize) -> usize {
        asked.min(self.inner.cfg.push_batch).max(1)
    }

    /// Webhook events of one [`HookKey`] in one POST (several past the key's batch size or
    /// `MAX_BATCH_BYTES`): structured mode for one event, CloudEvents' batched mode for
    /// several; a 2xx acks them all.
    pub(super) async fn webhook_batch(&self, key: &HookKey, ps: Vec<Prepared>) {
        let url = key.url.as_str();
        let most = self.webhook_batch_size(key.batch);
        let events: Vec<Vec<u8>> = ps
            .iter()
            .map(|p| {
                let node = p.delivery.object_id.map_or(0, |o| o.node);
                event_json(p.object.event(), &p.delivery, node)
            })
            .collect();
        let sizes: Vec<usize> = events.iter().map(Vec::len).collect();
        let objects: Vec<Arc<CachedObject>> = ps.iter().map(|p| p.object.clone()).collect();
        let traces: Vec<&[(&'static str, String)]> = objects
            .iter()
            .map(|o| o.event().trace_headers.as_slice())
            .collect();
        let mut ps = ps.into_iter();
        let runs = runs_by_size(&sizes, MAX_BATCH_BYTES)
            .into_iter()
            .flat_map(|r| {
                (r.start..r.end)
                    .step_by(most)
                    .map(move |s| s..(s + most).min(r.end))
            });
        for run in runs {
            let part = &events[run.clone()];
            let send = async {
                check_literal(url, self.inner.cfg.allow_private_targets)?;
                self.consented(url).await?;
                let (body, ctype, trace) = if part.len() == 1 {
                    (part[0].clone(), CLOUDEVENT, traces[run.start])
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
                    // a batch's events carry their own trace contexts in their bodies
                    (body, CLOUDEVENT_BATCH, &[][..])
                };
                self.send_post(key, body, ctype, trace).await
            };
            let r = match tokio::time::timeout(self.inner.cfg.attempt_timeout, send).await {
                Ok(r) => r,
                Err(_) => Err(format!("POST {url}: {}", self.no_answer())),
            };
            for p in ps.by_ref().take(run.len()) {
                self.settle(p, r.clone()).await;
            }
        }
    }

    /// One signed POST with the key's headers (and `trace`, the W3C trace-context headers of
    /// a POST that carries one event); the answer judged ([`judge`]).
    pub(super) async fn send_post(
        &self,
        key: &HookKey,
        body: Vec<u8>,
        ctype: &str,
        trace: &[(&'static str, String)],
    ) -> Result<Outcome, String> {
        let url = key.url.as_str();
        let ts = runtime::now_ms() / 1000; // receivers compare it with their wall clock
        let mut req = hyper::Request::post(url);
        for (name, value) in &key.headers {
            req = req.header(name.as_str(), value.as_str());
        }
        for (name, value) in trace {
            req = req.header(*name, value.as_str());
        }
        req = req
            .header("content-type", ctype)
            .header("user-agent", USER_AGENT)
            .header(TIMESTAMP_HEADER, ts.to_string());
        if !key.secret.is_empty() {
            req = req.header(SIGNATURE_HEADER, sign(&key.secret, ts, &body));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("building the request: {e}"))?;
        let resp = self.inner.http[usize::from(on_bulk())]
            .request(req)
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok());
        match judge(
            url,
            resp.status(),
            retry_after,
            std::time::SystemTime::now(),
        ) {
            Verdict::Accepted => Ok(Outcome::Done),
            Verdict::Refused(reason) => Ok(Outcome::Refused(reason)),
            Verdict::Retry {
                after: Some(after),
                reason,
            } => Ok(Outcome::Throttled { after, reason }),
            Verdict::Retry {
                after: None,
                reason,
            } => Err(reason),
        }
    }
}
