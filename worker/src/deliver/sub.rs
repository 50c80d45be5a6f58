//! A subscription as delivery holds it: the registry's record, with what every delivery asks
//! of it worked out once, when it is looked up: its QoS (validated) and the key of its
//! endpoint's queue. Before, each delivery validated the QoS again at every step and
//! formatted its endpoint key anew.

use std::ops::Deref;
use std::sync::Arc;

use proto::v1;

/// A looked-up subscription (derefs to the registry's record).
#[derive(Debug)]
pub(crate) struct Sub {
    raw: v1::Subscription,
    /// Its QoS (an unset one is at least once).
    pub(crate) qos: v1::Qos,
    /// The key of its endpoint's queue: `grpc URL`, `webhook URL` or `stream NAME`.
    pub(crate) endpoint: Arc<str>,
}

impl Sub {
    pub(crate) fn new(raw: v1::Subscription) -> Sub {
        let endpoint: Arc<str> = match raw.target.as_ref().and_then(|t| t.kind.as_ref()) {
            Some(v1::target::Kind::Grpc(u)) => format!("grpc {u}").into(),
            Some(v1::target::Kind::Webhook(u)) => format!("webhook {u}").into(),
            Some(v1::target::Kind::Stream(n)) => format!("stream {n}").into(),
            None => "none".into(),
        };
        Sub {
            qos: runtime::validate::qos(&raw),
            endpoint,
            raw,
        }
    }

    /// QoS 2: the two-phase handshake.
    pub(crate) fn exactly_once(&self) -> bool {
        self.qos == v1::Qos::ExactlyOnce
    }
}

impl Deref for Sub {
    type Target = v1::Subscription;

    fn deref(&self) -> &v1::Subscription {
        &self.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(kind: Option<v1::target::Kind>, qos: v1::Qos) -> Sub {
        Sub::new(v1::Subscription {
            id: 3,
            target: kind.map(|k| v1::Target { kind: Some(k) }),
            qos: qos as i32,
            ..v1::Subscription::default()
        })
    }

    #[test]
    fn the_endpoint_key_names_the_kind_and_the_address() {
        let g = sub(
            Some(v1::target::Kind::Grpc("http://a:1".into())),
            v1::Qos::ExactlyOnce,
        );
        assert_eq!(&*g.endpoint, "grpc http://a:1");
        assert!(g.exactly_once());
        let w = sub(
            Some(v1::target::Kind::Webhook("http://a:1".into())),
            v1::Qos::AtLeastOnce,
        );
        assert_eq!(
            &*w.endpoint, "webhook http://a:1",
            "another queue than gRPC's"
        );
        let s = sub(
            Some(v1::target::Kind::Stream("x".into())),
            v1::Qos::AtMostOnce,
        );
        assert_eq!(&*s.endpoint, "stream x");
        assert_eq!(s.qos, v1::Qos::AtMostOnce);
        assert_eq!(&*sub(None, v1::Qos::AtLeastOnce).endpoint, "none");
        assert_eq!(s.id, 3, "the record shows through");
    }

    #[test]
    fn an_unset_qos_is_at_least_once() {
        let s = Sub::new(v1::Subscription::default());
        assert_eq!(s.qos, v1::Qos::AtLeastOnce);
        assert!(!s.exactly_once());
    }
}
