//! Transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` (mimalloc's own
//! option) is set. With the kernel's THP on "always", every first touch of fresh memory
//! faults in and zeroes a whole 2 MiB page, and on this project's machines (virtual machines,
//! whose memory the host backs on first touch) the 1M-subscription W1 build spent about half
//! its time in the kernel's page clearing (`perf`: `clear_page_erms` under
//! `do_huge_pmd_anonymous_page`). Measured side by side (`DISSEM_BUILD_PHASES=1 dissem bench
//! match --workload uniform --preds 10 --width 0.5 --subs 1000000 --engine cpu`, and with
//! `MIMALLOC_ALLOW_THP=1`): W1 built in 5.8 s with THP off against 7.0 to 9.4 s with it on,
//! matching at the same speed; W2 (`--preds 3 --width 0.02`, small tables) built in 2.05 s
//! against 1.72 s, and matched within a few percent. Databases that allocate big tables
//! (Redis, MongoDB) ask for THP off too (for the latency spikes of compaction as well). The
//! setting holds for the whole process and survives `exec` (the start in place after a full
//! disk keeps it).

/// Turns THP off for this process unless `MIMALLOC_ALLOW_THP` says otherwise
/// (`MIMALLOC_ALLOW_THP=1` keeps the kernel's setting; `0` has mimalloc turn it off too).
pub(crate) fn configure() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    disable();
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn disable() {
    // SAFETY: prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) takes plain integers and touches no
    // memory of ours; it sets a flag of this process's address space.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r != 0 {
        // an old kernel: THP stays as the kernel has it, which only costs speed
        eprintln!(
            "note: transparent huge pages could not be turned off for this process (prctl: {})",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn disable() {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    #[allow(unsafe_code)]
    fn the_process_has_thp_off_after_configure() {
        // the test binary has no MIMALLOC_ALLOW_THP of its own unless a developer set it
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
            return;
        }
        super::configure();
        // SAFETY: PR_GET_THP_DISABLE takes plain integers and returns the flag
        let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(flag, 1, "THP is off for the process");
    }
}
