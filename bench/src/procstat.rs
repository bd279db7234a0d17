//! CPU time and peak memory of a child process, from /proc while it runs.
//!
//! A sampler thread reads `/proc/PID/stat` (utime + stime) and `/proc/PID/status` (VmHWM)
//! every few milliseconds until the process has exited. The harness reaps a child only when
//! asked to, so the sampler sees it as a zombie first: its stat then holds the final CPU time of
//! all its threads. VmHWM is gone by then (no memory map), so the last value read while it ran
//! is kept; it is a high-water mark, so a sample shortly before the exit is enough.
//!
//! [`snapshot`] is one look at a process now, resident set included (VmRSS, not only the
//! high-water mark): `scale` takes one per sample to show whether memory stays flat over a run.

use serde::Serialize;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the sampler looks.
const PERIOD: Duration = Duration::from_millis(10);

/// What a process used.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Usage {
    /// User plus system CPU time of all its threads, seconds.
    pub cpu_seconds: f64,
    /// Peak resident set (VmHWM), KiB.
    pub peak_rss_kib: u64,
    /// Whether the exit was seen (otherwise the figures stop at the deadline).
    pub complete: bool,
}

/// A sampler running on its own thread.
pub struct Sampler(JoinHandle<Usage>);

impl Sampler {
    /// Samples `pid` until it exits or `deadline` passes.
    pub fn start(pid: u32, deadline: Instant) -> Sampler {
        Sampler(std::thread::spawn(move || sample(pid, deadline)))
    }

    /// Waits for the exit (or the deadline) and returns what was used. Call before the harness
    /// reaps the process, or the final CPU time is lost.
    pub fn finish(self) -> Usage {
        self.0.join().unwrap_or_default()
    }
}

/// Clock ticks per second, the unit of utime and stime.
pub fn ticks_per_second() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        // 100 on every Linux architecture this runs on.
        _ => 100.0,
    }
}

/// State and utime + stime (ticks) from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((state, utime + stime))
}

/// VmHWM from `/proc/PID/status`, KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn sample(pid: u32, deadline: Instant) -> Usage {
    let ticks = ticks_per_second();
    let mut usage = Usage::default();
    loop {
        let Some((state, cpu)) = stat(pid) else {
            // Reaped already: the last sample is what there is.
            return usage;
        };
        usage.cpu_seconds = cpu as f64 / ticks;
        if matches!(state, 'Z' | 'X') {
            usage.complete = true;
            return usage;
        }
        if let Some(kib) = peak_rss_kib(pid) {
            usage.peak_rss_kib = usage.peak_rss_kib.max(kib);
        }
        if Instant::now() >= deadline {
            return usage;
        }
        std::thread::sleep(PERIOD);
    }
}

/// One look at a process: whether it has exited, its CPU time, and its resident memory now.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Snapshot {
    /// Whether it has exited (a zombie not yet reaped): the CPU time is then final.
    pub exited: bool,
    /// User plus system CPU time of all its threads so far, seconds.
    pub cpu_seconds: f64,
    /// Resident set now (VmRSS), KiB; none once it has exited.
    pub rss_kib: Option<u64>,
    /// The anonymous part of it (RssAnon: heap, stacks), KiB: what a leak grows, where file
    /// pages come and go with the page cache.
    pub rss_anon_kib: Option<u64>,
    /// Peak resident set so far (VmHWM), KiB; none once it has exited.
    pub peak_rss_kib: Option<u64>,
}

/// What `pid` uses now; none when there is no such process (never was, or reaped already).
pub fn snapshot(pid: u32) -> Option<Snapshot> {
    let (state, ticks) = stat(pid)?;
    let exited = matches!(state, 'Z' | 'X');
    // A zombie has no memory map left: its status has no Vm lines to read.
    let status =
        if exited { String::new() } else { std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default() };
    Some(Snapshot {
        exited,
        cpu_seconds: ticks as f64 / ticks_per_second(),
        rss_kib: status_kib(&status, "VmRSS:"),
        rss_anon_kib: status_kib(&status, "RssAnon:"),
        peak_rss_kib: status_kib(&status, "VmHWM:"),
    })
}

/// The value of a `Key:   1234 kB` line of `/proc/PID/status`, KiB.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_of_this_process_has_memory_and_none_of_a_missing_pid() {
        let own = snapshot(std::process::id()).expect("this process exists");
        assert!(!own.exited);
        assert!(own.rss_kib.is_some_and(|k| k > 0) && own.peak_rss_kib >= own.rss_kib, "{own:?}");
        assert!(own.rss_anon_kib.is_some_and(|k| k > 0), "{own:?}");
        // Above the kernel's pid_max limit (2^22), so never a process.
        assert!(snapshot(u32::MAX / 2).is_none());
        assert_eq!(status_kib("Name:\tx\nVmRSS:\t  1234 kB\n", "VmRSS:"), Some(1234));
    }
}
