//! One TCP stream across connections ([`StreamClient`]): the decisions a subscriber's stream and
//! a relay's upstream make between connections, on top of [`StreamConnection`] and
//! [`FrameReader`].
//!
//! - **When to connect.** The driver asks [`StreamClient::poll_action`]: connect now, wait until a
//!   time, run the connection it has, or stop. A subscriber waits before each new connection,
//!   from 100 ms doubling up to its cap, and starts the waits over after a connection whose
//!   handshake had succeeded (a violation or a `BUSY` keeps them growing), and never gives up. A
//!   relay tries again at once after losing a connection that worked (one whose stream started),
//!   then waits between attempts, doubling, and gives up when `give_up_after` would pass; a
//!   `BUSY`, before or after the handshake, is such a wait (never a failed handshake, never a
//!   connection that worked); after a protocol
//!   violation it waits first, longer for each violation that follows within 30 s, and gives up
//!   when violations keep coming without a frame taken for `give_up_after`.
//! - **Where to resume.** A greeting of the session received so far is answered with a resume
//!   from the frame after the highest received (a relay: after the last handed on); with
//!   from-start, before anything was received, from frame 1; else live. Whether the resume
//!   worked is the first record's sequence.
//! - **Sessions.** A subscriber follows a publisher that restarted (the tracker starts over); a
//!   relay cannot (its frames carry the first session's numbers) and stops.
//! - **Frames.** `DATA` records go through the frame reader to the driver's visitor; echoes due
//!   are queued on the connection.
//! - **The caller's turn.** Records that give the program nothing (a `FORMAT` record of the
//!   format in use, frames all skipped) are counted ([`Quiet`]); after a budget of them without
//!   an event or a frame, [`ClientEvent::Quiet`] tells the driver to give its caller a turn, so
//!   no peer can hold up a deadline, a report tick or a signal by what it sends.

use super::connection::{
    CloseReason, Closed, ConnectionConfig, ConnectionCounts, ConnectionEvent, Disposition, ResumePlan, Role,
    STREAM_READ_BUFFER, Start, StreamConnection,
};
use super::frames::{FrameReader, FrameVisitor, Origin, Payload, Place, ReaderConfig, ReaderMode};
use super::quiet::Quiet;
use crate::backoff::{Backoff, duration_ns};
use crate::relay::continuity::Violation;
use crate::relay::protect::{ProtectError, Protection, Protector, WireKey};
use crate::relay::session::Greeted;
use crate::relay::snapshot::{Snapshot, SnapshotReader};
use crate::relay::wire::{Hello, RecordTag, RelayError, Totals};
use mdrelay_codec::{Format, SymbolFilter};
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// First wait before connecting again; it doubles up to the configured cap.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// A relay's protocol violation this long after the one before starts its waits over: a link
/// that corrupts a record now and then costs a short pause each time.
pub const VIOLATIONS_FORGOTTEN_AFTER: Duration = Duration::from_secs(30);

/// How a stream client is set up.
#[derive(Clone, Debug)]
pub struct StreamClientConfig {
    /// A subscriber's stream or a relay's upstream (not [`Role::Recovery`]).
    pub role: Role,
    /// The protection expected of the frames.
    pub protection: Protection,
    /// The pre-shared key, when frames are encrypted.
    pub key: Option<WireKey>,
    /// Decode only these symbols' messages.
    pub symbols: Option<SymbolFilter>,
    /// Round-trip mode: echo every Nth frame.
    pub echo_every: Option<u64>,
    /// Ask for the session from its first frame, before anything was received.
    pub from_start: bool,
    /// Ask for a snapshot of the state before the stream, on a connection that starts live before
    /// anything was received ([`ClientEvent::Snapshot`]).
    pub snapshot: bool,
    /// A reconnection to the same session asks for the frames after the highest received (true
    /// for every client by default); without it, a reconnection takes the stream live and the
    /// frames sent while away are lost.
    pub resume: bool,
    /// Longest wait between connections, ns.
    pub reconnect_max_ns: i64,
    /// Give up when no connection works for this long, ns: a relay's upstream, or a subscriber
    /// that asked for a limit (by default a subscriber tries for ever).
    pub give_up_after_ns: Option<i64>,
    /// Time for the greeting, and then for the answer, ns.
    pub handshake_timeout_ns: i64,
    /// A connection that receives nothing for this long after its handshake is lost, ns.
    pub idle_timeout_ns: Option<i64>,
    /// Shorten each wait by up to this fraction, at random from this seed (none by default).
    pub jitter: Option<(f64, u64)>,
    /// Starting size of each connection's read buffer (it grows as records need).
    pub read_buffer: usize,
}

impl StreamClientConfig {
    /// A subscriber's stream, connecting again after at most `reconnect_max`.
    pub fn subscriber(protection: Protection, key: Option<WireKey>, reconnect_max: Duration) -> StreamClientConfig {
        StreamClientConfig {
            role: Role::Subscriber,
            protection,
            key,
            symbols: None,
            echo_every: None,
            from_start: false,
            snapshot: false,
            resume: true,
            reconnect_max_ns: duration_ns(reconnect_max),
            give_up_after_ns: None,
            handshake_timeout_ns: duration_ns(super::connection::SUBSCRIBER_HANDSHAKE_TIMEOUT),
            idle_timeout_ns: None,
            jitter: None,
            read_buffer: STREAM_READ_BUFFER,
        }
    }

    /// A relay's upstream `connect` (as configured); `crc`: its frames carry a CRC-32C.
    pub fn relay(
        connect: String,
        crc: bool,
        reconnect_max: Duration,
        give_up_after: Duration,
        handshake_timeout: Duration,
        idle_timeout: Option<Duration>,
    ) -> StreamClientConfig {
        StreamClientConfig {
            role: Role::Relay { connect },
            give_up_after_ns: Some(duration_ns(give_up_after)),
            handshake_timeout_ns: duration_ns(handshake_timeout),
            idle_timeout_ns: idle_timeout.map(duration_ns),
            // The rest as a subscriber's, without a key: a relay's upstream is not encrypted.
            ..StreamClientConfig::subscriber(Protection { crc, encrypted: false }, None, reconnect_max)
        }
    }
}

/// What the driver does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAction {
    /// Connect a socket now, then call [`StreamClient::connected`] (or
    /// [`StreamClient::connect_failed`]).
    Connect,
    /// Nothing to do before this time, ns.
    Wait(i64),
    /// Move bytes for the connection: read, write, poll events, honour the deadline.
    Run,
    /// The stream is over: see [`StreamClient::finished`].
    Finished,
}

/// How the stream ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The publisher's `END`.
    End,
    /// The publisher refused this client, or speaks another protocol (exit status 3): the
    /// connection's end says why.
    Refused(Closed),
    /// Another connection would not help: the reason, naming the peer.
    Fatal(String),
}

/// What the END said, once believed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndOfStream {
    /// The number the next frame would have had, as the record gave it.
    pub next_sequence: u64,
    /// Whether it was believed (a relay ignores one that does not fit what it handed on).
    pub believed: bool,
    /// The publisher's totals, or where and why they could not be read.
    pub totals: Result<Totals, (u64, RelayError)>,
}

/// Something that happened to the stream, for the program to act on or log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// A socket was connected (`again`: not the first of the run); `attempt` counts the
    /// attempts since the last success.
    Connected {
        /// The peer.
        peer: SocketAddr,
        /// Attempts it took.
        attempt: u64,
        /// A connection was made before this one.
        again: bool,
    },
    /// The greeting passed the checks and the answer is queued.
    Greeted {
        /// The greeting.
        hello: Hello,
        /// What the answer asked for.
        resume: Start,
        /// The first greeting of the run.
        first: bool,
    },
    /// The handshake completed (the answer written) on a connection made after losing one.
    Reconnected {
        /// Attempts it took.
        attempt: u64,
    },
    /// The publisher restarted (another session): accounting starts over.
    Restarted {
        /// The session before.
        old: u64,
        /// The new one.
        new: u64,
    },
    /// The first record started the stream where the resume asked.
    Resumed {
        /// The frame asked for.
        from: u64,
    },
    /// The first record started the stream later than the resume asked: the frames between are
    /// lost.
    ResumeFailed {
        /// The frame asked for.
        asked: u64,
        /// The first frame offered.
        offered: u64,
    },
    /// A record out of place (skipped).
    OutOfPlace {
        /// Its tag.
        tag: RecordTag,
        /// Where it starts.
        at: u64,
    },
    /// A record that does not fit the stream: the connection is dropped.
    Violation {
        /// How.
        violation: Violation,
        /// Where it starts.
        at: u64,
    },
    /// A relay's frame that failed its CRC-32C: the connection is dropped, and the next resumes
    /// from this frame.
    FrameCheckFailed {
        /// The frame.
        sequence: u64,
        /// Where it starts.
        at: u64,
        /// Why.
        error: ProtectError,
    },
    /// The publisher's `END`.
    End(EndOfStream),
    /// The snapshot asked for, read whole: the stream goes on from the frame after it.
    Snapshot(Arc<Snapshot>),
    /// The snapshot asked for could not be read (the stream goes on without it), or the
    /// publisher sent none (`why` is `None`: it keeps no state, or is an older build).
    SnapshotMissing {
        /// Why it could not be read, and where.
        why: Option<String>,
    },
    /// A connection attempt failed; the next one is in `retry_in` ns.
    ConnectFailed {
        /// Why, for a relay (its connection error, or the handshake that failed, which it logs
        /// as one); a subscriber's driver knows its own connection error.
        why: Option<String>,
        /// Attempts since the last success.
        attempt: u64,
        /// Wait before the next, ns.
        retry_in: i64,
    },
    /// A connection ended; another follows in `retry_in` ns.
    Lost {
        /// How it ended.
        closed: Closed,
        /// Wait before the next, ns.
        retry_in: i64,
    },
    /// Records (or bytes) that gave the program nothing went on for a whole budget
    /// ([`super::quiet`]): the driver gives its caller a turn (its runtime, its stop flag)
    /// before it polls again. Nothing is lost.
    Quiet,
    /// The stream is over.
    Finished(Finish),
}

/// What the client counted over every connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientCounts {
    /// Connections made.
    pub connections: u64,
    /// Connections made again after one was lost (a subscriber counts sockets connected, a
    /// relay connections whose stream started: one told BUSY is none).
    pub reconnects: u64,
    /// Reconnections where the publisher resumed at the frame asked for.
    pub resumes: u64,
    /// Every connection's counts, added up.
    pub connection: ConnectionCounts,
}

/// Where the client is.
#[derive(Debug)]
enum Phase {
    /// Connect when asked.
    Idle,
    /// Waiting until then, ns.
    Waiting(i64),
    /// The driver is connecting.
    Connecting,
    /// A connection is running; `established_seen`: its handshake's completion was noted;
    /// `streaming`: its first stream record came (a relay's attempt succeeds there, not at the
    /// handshake, since a publisher at its limit completes the handshake and then says BUSY).
    Connected { established_seen: bool, streaming: bool },
    /// Over.
    Finished(Finish),
}

/// A relay's attempts to reach its upstream since it lost it (or started).
#[derive(Clone, Copy, Debug)]
struct Reach {
    started: i64,
    attempt: u64,
    reconnecting: bool,
}

/// A stream across connections: see the module's documentation.
#[derive(Debug)]
pub struct StreamClient {
    config: StreamClientConfig,
    reader: FrameReader,
    phase: Phase,
    /// The last connection made: running, or closed and kept for what is left to write (echoes
    /// at the end) until the next one replaces it.
    conn: Option<Box<StreamConnection>>,
    backoff: Backoff,
    events: VecDeque<ClientEvent>,
    now: i64,
    receive_time: i64,
    /// The greeting of the current connection.
    hello: Option<Hello>,
    /// The first greeting's session (a relay's, which its frames carry).
    session: Option<u64>,
    connected_before: bool,
    attempt: u64,
    reach: Option<Reach>,
    violation_backoff: Backoff,
    last_violation: Option<i64>,
    violations_without_frames: Option<(i64, u64)>,
    /// A subscriber's first failed attempt since its last connection that worked (or its start).
    unreached_since: Option<i64>,
    /// A version-1 publisher's missing resume was reported.
    warned_v1: bool,
    end: Option<EndOfStream>,
    /// Records and bytes taken since the program was last given something.
    quiet: Quiet,
    counts: ClientCounts,
    /// The snapshot being read, when this connection's answer asked for one.
    snapshot: Option<Box<SnapshotReader>>,
    /// Whether a snapshot was taken (or given up): later connections do not ask again.
    snapshot_done: bool,
}

impl StreamClient {
    /// A client that has not connected yet.
    pub fn new(config: StreamClientConfig) -> StreamClient {
        let relay = matches!(config.role, Role::Relay { .. });
        let reader = FrameReader::new(ReaderConfig {
            mode: if relay { ReaderMode::Ordered } else { ReaderMode::Window },
            crc: config.protection.crc,
            key: config.key.clone(),
            symbols: config.symbols.clone(),
            echo_every: config.echo_every,
        });
        let initial = duration_ns(INITIAL_BACKOFF);
        let mut backoff = Backoff::new(initial, config.reconnect_max_ns);
        if let Some((fraction, seed)) = config.jitter {
            backoff = backoff.with_jitter(fraction, seed);
        }
        let violation_backoff = backoff.clone();
        StreamClient {
            snapshot: None,
            snapshot_done: false,
            reach: relay.then_some(Reach { started: 0, attempt: 0, reconnecting: false }),
            config,
            reader,
            phase: Phase::Idle,
            conn: None,
            backoff,
            events: VecDeque::new(),
            now: 0,
            receive_time: 0,
            hello: None,
            session: None,
            connected_before: false,
            attempt: 0,
            violation_backoff,
            last_violation: None,
            violations_without_frames: None,
            unreached_since: None,
            warned_v1: false,
            end: None,
            quiet: Quiet::new(),
            counts: ClientCounts::default(),
        }
    }

    /// The frame reader: its counts, tracker, formats.
    pub fn reader(&self) -> &FrameReader {
        &self.reader
    }

    /// The frame reader, to finish the run.
    pub fn reader_mut(&mut self) -> &mut FrameReader {
        &mut self.reader
    }

    /// What the client counted, over every connection so far.
    pub fn counts(&self) -> ClientCounts {
        let current = self.conn.as_ref().map(|c| c.counts()).unwrap_or_default();
        ClientCounts { connection: self.counts.connection + current, ..self.counts }
    }

    /// The session of the first greeting, once greeted.
    pub fn session(&self) -> Option<u64> {
        self.session
    }

    /// The publisher's `END`, once it came.
    pub fn end(&self) -> Option<&EndOfStream> {
        self.end.as_ref()
    }

    /// How the stream ended, once it has.
    pub fn finished(&self) -> Option<&Finish> {
        match &self.phase {
            Phase::Finished(finish) => Some(finish),
            _ => None,
        }
    }

    fn relay(&self) -> bool {
        matches!(self.config.role, Role::Relay { .. })
    }

    /// What to do at `now`.
    pub fn poll_action(&mut self, now: i64) -> ClientAction {
        self.now = now;
        match self.phase {
            Phase::Idle => self.connect_now(),
            Phase::Waiting(until) if now >= until => self.connect_now(),
            Phase::Waiting(until) => ClientAction::Wait(until),
            Phase::Connecting | Phase::Connected { .. } => ClientAction::Run,
            Phase::Finished(_) => ClientAction::Finished,
        }
    }

    fn connect_now(&mut self) -> ClientAction {
        if let Some(reach) = &mut self.reach
            && reach.attempt == 0
        {
            // A relay's time to give up counts from its first attempt.
            reach.started = self.now;
        }
        self.phase = Phase::Connecting;
        ClientAction::Connect
    }

    /// The stream ends for a reason outside the protocol (a relay's upstream that is its own
    /// server, a stop); `why` names it.
    pub fn give_up(&mut self, why: String) {
        self.finish(Finish::Fatal(why));
    }

    fn finish(&mut self, finish: Finish) {
        if !matches!(self.phase, Phase::Finished(_)) {
            self.events.push_back(ClientEvent::Finished(finish.clone()));
            self.phase = Phase::Finished(finish);
        }
    }

    /// Keeps the counts of the connection being replaced.
    fn retire_connection(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.counts.connection = self.counts.connection + conn.counts();
        }
    }

    /// A socket to `peer` was connected at `now`.
    pub fn connected(&mut self, peer: SocketAddr, now: i64) {
        self.now = now;
        if matches!(self.phase, Phase::Finished(_)) {
            return;
        }
        self.retire_connection();
        let again = self.connected_before;
        if !self.relay() {
            self.attempt += 1;
            if again {
                self.counts.reconnects += 1;
            }
            self.events.push_back(ClientEvent::Connected { peer, attempt: self.attempt, again });
            self.attempt = 0;
        } else {
            // A relay counts the attempts of one reach (see `relay_attempt_failed`).
            let attempt = self.reach.as_mut().map_or(1, |reach| {
                reach.attempt += 1;
                reach.attempt
            });
            self.events.push_back(ClientEvent::Connected { peer, attempt, again });
        }
        self.connected_before = true;
        self.counts.connections += 1;
        let mut config = match &self.config.role {
            Role::Relay { connect } => {
                ConnectionConfig::relay(connect.clone(), peer, self.config.protection.crc, Duration::ZERO)
            }
            _ => ConnectionConfig::subscriber(peer, self.config.protection, self.config.key.clone(), false),
        };
        config.echo = self.config.echo_every.is_some();
        config.handshake_timeout_ns = self.config.handshake_timeout_ns;
        config.idle_timeout_ns = self.config.idle_timeout_ns;
        config.read_buffer = self.config.read_buffer;
        config.resume = self.plan();
        config.snapshot = self.config.snapshot && !self.snapshot_done && self.reader.first_frame().is_none();
        self.hello = None;
        self.conn = Some(Box::new(StreamConnection::new(config, now)));
        self.phase = Phase::Connected { established_seen: false, streaming: false };
    }

    /// Where the next connection asks to start.
    fn plan(&self) -> ResumePlan {
        if self.relay() {
            return ResumePlan {
                session: self.session,
                next: self.reader.ordered_next(),
                from_start: false,
                same_session_only: true,
            };
        }
        let tracker = self.reader.tracker();
        ResumePlan {
            session: tracker.session(),
            next: tracker.highest().filter(|_| self.config.resume).map(|high| high.saturating_add(1)),
            from_start: self.config.from_start && self.reader.first_frame().is_none(),
            same_session_only: false,
        }
    }

    /// A connection attempt failed at `now` (refused, unreachable, timed out, a name that does
    /// not resolve); `why` says so, for a relay's message when it gives up.
    pub fn connect_failed(&mut self, why: &str, now: i64) {
        self.now = now;
        if matches!(self.phase, Phase::Finished(_)) {
            return;
        }
        if self.relay() {
            if let Some(reach) = &mut self.reach {
                reach.attempt += 1;
            }
            self.relay_attempt_failed(why.to_string());
        } else {
            self.attempt += 1;
            if let Some((seconds, limit)) = self.past_give_up(now) {
                // The next attempt would come after the limit: give up now, saying why.
                return self.finish(Finish::Fatal(format!(
                    "{why}; not reached in {} attempts over {seconds:.1} s (give up after {limit:?})",
                    self.attempt
                )));
            }
            let wait = self.backoff.next_wait();
            self.events.push_back(ClientEvent::ConnectFailed { why: None, attempt: self.attempt, retry_in: wait });
            self.phase = Phase::Waiting(now.saturating_add(wait));
        }
    }

    /// A relay's upstream said BUSY (at its connection limit), before or after the handshake
    /// completed: not a failed handshake, and not a connection that worked. The relay waits, the
    /// waits growing as for an upstream out of reach (never at once, which would ask again and
    /// again in a loop), and gives up when `give_up_after` would pass without the stream.
    fn relay_busy(&mut self, closed: Closed) {
        if matches!(self.phase, Phase::Connected { streaming: true, .. }) {
            // BUSY after the stream had started: the upstream was lost; its waits start over.
            self.reach = Some(Reach { started: self.now, attempt: 0, reconnecting: true });
            self.backoff.reset();
        }
        let reach = self.reach.unwrap_or(Reach { started: self.now, attempt: 1, reconnecting: false });
        let waited = self.now.saturating_sub(reach.started);
        let give_up = self.config.give_up_after_ns.unwrap_or(i64::MAX);
        if waited.saturating_add(self.backoff.peek()) > give_up {
            return self.relay_attempt_failed(closed.why);
        }
        let wait = self.backoff.next_wait();
        self.events.push_back(ClientEvent::Lost { closed, retry_in: wait });
        self.phase = Phase::Waiting(self.now.saturating_add(wait));
    }

    /// A subscriber out of reach (or told busy) since its first such attempt, or since `now`:
    /// when its next wait would pass its limit, the seconds out of reach so far and the limit.
    fn past_give_up(&mut self, now: i64) -> Option<(f64, Duration)> {
        let since = *self.unreached_since.get_or_insert(now);
        let limit = self.config.give_up_after_ns?;
        let out_of_reach = now.saturating_sub(since);
        (out_of_reach.saturating_add(self.backoff.peek()) > limit).then(|| (out_of_reach as f64 / 1e9, shown(limit)))
    }

    /// A relay's attempt failed: another after a wait, or give up if that would pass
    /// `give_up_after`.
    fn relay_attempt_failed(&mut self, why: String) {
        let reach = self.reach.unwrap_or(Reach { started: self.now, attempt: 1, reconnecting: false });
        let waited = self.now.saturating_sub(reach.started);
        let give_up = self.config.give_up_after_ns.unwrap_or(i64::MAX);
        if waited.saturating_add(self.backoff.peek()) > give_up {
            let since = if reach.reconnecting { "after losing it" } else { "at start" };
            let connect = match &self.config.role {
                Role::Relay { connect } => connect.as_str(),
                _ => "",
            };
            return self.finish(Finish::Fatal(format!(
                "upstream {connect}: {why}; not reached in {} attempts over {:.1} s {since} (source.upstream.give_up_after = {:?})",
                reach.attempt,
                waited as f64 / 1e9,
                shown(give_up)
            )));
        }
        let wait = self.backoff.next_wait();
        self.events.push_back(ClientEvent::ConnectFailed { why: Some(why), attempt: reach.attempt, retry_in: wait });
        self.phase = Phase::Waiting(self.now.saturating_add(wait));
    }

    fn conn(&mut self) -> Option<&mut StreamConnection> {
        self.conn.as_deref_mut()
    }

    /// Where to read the connection's next bytes into (empty without a connection).
    pub fn read_buf(&mut self) -> &mut [u8] {
        match self.conn() {
            Some(conn) => conn.read_buf(),
            None => &mut [],
        }
    }

    /// `n` bytes were read at `now` (monotonic) and `receive_time` (the wall clock, ns since
    /// the epoch); 0: the peer closed.
    pub fn received(&mut self, n: usize, now: i64, receive_time: i64) {
        self.now = now;
        if n > 0 {
            self.receive_time = receive_time;
            self.quiet.received(n);
        }
        if let Some(conn) = self.conn() {
            conn.received(n, now);
        }
    }

    /// A read failed.
    pub fn read_failed(&mut self, error: &dyn fmt::Display, now: i64) {
        self.now = now;
        if let Some(conn) = self.conn() {
            conn.read_failed(error);
        }
    }

    /// Bytes the current connection's read buffer holds without growing (0 without one).
    pub fn buffer_capacity(&self) -> usize {
        self.conn.as_ref().map_or(0, |c| c.buffer_capacity())
    }

    /// Bytes to write to the connection.
    pub fn transmit(&self) -> &[u8] {
        self.conn.as_ref().map_or(&[], |c| c.transmit())
    }

    /// `n` bytes of [`StreamClient::transmit`] were written.
    pub fn transmitted(&mut self, n: usize) {
        if let Some(conn) = self.conn() {
            conn.transmitted(n);
        }
    }

    /// The driver will write nothing more to the connection (the stream is over): what is
    /// still unsent is dropped, and its echoes counted as dropped.
    pub fn discard_unsent(&mut self) {
        if let Some(conn) = self.conn() {
            conn.discard_unsent();
        }
    }

    /// A write failed.
    pub fn write_failed(&mut self, error: &dyn fmt::Display, now: i64) {
        self.now = now;
        if let Some(conn) = self.conn() {
            conn.write_failed(error);
        }
    }

    /// When [`StreamClient::on_timeout`] (or, while waiting, [`StreamClient::poll_action`]) is
    /// due, if ever.
    pub fn deadline(&self) -> Option<i64> {
        match &self.phase {
            Phase::Connected { .. } => self.conn.as_ref().and_then(|c| c.deadline()),
            Phase::Waiting(until) => Some(*until),
            _ => None,
        }
    }

    /// Time passed.
    pub fn on_timeout(&mut self, now: i64) {
        self.now = now;
        if let Some(conn) = self.conn() {
            conn.on_timeout(now);
        }
    }

    /// The next event, handing frames to `visitor` as their records are read; poll until `None`
    /// before reading again.
    pub fn poll_event<V: FrameVisitor + ?Sized>(&mut self, visitor: &mut V) -> Option<ClientEvent> {
        loop {
            if let Some(event) = self.events.pop_front() {
                self.quiet.produced();
                return Some(event);
            }
            if self.quiet.turn_due() {
                return Some(ClientEvent::Quiet);
            }
            let relay = self.relay();
            let StreamClient {
                phase,
                conn,
                reader,
                events,
                hello,
                receive_time,
                now,
                reach,
                counts,
                session,
                warned_v1,
                violations_without_frames,
                unreached_since,
                end,
                quiet,
                snapshot,
                snapshot_done,
                config,
                ..
            } = self;
            let (Phase::Connected { established_seen, streaming }, Some(conn)) = (phase, conn.as_deref_mut()) else {
                return None;
            };
            if !*established_seen && conn.is_established() {
                *established_seen = true;
                continue;
            }
            let event = conn.poll_event()?;
            if !*streaming
                && matches!(
                    event,
                    ConnectionEvent::Format { .. } | ConnectionEvent::Data { .. } | ConnectionEvent::End { .. }
                )
            {
                *streaming = true;
                // A connection that works (the stream started, not only the handshake: a
                // publisher at its limit completes it, then says BUSY): a subscriber's limit
                // counts from its next failure.
                *unreached_since = None;
                if relay && let Some(done) = reach.take() {
                    // A relay's attempt succeeds when the stream starts: a BUSY after the
                    // handshake is no success (and no reconnection).
                    *reach = Some(Reach { started: *now, attempt: 0, reconnecting: false });
                    if done.reconnecting {
                        counts.reconnects += 1;
                        events.push_back(ClientEvent::Reconnected { attempt: done.attempt });
                    }
                }
            }
            let stream_session = hello.map_or(0, |h| h.session);
            let mut ended = None;
            // Whether the record gave the program something: an event (handed out next round,
            // which counts it) or a frame or format for the visitor.
            let events_before = events.len();
            let mut gave = false;
            if matches!(event, ConnectionEvent::Format { .. } | ConnectionEvent::Data { .. })
                && let Some(reader) = snapshot.take()
            {
                // The stream began without the snapshot asked for (or before its end).
                *snapshot_done = true;
                let why = reader.started().then(|| "the stream began before the snapshot's closing record".to_string());
                events.push_back(ClientEvent::SnapshotMissing { why });
            }
            match event {
                ConnectionEvent::Greeted { hello: greeting, resume, answer } => {
                    *hello = Some(greeting);
                    *snapshot = answer.snapshot.then(Box::default);
                    let first = session.is_none();
                    if first {
                        *session = Some(greeting.session);
                    }
                    if !relay {
                        if let Greeted::Restarted { old } =
                            reader.tracker_mut().greeted(greeting.session, greeting.next_sequence)
                        {
                            events.push_back(ClientEvent::Restarted { old, new: greeting.session });
                        }
                        if let Some(change) = reader.note_format(greeting.format) {
                            visitor.format_changed(change.from, change.to);
                        }
                    }
                    // A version-1 publisher's missing resume is reported once.
                    let resume = match resume {
                        Start::ResumeUnsupported { .. } if *warned_v1 => Start::Live,
                        Start::ResumeUnsupported { version } => {
                            *warned_v1 = true;
                            Start::ResumeUnsupported { version }
                        }
                        other => other,
                    };
                    events.push_back(ClientEvent::Greeted { hello: greeting, resume, first });
                }
                ConnectionEvent::Snapshot { header, payload, payload_at } => {
                    gave = true;
                    match snapshot.as_deref_mut() {
                        None => events.push_back(ClientEvent::OutOfPlace { tag: RecordTag::Snapshot, at: payload_at }),
                        Some(reader) => {
                            let mut protector = Protector::new(
                                config.protection.crc,
                                config.key.as_ref(),
                                mdrelay_codec::Limits::default().max_frame,
                            );
                            match reader.record(&header, payload, &mut protector, stream_session, Default::default()) {
                                Ok(None) => {}
                                Ok(Some(read)) => {
                                    *snapshot = None;
                                    *snapshot_done = true;
                                    events.push_back(ClientEvent::Snapshot(Arc::new(read)));
                                }
                                Err(error) => {
                                    *snapshot = None;
                                    *snapshot_done = true;
                                    let why =
                                        format!("{error} (record at stream byte {})", payload_at.saturating_sub(16));
                                    events.push_back(ClientEvent::SnapshotMissing { why: Some(why) });
                                }
                            }
                        }
                    }
                }
                ConnectionEvent::Format { format, first_sequence, .. } => {
                    if !relay {
                        // The first record names the first frame offered to this subscriber.
                        reader.tracker_mut().expect_from(first_sequence);
                    }
                    if let Some(change) = reader.note_format(format) {
                        visitor.format_changed(change.from, change.to);
                        gave = true;
                    }
                }
                ConnectionEvent::Resume { asked, offered } => {
                    if asked == offered {
                        counts.resumes += 1;
                        events.push_back(ClientEvent::Resumed { from: asked });
                    } else {
                        events.push_back(ClientEvent::ResumeFailed { asked, offered });
                    }
                }
                ConnectionEvent::Data { header, payload, payload_at } => {
                    let p = Payload {
                        origin: Origin::Stream,
                        format: header.format,
                        bytes: payload,
                        first_sequence: header.sequence,
                        declared_frames: u64::from(header.frame_count),
                        session: stream_session,
                        receive_time: *receive_time,
                        now: *now,
                        place: Place::Stream(payload_at),
                    };
                    let outcome = reader.payload(p, visitor);
                    if outcome.decoded > 0 {
                        *violations_without_frames = None;
                        gave = true;
                    }
                    if let Some(failed) = outcome.check_failed {
                        let at = payload_at.saturating_add(failed.at.1);
                        events.push_back(ClientEvent::FrameCheckFailed {
                            sequence: failed.sequence,
                            at,
                            error: failed.error.clone(),
                        });
                        conn.abort(CloseReason::FrameCheck { sequence: failed.sequence, at, error: failed.error });
                    }
                    if reader.has_echoes() {
                        let format = reader.current_format().unwrap_or(Format::Raw);
                        for echo in reader.drain_echoes() {
                            conn.queue_echo(echo, format);
                        }
                    }
                }
                ConnectionEvent::End { next_sequence, totals, payload_at } => {
                    let believed = if relay {
                        // Believed when it fits the stream: a wild number would invent loss
                        // downstream.
                        let next = reader.ordered_next().unwrap_or(1);
                        next_sequence >= next && next_sequence - next <= u64::from(u32::MAX)
                    } else {
                        reader.tracker_mut().end(next_sequence);
                        true
                    };
                    let totals = totals.map_err(|e| (payload_at.saturating_add(e.offset as u64), e));
                    let eos = EndOfStream { next_sequence, believed, totals };
                    *end = Some(eos.clone());
                    events.push_back(ClientEvent::End(eos));
                }
                ConnectionEvent::OutOfPlace { tag, at } => events.push_back(ClientEvent::OutOfPlace { tag, at }),
                ConnectionEvent::Violation { violation, at } => {
                    events.push_back(ClientEvent::Violation { violation, at })
                }
                // Answers of a recovery connection: never on a stream connection.
                ConnectionEvent::Gone { .. } | ConnectionEvent::Busy { .. } => {}
                ConnectionEvent::Closed(closed) => ended = Some(closed),
            }
            if gave {
                quiet.produced();
            } else if events.len() == events_before {
                quiet.took();
            }
            if let Some(closed) = ended {
                self.closed(closed);
            }
        }
    }

    /// The connection ended: what next.
    fn closed(&mut self, closed: Closed) {
        let now = self.now;
        match closed.reason.disposition() {
            Disposition::Finished => self.finish(Finish::End),
            Disposition::Refused => self.finish(Finish::Refused(closed)),
            Disposition::Fatal => {
                let why = closed.why.clone();
                self.finish(Finish::Fatal(why))
            }
            _ if self.relay() => self.relay_lost(closed),
            disposition => {
                // A connection whose handshake worked starts the waits over; one that broke its
                // numbering or was busy does not, so a publisher that keeps failing is not
                // connected to in a loop.
                if closed.established && disposition == Disposition::Retry {
                    self.backoff.reset();
                }
                if disposition == Disposition::Busy {
                    // A publisher at its limit serves no stream: the subscriber's limit runs as
                    // for one out of reach.
                    if let Some((seconds, limit)) = self.past_give_up(now) {
                        return self.finish(Finish::Fatal(format!(
                            "{}; still busy after {seconds:.1} s of attempts (give up after {limit:?})",
                            closed.why
                        )));
                    }
                }
                let wait = self.backoff.next_wait();
                self.events.push_back(ClientEvent::Lost { closed, retry_in: wait });
                self.phase = Phase::Waiting(now.saturating_add(wait));
            }
        }
    }

    /// A relay's connection ended: a failed attempt, a lost connection (reached again at once),
    /// or a violation (after a wait).
    fn relay_lost(&mut self, closed: Closed) {
        let now = self.now;
        if closed.reason.disposition() == Disposition::Violation {
            let forgotten = duration_ns(VIOLATIONS_FORGOTTEN_AFTER);
            if self.last_violation.is_none_or(|last| now.saturating_sub(last) > forgotten) {
                self.violation_backoff.reset();
            }
            self.last_violation = Some(now);
            let wait = self.violation_backoff.next_wait();
            let (since, count) = self.violations_without_frames.get_or_insert((now, 0));
            *count += 1;
            let (since, count) = (*since, *count);
            let give_up = self.config.give_up_after_ns.unwrap_or(i64::MAX);
            // The first violation always gets another connection; then, as when the upstream is
            // out of reach, `give_up_after` bounds the time without a frame that fits.
            if count > 1 && now.saturating_sub(since).saturating_add(wait) > give_up {
                let connect = match &self.config.role {
                    Role::Relay { connect } => connect.clone(),
                    _ => String::new(),
                };
                return self.finish(Finish::Fatal(format!(
                    "upstream {connect}: {}; {count} protocol violations in a row over {:.1} s without a frame taken (source.upstream.give_up_after = {:?})",
                    closed.why,
                    now.saturating_sub(since) as f64 / 1e9,
                    shown(give_up)
                )));
            }
            self.reach = Some(Reach { started: now, attempt: 0, reconnecting: true });
            self.backoff.reset();
            self.events.push_back(ClientEvent::Lost { closed, retry_in: wait });
            self.phase = Phase::Waiting(now.saturating_add(wait));
            return;
        }
        if closed.reason.disposition() == Disposition::Busy {
            return self.relay_busy(closed);
        }
        if !closed.established {
            // The handshake did not complete: this attempt failed.
            return self.relay_attempt_failed(closed.why);
        }
        // A connection that worked: reached again at once, with waits from the first.
        self.reach = Some(Reach { started: now, attempt: 0, reconnecting: true });
        self.backoff.reset();
        self.events.push_back(ClientEvent::Lost { closed, retry_in: 0 });
        self.phase = Phase::Idle;
    }
}

/// A duration of ns as `Debug` shows it, as the programs have always written it.
fn shown(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
