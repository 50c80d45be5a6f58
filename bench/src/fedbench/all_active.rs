//! All-active: three clusters in a triangle (each links to both others), a publisher and a
//! recording subscriber per cluster; the link from the first cluster to the second runs
//! through a relay that is cut for a while mid-run.

use super::*;
use crate::cut::Cut;

/// The all-active figures.
#[derive(Debug, Clone, Serialize)]
pub struct AllActiveReport {
    pub pass: bool,
    /// Over the three clusters' subscribers: acknowledged objects one did not get, and
    /// objects shown more than once.
    pub missing: u64,
    pub duplicates: u64,
    pub clusters: usize,
    pub objects_per_publisher: u32,
    pub rate: u32,
    /// Puts per second the slowest publisher achieved (first to last acknowledgement; puts
    /// are pipelined on one stream, paced at `rate`).
    pub achieved_rate: f64,
    /// Distinct objects each cluster's subscriber got.
    pub delivered: Vec<usize>,
    /// Objects the links' peers acknowledged, and what that should be (each object once to
    /// each peer).
    pub forwards: u64,
    pub expected_forwards: u64,
    /// Objects a cluster sent that it had not ingested itself (a loop).
    pub re_forwards: u64,
    /// Objects a peer had already (a batch sent again after the cut).
    pub retransmitted: u64,
    /// Per cluster and publisher, objects the cluster stored after a later one of the same
    /// publisher (the order its ids give: what a link keeps).
    pub out_of_order: u64,
    /// Per subscriber (an ordered subscription) and publisher, objects that reached the
    /// subscriber after a later one of the same publisher, and where:
    /// `cluster <- publisher: count`.
    pub arrived_out_of_order: u64,
    pub arrived_out_of_order_at: Vec<String>,
    pub flat_s: f64,
    /// Whether any count moved during the flat period after traffic stopped.
    pub changed_after_stop: bool,
    pub cut_s: f64,
}

pub(super) async fn run(o: &FederationOptions, dir: &Path) -> anyhow::Result<AllActiveReport> {
    let addrs: Vec<SocketAddr> = (0..3).map(|_| procs::free_port()).collect();
    let names = ["c0", "c1", "c2"];
    // the link c0 -> c1 goes through a relay the run cuts
    let cut = Cut::start(addrs[1]).await?;
    let mut procs_ = Vec::new();
    for i in 0..3 {
        let mut extra = Vec::new();
        for j in (0..3).filter(|j| *j != i) {
            let to = if (i, j) == (0, 1) { cut.addr } else { addrs[j] };
            extra.push("--link".to_string());
            extra.push(format!("to-{}=http://{to}", names[j]));
        }
        procs_.push(cluster(&o.bin, dir, names[i], addrs[i], &extra));
    }
    let urls: Vec<String> = procs_.iter().map(Proc::url).collect();
    let mut recs = Vec::new();
    for u in &urls {
        let (rec, target) = Recorder::start().await?;
        let sub = Sub {
            qos: v1::Qos::AtLeastOnce,
            ordered: true,
            ..Sub::default()
        };
        subscribe(u, &target, sub).await?;
        recs.push(rec);
    }
    let publishers: Vec<Publisher> = (0..3)
        .map(|i| Publisher::new(&format!("p{i}"), &urls[i..=i]))
        .collect();
    let n = i64::from(o.objects);
    let tasks: Vec<_> = publishers
        .iter()
        .map(|p| p.spawn_stream(0..n, o.rate))
        .collect();
    // cut c0 -> c1 about a third of the way in
    let run_time = Duration::from_secs_f64(f64::from(o.objects) / f64::from(o.rate.max(1)));
    tokio::time::sleep(run_time / 3).await;
    eprintln!("  cutting the link c0 -> c1 for {} s", o.cut.as_secs_f64());
    cut.set_down(true);
    tokio::time::sleep(o.cut).await;
    cut.set_down(false);
    for t in tasks {
        t.await?;
    }
    // from the first acknowledgement to the last, per publisher (the slowest)
    let achieved_rate = publishers
        .iter()
        .map(|p| {
            let at: Vec<Instant> = p.acked().values().map(|(t, _)| *t).collect();
            match (at.iter().min(), at.iter().max()) {
                (Some(a), Some(b)) if b > a => (at.len() - 1) as f64 / (*b - *a).as_secs_f64(),
                _ => 0.0,
            }
        })
        .fold(f64::INFINITY, f64::min);
    eprintln!("  puts done ({achieved_rate:.0}/s per publisher); waiting for every subscriber");
    let want = 3 * o.objects as usize;
    let _ = procs::try_wait_for(Duration::from_secs(60), || async {
        recs.iter()
            .all(|r| r.numbered().len() >= want)
            .then_some(())
    })
    .await;
    let _ = drained(&urls, Duration::from_secs(30)).await;
    let counts = |recs: &[Recorder]| -> Vec<u32> {
        recs.iter()
            .map(|r| r.numbered().values().map(|v| v.times).sum())
            .collect()
    };
    let own: Vec<u64> = publishers.iter().map(|p| p.acked().len() as u64).collect();
    let before = (counts(&recs), forwards(&urls, &own).await);
    eprintln!(
        "  checking that nothing moves for {} s",
        o.flat.as_secs_f64()
    );
    tokio::time::sleep(o.flat).await;
    let after = (counts(&recs), forwards(&urls, &own).await);
    let acked: BTreeMap<(String, i64), (Instant, usize)> =
        publishers.iter().flat_map(|p| p.acked()).collect();
    let mut missing = 0;
    let mut duplicates = 0;
    let mut out_of_order = 0;
    let mut arrived_out_of_order = 0;
    let mut arrived_out_of_order_at = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        let shown = shows(&[r]);
        let (m, d) = tally(&acked, &shown);
        missing += m;
        duplicates += d;
        out_of_order += disorder(r, |v| (v.id, v.first))
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>();
        for (publisher, late) in disorder(r, |v| (v.first, v.id)) {
            arrived_out_of_order += late;
            arrived_out_of_order_at.push(format!("{} <- {publisher}: {late}", names[i]));
        }
    }
    let (forwards, retransmitted, re_forwards) = after.1.unwrap_or_default();
    let expected_forwards = 2 * acked.len() as u64;
    let pass = missing == 0
        && duplicates == 0
        && out_of_order == 0
        && arrived_out_of_order == 0
        && forwards == expected_forwards
        && re_forwards == 0
        && before == after
        && acked.len() == want;
    Ok(AllActiveReport {
        pass,
        missing,
        duplicates,
        clusters: 3,
        objects_per_publisher: o.objects,
        rate: o.rate,
        achieved_rate,
        delivered: recs.iter().map(|r| r.numbered().len()).collect(),
        forwards,
        expected_forwards,
        re_forwards,
        retransmitted,
        out_of_order,
        arrived_out_of_order,
        arrived_out_of_order_at,
        flat_s: o.flat.as_secs_f64(),
        changed_after_stop: before != after,
        cut_s: o.cut.as_secs_f64(),
    })
}

/// Over every link of the clusters at `urls`: (acknowledged, deduplicated, re-forwards:
/// acknowledged beyond the `own` objects the sending cluster ingested itself, which each
/// link carries once).
async fn forwards(urls: &[String], own: &[u64]) -> Option<(u64, u64, u64)> {
    let mut acked = 0;
    let mut dedup = 0;
    let mut again = 0;
    for (u, own) in urls.iter().zip(own) {
        let own = *own;
        for l in links(u).await?.links {
            acked += l.acked;
            dedup += l.deduplicated;
            again += l.acked.saturating_sub(own);
        }
    }
    Some((acked, dedup, again))
}

/// Per publisher, how many of `r`'s numbered objects come after a higher-numbered one of the
/// same publisher in the order `order` gives (publishers with none left out).
fn disorder<K: Ord>(r: &Recorder, order: impl Fn(&Seen) -> K) -> Vec<(String, u64)> {
    let mut by_pub: BTreeMap<String, Vec<(K, i64)>> = BTreeMap::new();
    for ((p, n), v) in r.numbered() {
        by_pub.entry(p).or_default().push((order(&v), n));
    }
    let mut out = Vec::new();
    for (publisher, mut v) in by_pub {
        v.sort();
        let mut top = i64::MIN;
        let mut late = 0;
        for (_, n) in v {
            if n < top {
                late += 1;
            }
            top = top.max(n);
        }
        if late > 0 {
            out.push((publisher, late));
        }
    }
    out
}
