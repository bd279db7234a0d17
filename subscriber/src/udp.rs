//! UDP, unicast or multicast: the socket (SO_REUSEADDR, a large receive buffer, the group
//! joined on the configured interface) and the datagram loop: relay header, publisher session,
//! frames, the first END, echoes back to each datagram's sender.

use crate::buffer::ReadBuf;
use crate::config::Transport;
use crate::control::{Control, Event, RunError, Stop};
use crate::frames::{Payload, Pipeline, Place, now_ns};
use anyhow::Context;
use mdrelay_proto::relay::{DatagramHeader, DatagramKind, Echo, PROTOCOL_VERSION, Totals};
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
    // Several subscribers on one host can join the same group and port.
    socket.set_reuse_address(true).with_context(|| format!("{key}: cannot set SO_REUSEADDR"))?;
    receive_buffer(&socket);
    socket.bind(&bind.into()).with_context(|| format!("{key}: cannot bind {bind}"))?;
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

/// Receives datagrams until a stop.
pub async fn run(socket: UdpSocket, pipeline: &mut Pipeline, control: &mut Control) -> Result<Stop, RunError> {
    let mut buf = ReadBuf::new(MAX_DATAGRAM);
    let mut session: Option<u64> = None;
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
                            if pipeline.warnings.allow("receive") {
                                tracing::warn!(%error, "receive error");
                            }
                            break;
                        }
                    };
                    let receive_time = now_ns();
                    let datagram = &buf.spare()[..n];
                    if let Some(stop) = datagram_in(datagram, peer, receive_time, &mut session, pipeline) {
                        return Ok(stop);
                    }
                    send_echoes(&socket, peer, &mut session, pipeline);
                    if pipeline.count_reached() {
                        return Ok(Stop::Count);
                    }
                }
            }
        }
    }
}

/// Takes one datagram; `Some(Stop::End)` on the first END.
fn datagram_in(
    d: &[u8],
    peer: SocketAddr,
    receive_time: i64,
    session: &mut Option<u64>,
    pipeline: &mut Pipeline,
) -> Option<Stop> {
    pipeline.stats.bytes += d.len() as u64;
    if !DatagramHeader::is_relay_datagram(d) {
        pipeline.stats.invalid_packets += 1;
        if pipeline.warnings.allow("foreign datagram") {
            let head = &d[..d.len().min(8)];
            tracing::warn!(%peer, len = d.len(), "datagram skipped: not a relay datagram (starts with {head:02x?}, not \"MDRU\")");
        }
        return None;
    }
    let header = match DatagramHeader::parse(d) {
        Ok(h) => h,
        Err(e) => {
            pipeline.stats.invalid_packets += 1;
            if pipeline.warnings.allow("datagram header") {
                tracing::warn!(%peer, at = e.offset, len = d.len(), error = %e.what, "datagram skipped: bad relay header");
            }
            return None;
        }
    };
    match *session {
        None => tracing::info!(publisher = %peer, session = format_args!("{:#x}", header.session), "publisher session"),
        Some(old) if old != header.session => {
            pipeline.stats.publisher_restarts += 1;
            pipeline.stats.new_session();
            tracing::warn!(publisher = %peer, old_session = format_args!("{old:#x}"), new_session = format_args!("{:#x}", header.session),
                "publisher restarted: sequence tracking starts over");
        }
        _ => {}
    }
    *session = Some(header.session);
    let body = &d[DatagramHeader::LEN..];
    match header.kind {
        DatagramKind::Data => pipeline.data(Payload {
            peer,
            format: header.format,
            bytes: body,
            first_sequence: header.sequence,
            declared_frames: usize::from(header.frame_count),
            receive_time,
            place: Place::Datagram(DatagramHeader::LEN as u64),
        }),
        DatagramKind::End => match Totals::parse(body) {
            Ok(totals) => {
                tracing::info!(publisher = %peer, frames = totals.frames, messages = totals.messages, "end of stream");
                pipeline.stats.publisher_totals = Some(totals);
                return Some(Stop::End);
            }
            Err(e) => {
                // The publisher repeats its END: wait for a readable one.
                pipeline.stats.invalid_packets += 1;
                if pipeline.warnings.allow("end totals") {
                    tracing::warn!(%peer, at = DatagramHeader::LEN + e.offset, error = %e.what, "END datagram with unreadable totals skipped");
                }
            }
        },
        DatagramKind::Echo => {
            if pipeline.warnings.allow("echo datagram") {
                tracing::debug!(%peer, "echo datagram ignored (subscribers send them, not receive them)");
            }
        }
    }
    None
}

/// Sends the pipeline's echoes to `peer`, the sender of the datagram they answer, without
/// waiting: one that does not fit the socket's send buffer now is dropped and counted.
fn send_echoes(socket: &UdpSocket, peer: SocketAddr, session: &mut Option<u64>, pipeline: &mut Pipeline) {
    if pipeline.echoes.is_empty() {
        return;
    }
    let format = pipeline.current_format().unwrap_or(mdrelay_proto::codec::Format::Raw);
    let mut bytes = [0u8; DatagramHeader::LEN + Echo::LEN];
    let echoes = std::mem::take(&mut pipeline.echoes);
    for echo in &echoes {
        let header = DatagramHeader {
            version: PROTOCOL_VERSION as u8,
            format,
            kind: DatagramKind::Echo,
            frame_count: 0,
            session: session.unwrap_or(0),
            sequence: echo.sequence,
        };
        bytes[..DatagramHeader::LEN].copy_from_slice(&header.to_bytes());
        bytes[DatagramHeader::LEN..].copy_from_slice(&echo.to_bytes());
        match socket.try_send_to(&bytes, peer) {
            Ok(_) => pipeline.stats.echoes_sent += 1,
            Err(error) => {
                pipeline.stats.echoes_dropped += 1;
                if error.kind() != io::ErrorKind::WouldBlock && pipeline.warnings.allow("echo send") {
                    tracing::warn!(%peer, %error, "echo not sent");
                }
            }
        }
    }
    // Give the (now empty) list back to keep its allocation.
    pipeline.echoes = echoes;
    pipeline.echoes.clear();
}
