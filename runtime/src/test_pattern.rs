//! `dissem test-pattern`: whether one JSON event matches a filter, as EventBridge's
//! TestEventPattern answers it, evaluated with the same predicate semantics the match blocks
//! use. Nested objects name attributes by their dotted path; an array matches a predicate
//! when any of its elements does; booleans and `null` are the text `true`, `false`, `null`
//! (object metadata has no boolean or null type).

use blocks::{Dnf, Num, Value};

use crate::config::Limits;
use crate::error::ServiceError;
use proto::v1;

/// The deepest object nesting of a test event.
const MAX_EVENT_DEPTH: usize = 32;
/// The largest test event.
const MAX_EVENT_BYTES: usize = 1 << 20;

/// A JSON scalar at `path` as a metadata value: strings as text, numbers exactly (or an
/// error naming the path), booleans and `null` as the text `true`, `false`, `null` (object
/// metadata has no such types). Objects and arrays are the caller's to walk.
pub fn json_scalar(path: &str, v: &serde_json::Value) -> Result<Value, String> {
    Ok(match v {
        serde_json::Value::String(s) => Value::Str(s.clone()),
        serde_json::Value::Number(n) => Value::Num(
            Num::parse(&n.to_string())
                .map_err(|e| format!("{path}: {n} is not an exact number: {e}"))?,
        ),
        serde_json::Value::Bool(b) => Value::Str(b.to_string()),
        serde_json::Value::Null => Value::Str("null".into()),
        serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
            return Err(format!("{path}: not a single value"));
        }
    })
}

/// An event's attributes, each with every value it has (several for an array).
#[derive(Debug, Default)]
struct Values(std::collections::BTreeMap<String, Vec<Value>>);

impl Values {
    fn add(&mut self, path: &str, v: &serde_json::Value, depth: usize) -> Result<(), ServiceError> {
        if depth > MAX_EVENT_DEPTH {
            return Err(ServiceError::invalid(
                "--event",
                format!("objects nest more than {MAX_EVENT_DEPTH} levels deep at {path}"),
            ));
        }
        let scalar = match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    self.add(&p, x, depth + 1)?;
                }
                return Ok(());
            }
            serde_json::Value::Array(items) => {
                for x in items {
                    self.add(path, x, depth + 1)?;
                }
                return Ok(());
            }
            scalar => json_scalar(path, scalar).map_err(|e| ServiceError::invalid("--event", e))?,
        };
        self.0.entry(path.to_string()).or_default().push(scalar);
        Ok(())
    }

    fn matches(&self, dnf: &Dnf) -> bool {
        dnf.0.iter().any(|c| {
            c.0.iter().all(|p| match self.0.get(&p.attr) {
                None => p.eval(None),
                Some(vs) => vs.iter().any(|v| p.eval(Some(v))),
            })
        })
    }
}

/// Whether `event` (a JSON object) matches `pattern` (EventBridge JSON when it starts with
/// `{`, else the text syntax), under the same limits as a subscription's filter.
pub fn test_pattern(pattern: &str, event: &str, limits: &Limits) -> Result<bool, ServiceError> {
    let filter = if pattern.trim_start().starts_with('{') {
        v1::subscription::Filter::Eventbridge(pattern.to_string())
    } else {
        v1::subscription::Filter::Text(pattern.to_string())
    };
    let s = v1::Subscription {
        filter: Some(filter),
        ..v1::Subscription::default()
    };
    let dnf = crate::validate::filter(&s, limits)?;
    if event.len() > MAX_EVENT_BYTES {
        return Err(ServiceError::invalid(
            "--event",
            format!(
                "{} bytes exceed the limit of {MAX_EVENT_BYTES}",
                event.len()
            ),
        ));
    }
    let json: serde_json::Value = serde_json::from_str(event)
        .map_err(|e| ServiceError::invalid("--event", format!("not JSON: {e}")))?;
    if !json.is_object() {
        return Err(ServiceError::invalid("--event", "must be a JSON object"));
    }
    let mut values = Values::default();
    values.add("", &json, 0)?;
    Ok(values.matches(&dnf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(p: &str, e: &str) -> bool {
        test_pattern(p, e, &Limits::default()).expect("valid")
    }

    /// Patterns and events from the AWS EventBridge documentation's examples.
    #[test]
    fn eventbridge_examples_match_as_documented() {
        let event = r#"{"source":"aws.ec2","detail-type":"EC2 Instance State-change Notification",
            "resources":["arn:aws:ec2:us-east-1:123456789012:instance/i-1234567890abcdef0"],
            "detail":{"instance-id":"i-1234567890abcdef0","state":"terminated","c-count":5}}"#;
        assert!(t(
            r#"{"source":["aws.ec2"],"detail":{"state":["terminated","stopped"]}}"#,
            event
        ));
        assert!(!t(r#"{"source":["aws.s3"]}"#, event));
        assert!(t(
            r#"{"detail":{"c-count":[{"numeric":[">",0,"<=",5]}]}}"#,
            event
        ));
        assert!(!t(r#"{"detail":{"c-count":[{"numeric":[">",5]}]}}"#, event));
        assert!(t(
            r#"{"detail":{"state":[{"anything-but":"running"}]}}"#,
            event
        ));
        assert!(
            t(r#"{"resources":[{"prefix":"arn:aws:ec2:"}]}"#, event),
            "any array element"
        );
        assert!(t(r#"{"detail":{"nope":[{"exists":false}]}}"#, event));
        assert!(!t(r#"{"detail":{"nope":[{"exists":true}]}}"#, event));
        assert!(t(
            "detail.state = \"terminated\" && detail.c-count >= 5",
            event
        ));
    }

    #[test]
    fn bad_input_names_its_flag() {
        let l = Limits::default();
        let e = test_pattern("{", "{}", &l)
            .expect_err("bad pattern")
            .to_string();
        assert!(e.contains("eventbridge"), "{e}");
        let e = test_pattern("a = 1", "[1]", &l)
            .expect_err("not an object")
            .to_string();
        assert!(e.contains("--event"), "{e}");
        let deep = format!("{}1{}", "{\"a\":".repeat(40), "}".repeat(40));
        let e = test_pattern("a = 1", &deep, &l)
            .expect_err("deep")
            .to_string();
        assert!(e.contains("nest"), "{e}");
    }
}
