//! The UDP and multicast driver: moves datagrams from one or two sockets (A/B lines) into
//! [`DatagramReceiver`], which decides everything (protection, held datagrams, the end, the
//! lines, when to ask for missing frames); sends the echoes it makes; connects to the
//! retransmission service when it says, and moves that connection's bytes.
//!
//! Every wait is a readiness wait, a sleep, or the recovery connection being made (kept in the
//! driver), so a wait that is dropped loses nothing. Datagrams (and recovery bytes) that give
//! the caller nothing are counted ([`Quiet`]); after a budget of them the driver yields to the
//! runtime, so the caller's deadline, ticks and signals get their turn whatever arrives.

use crate::collect::Collector;
use crate::counters::Counters;
use crate::error::Error;
use crate::event::{End, Event, Notice, RecoveryEvent, Skipped};
use crate::net::{self, Clock, Connecting, shown};
use crate::poll::{Idle, Poller};
use crate::settings::{Checked, Transport};
use mdrelay_proto::relay::Totals;
use mdrelay_proto::relay::client::{
    DatagramConfig, DatagramEvent, DatagramReceiver, Line, Origin, Quiet, ReaderConfig, RecoveryAction, RecoveryConfig,
};
use socket2::SockRef;
use std::io;
use std::net::SocketAddr;
use std::task::Poll;
use std::time::Duration;
use tokio::net::{TcpStream, UdpSocket};

/// Largest UDP payload there is.
const MAX_DATAGRAM: usize = 65_536;

/// The connection to the retransmission service.
struct Link {
    server: String,
    connect_timeout: Duration,
    conn: Option<TcpStream>,
    connecting: Option<Connecting>,
    blocked_write: bool,
    /// The service's address, once connected.
    peer: Option<SocketAddr>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("server", &self.server).field("connected", &self.conn.is_some()).finish()
    }
}

/// One line's socket.
#[derive(Debug)]
struct LineSocket {
    socket: UdpSocket,
    origin: Origin,
    granted: usize,
}

/// A UDP or multicast subscription's driver.
#[derive(Debug)]
pub(crate) struct UdpDriver {
    receiver: DatagramReceiver,
    lines: Vec<LineSocket>,
    /// The line read first in the next round, so neither waits behind the other.
    turn: usize,
    buf: Vec<u8>,
    link: Option<Link>,
    notes: EndNotes,
    /// The retransmission service as configured, for the report.
    recovery_server: String,
    echoes_sent: u64,
    echoes_dropped: u64,
    busy_poll_refused: bool,
    clock: Clock,
    poller: Poller,
    /// Datagrams and bytes taken since the caller was last given something.
    quiet: Quiet,
    finished: bool,
}

impl UdpDriver {
    /// Binds (and joins) the lines' sockets.
    pub fn start(settings: &Checked, clock: Clock) -> Result<UdpDriver, Error> {
        let a = net::open_udp(&settings.transport, setting_of(&settings.transport), settings.receive_buffer)?;
        let b = match &settings.line_b {
            Some(line) => Some(net::open_udp(line, "line_b", settings.receive_buffer)?),
            None => None,
        };
        let name = |s: &UdpSocket| s.local_addr().map_or_else(|_| "-".to_string(), |a| a.to_string());
        let names = b.as_ref().map(|b| (name(&a.socket), name(&b.socket)));
        let config = DatagramConfig {
            reader: ReaderConfig {
                crc: settings.protection.crc,
                key: settings.key.clone(),
                symbols: settings.symbols.clone(),
                echo_every: settings.echo_every,
                ..ReaderConfig::default()
            },
            from_start: settings.from_start,
            lines: names,
            recovery: settings.recovery.as_ref().map(|r| RecoveryConfig {
                delay: r.delay,
                retry: r.retry,
                attempts: r.attempts,
                linger: r.linger,
            }),
            snapshot: settings.snapshot,
        };
        let mut busy_poll_refused = false;
        let mut lines = Vec::new();
        let two = b.is_some();
        for (opened, line) in [Some(a), b].into_iter().flatten().zip([Line::A, Line::B]) {
            if settings.busy_poll && !net::busy_poll(SockRef::from(&opened.socket)) {
                busy_poll_refused = true;
            }
            let origin = if two { Origin::Line(line) } else { Origin::Stream };
            lines.push(LineSocket { socket: opened.socket, origin, granted: opened.granted });
        }
        Ok(UdpDriver {
            receiver: DatagramReceiver::new(config),
            lines,
            turn: 0,
            buf: vec![0u8; MAX_DATAGRAM],
            link: settings.recovery.as_ref().map(|r| Link {
                server: r.server.clone(),
                connect_timeout: settings.connect_timeout,
                conn: None,
                connecting: None,
                blocked_write: false,
                peer: None,
            }),
            notes: EndNotes::default(),
            recovery_server: settings.recovery.as_ref().map(|r| r.server.clone()).unwrap_or_default(),
            echoes_sent: 0,
            echoes_dropped: 0,
            busy_poll_refused,
            clock,
            poller: Poller::new(settings.idle),
            quiet: Quiet::new(),
            finished: false,
        })
    }

    /// The local addresses of the lines (A first).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.lines.iter().filter_map(|l| l.socket.local_addr().ok()).collect()
    }

    /// The stream ended.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Moves bytes until the machine has something for the caller, or the stream is over.
    pub async fn step(&mut self, out: &mut Collector) -> Result<(), Error> {
        loop {
            self.pump(out);
            if out.has_items() || self.finished {
                self.quiet.produced();
                return Ok(());
            }
            if self.quiet.turn_due() {
                // Datagrams that give nothing go on: the caller's deadline, a select!'s other
                // branches and the runtime's timers run before the next ones are taken.
                tokio::task::yield_now().await;
                continue;
            }
            let now = self.clock.now();
            if self.recovery_io(now).await {
                self.quiet.took();
                continue;
            }
            // Before the datagrams: a stream that never pauses still gets its gaps asked for.
            if let Some(deadline) = self.receiver.deadline()
                && deadline <= now
            {
                self.receiver.on_timeout(now);
                continue;
            }
            if self.receive(out) {
                self.quiet.took();
                continue;
            }
            match self.poller.empty() {
                Idle::Poll => continue,
                Idle::Yield => {
                    tokio::task::yield_now().await;
                    continue;
                }
                Idle::Park => self.park().await,
            }
        }
    }

    /// The recovery connection: made when the machine asks, written and read. True when
    /// something happened.
    async fn recovery_io(&mut self, now: i64) -> bool {
        let Some(link) = &mut self.link else { return false };
        if link.conn.is_none()
            && link.connecting.is_none()
            && self.receiver.recovery_action(now) == Some(RecoveryAction::Connect)
        {
            link.connecting = Some(net::connect(link.server.clone(), link.connect_timeout, None));
        }
        if let Some(connecting) = &mut link.connecting {
            // Polled once: the connection is made in the background of the datagrams.
            let polled = std::future::poll_fn(|cx| Poll::Ready(connecting.as_mut().poll(cx))).await;
            let Poll::Ready(made) = polled else { return false };
            self.link_made(made);
            return true;
        }
        let Some(fd) = &link.conn else { return false };
        let mut moved = false;
        loop {
            let pending = self.receiver.recovery_transmit();
            if pending.is_empty() {
                link.blocked_write = false;
                break;
            }
            match fd.try_write(pending) {
                Ok(n) => {
                    self.receiver.recovery_transmitted(n);
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    link.blocked_write = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.receiver.recovery_write_failed(&e);
                    return true;
                }
            }
        }
        let buf = self.receiver.recovery_read_buf();
        if buf.is_empty() {
            return moved;
        }
        match fd.try_read(buf) {
            Ok(n) => {
                self.receiver.recovery_received(n, now, self.clock.wall());
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => moved,
            Err(e) => {
                self.receiver.recovery_read_failed(&e);
                true
            }
        }
    }

    /// Takes one datagram from the lines (in turn), and sends the echoes it makes; false when
    /// none was waiting.
    fn receive(&mut self, out: &mut Collector) -> bool {
        let count = self.lines.len();
        for k in 0..count {
            let i = (self.turn + k) % count;
            let line = &self.lines[i];
            let (n, peer) = match line.socket.try_recv_from(&mut self.buf) {
                Ok(r) => r,
                // An ICMP error for an echo sent earlier, say: the socket stays usable.
                Err(_) => continue,
            };
            self.turn = i + 1;
            self.quiet.received(n);
            let now = self.clock.now();
            out.stream_peer = Some(peer);
            self.receiver.datagram(line.origin, &self.buf[..n], peer, now, self.clock.wall(), out);
            if let Some(to) = self.receiver.last_peer() {
                while let Some(echo) = self.receiver.next_echo() {
                    // Echoes are best effort: one lost is one round trip less.
                    match line.socket.try_send_to(&echo, to) {
                        Ok(_) => self.echoes_sent += 1,
                        Err(_) => self.echoes_dropped += 1,
                    }
                }
            }
            self.poller.data();
            return true;
        }
        false
    }

    /// The recovery connection was made, or could not be.
    fn link_made(&mut self, made: Result<(TcpStream, SocketAddr), String>) {
        let Some(link) = &mut self.link else { return };
        link.connecting = None;
        let now = self.clock.now();
        match made {
            Ok((fd, peer)) => {
                link.peer = Some(peer);
                link.conn = Some(fd);
                link.blocked_write = false;
                self.receiver.recovery_connected(peer, now);
            }
            Err(why) => self.receiver.recovery_connect_failed(&why, now),
        }
    }

    /// Waits for a line, the recovery connection (being made, or its bytes) or the machine's
    /// deadline.
    async fn park(&mut self) {
        let clock = self.clock;
        let deadline = self.receiver.deadline();
        let sleep = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(clock.instant(d)).await,
                None => std::future::pending().await,
            }
        };
        let a = &self.lines[0].socket;
        let b = self.lines.get(1).map(|l| &l.socket);
        let (conn, blocked_write, connecting) = match &mut self.link {
            Some(Link { conn, blocked_write, connecting, .. }) => (conn.as_ref(), *blocked_write, connecting.as_mut()),
            None => (None, false, None),
        };
        let making = connecting.is_some();
        let made = tokio::select! {
            _ = a.readable() => None,
            _ = async { b.expect("guarded").readable().await }, if b.is_some() => None,
            _ = async { conn.expect("guarded").readable().await }, if conn.is_some() => None,
            _ = async { conn.expect("guarded").writable().await }, if conn.is_some() && blocked_write => None,
            made = async { connecting.expect("guarded").as_mut().await }, if making => Some(made),
            _ = sleep => None,
        };
        if let Some(made) = made {
            self.link_made(made);
        }
    }

    /// Takes the machine's events.
    fn pump(&mut self, out: &mut Collector) {
        out.recovery_peer = self.link.as_ref().and_then(|l| l.peer);
        while let Some(event) = self.receiver.poll_event(out) {
            let notice = match event {
                DatagramEvent::EchoIgnored { .. }
                | DatagramEvent::Ending { .. }
                | DatagramEvent::EndWaitOver { .. } => {
                    continue;
                }
                DatagramEvent::End { next_sequence, totals, .. } => {
                    self.notes.ended(next_sequence, totals);
                    continue;
                }
                DatagramEvent::Snapshot(snapshot) => {
                    self.notes.snapshot = Some((snapshot.state.as_of, snapshot.totals.clone()));
                    Event::Snapshot(crate::event::Snapshot::new(snapshot))
                }
                DatagramEvent::SnapshotMissing { why } => Event::SnapshotMissing { reason: why },
                DatagramEvent::Finished => {
                    self.finish_run(out);
                    let counters = self.counters_with(out);
                    self.notes.finished(&counters)
                }
                DatagramEvent::RecoveryConnected { peer, session, stream } => {
                    Event::Recovery(RecoveryEvent::Connected { peer, session, other_session: stream.is_some() })
                }
                DatagramEvent::RecoveryBusy { first } => Event::Recovery(RecoveryEvent::Busy { first }),
                DatagramEvent::RecoveryOutOfPlace { tag, at } => {
                    Event::Skipped(Skipped::OutOfPlace { tag: tag as u8, at })
                }
                DatagramEvent::RecoveryLost { why, retry_in, quiet } => {
                    if let Some(link) = &mut self.link {
                        link.conn = None;
                    }
                    if quiet {
                        Event::Recovery(RecoveryEvent::Closed { reason: why })
                    } else {
                        Event::Recovery(RecoveryEvent::Lost { reason: why, retry_in: shown(retry_in) })
                    }
                }
                DatagramEvent::RecoveryRefused { why } => {
                    if let Some(link) = &mut self.link {
                        link.conn = None;
                    }
                    Event::Recovery(RecoveryEvent::Refused { reason: why })
                }
                other => match datagram_notice(other) {
                    Some(notice) => notice,
                    None => continue,
                },
            };
            out.notice(notice);
        }
        self.notes.note_given_up(&self.receiver, out);
    }

    /// The run is over: what is still held or missing is given up.
    fn finish_run(&mut self, out: &mut Collector) {
        if !self.finished {
            self.finished = true;
            self.receiver.finish_run();
            self.notes.note_given_up(&self.receiver, out);
            self.link = None;
        }
    }

    /// Ends the stream now.
    pub fn close(&mut self, out: &mut Collector) {
        self.finish_run(out);
    }

    /// What was counted, with what the collector counted.
    pub fn counters_with(&self, out: &Collector) -> Counters {
        let d = self.receiver.counts();
        let reader = self.receiver.reader();
        let lines = reader.lines();
        Counters {
            bytes: d.bytes,
            invalid_packets: d.invalid_packets,
            echoes_sent: self.echoes_sent,
            echoes_dropped: self.echoes_dropped,
            datagrams: d.datagrams,
            receive_buffers: self.lines.iter().map(|l| l.granted).collect(),
            lines: lines.map(|l| l.report()),
            arbitrated: lines.map_or(0, |l| l.arbitrated()),
            recovery: reader.book().map(|b| b.report(&self.recovery_server)),
            publisher_totals: self.receiver.publisher_totals().cloned(),
            busy_poll_refused: self.busy_poll_refused,
            ..Counters::of_reader(reader, &out.tally, lines.map(|l| l.merged_extra()).unwrap_or_default())
        }
    }
}

/// What a datagram driver (UDP or NATS) keeps of the publisher's END until the machine
/// finishes, and the frames given up it has told of.
#[derive(Debug, Default)]
pub(crate) struct EndNotes {
    end: Option<(u64, Totals)>,
    /// The snapshot taken: its frame and the stream's totals up to it, which the end's verdict
    /// counts with what was taken after it.
    pub snapshot: Option<(u64, Totals)>,
    /// Frames given up so far, to tell when more are.
    given_up: u64,
}

impl EndNotes {
    /// The publisher's END arrived: it is told when the machine finishes.
    pub fn ended(&mut self, next_sequence: u64, totals: Totals) {
        self.end = Some((next_sequence, totals));
    }

    /// The machine finished: the end of the stream, complete when `counters` match the END.
    pub fn finished(&mut self, counters: &Counters) -> Notice {
        let (next_sequence, totals) = match self.end.take() {
            Some((next, totals)) => (next, Some(totals)),
            None => (0, None),
        };
        let complete = totals.as_ref().is_some_and(|t| match &self.snapshot {
            Some((as_of, before)) => counters.matches_after_snapshot(t, *as_of, before),
            None => counters.matches(t),
        });
        Event::End(End { totals, next_sequence, complete })
    }

    /// Tells of frames given up since the last look.
    pub fn note_given_up(&mut self, receiver: &DatagramReceiver, out: &mut Collector) {
        let Some(book) = receiver.reader().book() else { return };
        let now = book.counts().frames_unrecoverable;
        if now > self.given_up {
            out.notice(Event::GivenUp { frames: now - self.given_up });
        }
        // A frame given up and then taken after all leaves the count: followed down too.
        self.given_up = now;
    }
}

/// The event a datagram machine's event is for the caller, for the events that need nothing of
/// the driver's (the session, restarts, what was skipped, frames a store or service no longer
/// has); `None` for the others.
pub(crate) fn datagram_notice(event: DatagramEvent) -> Option<Notice> {
    Some(match event {
        DatagramEvent::RecoveryGone { first, count } => Event::Recovery(RecoveryEvent::Gone { first, count }),
        DatagramEvent::SessionStarted { session, peer } => Event::SessionStarted { session, peer },
        DatagramEvent::Restarted { old, new, .. } => Event::Restarted { old, new },
        DatagramEvent::Held { session, sequence, peer } => Event::Skipped(Skipped::Held { peer, session, sequence }),
        DatagramEvent::NotRelay { peer, len, .. } => {
            Event::Skipped(Skipped::Invalid { peer, len, what: "not a relay datagram".into() })
        }
        DatagramEvent::BadHeader { peer, len, error } => {
            Event::Skipped(Skipped::Invalid { peer, len, what: error.to_string() })
        }
        DatagramEvent::Refused { peer, sequence, why, .. } => {
            Event::Skipped(Skipped::Protection { at: format!("datagram from {peer}"), first: sequence, why })
        }
        DatagramEvent::UnreadableEnd { peer, at, error } => {
            Event::Skipped(Skipped::End { peer, what: format!("its totals cannot be read at byte {at}: {error}") })
        }
        DatagramEvent::ForeignEnd { peer, session, next_sequence } => Event::Skipped(Skipped::End {
            peer,
            what: format!("of session {session:#x} up to frame {next_sequence}: it does not fit the stream"),
        }),
        _ => return None,
    })
}

/// The builder setting line A came from.
fn setting_of(transport: &Transport) -> &'static str {
    match transport {
        Transport::Multicast { .. } => "multicast",
        _ => "udp",
    }
}
