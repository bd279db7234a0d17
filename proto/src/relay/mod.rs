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
//! Versions are negotiated: a subscriber answers a greeting with the lower of the two versions,
//! and a publisher serves a version-1 answer (live only).
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
//! - [`continuity`]: whether a TCP connection's records fit together ([`Continuity`]): a header
//!   changed on the way is a protocol violation, not a new numbering;
//! - [`window`]: frame accounting for one session: lost, duplicate, reordered, too late;
//! - [`session`]: publisher sessions, restarts, and datagrams no other datagram backs up
//!   ([`SessionTracker`]);
//! - [`echo`]: checking echoes against the frames actually sent;
//! - [`ring`]: the publisher's last frames, bounded in bytes, for retransmission and resume;
//! - [`recovery`]: the subscriber's missing frames and when to ask for them;
//! - [`unstored`]: how far a publisher into a store may run ahead of what it holds ([`Unstored`]);
//! - [`msg_id`]: the keyed ids of a publisher's messages in a store ([`MessageIds`]), and whose
//!   message a store holds under an id acknowledged as a duplicate;
//! - [`protect`]: per-frame CRC-32C and authenticated encryption ([`Protector`]);
//! - [`client`]: the client's machines, fed bytes and time: a TCP connection, a stream across
//!   connections, datagrams in, frames out;
//! - [`server`]: the publisher's machines, fed bytes, the ring and time: the handshake, what a
//!   subscriber is sent (replay, FORMAT records, hand-over), retransmission answers, pacing.
//!
//! **Recovery (version 2).** A TCP subscriber that reconnects answers the greeting with
//! [`Resume::From`] its next frame (or 1, for the whole session): the publisher replays what its
//! [`FrameRing`] holds from there before the live records, so within the ring the subscriber sees
//! no gap. A UDP subscriber opens a TCP connection with [`Purpose::Recovery`] to the publisher's
//! retransmission port and sends `REQUEST` records ([`RetransmitRequest`]); the answers are
//! `DATA` records of the frames (in their original format), `GONE` for frames the ring no longer
//! holds, and `BUSY` for a request over the rate limit.

pub mod client;
pub mod coalesce;
pub mod continuity;
pub mod echo;
pub mod msg_id;
pub mod order;
pub mod protect;
pub mod recovery;
pub mod ring;
pub mod server;
pub mod session;
pub mod snapshot;
pub mod unstored;
pub mod window;
pub mod wire;

pub use coalesce::{Coalescer, Envelope, MAX_RUN_BYTES, Sealed};
pub use continuity::{Continuity, MAX_SEQUENCE, Verdict, Violation, ViolationKind};
pub use msg_id::{Duplicate, MessageIds, judge_duplicate};
pub use order::{InOrder, InOrderCounts, Offered};
pub use protect::{
    KeyError, MAX_KEY_FILE, ProtectError, Protection, ProtectionSection, ProtectionSettings, Protector, WireKey,
};
pub use recovery::{GapList, RecoveryCounts, RecoveryPolicy};
pub use ring::FrameRing;
pub use session::{Admission, Greeted, SessionTracker};
pub use unstored::{MAX_UNSTORED_FRAMES, Unstored};
pub use window::{Observed, SequenceCounts, SequenceWindow};
pub use wire::*;
