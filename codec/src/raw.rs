//! The baseline: the IEX-TP segment bytes as they are, behind the publisher's send timestamp.
//!
//! Frame: `publish_time` (i64, little-endian, ns since the epoch), then the segment (40-byte
//! header and its payload). The segment header's payload length delimits the frame on a stream.

use super::format::Format;
use super::frame::{BatchHeader, DecodeError, EncodeError, Limits};
use crate::format_codec::{Batch, FilteredSink, FormatCodec};
use mdrelay_iex::iextp::{self, Segment, SegmentHeader};
use mdrelay_iex::message::{Message, kind, layout_len};

/// Where an IEX message with a symbol has it: after its type, flag and timestamp.
const SYMBOL_AT: usize = 10;

/// Bytes before the segment.
pub const PREFIX_LEN: usize = 8;

/// Raw IEX-TP codec.
#[derive(Debug)]
pub struct RawCodec {
    limits: Limits,
    skipped: u64,
}

impl RawCodec {
    /// A codec with the given limits.
    pub fn new(limits: Limits) -> Self {
        RawCodec { limits, skipped: 0 }
    }

    /// Messages skipped while decoding because they were shorter than their type's layout (raw
    /// frames relay a feed's bytes unchanged, bad messages included), or lost to an overrun.
    pub fn skipped_messages(&self) -> u64 {
        self.skipped
    }

    /// Appends a frame for an IEX-TP segment as received, without re-encoding it.
    pub fn encode_segment(&mut self, publish_time: i64, segment: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&publish_time.to_le_bytes());
        out.extend_from_slice(segment);
    }

    /// Reads the frame's segment and hands each message block to `each`, which says whether it
    /// was a message; the others are counted as skipped.
    #[inline(always)]
    fn walk(&mut self, frame: &[u8], mut each: impl FnMut(&[u8]) -> bool) -> Result<BatchHeader, DecodeError> {
        if frame.len() < PREFIX_LEN {
            return Err(DecodeError::new(Format::Raw, 0, "frame shorter than the 8-byte publish time"));
        }
        let publish_time = i64::from_le_bytes(frame[..PREFIX_LEN].try_into().expect("8 bytes"));
        let segment = Segment::parse(&frame[PREFIX_LEN..])
            .map_err(|e| DecodeError::new(Format::Raw, PREFIX_LEN, e.to_string()))?;
        let mut header = BatchHeader::from_segment(&segment.header);
        header.publish_time = publish_time;
        let mut visited = 0u32;
        for block in segment.blocks() {
            match block.map(&mut each) {
                Ok(true) => visited += 1,
                _ => self.skipped += 1,
            }
        }
        header.message_count = visited;
        Ok(header)
    }
}

impl FormatCodec for RawCodec {
    /// Appends a frame holding a segment built from `messages`.
    fn encode_batch(&mut self, batch: Batch<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let Batch { header, messages, count } = batch;
        out.extend_from_slice(&header.publish_time.to_le_bytes());
        let segment_start = out.len();
        out.resize(segment_start + iextp::HEADER_LEN, 0);
        for (index, message) in messages.iter().enumerate() {
            let len = message.iex_len();
            let Ok(len16) = u16::try_from(len) else {
                return Err(EncodeError::Unrepresentable {
                    format: Format::Raw,
                    index,
                    what: "message longer than 65535 bytes".into(),
                });
            };
            out.extend_from_slice(&len16.to_le_bytes());
            message.write_iex(out);
        }
        let payload = out.len() - segment_start - iextp::HEADER_LEN;
        let Ok(payload_length) = u16::try_from(payload) else {
            return Err(EncodeError::Unrepresentable {
                format: Format::Raw,
                index: messages.len().saturating_sub(1),
                what: "batch larger than an IEX-TP segment's 65535-byte payload".into(),
            });
        };
        let segment_header = SegmentHeader {
            version: 1,
            protocol_id: header.protocol_id,
            channel_id: header.channel_id,
            session_id: header.session_id,
            payload_length,
            message_count: count,
            stream_offset: 0,
            first_sequence: header.first_sequence,
            send_time: header.send_time,
        };
        out[segment_start..segment_start + iextp::HEADER_LEN].copy_from_slice(&segment_header.to_bytes());
        Ok(())
    }

    fn format(&self) -> Format {
        Format::Raw
    }

    /// Length of the first frame in `buf`, from the segment header's payload length.
    fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        if buf.len() < PREFIX_LEN + iextp::HEADER_LEN {
            return Ok(None);
        }
        if buf[PREFIX_LEN] != 1 {
            return Err(DecodeError::new(
                Format::Raw,
                PREFIX_LEN,
                format!("IEX-TP version {}, expected 1", buf[PREFIX_LEN]),
            ));
        }
        let at = PREFIX_LEN + 12;
        let payload = usize::from(u16::from_le_bytes([buf[at], buf[at + 1]]));
        let len = PREFIX_LEN + iextp::HEADER_LEN + payload;
        if len > self.limits.max_frame {
            return Err(DecodeError::new(
                Format::Raw,
                at,
                format!("frame of {len} bytes exceeds the {}-byte limit", self.limits.max_frame),
            ));
        }
        Ok((buf.len() >= len).then_some(len))
    }

    /// Decodes one frame. Messages shorter than their layout are skipped and counted (see
    /// [`RawCodec::skipped_messages`]); unknown types are visited as [`Message::Unknown`].
    fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], mut visit: F) -> Result<BatchHeader, DecodeError> {
        self.walk(frame, |block| match Message::parse(block) {
            Ok(message) => {
                visit(&message);
                true
            }
            Err(_) => false,
        })
    }

    /// Decodes one frame like [`RawCodec::decode`], handing `sink` only the messages of
    /// the symbols it wants. Every IEX message with a symbol has it at byte 10, after its type, flag and
    /// timestamp, so another symbol's message is skipped on those bytes and its length.
    fn decode_to(&mut self, frame: &[u8], sink: &mut impl FilteredSink) -> Result<BatchHeader, DecodeError> {
        self.walk(frame, |block| {
            let Some(&kind) = block.first() else { return false };
            let symbol = block.get(SYMBOL_AT..).and_then(<[u8]>::first_chunk::<8>);
            match (layout_len(kind), symbol) {
                // A known type with a symbol, whole, of another symbol: counted, not decoded.
                (Some(len), Some(symbol)) if kind != kind::SYSTEM_EVENT && block.len() >= len => {
                    if sink.wants(*symbol) {
                        Message::parse(block).map(|m| sink.visit(&m)).is_ok()
                    } else {
                        sink.skip(kind);
                        true
                    }
                }
                _ => Message::parse(block).map(|m| sink.offer(&m)).is_ok(),
            }
        })
    }
}
