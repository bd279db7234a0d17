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
use crate::datagram::{self, DatagramDriver, EndNotes, Parts};
use crate::error::Error;
use crate::event::{Event, Notice, RecoveryEvent, Skipped};
use crate::net::{self, Clock, Connecting, Written, shown};
use crate::poll::{Idle, Poller};
use crate::settings::{Checked, Transport};
use mdrelay_proto::relay::client::{DatagramEvent, DatagramReceiver, Line, Origin, Quiet, RecoveryAction};
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
        let config = datagram::config(settings, settings.echo_every, names);
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
        })
    }

    /// The local addresses of the lines (A first).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.lines.iter().filter_map(|l| l.socket.local_addr().ok()).collect()
    }

    /// Moves bytes until the machine has something for the caller, or the stream is over.
    pub async fn step(&mut self, out: &mut Collector) -> Result<(), Error> {
        loop {
            // Datagrams that give nothing go on, with a yield to the runtime now and then.
            if let Some(result) = datagram::begin_round(self, out).await {
                return result;
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
        let (written, moved) = net::write_pending(
            fd,
            &mut self.receiver,
            DatagramReceiver::recovery_transmit,
            DatagramReceiver::recovery_transmitted,
        );
        match written {
            Written::Drained => link.blocked_write = false,
            Written::Blocked => link.blocked_write = true,
            Written::Failed(e) => {
                self.receiver.recovery_write_failed(&e);
                return true;
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
        let sleep = self.clock.sleep_until(self.receiver.deadline());
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
}

impl DatagramDriver for UdpDriver {
    fn parts(&mut self) -> Parts<'_> {
        Parts { receiver: &mut self.receiver, notes: &mut self.notes, quiet: &mut self.quiet }
    }

    /// Frames recovered are told as the recovery connection's peer's.
    fn before_pump(&mut self, out: &mut Collector) {
        out.recovery_peer = self.link.as_ref().and_then(|l| l.peer);
    }

    fn stop(&mut self) {
        self.link = None;
    }

    fn counters_with(&self, out: &Collector) -> Counters {
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

    fn own_notice(&mut self, event: DatagramEvent, _out: &mut Collector) -> Option<Notice> {
        Some(match event {
            DatagramEvent::RecoveryConnected { peer, session, stream } => {
                Event::Recovery(RecoveryEvent::Connected { peer, session, other_session: stream.is_some() })
            }
            DatagramEvent::RecoveryBusy { first } => Event::Recovery(RecoveryEvent::Busy { first }),
            DatagramEvent::RecoveryOutOfPlace { tag, at } => Event::Skipped(Skipped::OutOfPlace { tag: tag as u8, at }),
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
            // Echoes ignored, the end awaited, the other transports' events: nothing to tell.
            _ => return None,
        })
    }
}

/// The builder setting line A came from.
fn setting_of(transport: &Transport) -> &'static str {
    match transport {
        Transport::Multicast { .. } => "multicast",
        _ => "udp",
    }
}
