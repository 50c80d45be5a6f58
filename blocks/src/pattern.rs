//! The string tests that neither a tree nor a hash table answers: EventBridge's `wildcard`
//! globs and `cidr` address ranges.
//!
//! A wildcard is a string in which `*` stands for any run of characters (none included);
//! `\*` is a literal star and `\\` a literal backslash, as in EventBridge. Two stars in a row
//! are refused, as EventBridge does, and a glob holds at most [`MAX_STARS`] of them, so the
//! matcher's backtracking stays linear in practice. A CIDR range is an IPv4 or IPv6 network
//! and a prefix length; its canonical form has the host bits cleared (`10.0.0.7/24` is
//! `10.0.0.0/24`). A value matches a range when it is an address of the same family inside it.
//! Both parse once when a block is built ([`Glob`], [`Cidr`]); the predicate model keeps their
//! canonical text.

use std::fmt;
use std::net::IpAddr;

/// The most stars one wildcard may hold.
pub const MAX_STARS: usize = 16;

/// Why a wildcard or CIDR constant was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternConstError {
    #[error("a wildcard may not hold two `*` in a row")]
    DoubleStar,
    #[error("a wildcard holds at most {MAX_STARS} `*`")]
    TooManyStars,
    #[error("a wildcard may not end with a lone backslash (write `\\\\` for one)")]
    TrailingBackslash,
    #[error("`\\{0}` is not an escape a wildcard knows (only `\\*` and `\\\\`)")]
    BadEscape(char),
    #[error("not of the form address/prefix-length (10.0.0.0/24, 2001:db8::/32)")]
    CidrShape,
    #[error("the prefix length {len} is longer than the {max} bits of the address")]
    CidrLength { len: u32, max: u32 },
}

/// A parsed wildcard: the literal pieces between the stars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    /// Literal pieces; a star stands between each two.
    pieces: Vec<String>,
}

impl Glob {
    /// Parses EventBridge's wildcard syntax.
    pub fn parse(pattern: &str) -> Result<Glob, PatternConstError> {
        let mut pieces = vec![String::new()];
        let mut chars = pattern.chars();
        let mut last_star = false;
        while let Some(c) = chars.next() {
            match c {
                '*' => {
                    if last_star {
                        return Err(PatternConstError::DoubleStar);
                    }
                    if pieces.len() > MAX_STARS {
                        return Err(PatternConstError::TooManyStars);
                    }
                    pieces.push(String::new());
                    last_star = true;
                    continue;
                }
                '\\' => match chars.next() {
                    Some(e @ ('*' | '\\')) => push_last(&mut pieces, e),
                    Some(other) => return Err(PatternConstError::BadEscape(other)),
                    None => return Err(PatternConstError::TrailingBackslash),
                },
                c => push_last(&mut pieces, c),
            }
            last_star = false;
        }
        Ok(Glob { pieces })
    }

    /// Whether the whole of `s` matches.
    pub fn matches(&self, s: &str) -> bool {
        let (first, rest) = match self.pieces.split_first() {
            Some(x) => x,
            None => return s.is_empty(),
        };
        let Some(mut s) = s.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return s.is_empty();
        };
        // Each middle piece is taken at its first occurrence: an earlier match leaves more
        // room for what follows, so this is exact without backtracking.
        for piece in middle {
            match s.find(piece.as_str()) {
                Some(at) => s = &s[at + piece.len()..],
                None => return false,
            }
        }
        s.ends_with(last.as_str())
    }
}

fn push_last(pieces: &mut [String], c: char) {
    if let Some(last) = pieces.last_mut() {
        last.push(c);
    }
}

/// Whether `pattern` is a wildcard that [`Glob::parse`] accepts.
pub fn check_wildcard(pattern: &str) -> Result<(), PatternConstError> {
    Glob::parse(pattern).map(|_| ())
}

/// Whether `s` matches the wildcard (false for a malformed wildcard, which validation refuses
/// before it reaches a block).
pub fn wildcard_matches(pattern: &str, s: &str) -> bool {
    Glob::parse(pattern).is_ok_and(|g| g.matches(s))
}

/// A parsed CIDR range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    len: u32,
}

impl Cidr {
    /// Parses `address/length`, clearing the host bits.
    pub fn parse(text: &str) -> Result<Cidr, PatternConstError> {
        let (addr, len) = text
            .trim()
            .split_once('/')
            .ok_or(PatternConstError::CidrShape)?;
        let addr: IpAddr = addr.parse().map_err(|_| PatternConstError::CidrShape)?;
        if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) || len.len() > 3 {
            return Err(PatternConstError::CidrShape);
        }
        let len: u32 = len.parse().map_err(|_| PatternConstError::CidrShape)?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(PatternConstError::CidrLength { len, max });
        }
        let net = match addr {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) & mask32(len)).into()),
            IpAddr::V6(a) => IpAddr::V6((u128::from(a) & mask128(len)).into()),
        };
        Ok(Cidr { net, len })
    }

    /// Whether an address lies inside the range (a different family never does).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.net, addr) {
            (IpAddr::V4(n), IpAddr::V4(a)) => u32::from(a) & mask32(self.len) == u32::from(n),
            (IpAddr::V6(n), IpAddr::V6(a)) => u128::from(a) & mask128(self.len) == u128::from(n),
            _ => false,
        }
    }

    /// Whether a metadata string is an address inside the range.
    pub fn contains_text(&self, s: &str) -> bool {
        s.parse::<IpAddr>().is_ok_and(|a| self.contains(a))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.len)
    }
}

fn mask32(len: u32) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - len) }
}

fn mask128(len: u32) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    }
}

/// The canonical text of a CIDR constant (host bits cleared), or why it is refused.
pub fn canonical_cidr(text: &str) -> Result<String, PatternConstError> {
    Cidr::parse(text).map(|c| c.to_string())
}

/// Whether `s` is an address inside the canonical range `cidr` (false for a malformed range).
pub fn cidr_matches(cidr: &str, s: &str) -> bool {
    Cidr::parse(cidr).is_ok_and(|c| c.contains_text(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The obvious recursive definition, to check the greedy matcher against.
    fn slow(p: &[char], s: &[char]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some(('*', rest)) => (0..=s.len()).any(|i| slow(rest, &s[i..])),
            Some((c, rest)) => s.first() == Some(c) && slow(rest, &s[1..]),
        }
    }

    #[test]
    fn wildcards_agree_with_the_recursive_definition() {
        let patterns = [
            "", "*", "a", "a*", "*a", "*a*", "a*b", "*ab*ba*", "a*a*a", "*.png", "dir/*/x*", "ab*",
            "*b*", "é*ö",
        ];
        let values = [
            "", "a", "ab", "ba", "aba", "abba", "aaa", "aa", "x.png", ".png", "dir/q/xy", "dir//x",
            "éö", "éxö", "abab", "babab",
        ];
        for p in patterns {
            let g = Glob::parse(p).expect(p);
            let pc: Vec<char> = p.chars().collect();
            for v in values {
                let vc: Vec<char> = v.chars().collect();
                assert_eq!(g.matches(v), slow(&pc, &vc), "{p:?} on {v:?}");
            }
        }
    }

    #[test]
    fn escapes_and_refusals() {
        assert!(Glob::parse(r"a\*b").expect("escape").matches("a*b"));
        assert!(!Glob::parse(r"a\*b").expect("escape").matches("axb"));
        assert!(Glob::parse(r"a\\*").expect("escape").matches(r"a\zz"));
        assert_eq!(Glob::parse("a**"), Err(PatternConstError::DoubleStar));
        assert_eq!(
            Glob::parse(r"a\"),
            Err(PatternConstError::TrailingBackslash)
        );
        assert_eq!(Glob::parse(r"a\n"), Err(PatternConstError::BadEscape('n')));
        let many = "a*".repeat(MAX_STARS + 1);
        assert_eq!(Glob::parse(&many), Err(PatternConstError::TooManyStars));
        assert!(Glob::parse(&"a*".repeat(MAX_STARS)).is_ok());
    }

    #[test]
    fn cidr_ranges() {
        let c = Cidr::parse("10.0.0.7/24").expect("v4");
        assert_eq!(c.to_string(), "10.0.0.0/24");
        assert!(c.contains_text("10.0.0.255"));
        assert!(!c.contains_text("10.0.1.0"));
        assert!(!c.contains_text("::ffff:10.0.0.1"));
        assert!(!c.contains_text("not an address"));
        let all = Cidr::parse("0.0.0.0/0").expect("all");
        assert!(all.contains_text("255.1.2.3"));
        let v6 = Cidr::parse("2001:DB8::1/32").expect("v6");
        assert_eq!(v6.to_string(), "2001:db8::/32");
        assert!(v6.contains_text("2001:db8:ffff::1"));
        assert!(!v6.contains_text("2001:db9::1"));
        assert!(!v6.contains_text("10.0.0.1"));
        assert_eq!(
            Cidr::parse("10.0.0.0/33"),
            Err(PatternConstError::CidrLength { len: 33, max: 32 })
        );
        for bad in ["10.0.0.0", "10.0.0/8", "10.0.0.0/+8", "10.0.0.0/", "x/8"] {
            assert_eq!(Cidr::parse(bad), Err(PatternConstError::CidrShape), "{bad}");
        }
    }
}
