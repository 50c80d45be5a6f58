//! The trace spans the origin node records for a traced object ([`crate::trace`]): its put,
//! its tests and match (from the match worker's timings in `Daemon.Matched`), and each push
//! attempt. Nothing is read or recorded unless the node exports spans.

use super::*;

use crate::trace::{AttrValue, Span, TraceContext, Tracer};

/// OTLP span kinds.
const INTERNAL: u8 = 1;
const SERVER: u8 = 2;
const PRODUCER: u8 = 4;

impl Deliverer {
    /// The exporter of this node's spans, when it has one.
    pub fn tracer(&self) -> Option<&Tracer> {
        self.inner.tracer.get()
    }

    /// Exports this node's spans through `tracer` from now on (once; a second is ignored).
    pub fn set_tracer(&self, tracer: Tracer) {
        let _ = self.inner.tracer.set(tracer);
    }

    /// The `dissem.put` span of a stored object: from `start_unix_us` (the put's arrival) to
    /// now (its acknowledgement).
    pub fn trace_put(
        &self,
        id: ObjectId,
        metadata: &[(String, blocks::Value)],
        start_unix_us: u64,
    ) {
        let Some(t) = self.tracer() else { return };
        let Some(ctx) = TraceContext::of_values(metadata) else {
            return;
        };
        let object = (id.node, id.seq);
        let mut span = Span::step(
            &ctx,
            "dissem.put",
            SERVER,
            object,
            0,
            (start_unix_us, runtime::now_us()),
        );
        span.span_id = ctx.put_span(object);
        span.parent_id = ctx.parent_id.clone();
        t.record(span);
    }

    /// The `dissem.test` and `dissem.match` spans of traced objects whose matches arrived.
    pub fn trace_matched(&self, objects: &[v1::ObjectMatches]) {
        let Some(t) = self.tracer() else { return };
        for o in objects {
            let Some(id) = o.id else { continue };
            let id = ObjectId {
                node: id.node,
                seq: id.seq,
            };
            if o.match_started_unix_us == 0 {
                continue;
            }
            let Ok(Some(obj)) = self.object(id) else {
                continue;
            };
            let Some(ctx) = TraceContext::of_attributes(&obj.metadata) else {
                continue;
            };
            let object = (id.node, id.seq);
            let arrived = obj.stored.received_unix_ms * 1000;
            let (m0, m1) = (o.match_started_unix_us, o.match_finished_unix_us);
            t.record(Span::step(
                &ctx,
                "dissem.test",
                INTERNAL,
                object,
                0,
                (arrived, m0),
            ));
            let mut m = Span::step(&ctx, "dissem.match", INTERNAL, object, 0, (m0, m1));
            m.attributes.push((
                "dissem.matches",
                AttrValue::Int(o.subscriptions.len() as i64),
            ));
            t.record(m);
        }
    }

    /// The `dissem.push` span of one settled attempt (`error`: why it failed).
    pub(super) fn trace_push(&self, p: &Prepared, error: Option<String>) {
        let Some(t) = self.tracer() else { return };
        let Some(ctx) = TraceContext::of_attributes(&p.object.metadata) else {
            return;
        };
        let obj = p.job.obj;
        let end = runtime::now_us();
        let start = end.saturating_sub(p.started.elapsed().as_micros() as u64);
        let attempt = u64::from(p.attempts) + 1;
        let mut span = Span::step(
            &ctx,
            "dissem.push",
            PRODUCER,
            (obj.node, obj.seq),
            p.job.sub.rotate_left(16) ^ attempt,
            (start, end),
        );
        span.attributes.extend([
            ("dissem.subscription", AttrValue::Int(p.job.sub as i64)),
            ("dissem.attempt", AttrValue::Int(attempt as i64)),
            (
                "dissem.target_kind",
                AttrValue::Str(figures::TargetKind::of(&p.s).label().to_string()),
            ),
        ]);
        span.error = error;
        t.record(span);
    }
}
