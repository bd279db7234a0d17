//! The hot thread's place on the machine: pinned to a core (`[cpu] hot_core`), and timers as
//! precise as the kernel allows, so `backoff`'s short sleeps end when asked.

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

/// CPUs as `0-3,6`.
fn list(cpus: &[usize]) -> String {
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
pub fn pin_current_thread(core: usize) -> Result<()> {
    let mut set = CpuSet::new();
    set.set(core)?;
    sched_setaffinity(Pid::from_raw(0), &set)?;
    Ok(())
}

/// Sets the calling thread's timer slack to 1 ns (PR_SET_TIMERSLACK). With the default 50 µs
/// the kernel may end any sleep up to 50 µs late to batch wake-ups; measured on a 2 vCPU KVM
/// guest, a 10 µs sleep then ends about 70 µs late, and with 1 ns about 20 µs late. A failure
/// only costs precision, so it is logged and the thread goes on.
pub fn precise_timers() {
    if let Err(error) = nix::sys::prctl::set_timerslack(1) {
        tracing::warn!(%error, "cannot set the hot thread's timer slack to 1 ns; short sleeps may end up to 50 µs late");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_written_as_ranges() {
        assert_eq!(list(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(list(&[1]), "1");
    }

    #[test]
    fn a_core_beyond_the_machine_is_refused_by_name() {
        let e = check_core("cpu.hot_core", 100_000).unwrap_err().to_string();
        assert!(e.starts_with("cpu.hot_core: 100000"), "{e}");
        assert!(check_core("cpu.hot_core", allowed_cpus()[0]).is_ok());
    }
}
