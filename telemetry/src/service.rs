//! The service manager's notification protocol (systemd's `sd_notify`), for `Type=notify`
//! units, and the readiness the metrics endpoint's `/readyz` reports: `READY=1` once a program serves (units ordered after it start then, not at exec),
//! `STOPPING=1` when it winds down, and `WATCHDOG=1` at half the interval the unit's
//! `WatchdogSec=` asks for, so a program whose runtime stops scheduling is restarted.
//!
//! Without a service manager (`NOTIFY_SOCKET` unset) every call does nothing; a notification
//! that cannot be sent is logged at debug level and otherwise ignored: the service manager's
//! bookkeeping must never stop the stream.

use sd_notify::NotifyState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Whether the program does its job now: between [`ready`] and [`stopping`]. The metrics
/// endpoint's `/readyz` answers from it.
static READY: AtomicBool = AtomicBool::new(false);

/// Tells the service manager (and `/readyz`) the program is ready, with `status` for
/// `systemctl status`.
pub fn ready(status: &str) {
    READY.store(true, Ordering::Relaxed);
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells the service manager (and `/readyz`) the program is stopping.
pub fn stopping() {
    READY.store(false, Ordering::Relaxed);
    send(&[NotifyState::Stopping]);
}

/// Between [`ready`] and [`stopping`]: whether the program can do its job now (a subscriber
/// that lost its publisher and reconnects cannot), for `/readyz` only; systemd is told once.
pub fn set_serving(serving: bool) {
    READY.store(serving, Ordering::Relaxed);
}

/// Whether the program said it is ready and has not said it is stopping.
pub fn is_ready() -> bool {
    READY.load(Ordering::Relaxed)
}

/// How often to tell the watchdog the program is alive: half the interval the service manager
/// asked this process for (`WATCHDOG_USEC`, with `WATCHDOG_PID` naming it), or `None`.
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0;
    (sd_notify::watchdog_enabled(false, &mut usec) && usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// Tells the watchdog the program is alive every `interval`, for as long as the runtime runs
/// this task.
pub async fn watchdog(interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        send(&[NotifyState::Watchdog]);
    }
}

/// Starts [`watchdog`] on the current runtime when the service manager asked for one.
pub fn spawn_watchdog() {
    if let Some(interval) = watchdog_interval() {
        tracing::info!(?interval, "telling the service manager's watchdog we are alive");
        tokio::spawn(watchdog(interval));
    }
}

fn send(states: &[NotifyState]) {
    if let Err(error) = sd_notify::notify(false, states) {
        tracing::debug!(%error, "cannot notify the service manager");
    }
}
