//! Grouping frames into TCP records and UDP datagrams: one algorithm for both.
//!
//! Frames of one format go back to back behind the envelope's header, up to a byte budget and
//! the envelope's frame-count limit; a frame of another format, or one that would not fit, seals
//! the envelope first. A budget of 0 seals every frame on its own. Sealed envelopes are handed
//! over as [`Bytes`] split off a reused buffer: the TCP fanout shares one record between every
//! subscriber without copying, and once every holder has dropped it the buffer's space is reused,
//! so steady state allocates nothing.

use super::wire::{DATAGRAM_VERSION, DatagramHeader, DatagramKind, MAX_DATAGRAM, MAX_RECORD, RecordHeader, RecordTag};
use crate::codec::Format;
use bytes::{Bytes, BytesMut};

/// The relay framing frames are grouped into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Envelope {
    /// A TCP `DATA` record: [`RecordHeader`], up to 65,535 frames.
    Record,
    /// A UDP `DATA` datagram of this publisher session: [`DatagramHeader`], up to 255 frames.
    Datagram {
        /// The publisher's session, in every header.
        session: u64,
    },
}

impl Envelope {
    /// Header bytes before the frames.
    pub const fn header_len(self) -> usize {
        match self {
            Envelope::Record => RecordHeader::LEN,
            Envelope::Datagram { .. } => DatagramHeader::LEN,
        }
    }

    /// Most frames one envelope can declare.
    pub const fn max_frames(self) -> usize {
        match self {
            Envelope::Record => u16::MAX as usize,
            Envelope::Datagram { .. } => u8::MAX as usize,
        }
    }

    /// Largest envelope, header included.
    pub const fn max_len(self) -> usize {
        match self {
            Envelope::Record => RecordHeader::LEN + MAX_RECORD,
            Envelope::Datagram { .. } => MAX_DATAGRAM,
        }
    }

    fn write_header(self, out: &mut [u8], format: Format, first_sequence: u64, frames: usize) {
        let payload = out.len() - self.header_len();
        match self {
            Envelope::Record => {
                let header = RecordHeader {
                    tag: RecordTag::Data,
                    format,
                    frame_count: u16::try_from(frames).unwrap_or(u16::MAX),
                    length: u32::try_from(payload).unwrap_or(u32::MAX),
                    sequence: first_sequence,
                };
                out[..RecordHeader::LEN].copy_from_slice(&header.to_bytes());
            }
            Envelope::Datagram { session } => {
                let header = DatagramHeader {
                    version: DATAGRAM_VERSION,
                    format,
                    kind: DatagramKind::Data,
                    frame_count: u8::try_from(frames).unwrap_or(u8::MAX),
                    session,
                    sequence: first_sequence,
                };
                out[..DatagramHeader::LEN].copy_from_slice(&header.to_bytes());
            }
        }
    }
}

/// A finished record or datagram.
#[derive(Clone, Debug)]
pub struct Sealed {
    /// Header and frames.
    pub bytes: Bytes,
    /// The frames' format.
    pub format: Format,
    /// Sequence number of the first frame.
    pub first_sequence: u64,
    /// Frames in it.
    pub frames: u64,
}

impl Sealed {
    /// Sequence number of the frame after the last one in it.
    pub fn next_sequence(&self) -> u64 {
        self.first_sequence.saturating_add(self.frames)
    }
}

/// A frame that cannot travel in this envelope at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a frame of {len} bytes does not fit a {envelope:?} (at most {max} bytes with the header)")]
pub struct FrameTooLarge {
    /// The frame's length.
    pub len: usize,
    /// The envelope.
    pub envelope: Envelope,
    /// The envelope's largest size.
    pub max: usize,
}

/// Groups frames into envelopes of one kind.
#[derive(Debug)]
pub struct Coalescer {
    envelope: Envelope,
    /// Largest envelope to build (header included), or 0 for one frame per envelope.
    budget: usize,
    buf: BytesMut,
    frames: usize,
    first_sequence: u64,
    format: Format,
}

impl Coalescer {
    /// A coalescer for `envelope` filling envelopes up to `budget` bytes, header included (0:
    /// one frame each; larger than the envelope allows: the envelope's limit).
    pub fn new(envelope: Envelope, budget: usize) -> Coalescer {
        Coalescer {
            envelope,
            budget: budget.min(envelope.max_len()),
            buf: BytesMut::with_capacity(budget.clamp(64 << 10, 1 << 20)),
            frames: 0,
            first_sequence: 0,
            format: Format::Raw,
        }
    }

    /// The envelope this coalescer fills.
    pub fn envelope(&self) -> Envelope {
        self.envelope
    }

    /// Frames waiting in the envelope being built.
    pub fn pending_frames(&self) -> usize {
        self.frames
    }

    /// Adds frame `sequence`; hands over every envelope this seals (the one being built, when the
    /// frame does not join it, and the frame's own when the budget is 0).
    pub fn push(
        &mut self,
        sequence: u64,
        format: Format,
        frame: &[u8],
        mut sealed: impl FnMut(Sealed),
    ) -> Result<(), FrameTooLarge> {
        let header = self.envelope.header_len();
        if header + frame.len() > self.envelope.max_len() {
            return Err(FrameTooLarge { len: frame.len(), envelope: self.envelope, max: self.envelope.max_len() });
        }
        let joins = self.frames > 0
            && format == self.format
            && self.frames < self.envelope.max_frames()
            && self.buf.len() + frame.len() <= self.budget
            && sequence == self.first_sequence.saturating_add(self.frames as u64);
        if self.frames > 0 && !joins {
            self.flush(&mut sealed);
        }
        if self.frames == 0 {
            self.buf.clear();
            self.buf.resize(header, 0);
            self.first_sequence = sequence;
            self.format = format;
        }
        self.buf.extend_from_slice(frame);
        self.frames += 1;
        if self.budget == 0 {
            self.flush(&mut sealed);
        }
        Ok(())
    }

    /// Seals the envelope being built, if it holds any frame.
    pub fn flush(&mut self, mut sealed: impl FnMut(Sealed)) {
        if self.frames == 0 {
            return;
        }
        self.envelope.write_header(&mut self.buf, self.format, self.first_sequence, self.frames);
        let frames = self.frames as u64;
        self.frames = 0;
        sealed(Sealed {
            bytes: self.buf.split().freeze(),
            format: self.format,
            first_sequence: self.first_sequence,
            frames,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(c: &mut Coalescer, frames: &[(u64, Format, usize)]) -> Vec<Sealed> {
        let mut out = Vec::new();
        for &(seq, format, len) in frames {
            c.push(seq, format, &vec![seq as u8; len], |s| out.push(s)).unwrap();
        }
        c.flush(|s| out.push(s));
        out
    }

    #[test]
    fn frames_group_up_to_the_budget_and_split_on_format_or_a_break_in_sequence() {
        let mut c = Coalescer::new(Envelope::Record, 16 + 100);
        let sealed = collect(
            &mut c,
            &[
                (1, Format::Sbe, 40),
                (2, Format::Sbe, 40),
                (3, Format::Sbe, 40),
                (4, Format::Capnp, 8),
                (6, Format::Capnp, 8),
            ],
        );
        let shape: Vec<_> = sealed.iter().map(|s| (s.first_sequence, s.frames, s.format, s.bytes.len())).collect();
        assert_eq!(
            shape,
            vec![
                (1, 2, Format::Sbe, 96),
                (3, 1, Format::Sbe, 56),
                (4, 1, Format::Capnp, 24),
                (6, 1, Format::Capnp, 24)
            ]
        );
        let h = RecordHeader::parse(&sealed[0].bytes, MAX_RECORD).unwrap();
        assert_eq!((h.tag, h.frame_count, h.length, h.sequence), (RecordTag::Data, 2, 80, 1));
        assert_eq!(sealed[0].next_sequence(), 3);
    }

    #[test]
    fn a_zero_budget_seals_every_frame_and_datagrams_carry_the_session() {
        let mut c = Coalescer::new(Envelope::Datagram { session: 77 }, 0);
        let sealed = collect(&mut c, &[(5, Format::Raw, 10), (6, Format::Raw, 10)]);
        assert_eq!(sealed.len(), 2);
        let h = DatagramHeader::parse(&sealed[1].bytes).unwrap();
        assert_eq!((h.session, h.sequence, h.frame_count, h.kind), (77, 6, 1, DatagramKind::Data));
    }

    #[test]
    fn the_frame_count_limit_and_the_largest_envelope_hold() {
        let mut c = Coalescer::new(Envelope::Datagram { session: 1 }, 60_000);
        let frames: Vec<_> = (1..=300).map(|s| (s, Format::Sbe, 1)).collect();
        let sealed = collect(&mut c, &frames);
        assert_eq!(sealed.iter().map(|s| s.frames).collect::<Vec<_>>(), vec![255, 45]);
        let big = vec![0u8; MAX_DATAGRAM];
        assert!(c.push(1, Format::Sbe, &big, |_| panic!("nothing sealed")).is_err());
        assert_eq!(c.pending_frames(), 0);
    }
}
