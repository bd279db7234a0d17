//! IEX market data for mdrelay: from a capture file or a feed's datagrams to typed messages and
//! what they add up to. Everything here works on byte slices and `std::io` streams; the one
//! place that opens files is [`capture`], which reads a capture by path.
//!
//! Layout, from the wire inwards:
//! - [`capture`]: streaming pcap / pcapng reader (gzip or not), packets out;
//! - [`link`]: Ethernet / VLAN / Linux SLL / raw IPv4 down to the UDP payload;
//! - [`iextp`]: IEX-TP v1 segments and their length-prefixed message blocks;
//! - [`message`]: the message model every wire format converts to and from;
//! - [`price`]: fixed-point prices and space-padded symbols;
//! - [`aggregate`]: per-symbol volume and high/low prices;
//! - [`book`]: per-symbol state (price levels, status, last trade, top of book);
//! - [`sequence`]: IEX-TP numbering per (protocol, channel, session): gaps, duplicates, late
//!   segments and restarts;
//! - [`inspect`]: a whole capture into counts and aggregates;
//! - [`counts`]: messages counted by type;
//! - [`synth`]: a realistic synthetic trading day of IEX DEEP;
//! - [`capture_writer`]: segments out to pcap / pcapng, with Ethernet, IPv4 and UDP headers;
//! - [`peer_text`]: text a peer chose (a refusal's reason, a symbol) made safe to print;
//! - [`warn`]: the process's budget for warnings about bad input.
//!
//! The wire formats are in `mdrelay-codec`, the relay protocol in `mdrelay-proto`; both build
//! on this crate, and it on neither.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod aggregate;
pub mod book;
pub mod capture;
pub mod capture_writer;
pub mod counts;
pub mod iextp;
pub mod inspect;
pub mod link;
pub mod message;
pub mod peer_text;
pub mod price;
pub mod sequence;
#[cfg(test)]
mod shared_data;
mod symbol_table;
pub mod synth;
pub mod warn;

pub use aggregate::{Aggregator, SymbolAggregate};
pub use book::{Books, Level, SymbolBook};
pub use message::Message;
pub use price::{Price, Symbol};
