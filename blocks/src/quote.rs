//! Quoting caller-supplied text inside error messages, bounded: an error must never echo a
//! multi-megabyte value back (gRPC puts the message in a header, which the client then cannot
//! read).

/// How many characters of a bad value an error message quotes.
pub const QUOTE_CHARS: usize = 100;

/// `s` itself when short, else its first [`QUOTE_CHARS`] characters, an ellipsis and the
/// full length in bytes.
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(QUOTE_CHARS) {
        None => s.to_string(),
        Some((cut, _)) => format!("{}... ({} bytes)", &s[..cut], s.len()),
    }
}

/// [`clip`], then quoted as Rust's `{:?}` would (escapes included).
pub fn quoted(s: &str) -> String {
    match s.char_indices().nth(QUOTE_CHARS) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &s[..cut], s.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_and_long_text_is_cut_with_its_length() {
        assert_eq!(clip("abc"), "abc");
        assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
        let long = "9".repeat(3_000_000);
        let c = clip(&long);
        assert!(c.len() < 150, "{}", c.len());
        assert!(c.ends_with("... (3000000 bytes)"), "{c}");
        let q = quoted(&"é".repeat(500));
        assert!(q.len() < 250 && q.ends_with("(1000 bytes)"), "{q}");
    }
}
