//! Where IEX-TP segments come from: a capture file, a synthetic day, a live UDP feed, or another
//! publisher's TCP stream ([`crate::upstream`]).

use crate::config::{Live, Source};
use crate::item::Item;
use crate::progress::Counted;
use crate::stop::{Stop, wait_readable};
use crate::upstream::{TcpUpstream, Upstream, UpstreamSource, UpstreamSummary};
use crate::upstream_nats::NatsUpstream;
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use flate2::read::MultiGzDecoder;
use mdrelay_codec::FormatCodec;
use mdrelay_codec::raw::{PREFIX_LEN, RawCodec};
use mdrelay_codec::{Format, Limits};
use mdrelay_iex::capture::{CaptureError, CaptureReader};
use mdrelay_iex::iextp::{Segment, SegmentHeader};
use mdrelay_iex::link;
use mdrelay_iex::sequence::{SequenceCounts, SequenceEvent, SequenceTracker};
use mdrelay_iex::synth::SyntheticDay;
use mdrelay_proto::relay::{DatagramHeader, DatagramKind};
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, Read};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of segments.
pub enum SegmentSource {
    /// A capture file, reopened for every pass (a FIFO is read once).
    Capture {
        /// The file.
        path: PathBuf,
        /// The open reader.
        reader: CaptureReader,
        /// Packets skipped for not being IEX-TP.
        skipped: u64,
        /// Records the reader skipped in earlier passes (pcapng records of unusable interfaces).
        skipped_records_before: u64,
        /// Whether the file is a FIFO, which cannot be replayed.
        fifo: bool,
        /// The decompressed capture, kept in memory when it is replayed in a loop (see
        /// [`SegmentSource::keep_for_loops`]).
        inflated: Option<Bytes>,
        /// Bytes of input read in this pass (of the file as stored, or of the inflated capture
        /// kept in memory), for the progress bar.
        read: Arc<AtomicU64>,
    },
    /// A synthetic day, regenerated for every pass.
    Synthetic {
        /// Its configuration.
        config: mdrelay_iex::synth::SynthConfig,
        /// The generator.
        day: SyntheticDay,
    },
    /// A live feed.
    Live(LiveSource),
    /// Another publisher's stream. Boxed: its buffers and codecs make it far larger than the
    /// other sources.
    Upstream(UpstreamSource),
}

impl SegmentSource {
    /// Opens the configured source; `stop` ends a wait for a FIFO's writer or a live datagram.
    pub fn open(source: &Source, stop: Arc<Stop>) -> Result<SegmentSource> {
        Ok(match source {
            Source::Capture(path) => {
                let read = Arc::new(AtomicU64::new(0));
                let (reader, fifo) = open_capture(path, &stop, &read)?;
                SegmentSource::Capture {
                    path: path.clone(),
                    reader,
                    skipped: 0,
                    skipped_records_before: 0,
                    fifo,
                    inflated: None,
                    read,
                }
            }
            Source::Synthetic(config) => SegmentSource::Synthetic { config: *config, day: SyntheticDay::new(*config)? },
            Source::Live(live) => SegmentSource::Live(LiveSource::bind(live, stop)?),
            Source::Upstream(upstream) => {
                SegmentSource::Upstream(Box::new(TcpUpstream::connect(upstream.clone(), Vec::new(), stop)?))
            }
            Source::NatsUpstream(upstream) => {
                SegmentSource::Upstream(Box::new(NatsUpstream::connect(upstream.clone(), stop)?))
            }
        })
    }

    /// Before a run that replays the source more than once: a gzipped capture is inflated once
    /// into memory and every pass reads it from there, since inflating costs about as much as
    /// relaying (DEEP10 looped at top speed: bound by gunzip). Only a file of at most
    /// [`KEEP_COMPRESSED_MAX`] inflating to at most [`KEEP_INFLATED_MAX`] is kept; a larger one
    /// is inflated again on every pass, as before, so memory stays bounded.
    pub fn keep_for_loops(&mut self) -> Result<()> {
        let SegmentSource::Capture { path, reader, fifo: false, inflated, read, .. } = self else { return Ok(()) };
        if !reader.compressed() || inflated.is_some() {
            return Ok(());
        }
        let name = path.display().to_string();
        let size = std::fs::metadata(&*path).with_context(|| format!("{name}: cannot read its size"))?.len();
        if size > KEEP_COMPRESSED_MAX {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let file = std::fs::File::open(&*path).with_context(|| format!("{name}: cannot open"))?;
        let mut bytes = Vec::new();
        let inflating = MultiGzDecoder::new(io::BufReader::with_capacity(1 << 16, file))
            .take(KEEP_INFLATED_MAX + 1)
            .read_to_end(&mut bytes);
        if let Err(error) = inflating {
            // A damaged stream is read pass by pass as before, so the packets before the damage
            // are still relayed (and the damage reported where the reader meets it).
            tracing::warn!(file = %name, %error, "capture cannot be inflated whole; it is read pass by pass");
            return Ok(());
        }
        if bytes.len() as u64 > KEEP_INFLATED_MAX {
            tracing::info!(file = %name, "capture too large to keep inflated in memory; inflating it on every pass");
            return Ok(());
        }
        tracing::info!(
            file = %name,
            mib = bytes.len() >> 20,
            seconds = started.elapsed().as_secs_f64(),
            "capture inflated into memory for the loop"
        );
        let bytes = Bytes::from(bytes);
        read.store(0, Ordering::Relaxed);
        *reader = CaptureReader::new(name, Counted::new(io::Cursor::new(bytes.clone()), read.clone()))?;
        *inflated = Some(bytes);
        Ok(())
    }

    /// Counts of input the source skipped, for the run's summary.
    pub fn skipped(&self) -> SourceSkips {
        match self {
            SegmentSource::Capture { reader, skipped, skipped_records_before, .. } => SourceSkips {
                non_iex_packets: *skipped,
                capture_records: skipped_records_before + reader.skipped_records(),
                live_datagrams: 0,
            },
            SegmentSource::Synthetic { .. } => SourceSkips::default(),
            SegmentSource::Live(live) => SourceSkips { live_datagrams: live.rejected, ..SourceSkips::default() },
            SegmentSource::Upstream(_) => SourceSkips::default(),
        }
    }

    /// For a capture: the bytes of this pass read so far (shared, for the progress bar), and the
    /// size of a pass when known (the file's, or the inflated capture's kept in memory).
    pub fn progress(&self) -> Option<(Arc<AtomicU64>, Option<u64>)> {
        let SegmentSource::Capture { path, read, inflated, fifo, .. } = self else { return None };
        let size = match inflated {
            Some(bytes) => Some(bytes.len() as u64),
            None if *fifo => None,
            None => std::fs::metadata(path).ok().map(|m| m.len()),
        };
        Some((read.clone(), size))
    }

    /// What a live feed's numbering said about its input: segments received, gaps, copies,
    /// late segments and restarts. `None` for the other sources.
    pub fn feed_summary(&self) -> Option<FeedSummary> {
        match self {
            SegmentSource::Live(live) => Some(live.feed_summary()),
            _ => None,
        }
    }

    /// True for a live feed or an upstream, whose next segment may be long in coming.
    pub fn is_live(&self) -> bool {
        matches!(self, SegmentSource::Live(_) | SegmentSource::Upstream(_))
    }

    /// What an upstream source received, for the run's summary.
    pub fn upstream_summary(&self) -> Option<UpstreamSummary> {
        self.upstream().map(|u| u.summary())
    }

    /// The upstream publisher, when the source is one.
    pub fn upstream(&self) -> Option<&dyn Upstream> {
        match self {
            SegmentSource::Upstream(upstream) => Some(upstream.as_ref()),
            _ => None,
        }
    }

    /// The sequence number the upstream's END gave its next frame, when it sent one: the relay's
    /// own END says the same, so frames missing at the tail upstream are missing downstream too.
    pub fn end_sequence(&self) -> Option<u64> {
        match self {
            SegmentSource::Upstream(upstream) => upstream.end_sequence(),
            _ => None,
        }
    }

    /// A short description for logs.
    pub fn describe(&self) -> String {
        match self {
            SegmentSource::Capture { path, .. } => format!("capture {}", path.display()),
            SegmentSource::Synthetic { config, .. } => {
                format!(
                    "synthetic day ({} messages, {} symbols, seed {})",
                    config.messages, config.symbols, config.seed
                )
            }
            SegmentSource::Live(live) => format!("live feed on {}", live.describe),
            SegmentSource::Upstream(upstream) => upstream.describe(),
        }
    }

    /// The next segment of this pass; `None` at the end of the pass (or of a live feed).
    pub fn next_item(&mut self) -> Result<Option<Item<'_>>> {
        match self {
            SegmentSource::Capture { reader, skipped, .. } => {
                // Two phases so the returned packet can borrow the reader: find it, then take it.
                loop {
                    let Some(packet) = reader.next_packet()? else { return Ok(None) };
                    let ok = link::udp_datagram(packet.link_type, packet.data)
                        .is_ok_and(|d| Segment::parse(d.payload).is_ok());
                    if ok {
                        break;
                    }
                    *skipped += 1;
                }
                // Re-derive the borrow from the packet just read (next_packet does not advance
                // until it is called again).
                let packet = reader.current_packet().expect("a packet was just read");
                let datagram = link::udp_datagram(packet.link_type, packet.data).expect("checked above");
                Ok(Some(Item { time_ns: packet.timestamp_ns, bytes: datagram.payload, origin: None }))
            }
            SegmentSource::Synthetic { day, .. } => {
                Ok(day.next_segment().map(|s| Item { time_ns: s.send_time, bytes: s.bytes, origin: None }))
            }
            SegmentSource::Live(live) => live.next_item(),
            SegmentSource::Upstream(upstream) => Ok(upstream.next_item()),
        }
    }

    /// Starts another pass; false when the source cannot be replayed (a live feed).
    pub fn rewind(&mut self) -> Result<bool> {
        match self {
            SegmentSource::Capture { fifo: true, .. } => Ok(false),
            SegmentSource::Capture { path, reader, skipped_records_before, inflated, read, .. } => {
                *skipped_records_before += reader.skipped_records();
                read.store(0, Ordering::Relaxed);
                let name = path.display().to_string();
                *reader = match inflated {
                    Some(bytes) => {
                        CaptureReader::new(name, Counted::new(io::Cursor::new(bytes.clone()), read.clone()))?
                    }
                    None => {
                        let file = std::fs::File::open(&*path).with_context(|| format!("{name}: cannot open"))?;
                        CaptureReader::new(name, Counted::new(file, read.clone()))?
                    }
                };
                Ok(true)
            }
            SegmentSource::Synthetic { config, day } => {
                *day = SyntheticDay::new(*config)?;
                Ok(true)
            }
            SegmentSource::Live(_) | SegmentSource::Upstream(_) => Ok(false),
        }
    }
}

/// Largest gzipped capture inflated into memory for a looped replay.
pub const KEEP_COMPRESSED_MAX: u64 = 128 << 20;
/// Largest inflated capture kept in memory for a looped replay.
pub const KEEP_INFLATED_MAX: u64 = 1 << 30;

/// Input a source skipped.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct SourceSkips {
    /// Capture packets that are not IEX-TP over UDP.
    pub non_iex_packets: u64,
    /// Capture records skipped by the reader (pcapng records naming an unusable interface).
    pub capture_records: u64,
    /// Live datagrams that were neither IEX-TP nor the upstream publisher's raw datagrams.
    pub live_datagrams: u64,
}

/// A live feed's input as its IEX-TP numbering shows it (`docs/operations.md`, "Loss on the live
/// input").
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct FeedSummary {
    /// IEX-TP segments received, copies included (bare, or in an upstream's raw datagrams).
    pub segments: u64,
    /// Messages in them, by their headers' counts.
    pub messages: u64,
    /// Gaps, copies (dropped, not relayed), late segments and restarts.
    #[serde(flatten)]
    pub sequence: SequenceCounts,
}

impl std::fmt::Display for FeedSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.sequence;
        write!(
            f,
            "{} segments, {} messages received; gaps {} ({} messages missing, {} came late), duplicates {} (not relayed), reordered {}, overlapping {} ({} messages repeated), restarts {}",
            self.segments,
            self.messages,
            s.gaps,
            s.gap_messages,
            s.late_messages,
            s.duplicate_segments,
            s.reordered_segments,
            s.overlapping_segments,
            s.repeated_messages,
            s.restarts
        )
    }
}

/// Opens a capture. A FIFO (`mkfifo`, a pipe from another program) is opened without blocking
/// and waited on with `stop` checked, since opening it blocks until a writer appears, and a
/// publisher waiting there could neither say so nor be stopped.
fn open_capture(path: &Path, stop: &Stop, read: &Arc<AtomicU64>) -> Result<(CaptureReader, bool)> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let is_fifo = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
    if !is_fifo {
        let name = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| CaptureError::Io { name: name.clone(), source })?;
        return Ok((CaptureReader::new(name, Counted::new(file, read.clone()))?, false));
    }
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
        .with_context(|| format!("{}: cannot open the FIFO", path.display()))?;
    tracing::info!(file = %path.display(), "the capture is a FIFO: waiting for a writer");
    // Linux reports neither readable nor hung up until a writer has opened the FIFO; the stop
    // ends the wait at once.
    loop {
        if stop.is_set() {
            bail!("{}: stopped while waiting for a writer on the FIFO", path.display());
        }
        let ready = wait_readable(&[file.as_fd(), stop.fd()], None)
            .with_context(|| format!("{}: waiting on the FIFO", path.display()))?;
        if ready.contains(&0) {
            break;
        }
    }
    // Blocking reads from here on, as from any file.
    fcntl(file.as_fd(), FcntlArg::F_SETFL(OFlag::empty()))
        .with_context(|| format!("{}: cannot make the FIFO blocking", path.display()))?;
    Ok((CaptureReader::new(path.display().to_string(), Counted::new(file, read.clone()))?, true))
}

/// Receive buffer asked for on a live feed's socket: a few hundred milliseconds of a busy feed.
const LIVE_RECEIVE_BUFFER: usize = 16 << 20;

/// A live IEX-TP feed on UDP: bare IEX-TP segments (from the exchange or tcpreplay), or another
/// mdrelay publisher's raw relay datagrams. Every segment's numbering is tracked
/// ([`SequenceTracker`]): gaps, late segments and restarts are counted, and a copy of what
/// came before is counted and dropped, so an exchange's A and B lines, or a datagram played
/// twice, are relayed once.
pub struct LiveSource {
    socket: UdpSocket,
    describe: String,
    buf: Vec<u8>,
    len: usize,
    /// Offset of the next raw frame in `buf` when it holds a relay datagram.
    cursor: usize,
    relay_datagram: bool,
    raw: RawCodec,
    idle_timeout: Option<Duration>,
    stop: Arc<Stop>,
    /// The upstream publisher's session, from its first raw data datagram: its control datagrams
    /// (END) are accepted only from that session, so a stray or spoofed END cannot end the stream.
    upstream_session: Option<u64>,
    /// Datagrams that were neither IEX-TP nor the upstream's raw relay datagrams.
    pub rejected: u64,
    /// The feed's numbering: what was lost, copied, late or restarted.
    sequence: SequenceTracker,
    /// Segments and messages received, copies included.
    received: (u64, u64),
}

/// Takes one segment of the feed into its accounting; false for a copy of what came before,
/// which is not relayed (the A and B lines of an exchange, a datagram replayed).
fn admit(sequence: &mut SequenceTracker, received: &mut (u64, u64), header: &SegmentHeader, feed: &str) -> bool {
    received.0 += 1;
    received.1 += u64::from(header.message_count);
    let event = sequence.observe(header);
    match event {
        SequenceEvent::InOrder | SequenceEvent::Reordered { .. } => {}
        SequenceEvent::Duplicate => {
            // Every segment of line B is one: not worth a line each.
            tracing::trace!(%feed, sequence = header.first_sequence, "copy of a segment already relayed; dropped");
        }
        SequenceEvent::Gap { .. } | SequenceEvent::Overlap { .. } => {
            if mdrelay_iex::warn::allow("live sequence") {
                tracing::warn!(%feed, channel = header.channel_id, session = header.session_id,
                    sequence = header.first_sequence, ?event, "the live feed's numbering skipped or repeated messages");
            }
        }
        SequenceEvent::Restart { .. } | SequenceEvent::NewSession { .. } => {
            tracing::info!(%feed, channel = header.channel_id, session = header.session_id,
                sequence = header.first_sequence, ?event, "the live feed's numbering starts again");
        }
    }
    event.is_new()
}

impl LiveSource {
    /// Binds (and joins the group, if any); `stop` ends a wait for the next datagram.
    pub fn bind(live: &Live, stop: Arc<Stop>) -> Result<LiveSource> {
        let socket =
            Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).context("creating the live feed socket")?;
        socket.set_reuse_address(true)?;
        // Market data bursts: a large receive buffer rides them out. SO_RCVBUFFORCE passes
        // net.core.rmem_max but needs CAP_NET_ADMIN; SO_RCVBUF is capped at rmem_max.
        use nix::sys::socket::{setsockopt, sockopt::RcvBufForce};
        if setsockopt(&socket, RcvBufForce, &LIVE_RECEIVE_BUFFER).is_err() {
            let _ = socket.set_recv_buffer_size(LIVE_RECEIVE_BUFFER);
        }
        let granted = socket.recv_buffer_size().unwrap_or(0);
        if granted < LIVE_RECEIVE_BUFFER {
            tracing::warn!(
                requested = LIVE_RECEIVE_BUFFER,
                granted,
                "live feed receive buffer below what was asked for: bursts may be dropped; run as root or raise net.core.rmem_max"
            );
        }
        let bind: SocketAddr = match live.group {
            Some(group) => SocketAddr::new(group.into(), live.listen.port()),
            None => live.listen,
        };
        socket.bind(&bind.into()).with_context(|| format!("source.live.listen: cannot bind {bind}"))?;
        if let Some(group) = live.group {
            socket
                .join_multicast_v4(&group, &live.interface)
                .with_context(|| format!("source.live.group: cannot join {group} on interface {}", live.interface))?;
        }
        let socket: UdpSocket = socket.into();
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let describe = match live.group {
            Some(g) => format!("{g}:{} (interface {})", live.listen.port(), live.interface),
            None => live.listen.to_string(),
        };
        Ok(LiveSource {
            socket,
            describe,
            buf: vec![0; 65_536],
            len: 0,
            cursor: 0,
            relay_datagram: false,
            raw: RawCodec::new(Limits::default()),
            idle_timeout: (!live.idle_timeout.is_zero()).then_some(live.idle_timeout),
            stop,
            upstream_session: None,
            rejected: 0,
            sequence: SequenceTracker::new(),
            received: (0, 0),
        })
    }

    /// What the feed's numbering said so far.
    pub fn feed_summary(&self) -> FeedSummary {
        FeedSummary { segments: self.received.0, messages: self.received.1, sequence: self.sequence.counts() }
    }

    fn next_item(&mut self) -> Result<Option<Item<'_>>> {
        // Since when no datagram came, once a wait began.
        let mut idle_since: Option<Instant> = None;
        loop {
            if self.relay_datagram && self.cursor < self.len {
                let rest = &self.buf[self.cursor..self.len];
                match self.raw.frame_len(rest) {
                    Ok(Some(n)) => {
                        let start = self.cursor;
                        self.cursor += n;
                        let range = start + PREFIX_LEN..start + n;
                        // The header is copied out first: the bytes are borrowed only to return
                        // them, once the segment is known to be admitted.
                        let header = Segment::parse(&self.buf[range.clone()]).map(|s| s.header);
                        let time_ns = match header {
                            Ok(header) => {
                                if !admit(&mut self.sequence, &mut self.received, &header, &self.describe) {
                                    continue;
                                }
                                header.send_time
                            }
                            // Counted by the engine, which skips it.
                            Err(_) => 0,
                        };
                        let bytes = &self.buf[range];
                        return Ok(Some(Item { time_ns, bytes, origin: None }));
                    }
                    _ => {
                        self.rejected += 1;
                        if mdrelay_iex::warn::allow("live frame") {
                            tracing::warn!(feed = %self.describe, offset = self.cursor, "malformed raw frame in a relay datagram; rest of the datagram skipped");
                        }
                        self.cursor = self.len;
                        continue;
                    }
                }
            }
            if self.stop.is_set() {
                return Ok(None);
            }
            // Wait for a datagram, the stop, or the end of the idle time, whichever comes first.
            let since = *idle_since.get_or_insert_with(Instant::now);
            let left = match self.idle_timeout {
                Some(t) if since.elapsed() >= t => {
                    tracing::info!(feed = %self.describe, "live feed idle; ending the stream");
                    return Ok(None);
                }
                Some(t) => Some(t - since.elapsed()),
                None => None,
            };
            let ready = wait_readable(&[self.socket.as_fd(), self.stop.fd()], left)
                .with_context(|| format!("waiting on {}", self.describe))?;
            if !ready.contains(&0) {
                continue;
            }
            let (n, peer) = match self.socket.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(e).with_context(|| format!("receiving on {}", self.describe)),
            };
            idle_since = None;
            self.len = n;
            let datagram = &self.buf[..n];
            if DatagramHeader::is_relay_datagram(datagram) {
                let header = match DatagramHeader::parse(datagram) {
                    Ok(h) => h,
                    Err(e) => {
                        self.rejected += 1;
                        if mdrelay_iex::warn::allow("live datagram") {
                            tracing::warn!(%peer, %e, "relay datagram rejected");
                        }
                        continue;
                    }
                };
                match header.kind {
                    DatagramKind::End if self.upstream_session == Some(header.session) => {
                        tracing::info!(%peer, "upstream publisher ended its stream");
                        return Ok(None);
                    }
                    DatagramKind::End | DatagramKind::Echo => {
                        self.rejected += 1;
                        if mdrelay_iex::warn::allow("live control") {
                            tracing::warn!(%peer, kind = ?header.kind, session = format_args!("{:#x}", header.session),
                                "control datagram not from the upstream session that sends the data; ignored");
                        }
                        continue;
                    }
                    DatagramKind::Data if header.format != Format::Raw => {
                        self.rejected += 1;
                        if mdrelay_iex::warn::allow("live format") {
                            tracing::warn!(%peer, format = %header.format, "a live source relays raw IEX-TP; this upstream sends another format");
                        }
                        continue;
                    }
                    DatagramKind::Data => {
                        if self.upstream_session.is_none() {
                            tracing::info!(%peer, session = format_args!("{:#x}", header.session), "upstream publisher session");
                        }
                        // A restarted upstream's data carries its new session; its END follows.
                        self.upstream_session = Some(header.session);
                        self.relay_datagram = true;
                        self.cursor = header.len_on_wire();
                        continue;
                    }
                }
            }
            self.relay_datagram = false;
            match Segment::parse(datagram).map(|s| s.header) {
                Ok(header) => {
                    if !admit(&mut self.sequence, &mut self.received, &header, &self.describe) {
                        continue;
                    }
                    return Ok(Some(Item { time_ns: header.send_time, bytes: &self.buf[..n], origin: None }));
                }
                Err(e) => {
                    self.rejected += 1;
                    if mdrelay_iex::warn::allow("live datagram") {
                        tracing::warn!(%peer, len = n, %e, "datagram is neither IEX-TP nor an mdrelay raw datagram; skipped");
                    }
                }
            }
        }
    }
}

/// Refuses a live source for a configuration that would loop a publisher into itself.
pub fn check_live_not_self(live: &Live, own: &[SocketAddr]) -> Result<()> {
    if own.iter().any(|a| a.port() == live.listen.port() && (a.ip().is_loopback() || a.ip().is_multicast())) {
        bail!(
            "source.live.listen: port {} is also a destination of this publisher; it would relay its own output",
            live.listen.port()
        );
    }
    Ok(())
}
