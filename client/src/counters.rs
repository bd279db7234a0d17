//! What a subscriber counted so far ([`Counters`]), made on demand from the machines' counts.

use crate::collect::Tally;
use mdrelay_codec::Format;
use mdrelay_proto::relay::client::{FrameReader, LinesReport, ProtectionCounts, RecoveryReport};
use mdrelay_proto::relay::{SequenceCounts, Totals};
use std::collections::BTreeMap;

/// Everything a subscriber counted since it was built. Frames are counted by sequence number
/// within the publisher's session: a frame is taken once, whichever copy (line, retransmission)
/// came first.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Counters {
    /// Frames taken and decoded (retransmitted ones included); a frame taken that did not
    /// decode is handed out too, and counted in [`Counters::decode_errors`] instead.
    pub frames: u64,
    /// Of those, frames that filled a gap from the retransmission service (NATS: from the
    /// JetStream stream).
    pub frames_recovered: u64,
    /// Frames taken that did not decode (handed out with their error).
    pub decode_errors: u64,
    /// Messages read, those the symbol filter skipped included.
    pub messages: u64,
    /// Of those, messages the symbol filter skipped (counted by type only).
    pub messages_skipped: u64,
    /// Messages read by IEX type byte (`b'T'`, `b'8'`...), the filter's skipped ones included;
    /// types never seen are left out.
    pub messages_by_type: BTreeMap<u8, u64>,
    /// Messages the raw format's decoder skipped for being shorter than their type's layout.
    pub raw_skipped_messages: u64,
    /// Bytes received, relay headers (and the greeting) included.
    pub bytes: u64,
    /// Frames the publisher sent this subscriber that never arrived (so far): between the first
    /// frame owed and the highest seen, and at the tail once the end of stream names the last.
    pub lost: u64,
    /// Frames received again (within the sequence window): not taken twice.
    pub duplicates: u64,
    /// Frames that arrived after a later frame, filling a gap.
    pub reordered: u64,
    /// Frames older than the sequence window: not taken.
    pub too_late: u64,
    /// The publisher's session now, once known.
    pub session: Option<u64>,
    /// The highest frame number seen in that session.
    pub highest_sequence: Option<u64>,
    /// The lowest frame taken in the first session, if any: above 1, the subscriber joined
    /// late and the frames before it were never owed to it (unless it asked from the start).
    pub first_frame: Option<u64>,
    /// The first frame of a late join, when the subscriber joined after the session's first.
    pub late_join: Option<u64>,
    /// Publisher restarts (new sessions) followed.
    pub publisher_restarts: u64,
    /// UDP: datagrams whose session or sequence no later datagram confirmed (dropped).
    pub unconfirmed_datagrams: u64,
    /// Records or datagrams refused before any frame was read: datagrams that are not relay
    /// datagrams or whose header or totals cannot be read, record headers that cannot be read,
    /// records whose numbers do not fit the stream, records out of place.
    pub invalid_packets: u64,
    /// Records or datagrams whose frames could not all be delimited (the rest is lost).
    pub undelimited_payloads: u64,
    /// Records or datagrams with bytes after the frames they declare (not read).
    pub excess_payloads: u64,
    /// What frame protection refused.
    pub protection: ProtectionCounts,
    /// The format now in use.
    pub format: Option<Format>,
    /// Changes of the stream's format.
    pub format_switches: u64,
    /// Every format seen (retransmitted frames' included).
    pub formats_seen: Vec<Format>,
    /// TCP and NATS: connections made (NATS: to any server of the cluster).
    pub connections: u64,
    /// TCP and NATS: connections made again after one was lost (NATS: the client's own
    /// reconnection, to the same server or another of the cluster).
    pub reconnects: u64,
    /// TCP: reconnections the publisher resumed at the frame asked for.
    pub resumes: u64,
    /// TCP: record headers that could not be read (each cost the connection).
    pub bad_headers: u64,
    /// TCP: records whose numbers did not fit the stream (each cost the connection).
    pub violations: u64,
    /// TCP: records that have no place on the connection (skipped).
    pub records_out_of_place: u64,
    /// Echoes sent back to the publisher (round-trip latency).
    pub echoes_sent: u64,
    /// Echoes dropped because the way back was full, or because the connection was lost or the
    /// stream ended before they were written (every echo is counted once, sent or dropped).
    pub echoes_dropped: u64,
    /// UDP: datagrams received.
    pub datagrams: u64,
    /// UDP: the receive buffer the kernel granted each line's socket, in bytes (Linux reports
    /// twice the usable size).
    pub receive_buffers: Vec<usize>,
    /// A/B: each line's figures.
    pub lines: Option<LinesReport>,
    /// A/B: copies of frames the other line had delivered first (taken once).
    pub arbitrated: u64,
    /// UDP with recovery, or NATS with a JetStream stream: what was missing and what became of
    /// it (NATS: `requests` are the ranges read from the stream, `gone_frames` those it no
    /// longer held).
    pub recovery: Option<RecoveryReport>,
    /// NATS with a JetStream stream: messages read from the stream to repair gaps, the ones
    /// read to find where a range starts included.
    pub repair_fetches: u64,
    /// The publisher's totals, once its end of stream came.
    pub publisher_totals: Option<Totals>,
    /// SO_BUSY_POLL was asked for and the kernel refused it (receiving works without it).
    pub busy_poll_refused: bool,
}

impl Counters {
    /// What both transports count alike: the frame reader's counts (its tracker's with
    /// `extra`, what A/B lines keep outside it) and what the collector tallied of the messages.
    /// The drivers add their own.
    pub(crate) fn of_reader(reader: &FrameReader, tally: &Tally, extra: SequenceCounts) -> Counters {
        let r = reader.counts();
        let tracker = reader.tracker();
        let seq = tracker.counts() + extra;
        Counters {
            frames: r.frames_decoded,
            frames_recovered: r.frames_recovered,
            decode_errors: r.decode_errors,
            messages: tally.messages,
            messages_skipped: tally.skipped,
            messages_by_type: tally.by_type.seen().collect(),
            raw_skipped_messages: reader.raw_skipped_messages(),
            lost: seq.lost,
            duplicates: seq.duplicates,
            reordered: seq.reordered,
            too_late: seq.too_late,
            session: tracker.session(),
            highest_sequence: tracker.highest(),
            first_frame: reader.first_frame(),
            late_join: tracker.late_join(),
            publisher_restarts: tracker.restarts(),
            unconfirmed_datagrams: tracker.unconfirmed(),
            undelimited_payloads: r.undelimited_payloads,
            excess_payloads: r.excess_payloads,
            protection: r.protection,
            format: reader.current_format(),
            format_switches: reader.format_switches(),
            formats_seen: reader.formats_seen().iter().copied().collect(),
            ..Counters::default()
        }
    }

    /// Whether what was taken is everything the publisher's `totals` say it sent: frames,
    /// messages and messages by type equal, no late join, and a whole stream at its end (see
    /// [`End::complete`](crate::End::complete)).
    pub fn matches(&self, totals: &Totals) -> bool {
        self.late_join.is_none()
            && !totals.truncated
            && self.frames == totals.frames
            && self.messages == totals.messages
            && totals.by_type.iter().filter(|(_, n)| **n > 0).eq(self.messages_by_type.iter())
    }

    /// [`Counters::matches`] for a subscriber that joined with a snapshot as of frame `as_of`,
    /// whose totals up to it were `before`: what was taken after it and the snapshot's counts
    /// together are everything the `totals` say, and the stream started at the frame after it.
    pub(crate) fn matches_after_snapshot(&self, totals: &Totals, as_of: u64, before: &Totals) -> bool {
        let mut by_type = before.by_type.clone();
        for (kind, n) in &self.messages_by_type {
            *by_type.entry(*kind).or_default() += n;
        }
        self.late_join.is_none_or(|first| first == as_of.saturating_add(1))
            && !totals.truncated
            && self.frames + before.frames == totals.frames
            && self.messages + before.messages == totals.messages
            && totals.by_type.iter().filter(|(_, n)| **n > 0).eq(by_type.iter().filter(|(_, n)| **n > 0))
    }
}
