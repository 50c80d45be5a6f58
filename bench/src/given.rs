//! A user's own workload for `dissem bench match --patterns FILE --events FILE`: their
//! filters (one per line: EventBridge JSON when it starts with `{`, else the text syntax) and
//! their JSON events (one object per line), instead of a generated workload, so a deployment
//! can be sized for its own rules. Every engine is compared with the naive reference as
//! with the generated workloads.
//!
//! Filters go through the same validation and limits as a subscription's. An event's nested
//! objects name attributes by their dotted path (as EventBridge does); booleans and `null` are
//! the text `true`, `false`, `null` (object metadata has no such types, as in `dissem
//! test-pattern`); an array is refused, naming its line and path, since object metadata has
//! one value per attribute. Blank lines and lines starting with `#` are skipped. Errors name
//! the file and line.

use std::path::Path;

use anyhow::{Context, bail};
use blocks::{Dnf, Event, Value};
use proto::v1;

/// The deepest object nesting of an event.
const MAX_DEPTH: usize = 32;

/// The largest file read (each of the two).
const MAX_FILE_BYTES: u64 = 1 << 30;

/// The filters and events read from the user's files.
#[derive(Debug, Clone, Default)]
pub struct Given {
    pub subscriptions: Vec<Dnf>,
    pub events: Vec<Event>,
}

fn lines(path: &Path) -> anyhow::Result<Vec<(usize, String)>> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if len > MAX_FILE_BYTES {
        bail!(
            "{}: {len} bytes exceed the limit of {MAX_FILE_BYTES}",
            path.display()
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim().to_string()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .collect())
}

/// One filter line as the registry would take it.
fn filter(line: &str, limits: &runtime::Limits) -> Result<Dnf, runtime::ServiceError> {
    let f = if line.starts_with('{') {
        v1::subscription::Filter::Eventbridge(line.to_string())
    } else {
        v1::subscription::Filter::Text(line.to_string())
    };
    runtime::validate::filter(
        &v1::Subscription {
            filter: Some(f),
            ..v1::Subscription::default()
        },
        limits,
    )
}

fn flatten(
    path: &str,
    v: &serde_json::Value,
    depth: usize,
    out: &mut Vec<(String, Value)>,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "objects nest more than {MAX_DEPTH} levels at {path}"
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
                flatten(&p, x, depth + 1, out)?;
            }
            return Ok(());
        }
        serde_json::Value::Array(_) => {
            return Err(format!(
                "{path} is an array; object metadata has one value per attribute"
            ));
        }
        scalar => runtime::test_pattern::json_scalar(path, scalar)?,
    };
    out.push((path.to_string(), scalar));
    Ok(())
}

/// One event line.
fn event(line: &str) -> Result<Event, String> {
    let json: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    if !json.is_object() {
        return Err("must be a JSON object".into());
    }
    let mut attrs = Vec::new();
    flatten("", &json, 0, &mut attrs)?;
    Ok(Event { attrs })
}

/// Reads `patterns` and `events`; neither may be empty.
pub fn load(patterns: &Path, events: &Path) -> anyhow::Result<Given> {
    let limits = runtime::Limits::default();
    let mut g = Given::default();
    for (n, l) in lines(patterns)? {
        let d =
            filter(&l, &limits).map_err(|e| anyhow::anyhow!("{}:{n}: {e}", patterns.display()))?;
        g.subscriptions.push(d);
    }
    for (n, l) in lines(events)? {
        let e = event(&l).map_err(|e| anyhow::anyhow!("{}:{n}: {e}", events.display()))?;
        g.events.push(e);
    }
    if g.subscriptions.is_empty() {
        bail!("{}: no filter in it", patterns.display());
    }
    if g.events.is_empty() {
        bail!("{}: no event in it", events.display());
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_flatten_to_dotted_paths_and_arrays_are_refused() {
        let e = event(r#"{"source":"aws.ec2","detail":{"state":"running","n":5,"ok":true}}"#)
            .expect("event");
        assert_eq!(e.get("detail.state"), Some(&Value::Str("running".into())));
        assert_eq!(e.get("detail.n"), Some(&Value::Num(blocks::Num::from(5))));
        assert_eq!(e.get("detail.ok"), Some(&Value::Str("true".into())));
        let err = event(r#"{"resources":["a","b"]}"#).expect_err("array");
        assert!(err.contains("resources is an array"), "{err}");
        assert!(event("[1]").is_err());
        assert!(event("{").is_err());
    }

    #[test]
    fn both_filter_syntaxes_are_taken() {
        let limits = runtime::Limits::default();
        assert!(filter(r#"{"detail":{"state":["running"]}}"#, &limits).is_ok());
        assert!(filter("temp > 30 && site prefix \"kr/\"", &limits).is_ok());
        assert!(filter(r#"{"detail":{"state":"running"}}"#, &limits).is_err());
    }
}
