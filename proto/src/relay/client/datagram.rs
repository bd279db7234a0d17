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
//! - **Far behind, with a store.** A datagram or `END` of the stream's session more than a
//!   window ahead of the highest frame taken ([`crate::relay::SessionTracker::far_ahead`]), or
//!   a datagram that would take the window past a frame still missing, says the receiver fell
//!   behind (a slow consumer the server cut, a process stopped for seconds), or it is forged;
//!   its number is evidence of neither. Repairs could not help: the window would pass the
//!   missing frames before they were read. So the receiver catches up: it does not take the
//!   datagram, and asks the driver ([`DatagramReceiver::next_catch_up`]) to read the store in
//!   order from the first frame it lacks (the lowest missing, or the one after the highest
//!   taken), holding the live datagrams meanwhile, then to give them again (that datagram
//!   first). Read in order, a frame missing fills its gap (counted recovered), a frame taken
//!   already is skipped without being counted, and the frames past the highest are the stream's
//!   own, judged as live datagrams are, in the store's order: a datagram far ahead there is held
//!   until the next confirms it, and frames between stored datagrams are a gap. Gaps are not
//!   asked for meanwhile: the read brings them. A datagram far ahead that the store did not
//!   back (forged, or past frames it does not hold) is then judged as over UDP: another
//!   catch-up waits until the stream has moved and [`CATCH_UP_INTERVAL`] has passed, so a forger
//!   cannot keep the receiver reading the store. A replay from the start or a time is a read of
//!   the store in order too ([`DatagramReceiver::store_read_began`]), of the stream's own
//!   datagrams.
//! - **An `END` far ahead** that no read of the store brought within reach (the frames before
//!   it were never stored: a publisher dropped them for a slow server) is neither taken nor
//!   ignored: it is held ([`DatagramEvent::EndAhead`]), refuted by any new frame of its session
//!   that comes after it (a forged `END` in a live stream is followed by the stream; after one
//!   read from the store, by a newer message stored, or a live frame at or past its sequence:
//!   live frames from before it may still be on their way to a slow subscriber), and taken
//!   once nothing new has come for the give-up time ([`DatagramReceiver::with_give_up_after`]):
//!   the frames before it are then a gap, given up as gone at once when the store was read in
//!   order up to it (a publisher stores its `END` after everything else), else sought there.
//! - **Giving up.** With a give-up time, a stream that has started and brings nothing new for
//!   that long, and holds no such `END`, is given up ([`DatagramEvent::GaveUp`]): its frames
//!   still missing are given up with it. With a store, "nothing new" is the store's answer: the
//!   driver reads its tail while the live datagrams are quiet and hands it over
//!   ([`DatagramReceiver::stored_tail`]), which takes it when it is newer than what was taken (a
//!   lost tail, or an `END`) and otherwise counts as silence; a store out of reach answers
//!   nothing, and is waited for. A store that answers slowly (a round trip over a quarter of
//!   the give-up time) was stalled itself, a frozen server or its link: what the publisher sent
//!   it meanwhile may still be queued before the answer, so its word is not taken and the
//!   give-up time starts again from the answer. Without a store, the time alone decides.
//!
//! Nothing here knows the transport: a datagram is bytes and the line it came on, so another
//! source of the same datagrams (a message bus) reuses the receiver unchanged.

use super::book::{MAX_REQUESTS_PER_TICK, RecoveryBook, policy};
use super::connection::{CloseReason, ConnectionConfig, ConnectionEvent, Disposition, StreamConnection};
use super::frames::{FrameReader, FrameVisitor, Origin, Payload, Place, ReaderConfig, ReaderMode};
use super::lines::{Line, Lines};
use crate::backoff::{Backoff, duration_ns};
use crate::relay::protect::Protection;
use crate::relay::protect::Protector;
use crate::relay::session::Admission;
use crate::relay::snapshot::{Snapshot, SnapshotReader};
use crate::relay::window::WINDOW;
use crate::relay::wire::{
    DATAGRAM_VERSION, DatagramHeader, DatagramKind, Echo, RecordHeader, RecordTag, RelayError, RetransmitRequest,
    Totals,
};
use mdrelay_codec::Format;
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
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
/// How long a receiver joining with a snapshot waits for it, holding the datagrams that come
/// meanwhile, before it goes on without one.
pub const SNAPSHOT_WAIT: Duration = Duration::from_secs(5);
/// Bytes of datagrams held while a snapshot is on its way, at most: past it, datagrams are
/// dropped, and their frames recovered from the ring as a gap once the snapshot is taken.
pub const SNAPSHOT_HOLD_BYTES: usize = 64 << 20;
/// After a read of the store in order, the least time before a catch-up (see the module's
/// documentation).
pub const CATCH_UP_INTERVAL: Duration = Duration::from_secs(1);

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
    /// Join with a snapshot of the state: from the retransmission service (with `recovery`),
    /// or handed over by the driver ([`DatagramReceiver::snapshot_record`]); see
    /// [`DatagramEvent::Snapshot`].
    pub snapshot: bool,
}

/// A read of the store in order, for a receiver that fell more than a window behind: see
/// [`DatagramReceiver::next_catch_up`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatchUp {
    /// The stream's session.
    pub session: u64,
    /// The first frame to read: the lowest missing, or the one after the highest taken.
    pub from: u64,
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
    /// The snapshot asked for, read whole: the state as of its frame, from the retransmission
    /// service. The stream is owed from the frame after it: frames lost before the first
    /// datagram taken are recovered from the ring, and frames the snapshot covers are skipped.
    Snapshot(Arc<Snapshot>),
    /// No snapshot: the service did not send one within [`SNAPSHOT_WAIT`], refused, or sent
    /// one that could not be read (`why`). The stream is taken as without one.
    SnapshotMissing {
        /// What went wrong.
        why: String,
    },
    /// A datagram or `END` of the stream's session came more than a window ahead of the
    /// frames taken, or a datagram that would take the window past a frame still missing: it
    /// was not taken, and the store is to be read in order from `from`
    /// ([`DatagramReceiver::next_catch_up`]).
    Behind {
        /// The session.
        session: u64,
        /// The first frame to read from the store.
        from: u64,
        /// The frame that came (an `END`'s: the one before its number).
        ahead: u64,
    },
    /// A read of the store in order for a catch-up ended (or reached the stream's end), having
    /// taken `frames` frames.
    CaughtUp {
        /// Frames taken from the store.
        frames: u64,
    },
    /// An `END` of the stream's session far ahead of the frames taken, which the store did not
    /// bring within reach: held, and taken once nothing new has come for the give-up time
    /// (refuted by a new frame of its session after it).
    EndAhead {
        /// Who sent it.
        peer: SocketAddr,
        /// Its session.
        session: u64,
        /// The next sequence it names.
        next_sequence: u64,
    },
    /// Nothing new came for the give-up time, and no `END`: the stream is over without it.
    /// Nothing follows.
    GaveUp {
        /// How long nothing new came, ns.
        silent: i64,
        /// Frames still missing, given up with the stream.
        given_up: u64,
    },
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

/// Where the stream's datagrams come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reading {
    /// The live datagrams.
    Live,
    /// A catch-up is asked for and not taken by the driver yet.
    Asked(CatchUp),
    /// The store, in order: a replay or a catch-up, which began with this many frames taken.
    Store { catch_up: bool, taken_before: u64 },
}

/// An `END` far ahead, held until the stream confirms or refutes it.
#[derive(Debug)]
struct EndAhead {
    session: u64,
    next: u64,
    totals: Totals,
    peer: SocketAddr,
    /// Read from the store in order: the store holds nothing of its session between the
    /// highest frame taken and it (a publisher stores its END after everything else).
    in_store_order: bool,
    /// Read from the store (its tail, or in order): live frames that come after it were not
    /// sent after it, only delivered later (a slow subscriber's queue), so only a frame at or
    /// past its sequence, or one the store holds after it, refutes it.
    from_store: bool,
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
    /// Live, or reading the store in order.
    reading: Reading,
    /// The last read of the store: the stream's session and highest frame then, and when it
    /// ended.
    last_read: Option<(Option<u64>, Option<u64>, i64)>,
    /// An `END` far ahead, waiting for the stream to confirm it.
    end_ahead: Option<EndAhead>,
    /// How long a stream that has started may bring nothing new, ns.
    give_up_after_ns: Option<i64>,
    /// When a datagram last brought a frame not taken before, once one did.
    progress_at: Option<i64>,
    /// When the store last answered a read of its tail slowly: stalled until then, its
    /// silence before says nothing of the stream's.
    store_back_at: Option<i64>,
    /// The store position of the last tail taken: read again, it is nothing new.
    tail_position: Option<u64>,
    /// A stored tail is being taken (it comes in through [`DatagramReceiver::datagram`]).
    taking_tail: bool,
    /// After a read of the store in order, the highest frame it took: the frames of live
    /// datagrams held meanwhile up to there are expected copies, not duplicates.
    copies_to: Option<u64>,
    /// Joining with a snapshot: where it stands.
    joining: Joining,
    /// How snapshot frames are opened (the stream's protection).
    snapshot_opener: Option<Box<Protector>>,
}

/// A receiver's join with a snapshot.
#[derive(Debug, Default)]
enum Joining {
    /// No snapshot asked for, or it came (or was given up): datagrams are taken as they come.
    #[default]
    Done,
    /// Waiting for the snapshot, with the datagrams that came meanwhile.
    Waiting {
        /// The request went out on the current recovery connection.
        asked: bool,
        /// When to go on without it (set at the first call that tells the time).
        until: Option<i64>,
        /// The snapshot's records read so far.
        reader: Box<SnapshotReader>,
        held: VecDeque<HeldLive>,
        held_bytes: usize,
    },
    /// Over: the datagrams held are to be taken now (at the next call with a visitor).
    Releasing(VecDeque<HeldLive>),
}

/// Takes one `SNAPSHOT` record of the snapshot awaited, of the publisher's `session`: the
/// event that ends the wait (the snapshot read whole, or why it cannot be), or none (more
/// records to come, or no snapshot awaited). `at` says where the record was, for errors.
fn snapshot_record(
    joining: &mut Joining,
    opener: &mut Option<Box<Protector>>,
    reader: &mut FrameReader,
    header: &RecordHeader,
    payload: &[u8],
    session: u64,
    at: impl FnOnce() -> String,
) -> Option<DatagramEvent> {
    let (Joining::Waiting { reader: snapshot, .. }, Some(opener)) = (joining, opener.as_deref_mut()) else {
        return None;
    };
    match snapshot.record(header, payload, opener, session, mdrelay_codec::Limits::default()) {
        Ok(None) => None,
        Ok(Some(read)) => {
            reader.covered_by_snapshot(session, read.state.as_of);
            Some(DatagramEvent::Snapshot(Arc::new(read)))
        }
        Err(error) => Some(DatagramEvent::SnapshotMissing { why: format!("{error} ({})", at()) }),
    }
}

/// A datagram that came while the snapshot was on its way.
#[derive(Debug)]
struct HeldLive {
    origin: Origin,
    bytes: Vec<u8>,
    peer: SocketAddr,
    receive_time: i64,
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
        let snapshot = config.snapshot;
        let joining = if snapshot {
            Joining::Waiting { asked: false, until: None, reader: Box::default(), held: VecDeque::new(), held_bytes: 0 }
        } else {
            Joining::Done
        };
        let snapshot_opener = snapshot.then(|| {
            Box::new(Protector::new(
                config.reader.crc,
                config.reader.key.as_ref(),
                mdrelay_codec::Limits::default().max_frame,
            ))
        });
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
            reading: Reading::Live,
            last_read: None,
            end_ahead: None,
            give_up_after_ns: None,
            progress_at: None,
            store_back_at: None,
            tail_position: None,
            taking_tail: false,
            copies_to: None,
            joining,
            snapshot_opener,
        }
    }

    /// A stream that has started and brings nothing new for `limit` is given up, and an `END`
    /// far ahead is taken at that point (see the module's documentation); `None`: never.
    pub fn with_give_up_after(mut self, limit: Option<Duration>) -> DatagramReceiver {
        self.give_up_after_ns = limit.map(duration_ns);
        self
    }

    /// The catch-up asked for, once (see the module's documentation): read the store in order
    /// from the datagram carrying frame `from`, hand each datagram to
    /// [`DatagramReceiver::datagram`] as it comes, and hold the live datagrams meanwhile; then
    /// call [`DatagramReceiver::store_read_ended`] (also when the store could not be read), and
    /// give the live datagrams held, starting with the one given when this was asked for, which
    /// was not taken.
    pub fn next_catch_up(&mut self) -> Option<CatchUp> {
        let Reading::Asked(catch_up) = self.reading else { return None };
        self.reading = Reading::Store { catch_up: true, taken_before: self.frames_taken() };
        self.reader.set_store_in_order(true);
        Some(catch_up)
    }

    /// Whether a catch-up's read of the store is under way.
    fn catching_up(&self) -> bool {
        matches!(self.reading, Reading::Store { catch_up: true, .. })
    }

    /// The datagrams now come from the store in order (a replay from the start or from a time),
    /// until [`DatagramReceiver::store_read_ended`].
    pub fn store_read_began(&mut self) {
        self.reading = Reading::Store { catch_up: false, taken_before: self.frames_taken() };
    }

    /// The read of the store in order is over, at `now`: the live datagrams come next.
    pub fn store_read_ended(&mut self, now: i64) {
        self.now = now;
        if let Reading::Store { catch_up: true, taken_before } = self.reading {
            let frames = self.frames_taken().saturating_sub(taken_before);
            self.events.push_back(DatagramEvent::CaughtUp { frames });
        }
        self.reading = Reading::Live;
        self.reader.set_store_in_order(false);
        let tracker = self.reader.tracker();
        self.last_read = Some((tracker.session(), tracker.highest(), now));
        self.copies_to = tracker.highest();
    }

    /// Whether the live datagrams are to be held: a catch-up is asked for or under way, or a
    /// replay.
    pub fn reading_store(&self) -> bool {
        self.reading != Reading::Live
    }

    /// Whether the store's tail is worth reading while the live datagrams are quiet: the stream
    /// has started, its `END` was not taken, and nothing is read from the store in order.
    pub fn wants_tail(&self) -> bool {
        self.store.is_some()
            && !self.finished
            && self.reading == Reading::Live
            && self.publisher_totals.is_none()
            && self.reader.tracker().session().is_some()
    }

    /// The store's last datagram of the stream (at its `position`), read while the live
    /// datagrams were quiet: taken as a live one when it is newer than what was taken (a
    /// later frame of the stream's session, or an `END` of it not taken or held yet), else the
    /// store's word that nothing new came. A datagram is taken once, whatever it turns out to
    /// be (a forgery the checks refuse is counted once, not at every read). The read was sent
    /// at `asked_at`: a slow answer's silence is not taken (see the module's documentation).
    #[allow(clippy::too_many_arguments)] // The datagram's, the read's and the time's: one call.
    pub fn stored_tail<V: FrameVisitor + ?Sized>(
        &mut self,
        position: u64,
        bytes: &[u8],
        peer: SocketAddr,
        asked_at: i64,
        now: i64,
        receive_time: i64,
        visitor: &mut V,
    ) {
        self.now = now;
        if self.finished {
            return;
        }
        if self.tail_position != Some(position) && self.end_ahead.as_ref().is_some_and(|e| e.from_store) {
            // The store holds something after the END read from it: that END was not the last.
            let same_end = DatagramHeader::parse_datagram(bytes).is_ok_and(|h| {
                h.kind == DatagramKind::End
                    && self.end_ahead.as_ref().is_some_and(|e| (e.session, e.next) == (h.session, h.sequence))
            });
            if !same_end {
                self.end_ahead = None;
                self.reader.tracker_mut().refuted();
            }
        }
        if self.tail_position != Some(position) && self.newer_than_taken(bytes) {
            self.tail_position = Some(position);
            self.taking_tail = true;
            self.datagram(Origin::Stream, bytes, peer, now, receive_time, visitor);
            self.taking_tail = false;
        } else {
            self.store_says_nothing_new(asked_at, now);
        }
    }

    /// The store holds nothing of the stream (its messages were removed): nothing new came,
    /// by a read sent at `asked_at`.
    pub fn store_holds_nothing(&mut self, asked_at: i64, now: i64) {
        self.now = now;
        self.store_says_nothing_new(asked_at, now);
    }

    /// A read of the store sent at `asked_at` found nothing new at `now`: silence, when the
    /// store answered promptly. A slow answer means the store was stalled itself, with what the
    /// publisher sent meanwhile perhaps still queued before the read: the give-up time starts
    /// again from the answer.
    fn store_says_nothing_new(&mut self, asked_at: i64, now: i64) {
        if let Some(limit) = self.give_up_after_ns
            && now.saturating_sub(asked_at) > limit / 4
        {
            self.store_back_at = Some(now);
            return;
        }
        self.silent(now);
    }

    /// Whether a datagram (by its header, which is only a hint: its protection is checked when
    /// it is taken) is newer than everything taken of the stream's session.
    fn newer_than_taken(&self, bytes: &[u8]) -> bool {
        let Ok(h) = DatagramHeader::parse_datagram(bytes) else { return false };
        let tracker = self.reader.tracker();
        // Only the stream's session: a store also keeps earlier sessions, whose END must not end
        // this one, and a new session comes live anyway.
        if tracker.session() != Some(h.session) {
            return false;
        }
        match h.kind {
            DatagramKind::Data => {
                let last = h.sequence.saturating_add(u64::from(h.frame_count)).saturating_sub(1);
                tracker.highest().is_none_or(|high| last > high)
            }
            DatagramKind::End => {
                self.publisher_totals.is_none()
                    && self.end_ahead.as_ref().is_none_or(|e| (e.session, e.next) != (h.session, h.sequence))
            }
            DatagramKind::Echo => false,
        }
    }

    /// Frames taken so far (decoded or not).
    fn frames_taken(&self) -> u64 {
        let c = self.reader.counts();
        c.frames_decoded.saturating_add(c.decode_errors)
    }

    /// Nothing new came, as of `now`: past the give-up time, an `END` held far ahead is taken,
    /// or else the stream is given up.
    fn silent(&mut self, now: i64) {
        let (Some(limit), Some(since)) = (self.give_up_after_ns, self.progress_at) else { return };
        let silent = now.saturating_sub(since);
        let heard_for = now.saturating_sub(self.store_back_at.map_or(since, |back| back.max(since)));
        // After an END, the linger bounds the wait.
        if self.finished || self.publisher_totals.is_some() || heard_for < limit {
            return;
        }
        if let Some(end) = self.end_ahead.take() {
            self.take_end_ahead(end, now);
            return;
        }
        self.reader.tracker_mut().finish();
        let given_up = self.reader.book_mut().map_or(0, |b| b.give_up_all());
        self.events.push_back(DatagramEvent::GaveUp { silent, given_up });
        self.finished = true;
    }

    /// An `END` held far ahead that nothing followed: taken.
    fn take_end_ahead(&mut self, end: EndAhead, now: i64) {
        if self.reader.tracker().session() != Some(end.session) {
            self.reader.tracker_mut().refuted();
            return;
        }
        let highest = self.reader.tracker().highest();
        self.reader.tracker_mut().end_confirmed(end.next);
        self.reader.stream_ended(end.next, now);
        if end.in_store_order
            && let Some(book) = self.reader.book_mut()
        {
            // The store holds none of the frames past the highest: gone, without a search.
            let from = highest.map_or(1, |high| high.saturating_add(1));
            let count = end.next.saturating_sub(from);
            book.gone(from, count);
            self.events.push_back(DatagramEvent::RecoveryGone { first: from, count });
        }
        let first = self.publisher_totals.is_none();
        self.events.push_back(DatagramEvent::End {
            peer: end.peer,
            next_sequence: end.next,
            totals: end.totals.clone(),
            first,
        });
        self.publisher_totals = Some(end.totals);
        self.end_taken(0, now);
    }

    /// Whether a datagram of `session` with frames `first..=last` is to start a catch-up (see
    /// the module's documentation).
    fn catch_up_due(&self, session: u64, first: u64, last: u64, now: i64) -> bool {
        let tracker = self.reader.tracker();
        let behind = tracker.far_ahead(session, first)
            || tracker.session() == Some(session)
                && self.reader.book().and_then(RecoveryBook::first_missing).is_some_and(|low| {
                    // Taking it would take the window past a frame still missing.
                    last >= low.saturating_add(WINDOW)
                });
        self.store.is_some()
            && self.reading == Reading::Live
            && behind
            && self.last_read.is_none_or(|(read_session, read_highest, at)| {
                let moved = read_session != tracker.session() || read_highest < tracker.highest();
                moved && now >= at.saturating_add(duration_ns(CATCH_UP_INTERVAL))
            })
    }

    /// While a snapshot is awaited (or its datagrams wait to be taken), a datagram waits too,
    /// in order; past [`SNAPSHOT_HOLD_BYTES`] it is dropped (its frames are then a gap,
    /// recovered). True when it was held or dropped.
    fn hold_for_snapshot(&mut self, origin: Origin, bytes: &[u8], peer: SocketAddr, receive_time: i64) -> bool {
        let now = self.now;
        let live = || HeldLive { origin, bytes: bytes.to_vec(), peer, receive_time };
        match &mut self.joining {
            Joining::Done => false,
            Joining::Releasing(held) => {
                held.push_back(live());
                true
            }
            Joining::Waiting { until, held, held_bytes, .. } => {
                until.get_or_insert(now.saturating_add(duration_ns(SNAPSHOT_WAIT)));
                if held_bytes.saturating_add(bytes.len()) <= SNAPSHOT_HOLD_BYTES {
                    *held_bytes += bytes.len();
                    held.push_back(live());
                } else {
                    self.counts.datagrams += 1;
                    self.counts.bytes += bytes.len() as u64;
                }
                true
            }
        }
    }

    /// The snapshot came, or will not: the datagrams held meanwhile are taken at the next
    /// [`DatagramReceiver::poll_event`], after its event.
    fn joined(&mut self, event: DatagramEvent) {
        if let Joining::Waiting { held, .. } = std::mem::take(&mut self.joining) {
            self.events.push_back(event);
            self.joining = Joining::Releasing(held);
        }
    }

    /// Takes the datagrams held for the snapshot; false when there were none to take.
    fn release_held<V: FrameVisitor + ?Sized>(&mut self, visitor: &mut V) -> bool {
        if !matches!(self.joining, Joining::Releasing(_)) {
            return false;
        }
        let Joining::Releasing(held) = std::mem::take(&mut self.joining) else { return false };
        let now = self.now;
        for d in held {
            self.datagram(d.origin, &d.bytes, d.peer, now, d.receive_time, visitor);
        }
        true
    }

    /// Whether a snapshot is awaited (see [`DatagramConfig::snapshot`]).
    pub fn awaiting_snapshot(&self) -> bool {
        matches!(self.joining, Joining::Waiting { .. })
    }

    /// One `SNAPSHOT` record of the snapshot the driver asked for, where the transport has no
    /// recovery connection to ask on (NATS: a request the publisher answers), from the
    /// publisher of `session`; `source` names where it came from, for errors.
    pub fn snapshot_record(&mut self, header: &RecordHeader, payload: &[u8], session: u64, source: &str) {
        let DatagramReceiver { joining, snapshot_opener, reader, .. } = self;
        let at = || format!("record of {} bytes from {source}", payload.len());
        if let Some(event) = snapshot_record(joining, snapshot_opener, reader, header, payload, session, at) {
            self.joined(event);
        }
    }

    /// The snapshot the driver asked for will not come (`why`): the stream is taken without it.
    pub fn snapshot_unavailable(&mut self, why: String) {
        self.joined(DatagramEvent::SnapshotMissing { why });
    }

    /// Whether a snapshot is awaited and not yet asked for on the recovery connection.
    fn snapshot_unasked(&self) -> bool {
        matches!(self.joining, Joining::Waiting { asked: false, .. })
    }

    /// Asks for a catch-up, the datagram of `len` bytes reaching frame `ahead` not taken.
    fn ask_catch_up(&mut self, session: u64, ahead: u64, len: usize) {
        let next = self.reader.tracker().highest().map_or(1, |high| high.saturating_add(1));
        let from = self.reader.book().and_then(RecoveryBook::first_missing).map_or(next, |low| low.min(next));
        self.reading = Reading::Asked(CatchUp { session, from });
        self.events.push_back(DatagramEvent::Behind { session, from, ahead });
        // Given again after the catch-up, and counted then.
        self.counts.datagrams = self.counts.datagrams.saturating_sub(1);
        self.counts.bytes = self.counts.bytes.saturating_sub(len as u64);
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
        let Ok(header) = DatagramHeader::parse_datagram(bytes) else { return };
        let before = self.frames_taken();
        match self.reader.take_unsealer() {
            Some(mut unsealer) => {
                if let Ok(plain) = unsealer.datagram(bytes, &header, self.reader.tracker().session()) {
                    self.stored_plain(plain, now, receive_time, visitor);
                }
                self.reader.put_unsealer(unsealer);
            }
            None => self.stored_plain(bytes, now, receive_time, visitor),
        }
        if self.frames_taken() > before {
            self.progress_at = Some(now);
        }
        self.check_finished();
    }

    /// A plain datagram from the store: its frames of the stream's session, as recovered.
    fn stored_plain<V: FrameVisitor + ?Sized>(&mut self, d: &[u8], now: i64, receive_time: i64, visitor: &mut V) {
        let Ok(header) = DatagramHeader::parse_datagram(d) else { return };
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
                bytes: &d[header.len_on_wire()..],
                first_sequence: header.sequence,
                declared_frames: u64::from(header.frame_count),
                session,
                receive_time,
                now,
                place: Place::Datagram(header.len_on_wire() as u64),
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
            // After the snapshot's event has been taken: its frames come first.
            if self.release_held(visitor) {
                continue;
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
        if self.hold_for_snapshot(origin, bytes, peer, receive_time) {
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
                let ended = match DatagramHeader::parse_datagram(bytes) {
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
            self.end_taken(line, now);
        }
        self.check_finished();
    }

    /// An `END` was taken on `line`: the stream ends once every line's came and nothing is
    /// missing, or after a wait.
    fn end_taken(&mut self, line: usize, now: i64) {
        self.end_ahead = None;
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

    fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            // A catch-up that read the stream's END: what it took is told before the end.
            if let Reading::Store { catch_up: true, taken_before } = self.reading {
                let frames = self.frames_taken().saturating_sub(taken_before);
                self.events.push_back(DatagramEvent::CaughtUp { frames });
            }
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
        let header = match DatagramHeader::parse_datagram(d) {
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
                let last = header.sequence.saturating_add(u64::from(header.frame_count)).saturating_sub(1);
                if self.catch_up_due(header.session, header.sequence, last, now) {
                    self.ask_catch_up(header.session, header.sequence, d.len());
                    return false;
                }
                // Read in order from a store, a datagram's frames fill gaps or follow the highest;
                // a live one that the read brought already is a copy of its frames.
                let copy = self.reader.tracker().session() == Some(header.session)
                    && self.copies_to.is_some_and(|to| header.sequence <= to);
                if !copy {
                    self.copies_to = None;
                }
                let in_order = self.catching_up() || copy;
                let taken_as = if in_order { Origin::Recovered } else { origin };
                self.reader.set_store_in_order(in_order);
                let highest = self.reader.tracker().highest();
                let admission =
                    self.reader.tracker_mut().datagram(header.session, header.sequence, u64::from(header.frame_count));
                self.note_session(before, peer);
                match admission {
                    Admission::Take => {
                        self.held = None;
                        self.take(d, &header, receive_time, now, taken_as, visitor);
                        self.refute_end_ahead(highest, in_order);
                    }
                    Admission::TakeHeldThenThis => {
                        self.take_held(now, visitor);
                        self.take(d, &header, receive_time, now, taken_as, visitor);
                        self.refute_end_ahead(highest, in_order);
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
                self.reader.set_store_in_order(self.catching_up());
                false
            }
            DatagramKind::End => {
                let totals = match Totals::parse(&d[header.len_on_wire()..]) {
                    Ok(t) => t,
                    Err(error) => {
                        // The publisher repeats its END: wait for a readable one.
                        self.counts.invalid_packets += 1;
                        let at = header.len_on_wire() + error.offset;
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
                        let last = header.sequence.saturating_sub(1);
                        if self.reader.tracker().far_ahead(header.session, last) {
                            if self.catch_up_due(header.session, last, last, now) {
                                self.ask_catch_up(header.session, last, d.len());
                                return false;
                            }
                            if self.give_up_after_ns.is_some() {
                                let again = self
                                    .end_ahead
                                    .as_ref()
                                    .is_some_and(|e| (e.session, e.next) == (header.session, header.sequence));
                                // The same END again (given back after a read of the store) is
                                // held once, as first seen.
                                if !again {
                                    self.events.push_back(DatagramEvent::EndAhead {
                                        peer,
                                        session: header.session,
                                        next_sequence: header.sequence,
                                    });
                                    let in_store_order = self.reading_store();
                                    self.end_ahead = Some(EndAhead {
                                        session: header.session,
                                        next: header.sequence,
                                        totals,
                                        peer,
                                        in_store_order,
                                        from_store: in_store_order || self.taking_tail,
                                    });
                                }
                                return false;
                            }
                        }
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

    /// A data datagram was taken (`in_order`: read from the store in order), the highest frame
    /// before it `highest`: a new frame of the `END` held far ahead's session after it (or
    /// another session) refutes that `END`. After an `END` read from the store, a live frame
    /// refutes it only at or past its sequence: one before it was published before it, and
    /// only delivered later (see [`EndAhead::from_store`]).
    fn refute_end_ahead(&mut self, highest: Option<u64>, in_order: bool) {
        let tracker = self.reader.tracker();
        let after_it_in_store = in_order || self.taking_tail;
        let refuted = self.end_ahead.as_ref().is_some_and(|end| {
            tracker.session() != Some(end.session)
                || (tracker.highest() > highest
                    && (!end.from_store || after_it_in_store || tracker.highest() >= Some(end.next)))
        });
        if refuted {
            self.end_ahead = None;
            self.reader.tracker_mut().refuted();
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
            && let Ok(header) = DatagramHeader::parse_datagram(&h.bytes)
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
        let before = self.frames_taken();
        self.reader.payload(
            Payload {
                origin,
                format: header.format,
                bytes: &d[header.len_on_wire()..],
                first_sequence: header.sequence,
                declared_frames: u64::from(header.frame_count),
                session: header.session,
                receive_time,
                now,
                place: Place::Datagram(header.len_on_wire() as u64),
            },
            visitor,
        );
        if self.frames_taken() > before {
            self.progress_at = Some(now);
        }
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
        if let Joining::Waiting { until: Some(until), .. } = &self.joining {
            at(*until);
        }
        // Without a store, the time alone says nothing new came (with one, the store says so).
        if self.store.is_none()
            && let (Some(limit), Some(since)) = (self.give_up_after_ns, self.progress_at)
        {
            at(since.saturating_add(limit));
        }
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
        if let Joining::Waiting { until: Some(until), .. } = self.joining
            && now >= until
        {
            self.joined(DatagramEvent::SnapshotMissing { why: format!("no snapshot within {SNAPSHOT_WAIT:?}") });
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
        if self.store.is_none() {
            self.silent(now);
            if self.finished {
                return;
            }
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
        if self.catching_up() {
            // The catch-up reads the gaps in order; they are asked for after it, if still open.
            return;
        }
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
        let snapshot = self.snapshot_unasked();
        if let Joining::Waiting { until, .. } = &mut self.joining {
            until.get_or_insert(now.saturating_add(duration_ns(SNAPSHOT_WAIT)));
        }
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
        (link.pending.is_some() || snapshot).then(|| {
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
        let DatagramReceiver { link, reader, events, joining, snapshot_opener, .. } = self;
        let Some(link) = link.as_mut() else { return false };
        let receive_time = link.receive_time;
        let LinkState::Connected { conn, serves } = &mut link.state else { return false };
        let peer = conn.config().peer;
        let Some(event) = conn.poll_event() else { return false };
        let mut ended = None;
        let mut joined = None;
        match event {
            ConnectionEvent::Greeted { hello, .. } => {
                *serves = Some(hello.session);
                if let Joining::Waiting { asked: asked @ false, .. } = joining {
                    conn.queue_snapshot_request();
                    *asked = true;
                }
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
            // Frame 0 is never asked for: a BUSY for it refuses the snapshot, with the reason.
            ConnectionEvent::Busy { first: 0, reason } if matches!(joining, Joining::Waiting { asked: true, .. }) => {
                joined = Some(DatagramEvent::SnapshotMissing { why: format!("{peer}: {reason}") });
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
            ConnectionEvent::Snapshot { header, payload, payload_at } => {
                let session = serves.unwrap_or(0);
                let at = || {
                    let record = payload_at.saturating_sub(RecordHeader::LEN as u64);
                    format!("record at byte {record} of the connection to {peer}")
                };
                match snapshot_record(joining, snapshot_opener, reader, &header, payload, session, at) {
                    Some(event) => joined = Some(event),
                    None if matches!(joining, Joining::Waiting { .. }) => {}
                    None => {
                        events.push_back(DatagramEvent::RecoveryOutOfPlace { tag: RecordTag::Snapshot, at: payload_at })
                    }
                }
            }
            ConnectionEvent::Format { .. }
            | ConnectionEvent::Resume { .. }
            | ConnectionEvent::End { .. }
            | ConnectionEvent::Violation { .. } => {}
        }
        if let Some(event) = joined {
            self.joined(event);
        }
        if let Some((reason, why, answered)) = ended {
            let quiet = reason == CloseReason::Quiet;
            match reason.disposition() {
                Disposition::Refused => {
                    self.joined(DatagramEvent::SnapshotMissing {
                        why: format!("the retransmission service refused the connection: {why}"),
                    });
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
        // A snapshot not read whole is asked again on the next connection.
        if let Joining::Waiting { asked, reader, .. } = &mut self.joining {
            *asked = false;
            **reader = SnapshotReader::new();
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
