//! Every row of the comparison-operator table in Amazon EventBridge's documentation (plus IP
//! address and boolean matching from its content-filtering page), each pattern with an event
//! it matches and one it does not, through the reference semantics and through a built match
//! index of all strategies together.

use blocks::{
    Event, MatchIndex, Num, ShardConfig, Strategy as MatchStrategy, StrategyChoice, Value,
};

/// (what the row is, pattern, an event it matches, an event it does not).
const ROWS: &[(&str, &str, &str, &str)] = &[
    (
        "and",
        r#"{"Location": ["New York"], "Day": ["Monday"]}"#,
        r#"{"Location": "New York", "Day": "Monday"}"#,
        r#"{"Location": "New York", "Day": "Sunday"}"#,
    ),
    (
        "anything-but",
        r#"{"state": [{"anything-but": "initializing"}]}"#,
        r#"{"state": "running"}"#,
        r#"{"state": "initializing"}"#,
    ),
    (
        "anything-but (begins with)",
        r#"{"Region": [{"anything-but": {"prefix": "us-"}}]}"#,
        r#"{"Region": "eu-west-1"}"#,
        r#"{"Region": "us-east-1"}"#,
    ),
    (
        "anything-but (ends with)",
        r#"{"FileName": [{"anything-but": {"suffix": ".png"}}]}"#,
        r#"{"FileName": "a.jpg"}"#,
        r#"{"FileName": "a.png"}"#,
    ),
    (
        "anything-but (ignore case)",
        r#"{"state": [{"anything-but": {"equals-ignore-case": "initializing"}}]}"#,
        r#"{"state": "running"}"#,
        r#"{"state": "INITIALIZING"}"#,
    ),
    (
        "anything-but (ignore case, a list)",
        r#"{"state": [{"anything-but": {"equals-ignore-case": ["initializing", "stopped"]}}]}"#,
        r#"{"state": "running"}"#,
        r#"{"state": "Stopped"}"#,
    ),
    (
        "anything-but using a wildcard",
        r#"{"FilePath": [{"anything-but": {"wildcard": "*/lib/*"}}]}"#,
        r#"{"FilePath": "/usr/bin/x"}"#,
        r#"{"FilePath": "/usr/lib/x"}"#,
    ),
    (
        "begins with",
        r#"{"Region": [{"prefix": "us-"}]}"#,
        r#"{"Region": "us-east-1"}"#,
        r#"{"Region": "eu-west-1"}"#,
    ),
    (
        "begins with (ignore case)",
        r#"{"service": [{"prefix": {"equals-ignore-case": "eventb"}}]}"#,
        r#"{"service": "EventBridge"}"#,
        r#"{"service": "SQS"}"#,
    ),
    (
        "empty",
        r#"{"LastName": [""]}"#,
        r#"{"LastName": ""}"#,
        r#"{"LastName": "Doe"}"#,
    ),
    (
        "equals",
        r#"{"Name": ["Alice"]}"#,
        r#"{"Name": "Alice"}"#,
        r#"{"Name": "alice"}"#,
    ),
    (
        "equals (ignore case)",
        r#"{"Name": [{"equals-ignore-case": "alice"}]}"#,
        r#"{"Name": "ALICE"}"#,
        r#"{"Name": "Bob"}"#,
    ),
    (
        "ends with",
        r#"{"FileName": [{"suffix": ".png"}]}"#,
        r#"{"FileName": "photo.png"}"#,
        r#"{"FileName": "photo.PNG"}"#,
    ),
    (
        "ends with (ignore case)",
        r#"{"FileName": [{"suffix": {"equals-ignore-case": ".png"}}]}"#,
        r#"{"FileName": "photo.PNG"}"#,
        r#"{"FileName": "photo.jpg"}"#,
    ),
    (
        "exists",
        r#"{"ProductName": [{"exists": true}]}"#,
        r#"{"ProductName": "Widget"}"#,
        r#"{"Other": "x"}"#,
    ),
    (
        "does not exist",
        r#"{"ProductName": [{"exists": false}]}"#,
        r#"{"Other": "x"}"#,
        r#"{"ProductName": "Widget"}"#,
    ),
    (
        "not",
        r#"{"Weather": [{"anything-but": ["Raining"]}]}"#,
        r#"{"Weather": "Sunny"}"#,
        r#"{"Weather": "Raining"}"#,
    ),
    (
        "null",
        r#"{"UserID": [null]}"#,
        r#"{"UserID": null}"#,
        r#"{"UserID": "u-1"}"#,
    ),
    (
        "numeric (equals)",
        r#"{"Price": [{"numeric": ["=", 100]}]}"#,
        r#"{"Price": 100.0}"#,
        r#"{"Price": 101}"#,
    ),
    (
        "numeric (range)",
        r#"{"Price": [{"numeric": [">", 10, "<=", 20]}]}"#,
        r#"{"Price": 20}"#,
        r#"{"Price": 10}"#,
    ),
    (
        "or",
        r#"{"PaymentType": ["Credit", "Debit"]}"#,
        r#"{"PaymentType": "Debit"}"#,
        r#"{"PaymentType": "Cash"}"#,
    ),
    (
        "or (multiple fields)",
        r#"{"$or": [{"Location": ["New York"]}, {"Day": ["Monday"]}]}"#,
        r#"{"Location": "Boston", "Day": "Monday"}"#,
        r#"{"Location": "Boston", "Day": "Sunday"}"#,
    ),
    (
        "wildcard",
        r#"{"FileName": [{"wildcard": "dir/*.png"}]}"#,
        r#"{"FileName": "dir/a/b.png"}"#,
        r#"{"FileName": "other/b.png"}"#,
    ),
    (
        "IP address (IPv4)",
        r#"{"detail": {"sourceIPAddress": [{"cidr": "10.0.0.0/24"}]}}"#,
        r#"{"detail": {"sourceIPAddress": "10.0.0.255"}}"#,
        r#"{"detail": {"sourceIPAddress": "10.0.1.1"}}"#,
    ),
    (
        "IP address (IPv6)",
        r#"{"sourceIPAddress": [{"cidr": "2001:db8::/32"}]}"#,
        r#"{"sourceIPAddress": "2001:db8:1::7"}"#,
        r#"{"sourceIPAddress": "2001:db9::7"}"#,
    ),
    (
        "boolean",
        r#"{"detail": {"enabled": [true]}}"#,
        r#"{"detail": {"enabled": true}}"#,
        r#"{"detail": {"enabled": false}}"#,
    ),
];

/// A JSON event as metadata: nested objects as dotted names; booleans and null as text.
fn event(json: &str) -> Event {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, Value)>) {
        let name = |k: &str| {
            if prefix.is_empty() {
                k.to_string()
            } else {
                format!("{prefix}.{k}")
            }
        };
        if let serde_json::Value::Object(m) = v {
            for (k, x) in m {
                match x {
                    serde_json::Value::Object(_) => walk(&name(k), x, out),
                    serde_json::Value::String(s) => out.push((name(k), Value::Str(s.clone()))),
                    serde_json::Value::Number(n) => out.push((
                        name(k),
                        Value::Num(Num::parse(&n.to_string()).expect("exact")),
                    )),
                    other => out.push((name(k), Value::Str(other.to_string()))),
                }
            }
        }
    }
    let mut attrs = Vec::new();
    walk(
        "",
        &serde_json::from_str(json).expect("event JSON"),
        &mut attrs,
    );
    Event { attrs }
}

#[test]
fn every_documented_operator_is_accepted_and_matches_as_documented() {
    let mut subs = Vec::new();
    for (i, (what, pattern, yes, no)) in ROWS.iter().enumerate() {
        let dnf = blocks::eventbridge::parse_pattern(pattern)
            .unwrap_or_else(|e| panic!("{what}: {pattern} refused: {e}"));
        assert!(
            dnf.eval(&event(yes)),
            "{what}: {pattern} should match {yes}"
        );
        assert!(
            !dnf.eval(&event(no)),
            "{what}: {pattern} should not match {no}"
        );
        // the canonical text reads back as the same conjunctions
        let again = blocks::text::parse_text(&dnf.to_text())
            .unwrap_or_else(|e| panic!("{what}: {} does not read back: {e}", dnf.to_text()));
        assert_eq!(again, dnf, "{what}");
        subs.push((i as u64, dnf));
    }
    // all patterns in one index: every strategy reports exactly the documented matches
    for strategy in [
        MatchStrategy::Access,
        MatchStrategy::Bloom,
        MatchStrategy::Cells,
    ] {
        let cfg = ShardConfig {
            strategy: StrategyChoice::Fixed(strategy),
            ..ShardConfig::default()
        };
        let index = MatchIndex::build(cfg, subs.clone()).expect("build");
        let mut ctx = index.base().new_ctx();
        for (i, (what, _, yes, no)) in ROWS.iter().enumerate() {
            let hits = index.match_event(&event(yes), &mut ctx);
            assert!(hits.contains(&(i as u64)), "{strategy:?} {what}: {hits:?}");
            let hits = index.match_event(&event(no), &mut ctx);
            assert!(!hits.contains(&(i as u64)), "{strategy:?} {what}: {hits:?}");
            // and every other subscription agrees with the reference
            for e in [event(yes), event(no)] {
                let want: Vec<u64> = subs
                    .iter()
                    .filter(|(_, d)| d.eval(&e))
                    .map(|(id, _)| *id)
                    .collect();
                let mut got = index.match_event(&e, &mut ctx);
                got.sort_unstable();
                assert_eq!(got, want, "{strategy:?} on {e:?}");
            }
        }
    }
}
