//! mdrelay's core, without any I/O runtime: everything here works on byte slices and `std::io`
//! streams, so it is testable without sockets and shared by the publisher and the subscriber.
//!
//! Layout, from the wire inwards:
//! - [`capture`]: streaming pcap / pcapng reader (gzip or not), packets out;
//! - [`link`]: Ethernet / VLAN / Linux SLL / raw IPv4 down to the UDP payload;
//! - [`iextp`]: IEX-TP v1 segments and their length-prefixed message blocks;
//! - [`message`]: the message model every wire format converts to and from;
//! - [`price`]: fixed-point prices and space-padded symbols;
//! - [`aggregate`]: per-symbol volume and high/low prices;
//! - [`sequence`]: IEX-TP numbering per (protocol, channel, session): gaps, duplicates, late
//!   segments and restarts;
//! - [`inspect`]: a whole capture into counts and aggregates;
//! - [`relay`]: the publisher/subscriber protocol: its bytes (handshake, records, datagrams,
//!   totals) and its state machines (coalescing, sessions, frame accounting, echo checks);
//! - [`clock`]: the wall clock publish and receive times are read from;
//! - [`backoff`]: capped exponential waits between reconnections, with optional seeded jitter;
//! - [`idle`]: idle strategies (spin, yield, backoff, sleep) and profiles for hot threads;
//! - [`latency`]: latency histograms and their percentiles;
//! - [`counts`]: messages counted by type;
//! - [`warn`]: the process's budget for warnings about bad input;
//! - [`peer_text`]: text a peer chose (a refusal's reason, a symbol) made safe to print;
//! - [`synth`]: a realistic synthetic trading day of IEX DEEP;
//! - [`codec`]: the wire formats (raw, SBE, FlatBuffers, Cap'n Proto) and their framing;
//! - [`capture_writer`]: segments out to pcap / pcapng, with Ethernet, IPv4 and UDP headers;
//! - [`resegment`]: a decoded frame of any format back to its IEX-TP segment (for recording).

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod aggregate;
pub mod backoff;
pub mod capture;
pub mod capture_writer;
pub mod clock;
pub mod codec;
pub mod counts;
pub mod idle;
pub mod iextp;
pub mod inspect;
pub mod latency;
pub mod link;
pub mod message;
pub mod peer_text;
pub mod price;
pub mod relay;
pub mod resegment;
pub mod sequence;
#[cfg(test)]
mod shared_data;
pub mod synth;
pub mod warn;

pub use aggregate::{Aggregator, SymbolAggregate};
pub use message::Message;
pub use price::{Price, Symbol};
