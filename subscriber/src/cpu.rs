//! The receive thread's place on the machine: pinned to a core (`core`, `--core`, with
//! `mdrelay_telemetry::cpu`, which the publisher's hot thread uses too). SO_BUSY_POLL under the
//! low-latency profile is set by `mdrelay-client` on the sockets it opens.

pub use mdrelay_telemetry::cpu::{allowed_cpus, list, pin_current_thread};
