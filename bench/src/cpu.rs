//! Process CPU time from `/proc/<pid>/stat` (Linux; `None` elsewhere): what the cost
//! benchmark divides by deliveries to give a node's CPU per delivery.

use std::sync::OnceLock;

/// Clock ticks per second of `/proc`'s times (`getconf CLK_TCK`; 100, the Linux user ABI's
/// value, when that cannot be run).
fn ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// User and system CPU seconds a `/proc/<pid>/stat` line records (every thread of the
/// process, live or ended).
pub fn parse_stat(line: &str) -> Option<f64> {
    // the command name (field 2) may hold spaces and parentheses: fields are counted from
    // after its last ')'; utime and stime are fields 14 and 15
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_second())
}

/// CPU seconds (user + system) process `pid` has used so far.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds (user + system) this process has used so far.
pub fn own_cpu_seconds() -> Option<f64> {
    process_cpu_seconds(std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_user_plus_system_time() {
        let t = ticks_per_second();
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        let got = parse_stat(line).expect("parsed");
        assert!((got - 300.0 / t).abs() < 1e-9, "{got}");
        assert_eq!(parse_stat("42 (x) S 1"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        let mut x = 0u64;
        let t0 = std::time::Instant::now();
        while t0.elapsed().as_millis() < 30 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(own_cpu_seconds().expect("linux") > 0.0);
    }
}
