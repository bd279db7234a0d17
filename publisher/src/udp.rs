//! UDP output: unicast to a list of destinations and/or one multicast group. Every datagram
//! starts with the relay header (magic, version, format, session, first frame's sequence number,
//! frame count), so receivers detect the format, loss, duplicates and reordering.

use crate::config::Udp;
use crate::stats::RoundTrips;
use anyhow::{Context, Result};
use mdrelay_proto::codec::Format;
use mdrelay_proto::relay::{DatagramHeader, DatagramKind, Echo, PROTOCOL_VERSION};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Largest UDP payload over IPv4.
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// Sends datagrams to every configured destination.
pub struct UdpOut {
    socket: UdpSocket,
    targets: Vec<SocketAddr>,
    session: u64,
    /// The datagram being built: header space, then frames.
    datagram: Vec<u8>,
    frames: u8,
    first_sequence: u64,
    format: Format,
    limit: usize,
    /// Datagrams that could not be sent (logged once per kind of error).
    pub send_errors: u64,
    /// Frames over the largest UDP payload, not sent.
    pub oversized: u64,
    warned_fragmenting: bool,
}

impl UdpOut {
    /// Opens the sending socket. `coalesce` is the byte budget for grouping frames (0: one frame
    /// per datagram).
    pub fn open(udp: &Udp, session: u64, coalesce: usize) -> Result<UdpOut> {
        let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).context("creating the UDP socket")?;
        let _ = socket.set_send_buffer_size(4 << 20);
        let mut targets = udp.destinations.clone();
        let bind_ip = match &udp.multicast {
            Some(m) => {
                socket
                    .set_multicast_if_v4(&m.interface)
                    .with_context(|| format!("multicast.interface: cannot send on {}", m.interface))?;
                socket.set_multicast_ttl_v4(m.ttl).context("multicast.ttl")?;
                socket.set_multicast_loop_v4(m.loopback).context("multicast.loopback")?;
                targets.push(m.group);
                m.interface
            }
            None => Ipv4Addr::UNSPECIFIED,
        };
        socket.bind(&SocketAddr::V4(SocketAddrV4::new(bind_ip, 0)).into()).context("binding the UDP socket")?;
        let socket: UdpSocket = socket.into();
        let limit = if coalesce == 0 { 0 } else { coalesce.min(udp.max_datagram) };
        Ok(UdpOut {
            socket,
            targets,
            session,
            datagram: Vec::with_capacity(MAX_UDP_PAYLOAD),
            frames: 0,
            first_sequence: 0,
            format: Format::Raw,
            limit,
            send_errors: 0,
            oversized: 0,
            warned_fragmenting: false,
        })
    }

    /// Where datagrams go.
    pub fn targets(&self) -> &[SocketAddr] {
        &self.targets
    }

    /// Reads echoes arriving on the sending socket until `stop`, on a thread of its own.
    pub fn spawn_echo_reader(
        &self,
        round_trips: Arc<RoundTrips>,
        stop: Arc<AtomicBool>,
    ) -> Result<std::thread::JoinHandle<()>> {
        let socket = self.socket.try_clone()?;
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        Ok(std::thread::Builder::new().name("udp-echoes".into()).spawn(move || {
            let mut buf = [0u8; 256];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, _)) = socket.recv_from(&mut buf) else { continue };
                let Ok(header) = DatagramHeader::parse(&buf[..n]) else { continue };
                if header.kind == DatagramKind::Echo {
                    if let Ok(echo) = Echo::parse(&buf[DatagramHeader::LEN..n]) {
                        round_trips.record(echo.publish_time);
                    }
                }
            }
        })?)
    }

    fn header(&self, kind: DatagramKind, frames: u8, sequence: u64) -> [u8; DatagramHeader::LEN] {
        DatagramHeader {
            version: PROTOCOL_VERSION as u8,
            format: self.format,
            kind,
            frame_count: frames,
            session: self.session,
            sequence,
        }
        .to_bytes()
    }

    /// Adds a frame; sends the datagram first if the frame would not fit with the others.
    pub fn push(&mut self, sequence: u64, format: Format, frame: &[u8]) {
        if self.frames > 0
            && (format != self.format || self.datagram.len() + frame.len() > self.limit || self.frames == u8::MAX)
        {
            self.flush();
        }
        if DatagramHeader::LEN + frame.len() > MAX_UDP_PAYLOAD {
            self.oversized += 1;
            tracing::warn!(
                sequence,
                bytes = frame.len(),
                "frame larger than a UDP datagram can carry; not sent over UDP"
            );
            return;
        }
        if self.frames == 0 {
            self.datagram.clear();
            self.datagram.resize(DatagramHeader::LEN, 0);
            self.first_sequence = sequence;
            self.format = format;
        }
        self.datagram.extend_from_slice(frame);
        self.frames += 1;
        if self.limit == 0 {
            self.flush();
        }
    }

    /// Sends the datagram being built, if any.
    pub fn flush(&mut self) {
        if self.frames == 0 {
            return;
        }
        let header = self.header(DatagramKind::Data, self.frames, self.first_sequence);
        self.datagram[..DatagramHeader::LEN].copy_from_slice(&header);
        if self.datagram.len() > 1472 && !self.warned_fragmenting {
            self.warned_fragmenting = true;
            tracing::info!(
                bytes = self.datagram.len(),
                "datagrams above 1472 bytes are fragmented by IP on a 1500-byte MTU"
            );
        }
        let datagram = std::mem::take(&mut self.datagram);
        self.send(&datagram);
        self.datagram = datagram;
        self.frames = 0;
    }

    fn send(&mut self, datagram: &[u8]) {
        for target in &self.targets {
            if let Err(e) = self.socket.send_to(datagram, target) {
                self.send_errors += 1;
                if self.send_errors <= 10 {
                    tracing::warn!(%target, error = %e, "UDP send failed");
                }
            }
        }
    }

    /// Sends the end of stream with the publisher's totals, a few times: UDP may lose one.
    pub fn end(&mut self, next_sequence: u64, totals: &[u8]) {
        self.flush();
        let mut datagram = self.header(DatagramKind::End, 0, next_sequence).to_vec();
        datagram.extend_from_slice(totals);
        for _ in 0..3 {
            self.send(&datagram);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
