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
mod format_codec;
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
pub use format_codec::{Batch, Filtered, FilteredSink, FormatCodec};
pub use frame::{BatchHeader, DEFAULT_MAX_FRAME, DecodeError, EncodeError, Limits, MAX_BATCH};

/// A trade, a batch header, and one encode and decode for the codecs' unit tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::format_codec::FormatCodec;
    use super::frame::{BatchHeader, DecodeError};
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

    /// `messages` encoded by `codec` as one frame under `header`.
    pub fn encoded(mut codec: impl FormatCodec, header: &BatchHeader, messages: &[Message<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        codec.encode(header, messages, &mut out).unwrap();
        out
    }

    /// Each message's `Debug` text, as [`decoded`] gives it.
    pub fn debug(messages: &[Message<'_>]) -> Vec<String> {
        messages.iter().map(|m| format!("{m:?}")).collect()
    }

    /// `frame` decoded by `codec`: its header, and each message as its `Debug` text.
    pub fn decoded(codec: &mut impl FormatCodec, frame: &[u8]) -> Result<(BatchHeader, Vec<String>), DecodeError> {
        let mut seen = Vec::new();
        let header = codec.decode(frame, |m| seen.push(format!("{m:?}")))?;
        Ok((header, seen))
    }
}

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

/// `$body` for the codec inside a [`Codec`], bound to `$c`: the one list of its variants that
/// every method dispatches through.
macro_rules! with_codec {
    ($codec:expr, $c:ident => $body:expr) => {
        match $codec {
            Codec::Raw($c) => $body,
            Codec::Sbe($c) => $body,
            Codec::FlatBuffers($c) => $body,
            Codec::Capnp($c) => $body,
            Codec::Json($c) => $body,
            Codec::Protobuf($c) => $body,
            Codec::Brec($c) => $body,
        }
    };
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
}

/// A codec chosen at run time is a codec of its format: each method goes to the one inside.
impl FormatCodec for Codec {
    fn format(&self) -> Format {
        with_codec!(self, c => c.format())
    }

    #[inline]
    fn encode_batch(&mut self, batch: Batch<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        with_codec!(self, c => c.encode_batch(batch, out))
    }

    /// The format's own `encode` behind the dispatch, so that its checks and its `encode_batch`
    /// are compiled together, as one codec's are (through `encode_batch` above, SBE's encode
    /// took 1.12x as long: the format's code was no longer inlined into its arm).
    #[inline]
    fn encode(&mut self, header: &BatchHeader, messages: &[Message<'_>], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        with_codec!(self, c => c.encode(header, messages, out))
    }

    #[inline]
    fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        with_codec!(self, c => c.frame_len(buf))
    }

    #[inline]
    fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], visit: F) -> Result<BatchHeader, DecodeError> {
        with_codec!(self, c => c.decode(frame, visit))
    }

    #[inline]
    fn decode_to(&mut self, frame: &[u8], sink: &mut impl FilteredSink) -> Result<BatchHeader, DecodeError> {
        with_codec!(self, c => c.decode_to(frame, sink))
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
