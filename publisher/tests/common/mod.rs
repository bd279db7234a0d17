//! Helpers for tests that run the real publisher and subscriber as processes on loopback.
#![allow(dead_code)]

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// `../shared/data/iex` beside the project root, or a panic saying what is missing.
pub fn iex_data() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/iex");
    assert!(
        dir.join("README.md").is_file(),
        "missing {}: the tests need the shared IEX captures and reference outputs beside the project root, as in CI",
        dir.display()
    );
    dir
}

/// A reference output from `iex_data()/expected`.
pub fn expected(name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(iex_data().join("expected").join(name)).unwrap()).unwrap()
}

/// The publisher binary under test.
pub fn publisher_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mdrelay-pub"))
}

/// The subscriber binary, from the same build; built on demand when this package is tested alone.
pub fn subscriber_bin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = publisher_bin().parent().unwrap().to_path_buf();
            let path = dir.join("mdrelay-sub");
            if !path.is_file() {
                let cargo = option_env!("CARGO").unwrap_or("cargo");
                let mut build = Command::new(cargo);
                build.args(["build", "-p", "mdrelay-subscriber", "--bin", "mdrelay-sub"]);
                if dir.ends_with("release") {
                    build.arg("--release");
                }
                assert!(build.status().expect("cargo runs").success(), "building mdrelay-sub");
            }
            assert!(path.is_file(), "{} missing", path.display());
            path
        })
        .clone()
}

/// One relay test at a time: they share two cores, and UDP tests must not starve each other.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A free TCP port on 127.0.0.1.
pub fn tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A free UDP port on 127.0.0.1.
pub fn udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A child process killed when dropped, whose output is collected.
pub struct Proc {
    pub name: &'static str,
    child: Child,
}

/// What a finished process printed.
pub struct Finished {
    pub stdout: String,
    pub stderr: String,
    pub code: Option<i32>,
}

impl Proc {
    /// Starts `bin` with `args`, capturing stdout and stderr.
    pub fn start(name: &'static str, bin: &Path, args: &[String]) -> Proc {
        let child = Command::new(bin)
            .args(args)
            .env("MDRELAY_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        Proc { name, child }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the process to exit, at most `limit`; panics with its output otherwise.
    pub fn wait(mut self, limit: Duration) -> Finished {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let mut stdout = String::new();
        let mut stderr = String::new();
        self.child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
        self.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let name = self.name;
        let Some(status) = status else {
            panic!("{name} did not finish within {limit:?}\nstdout:\n{stdout}\nstderr:\n{stderr}")
        };
        Finished { stdout, stderr, code: status.code() }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Strings from `&str`s.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Reads a JSON file written by a process.
pub fn json_file(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap()
}

/// Asserts the subscriber's aggregates equal the reference's, symbol by symbol.
pub fn assert_aggregates(sub: &serde_json::Value, reference: &serde_json::Value, context: &str) {
    for key in ["total_trade_volume", "symbols_with_trades_or_quotes", "symbols"] {
        assert_eq!(sub[key], reference[key], "{context}: {key}");
    }
}
