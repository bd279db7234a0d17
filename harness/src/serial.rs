//! Which process-heavy tests run at once, in a test binary and across the binaries running at
//! the same time on the host.
//!
//! A package's integration tests are one binary (a module per area), so tests of different
//! areas meet in one process. A test that drives streams hard runs alone ([`serial`]): two
//! cores carry its publishers and subscribers, and paced UDP streams must not starve each other.
//! Any other test that starts processes takes [`shared`]: such tests run side by side, as they
//! did when each area was a binary of its own, but never beside a serial one.
//!
//! The rule holds across processes too: CI runs the long tests of several binaries at once, and
//! a person may run two `cargo test`s. Each guard also holds a lock on [`lock_path`] (exclusive
//! for [`serial`], shared for [`shared`]; `flock`, so it is released when the process dies,
//! killed or not), taken after the process's own lock so that threads of one binary queue in
//! the process rather than on the file.

use std::fs::File;
use std::path::PathBuf;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static LOCK: RwLock<()> = RwLock::new(());

/// A [`serial`] test's hold: nothing else that holds [`serial`] or [`shared`], in this process
/// or another on the host, runs until it is dropped.
pub struct Serial {
    // Declared first, so released first: the file, then the process's lock.
    _host: File,
    _process: RwLockWriteGuard<'static, ()>,
}

/// A [`shared`] test's hold: no [`serial`] test, in this process or another on the host, runs
/// until it is dropped.
pub struct Shared {
    _host: File,
    _process: RwLockReadGuard<'static, ()>,
}

/// The host-wide lock file, in the temporary directory: every test binary of every checkout
/// meets there, as they share the cores.
pub fn lock_path() -> PathBuf {
    std::env::temp_dir().join("mdrelay-tests.lock")
}

/// The lock file, opened for this hold (a lock belongs to the open file, so each hold opens its
/// own). Read-only will do when another user created it.
fn open_lock() -> File {
    let path = lock_path();
    File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .or_else(|_| File::open(&path))
        .unwrap_or_else(|e| panic!("opening the tests' host-wide lock {}: {e}", path.display()))
}

/// Held for a test's duration: no other test holding [`serial`] or [`shared`] runs meanwhile,
/// in this binary or another. A test that panicked does not poison it.
pub fn serial() -> Serial {
    let process = LOCK.write().unwrap_or_else(|e| e.into_inner());
    let host = open_lock();
    host.lock().unwrap_or_else(|e| panic!("locking {}: {e}", lock_path().display()));
    Serial { _host: host, _process: process }
}

/// Held for a test's duration: other tests holding it may run meanwhile, a [`serial`] one may
/// not, in this binary or another.
pub fn shared() -> Shared {
    let process = LOCK.read().unwrap_or_else(|e| e.into_inner());
    let host = open_lock();
    host.lock_shared().unwrap_or_else(|e| panic!("locking {}: {e}", lock_path().display()));
    Shared { _host: host, _process: process }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// `flock` from util-linux holding the lock file, as another process would, until the file
    /// `release` appears, and then writing the file `done` before it lets go (so a hold that
    /// sees no `done` came too early, whatever the machine's load); returned once it holds the
    /// lock (a try to lock the file then fails).
    fn other_process(mode: &str, dir: &Path) -> std::process::Child {
        let script = format!(
            "while [ ! -e '{release}' ]; do sleep 0.01; done; touch '{done}'",
            release = dir.join("release").display(),
            done = dir.join("done").display()
        );
        let child = Command::new("flock")
            .args([mode, lock_path().to_str().unwrap(), "-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .expect("running flock(1)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while open_lock().try_lock().is_ok() {
            assert!(Instant::now() < deadline, "flock(1) never took the lock");
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    #[test]
    fn a_serial_test_waits_for_another_process_holding_the_lock_and_shared_ones_do_not_wait_for_each_other() {
        let _alone = serial();
        drop(_alone);
        let writer_dir = tempfile::tempdir().unwrap();
        let mut holder = other_process("--exclusive", writer_dir.path());
        let release = writer_dir.path().join("release");
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            std::fs::write(release, b"").unwrap();
        });
        let _serial = serial();
        assert!(writer_dir.path().join("done").exists(), "the serial hold came before the other process let go");
        releaser.join().unwrap();
        drop(_serial);
        holder.wait().unwrap();

        let reader_dir = tempfile::tempdir().unwrap();
        let mut reader = other_process("--shared", reader_dir.path());
        let _shared = shared();
        assert!(reader.try_wait().unwrap().is_none(), "a shared hold beside another process's");
        std::fs::write(reader_dir.path().join("release"), b"").unwrap();
        reader.wait().unwrap();
    }
}
