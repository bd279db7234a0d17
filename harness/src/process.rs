//! A binary run as a child process: stderr collected line by line as it comes (so a test can
//! wait for a readiness line), stdout collected whole, killed when dropped.
//!
//! Every wait has a deadline and fails with everything the process printed so far. The `try_`
//! variants return a [`Failure`] instead of panicking, for callers that are not tests.

use std::ffi::OsStr;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub use nix::sys::signal::Signal;

/// How long a single wait (for a line, for an exit) may take by default before the test fails.
pub const STEP: Duration = Duration::from_secs(30);

/// How long output is still collected after the process exits; only a grandchild holding the
/// pipes open would make it matter.
const DRAIN: Duration = Duration::from_secs(5);

/// A running child process.
pub struct Process {
    name: String,
    child: Child,
    lines: Receiver<String>,
    /// Stderr lines received so far.
    stderr: Vec<String>,
    /// Lines before this index have been looked at by a wait.
    cursor: usize,
    stdout: Receiver<String>,
    /// Stdout, once the process has exited and it has been read.
    stdout_text: Option<String>,
    status: Option<ExitStatus>,
}

/// What a process left when it exited.
pub struct Finished {
    /// The binary's file name.
    pub name: String,
    /// The exit status.
    pub status: ExitStatus,
    /// Everything on stdout.
    pub stdout: String,
    /// Everything on stderr.
    pub stderr: String,
}

/// A wait that did not succeed: what was waited for, and everything the process printed.
#[derive(Debug)]
pub struct Failure(String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

impl Process {
    /// Starts `bin` with `args` and `MDRELAY_LOG=info`; panics when it cannot start.
    pub fn start<S: AsRef<OsStr>>(bin: impl AsRef<Path>, args: impl IntoIterator<Item = S>) -> Process {
        let bin = bin.as_ref();
        Process::spawn(bin, args, &[]).unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()))
    }

    /// Starts `bin` with `args` and `env` (over the default `MDRELAY_LOG=info`), stdin closed.
    pub fn spawn<S: AsRef<OsStr>>(
        bin: impl AsRef<Path>,
        args: impl IntoIterator<Item = S>,
        env: &[(&str, &str)],
    ) -> std::io::Result<Process> {
        let bin = bin.as_ref();
        let mut command = Command::new(bin);
        command.args(args).env("MDRELAY_LOG", "info");
        for (key, value) in env {
            command.env(key, value);
        }
        Process::spawn_command(&program_name(bin), command)
    }

    /// Starts `command` as it is set up (program, arguments, environment, directory) under
    /// `name`, with stdin closed and `MDRELAY_LOG=info` unless the command sets it: for a binary
    /// run through a wrapper, such as `ip netns exec NAMESPACE BIN ...` (which execs `BIN` in
    /// place, so the pid and signals are still the binary's).
    pub fn spawn_command(name: &str, mut command: Command) -> std::io::Result<Process> {
        let name = name.to_string();
        if !command.get_envs().any(|(key, _)| key == "MDRELAY_LOG") {
            command.env("MDRELAY_LOG", "info");
        }
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // A test run under `nohup` (or a CI runner that ignores signals) would hand its children
        // ignored signals, which a shell cannot trap again: each child starts with the default
        // dispositions, as a process started from a terminal does.
        // SAFETY: between fork and exec only async-signal-safe calls are made (sigaction).
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(|| {
                for signal in [Signal::SIGHUP, Signal::SIGINT, Signal::SIGTERM, Signal::SIGPIPE] {
                    nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl)
                        .map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        let (line_tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().expect("stderr is piped");
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            let mut line = Vec::new();
            // Bytes, not `lines()`: a line that is not UTF-8 must not end the collection.
            while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let text = String::from_utf8_lossy(&line).trim_end_matches(['\n', '\r']).to_string();
                if line_tx.send(text).is_err() {
                    break;
                }
                line.clear();
            }
        });
        let (out_tx, stdout) = mpsc::channel();
        let mut out = child.stdout.take().expect("stdout is piped");
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = out.read_to_end(&mut bytes);
            let _ = out_tx.send(String::from_utf8_lossy(&bytes).into_owned());
        });
        Ok(Process { name, child, lines, stderr: Vec::new(), cursor: 0, stdout, stdout_text: None, status: None })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal`; panics if it cannot be delivered, or if a wait saw the process exit
    /// (until then it is not reaped, so its pid is still its own).
    pub fn signal(&self, signal: Signal) {
        if let Some(status) = self.status {
            panic!("{}: sending {signal}: it has exited ({status})", self.name);
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap_or_else(|e| panic!("{}: sending {signal}: {e}", self.name));
    }

    /// The next stderr line (after the last one a wait returned) containing `needle`, waiting
    /// up to [`STEP`]; panics with the output so far otherwise.
    pub fn wait_for(&mut self, needle: &str) -> String {
        self.wait_for_within(needle, STEP)
    }

    /// As [`Process::wait_for`], waiting up to `limit`.
    pub fn wait_for_within(&mut self, needle: &str, limit: Duration) -> String {
        self.try_wait_until(&format!("a line with {needle:?}"), limit, |line| line.contains(needle))
            .unwrap_or_else(|f| panic!("{f}"))
    }

    /// The next stderr line for which `wanted` holds, waiting up to [`STEP`]; panics with the
    /// output so far, saying it waited for `what`, otherwise.
    pub fn wait_until(&mut self, what: &str, wanted: impl FnMut(&str) -> bool) -> String {
        self.try_wait_until(what, STEP, wanted).unwrap_or_else(|f| panic!("{f}"))
    }

    /// The next stderr line for which `wanted` holds, waiting up to `limit`; fails early when
    /// the process exits without printing it.
    pub fn try_wait_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut wanted: impl FnMut(&str) -> bool,
    ) -> Result<String, Failure> {
        let deadline = Instant::now() + limit;
        loop {
            while self.cursor < self.stderr.len() {
                let line = &self.stderr[self.cursor];
                self.cursor += 1;
                if wanted(line) {
                    return Ok(line.clone());
                }
            }
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => self.stderr.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.failure(&format!("{what} did not come on stderr within {limit:?}")));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Stderr closed: the process exited (or is exiting) without the line.
                    let _ = self.reap(deadline);
                    return Err(self.failure(&format!("exited before printing {what}")));
                }
            }
        }
    }

    /// The address `mdrelay-sub` receives on, from its "listening on ADDR" line (UDP and
    /// multicast, after binding and joining); panics when it does not come within [`STEP`].
    pub fn listening_on(&mut self) -> SocketAddr {
        self.try_listening_on(STEP).unwrap_or_else(|f| panic!("{f}"))
    }

    /// As [`Process::listening_on`], waiting up to `limit`.
    pub fn try_listening_on(&mut self, limit: Duration) -> Result<SocketAddr, Failure> {
        let line = self.try_wait_until("\"listening on ADDR\"", limit, |l| l.contains("listening on "))?;
        let rest = &line[line.find("listening on ").expect("matched") + "listening on ".len()..];
        let addr = rest.split_whitespace().next().unwrap_or_default();
        addr.parse().map_err(|e| Failure(format!("{}: {addr:?} in {line:?} is not an address: {e}", self.name)))
    }

    /// The address `mdrelay-pub` accepts subscribers on, from its "serving subscribers over
    /// TCP" line (`listen=ADDR`, the bound address, so `--tcp 127.0.0.1:0` works); panics when
    /// it does not come within [`STEP`].
    pub fn serving_on(&mut self) -> SocketAddr {
        self.try_serving_on(STEP).unwrap_or_else(|f| panic!("{f}"))
    }

    /// As [`Process::serving_on`], waiting up to `limit`.
    pub fn try_serving_on(&mut self, limit: Duration) -> Result<SocketAddr, Failure> {
        let what = "\"serving subscribers over TCP\"";
        let line = self.try_wait_until(what, limit, |l| l.contains("serving subscribers over TCP"))?;
        let addr = field(&line, "listen").unwrap_or_default();
        addr.parse().map_err(|e| Failure(format!("{}: listen={addr:?} in {line:?} is not an address: {e}", self.name)))
    }

    /// Waits for an `mdrelay-sub` interval line (it needs `--report-interval`) saying at least
    /// `frames` frames have arrived; returns the count it says.
    pub fn wait_for_frames(&mut self, frames: u64) -> u64 {
        let line = self.wait_until(&format!("an interval line with at least {frames} frames"), |line| {
            interval_frames(line).is_some_and(|n| n >= frames)
        });
        interval_frames(&line).expect("matched")
    }

    /// Waits for the exit, at most `limit`; panics with the output otherwise (after killing the
    /// process).
    pub fn finish(self, limit: Duration) -> Finished {
        self.try_finish(limit).unwrap_or_else(|f| panic!("{f}"))
    }

    /// Waits for the process to end on its own within `limit`, as one whose stream has nothing
    /// more to give should; one still running then is stopped with SIGINT, and the test fails
    /// with what it printed (its log without interval lines) and `report`'s contents, when it
    /// names a report file.
    pub fn ends_on_its_own(mut self, limit: Duration, context: &str, report: Option<&Path>) -> Finished {
        let started = Instant::now();
        let waited = self.try_wait_until("its exit", limit, |_| false);
        if waited.as_ref().is_err_and(|f| f.to_string().contains("did not come on stderr within")) {
            self.signal(Signal::SIGINT);
            let stopped = self.finish(Duration::from_secs(30));
            let report = report.map(|json| std::fs::read_to_string(json).unwrap_or_default()).unwrap_or_default();
            panic!(
                "{context}: still running {:.0?} after its stream had nothing more to give; stopped with SIGINT \
                 (exit {:?}), it reported:\n{}\n{report}\nlog:\n{}",
                started.elapsed(),
                stopped.code(),
                stopped.stdout,
                lines_other_than_intervals(&stopped.stderr)
            );
        }
        let finished = self.finish(Duration::from_secs(30));
        eprintln!("{context}: ended {:.1?} after its stream had nothing more to give", started.elapsed());
        finished
    }

    /// Waits for the exit, at most `limit`, and returns the status and the whole output; kills
    /// the process and fails with its output when the limit passes.
    pub fn try_finish(mut self, limit: Duration) -> Result<Finished, Failure> {
        let deadline = Instant::now() + limit;
        if self.reap(deadline).is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
            return Err(self.failure(&format!("did not exit within {limit:?}; killed")));
        }
        self.collect();
        Ok(Finished {
            name: self.name.clone(),
            status: self.status.expect("reaped"),
            stdout: self.stdout_after_exit(),
            stderr: self.stderr.join("\n"),
        })
    }

    /// Polls for the exit until `deadline`. Polling, not a blocking wait on another thread:
    /// the child stays unreaped (its pid its own) for [`Process::signal`] until it has exited.
    fn reap(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Some(status);
            }
            match self.child.try_wait() {
                Ok(Some(status)) => self.status = Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => return None,
            }
        }
    }

    /// Takes the stderr lines that have come, until the pipe closes (bounded by [`DRAIN`]).
    fn collect(&mut self) {
        let deadline = Instant::now() + DRAIN;
        while let Ok(line) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.stderr.push(line);
        }
    }

    /// Stdout, read whole once the process has exited (bounded by [`DRAIN`]).
    fn stdout_after_exit(&mut self) -> String {
        if self.stdout_text.is_none() {
            self.stdout_text = Some(self.stdout.recv_timeout(DRAIN).unwrap_or_default());
        }
        self.stdout_text.clone().unwrap_or_default()
    }

    /// A failure naming the process, what went wrong and everything it printed.
    fn failure(&mut self, what: &str) -> Failure {
        let status = match self.status {
            Some(status) => {
                self.collect();
                format!("exited: {status}")
            }
            None => {
                while let Ok(line) = self.lines.try_recv() {
                    self.stderr.push(line);
                }
                "still running".to_string()
            }
        };
        // Stdout comes whole at exit; while the process runs there is none to show.
        let stdout = if self.status.is_some() { self.stdout_after_exit() } else { String::new() };
        Failure(format!(
            "{}: {what} ({status})\n--- stdout:\n{stdout}\n--- stderr:\n{}",
            self.name,
            self.stderr.join("\n")
        ))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Finished {
    /// The exit code, `None` when a signal ended the process.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics with the output unless the process exited with code 0.
    pub fn assert_success(&self) -> &Finished {
        assert!(self.status.success(), "{self:?}");
        self
    }

    /// Stdout as JSON (a report written with `--json -`); panics with the output otherwise.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

impl fmt::Debug for Finished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}\n--- stdout:\n{}\n--- stderr:\n{}", self.name, self.status, self.stdout, self.stderr)
    }
}

/// A binary's file name, as failures name the process.
pub(crate) fn program_name(bin: &Path) -> String {
    bin.file_name().map_or_else(|| bin.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// The value of a `key=value` field in a log line (`granted=33554432`).
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

/// The cumulative frame count of an `mdrelay-sub` interval line ("... frames N (+k) ...").
fn interval_frames(line: &str) -> Option<u64> {
    if !line.contains("msg/s") {
        return None;
    }
    let mut words = line.split_whitespace();
    words.find(|w| *w == "frames")?;
    words.next()?.parse().ok()
}

/// A subscriber's log without its interval lines (` msg/s `), for a failing test's message.
pub fn lines_other_than_intervals(stderr: &str) -> String {
    stderr.lines().filter(|l| !l.contains(" msg/s ")).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_interval_lines_parse() {
        let line = "2025-01-01T00:00:00Z  INFO mdrelay_pub::run: serving subscribers over TCP listen=127.0.0.1:4000";
        assert_eq!(field(line, "listen"), Some("127.0.0.1:4000"));
        assert_eq!(field(line, "missing"), None);
        let interval = "mdrelay-sub [     1.0s]      12000 msg/s  frames 345 (+40)  messages 12000  latency -  gaps 0";
        assert_eq!(interval_frames(interval), Some(345));
        assert_eq!(interval_frames("frames 3 without a rate"), None);
    }

    #[test]
    fn waits_return_lines_in_order_and_fail_with_the_output() {
        let script = "echo one >&2; echo two >&2; echo one again >&2; echo out";
        let mut p = Process::start("/bin/sh", ["-c", script]);
        assert_eq!(p.wait_for("one"), "one");
        assert_eq!(p.wait_for("one"), "one again");
        let failure = p.try_wait_until("a line with \"three\"", STEP, |l| l.contains("three")).unwrap_err();
        let text = failure.to_string();
        assert!(text.contains("exited before") && text.contains("two") && text.contains("\nout\n"), "{text}");
        let done = p.finish(STEP);
        assert_eq!((done.code(), done.stdout.as_str()), (Some(0), "out\n"));
        assert_eq!(done.stderr, "one\ntwo\none again");
    }

    #[test]
    fn a_process_past_its_limit_is_killed_and_a_signal_arrives() {
        let p = Process::start("/bin/sh", ["-c", "echo started >&2; exec sleep 30"]);
        let started = Instant::now();
        let Err(failure) = p.try_finish(Duration::from_millis(200)) else { panic!("exited before its limit") };
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(failure.to_string().contains("did not exit"), "{failure}");
        let mut p = Process::start(
            "/bin/sh",
            ["-c", "trap 'echo hup >&2; exit 7' HUP; echo ready >&2; while :; do sleep 0.05; done"],
        );
        p.wait_for("ready");
        p.signal(Signal::SIGHUP);
        assert_eq!(p.finish(STEP).code(), Some(7));
    }
}
