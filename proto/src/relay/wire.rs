//! The relay protocol's structures as bytes: greeting, answer, record and datagram headers,
//! echoes and totals. Every read goes through checked accessors, so a structure cut short is an
//! error wherever it is cut, whatever the caller checked before.

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
/// Largest UDP payload over IPv4: the most a relay datagram can hold, header included.
pub const MAX_DATAGRAM: usize = 65_507;

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

/// The `N` bytes at `at`, or an error naming the offset when `b` ends first.
fn bytes_at<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], RelayError> {
    b.get(at..)
        .and_then(<[u8]>::first_chunk::<N>)
        .copied()
        .ok_or_else(|| err(at.min(b.len()), format!("{} bytes end where {N} more were expected", b.len())))
}

fn u8_at(b: &[u8], at: usize) -> Result<u8, RelayError> {
    Ok(bytes_at::<1>(b, at)?[0])
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, RelayError> {
    Ok(u16::from_le_bytes(bytes_at(b, at)?))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, RelayError> {
    Ok(u32::from_le_bytes(bytes_at(b, at)?))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, RelayError> {
    Ok(u64::from_le_bytes(bytes_at(b, at)?))
}

fn format_at(b: &[u8], at: usize) -> Result<Format, RelayError> {
    let id = u8_at(b, at)?;
    Format::from_id(id).ok_or_else(|| err(at, format!("unknown format id {id}")))
}

/// Why a greeting or an answer cannot be accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The bytes are not a greeting (or an answer) of any version.
    #[error("{0}")]
    Malformed(RelayError),
    /// A well-formed greeting or answer of another protocol or schema version.
    #[error(
        "the peer speaks relay protocol version {protocol}{}; this build speaks version {PROTOCOL_VERSION} (schema version {SCHEMA_VERSION}): use matching releases",
        schema.map(|s| format!(" (schema version {s})")).unwrap_or_default()
    )]
    Version {
        /// The peer's protocol version.
        protocol: u16,
        /// The peer's schema version, where the structure carries one.
        schema: Option<u16>,
    },
}

impl From<RelayError> for HandshakeError {
    fn from(e: RelayError) -> Self {
        HandshakeError::Malformed(e)
    }
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
    /// Sequence number of the next frame when the greeting was sent; the first record after
    /// the handshake (a `FORMAT` record) gives the exact first frame offered.
    pub next_sequence: u64,
}

impl Hello {
    /// Bytes on the wire.
    pub const LEN: usize = 40;

    /// A greeting of this build's protocol and schema versions.
    pub fn new(format: Format, session: u64, stream: u32, next_sequence: u64) -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            format,
            schema_version: SCHEMA_VERSION,
            session,
            stream,
            next_sequence,
        }
    }

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

    /// Reads a greeting of this build's versions. The versions are read before anything else:
    /// a publisher of another version may lay out the rest differently (a format number this
    /// build does not know, say), and the user needs to hear about the versions, not that.
    pub fn parse(b: &[u8]) -> Result<Hello, HandshakeError> {
        let magic: [u8; 8] = bytes_at(b, 0)?;
        if magic != HELLO_MAGIC {
            return Err(err(
                0,
                format!(
                    "not an mdrelay publisher: its first bytes are {magic:02x?}, a greeting starts with \"MDRELAY\\0\""
                ),
            )
            .into());
        }
        let protocol = u16_at(b, 8)?;
        let schema = u16_at(b, 12)?;
        if protocol != PROTOCOL_VERSION || schema != SCHEMA_VERSION {
            return Err(HandshakeError::Version { protocol, schema: Some(schema) });
        }
        if b.len() < Hello::LEN {
            return Err(err(b.len(), format!("greeting of {} bytes, expected {}", b.len(), Hello::LEN)).into());
        }
        Ok(Hello {
            protocol_version: protocol,
            format: format_at(b, 10)?,
            schema_version: schema,
            session: u64_at(b, 16)?,
            stream: u32_at(b, 24)?,
            next_sequence: u64_at(b, 32)?,
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

    /// An answer of this build's protocol version.
    pub fn new(echo: bool) -> Subscribe {
        Subscribe { protocol_version: PROTOCOL_VERSION, echo }
    }

    /// The answer's bytes.
    pub fn to_bytes(&self) -> [u8; Subscribe::LEN] {
        let mut b = [0u8; Subscribe::LEN];
        b[..8].copy_from_slice(&SUBSCRIBE_MAGIC);
        b[8..10].copy_from_slice(&self.protocol_version.to_le_bytes());
        b[10..12].copy_from_slice(&u16::from(self.echo).to_le_bytes());
        b
    }

    /// Reads an answer of this build's protocol version.
    pub fn parse(b: &[u8]) -> Result<Subscribe, HandshakeError> {
        let magic: [u8; 8] = bytes_at(b, 0)?;
        if magic != SUBSCRIBE_MAGIC {
            return Err(err(
                0,
                format!(
                    "not an mdrelay subscriber: its first bytes are {magic:02x?}, an answer starts with \"MDRSUBS\\0\""
                ),
            )
            .into());
        }
        let protocol = u16_at(b, 8)?;
        if protocol != PROTOCOL_VERSION {
            return Err(HandshakeError::Version { protocol, schema: None });
        }
        if b.len() < Subscribe::LEN {
            return Err(err(b.len(), format!("answer of {} bytes, expected {}", b.len(), Subscribe::LEN)).into());
        }
        Ok(Subscribe { protocol_version: protocol, echo: u16_at(b, 10)? & 1 == 1 })
    }
}

/// What a TCP record carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordTag {
    /// Frames of the record's format.
    Data = 1,
    /// The record's format applies from the next record on, whose first frame is the record's
    /// sequence number. Always the first record after the handshake.
    Format = 2,
    /// End of stream: the publisher's [`Totals`]; the record's sequence number is the number the
    /// next frame would have had, so frames missing at the tail are counted.
    End = 3,
    /// The publisher refuses the subscriber: UTF-8 reason. Do not retry.
    Refuse = 4,
    /// Subscriber to publisher: an [`Echo`].
    Echo = 5,
    /// The publisher cannot take the subscriber now (its connection limit): UTF-8 reason. Retry
    /// later.
    Busy = 6,
}

impl RecordTag {
    fn from_u8(v: u8) -> Option<RecordTag> {
        Some(match v {
            1 => RecordTag::Data,
            2 => RecordTag::Format,
            3 => RecordTag::End,
            4 => RecordTag::Refuse,
            5 => RecordTag::Echo,
            6 => RecordTag::Busy,
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
        let tag_byte = u8_at(b, 0)?;
        let tag = RecordTag::from_u8(tag_byte).ok_or_else(|| err(0, format!("unknown record tag {tag_byte}")))?;
        let length = u32_at(b, 4)?;
        if usize::try_from(length).map_or(true, |l| l > max) {
            return Err(err(4, format!("record length {length} exceeds the {max}-byte limit")));
        }
        Ok(RecordHeader { tag, format: format_at(b, 1)?, frame_count: u16_at(b, 2)?, length, sequence: u64_at(b, 8)? })
    }
}

/// A whole record without frames (FORMAT, END, REFUSE, BUSY, ECHO): header and payload. The
/// payload must be shorter than [`MAX_RECORD`].
pub fn control_record(tag: RecordTag, format: Format, sequence: u64, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("control payloads are small");
    let header = RecordHeader { tag, format, frame_count: 0, length, sequence };
    let mut out = Vec::with_capacity(RecordHeader::LEN + payload.len());
    out.extend_from_slice(&header.to_bytes());
    out.extend_from_slice(payload);
    out
}

/// What a datagram carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatagramKind {
    /// Frames.
    Data = 0,
    /// End of stream: the publisher's [`Totals`]; the header's sequence is the next frame's.
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
        b.first_chunk::<4>() == Some(&DATAGRAM_MAGIC)
    }

    /// Reads a header.
    pub fn parse(b: &[u8]) -> Result<DatagramHeader, RelayError> {
        if b.len() < DatagramHeader::LEN {
            return Err(err(b.len(), format!("datagram of {} bytes is shorter than the relay header", b.len())));
        }
        if !DatagramHeader::is_relay_datagram(b) {
            return Err(err(0, "not a relay datagram (bad magic)"));
        }
        let version = u8_at(b, 4)?;
        if u16::from(version) != PROTOCOL_VERSION {
            return Err(err(4, format!("relay protocol version {version}, this build speaks {PROTOCOL_VERSION}")));
        }
        let kind = match u8_at(b, 6)? {
            0 => DatagramKind::Data,
            1 => DatagramKind::End,
            2 => DatagramKind::Echo,
            other => return Err(err(6, format!("unknown datagram kind {other}"))),
        };
        Ok(DatagramHeader {
            version,
            format: format_at(b, 5)?,
            kind,
            frame_count: u8_at(b, 7)?,
            session: u64_at(b, 8)?,
            sequence: u64_at(b, 16)?,
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
        Ok(Echo { publish_time: i64::from_le_bytes(bytes_at(b, 0)?), sequence: u64_at(b, 8)? })
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
    s.collect_map(types.iter().map(|(k, v)| (char::from(*k).to_string(), v)))
}

impl Totals {
    /// Bytes before the per-type entries.
    const FIXED: usize = 18;
    /// Bytes of one per-type entry: the type byte and its count.
    const ENTRY: usize = 9;

    /// Appends the totals' bytes.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.frames.to_le_bytes());
        out.extend_from_slice(&self.messages.to_le_bytes());
        // At most 256 type bytes exist, so the count fits.
        out.extend_from_slice(&(self.by_type.len().min(256) as u16).to_le_bytes());
        for (kind, count) in self.by_type.iter().take(256) {
            out.push(*kind);
            out.extend_from_slice(&count.to_le_bytes());
        }
    }

    /// Reads totals; at most 256 types, whatever the count field says.
    pub fn parse(b: &[u8]) -> Result<Totals, RelayError> {
        let frames = u64_at(b, 0)?;
        let messages = u64_at(b, 8)?;
        let n = usize::from(u16_at(b, 16)?);
        if n > 256 {
            return Err(err(16, format!("{n} message types in totals, at most 256 exist")));
        }
        if b.len() < Totals::FIXED + n * Totals::ENTRY {
            return Err(err(b.len(), format!("totals name {n} types but hold {} bytes", b.len())));
        }
        let mut by_type = BTreeMap::new();
        for i in 0..n {
            let at = Totals::FIXED + i * Totals::ENTRY;
            by_type.insert(u8_at(b, at)?, u64_at(b, at + 1)?);
        }
        Ok(Totals { frames, messages, by_type })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_structure_round_trips_and_short_input_is_an_error() {
        let hello = Hello::new(Format::Sbe, 7, 3, 99);
        assert_eq!(Hello::parse(&hello.to_bytes()).unwrap(), hello);
        for cut in 0..Hello::LEN {
            assert!(Hello::parse(&hello.to_bytes()[..cut]).is_err(), "cut at {cut}");
        }
        let sub = Subscribe::new(true);
        assert_eq!(Subscribe::parse(&sub.to_bytes()).unwrap(), sub);
        assert!(Subscribe::parse(b"GET / HTTP/1.1\r\n").is_err());
        for cut in 0..Subscribe::LEN {
            assert!(Subscribe::parse(&sub.to_bytes()[..cut]).is_err(), "cut at {cut}");
        }
        let rec =
            RecordHeader { tag: RecordTag::Data, format: Format::Capnp, frame_count: 3, length: 100, sequence: 5 };
        assert_eq!(RecordHeader::parse(&rec.to_bytes(), 1000).unwrap(), rec);
        assert!(RecordHeader::parse(&rec.to_bytes(), 99).unwrap_err().what.contains("limit"));
        for cut in 0..RecordHeader::LEN {
            assert!(RecordHeader::parse(&rec.to_bytes()[..cut], 1000).is_err(), "cut at {cut}");
        }
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
        for cut in 0..bytes.len() {
            assert!(Totals::parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let echo = Echo { publish_time: -5, sequence: 8 };
        assert_eq!(Echo::parse(&echo.to_bytes()).unwrap(), echo);
        assert!(Echo::parse(&echo.to_bytes()[..15]).is_err());
        let record = control_record(RecordTag::Refuse, Format::Raw, 4, b"why");
        let header = RecordHeader::parse(&record, 100).unwrap();
        assert_eq!((header.tag, header.length, header.sequence, &record[16..]), (RecordTag::Refuse, 3, 4, &b"why"[..]));
    }

    #[test]
    fn another_version_is_reported_as_such_before_the_rest_is_read() {
        let mut hello = Hello::new(Format::Sbe, 7, 3, 99).to_bytes();
        hello[8] = 2;
        // A format number this build does not know: the version is what the user needs to hear.
        hello[10] = 200;
        let e = Hello::parse(&hello).unwrap_err();
        assert_eq!(e, HandshakeError::Version { protocol: 2, schema: Some(1) });
        assert!(e.to_string().contains("version 2") && e.to_string().contains("speaks version 1"), "{e}");
        let mut hello = Hello::new(Format::Sbe, 7, 3, 99).to_bytes();
        hello[12] = 5;
        assert_eq!(Hello::parse(&hello).unwrap_err(), HandshakeError::Version { protocol: 1, schema: Some(5) });
        let sub = Subscribe { protocol_version: 99, echo: false }.to_bytes();
        assert_eq!(Subscribe::parse(&sub).unwrap_err(), HandshakeError::Version { protocol: 99, schema: None });
        assert!(matches!(
            Hello::parse(b"HTTP/1.1 200 OK\r\n\r\nhello there, this is long"),
            Err(HandshakeError::Malformed(_))
        ));
    }
}
