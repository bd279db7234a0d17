//! The UDP and multicast side of a subscriber ([`DatagramReceiver`], ported from the
//! subscriber's datagram loop and its recovery client): datagrams in (which line, bytes, when),
//! frames out to a visitor, and the decisions around them.
//!
//! - **Protection first.** A protected datagram is opened before its header is believed: a
//!   sender without the key cannot move the stream's accounting.
//! - **Held datagrams.** A datagram of another session, or far outside the window, is held
//!   until the next one confirms or refutes it ([`crate::relay::SessionTracker::datagram`]).
//! - **END.** Taken only from the stream's session and within reach of what was seen; after it
//!   the receiver waits for what is still on its way: the other line's `END` (up to
//!   [`AB_END_GRACE`]) and, with recovery, the frames still missing (up to the linger).
//! - **A/B lines** ([`Lines`]) and **the recovery book** ([`RecoveryBook`]) through the frame
//!   reader.
//! - **Recovery.** Gaps due are asked for on a timer (twice per delay or retry, every 1 to
//!   10 ms), over a connection to the retransmission service made when there is something to
//!   ask: the driver is told when to connect ([`DatagramReceiver::recovery_action`]) and moves
//!   the connection's bytes; its answers go through the same reader, marked recovered. A lost
//!   connection is made again after a wait that doubles from 50 ms to 1 s (starting over once
//!   the service answered), a `BUSY` instead of a greeting is counted, a `REFUSE` turns recovery
//!   off.
//!
//! - **Recovery from a store** ([`DatagramReceiver::with_store_recovery`]): where the datagrams
//!   are also kept by the transport (a JetStream stream), the same requests are handed to the
//!   driver ([`DatagramReceiver::next_store_request`]) instead of a retransmission service; it
//!   reads the datagrams from the store ([`super::store::StoreSearch`] finds them) and hands
//!   them back ([`DatagramReceiver::store_datagram`]), marked recovered, or says they are gone
//!   ([`DatagramReceiver::store_gone`]).
//!
//! Nothing here knows the transport: a datagram is bytes and the line it came on, so another
//! source of the same datagrams (a message bus) reuses the receiver unchanged.

use super::book::{MAX_REQUESTS_PER_TICK, RecoveryBook, policy};
use super::connection::{CloseReason, ConnectionConfig, ConnectionEvent, Disposition, StreamConnection};
use super::frames::{FrameReader, FrameVisitor, Origin, Payload, Place, ReaderConfig, ReaderMode};
use super::lines::{Line, Lines};
use crate::backoff::{Backoff, duration_ns};
use crate::codec::Format;
use crate::relay::protect::Protection;
use crate::relay::session::Admission;
use crate::relay::wire::{
    DATAGRAM_VERSION, DatagramHeader, DatagramKind, Echo, RecordTag, RelayError, RetransmitRequest, Totals,
};
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// A/B: how long after one line's `END` the other line's is waited for (its last frames are
/// still on their way over a slower network; a line that is down never sends it).
pub const AB_END_GRACE: Duration = Duration::from_secs(1);
/// The longest time between looks at the gaps: each look asks at most
/// [`MAX_REQUESTS_PER_TICK`] requests, so this also sets how many go out per second when many
/// frames are missing at once.
pub const MAX_ASK_PERIOD: Duration = Duration::from_millis(10);
/// Requests waiting for the recovery connection (while it is being made, or its socket is full).
pub const ASK_QUEUE: usize = 1024;
/// First wait before connecting to the retransmission service again; it doubles up to
/// [`RECOVERY_MAX_BACKOFF`].
pub const RECOVERY_INITIAL_BACKOFF: Duration = Duration::from_millis(50);
/// Longest wait between connections to the retransmission service: missing frames are worth
/// little after a second.
pub const RECOVERY_MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Bytes of an `ECHO` datagram.
pub const ECHO_DATAGRAM: usize = DatagramHeader::LEN + Echo::LEN;

/// How often the gaps are looked at: twice per delay or retry, whichever is shorter, so a
/// request goes out at most half of it late; at least every millisecond, at most every
/// [`MAX_ASK_PERIOD`].
pub fn ask_period(delay: Duration, retry: Duration) -> Duration {
    (delay.min(retry) / 2).clamp(Duration::from_millis(1), MAX_ASK_PERIOD)
}

/// Loss recovery's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// Wait this long after a gap is seen before asking.
    pub delay: Duration,
    /// Ask again after this long without an answer.
    pub retry: Duration,
    /// Requests per gap before it is given up.
    pub attempts: u32,
    /// After the `END`, wait this long at most for the frames still missing.
    pub linger: Duration,
}

/// How a datagram receiver is set up.
#[derive(Clone, Debug, Default)]
pub struct DatagramConfig {
    /// Protection, symbol filter and echoes (the mode is always the subscriber's window).
    pub reader: ReaderConfig,
    /// Every frame of the session is owed: frames lost before the first received count (and,
    /// with recovery, are asked for).
    pub from_start: bool,
    /// Two A/B lines, by the names of where they are received (for the report).
    pub lines: Option<(String, String)>,
    /// Loss recovery from the retransmission service.
    pub recovery: Option<RecoveryConfig>,
}

/// What the driver does for the recovery connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryAction {
    /// Connect to the retransmission service now, then call
    /// [`DatagramReceiver::recovery_connected`] (or [`DatagramReceiver::recovery_connect_failed`]).
    Connect,
}

/// Something that happened, for the program to log or act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatagramEvent {
    /// The stream's first session.
    SessionStarted {
        /// The session.
        session: u64,
        /// Who sent the datagram that set it.
        peer: SocketAddr,
    },
    /// A confirmed restart: sequence tracking starts over.
    Restarted {
        /// The session before.
        old: u64,
        /// The new one.
        new: u64,
        /// Who sent it.
        peer: SocketAddr,
    },
    /// A datagram out of line with the stream (session or sequence), held until the next one
    /// confirms it.
    Held {
        /// Its session.
        session: u64,
        /// Its first frame.
        sequence: u64,
        /// Who sent it.
        peer: SocketAddr,
    },
    /// Not a relay datagram (skipped, counted invalid).
    NotRelay {
        /// Who sent it.
        peer: SocketAddr,
        /// Its length.
        len: usize,
        /// Its first bytes (up to 8).
        head: Vec<u8>,
    },
    /// A relay header that cannot be read (skipped, counted invalid).
    BadHeader {
        /// Who sent it.
        peer: SocketAddr,
        /// Its length.
        len: usize,
        /// What was wrong, and where.
        error: RelayError,
    },
    /// Refused by the protection check (counted by reason).
    Refused {
        /// Who sent it.
        peer: SocketAddr,
        /// Its session.
        session: u64,
        /// Its sequence.
        sequence: u64,
        /// Why.
        why: String,
    },
    /// An `END` whose totals cannot be read: skipped (the publisher repeats it).
    UnreadableEnd {
        /// Who sent it.
        peer: SocketAddr,
        /// The datagram byte where the totals go wrong.
        at: usize,
        /// What was wrong.
        error: RelayError,
    },
    /// An `END` that does not fit the stream (another session, or out of reach): ignored.
    ForeignEnd {
        /// Who sent it.
        peer: SocketAddr,
        /// Its session.
        session: u64,
        /// The next sequence it names.
        next_sequence: u64,
    },
    /// An `ECHO` datagram (subscribers send them, not receive them): ignored.
    EchoIgnored {
        /// Who sent it.
        peer: SocketAddr,
    },
    /// The publisher's `END`, taken.
    End {
        /// Who sent it.
        peer: SocketAddr,
        /// The number the next frame would have had: every frame below it was sent.
        next_sequence: u64,
        /// Its totals.
        totals: Totals,
        /// The first `END` taken (a publisher sends it three times, and each line).
        first: bool,
    },
    /// The end of stream came and something is still on its way: waiting up to `wait` ns.
    Ending {
        /// Frames still missing.
        missing: u64,
        /// How long, ns.
        wait: i64,
    },
    /// The wait after the end ran out: `lines_without_end` says a line never sent its END,
    /// `given_up` the frames still missing, now given up.
    EndWaitOver {
        /// A line's END never came.
        lines_without_end: bool,
        /// Frames given up.
        given_up: u64,
    },
    /// The stream is over (its end, after the waits).
    Finished,
    /// A connection to the retransmission service was set up; it serves `session`.
    RecoveryConnected {
        /// The service.
        peer: SocketAddr,
        /// The session it serves.
        session: u64,
        /// The stream's session, when it differs (its gaps cannot be recovered from this one).
        stream: Option<u64>,
    },
    /// The service no longer holds these frames: unrecoverable.
    RecoveryGone {
        /// The first.
        first: u64,
        /// How many.
        count: u64,
    },
    /// The service was busy (over its rate limit, or full): asked again later.
    RecoveryBusy {
        /// The request's first frame (0: made to leave for another client).
        first: u64,
    },
    /// A record a retransmission service does not send: skipped.
    RecoveryOutOfPlace {
        /// Its tag.
        tag: RecordTag,
        /// Where it starts.
        at: u64,
    },
    /// The recovery connection ended; another is made for the next request after `retry_in` ns.
    RecoveryLost {
        /// Why, naming the service.
        why: String,
        /// The wait.
        retry_in: i64,
        /// The service closed an idle connection: nothing was lost.
        quiet: bool,
    },
    /// Recovery is off: the service refused (or cannot serve) this subscriber.
    RecoveryRefused {
        /// Why.
        why: String,
    },
}

/// What the receiver counted (the frame reader counts the rest).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatagramCounts {
    /// Datagrams received.
    pub datagrams: u64,
    /// Bytes received, relay headers included.
    pub bytes: u64,
    /// Datagrams refused before any frame was read: not relay datagrams, bad headers, `END`s
    /// that cannot be read or do not fit.
    pub invalid_packets: u64,
}

/// A datagram held until the next one confirms or refutes it.
#[derive(Debug)]
struct Held {
    bytes: Vec<u8>,
    receive_time: i64,
    origin: Origin,
}

/// A request for the recovery connection, of the stream's `session`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ask {
    session: u64,
    request: RetransmitRequest,
}

/// Where the recovery connection is.
#[derive(Debug)]
enum LinkState {
    /// Connect when there is something to ask.
    Idle,
    /// Waiting until then before connecting again.
    Waiting(i64),
    /// The driver is connecting.
    Connecting,
    /// Connected; the service's session once it greeted.
    Connected { conn: Box<StreamConnection>, serves: Option<u64> },
    /// Recovery is off.
    Off,
}

/// The connection to the retransmission service, made when there is something to ask.
#[derive(Debug)]
struct RecoveryLink {
    protection: Protection,
    state: LinkState,
    /// The request that made the connection be made.
    pending: Option<Ask>,
    /// Requests waiting for room.
    queue: VecDeque<Ask>,
    backoff: Backoff,
    receive_time: i64,
}

impl RecoveryLink {
    /// Takes a request; false when no more can wait.
    fn ask(&mut self, ask: Ask) -> bool {
        match &mut self.state {
            LinkState::Off => false,
            LinkState::Connected { conn, serves: Some(_) } if self.queue.is_empty() && conn.has_room_for_requests() => {
                self.queue.push_back(ask);
                true
            }
            LinkState::Idle if self.pending.is_none() => {
                self.pending = Some(ask);
                true
            }
            _ if self.queue.len() < ASK_QUEUE => {
                self.queue.push_back(ask);
                true
            }
            _ => false,
        }
    }
}

/// Datagrams in, frames out: see the module's documentation.
#[derive(Debug)]
pub struct DatagramReceiver {
    reader: FrameReader,
    held: Option<Held>,
    /// The lines whose END has come (one line: B never comes, and need not).
    ended: [bool; 2],
    /// After the first END: when to stop at the latest, frames still missing or not.
    ending: Option<i64>,
    linger_ns: i64,
    ask_period_ns: i64,
    last_ask: Option<i64>,
    link: Option<RecoveryLink>,
    /// Recovery from a store: the requests waiting for the driver, of the stream's session.
    store: Option<VecDeque<(u64, RetransmitRequest)>>,
    publisher_totals: Option<Totals>,
    events: VecDeque<DatagramEvent>,
    /// The sender of the last datagram: where its echoes go.
    last_peer: Option<SocketAddr>,
    /// The driver's time at its last call, ns.
    now: i64,
    finished: bool,
    counts: DatagramCounts,
}

impl DatagramReceiver {
    /// A receiver set up by `config`.
    pub fn new(config: DatagramConfig) -> DatagramReceiver {
        let mut reader = FrameReader::new(ReaderConfig { mode: ReaderMode::Window, ..config.reader.clone() });
        let two = config.lines.is_some();
        if let Some((a, b)) = config.lines {
            let mut lines = Lines::new(a, b);
            if config.from_start {
                lines.expect_from(1);
            }
            reader = reader.with_lines(lines);
        }
        if let Some(r) = &config.recovery {
            reader = reader.with_recovery(RecoveryBook::new(policy(r.delay, r.retry, r.attempts)));
        }
        // Over UDP, from the start means every frame of the session is owed, so frames lost
        // before the first received count (and, with recovery, are asked for).
        if config.from_start {
            reader.tracker_mut().expect_from(1);
            if let Some(book) = reader.book_mut() {
                book.expect_from(1);
            }
        }
        let protection = Protection { crc: config.reader.crc, encrypted: config.reader.key.is_some() };
        DatagramReceiver {
            reader,
            held: None,
            ended: [false, !two],
            ending: None,
            linger_ns: config.recovery.as_ref().map_or(0, |r| duration_ns(r.linger)),
            ask_period_ns: duration_ns(
                config.recovery.as_ref().map_or(MAX_ASK_PERIOD, |r| ask_period(r.delay, r.retry)),
            ),
            last_ask: None,
            link: config.recovery.as_ref().map(|_| RecoveryLink {
                protection,
                state: LinkState::Idle,
                pending: None,
                queue: VecDeque::new(),
                backoff: Backoff::new(duration_ns(RECOVERY_INITIAL_BACKOFF), duration_ns(RECOVERY_MAX_BACKOFF)),
                receive_time: 0,
            }),
            store: None,
            publisher_totals: None,
            events: VecDeque::new(),
            last_peer: None,
            now: 0,
            finished: false,
            counts: DatagramCounts::default(),
        }
    }

    /// Recovery asks the driver, which reads the datagrams from a store that keeps them (a
    /// JetStream stream), instead of a retransmission service: see the module's documentation.
    /// Needs a [`RecoveryConfig`] (when and how often to ask, the linger).
    pub fn with_store_recovery(mut self) -> DatagramReceiver {
        if self.link.take().is_some() {
            self.store = Some(VecDeque::new());
        }
        self
    }

    /// The next range to read from the store: the stream's session, and the frames.
    pub fn next_store_request(&mut self) -> Option<(u64, RetransmitRequest)> {
        self.store.as_mut()?.pop_front()
    }

    /// A datagram read from the store, at `now` and `receive_time`: opened as a datagram from
    /// the lines is, and its frames taken only where they are missing (as retransmitted ones).
    pub fn store_datagram<V: FrameVisitor + ?Sized>(
        &mut self,
        bytes: &[u8],
        now: i64,
        receive_time: i64,
        visitor: &mut V,
    ) {
        self.now = now;
        if self.finished || self.store.is_none() {
            return;
        }
        self.counts.bytes += bytes.len() as u64;
        let Ok(header) = DatagramHeader::parse(bytes) else { return };
        match self.reader.take_unsealer() {
            Some(mut unsealer) => {
                if let Ok(plain) = unsealer.datagram(bytes, &header, self.reader.tracker().session()) {
                    self.stored_plain(plain, now, receive_time, visitor);
                }
                self.reader.put_unsealer(unsealer);
            }
            None => self.stored_plain(bytes, now, receive_time, visitor),
        }
        self.check_finished();
    }

    /// A plain datagram from the store: its frames of the stream's session, as recovered.
    fn stored_plain<V: FrameVisitor + ?Sized>(&mut self, d: &[u8], now: i64, receive_time: i64, visitor: &mut V) {
        let Ok(header) = DatagramHeader::parse(d) else { return };
        if header.kind != DatagramKind::Data {
            return;
        }
        let Some(session) = self.reader.tracker().session() else { return };
        if header.session != session {
            if let Some(book) = self.reader.book_mut() {
                book.not_taken(u64::from(header.frame_count));
            }
            return;
        }
        self.reader.payload(
            Payload {
                origin: Origin::Recovered,
                format: header.format,
                bytes: &d[DatagramHeader::LEN..],
                first_sequence: header.sequence,
                declared_frames: u64::from(header.frame_count),
                session,
                receive_time,
                now,
                place: Place::Datagram(DatagramHeader::LEN as u64),
            },
            visitor,
        );
    }

    /// The store no longer holds frames `first..first + count` of `session` (or never did):
    /// given up.
    pub fn store_gone(&mut self, session: u64, first: u64, count: u64) {
        if self.store.is_none() || self.reader.tracker().session() != Some(session) {
            return;
        }
        if let Some(book) = self.reader.book_mut() {
            book.gone(first, count);
            self.events.push_back(DatagramEvent::RecoveryGone { first, count });
        }
        self.check_finished();
    }

    /// The frame reader: its counts, tracker, lines and book.
    pub fn reader(&self) -> &FrameReader {
        &self.reader
    }

    /// The frame reader, to finish the run.
    pub fn reader_mut(&mut self) -> &mut FrameReader {
        &mut self.reader
    }

    /// What the receiver counted.
    pub fn counts(&self) -> DatagramCounts {
        self.counts
    }

    /// The publisher's totals, from its `END`.
    pub fn publisher_totals(&self) -> Option<&Totals> {
        self.publisher_totals.as_ref()
    }

    /// Whether the stream is over.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether recovery is on (configured, and not refused).
    pub fn recovering(&self) -> bool {
        self.store.is_some() || self.link.as_ref().is_some_and(|l| !matches!(l.state, LinkState::Off))
    }

    /// The next event, handing the frames of the retransmission service's answers to `visitor`.
    pub fn poll_event<V: FrameVisitor + ?Sized>(&mut self, visitor: &mut V) -> Option<DatagramEvent> {
        loop {
            if let Some(event) = self.events.pop_front() {
                return Some(event);
            }
            if !self.pump_recovery(visitor) {
                self.check_finished();
                return self.events.pop_front();
            }
        }
    }

    /// Takes one datagram that came on `origin`'s line from `peer`, at `now` (monotonic) and
    /// `receive_time` (the wall clock, ns since the epoch); its frames go to `visitor`.
    pub fn datagram<V: FrameVisitor + ?Sized>(
        &mut self,
        origin: Origin,
        bytes: &[u8],
        peer: SocketAddr,
        now: i64,
        receive_time: i64,
        visitor: &mut V,
    ) {
        self.now = now;
        if self.finished {
            return;
        }
        self.counts.datagrams += 1;
        self.last_peer = Some(peer);
        if let (Some(lines), Origin::Line(line)) = (self.reader.lines_mut(), origin) {
            lines.datagram(line);
        }
        let ended = match self.reader.take_unsealer() {
            // Its protection is checked, and its frames opened, before its header is believed.
            Some(mut unsealer) => {
                let ended = match DatagramHeader::parse(bytes) {
                    Ok(header) => match unsealer.datagram(bytes, &header, self.reader.tracker().session()) {
                        Ok(plain) => self.plain_datagram(plain, peer, now, receive_time, origin, visitor),
                        Err(why) => {
                            self.counts.bytes += bytes.len() as u64;
                            self.events.push_back(DatagramEvent::Refused {
                                peer,
                                session: header.session,
                                sequence: header.sequence,
                                why,
                            });
                            false
                        }
                    },
                    // Not a relay datagram, or a bad header: counted as such.
                    Err(_) => self.plain_datagram(bytes, peer, now, receive_time, origin, visitor),
                };
                self.reader.put_unsealer(unsealer);
                ended
            }
            None => self.plain_datagram(bytes, peer, now, receive_time, origin, visitor),
        };
        if ended {
            let line = match origin {
                Origin::Line(Line::B) => 1,
                _ => 0,
            };
            self.ended[line] = true;
            if self.ended == [true, true] && self.reader.missing() == 0 {
                self.finish();
            } else if self.ending.is_none() {
                // The other line's last frames may still be on their way, and with recovery the
                // frames still missing: wait for them, for a while.
                let missing = self.reader.missing();
                let mut grace = if missing > 0 { self.linger_ns } else { 0 };
                if self.ended != [true, true] {
                    grace = grace.max(duration_ns(AB_END_GRACE));
                }
                if grace > 0 {
                    self.events.push_back(DatagramEvent::Ending { missing, wait: grace });
                }
                self.ending = Some(now.saturating_add(grace));
            }
        }
        self.check_finished();
    }

    fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            self.events.push_back(DatagramEvent::Finished);
        }
    }

    /// The stream is over once its end came on every line and nothing is missing any more.
    fn check_finished(&mut self) {
        if self.ending.is_some() && self.ended == [true, true] && self.reader.missing() == 0 {
            self.finish();
        }
    }

    /// Takes one datagram whose frames are plain; true for an `END` of the stream.
    fn plain_datagram<V: FrameVisitor + ?Sized>(
        &mut self,
        d: &[u8],
        peer: SocketAddr,
        now: i64,
        receive_time: i64,
        origin: Origin,
        visitor: &mut V,
    ) -> bool {
        self.counts.bytes += d.len() as u64;
        if !DatagramHeader::is_relay_datagram(d) {
            self.counts.invalid_packets += 1;
            self.events.push_back(DatagramEvent::NotRelay { peer, len: d.len(), head: d[..d.len().min(8)].to_vec() });
            return false;
        }
        let header = match DatagramHeader::parse(d) {
            Ok(h) => h,
            Err(error) => {
                self.counts.invalid_packets += 1;
                self.events.push_back(DatagramEvent::BadHeader { peer, len: d.len(), error });
                return false;
            }
        };
        let before = self.reader.tracker().session();
        match header.kind {
            DatagramKind::Data => {
                let admission =
                    self.reader.tracker_mut().datagram(header.session, header.sequence, u64::from(header.frame_count));
                self.note_session(before, peer);
                match admission {
                    Admission::Take => {
                        self.held = None;
                        self.take(d, &header, receive_time, now, origin, visitor);
                    }
                    Admission::TakeHeldThenThis => {
                        self.take_held(now, visitor);
                        self.take(d, &header, receive_time, now, origin, visitor);
                    }
                    Admission::Hold => {
                        self.events.push_back(DatagramEvent::Held {
                            session: header.session,
                            sequence: header.sequence,
                            peer,
                        });
                        self.held = Some(Held { bytes: d.to_vec(), receive_time, origin });
                    }
                    Admission::Ignore => {}
                }
                false
            }
            DatagramKind::End => {
                let totals = match Totals::parse(&d[DatagramHeader::LEN..]) {
                    Ok(t) => t,
                    Err(error) => {
                        // The publisher repeats its END: wait for a readable one.
                        self.counts.invalid_packets += 1;
                        let at = DatagramHeader::LEN + error.offset;
                        self.events.push_back(DatagramEvent::UnreadableEnd { peer, at, error });
                        return false;
                    }
                };
                match self.reader.tracker_mut().end_datagram(header.session, header.sequence) {
                    Admission::Take | Admission::Hold => {}
                    Admission::TakeHeldThenThis => {
                        self.note_session(before, peer);
                        self.take_held(now, visitor);
                    }
                    Admission::Ignore => {
                        self.counts.invalid_packets += 1;
                        self.events.push_back(DatagramEvent::ForeignEnd {
                            peer,
                            session: header.session,
                            next_sequence: header.sequence,
                        });
                        return false;
                    }
                }
                self.reader.stream_ended(header.sequence, now);
                let first = self.publisher_totals.is_none();
                self.events.push_back(DatagramEvent::End {
                    peer,
                    next_sequence: header.sequence,
                    totals: totals.clone(),
                    first,
                });
                self.publisher_totals = Some(totals);
                true
            }
            DatagramKind::Echo => {
                self.events.push_back(DatagramEvent::EchoIgnored { peer });
                false
            }
        }
    }

    /// Notes the stream's first session and each confirmed restart.
    fn note_session(&mut self, before: Option<u64>, peer: SocketAddr) {
        match (before, self.reader.tracker().session()) {
            (None, Some(session)) => self.events.push_back(DatagramEvent::SessionStarted { session, peer }),
            (Some(old), Some(new)) if old != new => self.events.push_back(DatagramEvent::Restarted { old, new, peer }),
            _ => {}
        }
    }

    /// Takes the held datagram, which the one after it confirmed.
    fn take_held<V: FrameVisitor + ?Sized>(&mut self, now: i64, visitor: &mut V) {
        if let Some(h) = self.held.take()
            && let Ok(header) = DatagramHeader::parse(&h.bytes)
        {
            self.take(&h.bytes, &header, h.receive_time, now, h.origin, visitor);
        }
    }

    /// Decodes a data datagram's frames.
    fn take<V: FrameVisitor + ?Sized>(
        &mut self,
        d: &[u8],
        header: &DatagramHeader,
        receive_time: i64,
        now: i64,
        origin: Origin,
        visitor: &mut V,
    ) {
        self.reader.payload(
            Payload {
                origin,
                format: header.format,
                bytes: &d[DatagramHeader::LEN..],
                first_sequence: header.sequence,
                declared_frames: u64::from(header.frame_count),
                session: header.session,
                receive_time,
                now,
                place: Place::Datagram(DatagramHeader::LEN as u64),
            },
            visitor,
        );
    }

    /// The next `ECHO` datagram to send back to the sender of the last datagram (round-trip
    /// mode).
    pub fn next_echo(&mut self) -> Option<[u8; ECHO_DATAGRAM]> {
        let echo = self.reader.next_echo()?;
        let header = DatagramHeader {
            version: DATAGRAM_VERSION,
            format: self.reader.current_format().unwrap_or(Format::Raw),
            kind: DatagramKind::Echo,
            frame_count: 0,
            protection: Protection::NONE,
            session: self.reader.tracker().session().unwrap_or(0),
            sequence: echo.sequence,
        };
        let mut bytes = [0u8; ECHO_DATAGRAM];
        bytes[..DatagramHeader::LEN].copy_from_slice(&header.to_bytes());
        bytes[DatagramHeader::LEN..].copy_from_slice(&echo.to_bytes());
        Some(bytes)
    }

    /// Where the last datagram came from (its echoes go there).
    pub fn last_peer(&self) -> Option<SocketAddr> {
        self.last_peer
    }

    /// When [`DatagramReceiver::on_timeout`] is due, if ever.
    pub fn deadline(&self) -> Option<i64> {
        if self.finished {
            return None;
        }
        let mut deadline = self.ending;
        let mut at = |t: i64| deadline = Some(deadline.map_or(t, |d| d.min(t)));
        if self.store.is_some() && self.reader.missing() > 0 {
            at(self.last_ask.map_or(self.now, |last| last.saturating_add(self.ask_period_ns)));
        }
        if let Some(link) = &self.link {
            if self.reader.missing() > 0 && !matches!(link.state, LinkState::Off) {
                // Due at once when the gaps were never looked at.
                at(self.last_ask.map_or(self.now, |last| last.saturating_add(self.ask_period_ns)));
            }
            match &link.state {
                LinkState::Waiting(until) => at(*until),
                LinkState::Connected { conn, .. } => {
                    if let Some(d) = conn.deadline() {
                        at(d)
                    }
                }
                _ => {}
            }
        }
        deadline
    }

    /// Time passed: gaps due are asked for, the recovery connection's handshake time and the
    /// wait after the end are looked at.
    pub fn on_timeout(&mut self, now: i64) {
        self.now = now;
        if self.finished {
            return;
        }
        if let Some(link) = &mut self.link {
            match &mut link.state {
                LinkState::Connected { conn, .. } => conn.on_timeout(now),
                LinkState::Waiting(until) if now >= *until => link.state = LinkState::Idle,
                _ => {}
            }
        }
        if self.reader.missing() > 0
            && self.recovering()
            && self.last_ask.is_none_or(|last| now.saturating_sub(last) >= self.ask_period_ns)
        {
            self.last_ask = Some(now);
            self.ask(now);
        }
        if let Some(ending) = self.ending
            && now >= ending
        {
            let lines_without_end = self.ended != [true, true];
            let given_up = self.reader.book_mut().map_or(0, |b| b.give_up_all());
            self.events.push_back(DatagramEvent::EndWaitOver { lines_without_end, given_up });
            self.finish();
        }
    }

    /// Asks for the frames due (those that do not fit the queue are asked again at their retry).
    fn ask(&mut self, now: i64) {
        let Some(session) = self.reader.tracker().session() else { return };
        if let Some(store) = &mut self.store {
            let Some(book) = self.reader.book_mut() else { return };
            for request in book.due(now, MAX_REQUESTS_PER_TICK) {
                if store.len() < ASK_QUEUE {
                    store.push_back((session, request));
                } else {
                    book.deferred();
                }
            }
            return;
        }
        let Some(link) = &mut self.link else { return };
        let Some(book) = self.reader.book_mut() else { return };
        for request in book.due(now, MAX_REQUESTS_PER_TICK) {
            if !link.ask(Ask { session, request }) {
                book.deferred();
            }
        }
        self.feed_link();
    }

    /// Moves waiting requests to the connection while it has room; a request of another session
    /// than the service's is answered at once (it cannot have those frames).
    fn feed_link(&mut self) {
        let stream = self.reader.tracker().session();
        let Some(link) = &mut self.link else { return };
        let LinkState::Connected { conn, serves: Some(serves) } = &mut link.state else { return };
        let serves = *serves;
        let mut other = Vec::new();
        if let Some(ask) = link.pending.take() {
            // The request that made the connection goes first, room or not.
            if ask.session != serves {
                other.push(ask);
            } else {
                conn.queue_request_unbounded(ask.request);
            }
        }
        while conn.has_room_for_requests() {
            let Some(ask) = link.queue.pop_front() else { break };
            if ask.session != serves {
                other.push(ask);
            } else {
                conn.queue_request(ask.request);
            }
        }
        for ask in other {
            if stream == Some(ask.session)
                && let Some(book) = self.reader.book_mut()
            {
                book.other_session(ask.request.first, u64::from(ask.request.count));
            }
        }
    }

    /// What to do for the recovery connection now, if anything.
    pub fn recovery_action(&mut self, now: i64) -> Option<RecoveryAction> {
        self.now = now;
        let link = self.link.as_mut()?;
        if let LinkState::Waiting(until) = link.state {
            if now < until {
                return None;
            }
            link.state = LinkState::Idle;
        }
        if !matches!(link.state, LinkState::Idle) {
            return None;
        }
        if link.pending.is_none() {
            link.pending = link.queue.pop_front();
        }
        link.pending.is_some().then(|| {
            link.state = LinkState::Connecting;
            RecoveryAction::Connect
        })
    }

    /// The driver connected to the retransmission service at `peer`.
    pub fn recovery_connected(&mut self, peer: SocketAddr, now: i64) {
        self.now = now;
        let Some(link) = &mut self.link else { return };
        if matches!(link.state, LinkState::Off) {
            return;
        }
        let conn = StreamConnection::new(ConnectionConfig::recovery(peer, link.protection), now);
        link.state = LinkState::Connected { conn: Box::new(conn), serves: None };
    }

    /// Connecting to the retransmission service failed; `why` says so ("cannot connect: ...").
    pub fn recovery_connect_failed(&mut self, why: &str, now: i64) {
        self.now = now;
        self.link_ended(why.to_string(), false, false, false);
    }

    fn link_conn(&mut self) -> Option<&mut StreamConnection> {
        match &mut self.link.as_mut()?.state {
            LinkState::Connected { conn, .. } => Some(conn),
            _ => None,
        }
    }

    /// Where to read the recovery connection's next bytes into (empty without one).
    pub fn recovery_read_buf(&mut self) -> &mut [u8] {
        match self.link_conn() {
            Some(conn) => conn.read_buf(),
            None => &mut [],
        }
    }

    /// `n` bytes were read from the recovery connection (0: the service closed it).
    pub fn recovery_received(&mut self, n: usize, now: i64, receive_time: i64) {
        self.now = now;
        if let Some(link) = &mut self.link {
            link.receive_time = receive_time;
        }
        if let Some(conn) = self.link_conn() {
            conn.received(n, now);
        }
    }

    /// Reading the recovery connection failed.
    pub fn recovery_read_failed(&mut self, error: &dyn fmt::Display) {
        if let Some(conn) = self.link_conn() {
            conn.read_failed(error);
        }
    }

    /// Bytes to write to the recovery connection.
    pub fn recovery_transmit(&self) -> &[u8] {
        match self.link.as_ref().map(|l| &l.state) {
            Some(LinkState::Connected { conn, .. }) => conn.transmit(),
            _ => &[],
        }
    }

    /// `n` bytes of [`DatagramReceiver::recovery_transmit`] were written.
    pub fn recovery_transmitted(&mut self, n: usize) {
        if let Some(conn) = self.link_conn() {
            conn.transmitted(n);
        }
        self.feed_link();
    }

    /// Writing to the recovery connection failed.
    pub fn recovery_write_failed(&mut self, error: &dyn fmt::Display) {
        if let Some(conn) = self.link_conn() {
            conn.write_failed(error);
        }
    }

    /// Takes the recovery connection's events; false when there were none.
    fn pump_recovery<V: FrameVisitor + ?Sized>(&mut self, visitor: &mut V) -> bool {
        let stream_session = self.reader.tracker().session();
        let now = self.now;
        let DatagramReceiver { link, reader, events, .. } = self;
        let Some(link) = link.as_mut() else { return false };
        let receive_time = link.receive_time;
        let LinkState::Connected { conn, serves } = &mut link.state else { return false };
        let peer = conn.config().peer;
        let Some(event) = conn.poll_event() else { return false };
        let mut ended = None;
        match event {
            ConnectionEvent::Greeted { hello, .. } => {
                *serves = Some(hello.session);
                if let Some(book) = reader.book_mut() {
                    book.connected();
                }
                let stream = stream_session.filter(|s| *s != hello.session);
                events.push_back(DatagramEvent::RecoveryConnected { peer, session: hello.session, stream });
            }
            ConnectionEvent::Data { header, payload, payload_at } => {
                let of = serves.unwrap_or(0);
                if stream_session != Some(of) {
                    // Frames of a session the stream has left (or not reached): nothing to fill.
                    if let Some(book) = reader.book_mut() {
                        book.not_taken(u64::from(header.frame_count));
                    }
                } else {
                    reader.payload(
                        Payload {
                            origin: Origin::Recovered,
                            format: header.format,
                            bytes: payload,
                            first_sequence: header.sequence,
                            declared_frames: u64::from(header.frame_count),
                            session: of,
                            receive_time,
                            now,
                            place: Place::Recovery(payload_at),
                        },
                        visitor,
                    );
                }
            }
            ConnectionEvent::Gone { first, count } => {
                if stream_session.is_some()
                    && stream_session == *serves
                    && let Some(book) = reader.book_mut()
                {
                    events.push_back(DatagramEvent::RecoveryGone { first, count });
                    book.gone(first, count);
                }
            }
            ConnectionEvent::Busy { first, .. } => {
                if let Some(book) = reader.book_mut() {
                    book.busy(first, now);
                }
                events.push_back(DatagramEvent::RecoveryBusy { first });
            }
            ConnectionEvent::OutOfPlace { tag, at } => events.push_back(DatagramEvent::RecoveryOutOfPlace { tag, at }),
            ConnectionEvent::Closed(closed) => {
                ended = Some((closed.reason, closed.why, conn.answered()));
            }
            ConnectionEvent::Format { .. }
            | ConnectionEvent::Resume { .. }
            | ConnectionEvent::End { .. }
            | ConnectionEvent::Violation { .. } => {}
        }
        if let Some((reason, why, answered)) = ended {
            let quiet = reason == CloseReason::Quiet;
            match reason.disposition() {
                Disposition::Refused => {
                    self.events.push_back(DatagramEvent::RecoveryRefused { why });
                    if let Some(book) = self.reader.book_mut() {
                        book.refuse();
                    }
                    if let Some(link) = &mut self.link {
                        link.state = LinkState::Off;
                    }
                }
                disposition => self.link_ended(why, answered, disposition == Disposition::Busy, quiet),
            }
        } else {
            self.feed_link();
        }
        true
    }

    /// The recovery connection ended (or could not be made): the next is made for the next
    /// request, after a wait. `answered`: the service answered on it (the waits start over).
    fn link_ended(&mut self, why: String, answered: bool, busy: bool, quiet: bool) {
        let now = self.now;
        let Some(link) = &mut self.link else { return };
        if matches!(link.state, LinkState::Off) {
            return;
        }
        if busy && let Some(book) = self.reader.book_mut() {
            book.busy_at_connect();
        }
        if answered {
            link.backoff.reset();
        }
        // The next connection waits for the next request: the frames still missing are asked
        // again at their retry, and ones given up meanwhile need no connection.
        link.pending = None;
        // Something was answered before a quiet close, so this is the shortest wait: a service
        // that keeps closing connections still gets no more than one a wait.
        let wait = if quiet { link.backoff.peek() } else { link.backoff.next_wait() };
        link.state = LinkState::Waiting(now.saturating_add(wait));
        self.events.push_back(DatagramEvent::RecoveryLost { why, retry_in: wait, quiet });
    }

    /// The run is over: what is still held or missing is given up.
    pub fn finish_run(&mut self) {
        self.reader.finish();
    }
}

#[cfg(test)]
#[path = "datagram_tests.rs"]
mod tests;
