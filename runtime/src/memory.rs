//! How the process's allocator hands freed memory back to the system.

/// Keeps the memory the process frees for its own later use instead of handing it back to the
/// system.
///
/// glibc's allocator gives back the free top of each arena once it passes a threshold (128 KiB
/// by default), so a process whose buffers come and go in bursts (a relay's records, held until
/// its slowest subscriber has taken them) sees its resident set swing by megabytes, and faults
/// the same pages in again on the next burst, on the thread that allocates. A relay's memory is
/// bounded by its settings (its ring, its queue), so keeping what it freed costs nothing beyond
/// that bound: its resident set stays at its high-water mark, reached in its first seconds.
///
/// Returns whether the allocator took the setting: false with another C library, whose own
/// policy then stands.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` sets one of glibc's allocator tunables from two integers; it reads
        // and writes no memory of ours, and glibc takes its arenas' locks to change it, so it may
        // be called at any time, from any thread.
        #[allow(unsafe_code)]
        let took = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) };
        took == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// The resident set of this process, KiB, from /proc.
    fn resident_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn memory_freed_stays_with_the_process() {
        // A thread of its own, so the blocks come from one arena that nothing else uses while
        // they are freed: its free top is then exactly what glibc would have handed back.
        let kept_kib = std::thread::spawn(|| {
            assert!(keep_freed_memory(), "glibc takes the setting");
            // 48 MiB in blocks below the mmap threshold: from the arena's heap, touched.
            let blocks: Vec<Vec<u8>> = (0..768).map(|i| vec![i as u8; 64 << 10]).collect();
            let full = resident_kib();
            drop(blocks);
            full.saturating_sub(resident_kib())
        })
        .join()
        .unwrap();
        // Without the setting, freeing the blocks hands nearly all 48 MiB back at once.
        assert!(kept_kib < 8 << 10, "{kept_kib} KiB of the 48 MiB freed left the process");
    }
}
