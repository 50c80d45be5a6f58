//! Property tests: every engine and every path of the matching core against the reference
//! matcher, on random subscriptions and objects built from small pools of constants so that
//! the edges (a value equal to a constant, empty strings, unicode, 2^63-scale integers, long
//! strings, negatives, type mismatches, absent attributes) come up constantly.

use blocks::bloom::BloomConfig;
use blocks::image::{decode_shard, encode_shard};
use blocks::{
    Bound, Conjunction, Dnf, Event, MatchIndex, Num, Predicate, ReferenceMatcher, ShardConfig,
    Strategy as MatchStrategy, StrategyChoice, Test, Value,
};
use proptest::prelude::*;

const ATTRS: &[&str] = &["a", "b", "c", "d"];

fn num_pool() -> Vec<Num> {
    [
        "-5",
        "0",
        "0.1",
        "0.3",
        "1",
        "2",
        "9223372036854775806",
        "9223372036854775807",
        "-9223372036854775808",
        "18446744073709551615",
        "-100000000000000000000",
    ]
    .iter()
    .map(|s| Num::parse(s).expect("pool"))
    .collect()
}

fn str_pool() -> Vec<String> {
    let mut v: Vec<String> = [
        "",
        "a",
        "ab",
        "abc",
        "b",
        "kr/",
        "kr/seoul/",
        "kr/seoul/b12",
        "é",
        "日本",
        "AbC",
        "bca",
        "KR/Seoul/B12",
        "10.1.2.3",
        "10.2.0.1",
        "2001:db8::1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("x".repeat(300));
    v
}

fn arb_num() -> impl Strategy<Value = Num> {
    (0..num_pool().len(), -1i128..=1).prop_map(|(i, d)| Num::from_raw(num_pool()[i].to_raw() + d))
}

fn arb_const_num() -> impl Strategy<Value = Num> {
    (0..num_pool().len()).prop_map(|i| num_pool()[i])
}

fn arb_str() -> impl Strategy<Value = String> {
    (0..str_pool().len()).prop_map(|i| str_pool()[i].clone())
}

fn arb_bound() -> impl Strategy<Value = Bound> {
    prop_oneof![
        Just(Bound::Unbounded),
        arb_const_num().prop_map(Bound::Incl),
        arb_const_num().prop_map(Bound::Excl),
    ]
}

fn arb_test() -> impl Strategy<Value = Test> {
    prop_oneof![
        Just(Test::Exists),
        (arb_bound(), arb_bound()).prop_map(|(lo, hi)| {
            // the syntaxes reject inverted ranges; keep bounds ordered (equal ones may be empty)
            let key = |b: Bound| match b {
                Bound::Incl(n) | Bound::Excl(n) => Some(n),
                Bound::Unbounded => None,
            };
            match (key(lo), key(hi)) {
                (Some(a), Some(b)) if a > b => Test::Interval { lo: hi, hi: lo },
                _ => Test::Interval { lo, hi },
            }
        }),
        prop::collection::vec(arb_const_num(), 1..4).prop_map(Test::NumIn),
        prop::collection::vec(arb_str(), 1..4).prop_map(Test::StrIn),
        arb_str().prop_map(Test::Prefix),
        arb_str().prop_map(Test::Suffix),
        arb_str().prop_map(Test::Contains),
        arb_str().prop_map(Test::EqIgnoreCase),
        arb_str().prop_map(Test::PrefixIgnoreCase),
        arb_str().prop_map(Test::SuffixIgnoreCase),
        (arb_str(), arb_str()).prop_map(|(a, b)| Test::Wildcard(format!("{a}*{b}"))),
        arb_str().prop_map(|a| Test::Wildcard(format!("*{a}*").replace("**", "*"))),
        prop_oneof![
            Just("10.0.0.0/8"),
            Just("10.1.0.0/16"),
            Just("2001:db8::/32")
        ]
        .prop_map(|c| Test::Cidr(c.to_string())),
    ]
}

fn arb_pred() -> impl Strategy<Value = Predicate> {
    (0..ATTRS.len(), arb_test(), prop::bool::weighted(0.25))
        .prop_map(|(a, t, n)| Predicate::new(ATTRS[a], t, n))
}

fn arb_dnf() -> impl Strategy<Value = Dnf> {
    prop::collection::vec(prop::collection::vec(arb_pred(), 1..4), 1..3)
        .prop_map(|cs| Dnf(cs.into_iter().map(Conjunction::new).collect()))
}

fn arb_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        arb_num().prop_map(Value::Num),
        arb_str().prop_map(Value::Str)
    ]
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop::collection::vec(prop::option::weighted(0.8, arb_value()), ATTRS.len()).prop_map(|vals| {
        Event {
            attrs: ATTRS
                .iter()
                .zip(vals)
                .filter_map(|(a, v)| v.map(|v| (a.to_string(), v)))
                .collect(),
        }
    })
}

/// One of 300 values, `v0` the most drawn (roughly Zipf: a uniform draw's square).
fn arb_popular_value() -> impl Strategy<Value = String> {
    (0u32..300).prop_map(|i| format!("v{}", i * i / 300))
}

fn arb_values_pred() -> impl Strategy<Value = Predicate> {
    (
        0..ATTRS.len(),
        prop::collection::vec(arb_popular_value(), 1..6),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(a, set, n)| Predicate::new(ATTRS[a], Test::StrIn(set), n))
}

fn arb_values_dnf() -> impl Strategy<Value = Dnf> {
    prop::collection::vec(prop::collection::vec(arb_values_pred(), 1..4), 1..3)
        .prop_map(|cs| Dnf(cs.into_iter().map(Conjunction::new).collect()))
}

fn arb_values_event() -> impl Strategy<Value = Event> {
    prop::collection::vec(
        prop::option::weighted(0.9, arb_popular_value()),
        ATTRS.len(),
    )
    .prop_map(|vals| Event {
        attrs: ATTRS
            .iter()
            .zip(vals)
            .filter_map(|(a, v)| v.map(|v| (a.to_string(), Value::Str(v))))
            .collect(),
    })
}

fn arb_small_int() -> impl Strategy<Value = Num> {
    prop_oneof![
        (-20i64..20).prop_map(Num::from),
        Just(Num::from(i64::from(i32::MIN))),
        Just(Num::from(i64::from(i32::MAX))),
    ]
}

fn arb_int_bound() -> impl Strategy<Value = Bound> {
    prop_oneof![
        Just(Bound::Unbounded),
        arb_small_int().prop_map(Bound::Incl),
        arb_small_int().prop_map(Bound::Excl),
    ]
}

fn arb_int_pred() -> impl Strategy<Value = Predicate> {
    (
        0..ATTRS.len(),
        arb_int_bound(),
        arb_int_bound(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(a, lo, hi, n)| Predicate::new(ATTRS[a], Test::Interval { lo, hi }, n))
}

fn arb_int_dnf() -> impl Strategy<Value = Dnf> {
    prop::collection::vec(prop::collection::vec(arb_int_pred(), 1..4), 1..3)
        .prop_map(|cs| Dnf(cs.into_iter().map(Conjunction::new).collect()))
}

fn arb_int_event() -> impl Strategy<Value = Event> {
    let value = prop_oneof![
        8 => arb_small_int().prop_map(Value::Num),
        1 => (-40i64..40).prop_map(|v| Value::Num(Num::from(v))),
        1 => Just(Value::Str("x".to_string())),
    ];
    prop::collection::vec(prop::option::weighted(0.85, value), ATTRS.len()).prop_map(|vals| Event {
        attrs: ATTRS
            .iter()
            .zip(vals)
            .filter_map(|(a, v)| v.map(|v| (a.to_string(), v)))
            .collect(),
    })
}

fn reference(subs: &[(u64, Dnf)]) -> ReferenceMatcher {
    let mut r = ReferenceMatcher::new();
    for (id, d) in subs {
        r.insert(*id, d.clone());
    }
    r
}

fn check_engines(
    subs: &[(u64, Dnf)],
    events: &[Event],
    bloom: BloomConfig,
) -> Result<(), TestCaseError> {
    let reference = reference(subs);
    let want: Vec<Vec<u64>> = events.iter().map(|e| reference.match_event(e)).collect();
    let cfg = ShardConfig {
        bloom,
        ..ShardConfig::default()
    };
    let index =
        MatchIndex::build(cfg, subs.to_vec()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut ctx = index.base().new_ctx();
    for strategy in [MatchStrategy::Access, MatchStrategy::Bloom] {
        let mut got = Vec::new();
        index.match_batch_with(strategy, events, &mut ctx, &mut got);
        prop_assert_eq!(&got, &want, "strategy {:?}", strategy);
    }
    // split between threads, as the shard's strategy does it
    let mut got = Vec::new();
    index.match_batch_split(events, 2, &mut got);
    prop_assert_eq!(&got, &want, "on 2 threads");
    // one event at a time gives the same
    for (e, w) in events.iter().zip(&want) {
        prop_assert_eq!(&index.match_event(e, &mut ctx), w);
    }
    // the distributed path: per-attribute test outputs (filter + exact ids), union, Bloom
    // scan, verification by ids
    let base = index.base();
    // one test context reused across every value, as a test worker does per batch
    let mut tctx = base.new_ctx();
    for (e, w) in events.iter().zip(&want) {
        let mut filter = vec![0u64; base.filter_words()];
        let mut ids = roaring::RoaringBitmap::new();
        for name in base.attribute_names() {
            let out = base
                .test_attribute_with(name, e.get(name), &mut tctx)
                .ok_or_else(|| TestCaseError::fail("test ids enabled by default"))?;
            let fresh = base
                .test_attribute(name, e.get(name))
                .ok_or_else(|| TestCaseError::fail("test ids enabled by default"))?;
            prop_assert_eq!(
                &out.ids,
                &fresh.ids,
                "a reused context tests as a fresh one"
            );
            prop_assert_eq!(&out.filter, &fresh.filter);
            for (f, o) in filter.iter_mut().zip(&out.filter) {
                *f |= o;
            }
            ids |= out.ids;
        }
        prop_assert_eq!(&filter, &base.event_filter(e, &mut ctx));
        let mut cands = Vec::new();
        base.bloom_candidates(&filter, |_, rec| cands.push(rec));
        prop_assert_eq!(
            base.verified_subscriptions(&cands, &ids),
            Some(w.clone()),
            "Bloom candidates"
        );
        // without a GPU: candidates by access predicate id, same verification
        let mut cands = Vec::new();
        prop_assert!(base.id_candidates(&ids, &mut cands));
        prop_assert_eq!(
            base.verified_subscriptions(&cands, &ids),
            Some(w.clone()),
            "candidates by access predicate id"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn engines_equal_reference(
        dnfs in prop::collection::vec(arb_dnf(), 1..40),
        events in prop::collection::vec(arb_event(), 1..24),
    ) {
        let subs: Vec<(u64, Dnf)> = dnfs.into_iter().enumerate().map(|(i, d)| (i as u64 * 3 + 1, d)).collect();
        check_engines(&subs, &events, BloomConfig::default())?;
        // a tiny filter saturates: verification must still make it exact
        check_engines(&subs, &events, BloomConfig { bits: 64, k: 1 })?;
    }

    /// `in {strings}` over hundreds of values per attribute, popular ones drawn most:
    /// sets on one page of 64 value indexes compile to value-index codes, sets across pages
    /// and negated ones to test flags, and any may be a conjunction's access predicate.
    #[test]
    fn many_string_values_equal_reference(
        dnfs in prop::collection::vec(arb_values_dnf(), 1..80),
        events in prop::collection::vec(arb_values_event(), 1..24),
    ) {
        let subs: Vec<(u64, Dnf)> = dnfs.into_iter().enumerate().map(|(i, d)| (i as u64 + 1, d)).collect();
        check_engines(&subs, &events, BloomConfig::default())?;
    }

    /// Ranges over integers that fit in 32 bits only (bounds ranked by sorting at build):
    /// every bound kind, equal and inverted bounds, the extremes, values between and on them.
    #[test]
    fn small_integer_ranges_equal_reference(
        dnfs in prop::collection::vec(arb_int_dnf(), 1..60),
        events in prop::collection::vec(arb_int_event(), 1..24),
    ) {
        let subs: Vec<(u64, Dnf)> = dnfs.into_iter().enumerate().map(|(i, d)| (i as u64 + 1, d)).collect();
        check_engines(&subs, &events, BloomConfig::default())?;
    }

    #[test]
    fn incremental_versions_equal_reference(
        initial in prop::collection::vec(arb_dnf(), 0..20),
        changes in prop::collection::vec((0u64..30, prop::option::weighted(0.7, arb_dnf())), 1..25),
        events in prop::collection::vec(arb_event(), 1..12),
    ) {
        let subs: Vec<(u64, Dnf)> = initial.into_iter().enumerate().map(|(i, d)| (i as u64, d)).collect();
        let mut reference = reference(&subs);
        let mut index = MatchIndex::build(ShardConfig::default(), subs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let first = index.clone();
        let first_want: Vec<Vec<u64>> = events.iter().map(|e| reference.match_event(e)).collect();
        let mut ctx = index.base().new_ctx();
        for (id, change) in changes {
            index = match change {
                Some(d) => {
                    reference.insert(id, d.clone());
                    index.upsert(id, d).map_err(|e| TestCaseError::fail(e.to_string()))?
                }
                None => match index.remove(id) {
                    Ok(i) => {
                        prop_assert!(reference.remove(id));
                        i
                    }
                    Err(_) => {
                        prop_assert!(!reference.remove(id));
                        index
                    }
                },
            };
            prop_assert_eq!(index.len(), reference.len());
        }
        let want: Vec<Vec<u64>> = events.iter().map(|e| reference.match_event(e)).collect();
        let mut got = Vec::new();
        index.match_batch(&events, &mut ctx, &mut got);
        prop_assert_eq!(&got, &want);
        // the old snapshot is untouched
        let mut old = Vec::new();
        first.match_batch(&events, &mut ctx, &mut old);
        prop_assert_eq!(&old, &first_want);
        // compaction and a round trip through the image give the same answers
        let compacted = index.compact().map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(compacted.delta_len(), 0);
        let mut got2 = Vec::new();
        compacted.match_batch(&events, &mut ctx, &mut got2);
        prop_assert_eq!(&got2, &want);
        let bytes = index.to_image().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let img = decode_shard(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(encode_shard(&img), bytes.clone());
        let loaded = MatchIndex::from_image(ShardConfig::default(), &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut got3 = Vec::new();
        loaded.match_batch(&events, &mut ctx, &mut got3);
        prop_assert_eq!(&got3, &want);
    }

    /// What a match worker does from test results (`worker/src/daemon/tasks.rs`
    /// `match_objects`), over a base and the overlay of the changes since: each attribute of
    /// the object tested against the base and the overlay, the outputs of absent attributes
    /// added, candidates by predicate id, verified, the base's answers for changed
    /// subscriptions dropped. Equal to the reference on the changed set.
    #[test]
    fn matching_from_test_outputs_with_an_overlay_equals_reference(
        initial in prop::collection::vec(arb_dnf(), 0..20),
        changes in prop::collection::vec((0u64..300, prop::option::weighted(0.7, arb_dnf())), 1..300),
        events in prop::collection::vec(arb_event(), 1..12),
    ) {
        let subs: Vec<(u64, Dnf)> = initial.into_iter().enumerate().map(|(i, d)| (i as u64, d)).collect();
        let mut reference = reference(&subs);
        let index = MatchIndex::build(ShardConfig::default(), subs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (id, c) in &changes {
            match c {
                Some(d) => reference.insert(*id, d.clone()),
                None => { reference.remove(*id); }
            }
        }
        // in a few versions, so some changes land in the middle layer and some in the top one
        let mut index = index;
        for (k, part) in changes.chunks(40).enumerate() {
            index = index.changed_to(k as u64 + 2, part.to_vec()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        prop_assert_eq!(index.len(), reference.len());
        let overlays = index.overlays();
        let layers: Vec<&blocks::shard::Base> = std::iter::once(index.base()).chain(overlays.iter().map(|l| l.base)).collect();
        for ev in &events {
            let mut got = Vec::new();
            for (layer, base) in layers.iter().enumerate() {
                let mut ids = roaring::RoaringBitmap::new();
                for name in base.attribute_names() {
                    let out = base.test_attribute(name, ev.get(name)).ok_or_else(|| TestCaseError::fail("no test ids"))?;
                    ids |= out.ids;
                }
                let mut cands = Vec::new();
                prop_assert!(base.id_candidates(&ids, &mut cands));
                let mut subs = base.verified_subscriptions(&cands, &ids).unwrap_or_default();
                if layer == 0 {
                    subs.retain(|id| !index.changed(*id));
                } else {
                    subs.retain(|id| !overlays[layer - 1].shadowed(*id));
                }
                got.extend(subs);
            }
            got.sort_unstable();
            got.dedup();
            prop_assert_eq!(got, reference.match_event(ev));
        }
    }

    #[test]
    fn canonical_text_round_trips(d in arb_dnf()) {
        let text = d.to_text();
        let parsed = blocks::text::parse_text(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let mut norm = d.0.clone();
        norm.sort();
        norm.dedup();
        prop_assert_eq!(parsed.0, norm);
    }
}

#[test]
fn a_subscription_matching_by_two_conjunctions_is_reported_once() {
    let d = blocks::text::parse_text(r#"a > 1 || a > 2 || b prefix "x""#).expect("valid");
    let index = MatchIndex::build(ShardConfig::default(), vec![(9, d)]).expect("build");
    let mut ctx = index.base().new_ctx();
    let ev = Event::new([("a", Value::from(5)), ("b", Value::from("xyz"))]);
    assert_eq!(index.match_event(&ev, &mut ctx), vec![9]);
    for s in [MatchStrategy::Access, MatchStrategy::Bloom] {
        let mut out = Vec::new();
        index.match_batch_with(s, std::slice::from_ref(&ev), &mut ctx, &mut out);
        assert_eq!(out, vec![vec![9]]);
    }
}

#[test]
fn fixed_strategies_are_honoured() {
    let d = blocks::text::parse_text("a = 1").expect("valid");
    for s in [
        MatchStrategy::Access,
        MatchStrategy::Bloom,
        MatchStrategy::Cells,
    ] {
        let cfg = ShardConfig {
            strategy: StrategyChoice::Fixed(s),
            ..ShardConfig::default()
        };
        let index = MatchIndex::build(cfg, vec![(1, d.clone())]).expect("build");
        assert_eq!(index.base().strategy(), s);
    }
    let cfg = ShardConfig {
        strategy: StrategyChoice::Fixed(MatchStrategy::Bloom),
        bloom_tables: false,
        ..ShardConfig::default()
    };
    assert!(MatchIndex::build(cfg, vec![(1, d)]).is_err());
}

/// Long posting lists (runs of point probes are binary-searched only past 32 records): many
/// subscriptions over few values, equality, ranges, sets and strings mixed, against the
/// reference.
#[test]
fn long_posting_lists_equal_reference() {
    let mut seed = 12345u64;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut subs = Vec::new();
    for id in 0..3000u64 {
        let mut parts = Vec::new();
        for a in 0..4 {
            match next(6) {
                0 | 1 => parts.push(format!("x{a} = {}", next(5))),
                2 => parts.push(format!("x{a} range [{}, {}]", next(3), 2 + next(3))),
                3 => parts.push(format!("s{a} = \"v{}\"", next(4))),
                4 => parts.push(format!("s{a} in [\"v{}\", \"v{}\"]", next(4), next(4))),
                _ => {}
            }
        }
        if parts.is_empty() {
            parts.push(format!("x0 = {}", next(5)));
        }
        let text = parts.join(" && ");
        subs.push((id, blocks::text::parse_text(&text).expect("valid")));
    }
    let events: Vec<Event> = (0..400)
        .map(|_| {
            let mut attrs = Vec::new();
            for a in 0..4 {
                if next(10) > 0 {
                    attrs.push((format!("x{a}"), Value::from(next(6) as i64)));
                }
                if next(10) > 0 {
                    attrs.push((format!("s{a}"), Value::from(format!("v{}", next(5)))));
                }
            }
            Event { attrs }
        })
        .collect();
    let reference = reference(&subs);
    let want: Vec<Vec<u64>> = events.iter().map(|e| reference.match_event(e)).collect();
    assert!(
        want.iter().map(Vec::len).sum::<usize>() > 1000,
        "the workload should match"
    );
    // a match block alone keeps no test ids: its Bloom tables must not depend on them
    let strategies = [
        MatchStrategy::Access,
        MatchStrategy::Bloom,
        MatchStrategy::Cells,
    ];
    for (strategy, test_ids) in strategies.into_iter().flat_map(|s| [(s, true), (s, false)]) {
        let cfg = ShardConfig {
            strategy: StrategyChoice::Fixed(strategy),
            test_ids,
            ..ShardConfig::default()
        };
        let index = MatchIndex::build(cfg, subs.clone()).expect("build");
        let mut ctx = index.base().new_ctx();
        let mut got = Vec::new();
        index.match_batch(&events, &mut ctx, &mut got);
        assert_eq!(got, want, "{strategy:?}");
        // a cell shard drops its access index: asked for access, it still answers exactly
        for asked in [MatchStrategy::Access, MatchStrategy::Bloom] {
            index.match_batch_with(asked, &events, &mut ctx, &mut got);
            assert_eq!(got, want, "{strategy:?} asked for {asked:?}");
        }
        // one batch split between threads (3,000 conjunctions: two cell blocks)
        for threads in [2, 3] {
            index.match_batch_split(&events, threads, &mut got);
            assert_eq!(got, want, "{strategy:?} on {threads} threads");
        }
    }
}

/// Selective numeric predicates get Bloom bits, carried by the per-row filters: a match block
/// that keeps no test ids (as the bench's and the cluster's may) must still build them.
#[test]
fn bloom_without_test_ids_finds_selective_numeric_matches() {
    let subs: Vec<(u64, blocks::Dnf)> = (0..600u64)
        .map(|i| {
            let text = format!("x = {i} && y range [{}, {}]", i % 97, i % 97 + 3);
            (i, blocks::text::parse_text(&text).expect("valid"))
        })
        .collect();
    let events: Vec<Event> = (0..300i64)
        .map(|i| {
            Event::new([
                ("x", Value::from(i * 3)),
                ("y", Value::from(i * 3 % 97 + 1)),
            ])
        })
        .collect();
    let reference = reference(&subs);
    let want: Vec<Vec<u64>> = events.iter().map(|e| reference.match_event(e)).collect();
    assert!(want.iter().filter(|m| !m.is_empty()).count() > 50);
    let cfg = ShardConfig {
        strategy: StrategyChoice::Fixed(MatchStrategy::Bloom),
        test_ids: false,
        ..ShardConfig::default()
    };
    let index = MatchIndex::build(cfg, subs).expect("build");
    let mut ctx = index.base().new_ctx();
    let mut got = Vec::new();
    index.match_batch(&events, &mut ctx, &mut got);
    assert_eq!(got, want);
}

/// The build reads the subscriptions in halves, a thread each: a subscription given twice is
/// refused whether both are in one half or one in each.
#[test]
fn a_subscription_given_twice_is_refused_in_one_half_or_across_them() {
    let d = Dnf(vec![Conjunction(vec![Predicate::new(
        "a",
        Test::Exists,
        false,
    )])]);
    for ids in [[7u64, 7, 2, 3], [7, 2, 3, 7]] {
        let subs: Vec<(u64, &Dnf)> = ids.iter().map(|&i| (i, &d)).collect();
        match blocks::shard::Base::build(ShardConfig::default(), subs) {
            Err(blocks::shard::BuildError::DuplicateSubscription(7)) => {}
            other => panic!("{ids:?}: {:?}", other.map(|_| "built")),
        }
    }
}
