//! IEX-TP v1 transport: the 40-byte segment header and the length-prefixed message blocks after it.

use nom::Parser;
use nom::number::complete::{le_i64, le_u8, le_u16, le_u32};

/// Bytes in a segment header.
pub const HEADER_LEN: usize = 40;

/// Message protocol ids carried in the segment header.
pub mod protocol {
    /// TOPS 1.6.
    pub const TOPS: u16 = 0x8003;
    /// DEEP 1.0.
    pub const DEEP: u16 = 0x8004;
    /// DEEP+ (order by order).
    pub const DEEP_PLUS: u16 = 0x8005;

    /// A short name for a protocol id, for logs and reports.
    pub fn name(id: u16) -> &'static str {
        match id {
            TOPS => "TOPS",
            DEEP => "DEEP",
            DEEP_PLUS => "DEEP+",
            _ => "unknown",
        }
    }
}

/// The IEX-TP v1 segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SegmentHeader {
    /// Always 1.
    pub version: u8,
    /// Message protocol id, see [`protocol`].
    pub protocol_id: u16,
    /// Channel id.
    pub channel_id: u32,
    /// Session id; sequence numbers are per session.
    pub session_id: u32,
    /// Bytes after the header.
    pub payload_length: u16,
    /// Messages in the segment; 0 is a heartbeat.
    pub message_count: u16,
    /// Byte offset of this payload in the session's stream.
    pub stream_offset: i64,
    /// Sequence number of the first message (for a heartbeat, of the next message).
    pub first_sequence: i64,
    /// Send time, nanoseconds since the Unix epoch.
    pub send_time: i64,
}

impl SegmentHeader {
    /// The header in its wire layout.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.version;
        b[2..4].copy_from_slice(&self.protocol_id.to_le_bytes());
        b[4..8].copy_from_slice(&self.channel_id.to_le_bytes());
        b[8..12].copy_from_slice(&self.session_id.to_le_bytes());
        b[12..14].copy_from_slice(&self.payload_length.to_le_bytes());
        b[14..16].copy_from_slice(&self.message_count.to_le_bytes());
        b[16..24].copy_from_slice(&self.stream_offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.first_sequence.to_le_bytes());
        b[32..40].copy_from_slice(&self.send_time.to_le_bytes());
        b
    }

    /// Appends the header in its wire layout.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes());
    }

    /// True for a segment with no messages.
    pub fn is_heartbeat(&self) -> bool {
        self.message_count == 0
    }
}

/// Why a UDP payload is not an IEX-TP segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    /// Fewer than 40 bytes.
    #[error("{len} bytes is too short for an IEX-TP header (40)")]
    TooShort {
        /// The payload's length.
        len: usize,
    },
    /// A version other than 1.
    #[error("IEX-TP version {version}, expected 1")]
    Version {
        /// The version byte.
        version: u8,
    },
    /// The header's payload length disagrees with the UDP payload.
    #[error("header says {header} payload bytes, the UDP payload has {actual}")]
    LengthMismatch {
        /// The header's payload length.
        header: u16,
        /// Bytes after the header in the UDP payload.
        actual: usize,
    },
}

/// A parsed segment: the header and the payload it borrows.
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    /// The header.
    pub header: SegmentHeader,
    /// The message blocks, after the header.
    pub payload: &'a [u8],
}

#[inline]
fn header(input: &[u8]) -> nom::IResult<&[u8], SegmentHeader> {
    let (rest, (version, _reserved, protocol_id, channel_id, session_id)) =
        (le_u8, le_u8, le_u16, le_u32, le_u32).parse(input)?;
    let (rest, (payload_length, message_count, stream_offset, first_sequence, send_time)) =
        (le_u16, le_u16, le_i64, le_i64, le_i64).parse(rest)?;
    let header = SegmentHeader {
        version,
        protocol_id,
        channel_id,
        session_id,
        payload_length,
        message_count,
        stream_offset,
        first_sequence,
        send_time,
    };
    Ok((rest, header))
}

impl<'a> Segment<'a> {
    /// Parses a UDP payload as a segment; the whole payload must be the segment.
    #[inline]
    pub fn parse(udp_payload: &'a [u8]) -> Result<Segment<'a>, SegmentError> {
        let Ok((payload, header)) = header(udp_payload) else {
            return Err(SegmentError::TooShort { len: udp_payload.len() });
        };
        if header.version != 1 {
            return Err(SegmentError::Version { version: header.version });
        }
        if usize::from(header.payload_length) != payload.len() {
            return Err(SegmentError::LengthMismatch { header: header.payload_length, actual: payload.len() });
        }
        Ok(Segment { header, payload })
    }

    /// The message blocks, each the bytes after its u16 length prefix.
    pub fn blocks(&self) -> Blocks<'a> {
        Blocks { payload: self.payload, offset: 0 }
    }
}

/// A message block whose length prefix runs past the end of the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("message length {length} at payload offset {offset} runs past the segment ({available} bytes left)")]
pub struct BlockOverrun {
    /// Offset of the length prefix within the payload.
    pub offset: usize,
    /// The length prefix.
    pub length: usize,
    /// Bytes after the prefix.
    pub available: usize,
}

/// Iterator over a segment's message blocks. After an overrun it yields nothing more: without a
/// trustworthy length the next boundary cannot be found.
#[derive(Clone, Debug)]
pub struct Blocks<'a> {
    payload: &'a [u8],
    offset: usize,
}

impl<'a> Blocks<'a> {
    /// Offset within the payload of the next length prefix.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

impl<'a> Iterator for Blocks<'a> {
    type Item = Result<&'a [u8], BlockOverrun>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.payload.get(self.offset..)?;
        if rest.len() < 2 {
            // A stray single byte is padding at most; a real block needs its prefix.
            self.offset = self.payload.len();
            return None;
        }
        let length = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        let body = &rest[2..];
        if length > body.len() {
            let overrun = BlockOverrun { offset: self.offset, length, available: body.len() };
            self.offset = self.payload.len();
            return Some(Err(overrun));
        }
        self.offset += 2 + length;
        Some(Ok(&body[..length]))
    }
}

/// Builds segments into a reusable buffer: header, then length-prefixed messages.
#[derive(Debug, Default)]
pub struct SegmentBuilder {
    buf: Vec<u8>,
    count: u16,
}

impl SegmentBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        SegmentBuilder { buf: Vec::with_capacity(1500), count: 0 }
    }

    /// Starts a segment, discarding anything built before.
    pub fn start(&mut self) {
        self.buf.clear();
        self.buf.resize(HEADER_LEN, 0);
        self.count = 0;
    }

    /// Bytes in the segment so far, header included.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when no message was added since [`SegmentBuilder::start`].
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Messages added so far.
    pub fn message_count(&self) -> u16 {
        self.count
    }

    /// Appends one message with its length prefix.
    pub fn push(&mut self, message: &crate::message::Message<'_>) {
        let len = message.iex_len() as u16;
        self.buf.extend_from_slice(&len.to_le_bytes());
        let before = self.buf.len();
        message.write_iex(&mut self.buf);
        debug_assert_eq!(self.buf.len() - before, usize::from(len));
        self.count += 1;
    }

    /// Writes `header` (its payload length and message count set from what was built) and returns
    /// the finished segment.
    pub fn finish(&mut self, mut header: SegmentHeader) -> &[u8] {
        header.payload_length = (self.buf.len() - HEADER_LEN) as u16;
        header.message_count = self.count;
        self.buf[..HEADER_LEN].copy_from_slice(&header.to_bytes());
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, SystemEvent};

    #[test]
    fn builds_and_parses_a_segment() {
        let mut b = SegmentBuilder::new();
        b.start();
        let m = Message::SystemEvent(SystemEvent { event: b'O', timestamp: 7 });
        b.push(&m);
        b.push(&m);
        let header = SegmentHeader {
            version: 1,
            protocol_id: protocol::DEEP,
            session_id: 9,
            first_sequence: 1,
            send_time: 42,
            ..Default::default()
        };
        let bytes = b.finish(header).to_vec();
        let seg = Segment::parse(&bytes).unwrap();
        assert_eq!(seg.header.message_count, 2);
        assert_eq!(seg.header.payload_length, 24);
        assert_eq!(seg.header.send_time, 42);
        let blocks: Vec<_> = seg.blocks().collect::<Result<_, _>>().unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(Message::parse(blocks[1]).unwrap(), m);
    }

    #[test]
    fn rejects_bad_headers_and_overruns() {
        assert_eq!(Segment::parse(&[1; 10]).unwrap_err(), SegmentError::TooShort { len: 10 });
        let mut bytes = vec![0u8; 40];
        bytes[0] = 2;
        assert_eq!(Segment::parse(&bytes).unwrap_err(), SegmentError::Version { version: 2 });
        bytes[0] = 1;
        bytes[12] = 5;
        assert_eq!(Segment::parse(&bytes).unwrap_err(), SegmentError::LengthMismatch { header: 5, actual: 0 });
        bytes[12] = 4;
        bytes.extend_from_slice(&[9, 0, 1, 2]);
        let seg = Segment::parse(&bytes).unwrap();
        let blocks: Vec<_> = seg.blocks().collect();
        assert_eq!(blocks, vec![Err(BlockOverrun { offset: 0, length: 9, available: 2 })]);
    }
}
