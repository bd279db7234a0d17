//! Whether the records of one TCP connection fit together: the check a relay and a subscriber
//! make on each record header before believing its numbers.
//!
//! Nothing is lost, duplicated or reordered inside one TCP connection, so the records a
//! publisher sends follow each other. Within one connection:
//! - the first record starts at the frame asked for when resuming (anywhere, when live);
//! - a `FORMAT` record names the first frame of the records after it: never one already
//!   received;
//! - a `DATA` record starts at the frame after the last one received, or later: a publisher
//!   skips the frames a subscriber fell a whole queue behind on (`slow_subscriber = "drop"`),
//!   frames that left its ring before a resume reached them, and frames a relay never had
//!   itself. A record that skips ahead is believed only once the record after it follows on
//!   from it (starts at or after its end). A header changed on the way (a jump of a million, a
//!   flipped bit) makes the record after it seem to go back, so the changed record is refuted
//!   before any of its frames is taken: [`Verdict::NeedNext`] asks for that record's header;
//! - `END` names a next frame at or after the last one received.
//!
//! Anything else is a protocol violation ([`Violation`]): the connection's numbers cannot be
//! believed any more. The reader drops the connection and resumes from the frame after the last
//! one it took, so nothing numbered wrongly is handed on and nothing is lost while the
//! publisher's ring holds the frames.

use super::wire::{RecordHeader, RecordTag};
use std::fmt;

/// Highest sequence number believed in a `DATA` record: far beyond any real stream (a billion
/// frames a second for a century), far below where adding frame counts could overflow.
pub const MAX_SEQUENCE: u64 = 1 << 62;

/// What to do with a record, from its header (and, for a record that skips ahead, the next
/// record's header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It fits: take it.
    Take,
    /// It skips ahead: ask again with the next record's header before taking any of its frames.
    NeedNext,
    /// It does not fit: drop the connection and resume after the last frame taken.
    Violation(Violation),
}

/// How a record failed to fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViolationKind {
    /// A `DATA` record numbered 0, or beyond [`MAX_SEQUENCE`]: no publisher numbers frames so.
    Unnumbered,
    /// Behind the next frame owed: frames this connection already brought, or a changed number.
    Behind,
    /// It skipped ahead, and the record after it does not follow on from it.
    Unconfirmed {
        /// The next record's tag.
        next_tag: RecordTag,
        /// The next record's sequence number.
        next_sequence: u64,
        /// Where the skipping record's frames end: the next record had to start here or later.
        end: u64,
    },
}

/// A record that does not fit the stream of its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The record's tag.
    pub tag: RecordTag,
    /// Its sequence number (its first frame's, for `DATA`).
    pub sequence: u64,
    /// The frame the connection owes next, when known.
    pub expected: Option<u64>,
    /// What was wrong.
    pub kind: ViolationKind,
}

fn numbered(tag: RecordTag, sequence: u64) -> String {
    match tag {
        RecordTag::Data => format!("DATA numbered from {sequence}"),
        RecordTag::Format => format!("FORMAT naming {sequence} as the next frame"),
        RecordTag::End => format!("END naming {sequence} as the next frame"),
        RecordTag::Snapshot => format!("SNAPSHOT as of frame {sequence}"),
        other => format!("{other:?} record"),
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let record = numbered(self.tag, self.sequence);
        let expected = match self.expected {
            Some(e) => format!("frame {e} was expected (the frame after the last one received)"),
            None => "no frame was owed yet".to_string(),
        };
        match self.kind {
            ViolationKind::Unnumbered => write!(f, "{record}, not a number a publisher gives, where {expected}"),
            ViolationKind::Behind => write!(f, "{record} where {expected}"),
            ViolationKind::Unconfirmed { next_tag, next_sequence, end } => write!(
                f,
                "{record} skips ahead where {expected}, and the record after it ({}) does not start at or after {end}, where its frames end",
                numbered(next_tag, next_sequence)
            ),
        }
    }
}

/// The check of one connection's records: create it when the connection is made, and ask it
/// about every record, in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Continuity {
    /// The next frame owed: the frame asked for, then the one after the last record taken.
    expected: Option<u64>,
}

impl Continuity {
    /// A connection that asked to resume at `asked` (`None`: live, so its first record says
    /// where the stream starts).
    pub fn new(asked: Option<u64>) -> Continuity {
        Continuity { expected: asked }
    }

    /// The frame owed next, once known.
    pub fn expected(&self) -> Option<u64> {
        self.expected
    }

    /// Whether `record` fits; `next` is the header of the record after it, which a record that
    /// skips ahead needs ([`Verdict::NeedNext`] until it is given). Taking a record moves the
    /// frame owed past it; [`Verdict::NeedNext`] and a violation change nothing.
    pub fn check(&mut self, record: &RecordHeader, next: Option<&RecordHeader>) -> Verdict {
        let violation = |kind| {
            Verdict::Violation(Violation { tag: record.tag, sequence: record.sequence, expected: self.expected, kind })
        };
        let sequence = record.sequence;
        match record.tag {
            RecordTag::Data | RecordTag::Format => {
                let frames = if record.tag == RecordTag::Data { u64::from(record.frame_count) } else { 0 };
                if record.tag == RecordTag::Data && (sequence == 0 || sequence > MAX_SEQUENCE) {
                    return violation(ViolationKind::Unnumbered);
                }
                // No overflow: a FORMAT adds nothing, a DATA record's number is at most MAX_SEQUENCE.
                let end = sequence.saturating_add(frames);
                match self.expected {
                    Some(expected) if sequence < expected => return violation(ViolationKind::Behind),
                    // A FORMAT record carries no frame: what it names is checked by the record after it.
                    Some(expected) if sequence > expected && record.tag == RecordTag::Data => match next {
                        None => return Verdict::NeedNext,
                        Some(after) if follows(after, end) => {}
                        Some(after) => {
                            return violation(ViolationKind::Unconfirmed {
                                next_tag: after.tag,
                                next_sequence: after.sequence,
                                end,
                            });
                        }
                    },
                    _ => {}
                }
                self.expected = Some(end);
                Verdict::Take
            }
            RecordTag::End => match self.expected {
                Some(expected) if sequence < expected => violation(ViolationKind::Behind),
                _ => Verdict::Take,
            },
            // A snapshot as of frame n comes before the stream, which goes on from frame n + 1.
            RecordTag::Snapshot => match self.expected {
                Some(expected) if expected != sequence.saturating_add(1) => violation(ViolationKind::Behind),
                _ => {
                    self.expected = Some(sequence.saturating_add(1));
                    Verdict::Take
                }
            },
            // Not numbered: nothing to check here (the reader decides whether they belong).
            RecordTag::Refuse | RecordTag::Echo | RecordTag::Busy | RecordTag::Request | RecordTag::Gone => {
                Verdict::Take
            }
        }
    }
}

/// Whether `after` starts at or after `end`: a record that carries the stream on.
fn follows(after: &RecordHeader, end: u64) -> bool {
    matches!(after.tag, RecordTag::Data | RecordTag::Format | RecordTag::End) && after.sequence >= end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::control_record;
    use mdrelay_codec::Format;

    fn data(sequence: u64, frames: u16) -> RecordHeader {
        let bytes =
            RecordHeader { tag: RecordTag::Data, format: Format::Sbe, frame_count: frames, length: 0, sequence }
                .to_bytes();
        RecordHeader::parse(&bytes, 0).unwrap()
    }

    fn control(tag: RecordTag, sequence: u64) -> RecordHeader {
        RecordHeader::parse(&control_record(tag, Format::Sbe, sequence, &[]), 0).unwrap()
    }

    /// Runs `records` through a check the way a reader does: a record that skips ahead is asked
    /// about again with the next one; returns the verdicts, up to the first violation.
    fn run(asked: Option<u64>, records: &[RecordHeader]) -> Vec<Verdict> {
        let mut check = Continuity::new(asked);
        let mut out = Vec::new();
        for (i, record) in records.iter().enumerate() {
            let mut verdict = check.check(record, None);
            if verdict == Verdict::NeedNext {
                assert_eq!(check.check(record, None), Verdict::NeedNext, "asking again changes nothing");
                verdict = match records.get(i + 1) {
                    Some(next) => check.check(record, Some(next)),
                    None => Verdict::NeedNext,
                };
            }
            let stop = matches!(verdict, Verdict::Violation(_));
            out.push(verdict);
            if stop {
                break;
            }
        }
        out
    }

    fn violation(v: &[Verdict]) -> Violation {
        match v.last() {
            Some(Verdict::Violation(v)) => *v,
            other => panic!("no violation: {other:?}"),
        }
    }

    #[test]
    fn consecutive_records_fit_from_the_announced_first_frame_to_end() {
        let records = [
            control(RecordTag::Format, 1),
            data(1, 3),
            data(4, 1),
            control(RecordTag::Format, 5),
            data(5, 2),
            control(RecordTag::End, 7),
        ];
        assert_eq!(run(None, &records), vec![Verdict::Take; records.len()]);
        let mut check = Continuity::new(None);
        for r in &records[..5] {
            check.check(r, None);
        }
        assert_eq!(check.expected(), Some(7));
    }

    #[test]
    fn a_record_renumbered_ahead_is_refuted_by_the_one_after_it() {
        // The bug this check exists for: one record's number jumped (a million ahead, or bit 29
        // flipped); the records after it carry the true numbers.
        for wrong in [301 + 1_000_000, 301 ^ (1 << 29)] {
            let v = run(None, &[control(RecordTag::Format, 1), data(1, 300), data(wrong, 1), data(302, 1)]);
            assert_eq!(v[..2], [Verdict::Take, Verdict::Take]);
            let violation = violation(&v);
            assert_eq!((violation.sequence, violation.expected), (wrong, Some(301)));
            assert_eq!(
                violation.kind,
                ViolationKind::Unconfirmed { next_tag: RecordTag::Data, next_sequence: 302, end: wrong + 1 }
            );
            let text = violation.to_string();
            assert!(
                text.contains(&format!("DATA numbered from {wrong}")) && text.contains("frame 301 was expected"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_record_renumbered_behind_is_refused_at_once() {
        for wrong in [1, 300, 301 - (1 << 8)] {
            let v = run(None, &[control(RecordTag::Format, 1), data(1, 300), data(wrong, 1)]);
            let violation = violation(&v);
            assert_eq!(
                (violation.kind, violation.sequence, violation.expected),
                (ViolationKind::Behind, wrong, Some(301))
            );
        }
    }

    #[test]
    fn skips_a_publisher_makes_are_believed_once_the_next_record_follows_on() {
        // A subscriber under `drop` skipped frames 11..=50; a relay missing frame 60; a resume
        // whose first frames had left the ring; a skip right before a format switch and at END.
        let records = [
            control(RecordTag::Format, 1),
            data(1, 10),
            data(51, 9),
            data(61, 1),
            control(RecordTag::Format, 62),
            data(62, 1),
            data(70, 1),
            control(RecordTag::End, 80),
        ];
        assert_eq!(run(None, &records), vec![Verdict::Take; records.len()]);
        let resumed = [control(RecordTag::Format, 100), data(140, 5), data(145, 1)];
        assert_eq!(run(Some(100), &resumed), vec![Verdict::Take; 3]);
        // A skip is confirmed by a next record that skips again, and by END after it.
        assert_eq!(run(Some(1), &[data(5, 1), data(9, 1), control(RecordTag::End, 12)]), vec![Verdict::Take; 3]);
    }

    #[test]
    fn a_skip_the_next_record_does_not_carry_on_is_a_violation() {
        // The next record starts inside the skipping record's frames, or is not numbered.
        let v = run(Some(1), &[data(1, 1), data(10, 5), data(12, 1)]);
        assert!(matches!(violation(&v).kind, ViolationKind::Unconfirmed { next_sequence: 12, end: 15, .. }));
        let v = run(Some(1), &[data(1, 1), data(10, 5), control(RecordTag::End, 14)]);
        assert!(matches!(violation(&v).kind, ViolationKind::Unconfirmed { next_tag: RecordTag::End, .. }));
        let v = run(Some(1), &[data(1, 1), data(10, 5), control(RecordTag::Echo, 0)]);
        assert!(matches!(violation(&v).kind, ViolationKind::Unconfirmed { next_tag: RecordTag::Echo, .. }));
    }

    #[test]
    fn a_resume_must_start_where_it_was_asked_for_or_later() {
        let v = run(Some(500), &[control(RecordTag::Format, 499)]);
        assert_eq!(violation(&v).kind, ViolationKind::Behind);
        let v = run(Some(500), &[control(RecordTag::Format, 500), data(400, 3)]);
        assert_eq!((violation(&v).kind, violation(&v).expected), (ViolationKind::Behind, Some(500)));
        assert_eq!(run(Some(500), &[control(RecordTag::Format, 500), data(500, 3)]), vec![Verdict::Take; 2]);
        // Live, the first record is where the stream starts.
        assert_eq!(run(None, &[data(7_000, 3), data(7_003, 1)]), vec![Verdict::Take; 2]);
    }

    #[test]
    fn a_format_record_naming_a_later_frame_is_checked_by_the_record_after_it() {
        // FORMAT's number changed ahead: the true DATA after it is behind it.
        let v = run(
            None,
            &[control(RecordTag::Format, 1), data(1, 4), control(RecordTag::Format, 5 + (1 << 29)), data(5, 1)],
        );
        let violation = violation(&v);
        assert_eq!(
            (violation.tag, violation.kind, violation.expected),
            (RecordTag::Data, ViolationKind::Behind, Some(5 + (1 << 29)))
        );
    }

    #[test]
    fn an_end_behind_the_frames_received_is_a_violation_and_one_ahead_counts_the_tail() {
        let v = run(None, &[data(1, 10), control(RecordTag::End, 5)]);
        assert_eq!((violation(&v).tag, violation(&v).kind), (RecordTag::End, ViolationKind::Behind));
        assert!(violation(&v).to_string().contains("END naming 5 as the next frame where frame 11 was expected"));
        assert_eq!(run(None, &[data(1, 10), control(RecordTag::End, 11)]), vec![Verdict::Take; 2]);
        assert_eq!(run(None, &[data(1, 10), control(RecordTag::End, 20)]), vec![Verdict::Take; 2]);
        assert_eq!(run(None, &[control(RecordTag::End, 1)]), vec![Verdict::Take]);
    }

    #[test]
    fn numbers_no_publisher_gives_are_violations_and_nothing_overflows() {
        for wrong in [0, MAX_SEQUENCE + 1, u64::MAX] {
            let v = run(None, &[data(wrong, u16::MAX)]);
            assert_eq!(violation(&v).kind, ViolationKind::Unnumbered, "{wrong}");
        }
        let mut check = Continuity::new(None);
        assert_eq!(check.check(&data(MAX_SEQUENCE, u16::MAX), None), Verdict::Take);
        assert_eq!(check.expected(), Some(MAX_SEQUENCE + u64::from(u16::MAX)));
        // Every header a reader can parse gets a verdict, whatever its numbers.
        let mut check = Continuity::new(Some(u64::MAX));
        for tag in [RecordTag::Data, RecordTag::Format, RecordTag::End, RecordTag::Echo] {
            for sequence in [0, 1, MAX_SEQUENCE, u64::MAX] {
                let _ = check.check(&control(tag, sequence), Some(&control(tag, u64::MAX)));
            }
        }
    }
}
