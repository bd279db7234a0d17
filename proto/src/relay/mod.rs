//! The relay protocol between `mdrelay-pub` and `mdrelay-sub`: its bytes and its state
//! machines, without I/O, so tests can drive every case the network can produce.
//!
//! **TCP.** The publisher greets with a [`Hello`] (magic, protocol version, format, schema
//! version, session, stream, the next frame's sequence number). The subscriber answers with a
//! [`Subscribe`]; a subscriber speaking another protocol version gets a `REFUSE` record with the
//! reason, one arriving while the publisher is at its connection limit a `BUSY` record, and the
//! connection closes. Then the publisher sends records: a 16-byte [`RecordHeader`] (tag, format,
//! frame count, length, first frame's sequence number) and its payload. The first record is a
//! `FORMAT` record naming the format and the first frame offered to this subscriber; a `FORMAT`
//! record also precedes every switch. A `DATA` payload is one or more frames of the record's
//! format, back to back, each delimited by the format's own framing; the record length lets a
//! reader skip a corrupt frame without losing its place. `END` carries the publisher's
//! [`Totals`] and the number the next frame would have had. A subscriber in round-trip mode
//! sends `ECHO` records back.
//!
//! **UDP.** Every datagram starts with a 24-byte [`DatagramHeader`] (magic, version, format,
//! kind, frame count, session, first frame's sequence number), so receivers detect the format,
//! loss, duplicates and reordering; then frames (`DATA`), [`Totals`] (`END`) or an echo (`ECHO`).
//!
//! Headers are multiples of 8 bytes so frames that follow keep the 8-byte alignment Cap'n Proto
//! reads want. Every number is little-endian.
//!
//! Layout:
//! - [`wire`]: the structures as bytes;
//! - [`coalesce`]: grouping frames into records and datagrams ([`Coalescer`]);
//! - [`window`]: frame accounting for one session: lost, duplicate, reordered, too late;
//! - [`session`]: publisher sessions, restarts, and datagrams no other datagram backs up
//!   ([`SessionTracker`]);
//! - [`echo`]: checking echoes against the frames actually sent.

pub mod coalesce;
pub mod echo;
pub mod session;
pub mod window;
pub mod wire;

pub use coalesce::{Coalescer, Envelope, Sealed};
pub use session::{Admission, Greeted, SessionTracker};
pub use window::{Observed, SequenceCounts, SequenceWindow};
pub use wire::*;
