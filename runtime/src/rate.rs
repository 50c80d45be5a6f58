//! Per-connection request rate limiting: a token bucket per client connection (keyed by the
//! peer address, which is unique per TCP connection). Over the limit a request gets
//! `ResourceExhausted` instead of being stored, so one noisy writer cannot starve the rest.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Token buckets per connection.
#[derive(Debug)]
pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<SocketAddr, Bucket>>,
}

impl RateLimiter {
    /// `per_second` requests per connection, with bursts up to one second's worth.
    pub fn new(per_second: u32) -> RateLimiter {
        RateLimiter {
            per_second: per_second as f64,
            burst: per_second.max(1) as f64,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `peer`; false when the connection is over its rate.
    pub fn allow(&self, peer: Option<SocketAddr>, now: Instant) -> bool {
        let Some(peer) = peer else {
            return true; // not a TCP connection (in-process): nothing to key on
        };
        let mut map = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 100_000 {
            // forget connections idle for a minute (their buckets are full again anyway)
            map.retain(|_, b| now.duration_since(b.last).as_secs() < 60);
        }
        let b = map.entry(peer).or_insert(Bucket {
            tokens: self.burst,
            last: now,
        });
        b.tokens =
            (b.tokens + now.duration_since(b.last).as_secs_f64() * self.per_second).min(self.burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bursts_then_refills_per_connection() {
        let r = RateLimiter::new(10);
        let t0 = Instant::now();
        let a: SocketAddr = "127.0.0.1:1000".parse().expect("addr");
        let b: SocketAddr = "127.0.0.1:1001".parse().expect("addr");
        assert_eq!((0..20).filter(|_| r.allow(Some(a), t0)).count(), 10);
        assert!(
            r.allow(Some(b), t0),
            "another connection has its own bucket"
        );
        assert!(!r.allow(Some(a), t0));
        assert!(
            r.allow(Some(a), t0 + Duration::from_millis(150)),
            "refilled after 100+ ms"
        );
        assert!(r.allow(None, t0));
    }
}
