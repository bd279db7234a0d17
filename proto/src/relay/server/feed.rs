//! What one TCP subscriber is sent, decided without I/O: where a resuming subscriber's replay
//! starts and ends, the replay's chunks out of the ring, a `FORMAT` record before the first
//! record and before each record of a new format, the frames it missed counted, and the
//! hand-over from the replay to the live records with no gap and no duplicate.
//!
//! A subscriber that resumes joins the live records under the ring's lock ([`plan_join`]): the
//! replay owes it the frames from the one it asked for (or the oldest still held; those no
//! longer held are its loss, as the `FORMAT` record names the frame it asked for) up to the
//! ring's mark, the first frame not yet handed to the live records. The live records that
//! start below the mark are skipped ([`SubscriberFeed::take`]), as the replay covers them: the
//! publisher moves the mark past a run of records before it hands the run over, so a run either
//! starts at or above the mark or was replayed whole.

use super::super::ring::FrameRing;
use super::super::wire::{RecordHeader, RecordTag, control_record};
use mdrelay_codec::Format;
use std::ops::Range;

/// Where a subscriber asking to resume joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Join {
    /// It asked for frames not sent yet (its numbers are not this publisher's): served live.
    Ahead {
        /// The frame it asked for.
        from: u64,
        /// The ring's mark: the next frame the live records bring.
        mark: u64,
    },
    /// It is replayed `first..end` from the ring, then joins the live records at `end`.
    Replay {
        /// The frame it asked for: its `FORMAT` record names it.
        from: u64,
        /// The first frame the ring still holds from `from` on.
        first: u64,
        /// The ring's mark.
        end: u64,
        /// The format of `first` (the live format when nothing is held).
        format: Format,
    },
}

impl Join {
    /// Frames asked for that the ring no longer holds: lost for the subscriber.
    pub fn gone(&self) -> u64 {
        match *self {
            Join::Ahead { .. } => 0,
            Join::Replay { from, first, .. } => first - from,
        }
    }
}

/// Where a subscriber resuming from `from` joins, against `ring` (locked by the caller while it
/// also joins the live records); `live_format` names a replay of nothing.
pub fn plan_join(ring: &FrameRing, from: u64, live_format: Format) -> Join {
    let end = ring.published();
    if from > end {
        return Join::Ahead { from, mark: end };
    }
    let first = from.max(ring.first());
    let format = ring.format_of(first).unwrap_or(live_format);
    Join::Replay { from, first, end, format }
}

/// What [`SubscriberFeed::take`] decided about one record (or run of records).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeedStep {
    /// Not sent: a live record the replay covered, or bytes that are not a record.
    Skip,
    /// DATA records starting at `first`: sent after `format_record` if there is one; `dropped`
    /// frames before `first` never reached the subscriber.
    Data {
        /// The `FORMAT` record to send first: the first record, or a new format.
        format_record: Option<Vec<u8>>,
        /// Frames skipped before this record.
        dropped: u64,
        /// The record's first frame.
        first: u64,
    },
    /// END: sent; `dropped` frames before it never reached the subscriber.
    End {
        /// Frames skipped before END.
        dropped: u64,
    },
    /// Another record: sent as it is.
    Other,
}

/// A subscriber's position in what it is sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubscriberFeed {
    /// The format of the last DATA record taken.
    format: Option<Format>,
    /// The frame the next record should start at, once one was taken.
    next: Option<u64>,
    /// Live records starting below this frame are covered by the replay.
    skip_below: u64,
    /// END was taken.
    ended: bool,
}

impl SubscriberFeed {
    /// A subscriber served live from the next record on.
    pub fn live() -> SubscriberFeed {
        SubscriberFeed::default()
    }

    /// A subscriber replayed as `join` says, and its first record: the `FORMAT` record naming
    /// the frame it asked for. `None` for a join served live.
    pub fn resuming(join: &Join) -> Option<(SubscriberFeed, Vec<u8>)> {
        let Join::Replay { from, end, format, .. } = *join else { return None };
        let feed = SubscriberFeed { format: Some(format), next: Some(from), skip_below: end, ended: false };
        Some((feed, control_record(RecordTag::Format, format, from, &[])))
    }

    /// The frame the next record should start at, once one was taken.
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// The format of the last DATA record taken.
    pub fn format(&self) -> Option<Format> {
        self.format
    }

    /// The frames before `next` reached the subscriber another way (the publisher's hot thread
    /// wrote them, [`super::handover`]): records of them taken later are not counted as frames
    /// dropped before the next one.
    pub fn delivered_until(&mut self, next: u64) {
        if let Some(own) = &mut self.next {
            *own = (*own).max(next);
        }
    }

    /// Whether END was taken.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Takes `record` (one record, or a run of DATA records of one format back to back), from
    /// the replay (`replaying`: the subscriber's replay is not over) or the live records.
    pub fn take(&mut self, record: &[u8], replaying: bool) -> FeedStep {
        let Ok(header) = RecordHeader::parse(record, usize::MAX) else { return FeedStep::Skip };
        match header.tag {
            RecordTag::Data if header.sequence < self.skip_below && !replaying => FeedStep::Skip,
            RecordTag::Data => {
                let dropped = self.dropped_before(header.sequence);
                let last = last_record(record).unwrap_or(header);
                self.next = Some(last.sequence.saturating_add(u64::from(last.frame_count)));
                let format_record = (self.format != Some(header.format)).then(|| {
                    self.format = Some(header.format);
                    control_record(RecordTag::Format, header.format, header.sequence, &[])
                });
                FeedStep::Data { format_record, dropped, first: header.sequence }
            }
            RecordTag::End => {
                self.ended = true;
                FeedStep::End { dropped: self.dropped_before(header.sequence) }
            }
            _ => FeedStep::Other,
        }
    }

    fn dropped_before(&self, sequence: u64) -> u64 {
        self.next.map_or(0, |next| sequence.saturating_sub(next))
    }
}

/// The header of the last record in `bytes`, one record or a run of them back to back.
pub fn last_record(bytes: &[u8]) -> Option<RecordHeader> {
    let mut at = 0usize;
    loop {
        let header = RecordHeader::parse(bytes.get(at..)?, usize::MAX).ok()?;
        let next = at.checked_add(RecordHeader::LEN)?.checked_add(header.length as usize)?;
        if next >= bytes.len() {
            return Some(header);
        }
        at = next;
    }
}

/// The frames a resuming subscriber is still owed from the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayCursor {
    /// The next frame to replay.
    next: u64,
    /// The ring's mark when the subscriber joined: the live records bring the rest.
    end: u64,
    finished: bool,
}

/// What [`ReplayCursor::fill`] came to.
#[derive(Debug, PartialEq, Eq)]
pub enum ReplayFill {
    /// DATA records copied into `buf`, one per range.
    Built {
        /// The chunk.
        buf: Vec<u8>,
        /// Each record's bytes in it.
        records: Vec<Range<usize>>,
    },
    /// The next frame alone needs this many bytes, more than the room given.
    Needs(usize),
    /// Nothing is left to replay.
    Done,
}

impl ReplayCursor {
    /// The replay `join` owes, if any.
    pub fn of(join: &Join) -> Option<ReplayCursor> {
        match *join {
            Join::Replay { first, end, .. } => Some(ReplayCursor { next: first, end, finished: false }),
            Join::Ahead { .. } => None,
        }
    }

    /// The next frame to replay and the end of the replay.
    pub fn range(&self) -> (u64, u64) {
        (self.next, self.end)
    }

    /// Whether the replay is over.
    pub fn is_finished(&self) -> bool {
        self.finished || self.next >= self.end
    }

    /// Copies the next records out of `ring` into one chunk of at most `room` bytes (headers
    /// included), in a buffer `buffer` gives for a size (called once, only if anything is
    /// copied). Frames that left the ring since the subscriber joined are passed over (its loss,
    /// counted at the next record it takes). A first frame larger than `room` is taken alone
    /// when `room` is the whole budget (`whole_budget`), else its need is returned.
    pub fn fill(
        &mut self,
        ring: &FrameRing,
        room: usize,
        whole_budget: bool,
        buffer: impl FnOnce(usize) -> Vec<u8>,
    ) -> ReplayFill {
        if self.is_finished() {
            return ReplayFill::Done;
        }
        let mut buffer = Some(buffer);
        let mut buf: Option<Vec<u8>> = None;
        let mut records = Vec::new();
        self.next = self.next.max(ring.first());
        while self.next < self.end {
            let Some(len) = ring.frame_len(self.next) else { break };
            let filled = buf.as_ref().map_or(0, Vec::len);
            let left = room.saturating_sub(filled);
            let need = RecordHeader::LEN + len;
            if need > left {
                if filled > 0 {
                    break;
                }
                if !whole_budget {
                    return ReplayFill::Needs(need);
                }
            }
            let bytes = match &mut buf {
                Some(bytes) => bytes,
                None => buf.insert(buffer.take().map_or_else(Vec::new, |make| make(room.max(need)))),
            };
            // Within the room: the first frame fits (or is alone), the rest are bounded.
            let most = left.saturating_sub(RecordHeader::LEN);
            let Some(next) = ring.copy_record(self.next, self.end - self.next, most, bytes) else { break };
            records.push(filled..bytes.len());
            self.next = next;
        }
        if ring.first() > self.end {
            self.next = self.end;
        }
        match buf {
            Some(buf) => ReplayFill::Built { buf, records },
            None => {
                // Nothing left: replayed, or gone from the ring.
                self.finished = true;
                ReplayFill::Done
            }
        }
    }
}
