//! Emulated hosts on this machine, for tests that cross a network: the namespaces
//! `deploy/netns-hosts.sh` builds (hosts `pub`, `sub1`, `sub2` on two lines, A and B), processes
//! started inside them, and the script's loss injection and drop records.
//!
//! Needs root (as CI runs). A network is taken down when its [`Hosts`] is dropped, also when the
//! test panics; one left behind by a killed test run is replaced by the next `up` with its prefix.

use crate::process::{Process, STEP, program_name};
use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// How long `up` may take: the first run on a bare machine installs nftables with apt-get.
const UP: Duration = Duration::from_secs(300);

/// One of the emulated hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// The publisher's host: 198.18.0.1 on line A, 198.18.1.1 on line B.
    Pub,
    /// A subscriber host: 198.18.0.2 / 198.18.1.2.
    Sub1,
    /// Another subscriber host: 198.18.0.3 / 198.18.1.3.
    Sub2,
}

impl Host {
    /// Every host.
    pub const ALL: [Host; 3] = [Host::Pub, Host::Sub1, Host::Sub2];

    /// The script's name for the host.
    pub fn name(self) -> &'static str {
        match self {
            Host::Pub => "pub",
            Host::Sub1 => "sub1",
            Host::Sub2 => "sub2",
        }
    }

    /// The host's address on `line`.
    pub fn addr(self, line: Line) -> Ipv4Addr {
        let host = match self {
            Host::Pub => 1,
            Host::Sub1 => 2,
            Host::Sub2 => 3,
        };
        Ipv4Addr::new(198, 18, line.third_octet(), host)
    }
}

/// One of the two networks every host is on, each a bridge of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Line {
    /// 198.18.0.0/24, interface `a0`; multicast (239.255.0.0/16) is routed here.
    A,
    /// 198.18.1.0/24, interface `b0`.
    B,
}

impl Line {
    /// The script's name for the line.
    pub fn name(self) -> &'static str {
        match self {
            Line::A => "a",
            Line::B => "b",
        }
    }

    /// The host's interface on the line.
    pub fn interface(self) -> &'static str {
        match self {
            Line::A => "a0",
            Line::B => "b0",
        }
    }

    fn third_octet(self) -> u8 {
        match self {
            Line::A => 0,
            Line::B => 1,
        }
    }
}

/// `deploy/netns-hosts.sh`.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/netns-hosts.sh")
}

/// The network namespaces on this machine (`ip netns list`), by name.
pub fn namespaces() -> Vec<String> {
    let output = Command::new("ip").args(["netns", "list"]).output().expect("running ip netns list");
    assert!(output.status.success(), "ip netns list: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// A prefix no other network of this process uses at the same time: the pid in base 36 (five
/// digits cover every Linux pid) and a counter digit, six characters, so it never equals a
/// person's shorter prefix such as the default `mdr`.
pub fn unique_prefix() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % 36;
    let mut digits = base36(std::process::id(), 5);
    digits.push_str(&base36(n, 1));
    digits
}

fn base36(mut n: u32, width: usize) -> String {
    let mut out = vec![b'0'; width];
    for slot in out.iter_mut().rev() {
        *slot = b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize];
        n /= 36;
    }
    String::from_utf8(out).expect("ASCII digits")
}

/// Runs the script with `args` for the network `prefix`, within `limit`; its exit code (`None`
/// when it did not exit by itself: killed by a signal, past its limit, or not started) and its
/// stdout and stderr. Never panics, so [`Hosts`]' drop can use it while a test unwinds.
pub fn run_script(prefix: &str, args: &[&str], limit: Duration) -> (Option<i32>, String, String) {
    let mut command = Command::new("bash");
    command.arg(script()).args(args).env("MDR_NETNS_PREFIX", prefix);
    match Process::spawn_command("netns-hosts.sh", command).map_err(|e| e.to_string()) {
        Ok(process) => match process.try_finish(limit) {
            Ok(done) => (done.code(), done.stdout, done.stderr),
            Err(failure) => (None, String::new(), failure.to_string()),
        },
        Err(e) => (None, String::new(), format!("running bash: {e}")),
    }
}

/// A network of emulated hosts, up until dropped.
pub struct Hosts {
    prefix: String,
}

impl Hosts {
    /// Builds the network named `prefix` (replacing one of that name); panics with the script's
    /// output when it cannot.
    pub fn up(prefix: &str) -> Hosts {
        let hosts = Hosts { prefix: prefix.to_string() };
        hosts.script_ok(&["up"], UP);
        hosts
    }

    /// Builds a network under a [`unique_prefix`].
    pub fn unique() -> Hosts {
        Hosts::up(&unique_prefix())
    }

    /// The prefix of the namespaces' names.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The network namespace of `host`.
    pub fn namespace(&self, host: Host) -> String {
        format!("{}-{}", self.prefix, host.name())
    }

    /// The address of `host` on `line`.
    pub fn addr(&self, host: Host, line: Line) -> Ipv4Addr {
        host.addr(line)
    }

    /// `program` to run on `host`: `ip netns exec NAMESPACE program`; add arguments as usual.
    pub fn command(&self, host: Host, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec"]).arg(self.namespace(host)).arg(program);
        command
    }

    /// Starts `bin` with `args` on `host`, as [`Process::start`] does here; panics when it cannot.
    pub fn start<S: AsRef<OsStr>>(
        &self,
        host: Host,
        bin: impl AsRef<Path>,
        args: impl IntoIterator<Item = S>,
    ) -> Process {
        let bin = bin.as_ref();
        let mut command = self.command(host, bin);
        command.args(args);
        Process::spawn_command(&format!("{} on {}", program_name(bin), host.name()), command)
            .unwrap_or_else(|e| panic!("starting {} on {}: {e}", bin.display(), host.name()))
    }

    /// Drops `percent` % (0 to 100; 0 removes the rule) of the relay DATA datagrams arriving on
    /// `host`'s `line`, and zeroes that line's drop counter and record.
    pub fn loss(&self, host: Host, percent: u32, line: Line) {
        self.script_ok(&["loss", host.name(), &percent.to_string(), line.name()], STEP);
    }

    /// Datagrams the loss rules of `host` have dropped: (line A, line B).
    pub fn counter(&self, host: Host) -> (u64, u64) {
        let out = self.script_ok(&["counter", host.name()], STEP);
        let count = |key: &str| {
            out.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
                .unwrap_or_else(|| panic!("counter {}: no {key}=N in {out:?}", host.name()))
        };
        (count("a"), count("b"))
    }

    /// The relay sequence numbers of the datagrams the loss rule of `host`'s `line` dropped,
    /// ascending.
    pub fn dropped(&self, host: Host, line: Line) -> Vec<u64> {
        let out = self.script_ok(&["dropped", host.name(), line.name()], STEP);
        out.lines().map(|l| l.trim().parse().unwrap_or_else(|e| panic!("dropped: {l:?}: {e}"))).collect()
    }

    /// Sets `host`'s interface on `line` up or down (the cable plugged or pulled, on that side).
    pub fn link(&self, host: Host, line: Line, up: bool) {
        self.script_ok(&["link", host.name(), line.name(), if up { "up" } else { "down" }], STEP);
    }

    /// Runs the script for this network; its stdout, or a panic with everything it printed.
    pub fn script_ok(&self, args: &[&str], limit: Duration) -> String {
        let (code, stdout, stderr) = run_script(&self.prefix, args, limit);
        assert_eq!(code, Some(0), "netns-hosts.sh {} (prefix {}):\n{stdout}\n{stderr}", args.join(" "), self.prefix);
        stdout
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // No panic here: this may run while a failed test unwinds.
        let (code, stdout, stderr) = run_script(&self.prefix, &["down"], STEP);
        if code != Some(0) {
            eprintln!("netns-hosts.sh down (prefix {}) failed ({code:?}):\n{stdout}\n{stderr}", self.prefix);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_short_plain_and_distinct() {
        let (a, b) = (unique_prefix(), unique_prefix());
        for p in [&a, &b] {
            assert_eq!(p.len(), 6, "{p}");
            assert!(p.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()), "{p}");
        }
        assert_ne!(a, b);
        assert_eq!(base36(4_194_304, 5), "2hwcg");
        assert_eq!(Host::Sub2.addr(Line::B), Ipv4Addr::new(198, 18, 1, 3));
    }
}
