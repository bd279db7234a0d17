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

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod brec;
pub mod capnproto;
pub mod fbs;
pub mod filter;
mod format;
mod frame;
pub mod json;
pub mod protobuf;
pub mod raw;
pub mod resegment;
pub mod sbe;

// Defined in modules of their own, which the codecs import directly, so that no codec depends on
// the dispatch below; re-exported here, where the crate's users find them.
pub use filter::SymbolFilter;
pub use format::{Format, UnknownFormat};
pub use frame::{BatchHeader, DEFAULT_MAX_FRAME, DecodeError, EncodeError, Limits, MAX_BATCH};

/// A trade and a batch header for the codecs' unit tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::frame::BatchHeader;
    use mdrelay_iex::message::{Message, Trade};
    use mdrelay_iex::price::{Price, Symbol};

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

use frame::batch_count;
use mdrelay_iex::message::Message;

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
        batch_count(messages)?;
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
        segment: &mdrelay_iex::iextp::Segment<'_>,
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
pub fn collect_segment<'a>(segment: &mdrelay_iex::iextp::Segment<'a>, list: &mut Vec<Message<'a>>) -> usize {
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
