//! The receive thread's place on the machine: pinned to a core (`core`, `--core`), and
//! SO_BUSY_POLL on its sockets under the low-latency profile.

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use std::os::fd::AsFd;

/// Microseconds the kernel busy-polls the device queue on a receive with no data (SO_BUSY_POLL):
/// the value the kernel's documentation suggests for a start.
pub const BUSY_POLL_US: u32 = 50;

/// The CPUs this process may run on (its affinity mask: the machine's CPUs, less any a
/// container or `taskset` took away).
pub fn allowed_cpus() -> Vec<usize> {
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect(),
        // Unknown: every CPU the standard library counts.
        Err(_) => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

/// CPUs as `0-3,6`.
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

/// Sets SO_BUSY_POLL on `socket`; logs when the kernel refuses it (raising it above
/// net.core.busy_read needs CAP_NET_ADMIN), since the relay works without it.
pub fn busy_poll(socket: &impl AsFd, what: &str) {
    match socket2::SockRef::from(socket).set_busy_poll(BUSY_POLL_US) {
        Ok(()) => tracing::info!(socket = what, us = BUSY_POLL_US, "SO_BUSY_POLL set"),
        Err(error) => tracing::warn!(socket = what, %error, "SO_BUSY_POLL refused; receiving without it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_written_as_ranges() {
        assert_eq!(list(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(list(&[]), "");
    }
}
