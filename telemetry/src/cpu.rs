//! Where a program's hot thread runs, the same way in both programs (the publisher's
//! `[cpu] hot_core`, the subscriber's `core`): the CPUs this process may use, a core checked
//! against them, pinning the calling thread, and CPU lists as an operator writes them (`0-3,6`).
//!
//! Here rather than in the core: the affinity mask is a system call's answer, and the core
//! does no I/O.

use anyhow::{Result, bail};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// The CPUs this process may run on (its affinity mask: the machine's CPUs, less any a
/// container or `taskset` took away).
pub fn allowed_cpus() -> Vec<usize> {
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect(),
        // Unknown: every CPU the standard library counts.
        Err(_) => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

/// `core`, when this process may run on it; else an error naming `setting` and the CPUs there are.
pub fn check_core(setting: &str, core: usize) -> Result<usize> {
    let allowed = allowed_cpus();
    if !allowed.contains(&core) {
        bail!("{setting}: {core} is not a CPU this process may run on (it may use {})", list(&allowed));
    }
    Ok(core)
}

/// CPUs as `0-3,6`: runs of consecutive CPUs as ranges.
pub fn list(cpus: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    out.join(",")
}

/// Pins the calling thread (only it: sched_setaffinity with pid 0 is per thread) to `core`.
pub fn pin_current_thread(core: usize) -> nix::Result<()> {
    let mut set = CpuSet::new();
    set.set(core)?;
    sched_setaffinity(Pid::from_raw(0), &set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_written_as_ranges() {
        assert_eq!(list(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(list(&[1]), "1");
        assert_eq!(list(&[1, 3, 4]), "1,3-4");
        assert_eq!(list(&[]), "");
    }

    #[test]
    fn a_core_beyond_the_machine_is_refused_by_name() {
        let e = check_core("cpu.hot_core", 100_000).unwrap_err().to_string();
        assert!(e.starts_with("cpu.hot_core: 100000"), "{e}");
        assert!(e.contains(&list(&allowed_cpus())), "{e}");
        assert!(check_core("cpu.hot_core", allowed_cpus()[0]).is_ok());
    }

    #[test]
    fn a_thread_is_pinned_to_an_allowed_cpu_and_refused_one_beyond_the_mask() {
        let core = *allowed_cpus().last().expect("at least one CPU");
        // A thread of its own, so the test's other threads keep every CPU.
        let pinned = std::thread::spawn(move || {
            pin_current_thread(core).map(|()| sched_getaffinity(Pid::from_raw(0)).map(|set| set.is_set(core)))
        })
        .join()
        .unwrap();
        assert_eq!(pinned, Ok(Ok(Ok(true))));
        assert!(std::thread::spawn(|| pin_current_thread(CpuSet::count())).join().unwrap().is_err());
    }
}
