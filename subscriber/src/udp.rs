//! UDP, unicast or multicast: the socket (SO_REUSEADDR, a large receive buffer, the group
//! joined on the configured interface) and the datagram loop: relay header, publisher session,
//! frames, the first END, echoes back to each datagram's sender.

use crate::buffer::ReadBuf;
use crate::config::Transport;
use crate::control::{Control, Event, RunError, Stop};
use crate::frames::{Payload, Pipeline, Place};
use anyhow::Context;
use mdrelay_proto::clock::wall_clock_ns as now_ns;
use mdrelay_proto::relay::{Admission, DatagramHeader, DatagramKind, Echo, DATAGRAM_VERSION, Totals};
use mdrelay_proto::warn;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, SocketAddr};
use tokio::net::UdpSocket;

/// Receive buffer asked for: deep enough to ride out a scheduling hiccup at full rate.
const RECEIVE_BUFFER: usize = 16 << 20;
/// Largest UDP payload there is.
const MAX_DATAGRAM: usize = 65_536;
/// Datagrams taken without waiting after a wake-up, before ticks and stops are looked at again.
const BURST: usize = 256;

/// Opens the socket for a UDP or multicast transport and logs where it listens.
pub fn open(transport: &Transport) -> anyhow::Result<UdpSocket> {
    let (bind, key) = match transport {
        Transport::Udp(addr) => (*addr, "listen"),
        // Bound to the group address, the socket gets only this group's datagrams, not those of
        // every group (or unicast) sent to the same port.
        Transport::Multicast { group, .. } => (*group, "group"),
        Transport::Tcp(_) => anyhow::bail!("not a UDP transport"),
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
        let IpAddr::V4(ip) = group.ip() else { anyhow::bail!("group: {group} is not IPv4") };
        socket
            .join_multicast_v4(&ip, interface)
            .with_context(|| format!("group: cannot join {ip} on interface {interface}"))?;
    }
    socket.set_nonblocking(true).context("cannot make the socket non-blocking")?;
    let socket = UdpSocket::from_std(socket.into()).context("cannot register the socket with the runtime")?;
    let local = socket.local_addr().context("cannot read the socket's address")?;
    match transport {
        Transport::Multicast { interface, .. } => {
            tracing::info!("listening on {local} (multicast, interface {interface})")
        }
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
}

/// Receives datagrams until a stop.
pub async fn run(socket: UdpSocket, pipeline: &mut Pipeline, control: &mut Control) -> Result<Stop, RunError> {
    let mut buf = ReadBuf::new(MAX_DATAGRAM);
    let mut held: Option<Held> = None;
    loop {
        tokio::select! {
            biased;
            event = control.next() => match event {
                Event::Tick => pipeline.tick(),
                Event::Stop(stop) => return Ok(stop),
            },
            received = socket.recv_from(buf.spare()) => {
                let mut received = Some(received);
                for _ in 0..BURST {
                    let (n, peer) = match received.take().unwrap_or_else(|| socket.try_recv_from(buf.spare())) {
                        Ok(r) => r,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(error) => {
                            // E.g. an ICMP error for an echo sent earlier; the socket stays usable.
                            if warn::allow("receive") {
                                tracing::warn!(%error, "receive error");
                            }
                            break;
                        }
                    };
                    let receive_time = now_ns();
                    let datagram = &buf.spare()[..n];
                    if let Some(stop) = datagram_in(datagram, peer, receive_time, &mut held, pipeline) {
                        return Ok(stop);
                    }
                    send_echoes(&socket, peer, pipeline);
                    if pipeline.count_reached() {
                        return Ok(Stop::Count);
                    }
                }
            }
        }
    }
}

/// Takes one datagram; `Some(Stop::End)` on the first END of the stream's session.
fn datagram_in(
    d: &[u8],
    peer: SocketAddr,
    receive_time: i64,
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
                    take(d, &header, peer, receive_time, pipeline);
                }
                Admission::TakeHeldThenThis => {
                    if let Some(h) = held.take() {
                        if let Ok(held_header) = DatagramHeader::parse(&h.bytes) {
                            take(&h.bytes, &held_header, h.peer, h.receive_time, pipeline);
                        }
                    }
                    take(d, &header, peer, receive_time, pipeline);
                }
                Admission::Hold => {
                    if warn::allow("held datagram") {
                        tracing::info!(%peer, session = format_args!("{:#x}", header.session), sequence = header.sequence,
                            "datagram out of line with the stream (session or sequence): held until the next one confirms it");
                    }
                    *held = Some(Held { bytes: d.to_vec(), peer, receive_time });
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
                    if let Some(h) = held.take() {
                        if let Ok(held_header) = DatagramHeader::parse(&h.bytes) {
                            take(&h.bytes, &held_header, h.peer, h.receive_time, pipeline);
                        }
                    }
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
            tracing::info!(publisher = %peer, frames = totals.frames, messages = totals.messages, "end of stream");
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
fn take(d: &[u8], header: &DatagramHeader, peer: SocketAddr, receive_time: i64, pipeline: &mut Pipeline) {
    pipeline.data(Payload {
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
    let format = pipeline.current_format().unwrap_or(mdrelay_proto::codec::Format::Raw);
    let session = pipeline.tracker.session().unwrap_or(0);
    let mut bytes = [0u8; DatagramHeader::LEN + Echo::LEN];
    let echoes = std::mem::take(&mut pipeline.echoes);
    for echo in &echoes {
        let header = DatagramHeader {
            version: DATAGRAM_VERSION,
            format,
            kind: DatagramKind::Echo,
            frame_count: 0,
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
