//! UDP output: unicast to a list of destinations and/or one multicast group. Datagrams come
//! sealed from a [`Coalescer`](mdrelay_proto::relay::Coalescer) (relay header, then frames), so
//! receivers detect the format, loss, duplicates and reordering. Echoes from subscribers in
//! round-trip mode come back to the sending socket and are read on a thread of their own.
//!
//! Datagrams sealed between two flushes of the hot path go out together, one `sendmmsg` call per
//! destination for up to [`BATCH`] of them: at top speed the per-call cost of `send_to` was what
//! bounded UDP. A kernel without `sendmmsg` gets `send_to`, after one log line.

use crate::config::{Multicast, Settings};
use crate::stats::Echoes;
use anyhow::{Context, Result};
use bytes::Bytes;
use mdrelay_codec::Format;
use mdrelay_proto::relay::Protector;
use mdrelay_proto::relay::echo::EchoGate;
use mdrelay_proto::relay::{DATAGRAM_VERSION, DatagramHeader, DatagramKind, Echo};
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, sendmmsg};
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Echo senders tracked at once; echoes from further addresses are rejected (and counted), so a
/// flood of spoofed sources cannot grow the publisher's memory.
const MAX_ECHO_PEERS: usize = 4096;

/// Datagrams sent by one `sendmmsg` call at most: past a few dozen the call's fixed cost is
/// already negligible, and the batch (about 90 KiB of MTU-sized datagrams) stays in cache.
pub const BATCH: usize = 64;

/// Sends datagrams to every configured destination.
pub struct UdpOut {
    socket: UdpSocket,
    targets: Vec<SocketAddr>,
    /// Line B: its own socket (it may leave by another interface) and group.
    line_b: Option<(UdpSocket, SocketAddr)>,
    session: u64,
    /// Datagrams that could not be sent.
    pub send_errors: u64,
    warned_fragmenting: bool,
    /// Datagrams sealed since the last [`UdpOut::flush`], sent together.
    pending: Vec<Bytes>,
    /// False once the kernel refused `sendmmsg`: every datagram then goes by `send_to`.
    mmsg: bool,
}

impl UdpOut {
    /// Opens the sending sockets of the UDP outputs `settings` configures.
    pub fn open(settings: &Settings, session: u64) -> Result<UdpOut> {
        let mut targets = settings.udp.as_ref().map(|u| u.destinations.clone()).unwrap_or_default();
        let socket = match &settings.multicast {
            Some(m) => {
                targets.push(m.group);
                sending_socket(Some((m, "multicast")))?
            }
            None => sending_socket(None)?,
        };
        let line_b = match &settings.multicast_b {
            Some(m) => Some((sending_socket(Some((m, "multicast_b")))?, m.group)),
            None => None,
        };
        Ok(UdpOut {
            socket,
            targets,
            line_b,
            session,
            send_errors: 0,
            warned_fragmenting: false,
            pending: Vec::with_capacity(BATCH),
            mmsg: true,
        })
    }

    /// Every socket datagrams leave from: line A's, then line B's.
    fn sockets(&self) -> impl Iterator<Item = &UdpSocket> {
        std::iter::once(&self.socket).chain(self.line_b.as_ref().map(|(s, _)| s))
    }

    /// Where datagrams go (line B's group last).
    pub fn targets(&self) -> Vec<SocketAddr> {
        self.targets.iter().copied().chain(self.line_b.as_ref().map(|(_, g)| *g)).collect()
    }

    /// Reads echoes arriving on the sending sockets until `stop`, a thread per socket (a
    /// subscriber echoes to the line whose copy it took). An echo counts only for a frame sent,
    /// with its publish time, after its sender's previous echo.
    pub fn spawn_echo_readers(
        &self,
        echoes: &Arc<Echoes>,
        stop: &Arc<AtomicBool>,
    ) -> Result<Vec<std::thread::JoinHandle<()>>> {
        self.sockets().map(|socket| self.spawn_echo_reader(socket, echoes.clone(), stop.clone())).collect()
    }

    fn spawn_echo_reader(
        &self,
        socket: &UdpSocket,
        echoes: Arc<Echoes>,
        stop: Arc<AtomicBool>,
    ) -> Result<std::thread::JoinHandle<()>> {
        let socket = socket.try_clone()?;
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let session = self.session;
        Ok(std::thread::Builder::new().name("udp-echoes".into()).spawn(move || {
            let mut buf = [0u8; 256];
            let mut gates: HashMap<SocketAddr, EchoGate> = HashMap::new();
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else { continue };
                let datagram = &buf[..n];
                let echo = DatagramHeader::parse(datagram)
                    .ok()
                    .filter(|h| h.kind == DatagramKind::Echo && h.session == session)
                    .and_then(|h| Echo::parse(&datagram[h.len_on_wire()..]).ok());
                let verdict = match echo {
                    None => Err("not an echo datagram of this session".to_string()),
                    Some(echo) => {
                        if gates.len() >= MAX_ECHO_PEERS && !gates.contains_key(&peer) {
                            Err(format!("more than {MAX_ECHO_PEERS} addresses send echoes"))
                        } else {
                            let gate = gates.entry(peer).or_default();
                            gate.admit(&echoes.sent, &echo).map(|()| echo).map_err(|e| e.to_string())
                        }
                    }
                };
                match verdict {
                    Ok(echo) => echoes.round_trips.record(echo.publish_time),
                    Err(why) => {
                        echoes.rejected.fetch_add(1, Ordering::Relaxed);
                        if mdrelay_iex::warn::allow("udp echo") {
                            tracing::warn!(%peer, %why, "datagram on the sending socket rejected");
                        }
                    }
                }
            }
        })?)
    }

    /// Queues one sealed datagram for every destination; it leaves at the next
    /// [`UdpOut::flush`], or now if the batch is full.
    pub fn send(&mut self, datagram: Bytes) {
        if datagram.len() > 1472 && !self.warned_fragmenting {
            self.warned_fragmenting = true;
            tracing::info!(
                bytes = datagram.len(),
                "datagrams above 1472 bytes are fragmented by IP on a 1500-byte MTU"
            );
        }
        self.pending.push(datagram);
        if self.pending.len() >= BATCH {
            self.flush();
        }
    }

    /// Sends every queued datagram to every destination, in order for each.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let UdpOut { socket, targets, line_b, send_errors, pending, mmsg, .. } = self;
        let line_b = line_b.as_ref().map(|(socket, group)| (socket, group));
        // The headers are not Send (raw pointers inside), so they cannot live in `UdpOut`, which
        // moves to the hot thread: one allocation per flush, against a system call per datagram.
        let mut headers = mmsg.then(|| MultiHeaders::preallocate(BATCH, None));
        for (socket, target) in targets.iter().map(|t| (&*socket, t)).chain(line_b) {
            let mut at = 0;
            while at < pending.len() {
                let Some(h) = headers.as_mut() else { break };
                match send_batch(socket, *target, &pending[at..], h) {
                    Ok(sent) => at += sent,
                    Err(Errno::ENOSYS | Errno::EOPNOTSUPP) => {
                        tracing::info!("sendmmsg is not supported here; sending one datagram per send_to");
                        *mmsg = false;
                        headers = None;
                    }
                    // The first datagram of the batch failed (a later failure only shortens
                    // the count): counted, and the rest goes on.
                    Err(error) => {
                        at += 1;
                        *send_errors += 1;
                        if mdrelay_iex::warn::allow("udp send") {
                            tracing::warn!(%target, %error, "UDP send failed");
                        }
                    }
                }
            }
            for datagram in &pending[at..] {
                if let Err(error) = socket.send_to(datagram, target) {
                    *send_errors += 1;
                    if mdrelay_iex::warn::allow("udp send") {
                        tracing::warn!(%target, %error, "UDP send failed");
                    }
                }
            }
        }
        pending.clear();
    }

    /// Sends the end of stream with the publisher's totals, a few times: UDP may lose one.
    /// With protection, the totals are sealed like a frame, so no other sender can end the stream.
    pub fn end(&mut self, format: Format, next_sequence: u64, totals: &[u8], protector: &mut Protector) {
        let datagram = end_datagram(self.session, format, next_sequence, totals, protector);
        self.flush();
        for _ in 0..3 {
            self.send(datagram.clone());
            self.flush();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The END datagram of `session`: the header, then the totals, sealed as the frames are (so no
/// other sender can end the stream). UDP and NATS send the same bytes.
pub fn end_datagram(
    session: u64,
    format: Format,
    next_sequence: u64,
    totals: &[u8],
    protector: &mut Protector,
) -> Bytes {
    let header = DatagramHeader {
        version: DATAGRAM_VERSION,
        format,
        kind: DatagramKind::End,
        frame_count: 0,
        protection: protector.protection(),
        session,
        sequence: next_sequence,
    };
    let mut datagram = header.to_bytes().to_vec();
    protector.seal_end(session, next_sequence, totals, &mut datagram);
    Bytes::from(datagram)
}

/// Sends `datagrams` (at most [`BATCH`] of them) to `target` in one `sendmmsg` call: how many
/// left, at least one, or the error of the first.
fn send_batch(
    socket: &UdpSocket,
    target: SocketAddr,
    datagrams: &[Bytes],
    headers: &mut MultiHeaders<SockaddrStorage>,
) -> nix::Result<usize> {
    let datagrams = &datagrams[..datagrams.len().min(BATCH)];
    let slices: Vec<[IoSlice<'_>; 1]> = datagrams.iter().map(|d| [IoSlice::new(d)]).collect();
    let addrs = vec![Some(SockaddrStorage::from(target)); datagrams.len()];
    let sent = sendmmsg(socket.as_raw_fd(), headers, &slices, &addrs, [], MsgFlags::empty())?.count();
    // The kernel returns an error rather than 0 when nothing left; a 0 would loop forever.
    Ok(sent.max(1))
}

/// A sending socket: bound to the multicast interface of `multicast` (named by its section), or
/// to any address for unicast only.
fn sending_socket(multicast: Option<(&Multicast, &str)>) -> Result<UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).context("creating the UDP socket")?;
    let _ = socket.set_send_buffer_size(4 << 20);
    let bind_ip = match multicast {
        Some((m, name)) => {
            socket
                .set_multicast_if_v4(&m.interface)
                .with_context(|| format!("{name}.interface: cannot send on {}", m.interface))?;
            socket.set_multicast_ttl_v4(m.ttl()).with_context(|| format!("{name}.ttl"))?;
            socket.set_multicast_loop_v4(m.loopback()).with_context(|| format!("{name}.loopback"))?;
            m.interface
        }
        None => Ipv4Addr::UNSPECIFIED,
    };
    socket
        .bind(&SocketAddr::V4(SocketAddrV4::new(bind_ip, 0)).into())
        .with_context(|| format!("binding a UDP socket to {bind_ip}"))?;
    Ok(socket.into())
}
