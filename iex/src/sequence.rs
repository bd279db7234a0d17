//! IEX-TP sequence tracking per (message protocol, channel, session): what each segment's
//! numbering says about the feed, for a capture (`inspect`) and for a live feed (the publisher,
//! which drops the duplicates it is told about).
//!
//! Every segment carries the sequence number of its first message and a message count; a
//! heartbeat (no messages) carries the number the next message will have. Against the number
//! expected next (`next`), a segment is:
//! - **in order** at `next`;
//! - a **gap** above it: the messages between are missing, and a heartbeat reveals a gap at the
//!   tail of a burst as well as data does;
//! - **behind** it otherwise, and then one of:
//!   - a **restart** when its send time is later than any segment's so far (the numbering went
//!     back while the clock went on: the exchange restarted the session's numbering), or more
//!     than [`REPLAY_AGE_NS`] earlier (the feed is being played again from an earlier point, as
//!     a looped replay does); the numbering starts over from 1, so messages below the restart's
//!     first are missing;
//!   - **reordered** when every message in it is one still missing (a late segment: it fills
//!     its gap, and the messages leave the missing count, as a late frame does for the
//!     subscriber);
//!   - a **duplicate** when every message in it has arrived already (the other line of an A/B
//!     pair, a replayed datagram), and so does a heartbeat behind `next` or one at `next` sent
//!     no later than the latest segment: a duplicate carries nothing new and is not to be
//!     relayed ([`SequenceEvent::is_new`]);
//!   - an **overlap** when part of it arrived already and part did not: it carries new
//!     messages, so it is relayed whole, and the messages it repeats are counted.
//!
//! A new session on a channel that had another is a restart too, numbered from 1. The first
//! segment of the first session of a channel owes nothing before it (the feed was joined
//! there).
//!
//! Memory is bounded whatever the feed says: at most [`MAX_STREAMS`] (protocol, channel,
//! session) are tracked (the one heard from longest ago is forgotten), and each remembers at
//! most [`MAX_HOLES`] ranges of missing numbers (the oldest is forgotten: its messages stay
//! missing, and a segment that would have filled it then counts as a duplicate). The counts
//! trust the headers: a forged segment can make them wrong, but cannot stop the stream, since
//! a restart is recognised from the next honest segment.

use crate::iextp::SegmentHeader;
use rustc_hash::FxHashMap;

/// Streams (protocol, channel, session) tracked at once.
pub const MAX_STREAMS: usize = 64;

/// Ranges of missing sequence numbers remembered per stream.
pub const MAX_HOLES: usize = 64;

/// How much earlier than the latest segment's a segment numbered behind the expected one may be
/// sent and still be taken for a copy or a late arrival, ns. An A/B pair's lines, or a network
/// that reorders, differ by micro- to milliseconds; a feed played again from an earlier point
/// differs by the length of what was played.
pub const REPLAY_AGE_NS: i64 = 10_000_000_000;

/// What one segment's numbering said about the feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceEvent {
    /// The first segment of a stream, or the expected next one.
    InOrder,
    /// Messages were skipped: `missing` of them, starting at `expected`.
    Gap {
        /// The sequence number that was expected.
        expected: i64,
        /// How many messages are missing.
        missing: u64,
    },
    /// The numbering started over within the session (a restart or a replay from an earlier
    /// point); `missing` messages of the new numbering came before this segment's first.
    Restart {
        /// The sequence number that was expected.
        expected: i64,
        /// Messages of the new numbering (from 1) before this segment.
        missing: u64,
    },
    /// A session new on its channel, after another; `missing` messages of it (from 1) came
    /// before this segment.
    NewSession {
        /// The session heard from before on this channel.
        previous: u32,
        /// Messages of the new session before this segment.
        missing: u64,
    },
    /// A late segment: every message in it was missing, and is no longer.
    Reordered {
        /// The messages it brought.
        messages: u64,
    },
    /// Part of it had arrived before, part had not: relayed whole.
    Overlap {
        /// The messages in it that had arrived before.
        repeated: u64,
    },
    /// Nothing in it is new: a copy of what arrived before, or a stale heartbeat.
    Duplicate,
}

impl SequenceEvent {
    /// Whether the segment carries anything not seen before, and so is to be relayed.
    pub fn is_new(self) -> bool {
        !matches!(self, SequenceEvent::Duplicate)
    }
}

/// Counts of sequence events over the feed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SequenceCounts {
    /// Gaps seen (ranges of messages skipped, each counted when it opened).
    pub gaps: u64,
    /// Messages missing: skipped and never arrived (a late segment takes its messages out).
    pub gap_messages: u64,
    /// Messages that arrived late, in reordered or overlapping segments, filling a gap.
    pub late_messages: u64,
    /// Times the numbering started over: within a session, or with a new session on a channel.
    pub restarts: u64,
    /// Segments with nothing new (copies, stale heartbeats); a live feed drops them.
    pub duplicate_segments: u64,
    /// Late segments whose messages were all missing.
    pub reordered_segments: u64,
    /// Segments partly new and partly not (relayed whole).
    pub overlapping_segments: u64,
    /// Messages in overlapping segments that had arrived before.
    pub repeated_messages: u64,
}

/// One stream's numbering.
#[derive(Clone, Debug)]
struct Stream {
    /// The sequence number expected next.
    next: i64,
    /// The latest send time of a segment that brought something new.
    latest: i64,
    /// Ranges `[start, end)` of missing numbers below `next`, ascending and disjoint.
    holes: Vec<(i64, i64)>,
    /// When it was last heard from (the tracker's segment count), to forget the stalest first.
    heard: u64,
}

/// The length of `[start, end)`, 0 when empty, without overflow.
fn span(start: i64, end: i64) -> u64 {
    if end > start { (i128::from(end) - i128::from(start)) as u64 } else { 0 }
}

impl Stream {
    fn new(next: i64, latest: i64, heard: u64) -> Stream {
        Stream { next, latest, holes: Vec::new(), heard }
    }

    /// Notes `[start, end)` as missing.
    fn open_hole(&mut self, start: i64, end: i64) {
        if end <= start {
            return;
        }
        if self.holes.len() >= MAX_HOLES {
            self.holes.remove(0);
        }
        self.holes.push((start, end));
    }

    /// How many numbers of `[start, end)` are missing.
    fn missing_within(&self, start: i64, end: i64) -> u64 {
        self.holes.iter().map(|&(s, e)| span(s.max(start), e.min(end))).sum()
    }

    /// Takes `[start, end)` out of the holes.
    fn fill(&mut self, start: i64, end: i64) {
        let mut i = 0;
        while i < self.holes.len() {
            let (s, e) = self.holes[i];
            if end <= s || start >= e {
                i += 1;
            } else if start <= s && end >= e {
                self.holes.remove(i);
            } else if start > s && end < e {
                // The middle of a hole: two holes remain.
                self.holes[i] = (s, start);
                self.holes.insert(i + 1, (end, e));
                if self.holes.len() > MAX_HOLES {
                    self.holes.remove(0);
                } else {
                    i += 1;
                }
                i += 1;
            } else if start <= s {
                self.holes[i] = (end, e);
                i += 1;
            } else {
                self.holes[i] = (s, start);
                i += 1;
            }
        }
    }
}

/// Tracks the numbering of every (protocol, channel, session) of a feed.
#[derive(Clone, Debug, Default)]
pub struct SequenceTracker {
    streams: FxHashMap<(u16, u32, u32), Stream>,
    counts: SequenceCounts,
    /// Messages skipped when their gaps opened, and those that arrived late after all.
    opened: u64,
    heard: u64,
}

impl SequenceTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes one segment (heartbeats included: they carry the next sequence number) and says
    /// what it was.
    pub fn observe(&mut self, header: &SegmentHeader) -> SequenceEvent {
        self.heard += 1;
        let heard = self.heard;
        let first = header.first_sequence;
        let count = u64::from(header.message_count);
        // Sequence numbers come from the network: saturate rather than wrap on wild ones.
        let after = first.saturating_add(i64::from(header.message_count));
        let time = header.send_time;
        let key = (header.protocol_id, header.channel_id, header.session_id);
        let Some(stream) = self.streams.get_mut(&key) else {
            let previous = self
                .streams
                .iter()
                .filter(|((protocol, channel, _), _)| (*protocol, *channel) == (key.0, key.1))
                .max_by_key(|(_, s)| s.heard)
                .map(|((_, _, session), _)| *session);
            let mut stream = Stream::new(after, time, heard);
            let event = match previous {
                None => SequenceEvent::InOrder,
                Some(previous) => {
                    // A new session is numbered from 1: what came before its first was missed.
                    let missing = span(1, first);
                    stream.open_hole(1, first);
                    self.restarted(missing);
                    SequenceEvent::NewSession { previous, missing }
                }
            };
            self.insert(key, stream);
            return event;
        };
        stream.heard = heard;
        let expected = stream.next;
        let heartbeat = count == 0;
        let behind = first < expected || (heartbeat && first == expected && time <= stream.latest);
        if !behind {
            stream.latest = stream.latest.max(time);
            stream.next = after;
            if first == expected {
                return SequenceEvent::InOrder;
            }
            let missing = span(expected, first);
            stream.open_hole(expected, first);
            self.counts.gaps += 1;
            self.opened = self.opened.saturating_add(missing);
            self.update();
            return SequenceEvent::Gap { expected, missing };
        }
        if time > stream.latest || time < stream.latest.saturating_sub(REPLAY_AGE_NS) {
            // Numbered behind, yet sent after everything so far (or long before it): the
            // numbering started over. Holes of the old numbering stay counted missing.
            *stream = Stream::new(after, time, heard);
            let missing = span(1, first);
            stream.open_hole(1, first);
            self.restarted(missing);
            return SequenceEvent::Restart { expected, missing };
        }
        if heartbeat {
            self.counts.duplicate_segments += 1;
            return SequenceEvent::Duplicate;
        }
        let below_end = after.min(expected);
        let late = stream.missing_within(first, below_end);
        let repeated = span(first, below_end) - late;
        let beyond = span(expected, after);
        let new = late.saturating_add(beyond);
        if new == 0 {
            self.counts.duplicate_segments += 1;
            return SequenceEvent::Duplicate;
        }
        stream.fill(first, below_end);
        stream.latest = stream.latest.max(time);
        stream.next = stream.next.max(after);
        self.counts.late_messages = self.counts.late_messages.saturating_add(late);
        let event = if repeated == 0 {
            self.counts.reordered_segments += 1;
            SequenceEvent::Reordered { messages: count }
        } else {
            self.counts.overlapping_segments += 1;
            self.counts.repeated_messages = self.counts.repeated_messages.saturating_add(repeated);
            SequenceEvent::Overlap { repeated }
        };
        self.update();
        event
    }

    fn restarted(&mut self, missing: u64) {
        self.counts.restarts += 1;
        if missing > 0 {
            self.counts.gaps += 1;
            self.opened = self.opened.saturating_add(missing);
            self.update();
        }
    }

    fn update(&mut self) {
        self.counts.gap_messages = self.opened.saturating_sub(self.counts.late_messages);
    }

    fn insert(&mut self, key: (u16, u32, u32), stream: Stream) {
        if self.streams.len() >= MAX_STREAMS {
            let stalest = self.streams.iter().min_by_key(|(_, s)| s.heard).map(|(k, _)| *k);
            if let Some(stalest) = stalest {
                self.streams.remove(&stalest);
            }
        }
        self.streams.insert(key, stream);
    }

    /// The counts so far.
    pub fn counts(&self) -> SequenceCounts {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iextp::{Segment, protocol};
    use proptest::prelude::*;

    const SESSION: u32 = 0x4000;
    const SECOND: i64 = 1_000_000_000;

    /// A segment's bytes as the feed sends them: `count` one-byte messages from `first`, sent at
    /// `time` seconds.
    fn segment(session: u32, first: i64, count: u16, time: i64) -> Vec<u8> {
        let header = SegmentHeader {
            version: 1,
            protocol_id: protocol::DEEP,
            channel_id: 1,
            session_id: session,
            payload_length: count * 3,
            message_count: count,
            stream_offset: 0,
            first_sequence: first,
            send_time: 1_493_132_598 * SECOND + time * SECOND,
        };
        let mut bytes = header.to_bytes().to_vec();
        for _ in 0..count {
            bytes.extend_from_slice(&[1, 0, b'S']);
        }
        bytes
    }

    /// The tracker's verdict on a segment's bytes, parsed as the publisher parses them.
    fn feed(t: &mut SequenceTracker, bytes: &[u8]) -> SequenceEvent {
        t.observe(&Segment::parse(bytes).expect("a valid segment").header)
    }

    #[test]
    fn in_order_gaps_and_a_heartbeat_revealing_the_tail() {
        let mut t = SequenceTracker::new();
        assert_eq!(feed(&mut t, &segment(SESSION, 1, 0, 0)), SequenceEvent::InOrder);
        assert_eq!(feed(&mut t, &segment(SESSION, 1, 3, 1)), SequenceEvent::InOrder);
        assert_eq!(feed(&mut t, &segment(SESSION, 4, 2, 2)), SequenceEvent::InOrder);
        assert_eq!(feed(&mut t, &segment(SESSION, 9, 1, 3)), SequenceEvent::Gap { expected: 6, missing: 3 });
        // Segments 10..=14 lost at the end of a burst: the next heartbeat says so.
        assert_eq!(feed(&mut t, &segment(SESSION, 15, 0, 4)), SequenceEvent::Gap { expected: 10, missing: 5 });
        let c = t.counts();
        assert_eq!((c.gaps, c.gap_messages, c.duplicate_segments, c.restarts), (2, 8, 0, 0));
    }

    #[test]
    fn copies_are_duplicates_and_are_not_new() {
        let mut t = SequenceTracker::new();
        let data = segment(SESSION, 1, 3, 1);
        let heartbeat = segment(SESSION, 4, 0, 2);
        assert!(feed(&mut t, &data).is_new());
        // Line B's copy right behind line A's, of data and of a heartbeat.
        assert_eq!(feed(&mut t, &data), SequenceEvent::Duplicate);
        assert!(feed(&mut t, &heartbeat).is_new());
        assert_eq!(feed(&mut t, &heartbeat), SequenceEvent::Duplicate);
        // A copy arriving after later segments, and a stale heartbeat.
        assert!(feed(&mut t, &segment(SESSION, 4, 2, 3)).is_new());
        assert_eq!(feed(&mut t, &data), SequenceEvent::Duplicate);
        assert_eq!(feed(&mut t, &heartbeat), SequenceEvent::Duplicate);
        assert!(!SequenceEvent::Duplicate.is_new());
        let c = t.counts();
        assert_eq!((c.duplicate_segments, c.gaps, c.gap_messages, c.restarts), (4, 0, 0, 0));
    }

    #[test]
    fn a_late_segment_fills_its_gap_and_a_copy_of_it_then_is_a_duplicate() {
        let mut t = SequenceTracker::new();
        feed(&mut t, &segment(SESSION, 1, 2, 1));
        let late = segment(SESSION, 3, 2, 2);
        // 3 and 4 come after 5..=7.
        assert_eq!(feed(&mut t, &segment(SESSION, 5, 3, 3)), SequenceEvent::Gap { expected: 3, missing: 2 });
        assert_eq!(t.counts().gap_messages, 2);
        assert_eq!(feed(&mut t, &late), SequenceEvent::Reordered { messages: 2 });
        assert_eq!(feed(&mut t, &late), SequenceEvent::Duplicate);
        let c = t.counts();
        assert_eq!(
            (c.gaps, c.gap_messages, c.late_messages, c.reordered_segments, c.duplicate_segments),
            (1, 0, 2, 1, 1)
        );
    }

    #[test]
    fn a_partly_new_segment_is_an_overlap_and_fills_what_it_can() {
        let mut t = SequenceTracker::new();
        feed(&mut t, &segment(SESSION, 1, 4, 1));
        // 5..=6 lost, 7..=10 came.
        feed(&mut t, &segment(SESSION, 7, 4, 3));
        // 4..=6: 4 came before, 5 and 6 did not.
        assert_eq!(feed(&mut t, &segment(SESSION, 4, 3, 2)), SequenceEvent::Overlap { repeated: 1 });
        // 9..=12: 9 and 10 came before, 11 and 12 are new.
        assert_eq!(feed(&mut t, &segment(SESSION, 9, 4, 3)), SequenceEvent::Overlap { repeated: 2 });
        assert_eq!(feed(&mut t, &segment(SESSION, 13, 1, 4)), SequenceEvent::InOrder);
        let c = t.counts();
        assert_eq!((c.gaps, c.gap_messages, c.late_messages), (1, 0, 2));
        assert_eq!((c.overlapping_segments, c.repeated_messages, c.duplicate_segments), (2, 3, 0));
        // The middle of a hole filled leaves both ends missing.
        let mut t = SequenceTracker::new();
        feed(&mut t, &segment(SESSION, 1, 1, 1));
        feed(&mut t, &segment(SESSION, 10, 1, 3));
        assert_eq!(feed(&mut t, &segment(SESSION, 4, 2, 2)), SequenceEvent::Reordered { messages: 2 });
        assert_eq!(t.counts().gap_messages, 6);
        assert_eq!(feed(&mut t, &segment(SESSION, 2, 2, 2)), SequenceEvent::Reordered { messages: 2 });
        assert_eq!(feed(&mut t, &segment(SESSION, 6, 4, 2)), SequenceEvent::Reordered { messages: 4 });
        assert_eq!(t.counts().gap_messages, 0);
        assert_eq!(feed(&mut t, &segment(SESSION, 5, 1, 2)), SequenceEvent::Duplicate);
    }

    #[test]
    fn restarts_within_a_session_and_new_sessions() {
        let mut t = SequenceTracker::new();
        feed(&mut t, &segment(SESSION, 1, 5, 1));
        feed(&mut t, &segment(SESSION, 6, 0, 2));
        // Back to 1, sent later: the exchange numbers again (DEEP10 does so 11 times).
        assert_eq!(feed(&mut t, &segment(SESSION, 1, 0, 3)), SequenceEvent::Restart { expected: 6, missing: 0 });
        // Line B's copy of the restart's heartbeat is a duplicate, not a second restart.
        assert_eq!(feed(&mut t, &segment(SESSION, 1, 0, 3)), SequenceEvent::Duplicate);
        assert_eq!(feed(&mut t, &segment(SESSION, 1, 2, 4)), SequenceEvent::InOrder);
        assert_eq!(feed(&mut t, &segment(SESSION, 3, 10, 4)), SequenceEvent::InOrder);
        // A restart whose first segments were lost: 1..=4 of the new numbering are missing.
        assert_eq!(feed(&mut t, &segment(SESSION, 5, 1, 5)), SequenceEvent::Restart { expected: 13, missing: 4 });
        // A new session on the channel, joined at 3: 1 and 2 were missed.
        assert_eq!(
            feed(&mut t, &segment(SESSION + 1, 3, 1, 6)),
            SequenceEvent::NewSession { previous: SESSION, missing: 2 }
        );
        // The old session's late copy is still its own duplicate.
        assert_eq!(feed(&mut t, &segment(SESSION, 5, 1, 5)), SequenceEvent::Duplicate);
        // The feed played again from its start, hours earlier by its clock: a restart.
        assert_eq!(
            feed(&mut t, &segment(SESSION + 1, 1, 2, -3600)),
            SequenceEvent::Restart { expected: 4, missing: 0 }
        );
        let c = t.counts();
        assert_eq!((c.restarts, c.gaps, c.gap_messages, c.duplicate_segments), (4, 2, 6, 2));
    }

    #[test]
    fn the_first_segment_of_the_first_session_owes_nothing() {
        let mut t = SequenceTracker::new();
        assert_eq!(feed(&mut t, &segment(SESSION, 5000, 2, 1)), SequenceEvent::InOrder);
        assert_eq!(feed(&mut t, &segment(SESSION, 5002, 1, 2)), SequenceEvent::InOrder);
        assert_eq!(t.counts(), SequenceCounts::default());
    }

    #[test]
    fn memory_is_bounded_and_forgotten_holes_stay_missing() {
        let mut t = SequenceTracker::new();
        // Every other segment lost: more holes than are kept.
        let mut first = 1;
        for i in 0..(2 * MAX_HOLES as i64) {
            feed(&mut t, &segment(SESSION, first, 1, i));
            first += 2;
        }
        assert_eq!(t.streams[&(protocol::DEEP, 1, SESSION)].holes.len(), MAX_HOLES);
        assert_eq!(t.counts().gap_messages, 2 * MAX_HOLES as u64 - 1);
        // The oldest hole (2) is forgotten: its late segment is taken for a copy; the newest is not.
        let now = 2 * MAX_HOLES as i64 - 1;
        assert_eq!(feed(&mut t, &segment(SESSION, 2, 1, now)), SequenceEvent::Duplicate);
        assert_eq!(feed(&mut t, &segment(SESSION, first - 3, 1, now)), SequenceEvent::Reordered { messages: 1 });
        // A session per segment: at most MAX_STREAMS are kept.
        for session in 0..1000 {
            feed(&mut t, &segment(session, 1, 1, 0));
        }
        assert_eq!(t.streams.len(), MAX_STREAMS);
    }

    #[test]
    fn wild_sequence_numbers_saturate() {
        let header = |first: i64, count: u16, time: i64| SegmentHeader {
            version: 1,
            session_id: SESSION,
            message_count: count,
            first_sequence: first,
            send_time: time,
            ..Default::default()
        };
        let mut t = SequenceTracker::new();
        t.observe(&header(i64::MIN, 1, 1));
        assert_eq!(
            t.observe(&header(i64::MAX, u16::MAX, 2)),
            SequenceEvent::Gap { expected: i64::MIN + 1, missing: u64::MAX - 1 }
        );
        // Past the top, numbers saturate: the last of the range stands for all after it.
        assert_eq!(t.observe(&header(i64::MAX, 1, 2)), SequenceEvent::InOrder);
        assert_eq!(t.observe(&header(i64::MAX - 1, 1, 2)), SequenceEvent::Reordered { messages: 1 });
        assert_eq!(t.observe(&header(i64::MAX - 1, 1, 2)), SequenceEvent::Duplicate);
        assert_eq!(t.observe(&header(i64::MIN + 1, 1, 2)), SequenceEvent::Reordered { messages: 1 });
        assert_eq!(t.counts().gap_messages, u64::MAX - 3);
        // Send times at the ends of the range.
        t.observe(&header(5, 1, i64::MIN));
        t.observe(&header(1, 1, i64::MAX));
        t.observe(&header(1, 1, i64::MIN));
    }

    /// DEEP10's numbering, read the way the reference README describes it: 11 restarts (back to
    /// 1 in the same session) and nothing missing or repeated.
    #[test]
    fn deep10_has_eleven_restarts_and_nothing_else() {
        let path = crate::shared_data::iex_data().join("DEEP10.pcap.gz");
        let mut reader = crate::capture::CaptureReader::open(&path).unwrap();
        let mut t = SequenceTracker::new();
        let mut segments = 0;
        while let Ok(Some(packet)) = reader.next_packet() {
            if let Ok(d) = crate::link::udp_datagram(packet.link_type, packet.data)
                && let Ok(s) = Segment::parse(d.payload)
            {
                assert!(t.observe(&s.header).is_new());
                segments += 1;
            }
        }
        assert_eq!(segments, crate::shared_data::expected("DEEP10.json")["segments"]);
        assert_eq!(t.counts(), SequenceCounts { restarts: 11, ..Default::default() });
    }

    proptest! {
        /// A feed of consecutive segments, some dropped and some sent twice in a row: the
        /// missing messages are those of the dropped segments after the first one received,
        /// every second copy is a duplicate, and nothing else is counted.
        #[test]
        fn drops_and_copies_are_counted_exactly(plan in proptest::collection::vec((0u16..5, 0u8..10), 1..300)) {
            let mut t = SequenceTracker::new();
            let (mut first, mut missing, mut copies, mut gaps) = (1i64, 0u64, 0u64, 0u64);
            // Messages dropped since the last segment received: a loss shows only when a later
            // segment (data or heartbeat) arrives.
            let (mut joined, mut dropped) = (false, 0u64);
            for (i, &(count, fate)) in plan.iter().enumerate() {
                let bytes = segment(SESSION, first, count, i as i64);
                first += i64::from(count);
                if fate == 0 {
                    if joined {
                        dropped += u64::from(count);
                    }
                    continue;
                }
                joined = true;
                if dropped > 0 {
                    missing += dropped;
                    gaps += 1;
                    dropped = 0;
                }
                prop_assert!(feed(&mut t, &bytes).is_new());
                if fate == 1 {
                    copies += 1;
                    prop_assert_eq!(feed(&mut t, &bytes), SequenceEvent::Duplicate);
                }
            }
            let c = t.counts();
            prop_assert_eq!((c.gap_messages, c.gaps, c.duplicate_segments), (missing, gaps, copies));
            prop_assert_eq!((c.restarts, c.reordered_segments, c.overlapping_segments), (0, 0, 0));
        }

        /// Any headers at all: no panic, and memory stays within its bounds.
        #[test]
        fn any_headers_are_taken(headers in proptest::collection::vec(
            (0u32..4, 0u32..80, any::<i64>(), any::<u16>(), any::<i64>()), 1..400)) {
            let mut t = SequenceTracker::new();
            for (channel, session, first, count, time) in headers {
                let header = SegmentHeader {
                    version: 1, channel_id: channel, session_id: session, message_count: count,
                    first_sequence: first, send_time: time, ..Default::default()
                };
                t.observe(&header);
            }
            prop_assert!(t.streams.len() <= MAX_STREAMS);
            prop_assert!(t.streams.values().all(|s| s.holes.len() <= MAX_HOLES));
        }
    }
}
