//! `dissem subscribe --file`: many subscriptions from a JSON Lines file, one subscription per
//! line with the flags of `dissem subscribe` as keys, loaded a thousand per `CreateMany` with
//! a few calls in flight. Every line is checked before the first call (a bad line is named
//! with its number and field, and nothing is created), and the file is read line by line
//! with a bound on each line, so a million-line file neither waits on one call at a time nor
//! sits in memory as text.

use std::io::BufRead;

use proto::v1;
use runtime::error::ServiceError;
use serde_json::Value;

use super::{Client, Printed, SubscribeSpec, cli_error};

/// Longest line accepted (a filter is bounded far below this by the node's limits).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Most lines in one file.
pub const MAX_LINES: usize = 10_000_000;

/// `CreateMany` calls in flight.
const IN_FLIGHT: usize = 4;

/// One line's subscription, its fields named `line N: field`.
pub fn parse_line(text: &str, line: usize) -> Result<v1::Subscription, ServiceError> {
    let field = |f: &str| format!("line {line}: {f}");
    let bad = |f: &str, why: String| ServiceError::invalid(field(f), why);
    let v: Value = serde_json::from_str(text)
        .map_err(|e| bad("(the line)", format!("not a JSON object: {e}")))?;
    let Value::Object(map) = v else {
        return Err(bad("(the line)", "not a JSON object".into()));
    };
    let mut spec = SubscribeSpec::default();
    let (mut filter, mut target) = (false, false);
    let string = |k: &str, v: &Value| -> Result<String, ServiceError> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| bad(k, format!("a string is required, got {v}")))
    };
    let number = |k: &str, v: &Value| -> Result<u64, ServiceError> {
        v.as_u64()
            .ok_or_else(|| bad(k, format!("a non-negative integer is required, got {v}")))
    };
    let small = |k: &str, v: &Value| -> Result<u32, ServiceError> {
        u32::try_from(number(k, v)?).map_err(|_| bad(k, format!("{v} is out of range")))
    };
    for (k, v) in &map {
        match k.as_str() {
            "filter" => {
                filter = true;
                // an EventBridge pattern may be given as the JSON object itself
                spec.filter = match v {
                    Value::Object(_) => v.to_string(),
                    _ => string(k, v)?,
                };
            }
            "target" => {
                target = true;
                spec.target = string(k, v)?;
            }
            "qos" => spec.qos = Some(small(k, v)?),
            "priority" => spec.priority = small(k, v)?,
            "secret" => spec.secret = Some(string(k, v)?),
            "max_attempts" => spec.max_attempts = Some(small(k, v)?),
            "ttl_ms" => spec.ttl_ms = Some(number(k, v)?),
            "push_batch" => spec.push_batch = Some(small(k, v)?),
            "headers" => {
                let Value::Array(hs) = v else {
                    return Err(bad(
                        k,
                        "an array of \"Name: value\" strings is required".into(),
                    ));
                };
                spec.headers = hs.iter().map(|h| string(k, h)).collect::<Result<_, _>>()?;
            }
            "name" => spec.name = Some(string(k, v)?),
            "ordered" => {
                spec.ordered = v
                    .as_bool()
                    .ok_or_else(|| bad(k, format!("true or false is required, got {v}")))?;
            }
            other => {
                return Err(bad(
                    other,
                    "unknown key (filter, target, qos, priority, secret, max_attempts, ttl_ms, \
                     push_batch, headers, name, ordered)"
                        .into(),
                ));
            }
        }
    }
    if !filter {
        return Err(bad("filter", "required".into()));
    }
    if !target {
        return Err(bad("target", "required".into()));
    }
    spec.to_subscription().map_err(|e| match e {
        ServiceError::InvalidArgument { field: f, reason } => {
            let key = match f.trim_start_matches("--") {
                "header" => "headers",
                k => k,
            };
            ServiceError::invalid(field(key), reason)
        }
        e => e,
    })
}

/// Reads and checks every line of `path` (blank lines and lines starting with `#` are
/// skipped).
pub fn read_file(path: &std::path::Path) -> Result<Vec<v1::Subscription>, ServiceError> {
    let named = |why: String| ServiceError::invalid("--file", why);
    let f = std::fs::File::open(path).map_err(|e| named(format!("{}: {e}", path.display())))?;
    let mut r = std::io::BufReader::new(f);
    let mut subs = Vec::new();
    let mut buf = Vec::new();
    let mut line = 0usize;
    loop {
        buf.clear();
        let n = std::io::Read::take(&mut r, MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| named(format!("{}: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        line += 1;
        if buf.len() > MAX_LINE_BYTES {
            return Err(named(format!(
                "line {line} is longer than {MAX_LINE_BYTES} bytes"
            )));
        }
        if subs.len() >= MAX_LINES {
            return Err(named(format!("more than {MAX_LINES} subscriptions")));
        }
        let text = std::str::from_utf8(&buf)
            .map_err(|_| named(format!("line {line} is not UTF-8")))?
            .trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        subs.push(parse_line(text, line)?);
    }
    if subs.is_empty() {
        return Err(named(format!("{} holds no subscription", path.display())));
    }
    Ok(subs)
}

/// Creates the subscriptions of `path`, [`runtime::subscriptions::MAX_CREATE_MANY`] per call
/// (each call all or none), calling `progress(created)` after each. On a refusal, says how
/// many were created before it (those stay).
pub async fn subscribe_file(
    c: Client,
    path: &std::path::Path,
    progress: impl Fn(usize, usize),
) -> Result<Printed, ServiceError> {
    let subs = read_file(path)?;
    let total = subs.len();
    let started = std::time::Instant::now();
    let mut batches = subs
        .chunks(runtime::subscriptions::MAX_CREATE_MANY)
        .map(<[v1::Subscription]>::to_vec)
        .enumerate();
    let mut ids: Vec<Vec<u64>> =
        vec![Vec::new(); total.div_ceil(runtime::subscriptions::MAX_CREATE_MANY)];
    let mut calls = tokio::task::JoinSet::new();
    let mut created = 0usize;
    let mut failed = None;
    loop {
        while failed.is_none() && calls.len() < IN_FLIGHT {
            let Some((i, batch)) = batches.next() else {
                break;
            };
            let c = c.clone();
            calls.spawn(async move { (i, c.subscribe_many(batch).await) });
        }
        let Some(done) = calls.join_next().await else {
            break;
        };
        let (i, r) = done.map_err(|e| ServiceError::Unavailable(format!("create task: {e}")))?;
        match r {
            Ok(made) => {
                created += made.len();
                ids[i] = made.iter().map(|s| s.id).collect();
                progress(created, total);
            }
            Err(e) => {
                let first = i * runtime::subscriptions::MAX_CREATE_MANY + 1;
                failed.get_or_insert((first, cli_error(e)));
            }
        }
    }
    if let Some((first, e)) = failed {
        return Err(ServiceError::Unavailable(format!(
            "{created} of {total} subscriptions were created; the batch from subscription \
             {first} on was refused: {e}"
        )));
    }
    let ids: Vec<u64> = ids.into_iter().flatten().collect();
    let secs = started.elapsed().as_secs_f64();
    let (first, last) = (ids.first().copied(), ids.last().copied());
    Ok(Printed::new(
        vec![format!(
            "{created} subscriptions created in {secs:.1} s ({:.0}/s), ids {} to {}",
            created as f64 / secs.max(1e-9),
            first.unwrap_or(0),
            last.unwrap_or(0)
        )],
        serde_json::json!({
            "created": created,
            "seconds": secs,
            "ids": ids,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_a_subscription_with_the_flags_as_keys() {
        let s = parse_line(
            r#"{"filter": "temp > 3", "target": "stream:s", "qos": 0, "priority": 7}"#,
            1,
        )
        .expect("valid");
        assert_eq!(s.priority, 7);
        assert!(matches!(
            s.filter,
            Some(v1::subscription::Filter::Text(ref t)) if t == "temp > 3"
        ));
        // an EventBridge pattern as the object itself
        let s = parse_line(
            r#"{"filter": {"site": ["a"]}, "target": "grpc:http://127.0.0.1:1"}"#,
            2,
        )
        .expect("valid");
        assert!(s.filter.is_some());
    }

    #[test]
    fn a_bad_line_is_named_with_its_number_and_field() {
        let cases = [
            ("not json", "line 3: (the line)"),
            (r#"["a"]"#, "line 3: (the line)"),
            (r#"{"target": "stream:s"}"#, "line 3: filter"),
            (r#"{"filter": "a = 1"}"#, "line 3: target"),
            (
                r#"{"filter": "a = 1", "target": "stream:s", "qos": "x"}"#,
                "line 3: qos",
            ),
            (
                r#"{"filter": "a = 1", "target": "stream:s", "colour": 1}"#,
                "line 3: colour",
            ),
            (
                r#"{"filter": "a = 1", "target": "ftp:x"}"#,
                "line 3: target",
            ),
            (
                r#"{"filter": "a = 1", "target": "stream:s", "qos": 9}"#,
                "line 3: qos",
            ),
            (
                r#"{"filter": "a = 1", "target": "stream:s", "priority": 99999999999}"#,
                "line 3: priority",
            ),
        ];
        for (text, want) in cases {
            match parse_line(text, 3) {
                Err(ServiceError::InvalidArgument { field, .. }) => {
                    assert_eq!(field, want, "{text}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_file_is_read_whole_before_anything_is_created() {
        let dir = std::env::temp_dir().join(format!("dissem-bulk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join("subs.jsonl");
        std::fs::write(
            &p,
            "# two subscriptions\n{\"filter\": \"a = 1\", \"target\": \"stream:s\"}\n\n\
             {\"filter\": \"b = 2\", \"target\": \"stream:s\"}\n",
        )
        .expect("write");
        assert_eq!(read_file(&p).expect("valid").len(), 2);
        std::fs::write(
            &p,
            "{\"filter\": \"a = 1\", \"target\": \"stream:s\"}\n{\"x\": 1}\n",
        )
        .expect("write");
        match read_file(&p) {
            Err(ServiceError::InvalidArgument { field, .. }) => assert_eq!(field, "line 2: x"),
            other => panic!("{other:?}"),
        }
        std::fs::write(&p, "\n# nothing\n").expect("write");
        assert!(read_file(&p).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
