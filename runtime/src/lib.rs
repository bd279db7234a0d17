//! What mdrelay's drivers (the client library, the publisher, the subscriber) wait and stamp
//! with: the one place besides their sockets where they touch the operating system's clock and
//! scheduler, kept out of the I/O-free protocol core (`mdrelay-proto`).
//!
//! - [`idle`]: idle strategies (spin, yield, backoff, sleep) and profiles for hot threads;
//! - [`clock`]: the wall clock publish and receive times are read from;
//! - [`memory`]: whether freed memory goes back to the system.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod idle;
pub mod memory;
