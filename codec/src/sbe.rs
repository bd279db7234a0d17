//! FIX Simple Binary Encoding: a `Batch` message carrying the segment header, then one standard
//! SBE message per IEX message, its templateId being the IEX type byte. The schema, and why it is
//! laid out so, is `codec/schema/marketdata.xml`; the codecs in `codec/generated/sbe/` are
//! generated from it by `codec/schema/gen-sbe.sh`.
//!
//! Frame: `Batch` (8-byte header + 36-byte block), then `Batch.messageCount` messages, each an
//! 8-byte header and its template's block (plus a `uint32` length and the bytes, for
//! `UnknownMessage`). Nothing states the frame's total length: a stream reader finds the end by
//! walking the message headers (see [`SbeCodec::frame_len`]).
//!
//! The generated decoders index their buffer (a short one panics) and only `debug_assert` the
//! templateId, so before one is used this module checks the header's schemaId, version and
//! templateId, that blockLength is at least the template's, and that the bytes are there; it then
//! hands the decoder exactly the template's bytes as a fixed-size array, which makes every field
//! read a load at a constant offset with no bounds check left.

use super::format::Format;
use super::frame::{BatchHeader, DecodeError, EncodeError, Limits};
use crate::format_codec::{Batch, FilteredSink, FormatCodec};
use mdrelay_iex::for_each_message_type;
use mdrelay_iex::message::{
    AuctionInformation, IexField, Message, OfficialPrice, OperationalHaltStatus, PriceLevelUpdate, QuoteUpdate,
    RetailLiquidityIndicator, SecurityDirectory, SecurityEvent, ShortSalePriceTestStatus, Side, SystemEvent, Trade,
    TradingStatus, UnknownMessage, kind,
};
use mdrelay_iex::price::{Price, Symbol};

/// The codecs `codec/schema/gen-sbe.sh` generates from `codec/schema/marketdata.xml`; generated
/// code is neither formatted nor linted.
#[rustfmt::skip]
#[allow(dead_code, unused_imports, clippy::all, clippy::pedantic, clippy::nursery, clippy::undocumented_unsafe_blocks)]
#[path = "../generated/sbe/mod.rs"]
mod generated;

use generated::message_header_codec::{MessageHeaderDecoder, MessageHeaderEncoder};
use generated::{
    ReadBuf, WriteBuf, Writer, batch_codec, message_header_codec, price_level_update_buy_codec,
    price_level_update_sell_codec, system_event_codec, unknown_message_codec,
};

/// The schema's id, in every message header.
pub const SCHEMA_ID: u16 = generated::SBE_SCHEMA_ID;

/// The schema version this codec writes and accepts.
pub const SCHEMA_VERSION: u16 = generated::SBE_SCHEMA_VERSION;

/// Length of the standard message header in front of every message.
pub const HEADER_LEN: usize = message_header_codec::ENCODED_LENGTH;

/// Length of the `Batch` message that starts every frame.
pub const BATCH_LEN: usize = HEADER_LEN + batch_codec::SBE_BLOCK_LENGTH as usize;

/// Longest unknown message carried (as long as an IEX-TP message block can be).
pub const MAX_UNKNOWN_LEN: usize = u16::MAX as usize;

/// Offset of `Batch.messageCount` in a frame: the last field of the `Batch` block.
const MESSAGE_COUNT_AT: usize = BATCH_LEN - size_of::<u16>();

/// `varDataEncoding.length` is a uint32 (see the schema for why not a uint16).
const VAR_DATA_LENGTH_LEN: usize = size_of::<u32>();

const _: () = assert!(
    price_level_update_buy_codec::SBE_BLOCK_LENGTH == price_level_update_sell_codec::SBE_BLOCK_LENGTH,
    "the price level update templates differ: decode_message reads both with one decoder"
);

/// Where every fixed-size template with a symbol has it within its block (checked by a test
/// against the generated decoders).
const SYMBOL_AT: usize = 9;

/// The shortest message a frame can hold: an `UnknownMessage` of one byte. Bounds the frame
/// length from `Batch.messageCount` alone, before any message is read.
const MIN_MESSAGE_LEN: usize = {
    let unknown = HEADER_LEN + unknown_message_codec::SBE_BLOCK_LENGTH as usize + VAR_DATA_LENGTH_LEN + 1;
    let fixed = HEADER_LEN + system_event_codec::SBE_BLOCK_LENGTH as usize;
    if unknown < fixed { unknown } else { fixed }
};

/// SBE codec; it keeps no buffers, so it costs nothing to create.
#[derive(Debug)]
pub struct SbeCodec {
    limits: Limits,
}

/// What the message header says, once its schemaId and version are checked.
#[derive(Clone, Copy, Debug)]
struct Header {
    block_length: u16,
    template_id: u16,
    version: u16,
}

impl Header {
    /// Bytes of the header and the block, which blockLength (not the template) decides: a longer
    /// block is padding or fields of a later version, skipped.
    #[inline(always)]
    fn fixed_len(self) -> usize {
        HEADER_LEN + usize::from(self.block_length)
    }
}

#[inline(always)]
fn error(offset: usize, what: impl Into<std::borrow::Cow<'static, str>>) -> DecodeError {
    DecodeError::new(Format::Sbe, offset, what)
}

/// Reads and checks the message header at `at` (the offset in the frame, for errors).
#[inline(always)]
fn read_header(bytes: &[u8; HEADER_LEN], at: usize) -> Result<Header, DecodeError> {
    let decoder = MessageHeaderDecoder::default().wrap(ReadBuf::new(bytes), 0);
    let (schema_id, version) = (decoder.schema_id(), decoder.version());
    if schema_id != SCHEMA_ID || version != SCHEMA_VERSION {
        return Err(wrong_schema(at, schema_id, version));
    }
    Ok(Header { block_length: decoder.block_length(), template_id: decoder.template_id(), version })
}

/// The header at `at` in `buf`: `Ok(None)` when `buf` ends before it.
#[inline(always)]
fn header_at(buf: &[u8], at: usize) -> Result<Option<Header>, DecodeError> {
    match buf.get(at..).and_then(<[u8]>::first_chunk::<HEADER_LEN>) {
        Some(bytes) => read_header(bytes, at).map(Some),
        None => Ok(None),
    }
}

#[cold]
#[inline(never)]
fn wrong_schema(at: usize, schema_id: u16, version: u16) -> DecodeError {
    if schema_id != SCHEMA_ID {
        error(at + 4, format!("messageHeader.schemaId {schema_id}, expected {SCHEMA_ID}: not a frame of this schema"))
    } else {
        error(at + 6, format!("messageHeader.version {version}, expected {SCHEMA_VERSION}"))
    }
}

#[cold]
#[inline(never)]
fn short_block(at: usize, template: &str, block_length: u16, needed: usize) -> DecodeError {
    error(at, format!("{template} messageHeader.blockLength {block_length} is shorter than the template's {needed}"))
}

#[cold]
#[inline(never)]
fn past_end(at: usize, what: &str, needed: usize, left: usize) -> DecodeError {
    error(at, format!("{what} needs {needed} bytes, the frame has {left} left"))
}

#[cold]
#[inline(never)]
fn not_a_message(at: usize, template_id: u16) -> DecodeError {
    if template_id == batch_codec::SBE_TEMPLATE_ID {
        error(at + 2, "messageHeader.templateId 1 (Batch) where a message was expected: Batch only starts a frame")
    } else {
        error(at + 2, format!("messageHeader.templateId {template_id} is no message template of schema {SCHEMA_ID}"))
    }
}

#[cold]
#[inline(never)]
fn not_a_batch(template_id: u16) -> DecodeError {
    let batch = batch_codec::SBE_TEMPLATE_ID;
    error(2, format!("messageHeader.templateId {template_id}, expected {batch} (Batch) at the start of a frame"))
}

#[cold]
#[inline(never)]
fn over_limit(at: usize, len: usize, max: usize, why: &str) -> DecodeError {
    error(at, format!("frame of at least {len} bytes ({why}) exceeds the {max}-byte limit"))
}

#[cold]
#[inline(never)]
fn bad_unknown_length(at: usize, len: usize) -> DecodeError {
    if len == 0 {
        error(at, "UnknownMessage.bytes length 0: it holds at least the IEX type byte")
    } else {
        error(at, format!("UnknownMessage.bytes length {len} exceeds {MAX_UNKNOWN_LEN}"))
    }
}

/// Checks a fixed-size message against its template and returns exactly `LEN` of its bytes from
/// `AT`: the whole message (`AT` 0) for the generated decoders, or its block (`AT` the header's
/// length), as an array, so that every field read from it is a load at a constant offset.
#[inline(always)]
fn fixed<'a, const AT: usize, const LEN: usize>(
    rest: &'a [u8],
    header: Header,
    at: usize,
    template: &'static str,
) -> Result<&'a [u8; LEN], DecodeError> {
    if header.fixed_len() < AT + LEN {
        return Err(short_block(at, template, header.block_length, AT + LEN - HEADER_LEN));
    }
    if rest.len() < header.fixed_len() {
        return Err(past_end(at, template, header.fixed_len(), rest.len()));
    }
    rest.get(AT..).and_then(<[u8]>::first_chunk::<LEN>).ok_or_else(|| past_end(at, template, AT + LEN, rest.len()))
}

/// The generated decoder of a fixed-size template, over exactly its bytes.
macro_rules! decoder {
    ($codec:ident :: $decoder:ident, $name:literal, $rest:expr, $header:expr, $at:expr) => {{
        const LEN: usize = HEADER_LEN + $codec::SBE_BLOCK_LENGTH as usize;
        let bytes = fixed::<0, LEN>($rest, $header, $at, $name)?;
        $codec::$decoder::default().wrap(ReadBuf::new(bytes), HEADER_LEN, $header.block_length, $header.version)
    }};
}

/// Appends `LEN` zero bytes to `out` and returns them.
#[inline(always)]
fn append_zeroed<const LEN: usize>(out: &mut Vec<u8>) -> &mut [u8; LEN] {
    out.extend_from_slice(&[0; LEN]);
    match out.last_chunk_mut::<LEN>() {
        Some(tail) => tail,
        None => unreachable!("{LEN} bytes were just appended"),
    }
}

/// The encoder a generated `header()` wrapped, back from it.
#[inline(always)]
fn after_header<'a, E: Writer<'a> + Default>(mut header: MessageHeaderEncoder<E>) -> E {
    match header.parent() {
        Ok(encoder) => encoder,
        Err(_) => unreachable!("header() wraps its encoder"),
    }
}

/// The generated encoder of a fixed-size template, over the message's bytes appended to `out`,
/// its header written.
macro_rules! encoder {
    ($codec:ident :: $encoder:ident, $out:expr) => {{
        const LEN: usize = HEADER_LEN + $codec::SBE_BLOCK_LENGTH as usize;
        let bytes = append_zeroed::<LEN>($out);
        after_header($codec::$encoder::default().wrap(WriteBuf::new(bytes), HEADER_LEN).header(0))
    }};
}

/// The message header of a fixed-size template, as the generated encoders write it.
#[inline(always)]
fn message_header(block_length: usize, type_byte: u8) -> [u8; HEADER_LEN] {
    let [l0, l1] = (block_length as u16).to_le_bytes();
    let [t0, t1] = u16::from(type_byte).to_le_bytes();
    let [s0, s1] = SCHEMA_ID.to_le_bytes();
    let [v0, v1] = SCHEMA_VERSION.to_le_bytes();
    [l0, l1, t0, t1, s0, s1, v0, v1]
}

/// The per-template code from the message table. Every fixed-size template's templateId is its
/// IEX type byte and its block the IEX layout after that byte (the schema says so, and a test
/// checks the table against the generated codecs), so a block is read and written as that layout:
/// each field a load or store at a constant offset within an array of the template's length.
macro_rules! sbe_templates {
    ($($wire:ident $name:literal = $kind:ident => $variant:ident($ty:ident { $($fixed:ident: $fixed_value:path),* } {
        $($field:ident: $field_type:tt),* $(,)?
    })),* $(,)?) => {
        /// The name and block length of each fixed-size message template, `None` for
        /// `UnknownMessage` and ids that are no message.
        #[inline(always)]
        const fn fixed_template(template_id: u16) -> Option<(&'static str, u16)> {
            $(if template_id == kind::$kind as u16 {
                return Some((stringify!($wire), (0 $(+ <$field_type as IexField>::LEN)*) as u16));
            })*
            None
        }

        /// Appends one message; the error says why the message cannot be carried.
        #[inline(always)]
        fn encode_message(message: &Message<'_>, out: &mut Vec<u8>) -> Result<(), &'static str> {
            match message {
                $(Message::$variant(m @ $ty { $($fixed: $fixed_value,)* .. }) => {
                    const BLOCK: usize = 0 $(+ <$field_type as IexField>::LEN)*;
                    let bytes = append_zeroed::<{ HEADER_LEN + BLOCK }>(out);
                    if let Some((header, mut block)) = bytes.split_first_chunk_mut::<HEADER_LEN>() {
                        *header = message_header(BLOCK, kind::$kind);
                        $(m.$field.write(&mut block);)*
                    }
                })*
                Message::Unknown(m) => encode_unknown(m, out)?,
            }
            Ok(())
        }

        /// Decodes the message at the start of `rest` (at offset `at` of the frame) whose header
        /// is `header`, visits it, and returns its length.
        #[inline(always)]
        fn decode_message<F: FnMut(&Message<'_>)>(
            rest: &[u8],
            header: Header,
            at: usize,
            visit: &mut F,
        ) -> Result<usize, DecodeError> {
            // Each arm visits its own message, so that once `visit` is inlined its own match on
            // the message type folds away in every arm: one dispatch per message, not two.
            // The two sides' templates have the same fields: one arm reads both, and the side
            // comes from the templateId without a branch, which the feed's mix of sides would
            // mispredict; the table's own arms for them are never reached.
            #[allow(unreachable_patterns)]
            match u8::try_from(header.template_id) {
                Ok(type_byte @ (kind::PRICE_LEVEL_BUY | kind::PRICE_LEVEL_SELL)) => {
                    const BLOCK: usize = price_level_update_buy_codec::SBE_BLOCK_LENGTH as usize;
                    let mut block: &[u8] = fixed::<HEADER_LEN, BLOCK>(rest, header, at, "PriceLevelUpdate")?;
                    let side = if type_byte == kind::PRICE_LEVEL_BUY { Side::Buy } else { Side::Sell };
                    visit(&Message::PriceLevelUpdate(PriceLevelUpdate {
                        side,
                        event_flags: IexField::read(&mut block),
                        timestamp: IexField::read(&mut block),
                        symbol: IexField::read(&mut block),
                        size: IexField::read(&mut block),
                        price: IexField::read(&mut block),
                    }))
                }
                $(Ok(kind::$kind) => {
                    const BLOCK: usize = 0 $(+ <$field_type as IexField>::LEN)*;
                    let mut block: &[u8] = fixed::<HEADER_LEN, BLOCK>(rest, header, at, stringify!($wire))?;
                    visit(&Message::$variant($ty {
                        $($fixed: $fixed_value,)*
                        $($field: IexField::read(&mut block),)*
                    }))
                })*
                _ if header.template_id == unknown_message_codec::SBE_TEMPLATE_ID => {
                    return decode_unknown(rest, header, at, visit);
                }
                _ => return Err(not_a_message(at, header.template_id)),
            }
            Ok(header.fixed_len())
        }
    };
}
for_each_message_type!(sbe_templates);

/// [`fixed_template`]'s block lengths by templateId (every fixed template's id is an IEX type
/// byte), 0 for none: the framer's lookup is a load where a `match` would be an indirect jump,
/// mispredicted as often as the feed's message types alternate.
static FIXED_BLOCK_LENGTHS: [u16; 256] = {
    let mut table = [0; 256];
    let mut id = 0;
    while id < table.len() {
        if let Some((_, block_length)) = fixed_template(id as u16) {
            table[id] = block_length;
        }
        id += 1;
    }
    table
};

#[cold]
fn template_name(template_id: u16) -> &'static str {
    fixed_template(template_id).map_or("message", |(name, _)| name)
}

/// Where an `UnknownMessage`'s bytes are within the message, from its header and its varData length.
#[inline(always)]
fn unknown_bytes_range(header: Header, message: &[u8], at: usize) -> Result<Option<(usize, usize)>, DecodeError> {
    let length_at = header.fixed_len();
    let Some(with_length) = message.get(..length_at + VAR_DATA_LENGTH_LEN) else { return Ok(None) };
    let mut decoder = unknown_message_codec::UnknownMessageDecoder::default().wrap(
        ReadBuf::new(with_length),
        HEADER_LEN,
        header.block_length,
        header.version,
    );
    let (start, len) = decoder.bytes_decoder();
    if len == 0 || len > MAX_UNKNOWN_LEN {
        return Err(bad_unknown_length(at + length_at, len));
    }
    Ok(Some((start, len)))
}

impl SbeCodec {
    /// A codec with the given limits.
    pub fn new(limits: Limits) -> Self {
        SbeCodec { limits }
    }

    /// Reads the frame's Batch, then hands each message's bytes (from its header on), its
    /// checked header and its offset to `each`, which returns the message's length.
    #[inline(always)]
    fn walk(
        &mut self,
        frame: &[u8],
        mut each: impl FnMut(&[u8], Header, usize) -> Result<usize, DecodeError>,
    ) -> Result<BatchHeader, DecodeError> {
        if frame.len() > self.limits.max_frame {
            return Err(over_limit(0, frame.len(), self.limits.max_frame, "its length"));
        }
        let Some(header) = header_at(frame, 0)? else {
            return Err(past_end(0, "the Batch message header", HEADER_LEN, frame.len()));
        };
        if header.template_id != batch_codec::SBE_TEMPLATE_ID {
            return Err(not_a_batch(header.template_id));
        }
        let batch = decoder!(batch_codec::BatchDecoder, "Batch", frame, header, 0);
        let count = batch.message_count();
        let batch_header = BatchHeader {
            protocol_id: batch.protocol_id(),
            channel_id: batch.channel_id(),
            session_id: batch.session_id(),
            first_sequence: batch.first_sequence(),
            message_count: u32::from(count),
            send_time: batch.send_time(),
            publish_time: batch.publish_time(),
        };
        let mut rest = frame.get(header.fixed_len()..).unwrap_or_default();
        for index in 0..count {
            let at = frame.len() - rest.len();
            let Some(bytes) = rest.first_chunk::<HEADER_LEN>() else {
                let what = format!("message {index} of Batch.messageCount {count}: its header");
                return Err(past_end(at, &what, HEADER_LEN, rest.len()));
            };
            let header = read_header(bytes, at)?;
            let len = each(rest, header, at)?;
            rest = rest.get(len..).ok_or_else(|| past_end(at, "message", len, rest.len()))?;
        }
        if !rest.is_empty() {
            let at = frame.len() - rest.len();
            return Err(error(
                at,
                format!("{} bytes after the last of Batch.messageCount {count} messages", rest.len()),
            ));
        }
        Ok(batch_header)
    }
}

impl FormatCodec for SbeCodec {
    /// Appends one frame: the batch, then each message through its template's generated encoder.
    /// On error `out` is left as it was.
    #[inline]
    fn encode_batch(&mut self, batch: Batch<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let Batch { header, messages, count } = batch;
        let mut batch = encoder!(batch_codec::BatchEncoder, out);
        batch
            .first_sequence(header.first_sequence)
            .send_time(header.send_time)
            .publish_time(header.publish_time)
            .channel_id(header.channel_id)
            .session_id(header.session_id)
            .protocol_id(header.protocol_id)
            .message_count(count);
        for (index, message) in messages.iter().enumerate() {
            if let Err(what) = encode_message(message, out) {
                return Err(EncodeError::Unrepresentable { format: Format::Sbe, index, what: what.into() });
            }
        }
        Ok(())
    }

    fn format(&self) -> Format {
        Format::Sbe
    }

    /// Length of the first frame in `buf`, found by walking the message headers: the `Batch`
    /// block gives the message count, each header's blockLength the size of its message (and for
    /// `UnknownMessage` the varData length after its block), so one pass over the headers reaches
    /// the end without reading any field. The count alone bounds the length from below, so a frame
    /// too long for `limits.max_frame` is refused from its first 44 bytes when the count says so,
    /// else as soon as the walk passes the limit. `Ok(None)` while `buf` ends before the frame.
    #[inline]
    fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        let max = self.limits.max_frame;
        let Some(header) = header_at(buf, 0)? else { return Ok(None) };
        if header.template_id != batch_codec::SBE_TEMPLATE_ID {
            return Err(not_a_batch(header.template_id));
        }
        if header.fixed_len() < BATCH_LEN {
            return Err(short_block(0, "Batch", header.block_length, BATCH_LEN - HEADER_LEN));
        }
        let mut end = header.fixed_len();
        if end > max {
            return Err(over_limit(0, end, max, "Batch messageHeader.blockLength"));
        }
        let Some(batch) = buf.first_chunk::<BATCH_LEN>() else { return Ok(None) };
        let batch = batch_codec::BatchDecoder::default().wrap(
            ReadBuf::new(batch),
            HEADER_LEN,
            header.block_length,
            header.version,
        );
        let count = usize::from(batch.message_count());
        if end + count * MIN_MESSAGE_LEN > max {
            return Err(over_limit(MESSAGE_COUNT_AT, end + count * MIN_MESSAGE_LEN, max, "Batch.messageCount"));
        }
        for _ in 0..count {
            let at = end;
            let Some(header) = header_at(buf, at)? else { return Ok(None) };
            let template_id = header.template_id;
            let block_length = FIXED_BLOCK_LENGTHS.get(usize::from(template_id)).copied().unwrap_or(0);
            let len = if block_length != 0 {
                if header.block_length < block_length {
                    return Err(short_block(at, template_name(template_id), header.block_length, block_length.into()));
                }
                header.fixed_len()
            } else if template_id == unknown_message_codec::SBE_TEMPLATE_ID {
                let length_end = at + header.fixed_len() + VAR_DATA_LENGTH_LEN;
                if length_end > max {
                    return Err(over_limit(at, length_end, max, "messageHeader.blockLength"));
                }
                match unknown_bytes_range(header, buf.get(at..).unwrap_or_default(), at)? {
                    Some((start, len)) => start + len,
                    None => return Ok(None),
                }
            } else {
                return Err(not_a_message(at, template_id));
            };
            end += len;
            if end > max {
                return Err(over_limit(at, end, max, "walking the message headers"));
            }
        }
        Ok((buf.len() >= end).then_some(end))
    }

    /// Decodes one frame, handing each message to `visit` as it is read: a frame that goes bad
    /// part way has had its messages up to there visited when the error comes back.
    #[inline]
    fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], mut visit: F) -> Result<BatchHeader, DecodeError> {
        self.walk(frame, |rest, header, at| decode_message(rest, header, at, &mut visit))
    }

    /// Decodes one frame like [`SbeCodec::decode`], handing `sink` only the messages of
    /// the symbols it wants. A fixed-size message's symbol sits at the same place in every template (block
    /// offset 9: the IEX layout after its flag byte and timestamp), so another symbol's message is
    /// skipped after reading its header and those 8 bytes; its block is checked against its
    /// template's length, as decoding would, and its templateId is its IEX type byte.
    #[inline]
    fn decode_to(&mut self, frame: &[u8], sink: &mut impl FilteredSink) -> Result<BatchHeader, DecodeError> {
        self.walk(frame, |rest, header, at| {
            let template_id = header.template_id;
            let block_length = FIXED_BLOCK_LENGTHS.get(usize::from(template_id)).copied().unwrap_or(0);
            if block_length != 0 && template_id != system_event_codec::SBE_TEMPLATE_ID {
                if header.block_length < block_length {
                    return Err(short_block(at, template_name(template_id), header.block_length, block_length.into()));
                }
                if rest.len() < header.fixed_len() {
                    return Err(past_end(at, template_name(template_id), header.fixed_len(), rest.len()));
                }
                let symbol = rest.get(HEADER_LEN + SYMBOL_AT..).and_then(<[u8]>::first_chunk::<8>);
                if symbol.is_some_and(|s| !sink.wants(*s)) {
                    sink.skip(template_id as u8);
                    return Ok(header.fixed_len());
                }
            }
            decode_message(rest, header, at, &mut |m: &Message<'_>| sink.offer(m))
        })
    }
}

/// Appends an `UnknownMessage`. Its type byte is not written apart: it is the first of its bytes.
#[cold]
fn encode_unknown(m: &UnknownMessage<'_>, out: &mut Vec<u8>) -> Result<(), &'static str> {
    if m.bytes.len() > MAX_UNKNOWN_LEN {
        return Err("unknown message longer than 65535 bytes");
    }
    if m.bytes.first() != Some(&m.kind) {
        return Err("unknown message whose bytes do not start with its type byte");
    }
    let start = out.len();
    let len = HEADER_LEN + usize::from(unknown_message_codec::SBE_BLOCK_LENGTH) + VAR_DATA_LENGTH_LEN + m.bytes.len();
    out.resize(start + len, 0);
    let encoder =
        unknown_message_codec::UnknownMessageEncoder::default().wrap(WriteBuf::new(&mut out[start..]), HEADER_LEN);
    after_header(encoder.header(0)).bytes(m.bytes);
    Ok(())
}

/// Decodes an `UnknownMessage` (see [`decode_message`]); rare, so kept out of the hot loop.
#[cold]
#[inline(never)]
fn decode_unknown<F: FnMut(&Message<'_>)>(
    rest: &[u8],
    header: Header,
    at: usize,
    visit: &mut F,
) -> Result<usize, DecodeError> {
    let needed = header.fixed_len() + VAR_DATA_LENGTH_LEN;
    let Some((start, len)) = unknown_bytes_range(header, rest, at)? else {
        return Err(past_end(at, "UnknownMessage up to its bytes' length", needed, rest.len()));
    };
    let Some(bytes) = rest.get(start..start + len) else {
        return Err(past_end(
            at + needed - VAR_DATA_LENGTH_LEN,
            "UnknownMessage.bytes length",
            start + len,
            rest.len(),
        ));
    };
    let &[kind, ..] = bytes else { return Err(bad_unknown_length(at + needed - VAR_DATA_LENGTH_LEN, 0)) };
    visit(&Message::Unknown(UnknownMessage { kind, bytes }));
    Ok(start + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offset of the first message after the `Batch` in a frame.
    const FIRST: usize = BATCH_LEN;

    use crate::fixtures::{header, trade};

    fn encode(messages: &[Message<'_>]) -> Vec<u8> {
        crate::fixtures::encoded(SbeCodec::new(Limits::default()), &header(), messages)
    }

    fn decode(frame: &[u8]) -> Result<(BatchHeader, Vec<String>), DecodeError> {
        crate::fixtures::decoded(&mut SbeCodec::new(Limits::default()), frame)
    }

    fn frame_len(frame: &[u8]) -> Result<Option<usize>, DecodeError> {
        SbeCodec::new(Limits::default()).frame_len(frame)
    }

    fn put_u16(frame: &mut [u8], at: usize, value: u16) {
        frame[at..at + 2].copy_from_slice(&value.to_le_bytes());
    }

    fn put_u32(frame: &mut [u8], at: usize, value: u32) {
        frame[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// Both the framer and the decoder refuse `frame` at `offset`, naming `field`.
    fn refused(frame: &[u8], offset: usize, field: &str) {
        for (who, result) in [("frame_len", frame_len(frame).map(|_| ())), ("decode", decode(frame).map(|_| ()))] {
            let e = result.expect_err(who);
            assert_eq!((e.format, e.offset), (Format::Sbe, offset), "{who}: {e}");
            assert!(e.what.contains(field), "{who}: {e} should name {field}");
        }
    }

    #[test]
    fn the_frame_is_the_schema_layout() {
        let frame = encode(&[trade(1)]);
        assert_eq!(frame.len(), BATCH_LEN + HEADER_LEN + 37);
        let u16_at = |at: usize| u16::from_le_bytes([frame[at], frame[at + 1]]);
        assert_eq!([u16_at(0), u16_at(2), u16_at(4), u16_at(6)], [36, 1, SCHEMA_ID, SCHEMA_VERSION]);
        assert_eq!(u16_at(MESSAGE_COUNT_AT), 1);
        assert_eq!([u16_at(FIRST), u16_at(FIRST + 2), u16_at(FIRST + 4)], [37, u16::from(b'T'), SCHEMA_ID]);
        // The block is the IEX layout without its type byte.
        let mut iex = Vec::new();
        trade(1).write_iex(&mut iex);
        assert_eq!(&frame[FIRST + HEADER_LEN..], &iex[1..]);
        assert_eq!(frame_len(&frame).unwrap(), Some(frame.len()));
        let (batch, seen) = decode(&frame).unwrap();
        assert_eq!(batch, BatchHeader { message_count: 1, ..header() });
        assert_eq!(seen, [format!("{:?}", trade(1))]);
    }

    #[test]
    fn every_known_type_costs_its_iex_layout_plus_seven_bytes() {
        for kind in mdrelay_iex::message::kind::ALL {
            let len = mdrelay_iex::message::layout_len(kind).unwrap();
            let mut bytes = vec![7u8; len];
            bytes[0] = kind;
            let message = Message::parse(&bytes).unwrap();
            assert_eq!(encode(&[message]).len(), BATCH_LEN + len + 7, "type {}", kind as char);
            assert_eq!(fixed_template(u16::from(kind)).map(|(_, block)| usize::from(block)), Some(len - 1));
        }
    }

    #[test]
    fn the_message_table_is_the_schemas_templates() {
        use generated::*;
        let schema = [
            (system_event_codec::SBE_TEMPLATE_ID, system_event_codec::SBE_BLOCK_LENGTH),
            (security_directory_codec::SBE_TEMPLATE_ID, security_directory_codec::SBE_BLOCK_LENGTH),
            (trading_status_codec::SBE_TEMPLATE_ID, trading_status_codec::SBE_BLOCK_LENGTH),
            (retail_liquidity_indicator_codec::SBE_TEMPLATE_ID, retail_liquidity_indicator_codec::SBE_BLOCK_LENGTH),
            (operational_halt_status_codec::SBE_TEMPLATE_ID, operational_halt_status_codec::SBE_BLOCK_LENGTH),
            (short_sale_price_test_status_codec::SBE_TEMPLATE_ID, short_sale_price_test_status_codec::SBE_BLOCK_LENGTH),
            (security_event_codec::SBE_TEMPLATE_ID, security_event_codec::SBE_BLOCK_LENGTH),
            (price_level_update_buy_codec::SBE_TEMPLATE_ID, price_level_update_buy_codec::SBE_BLOCK_LENGTH),
            (price_level_update_sell_codec::SBE_TEMPLATE_ID, price_level_update_sell_codec::SBE_BLOCK_LENGTH),
            (quote_update_codec::SBE_TEMPLATE_ID, quote_update_codec::SBE_BLOCK_LENGTH),
            (trade_report_codec::SBE_TEMPLATE_ID, trade_report_codec::SBE_BLOCK_LENGTH),
            (trade_break_codec::SBE_TEMPLATE_ID, trade_break_codec::SBE_BLOCK_LENGTH),
            (official_price_codec::SBE_TEMPLATE_ID, official_price_codec::SBE_BLOCK_LENGTH),
            (auction_information_codec::SBE_TEMPLATE_ID, auction_information_codec::SBE_BLOCK_LENGTH),
        ];
        assert_eq!(schema.len(), mdrelay_iex::message::kind::ALL.len());
        for (template_id, block_length) in schema {
            assert_eq!(fixed_template(template_id).map(|(_, block)| block), Some(block_length), "{template_id}");
        }
    }

    #[test]
    fn the_framers_table_is_the_template_list() {
        for template_id in 0..=u16::MAX {
            let table = FIXED_BLOCK_LENGTHS.get(usize::from(template_id)).copied().unwrap_or(0);
            assert_eq!(fixed_template(template_id).map_or(0, |(_, block)| block), table, "templateId {template_id}");
        }
    }

    #[test]
    fn a_wrong_schema_id_is_refused_naming_the_field() {
        let mut frame = encode(&[trade(1)]);
        put_u16(&mut frame, 4, 7);
        refused(&frame, 4, "messageHeader.schemaId 7");
        let mut frame = encode(&[trade(1)]);
        put_u16(&mut frame, FIRST + 4, 7);
        refused(&frame, FIRST + 4, "messageHeader.schemaId 7");
    }

    #[test]
    fn a_wrong_version_is_refused_naming_the_field() {
        let mut frame = encode(&[trade(1)]);
        put_u16(&mut frame, 6, SCHEMA_VERSION + 1);
        refused(&frame, 6, "messageHeader.version");
        let mut frame = encode(&[trade(1)]);
        put_u16(&mut frame, FIRST + 6, SCHEMA_VERSION + 1);
        refused(&frame, FIRST + 6, "messageHeader.version");
    }

    #[test]
    fn a_wrong_template_id_is_refused_naming_the_field() {
        // A frame must start with a Batch.
        let mut frame = encode(&[trade(1)]);
        put_u16(&mut frame, 2, u16::from(b'T'));
        refused(&frame, 2, "messageHeader.templateId 84, expected 1 (Batch)");
        // A message must be one of the schema's, and not a second Batch.
        for template_id in [999, u16::from(b'z'), batch_codec::SBE_TEMPLATE_ID] {
            let mut frame = encode(&[trade(1)]);
            put_u16(&mut frame, FIRST + 2, template_id);
            refused(&frame, FIRST + 2, &format!("messageHeader.templateId {template_id}"));
        }
    }

    #[test]
    fn a_block_length_shorter_than_the_template_is_refused_naming_the_field() {
        let mut frame = encode(&[trade(1)]);
        put_u16(&mut frame, 0, 35);
        refused(&frame, 0, "Batch messageHeader.blockLength 35 is shorter than the template's 36");
        let mut frame = encode(&[trade(1)]);
        put_u16(&mut frame, FIRST, 36);
        refused(&frame, FIRST, "TradeReport messageHeader.blockLength 36 is shorter than the template's 37");
    }

    #[test]
    fn a_longer_block_is_skipped_as_padding_or_fields_of_a_later_version() {
        let plain = encode(&[trade(1), trade(2)]);
        // Three bytes appended to the Batch block and to the first message's.
        let mut frame = plain[..BATCH_LEN].to_vec();
        frame.extend_from_slice(b"new");
        frame.extend_from_slice(&plain[FIRST..FIRST + HEADER_LEN + 37]);
        frame.extend_from_slice(b"new");
        frame.extend_from_slice(&plain[FIRST + HEADER_LEN + 37..]);
        put_u16(&mut frame, 0, 39);
        put_u16(&mut frame, FIRST + 3, 40);
        assert_eq!(frame_len(&frame).unwrap(), Some(frame.len()));
        assert_eq!(decode(&frame).unwrap(), decode(&plain).unwrap());
    }

    fn unknown(bytes: &[u8]) -> Message<'_> {
        Message::Unknown(UnknownMessage { kind: bytes[0], bytes })
    }

    #[test]
    fn unknown_messages_up_to_65535_bytes_round_trip_and_longer_ones_are_refused() {
        let mut bytes = vec![b'z'; MAX_UNKNOWN_LEN];
        bytes[1] = 1;
        let frame = encode(&[trade(1), unknown(&bytes), trade(2)]);
        assert_eq!(frame_len(&frame).unwrap(), Some(frame.len()));
        let (_, seen) = decode(&frame).unwrap();
        assert_eq!(seen[1], format!("{:?}", unknown(&bytes)));
        assert_eq!(seen.len(), 3);

        let mut out = b"kept".to_vec();
        let mut codec = SbeCodec::new(Limits::default());
        bytes.push(0);
        let too_long = codec.encode(&header(), &[trade(1), unknown(&bytes)], &mut out);
        assert!(matches!(too_long, Err(EncodeError::Unrepresentable { index: 1, .. })), "{too_long:?}");
        let empty = Message::Unknown(UnknownMessage { kind: b'z', bytes: b"" });
        let mismatched = Message::Unknown(UnknownMessage { kind: b'z', bytes: b"y" });
        for message in [empty, mismatched] {
            assert!(codec.encode(&header(), &[message], &mut out).is_err(), "{message:?}");
        }
        assert_eq!(out, b"kept", "a refused batch leaves the output as it was");
    }

    #[test]
    fn a_var_data_length_past_the_end_is_refused_naming_the_field() {
        let frame = encode(&[unknown(b"zabc")]);
        let length_at = FIRST + HEADER_LEN;
        let mut long = frame.clone();
        put_u32(&mut long, length_at, 5);
        let e = decode(&long).unwrap_err();
        assert_eq!(e.offset, length_at, "{e}");
        assert!(e.what.contains("UnknownMessage.bytes length"), "{e}");
        // On a stream the bytes may be still to come...
        assert_eq!(frame_len(&long).unwrap(), None);
        // ...unless they would take the frame past the limit.
        put_u32(&mut long, length_at, u32::from(u16::MAX));
        let small = SbeCodec::new(Limits { max_frame: 1000, ..Limits::default() });
        assert!(small.frame_len(&long).is_err());
        // Lengths the schema does not allow.
        for bad in [0, MAX_UNKNOWN_LEN as u32 + 1] {
            let mut frame = frame.clone();
            put_u32(&mut frame, length_at, bad);
            refused(&frame, length_at, &format!("UnknownMessage.bytes length {bad}"));
        }
    }

    #[test]
    fn fewer_messages_than_the_count_or_bytes_after_them_are_errors() {
        let frame = encode(&[trade(1), trade(2)]);
        let mut short = frame.clone();
        put_u16(&mut short, MESSAGE_COUNT_AT, 3);
        assert_eq!(frame_len(&short).unwrap(), None, "the third message may be still to come");
        let e = decode(&short).unwrap_err();
        assert!(e.what.contains("message 2 of Batch.messageCount 3"), "{e}");
        assert_eq!(e.offset, frame.len());

        let mut long = frame.clone();
        put_u16(&mut long, MESSAGE_COUNT_AT, 1);
        assert_eq!(frame_len(&long).unwrap(), Some(FIRST + HEADER_LEN + 37));
        let e = decode(&long).unwrap_err();
        assert!(e.what.contains("45 bytes after the last of Batch.messageCount 1"), "{e}");
    }

    #[test]
    fn a_count_too_large_for_the_limit_is_refused_from_the_batch_alone() {
        let frame = encode(&[trade(1); 100]);
        let max_frame = BATCH_LEN + 50 * MIN_MESSAGE_LEN;
        let mut small = SbeCodec::new(Limits { max_frame, ..Limits::default() });
        let e = small.frame_len(&frame[..BATCH_LEN]).unwrap_err();
        assert_eq!(e.offset, MESSAGE_COUNT_AT);
        assert!(e.what.contains("Batch.messageCount"), "{e}");
        // A count within the bound goes on until the walk passes the limit.
        let frame = encode(&[trade(1); 40]);
        assert!(small.frame_len(&frame).is_err());
        assert!(small.decode(&frame, |_| {}).is_err());
    }

    #[test]
    fn more_messages_than_a_count_holds_are_refused() {
        let many = vec![trade(1); usize::from(u16::MAX) + 1];
        let result = SbeCodec::new(Limits::default()).encode(&header(), &many, &mut Vec::new());
        assert_eq!(result, Err(EncodeError::TooManyMessages(many.len())));
    }
}
