//! JSON, newline-delimited (NDJSON): one object per frame, the frame being the object's bytes and
//! the `\n` after them. A baseline for readability, not for speed.
//!
//! A frame reads
//! `{"protocol_id":32772,"channel_id":1,"session_id":2,"first_sequence":3,"send_time":4,"publish_time":5,"messages":[{"type":"trade_report","sale_condition":64,...}]}`
//! with the batch's message count implied by the array. Each message names its kind in `"type"`
//! and carries exactly its model's fields under the model's names:
//! - integers (flags, sizes, timestamps, trade ids, side and status bytes) as JSON integers;
//! - prices as the model's fixed-point integer ($1 = 10,000), not as decimals: serde_json reads
//!   and writes every i64 exactly (it never goes through f64 for an integer token), so the round
//!   trip is exact with no decimal parsing on either side. A JavaScript reader would lose digits
//!   above 2^53, but prices that large ($900 billion) never occur and timestamps already need
//!   the same care;
//! - symbols as strings without their space padding, and the trading-status reason as a string
//!   of exactly 4 characters. Each byte is one character U+0000..U+00FF (ASCII as itself, any
//!   other byte as its Latin-1 character), so even a symbol with bytes outside ASCII round-trips
//!   exactly;
//! - a price level update's side as `"buy"` or `"sell"`;
//! - an unknown message as `{"type":"unknown","kind":122,"bytes":"7a6263"}`: its type byte, and
//!   its bytes (type byte included, as in the model) in lowercase hex.
//!
//! Decoding is strict: every field present once, no other field, every number in its field's
//! range, `type` one of the names above. Errors carry the byte offset serde_json stopped at.

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
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// Longest unknown message carried, in bytes: as long as an IEX-TP message block can be.
pub const MAX_UNKNOWN_LEN: usize = u16::MAX as usize;

/// A decoded message held until the whole frame has been checked: known messages own all their
/// fields; an unknown one points into the codec's byte scratch.
#[derive(Clone, Copy)]
enum Parsed {
    Known(Message<'static>),
    Unknown { kind: u8, start: usize, len: usize },
}

/// NDJSON codec; its two scratch buffers are reused across frames.
#[derive(Debug, Default)]
pub struct JsonCodec {
    limits: Limits,
    /// Messages of the frame being decoded: a frame is visited only once all of it decoded, so a
    /// bad frame hands nothing to the visitor (unlike the streaming binary decoders).
    parsed: Vec<ParsedSlot>,
    /// The decoded hex of the frame's unknown messages.
    bytes: Vec<u8>,
}

/// [`Parsed`] behind a newtype so that `JsonCodec` can derive `Debug` without `Parsed` needing it.
#[derive(Clone, Copy)]
struct ParsedSlot(Parsed);

impl fmt::Debug for ParsedSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Parsed::Known(m) => m.fmt(f),
            Parsed::Unknown { kind, start, len } => write!(f, "Unknown({kind}, {start}..+{len})"),
        }
    }
}

impl JsonCodec {
    /// A codec with the given decoding limits.
    pub fn new(limits: Limits) -> Self {
        JsonCodec { limits, parsed: Vec::new(), bytes: Vec::new() }
    }
}

impl FormatCodec for JsonCodec {
    /// Appends one frame (the object and its `\n`) to `out`. Unknown messages must be what the
    /// model makes of an IEX block: 1 to 65535 bytes starting with their type byte, which is no
    /// known type; otherwise the batch is refused and `out` left as it was.
    fn encode_batch(&mut self, batch: Batch<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let Batch { header, messages, .. } = batch;
        let mut w = Writer(out);
        w.raw(b"{\"protocol_id\":");
        w.int(header.protocol_id);
        w.key("channel_id");
        w.int(header.channel_id);
        w.key("session_id");
        w.int(header.session_id);
        w.key("first_sequence");
        w.int(header.first_sequence);
        w.key("send_time");
        w.int(header.send_time);
        w.key("publish_time");
        w.int(header.publish_time);
        w.raw(b",\"messages\":[");
        for (index, message) in messages.iter().enumerate() {
            if index > 0 {
                w.raw(b",");
            }
            if let Err(what) = write_message(&mut w, message) {
                return Err(EncodeError::Unrepresentable { format: Format::Json, index, what: what.into() });
            }
        }
        w.raw(b"]}\n");
        Ok(())
    }

    fn format(&self) -> Format {
        Format::Json
    }

    /// The length of the first frame at the start of `buf` (up to and including its `\n`);
    /// `None` while no `\n` has come and the limit is not reached; an error once `max_frame`
    /// bytes have come without one. Only the bytes given are read; nothing is allocated.
    fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        let max = self.limits.max_frame;
        let window = &buf[..buf.len().min(max)];
        match memchr::memchr(b'\n', window) {
            Some(end) => Ok(Some(end + 1)),
            None if buf.len() >= max => {
                Err(error(max, format!("no newline within the {max}-byte frame limit: line too long")))
            }
            None => Ok(None),
        }
    }

    /// Decodes one frame (exactly the bytes [`JsonCodec::frame_len`] delimited), then hands each
    /// message to `visit` in order and returns the batch header. The whole frame is checked
    /// before the first message is visited, so a bad frame visits nothing.
    fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], mut visit: F) -> Result<BatchHeader, DecodeError> {
        let max = self.limits.max_frame;
        if frame.len() > max {
            return Err(error(0, format!("frame of {} bytes exceeds the {max}-byte limit", frame.len())));
        }
        match memchr::memchr(b'\n', frame) {
            Some(end) if end + 1 == frame.len() => {}
            Some(end) => return Err(error(end + 1, "bytes after the frame's newline")),
            None => return Err(error(frame.len(), "the frame does not end with a newline")),
        }
        self.parsed.clear();
        self.bytes.clear();
        // One pass over the frame checks its UTF-8 (ASCII, in practice: a word at a time), so
        // that serde reads it as text and does not check each string again on its own.
        let text = std::str::from_utf8(frame).map_err(|e| error(e.valid_up_to(), "the frame is not UTF-8"))?;
        let mut de = serde_json::Deserializer::from_str(text);
        let seed = FrameSeed { parsed: &mut self.parsed, bytes: &mut self.bytes };
        let header = seed.deserialize(&mut de).and_then(|h| de.end().map(|()| h)).map_err(|e| from_serde(frame, &e))?;
        for slot in &self.parsed {
            match slot.0 {
                Parsed::Known(m) => visit(&m),
                Parsed::Unknown { kind, start, len } => {
                    let bytes = self.bytes.get(start..start + len).unwrap_or_default();
                    visit(&Message::Unknown(UnknownMessage { kind, bytes }));
                }
            }
        }
        Ok(header)
    }
}

#[cold]
fn error(offset: usize, what: impl Into<Cow<'static, str>>) -> DecodeError {
    DecodeError::new(Format::Json, offset, what)
}

/// serde_json's error as ours: its position (line, and column = bytes on that line before the
/// point it stopped) made a byte offset in the frame, and its message without the position.
#[cold]
fn from_serde(frame: &[u8], e: &serde_json::Error) -> DecodeError {
    let mut offset = 0;
    if e.line() > 1 {
        // A frame has one newline, at its end, so this only happens past it; kept exact anyway.
        let newlines = frame.iter().enumerate().filter(|&(_, &b)| b == b'\n').map(|(i, _)| i + 1);
        offset = newlines.take(e.line() - 1).last().unwrap_or(0);
    }
    offset = (offset + e.column()).min(frame.len());
    let text = e.to_string();
    let what = match text.rfind(" at line ") {
        Some(at) => &text[..at],
        None => &text,
    };
    // serde quotes the frame's own text (an unknown field's name, say): escaped, since the
    // error reaches logs.
    error(offset, mdrelay_iex::peer_text::escape(what).into_owned())
}

/// Appends JSON text to the output buffer; every write goes straight into it.
struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    #[inline(always)]
    fn raw(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    /// `,"name":` — names are this module's ASCII literals, which need no escaping.
    #[inline(always)]
    fn key(&mut self, name: &str) {
        self.0.extend_from_slice(b",\"");
        self.0.extend_from_slice(name.as_bytes());
        self.0.extend_from_slice(b"\":");
    }

    /// An integer, written by serde_json (itoa, no allocation).
    #[inline(always)]
    fn int<T: serde::Serialize>(&mut self, value: T) {
        // Writing an integer into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *self.0, &value);
    }

    /// `bytes` as a string of one character per byte (see the module doc), escaped by serde_json.
    #[inline(always)]
    fn latin1(&mut self, bytes: &[u8]) {
        // At most 8 bytes, each at most 2 bytes of UTF-8: a stack buffer, no allocation.
        let mut buf = [0u8; 16];
        let mut len = 0;
        for &b in bytes {
            len += char::from(b).encode_utf8(&mut buf[len..]).len();
        }
        // Writing a string into a Vec cannot fail; the buffer holds whole characters.
        if let Ok(text) = std::str::from_utf8(&buf[..len]) {
            let _ = serde_json::to_writer(&mut *self.0, text);
        }
    }

    #[inline(always)]
    fn field<T: serde::Serialize>(&mut self, name: &str, value: T) {
        self.key(name);
        self.int(value);
    }
}

/// How a model field is written: integers (prices their fixed-point integer) as numbers, the
/// symbol without its padding and the trading-status reason as strings of one character per byte,
/// the side as `"buy"` or `"sell"`.
trait JsonField {
    /// Appends the field's value.
    fn write_json(&self, w: &mut Writer<'_>);
}

macro_rules! json_integer_fields {
    ($($int:ty),*) => {$(
        impl JsonField for $int {
            #[inline(always)]
            fn write_json(&self, w: &mut Writer<'_>) {
                w.int(*self);
            }
        }
    )*};
}
json_integer_fields!(u8, u32, i64);

impl JsonField for Price {
    #[inline(always)]
    fn write_json(&self, w: &mut Writer<'_>) {
        w.int(self.0);
    }
}

impl JsonField for Symbol {
    #[inline(always)]
    fn write_json(&self, w: &mut Writer<'_>) {
        w.latin1(self.trimmed());
    }
}

impl JsonField for [u8; 4] {
    #[inline(always)]
    fn write_json(&self, w: &mut Writer<'_>) {
        w.latin1(self);
    }
}

impl JsonField for Side {
    #[inline(always)]
    fn write_json(&self, w: &mut Writer<'_>) {
        w.raw(match self {
            Side::Buy => b"\"buy\"",
            Side::Sell => b"\"sell\"",
        });
    }
}

/// The message writer from the message table: the type's text name, then the fields its type
/// byte decides (the side), then the others in the IEX order, each under its model name.
macro_rules! json_writer {
    ($($wire:ident $name:literal = $kind:ident => $variant:ident($ty:ident { $($fixed:ident: $fixed_value:path),* } {
        $($field:ident: $field_type:tt),* $(,)?
    })),* $(,)?) => {
        /// Appends one message object; the error says why an unknown message cannot be carried.
        #[inline]
        fn write_message(w: &mut Writer<'_>, message: &Message<'_>) -> Result<(), &'static str> {
            match message {
                $(Message::$variant(m @ $ty { $($fixed: $fixed_value,)* .. }) => {
                    w.raw(concat!("{\"type\":\"", $name, "\"").as_bytes());
                    $(w.key(stringify!($fixed)); m.$fixed.write_json(w);)*
                    $(w.key(stringify!($field)); m.$field.write_json(w);)*
                })*
                Message::Unknown(m) => write_unknown(w, m)?,
            }
            w.raw(b"}");
            Ok(())
        }
    };
}
for_each_message_type!(json_writer);

/// Appends an unknown message's fields (rare, kept out of the hot path).
#[cold]
fn write_unknown(w: &mut Writer<'_>, m: &UnknownMessage<'_>) -> Result<(), &'static str> {
    unknown_problem(m.kind, m.bytes)?;
    w.raw(b"{\"type\":\"unknown\"");
    w.field("kind", m.kind);
    w.raw(b",\"bytes\":\"");
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in m.bytes {
        w.raw(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
    }
    w.raw(b"\"");
    Ok(())
}

// ---- Decoding ----

/// The header's fields.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HeaderKey {
    ProtocolId,
    ChannelId,
    SessionId,
    FirstSequence,
    SendTime,
    PublishTime,
    Messages,
}

const HEADER_KEYS: [&str; 7] =
    ["protocol_id", "channel_id", "session_id", "first_sequence", "send_time", "publish_time", "messages"];

/// A name read from the frame (a key, or a `type` or `side` value when the third field is true),
/// borrowed or (when it had escapes) from serde_json's scratch, and looked up without allocating.
struct KeySeed<T>(fn(&str) -> Option<T>, &'static [&'static str], bool);

impl<'de, T> DeserializeSeed<'de> for KeySeed<T> {
    type Value = T;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        d.deserialize_str(self)
    }
}

impl<T> Visitor<'_> for KeySeed<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.2 { "a name" } else { "a field name" })
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.0)(v).ok_or_else(|| if self.2 { E::unknown_variant(v, self.1) } else { E::unknown_field(v, self.1) })
    }
}

fn header_key(name: &str) -> Option<HeaderKey> {
    Some(match name {
        "protocol_id" => HeaderKey::ProtocolId,
        "channel_id" => HeaderKey::ChannelId,
        "session_id" => HeaderKey::SessionId,
        "first_sequence" => HeaderKey::FirstSequence,
        "send_time" => HeaderKey::SendTime,
        "publish_time" => HeaderKey::PublishTime,
        "messages" => HeaderKey::Messages,
        _ => return None,
    })
}

/// Reads the whole frame object into a [`BatchHeader`], its messages into the scratch lists.
struct FrameSeed<'s> {
    parsed: &'s mut Vec<ParsedSlot>,
    bytes: &'s mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for FrameSeed<'_> {
    type Value = BatchHeader;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<BatchHeader, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FrameSeed<'_> {
    type Value = BatchHeader;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a batch object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BatchHeader, A::Error> {
        let mut h = BatchHeader::default();
        let mut seen = 0u8;
        while let Some(key) = map.next_key_seed(KeySeed(header_key, &HEADER_KEYS, false))? {
            let bit = 1u8 << key as u8;
            if seen & bit != 0 {
                return Err(de::Error::duplicate_field(HEADER_KEYS[key as usize]));
            }
            seen |= bit;
            match key {
                HeaderKey::ProtocolId => h.protocol_id = map.next_value()?,
                HeaderKey::ChannelId => h.channel_id = map.next_value()?,
                HeaderKey::SessionId => h.session_id = map.next_value()?,
                HeaderKey::FirstSequence => h.first_sequence = map.next_value()?,
                HeaderKey::SendTime => h.send_time = map.next_value()?,
                HeaderKey::PublishTime => h.publish_time = map.next_value()?,
                HeaderKey::Messages => {
                    map.next_value_seed(MessagesSeed { parsed: &mut *self.parsed, bytes: &mut *self.bytes })?;
                }
            }
        }
        if let Some(missing) = (0..HEADER_KEYS.len()).find(|i| seen & (1 << i) == 0) {
            return Err(de::Error::missing_field(HEADER_KEYS[missing]));
        }
        // At most MAX_BATCH (checked while reading), which fits a u32.
        h.message_count = self.parsed.len() as u32;
        Ok(h)
    }
}

/// Reads the `messages` array.
struct MessagesSeed<'s> {
    parsed: &'s mut Vec<ParsedSlot>,
    bytes: &'s mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for MessagesSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for MessagesSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of message objects")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        loop {
            let Some(message) = seq.next_element_seed(MessageSeed { bytes: &mut *self.bytes })? else { return Ok(()) };
            if self.parsed.len() == MAX_BATCH {
                return Err(de::Error::custom(format_args!("more than {MAX_BATCH} messages in one batch")));
            }
            self.parsed.push(ParsedSlot(message));
        }
    }
}

/// How a message field's value is read.
#[derive(Clone, Copy)]
enum Ty {
    U8,
    U32,
    I64,
    Symbol,
    Reason,
    Side,
    Type,
    Hex,
}

/// Declares the message fields: an enum `F` (its discriminant the bit in a presence mask), their
/// JSON names and how each is read.
macro_rules! fields {
    ($($name:ident = $text:literal : $ty:ident),* $(,)?) => {
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[allow(non_camel_case_types)]
        enum F { $($name),* }
        const FIELD_NAMES: &[&str] = &[$($text),*];
        const FIELD_TYPES: &[Ty] = &[$(Ty::$ty),*];
        const FIELD_COUNT: usize = FIELD_NAMES.len();
        fn message_key(name: &str) -> Option<F> {
            Some(match name { $($text => F::$name,)* _ => return None })
        }
    };
}

fields! {
    type_ = "type": Type,
    timestamp = "timestamp": I64,
    symbol = "symbol": Symbol,
    event = "event": U8,
    flags = "flags": U8,
    round_lot_size = "round_lot_size": U32,
    adjusted_poc_price = "adjusted_poc_price": I64,
    luld_tier = "luld_tier": U8,
    status = "status": U8,
    reason = "reason": Reason,
    indicator = "indicator": U8,
    in_effect = "in_effect": U8,
    detail = "detail": U8,
    side = "side": Side,
    event_flags = "event_flags": U8,
    size = "size": U32,
    price = "price": I64,
    bid_size = "bid_size": U32,
    bid_price = "bid_price": I64,
    ask_price = "ask_price": I64,
    ask_size = "ask_size": U32,
    sale_condition = "sale_condition": U8,
    trade_id = "trade_id": I64,
    price_type = "price_type": U8,
    auction_type = "auction_type": U8,
    paired_shares = "paired_shares": U32,
    reference_price = "reference_price": I64,
    indicative_clearing_price = "indicative_clearing_price": I64,
    imbalance_shares = "imbalance_shares": U32,
    imbalance_side = "imbalance_side": U8,
    extension_number = "extension_number": U8,
    scheduled_auction_time = "scheduled_auction_time": U32,
    auction_book_clearing_price = "auction_book_clearing_price": I64,
    collar_reference_price = "collar_reference_price": I64,
    lower_auction_collar = "lower_auction_collar": I64,
    upper_auction_collar = "upper_auction_collar": I64,
    kind = "kind": U8,
    bytes = "bytes": Hex,
}

const _: () = assert!(FIELD_COUNT <= 64, "the presence mask is a u64");

/// The message types, with their JSON names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Type {
    SystemEvent,
    SecurityDirectory,
    TradingStatus,
    RetailLiquidityIndicator,
    OperationalHaltStatus,
    ShortSalePriceTestStatus,
    SecurityEvent,
    PriceLevelUpdate,
    QuoteUpdate,
    TradeReport,
    TradeBreak,
    OfficialPrice,
    AuctionInformation,
    Unknown,
}

const TYPE_NAMES: &[&str] = &[
    "system_event",
    "security_directory",
    "trading_status",
    "retail_liquidity_indicator",
    "operational_halt_status",
    "short_sale_price_test_status",
    "security_event",
    "price_level_update",
    "quote_update",
    "trade_report",
    "trade_break",
    "official_price",
    "auction_information",
    "unknown",
];

fn type_named(name: &str) -> Option<Type> {
    Some(match name {
        "system_event" => Type::SystemEvent,
        "security_directory" => Type::SecurityDirectory,
        "trading_status" => Type::TradingStatus,
        "retail_liquidity_indicator" => Type::RetailLiquidityIndicator,
        "operational_halt_status" => Type::OperationalHaltStatus,
        "short_sale_price_test_status" => Type::ShortSalePriceTestStatus,
        "security_event" => Type::SecurityEvent,
        "price_level_update" => Type::PriceLevelUpdate,
        "quote_update" => Type::QuoteUpdate,
        "trade_report" => Type::TradeReport,
        "trade_break" => Type::TradeBreak,
        "official_price" => Type::OfficialPrice,
        "auction_information" => Type::AuctionInformation,
        "unknown" => Type::Unknown,
        _ => return None,
    })
}

/// The presence mask of `fields`.
const fn mask(fields: &[F]) -> u64 {
    let mut m = 1 << F::type_ as u32;
    let mut i = 0;
    while i < fields.len() {
        m |= 1 << fields[i] as u32;
        i += 1;
    }
    m
}

/// Reads one message object.
struct MessageSeed<'s> {
    bytes: &'s mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for MessageSeed<'_> {
    type Value = Parsed;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Parsed, D::Error> {
        d.deserialize_map(self)
    }
}

/// The values of one message object, as read: every integer field widened to i64 once checked
/// against its own type's range.
struct Values {
    present: u64,
    ints: [i64; FIELD_COUNT],
    symbol: Symbol,
    reason: [u8; 4],
    side: Side,
    kind: Option<Type>,
    hex: (usize, usize),
}

impl Values {
    /// The value of an integer field, narrowed back to the type it was checked against.
    fn get<T: TryFrom<i64> + Default>(&self, f: F) -> T {
        // Every value was read as T, so the conversion cannot fail.
        T::try_from(self.ints[f as usize]).unwrap_or_default()
    }
    fn price(&self, f: F) -> Price {
        Price(self.ints[f as usize])
    }
}

impl<'de> Visitor<'de> for MessageSeed<'_> {
    type Value = Parsed;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parsed, A::Error> {
        let mut v = Values {
            present: 0,
            ints: [0; FIELD_COUNT],
            symbol: Symbol([b' '; 8]),
            reason: [0; 4],
            side: Side::Buy,
            kind: None,
            hex: (0, 0),
        };
        while let Some(key) = map.next_key_seed(KeySeed(message_key, FIELD_NAMES, false))? {
            let bit = 1u64 << key as u32;
            if v.present & bit != 0 {
                return Err(de::Error::duplicate_field(FIELD_NAMES[key as usize]));
            }
            v.present |= bit;
            // With the type already read (the encoder writes it first), a stray field is
            // refused at its key; otherwise once the object ends.
            if let Some(t) = v.kind
                && fields_of(t) & bit == 0
            {
                let (name, field) = (TYPE_NAMES[t as usize], FIELD_NAMES[key as usize]);
                return Err(de::Error::custom(format_args!("{name} message: field `{field}` does not belong to it")));
            }
            let slot = &mut v.ints[key as usize];
            match FIELD_TYPES[key as usize] {
                Ty::U8 => *slot = i64::from(map.next_value::<u8>()?),
                Ty::U32 => *slot = i64::from(map.next_value::<u32>()?),
                Ty::I64 => *slot = map.next_value::<i64>()?,
                Ty::Symbol => {
                    let (bytes, len) = map.next_value_seed(Latin1Seed::<8> { exact: false, field: "symbol" })?;
                    // Padded with spaces, as on the wire.
                    v.symbol = Symbol(bytes);
                    v.symbol.0[len..].fill(b' ');
                }
                Ty::Reason => v.reason = map.next_value_seed(Latin1Seed::<4> { exact: true, field: "reason" })?.0,
                Ty::Side => v.side = map.next_value_seed(KeySeed(side_named, &["buy", "sell"], true))?,
                Ty::Type => v.kind = Some(map.next_value_seed(KeySeed(type_named, TYPE_NAMES, true))?),
                Ty::Hex => v.hex = map.next_value_seed(HexSeed { out: &mut *self.bytes })?,
            }
        }
        let Some(t) = v.kind else { return Err(de::Error::missing_field("type")) };
        let wanted = fields_of(t);
        if v.present != wanted {
            let name = TYPE_NAMES[t as usize];
            let missing = wanted & !v.present;
            let extra = v.present & !wanted;
            return Err(if extra != 0 {
                let field = FIELD_NAMES[extra.trailing_zeros() as usize];
                de::Error::custom(format_args!("{name} message: field `{field}` does not belong to it"))
            } else {
                let field = FIELD_NAMES[missing.trailing_zeros() as usize];
                de::Error::custom(format_args!("{name} message: missing field `{field}`"))
            });
        }
        build(t, &v, self.bytes)
    }
}

/// How a model field is read back from a message object's checked values.
trait JsonValue {
    /// The value of field `f`.
    fn from_values(v: &Values, f: F) -> Self;
}

macro_rules! json_integer_values {
    ($($int:ty),*) => {$(
        impl JsonValue for $int {
            #[inline(always)]
            fn from_values(v: &Values, f: F) -> Self {
                v.get(f)
            }
        }
    )*};
}
json_integer_values!(u8, u32, i64);

impl JsonValue for Price {
    #[inline(always)]
    fn from_values(v: &Values, f: F) -> Self {
        v.price(f)
    }
}

impl JsonValue for Symbol {
    #[inline(always)]
    fn from_values(v: &Values, _: F) -> Self {
        v.symbol
    }
}

impl JsonValue for [u8; 4] {
    #[inline(always)]
    fn from_values(v: &Values, _: F) -> Self {
        v.reason
    }
}

impl JsonValue for Side {
    #[inline(always)]
    fn from_values(v: &Values, _: F) -> Self {
        v.side
    }
}

/// Which fields each type carries and how its message is built, from the message table. Every
/// field, the side included, is one of the object's: both sides of a price level update are one
/// JSON type, whose second entry in the table is never reached.
macro_rules! json_reader {
    ($($wire:ident $name:literal = $kind:ident => $variant:ident($ty:ident { $($fixed:ident: $fixed_value:path),* } {
        $($field:ident: $field_type:tt),* $(,)?
    })),* $(,)?) => {
        /// The fields each type carries, besides `type`.
        #[allow(unreachable_patterns)]
        const fn fields_of(t: Type) -> u64 {
            match t {
                $(Type::$variant => mask(&[$(F::$fixed,)* $(F::$field),*]),)*
                Type::Unknown => mask(&[F::kind, F::bytes]),
            }
        }

        /// The message of type `t` from its checked values.
        #[allow(unreachable_patterns)]
        fn build<E: de::Error>(t: Type, v: &Values, bytes: &[u8]) -> Result<Parsed, E> {
            let m = match t {
                $(Type::$variant => Message::$variant($ty {
                    $($fixed: JsonValue::from_values(v, F::$fixed),)*
                    $($field: JsonValue::from_values(v, F::$field),)*
                }),)*
                Type::Unknown => {
                    let k: u8 = v.get(F::kind);
                    let (start, len) = v.hex;
                    let data = bytes.get(start..start + len).unwrap_or_default();
                    unknown_problem(k, data).map_err(E::custom)?;
                    return Ok(Parsed::Unknown { kind: k, start, len });
                }
            };
            Ok(Parsed::Known(m))
        }
    };
}
for_each_message_type!(json_reader);

fn side_named(name: &str) -> Option<Side> {
    match name {
        "buy" => Some(Side::Buy),
        "sell" => Some(Side::Sell),
        _ => None,
    }
}

/// Reads a string of at most (or, `exact`, exactly) `N` characters U+0000..U+00FF as bytes;
/// returns them (zero-filled past the end) and how many there were.
struct Latin1Seed<const N: usize> {
    exact: bool,
    field: &'static str,
}

impl<'de, const N: usize> DeserializeSeed<'de> for Latin1Seed<N> {
    type Value = ([u8; N], usize);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<const N: usize> Visitor<'_> for Latin1Seed<N> {
    type Value = ([u8; N], usize);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at_most = if self.exact { "" } else { "at most " };
        write!(f, "{}: a string of {at_most}{N} characters U+0000..U+00FF", self.field)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        let mut out = [0u8; N];
        let mut len = 0;
        for c in s.chars() {
            let Ok(byte) = u8::try_from(c) else {
                return Err(E::custom(format_args!(
                    "{}: character {c:?} is not one byte (U+0000..U+00FF)",
                    self.field
                )));
            };
            let Some(slot) = out.get_mut(len) else {
                return Err(E::custom(format_args!("{}: {s:?} is longer than {N} bytes", self.field)));
            };
            *slot = byte;
            len += 1;
        }
        if self.exact && len != N {
            return Err(E::custom(format_args!("{}: {s:?} is not exactly {N} bytes", self.field)));
        }
        Ok((out, len))
    }
}

/// Reads a hex string into the codec's byte scratch; returns where its bytes are there.
struct HexSeed<'s> {
    out: &'s mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for HexSeed<'_> {
    type Value = (usize, usize);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(usize, usize), D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for HexSeed<'_> {
    type Value = (usize, usize);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bytes: a string of hex digits")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(usize, usize), E> {
        // Checked before anything is appended: the scratch grows by at most what the frame
        // itself holds, and never past one IEX block.
        if !s.len().is_multiple_of(2) {
            return Err(E::custom("bytes: an odd number of hex digits"));
        }
        if s.len() / 2 > MAX_UNKNOWN_LEN {
            return Err(E::custom(format_args!("bytes: {} bytes exceed {MAX_UNKNOWN_LEN}", s.len() / 2)));
        }
        fn digit(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                b'A'..=b'F' => Some(c - b'A' + 10),
                _ => None,
            }
        }
        let start = self.out.len();
        for pair in s.as_bytes().chunks_exact(2) {
            match (digit(pair[0]), digit(pair[1])) {
                (Some(hi), Some(lo)) => self.out.push(hi << 4 | lo),
                _ => {
                    self.out.truncate(start);
                    return Err(E::custom("bytes: not a hex digit"));
                }
            }
        }
        Ok((start, s.len() / 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fixtures::{header, trade};

    #[test]
    fn the_frame_is_one_readable_line() {
        let mut out = Vec::new();
        JsonCodec::new(Limits::default()).encode(&header(), &[trade(1)], &mut out).unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        assert_eq!(
            text,
            "{\"protocol_id\":32772,\"channel_id\":1,\"session_id\":2,\"first_sequence\":3,\"send_time\":4,\
             \"publish_time\":5,\"messages\":[{\"type\":\"trade_report\",\"sale_condition\":64,\"timestamp\":1,\
             \"symbol\":\"ZIEXT\",\"size\":100,\"price\":10001,\"trade_id\":1}]}\n"
        );
        // It is plain JSON for any other reader.
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(value["messages"][0]["symbol"], "ZIEXT");
    }

    #[test]
    fn a_refused_batch_leaves_the_output_as_it_was() {
        let mut out = b"kept".to_vec();
        let mut codec = JsonCodec::new(Limits::default());
        for bytes in [&b""[..], b"y", b"Tabc"] {
            let kind = if bytes == b"Tabc" { b'T' } else { b'z' };
            let m = Message::Unknown(UnknownMessage { kind, bytes });
            let e = codec.encode(&header(), &[trade(1), m], &mut out).unwrap_err();
            assert!(matches!(e, EncodeError::Unrepresentable { index: 1, .. }), "{e}");
        }
        assert_eq!(out, b"kept");
    }

    #[test]
    fn a_decode_error_quoting_the_frame_shows_its_control_characters_escaped() {
        let mut codec = JsonCodec::new(Limits::default());
        let mut out = Vec::new();
        codec.encode(&header(), &[trade(1)], &mut out).unwrap();
        // A message type of the peer's choosing, with an escape and a newline (JSON-escaped, so
        // the frame is still one line).
        let frame = String::from_utf8(out).unwrap().replace("trade_report", "\\u001b[2J\\nforged");
        let e = codec.decode(frame.as_bytes(), |_| {}).unwrap_err();
        assert!(!e.what.chars().any(char::is_control), "{e}");
        assert!(e.what.contains("\\u{1b}[2J\\nforged"), "{e}");
    }

    #[test]
    fn a_frame_that_is_not_utf8_is_an_error_at_its_first_bad_byte() {
        let mut codec = JsonCodec::new(Limits::default());
        let mut frame = Vec::new();
        codec.encode(&header(), &[trade(1)], &mut frame).unwrap();
        let at = frame.windows(5).position(|w| w == b"ZIEXT").unwrap();
        frame[at + 1] = 0xff;
        let e = codec.decode(&frame, |_| panic!("no message of a frame that is not UTF-8")).unwrap_err();
        assert_eq!((e.offset, e.what.as_ref()), (at + 1, "the frame is not UTF-8"), "{e}");
        // The same frame made valid again decodes: the check is on the bytes, not the codec's state.
        frame[at + 1] = b'I';
        assert_eq!(codec.decode(&frame, |_| {}).unwrap().session_id, header().session_id);
    }
}
