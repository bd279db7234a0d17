//! Relay chaining: another mdrelay publisher's TCP stream as this publisher's source, so relays
//! form a distribution tree across hosts (docs/chaining.md).
//!
//! The relay is a subscriber of its upstream, speaking the relay protocol as `mdrelay-sub` does
//! (proto's [`relay`](mdrelay_proto::relay) structures): greeting, answer, then `FORMAT`, `DATA`
//! and `END` records. It follows the upstream's format, switches included, decodes every frame
//! with proto's [`Codec`] and rebuilds the IEX-TP segment it carried
//! ([`Resegmenter`]: a raw frame's segment is kept byte for byte), which the engine then
//! publishes in this relay's own format and transports.
//!
//! Each frame keeps the origin's publish time and sequence number ([`Origin`]): a leaf measures
//! origin-to-leaf latency, and a gap anywhere upstream stays a gap downstream. The relay adopts
//! the upstream's session too (it connects before its outputs are built), so a leaf sees one
//! session through the whole chain. Each hop measures its own latency: receipt time minus the
//! origin's publish time.
//!
//! A connection lost without `END` is made again with a doubling backoff, resuming from the frame
//! after the last one received (protocol version 2: the upstream replays what its ring holds).
//! So is a connection whose records stop fitting the stream (proto's [`Continuity`]: a header
//! changed on the way, say) or, with `crc`, whose frame fails its CRC-32C: a protocol violation,
//! counted and logged, after which nothing more of that connection is believed. Violations in a
//! row wait longer each time, and with no frame taken between them the relay gives up after
//! `give_up_after`, as for an upstream out of reach.
//! The relay ends with an error naming the upstream when it cannot: no connection within
//! `give_up_after`, or an upstream that restarted (a new session, whose numbering the relay's
//! frames cannot follow). Its own stream then ends with its `END` and totals, so its subscribers
//! stop instead of waiting; the summary and the exit status say why. That END says the stream was
//! cut short ([`Totals::truncated`]), so no leaf reports its totals as matching; after the
//! upstream's own END, the relay's END carries the upstream's totals
//! ([`UpstreamSource::end_totals`]).
//!
//! Bytes from the upstream are untrusted: records are bounded by [`MAX_RECORD`] before anything
//! is read into memory (the buffer grows only as bytes arrive), every frame is delimited and
//! decoded by checked code, and a frame that fails is counted and skipped, never a panic.

use crate::config::{Upstream, check_not_self};
use crate::item::{Item, Origin};
use hdrhistogram::Histogram;
use mdrelay_proto::clock::wall_clock_ns;
use mdrelay_proto::codec::{BatchHeader, Codec, Format, Limits};
use mdrelay_proto::latency::{LatencySummary, latency_histogram};
use mdrelay_proto::relay::{
    Continuity, HandshakeError, Hello, MAX_RECORD, ProtectError, Protection, Protector, RecordHeader, RecordTag,
    Resume, Subscribe, Totals, Verdict, Violation, protect::LEN_PREFIX,
};
use mdrelay_proto::resegment::Resegmenter;
use mdrelay_telemetry::exit::{ExitStatus, WithExitStatus};
use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a blocking read gives up waiting to look at the stop flag.
const POLL: Duration = Duration::from_millis(100);
/// First wait before another attempt; it doubles up to `reconnect_max`.
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Starting size of the read buffer; it grows (doubling) only when full of bytes that arrived.
const READ_BUFFER: usize = 256 << 10;
/// Largest read buffer: one whole record of the largest size the protocol allows, and the next
/// record's header (which says whether a record that skips ahead is to be believed).
const MAX_BUFFER: usize = 2 * RecordHeader::LEN + MAX_RECORD;
/// A protocol violation this long after the one before starts the backoff from its first wait
/// again: a link that corrupts a record now and then costs a short pause each time.
const VIOLATIONS_FORGOTTEN_AFTER: Duration = Duration::from_secs(30);
/// TCP keepalive: an upstream host that vanished without closing (power, cable) is noticed
/// within about `KEEPALIVE_IDLE + KEEPALIVE_RETRIES × KEEPALIVE_INTERVAL` of silence.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_RETRIES: u32 = 5;

/// What the relay received from its upstream, for the run's summary.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct UpstreamSummary {
    /// The upstream's address, as configured.
    pub connect: String,
    /// The upstream's session, which this relay's frames carry.
    pub session: u64,
    /// Frames decoded and handed on.
    pub frames: u64,
    /// Messages in them.
    pub messages: u64,
    /// Sequence number of the first frame handed on.
    pub first_sequence: Option<u64>,
    /// Sequence number of the last frame handed on.
    pub last_sequence: Option<u64>,
    /// Frames missing from the upstream's numbering (they stay missing downstream).
    pub gaps: u64,
    /// Frames at or below one already handed on (a replay overlapping), skipped.
    pub duplicates: u64,
    /// Frames that did not decode (skipped: a gap downstream).
    pub decode_errors: u64,
    /// Records with a frame that could not be delimited (the rest of the record skipped).
    pub undelimited_records: u64,
    /// Frames whose segment cannot be rebuilt (larger than a UDP datagram holds).
    pub unrepresentable_frames: u64,
    /// Records that have no place on a stream connection (ECHO, REQUEST, GONE), skipped.
    pub invalid_records: u64,
    /// Records whose numbers did not fit the stream (a header changed on the way, say): each
    /// dropped its connection, and the next resumed after the last frame taken.
    pub protocol_violations: u64,
    /// Frames whose CRC-32C did not match (`crc`): each dropped its connection, and the next
    /// resumed from that frame.
    pub crc_failures: u64,
    /// Changes of the upstream's format.
    pub format_switches: u64,
    /// Formats the upstream sent.
    pub formats_seen: BTreeSet<Format>,
    /// Connections made again after one was lost.
    pub reconnects: u64,
    /// Reconnections where the upstream resumed at the frame asked for.
    pub resumes: u64,
    /// Bytes received.
    pub bytes: u64,
    /// This hop's latency: receipt time minus the origin's publish time, ns.
    pub latency_ns: LatencySummary,
    /// Frames received before their origin's publish time (clocks out of step), not in the
    /// latency figures.
    pub negative_latencies: u64,
    /// The upstream's totals, from its END.
    pub totals: Option<Totals>,
    /// How the upstream stream ended: "end" (its END), "stopped" (this relay was stopped) or
    /// "failed" (see `error`).
    pub stop_reason: &'static str,
    /// Why the relay could not go on, naming the upstream.
    pub error: Option<String>,
    /// The upstream refused this relay (or speaks another protocol): exit status 3, not 4.
    #[serde(skip)]
    pub refused: bool,
}

/// Why the stream from the upstream did not go on.
#[derive(Debug)]
enum Trouble {
    /// The connection is gone; another one may resume it.
    Lost(String),
    /// Another connection would not help: the reason, naming the upstream.
    Fatal(String),
    /// The upstream refused this relay, or is not one it can take: the reason, naming it.
    Refused(String),
    /// The stop flag was set.
    Stopped,
    /// The connection's bytes cannot be believed any more (counted and logged): another one
    /// resumes after the last frame taken, after a wait that grows while violations follow.
    Violation(String),
}

/// The DATA record whose frames are being handed out: it stays at the front of the buffer until
/// all of them are.
#[derive(Debug, Clone, Copy)]
struct Record {
    format: Format,
    /// Sequence number of its first frame.
    first: u64,
    /// Frames its header declares.
    count: u64,
    /// Frames taken so far.
    index: u64,
    /// Offset of the next frame in the buffer's data (the payload starts after the header).
    offset: usize,
    /// Header and payload bytes.
    total: usize,
}

/// A frame decoded and ready to hand on: its bytes in the buffer's data, and its header.
#[derive(Debug, Clone, Copy)]
struct Ready {
    start: usize,
    end: usize,
    header: BatchHeader,
    sequence: u64,
}

/// Bytes read from the upstream and not yet consumed. It grows (doubling) only when it is full of
/// bytes that arrived, never because a length field asks for it.
#[derive(Debug)]
struct RecvBuf {
    bytes: Vec<u8>,
    start: usize,
    end: usize,
}

impl RecvBuf {
    fn new() -> RecvBuf {
        RecvBuf { bytes: vec![0; READ_BUFFER], start: 0, end: 0 }
    }

    fn data(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.clear();
        }
    }

    fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Room to read into at the end: made by moving the unread bytes to the front, or by doubling
    /// the buffer up to [`MAX_BUFFER`]; `None` when it is full at that size.
    fn spare(&mut self) -> Option<&mut [u8]> {
        if self.end == self.bytes.len() {
            if self.start > 0 {
                self.bytes.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.bytes.len() < MAX_BUFFER {
                let grown = (self.bytes.len() * 2).min(MAX_BUFFER);
                self.bytes.resize(grown, 0);
            } else {
                return None;
            }
        }
        Some(&mut self.bytes[self.end..])
    }

    fn commit(&mut self, n: usize) {
        self.end = (self.end + n).min(self.bytes.len());
    }
}

/// Another publisher's stream as a source of segments.
pub struct UpstreamSource {
    settings: Upstream,
    /// Addresses of this publisher's own servers, by setting: never an upstream.
    own: Vec<(&'static str, SocketAddr)>,
    stop: Arc<AtomicBool>,
    stream: Option<TcpStream>,
    /// The upstream's address on the current connection.
    peer: Option<SocketAddr>,
    buf: RecvBuf,
    /// Byte of the connection (counted from its greeting) where the buffer's data starts.
    offset: u64,
    record: Option<Record>,
    /// One codec per format, made when the format is first seen; indexed by format id.
    codecs: [Option<Codec>; Format::ALL.len()],
    resegmenter: Resegmenter,
    /// The upstream's format now.
    format: Option<Format>,
    /// The session of the first greeting: every later one must be the same.
    session: Option<u64>,
    /// The frame after the last one handed on: where a new connection resumes.
    next: Option<u64>,
    /// The frame asked for on this connection, until its first record says where it starts.
    asked: Option<u64>,
    /// Whether this connection's records fit together.
    continuity: Continuity,
    /// Checks each frame's CRC-32C, when the upstream protects its frames with one.
    crc: Option<Protector>,
    /// The wait before reconnecting after the next protocol violation.
    violation_backoff: Duration,
    /// When the last protocol violation was.
    last_violation: Option<Instant>,
    /// Violations since the last frame handed on: when the first was, and how many.
    violations_without_frames: Option<(Instant, u64)>,
    /// A version-1 upstream's missing resume was reported.
    warned_v1: bool,
    /// Receipt time of the bytes being read, ns since the epoch.
    receive_time: i64,
    last_read: Instant,
    end_sequence: Option<u64>,
    latency: Histogram<u64>,
    summary: UpstreamSummary,
    ended: bool,
}

impl UpstreamSource {
    /// Connects to the upstream (trying for `give_up_after`) and completes the handshake, so its
    /// session is known before this publisher's outputs are built; `own` are this publisher's
    /// servers, which must not be the upstream; `stop` ends the attempts.
    pub fn connect(
        settings: Upstream,
        own: Vec<(&'static str, SocketAddr)>,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<UpstreamSource> {
        let summary = UpstreamSummary { connect: settings.connect.clone(), ..UpstreamSummary::default() };
        // CRC-32C only: an encrypted upstream is refused at its greeting.
        let crc = settings.crc.then(|| Protector::new(true, None, mdrelay_proto::codec::DEFAULT_MAX_FRAME));
        let mut source = UpstreamSource {
            settings,
            own,
            stop,
            stream: None,
            peer: None,
            buf: RecvBuf::new(),
            offset: 0,
            record: None,
            codecs: Default::default(),
            crc,
            resegmenter: Resegmenter::new(),
            format: None,
            session: None,
            next: None,
            asked: None,
            continuity: Continuity::new(None),
            violation_backoff: INITIAL_BACKOFF,
            last_violation: None,
            violations_without_frames: None,
            warned_v1: false,
            receive_time: 0,
            last_read: Instant::now(),
            end_sequence: None,
            latency: latency_histogram(),
            summary,
            ended: false,
        };
        match source.reach(None) {
            Ok(()) => Ok(source),
            Err(Trouble::Refused(why)) => Err(anyhow::anyhow!(why)).exit_status(ExitStatus::Refused),
            Err(Trouble::Fatal(why) | Trouble::Lost(why) | Trouble::Violation(why)) => {
                Err(anyhow::anyhow!(why)).exit_status(ExitStatus::UpstreamLost)
            }
            Err(Trouble::Stopped) => {
                Err(anyhow::anyhow!("stopped before the upstream {} was reached", source.settings.connect))
            }
        }
    }

    /// Makes `stop` the flag that ends waits for the upstream (the run's, once it has one).
    pub fn set_stop(&mut self, stop: Arc<AtomicBool>) {
        self.stop = stop;
    }

    /// The upstream's session, which this relay's outputs take as theirs.
    pub fn session(&self) -> u64 {
        self.summary.session
    }

    /// A short description for logs.
    pub fn describe(&self) -> String {
        format!("upstream publisher {} (session {:#x})", self.settings.connect, self.summary.session)
    }

    /// The sequence number the upstream's END gave its next frame, if it sent one.
    pub fn end_sequence(&self) -> Option<u64> {
        self.end_sequence
    }

    /// What this relay's END says was sent, given `own`, the totals of what it published. After
    /// the upstream's END: the upstream's totals (the origin's, through every hop), so a leaf
    /// compares what it got with what the origin sent, and frames lost on any hop show. Else
    /// (the upstream lost for good, this relay stopped or at a limit): its own totals, marked
    /// truncated, since frames the origin sent after the last one received here were never
    /// relayed and no count says how many.
    pub fn end_totals(&self, own: &Totals) -> Totals {
        let upstream_ended = self.ended && self.summary.stop_reason == "end";
        match &self.summary.totals {
            Some(upstream) if upstream_ended => upstream.clone(),
            // An END whose totals did not parse: the stream did end there.
            _ if upstream_ended => own.clone(),
            _ => Totals { truncated: true, ..own.clone() },
        }
    }

    /// The counts so far (without the latency figures, which are in [`UpstreamSource::latency`]).
    pub fn counts(&self) -> &UpstreamSummary {
        &self.summary
    }

    /// This hop's latencies so far, ns.
    pub fn latency(&self) -> &Histogram<u64> {
        &self.latency
    }

    /// What was received so far; a stream the relay stopped taking before it ended (a message or
    /// time limit) counts as stopped.
    pub fn summary(&self) -> UpstreamSummary {
        let stop_reason = if self.ended { self.summary.stop_reason } else { "stopped" };
        UpstreamSummary { latency_ns: LatencySummary::of(&self.latency), stop_reason, ..self.summary.clone() }
    }

    /// The next frame's segment, with the origin's stamp and number; `None` at the upstream's END,
    /// at a stop, or when the upstream is lost for good (the summary's `error` says why).
    pub fn next_item(&mut self) -> Option<Item<'_>> {
        let ready = loop {
            if self.ended {
                return None;
            }
            if self.stop.load(Ordering::Relaxed) {
                self.finish("stopped", None);
                return None;
            }
            let taken = match self.take_frame() {
                Ok(Some(ready)) => break ready,
                Ok(None) => self.next_record(),
                Err(trouble) => Err(trouble),
            };
            let trouble = match taken {
                Ok(()) => continue,
                Err(Trouble::Lost(why)) => match self.reach(Some(why)) {
                    Ok(()) => continue,
                    Err(trouble) => trouble,
                },
                Err(Trouble::Violation(why)) => match self.after_violation(why) {
                    Ok(()) => continue,
                    Err(trouble) => trouble,
                },
                Err(trouble) => trouble,
            };
            self.summary.refused = matches!(trouble, Trouble::Refused(_));
            match trouble {
                Trouble::Stopped => self.finish("stopped", None),
                Trouble::Fatal(why) | Trouble::Lost(why) | Trouble::Violation(why) | Trouble::Refused(why) => {
                    tracing::error!(upstream = %self.settings.connect, "{why}; the relay's stream ends here");
                    self.finish("failed", Some(why));
                }
            }
            return None;
        };
        let UpstreamSource { buf, resegmenter, summary, .. } = self;
        let frame = &buf.data()[ready.start..ready.end];
        let origin = Some(Origin { publish_time: ready.header.publish_time, sequence: ready.sequence });
        let time_ns = ready.header.send_time;
        match resegmenter.finish(frame, &ready.header) {
            Ok(bytes) => Some(Item { time_ns, bytes, origin }),
            Err(error) => {
                // Handed on empty: the engine counts it as a segment it could not parse, and the
                // frame's number is a gap downstream.
                summary.unrepresentable_frames += 1;
                if mdrelay_proto::warn::allow("upstream segment") {
                    tracing::warn!(upstream = %summary.connect, sequence = ready.sequence, %error, "frame not relayed");
                }
                Some(Item { time_ns, bytes: &[], origin })
            }
        }
    }

    fn finish(&mut self, reason: &'static str, error: Option<String>) {
        self.ended = true;
        self.summary.stop_reason = reason;
        self.summary.error = error;
        self.stream = None;
    }

    /// The next frame of the current DATA record, decoded (its messages given to the
    /// resegmenter); `None` once the record has no more (it is then consumed). With `crc`, a
    /// frame that fails its CRC-32C is a violation: nothing more of its connection is believed.
    fn take_frame(&mut self) -> Result<Option<Ready>, Trouble> {
        let UpstreamSource {
            record,
            buf,
            offset,
            codecs,
            crc,
            resegmenter,
            next,
            summary,
            latency,
            receive_time,
            peer,
            violations_without_frames,
            ..
        } = self;
        let Some(current) = record.as_mut() else { return Ok(None) };
        let data = buf.data();
        let codec = codecs[usize::from(current.format.id())]
            .get_or_insert_with(|| Codec::new(current.format, Limits::default()));
        while current.index < current.count {
            let rest = &data[current.offset..current.total];
            // first + index stays far below u64::MAX: first is at most MAX_SEQUENCE.
            let sequence = current.first + current.index;
            // Where the frame's own bytes are in the record, and the bytes it takes there.
            let (start, len, taken) = match crc {
                Some(crc) => {
                    // Checked before anything of the frame is read: a changed byte, or a length
                    // that does not fit the record, costs the connection, not the frame.
                    let at = *offset + current.offset as u64;
                    let opened = match crc.sealed_len(rest) {
                        Ok(Some(sealed)) => crc
                            .open(summary.session, sequence, current.format, &rest[..sealed], &mut Vec::new())
                            .map(|frame| (sealed, frame.len())),
                        Ok(None) => Err(ProtectError::Malformed {
                            offset: rest.len(),
                            what: "the record ends inside the protected frame".into(),
                        }),
                        Err(e) => Err(e),
                    };
                    match opened {
                        // CRC-32C only (an encrypted upstream is refused): the frame is the body
                        // behind the length prefix.
                        Ok((sealed, body)) => (current.offset + LEN_PREFIX, body, sealed),
                        Err(error) => {
                            summary.crc_failures += 1;
                            tracing::warn!(upstream = %peer_name(*peer), at, sequence, %error,
                                "frame changed on the way; dropping the connection to resume from this frame");
                            return Err(Trouble::Violation(format!(
                                "frame {sequence} at stream byte {at} failed its check: {error}"
                            )));
                        }
                    }
                }
                None => match codec.frame_len(rest) {
                    Ok(Some(n)) if n > 0 && n <= rest.len() => (current.offset, n, n),
                    delimit => {
                        let what = match delimit {
                            Err(e) => e.to_string(),
                            Ok(None) => format!("{} bytes left, not a whole frame", rest.len()),
                            Ok(Some(n)) => format!("framing says {n} bytes with {} left", rest.len()),
                        };
                        summary.undelimited_records += 1;
                        if mdrelay_proto::warn::allow("upstream delimit") {
                            tracing::warn!(upstream = %peer_name(*peer), at = *offset + current.offset as u64, format = %current.format,
                                error = %what, "cannot delimit a frame; the rest of the record is skipped");
                        }
                        break;
                    }
                },
            };
            current.offset += taken;
            current.index += 1;
            if let Some(expected) = *next {
                if sequence < expected {
                    summary.duplicates += 1;
                    continue;
                }
                if sequence > expected {
                    summary.gaps += sequence - expected;
                    if mdrelay_proto::warn::allow("upstream gap") {
                        tracing::warn!(upstream = %peer_name(*peer), missing = sequence - expected, before = sequence,
                            "frames missing upstream; they stay missing downstream");
                    }
                }
            }
            *next = Some(sequence + 1);
            let frame = &data[start..start + len];
            resegmenter.begin(current.format);
            let mut messages = 0u64;
            let decoded = codec.decode(frame, |m| {
                messages += 1;
                resegmenter.message(m);
            });
            match decoded {
                Ok(header) => {
                    summary.frames += 1;
                    summary.messages += messages;
                    summary.first_sequence.get_or_insert(sequence);
                    summary.last_sequence = Some(sequence);
                    *violations_without_frames = None;
                    let hop = receive_time.saturating_sub(header.publish_time);
                    match u64::try_from(hop) {
                        Ok(ns) => latency.saturating_record(ns.max(1)),
                        Err(_) => summary.negative_latencies += 1,
                    }
                    return Ok(Some(Ready { start, end: start + len, header, sequence }));
                }
                Err(error) => {
                    summary.decode_errors += 1;
                    if mdrelay_proto::warn::allow("upstream decode") {
                        tracing::warn!(upstream = %peer_name(*peer), at = *offset + start as u64, sequence, %error,
                            "frame skipped; it is a gap downstream");
                    }
                }
            }
        }
        let total = current.total;
        *record = None;
        buf.consume(total);
        *offset += total as u64;
        Ok(None)
    }

    /// Takes the record at the front of the buffer, reading more bytes when it is not whole.
    fn next_record(&mut self) -> Result<(), Trouble> {
        let data = self.buf.data();
        if data.len() < RecordHeader::LEN {
            return self.read_more();
        }
        let header = RecordHeader::parse(data, MAX_RECORD).map_err(|e| {
            // The stream's framing is lost: only a new connection finds it again.
            Trouble::Lost(format!("bad record header at stream byte {}: {}", self.offset + e.offset as u64, e.what))
        })?;
        let total = RecordHeader::LEN + header.length as usize;
        if data.len() < total {
            return self.read_more();
        }
        let at = self.offset;
        // Numbers that do not fit the connection's stream are a violation; a record that skips
        // ahead waits for the header of the record after it to say whether it is believed.
        let mut verdict = self.continuity.check(&header, None);
        if verdict == Verdict::NeedNext {
            let Some(after) = data.get(total..).filter(|after| after.len() >= RecordHeader::LEN) else {
                return self.read_more();
            };
            let after = RecordHeader::parse(after, MAX_RECORD).map_err(|e| {
                let at = at + total as u64 + e.offset as u64;
                Trouble::Lost(format!("bad record header at stream byte {at}: {}", e.what))
            })?;
            verdict = self.continuity.check(&header, Some(&after));
        }
        if let Verdict::Violation(violation) = verdict {
            return Err(self.violation(at, violation));
        }
        let payload = &data[RecordHeader::LEN..total];
        match header.tag {
            RecordTag::Data => {
                let count = u64::from(header.frame_count);
                self.note_format(header.format);
                self.started_at(header.sequence);
                let record = Record {
                    format: header.format,
                    first: header.sequence,
                    count,
                    index: 0,
                    offset: RecordHeader::LEN,
                    total,
                };
                // Consumed once its frames are taken.
                self.record = Some(record);
                return Ok(());
            }
            RecordTag::Format => {
                self.note_format(header.format);
                self.started_at(header.sequence);
            }
            RecordTag::End => {
                let parsed = Totals::parse(payload);
                let next = self.next.unwrap_or(1);
                // Believed when it fits the stream: a wild number would invent loss downstream.
                if header.sequence >= next && header.sequence - next <= u64::from(u32::MAX) {
                    self.end_sequence = Some(header.sequence);
                } else if mdrelay_proto::warn::allow("upstream end") {
                    tracing::warn!(upstream = %peer_name(self.peer), next_sequence = header.sequence, expected = next,
                        "END names a next frame that does not fit the stream; ignored");
                }
                match parsed {
                    Ok(totals) => {
                        tracing::info!(upstream = %peer_name(self.peer), frames = totals.frames, messages = totals.messages,
                            "upstream end of stream");
                        self.summary.totals = Some(totals);
                    }
                    Err(e) => {
                        self.summary.invalid_records += 1;
                        tracing::warn!(upstream = %peer_name(self.peer), at = at + RecordHeader::LEN as u64 + e.offset as u64,
                            error = %e.what, "upstream end of stream with unreadable totals");
                    }
                }
                self.finish("end", None);
                return Ok(());
            }
            RecordTag::Refuse => {
                let reason = String::from_utf8_lossy(payload);
                return Err(Trouble::Refused(format!(
                    "upstream {} ({}) refused this relay: {reason}",
                    self.settings.connect,
                    peer_name(self.peer)
                )));
            }
            RecordTag::Busy => {
                let reason = String::from_utf8_lossy(payload);
                return Err(Trouble::Lost(format!("the upstream is busy: {reason}")));
            }
            RecordTag::Echo | RecordTag::Request | RecordTag::Gone => {
                // Not for a stream connection; the length still frames it, so the stream goes on.
                self.summary.invalid_records += 1;
                if mdrelay_proto::warn::allow("upstream record") {
                    tracing::warn!(upstream = %peer_name(self.peer), at, tag = ?header.tag, "record out of place on the stream; skipped");
                }
            }
        }
        self.buf.consume(total);
        self.offset += total as u64;
        Ok(())
    }

    /// Counts and logs `violation`, by the record at stream byte `at`: the connection is done.
    fn violation(&mut self, at: u64, violation: Violation) -> Trouble {
        self.summary.protocol_violations += 1;
        tracing::warn!(upstream = %peer_name(self.peer), at, sequence = violation.sequence, expected = ?violation.expected,
            "protocol violation at stream byte {at}: {violation}; dropping the connection to resume after the last frame received");
        Trouble::Violation(format!("protocol violation at stream byte {at}: {violation}"))
    }

    /// After a violation (`why`): waits (longer for each violation that follows soon after
    /// another), then connects again and resumes after the last frame handed on. Gives up, as
    /// for an upstream out of reach, when violations have followed one another without a frame
    /// handed on for `give_up_after`.
    fn after_violation(&mut self, why: String) -> Result<(), Trouble> {
        self.stream = None;
        let now = Instant::now();
        if self.last_violation.is_none_or(|last| now.duration_since(last) > VIOLATIONS_FORGOTTEN_AFTER) {
            self.violation_backoff = INITIAL_BACKOFF.min(self.settings.reconnect_max);
        }
        self.last_violation = Some(now);
        let wait = self.violation_backoff;
        self.violation_backoff = (wait * 2).min(self.settings.reconnect_max);
        let (since, count) = self.violations_without_frames.get_or_insert((now, 0));
        *count += 1;
        let (since, count) = (*since, *count);
        // The first violation always gets another connection; then, as when the upstream is
        // out of reach, `give_up_after` bounds the time without a frame that fits.
        if count > 1 && since.elapsed() + wait > self.settings.give_up_after {
            return Err(Trouble::Fatal(format!(
                "upstream {}: {why}; {count} protocol violations in a row over {:.1} s without a frame taken (source.upstream.give_up_after = {:?})",
                self.settings.connect,
                since.elapsed().as_secs_f64(),
                self.settings.give_up_after
            )));
        }
        tracing::info!(upstream = %self.settings.connect, retry_in = ?wait, "reconnecting after a protocol violation");
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if self.stop.load(Ordering::Relaxed) {
                return Err(Trouble::Stopped);
            }
            std::thread::sleep(POLL.min(until.saturating_duration_since(Instant::now())));
        }
        self.reach(Some(why))
    }

    /// Notes the upstream's format (a FORMAT record, or a DATA record's header).
    fn note_format(&mut self, format: Format) {
        self.summary.formats_seen.insert(format);
        match self.format {
            Some(old) if old != format => {
                self.summary.format_switches += 1;
                tracing::info!(upstream = %peer_name(self.peer), from = %old, to = %format, "upstream format switch");
            }
            None => tracing::info!(upstream = %peer_name(self.peer), %format, "upstream format"),
            _ => {}
        }
        self.format = Some(format);
    }

    /// The first record of a connection says where its frames start: where a resume was asked
    /// for, or later when the upstream's ring no longer holds the frames in between.
    fn started_at(&mut self, first: u64) {
        let Some(asked) = self.asked.take() else { return };
        if first == asked {
            self.summary.resumes += 1;
            tracing::info!(upstream = %peer_name(self.peer), from = first, "resumed after the last frame received");
        } else if first > asked {
            tracing::warn!(upstream = %peer_name(self.peer), asked, offered = first,
                "the upstream could not resume there (its ring no longer holds those frames): they stay a gap downstream");
        }
    }

    /// Reads what the socket has (waiting at most [`POLL`]).
    fn read_more(&mut self) -> Result<(), Trouble> {
        let Some(stream) = &mut self.stream else { return Err(Trouble::Lost("not connected".into())) };
        let Some(spare) = self.buf.spare() else {
            return Err(Trouble::Lost(format!("a record larger than {MAX_BUFFER} bytes")));
        };
        match stream.read(spare) {
            Ok(0) => Err(Trouble::Lost(if self.buf.data().is_empty() {
                "the upstream closed the connection without an end of stream".to_string()
            } else {
                format!("the upstream closed the connection inside a record at stream byte {}", self.offset)
            })),
            Ok(n) => {
                self.buf.commit(n);
                self.receive_time = wall_clock_ns();
                self.last_read = Instant::now();
                self.summary.bytes += n as u64;
                Ok(())
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                match self.settings.idle_timeout {
                    Some(idle) if self.last_read.elapsed() >= idle => {
                        Err(Trouble::Lost(format!("nothing received for {idle:?} (source.upstream.idle_timeout)")))
                    }
                    _ => Ok(()),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(Trouble::Lost(format!(
                "reading at stream byte {}: {e}",
                self.offset + self.buf.data().len() as u64
            ))),
        }
    }

    /// Makes a connection: at once, then with a doubling wait, until one is greeted (`Ok`), a
    /// reason that another attempt would not help, a stop, or `give_up_after` has passed. `lost`
    /// says why the connection before was lost (none at start).
    fn reach(&mut self, lost: Option<String>) -> Result<(), Trouble> {
        let connect = self.settings.connect.clone();
        let reconnecting = lost.is_some();
        if let Some(why) = &lost {
            tracing::warn!(upstream = %connect, "connection lost: {why}; reconnecting");
        }
        self.stream = None;
        self.peer = None;
        self.record = None;
        self.buf.clear();
        let started = Instant::now();
        let mut backoff = INITIAL_BACKOFF.min(self.settings.reconnect_max);
        let mut attempt = 0u64;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Err(Trouble::Stopped);
            }
            attempt += 1;
            let why = match self.attempt() {
                Ok(()) => {
                    if reconnecting {
                        self.summary.reconnects += 1;
                        tracing::info!(upstream = %connect, attempt, "reconnected");
                    }
                    return Ok(());
                }
                Err(Trouble::Lost(why)) => why,
                Err(other) => return Err(other),
            };
            let waited = started.elapsed();
            if waited + backoff > self.settings.give_up_after {
                let since = if reconnecting { "after losing it" } else { "at start" };
                return Err(Trouble::Fatal(format!(
                    "upstream {connect}: {why}; not reached in {attempt} attempts over {:.1} s {since} (source.upstream.give_up_after = {:?})",
                    waited.as_secs_f64(),
                    self.settings.give_up_after
                )));
            }
            tracing::warn!(upstream = %connect, attempt, retry_in = ?backoff, "{why}; retrying");
            let until = Instant::now() + backoff;
            while Instant::now() < until {
                if self.stop.load(Ordering::Relaxed) {
                    return Err(Trouble::Stopped);
                }
                std::thread::sleep(POLL.min(until.saturating_duration_since(Instant::now())));
            }
            backoff = (backoff * 2).min(self.settings.reconnect_max);
        }
    }

    /// One attempt: resolve, connect, read the greeting, answer it.
    fn attempt(&mut self) -> Result<(), Trouble> {
        let connect = &self.settings.connect;
        let addrs: Vec<SocketAddr> = match connect.to_socket_addrs() {
            Ok(addrs) => addrs.collect(),
            Err(e) => return Err(Trouble::Lost(format!("cannot resolve {connect}: {e}"))),
        };
        if addrs.is_empty() {
            return Err(Trouble::Lost(format!("{connect} resolves to no address")));
        }
        for addr in &addrs {
            check_not_self(*addr, &self.own).map_err(|e| Trouble::Fatal(format!("{e:#}")))?;
        }
        let mut last = String::new();
        let mut connected = None;
        for addr in &addrs {
            match TcpStream::connect_timeout(addr, self.settings.connect_timeout) {
                Ok(stream) => {
                    connected = Some((stream, *addr));
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    last = format!(
                        "connecting to {addr} took longer than {:?} (source.upstream.connect_timeout)",
                        self.settings.connect_timeout
                    );
                }
                Err(e) => last = format!("connecting to {addr}: {e}"),
            }
        }
        let Some((mut stream, peer)) = connected else { return Err(Trouble::Lost(last)) };
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_RETRIES);
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        let io = |e: io::Error| Trouble::Lost(format!("upstream {peer}: {e}"));
        stream.set_read_timeout(Some(POLL)).map_err(io)?;
        stream.set_write_timeout(Some(self.settings.handshake_timeout)).map_err(io)?;

        let hello = self.greeting(&mut stream, peer)?;
        let expected = Protection { crc: self.settings.crc, encrypted: false };
        if hello.protection.encrypted {
            return Err(Trouble::Refused(format!(
                "upstream {connect} ({peer}) encrypts its frames ({}); a relay cannot take an encrypted upstream (docs/chaining.md): encrypt between the last relay and its subscribers, and protect the links to relays with `crc`",
                hello.protection
            )));
        }
        if hello.protection != expected {
            return Err(Trouble::Refused(format!(
                "upstream {connect} ({peer}) protects its frames with {} and source.upstream.crc = {} expects {expected}: set source.upstream.crc = {} to match the upstream's [protection] crc",
                hello.protection, self.settings.crc, hello.protection.crc
            )));
        }
        if let Some(session) = self.session.filter(|s| *s != hello.session) {
            return Err(Trouble::Fatal(format!(
                "upstream {connect} ({peer}) restarted: its session {session:#x} is now {:#x}; this relay's frames carry the first session's numbers and cannot follow a new numbering (restart the relay)",
                hello.session
            )));
        }
        let wanted = match self.next {
            Some(next) => Resume::From(next),
            None => Resume::Live,
        };
        let answer = Subscribe { resume: wanted, protection: expected, ..Subscribe::new(false) }
            .negotiated(hello.protocol_version);
        if wanted != answer.resume && !self.warned_v1 {
            self.warned_v1 = true;
            tracing::warn!(upstream = %peer, version = hello.protocol_version,
                "the upstream speaks relay protocol version {}: it cannot resume; frames sent while away are a gap downstream",
                hello.protocol_version);
        }
        stream
            .write_all(&answer.to_bytes())
            .map_err(|e| Trouble::Lost(format!("sending the subscription to {peer}: {e}")))?;
        self.asked = match answer.resume {
            Resume::From(from) => Some(from),
            Resume::Live => None,
        };
        self.continuity = Continuity::new(self.asked);
        if self.session.is_none() {
            tracing::info!(upstream = %peer, session = format_args!("{:#x}", hello.session), stream = hello.stream,
                format = %hello.format, next_sequence = hello.next_sequence, version = hello.protocol_version,
                "upstream greeted: this relay carries its session and sequence numbers");
        }
        self.session = Some(hello.session);
        self.summary.session = hello.session;
        self.stream = Some(stream);
        self.peer = Some(peer);
        self.offset = Hello::LEN as u64;
        self.last_read = Instant::now();
        Ok(())
    }

    /// Reads and checks the upstream's greeting within `handshake_timeout`.
    fn greeting(&self, stream: &mut TcpStream, peer: SocketAddr) -> Result<Hello, Trouble> {
        let timeout = self.settings.handshake_timeout;
        let deadline = Instant::now() + timeout;
        let mut hello = [0u8; Hello::LEN];
        let mut have = 0;
        while have < Hello::LEN {
            if self.stop.load(Ordering::Relaxed) {
                return Err(Trouble::Stopped);
            }
            match stream.read(&mut hello[have..]) {
                Ok(0) => {
                    return Err(Trouble::Lost(format!(
                        "{peer} closed the connection after {have} bytes of the greeting"
                    )));
                }
                Ok(n) => have += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(Trouble::Lost(format!("reading the greeting of {peer}: {e}"))),
            }
            if have < Hello::LEN && Instant::now() >= deadline {
                return Err(Trouble::Lost(format!(
                    "{peer} sent {have} of the {} greeting bytes within {timeout:?} (source.upstream.handshake_timeout)",
                    Hello::LEN
                )));
            }
        }
        Hello::parse(&hello).map_err(|e| match e {
            HandshakeError::Malformed(e) => Trouble::Refused(format!(
                "upstream {} ({peer}) is not an mdrelay publisher: {e}",
                self.settings.connect
            )),
            version => Trouble::Refused(format!("upstream {} ({peer}): {version}", self.settings.connect)),
        })
    }
}

fn peer_name(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "not connected".to_string(), |p| p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_grows_only_when_full_and_keeps_unread_bytes() {
        let mut b = RecvBuf::new();
        let room = b.spare().unwrap().len();
        assert_eq!(room, READ_BUFFER);
        b.commit(room);
        b.consume(10);
        // Full: the unread bytes move to the front rather than the buffer growing.
        assert_eq!(b.spare().unwrap().len(), 10);
        assert_eq!(b.bytes.len(), READ_BUFFER);
        b.commit(10);
        assert_eq!(b.spare().unwrap().len(), READ_BUFFER);
        assert_eq!(b.data().len(), READ_BUFFER);
    }
}
