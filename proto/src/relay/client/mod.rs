//! The client side of the relay protocol as state machines without I/O, fed bytes and time (ns
//! on a monotonic base the driver chooses), in the way quinn-proto holds QUIC: the drivers (the
//! subscriber, a relay's upstream, the client library) only move bytes between sockets and these
//! machines, and keep the timers they ask for.
//!
//! - [`connection`]: one TCP connection for any purpose ([`StreamConnection`]): handshake,
//!   version negotiation, protection checks, records;
//! - [`buffer`]: the connection's read buffer, 8-aligned and grown only as bytes arrive.

pub mod buffer;
pub mod connection;
#[cfg(test)]
pub(crate) mod testing;

pub use connection::{
    CloseReason, Closed, ConnectionConfig, ConnectionCounts, ConnectionEvent, Disposition, ResumeAsked, ResumePlan,
    Role, StreamConnection,
};
