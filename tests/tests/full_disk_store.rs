//! What a store answered as durable stays durable when its disk fills up mid-write: writers
//! put objects and record QoS 2 "received" phases side by side on a small tmpfs, the disk
//! is filled under them until sled fails, and after the ballast is removed and the store
//! opened again every put and every record whose call answered Ok is there. Before the fix
//! in `Store::commit`, the writers that shared a failed flush with the one that ran it were
//! answered Ok (a handful of acknowledged writes lost per fill; `bench chaos` seed 32 showed
//! it as QoS 2 deliveries released on a "received" phase that never reached the disk).
//! Needs a tmpfs (root); skipped elsewhere unless `DISSEM_REQUIRE_MOUNT` is set.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use blocks::Value;
use storage::{DeliveryState, NewObject, ObjectId, Store};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the writers were answered Ok for: objects put, (writer, seq) records written.
#[derive(Default)]
struct Acked {
    puts: Vec<(ObjectId, i64)>,
    records: Vec<(u64, u64)>,
}

/// Writer `w`: puts and records alternately until the store has refused it many times.
async fn write(s: Store, w: u64, acked: Arc<Mutex<Acked>>) {
    let mut refused = 0;
    for i in 0..u64::MAX {
        let r = if i % 2 == 0 {
            let o = NewObject {
                data: vec![7u8; 64],
                metadata: vec![("n".into(), Value::from(i as i64))],
                ..NewObject::default()
            };
            s.put(o).await.map(|p| {
                lock(&acked).puts.push((p.id, i as i64));
            })
        } else {
            let st = DeliveryState::Received {
                attempts: 1,
                next_attempt_unix_ms: i,
            };
            s.set_delivery(w, ObjectId { node: 1, seq: i }, &st)
                .await
                .map(|_| lock(&acked).records.push((w, i)))
        };
        if r.is_err() {
            refused += 1;
            if refused > 20 {
                return;
            }
            tokio::task::yield_now().await;
        }
    }
}

#[test]
fn what_a_store_acknowledged_survives_its_disk_filling_up() {
    // the fill lands at a different moment of the writes each round
    for round in 0..5u64 {
        let dir = tests::temp_dir(&format!("full-disk-store-{round}"));
        let Some(fs) = bench::chaosdisk::Tmpfs::mount_for_test(&dir, 40) else {
            return;
        };
        let acked: Arc<Mutex<Acked>> = Arc::default();
        tests::runtime().block_on(async {
            let s = Store::open(&dir, 1).expect("open");
            // no reserve: the writes run into the full disk itself, as when another process
            // takes the last bytes between the reserve check and the write
            s.set_disk_reserve(Some(0));
            let writers: Vec<_> = (0..8)
                .map(|w| tokio::spawn(write(s.clone(), w, acked.clone())))
                .collect();
            let enough = 2_000 + 1_500 * round as usize;
            tests::wait_for("writes before the fill", Duration::from_secs(60), || {
                let a = lock(&acked);
                let n = a.puts.len() + a.records.len();
                async move { (n >= enough).then_some(()) }
            })
            .await;
            let d = dir.clone();
            tokio::task::spawn_blocking(move || bench::chaosdisk::fill(&d))
                .await
                .expect("join")
                .expect("fill");
            for w in writers {
                tokio::time::timeout(Duration::from_secs(60), w)
                    .await
                    .expect("a writer refused by the full disk stops")
                    .expect("join");
            }
        });
        bench::chaosdisk::free(&dir).expect("free");
        let s = Store::open(&dir, 1).expect("reopen");
        let a = lock(&acked);
        let lost_puts: Vec<_> = a
            .puts
            .iter()
            .filter(|(id, _)| s.get(*id).ok().flatten().is_none())
            .collect();
        let lost_records: Vec<_> = a
            .records
            .iter()
            .filter(|(w, i)| {
                let key = ObjectId { node: 1, seq: *i };
                s.delivery(*w, key).ok().flatten().is_none()
            })
            .collect();
        assert!(
            lost_puts.is_empty() && lost_records.is_empty(),
            "round {round}: of {} puts and {} records acknowledged, {} puts and {} records \
             lost, e.g. {:?} {:?}",
            a.puts.len(),
            a.records.len(),
            lost_puts.len(),
            lost_records.len(),
            &lost_puts[..lost_puts.len().min(3)],
            &lost_records[..lost_records.len().min(3)]
        );
        drop(a);
        drop(s);
        drop(fs);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
