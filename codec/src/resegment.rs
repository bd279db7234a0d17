//! A decoded frame back to the IEX-TP segment it carried, whatever its wire format: what a
//! subscriber writes when it records a stream to a capture file.
//!
//! A raw frame holds the segment itself, which is kept byte for byte (stream offset, unknown
//! and malformed messages included). A schema format carries the segment's header fields and
//! its decoded messages, so the segment is built again from those: each message in its
//! documented IEX layout. The schema formats do not carry the stream offset; it is continued
//! from the previous segment of the same session (from the last raw segment's own offset across
//! a format switch), so the recording is consistent with itself: each segment's offset is the
//! previous one's plus its payload length.

use crate::{BatchHeader, Format, raw};
use mdrelay_iex::iextp::{self, SegmentBuilder, SegmentHeader};
use mdrelay_iex::message::Message;

/// The largest segment a capture holds whole as one IPv4 UDP datagram in an Ethernet frame:
/// 65,535 bytes (the snap length captures are written with, beyond which readers cut packets)
/// less the Ethernet, IPv4 and UDP headers.
pub const MAX_SEGMENT: usize = 65_535 - 14 - 20 - 8;

/// Why a decoded frame gives no segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResegmentError {
    /// The segment would not fit one UDP datagram.
    #[error("the segment would be over {MAX_SEGMENT} bytes, more than one captured UDP datagram holds")]
    TooLarge,
    /// A raw frame whose bytes after the publish time are not one IEX-TP segment.
    #[error("the raw frame does not hold one IEX-TP segment: {0}")]
    NotASegment(iextp::SegmentError),
}

/// Rebuilds segments from frames, one frame at a time: [`Resegmenter::begin`], then
/// [`Resegmenter::message`] for each message the decoder visits, then [`Resegmenter::finish`].
/// Its buffers are reused from frame to frame.
#[derive(Debug, Default)]
pub struct Resegmenter {
    builder: SegmentBuilder,
    /// The frame being rebuilt is raw: its messages are not needed.
    raw: bool,
    /// A message did not fit: the frame gives no segment.
    too_large: bool,
    /// The stream offset after the last segment, and that segment's protocol and session.
    next_offset: Option<(u16, u32, i64)>,
}

impl Resegmenter {
    /// A resegmenter with empty buffers.
    pub fn new() -> Self {
        Resegmenter { builder: SegmentBuilder::new(), ..Default::default() }
    }

    /// Starts a frame of `format`.
    #[inline]
    pub fn begin(&mut self, format: Format) {
        self.raw = format == Format::Raw;
        self.too_large = false;
        if !self.raw {
            self.builder.start();
        }
    }

    /// Takes the frame's next decoded message (ignored for a raw frame, whose bytes are kept).
    #[inline]
    pub fn message(&mut self, message: &Message<'_>) {
        if self.raw || self.too_large {
            return;
        }
        // Checked before pushing: the builder counts lengths in u16 and must not be handed more.
        if self.builder.len() + 2 + message.iex_len() > MAX_SEGMENT {
            self.too_large = true;
            return;
        }
        self.builder.push(message);
    }

    /// The segment of the frame begun last: `frame` (the frame's bytes) for a raw frame, else
    /// built from `header` (as the decoder returned it) and the messages taken.
    pub fn finish<'s>(&'s mut self, frame: &'s [u8], header: &BatchHeader) -> Result<&'s [u8], ResegmentError> {
        if self.raw {
            let bytes = frame.get(raw::PREFIX_LEN..).unwrap_or_default();
            let segment = iextp::Segment::parse(bytes).map_err(ResegmentError::NotASegment)?;
            if bytes.len() > MAX_SEGMENT {
                return Err(ResegmentError::TooLarge);
            }
            let h = &segment.header;
            self.next_offset =
                Some((h.protocol_id, h.session_id, h.stream_offset.wrapping_add(i64::from(h.payload_length))));
            return Ok(bytes);
        }
        if self.too_large {
            return Err(ResegmentError::TooLarge);
        }
        if self.builder.len() < iextp::HEADER_LEN {
            // Finished without a begin: an empty segment rather than a slice out of bounds.
            self.builder.start();
        }
        let payload_length = (self.builder.len() - iextp::HEADER_LEN) as i64;
        let stream_offset = match self.next_offset {
            Some((protocol, session, offset)) if (protocol, session) == (header.protocol_id, header.session_id) => {
                offset
            }
            _ => 0,
        };
        self.next_offset = Some((header.protocol_id, header.session_id, stream_offset.wrapping_add(payload_length)));
        let segment = SegmentHeader {
            version: 1,
            protocol_id: header.protocol_id,
            channel_id: header.channel_id,
            session_id: header.session_id,
            // Both set by the builder from what it holds.
            payload_length: 0,
            message_count: 0,
            stream_offset,
            first_sequence: header.first_sequence,
            send_time: header.send_time,
        };
        Ok(self.builder.finish(segment))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Codec, FormatCodec, Limits, MessageScratch, collect_segment};
    use mdrelay_iex::iextp::Segment;
    use mdrelay_iex::message::UnknownMessage;
    use mdrelay_iex::synth::{SynthConfig, SyntheticDay};

    fn frame_of(codec: &mut Codec, segment: &[u8], scratch: &mut MessageScratch) -> Vec<u8> {
        let parsed = Segment::parse(segment).unwrap();
        let mut frame = Vec::new();
        scratch.with(|list| {
            collect_segment(&parsed, list);
            codec.encode_segment(1234, &parsed, segment, list, &mut frame).unwrap();
        });
        frame
    }

    fn resegment(codec: &mut Codec, r: &mut Resegmenter, frame: &[u8]) -> Result<Vec<u8>, ResegmentError> {
        r.begin(codec.format());
        let header = codec.decode(frame, |m| r.message(m)).unwrap();
        r.finish(frame, &header).map(<[u8]>::to_vec)
    }

    #[test]
    fn every_format_gives_back_the_segment_it_carried() {
        let config = SynthConfig { messages: 3_000, symbols: 12, seed: 5, ..SynthConfig::default() };
        let mut day = SyntheticDay::new(config).unwrap();
        let mut segments = Vec::new();
        while let Some(s) = day.next_segment() {
            segments.push(s.bytes.to_vec());
        }
        assert!(segments.iter().any(|s| Segment::parse(s).unwrap().header.is_heartbeat()));
        let mut scratch = MessageScratch::new();
        for format in Format::ALL {
            let mut codec = Codec::new(format, Limits::default());
            let mut r = Resegmenter::new();
            for (i, segment) in segments.iter().enumerate() {
                let frame = frame_of(&mut codec, segment, &mut scratch);
                // Synthetic messages are in their documented layouts and the day's offsets
                // start at 0 and run on, so even the schema formats give back every byte.
                let back = resegment(&mut codec, &mut r, &frame).unwrap();
                assert_eq!(back, *segment, "{format}: segment {i}");
            }
        }
    }

    #[test]
    fn a_raw_frame_is_kept_byte_for_byte_and_its_offset_continues_after_a_switch() {
        let mut b = SegmentBuilder::new();
        b.start();
        let odd = Message::Unknown(UnknownMessage { kind: b'z', bytes: b"zabc" });
        b.push(&odd);
        let header = SegmentHeader {
            version: 1,
            protocol_id: iextp::protocol::DEEP,
            session_id: 7,
            stream_offset: 1000,
            first_sequence: 40,
            send_time: 9,
            ..Default::default()
        };
        let segment = b.finish(header).to_vec();
        let mut raw = Codec::new(Format::Raw, Limits::default());
        let mut sbe = Codec::new(Format::Sbe, Limits::default());
        let mut scratch = MessageScratch::new();
        let mut r = Resegmenter::new();
        let raw_frame = frame_of(&mut raw, &segment, &mut scratch);
        assert_eq!(resegment(&mut raw, &mut r, &raw_frame).unwrap(), segment);
        // The same session in SBE next: its offset follows the raw segment's 6 payload bytes.
        let sbe_frame = frame_of(&mut sbe, &segment, &mut scratch);
        let back = resegment(&mut sbe, &mut r, &sbe_frame).unwrap();
        let parsed = Segment::parse(&back).unwrap();
        assert_eq!(parsed.header.stream_offset, 1006);
        assert_eq!((parsed.header.session_id, parsed.header.first_sequence, parsed.header.send_time), (7, 40, 9));
        // Another session starts its offsets over.
        let other = SegmentHeader { session_id: 8, ..header };
        let other = b.finish(other).to_vec();
        let frame = frame_of(&mut sbe, &other, &mut scratch);
        assert_eq!(Segment::parse(&resegment(&mut sbe, &mut r, &frame).unwrap()).unwrap().header.stream_offset, 0);
    }

    #[test]
    fn a_frame_too_large_for_a_datagram_gives_an_error_not_a_wrong_segment() {
        let big = vec![b'z'; 60_000];
        let mut r = Resegmenter::new();
        r.begin(Format::Sbe);
        let message = Message::Unknown(UnknownMessage { kind: b'z', bytes: &big });
        r.message(&message);
        r.message(&message);
        let header = BatchHeader { protocol_id: iextp::protocol::DEEP, ..BatchHeader::default() };
        assert_eq!(r.finish(&[], &header), Err(ResegmentError::TooLarge));
        // The next frame starts clean.
        r.begin(Format::Sbe);
        r.message(&message);
        assert_eq!(Segment::parse(r.finish(&[], &header).unwrap()).unwrap().header.message_count, 1);
        // A raw frame too short to hold a segment is refused, not sliced out of bounds.
        r.begin(Format::Raw);
        assert!(matches!(r.finish(&[1, 2, 3], &header), Err(ResegmentError::NotASegment(_))));
    }
}
