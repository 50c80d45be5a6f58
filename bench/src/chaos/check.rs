//! The oracle of `dissem bench chaos`: what it checks after each schedule (objects missing
//! here and at the peer cluster, QoS 2 duplicates named with their calls, the leader's
//! registry against the subscription changes, deliveries nothing should have received).

use super::*;

/// The acknowledged objects of `acked` the peer cluster was not shown (waiting up to a
/// minute for them): (number, object id here).
pub(super) async fn peer_missing(
    peer: &Peer,
    traffic: &Traffic,
    acked: &[ObjectId],
) -> Vec<(usize, ObjectId)> {
    let by_number: BTreeMap<usize, ObjectId> = {
        let numbers = runtime::lock(&traffic.numbers.of);
        acked
            .iter()
            .filter_map(|id| numbers.get(id).map(|&n| (n, *id)))
            .collect()
    };
    let want = by_number.keys().copied().collect();
    peer.missing(&want, Duration::from_secs(60))
        .await
        .into_iter()
        .filter_map(|n| by_number.get(&n).map(|&id| (n, id)))
        .collect()
}

/// The QoS 2 pairs shown more than once that were not named yet, with the in-process
/// subscriber's calls of each (when, relative to the first; what; from which port): where a
/// replay starts; and the receiver process's.
pub(super) fn duplicated(
    t: &Traffic,
    receiver: &super::receiver::Receiver,
    reported: &mut std::collections::BTreeSet<(u64, ObjectId)>,
) -> String {
    let mut out = Vec::new();
    for (pair, _) in t
        .rec
        .shown()
        .into_iter()
        .filter(|(p, n)| p.0 == t.q2 && *n > 1)
    {
        if !reported.insert(pair) {
            continue;
        }
        let calls = t.rec.calls(pair);
        let first = calls.first().map(|c| c.0);
        let calls: Vec<String> = calls
            .iter()
            .map(|(at, what, port)| {
                let ms = first.map_or(0, |f| at.duration_since(f).as_millis());
                format!("+{ms} ms {what} from port {port}")
            })
            .collect();
        out.push(format!(
            "object {}:{} ({})",
            pair.1.node,
            pair.1.seq,
            calls.join(", ")
        ));
    }
    for pair in receiver.duplicated() {
        if reported.insert(pair) {
            out.push(format!(
                "object {}:{} at the receiver process (its journal's `shown` lines name the \
                 deliveries)",
                pair.1.node, pair.1.seq
            ));
        }
    }
    out.join("; ")
}

/// The objects of `acked` not in `known` (those a check found missing already).
pub(super) fn not_in(
    acked: &[ObjectId],
    known: &std::collections::HashSet<ObjectId>,
) -> Vec<ObjectId> {
    acked
        .iter()
        .filter(|id| !known.contains(*id))
        .copied()
        .collect()
}

/// The leader's subscription list (id -> revision), through a live node.
pub(super) async fn leader_list(c: &ElectedCluster) -> anyhow::Result<HashMap<u64, u64>> {
    let via = live_node(c, None);
    try_wait_for(Duration::from_secs(30), || {
        let via = via.clone();
        async move {
            let mut subs = v1::subscriptions_client::SubscriptionsClient::new(procs::channel(&via));
            let mut out = HashMap::new();
            let mut after = 0;
            loop {
                let page = subs
                    .list(v1::ListSubscriptionsRequest {
                        after_id: after,
                        limit: 1000,
                    })
                    .await
                    .ok()?
                    .into_inner();
                out.extend(page.subscriptions.iter().map(|s| (s.id, s.revision)));
                if page.next_after_id == 0 {
                    return Some(out);
                }
                after = page.next_after_id;
            }
        }
    })
    .await
    .context("the leader's subscription list")
}

/// After the last schedule: the leader is killed and the standby's list, rebuilt from the
/// nodes, must equal the old leader's (the subscription list is the same on every
/// coordinator that leads). A violation names the first subscriptions that differ.
pub(super) async fn leaders_agree(
    c: &mut ElectedCluster,
    seed: u64,
    violations: &mut Vec<Violation>,
) -> anyhow::Result<()> {
    let before = leader_list(c).await?;
    c.kill_leader().await?;
    let after = leader_list(c).await?;
    let mut differ: Vec<String> = before
        .iter()
        .filter(|(id, rev)| after.get(id) != Some(rev))
        .map(|(id, rev)| format!("{id} at {rev} became {:?}", after.get(id)))
        .chain(
            after
                .iter()
                .filter(|(id, _)| !before.contains_key(id))
                .map(|(id, rev)| format!("{id} at {rev} appeared")),
        )
        .collect();
    if !differ.is_empty() {
        differ.sort();
        violations.push(Violation {
            seed,
            invariant: "leaders_disagree",
            detail: format!(
                "{} subscriptions differ between the last leader and the next, e.g. {}",
                differ.len(),
                differ[..differ.len().min(3)].join("; ")
            ),
        });
    }
    Ok(())
}

/// The leader's registry against the changes: (resurrected, stale versions).
pub(super) async fn check_registry(
    c: &ElectedCluster,
    changes: &mut Changes,
    seed: u64,
    violations: &mut Vec<Violation>,
) -> anyhow::Result<(usize, usize)> {
    let listed = leader_list(c).await?;
    let mut resurrected = 0;
    let back: Vec<u64> = changes
        .deleted
        .keys()
        .filter(|id| listed.contains_key(id))
        .copied()
        .collect();
    // each resurrected subscription is one violation, at the first check that lists it
    for id in back {
        if !changes.resurrected.insert(id) {
            continue;
        }
        resurrected += 1;
        violations.push(Violation {
            seed,
            invariant: "resurrected",
            detail: format!("subscription {id} listed after its delete returned"),
        });
    }
    let mut stale = 0;
    for (id, want) in &changes.canaries {
        match listed.get(id) {
            Some(have) if have < want => {
                stale += 1;
                violations.push(Violation {
                    seed,
                    invariant: "stale_versions",
                    detail: format!("subscription {id} at revision {have}, updated to {want}"),
                });
            }
            None => violations.push(Violation {
                seed,
                invariant: "lost_subscription",
                detail: format!("subscription {id} is missing from the leader's list"),
            }),
            _ => {}
        }
    }
    Ok((resurrected, stale))
}

/// Deliveries to canaries, and to deleted subscriptions of objects put after the delete.
pub(super) fn misdeliveries(t: &Traffic, changes: &Changes) -> u64 {
    let numbers = runtime::lock(&t.numbers.of).clone();
    t.rec
        .shown()
        .iter()
        .filter(|((sub, obj), _)| {
            changes.canaries.contains_key(sub)
                || changes
                    .deleted
                    .get(sub)
                    .is_some_and(|&from| numbers.get(obj).is_some_and(|&n| n >= from))
        })
        .map(|(_, &n)| u64::from(n))
        .sum()
}
