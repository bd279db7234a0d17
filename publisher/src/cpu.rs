//! The hot thread's timers: as precise as the kernel allows, so `backoff`'s short sleeps end when
//! asked. Its core (`[cpu] hot_core`) is checked and pinned with `mdrelay_telemetry::cpu`, which
//! the subscriber's receive thread uses too.

/// Sets the calling thread's timer slack to 1 ns (PR_SET_TIMERSLACK). With the default 50 µs
/// the kernel may end any sleep up to 50 µs late to batch wake-ups; measured on a 2 vCPU KVM
/// guest, a 10 µs sleep then ends about 70 µs late, and with 1 ns about 20 µs late. A failure
/// only costs precision, so it is logged and the thread goes on.
pub fn precise_timers() {
    if let Err(error) = nix::sys::prctl::set_timerslack(1) {
        tracing::warn!(%error, "cannot set the hot thread's timer slack to 1 ns; short sleeps may end up to 50 µs late");
    }
}
