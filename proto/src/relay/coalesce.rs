//! Grouping frames into TCP records and UDP datagrams: one algorithm for both.
//!
//! Frames of one format go back to back behind the envelope's header, up to a byte budget and
//! the envelope's frame-count limit; a frame of another format, or one that would not fit, seals
//! the envelope first. A budget of 0 seals every frame on its own. Sealed envelopes are handed
//! over as [`Bytes`] split off a reused buffer: the TCP fanout shares one record between every
//! subscriber without copying, and once every holder has dropped it the buffer's space is reused,
//! so steady state allocates nothing.
//!
//! A coalescer can also hand envelopes over in runs ([`Coalescer::with_runs`]): consecutive
//! sealed envelopes of one format, back to back in one [`Bytes`]. A TCP stream is a byte stream,
//! so a run is written as is; handing the fanout one run instead of one record per frame takes
//! its per-record costs (a queue slot, a wake-up check, reference counts) once per run. Runs end
//! at a flush, so a paced stream's frames leave as soon as they did one by one.

use super::protect::Protection;
use super::wire::{
    DATAGRAM_VERSION, DatagramHeader, DatagramKind, MAX_DATAGRAM, MAX_RECORD, RecordHeader, RecordTag,
    WIDE_DATAGRAM_VERSION,
};
use bytes::{Buf, Bytes, BytesMut};
use mdrelay_codec::Format;

/// The relay framing frames are grouped into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Envelope {
    /// A TCP `DATA` record: [`RecordHeader`], up to 65,535 frames.
    Record,
    /// A `DATA` datagram of this publisher session (UDP, or a NATS message): [`DatagramHeader`]
    /// in version 1 up to 255 frames, in version 2 beyond (unless the coalescer is held to
    /// version 1).
    Datagram {
        /// The publisher's session, in every header.
        session: u64,
        /// The frames' protection, flagged in every header.
        protection: Protection,
    },
}

impl Envelope {
    /// Header bytes before the frames of an envelope of one frame (a datagram's version 1).
    pub const fn header_len(self) -> usize {
        match self {
            Envelope::Record => RecordHeader::LEN,
            Envelope::Datagram { .. } => DatagramHeader::LEN,
        }
    }

    /// Header bytes before `frames` frames, when a datagram may be written in version 2.
    const fn header_len_for(self, frames: usize, wide: bool) -> usize {
        match self {
            Envelope::Datagram { .. } if wide && frames > u8::MAX as usize => DatagramHeader::WIDE_LEN,
            _ => self.header_len(),
        }
    }

    /// Largest envelope, header included.
    pub const fn max_len(self) -> usize {
        match self {
            Envelope::Record => RecordHeader::LEN + MAX_RECORD,
            Envelope::Datagram { .. } => MAX_DATAGRAM,
        }
    }

    /// Writes the header of `frames` frames at the start of `out` (header and frames), which
    /// is `header_len_for(frames, wide)` bytes.
    fn write_header(self, out: &mut [u8], format: Format, first_sequence: u64, frames: usize, wide: bool) {
        let payload = out.len() - self.header_len_for(frames, wide);
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
            Envelope::Datagram { session, protection } => {
                let wide = wide && frames > usize::from(u8::MAX);
                let header = DatagramHeader {
                    version: if wide { WIDE_DATAGRAM_VERSION } else { DATAGRAM_VERSION },
                    format,
                    kind: DatagramKind::Data,
                    frame_count: u32::try_from(frames).unwrap_or(u32::MAX),
                    protection,
                    session,
                    sequence: first_sequence,
                };
                let bytes = header.to_bytes();
                out[..bytes.len()].copy_from_slice(&bytes);
            }
        }
    }
}

/// A finished record or datagram, or a run of consecutive records of one format.
#[derive(Clone, Debug)]
pub struct Sealed {
    /// Header and frames (headers and frames, for a run).
    pub bytes: Bytes,
    /// The frames' format.
    pub format: Format,
    /// Sequence number of the first frame.
    pub first_sequence: u64,
    /// Frames in it.
    pub frames: u64,
    /// Envelopes in it: 1, or more for a run.
    pub envelopes: u64,
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

/// A run ends once it holds this many bytes (so it is at most this plus one record). Runs are
/// for many small records: 1 KiB takes a dozen frame-sized records, which is most of the gain
/// measured with 64 KiB runs, and a queue of runs a stalled subscriber keeps unread stays small.
pub const MAX_RUN_BYTES: usize = 1 << 10;

/// Groups frames into envelopes of one kind.
#[derive(Debug)]
pub struct Coalescer {
    envelope: Envelope,
    /// Largest envelope to build (header included), or 0 for one frame per envelope.
    budget: usize,
    buf: BytesMut,
    /// Where the envelope being built starts in `buf`: after the run's sealed envelopes.
    start: usize,
    frames: usize,
    first_sequence: u64,
    format: Format,
    /// Whether a datagram of more than 255 frames is written in header version 2 (else
    /// datagrams hold at most 255 frames).
    wide: bool,
    /// Header bytes kept before the frames of the envelope being built: as many as its header
    /// can grow to. A datagram that ends up in version 1 starts `reserved - 24` bytes in.
    reserved: usize,
    /// Bytes before the first envelope of the run being handed over that are not part of it.
    skip: usize,
    /// Sealed envelopes handed over together (1: each on its own).
    run_limit: usize,
    /// Sealed envelopes waiting in `buf`, their frames, first frame and format.
    run_envelopes: usize,
    run_frames: u64,
    run_first: u64,
    run_format: Format,
}

impl Coalescer {
    /// A coalescer for `envelope` filling envelopes up to `budget` bytes, header included (0:
    /// one frame each; larger than the envelope allows: the envelope's limit).
    pub fn new(envelope: Envelope, budget: usize) -> Coalescer {
        Coalescer {
            envelope,
            budget: budget.min(envelope.max_len()),
            buf: BytesMut::with_capacity(budget.clamp(64 << 10, 1 << 20)),
            start: 0,
            frames: 0,
            first_sequence: 0,
            format: Format::Raw,
            wide: true,
            reserved: envelope.header_len_for(usize::MAX, true),
            skip: 0,
            run_limit: 1,
            run_envelopes: 0,
            run_frames: 0,
            run_first: 0,
            run_format: Format::Raw,
        }
    }

    /// Hands sealed envelopes over in runs of up to `envelopes` (and [`MAX_RUN_BYTES`]) instead
    /// of one by one; a run also ends at a flush, a format change or a break in the sequence.
    /// Only for a byte stream: a datagram must stay one envelope.
    pub fn with_runs(mut self, envelopes: usize) -> Coalescer {
        self.run_limit = envelopes.max(1);
        self
    }

    /// Writes datagrams in header version 1 only, at most 255 frames each, for receivers that
    /// read no other (`false`); by default a datagram of more frames is written in version 2.
    pub fn with_wide_datagrams(mut self, wide: bool) -> Coalescer {
        self.wide = wide;
        self.reserved = self.envelope.header_len_for(usize::MAX, wide);
        self
    }

    /// The envelope this coalescer fills.
    pub fn envelope(&self) -> Envelope {
        self.envelope
    }

    /// Most frames one envelope can declare.
    fn max_frames(&self) -> usize {
        match self.envelope {
            Envelope::Record => u16::MAX.into(),
            Envelope::Datagram { .. } if self.wide => usize::try_from(u32::MAX).unwrap_or(usize::MAX),
            Envelope::Datagram { .. } => u8::MAX.into(),
        }
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
        let payload = (self.buf.len() - self.start).saturating_sub(self.reserved);
        let joins = self.frames > 0
            && format == self.format
            && self.frames < self.max_frames()
            && self.envelope.header_len_for(self.frames + 1, self.wide) + payload + frame.len() <= self.budget
            && sequence == self.first_sequence.saturating_add(self.frames as u64);
        if self.frames > 0 && !joins {
            self.seal(&mut sealed);
        }
        // A run holds consecutive frames of one format.
        if self.run_envelopes > 0
            && (format != self.run_format || sequence != self.run_first.saturating_add(self.run_frames))
        {
            self.hand_over(&mut sealed);
        }
        if self.frames == 0 {
            if self.run_envelopes == 0 {
                self.buf.clear();
                self.start = 0;
            }
            self.buf.resize(self.start + self.reserved, 0);
            self.first_sequence = sequence;
            self.format = format;
        }
        self.buf.extend_from_slice(frame);
        self.frames += 1;
        if self.budget == 0 {
            self.seal(&mut sealed);
        }
        Ok(())
    }

    /// Seals the envelope being built, if it holds any frame, and hands it over with the run
    /// before it.
    pub fn flush(&mut self, mut sealed: impl FnMut(Sealed)) {
        if self.frames > 0 {
            self.seal(&mut sealed);
        }
        self.hand_over(&mut sealed);
    }

    /// Closes the envelope being built into the run; hands the run over when it is full.
    fn seal(&mut self, sealed: &mut impl FnMut(Sealed)) {
        let unused = self.reserved - self.envelope.header_len_for(self.frames, self.wide);
        let at = self.start + unused;
        self.envelope.write_header(&mut self.buf[at..], self.format, self.first_sequence, self.frames, self.wide);
        if self.run_envelopes == 0 {
            // Runs are of records, whose header is always the reserved length: only a run's
            // first envelope can start in.
            self.skip = unused;
            self.run_first = self.first_sequence;
            self.run_format = self.format;
        }
        self.run_envelopes += 1;
        self.run_frames += self.frames as u64;
        self.frames = 0;
        self.start = self.buf.len();
        if self.run_envelopes >= self.run_limit || self.buf.len() >= MAX_RUN_BYTES {
            self.hand_over(sealed);
        }
    }

    /// Hands over the sealed envelopes waiting, if any.
    fn hand_over(&mut self, sealed: &mut impl FnMut(Sealed)) {
        if self.run_envelopes == 0 {
            return;
        }
        let mut bytes = self.buf.split_to(self.start).freeze();
        bytes.advance(self.skip);
        let run = Sealed {
            bytes,
            format: self.run_format,
            first_sequence: self.run_first,
            frames: self.run_frames,
            envelopes: self.run_envelopes as u64,
        };
        self.start = 0;
        self.skip = 0;
        self.run_envelopes = 0;
        self.run_frames = 0;
        sealed(run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record header's bytes.
    const H: usize = RecordHeader::LEN;

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
        let mut c = Coalescer::new(Envelope::Datagram { session: 77, protection: Protection::NONE }, 0);
        let sealed = collect(&mut c, &[(5, Format::Raw, 10), (6, Format::Raw, 10)]);
        assert_eq!(sealed.len(), 2);
        let h = DatagramHeader::parse(&sealed[1].bytes).unwrap();
        assert_eq!((h.session, h.sequence, h.frame_count, h.kind), (77, 6, 1, DatagramKind::Data));
    }

    #[test]
    fn runs_hold_consecutive_records_of_one_format_back_to_back() {
        let mut c = Coalescer::new(Envelope::Record, 0).with_runs(3);
        let sealed = collect(
            &mut c,
            &[
                (1, Format::Sbe, 10),
                (2, Format::Sbe, 11),
                (3, Format::Sbe, 12),
                (4, Format::Sbe, 13),
                (5, Format::Capnp, 14),
                (7, Format::Capnp, 15),
                (8, Format::Capnp, 16),
            ],
        );
        let shape: Vec<_> =
            sealed.iter().map(|s| (s.first_sequence, s.frames, s.envelopes, s.format, s.bytes.len())).collect();
        assert_eq!(
            shape,
            vec![
                (1, 3, 3, Format::Sbe, 3 * H + 33),
                (4, 1, 1, Format::Sbe, H + 13),
                (5, 1, 1, Format::Capnp, H + 14),
                (7, 2, 2, Format::Capnp, 2 * H + 31),
            ]
        );
        // Each record of a run is whole: header, then its frame.
        let run = &sealed[0].bytes;
        let mut at = 0;
        for (seq, len) in [(1u64, 10usize), (2, 11), (3, 12)] {
            let h = RecordHeader::parse(&run[at..], MAX_RECORD).unwrap();
            assert_eq!((h.sequence, h.frame_count, h.length as usize), (seq, 1, len));
            assert!(run[at + H..at + H + len].iter().all(|&b| b == seq as u8));
            at += H + len;
        }
        assert_eq!(at, run.len());
        assert_eq!(sealed[3].next_sequence(), 9);
    }

    #[test]
    fn a_run_of_one_is_the_envelope_alone_and_a_run_stops_at_its_byte_limit() {
        let frames: Vec<_> = (1..=40).map(|s| (s, Format::Sbe, 20)).collect();
        let single = collect(&mut Coalescer::new(Envelope::Record, 0), &frames);
        assert_eq!(single.len(), 40);
        assert!(single.iter().all(|s| s.envelopes == 1 && s.bytes.len() == H + 20));
        let mut c = Coalescer::new(Envelope::Record, 0).with_runs(usize::MAX);
        let big: Vec<_> = (1..=100).map(|s| (s, Format::Sbe, 100)).collect();
        let runs = collect(&mut c, &big);
        assert!(runs.iter().all(|r| r.bytes.len() < MAX_RUN_BYTES + H + 100), "{:?}", runs.len());
        assert_eq!(runs.iter().map(|r| r.frames).sum::<u64>(), 100);
        // The first record that takes the run to the limit or past it ends the run.
        assert_eq!(runs[0].envelopes as usize, MAX_RUN_BYTES.div_ceil(H + 100));
    }

    #[test]
    fn the_frame_count_limit_and_the_largest_envelope_hold() {
        let envelope = Envelope::Datagram { session: 1, protection: Protection::NONE };
        let mut c = Coalescer::new(envelope, 60_000).with_wide_datagrams(false);
        let frames: Vec<_> = (1..=300).map(|s| (s, Format::Sbe, 1)).collect();
        let sealed = collect(&mut c, &frames);
        assert_eq!(sealed.iter().map(|s| s.frames).collect::<Vec<_>>(), vec![255, 45]);
        for s in &sealed {
            let h = DatagramHeader::parse(&s.bytes).unwrap();
            assert_eq!((h.version, h.frame_count as u64), (DATAGRAM_VERSION, s.frames));
            assert_eq!(s.bytes.len(), DatagramHeader::LEN + s.frames as usize);
        }
        let big = vec![0u8; MAX_DATAGRAM];
        assert!(c.push(1, Format::Sbe, &big, |_| panic!("nothing sealed")).is_err());
        assert_eq!(c.pending_frames(), 0);
    }

    #[test]
    fn a_datagram_of_more_than_255_frames_is_written_in_version_2_and_fewer_in_version_1() {
        let envelope = Envelope::Datagram { session: 9, protection: Protection::NONE };
        let mut c = Coalescer::new(envelope, 60_000);
        let frames: Vec<_> = (1..=300).map(|s| (s, Format::Sbe, 2)).chain([(301, Format::Capnp, 2)]).collect();
        let sealed = collect(&mut c, &frames);
        assert_eq!(sealed.iter().map(|s| s.frames).collect::<Vec<_>>(), vec![300, 1]);
        let wide = DatagramHeader::parse(&sealed[0].bytes).unwrap();
        assert_eq!((wide.version, wide.frame_count, wide.session, wide.sequence), (WIDE_DATAGRAM_VERSION, 300, 9, 1));
        assert_eq!(wide.len_on_wire(), DatagramHeader::WIDE_LEN);
        assert_eq!(&sealed[0].bytes[..wide.len_on_wire()], &wide.to_bytes()[..], "the header as written");
        let payload = &sealed[0].bytes[DatagramHeader::WIDE_LEN..];
        let expected: Vec<u8> = (1..=300u64).flat_map(|s| [s as u8; 2]).collect();
        assert_eq!(payload, &expected[..], "every frame, in order, right after the header");
        let narrow = DatagramHeader::parse(&sealed[1].bytes).unwrap();
        assert_eq!((narrow.version, narrow.frame_count, narrow.sequence), (DATAGRAM_VERSION, 1, 301));
        assert_eq!(sealed[1].bytes.len(), DatagramHeader::LEN + 2, "version 1 is as it always was");
    }

    #[test]
    fn the_wider_header_counts_against_the_budget() {
        // 255 frames of 10 bytes fill a version-1 datagram to 2,574 bytes; the 256th needs 10
        // bytes more and a header 8 bytes longer.
        let envelope = Envelope::Datagram { session: 1, protection: Protection::NONE };
        for (budget, expected) in [(2_584, vec![255, 45]), (2_592, vec![256, 44])] {
            let mut c = Coalescer::new(envelope, budget);
            let frames: Vec<_> = (1..=300).map(|s| (s, Format::Sbe, 10)).collect();
            let sealed = collect(&mut c, &frames);
            assert_eq!(sealed.iter().map(|s| s.frames).collect::<Vec<_>>(), expected, "budget {budget}");
            assert!(sealed.iter().all(|s| s.bytes.len() <= budget), "budget {budget}");
        }
    }
}
