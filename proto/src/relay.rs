//! The relay protocol between `mdrelay-pub` and `mdrelay-sub`, as bytes (no I/O here).
//!
//! **TCP.** The publisher greets with a [`Hello`] (magic, protocol version, format, schema
//! version, session, stream, the sequence number of the next frame). The subscriber answers
//! with a [`Subscribe`]; a subscriber speaking another protocol version gets a `REFUSE` record
//! with the reason, and the connection closes. Then the publisher sends records: a 16-byte
//! [`RecordHeader`] (tag, format, frame count, length, first frame's sequence number) and its
//! payload. A `DATA` payload is one or more frames of the record's format, back to back, each
//! delimited by the format's own framing; the record length lets a reader skip a corrupt frame
//! without losing its place in the stream. A `FORMAT` record announces a format switch; `END`
//! carries the publisher's [`Totals`]. A subscriber in round-trip mode sends `ECHO` records back.
//!
//! **UDP.** Every datagram starts with a 24-byte [`DatagramHeader`] (magic, version, format,
//! kind, frame count, session, first frame's sequence number), so receivers detect the format,
//! loss, duplicates and reordering; then frames (`DATA`), [`Totals`] (`END`) or an echo (`ECHO`).
//!
//! Headers are multiples of 8 bytes so frames that follow keep the 8-byte alignment Cap'n Proto
//! reads want. Every number is little-endian.

use crate::codec::Format;
use std::collections::BTreeMap;

/// Version of this protocol; a peer with another version is refused.
pub const PROTOCOL_VERSION: u16 = 1;
/// Version of the schemas in proto/schema (all formats move together).
pub const SCHEMA_VERSION: u16 = 1;
/// First bytes of a publisher's greeting.
pub const HELLO_MAGIC: [u8; 8] = *b"MDRELAY\0";
/// First bytes of a subscriber's answer.
pub const SUBSCRIBE_MAGIC: [u8; 8] = *b"MDRSUBS\0";
/// First bytes of every relay datagram.
pub const DATAGRAM_MAGIC: [u8; 4] = *b"MDRU";
/// Largest record payload a reader accepts before allocating.
pub const MAX_RECORD: usize = 64 << 20;

/// Why relay bytes could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {offset}")]
pub struct RelayError {
    /// Byte offset within the structure read.
    pub offset: usize,
    /// What was wrong.
    pub what: String,
}

fn err(offset: usize, what: impl Into<String>) -> RelayError {
    RelayError { offset, what: what.into() }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn format_at(b: &[u8], at: usize) -> Result<Format, RelayError> {
    Format::from_id(b[at]).ok_or_else(|| err(at, format!("unknown format id {}", b[at])))
}

/// The publisher's greeting on a TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The publisher's protocol version.
    pub protocol_version: u16,
    /// The format of the first frames.
    pub format: Format,
    /// The schema version of the formats.
    pub schema_version: u16,
    /// The publisher's session: random per run, so a restarted publisher is noticed.
    pub session: u64,
    /// The stream's number, from the publisher's configuration.
    pub stream: u32,
    /// Sequence number of the next frame; above 1 for a subscriber that joins late.
    pub next_sequence: u64,
}

impl Hello {
    /// Bytes on the wire.
    pub const LEN: usize = 40;

    /// The greeting's bytes.
    pub fn to_bytes(&self) -> [u8; Hello::LEN] {
        let mut b = [0u8; Hello::LEN];
        b[..8].copy_from_slice(&HELLO_MAGIC);
        b[8..10].copy_from_slice(&self.protocol_version.to_le_bytes());
        b[10] = self.format.id();
        b[12..14].copy_from_slice(&self.schema_version.to_le_bytes());
        b[16..24].copy_from_slice(&self.session.to_le_bytes());
        b[24..28].copy_from_slice(&self.stream.to_le_bytes());
        b[32..40].copy_from_slice(&self.next_sequence.to_le_bytes());
        b
    }

    /// Reads a greeting. The version is returned as sent; the caller decides whether it speaks it.
    pub fn parse(b: &[u8]) -> Result<Hello, RelayError> {
        if b.len() < Hello::LEN {
            return Err(err(b.len(), format!("greeting of {} bytes, expected {}", b.len(), Hello::LEN)));
        }
        if b[..8] != HELLO_MAGIC {
            return Err(err(0, "not an mdrelay publisher (bad greeting magic)"));
        }
        Ok(Hello {
            protocol_version: u16_at(b, 8),
            format: format_at(b, 10)?,
            schema_version: u16_at(b, 12),
            session: u64_at(b, 16),
            stream: u32_at(b, 24),
            next_sequence: u64_at(b, 32),
        })
    }
}

/// The subscriber's answer to a [`Hello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subscribe {
    /// The subscriber's protocol version.
    pub protocol_version: u16,
    /// Send `ECHO` records for round-trip latency.
    pub echo: bool,
}

impl Subscribe {
    /// Bytes on the wire.
    pub const LEN: usize = 16;

    /// The answer's bytes.
    pub fn to_bytes(&self) -> [u8; Subscribe::LEN] {
        let mut b = [0u8; Subscribe::LEN];
        b[..8].copy_from_slice(&SUBSCRIBE_MAGIC);
        b[8..10].copy_from_slice(&self.protocol_version.to_le_bytes());
        b[10..12].copy_from_slice(&u16::from(self.echo).to_le_bytes());
        b
    }

    /// Reads an answer.
    pub fn parse(b: &[u8]) -> Result<Subscribe, RelayError> {
        if b.len() < Subscribe::LEN {
            return Err(err(b.len(), format!("answer of {} bytes, expected {}", b.len(), Subscribe::LEN)));
        }
        if b[..8] != SUBSCRIBE_MAGIC {
            return Err(err(0, "not an mdrelay subscriber (bad answer magic)"));
        }
        Ok(Subscribe { protocol_version: u16_at(b, 8), echo: u16_at(b, 10) & 1 == 1 })
    }
}

/// What a TCP record carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordTag {
    /// Frames of the record's format.
    Data = 1,
    /// The format changes to the record's format from the next record on.
    Format = 2,
    /// End of stream: the publisher's [`Totals`].
    End = 3,
    /// The publisher refuses the subscriber: UTF-8 reason.
    Refuse = 4,
    /// Subscriber to publisher: an [`Echo`].
    Echo = 5,
}

impl RecordTag {
    fn from_u8(v: u8) -> Option<RecordTag> {
        Some(match v {
            1 => RecordTag::Data,
            2 => RecordTag::Format,
            3 => RecordTag::End,
            4 => RecordTag::Refuse,
            5 => RecordTag::Echo,
            _ => return None,
        })
    }
}

/// The header of every TCP record after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// What the record carries.
    pub tag: RecordTag,
    /// The format of its frames (or the new format, for `FORMAT`).
    pub format: Format,
    /// Frames in a `DATA` record.
    pub frame_count: u16,
    /// Payload bytes after the header.
    pub length: u32,
    /// Sequence number of the first frame (of the next frame, for other tags).
    pub sequence: u64,
}

impl RecordHeader {
    /// Bytes on the wire.
    pub const LEN: usize = 16;

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; RecordHeader::LEN] {
        let mut b = [0u8; RecordHeader::LEN];
        b[0] = self.tag as u8;
        b[1] = self.format.id();
        b[2..4].copy_from_slice(&self.frame_count.to_le_bytes());
        b[4..8].copy_from_slice(&self.length.to_le_bytes());
        b[8..16].copy_from_slice(&self.sequence.to_le_bytes());
        b
    }

    /// Reads a header; a length over `max` is refused before the payload is read.
    pub fn parse(b: &[u8], max: usize) -> Result<RecordHeader, RelayError> {
        if b.len() < RecordHeader::LEN {
            return Err(err(b.len(), "record header cut short"));
        }
        let tag = RecordTag::from_u8(b[0]).ok_or_else(|| err(0, format!("unknown record tag {}", b[0])))?;
        let length = u32_at(b, 4);
        if length as usize > max {
            return Err(err(4, format!("record length {length} exceeds the {max}-byte limit")));
        }
        Ok(RecordHeader { tag, format: format_at(b, 1)?, frame_count: u16_at(b, 2), length, sequence: u64_at(b, 8) })
    }
}

/// What a datagram carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatagramKind {
    /// Frames.
    Data = 0,
    /// End of stream: the publisher's [`Totals`].
    End = 1,
    /// Subscriber to publisher: an [`Echo`].
    Echo = 2,
}

/// The header of every relay datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramHeader {
    /// The protocol version.
    pub version: u8,
    /// The format of the frames.
    pub format: Format,
    /// What the datagram carries.
    pub kind: DatagramKind,
    /// Frames in a `Data` datagram.
    pub frame_count: u8,
    /// The publisher's session.
    pub session: u64,
    /// Sequence number of the first frame (of the next frame, for other kinds).
    pub sequence: u64,
}

impl DatagramHeader {
    /// Bytes on the wire.
    pub const LEN: usize = 24;

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; DatagramHeader::LEN] {
        let mut b = [0u8; DatagramHeader::LEN];
        b[..4].copy_from_slice(&DATAGRAM_MAGIC);
        b[4] = self.version;
        b[5] = self.format.id();
        b[6] = self.kind as u8;
        b[7] = self.frame_count;
        b[8..16].copy_from_slice(&self.session.to_le_bytes());
        b[16..24].copy_from_slice(&self.sequence.to_le_bytes());
        b
    }

    /// True when `b` starts like a relay datagram (as opposed to, say, a bare IEX-TP segment).
    pub fn is_relay_datagram(b: &[u8]) -> bool {
        b.len() >= 4 && b[..4] == DATAGRAM_MAGIC
    }

    /// Reads a header.
    pub fn parse(b: &[u8]) -> Result<DatagramHeader, RelayError> {
        if b.len() < DatagramHeader::LEN {
            return Err(err(b.len(), format!("datagram of {} bytes is shorter than the relay header", b.len())));
        }
        if b[..4] != DATAGRAM_MAGIC {
            return Err(err(0, "not a relay datagram (bad magic)"));
        }
        if u16::from(b[4]) != PROTOCOL_VERSION {
            return Err(err(4, format!("relay protocol version {}, this build speaks {PROTOCOL_VERSION}", b[4])));
        }
        let kind = match b[6] {
            0 => DatagramKind::Data,
            1 => DatagramKind::End,
            2 => DatagramKind::Echo,
            other => return Err(err(6, format!("unknown datagram kind {other}"))),
        };
        Ok(DatagramHeader {
            version: b[4],
            format: format_at(b, 5)?,
            kind,
            frame_count: b[7],
            session: u64_at(b, 8),
            sequence: u64_at(b, 16),
        })
    }
}

/// A timestamp echoed from subscriber to publisher for round-trip latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Echo {
    /// The frame's publish time, as received.
    pub publish_time: i64,
    /// Sequence number of the frame.
    pub sequence: u64,
}

impl Echo {
    /// Bytes on the wire.
    pub const LEN: usize = 16;

    /// The echo's bytes.
    pub fn to_bytes(&self) -> [u8; Echo::LEN] {
        let mut b = [0u8; Echo::LEN];
        b[..8].copy_from_slice(&self.publish_time.to_le_bytes());
        b[8..].copy_from_slice(&self.sequence.to_le_bytes());
        b
    }

    /// Reads an echo.
    pub fn parse(b: &[u8]) -> Result<Echo, RelayError> {
        if b.len() < Echo::LEN {
            return Err(err(b.len(), "echo cut short"));
        }
        Ok(Echo { publish_time: u64_at(b, 0) as i64, sequence: u64_at(b, 8) })
    }
}

/// What the publisher sent over the whole stream, so a subscriber can tell whether it got it all.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    /// Frames (batches) sent.
    pub frames: u64,
    /// Messages in them.
    pub messages: u64,
    /// Messages by type byte.
    #[serde(serialize_with = "serialize_types")]
    pub by_type: BTreeMap<u8, u64>,
}

fn serialize_types<S: serde::Serializer>(types: &BTreeMap<u8, u64>, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(types.len()))?;
    for (k, v) in types {
        map.serialize_entry(&char::from(*k).to_string(), v)?;
    }
    map.end()
}

impl Totals {
    /// Appends the totals' bytes.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.frames.to_le_bytes());
        out.extend_from_slice(&self.messages.to_le_bytes());
        out.extend_from_slice(&(self.by_type.len() as u16).to_le_bytes());
        for (kind, count) in &self.by_type {
            out.push(*kind);
            out.extend_from_slice(&count.to_le_bytes());
        }
    }

    /// Reads totals; at most 256 types, whatever the count field says.
    pub fn parse(b: &[u8]) -> Result<Totals, RelayError> {
        if b.len() < 18 {
            return Err(err(b.len(), "totals cut short"));
        }
        let n = usize::from(u16_at(b, 16));
        if n > 256 {
            return Err(err(16, format!("{n} message types in totals, at most 256 exist")));
        }
        if b.len() < 18 + n * 9 {
            return Err(err(b.len(), format!("totals name {n} types but hold {} bytes", b.len())));
        }
        let by_type = (0..n).map(|i| (b[18 + i * 9], u64_at(b, 18 + i * 9 + 1))).collect();
        Ok(Totals { frames: u64_at(b, 0), messages: u64_at(b, 8), by_type })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_structure_round_trips_and_short_input_is_an_error() {
        let hello = Hello {
            protocol_version: 1,
            format: Format::Sbe,
            schema_version: 1,
            session: 7,
            stream: 3,
            next_sequence: 99,
        };
        assert_eq!(Hello::parse(&hello.to_bytes()).unwrap(), hello);
        assert!(Hello::parse(&hello.to_bytes()[..39]).is_err());
        let sub = Subscribe { protocol_version: 1, echo: true };
        assert_eq!(Subscribe::parse(&sub.to_bytes()).unwrap(), sub);
        assert!(Subscribe::parse(b"GET / HTTP/1.1\r\n").is_err());
        let rec =
            RecordHeader { tag: RecordTag::Data, format: Format::Capnp, frame_count: 3, length: 100, sequence: 5 };
        assert_eq!(RecordHeader::parse(&rec.to_bytes(), 1000).unwrap(), rec);
        assert!(RecordHeader::parse(&rec.to_bytes(), 99).unwrap_err().what.contains("limit"));
        let dg = DatagramHeader {
            version: 1,
            format: Format::FlatBuffers,
            kind: DatagramKind::End,
            frame_count: 0,
            session: 1,
            sequence: 2,
        };
        assert_eq!(DatagramHeader::parse(&dg.to_bytes()).unwrap(), dg);
        let mut bad = dg.to_bytes();
        bad[4] = 9;
        assert!(DatagramHeader::parse(&bad).unwrap_err().what.contains("version 9"));
        let totals = Totals { frames: 10, messages: 20, by_type: [(b'T', 15), (b'8', 5)].into_iter().collect() };
        let mut bytes = Vec::new();
        totals.write(&mut bytes);
        assert_eq!(Totals::parse(&bytes).unwrap(), totals);
        assert!(Totals::parse(&bytes[..bytes.len() - 1]).is_err());
        let echo = Echo { publish_time: -5, sequence: 8 };
        assert_eq!(Echo::parse(&echo.to_bytes()).unwrap(), echo);
    }
}
