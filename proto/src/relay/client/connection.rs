//! One TCP connection to a publisher, for any purpose, as a state machine fed bytes and time:
//! a subscriber's stream (live, resumed or from the start), a relay's upstream, or a UDP
//! subscriber's connection to the retransmission service.
//!
//! The driver connects a socket, makes a [`StreamConnection`] for it, and then only moves bytes:
//! it reads into [`StreamConnection::read_buf`] and says how many bytes came with
//! [`StreamConnection::received`] (0: the peer closed), writes what
//! [`StreamConnection::transmit`] holds and says how much went with
//! [`StreamConnection::transmitted`], polls [`StreamConnection::poll_event`] until it returns
//! `None` before reading again, and calls [`StreamConnection::on_timeout`] at
//! [`StreamConnection::deadline`]. Nothing here reads a clock or touches a socket, so every
//! branch is tested on byte slices with a fake clock.
//!
//! The handshake is checked here once for every kind of client: the greeting's magic, its
//! versions (negotiated down to the peer's), the protection bits and the key check, a `BUSY` or
//! `REFUSE` a retransmission service sends instead of greeting; then the answer is queued. After
//! it, records are walked one by one: each header is checked against its limit before its
//! payload is waited for, and on the stream against the connection's [`Continuity`] (a header
//! changed on the way is a protocol violation, which closes the connection before anything of
//! that record is handed on). The read buffer grows only as bytes arrive, never beyond one
//! record of the largest size allowed and the header after it.
//!
//! Why a connection ended is a [`CloseReason`] (what happened, with the data) and a text: the
//! one each program has always given, naming the peer and the byte of the connection.

use super::buffer::RecordBuf;
use crate::backoff::duration_ns;
use crate::relay::continuity::{Continuity, Verdict, Violation};
use crate::relay::protect::{ProtectError, Protection, Protector, WireKey};
use crate::relay::wire::{
    Echo, HELLO_MAGIC, HandshakeError, Hello, MAX_REASON, MAX_RECORD, Purpose, RecordHeader, RecordTag, RelayError,
    Resume, RetransmitRequest, Subscribe, Totals, parse_gone,
};
use mdrelay_codec::{DEFAULT_MAX_FRAME, Format};
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// A subscriber gives a publisher this long to greet, and to take its answer.
pub const SUBSCRIBER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A recovery client gives the retransmission service this long to greet, and to take its answer.
pub const RECOVERY_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer record a recovery client takes. A publisher's records hold up to 64 KiB of
/// frames, or one frame of a datagram's size at most.
pub const MAX_ANSWER_RECORD: usize = 1 << 20;
/// Echo bytes waiting to be written before further echoes are dropped (the publisher is not
/// reading them); bounded so a stalled way back costs neither memory nor the data flow.
pub const MAX_PENDING_ECHOES: usize = 1 << 20;
/// Request bytes waiting to be written before no more requests are taken.
pub const MAX_PENDING_REQUESTS: usize = 64 << 10;
/// Bytes of one `ECHO` record.
pub const ECHO_RECORD: usize = RecordHeader::LEN + Echo::LEN;
/// Starting size of a stream's read buffer; it grows (doubling) only for records larger than this.
pub const STREAM_READ_BUFFER: usize = 256 << 10;
/// Starting size of a recovery connection's read buffer.
pub const RECOVERY_READ_BUFFER: usize = 128 << 10;

/// Which program's client the connection is: what it checks, and how it words what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// A subscriber's stream (`mdrelay-sub` over TCP).
    Subscriber,
    /// A relay's upstream (`mdrelay-pub` with `[source.upstream]`): `connect` is the address as
    /// configured, for messages. It takes CRC-32C protection only, never encryption.
    Relay {
        /// `source.upstream.connect`.
        connect: String,
    },
    /// A UDP subscriber's connection to the retransmission service.
    Recovery,
}

impl Role {
    /// What the connection asks for in its answer.
    pub fn purpose(&self) -> Purpose {
        match self {
            Role::Recovery => Purpose::Recovery,
            _ => Purpose::Stream,
        }
    }

    /// Largest record payload read on this connection.
    pub fn max_record(&self) -> usize {
        match self {
            Role::Recovery => MAX_ANSWER_RECORD,
            _ => MAX_RECORD,
        }
    }
}

/// Where the connection asks the publisher to start, decided from what was received before it
/// (see [`crate::relay::client::StreamClient`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResumePlan {
    /// The publisher session of the frames received so far, if any.
    pub session: Option<u64>,
    /// The frame after the last one received in that session, if any was: a greeting of that
    /// session is answered with a resume from here.
    pub next: Option<u64>,
    /// Otherwise, ask for the session from its first frame (`--from-start`, nothing received yet).
    pub from_start: bool,
    /// A greeting of another session than `session` ends the connection (a relay cannot follow
    /// an upstream's restart); otherwise it is a restart the stream follows.
    pub same_session_only: bool,
}

impl ResumePlan {
    /// Where to start, given the greeting's session.
    fn resume(&self, session: u64) -> Resume {
        match (self.session, self.next) {
            (Some(s), Some(next)) if s == session => Resume::From(next),
            _ if self.from_start => Resume::From(1),
            _ => Resume::Live,
        }
    }
}

/// Where a TCP subscription asked the stream to start: what the answer to the greeting asked
/// for. The client library hands it to its users as it is (`mdrelay_client::Start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Start {
    /// From the next record: the stream live.
    Live,
    /// The same publisher run as before: from this frame, after the last one received.
    Resume {
        /// The frame asked for.
        from: u64,
    },
    /// The session from its first frame.
    FromStart,
    /// A resume was wanted, but the publisher speaks a protocol version without it: live.
    ResumeUnsupported {
        /// The publisher's protocol version.
        version: u16,
    },
}

/// How a connection is set up.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// Whose connection it is.
    pub role: Role,
    /// The peer, for messages.
    pub peer: SocketAddr,
    /// The protection this side expects of the frames.
    pub protection: Protection,
    /// The pre-shared key, when frames are encrypted: the greeting's key check is compared with
    /// the one this key gives (a subscriber's stream).
    pub key: Option<WireKey>,
    /// Ask for `ECHO` handling (round-trip mode).
    pub echo: bool,
    /// Where to start the stream.
    pub resume: ResumePlan,
    /// Ask for a snapshot of the state before the stream, when the stream starts live (not on
    /// a resume, nor from the start).
    pub snapshot: bool,
    /// Time for the greeting to arrive, and then for the answer to be taken, ns.
    pub handshake_timeout_ns: i64,
    /// With it, a connection that receives nothing for this long after its handshake is lost, ns.
    pub idle_timeout_ns: Option<i64>,
    /// Starting size of the read buffer.
    pub read_buffer: usize,
}

impl ConnectionConfig {
    /// A subscriber's stream connection to `peer`.
    pub fn subscriber(peer: SocketAddr, protection: Protection, key: Option<WireKey>, echo: bool) -> ConnectionConfig {
        ConnectionConfig {
            role: Role::Subscriber,
            peer,
            protection,
            key,
            echo,
            resume: ResumePlan::default(),
            snapshot: false,
            handshake_timeout_ns: duration_ns(SUBSCRIBER_HANDSHAKE_TIMEOUT),
            idle_timeout_ns: None,
            read_buffer: STREAM_READ_BUFFER,
        }
    }

    /// A relay's connection to its upstream `connect` (as configured), reached at `peer`;
    /// `crc`: the upstream protects its frames with a CRC-32C.
    pub fn relay(connect: String, peer: SocketAddr, crc: bool, handshake_timeout: Duration) -> ConnectionConfig {
        ConnectionConfig {
            role: Role::Relay { connect },
            peer,
            protection: Protection { crc, encrypted: false },
            key: None,
            echo: false,
            resume: ResumePlan { same_session_only: true, ..ResumePlan::default() },
            snapshot: false,
            handshake_timeout_ns: duration_ns(handshake_timeout),
            idle_timeout_ns: None,
            read_buffer: STREAM_READ_BUFFER,
        }
    }

    /// A recovery connection to the retransmission service at `peer`.
    pub fn recovery(peer: SocketAddr, protection: Protection) -> ConnectionConfig {
        ConnectionConfig {
            role: Role::Recovery,
            peer,
            protection,
            key: None,
            echo: false,
            resume: ResumePlan::default(),
            snapshot: false,
            handshake_timeout_ns: duration_ns(RECOVERY_HANDSHAKE_TIMEOUT),
            idle_timeout_ns: None,
            read_buffer: RECOVERY_READ_BUFFER,
        }
    }
}

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The publisher's `END`: the stream is complete.
    End,
    /// The peer is not a publisher: its greeting is not one (the error names the byte).
    NotAPublisher(RelayError),
    /// The peer speaks another protocol or schema version.
    Version(HandshakeError),
    /// The peer protects its frames otherwise than this side expects.
    ProtectionMismatch {
        /// The peer's protection.
        theirs: Protection,
        /// What this side expects.
        ours: Protection,
    },
    /// A relay's upstream encrypts its frames, which a relay cannot take.
    Encrypted(Protection),
    /// The peer encrypts with another key (its key check differs).
    WrongKey,
    /// A retransmission service of a protocol version without retransmission.
    NoRetransmission {
        /// The peer's protocol version.
        version: u16,
    },
    /// A relay's upstream greeted with another session than before: it restarted.
    Restarted {
        /// The session before.
        old: u64,
        /// The greeting's session.
        new: u64,
    },
    /// A `REFUSE` record: do not retry.
    Refused(String),
    /// A `BUSY` record: retry later.
    Busy(String),
    /// No whole greeting within the handshake time; `received` bytes of it came.
    HandshakeTimeout {
        /// Greeting bytes received.
        received: usize,
    },
    /// The answer was not taken within the handshake time.
    AnswerNotTaken,
    /// Nothing received for the idle time after the handshake.
    IdleTimeout,
    /// The peer closed the connection during the greeting, after `received` bytes.
    ClosedInGreeting {
        /// Greeting bytes received.
        received: usize,
    },
    /// The peer closed the connection; inside the record at this byte, when there was one.
    Closed {
        /// Where the record cut short starts.
        inside_record: Option<u64>,
    },
    /// A retransmission service closed the connection between answers, with nothing of this
    /// side's unsent (it closes connections that ask nothing for a while).
    Quiet,
    /// A record header that cannot be read, at this byte: the stream's framing is lost.
    BadHeader {
        /// The byte of the connection.
        at: u64,
        /// What was wrong.
        error: RelayError,
    },
    /// A `GONE` record whose payload cannot be read, at this byte.
    BadGone {
        /// The byte of the connection.
        at: u64,
        /// What was wrong.
        error: RelayError,
    },
    /// A record whose numbers do not fit the connection's stream, at this byte.
    Violation {
        /// Where the record starts.
        at: u64,
        /// How it did not fit.
        violation: Violation,
    },
    /// A frame that failed its check (a relay's CRC-32C): the bytes changed on the way.
    FrameCheck {
        /// The frame.
        sequence: u64,
        /// Where its protected bytes start.
        at: u64,
        /// Why it failed.
        error: ProtectError,
    },
    /// Reading failed, at this byte; `in_greeting`: before the greeting was whole.
    ReadFailed {
        /// Bytes of the connection before the read.
        at: u64,
        /// The error.
        error: String,
        /// Whether the greeting was still being read.
        in_greeting: bool,
    },
    /// Writing failed; `in_handshake`: the answer had not all been written.
    WriteFailed {
        /// The error.
        error: String,
        /// Whether the answer was being written.
        in_handshake: bool,
    },
}

/// What the program does after a connection ended this way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// The stream is complete.
    Finished,
    /// Connect again, later.
    Retry,
    /// The peer was busy: connect again, later.
    Busy,
    /// The connection's bytes could not be believed: connect again after a wait that grows while
    /// violations follow one another.
    Violation,
    /// The peer and this side's settings disagree: do not retry.
    Refused,
    /// Another connection would not help.
    Fatal,
}

impl CloseReason {
    /// What to do next.
    pub fn disposition(&self) -> Disposition {
        match self {
            CloseReason::End => Disposition::Finished,
            CloseReason::NotAPublisher(_)
            | CloseReason::Version(_)
            | CloseReason::ProtectionMismatch { .. }
            | CloseReason::Encrypted(_)
            | CloseReason::WrongKey
            | CloseReason::NoRetransmission { .. }
            | CloseReason::Refused(_) => Disposition::Refused,
            CloseReason::Restarted { .. } => Disposition::Fatal,
            CloseReason::Busy(_) => Disposition::Busy,
            CloseReason::Violation { .. } | CloseReason::FrameCheck { .. } => Disposition::Violation,
            _ => Disposition::Retry,
        }
    }
}

/// How a connection ended: why, and the text the program gives for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Closed {
    /// Why.
    pub reason: CloseReason,
    /// Whether the handshake had completed (the answer written) before it ended.
    pub established: bool,
    /// What happened, naming the peer and the byte of the connection where that matters.
    pub why: String,
}

/// Something that happened on the connection, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum ConnectionEvent<'a> {
    /// The greeting passed every check; the answer is queued in [`StreamConnection::transmit`].
    Greeted {
        /// The greeting.
        hello: Hello,
        /// The answer, negotiated down to the peer's version.
        answer: Subscribe,
        /// Where the answer asks the stream to start.
        resume: Start,
    },
    /// A `FORMAT` record: `format` applies from the next record on, which starts at
    /// `first_sequence`.
    Format {
        /// The format.
        format: Format,
        /// The first frame of the records after it.
        first_sequence: u64,
        /// Where the record starts.
        at: u64,
    },
    /// The first record of a resumed connection says where its frames start: where the resume
    /// asked for (`offered == asked`), or later (the publisher no longer holds those frames, or
    /// keeps no ring of them).
    Resume {
        /// The frame asked for.
        asked: u64,
        /// The first frame offered.
        offered: u64,
    },
    /// A `DATA` record: its frames, 8-aligned for formats that read words in place.
    Data {
        /// The record's header.
        header: RecordHeader,
        /// Its payload.
        payload: &'a [u8],
        /// Where the payload starts.
        payload_at: u64,
    },
    /// A `SNAPSHOT` record: frames of a snapshot (8-aligned, as a `DATA` record's), or with no
    /// frames its closing totals.
    Snapshot {
        /// The record's header.
        header: RecordHeader,
        /// Its payload.
        payload: &'a [u8],
        /// Where the payload starts.
        payload_at: u64,
    },
    /// The publisher's `END`; the connection closes after it.
    End {
        /// The number the next frame would have had.
        next_sequence: u64,
        /// The publisher's totals, or why they could not be read (the error's offset is within
        /// the payload).
        totals: Result<Totals, RelayError>,
        /// Where the payload starts.
        payload_at: u64,
    },
    /// A retransmission service no longer holds `count` frames from `first`.
    Gone {
        /// The first.
        first: u64,
        /// How many.
        count: u64,
    },
    /// A retransmission service's `BUSY`: the request for frames from `first` was over its rate
    /// limit (or, with `first` 0, it made this connection leave for another client).
    Busy {
        /// The request's first frame.
        first: u64,
        /// The reason given.
        reason: String,
    },
    /// A record that has no place on this connection (skipped: its length keeps the framing).
    OutOfPlace {
        /// Its tag.
        tag: RecordTag,
        /// Where it starts.
        at: u64,
    },
    /// A record that does not fit the stream: the connection closes after this.
    Violation {
        /// How it did not fit.
        violation: Violation,
        /// Where it starts.
        at: u64,
    },
    /// The connection is over; nothing follows.
    Closed(Closed),
}

/// What the connection counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Bytes received, the greeting's included.
    pub bytes: u64,
    /// Record headers that could not be read.
    pub bad_headers: u64,
    /// Records whose numbers did not fit the stream.
    pub violations: u64,
    /// `REQUEST`, `GONE` or `ECHO` records on a stream, or other records than answers on a
    /// recovery connection: skipped.
    pub out_of_place: u64,
    /// Of those, `ECHO` records from a publisher.
    pub echoes_from_publisher: u64,
    /// `END` records whose totals could not be read.
    pub unreadable_totals: u64,
    /// `ECHO` records written whole.
    pub echoes_sent: u64,
    /// `ECHO` records dropped: too many waiting, or unsent when the connection was lost.
    pub echoes_dropped: u64,
}

counters_add!(ConnectionCounts {
    bytes,
    bad_headers,
    violations,
    out_of_place,
    echoes_from_publisher,
    unreadable_totals,
    echoes_sent,
    echoes_dropped
});

/// Where the connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Reading the greeting; for a recovery connection, possibly a `BUSY` or `REFUSE` record
    /// instead, whose header and reason of `reason` bytes are being read.
    Greeting { refusal: Option<(RecordHeader, usize)> },
    /// Records.
    Records,
    /// Over.
    Closed,
}

/// How the input ended, once the records before it are handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
enum InputEnd {
    /// The peer closed.
    Eof,
    /// A read failed.
    Failed(String),
}

/// One TCP connection to a publisher: see the module's documentation.
#[derive(Debug)]
pub struct StreamConnection {
    config: ConnectionConfig,
    /// Opens nothing: only the key check of an encrypted stream.
    key_check: Option<Protector>,
    state: State,
    buf: RecordBuf,
    /// An aligned copy of a payload that did not start on an 8-byte boundary.
    aligned: RecordBuf,
    /// Bytes of the last record handed out, consumed at the next call.
    pending_consume: usize,
    /// A `DATA` record checked and not yet handed out (a resume check goes first): its header,
    /// its bytes and where its payload starts.
    ready: Option<(RecordHeader, usize, u64)>,
    /// Byte of the connection where the buffer's data starts (counted from the greeting).
    offset: u64,
    continuity: Continuity,
    /// The resume asked for, until the first record says where the stream starts.
    resume_asked: Option<u64>,
    /// Bytes waiting to be written: the answer first, then echoes or requests.
    out: Vec<u8>,
    /// Bytes of the answer still at the front of `out`.
    answer_left: usize,
    /// Bytes of echo records written so far.
    echo_written: u64,
    /// Whether any whole record was received (a recovery connection that answered).
    answered: bool,
    input_end: Option<InputEnd>,
    /// The handshake's deadline, until the answer is written.
    handshake_deadline: i64,
    last_received: i64,
    events: VecDeque<ConnectionEvent<'static>>,
    closed: Option<Closed>,
    counts: ConnectionCounts,
}

/// A duration of ns as `Debug` shows it (`10s`), the way the programs have always written it.
fn shown(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

impl StreamConnection {
    /// A connection made at `now`, before anything was received.
    pub fn new(config: ConnectionConfig, now: i64) -> StreamConnection {
        let key_check = config
            .key
            .as_ref()
            .filter(|_| config.protection.encrypted)
            .map(|key| Protector::new(config.protection.crc, Some(key), DEFAULT_MAX_FRAME));
        let buf = RecordBuf::new(config.read_buffer.max(Hello::LEN));
        StreamConnection {
            handshake_deadline: now.saturating_add(config.handshake_timeout_ns),
            config,
            key_check,
            state: State::Greeting { refusal: None },
            buf,
            aligned: RecordBuf::new(0),
            pending_consume: 0,
            ready: None,
            offset: 0,
            continuity: Continuity::new(None),
            resume_asked: None,
            out: Vec::new(),
            answer_left: 0,
            echo_written: 0,
            answered: false,
            input_end: None,
            last_received: now,
            events: VecDeque::new(),
            closed: None,
            counts: ConnectionCounts::default(),
        }
    }

    /// The connection's settings.
    pub fn config(&self) -> &ConnectionConfig {
        &self.config
    }

    /// What it counted.
    pub fn counts(&self) -> ConnectionCounts {
        self.counts
    }

    /// Whether the handshake completed: the greeting checked and the answer written.
    pub fn is_established(&self) -> bool {
        self.state == State::Records && self.answer_left == 0
    }

    /// How it ended, once it has.
    pub fn closed(&self) -> Option<&Closed> {
        self.closed.as_ref()
    }

    /// Whether it is over.
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Bytes the read buffer holds without growing: it grows only as bytes arrive, up to one
    /// record of the largest size allowed and the header after it.
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Whether a recovery connection received any whole record.
    pub fn answered(&self) -> bool {
        self.answered
    }

    fn consume_pending(&mut self) {
        if self.pending_consume > 0 {
            self.buf.consume(self.pending_consume);
            self.offset += self.pending_consume as u64;
            self.pending_consume = 0;
        }
    }

    /// Where to read the next bytes into; empty once the connection is over. Poll every event
    /// first: room is made for what the connection waits for.
    pub fn read_buf(&mut self) -> &mut [u8] {
        self.consume_pending();
        if self.closed.is_some() || self.input_end.is_some() {
            return &mut [];
        }
        if self.buf.spare().is_empty() {
            // Only when the driver reads before polling: room for one more header.
            let want = self.buf.len() + RecordHeader::LEN;
            self.buf.reserve_for(want, 2 * RecordHeader::LEN + self.config.role.max_record());
        }
        self.buf.spare()
    }

    /// `n` bytes were read into [`StreamConnection::read_buf`] at `now`; 0 means the peer closed
    /// its side.
    pub fn received(&mut self, n: usize, now: i64) {
        if self.closed.is_some() || self.input_end.is_some() {
            return;
        }
        if n == 0 {
            self.input_end = Some(InputEnd::Eof);
            return;
        }
        let before = self.buf.len();
        self.buf.commit(n);
        let taken = self.buf.len() - before;
        self.counts.bytes += taken as u64;
        self.last_received = now;
    }

    /// A read failed with `error`: the connection ends once what was received is handed out.
    pub fn read_failed(&mut self, error: &dyn fmt::Display) {
        if self.closed.is_none() && self.input_end.is_none() {
            self.input_end = Some(InputEnd::Failed(error.to_string()));
        }
    }

    /// Bytes to write to the peer.
    pub fn transmit(&self) -> &[u8] {
        &self.out
    }

    /// `n` bytes of [`StreamConnection::transmit`] were written.
    pub fn transmitted(&mut self, n: usize) {
        let n = n.min(self.out.len());
        self.out.drain(..n);
        let of_answer = n.min(self.answer_left);
        self.answer_left -= of_answer;
        let rest = (n - of_answer) as u64;
        if rest > 0 && self.config.role != Role::Recovery {
            // Echo records are 32 bytes back to back, so the bytes written tell how many went
            // out whole.
            let before = self.echo_written / ECHO_RECORD as u64;
            self.echo_written += rest;
            self.counts.echoes_sent += self.echo_written / ECHO_RECORD as u64 - before;
        }
    }

    /// A write failed with `error`: the connection is over.
    pub fn write_failed(&mut self, error: &dyn fmt::Display) {
        if self.closed.is_none() {
            let in_handshake = self.state != State::Records || self.answer_left > 0;
            self.close(CloseReason::WriteFailed { error: error.to_string(), in_handshake });
        }
    }

    /// Ends the connection for a reason found outside it (a frame failing its check).
    pub fn abort(&mut self, reason: CloseReason) {
        if self.closed.is_none() {
            self.close(reason);
        }
    }

    /// When [`StreamConnection::on_timeout`] is due, if ever.
    pub fn deadline(&self) -> Option<i64> {
        if self.closed.is_some() {
            return None;
        }
        if !self.is_established() {
            return Some(self.handshake_deadline);
        }
        self.config.idle_timeout_ns.map(|idle| self.last_received.saturating_add(idle))
    }

    /// Time passed: a handshake or idle time that ran out ends the connection.
    pub fn on_timeout(&mut self, now: i64) {
        if self.closed.is_some() {
            return;
        }
        if !self.is_established() {
            if now >= self.handshake_deadline {
                let reason = match self.state {
                    State::Greeting { .. } => CloseReason::HandshakeTimeout { received: self.buf.len() },
                    _ => CloseReason::AnswerNotTaken,
                };
                self.close(reason);
            }
            return;
        }
        if let Some(idle) = self.config.idle_timeout_ns
            && now.saturating_sub(self.last_received) >= idle
        {
            self.close(CloseReason::IdleTimeout);
        }
    }

    /// Queues an `ECHO` record of `echo` (the stream's current `format` in its header); false
    /// when too many are waiting already (it is dropped and counted).
    pub fn queue_echo(&mut self, echo: Echo, format: Format) -> bool {
        if self.closed.is_some() || self.state != State::Records {
            return false;
        }
        if self.out.len() - self.answer_left + ECHO_RECORD > MAX_PENDING_ECHOES {
            self.counts.echoes_dropped += 1;
            return false;
        }
        let header = RecordHeader {
            tag: RecordTag::Echo,
            format,
            frame_count: 0,
            length: Echo::LEN as u32,
            sequence: echo.sequence,
        };
        self.out.extend_from_slice(&header.to_bytes());
        self.out.extend_from_slice(&echo.to_bytes());
        true
    }

    /// Queues a `REQUEST` record (a recovery connection); false while
    /// [`MAX_PENDING_REQUESTS`] bytes wait to be written already.
    pub fn queue_request(&mut self, request: RetransmitRequest) -> bool {
        if self.closed.is_some() || self.state != State::Records || self.out.len() >= MAX_PENDING_REQUESTS {
            return false;
        }
        self.out.extend_from_slice(&request.to_record());
        true
    }

    /// Queues a `REQUEST` record whatever is waiting already: the one a connection was made for
    /// goes out first, whatever else waits.
    pub fn queue_request_unbounded(&mut self, request: RetransmitRequest) {
        if self.closed.is_none() && self.state == State::Records {
            self.out.extend_from_slice(&request.to_record());
        }
    }

    /// Queues the `REQUEST` for a snapshot of the state (a recovery connection's, once): it goes
    /// out first, whatever else waits.
    pub fn queue_snapshot_request(&mut self) {
        if self.closed.is_none() && self.state == State::Records {
            self.out.extend_from_slice(&RetransmitRequest::snapshot_record());
        }
    }

    /// Whether another request would be taken now.
    pub fn has_room_for_requests(&self) -> bool {
        self.closed.is_none() && self.state == State::Records && self.out.len() < MAX_PENDING_REQUESTS
    }

    /// `ECHO` records still waiting to be written (a partly written one included).
    fn unsent_echoes(&self) -> u64 {
        ((self.out.len() - self.answer_left) as u64).div_ceil(ECHO_RECORD as u64)
    }

    /// The driver will write nothing more (the stream ended, the program stops): echoes still
    /// unsent count as dropped, so every echo queued is counted once, sent or dropped.
    pub fn discard_unsent(&mut self) {
        if self.config.role != Role::Recovery {
            self.counts.echoes_dropped += self.unsent_echoes();
        }
        let answer = self.answer_left.min(self.out.len());
        self.out.truncate(answer);
    }

    fn close(&mut self, reason: CloseReason) {
        let established = self.is_established();
        // Echoes that will never go out count as dropped when the connection is lost; after
        // END, or a refusal, the program stops anyway.
        let loses_echoes = matches!(
            reason,
            CloseReason::BadHeader { .. }
                | CloseReason::Violation { .. }
                | CloseReason::FrameCheck { .. }
                | CloseReason::Closed { .. }
                | CloseReason::ReadFailed { in_greeting: false, .. }
                | CloseReason::WriteFailed { in_handshake: false, .. }
                | CloseReason::IdleTimeout
        );
        if loses_echoes && self.config.role != Role::Recovery {
            self.counts.echoes_dropped += self.unsent_echoes();
        }
        let why = describe(&self.config, &reason);
        let closed = Closed { reason, established, why };
        self.state = State::Closed;
        self.closed = Some(closed.clone());
        self.events.push_back(ConnectionEvent::Closed(closed));
    }

    /// The next event, if any; a `Data` event's payload is valid until the next call.
    pub fn poll_event(&mut self) -> Option<ConnectionEvent<'_>> {
        self.consume_pending();
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        if self.ready.is_some() {
            return self.take_ready();
        }
        match self.state {
            State::Closed => None,
            State::Greeting { refusal } => {
                self.greeting(refusal);
                self.events.pop_front()
            }
            State::Records => self.next_record(),
        }
    }

    /// Reads the greeting, or what a retransmission service sends instead, when whole.
    fn greeting(&mut self, refusal: Option<(RecordHeader, usize)>) {
        let have = self.buf.len();
        if let Some((header, length)) = refusal {
            // A BUSY or REFUSE record instead of the greeting: its reason, up to MAX_REASON
            // bytes, or what came before the peer closed.
            if have < RecordHeader::LEN + length && self.input_end.is_none() {
                self.buf.reserve_for(RecordHeader::LEN + length, RecordHeader::LEN + MAX_REASON);
                return;
            }
            let text = &self.buf.data()[RecordHeader::LEN..have.min(RecordHeader::LEN + length)];
            let reason = reason_text(text, header.length);
            return self.close(if header.tag == RecordTag::Busy {
                CloseReason::Busy(reason)
            } else {
                CloseReason::Refused(reason)
            });
        }
        if self.config.role == Role::Recovery
            && have >= RecordHeader::LEN
            && self.buf.data()[..HELLO_MAGIC.len()] != HELLO_MAGIC
        {
            // Not a greeting: a record saying why not, or something else altogether.
            // Any length: a reason longer than MAX_REASON is still a BUSY or REFUSE, read up to
            // MAX_REASON bytes (the rest is never read: the connection ends here).
            if let Ok(header) = RecordHeader::parse(&self.buf.data()[..RecordHeader::LEN], u32::MAX as usize)
                && matches!(header.tag, RecordTag::Busy | RecordTag::Refuse)
            {
                let length = (header.length as usize).min(MAX_REASON);
                self.state = State::Greeting { refusal: Some((header, length)) };
                return self.greeting(Some((header, length)));
            }
            let error = match Hello::parse(&self.buf.data()[..have.min(Hello::LEN)]) {
                Err(HandshakeError::Malformed(e)) => CloseReason::NotAPublisher(e),
                Err(version) => CloseReason::Version(version),
                // The magic differs, so the parse fails; said plainly all the same.
                Ok(_) => CloseReason::NotAPublisher(RelayError { offset: 0, what: "not a greeting".into() }),
            };
            return self.close(error);
        }
        if have < Hello::LEN {
            match self.input_end.take() {
                Some(InputEnd::Eof) => self.close(CloseReason::ClosedInGreeting { received: have }),
                Some(InputEnd::Failed(error)) => {
                    self.close(CloseReason::ReadFailed { at: have as u64, error, in_greeting: true })
                }
                None => {
                    self.buf.reserve_for(Hello::LEN, Hello::LEN);
                }
            }
            return;
        }
        let hello = match Hello::parse(&self.buf.data()[..Hello::LEN]) {
            Ok(hello) => hello,
            Err(HandshakeError::Malformed(e)) => return self.close(CloseReason::NotAPublisher(e)),
            Err(version) => return self.close(CloseReason::Version(version)),
        };
        if let Some(refusal) = self.check_greeting(&hello) {
            return self.close(refusal);
        }
        self.buf.consume(Hello::LEN);
        self.offset = Hello::LEN as u64;
        let role = &self.config.role;
        let plan = self.config.resume;
        let wanted = if *role == Role::Recovery { Resume::Live } else { plan.resume(hello.session) };
        let subscribe = Subscribe {
            purpose: role.purpose(),
            resume: wanted,
            protection: self.config.protection,
            snapshot: self.config.snapshot && *role == Role::Subscriber && wanted == Resume::Live,
            ..Subscribe::new(self.config.echo)
        }
        .negotiated(hello.protocol_version);
        let resume = match (wanted, subscribe.resume) {
            (Resume::From(_), Resume::Live) => Start::ResumeUnsupported { version: hello.protocol_version },
            (Resume::From(from), Resume::From(_)) if plan.session == Some(hello.session) && plan.next.is_some() => {
                Start::Resume { from }
            }
            (Resume::From(_), Resume::From(_)) => Start::FromStart,
            (Resume::Live, _) => Start::Live,
        };
        // A resume counts once the first record starts the stream where it was asked to.
        self.resume_asked = match resume {
            Start::Resume { from } => Some(from),
            _ => None,
        };
        self.continuity = Continuity::new(match subscribe.resume {
            Resume::From(from) => Some(from),
            Resume::Live => None,
        });
        let answer = subscribe.to_bytes();
        self.answer_left = answer.len();
        self.out.extend_from_slice(&answer);
        self.state = State::Records;
        // The answer gets a handshake time of its own from the greeting on.
        self.handshake_deadline = self.last_received.saturating_add(self.config.handshake_timeout_ns);
        self.events.push_back(ConnectionEvent::Greeted { hello, answer: subscribe, resume });
    }

    /// What refuses a well-formed greeting, if anything.
    fn check_greeting(&mut self, hello: &Hello) -> Option<CloseReason> {
        let ours = self.config.protection;
        let mismatch = CloseReason::ProtectionMismatch { theirs: hello.protection, ours };
        match &self.config.role {
            Role::Subscriber => {
                if hello.protection != ours {
                    return Some(mismatch);
                }
                if let Some(check) = &mut self.key_check
                    && hello.key_check != check.key_check(hello.session)
                {
                    return Some(CloseReason::WrongKey);
                }
            }
            Role::Relay { .. } => {
                if hello.protection.encrypted {
                    return Some(CloseReason::Encrypted(hello.protection));
                }
                if hello.protection != ours {
                    return Some(mismatch);
                }
            }
            Role::Recovery => {
                if hello.protocol_version < 2 {
                    return Some(CloseReason::NoRetransmission { version: hello.protocol_version });
                }
                if hello.protection != ours {
                    return Some(mismatch);
                }
            }
        }
        let plan = &self.config.resume;
        match plan.session {
            Some(old) if plan.same_session_only && old != hello.session => {
                Some(CloseReason::Restarted { old, new: hello.session })
            }
            _ => None,
        }
    }

    /// Whether the bytes so far end the connection (the peer closed, or a read failed) now that
    /// no whole record is left; closes it if so.
    fn input_ended(&mut self) -> bool {
        let Some(end) = self.input_end.take() else { return false };
        let reason = match end {
            InputEnd::Failed(error) => {
                CloseReason::ReadFailed { at: self.offset + self.buf.len() as u64, error, in_greeting: false }
            }
            InputEnd::Eof if self.buf.is_empty() => {
                if self.config.role == Role::Recovery && self.out.is_empty() && self.answered {
                    CloseReason::Quiet
                } else {
                    CloseReason::Closed { inside_record: None }
                }
            }
            InputEnd::Eof => CloseReason::Closed { inside_record: Some(self.offset) },
        };
        self.close(reason);
        true
    }

    /// More bytes are needed for a unit of `want` bytes (at most `limit`): makes room, or ends
    /// the connection if the input has ended.
    fn need(&mut self, want: usize, limit: usize) -> Option<ConnectionEvent<'_>> {
        if self.input_ended() {
            return self.events.pop_front();
        }
        self.buf.reserve_for(want, limit);
        None
    }

    /// The next record, when whole.
    fn next_record(&mut self) -> Option<ConnectionEvent<'_>> {
        let max = self.config.role.max_record();
        let recovery = self.config.role == Role::Recovery;
        let data = self.buf.data();
        if data.len() < RecordHeader::LEN {
            return self.need(RecordHeader::LEN, RecordHeader::LEN);
        }
        // A record that ends the connection with a reason may declare any length: only its
        // start is read.
        let parsed =
            RecordHeader::parse(data, max).or_else(|error| match RecordHeader::parse(data, u32::MAX as usize) {
                Ok(header) if ends_with_reason(&header, recovery) => Ok(header),
                _ => Err(error),
            });
        let header = match parsed {
            Ok(h) => h,
            Err(error) => {
                // The stream's framing is lost: only a new connection finds it again.
                self.counts.bad_headers += 1;
                let at = self.offset + error.offset as u64;
                self.close(CloseReason::BadHeader { at, error });
                return self.events.pop_front();
            }
        };
        if ends_with_reason(&header, recovery) {
            // The connection ends here: the reason's first MAX_REASON bytes are all that is
            // read of it, whatever length the header declares (or what came of it before the
            // peer closed).
            let want = RecordHeader::LEN + (header.length as usize).min(MAX_REASON);
            if data.len() < want && self.input_end.is_none() {
                return self.need(want, RecordHeader::LEN + MAX_REASON);
            }
            let want = want.min(data.len());
            let reason = reason_text(&data[RecordHeader::LEN..want], header.length);
            self.answered = true;
            self.pending_consume = want;
            self.consume_pending();
            self.close(if header.tag == RecordTag::Busy {
                CloseReason::Busy(reason)
            } else {
                CloseReason::Refused(reason)
            });
            return self.events.pop_front();
        }
        let total = RecordHeader::LEN + header.length as usize;
        if data.len() < total {
            return self.need(total, RecordHeader::LEN + max);
        }
        let at = self.offset;
        if !recovery {
            // A record that skips ahead is believed once the next record's header follows on.
            let mut verdict = self.continuity.check(&header, None);
            if verdict == Verdict::NeedNext {
                let Some(after) = data.get(total..).filter(|after| after.len() >= RecordHeader::LEN) else {
                    return self.need(total + RecordHeader::LEN, 2 * RecordHeader::LEN + max);
                };
                match RecordHeader::parse(after, max) {
                    Ok(after) => verdict = self.continuity.check(&header, Some(&after)),
                    Err(error) => {
                        self.counts.bad_headers += 1;
                        let at = at + total as u64 + error.offset as u64;
                        self.close(CloseReason::BadHeader { at, error });
                        return self.events.pop_front();
                    }
                }
            }
            if let Verdict::Violation(violation) = verdict {
                self.counts.violations += 1;
                self.events.push_back(ConnectionEvent::Violation { violation, at });
                self.close(CloseReason::Violation { at, violation });
                return self.events.pop_front();
            }
        }
        self.answered = true;
        let payload_at = at + RecordHeader::LEN as u64;
        if let Some(asked) = self.resume_asked {
            // The first stream record says where the stream starts, whether FORMAT or DATA: a
            // publisher need not send FORMAT first, and a FORMAT later (a switch) names a later
            // frame than the one the resume started at.
            if matches!(header.tag, RecordTag::Format | RecordTag::Data) {
                self.resume_asked = None;
                self.events.push_back(ConnectionEvent::Resume { asked, offered: header.sequence });
            }
        }
        if header.tag == RecordTag::Data || header.tag == RecordTag::Snapshot {
            // Handed out whole at this call or, after the resume check, at the next.
            self.ready = Some((header, total, payload_at));
            return match self.events.pop_front() {
                Some(resume) => Some(resume),
                None => self.take_ready(),
            };
        }
        let payload = &self.buf.data()[RecordHeader::LEN..total];
        let event = match (header.tag, recovery) {
            (RecordTag::Format, false) => {
                ConnectionEvent::Format { format: header.format, first_sequence: header.sequence, at }
            }
            (RecordTag::End, false) => {
                let totals = Totals::parse(payload);
                if totals.is_err() {
                    self.counts.unreadable_totals += 1;
                }
                self.events.push_back(ConnectionEvent::End { next_sequence: header.sequence, totals, payload_at });
                self.pending_consume = total;
                self.consume_pending();
                self.close(CloseReason::End);
                return self.events.pop_front();
            }
            (RecordTag::Busy, true) => {
                let shown = &payload[..payload.len().min(MAX_REASON)];
                ConnectionEvent::Busy { first: header.sequence, reason: reason_text(shown, header.length) }
            }
            (RecordTag::Gone, true) => match parse_gone(payload) {
                Ok(count) => ConnectionEvent::Gone { first: header.sequence, count },
                Err(error) => {
                    let at = payload_at + error.offset as u64;
                    self.pending_consume = total;
                    self.consume_pending();
                    self.close(CloseReason::BadGone { at, error });
                    return self.events.pop_front();
                }
            },
            (tag, _) => {
                // Records of a recovery connection on the stream, echoes from a publisher, or
                // stream records on a recovery connection: their length keeps the framing.
                self.counts.out_of_place += 1;
                if tag == RecordTag::Echo {
                    self.counts.echoes_from_publisher += 1;
                }
                ConnectionEvent::OutOfPlace { tag, at }
            }
        };
        self.pending_consume = total;
        self.events.push_back(event);
        self.events.pop_front()
    }

    /// The `DATA` record checked and waiting to be handed out.
    fn take_ready(&mut self) -> Option<ConnectionEvent<'_>> {
        let (header, total, payload_at) = self.ready.take()?;
        self.pending_consume = total;
        let payload = &self.buf.data()[RecordHeader::LEN..total];
        // Raw frames are read byte by byte; other formats may read words in place (Cap'n Proto
        // does), so they get an aligned copy when a record before broke alignment.
        let payload = if header.format != Format::Raw && !(payload.as_ptr() as usize).is_multiple_of(8) {
            self.aligned.hold(payload)
        } else {
            payload
        };
        Some(match header.tag {
            RecordTag::Snapshot => ConnectionEvent::Snapshot { header, payload, payload_at },
            _ => ConnectionEvent::Data { header, payload, payload_at },
        })
    }
}

/// Whether a record ends the connection with a reason: a `REFUSE`, or a `BUSY` on a stream (on
/// a recovery connection a `BUSY` answers one request, and the connection goes on).
fn ends_with_reason(header: &RecordHeader, recovery: bool) -> bool {
    header.tag == RecordTag::Refuse || (header.tag == RecordTag::Busy && !recovery)
}

/// A `REFUSE` or `BUSY` reason as it is kept and printed: the bytes read of it (at most
/// [`MAX_REASON`]) escaped, and how long it was when the record declared more.
fn reason_text(read: &[u8], declared: u32) -> String {
    let text = mdrelay_iex::peer_text::from_bytes(read);
    if read.len() < declared as usize { format!("{text} [the first {} of {declared} bytes]", read.len()) } else { text }
}

/// The text each program gives for a connection that ended for `reason`.
fn describe(config: &ConnectionConfig, reason: &CloseReason) -> String {
    use CloseReason as R;
    let (role, peer) = (&config.role, config.peer);
    let timeout = shown(config.handshake_timeout_ns);
    match (role, reason) {
        (_, R::End) => "end of stream".to_string(),
        (_, R::Violation { at, violation }) => match role {
            // The subscriber logs the violation itself and gives the place as the reason.
            Role::Subscriber => format!("protocol violation at stream byte {at}"),
            _ => format!("protocol violation at stream byte {at}: {violation}"),
        },
        (_, R::FrameCheck { sequence, at, error }) => {
            format!("frame {sequence} at stream byte {at} failed its check: {error}")
        }
        (_, R::BadGone { at, error }) => format!("bad GONE record from {peer} at byte {at}: {}", error.what),
        (Role::Subscriber, reason) => match reason {
            R::NotAPublisher(e) => format!("{peer} is not an mdrelay publisher: {e}"),
            R::Version(v) => format!("publisher {peer}: {v}"),
            R::ProtectionMismatch { theirs, ours } => format!(
                "publisher {peer} protects its frames with {theirs} and this subscriber expects {ours}: configure the same [protection] (crc, key_file) on both"
            ),
            R::WrongKey => format!(
                "publisher {peer} encrypts with another key than protection.key_file: give both the same key file"
            ),
            R::Refused(r) => format!("publisher {peer} refused the subscription: {r}"),
            R::Busy(r) => format!("the publisher is busy: {r}"),
            R::HandshakeTimeout { .. } => format!("no greeting within {timeout:?}"),
            R::AnswerNotTaken => "the publisher does not read the subscription".to_string(),
            R::ClosedInGreeting { received } => format!("closed after {received} bytes of the greeting"),
            R::Closed { inside_record: None } | R::Quiet => {
                "the publisher closed the connection without an end of stream".to_string()
            }
            R::Closed { inside_record: Some(at) } => {
                format!("the publisher closed the connection inside a record at stream byte {at}")
            }
            R::BadHeader { at, error } => format!("bad record header at stream byte {at}: {}", error.what),
            R::ReadFailed { error, in_greeting: true, .. } => format!("reading the greeting: {error}"),
            R::ReadFailed { at, error, .. } => format!("reading at stream byte {at}: {error}"),
            R::WriteFailed { error, in_handshake: true } => format!("sending the subscription: {error}"),
            R::WriteFailed { error, .. } => format!("sending echoes: {error}"),
            other => generic(peer, config, other),
        },
        (Role::Relay { connect }, reason) => match reason {
            R::NotAPublisher(e) => format!("upstream {connect} ({peer}) is not an mdrelay publisher: {e}"),
            R::Version(v) => format!("upstream {connect} ({peer}): {v}"),
            R::Encrypted(p) => format!(
                "upstream {connect} ({peer}) encrypts its frames ({p}); a relay cannot take an encrypted upstream (docs/chaining.md): encrypt between the last relay and its subscribers, and protect the links to relays with `crc`"
            ),
            R::ProtectionMismatch { theirs, ours } => format!(
                "upstream {connect} ({peer}) protects its frames with {theirs} and source.upstream.crc = {} expects {ours}: set source.upstream.crc = {} to match the upstream's [protection] crc",
                ours.crc, theirs.crc
            ),
            R::Restarted { old, new } => format!(
                "upstream {connect} ({peer}) restarted: its session {old:#x} is now {new:#x}; this relay's frames carry the first session's numbers and cannot follow a new numbering (restart the relay)"
            ),
            R::Refused(r) => format!("upstream {connect} ({peer}) refused this relay: {r}"),
            R::Busy(r) => format!("the upstream is busy: {r}"),
            R::HandshakeTimeout { received } => format!(
                "{peer} sent {received} of the {} greeting bytes within {timeout:?} (source.upstream.handshake_timeout)",
                Hello::LEN
            ),
            R::AnswerNotTaken => format!(
                "sending the subscription to {peer}: not taken within {timeout:?} (source.upstream.handshake_timeout)"
            ),
            R::IdleTimeout => format!(
                "nothing received for {:?} (source.upstream.idle_timeout)",
                shown(config.idle_timeout_ns.unwrap_or(0))
            ),
            R::ClosedInGreeting { received } => {
                format!("{peer} closed the connection after {received} bytes of the greeting")
            }
            R::Closed { inside_record: None } | R::Quiet => {
                "the upstream closed the connection without an end of stream".to_string()
            }
            R::Closed { inside_record: Some(at) } => {
                format!("the upstream closed the connection inside a record at stream byte {at}")
            }
            R::BadHeader { at, error } => format!("bad record header at stream byte {at}: {}", error.what),
            R::ReadFailed { error, in_greeting: true, .. } => format!("reading the greeting of {peer}: {error}"),
            R::ReadFailed { at, error, .. } => format!("reading at stream byte {at}: {error}"),
            R::WriteFailed { error, .. } => format!("sending the subscription to {peer}: {error}"),
            other => generic(peer, config, other),
        },
        (Role::Recovery, reason) => match reason {
            R::NotAPublisher(e) => {
                format!("{peer} is not an mdrelay retransmission service: {e} (check the recovery setting)")
            }
            R::Version(v) => format!("retransmission service {peer}: {v}"),
            R::NoRetransmission { version } => {
                format!("{peer} speaks relay protocol version {version}, which has no retransmission service")
            }
            R::ProtectionMismatch { theirs, ours } => format!(
                "{peer} protects its frames with {theirs} and this subscriber expects {ours}: configure the same [protection] on both"
            ),
            R::Refused(r) => format!("{peer} refused the recovery connection: {r}"),
            R::Busy(r) => format!("{peer} is busy: {r}"),
            R::HandshakeTimeout { .. } => format!("{peer} sent no greeting within {timeout:?}"),
            R::AnswerNotTaken => format!("{peer} does not read the subscription"),
            R::ClosedInGreeting { received } => format!("{peer} closed after {received} bytes of the greeting"),
            R::Closed { inside_record: None } => format!("{peer} closed the connection"),
            R::Closed { inside_record: Some(at) } => {
                format!("{peer} closed the connection inside a record at byte {at}")
            }
            R::Quiet => format!("{peer} closed an idle connection"),
            R::BadHeader { at, error } => format!("bad record header from {peer} at byte {at}: {}", error.what),
            R::ReadFailed { at, error, in_greeting: true } => {
                format!("reading the greeting of {peer} at byte {at}: {error}")
            }
            R::ReadFailed { at, error, .. } => format!("reading from {peer} at byte {at}: {error}"),
            R::WriteFailed { error, in_handshake: true } => format!("sending the subscription to {peer}: {error}"),
            R::WriteFailed { error, .. } => format!("sending requests to {peer}: {error}"),
            other => generic(peer, config, other),
        },
    }
}

/// Reasons a role never meets (a key check on a relay, say), worded plainly.
fn generic(peer: SocketAddr, config: &ConnectionConfig, reason: &CloseReason) -> String {
    match reason {
        CloseReason::WrongKey => format!("{peer} encrypts with another key"),
        CloseReason::Encrypted(p) => format!("{peer} encrypts its frames ({p})"),
        CloseReason::NoRetransmission { version } => format!("{peer} speaks relay protocol version {version}"),
        CloseReason::Restarted { old, new } => format!("{peer} restarted: its session {old:#x} is now {new:#x}"),
        CloseReason::IdleTimeout => {
            format!("nothing received from {peer} for {:?}", shown(config.idle_timeout_ns.unwrap_or(0)))
        }
        other => format!("{peer}: {other:?}"),
    }
}

#[cfg(test)]
#[path = "connection_tests.rs"]
mod tests;
