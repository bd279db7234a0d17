//! A relay's frames on their way from its upstream to its engine: each frame's IEX-TP segment
//! rebuilt ([`Resegmenter`]: a raw frame's segment is kept byte for byte) and kept, with the
//! origin's stamp and number, until the engine takes it; and what the relay counted of its
//! upstream ([`UpstreamSummary`]). The TCP upstream ([`crate::upstream`]) feeds it from proto's
//! frame reader, the NATS upstream ([`crate::upstream_nats`]) from the client's decoded frames.
//! Both are an [`Upstream`], the one face the engine, the summary and the metrics see.

use crate::item::{Item, Origin};
use hdrhistogram::Histogram;
use mdrelay_codec::resegment::Resegmenter;
use mdrelay_codec::{BatchHeader, DecodeError, Format};
use mdrelay_iex::Message;
use mdrelay_proto::latency::{LatencySummary, latency_histogram};
use mdrelay_proto::relay::Totals;
use mdrelay_proto::relay::client::{Anomaly, FrameInfo, FrameVisitor, Place, PlaceAt};
use std::collections::BTreeSet;
use std::net::SocketAddr;

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

impl UpstreamSummary {
    /// The figures every upstream fills the same way: what `relayed` handed on and how `end`
    /// says the stream ended; the caller sets its reader's counts over these.
    pub(crate) fn handed_on(connect: String, session: u64, relayed: &Relayed, end: &StreamEnd) -> UpstreamSummary {
        UpstreamSummary {
            connect,
            session,
            messages: relayed.messages,
            first_sequence: relayed.first_sequence,
            last_sequence: relayed.last_sequence,
            unrepresentable_frames: relayed.unrepresentable_frames,
            latency_ns: LatencySummary::default(),
            negative_latencies: relayed.negative_latencies,
            totals: end.totals.clone(),
            stop_reason: end.stop_reason,
            error: end.error.clone(),
            ..UpstreamSummary::default()
        }
    }
}

/// How an upstream's stream ended and what its END said: the state both kinds of upstream keep.
#[derive(Debug, Default)]
pub struct StreamEnd {
    /// The sequence number the upstream's END gave its next frame, if it sent one that fits.
    pub end_sequence: Option<u64>,
    /// The upstream's totals, from its END.
    pub totals: Option<Totals>,
    /// Why the stream ended (the summary's `stop_reason`), once `ended`.
    pub stop_reason: &'static str,
    /// Why the relay could not go on, naming the upstream.
    pub error: Option<String>,
    /// The stream has ended: no frame is handed on after this.
    pub ended: bool,
}

impl StreamEnd {
    /// Ends the stream for `reason`, with `error` when it failed.
    pub fn finish(&mut self, reason: &'static str, error: Option<String>) {
        self.ended = true;
        self.stop_reason = reason;
        self.error = error;
    }
}

/// A frame rebuilt and waiting to be handed on: where its segment is in [`Relayed::bytes`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ready {
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// The IEX send time of the segment.
    pub(crate) time_ns: i64,
    pub(crate) origin: Origin,
}

/// What the frame reader hands each frame to: its segment is rebuilt and kept until the engine
/// takes it. The reader visits all the frames of the records read at once; the engine takes one
/// per call, so the segments wait here (at most what one read buffer held), in order. A NATS
/// upstream ([`crate::upstream_nats`]) hands its frames here the same way.
pub struct Relayed {
    /// The upstream, as configured, for logs.
    pub(crate) connect: String,
    /// The upstream's address on the current connection, for logs.
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) resegmenter: Resegmenter,
    /// The rebuilt segments, back to back.
    pub(crate) bytes: Vec<u8>,
    pub(crate) ready: Vec<Ready>,
    /// Frames of `ready` handed on.
    pub(crate) taken: usize,
    /// Messages of the frame being decoded.
    pub(crate) frame_messages: u64,
    pub(crate) messages: u64,
    pub(crate) first_sequence: Option<u64>,
    pub(crate) last_sequence: Option<u64>,
    pub(crate) unrepresentable_frames: u64,
    pub(crate) negative_latencies: u64,
    pub(crate) latency: Histogram<u64>,
}

impl Relayed {
    pub(crate) fn new(connect: String) -> Relayed {
        Relayed {
            connect,
            peer: None,
            resegmenter: Resegmenter::new(),
            bytes: Vec::new(),
            ready: Vec::new(),
            taken: 0,
            frame_messages: 0,
            messages: 0,
            first_sequence: None,
            last_sequence: None,
            unrepresentable_frames: 0,
            negative_latencies: 0,
            latency: latency_histogram(),
        }
    }

    /// Whether a frame waits to be handed on.
    pub(crate) fn has_ready(&self) -> bool {
        self.taken < self.ready.len()
    }

    /// The next frame to hand on.
    pub(crate) fn take(&mut self) -> Option<Ready> {
        let ready = *self.ready.get(self.taken)?;
        self.taken += 1;
        Some(ready)
    }

    /// The next frame to hand on, as the engine takes it; `None` when none waits.
    pub(crate) fn next_item(&mut self) -> Option<Item<'_>> {
        let ready = self.take()?;
        let bytes = &self.bytes[ready.start..ready.end];
        Some(Item { time_ns: ready.time_ns, bytes, origin: Some(ready.origin) })
    }

    /// A frame decoded elsewhere (by a NATS subscriber), rebuilt and kept to be handed on: its
    /// format, number, receipt time, bytes (opened), batch header and messages in order.
    pub(crate) fn decoded<'m>(
        &mut self,
        frame: &FrameInfo,
        bytes: &[u8],
        header: &BatchHeader,
        messages: impl Iterator<Item = Message<'m>>,
    ) {
        self.begin(frame);
        for message in messages {
            self.message(frame, &message);
        }
        self.end(frame, bytes, Ok(header));
    }

    /// Forgets the frames handed on once none waits (the engine is done with the last one).
    pub(crate) fn release(&mut self) {
        if !self.has_ready() {
            self.ready.clear();
            self.bytes.clear();
            self.taken = 0;
        }
    }

    pub(crate) fn peer(&self) -> String {
        peer_name(self.peer)
    }
}

/// The stream byte a place in a payload stands at.
fn stream_byte(at: PlaceAt) -> u64 {
    match at.0 {
        Place::Stream(base) | Place::Datagram(base) | Place::Recovery(base) => base.saturating_add(at.1),
    }
}

/// What a relay's END says was sent, given `own`, the totals of what it published. After the
/// upstream's END (`upstream_ended`): the upstream's `totals` (the origin's, through every hop),
/// so a leaf compares what it got with what the origin sent, and frames lost on any hop show.
/// Else (the upstream lost for good, this relay stopped or at a limit): its own totals, marked
/// truncated, since frames the origin sent after the last one received here were never relayed
/// and no count says how many.
pub fn end_totals(upstream_ended: bool, totals: Option<&Totals>, own: &Totals) -> Totals {
    match totals {
        Some(upstream) if upstream_ended => upstream.clone(),
        // An END whose totals did not parse: the stream did end there.
        _ if upstream_ended => own.clone(),
        _ => Totals { truncated: true, ..own.clone() },
    }
}

impl FrameVisitor for Relayed {
    fn begin(&mut self, frame: &FrameInfo) {
        self.resegmenter.begin(frame.format);
        self.frame_messages = 0;
    }

    fn message(&mut self, _frame: &FrameInfo, message: &Message<'_>) {
        self.frame_messages += 1;
        self.resegmenter.message(message);
    }

    fn end(&mut self, frame: &FrameInfo, bytes: &[u8], decoded: Result<&BatchHeader, &DecodeError>) {
        // A frame that did not decode was counted and logged as an anomaly: a gap downstream.
        let Ok(header) = decoded else { return };
        self.messages += self.frame_messages;
        self.first_sequence.get_or_insert(frame.sequence);
        self.last_sequence = Some(frame.sequence);
        match u64::try_from(frame.receive_time.saturating_sub(header.publish_time)) {
            Ok(ns) => self.latency.saturating_record(ns.max(1)),
            Err(_) => self.negative_latencies += 1,
        }
        let start = self.bytes.len();
        match self.resegmenter.finish(bytes, header) {
            Ok(segment) => self.bytes.extend_from_slice(segment),
            Err(error) => {
                // Handed on empty: the engine counts it as a segment it could not parse, and the
                // frame's number is a gap downstream.
                self.unrepresentable_frames += 1;
                if mdrelay_iex::warn::allow("upstream segment") {
                    tracing::warn!(upstream = %self.connect, sequence = frame.sequence, %error, "frame not relayed");
                }
            }
        }
        let origin = Origin { publish_time: header.publish_time, sequence: frame.sequence };
        self.ready.push(Ready { start, end: self.bytes.len(), time_ns: header.send_time, origin });
    }

    fn format_changed(&mut self, from: Option<Format>, to: Format) {
        match from {
            Some(old) => tracing::info!(upstream = %self.peer(), from = %old, %to, "upstream format switch"),
            None => tracing::info!(upstream = %self.peer(), format = %to, "upstream format"),
        }
    }

    fn anomaly(&mut self, anomaly: &Anomaly<'_>) {
        match anomaly {
            Anomaly::Gap { missing, before } if mdrelay_iex::warn::allow("upstream gap") => {
                tracing::warn!(upstream = %self.peer(), missing, before,
                    "frames missing upstream; they stay missing downstream");
            }
            Anomaly::Undelimited { at, format, what, .. } if mdrelay_iex::warn::allow("upstream delimit") => {
                tracing::warn!(upstream = %self.peer(), at = stream_byte(*at), %format, error = %what,
                    "cannot delimit a frame; the rest of the record is skipped");
            }
            Anomaly::DecodeFailed { at, sequence, error, .. } if mdrelay_iex::warn::allow("upstream decode") => {
                tracing::warn!(upstream = %self.peer(), at = stream_byte(*at), sequence, %error,
                    "frame skipped; it is a gap downstream");
            }
            // Past the warning budget; a relay's reader counts duplicates without a word, and
            // meets nothing else.
            _ => {}
        }
    }
}

/// A peer's address for logs.
pub(crate) fn peer_name(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "not connected".to_string(), |p| p.to_string())
}

/// A relay's upstream, whichever way its stream arrives: another publisher's TCP server
/// ([`crate::upstream::TcpUpstream`]), or the NATS subject another publisher's `[nats]` output
/// feeds ([`crate::upstream_nats::NatsUpstream`]). Both hand on the origin's frames with its numbers and stamps, and end the
/// same ways; the engine, the summary and the metrics see only this.
pub trait Upstream: Send {
    /// The upstream's session, which this relay's outputs take as theirs.
    fn session(&self) -> u64;

    /// A short description for logs.
    fn describe(&self) -> String;

    /// How the stream ended, once it has, and what the upstream's END said.
    fn end(&self) -> &StreamEnd;

    /// The sequence number the upstream's END gave its next frame, if it sent one that fits.
    fn end_sequence(&self) -> Option<u64> {
        self.end().end_sequence
    }

    /// The upstream's totals, from its END.
    fn upstream_totals(&self) -> Option<&Totals> {
        self.end().totals.as_ref()
    }

    /// What this relay's END says was sent, given `own`, the totals of what it published: the
    /// upstream's totals after its END, else its own marked truncated
    /// ([`crate::relayed::end_totals`]).
    fn end_totals(&self, own: &Totals) -> Totals {
        crate::relayed::end_totals(self.ended() == Some("end"), self.upstream_totals(), own)
    }

    /// The counts so far (without the latency figures, which are in [`Upstream::latency`]).
    fn counts(&self) -> UpstreamSummary;

    /// The frames handed on so far, with this hop's latencies.
    fn relayed(&self) -> &Relayed;

    /// How the stream ended (the summary's `stop_reason`), once it has.
    fn ended(&self) -> Option<&'static str> {
        let end = self.end();
        end.ended.then_some(end.stop_reason)
    }

    /// This hop's latencies so far, ns.
    fn latency(&self) -> &Histogram<u64> {
        &self.relayed().latency
    }

    /// What was received so far, for the run's summary; a stream the relay stopped taking before
    /// it ended (a message or time limit) counts as stopped.
    fn summary(&self) -> UpstreamSummary {
        let stop_reason = self.ended().unwrap_or("stopped");
        UpstreamSummary { latency_ns: LatencySummary::of(&self.relayed().latency), stop_reason, ..self.counts() }
    }

    /// The next frame's segment, with the origin's stamp and number; `None` at the upstream's
    /// END, at a stop, or when the upstream is lost for good (the summary's `error` says why).
    fn next_item(&mut self) -> Option<Item<'_>>;
}

/// The relay's upstream, of either kind.
pub type UpstreamSource = Box<dyn Upstream>;
