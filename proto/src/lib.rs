//! mdrelay's relay protocol, without any I/O: its bytes (handshake, records, datagrams, totals,
//! protection) and its state machines (coalescing, sessions, frame accounting, windows,
//! recovery, echo checks), fed bytes and time by the drivers, so every decision is testable on
//! byte slices with a fake clock. The crate reads no file, opens no socket, reads no clock and
//! never sleeps: its `clippy.toml` bans those calls, and CI's clippy pass holds it to that.
//!
//! Layout:
//! - [`relay`]: the publisher/subscriber protocol: its bytes and its machines;
//! - [`backoff`]: capped exponential waits between reconnections, with optional seeded jitter;
//! - [`latency`]: latency histograms and their percentiles.
//!
//! It builds on `mdrelay-iex` (the message model, IEX-TP) and `mdrelay-codec` (the wire
//! formats); the drivers' clock and idle strategies are in `mdrelay-runtime`.

#![deny(unsafe_code)]
#![warn(missing_docs)]

/// `impl Add` for a struct of counters: the sum of two is each counter's, saturating (two
/// sessions' counts, or a closed connection's and the current one's).
macro_rules! counters_add {
    ($counts:ident { $($counter:ident),* $(,)? }) => {
        impl std::ops::Add for $counts {
            type Output = $counts;
            fn add(self, other: $counts) -> $counts {
                $counts { $($counter: self.$counter.saturating_add(other.$counter)),* }
            }
        }
    };
}

pub mod backoff;
pub mod latency;
pub mod relay;
// The core's tests find the shared captures as mdrelay-iex's do, from the same file: the core
// does not depend on the test harness, so that its layers point one way.
#[cfg(test)]
#[path = "../../iex/src/shared_data.rs"]
#[allow(dead_code, clippy::disallowed_methods)] // `expected` serves mdrelay-iex's tests; tests read files
mod shared_data;
