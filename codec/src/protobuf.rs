//! Protocol Buffers through prost: one `Batch` message per frame, length-delimited as Protobuf
//! streams are (`encode_length_delimited`: a varint with the Batch's length, then the Batch).
//!
//! The schema, and why its fields have the types they have, is `codec/schema/marketdata.proto`:
//! the batch header's fields, then `repeated Message messages`, a `Message` being a oneof with
//! one case per IEX type byte (the price level update's side and trade report / trade break are
//! the case). Timestamps are sfixed64, symbols fixed64 (the 8 bytes, little-endian), the
//! trading-status reason fixed32, prices and other signed integers sint64, and every unsigned
//! field uint64 so that an out-of-range value reaches the range check instead of being truncated
//! by prost. An unknown IEX message is its bytes, the type byte first. The Rust types in
//! `codec/generated/protobuf/` are generated from the schema by `codec/schema/gen-protobuf.sh`.
//!
//! Decoding treats the frame as untrusted and is all-or-nothing: a frame is decoded whole (prost
//! into a `Batch` reused across frames), then checked whole, and only then visited, so a bad frame
//! visits nothing (as JSON, unlike the streaming binary decoders). Before prost runs, one walk over
//! the Batch's top-level fields counts the messages, so a frame claiming more than
//! [`MAX_BATCH`] is refused before prost allocates for them (a 2-byte empty message would
//! otherwise cost a decoded `Message` of about 120 bytes). Errors carry the byte offset in the
//! frame: where prost stopped, or the start of the field or message that was out of range.
//!
//! Fields follow protobuf's rules: a field this schema does not know (one added by a newer
//! schema) is skipped, a repeated scalar field keeps its last value, and a message whose oneof is
//! unset (a message type added by a newer schema) is refused, since the model has nothing to make
//! of it. Deprecated group fields are refused at the top level.
//!
//! Allocations: none in steady state for known message types. The decoded and the encoded
//! `Batch` keep their message vectors across frames; an unknown IEX message costs one allocation
//! when decoded (prost gives each `bytes` field a fresh `Vec`), and none when encoded (its
//! buffer is taken from a pool the codec refills from the previous frame's unknown messages).

use super::format::Format;
use super::frame::{BatchHeader, DecodeError, EncodeError, Limits, MAX_BATCH, unknown_problem};
use crate::format_codec::{Batch, FormatCodec};
use mdrelay_iex::for_each_message_type;
use mdrelay_iex::message::{
    AuctionInformation, Message, OfficialPrice, OperationalHaltStatus, PriceLevelUpdate, QuoteUpdate,
    RetailLiquidityIndicator, SecurityDirectory, SecurityEvent, ShortSalePriceTestStatus, Side, SystemEvent, Trade,
    TradingStatus, UnknownMessage,
};
use mdrelay_iex::price::{Price, Symbol};
use prost::Message as _;
use std::borrow::Cow;

/// The types `codec/schema/gen-protobuf.sh` generates from `codec/schema/marketdata.proto`;
/// generated code is neither formatted nor linted.
#[rustfmt::skip]
#[allow(dead_code, missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
#[path = "../generated/protobuf/mdrelay.v1.rs"]
mod pb;

use pb::message::Kind;

/// Longest unknown message carried, in bytes: as long as an IEX-TP message block can be.
pub const MAX_UNKNOWN_LEN: usize = u16::MAX as usize;

/// Longest varint: 10 bytes of 7 bits hold 64.
pub const MAX_VARINT_LEN: usize = 10;

/// The Batch's `messages` field number.
const MESSAGES_FIELD: u64 = 7;

/// Protobuf codec; the decoded and the encoded `Batch` are reused across frames.
#[derive(Debug, Default)]
pub struct ProtobufCodec {
    limits: Limits,
    /// The frame being decoded, merged into after `clear()`: its message vector keeps its
    /// capacity, so steady-state decoding allocates nothing for known message types.
    decoded: pb::Batch,
    /// The frame being encoded, refilled the same way.
    encoding: pb::Batch,
    /// Byte buffers of the previous encoded frame's unknown messages, reused for the next ones.
    spare_bytes: Vec<Vec<u8>>,
}

impl ProtobufCodec {
    /// A codec with the given decoding limits.
    pub fn new(limits: Limits) -> Self {
        ProtobufCodec { limits, ..ProtobufCodec::default() }
    }
}

impl FormatCodec for ProtobufCodec {
    /// Appends one frame (the varint length, then the Batch) to `out`. Unknown messages must be
    /// what the model makes of an IEX block: 1 to 65535 bytes starting with their type byte, which
    /// is no known type; otherwise the batch is refused and `out` left as it was.
    fn encode_batch(&mut self, batch: Batch<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let Batch { header, messages, .. } = batch;
        let batch = &mut self.encoding;
        // Keep the previous frame's unknown-message buffers before their messages are dropped.
        for m in &mut batch.messages {
            if let Some(Kind::Unknown(u)) = &mut m.kind {
                self.spare_bytes.push(std::mem::take(&mut u.bytes));
            }
        }
        batch.messages.clear();
        batch.protocol_id = u64::from(header.protocol_id);
        batch.channel_id = u64::from(header.channel_id);
        batch.session_id = u64::from(header.session_id);
        batch.first_sequence = header.first_sequence;
        batch.send_time = header.send_time;
        batch.publish_time = header.publish_time;
        for (index, message) in messages.iter().enumerate() {
            let kind = match message {
                Message::Unknown(m) => {
                    unknown_problem(m.kind, m.bytes).map_err(|what| EncodeError::Unrepresentable {
                        format: Format::Protobuf,
                        index,
                        what: what.into(),
                    })?;
                    let mut bytes = self.spare_bytes.pop().unwrap_or_default();
                    bytes.clear();
                    bytes.extend_from_slice(m.bytes);
                    Kind::Unknown(pb::Unknown { bytes })
                }
                known => to_wire(known),
            };
            batch.messages.push(pb::Message { kind: Some(kind) });
        }
        // Writing into a Vec cannot run out of room: it grows (and keeps its capacity for the
        // next frame).
        batch.encode_length_delimited(out).map_err(|e| EncodeError::Unrepresentable {
            format: Format::Protobuf,
            index: 0,
            what: e.to_string().into(),
        })
    }

    fn format(&self) -> Format {
        Format::Protobuf
    }

    /// The length of the first frame at the start of `buf` (its varint prefix and the Batch it
    /// announces); `None` while bytes are missing. An error for a prefix that is not a varint of
    /// at most 10 bytes, or that announces more than `max_frame` bytes in all, which is known
    /// from the prefix's first bytes, before anything is read or allocated for the frame.
    fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        let max = self.limits.max_frame as u64;
        let mut value = 0u64;
        for (i, &byte) in buf.iter().take(MAX_VARINT_LEN).enumerate() {
            if i == MAX_VARINT_LEN - 1 && byte > 1 {
                return Err(if byte & 0x80 != 0 {
                    error(i, "the length prefix is a varint longer than 10 bytes")
                } else {
                    error(i, "the length prefix overflows 64 bits")
                });
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            // The bytes still to come only add to the length: refuse it as soon as it is over.
            let total = value.saturating_add(i as u64 + 1);
            if total > max {
                return Err(error(
                    0,
                    format!("the length prefix announces a frame of at least {total} bytes, over the {max}-byte limit"),
                ));
            }
            if byte & 0x80 == 0 {
                // total <= max_frame, a usize.
                let total = total as usize;
                return Ok((buf.len() >= total).then_some(total));
            }
        }
        Ok(None)
    }

    /// Decodes one frame (exactly the bytes [`ProtobufCodec::frame_len`] delimited), then hands
    /// each message to `visit` in order and returns the batch header. The whole frame is decoded
    /// and checked before the first message is visited, so a bad frame visits nothing.
    fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], mut visit: F) -> Result<BatchHeader, DecodeError> {
        let max = self.limits.max_frame;
        if frame.len() > max {
            return Err(error(0, format!("frame of {} bytes exceeds the {max}-byte limit", frame.len())));
        }
        let body = match self.frame_len(frame)? {
            Some(len) if len == frame.len() => {
                // The prefix is the varint's bytes: those up to the first without a continuation bit.
                let prefix = frame.iter().position(|&b| b & 0x80 == 0).map_or(0, |i| i + 1);
                &frame[prefix..]
            }
            Some(len) => return Err(error(len, format!("{} bytes after the frame", frame.len() - len))),
            None if frame.is_empty() => return Err(error(0, "empty frame: no length prefix")),
            None => return Err(error(frame.len(), "the frame is shorter than its length prefix says")),
        };
        let prefix = frame.len() - body.len();
        let walk = walk_top_level(body).map_err(|(at, what)| error(prefix + at, what))?;

        self.decoded.clear();
        let mut rest = body;
        if let Err(e) = self.decoded.merge(&mut rest) {
            return Err(from_prost(prefix + body.len() - rest.len(), &e));
        }
        let batch = &self.decoded;
        let field = |n: usize| prefix + walk.header_at[n];
        let protocol_id = u16::try_from(batch.protocol_id)
            .map_err(|_| out_of_range(field(0), "Batch.protocol_id", batch.protocol_id, u16::MAX.into()))?;
        let channel_id = u32::try_from(batch.channel_id)
            .map_err(|_| out_of_range(field(1), "Batch.channel_id", batch.channel_id, u32::MAX.into()))?;
        let session_id = u32::try_from(batch.session_id)
            .map_err(|_| out_of_range(field(2), "Batch.session_id", batch.session_id, u32::MAX.into()))?;
        // Checked whole before any message is visited, so a bad frame visits nothing; the
        // conversion is a few moves per message, cheap next to prost's decoding.
        for (index, message) in batch.messages.iter().enumerate() {
            if let Err(invalid) = to_model(message) {
                return Err(invalid_message(body, prefix, index, invalid));
            }
        }
        for (index, message) in batch.messages.iter().enumerate() {
            match to_model(message) {
                Ok(m) => visit(&m),
                Err(invalid) => return Err(invalid_message(body, prefix, index, invalid)),
            }
        }
        Ok(BatchHeader {
            protocol_id,
            channel_id,
            session_id,
            first_sequence: batch.first_sequence,
            // At most MAX_BATCH, which the walk checked.
            message_count: batch.messages.len() as u32,
            send_time: batch.send_time,
            publish_time: batch.publish_time,
        })
    }
}

#[cold]
fn error(offset: usize, what: impl Into<Cow<'static, str>>) -> DecodeError {
    DecodeError::new(Format::Protobuf, offset, what)
}

#[cold]
fn out_of_range(offset: usize, field: &str, value: u64, max: u64) -> DecodeError {
    error(offset, format!("{field} {value} is out of range (at most {max})"))
}

/// prost's error at `offset`, without the "failed to decode Protobuf message" every one starts
/// with (the format is already named).
#[cold]
fn from_prost(offset: usize, e: &prost::DecodeError) -> DecodeError {
    let text = e.to_string();
    let what = text.strip_prefix("failed to decode Protobuf message: ").map(str::to_string).unwrap_or(text);
    error(offset, what)
}

// ---- The top-level walk ----

/// What the walk over a Batch's top-level fields learned.
struct Walk {
    /// Offset in the body of the last protocol_id, channel_id and session_id field (the one whose
    /// value counts), 0 when absent.
    header_at: [usize; 3],
}

/// Reads a varint at `*at` in `body`, advancing past it.
#[inline(always)]
fn read_varint(body: &[u8], at: &mut usize) -> Result<u64, (usize, &'static str)> {
    let start = *at;
    let mut value = 0u64;
    for i in 0..MAX_VARINT_LEN {
        let Some(&byte) = body.get(start + i) else {
            return Err((start, "a varint is cut short by the end of the frame"));
        };
        if i == MAX_VARINT_LEN - 1 && byte > 1 {
            return Err((start, "a varint is longer than 10 bytes or overflows 64 bits"));
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *at = start + i + 1;
            return Ok(value);
        }
    }
    Err((start, "a varint is longer than 10 bytes"))
}

/// Reads the top-level field at `*at` in `body` and skips its value, advancing past it; returns
/// its field number. Only what the walk needs is checked; prost checks the rest.
#[inline(always)]
fn next_field(body: &[u8], at: &mut usize) -> Result<u64, (usize, Cow<'static, str>)> {
    let field_at = *at;
    let key = read_varint(body, at).map_err(|(o, w)| (o, w.into()))?;
    let (number, wire_type) = (key >> 3, key & 7);
    let len = match wire_type {
        0 => {
            read_varint(body, at).map_err(|(o, w)| (o, w.into()))?;
            0
        }
        1 => 8,
        5 => 4,
        2 => read_varint(body, at).map_err(|(o, w)| (o, w.into()))?,
        3 | 4 => return Err((field_at, format!("field {number} is a group, which this schema does not use").into())),
        _ => return Err((field_at, format!("field {number} has the invalid wire type {wire_type}").into())),
    };
    if len > (body.len() - *at) as u64 {
        return Err((field_at, format!("field {number} runs {len} bytes past the end of the frame").into()));
    }
    // len <= the bytes left, a usize.
    *at += len as usize;
    Ok(number)
}

/// Walks the Batch's top-level fields: counts the messages (refusing more than [`MAX_BATCH`]
/// before prost allocates for them) and notes where the header fields are, for errors.
fn walk_top_level(body: &[u8]) -> Result<Walk, (usize, Cow<'static, str>)> {
    let mut walk = Walk { header_at: [0; 3] };
    let mut messages = 0usize;
    let mut at = 0;
    while at < body.len() {
        let field_at = at;
        match next_field(body, &mut at)? {
            number @ 1..=3 => walk.header_at[number as usize - 1] = field_at,
            MESSAGES_FIELD => {
                messages += 1;
                if messages > MAX_BATCH {
                    return Err((field_at, format!("more than {MAX_BATCH} messages in one batch").into()));
                }
            }
            _ => {}
        }
    }
    Ok(walk)
}

/// Offset in the body of the `index`th message (found again by walking; only for errors).
#[cold]
fn message_at(body: &[u8], index: usize) -> usize {
    let mut at = 0;
    let mut seen = 0;
    while at < body.len() {
        let field_at = at;
        match next_field(body, &mut at) {
            Ok(MESSAGES_FIELD) if seen == index => return field_at,
            Ok(MESSAGES_FIELD) => seen += 1,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    0
}

// ---- Wire types and the model ----

/// Why a decoded message is not one of the model's.
#[derive(Clone, Copy, Debug)]
enum Invalid {
    /// No oneof case set.
    NoKind,
    /// A field's value outside its model type.
    OutOfRange { field: &'static str, value: u64, max: u64 },
    /// An unknown message the model could not have produced.
    Unknown(&'static str),
}

#[cold]
fn invalid_message(body: &[u8], prefix: usize, index: usize, invalid: Invalid) -> DecodeError {
    let offset = prefix + message_at(body, index);
    match invalid {
        Invalid::NoKind => {
            error(offset, format!("message {index} has no kind set (a message type this schema does not know)"))
        }
        Invalid::OutOfRange { field, value, max } => {
            error(offset, format!("message {index}: {field} {value} is out of range (at most {max})"))
        }
        Invalid::Unknown(what) => error(offset, format!("message {index}: {what}")),
    }
}

/// How a model field travels in the schema's types: every unsigned field as uint64 (checked
/// against the model's range when read), symbols as fixed64, the trading-status reason as
/// fixed32, the rest as themselves.
trait PbField: Sized {
    /// The field's type in the generated code.
    type Wire;
    /// The field as it is sent.
    fn to_wire(self) -> Self::Wire;
    /// The field as it was received; `field` names it in an out-of-range error.
    fn from_wire(wire: Self::Wire, field: &'static str) -> Result<Self, Invalid>;
}

macro_rules! pb_unsigned_fields {
    ($($int:ty),*) => {$(
        impl PbField for $int {
            type Wire = u64;
            #[inline(always)]
            fn to_wire(self) -> u64 {
                self.into()
            }
            #[inline(always)]
            fn from_wire(value: u64, field: &'static str) -> Result<Self, Invalid> {
                <$int>::try_from(value).map_err(|_| Invalid::OutOfRange { field, value, max: <$int>::MAX.into() })
            }
        }
    )*};
}
pb_unsigned_fields!(u8, u32);

impl PbField for i64 {
    type Wire = i64;
    #[inline(always)]
    fn to_wire(self) -> i64 {
        self
    }
    #[inline(always)]
    fn from_wire(wire: i64, _: &'static str) -> Result<Self, Invalid> {
        Ok(wire)
    }
}

impl PbField for Price {
    type Wire = i64;
    #[inline(always)]
    fn to_wire(self) -> i64 {
        self.0
    }
    #[inline(always)]
    fn from_wire(wire: i64, _: &'static str) -> Result<Self, Invalid> {
        Ok(Price(wire))
    }
}

impl PbField for Symbol {
    type Wire = u64;
    #[inline(always)]
    fn to_wire(self) -> u64 {
        u64::from_le_bytes(self.0)
    }
    #[inline(always)]
    fn from_wire(wire: u64, _: &'static str) -> Result<Self, Invalid> {
        Ok(Symbol(wire.to_le_bytes()))
    }
}

impl PbField for [u8; 4] {
    type Wire = u32;
    #[inline(always)]
    fn to_wire(self) -> u32 {
        u32::from_le_bytes(self)
    }
    #[inline(always)]
    fn from_wire(wire: u32, _: &'static str) -> Result<Self, Invalid> {
        Ok(wire.to_le_bytes())
    }
}

/// The conversions between the model and the schema's types from the message table: each type
/// byte is a `Message` case named as in the table, holding the schema message named as the
/// model's struct, its fields named as the model's.
macro_rules! pb_conversions {
    ($($wire:ident $name:literal = $kind:ident => $variant:ident($ty:ident { $($fixed:ident: $fixed_value:path),* } {
        $($field:ident: $field_type:tt),* $(,)?
    })),* $(,)?) => {
        /// The model's message for a decoded one, borrowing an unknown message's bytes.
        #[inline(always)]
        fn to_model(message: &pb::Message) -> Result<Message<'_>, Invalid> {
            let Some(kind) = &message.kind else { return Err(Invalid::NoKind) };
            Ok(match kind {
                $(Kind::$wire(m) => Message::$variant($ty {
                    $($fixed: $fixed_value,)*
                    $($field: PbField::from_wire(m.$field, concat!(stringify!($ty), ".", stringify!($field)))?,)*
                }),)*
                Kind::Unknown(u) => {
                    let bytes = u.bytes.as_slice();
                    let kind = bytes.first().copied().unwrap_or(0);
                    unknown_problem(kind, bytes).map_err(Invalid::Unknown)?;
                    Message::Unknown(UnknownMessage { kind, bytes })
                }
            })
        }

        /// The wire message for a known model message (unknown ones are built by the caller,
        /// which lends them a reused buffer).
        #[inline(always)]
        fn to_wire(message: &Message<'_>) -> Kind {
            match message {
                $(Message::$variant(m @ $ty { $($fixed: $fixed_value,)* .. }) => {
                    Kind::$wire(pb::$ty { $($field: m.$field.to_wire(),)* })
                })*
                // The caller builds unknown messages; an empty one would be refused by the
                // decoder, but this arm is never reached.
                Message::Unknown(_) => Kind::Unknown(pb::Unknown::default()),
            }
        }
    };
}
for_each_message_type!(pb_conversions);

#[cfg(test)]
mod tests {
    use super::super::fixtures::{header, trade};
    use super::*;

    fn codec() -> ProtobufCodec {
        ProtobufCodec::new(Limits::default())
    }

    /// `batch` as a frame, through prost alone.
    fn frame_of(batch: &pb::Batch) -> Vec<u8> {
        batch.encode_length_delimited_to_vec()
    }

    fn wire_trade(size: u64, sale_condition: u64) -> pb::Message {
        let t = pb::Trade { sale_condition, timestamp: 1, symbol: 2, size, price: 3, trade_id: 4 };
        pb::Message { kind: Some(Kind::TradeReport(t)) }
    }

    fn decoded(frame: &[u8]) -> Result<(BatchHeader, Vec<String>), DecodeError> {
        let mut seen = Vec::new();
        let header = codec().decode(frame, |m| seen.push(format!("{m:?}")))?;
        Ok((header, seen))
    }

    #[test]
    fn a_batch_round_trips_and_reuses_its_buffers() {
        let mut codec = codec();
        let unknown = Message::Unknown(UnknownMessage { kind: b'z', bytes: b"zabc" });
        let odd = Message::TradingStatus(TradingStatus {
            status: 0xff,
            timestamp: i64::MIN,
            symbol: Symbol([0, 0xff, b' ', 7, 0x80, b'A', 0, 1]),
            reason: [0xff, 0, b' ', 0x80],
        });
        let messages = [trade(1), unknown, odd, trade(-2)];
        for _ in 0..3 {
            let mut out = vec![0xaa];
            codec.encode(&header(), &messages, &mut out).unwrap();
            assert_eq!(codec.frame_len(&out[1..]).unwrap(), Some(out.len() - 1));
            let mut seen = Vec::new();
            let got = codec.decode(&out[1..], |m| seen.push(format!("{m:?}"))).unwrap();
            assert_eq!(got, BatchHeader { message_count: 4, ..header() });
            assert_eq!(seen, messages.iter().map(|m| format!("{m:?}")).collect::<Vec<_>>());
        }
        // The unknown message's buffer went back to the pool and came out again.
        assert!(codec.spare_bytes.is_empty());
    }

    #[test]
    fn the_length_prefix_is_a_varint_of_at_most_ten_bytes() {
        let codec = codec();
        // A padded 10-byte varint is still a varint (protobuf accepts non-minimal encodings).
        let mut padded = vec![0x80 | 2, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00];
        assert_eq!(codec.frame_len(&padded).unwrap(), None);
        padded.extend_from_slice(&[0x08, 0x01]);
        assert_eq!(codec.frame_len(&padded).unwrap(), Some(12));
        let (h, seen) = decoded(&padded).unwrap();
        assert_eq!((h.protocol_id, seen.len()), (1, 0));
        // A continuation bit on the tenth byte: longer than 10 bytes.
        let overlong = [0x80u8; 11];
        let e =
            ProtobufCodec::new(Limits { max_frame: usize::MAX, ..Limits::default() }).frame_len(&overlong).unwrap_err();
        assert_eq!(e.offset, 9, "{e}");
        assert!(e.what.contains("longer than 10 bytes"), "{e}");
        // A tenth byte above 1 overflows 64 bits.
        let mut overflow = [0x80u8; 10];
        overflow[9] = 0x02;
        let e =
            ProtobufCodec::new(Limits { max_frame: usize::MAX, ..Limits::default() }).frame_len(&overflow).unwrap_err();
        assert!(e.offset == 9 && e.what.contains("overflows"), "{e}");
        // The largest 10-byte varint is over any limit.
        let largest = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(codec.frame_len(&largest).unwrap_err().what.contains("over the"));
    }

    #[test]
    fn a_length_over_the_limit_is_refused_from_the_first_bytes() {
        let codec = ProtobufCodec::new(Limits { max_frame: 1000, ..Limits::default() });
        // 1000 bytes in all is the most: a 2-byte prefix announcing 998.
        let at_limit = [0x80 | (998 & 0x7f) as u8, (998 >> 7) as u8];
        assert_eq!(codec.frame_len(&at_limit).unwrap(), None);
        let over = [0x80 | (999 & 0x7f) as u8, (999 >> 7) as u8];
        let e = codec.frame_len(&over).unwrap_err();
        assert_eq!(e.offset, 0);
        assert!(e.what.contains("1001") && e.what.contains("1000-byte limit"), "{e}");
        // Known to be over before the varint's end: its low bits alone are 16383 (+ 3 bytes).
        assert!(codec.frame_len(&[0xff, 0xff]).is_err());
        // And never None for an incomplete varint that is already over.
        assert!(codec.frame_len(&[0xff, 0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn split_reads_are_none_until_the_last_byte() {
        let codec = codec();
        let messages: Vec<Message<'_>> = (0..10).map(trade).collect();
        let mut frame = Vec::new();
        let mut enc = ProtobufCodec::new(Limits::default());
        enc.encode(&header(), &messages, &mut frame).unwrap();
        assert!(frame[0] & 0x80 != 0, "a two-byte prefix, so a cut can fall inside it");
        for cut in 0..frame.len() {
            assert_eq!(codec.frame_len(&frame[..cut]).unwrap(), None, "cut at {cut}");
        }
        let mut two = frame.clone();
        two.extend_from_slice(&frame);
        assert_eq!(codec.frame_len(&two).unwrap(), Some(frame.len()));
        // decode wants exactly one frame.
        assert!(decoded(&two).unwrap_err().what.contains("after the frame"));
        assert!(decoded(&frame[..frame.len() - 1]).unwrap_err().what.contains("shorter"));
        assert!(decoded(&[]).unwrap_err().what.contains("empty"));
    }

    #[test]
    fn out_of_range_values_are_errors_naming_the_field_and_its_message() {
        let mut batch = pb::Batch {
            messages: vec![wire_trade(1, 0), wire_trade(u64::from(u32::MAX) + 1, 0)],
            ..Default::default()
        };
        let frame = frame_of(&batch);
        let e = decoded(&frame).unwrap_err();
        assert!(e.what.contains("message 1") && e.what.contains("Trade.size 4294967296"), "{e}");
        // At the second message: after the 1-byte prefix and the first message.
        let first = frame_of(&pb::Batch { messages: vec![wire_trade(1, 0)], ..Default::default() }).len();
        assert_eq!(e.offset, first, "{e}");
        batch.messages[1] = wire_trade(1, 256);
        assert!(decoded(&frame_of(&batch)).unwrap_err().what.contains("Trade.sale_condition 256"));
        for (field, value) in [("protocol_id", 1 << 16), ("channel_id", 1 << 32), ("session_id", 1 << 32)] {
            let mut b = pb::Batch::default();
            match field {
                "protocol_id" => b.protocol_id = value,
                "channel_id" => b.channel_id = value,
                _ => b.session_id = value,
            }
            let e = decoded(&frame_of(&b)).unwrap_err();
            assert!(e.what.contains(&format!("Batch.{field} {value}")), "{e}");
            assert_eq!(e.offset, 1, "{e}");
        }
        // A bad frame visits nothing, not even the messages before the bad one.
        let mut visits = 0;
        let bad = frame_of(&pb::Batch { messages: vec![wire_trade(1, 0), wire_trade(1, 300)], ..Default::default() });
        assert!(codec().decode(&bad, |_| visits += 1).is_err());
        assert_eq!(visits, 0);
    }

    #[test]
    fn a_message_without_a_kind_is_refused_and_one_with_a_newer_field_is_read() {
        let empty =
            frame_of(&pb::Batch { messages: vec![wire_trade(1, 0), pb::Message::default()], ..Default::default() });
        let e = decoded(&empty).unwrap_err();
        assert!(e.what.contains("message 1 has no kind"), "{e}");
        // Fields a newer schema added, at the top level, in a message and in a trade, are skipped.
        let plain = frame_of(&pb::Batch { protocol_id: 5, messages: vec![wire_trade(7, 1)], ..Default::default() });
        let mut body = plain[1..].to_vec();
        // Batch field 99 (varint 300), field 100 (4 bytes), field 101 (8 bytes), field 102 (bytes).
        body.extend_from_slice(&[0x98, 0x06, 0xac, 0x02, 0xa5, 0x06, 1, 2, 3, 4, 0xa9, 0x06, 0, 0, 0, 0, 0, 0, 0, 0]);
        body.extend_from_slice(&[0xb2, 0x06, 2, 9, 9]);
        // A message (field 7) whose trade (Message field 11) has field 20 (varint 1) after its
        // own fields, and the Message a field 16 (varint 1).
        let trade = pb::Trade { size: 7, sale_condition: 1, timestamp: 1, symbol: 2, price: 3, trade_id: 4 };
        let mut inner = trade.encode_to_vec();
        inner.extend_from_slice(&[0xa0, 0x01, 0x01]);
        let mut message = vec![0x5a, inner.len() as u8];
        message.extend_from_slice(&inner);
        message.extend_from_slice(&[0x80, 0x01, 0x01]);
        body.push(0x3a);
        body.push(message.len() as u8);
        body.extend_from_slice(&message);
        let mut frame = vec![body.len() as u8];
        frame.extend_from_slice(&body);
        let (h, seen) = decoded(&frame).unwrap();
        assert_eq!((h.protocol_id, h.message_count), (5, 2));
        assert_eq!(seen[0], seen[1]);
    }

    #[test]
    fn unknown_messages_must_be_what_the_model_makes() {
        for (bytes, what) in [(&b""[..], "no bytes"), (&b"Tknown"[..], "known type")] {
            let m = pb::Message { kind: Some(Kind::Unknown(pb::Unknown { bytes: bytes.to_vec() })) };
            let e = decoded(&frame_of(&pb::Batch { messages: vec![m], ..Default::default() })).unwrap_err();
            assert!(e.what.contains(what), "{e}");
        }
        let long = vec![b'z'; MAX_UNKNOWN_LEN + 1];
        let m = pb::Message { kind: Some(Kind::Unknown(pb::Unknown { bytes: long.clone() })) };
        assert!(decoded(&frame_of(&pb::Batch { messages: vec![m], ..Default::default() })).is_err());
        // The encoder refuses the same, leaving the output as it was.
        let mut out = vec![1, 2, 3];
        let bad = Message::Unknown(UnknownMessage { kind: b'z', bytes: &long });
        assert!(codec().encode(&header(), &[trade(1), bad], &mut out).is_err());
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn wire_errors_are_reported_with_their_offset() {
        // More than MAX_BATCH empty messages: refused by the walk, before prost decodes one.
        let mut body = Vec::new();
        for _ in 0..=MAX_BATCH {
            body.extend_from_slice(&[0x3a, 0x00]);
        }
        let mut frame = Vec::new();
        prost::encode_length_delimiter(body.len(), &mut frame).unwrap();
        let prefix = frame.len();
        frame.extend_from_slice(&body);
        let e = decoded(&frame).unwrap_err();
        assert!(e.what.contains("more than 65535 messages"), "{e}");
        assert_eq!(e.offset, prefix + 2 * MAX_BATCH);
        // A group, a bad wire type, a length past the end, a cut varint.
        for (body, at, what) in [
            (&[0x08, 0x01, 0x0b][..], 3, "group"),
            (&[0x0e][..], 1, "wire type 6"),
            (&[0x3a, 0x05, 0x00][..], 1, "past the end"),
            (&[0x08, 0x80][..], 2, "cut short"),
        ] {
            let mut frame = vec![body.len() as u8];
            frame.extend_from_slice(body);
            let e = decoded(&frame).unwrap_err();
            assert!(e.offset == at && e.what.contains(what), "{e}");
        }
        // Errors only prost finds: a wrong wire type inside a message.
        let frame = [4, 0x3a, 0x02, 0x5d, 0x00];
        let e = decoded(&frame).unwrap_err();
        assert!(e.what.contains("wire type"), "{e}");
        assert!(!e.what.contains("failed to decode"), "{e}");
    }
}
