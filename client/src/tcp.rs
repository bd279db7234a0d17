//! The TCP driver: moves bytes between a socket and [`StreamClient`], which decides everything
//! (when to connect, the handshake, resume, restarts, records, echoes); connects when it says,
//! sleeps until its deadlines, and turns its events into the crate's [`Event`]s.
//!
//! Every wait is a readiness wait, a sleep, or the connection being made (kept in the driver),
//! so a wait that is dropped loses nothing: the next call goes on where it left off. When the
//! machine says records gave the caller nothing for a while ([`ClientEvent::Quiet`]), the
//! driver yields to the runtime before it goes on, so the caller's deadline, ticks and signals
//! get their turn whatever the publisher sends.

use crate::collect::Collector;
use crate::counters::Counters;
use crate::error::Error;
use crate::event::{End, Event, Skipped, Snapshot};
use crate::net::{self, Clock, Connecting, Written, shown};
use crate::poll::{Idle, Poller};
use crate::settings::Checked;
use mdrelay_proto::relay::client::{
    ClientAction, ClientEvent, CloseReason, Closed, Finish, StreamClient, StreamClientConfig,
};
use mdrelay_proto::relay::{HandshakeError, PROTOCOL_VERSION, SequenceCounts, Totals};
use socket2::SockRef;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// Items taken from the machine per call before they are handed out (see `TcpDriver::pump`).
const PUMP_BATCH: usize = 32;

/// A TCP subscription's driver.
#[derive(Debug)]
pub(crate) struct TcpDriver {
    address: String,
    client: StreamClient,
    conn: Option<TcpStream>,
    peer: Option<SocketAddr>,
    connecting: Option<ConnectingDebug>,
    connect_timeout: Duration,
    receive_buffer: Option<usize>,
    busy_poll: bool,
    busy_poll_refused: bool,
    /// Why the last connection attempt failed.
    last_error: String,
    /// The last write found the socket full: wait for room too.
    blocked_write: bool,
    end: Option<(u64, Option<Totals>)>,
    /// The snapshot taken: its frame and the stream's totals up to it, which the end's verdict
    /// counts with what came after it.
    snapshot: Option<(u64, Totals)>,
    clock: Clock,
    poller: Poller,
    /// The machine owes the caller a turn: yield to the runtime before going on.
    turn_due: bool,
    finished: bool,
}

/// A connection being made (its future has no `Debug`).
struct ConnectingDebug(Connecting);

impl std::fmt::Debug for ConnectingDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connecting")
    }
}

impl TcpDriver {
    /// A driver for `address`, checked to resolve.
    pub async fn start(address: String, settings: &Checked, clock: Clock) -> Result<TcpDriver, Error> {
        net::resolve(&address, settings.connect_timeout).await?;
        let mut config =
            StreamClientConfig::subscriber(settings.protection, settings.key.clone(), settings.reconnect_max);
        config.symbols = settings.symbols.clone();
        config.echo_every = settings.echo_every;
        config.from_start = settings.from_start;
        config.snapshot = settings.snapshot;
        config.resume = settings.resume;
        config.give_up_after_ns = settings.give_up_after.map(mdrelay_proto::backoff::duration_ns);
        Ok(TcpDriver {
            address,
            client: StreamClient::new(config),
            conn: None,
            peer: None,
            connecting: None,
            connect_timeout: settings.connect_timeout,
            receive_buffer: settings.receive_buffer,
            busy_poll: settings.busy_poll,
            busy_poll_refused: false,
            last_error: String::new(),
            blocked_write: false,
            end: None,
            snapshot: None,
            clock,
            poller: Poller::new(settings.idle),
            turn_due: false,
            finished: false,
        })
    }

    /// The stream ended (its end, an error, or a close).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Moves bytes until the machine has something for the caller, or the stream is over.
    pub async fn step(&mut self, out: &mut Collector) -> Result<(), Error> {
        loop {
            self.pump(out)?;
            if out.has_items() || self.finished {
                return Ok(());
            }
            if std::mem::take(&mut self.turn_due) {
                // Records that give nothing go on: the caller's deadline, a select!'s other
                // branches and the runtime's timers run before the next ones are taken.
                tokio::task::yield_now().await;
                continue;
            }
            let now = self.clock.now();
            match self.client.poll_action(now) {
                ClientAction::Finished => {
                    self.finished = true;
                    return Ok(());
                }
                ClientAction::Connect => {
                    let address = self.address.clone();
                    self.connecting =
                        Some(ConnectingDebug(net::connect(address, self.connect_timeout, self.receive_buffer)));
                }
                ClientAction::Wait(until) => tokio::time::sleep_until(self.clock.instant(until)).await,
                ClientAction::Run => {
                    if let Some(ConnectingDebug(connecting)) = &mut self.connecting {
                        let made = connecting.as_mut().await;
                        self.connecting = None;
                        self.connected(made);
                    } else {
                        self.io().await;
                    }
                }
            }
        }
    }

    /// A connection attempt ended.
    fn connected(&mut self, made: Result<(TcpStream, SocketAddr), String>) {
        let now = self.clock.now();
        match made {
            Ok((fd, peer)) => {
                if self.busy_poll && !net::busy_poll(SockRef::from(&fd)) {
                    self.busy_poll_refused = true;
                }
                self.conn = Some(fd);
                self.peer = Some(peer);
                self.blocked_write = false;
                self.client.connected(peer, now);
            }
            Err(why) => {
                self.client.connect_failed(&why, now);
                self.last_error = why;
            }
        }
    }

    /// Writes what the machine has to send; false when the connection failed.
    fn write(&mut self) {
        let Some(fd) = &self.conn else { return };
        match net::write_pending(fd, &mut self.client, StreamClient::transmit, StreamClient::transmitted).0 {
            Written::Drained => self.blocked_write = false,
            Written::Blocked => self.blocked_write = true,
            Written::Failed(e) => self.client.write_failed(&e, self.clock.now()),
        }
    }

    /// One round of I/O: write, read, or wait for either or the machine's deadline.
    async fn io(&mut self) {
        self.write();
        let now = self.clock.now();
        let Some(fd) = &self.conn else {
            // The machine runs a connection this driver no longer has: tell it so.
            self.client.read_failed(&"the connection is gone", now);
            return;
        };
        let buf = self.client.read_buf();
        if buf.is_empty() {
            return;
        }
        match fd.try_read(buf) {
            Ok(n) => {
                self.client.received(n, now, self.clock.wall());
                self.poller.data();
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            Err(e) => {
                self.client.read_failed(&e, now);
                return;
            }
        }
        let deadline = self.client.deadline();
        if deadline.is_some_and(|d| d <= now) {
            self.client.on_timeout(now);
            return;
        }
        match self.poller.empty() {
            Idle::Poll => return,
            Idle::Yield => return tokio::task::yield_now().await,
            Idle::Park => {}
        }
        let Some(fd) = &self.conn else { return };
        let clock = self.clock;
        let sleep = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(clock.instant(d)).await,
                None => std::future::pending().await,
            }
        };
        // Readiness found stale is cleared by the next `try_` call, which then waits again.
        let timed_out = tokio::select! {
            _ = fd.readable() => false,
            _ = fd.writable(), if self.blocked_write => false,
            _ = sleep => true,
        };
        if timed_out {
            self.client.on_timeout(self.clock.now());
        }
    }

    /// Takes the machine's events; an error when the stream ended with one.
    fn pump(&mut self, out: &mut Collector) -> Result<(), Error> {
        out.stream_peer = self.peer;
        // A read holds up to 256 KiB of records: the caller gets the first frames while their
        // messages are still in cache, rather than after all of them were stored. The machine
        // keeps the rest, and nothing is read before it has handed them out.
        while out.waiting() < PUMP_BATCH
            && let Some(event) = self.client.poll_event(out)
        {
            match event {
                ClientEvent::Connected { peer, attempt, again } => {
                    out.notice(Event::Connected { peer, attempt, reconnect: again })
                }
                ClientEvent::Greeted { hello, resume, .. } => out.notice(Event::Subscribed {
                    peer: self.peer.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
                    session: hello.session,
                    protocol_version: hello.protocol_version.min(PROTOCOL_VERSION),
                    format: hello.format,
                    start: resume,
                }),
                ClientEvent::Reconnected { .. } => {}
                ClientEvent::Quiet => {
                    self.turn_due = true;
                    break;
                }
                ClientEvent::Restarted { old, new } => out.notice(Event::Restarted { old, new }),
                ClientEvent::Resumed { from } => out.notice(Event::Resumed { asked: from, offered: from }),
                ClientEvent::ResumeFailed { asked, offered } => out.notice(Event::Resumed { asked, offered }),
                ClientEvent::OutOfPlace { tag, at } => {
                    out.notice(Event::Skipped(Skipped::OutOfPlace { tag: tag as u8, at }))
                }
                ClientEvent::Violation { violation, at } => {
                    out.notice(Event::Skipped(Skipped::Violation { at, what: violation.to_string() }))
                }
                ClientEvent::FrameCheckFailed { sequence, at, error } => {
                    out.notice(Event::Skipped(Skipped::Protection {
                        at: format!("stream byte {at}"),
                        first: sequence,
                        why: error.to_string(),
                    }))
                }
                ClientEvent::End(eos) => self.end = Some((eos.next_sequence, eos.totals.ok())),
                ClientEvent::Snapshot(snapshot) => {
                    self.snapshot = Some((snapshot.state.as_of, snapshot.totals.clone()));
                    out.notice(Event::Snapshot(Snapshot::new(snapshot)))
                }
                ClientEvent::SnapshotMissing { why } => out.notice(Event::SnapshotMissing {
                    reason: why.unwrap_or_else(|| {
                        "the publisher sent no snapshot: it keeps no state (tcp.snapshots = false, or no ring), or is an older build".into()
                    }),
                }),
                ClientEvent::ConnectFailed { why, attempt, retry_in } => out.notice(Event::Reconnecting {
                    reason: why.unwrap_or_else(|| self.last_error.clone()),
                    retry_in: shown(retry_in),
                    attempt,
                }),
                ClientEvent::Lost { closed, retry_in } => {
                    self.conn = None;
                    out.notice(match closed.reason {
                        CloseReason::Busy(reason) => Event::Busy { reason, retry_in: shown(retry_in) },
                        _ => Event::Reconnecting { reason: closed.why, retry_in: shown(retry_in), attempt: 0 },
                    });
                }
                ClientEvent::Finished(finish) => {
                    // Echoes still waiting go out if the socket takes them now; the rest count
                    // as dropped, so every echo is counted once, sent or dropped.
                    self.write();
                    self.client.discard_unsent();
                    self.conn = None;
                    self.finished = true;
                    self.client.reader_mut().finish();
                    match finish {
                        Finish::End => {
                            let (next_sequence, totals) = self.end.take().unwrap_or((0, None));
                            let counters = self.counters_with(out);
                            let complete = totals.as_ref().is_some_and(|t| match &self.snapshot {
                                Some((as_of, before)) => counters.matches_after_snapshot(t, *as_of, before),
                                None => counters.matches(t),
                            });
                            out.notice(Event::End(End { totals, next_sequence, complete }));
                        }
                        Finish::Refused(closed) => return Err(refusal(closed, self.peer)),
                        // A subscriber's machine gives up only when nothing could be reached for
                        // the time set (a close is no event of the stream).
                        Finish::Fatal(reason) => {
                            return Err(Error::Unreachable { address: self.address.clone(), reason });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Ends the stream now.
    pub fn close(&mut self) {
        self.write();
        // Nothing more is written: echoes still waiting count as dropped.
        self.client.discard_unsent();
        self.conn = None;
        self.connecting = None;
        if !self.finished {
            self.finished = true;
            self.client.give_up("closed by the application".into());
            self.client.reader_mut().finish();
        }
    }

    /// What was counted, with what the collector counted.
    pub fn counters_with(&self, out: &Collector) -> Counters {
        let c = self.client.counts();
        let conn = &c.connection;
        Counters {
            bytes: conn.bytes,
            invalid_packets: conn.bad_headers + conn.violations + conn.out_of_place,
            connections: c.connections,
            reconnects: c.reconnects,
            resumes: c.resumes,
            bad_headers: conn.bad_headers,
            violations: conn.violations,
            records_out_of_place: conn.out_of_place,
            echoes_sent: conn.echoes_sent,
            echoes_dropped: conn.echoes_dropped,
            publisher_totals: self.client.end().and_then(|e| e.totals.clone().ok()),
            busy_poll_refused: self.busy_poll_refused,
            ..Counters::of_reader(self.client.reader(), &out.tally, SequenceCounts::default())
        }
    }
}

/// What a refusal means for the caller.
fn refusal(closed: Closed, peer: Option<SocketAddr>) -> Error {
    let peer = peer.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
    match closed.reason {
        CloseReason::WrongKey => Error::WrongKey { peer },
        CloseReason::ProtectionMismatch { theirs, ours } => {
            Error::ProtectionMismatch { peer, publisher: theirs, subscriber: ours }
        }
        CloseReason::Version(HandshakeError::Version { protocol, schema }) => {
            Error::Version { peer, protocol, schema, detail: HandshakeError::Version { protocol, schema }.to_string() }
        }
        CloseReason::Version(HandshakeError::Malformed(e)) | CloseReason::NotAPublisher(e) => {
            Error::NotAPublisher { peer, detail: e.to_string() }
        }
        CloseReason::Refused(reason) => Error::Refused { peer, reason },
        _ => Error::Ended { peer: peer.to_string(), reason: closed.why },
    }
}
