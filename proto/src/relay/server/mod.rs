//! The publisher's side of the relay protocol as machines and functions without I/O, fed bytes,
//! the ring and the time (ns on a monotonic base the driver chooses): the publisher's drivers
//! (`tcp.rs`, `retransmit.rs`, `pacing.rs` in `mdrelay-pub`) only move bytes between sockets and
//! these, keep the timers they ask for, and count what they report.
//!
//! - [`handshake`]: the greeting sent and the answer read and checked ([`ServerHandshake`]):
//!   versions, the port's purpose, protection, the handshake's deadline; BUSY and REFUSE bytes;
//! - [`feed`]: what a subscriber is sent ([`SubscriberFeed`]): where a resuming subscriber's
//!   replay starts and ends ([`plan_join`]), the replay's chunks out of the ring
//!   ([`ReplayCursor`]), FORMAT records before the first record and at each switch, and the
//!   hand-over to the live records without a gap or a duplicate;
//! - [`handover`]: who writes a subscriber's socket ([`Handover`]): the hot thread, while the
//!   subscriber is current, or the subscriber's task;
//! - [`echoes`]: what a subscriber sends back, `ECHO` records only ([`EchoReader`]);
//! - [`retransmit`]: the retransmission service's side of a client ([`RequestReader`]: requests
//!   out of bytes, idle and partial-request deadlines), its rate ([`TokenBucket`]) and each
//!   request's answer out of the ring ([`Answer`]);
//! - [`pacing`]: when each segment is due ([`PaceSchedule`]), given the time.

pub mod echoes;
pub mod feed;
pub mod handover;
pub mod handshake;
pub mod pacing;
pub mod retransmit;

#[cfg(test)]
mod echoes_tests;
#[cfg(test)]
mod feed_tests;
#[cfg(test)]
mod handover_tests;
#[cfg(test)]
mod handshake_tests;
#[cfg(test)]
mod pacing_tests;
#[cfg(test)]
mod retransmit_tests;
#[cfg(test)]
mod testing;

pub use echoes::{ECHO_RECORD, EchoReader};
pub use feed::{FeedStep, Join, ReplayCursor, ReplayFill, SubscriberFeed, last_record, plan_join};
pub use handover::{Handover, Taken as HandoverTaken, Wrote};
pub use handshake::{HandshakeConfig, Refusal, ServerHandshake, busy_greeting, protection_mismatch, refusal_record};
pub use pacing::{PaceMode, PaceSchedule, Paced};
pub use retransmit::{
    ANSWER_BYTES, Answer, AnswerStep, ClientEnd, REQUEST_LEN, RequestEvent, RequestReader, TokenBucket, throttled,
};
