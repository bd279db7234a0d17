//! The relay protocol's structures as bytes: greeting, answer, record and datagram headers,
//! echoes and totals. Every read goes through checked accessors, so a structure cut short is an
//! error wherever it is cut, whatever the caller checked before.

use super::protect::{KEY_CHECK_LEN, Protection};
use mdrelay_codec::Format;
use std::collections::BTreeMap;

/// Version of this protocol. Version 2 added TCP resume and the retransmission service; a
/// version-1 subscriber is still served (live, without resume), and a version-1 publisher is
/// still followed (without resume or recovery). Any other version is refused.
pub const PROTOCOL_VERSION: u16 = 2;
/// The oldest protocol version this build still speaks.
pub const MIN_PROTOCOL_VERSION: u16 = 1;
/// Version of the datagram header written whenever the frame count fits its one byte: unchanged
/// since protocol version 1, so receivers of every release read it.
pub const DATAGRAM_VERSION: u8 = 1;
/// Version of the datagram header of a `DATA` datagram of more than 255 frames: version 1's 24
/// bytes (its frame count byte 0), then the frame count as a u32 and 4 bytes of 0. Receivers
/// before it count such a datagram as invalid, so a publisher can be told to write version 1
/// only (at most 255 frames a datagram).
pub const WIDE_DATAGRAM_VERSION: u8 = 2;
/// Version of the schemas in codec/schema (all formats move together).
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
/// Longest reason a `REFUSE` or `BUSY` record carries, in bytes. A sender cuts a longer one (at
/// the last whole UTF-8 character, [`control_record`] does it); a receiver reads at most this
/// many bytes of a record that declares more, and takes them as the reason, escaped before it
/// is printed ([`mdrelay_iex::peer_text`]).
pub const MAX_REASON: usize = 256;

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

fn protection_at(b: &[u8], at: usize) -> Result<Protection, RelayError> {
    let bits = u8_at(b, at)?;
    Protection::from_bits(bits).ok_or_else(|| err(at, format!("unknown frame protection bits {bits:#04x}")))
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
        "the peer speaks relay protocol version {protocol}{}; this build speaks versions {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION} (schema version {SCHEMA_VERSION}): use matching releases",
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
    /// How the publisher protects its frames (byte 11, zero before protection existed).
    pub protection: Protection,
    /// With encryption, the key check of the session ([`super::Protector::key_check`]).
    pub key_check: [u8; KEY_CHECK_LEN],
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
            protection: Protection::NONE,
            key_check: [0; KEY_CHECK_LEN],
        }
    }

    /// The greeting with the publisher's frame protection and its key check.
    pub fn protected(self, protection: Protection, key_check: [u8; KEY_CHECK_LEN]) -> Hello {
        Hello { protection, key_check, ..self }
    }

    /// The greeting's bytes.
    pub fn to_bytes(&self) -> [u8; Hello::LEN] {
        let mut b = [0u8; Hello::LEN];
        b[..8].copy_from_slice(&HELLO_MAGIC);
        b[8..10].copy_from_slice(&self.protocol_version.to_le_bytes());
        b[10] = self.format.id();
        b[11] = self.protection.bits();
        b[12..14].copy_from_slice(&self.schema_version.to_le_bytes());
        b[16..24].copy_from_slice(&self.session.to_le_bytes());
        b[24..28].copy_from_slice(&self.stream.to_le_bytes());
        b[28..32].copy_from_slice(&self.key_check);
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
        if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&protocol) || schema != SCHEMA_VERSION {
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
            protection: protection_at(b, 11)?,
            key_check: bytes_at(b, 28)?,
        })
    }
}

/// What a subscriber's connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The stream of records.
    Stream,
    /// Retransmission requests (version 2): see [`RetransmitRequest`].
    Recovery,
}

/// Where a subscriber wants its stream to start (version 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// From the next frame sent.
    Live,
    /// From this sequence number of the greeting's session, as far as the publisher still holds
    /// it: a reconnecting subscriber's next frame, or 1 for the whole session.
    From(u64),
}

/// The subscriber's answer to a [`Hello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subscribe {
    /// The subscriber's protocol version.
    pub protocol_version: u16,
    /// Send `ECHO` records for round-trip latency.
    pub echo: bool,
    /// What the connection is for (always the stream in version 1).
    pub purpose: Purpose,
    /// Where the stream starts (always live in version 1).
    pub resume: Resume,
    /// The frame protection the subscriber expects (byte 13 of a version-2 answer; zero from a
    /// build without protection): a publisher protecting otherwise refuses it.
    pub protection: Protection,
    /// A live subscription asks for a snapshot of the state first (flags bit 1, version 2): a
    /// publisher that keeps state sends `SNAPSHOT` records, then the stream from the frame after
    /// the snapshot's; one that does not (or an older build, which ignores the bit) serves the
    /// stream live without them.
    pub snapshot: bool,
}

impl Subscribe {
    /// Bytes every version starts with (all of version 1): enough to read the version.
    pub const LEN: usize = 16;
    /// Bytes of a version-2 answer.
    pub const V2_LEN: usize = 32;

    /// An answer of this build's protocol version for the stream, from the next frame.
    pub fn new(echo: bool) -> Subscribe {
        Subscribe {
            protocol_version: PROTOCOL_VERSION,
            echo,
            purpose: Purpose::Stream,
            resume: Resume::Live,
            protection: Protection::NONE,
            snapshot: false,
        }
    }

    /// The answer to a publisher of version `publisher`: the lower of the two versions, and
    /// what that version can say (a version-1 answer cannot resume or ask for recovery).
    pub fn negotiated(self, publisher: u16) -> Subscribe {
        if publisher >= 2 {
            return self;
        }
        Subscribe {
            protocol_version: 1,
            purpose: Purpose::Stream,
            resume: Resume::Live,
            protection: Protection::NONE,
            snapshot: false,
            ..self
        }
    }

    /// Bytes of an answer of `version`.
    pub fn len_of(version: u16) -> usize {
        if version >= 2 { Subscribe::V2_LEN } else { Subscribe::LEN }
    }

    /// The answer's bytes: 16 in version 1, 32 in version 2.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; Subscribe::len_of(self.protocol_version)];
        b[..8].copy_from_slice(&SUBSCRIBE_MAGIC);
        b[8..10].copy_from_slice(&self.protocol_version.to_le_bytes());
        let snapshot = u16::from(self.snapshot && self.protocol_version >= 2) << 1;
        b[10..12].copy_from_slice(&(u16::from(self.echo) | snapshot).to_le_bytes());
        if self.protocol_version >= 2 {
            b[12] = match self.purpose {
                Purpose::Stream => 0,
                Purpose::Recovery => 1,
            };
            b[13] = self.protection.bits();
            let from = match self.resume {
                Resume::Live => 0,
                Resume::From(sequence) => sequence.max(1),
            };
            b[16..24].copy_from_slice(&from.to_le_bytes());
        }
        b
    }

    /// Reads the first [`Subscribe::LEN`] bytes: the magic and the version, which says how many
    /// bytes the whole answer has.
    pub fn parse_version(b: &[u8]) -> Result<u16, HandshakeError> {
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
        if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&protocol) {
            return Err(HandshakeError::Version { protocol, schema: None });
        }
        Ok(protocol)
    }

    /// Reads an answer of a version this build speaks.
    pub fn parse(b: &[u8]) -> Result<Subscribe, HandshakeError> {
        let protocol = Subscribe::parse_version(b)?;
        let len = Subscribe::len_of(protocol);
        if b.len() < len {
            return Err(err(b.len(), format!("answer of {} bytes, version {protocol} has {len}", b.len())).into());
        }
        let flags = u16_at(b, 10)?;
        let echo = flags & 1 == 1;
        if protocol < 2 {
            return Ok(Subscribe {
                protocol_version: protocol,
                echo,
                purpose: Purpose::Stream,
                resume: Resume::Live,
                protection: Protection::NONE,
                snapshot: false,
            });
        }
        let purpose = match u8_at(b, 12)? {
            0 => Purpose::Stream,
            1 => Purpose::Recovery,
            other => return Err(err(12, format!("unknown connection purpose {other}")).into()),
        };
        let resume = match u64_at(b, 16)? {
            0 => Resume::Live,
            from => Resume::From(from),
        };
        let snapshot = flags & 2 == 2;
        Ok(Subscribe { protocol_version: protocol, echo, purpose, resume, protection: protection_at(b, 13)?, snapshot })
    }
}

/// A retransmission request (version 2, on a [`Purpose::Recovery`] connection): the frames
/// `first..first + count` of the greeting's session. Sent as a `REQUEST` record whose sequence
/// is `first`; the payload is the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetransmitRequest {
    /// The first frame wanted.
    pub first: u64,
    /// Frames wanted from `first` on.
    pub count: u32,
}

impl RetransmitRequest {
    /// Payload bytes of a `REQUEST` record.
    pub const PAYLOAD: usize = 8;

    /// The whole `REQUEST` record.
    pub fn to_record(&self) -> Vec<u8> {
        let mut payload = [0u8; RetransmitRequest::PAYLOAD];
        payload[..4].copy_from_slice(&self.count.to_le_bytes());
        control_record(RecordTag::Request, Format::Raw, self.first, &payload)
    }

    /// The whole `REQUEST` record that asks the retransmission service for a snapshot of the
    /// state instead of frames: no frames, and [`RetransmitRequest::SNAPSHOT`] set in the
    /// payload's flags (byte 4). A service of an earlier build answers it with nothing.
    pub fn snapshot_record() -> Vec<u8> {
        let mut payload = [0u8; RetransmitRequest::PAYLOAD];
        payload[4] = RetransmitRequest::SNAPSHOT;
        control_record(RecordTag::Request, Format::Raw, 0, &payload)
    }

    /// Bit of a `REQUEST`'s flags (payload byte 4): a snapshot, not frames, is asked for.
    pub const SNAPSHOT: u8 = 1;

    /// Whether a `REQUEST` record's payload asks for a snapshot.
    pub fn asks_snapshot(payload: &[u8]) -> bool {
        payload.get(4).is_some_and(|flags| flags & RetransmitRequest::SNAPSHOT != 0)
    }

    /// Reads a request from a `REQUEST` record's header and payload.
    pub fn parse(header: &RecordHeader, payload: &[u8]) -> Result<RetransmitRequest, RelayError> {
        if header.tag != RecordTag::Request {
            return Err(err(0, format!("a {:?} record where a REQUEST was expected", header.tag)));
        }
        Ok(RetransmitRequest { first: header.sequence, count: u32_at(payload, 0)? })
    }
}

/// The payload of a `GONE` record: the frames from the record's sequence on that the publisher no
/// longer holds (or never held, for another session).
pub fn gone_payload(count: u64) -> [u8; 8] {
    count.to_le_bytes()
}

/// Reads a `GONE` record's payload: how many frames are gone.
pub fn parse_gone(payload: &[u8]) -> Result<u64, RelayError> {
    u64_at(payload, 0)
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
    /// The publisher cannot take the subscriber now (its connection limit), or on a recovery
    /// connection the request whose first frame is the record's sequence (its rate limit):
    /// UTF-8 reason. Retry later.
    Busy = 6,
    /// Subscriber to publisher, on a recovery connection: a [`RetransmitRequest`].
    Request = 7,
    /// Publisher to subscriber, on a recovery connection: frames from the record's sequence on
    /// that are no longer held ([`parse_gone`]); they cannot be recovered.
    Gone = 8,
    /// Publisher to subscriber, on the stream, before the first `FORMAT` when the answer asked
    /// for one: frames of a snapshot of the state as of the record's sequence, or with no frames
    /// (the last of the snapshot's records) the stream's [`Totals`] as of that frame
    /// ([`super::snapshot`]).
    Snapshot = 9,
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
            7 => RecordTag::Request,
            8 => RecordTag::Gone,
            9 => RecordTag::Snapshot,
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
/// payload must be shorter than [`MAX_RECORD`]; a `REFUSE` or `BUSY` reason is cut to
/// [`MAX_REASON`] bytes.
pub fn control_record(tag: RecordTag, format: Format, sequence: u64, payload: &[u8]) -> Vec<u8> {
    let payload = match tag {
        RecordTag::Refuse | RecordTag::Busy => mdrelay_iex::peer_text::cut_at_char(payload, MAX_REASON),
        _ => payload,
    };
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
    /// The header's version: [`DATAGRAM_VERSION`], or [`WIDE_DATAGRAM_VERSION`] for a frame
    /// count over 255.
    pub version: u8,
    /// The format of the frames.
    pub format: Format,
    /// What the datagram carries.
    pub kind: DatagramKind,
    /// Frames in a `Data` datagram.
    pub frame_count: u32,
    /// How the frames (and an `End`'s totals) are protected: the kind byte's high bits, zero
    /// from a build without protection.
    pub protection: Protection,
    /// The publisher's session.
    pub session: u64,
    /// Sequence number of the first frame (of the next frame, for other kinds).
    pub sequence: u64,
}

impl DatagramHeader {
    /// Bytes on the wire in version 1 (every datagram of at most 255 frames).
    pub const LEN: usize = 24;
    /// Bytes on the wire in version 2.
    pub const WIDE_LEN: usize = 32;

    /// Bytes this header takes on the wire: where the payload starts.
    pub fn len_on_wire(&self) -> usize {
        if self.version == WIDE_DATAGRAM_VERSION { DatagramHeader::WIDE_LEN } else { DatagramHeader::LEN }
    }

    /// The header's bytes, as many as its version takes. A version-1 header's frame count
    /// is cut to 255: a writer that may count more writes version 2.
    pub fn to_bytes(&self) -> DatagramHeaderBytes {
        let mut b = [0u8; DatagramHeader::WIDE_LEN];
        b[..4].copy_from_slice(&DATAGRAM_MAGIC);
        b[4] = self.version;
        b[5] = self.format.id();
        b[6] = self.kind as u8 | self.protection.bits() << 4;
        b[8..16].copy_from_slice(&self.session.to_le_bytes());
        b[16..24].copy_from_slice(&self.sequence.to_le_bytes());
        if self.version == WIDE_DATAGRAM_VERSION {
            b[24..28].copy_from_slice(&self.frame_count.to_le_bytes());
        } else {
            b[7] = u8::try_from(self.frame_count).unwrap_or(u8::MAX);
        }
        DatagramHeaderBytes { bytes: b, len: self.len_on_wire() }
    }

    /// True when `b` starts like a relay datagram (as opposed to, say, a bare IEX-TP segment).
    pub fn is_relay_datagram(b: &[u8]) -> bool {
        b.first_chunk::<4>() == Some(&DATAGRAM_MAGIC)
    }

    /// Reads the header of a whole datagram `d`, with its frame count bounded by the payload
    /// (every frame takes at least a byte): a count no bytes back cannot make a receiver expect,
    /// count or look for frames that are not there.
    pub fn parse_datagram(d: &[u8]) -> Result<DatagramHeader, RelayError> {
        let mut header = DatagramHeader::parse(d)?;
        let payload = d.len().saturating_sub(header.len_on_wire());
        header.frame_count = header.frame_count.min(u32::try_from(payload).unwrap_or(u32::MAX));
        Ok(header)
    }

    /// Reads a header of either version.
    pub fn parse(b: &[u8]) -> Result<DatagramHeader, RelayError> {
        if b.len() < DatagramHeader::LEN {
            return Err(err(b.len(), format!("datagram of {} bytes is shorter than the relay header", b.len())));
        }
        if !DatagramHeader::is_relay_datagram(b) {
            return Err(err(0, "not a relay datagram (bad magic)"));
        }
        let version = u8_at(b, 4)?;
        let frame_count = match version {
            DATAGRAM_VERSION => u32::from(u8_at(b, 7)?),
            WIDE_DATAGRAM_VERSION => {
                if b.len() < DatagramHeader::WIDE_LEN {
                    return Err(err(
                        b.len(),
                        format!("datagram of {} bytes is shorter than a version-2 relay header (32 bytes)", b.len()),
                    ));
                }
                if u8_at(b, 7)? != 0 {
                    return Err(err(7, "a version-2 relay datagram header has a frame count byte other than 0"));
                }
                if u32_at(b, 28)? != 0 {
                    return Err(err(28, "a version-2 relay datagram header's last 4 bytes are not 0"));
                }
                u32_at(b, 24)?
            }
            _ => {
                return Err(err(
                    4,
                    format!(
                        "relay datagram version {version}, this build reads {DATAGRAM_VERSION} and {WIDE_DATAGRAM_VERSION}"
                    ),
                ));
            }
        };
        let protection = protection_at(&[u8_at(b, 6)? >> 4], 0).map_err(|e| err(6, e.what))?;
        let kind = match u8_at(b, 6)? & 0x0f {
            0 => DatagramKind::Data,
            1 => DatagramKind::End,
            2 => DatagramKind::Echo,
            other => return Err(err(6, format!("unknown datagram kind {other}"))),
        };
        Ok(DatagramHeader {
            version,
            format: format_at(b, 5)?,
            kind,
            frame_count,
            protection,
            session: u64_at(b, 8)?,
            sequence: u64_at(b, 16)?,
        })
    }
}

/// A datagram header's bytes: [`DatagramHeader::LEN`] of them in version 1,
/// [`DatagramHeader::WIDE_LEN`] in version 2. Reads as a byte slice.
#[derive(Clone, Copy, Debug)]
pub struct DatagramHeaderBytes {
    bytes: [u8; DatagramHeader::WIDE_LEN],
    len: usize,
}

impl std::ops::Deref for DatagramHeaderBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::ops::DerefMut for DatagramHeaderBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len]
    }
}

impl PartialEq<[u8]> for DatagramHeaderBytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
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
    /// The stream ended short of its source's end: a relay that lost its upstream for good, or
    /// was stopped before its upstream's END. Frames the source sent may never have come, so
    /// no receiver's counts can be said to match. A flags byte after the per-type entries on the
    /// wire, written only when set (older readers ignore it).
    pub truncated: bool,
}

fn serialize_types<S: serde::Serializer>(types: &BTreeMap<u8, u64>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(types.iter().map(|(k, v)| (char::from(*k).to_string(), v)))
}

impl Totals {
    /// Bytes before the per-type entries.
    const FIXED: usize = 18;
    /// Bytes of one per-type entry: the type byte and its count.
    const ENTRY: usize = 9;
    /// The flags byte's bit for [`Totals::truncated`]; other bits are ignored when read.
    const TRUNCATED: u8 = 1;

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
        if self.truncated {
            out.push(Totals::TRUNCATED);
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
        // Absent in the totals of a publisher without flags, or with none set.
        let flags = b.get(Totals::FIXED + n * Totals::ENTRY).copied().unwrap_or(0);
        Ok(Totals { frames, messages, by_type, truncated: flags & Totals::TRUNCATED != 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_structure_round_trips_and_short_input_is_an_error() {
        let hello = Hello::new(Format::Sbe, 7, 3, 99);
        assert_eq!(Hello::parse(&hello.to_bytes()).unwrap(), hello);
        let guarded = hello.protected(Protection { crc: true, encrypted: true }, [9, 8, 7, 6]);
        assert_eq!(Hello::parse(&guarded.to_bytes()).unwrap(), guarded);
        let mut bad = guarded.to_bytes();
        bad[11] = 0x80;
        assert!(Hello::parse(&bad).is_err(), "unknown protection bits");
        for cut in 0..Hello::LEN {
            assert!(Hello::parse(&hello.to_bytes()[..cut]).is_err(), "cut at {cut}");
        }
        let sub = Subscribe::new(true);
        assert_eq!(Subscribe::parse(&sub.to_bytes()).unwrap(), sub);
        assert!(Subscribe::parse(b"GET / HTTP/1.1\r\n").is_err());
        for cut in 0..Subscribe::V2_LEN {
            assert!(Subscribe::parse(&sub.to_bytes()[..cut]).is_err(), "cut at {cut}");
        }
        let resume = Subscribe {
            purpose: Purpose::Recovery,
            resume: Resume::From(77),
            protection: Protection { crc: false, encrypted: true },
            ..Subscribe::new(false)
        };
        assert_eq!(Subscribe::parse(&resume.to_bytes()).unwrap(), resume);
        let snapshot = Subscribe { snapshot: true, ..Subscribe::new(true) };
        assert_eq!(Subscribe::parse(&snapshot.to_bytes()).unwrap(), snapshot);
        assert!(!Subscribe::parse(&snapshot.negotiated(1).to_bytes()).unwrap().snapshot, "version 1 has no snapshots");
        let request = RetransmitRequest { first: 10, count: 5 };
        let record = request.to_record();
        let header = RecordHeader::parse(&record, 100).unwrap();
        assert_eq!(RetransmitRequest::parse(&header, &record[RecordHeader::LEN..]).unwrap(), request);
        assert_eq!(parse_gone(&gone_payload(9)).unwrap(), 9);
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
            protection: Protection { crc: true, encrypted: false },
            session: 1,
            sequence: 2,
        };
        assert_eq!(DatagramHeader::parse(&dg.to_bytes()).unwrap(), dg);
        let unprotected = DatagramHeader { protection: Protection::NONE, ..dg };
        assert_eq!(unprotected.to_bytes()[6], DatagramKind::End as u8, "unprotected datagrams are unchanged");
        let mut bad = dg.to_bytes();
        bad[4] = 9;
        assert!(DatagramHeader::parse(&bad).unwrap_err().what.contains("version 9"));
        // Version 2: the frame count after the first 24 bytes, as wide as a u32.
        let wide =
            DatagramHeader { version: WIDE_DATAGRAM_VERSION, kind: DatagramKind::Data, frame_count: 70_000, ..dg };
        let bytes = wide.to_bytes();
        assert_eq!(
            (bytes.len(), wide.len_on_wire(), bytes[7]),
            (DatagramHeader::WIDE_LEN, DatagramHeader::WIDE_LEN, 0)
        );
        assert_eq!(
            bytes[..24],
            DatagramHeader { frame_count: 0, ..wide }.to_bytes()[..24],
            "version 1's first 24 bytes"
        );
        assert_eq!(DatagramHeader::parse(&bytes).unwrap(), wide);
        for (at, what) in [(7, "frame count byte"), (29, "last 4 bytes")] {
            let mut bad = bytes;
            bad[at] = 1;
            assert!(DatagramHeader::parse(&bad).unwrap_err().what.contains(what), "byte {at}");
        }
        let cut = DatagramHeader::parse(&bytes[..31]).unwrap_err();
        assert_eq!(cut.offset, 31);
        assert!(cut.what.contains("shorter than a version-2"), "{}", cut.what);
        assert_eq!(DatagramHeader { frame_count: 300, ..dg }.to_bytes()[7], 255, "version 1 cuts what it cannot count");
        let mut boastful = DatagramHeader { frame_count: u32::MAX, ..wide }.to_bytes().to_vec();
        boastful.extend_from_slice(&[7; 5]);
        assert_eq!(DatagramHeader::parse(&boastful).unwrap().frame_count, u32::MAX);
        assert_eq!(DatagramHeader::parse_datagram(&boastful).unwrap().frame_count, 5, "no more than the bytes hold");
        let totals = Totals {
            frames: 10,
            messages: 20,
            by_type: [(b'T', 15), (b'8', 5)].into_iter().collect(),
            truncated: false,
        };
        let mut bytes = Vec::new();
        totals.write(&mut bytes);
        assert_eq!(bytes.len(), Totals::FIXED + 2 * Totals::ENTRY, "no flags byte when none is set");
        assert_eq!(Totals::parse(&bytes).unwrap(), totals);
        for cut in 0..bytes.len() {
            assert!(Totals::parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let truncated = Totals { truncated: true, ..totals.clone() };
        let mut flagged = Vec::new();
        truncated.write(&mut flagged);
        assert_eq!(flagged[..bytes.len()], bytes[..], "readers without flags read the same totals");
        assert_eq!(Totals::parse(&flagged).unwrap(), truncated);
        flagged[bytes.len()] = 0xfe;
        assert_eq!(Totals::parse(&flagged).unwrap(), totals, "unknown flags are ignored");
        let echo = Echo { publish_time: -5, sequence: 8 };
        assert_eq!(Echo::parse(&echo.to_bytes()).unwrap(), echo);
        assert!(Echo::parse(&echo.to_bytes()[..15]).is_err());
        let record = control_record(RecordTag::Refuse, Format::Raw, 4, b"why");
        let header = RecordHeader::parse(&record, 100).unwrap();
        assert_eq!((header.tag, header.length, header.sequence, &record[16..]), (RecordTag::Refuse, 3, 4, &b"why"[..]));
        // A reason past the limit is cut there, never inside a character; other payloads never.
        let long = "é".repeat(MAX_REASON);
        for tag in [RecordTag::Refuse, RecordTag::Busy] {
            let record = control_record(tag, Format::Raw, 0, long.as_bytes());
            assert_eq!(record.len() - RecordHeader::LEN, MAX_REASON, "{tag:?}");
            assert!(std::str::from_utf8(&record[RecordHeader::LEN..]).is_ok(), "{tag:?}");
        }
        let end = control_record(RecordTag::End, Format::Raw, 0, long.as_bytes());
        assert_eq!(end.len() - RecordHeader::LEN, long.len());
    }

    #[test]
    fn another_version_is_reported_as_such_before_the_rest_is_read() {
        let mut hello = Hello::new(Format::Sbe, 7, 3, 99).to_bytes();
        hello[8] = 3;
        // A format number this build does not know: the version is what the user needs to hear.
        hello[10] = 200;
        let e = Hello::parse(&hello).unwrap_err();
        assert_eq!(e, HandshakeError::Version { protocol: 3, schema: Some(1) });
        assert!(e.to_string().contains("version 3") && e.to_string().contains("speaks versions 1 to 2"), "{e}");
        let mut hello = Hello::new(Format::Sbe, 7, 3, 99).to_bytes();
        hello[12] = 5;
        assert_eq!(Hello::parse(&hello).unwrap_err(), HandshakeError::Version { protocol: 2, schema: Some(5) });
        let sub = Subscribe { protocol_version: 99, ..Subscribe::new(false) }.to_bytes();
        assert_eq!(Subscribe::parse(&sub).unwrap_err(), HandshakeError::Version { protocol: 99, schema: None });
        assert!(matches!(
            Hello::parse(b"HTTP/1.1 200 OK\r\n\r\nhello there, this is long"),
            Err(HandshakeError::Malformed(_))
        ));
    }

    #[test]
    fn version_one_peers_are_still_spoken_to() {
        // A version-1 greeting is read; the answer to it is version 1, without resume.
        let mut hello = Hello::new(Format::Sbe, 7, 3, 99).to_bytes();
        hello[8] = 1;
        assert_eq!(Hello::parse(&hello).unwrap().protocol_version, 1);
        let answer = Subscribe { resume: Resume::From(5), ..Subscribe::new(true) }.negotiated(1);
        let bytes = answer.to_bytes();
        assert_eq!(bytes.len(), Subscribe::LEN);
        let parsed = Subscribe::parse(&bytes).unwrap();
        assert_eq!((parsed.protocol_version, parsed.echo, parsed.resume), (1, true, Resume::Live));
        assert_eq!(Subscribe::parse_version(&bytes[..Subscribe::LEN]).unwrap(), 1);
    }
}
