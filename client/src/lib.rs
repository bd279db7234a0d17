//! Receive an [mdrelay] publisher's market data in your own program: IEX DEEP and TOPS messages
//! over TCP, UDP unicast, UDP multicast or NATS, in whichever wire format the publisher chose (it
//! says so; a switch mid-stream is followed), as the typed message model, with the frames'
//! publish and receive times, loss accounting, loss recovery and A/B line arbitration.
//!
//! [mdrelay]: https://example.invalid/mdrelay
//!
//! # A first subscriber
//!
//! Connect to a publisher over TCP and add up the traded volume of the whole stream:
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // A real publisher replaying IEX's DEEP sample on a port of its choosing.
//! # let deep10 = mdrelay_harness::iex_data().join("DEEP10.pcap.gz").display().to_string();
//! # let mut publisher = mdrelay_harness::Process::start(
//! #     mdrelay_harness::publisher_bin(),
//! #     ["run", "--capture", &deep10, "--tcp", "127.0.0.1:0", "--wait-subscribers", "1", "--slow-subscriber", "block"],
//! # );
//! # let address = publisher.serving_on().to_string();
//! use mdrelay_client::{Builder, Event, Message};
//!
//! let mut subscriber = Builder::tcp(address).build()?;
//! let mut volume = 0u64;
//! while let Some(event) = subscriber.next_event()? {
//!     match event {
//!         Event::Frame(frame) => {
//!             for message in frame.messages() {
//!                 if let Message::TradeReport(trade) = message {
//!                     volume += u64::from(trade.size);
//!                 }
//!             }
//!         }
//!         Event::Gap { first, count } => eprintln!("{count} frames missing from {first}"),
//!         Event::End(end) => assert!(end.complete, "every frame and message the publisher sent"),
//!         _ => {}
//!     }
//! }
//! # let reference = mdrelay_harness::expected("DEEP10.json");
//! assert_eq!(Some(volume), reference["total_trade_volume"].as_u64());
//! # publisher.finish(mdrelay_harness::STEP).assert_success();
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! A [`Builder`] says how the stream arrives and what to do with it; [`Builder::build`] gives a
//! blocking [`Subscriber`], [`Builder::build_async`] an [`AsyncSubscriber`] for a tokio
//! runtime. Both hand out one [`Event`] at a time: a [`Frame`] with its messages, borrowed from
//! the subscriber's buffers until the next call (nothing is allocated per message), or what
//! happened to the stream (connections, gaps, format changes, restarts, the end with the
//! publisher's totals). [`AsyncSubscriber::into_stream`] gives owned events as a
//! [`futures_core::Stream`]. [`Subscriber::counters`] says what was counted so far; an
//! [`Error`] says what went wrong and what to do ([`Error::kind`]).
//!
//! Every decision of the protocol (the handshake, versions, protection, records, resume,
//! sequence accounting, held datagrams, A/B arbitration, when to ask for missing frames) is made
//! by the I/O-free machines of `mdrelay_proto::relay::client`; this crate moves bytes between
//! them and tokio's sockets and timers. `docs/protocol.md` describes the protocol byte by byte.
//!
//! # Transports
//!
//! - [`Builder::tcp`]: one connection, made again when lost (resuming after the last frame
//!   received, from the publisher's ring), or from the session's first frame
//!   ([`Builder::from_start`]).
//! - [`Builder::udp`] and [`Builder::multicast`], with a second line ([`Builder::line_b`]) and
//!   loss recovery from the publisher's retransmission service ([`Builder::recovery`]).
#![cfg_attr(
    feature = "nats",
    doc = r"- [`Builder::nats`]: a NATS subject a publisher's `[nats]` output feeds, each message one
  datagram; with [`Builder::nats_stream`], gaps in the live subject (a connection the server
  cut as too slow, say) are repaired from the JetStream stream that stores it, and with
  [`Builder::from_start`] or [`Builder::nats_start_at`] the stream is replayed first (from
  its first message, or from a time) and handed over to the live subject without a gap or a
  duplicate. Secured clusters: [`Builder::nats_creds_file`], [`Builder::nats_nkey_file`],
  [`Builder::nats_user`] with [`Builder::nats_password_file`], [`Builder::nats_tls_ca_file`]."
)]
#![cfg_attr(
    not(feature = "nats"),
    doc = r"- `Builder::nats`: a NATS subject, with the `nats` feature (off in this build)."
)]
//!
//! Frames protected by the publisher (`[protection]`) are checked ([`Builder::crc`]) and opened
//! ([`Builder::key_file`]) before anything reads them.
//!
//! # Re-exports
//!
//! The message model ([`Message`] and the [`message`] module's types, [`Symbol`], [`Price`]),
//! the wire formats ([`Format`]), batch headers, the publisher's [`Totals`] and the report types
//! of lines and recovery come from `mdrelay_proto`, re-exported here so a program needs this
//! crate only.
//!
//! # Features
//!
//! - `nats` (default): the NATS transport, `Builder::nats` and its settings, on async-nats
//!   (with rustls and ring for TLS). A program that receives over TCP, UDP or multicast only
//!   can leave it out (`default-features = false`) and compiles about half as many crates.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
// docs.rs (`--cfg docsrs`, nightly): each item behind a feature says which.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod collect;
mod counters;
mod datagram;
mod error;
mod event;
mod nats_auth;
#[cfg(feature = "nats")]
mod nats_driver;
mod net;
mod poll;
mod settings;
mod subscriber;
mod tcp;
mod udp;

pub use builder::Builder;
pub use counters::Counters;
pub use nats_auth::{NatsAuth, NatsSetting, NatsSettingError};
pub use settings::{Settings, check_host_port, read_key_file};

/// A NATS connection's options from the same settings everywhere: the subscriber's, a
/// publisher's `[nats]` output and its NATS upstream each connect through these.
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats {
    pub use crate::nats_auth::{connect_error, connect_options};
}
pub use error::{Error, ErrorKind};
pub use event::{End, Event, Frame, Messages, OwnedEvent, OwnedFrame, OwnedMessage, RecoveryEvent, Skipped, Snapshot};
/// Where a TCP subscription asked the stream to start ([`Event::Subscribed`]): the protocol
/// machine's own answer, handed over as it is.
pub use mdrelay_proto::relay::client::Start;
pub use subscriber::{AsyncSubscriber, EventStream, Subscriber, Waited, WakeHandle};

pub use mdrelay_codec::{BatchHeader, DecodeError, Format};
/// One symbol's day aggregates: traded volume and count, breaks, high and low prices.
pub use mdrelay_iex::aggregate::SymbolAggregate;
/// Per-symbol state kept from the messages: order books, status, last trade, top of book.
///
/// A [`Books`] is fed the frames' messages (`books.extend(frame.messages())`) and answers per
/// symbol ([`Books::get`]: best bid and ask, levels in price order, statuses, last trade) or
/// over every symbol ([`Books::iter`]):
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let deep10 = mdrelay_harness::iex_data().join("DEEP10.pcap.gz").display().to_string();
/// # let mut publisher = mdrelay_harness::Process::start(
/// #     mdrelay_harness::publisher_bin(),
/// #     ["run", "--capture", &deep10, "--tcp", "127.0.0.1:0", "--wait-subscribers", "1", "--slow-subscriber", "block"],
/// # );
/// # let address = publisher.serving_on().to_string();
/// use mdrelay_client::{Books, Builder, Event, Symbol};
///
/// let mut subscriber = Builder::tcp(address).build()?;
/// let mut books = Books::new();
/// while let Some(event) = subscriber.next_event()? {
///     match event {
///         Event::Frame(frame) => books.extend(frame.messages()),
///         Event::End(_) => break,
///         _ => {}
///     }
/// }
/// let aa = books.get(&Symbol::new("AA").expect("a valid symbol")).expect("AA has a book");
/// let (bid, ask) = (aa.best_bid().unwrap(), aa.best_ask().unwrap());
/// println!("AA {} x {} at {} / {}", bid.size, ask.size, bid.price, ask.price);
/// # // The same as the independent reference reader's book at the end of the capture.
/// # let reference = mdrelay_harness::expected("DEEP10.book.json");
/// # assert_eq!(reference["symbols"]["AA"]["bids"][0], serde_json::json!([bid.price.0, bid.size]));
/// # assert_eq!(reference["symbols"]["AA"]["asks"][0], serde_json::json!([ask.price.0, ask.size]));
/// # assert_eq!(books.len(), reference["symbols"].as_object().unwrap().len());
/// # publisher.finish(mdrelay_harness::STEP).assert_success();
/// # Ok(())
/// # }
/// ```
pub use mdrelay_iex::book;
pub use mdrelay_iex::book::{Books, Level, SymbolBook};
/// The IEX message model: one type per message, every field a small `Copy` value.
pub use mdrelay_iex::message;
pub use mdrelay_iex::{Message, Price, Symbol};
pub use mdrelay_proto::latency::LatencySummary;
pub use mdrelay_proto::relay::client::{
    Line, LineReport, LinesReport, ProtectionCounts, RecoveryReport, UnrecoverableCauses,
};
pub use mdrelay_proto::relay::{KeyError, Protection, Totals, WireKey};
pub use mdrelay_runtime::idle::{IdleStrategy, Profile};

/// The crate's README, what crates.io shows: its examples are compiled with the doc tests (the
/// NATS one needs the feature).
#[cfg(all(doctest, feature = "nats"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
