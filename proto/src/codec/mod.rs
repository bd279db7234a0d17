//! Wire formats: the same batch of messages as raw IEX-TP, SBE, FlatBuffers, Cap'n Proto, packed
//! Cap'n Proto, Protobuf, brec or JSON, each framed as its ecosystem does it.
//!
//! A *frame* carries one batch: the messages of one IEX-TP segment and a [`BatchHeader`]. Every
//! codec offers the same three operations (see [`Codec`]):
//! - `encode`: appends one complete frame to a reusable output buffer, without allocating once
//!   its buffers are warm;
//! - `frame_len`: on the start of a byte stream, the length of the first complete frame, `None`
//!   while more bytes are needed, an error for a frame that is malformed or longer than the limit
//!   (checked before anything is allocated);
//! - `decode`: reads one frame zero-copy and hands each message, in order, to a visitor;
//! - `decode_filtered`: the same for the messages of a [`SymbolFilter`]'s symbols, reading as
//!   little of the others as the format allows (their type byte, for the counts).
//!
//! Decoders treat their input as untrusted: they never panic, never read out of bounds and never
//! allocate because a length field says so. An error names the format, the byte offset and what
//! was wrong; the caller skips the frame and goes on.

pub mod brec;
pub mod capnproto;
pub mod fbs;
pub mod filter;
pub mod json;
pub mod protobuf;
pub mod raw;
pub mod sbe;

pub use filter::SymbolFilter;

/// A trade and a batch header for the codecs' unit tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::BatchHeader;
    use crate::message::{Message, Trade};
    use crate::price::{Price, Symbol};

    /// Trade `n`: its timestamp, trade id and price offset.
    pub fn trade(n: i64) -> Message<'static> {
        Message::TradeReport(Trade {
            sale_condition: 0x40,
            timestamp: n,
            symbol: Symbol::new("ZIEXT").unwrap(),
            size: 100,
            price: Price(10_000 + n),
            trade_id: n,
        })
    }

    /// A DEEP batch header with every field set.
    pub fn header() -> BatchHeader {
        BatchHeader {
            protocol_id: 0x8004,
            channel_id: 1,
            session_id: 2,
            first_sequence: 3,
            message_count: 0,
            send_time: 4,
            publish_time: 5,
        }
    }
}

use crate::message::Message;
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// Largest number of messages in one batch (an IEX-TP segment counts them in a u16).
pub const MAX_BATCH: usize = u16::MAX as usize;

/// Default largest frame a decoder or framer accepts, in bytes.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// A wire format, chosen at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// The IEX-TP segment as received, behind the publisher's 8-byte send timestamp.
    Raw,
    /// FIX Simple Binary Encoding, one template per message type behind the standard header.
    Sbe,
    /// FlatBuffers, size-prefixed.
    FlatBuffers,
    /// Cap'n Proto with the standard stream framing (segment table).
    Capnp,
    /// Cap'n Proto, packed.
    CapnpPacked,
    /// Newline-delimited JSON, one object per frame.
    Json,
    /// Protocol Buffers (prost), length-delimited.
    Protobuf,
    /// brec packets: hot message types as blocks, rare ones in the payload.
    Brec,
}

impl Format {
    /// Every format, in a fixed order.
    pub const ALL: [Format; 8] = [
        Format::Raw,
        Format::Sbe,
        Format::FlatBuffers,
        Format::Capnp,
        Format::CapnpPacked,
        Format::Json,
        Format::Protobuf,
        Format::Brec,
    ];

    /// The name used in configuration files and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Sbe => "sbe",
            Format::FlatBuffers => "flatbuffers",
            Format::Capnp => "capnp",
            Format::CapnpPacked => "capnp-packed",
            Format::Json => "json",
            Format::Protobuf => "protobuf",
            Format::Brec => "brec",
        }
    }

    /// The format's number in relay headers and handshakes.
    pub const fn id(self) -> u8 {
        match self {
            Format::Raw => 0,
            Format::Sbe => 1,
            Format::FlatBuffers => 2,
            Format::Capnp => 3,
            Format::CapnpPacked => 4,
            Format::Json => 5,
            Format::Protobuf => 6,
            Format::Brec => 7,
        }
    }

    /// The format for a number from [`Format::id`], if it is one of [`Format::ALL`].
    pub const fn from_id(id: u8) -> Option<Format> {
        let all = Format::ALL;
        let mut i = 0;
        while i < all.len() {
            if all[i].id() == id {
                return Some(all[i]);
            }
            i += 1;
        }
        None
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A format name that is not one of [`Format::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown format {0:?}: expected one of raw, sbe, flatbuffers, capnp, capnp-packed, json, protobuf, brec")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Format, UnknownFormat> {
        Format::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| UnknownFormat(s.to_string()))
    }
}

impl serde::Serialize for Format {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Format {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Format, D::Error> {
        let name = <Cow<'de, str>>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// What every frame says about its batch besides the messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BatchHeader {
    /// IEX message protocol id of the source (0x8003 TOPS, 0x8004 DEEP...).
    pub protocol_id: u16,
    /// IEX channel id.
    pub channel_id: u32,
    /// IEX session id.
    pub session_id: u32,
    /// Sequence number of the first message (of the next one, for an empty batch).
    pub first_sequence: i64,
    /// Messages in the batch. Encoders write the length of the slice they are given; decoders
    /// fill this in from the frame.
    pub message_count: u32,
    /// IEX send time of the segment, ns since the Unix epoch.
    pub send_time: i64,
    /// The publisher's send timestamp, ns since the Unix epoch (CLOCK_REALTIME), for latency.
    pub publish_time: i64,
}

impl BatchHeader {
    /// The header of an IEX-TP segment, with `publish_time` to be set by the publisher.
    pub fn from_segment(header: &crate::iextp::SegmentHeader) -> BatchHeader {
        BatchHeader {
            protocol_id: header.protocol_id,
            channel_id: header.channel_id,
            session_id: header.session_id,
            first_sequence: header.first_sequence,
            message_count: u32::from(header.message_count),
            send_time: header.send_time,
            publish_time: 0,
        }
    }
}

/// Why a batch could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// More messages than [`MAX_BATCH`].
    #[error("{0} messages in one batch; at most {MAX_BATCH} fit")]
    TooManyMessages(usize),
    /// A message the format cannot carry (e.g. an unknown message longer than the format allows).
    #[error("{format} cannot carry message {index}: {what}")]
    Unrepresentable {
        /// The format.
        format: Format,
        /// Index of the message in the batch.
        index: usize,
        /// Why.
        what: Cow<'static, str>,
    },
}

/// Why a frame could not be delimited or decoded. The frame is lost; the stream goes on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{format} frame: {what} at byte {offset}")]
pub struct DecodeError {
    /// The format being decoded.
    pub format: Format,
    /// Byte offset within the frame where the problem was found.
    pub offset: usize,
    /// What was wrong, naming the field where there is one.
    pub what: Cow<'static, str>,
}

impl DecodeError {
    /// An error at `offset` in a frame of `format`.
    pub fn new(format: Format, offset: usize, what: impl Into<Cow<'static, str>>) -> DecodeError {
        DecodeError { format, offset, what: what.into() }
    }
}

/// What decoders accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame in bytes; longer ones are rejected before anything is allocated.
    pub max_frame: usize,
    /// FlatBuffers only: skip the checks that memory safety does not need (alignment, the
    /// library verifier when it was asked for). Bounds are always checked; see [`fbs`].
    pub trust_flatbuffers: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_frame: DEFAULT_MAX_FRAME, trust_flatbuffers: false }
    }
}

/// One codec of each format, chosen at run time; all buffers inside are reused across frames.
pub enum Codec {
    /// See [`raw`].
    Raw(raw::RawCodec),
    /// See [`sbe`].
    Sbe(sbe::SbeCodec),
    /// See [`fbs`]. Boxed: its builder and scratch vectors make it several times larger than
    /// the other codecs, and the enum should not be sized by its largest member.
    FlatBuffers(Box<fbs::FlatBuffersCodec>),
    /// See [`capnproto`] (unpacked and packed).
    Capnp(capnproto::CapnpCodec),
    /// See [`json`].
    Json(json::JsonCodec),
    /// See [`protobuf`].
    Protobuf(protobuf::ProtobufCodec),
    /// See [`brec`].
    Brec(Box<brec::BrecCodec>),
}

impl Codec {
    /// A codec for `format` with the given decoding limits.
    pub fn new(format: Format, limits: Limits) -> Codec {
        match format {
            Format::Raw => Codec::Raw(raw::RawCodec::new(limits)),
            Format::Sbe => Codec::Sbe(sbe::SbeCodec::new(limits)),
            Format::FlatBuffers => Codec::FlatBuffers(Box::new(fbs::FlatBuffersCodec::new(limits))),
            Format::Capnp => Codec::Capnp(capnproto::CapnpCodec::new(limits, false)),
            Format::CapnpPacked => Codec::Capnp(capnproto::CapnpCodec::new(limits, true)),
            Format::Json => Codec::Json(json::JsonCodec::new(limits)),
            Format::Protobuf => Codec::Protobuf(protobuf::ProtobufCodec::new(limits)),
            Format::Brec => Codec::Brec(Box::new(brec::BrecCodec::new(limits))),
        }
    }

    /// The codec's format.
    pub fn format(&self) -> Format {
        match self {
            Codec::Raw(_) => Format::Raw,
            Codec::Sbe(_) => Format::Sbe,
            Codec::FlatBuffers(_) => Format::FlatBuffers,
            Codec::Capnp(c) => c.format(),
            Codec::Json(_) => Format::Json,
            Codec::Protobuf(_) => Format::Protobuf,
            Codec::Brec(_) => Format::Brec,
        }
    }

    /// Appends one complete frame for `header` and `messages` to `out`.
    #[inline]
    pub fn encode(
        &mut self,
        header: &BatchHeader,
        messages: &[Message<'_>],
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        if messages.len() > MAX_BATCH {
            return Err(EncodeError::TooManyMessages(messages.len()));
        }
        match self {
            Codec::Raw(c) => c.encode(header, messages, out),
            Codec::Sbe(c) => c.encode(header, messages, out),
            Codec::FlatBuffers(c) => c.encode(header, messages, out),
            Codec::Capnp(c) => c.encode(header, messages, out),
            Codec::Json(c) => c.encode(header, messages, out),
            Codec::Protobuf(c) => c.encode(header, messages, out),
            Codec::Brec(c) => c.encode(header, messages, out),
        }
    }

    /// Appends one frame for an IEX-TP segment: `raw` relays the segment's `bytes` as they came
    /// (whatever they hold), every other format encodes `messages`, the segment's messages that
    /// decode, under the segment's header.
    #[inline]
    pub fn encode_segment(
        &mut self,
        publish_time: i64,
        segment: &crate::iextp::Segment<'_>,
        bytes: &[u8],
        messages: &[Message<'_>],
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        match self {
            Codec::Raw(raw) => {
                raw.encode_segment(publish_time, bytes, out);
                Ok(())
            }
            codec => {
                codec.encode(&BatchHeader { publish_time, ..BatchHeader::from_segment(&segment.header) }, messages, out)
            }
        }
    }

    /// The length of the first complete frame at the start of `buf`, `None` if more bytes are
    /// needed to know or to hold it.
    #[inline]
    pub fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        match self {
            Codec::Raw(c) => c.frame_len(buf),
            Codec::Sbe(c) => c.frame_len(buf),
            Codec::FlatBuffers(c) => c.frame_len(buf),
            Codec::Capnp(c) => c.frame_len(buf),
            Codec::Json(c) => c.frame_len(buf),
            Codec::Protobuf(c) => c.frame_len(buf),
            Codec::Brec(c) => c.frame_len(buf),
        }
    }

    /// Decodes one complete frame (exactly the bytes [`Codec::frame_len`] delimited), handing
    /// each message to `visit` in order, and returns the batch header.
    #[inline]
    pub fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], visit: F) -> Result<BatchHeader, DecodeError> {
        match self {
            Codec::Raw(c) => c.decode(frame, visit),
            Codec::Sbe(c) => c.decode(frame, visit),
            Codec::FlatBuffers(c) => c.decode(frame, visit),
            Codec::Capnp(c) => c.decode(frame, visit),
            Codec::Json(c) => c.decode(frame, visit),
            Codec::Protobuf(c) => c.decode(frame, visit),
            Codec::Brec(c) => c.decode(frame, visit),
        }
    }

    /// Decodes one frame like [`Codec::decode`], but hands `visit` only the messages whose symbol
    /// `filter` holds; every other message is passed to `skip` as its IEX type byte, read
    /// without decoding the rest of it where the format allows (SBE, FlatBuffers, Cap'n Proto,
    /// raw: the type and symbol are read first; brec: its blocks' symbols; Protobuf and JSON
    /// parse the whole frame first). Messages without a symbol are skipped.
    #[inline]
    pub fn decode_filtered<F: FnMut(&Message<'_>), S: FnMut(u8)>(
        &mut self,
        frame: &[u8],
        filter: &SymbolFilter,
        mut visit: F,
        mut skip: S,
    ) -> Result<BatchHeader, DecodeError> {
        match self {
            Codec::Raw(c) => c.decode_filtered(frame, filter, visit, skip),
            Codec::Sbe(c) => c.decode_filtered(frame, filter, visit, skip),
            Codec::FlatBuffers(c) => c.decode_filtered(frame, filter, visit, skip),
            Codec::Capnp(c) => c.decode_filtered(frame, filter, visit, skip),
            Codec::Brec(c) => c.decode_filtered(frame, filter, visit, skip),
            Codec::Json(_) | Codec::Protobuf(_) => {
                self.decode(frame, |m| if filter.matches_message(m) { visit(m) } else { skip(m.kind()) })
            }
        }
    }
}

/// What makes an unknown message one the model could not have produced, if anything: the
/// formats that carry unknown messages as free-form bytes (Protobuf, JSON) refuse such ones.
pub(crate) fn unknown_problem(kind: u8, bytes: &[u8]) -> Result<(), &'static str> {
    if bytes.is_empty() {
        Err("unknown message with no bytes: they hold at least the type byte")
    } else if bytes.len() > u16::MAX as usize {
        Err("unknown message longer than 65535 bytes")
    } else if bytes[0] != kind {
        Err("unknown message whose bytes do not start with its type byte")
    } else if crate::message::kind::layout_len(kind).is_some() {
        Err("unknown message whose type byte is a known type")
    } else {
        Ok(())
    }
}

/// A reusable list of decoded messages, so a segment's messages can be collected for encoding
/// without allocating per segment even though each list borrows from a different packet.
#[derive(Default)]
pub struct MessageScratch {
    spare: Vec<Message<'static>>,
}

impl MessageScratch {
    /// An empty scratch list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lends an empty list that may borrow from `'a` data, for the duration of `f`.
    pub fn with<'a, R>(&mut self, f: impl FnOnce(&mut Vec<Message<'a>>) -> R) -> R {
        // Vec is covariant: a list of 'static messages is a list of 'a messages.
        let mut list: Vec<Message<'a>> = std::mem::take(&mut self.spare);
        let result = f(&mut list);
        list.clear();
        // Give the (now empty) allocation back under the 'static type. Collecting an emptied
        // `IntoIter` into a Vec of a same-layout type reuses the allocation in place.
        self.spare = list.into_iter().map(|_| -> Message<'static> { unreachable!("the list was cleared") }).collect();
        result
    }
}

/// Collects a segment's messages into `list` (cleared first). Blocks that do not decode are
/// skipped and counted in the returned value.
pub fn collect_segment<'a>(segment: &crate::iextp::Segment<'a>, list: &mut Vec<Message<'a>>) -> usize {
    list.clear();
    let mut skipped = 0;
    for block in segment.blocks() {
        match block.map(Message::parse) {
            Ok(Ok(message)) => list.push(message),
            _ => skipped += 1,
        }
    }
    skipped
}
