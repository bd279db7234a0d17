//! Sequence tracking per (message protocol, session): gaps, restarts and repeats.

use crate::iextp::SegmentHeader;
use rustc_hash::FxHashMap;

/// What one segment's sequence number said about the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceEvent {
    /// The first segment of a (protocol, session), or the expected next one.
    InOrder,
    /// Messages were skipped: `missing` of them, starting at `expected`.
    Gap {
        /// The sequence number that was expected.
        expected: i64,
        /// How many messages are missing.
        missing: i64,
    },
    /// The sequence went back to 1 within the same session (a publisher restart).
    Restart {
        /// The sequence number that was expected.
        expected: i64,
    },
    /// A segment at or below numbers already seen (a duplicate or a late, reordered segment).
    Behind {
        /// The sequence number that was expected.
        expected: i64,
    },
}

/// Counts of sequence events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SequenceCounts {
    /// Gaps seen.
    pub gaps: u64,
    /// Messages missing over all gaps.
    pub missing_messages: u64,
    /// Restarts (back to 1, same session).
    pub restarts: u64,
    /// Segments behind the expected number.
    pub behind: u64,
}

/// Tracks the next expected sequence number of each (protocol, session).
#[derive(Clone, Debug, Default)]
pub struct SequenceTracker {
    next: FxHashMap<(u16, u32), i64>,
    counts: SequenceCounts,
}

impl SequenceTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes one segment (heartbeats included: they carry the next sequence number).
    pub fn observe(&mut self, header: &SegmentHeader) -> SequenceEvent {
        let first = header.first_sequence;
        let after = first.saturating_add(i64::from(header.message_count));
        let key = (header.protocol_id, header.session_id);
        let Some(expected) = self.next.get(&key).copied() else {
            self.next.insert(key, after);
            return SequenceEvent::InOrder;
        };
        let event = if first == expected {
            SequenceEvent::InOrder
        } else if first == 1 {
            self.counts.restarts += 1;
            SequenceEvent::Restart { expected }
        } else if first > expected {
            // Sequence numbers come from the capture: saturate rather than wrap on wild ones.
            let missing = first.saturating_sub(expected);
            self.counts.gaps += 1;
            self.counts.missing_messages = self.counts.missing_messages.saturating_add(missing.unsigned_abs());
            SequenceEvent::Gap { expected, missing }
        } else {
            self.counts.behind += 1;
            SequenceEvent::Behind { expected }
        };
        let next = match event {
            SequenceEvent::Behind { .. } => expected.max(after),
            _ => after,
        };
        self.next.insert(key, next);
        event
    }

    /// The counts so far.
    pub fn counts(&self) -> SequenceCounts {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(session: u32, first: i64, count: u16) -> SegmentHeader {
        SegmentHeader { session_id: session, first_sequence: first, message_count: count, ..Default::default() }
    }

    #[test]
    fn gaps_restarts_and_repeats() {
        let mut t = SequenceTracker::new();
        assert_eq!(t.observe(&seg(1, 1, 3)), SequenceEvent::InOrder);
        assert_eq!(t.observe(&seg(1, 4, 0)), SequenceEvent::InOrder);
        assert_eq!(t.observe(&seg(1, 4, 2)), SequenceEvent::InOrder);
        assert_eq!(t.observe(&seg(1, 9, 1)), SequenceEvent::Gap { expected: 6, missing: 3 });
        assert_eq!(t.observe(&seg(1, 9, 1)), SequenceEvent::Behind { expected: 10 });
        assert_eq!(t.observe(&seg(1, 1, 1)), SequenceEvent::Restart { expected: 10 });
        assert_eq!(t.observe(&seg(2, 50, 1)), SequenceEvent::InOrder);
        assert_eq!(t.counts(), SequenceCounts { gaps: 1, missing_messages: 3, restarts: 1, behind: 1 });
    }

    #[test]
    fn wild_sequence_numbers_saturate() {
        let mut t = SequenceTracker::new();
        t.observe(&seg(1, i64::MIN, 1));
        assert_eq!(
            t.observe(&seg(1, i64::MAX, u16::MAX)),
            SequenceEvent::Gap { expected: i64::MIN + 1, missing: i64::MAX }
        );
        t.observe(&seg(1, i64::MAX, 1));
        assert_eq!(t.counts().missing_messages, i64::MAX as u64);
    }
}
