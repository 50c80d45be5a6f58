//! What a webhook's HTTP answer means for the delivery: 2xx acknowledges; 408, 429 and 5xx
//! are worth a retry (after the receiver's `Retry-After`, when it sends one); any other 4xx
//! says the receiver will never take this event, so it is dead-lettered at once with the
//! status instead of being retried for a day.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest `Retry-After` honoured (a longer one waits this long; the TTL still applies).
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The `User-Agent` of every request the node makes to a webhook.
pub(super) const USER_AGENT: &str = concat!("dissem/", env!("CARGO_PKG_VERSION"));

/// The verdict on one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// 2xx.
    Accepted,
    /// Worth another attempt, not before `after` when the receiver said so.
    Retry {
        after: Option<Duration>,
        reason: String,
    },
    /// Never worth another attempt: dead-letter now.
    Refused(String),
}

/// Judges `status` (with its `Retry-After` header value, if any) of a POST to `url`; `now`
/// is the current wall-clock time (an HTTP-date is absolute).
pub(super) fn judge(
    url: &str,
    status: http::StatusCode,
    retry_after: Option<&str>,
    now: SystemTime,
) -> Verdict {
    if status.is_success() {
        return Verdict::Accepted;
    }
    let code = status.as_u16();
    let reason = format!("POST {url}: HTTP {status}");
    if status.is_client_error() && code != 408 && code != 429 {
        return Verdict::Refused(format!(
            "{reason} (a 4xx other than 408 and 429 is not retried)"
        ));
    }
    let after = retry_after
        .and_then(|v| parse_retry_after(v, now))
        .map(|d| d.min(MAX_RETRY_AFTER));
    Verdict::Retry { after, reason }
}

/// A `Retry-After` value: delay-seconds, or an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`)
/// relative to `now` (a date in the past is no delay). Anything else is ignored.
pub(super) fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = parse_imf_fixdate(v)?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

/// Seconds since the epoch of an IMF-fixdate (RFC 9110 §5.6.7).
fn parse_imf_fixdate(v: &str) -> Option<u64> {
    let mut parts = v.split_ascii_whitespace();
    let _weekday = parts.next()?.strip_suffix(',')?;
    let day: u64 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = parts.next()?.parse().ok()?;
    let mut hms = parts.next()?.split(':');
    let (h, m, s): (u64, u64, u64) = (
        hms.next()?.parse().ok()?,
        hms.next()?.parse().ok()?,
        hms.next()?.parse().ok()?,
    );
    if parts.next()? != "GMT" || parts.next().is_some() || hms.next().is_some() {
        return None;
    }
    if !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 || !(1970..=9999).contains(&year) {
        return None;
    }
    // days from civil (Howard Hinnant)
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days)
        .ok()
        .map(|d| d * 86_400 + h * 3600 + m * 60 + s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn client_errors_are_refused_but_408_429_and_5xx_are_retried() {
        let j = |c: u16| {
            judge(
                "http://h/",
                http::StatusCode::from_u16(c).expect("code"),
                None,
                at(0),
            )
        };
        assert_eq!(j(200), Verdict::Accepted);
        assert_eq!(j(204), Verdict::Accepted);
        for c in [400, 401, 403, 404, 410, 413, 422] {
            assert!(
                matches!(j(c), Verdict::Refused(r) if r.contains(&c.to_string())),
                "{c}"
            );
        }
        for c in [408, 429, 500, 502, 503] {
            assert!(matches!(j(c), Verdict::Retry { after: None, .. }), "{c}");
        }
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date_is_honoured_up_to_an_hour() {
        let v = judge("u", http::StatusCode::TOO_MANY_REQUESTS, Some("7"), at(0));
        assert!(matches!(v, Verdict::Retry { after: Some(d), .. } if d == Duration::from_secs(7)));
        // 784111777 is Sun, 06 Nov 1994 08:49:37 GMT
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse_imf_fixdate(date), Some(784_111_777));
        assert_eq!(
            parse_retry_after(date, at(784_111_777 - 30)),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after(date, at(784_111_777 + 5)),
            Some(Duration::ZERO)
        );
        let v = judge(
            "u",
            http::StatusCode::SERVICE_UNAVAILABLE,
            Some("999999"),
            at(0),
        );
        assert!(matches!(v, Verdict::Retry { after: Some(d), .. } if d == MAX_RETRY_AFTER));
        for bad in [
            "soon",
            "-3",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "",
        ] {
            assert_eq!(parse_retry_after(bad, at(0)), None, "{bad:?}");
        }
    }
}
