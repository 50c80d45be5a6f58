//! Fuzz-style tests of every parser and decoder that takes caller input (text filters,
//! EventBridge patterns, data images, numbers): random bytes, mutations of valid inputs and
//! adversarial shapes (deep nesting, long chains, huge numbers, duplicate keys). Each input
//! is parsed on a thread with a small stack, so a parser that recursed without a bound would
//! overflow it and fail the test instead of passing by luck on a big main-thread stack; each
//! must answer within a time bound.

use std::time::{Duration, Instant};

use blocks::eventbridge::parse_pattern;
use blocks::formula::MAX_NESTING;
use blocks::image::{decode_delta, decode_shard};
use blocks::text::parse_text;
use blocks::{Dnf, Num};
use proptest::prelude::*;

/// Stack for the parsing thread: far below a tokio worker's 2 MiB.
const STACK: usize = 256 * 1024;
/// Longest any single input may take (debug build, slow machine).
const BOUND: Duration = Duration::from_secs(2);

/// Runs `f` on a small-stack thread; fails on a panic, an overflow or a slow answer.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let start = Instant::now();
    let out = std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("spawn")
        .join()
        .unwrap_or_else(|_| panic!("{what}: the parser panicked"));
    let took = start.elapsed();
    assert!(took < BOUND, "{what}: took {took:?}");
    out
}

fn text(input: String) -> Result<Dnf, String> {
    bounded("text filter", move || {
        parse_text(&input).map_err(|e| e.to_string())
    })
}

fn pattern(input: String) -> Result<Dnf, String> {
    bounded("eventbridge pattern", move || {
        parse_pattern(&input).map_err(|e| e.to_string())
    })
}

#[test]
fn deep_parentheses_are_refused_naming_the_limit() {
    for depth in [MAX_NESTING + 1, 2_000, 30_000] {
        let f = format!("{}a > 1{}", "(".repeat(depth), ")".repeat(depth));
        let e = text(f).expect_err("too deep");
        assert!(e.contains("nesting limit"), "{e}");
        assert!(e.len() < 300, "{e}");
    }
    // unbalanced, too
    let e = text("(".repeat(100_000)).expect_err("too deep");
    assert!(e.contains("nesting limit"), "{e}");
    // the limit itself is accepted
    let ok = format!(
        "{}a > 1{}",
        "(".repeat(MAX_NESTING),
        ")".repeat(MAX_NESTING)
    );
    assert!(text(ok).is_ok());
}

#[test]
fn long_chains_and_wide_expansions_are_bounded() {
    let chain = vec!["a > 1"; 1_000].join(" && ");
    assert!(
        text(chain).is_ok(),
        "a long conjunction of one predicate dedups"
    );
    let chain = vec!["a > 1"; 12_000].join(" && ");
    let e = text(chain).expect_err("too many leaves");
    assert!(e.contains("more than 1024 predicates"), "{e}");
    let distinct: Vec<String> = (0..1_000).map(|i| format!("a{i} > 1")).collect();
    let e = text(distinct.join(" && ")).expect_err("too many predicates");
    assert!(e.contains("predicates"), "{e}");
    let e = text(distinct.join(" || ")).expect_err("too many conjunctions");
    assert!(e.contains("conjunctions"), "{e}");
    // many alternatives times a long repeated chain: the expansion stays bounded
    let wide = format!(
        "({}) && {}",
        (0..200)
            .map(|i| format!("b = {i}"))
            .collect::<Vec<_>>()
            .join(" || "),
        vec!["a > 1"; 800].join(" && ")
    );
    assert!(text(wide).is_ok());
    let product = vec!["(a = 1 || b = 2 || c = 3)"; 20].join(" && ");
    let e = text(product).expect_err("exponential expansion");
    assert!(e.contains("conjunctions"), "{e}");
}

#[test]
fn huge_numbers_and_strings_are_refused_with_short_errors() {
    let big = "9".repeat(3_000_000);
    let e = text(format!("a > {big}")).expect_err("out of range");
    assert!(e.len() < 400, "error of {} bytes", e.len());
    let e = text(format!("a > 0.{big}1")).expect_err("too precise");
    assert!(e.len() < 400, "error of {} bytes", e.len());
    let e = text(format!("a > 1e{big}")).expect_err("bad exponent");
    assert!(e.len() < 400, "error of {} bytes", e.len());
    let e = text(format!("\"{}\" ? 1", "x".repeat(1_000_000))).expect_err("operator");
    assert!(e.len() < 400, "error of {} bytes", e.len());
    let e = pattern(format!("{{\"a\":[{{\"numeric\":[\">\",{big}]}}]}}")).expect_err("range");
    assert!(e.len() < 400, "error of {} bytes", e.len());
    assert!(Num::parse(&big).is_err());
}

#[test]
fn deep_patterns_are_refused_naming_the_limit() {
    for depth in [MAX_NESTING + 1, 120, 2_000, 100_000] {
        let p = format!("{}[1]{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        let e = pattern(p).expect_err("too deep");
        assert!(
            e.contains("nesting limit") || e.contains("recursion limit"),
            "{e}"
        );
    }
    let mut or = String::from("{\"a\":[1]}");
    for _ in 0..200 {
        or = format!("{{\"$or\":[{or},{{\"b\":[2]}}]}}");
    }
    let e = pattern(or).expect_err("too deep");
    assert!(e.contains("limit"), "{e}");
    let arrays = format!("{{\"a\":{}1{}}}", "[".repeat(5_000), "]".repeat(5_000));
    assert!(pattern(arrays).is_err());
}

#[test]
fn duplicate_keys_are_refused_as_aws_does() {
    let e = pattern(r#"{"dk":[1],"dk":[2]}"#.into()).expect_err("duplicate");
    assert!(e.contains("duplicate key \"dk\""), "{e}");
    let e = pattern(r#"{"a":{"x":[1],"y":[2],"x":[3]}}"#.into()).expect_err("nested duplicate");
    assert!(e.contains("duplicate key \"x\""), "{e}");
    let e = pattern(r#"{"a":[{"numeric":[">",1],"numeric":["<",2]}]}"#.into())
        .expect_err("matcher duplicate");
    assert!(e.contains("duplicate key"), "{e}");
    // the same key in sibling objects is fine
    assert!(pattern(r#"{"$or":[{"a":[1]},{"a":[2]}]}"#.into()).is_ok());
}

/// Valid filters to mutate.
const SEEDS: &[&str] = &[
    r#"temp > 30 && site prefix "kr/seoul/" || type in ["cam", "lidar"]"#,
    r#"x range [10, 20) && fw != "1.2.3" && alarm not exists && key suffix ".jpg""#,
    r#"(a = 1 || b = 2) && (c ieq "X" || d not contains "y")"#,
];
const PATTERN_SEEDS: &[&str] = &[
    r#"{"detail":{"temp":[{"numeric":[">",30,"<=",40]}],"site":[{"prefix":"kr/"}]}}"#,
    r#"{"$or":[{"a":[1,2]},{"b":[{"anything-but":["x","y"]}]}],"c":[{"exists":true}]}"#,
];

fn mutate(seed: &str, edits: &[(usize, u8, u8)]) -> String {
    let mut b = seed.as_bytes().to_vec();
    for &(at, op, byte) in edits {
        let at = at % (b.len() + 1);
        match op % 4 {
            0 if at < b.len() => b[at] = byte,
            1 => b.insert(at, byte),
            2 if at < b.len() => {
                b.remove(at);
            }
            _ => {
                let tail = b[at..].to_vec();
                b.extend_from_slice(&tail[..tail.len().min(64)]);
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_text_never_panics(input in ".{0,400}") {
        let _ = text(input);
    }

    #[test]
    fn mutated_text_never_panics(
        seed in 0..SEEDS.len(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..12),
    ) {
        let _ = text(mutate(SEEDS[seed], &edits));
    }

    #[test]
    fn random_patterns_never_panic(input in "[\\[\\]{}\":,0-9a-z$ .-]{0,400}") {
        let _ = pattern(input);
    }

    #[test]
    fn mutated_patterns_never_panic(
        seed in 0..PATTERN_SEEDS.len(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..12),
    ) {
        let _ = pattern(mutate(PATTERN_SEEDS[seed], &edits));
    }

    #[test]
    fn random_images_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let b = bytes.clone();
        bounded("shard image", move || { let _ = decode_shard(&b); });
        bounded("delta image", move || { let _ = decode_delta(&bytes); });
    }

    #[test]
    fn random_numbers_never_panic(input in "[-+0-9.eE]{0,80}") {
        bounded("number", move || { let _ = Num::parse(&input); });
    }
}
