//! A stand-in for systemd's side of the notification protocol: a datagram socket a program is
//! told about in `NOTIFY_SOCKET`, and what it sent there, so a test can check a `Type=notify`
//! program's READY, WATCHDOG and STOPPING on the real process.

use crate::process::Process;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The socket, in a directory of its own that goes with it.
pub struct NotifySocket {
    socket: UnixDatagram,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl NotifySocket {
    /// Binds a fresh socket.
    pub fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("binding the notification socket");
        NotifySocket { socket, path, _dir: dir }
    }

    /// Starts `bin` with `args` as a unit would: `NOTIFY_SOCKET` set to this socket and, with
    /// `watchdog`, `WATCHDOG_USEC` and `WATCHDOG_PID` (the program's own pid: a shell sets it
    /// and execs the program in its place).
    pub fn start(&self, bin: &Path, args: &[&str], watchdog: Option<Duration>) -> Process {
        let mut command = Command::new("sh");
        command.arg("-c").arg(r#"WATCHDOG_PID=$$ exec "$0" "$@""#).arg(bin).args(args);
        command.env("NOTIFY_SOCKET", &self.path);
        if let Some(interval) = watchdog {
            command.env("WATCHDOG_USEC", interval.as_micros().to_string());
        }
        let name = bin.file_name().map_or_else(|| "program".into(), |n| n.to_string_lossy().into_owned());
        Process::spawn_command(&name, command).unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()))
    }

    /// The notifications received until one contains `last` (included), each as sent
    /// (`READY=1\nSTATUS=relaying`); panics after `limit` with what came.
    pub fn until(&self, last: &str, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no {last:?} within {limit:?}; received {got:?}");
            self.socket.set_read_timeout(Some(left)).unwrap();
            match self.socket.recv(&mut buf) {
                Ok(n) => {
                    let message = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let done = message.contains(last);
                    got.push(message);
                    if done {
                        return got;
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading the notification socket: {e}"),
            }
        }
    }
}
