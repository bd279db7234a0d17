//! What the client machines' tests share: a peer, records built with the wire structures, and
//! feeding a connection its bytes cut where a test says.

use super::connection::{ConnectionEvent, StreamConnection};
use super::stream::StreamClient;
use crate::relay::wire::{RecordHeader, RecordTag};
use mdrelay_codec::Format;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg32;
use std::net::SocketAddr;

/// The publisher every test talks to.
pub(crate) fn peer() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9100))
}

/// A whole record: header and payload.
pub(crate) fn record(tag: RecordTag, format: Format, frames: u16, sequence: u64, payload: &[u8]) -> Vec<u8> {
    let header = RecordHeader { tag, format, frame_count: frames, length: payload.len() as u32, sequence };
    let mut out = header.to_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// Cut points splitting `len` bytes at random (sorted, distinct, inside the bytes).
pub(crate) fn random_cuts(len: usize, seed: u64) -> Vec<usize> {
    let mut rng = Pcg32::seed_from_u64(seed);
    let mut cuts: Vec<usize> =
        (0..rng.random_range(0..=len.min(64))).map(|_| rng.random_range(1..len.max(2))).collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Every event as its `Debug` text: comparable across runs whatever the buffer held. What the
/// connection has to write is taken as written after each event, as a driver that writes at
/// once does.
pub(crate) fn drain(conn: &mut StreamConnection, out: &mut Vec<String>) {
    while let Some(event) = conn.poll_event() {
        let last = matches!(event, ConnectionEvent::Closed(_));
        out.push(format!("{event:?}"));
        let written = conn.transmit().len();
        conn.transmitted(written);
        if last {
            break;
        }
    }
}

/// A machine that takes the bytes a driver reads: a connection, or a stream client.
pub(crate) trait ReadInto {
    /// Where the next bytes go (empty while the machine takes none).
    fn room(&mut self) -> &mut [u8];
    /// `n` bytes were put at the start of the room at `now`; 0 closes the input.
    fn filled(&mut self, n: usize, now: i64);
}

impl ReadInto for StreamConnection {
    fn room(&mut self) -> &mut [u8] {
        self.read_buf()
    }

    fn filled(&mut self, n: usize, now: i64) {
        self.received(n, now);
    }
}

impl ReadInto for StreamClient {
    fn room(&mut self) -> &mut [u8] {
        self.read_buf()
    }

    fn filled(&mut self, n: usize, now: i64) {
        self.received(n, now, now);
    }
}

/// Feeds `bytes` to `machine` in pieces cut at `cuts`, at time `now`, calling `poll` after each
/// piece and whenever the room is full (as a driver does); then `eof` closes the input and
/// `poll` runs once more. Stops at once when the room stays full after a poll.
pub(crate) fn feed_with<M: ReadInto>(
    machine: &mut M,
    bytes: &[u8],
    cuts: &[usize],
    now: i64,
    eof: bool,
    mut poll: impl FnMut(&mut M),
) {
    let mut start = 0;
    for end in cuts.iter().copied().chain([bytes.len()]) {
        let mut piece = &bytes[start.min(end)..end];
        start = end;
        while !piece.is_empty() {
            let room = machine.room();
            if room.is_empty() {
                poll(machine);
                if machine.room().is_empty() {
                    return;
                }
                continue;
            }
            let n = room.len().min(piece.len());
            room[..n].copy_from_slice(&piece[..n]);
            machine.filled(n, now);
            piece = &piece[n..];
            poll(machine);
        }
    }
    if eof {
        machine.filled(0, now);
    }
    poll(machine);
}

/// Feeds `bytes` to `conn` in pieces cut at `cuts`, at time `now`, polling every event after
/// each piece (as a driver does); then `eof` closes the input. The answer and echoes are taken
/// as written at once.
pub(crate) fn feed(conn: &mut StreamConnection, bytes: &[u8], cuts: &[usize], now: i64, eof: bool) -> Vec<String> {
    let mut events = Vec::new();
    feed_with(conn, bytes, cuts, now, eof, |conn| drain(conn, &mut events));
    events
}

/// The first `limit` segments of the shared capture `name` (in `../shared/data/iex`) encoded as
/// frames of `format`, each with a publish time of its index + 1 (0 is what a frame without one
/// would read).
pub(crate) fn capture_frames(name: &str, format: Format, limit: usize) -> Vec<Vec<u8>> {
    use mdrelay_codec::{Codec, Limits, MessageScratch, collect_segment};
    use mdrelay_iex::capture::CaptureReader;
    use mdrelay_iex::iextp::Segment;
    let mut reader = CaptureReader::open(crate::shared_data::iex_data().join(name)).expect("the shared capture opens");
    let mut codec = Codec::new(format, Limits::default());
    let mut scratch = MessageScratch::new();
    let mut frames = Vec::new();
    while frames.len() < limit {
        let Some(packet) = reader.next_packet().expect("the shared capture reads") else { break };
        let Ok(datagram) = mdrelay_iex::link::udp_datagram(packet.link_type, packet.data) else { continue };
        let Ok(segment) = Segment::parse(datagram.payload) else { continue };
        let mut frame = Vec::new();
        let publish_time = frames.len() as i64 + 1;
        scratch
            .with(|list| {
                collect_segment(&segment, list);
                codec.encode_segment(publish_time, &segment, datagram.payload, list, &mut frame)
            })
            .expect("the capture's segments encode");
        frames.push(frame);
    }
    frames
}

/// A visitor that writes down everything it is told.
#[derive(Default)]
pub(crate) struct Notes {
    /// Frames decoded: sequence, origin and publish time.
    pub frames: Vec<(u64, super::frames::Origin, i64)>,
    /// Frames that failed to decode.
    pub failed: Vec<u64>,
    /// Messages visited, by type byte.
    pub kinds: Vec<u8>,
    /// Messages skipped by the filter, by type byte.
    pub skipped: Vec<u8>,
    /// Anomalies, as their `Debug` text.
    pub anomalies: Vec<String>,
    /// Format changes.
    pub formats: Vec<(Option<Format>, Format)>,
    /// Ask for every message whatever the filter.
    pub every: bool,
    /// Messages aggregated, as a subscriber does.
    pub aggregator: mdrelay_iex::Aggregator,
}

impl super::frames::FrameVisitor for Notes {
    fn every_message(&self) -> bool {
        self.every
    }

    fn message(&mut self, _: &super::frames::FrameInfo, message: &mdrelay_iex::Message<'_>) {
        self.kinds.push(message.kind());
        self.aggregator.apply(message);
    }

    fn skipped(&mut self, _: &super::frames::FrameInfo, kind: u8) {
        self.skipped.push(kind);
    }

    fn end(
        &mut self,
        frame: &super::frames::FrameInfo,
        _: &[u8],
        decoded: Result<&mdrelay_codec::BatchHeader, &mdrelay_codec::DecodeError>,
    ) {
        match decoded {
            Ok(header) => self.frames.push((frame.sequence, frame.origin, header.publish_time)),
            Err(_) => self.failed.push(frame.sequence),
        }
    }

    fn format_changed(&mut self, from: Option<Format>, to: Format) {
        self.formats.push((from, to));
    }

    fn anomaly(&mut self, anomaly: &super::frames::Anomaly<'_>) {
        self.anomalies.push(format!("{anomaly:?}"));
    }
}

impl Notes {
    /// The sequence numbers of the frames decoded.
    pub fn sequences(&self) -> Vec<u64> {
        self.frames.iter().map(|f| f.0).collect()
    }
}
