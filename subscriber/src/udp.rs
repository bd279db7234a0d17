//! UDP, unicast or multicast: the sockets (SO_REUSEADDR, a large receive buffer, the group
//! joined on the configured interface; two of them for A/B lines) and the datagram loop: relay
//! header, publisher session, frames, the END, echoes back to each datagram's sender.
//!
//! With recovery, the loop also asks for missing frames (a timer looks at the gaps twice per
//! delay or retry, every 1 to 10 ms) and takes the retransmission service's answers; after the END it keeps receiving
//! until nothing is missing or the linger time has passed.

use crate::buffer::ReadBuf;
use crate::config::{RecoverySettings, Transport};
use crate::control::{Control, Event, RunError, Stop};
use crate::frames::{Origin, Payload, Pipeline, Place};
use crate::lines::{Line, Lines};
use crate::poll::Poller;
use crate::recovery::{Answer, Ask, Client, MAX_REQUESTS_PER_TICK};
use anyhow::Context;
use mdrelay_proto::clock::wall_clock_ns as now_ns;
use mdrelay_proto::codec::Format;
use mdrelay_proto::idle::IdleStrategy;
use mdrelay_proto::relay::Protection;
use mdrelay_proto::relay::{Admission, DATAGRAM_VERSION, DatagramHeader, DatagramKind, Echo, Totals};
use mdrelay_proto::warn;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::time::{Instant, MissedTickBehavior};

/// Receive buffer asked for: deep enough to ride out a scheduling hiccup at full rate.
const RECEIVE_BUFFER: usize = 16 << 20;
/// Largest UDP payload there is.
const MAX_DATAGRAM: usize = 65_536;
/// Datagrams taken without waiting after a wake-up, before ticks and stops are looked at again.
const BURST: usize = 256;
/// A/B: how long after one line's END the other line's is waited for (its last frames are still
/// on their way over a slower network; a line that is down never sends it).
const AB_END_GRACE: Duration = Duration::from_secs(1);

/// Opens the socket for a UDP or multicast transport and logs where it listens.
pub fn open(transport: &Transport) -> anyhow::Result<UdpSocket> {
    open_line(transport, Line::A)
}

/// Opens the socket of one line of a UDP or multicast transport (line B of an A/B pair: its
/// settings are named `listen_b` and `group_b`) and logs where it listens.
pub fn open_line(transport: &Transport, line: Line) -> anyhow::Result<UdpSocket> {
    let (bind, key) = match (transport, line) {
        (Transport::Udp(addr), Line::A) => (*addr, "listen"),
        (Transport::Udp(addr), Line::B) => (*addr, "listen_b"),
        // Bound to the group address, the socket gets only this group's datagrams, not those of
        // every group (or unicast) sent to the same port.
        (Transport::Multicast { group, .. }, Line::A) => (*group, "group"),
        (Transport::Multicast { group, .. }, Line::B) => (*group, "group_b"),
        (Transport::Tcp(_), _) => anyhow::bail!("not a UDP transport"),
    };
    let socket = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))
        .with_context(|| format!("{key}: cannot open a UDP socket"))?;
    // Several subscribers on one host can join the same group and port. A unicast port is one
    // receiver's: with SO_REUSEADDR a second subscriber would bind it too and silently take the
    // datagrams from the first, so it is refused instead.
    let multicast = matches!(transport, Transport::Multicast { .. });
    if multicast {
        socket.set_reuse_address(true).with_context(|| format!("{key}: cannot set SO_REUSEADDR"))?;
    }
    receive_buffer(&socket);
    socket.bind(&bind.into()).map_err(|error| {
        if !multicast && error.kind() == io::ErrorKind::AddrInUse {
            anyhow::anyhow!(
                "{key}: {bind} is in use by another program (another subscriber?); a unicast port takes one receiver: give each subscriber its own port, or use multicast"
            )
        } else {
            anyhow::Error::new(error).context(format!("{key}: cannot bind {bind}"))
        }
    })?;
    if let Transport::Multicast { group, interface } = transport {
        let IpAddr::V4(ip) = group.ip() else { anyhow::bail!("{key}: {group} is not IPv4") };
        socket
            .join_multicast_v4(&ip, interface)
            .with_context(|| format!("{key}: cannot join {ip} on interface {interface}"))?;
    }
    socket.set_nonblocking(true).context("cannot make the socket non-blocking")?;
    let socket = UdpSocket::from_std(socket.into()).context("cannot register the socket with the runtime")?;
    let local = socket.local_addr().context("cannot read the socket's address")?;
    // Tests and scripts read the address after "listening on"; line A's comes first.
    let which = match line {
        Line::A => "",
        Line::B => "line B, ",
    };
    match transport {
        Transport::Multicast { interface, .. } => {
            tracing::info!("listening on {local} ({which}multicast, interface {interface})")
        }
        _ if line == Line::B => tracing::info!("listening on {local} (line B)"),
        _ => tracing::info!("listening on {local}"),
    }
    Ok(socket)
}

/// Asks for [`RECEIVE_BUFFER`]: SO_RCVBUFFORCE passes net.core.rmem_max but needs
/// CAP_NET_ADMIN; otherwise SO_RCVBUF, which the kernel caps at rmem_max.
fn receive_buffer(socket: &Socket) {
    use nix::sys::socket::{setsockopt, sockopt::RcvBufForce};
    let how = match setsockopt(socket, RcvBufForce, &RECEIVE_BUFFER) {
        Ok(()) => "SO_RCVBUFFORCE",
        Err(_) => {
            if let Err(error) = socket.set_recv_buffer_size(RECEIVE_BUFFER) {
                tracing::warn!(%error, "cannot set SO_RCVBUF; the default receive buffer is used");
            }
            "SO_RCVBUF, capped by net.core.rmem_max"
        }
    };
    // Linux reports twice the usable size (it counts its bookkeeping).
    let actual = socket.recv_buffer_size().unwrap_or(0);
    tracing::info!(requested = RECEIVE_BUFFER, granted = actual, via = how, "receive buffer");
    if actual < RECEIVE_BUFFER {
        tracing::warn!(
            "receive buffer below the {RECEIVE_BUFFER} bytes asked for: bursts may be dropped; run as root or raise net.core.rmem_max"
        );
    }
}

/// A datagram held until the next one confirms or refutes it (see
/// [`SessionTracker`](mdrelay_proto::relay::SessionTracker)).
struct Held {
    bytes: Vec<u8>,
    peer: SocketAddr,
    receive_time: i64,
    origin: Origin,
}

/// The longest time between looks at the gaps: each look sends at most
/// [`MAX_REQUESTS_PER_TICK`] requests, so this also sets how many go out per second when many
/// frames are missing at once.
const MAX_ASK_PERIOD: Duration = Duration::from_millis(10);

/// How often the gaps are looked at: twice per delay or retry, whichever is shorter, so a
/// request goes out at most half of it late; at least every millisecond, at most every
/// [`MAX_ASK_PERIOD`].
fn ask_period(delay: Duration, retry: Duration) -> Duration {
    (delay.min(retry) / 2).clamp(Duration::from_millis(1), MAX_ASK_PERIOD)
}

/// Receives datagrams on `sockets` (one, or two for A/B lines, A first) until a stop, asking
/// the retransmission service for missing frames when `recovery` is set; waits for data the
/// `idle` way (see [`crate::poll`]).
pub async fn run(
    sockets: Vec<UdpSocket>,
    recovery: Option<&RecoverySettings>,
    idle: IdleStrategy,
    pipeline: &mut Pipeline,
    control: &mut Control,
) -> Result<Stop, RunError> {
    let lines: Vec<(UdpSocket, Origin)> = match <[UdpSocket; 2]>::try_from(sockets) {
        Ok([a, b]) => {
            let name = |s: &UdpSocket| s.local_addr().map_or_else(|_| "-".to_string(), |a| a.to_string());
            let mut lines = Lines::new(name(&a), name(&b));
            if pipeline.from_start() {
                lines.expect_from(1);
            }
            pipeline.lines = Some(lines);
            vec![(a, Origin::Line(Line::A)), (b, Origin::Line(Line::B))]
        }
        Err(one) => one.into_iter().map(|s| (s, Origin::Stream)).take(1).collect(),
    };
    if lines.is_empty() {
        return Err(RunError::Fatal(anyhow::anyhow!("no socket to receive on")));
    }
    let protection = pipeline.unsealer.as_ref().map(|u| u.protection()).unwrap_or_default();
    let mut client = recovery.map(|r| Client::start(r.server.clone(), protection));
    let linger = recovery.map_or(Duration::ZERO, |r| r.linger);
    let period = recovery.map_or(MAX_ASK_PERIOD, |r| ask_period(r.delay, r.retry));
    let mut timer = tokio::time::interval(period);
    timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut buf = ReadBuf::new(MAX_DATAGRAM);
    let mut scratch = ReadBuf::new(0);
    let mut held: Option<Held> = None;
    let mut turn = 0usize;
    // The lines whose END has come (one line: B never comes, and need not).
    let mut ended = [false, lines.len() < 2];
    // After the first END: when to stop at the latest, frames still missing or not.
    let mut ending: Option<Instant> = None;
    let mut poller = Poller::new(idle);
    loop {
        let missing = pipeline.missing();
        if ending.is_some() && missing == 0 && ended == [true, true] {
            return Ok(Stop::End);
        }
        let b = lines.get(1).map(|(socket, _)| socket);
        // Parked, the loop waits for a socket to be readable beside everything else; busy, it
        // reads the sockets at once and looks at everything else (without waiting) only every
        // few dozen rounds, after giving the runtime a turn to run its timers, signals and the
        // recovery task.
        let park = poller.park();
        if park || poller.housekeeping_due() {
            if !park {
                tokio::task::yield_now().await;
            }
            let woke = tokio::select! {
                biased;
                event = control.next() => Woke::Event(event),
                _ = timer.tick(), if missing > 0 && client.is_some() => Woke::Timer,
                _ = tokio::time::sleep_until(ending.unwrap_or_else(Instant::now)), if ending.is_some() => Woke::Ending,
                answer = next_answer(&mut client), if client.is_some() => Woke::Answer(answer),
                _ = lines[0].0.readable(), if park => Woke::Socket,
                _ = async { b.expect("guarded").readable().await }, if park && b.is_some() => Woke::Socket,
                _ = std::future::ready(()), if !park => Woke::Socket,
            };
            match woke {
                Woke::Event(Event::Tick) => pipeline.tick(),
                Woke::Event(Event::Metrics) => pipeline.export_metrics(),
                Woke::Event(Event::Stop(stop)) => return Ok(stop),
                Woke::Timer => {
                    if let Some(c) = &client {
                        ask(pipeline, c);
                    }
                }
                Woke::Ending => {
                    if ended != [true, true] {
                        tracing::warn!(grace = ?AB_END_GRACE, "no end of stream on one of the lines; stopping");
                    }
                    let given_up = pipeline.recovery.as_mut().map_or(0, |b| b.give_up_all());
                    if given_up > 0 {
                        tracing::warn!(frames = given_up, linger = ?linger, "frames still missing after the end of stream; given up");
                    }
                    return Ok(Stop::End);
                }
                Woke::Answer(Some(answer)) => {
                    on_answer(answer, pipeline, &mut scratch, &mut client);
                    if pipeline.count_reached() {
                        return Ok(Stop::Count);
                    }
                }
                Woke::Answer(None) => {
                    tracing::warn!("the recovery task ended; missing frames are no longer asked for");
                    client = None;
                    if let Some(book) = &mut pipeline.recovery {
                        book.refuse();
                    }
                }
                Woke::Socket => {}
            }
        }
        // Whichever socket woke the loop, both are read, in turn, so neither line waits behind
        // the other.
        let mut idle = [false, lines.len() < 2];
        let mut taken = 0;
        while taken < BURST && !(idle[0] && idle[1]) {
            let i = turn % 2;
            turn = turn.wrapping_add(1);
            if idle[i] {
                continue;
            }
            let (socket, origin) = &lines[i];
            let (n, peer) = match socket.try_recv_from(buf.spare()) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    idle[i] = true;
                    continue;
                }
                Err(error) => {
                    // E.g. an ICMP error for an echo sent earlier; the socket stays usable.
                    if warn::allow("receive") {
                        tracing::warn!(%error, "receive error");
                    }
                    idle[i] = true;
                    continue;
                }
            };
            taken += 1;
            let receive_time = now_ns();
            if let (Some(lines), Origin::Line(line)) = (&mut pipeline.lines, origin) {
                lines.datagram(*line);
            }
            let datagram = &buf.spare()[..n];
            if datagram_in(datagram, peer, receive_time, *origin, &mut held, pipeline).is_some() {
                ended[i] = true;
                if ended == [true, true] && pipeline.missing() == 0 {
                    return Ok(Stop::End);
                }
                if ending.is_none() {
                    // The other line's last frames may still be on their way, and with recovery
                    // the frames still missing: wait for them, for a while.
                    let missing = pipeline.missing();
                    let mut grace = if missing > 0 { linger } else { Duration::ZERO };
                    if ended != [true, true] {
                        grace = grace.max(AB_END_GRACE);
                    }
                    if !grace.is_zero() {
                        tracing::info!(missing, wait = ?grace, "end of stream; waiting for what is still on its way");
                    }
                    ending = Some(Instant::now() + grace);
                }
            }
            send_echoes(socket, peer, pipeline);
            if pipeline.count_reached() {
                return Ok(Stop::Count);
            }
        }
        poller.after(taken);
    }
}

/// What ended a round's wait.
enum Woke {
    /// A tick or a stop.
    Event(Event),
    /// Time to look at the gaps.
    Timer,
    /// The time after the END is up.
    Ending,
    /// The recovery client answered, or ended (`None`).
    Answer(Option<Answer>),
    /// A socket is readable, or the loop is busy-polling.
    Socket,
}

/// The next answer of the recovery client; never, without one. Cancel-safe.
async fn next_answer(client: &mut Option<Client>) -> Option<Answer> {
    match client {
        Some(c) => c.answer().await,
        None => std::future::pending().await,
    }
}

/// Asks for the frames due (those that do not fit the queue are asked again at their retry).
fn ask(pipeline: &mut Pipeline, client: &Client) {
    let Some(session) = pipeline.tracker.session() else { return };
    let now = pipeline.now_ns();
    let Some(book) = &mut pipeline.recovery else { return };
    for request in book.due(now, MAX_REQUESTS_PER_TICK) {
        if !client.ask(Ask { session, request }) {
            book.deferred();
        }
    }
}

/// Takes one answer of the recovery client.
fn on_answer(answer: Answer, pipeline: &mut Pipeline, scratch: &mut ReadBuf, client: &mut Option<Client>) {
    let session = pipeline.tracker.session();
    match answer {
        Answer::Connected { peer, session: served } => {
            if let Some(book) = &mut pipeline.recovery {
                book.connected();
            }
            if let Some(stream) = session
                && stream != served
                && warn::allow("recovery session")
            {
                tracing::warn!(service = %peer, serves = format_args!("{served:#x}"), stream = format_args!("{stream:#x}"),
                    "the retransmission service serves another publisher session than the stream's: the stream's gaps cannot be recovered from it");
            }
        }
        Answer::Data { peer, session: of, header, payload, offset, receive_time } => {
            if session != Some(of) {
                // Frames of a session the stream has left (or not reached): nothing to fill.
                if let Some(book) = &mut pipeline.recovery {
                    book.not_taken(u64::from(header.frame_count));
                }
                return;
            }
            // Formats that read words in place get an aligned copy, as on the stream.
            let bytes = if header.format != Format::Raw && payload.as_ptr() as usize % 8 != 0 {
                scratch.hold(&payload)
            } else {
                &payload
            };
            pipeline.protected_data(
                Payload {
                    origin: Origin::Recovered,
                    peer,
                    format: header.format,
                    bytes,
                    first_sequence: header.sequence,
                    declared_frames: usize::from(header.frame_count),
                    receive_time,
                    place: Place::Recovery(offset),
                },
                of,
            );
        }
        Answer::Gone { session: of, first, count } => {
            if session == Some(of)
                && let Some(book) = &mut pipeline.recovery
            {
                if warn::allow("recovery gone") {
                    tracing::info!(first, count, "frames no longer held by the publisher: unrecoverable");
                }
                book.gone(first, count);
            }
        }
        Answer::OtherSession { session: of, first, count } => {
            if session == Some(of)
                && let Some(book) = &mut pipeline.recovery
            {
                book.other_session(first, count);
            }
        }
        Answer::Busy { first } => {
            if let Some(book) = &mut pipeline.recovery {
                book.busy();
            }
            if warn::allow("recovery busy") {
                tracing::info!(
                    first,
                    "the retransmission service is busy (over its rate limit, or full); asking again later"
                );
            }
        }
        Answer::BusyAtConnect => {
            // The client task says so, with when it tries again.
            if let Some(book) = &mut pipeline.recovery {
                book.busy_at_connect();
            }
        }
        Answer::Refused(why) => {
            tracing::warn!("recovery is off: {why}");
            if let Some(book) = &mut pipeline.recovery {
                book.refuse();
            }
            *client = None;
        }
    }
}

/// Takes one datagram; `Some(Stop::End)` on an END of the stream's session. Its protection is
/// checked, and its frames opened, before its header is believed.
fn datagram_in(
    d: &[u8],
    peer: SocketAddr,
    receive_time: i64,
    origin: Origin,
    held: &mut Option<Held>,
    pipeline: &mut Pipeline,
) -> Option<Stop> {
    let Some(mut unsealer) = pipeline.unsealer.take() else {
        return plain_datagram_in(d, peer, receive_time, origin, held, pipeline);
    };
    let stop = match DatagramHeader::parse(d) {
        Ok(header) => match unsealer.datagram(d, &header, pipeline.tracker.session()) {
            Ok(plain) => plain_datagram_in(plain, peer, receive_time, origin, held, pipeline),
            Err(why) => {
                pipeline.stats.bytes += d.len() as u64;
                if warn::allow("protection") {
                    tracing::warn!(%peer, session = format_args!("{:#x}", header.session), sequence = header.sequence,
                        "datagram refused: {why}");
                }
                None
            }
        },
        // Not a relay datagram, or a bad header: counted as such.
        Err(_) => plain_datagram_in(d, peer, receive_time, origin, held, pipeline),
    };
    pipeline.stats.protection = unsealer.counts;
    pipeline.unsealer = Some(unsealer);
    stop
}

/// Takes one datagram whose frames are plain.
fn plain_datagram_in(
    d: &[u8],
    peer: SocketAddr,
    receive_time: i64,
    origin: Origin,
    held: &mut Option<Held>,
    pipeline: &mut Pipeline,
) -> Option<Stop> {
    pipeline.stats.bytes += d.len() as u64;
    if !DatagramHeader::is_relay_datagram(d) {
        pipeline.stats.invalid_packets += 1;
        if warn::allow("foreign datagram") {
            let head = &d[..d.len().min(8)];
            tracing::warn!(%peer, len = d.len(), "datagram skipped: not a relay datagram (starts with {head:02x?}, not \"MDRU\")");
        }
        return None;
    }
    let header = match DatagramHeader::parse(d) {
        Ok(h) => h,
        Err(e) => {
            pipeline.stats.invalid_packets += 1;
            if warn::allow("datagram header") {
                tracing::warn!(%peer, at = e.offset, len = d.len(), error = %e.what, "datagram skipped: bad relay header");
            }
            return None;
        }
    };
    let before = pipeline.tracker.session();
    match header.kind {
        DatagramKind::Data => {
            let admission = pipeline.tracker.datagram(header.session, header.sequence, u64::from(header.frame_count));
            note_session(before, pipeline, peer);
            match admission {
                Admission::Take => {
                    *held = None;
                    take(d, &header, peer, receive_time, origin, pipeline);
                }
                Admission::TakeHeldThenThis => {
                    take_held(held, pipeline);
                    take(d, &header, peer, receive_time, origin, pipeline);
                }
                Admission::Hold => {
                    if warn::allow("held datagram") {
                        tracing::info!(%peer, session = format_args!("{:#x}", header.session), sequence = header.sequence,
                            "datagram out of line with the stream (session or sequence): held until the next one confirms it");
                    }
                    *held = Some(Held { bytes: d.to_vec(), peer, receive_time, origin });
                }
                Admission::Ignore => {}
            }
            None
        }
        DatagramKind::End => {
            let totals = match Totals::parse(&d[DatagramHeader::LEN..]) {
                Ok(t) => t,
                Err(e) => {
                    // The publisher repeats its END: wait for a readable one.
                    pipeline.stats.invalid_packets += 1;
                    if warn::allow("end totals") {
                        tracing::warn!(%peer, at = DatagramHeader::LEN + e.offset, error = %e.what, "END datagram with unreadable totals skipped");
                    }
                    return None;
                }
            };
            match pipeline.tracker.end_datagram(header.session, header.sequence) {
                Admission::Take | Admission::Hold => {}
                Admission::TakeHeldThenThis => {
                    note_session(before, pipeline, peer);
                    take_held(held, pipeline);
                }
                Admission::Ignore => {
                    pipeline.stats.invalid_packets += 1;
                    if warn::allow("foreign end") {
                        tracing::warn!(%peer, session = format_args!("{:#x}", header.session), next_sequence = header.sequence,
                            "END datagram that does not fit the stream (another session, or a sequence out of reach); ignored");
                    }
                    return None;
                }
            }
            pipeline.end(header.sequence);
            if pipeline.stats.publisher_totals.is_none() {
                tracing::info!(publisher = %peer, frames = totals.frames, messages = totals.messages, "end of stream");
            }
            pipeline.stats.publisher_totals = Some(totals);
            Some(Stop::End)
        }
        DatagramKind::Echo => {
            if warn::allow("echo datagram") {
                tracing::debug!(%peer, "echo datagram ignored (subscribers send them, not receive them)");
            }
            None
        }
    }
}

/// Takes the held datagram, which the one after it confirmed.
fn take_held(held: &mut Option<Held>, pipeline: &mut Pipeline) {
    if let Some(h) = held.take()
        && let Ok(header) = DatagramHeader::parse(&h.bytes)
    {
        take(&h.bytes, &header, h.peer, h.receive_time, h.origin, pipeline);
    }
}

/// Logs the stream's first session and each confirmed restart.
fn note_session(before: Option<u64>, pipeline: &Pipeline, peer: SocketAddr) {
    let now = pipeline.tracker.session();
    match (before, now) {
        (None, Some(session)) => {
            tracing::info!(publisher = %peer, session = format_args!("{session:#x}"), "publisher session")
        }
        (Some(old), Some(new)) if old != new && warn::allow("restart") => {
            tracing::warn!(publisher = %peer, old_session = format_args!("{old:#x}"), new_session = format_args!("{new:#x}"),
                "publisher restarted: sequence tracking starts over");
        }
        _ => {}
    }
}

/// Decodes a data datagram's frames.
fn take(
    d: &[u8],
    header: &DatagramHeader,
    peer: SocketAddr,
    receive_time: i64,
    origin: Origin,
    pipeline: &mut Pipeline,
) {
    pipeline.data(Payload {
        origin,
        peer,
        format: header.format,
        bytes: &d[DatagramHeader::LEN..],
        first_sequence: header.sequence,
        declared_frames: usize::from(header.frame_count),
        receive_time,
        place: Place::Datagram(DatagramHeader::LEN as u64),
    });
}

/// Sends the pipeline's echoes to `peer`, the sender of the datagram they answer, without
/// waiting: one that does not fit the socket's send buffer now is dropped and counted.
fn send_echoes(socket: &UdpSocket, peer: SocketAddr, pipeline: &mut Pipeline) {
    if pipeline.echoes.is_empty() {
        return;
    }
    let format = pipeline.current_format().unwrap_or(Format::Raw);
    let session = pipeline.tracker.session().unwrap_or(0);
    let mut bytes = [0u8; DatagramHeader::LEN + Echo::LEN];
    let echoes = std::mem::take(&mut pipeline.echoes);
    for echo in &echoes {
        let header = DatagramHeader {
            version: DATAGRAM_VERSION,
            format,
            kind: DatagramKind::Echo,
            frame_count: 0,
            protection: Protection::NONE,
            session,
            sequence: echo.sequence,
        };
        bytes[..DatagramHeader::LEN].copy_from_slice(&header.to_bytes());
        bytes[DatagramHeader::LEN..].copy_from_slice(&echo.to_bytes());
        match socket.try_send_to(&bytes, peer) {
            Ok(_) => pipeline.stats.echoes_sent += 1,
            Err(error) => {
                pipeline.stats.echoes_dropped += 1;
                if error.kind() != io::ErrorKind::WouldBlock && warn::allow("echo send") {
                    tracing::warn!(%peer, %error, "echo not sent");
                }
            }
        }
    }
    // Give the (now empty) list back to keep its allocation.
    pipeline.echoes = echoes;
    pipeline.echoes.clear();
}
