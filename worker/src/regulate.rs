//! Load regulation of a node daemon (DESIGN §5): the node, not the coordinator, decides how
//! many workers it can afford. A sans-I/O regulator turns CPU samples into actions: above the
//! upper threshold every idle worker is terminated so no more tasks land here; below the lower
//! threshold one empty worker is started per sample (the finest grain); workers that got no
//! task for a long time are cleaned up. [`CpuSampler`] reads the node's utilisation from
//! `/proc/stat`.

/// Settings of the regulator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegulatorConfig {
    /// Utilisation (0..=1) above which idle workers are terminated.
    pub upper: f64,
    /// Utilisation below which an empty worker is started.
    pub lower: f64,
    /// Workers kept even when the node is busy or they are idle.
    pub min_workers: usize,
    /// Workers never exceeded.
    pub max_workers: usize,
    /// A worker without a task for this long is terminated (above `min_workers`).
    pub idle_cleanup_ms: u64,
}

impl Default for RegulatorConfig {
    fn default() -> RegulatorConfig {
        RegulatorConfig {
            upper: 0.85,
            lower: 0.60,
            min_workers: 0,
            max_workers: 64,
            idle_cleanup_ms: 300_000,
        }
    }
}

/// What the regulator sees of one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerView {
    pub id: u64,
    pub idle: bool,
    /// When it last finished (or started with) a task, ms.
    pub last_task_ms: u64,
}

/// What the node daemon should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regulation {
    /// Start one empty worker.
    Start,
    /// Terminate this (idle) worker.
    Terminate(u64),
}

/// Decides from one CPU sample (0..=1) at `now` ms.
pub fn regulate(
    cfg: &RegulatorConfig,
    now: u64,
    cpu: f64,
    workers: &[WorkerView],
) -> Vec<Regulation> {
    let mut out = Vec::new();
    let mut alive = workers.len();
    if cpu > cfg.upper {
        // overloaded: stop taking work here, down to the floor
        for w in workers.iter().filter(|w| w.idle) {
            if alive <= cfg.min_workers {
                break;
            }
            out.push(Regulation::Terminate(w.id));
            alive -= 1;
        }
        return out;
    }
    for w in workers
        .iter()
        .filter(|w| w.idle && now.saturating_sub(w.last_task_ms) >= cfg.idle_cleanup_ms)
    {
        if alive <= cfg.min_workers {
            break;
        }
        out.push(Regulation::Terminate(w.id));
        alive -= 1;
    }
    if (cpu < cfg.lower && alive < cfg.max_workers) || alive < cfg.min_workers {
        out.push(Regulation::Start);
    }
    out
}

/// Node CPU utilisation from `/proc/stat`, between consecutive samples.
#[derive(Debug, Default, Clone)]
pub struct CpuSampler {
    last: Option<(u64, u64)>,
}

/// Parses the aggregate `cpu` line of `/proc/stat` into (busy, total) jiffies. Niced time
/// does not count as busy: niced work, such as a node's own bulk lane, yields the CPU to
/// anything at normal priority.
pub fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().sum();
    // niced, idle and iowait are not busy
    let idle = v[1] + v[3] + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

impl CpuSampler {
    /// Utilisation since the previous call (None on the first call or without `/proc`).
    pub fn sample(&mut self) -> Option<f64> {
        let now = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)?;
        self.observe(now)
    }

    /// Same from given (busy, total) counters.
    pub fn observe(&mut self, now: (u64, u64)) -> Option<f64> {
        let prev = self.last.replace(now)?;
        let total = now.1.checked_sub(prev.1)?;
        if total == 0 {
            return None;
        }
        Some((now.0.saturating_sub(prev.0)) as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: u64, idle: bool, last: u64) -> WorkerView {
        WorkerView {
            id,
            idle,
            last_task_ms: last,
        }
    }

    #[test]
    fn overload_terminates_every_idle_worker_down_to_the_floor() {
        let cfg = RegulatorConfig {
            min_workers: 1,
            ..RegulatorConfig::default()
        };
        let ws = [w(1, true, 0), w(2, false, 0), w(3, true, 0), w(4, true, 0)];
        assert_eq!(
            regulate(&cfg, 10, 0.95, &ws),
            vec![
                Regulation::Terminate(1),
                Regulation::Terminate(3),
                Regulation::Terminate(4)
            ]
        );
        let ws = [w(1, true, 0)];
        assert!(
            regulate(&cfg, 10, 0.95, &ws).is_empty(),
            "never below min_workers"
        );
    }

    #[test]
    fn spare_capacity_starts_one_empty_worker_per_sample() {
        let cfg = RegulatorConfig {
            max_workers: 2,
            ..RegulatorConfig::default()
        };
        assert_eq!(regulate(&cfg, 0, 0.10, &[]), vec![Regulation::Start]);
        assert_eq!(
            regulate(&cfg, 0, 0.10, &[w(1, true, 0)]),
            vec![Regulation::Start]
        );
        assert!(
            regulate(&cfg, 0, 0.10, &[w(1, true, 0), w(2, true, 0)]).is_empty(),
            "max reached"
        );
        assert!(
            regulate(&cfg, 0, 0.70, &[w(1, true, 0)]).is_empty(),
            "between thresholds: hold"
        );
    }

    #[test]
    fn long_idle_workers_are_cleaned_up() {
        let cfg = RegulatorConfig {
            idle_cleanup_ms: 1_000,
            ..RegulatorConfig::default()
        };
        let ws = [w(1, true, 0), w(2, true, 500), w(3, false, 0)];
        assert_eq!(
            regulate(&cfg, 1_200, 0.70, &ws),
            vec![Regulation::Terminate(1)]
        );
    }

    #[test]
    fn cpu_sampling() {
        let text = "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_proc_stat(text), Some((200, 1000)));
        let niced = "cpu  100 50 100 650 100 0 0 0 0 0\n";
        assert_eq!(
            parse_proc_stat(niced),
            Some((200, 1000)),
            "niced time is free"
        );
        let mut s = CpuSampler::default();
        assert_eq!(s.observe((200, 1000)), None);
        assert_eq!(s.observe((700, 2000)), Some(0.5));
        assert_eq!(s.observe((700, 2000)), None, "no time passed");
        if std::path::Path::new("/proc/stat").exists() {
            let mut real = CpuSampler::default();
            assert!(real.sample().is_none());
            // a second sample after some work gives a utilisation in [0, 1]
            let mut x = 0u64;
            for i in 0..5_000_000u64 {
                x = x.wrapping_add(i * i);
            }
            std::hint::black_box(x);
            if let Some(u) = real.sample() {
                assert!((0.0..=1.0).contains(&u), "{u}");
            }
        }
    }
}
