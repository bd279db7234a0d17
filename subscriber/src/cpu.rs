//! The receive thread's place on the machine: pinned to a core (`core`, `--core`, with
//! `mdrelay_telemetry::cpu`, which the publisher's hot thread uses too), and SO_BUSY_POLL on its
//! sockets under the low-latency profile.

pub use mdrelay_telemetry::cpu::{allowed_cpus, list, pin_current_thread};
use std::os::fd::AsFd;

/// Microseconds the kernel busy-polls the device queue on a receive with no data (SO_BUSY_POLL):
/// the value the kernel's documentation suggests for a start.
pub const BUSY_POLL_US: u32 = 50;

/// Sets SO_BUSY_POLL on `socket`; logs when the kernel refuses it (raising it above
/// net.core.busy_read needs CAP_NET_ADMIN), since the relay works without it.
pub fn busy_poll(socket: &impl AsFd, what: &str) {
    match socket2::SockRef::from(socket).set_busy_poll(BUSY_POLL_US) {
        Ok(()) => tracing::info!(socket = what, us = BUSY_POLL_US, "SO_BUSY_POLL set"),
        Err(error) => tracing::warn!(socket = what, %error, "SO_BUSY_POLL refused; receiving without it"),
    }
}
