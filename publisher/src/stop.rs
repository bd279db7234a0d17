//! The run's stop: set once (by SIGINT or SIGTERM, a limit, or an error) and seen by every loop.
//! Loops that run anyway look at its flag between steps; waits that could last (an upstream's
//! read, a wait before reconnecting, a wait for a NATS subject) end the moment it is set instead
//! of waking on a timer to look: they wait on its file descriptor beside their socket, or have
//! registered a wake-up.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A wake-up run when the stop is set.
type WakeUp = Box<dyn Fn() + Send + Sync>;

/// The run's stop (see the module's doc).
pub struct Stop {
    flag: AtomicBool,
    /// Readable from the moment the stop is set, for ever after: one byte is written to
    /// `signal`'s peer and never read, so every wait on it ends, whenever it starts.
    readable: UnixStream,
    signal: UnixStream,
    wake_ups: Mutex<Vec<WakeUp>>,
}

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stop").field("set", &self.is_set()).finish_non_exhaustive()
    }
}

impl Stop {
    /// A stop not yet set.
    pub fn new() -> std::io::Result<Stop> {
        let (readable, signal) = UnixStream::pair()?;
        signal.set_nonblocking(true)?;
        Ok(Stop { flag: AtomicBool::new(false), readable, signal, wake_ups: Mutex::default() })
    }

    /// Whether the stop was set.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Sets the stop and ends every wait on it; `true` if it was set already.
    pub fn set(&self) -> bool {
        if self.flag.swap(true, Ordering::Relaxed) {
            return true;
        }
        // The socket buffer is empty, so the byte goes; should it not, the flag still holds.
        let _ = (&self.signal).write(&[1]);
        for wake_up in self.wake_ups.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            wake_up();
        }
        false
    }

    /// The flag alone, for the hot path's loops that look at it between steps.
    pub fn flag(&self) -> &AtomicBool {
        &self.flag
    }

    /// A descriptor that becomes readable when the stop is set, to wait on beside a socket.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.readable.as_fd()
    }

    /// Runs `wake_up` when the stop is set (at once if it is already): for waits that cannot
    /// take a descriptor, such as a NATS subscriber's.
    pub fn on_set(&self, wake_up: impl Fn() + Send + Sync + 'static) {
        let mut wake_ups = self.wake_ups.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.is_set() {
            wake_up();
        }
        wake_ups.push(Box::new(wake_up));
    }

    /// Waits up to `timeout` for the stop; `true` if it was set.
    pub fn wait(&self, timeout: Duration) -> bool {
        let _ = wait_readable(&[self.fd()], Some(timeout));
        self.is_set()
    }
}

/// Waits until one of `fds` is readable (or has an error or hang-up to report), at most
/// `timeout` (none: without end); the indices of those that are. An interrupted wait returns
/// none, so the caller looks again.
pub fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> std::io::Result<Vec<usize>> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut polled: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)).collect();
    // poll(2) takes milliseconds as an i32: a longer wait is cut to the longest it takes, and a
    // fraction of a millisecond rounds up, so a wait never ends before its time.
    let timeout = match timeout {
        None => PollTimeout::NONE,
        Some(t) => {
            let ms = t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
    };
    match poll(&mut polled, timeout) {
        Ok(_) => Ok(polled
            .iter()
            .enumerate()
            .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
            .map(|(i, _)| i)
            .collect()),
        Err(nix::errno::Errno::EINTR) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    #[test]
    fn setting_the_stop_ends_waits_already_started_and_every_later_one() {
        let stop = Arc::new(Stop::new().unwrap());
        let waiter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                (stop.wait(Duration::from_secs(120)), started.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!stop.set(), "set for the first time");
        let (set, took) = waiter.join().unwrap();
        assert!(set && took < Duration::from_secs(30), "the wait did not end with the stop: {took:?}");
        // Later waits end at once, as often as they come; setting again changes nothing.
        for _ in 0..3 {
            assert!(stop.wait(Duration::from_secs(120)));
        }
        assert!(stop.set(), "set already");
        assert!(stop.is_set() && stop.flag().load(Ordering::Relaxed));
    }

    #[test]
    fn a_wake_up_runs_once_when_the_stop_is_set_or_at_once_when_registered_after() {
        let stop = Stop::new().unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        stop.on_set(move || {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(runs.load(Ordering::Relaxed), 0, "not before the stop");
        stop.set();
        stop.set();
        assert_eq!(runs.load(Ordering::Relaxed), 1, "once, however often the stop is set");
        let late = runs.clone();
        stop.on_set(move || {
            late.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(runs.load(Ordering::Relaxed), 2, "registered after the stop: at once");
    }

    #[test]
    fn a_wait_without_the_stop_lasts_its_time() {
        let stop = Stop::new().unwrap();
        let started = Instant::now();
        assert!(!stop.wait(Duration::from_millis(50)));
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
