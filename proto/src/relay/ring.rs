//! The publisher's retransmission ring: the last frames of the session, bounded in bytes, for
//! retransmission requests and for TCP subscribers that resume.
//!
//! Frames are copied into 1 MiB chunks and held as places in them (chunk, offset, length): one
//! allocation per chunk, not per frame, and no reference count to touch per frame on the hot
//! path. Readers copy frames out under the ring's lock ([`FrameRing::copy_record`]), so nothing
//! points into a chunk once the ring lets it go; the chunk evicted last is kept to be filled
//! again, so a steady stream allocates nothing. The bound counts each frame's bytes plus
//! [`ENTRY_OVERHEAD`] for its bookkeeping, so it is the ring's memory, not only its payload; what
//! it does not count is at most one chunk at each end (partly evicted at the head, partly filled
//! at the tail) and the spare, which is why the publisher's stated margin is 24 MiB.

use super::wire::{RecordHeader, RecordTag};
use mdrelay_codec::Format;
use std::collections::VecDeque;

/// Bytes of one chunk frames are copied into.
pub const CHUNK: usize = 1 << 20;
/// Bytes charged per frame for its entry (its place and format), on top of its size.
pub const ENTRY_OVERHEAD: usize = 48;

/// One frame held: where its bytes are.
#[derive(Clone, Copy, Debug)]
struct Held {
    format: Format,
    /// The chunk's number (chunks are numbered from 0 in the order they were started).
    chunk: u64,
    /// Offset in the chunk.
    start: usize,
    len: usize,
}

/// Where a requested range stands against the ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    /// Frames at the start of the range that left the ring (or were never in it).
    pub gone: u64,
    /// Frames after those that the ring holds.
    pub held: u64,
    /// Frames at the end of the range not sent yet.
    pub ahead: u64,
}

/// The last frames of one session, within a byte budget.
#[derive(Debug)]
pub struct FrameRing {
    frames: VecDeque<Held>,
    /// Sequence number of `frames[0]` (of the next frame, when empty).
    first: u64,
    /// Bytes charged for the frames held.
    charged: usize,
    limit: usize,
    /// The chunks frames are in; the last one is being filled.
    chunks: VecDeque<Vec<u8>>,
    /// The number of `chunks[0]`.
    first_chunk: u64,
    /// The chunk released last, kept to be filled again.
    spare: Option<Vec<u8>>,
    /// Frames below this sequence were handed to the TCP fanout (see [`FrameRing::published`]).
    published: u64,
}

impl FrameRing {
    /// An empty ring of at most `limit` bytes (frames plus [`ENTRY_OVERHEAD`] each).
    pub fn new(limit: usize) -> FrameRing {
        FrameRing {
            frames: VecDeque::new(),
            first: 1,
            charged: 0,
            limit,
            chunks: VecDeque::new(),
            first_chunk: 0,
            spare: None,
            published: 1,
        }
    }

    /// The bytes of a frame held.
    fn bytes(&self, held: &Held) -> &[u8] {
        let chunk = usize::try_from(held.chunk - self.first_chunk).ok().and_then(|i| self.chunks.get(i));
        // Every frame held is in a chunk held, within what was written to it.
        chunk.and_then(|c| c.get(held.start..held.start + held.len)).unwrap_or_default()
    }

    /// Lets go of the chunks before the oldest frame's (all but the last one when no frame is
    /// held), keeping one as the spare.
    fn release_chunks(&mut self) {
        let keep_from = self.frames.front().map_or(self.first_chunk + self.chunks.len() as u64, |f| f.chunk);
        while self.first_chunk < keep_from && self.chunks.len() > 1 {
            if let Some(chunk) = self.chunks.pop_front()
                && chunk.capacity() == CHUNK
            {
                self.spare = Some(chunk);
            }
            self.first_chunk += 1;
        }
    }

    /// The bound, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes charged now (never above the bound).
    pub fn charged(&self) -> usize {
        self.charged
    }

    /// Sequence number of the oldest frame held (of the next frame, when none is).
    pub fn first(&self) -> u64 {
        self.first
    }

    /// Sequence number the next frame will have.
    pub fn next(&self) -> u64 {
        self.first + self.frames.len() as u64
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// True when no frame is held.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Holds frame `sequence`, letting the oldest frames go to stay within the bound. Sequence
    /// numbers are consecutive; one that is not the next starts the ring over from it. A frame
    /// larger than the whole bound is not held (a request for it gets "gone").
    pub fn push(&mut self, sequence: u64, format: Format, frame: &[u8]) {
        if sequence != self.next() {
            self.frames.clear();
            self.charged = 0;
            self.first = sequence;
            self.published = self.published.max(sequence);
        }
        let cost = frame.len() + ENTRY_OVERHEAD;
        if cost > self.limit {
            self.frames.clear();
            self.charged = 0;
            self.first = sequence + 1;
            self.release_chunks();
            return;
        }
        while self.charged + cost > self.limit {
            let Some(old) = self.frames.pop_front() else { break };
            self.charged -= old.len + ENTRY_OVERHEAD;
            self.first += 1;
        }
        self.release_chunks();
        let room = self.chunks.back().map_or(0, |c| c.capacity() - c.len());
        if room < frame.len() || self.chunks.is_empty() {
            let chunk = match self.spare.take() {
                Some(mut spare) if spare.capacity() >= frame.len() => {
                    spare.clear();
                    spare
                }
                _ => Vec::with_capacity(CHUNK.max(frame.len())),
            };
            self.chunks.push_back(chunk);
        }
        let chunk = self.first_chunk + self.chunks.len() as u64 - 1;
        let Some(tail) = self.chunks.back_mut() else { return };
        let start = tail.len();
        tail.extend_from_slice(frame);
        self.frames.push_back(Held { format, chunk, start, len: frame.len() });
        self.charged += cost;
    }

    /// Notes that every frame below `next` was handed to the TCP fanout. A resuming subscriber
    /// is replayed frames up to this mark from the ring, and takes the fanout's records from it
    /// on; records that start below the mark were replayed already.
    pub fn set_published(&mut self, next: u64) {
        self.published = self.published.max(next);
    }

    /// See [`FrameRing::set_published`].
    pub fn published(&self) -> u64 {
        self.published
    }

    /// The format of frame `sequence`, when held.
    pub fn format_of(&self, sequence: u64) -> Option<Format> {
        let index = usize::try_from(sequence.checked_sub(self.first)?).ok()?;
        self.frames.get(index).map(|held| held.format)
    }

    /// The length of frame `sequence`, when held: what a record of it alone needs beyond its
    /// header, so a reader can size its buffer before it copies.
    pub fn frame_len(&self, sequence: u64) -> Option<usize> {
        let index = usize::try_from(sequence.checked_sub(self.first)?).ok()?;
        self.frames.get(index).map(|held| held.len)
    }

    /// Where `first..first + count` stands: gone, held, not sent yet.
    pub fn lookup(&self, first: u64, count: u64) -> Lookup {
        let end = first.saturating_add(count);
        let gone_end = end.min(self.first);
        let gone = gone_end.saturating_sub(first);
        let held_start = first.max(self.first);
        let held_end = end.min(self.next());
        let held = held_end.saturating_sub(held_start);
        let ahead = end.saturating_sub(self.next().max(first));
        Lookup { gone, held, ahead }
    }

    /// A `DATA` record of the frames held from `from` on: consecutive frames of one format, at
    /// most `max_frames` of them and `max_bytes` of payload (at least one frame, whatever its
    /// size), appended to `out`. Returns the sequence after the last frame put in, or `None` when
    /// `from` is not held.
    pub fn copy_record(&self, from: u64, max_frames: u64, max_bytes: usize, out: &mut Vec<u8>) -> Option<u64> {
        let index = usize::try_from(from.checked_sub(self.first)?).ok()?;
        let head = self.frames.get(index)?;
        let format = head.format;
        let header_at = out.len();
        out.extend_from_slice(&[0u8; RecordHeader::LEN]);
        let mut frames = 0u64;
        let mut length = 0usize;
        let limit = max_frames.clamp(1, u64::from(u16::MAX));
        for held in self.frames.range(index..) {
            if held.format != format || frames >= limit || (frames > 0 && length + held.len > max_bytes) {
                break;
            }
            out.extend_from_slice(self.bytes(held));
            length += held.len;
            frames += 1;
        }
        let header = RecordHeader {
            tag: RecordTag::Data,
            format,
            frame_count: frames as u16,
            length: u32::try_from(length).unwrap_or(u32::MAX),
            sequence: from,
        };
        out[header_at..header_at + RecordHeader::LEN].copy_from_slice(&header.to_bytes());
        Some(from + frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: u64, len: usize) -> Vec<u8> {
        vec![seq as u8; len]
    }

    #[test]
    fn holds_the_last_frames_within_its_bound() {
        let cost = 100 + ENTRY_OVERHEAD;
        let mut ring = FrameRing::new(10 * cost);
        for seq in 1..=25 {
            ring.push(seq, Format::Sbe, &frame(seq, 100));
            assert!(ring.charged() <= ring.limit());
        }
        assert_eq!((ring.first(), ring.next(), ring.len()), (16, 26, 10));
        assert_eq!(ring.lookup(10, 10), Lookup { gone: 6, held: 4, ahead: 0 });
        assert_eq!(ring.lookup(24, 5), Lookup { gone: 0, held: 2, ahead: 3 });
        assert_eq!(ring.lookup(30, 5), Lookup { gone: 0, held: 0, ahead: 5 });
        assert_eq!(ring.lookup(1, 3), Lookup { gone: 3, held: 0, ahead: 0 });
        assert_eq!(
            (ring.frame_len(15), ring.frame_len(16), ring.frame_len(25), ring.frame_len(26)),
            (None, Some(100), Some(100), None)
        );
        let mut out = Vec::new();
        assert_eq!(ring.copy_record(15, 100, 1 << 20, &mut out), None);
        assert_eq!(ring.copy_record(16, 3, 1 << 20, &mut out), Some(19));
        let header = RecordHeader::parse(&out, usize::MAX).unwrap();
        assert_eq!((header.sequence, header.frame_count, header.length), (16, 3, 300));
        assert_eq!(&out[RecordHeader::LEN..RecordHeader::LEN + 100], &frame(16, 100)[..]);
        assert_eq!(&out[RecordHeader::LEN + 200..], &frame(18, 100)[..]);
    }

    #[test]
    fn a_record_holds_one_format_and_at_least_one_frame() {
        let mut ring = FrameRing::new(1 << 20);
        ring.push(1, Format::Sbe, &frame(1, 10));
        ring.push(2, Format::Sbe, &frame(2, 10));
        ring.push(3, Format::Capnp, &frame(3, 10));
        let mut out = Vec::new();
        assert_eq!(ring.copy_record(1, 100, 1 << 20, &mut out), Some(3));
        out.clear();
        // Bigger than the byte budget alone: still sent, one frame per record.
        assert_eq!(ring.copy_record(1, 100, 5, &mut out), Some(2));
        out.clear();
        assert_eq!(ring.copy_record(3, 100, 1 << 20, &mut out), Some(4));
        assert_eq!(RecordHeader::parse(&out, usize::MAX).unwrap().format, Format::Capnp);
    }

    #[test]
    fn a_break_in_the_sequence_starts_over_and_huge_frames_are_not_held() {
        let mut ring = FrameRing::new(1000);
        ring.push(1, Format::Raw, &frame(1, 10));
        ring.push(2, Format::Raw, &frame(2, 10));
        ring.push(7, Format::Raw, &frame(7, 10));
        assert_eq!((ring.first(), ring.len()), (7, 1));
        ring.push(8, Format::Raw, &frame(8, 2000));
        assert_eq!((ring.first(), ring.next(), ring.len()), (9, 9, 0));
        assert_eq!(ring.lookup(8, 1).gone, 1);
        ring.push(9, Format::Raw, &frame(9, 10));
        assert_eq!(ring.lookup(9, 1).held, 1);
    }

    #[test]
    fn chunks_are_let_go_with_their_frames_and_the_spare_is_filled_again() {
        let limit = 4 * CHUNK;
        let mut ring = FrameRing::new(limit);
        for seq in 1..=100_000u64 {
            ring.push(seq, Format::Raw, &frame(seq, 1000));
            // The frames' chunks, plus at most one partly evicted at the head.
            assert!(ring.chunks.len() <= limit / CHUNK + 2, "{} chunks", ring.chunks.len());
        }
        // 100 MB went through: the chunks were let go as their frames were.
        assert!(ring.first_chunk > 90, "{}", ring.first_chunk);
        let mut out = Vec::new();
        let first = ring.first();
        assert_eq!(ring.copy_record(first, 1, usize::MAX, &mut out), Some(first + 1));
        assert_eq!(&out[RecordHeader::LEN..], &frame(first, 1000)[..]);
    }

    #[test]
    fn frames_outlive_their_place_in_the_ring() {
        let mut ring = FrameRing::new(3 * (CHUNK / 2 + ENTRY_OVERHEAD));
        for seq in 1..=10 {
            ring.push(seq, Format::Raw, &frame(seq, CHUNK / 2));
        }
        assert_eq!(ring.len(), 3);
        let mut out = Vec::new();
        ring.copy_record(8, 1, usize::MAX, &mut out).unwrap();
        assert!(out[RecordHeader::LEN..].iter().all(|&b| b == 8));
    }
}
