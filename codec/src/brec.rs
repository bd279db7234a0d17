//! brec (the `brec` crate, 0.6): one frame is one brec packet, exactly as brec lays it out, with
//! its packet header, block and payload signatures and CRCs. The frequent message types travel as
//! brec *blocks*, fixed-size and read zero-copy, so a symbol filter can pass over them without
//! touching the rest; every other message travels in the packet's *payload*.
//!
//! A frame reads
//!
//! | part | bytes | what |
//! |---|---|---|
//! | packet header | 29 | brec's: signature, body size (u64), blocks length (u64), payload flag, CRC of the header |
//! | `BatchBlock` | 44 | the [`BatchHeader`] and the message count |
//! | message blocks | 37 to 49 each | one per hot message: `TradeReportBlock` (T), `TradeBreakBlock` (B), `PriceLevelBuyBlock` (8), `PriceLevelSellBlock` (5), `QuoteUpdateBlock` (Q) |
//! | payload header | 14 | brec's, present only with a payload: signature of brec's byte payload, CRC of the body, body length |
//! | payload body | | the records, see below |
//!
//! Every block is brec's: a 4-byte signature derived from its name and fields, the fields
//! little-endian in declaration order (the IEX fields of the message, symbol as its 8 bytes,
//! prices as the fixed-point i64), then the CRC32 of the fields.
//!
//! The payload is brec's built-in byte payload (`Vec<u8>`, its `Payload::Bytes`), whose body is
//! this codec's own records, one per message not carried as a block, each
//! `[index: u16][length: u16][the message in its IEX layout]`. The index is the message's position
//! in the batch: blocks hold the other positions in order, so a decoder merges the two in one pass
//! and the batch keeps its order across blocks and payload. Records carry the IEX layout
//! ([`Message::write_iex`], read back with [`Message::parse`]) because it is compact, already
//! defined and puts the symbol at a fixed offset (bytes 10..18) for the filter; a known type's
//! record is exactly its documented length, an unknown one is 1 to 65535 bytes, its type byte
//! first.
//!
//! Which types are blocks: the ones that make up a trading day (price level updates in DEEP,
//! quote updates in TOPS, trades everywhere). System events, security directory, trading status,
//! operational halt, short-sale test, security events, retail liquidity, official prices, auction
//! information and unknown types come once per symbol or a few times a day: the payload. (The
//! IEX test-environment samples under `shared/data/iex` are dominated by trading-status,
//! operational-halt and short-sale messages, 72% of DEEP10's messages, but those all sit in the
//! start-of-day broadcast, 4% of its segments; the rest of the day is blocks only.)
//!
//! Limits: brec allows at most 255 blocks in a packet (`brec::MAX_BLOCKS_COUNT`), the batch
//! block one of them, so at most [`MAX_MESSAGE_BLOCKS`] messages are blocks. A batch with more hot
//! messages (an IEX segment holds up to 65535 messages) is not refused and not split: the hot
//! messages past that number go in the payload as records like the rare ones. The decoder accepts
//! a record of any type. The payload body and the packet are bounded by [`MAX_PAYLOAD_LEN`] and
//! [`MAX_PACKET_LEN`] (the limits given to `brec::generate!`, so brec's own readers accept every
//! frame written here); a batch beyond them is refused with [`EncodeError::Unrepresentable`].
//!
//! Reading and writing use brec's allocation-free parts: its generated block writers and
//! zero-copy `*Referred` block readers (which check each block's signature and CRC), and
//! [`PacketHeader`] (signature, header CRC). Two brec conveniences allocate on every packet and
//! are replaced by the same bytes read and written in place: `PacketDef` (a `Vec` of owned
//! blocks per packet) and `PayloadHeader` (`Vec`-backed signature and CRC). The tests check that
//! brec's own `PacketDef` writer produces exactly the bytes of this encoder and that brec's reader
//! reads its frames back, so a frame is a brec packet by brec's own account.
//!
//! Filtering ([`BrecCodec::decode_filtered`]): brec's reader rules accept or deny a whole packet
//! by its blocks; a subscriber needs messages by symbol, so the same test is made per block: the
//! referred block is read (signature and CRC checked, nothing copied) and its symbol compared
//! before any message is built. Records are filtered on their symbol bytes before they are
//! parsed. Messages without a symbol (system events, unknown types) are skipped.
//!
//! Decoding streams: messages are visited as the blocks are read, so a block that fails its CRC
//! ends the decode with an error after the messages before it were visited (as SBE's decoder
//! does). The packet header, the payload (its CRC over the whole body) and the frame's length are
//! checked before the first message.

use super::format::Format;
use super::frame::{BatchHeader, DecodeError, EncodeError, Limits};
use crate::format_codec::{Batch, FilteredSink, FormatCodec};
use ::brec::{CrcU32, PACKET_SIG, PacketHeader, ReadBlockFromSlice, SignatureU32, StaticPayloadSignature, WriteTo};
use mdrelay_iex::for_each_message_type;
use mdrelay_iex::message::{Message, PriceLevelUpdate, QuoteUpdate, Side, Trade, UnknownMessage, kind, layout_len};
use mdrelay_iex::price::{Price, Symbol};
use std::borrow::Cow;
use wire::{
    BatchBlock, BatchBlockReferred, PriceLevelBuyBlock, PriceLevelBuyBlockReferred, PriceLevelSellBlock,
    PriceLevelSellBlockReferred, QuoteUpdateBlock, QuoteUpdateBlockReferred, TradeBreakBlock, TradeBreakBlockReferred,
    TradeReportBlock, TradeReportBlockReferred,
};

/// The protocol's brec types: the blocks, and what `brec::generate!` makes of them (the `Block`
/// and `BlockReferred` enums, the `Payload` enum with brec's built-in payloads, the `Packet` type
/// and its readers), used by the tests to check frames against brec's own reader and writer.
///
/// brec's generated code uses `unsafe` (pointer copies in its writers, a lifetime transmute in its
/// slice readers) without the comments the workspace lints ask for; it is brec's, not ours.
#[allow(unsafe_code, dead_code, missing_docs, clippy::all, clippy::undocumented_unsafe_blocks)]
pub(crate) mod wire {
    /// The batch header; always the packet's first block.
    #[::brec::block]
    pub struct BatchBlock {
        pub protocol_id: u16,
        pub channel_id: u32,
        pub session_id: u32,
        pub first_sequence: i64,
        pub send_time: i64,
        pub publish_time: i64,
        /// Messages in the batch, blocks and records together.
        pub message_count: u16,
    }

    /// T: a trade report.
    #[::brec::block]
    pub struct TradeReportBlock {
        pub sale_condition: u8,
        pub timestamp: i64,
        pub symbol: [u8; 8],
        pub size: u32,
        pub price: i64,
        pub trade_id: i64,
    }

    /// B: a trade break (the trade report's fields).
    #[::brec::block]
    pub struct TradeBreakBlock {
        pub sale_condition: u8,
        pub timestamp: i64,
        pub symbol: [u8; 8],
        pub size: u32,
        pub price: i64,
        pub trade_id: i64,
    }

    /// 8: a price level update on the buy side.
    #[::brec::block]
    pub struct PriceLevelBuyBlock {
        pub event_flags: u8,
        pub timestamp: i64,
        pub symbol: [u8; 8],
        pub size: u32,
        pub price: i64,
    }

    /// 5: a price level update on the sell side.
    #[::brec::block]
    pub struct PriceLevelSellBlock {
        pub event_flags: u8,
        pub timestamp: i64,
        pub symbol: [u8; 8],
        pub size: u32,
        pub price: i64,
    }

    /// Q: a quote update.
    #[::brec::block]
    pub struct QuoteUpdateBlock {
        pub flags: u8,
        pub timestamp: i64,
        pub symbol: [u8; 8],
        pub bid_size: u32,
        pub bid_price: i64,
        pub ask_price: i64,
        pub ask_size: u32,
    }

    // The packet and payload limits of the generated types: see `MAX_PAYLOAD_LEN` and
    // `MAX_PACKET_LEN` in the parent module, which must match.
    ::brec::generate!(default_max_payload_len = 16777216, default_max_packet_len = 16777216);
}

/// Length of brec's packet header.
pub const PACKET_HEADER_LEN: usize = PacketHeader::SIZE as usize;

/// Length of brec's payload header as this codec writes it: 4-byte signature and 4-byte CRC.
pub const PAYLOAD_HEADER_LEN: usize = 1 + 4 + 1 + 4 + 4;

/// Most message blocks in one packet: brec's 255 blocks, less the batch block.
pub const MAX_MESSAGE_BLOCKS: usize = ::brec::MAX_BLOCKS_COUNT as usize - 1;

/// Largest payload body written or read, in bytes (the protocol's limit for brec's readers).
pub const MAX_PAYLOAD_LEN: usize = 16 << 20;

/// Largest packet body (blocks and payload, without the packet header) written or read.
pub const MAX_PACKET_LEN: usize = 16 << 20;

/// Longest unknown message carried (as long as an IEX-TP message block can be).
pub const MAX_UNKNOWN_LEN: usize = u16::MAX as usize;

/// Bytes of a record before the message: its index and its length, u16 each.
const RECORD_HEADER_LEN: usize = 4;

/// Offset of a message's symbol in its IEX layout (every type but S).
const SYMBOL_AT: usize = 10;

/// Offset of the payload flag in brec's packet header.
const PAYLOAD_FLAG_AT: usize = PACKET_SIG.len() + 8 + 8;

// The limits given to `brec::generate!` above.
const _: () = assert!(
    <wire::Payload as ::brec::ProtocolSchema>::MAX_PAYLOAD_LEN as usize == MAX_PAYLOAD_LEN
        && <wire::Payload as ::brec::ProtocolSchema>::MAX_PACKET_LEN as usize == MAX_PACKET_LEN,
    "brec::generate! limits differ from MAX_PAYLOAD_LEN / MAX_PACKET_LEN"
);

/// Block lengths: brec's signature, the fields, brec's CRC.
const BATCH_LEN: usize = 4 + 36 + 4;
const TRADE_LEN: usize = 4 + 37 + 4;
const LEVEL_LEN: usize = 4 + 29 + 4;
const QUOTE_LEN: usize = 4 + 41 + 4;

/// brec codec; its record buffer is reused across frames.
#[derive(Debug)]
pub struct BrecCodec {
    limits: Limits,
    /// The payload body of the frame being encoded: it follows every block in the packet, so
    /// records are gathered here while the blocks go straight to the output.
    records: Vec<u8>,
    /// The signature of brec's byte payload (a CRC of its type name), computed once.
    payload_sig: [u8; 4],
}

#[cold]
fn error(offset: usize, what: impl Into<Cow<'static, str>>) -> DecodeError {
    DecodeError::new(Format::Brec, offset, what)
}

#[cold]
fn unrepresentable(index: usize, what: impl Into<Cow<'static, str>>) -> EncodeError {
    EncodeError::Unrepresentable { format: Format::Brec, index, what: what.into() }
}

/// A block reader's error as ours: `what` names the block, `at` is its offset in the frame.
#[cold]
#[inline(never)]
fn block_error(at: usize, what: &str, e: &::brec::Error) -> DecodeError {
    match e {
        ::brec::Error::CrcDismatch => error(at, format!("{what} block fails its CRC")),
        ::brec::Error::NotEnoughData(_) | ::brec::Error::NotEnoughtSignatureData(..) => {
            error(at, format!("{what} block runs past the packet's blocks"))
        }
        ::brec::Error::SignatureDismatch(_) => error(at, format!("expected a {what} block: signature mismatch")),
        other => error(at, format!("{what} block: {other}")),
    }
}

/// The signature of brec's built-in byte payload.
fn bytes_payload_sig() -> [u8; 4] {
    let mut sig = [0u8; 4];
    sig.copy_from_slice(<Vec<u8> as StaticPayloadSignature>::ssig().as_slice());
    sig
}

/// What makes an unknown message one the model could not have produced, if anything.
fn unknown_problem(m: &UnknownMessage<'_>) -> Option<&'static str> {
    if m.bytes.is_empty() {
        Some("unknown message with no bytes: they hold at least the type byte")
    } else if m.bytes.len() > MAX_UNKNOWN_LEN {
        Some("unknown message longer than 65535 bytes")
    } else if m.bytes[0] != m.kind {
        Some("unknown message whose bytes do not start with its type byte")
    } else if layout_len(m.kind).is_some() {
        Some("unknown message whose type byte is a known type")
    } else {
        None
    }
}

/// Appends `message` as a block, if it is of a block type; `false` if it is not.
#[inline]
fn write_block(message: &Message<'_>, out: &mut Vec<u8>) -> bool {
    // Writing into a Vec cannot fail: the results are ignored.
    let _ = match message {
        Message::TradeReport(m) => trade_report_block(m).write_all(out),
        Message::TradeBreak(m) => trade_break_block(m).write_all(out),
        Message::PriceLevelUpdate(m) if m.side == Side::Buy => price_level_buy_block(m).write_all(out),
        Message::PriceLevelUpdate(m) => price_level_sell_block(m).write_all(out),
        Message::QuoteUpdate(m) => quote_update_block(m).write_all(out),
        _ => return false,
    };
    true
}

/// A field as a block holds it: a symbol as its eight bytes, a price as its i64.
macro_rules! brec_put {
    (Symbol, $value:expr) => {
        $value.0
    };
    (Price, $value:expr) => {
        $value.0
    };
    ($scalar:tt, $value:expr) => {
        $value
    };
}

/// A field read from a block's zero-copy form (arrays are borrowed there).
macro_rules! brec_take {
    (Symbol, $value:expr) => {
        Symbol(*$value)
    };
    (Price, $value:expr) => {
        Price($value)
    };
    ($scalar:tt, $value:expr) => {
        $value
    };
}

/// The items in braces if `$wire` is one of the types carried as blocks, else nothing.
macro_rules! if_block {
    (TradeReport $items:tt) => { if_block!(@yes $items); };
    (TradeBreak $items:tt) => { if_block!(@yes $items); };
    (PriceLevelBuy $items:tt) => { if_block!(@yes $items); };
    (PriceLevelSell $items:tt) => { if_block!(@yes $items); };
    (QuoteUpdate $items:tt) => { if_block!(@yes $items); };
    (@yes { $($items:tt)* }) => { $($items)* };
    ($other:ident $items:tt) => {};
}

/// For each block type, `trade_report_block` (the model's message as its block, for the
/// writer) and `trade_report_of` (the message from the block's zero-copy form): the block
/// structs in `wire` have the table's fields, in its order.
macro_rules! brec_conversions {
    ($($wire:ident $text:literal = $kind:ident => $variant:ident($ty:ident { $($fixed:ident: $fixed_value:path),* } {
        $($field:ident: $field_ty:tt),* $(,)?
    })),* $(,)?) => { pastey::paste! { $(
        if_block!($wire {
            #[doc = "A " $text " as its block."]
            #[inline(always)]
            fn [<$wire:snake _block>](m: &$ty) -> [<$wire Block>] {
                [<$wire Block>] { $($field: brec_put!($field_ty, m.$field),)* }
            }

            #[doc = "A " $text " from its block."]
            #[inline(always)]
            fn [<$wire:snake _of>](b: &[<$wire BlockReferred>]<'_>) -> $ty {
                $ty { $($fixed: $fixed_value,)* $($field: brec_take!($field_ty, b.$field),)* }
            }
        });
    )* } };
}
for_each_message_type!(brec_conversions);

/// A record's index and message, read from the payload body at `at`.
#[derive(Clone, Copy)]
struct Record<'a> {
    index: usize,
    bytes: &'a [u8],
    /// Offset of the record in the frame, for errors.
    at: usize,
}

/// The record at `at` in `body` (`base` is the body's offset in the frame), `None` at its end.
#[inline]
fn read_record(body: &[u8], at: usize, base: usize) -> Result<Option<Record<'_>>, DecodeError> {
    let Some(rest) = body.get(at..).filter(|r| !r.is_empty()) else { return Ok(None) };
    let Some(head) = rest.first_chunk::<RECORD_HEADER_LEN>() else {
        return Err(error(base + at, "payload record header cut short"));
    };
    let index = usize::from(u16::from_le_bytes([head[0], head[1]]));
    let len = usize::from(u16::from_le_bytes([head[2], head[3]]));
    let Some(bytes) = rest.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len) else {
        return Err(error(base + at + 2, format!("payload record of {len} bytes runs past the payload")));
    };
    let Some(&kind) = bytes.first() else {
        return Err(error(base + at + 2, "payload record of 0 bytes: a message holds at least its type byte"));
    };
    if let Some(layout) = layout_len(kind)
        && layout != len
    {
        return Err(error(
            base + at + 2,
            format!("payload record of type {:?} has {len} bytes, its layout {layout}", char::from(kind)),
        ));
    }
    Ok(Some(Record { index, bytes, at: base + at }))
}

/// A hot block's message, built from its zero-copy form.
macro_rules! read_block {
    ($referred:ident, $blocks:expr, $at:expr, $base:expr, $name:literal) => {{
        // brec's slice reader checks the signature, the length and the CRC. Its result borrows
        // nothing past this statement: every field is copied out below.
        let b: $referred<'_> =
            $referred::read_from_slice($blocks, false).map_err(|e| block_error($base + $at, $name, &e))?;
        b
    }};
}

impl BrecCodec {
    /// A codec with the given decoding limits.
    pub fn new(limits: Limits) -> Self {
        BrecCodec { limits, records: Vec::new(), payload_sig: bytes_payload_sig() }
    }

    /// Reads and checks brec's packet header, and the packet's length against the limits.
    #[inline]
    fn packet_header(&self, head: &[u8; PACKET_HEADER_LEN]) -> Result<PacketHeader, DecodeError> {
        // brec reads any flag byte but 1 as "no payload" (and its CRC covers the flag as 0 or
        // 1), so a flag of 2 would pass: only the two values brec writes are accepted.
        if head[PAYLOAD_FLAG_AT] > 1 {
            return Err(error(PAYLOAD_FLAG_AT, format!("packet header payload flag {}", head[PAYLOAD_FLAG_AT])));
        }
        let packet = PacketHeader::read_from_slice(head, false).map_err(|e| match e {
            ::brec::Error::CrcDismatch => error(PACKET_HEADER_LEN - 4, "packet header fails its CRC"),
            ::brec::Error::InvalidLength => error(16, "packet header blocks length exceeds the packet size"),
            other => error(0, format!("packet header: {other}")),
        })?;
        let max = self.limits.max_frame.min(PACKET_HEADER_LEN + MAX_PACKET_LEN);
        if packet.size > (max - PACKET_HEADER_LEN.min(max)) as u64 {
            return Err(error(8, format!("packet of {} body bytes exceeds the {max}-byte frame limit", packet.size)));
        }
        Ok(packet)
    }

    /// The one decoder behind `decode` (`FILTER` false) and `decode_filtered`.
    #[inline(always)]
    fn walk<const FILTER: bool, K: FilteredSink>(
        &self,
        frame: &[u8],
        sink: &mut K,
    ) -> Result<BatchHeader, DecodeError> {
        let Some(head) = frame.first_chunk::<PACKET_HEADER_LEN>() else {
            return Err(error(frame.len(), format!("frame of {} bytes, shorter than a packet header", frame.len())));
        };
        if head[..PACKET_SIG.len()] != PACKET_SIG {
            return Err(error(0, "not a brec packet: the packet signature does not match"));
        }
        let packet = self.packet_header(head)?;
        let len = PACKET_HEADER_LEN + packet.size as usize;
        if frame.len() != len {
            return Err(error(8, format!("packet header says {len} bytes, the frame has {}", frame.len())));
        }
        let blocks_end = PACKET_HEADER_LEN + packet.blocks_len as usize;
        let blocks = &frame[PACKET_HEADER_LEN..blocks_end];
        let body = self.payload(frame, blocks_end, packet.payload)?;
        let body_at = blocks_end + PAYLOAD_HEADER_LEN;

        let batch = read_block!(BatchBlockReferred, blocks, 0, PACKET_HEADER_LEN, "batch");
        let header = BatchHeader {
            protocol_id: batch.protocol_id,
            channel_id: batch.channel_id,
            session_id: batch.session_id,
            first_sequence: batch.first_sequence,
            message_count: u32::from(batch.message_count),
            send_time: batch.send_time,
            publish_time: batch.publish_time,
        };
        let count = usize::from(batch.message_count);
        let mut at = BATCH_LEN;
        let mut block_count = 1;
        let mut record_at = 0;
        let mut next = read_record(body, record_at, body_at)?;
        for index in 0..count {
            if let Some(record) = next.filter(|r| r.index == index) {
                record_at = record.at - body_at + RECORD_HEADER_LEN + record.bytes.len();
                next = read_record(body, record_at, body_at)?;
                if let Some(n) = next
                    && n.index <= index
                {
                    return Err(error(n.at, format!("payload record index {} after index {index}", n.index)));
                }
                visit_record::<FILTER, _>(record, sink);
                continue;
            }
            let Some(rest) = blocks.get(at..).filter(|r| r.len() >= 4) else {
                return Err(error(
                    PACKET_HEADER_LEN + at,
                    format!("message {index} of {count}: no block left and no payload record for it"),
                ));
            };
            block_count += 1;
            if block_count > usize::from(::brec::MAX_BLOCKS_COUNT) {
                return Err(error(PACKET_HEADER_LEN + at, "more than brec's 255 blocks in one packet"));
            }
            let sig: &[u8; 4] = rest.first_chunk().unwrap_or(&[0; 4]);
            let base = PACKET_HEADER_LEN;
            // Each block type: read it (brec checks its signature, length and CRC), step over
            // it, then skip it by the filter or hand its message over.
            macro_rules! block {
                ($referred:ident, $len:ident, $kind:expr, $variant:ident, $of:ident, $name:literal) => {{
                    let b = read_block!($referred, rest, at, base, $name);
                    at += $len;
                    if FILTER && !sink.wants(*b.symbol) {
                        sink.skip($kind);
                        continue;
                    }
                    sink.visit(&Message::$variant($of(&b)));
                }};
            }
            if sig == TradeReportBlockReferred::sig() {
                block!(
                    TradeReportBlockReferred,
                    TRADE_LEN,
                    kind::TRADE_REPORT,
                    TradeReport,
                    trade_report_of,
                    "trade report"
                )
            } else if sig == PriceLevelBuyBlockReferred::sig() {
                block!(
                    PriceLevelBuyBlockReferred,
                    LEVEL_LEN,
                    kind::PRICE_LEVEL_BUY,
                    PriceLevelUpdate,
                    price_level_buy_of,
                    "price level buy"
                )
            } else if sig == PriceLevelSellBlockReferred::sig() {
                block!(
                    PriceLevelSellBlockReferred,
                    LEVEL_LEN,
                    kind::PRICE_LEVEL_SELL,
                    PriceLevelUpdate,
                    price_level_sell_of,
                    "price level sell"
                )
            } else if sig == QuoteUpdateBlockReferred::sig() {
                block!(
                    QuoteUpdateBlockReferred,
                    QUOTE_LEN,
                    kind::QUOTE_UPDATE,
                    QuoteUpdate,
                    quote_update_of,
                    "quote update"
                )
            } else if sig == TradeBreakBlockReferred::sig() {
                block!(TradeBreakBlockReferred, TRADE_LEN, kind::TRADE_BREAK, TradeBreak, trade_break_of, "trade break")
            } else {
                return Err(unknown_block(PACKET_HEADER_LEN + at, sig));
            }
        }
        if at != blocks.len() {
            return Err(error(
                PACKET_HEADER_LEN + at,
                format!("{} bytes of blocks after the last message", blocks.len() - at),
            ));
        }
        if let Some(r) = next {
            return Err(error(r.at, format!("payload record index {} is past the {count} messages", r.index)));
        }
        Ok(header)
    }

    /// The payload body after brec's payload header at `at`, checked: brec's byte payload, its
    /// CRC, and exactly the rest of the packet. Empty when the packet has no payload.
    #[inline]
    fn payload<'a>(&self, frame: &'a [u8], at: usize, present: bool) -> Result<&'a [u8], DecodeError> {
        let region = &frame[at..];
        if !present {
            if !region.is_empty() {
                return Err(error(at, format!("{} bytes after the blocks of a packet without payload", region.len())));
            }
            return Ok(&[]);
        }
        let Some(head) = region.first_chunk::<PAYLOAD_HEADER_LEN>() else {
            return Err(error(at, "payload header cut short"));
        };
        if head[0] != 4 || head[1..5] != self.payload_sig {
            return Err(error(at, "payload signature: not brec's byte payload"));
        }
        if head[5] != 4 {
            return Err(error(at + 5, format!("payload CRC length {}, expected 4", head[5])));
        }
        let len = u32::from_le_bytes([head[10], head[11], head[12], head[13]]) as usize;
        let body = &region[PAYLOAD_HEADER_LEN..];
        if len != body.len() {
            return Err(error(at + 10, format!("payload length {len}, the packet holds {}", body.len())));
        }
        if len > MAX_PAYLOAD_LEN {
            return Err(error(at + 10, format!("payload of {len} bytes exceeds brec's {MAX_PAYLOAD_LEN}-byte limit")));
        }
        let mut hasher = ::brec::crc32fast::Hasher::new();
        hasher.update(body);
        if hasher.finalize().to_le_bytes() != head[6..10] {
            return Err(error(at + 6, "payload fails its CRC"));
        }
        Ok(body)
    }
}

impl FormatCodec for BrecCodec {
    /// Appends one frame (one brec packet) for `header` and `messages` to `out`. Unknown messages
    /// must be what the model makes of an IEX block (1 to 65535 bytes starting with their type
    /// byte, which is no known type), and the payload and packet must stay within
    /// [`MAX_PAYLOAD_LEN`] and [`MAX_PACKET_LEN`]; otherwise the batch is refused and `out` left
    /// as it was.
    fn encode_batch(&mut self, batch: Batch<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let Batch { header, messages, count } = batch;
        let start = out.len();
        // The packet header's lengths and CRC are known once the body is written: a placeholder
        // now, filled in at the end.
        out.resize(start + PACKET_HEADER_LEN, 0);
        let batch = BatchBlock {
            protocol_id: header.protocol_id,
            channel_id: header.channel_id,
            session_id: header.session_id,
            first_sequence: header.first_sequence,
            send_time: header.send_time,
            publish_time: header.publish_time,
            // At most MAX_BATCH (u16::MAX): `count`, checked by `FormatCodec::encode`.
            message_count: count,
        };
        let _ = batch.write_all(out);
        self.records.clear();
        let mut blocks = 0;
        for (index, message) in messages.iter().enumerate() {
            if blocks < MAX_MESSAGE_BLOCKS && write_block(message, out) {
                blocks += 1;
                continue;
            }
            if let Message::Unknown(m) = message
                && let Some(what) = unknown_problem(m)
            {
                return Err(unrepresentable(index, what));
            }
            let len = message.iex_len();
            if self.records.len() + RECORD_HEADER_LEN + len > MAX_PAYLOAD_LEN {
                return Err(unrepresentable(index, "the payload would exceed brec's 16 MiB payload limit"));
            }
            // Both fit a u16: the index is below MAX_BATCH, the length at most MAX_UNKNOWN_LEN
            // or a known layout's.
            self.records.extend_from_slice(&(index as u16).to_le_bytes());
            self.records.extend_from_slice(&(len as u16).to_le_bytes());
            message.write_iex(&mut self.records);
        }
        let blocks_len = out.len() - start - PACKET_HEADER_LEN;
        let has_payload = !self.records.is_empty();
        if has_payload {
            let mut hasher = ::brec::crc32fast::Hasher::new();
            hasher.update(&self.records);
            // brec's payload header (`PayloadHeader::as_vec`, without its Vec): signature length
            // and signature, CRC length and CRC, body length.
            out.push(4);
            out.extend_from_slice(&self.payload_sig);
            out.push(4);
            out.extend_from_slice(&hasher.finalize().to_le_bytes());
            out.extend_from_slice(&(self.records.len() as u32).to_le_bytes());
            out.extend_from_slice(&self.records);
        }
        let size = out.len() - start - PACKET_HEADER_LEN;
        if size > MAX_PACKET_LEN {
            return Err(unrepresentable(
                messages.len().saturating_sub(1),
                "the packet would exceed brec's 16 MiB limit",
            ));
        }
        let mut packet =
            PacketHeader { size: size as u64, blocks_len: blocks_len as u64, payload: has_payload, crc: 0 };
        packet.crc = u32::from_le_bytes(packet.crc());
        let _ = packet.write_all(&mut &mut out[start..start + PACKET_HEADER_LEN]);
        Ok(())
    }

    fn format(&self) -> Format {
        Format::Brec
    }

    /// The length of the brec packet at the start of `buf`, from its header: `None` while fewer
    /// than its 29 bytes (or fewer than the packet's) have come, an error as soon as the bytes
    /// present are not a packet signature, or the header fails its CRC, or the packet is longer
    /// than `max_frame` or [`MAX_PACKET_LEN`]. Nothing is allocated.
    fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        let seen = buf.len().min(PACKET_SIG.len());
        if buf[..seen] != PACKET_SIG[..seen] {
            return Err(error(0, "not a brec packet: the packet signature does not match"));
        }
        let Some(head) = buf.first_chunk::<PACKET_HEADER_LEN>() else { return Ok(None) };
        let packet = self.packet_header(head)?;
        let len = PACKET_HEADER_LEN + packet.size as usize;
        Ok((buf.len() >= len).then_some(len))
    }

    /// Decodes one frame (exactly the bytes [`BrecCodec::frame_len`] delimited), handing each
    /// message to `visit` in batch order, and returns the batch header.
    fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], visit: F) -> Result<BatchHeader, DecodeError> {
        self.walk::<false, _>(frame, &mut Everything(visit))
    }

    /// Decodes one frame like [`BrecCodec::decode`], handing `sink` the messages of the
    /// symbols it wants and the type byte of every other: a block's symbol is read
    /// from its zero-copy form before any message is built, a record's from its bytes before it
    /// is parsed. Messages without a symbol are skipped.
    fn decode_to(&mut self, frame: &[u8], sink: &mut impl FilteredSink) -> Result<BatchHeader, DecodeError> {
        self.walk::<true, _>(frame, sink)
    }
}

/// The sink of an unfiltered decode: every message to the closure (the walk does not ask it
/// `wants`, nor calls `skip`, with `FILTER` false).
struct Everything<V>(V);

impl<V: FnMut(&Message<'_>)> FilteredSink for Everything<V> {
    #[inline]
    fn wants(&self, _: [u8; 8]) -> bool {
        true
    }

    #[inline]
    fn visit(&mut self, message: &Message<'_>) {
        (self.0)(message)
    }

    #[inline]
    fn skip(&mut self, _: u8) {}
}

/// Hands a record's message to the sink, or (filtering) its type byte when its symbol,
/// read before the message is parsed, is not the filter's or it has none.
#[inline]
fn visit_record<const FILTER: bool, K: FilteredSink>(record: Record<'_>, sink: &mut K) {
    let kind = record.bytes[0];
    if FILTER {
        let symbol = match layout_len(kind) {
            Some(_) if kind != kind::SYSTEM_EVENT => record.bytes.get(SYMBOL_AT..SYMBOL_AT + 8),
            _ => None,
        };
        let wanted = symbol.and_then(|s| s.first_chunk::<8>()).is_some_and(|s| sink.wants(*s));
        if !wanted {
            sink.skip(kind);
            return;
        }
    }
    // A known type's record is exactly its layout (checked when read), so it parses; anything
    // else is the unknown message it was written as.
    match Message::parse(record.bytes) {
        Ok(message) => sink.visit(&message),
        Err(_) => sink.visit(&Message::Unknown(UnknownMessage { kind, bytes: record.bytes })),
    }
}

#[cold]
#[inline(never)]
fn unknown_block(at: usize, sig: &[u8; 4]) -> DecodeError {
    if sig == BatchBlockReferred::sig() {
        error(at, "a second batch block: only the packet's first block is one")
    } else {
        error(at, format!("block signature {sig:02x?} is no block of this protocol"))
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{Block, Packet, Payload};
    use super::*;
    use crate::filter::SymbolFilter;
    use crate::fixtures::{debug, header, trade};
    use ::brec::{ReadPacketFrom, WriteMutTo};
    use mdrelay_iex::message::{OperationalHaltStatus, SystemEvent, TradingStatus};

    fn sym(s: &str) -> Symbol {
        Symbol::new(s).unwrap()
    }

    fn level(side: Side, symbol: &str, n: i64) -> Message<'static> {
        Message::PriceLevelUpdate(PriceLevelUpdate {
            side,
            event_flags: 1,
            timestamp: n,
            symbol: sym(symbol),
            size: n as u32,
            price: Price(n * 100),
        })
    }

    fn quote(symbol: &str, n: i64) -> Message<'static> {
        Message::QuoteUpdate(QuoteUpdate {
            flags: 0,
            timestamp: n,
            symbol: sym(symbol),
            bid_size: 1,
            bid_price: Price(n),
            ask_price: Price(n + 1),
            ask_size: 2,
        })
    }

    fn status(symbol: &str, n: i64) -> Message<'static> {
        Message::TradingStatus(TradingStatus { status: b'T', timestamp: n, symbol: sym(symbol), reason: *b"    " })
    }

    fn trade_of(symbol: &str, n: i64, brk: bool) -> Message<'static> {
        let t = Trade { sale_condition: 0, timestamp: n, symbol: sym(symbol), size: 10, price: Price(n), trade_id: n };
        if brk { Message::TradeBreak(t) } else { Message::TradeReport(t) }
    }

    /// Blocks and records interleaved, two symbols, every block type and a few payload types.
    fn mixed() -> Vec<Message<'static>> {
        vec![
            Message::SystemEvent(SystemEvent { event: b'O', timestamp: 1 }),
            trade_of("AAA", 2, false),
            status("BBB", 3),
            level(Side::Buy, "BBB", 4),
            level(Side::Sell, "AAA", 5),
            Message::Unknown(UnknownMessage { kind: b'z', bytes: b"zabc" }),
            quote("AAA", 6),
            status("AAA", 7),
            trade_of("BBB", 8, true),
            Message::OperationalHaltStatus(OperationalHaltStatus { status: b'N', timestamp: 9, symbol: sym("AAA") }),
            trade_of("AAA", 10, true),
        ]
    }

    fn encode(messages: &[Message<'_>]) -> Vec<u8> {
        crate::fixtures::encoded(BrecCodec::new(Limits::default()), &header(), messages)
    }

    fn decode_all(frame: &[u8]) -> Result<(BatchHeader, Vec<String>), DecodeError> {
        crate::fixtures::decoded(&mut BrecCodec::new(Limits::default()), frame)
    }

    /// A frame from its parts, with brec's packet header and payload header over them.
    fn assemble(blocks: &[u8], body: Option<&[u8]>) -> Vec<u8> {
        let mut payload = Vec::new();
        if let Some(body) = body {
            let mut hasher = ::brec::crc32fast::Hasher::new();
            hasher.update(body);
            payload.push(4);
            payload.extend_from_slice(&bytes_payload_sig());
            payload.push(4);
            payload.extend_from_slice(&hasher.finalize().to_le_bytes());
            payload.extend_from_slice(&(body.len() as u32).to_le_bytes());
            payload.extend_from_slice(body);
        }
        let mut packet = PacketHeader {
            size: (blocks.len() + payload.len()) as u64,
            blocks_len: blocks.len() as u64,
            payload: body.is_some(),
            crc: 0,
        };
        packet.crc = u32::from_le_bytes(packet.crc());
        let mut out = Vec::new();
        packet.write_all(&mut out).unwrap();
        out.extend_from_slice(blocks);
        out.extend_from_slice(&payload);
        out
    }

    /// The batch block of `count` messages, as the encoder writes it for the fixture header.
    fn batch_block(count: u16) -> Vec<u8> {
        let h = header();
        let mut out = Vec::new();
        BatchBlock {
            protocol_id: h.protocol_id,
            channel_id: h.channel_id,
            session_id: h.session_id,
            first_sequence: h.first_sequence,
            send_time: h.send_time,
            publish_time: h.publish_time,
            message_count: count,
        }
        .write_all(&mut out)
        .unwrap();
        out
    }

    fn record(index: u16, message: &Message<'_>) -> Vec<u8> {
        let mut out = index.to_le_bytes().to_vec();
        out.extend_from_slice(&(message.iex_len() as u16).to_le_bytes());
        message.write_iex(&mut out);
        out
    }

    #[test]
    fn block_lengths_are_brecs() {
        use ::brec::StaticSize;
        assert_eq!(BatchBlock::ssize() as usize, BATCH_LEN);
        assert_eq!(TradeReportBlock::ssize() as usize, TRADE_LEN);
        assert_eq!(TradeBreakBlock::ssize() as usize, TRADE_LEN);
        assert_eq!(PriceLevelBuyBlock::ssize() as usize, LEVEL_LEN);
        assert_eq!(PriceLevelSellBlock::ssize() as usize, LEVEL_LEN);
        assert_eq!(QuoteUpdateBlock::ssize() as usize, QUOTE_LEN);
    }

    #[test]
    fn a_frame_is_exactly_what_brecs_own_writer_writes() {
        let messages = mixed();
        let frame = encode(&messages);
        // The same packet through brec's PacketDef: the blocks, then the records as brec's byte
        // payload.
        let mut blocks = vec![Block::BatchBlock(BatchBlock {
            protocol_id: header().protocol_id,
            channel_id: header().channel_id,
            session_id: header().session_id,
            first_sequence: header().first_sequence,
            send_time: header().send_time,
            publish_time: header().publish_time,
            message_count: messages.len() as u16,
        })];
        let mut records = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            match *m {
                Message::TradeReport(t) => blocks.push(Block::TradeReportBlock(TradeReportBlock {
                    sale_condition: t.sale_condition,
                    timestamp: t.timestamp,
                    symbol: t.symbol.0,
                    size: t.size,
                    price: t.price.0,
                    trade_id: t.trade_id,
                })),
                Message::TradeBreak(t) => blocks.push(Block::TradeBreakBlock(TradeBreakBlock {
                    sale_condition: t.sale_condition,
                    timestamp: t.timestamp,
                    symbol: t.symbol.0,
                    size: t.size,
                    price: t.price.0,
                    trade_id: t.trade_id,
                })),
                Message::PriceLevelUpdate(p) if p.side == Side::Buy => {
                    blocks.push(Block::PriceLevelBuyBlock(PriceLevelBuyBlock {
                        event_flags: p.event_flags,
                        timestamp: p.timestamp,
                        symbol: p.symbol.0,
                        size: p.size,
                        price: p.price.0,
                    }))
                }
                Message::PriceLevelUpdate(p) => blocks.push(Block::PriceLevelSellBlock(PriceLevelSellBlock {
                    event_flags: p.event_flags,
                    timestamp: p.timestamp,
                    symbol: p.symbol.0,
                    size: p.size,
                    price: p.price.0,
                })),
                Message::QuoteUpdate(q) => blocks.push(Block::QuoteUpdateBlock(QuoteUpdateBlock {
                    flags: q.flags,
                    timestamp: q.timestamp,
                    symbol: q.symbol.0,
                    bid_size: q.bid_size,
                    bid_price: q.bid_price.0,
                    ask_price: q.ask_price.0,
                    ask_size: q.ask_size,
                })),
                _ => records.extend_from_slice(&record(i as u16, m)),
            }
        }
        let mut packet = Packet::new(blocks, Some(Payload::Bytes(records)));
        let mut by_brec = Vec::new();
        packet.write_all(&mut by_brec, &mut ()).unwrap();
        assert_eq!(frame, by_brec);
    }

    #[test]
    fn brecs_own_reader_reads_a_frame() {
        let frame = encode(&mixed());
        let packet = <Packet as ReadPacketFrom>::read(&mut std::io::Cursor::new(&frame), &mut ()).unwrap();
        assert_eq!(packet.blocks.len(), 1 + 6, "the batch block and six hot messages");
        assert!(matches!(packet.blocks[0], Block::BatchBlock(BatchBlock { message_count: 11, .. })));
        let Some(Payload::Bytes(body)) = packet.payload else { panic!("brec's byte payload") };
        assert_eq!(
            body.len(),
            frame.len()
                - PACKET_HEADER_LEN
                - (BATCH_LEN + 3 * TRADE_LEN + 2 * LEVEL_LEN + QUOTE_LEN)
                - PAYLOAD_HEADER_LEN
        );
        // Without rare messages there is no payload at all.
        let frame = encode(&[trade(1), trade(2)]);
        let packet = <Packet as ReadPacketFrom>::read(&mut std::io::Cursor::new(&frame), &mut ()).unwrap();
        assert_eq!((packet.blocks.len(), packet.payload.is_none()), (3, true));
        assert_eq!(frame.len(), PACKET_HEADER_LEN + BATCH_LEN + 2 * TRADE_LEN);
    }

    #[test]
    fn order_is_kept_across_blocks_and_payload() {
        let messages = mixed();
        let (decoded, seen) = decode_all(&encode(&messages)).unwrap();
        assert_eq!(seen, debug(&messages));
        assert_eq!(decoded, BatchHeader { message_count: messages.len() as u32, ..header() });
        // Payload first and last, and a batch of only payload.
        let edges = [status("A", 1), trade(2), status("A", 3)];
        assert_eq!(decode_all(&encode(&edges)).unwrap().1, debug(&edges));
        let rare = [status("A", 1), status("B", 2)];
        assert_eq!(decode_all(&encode(&rare)).unwrap().1, debug(&rare));
        assert_eq!(decode_all(&encode(&[])).unwrap().1, Vec::<String>::new());
    }

    #[test]
    fn hot_messages_past_brecs_block_limit_go_in_the_payload_in_order() {
        // 300 hot messages with rare ones among them: 254 blocks, the rest records.
        let mut messages = Vec::new();
        for n in 0..300 {
            messages.push(if n % 3 == 0 { trade(n) } else { level(Side::Sell, "X", n) });
            if n % 50 == 0 {
                messages.push(status("X", n));
            }
        }
        let frame = encode(&messages);
        let (_, seen) = decode_all(&frame).unwrap();
        assert_eq!(seen, debug(&messages));
        let packet = <Packet as ReadPacketFrom>::read(&mut std::io::Cursor::new(&frame), &mut ()).unwrap();
        assert_eq!(packet.blocks.len(), usize::from(::brec::MAX_BLOCKS_COUNT), "brec's limit, reached");
        // A payload past brec's limit is refused cleanly.
        let big = vec![b'z'; MAX_UNKNOWN_LEN];
        let unknown = Message::Unknown(UnknownMessage { kind: b'z', bytes: &big });
        let batch = vec![unknown; MAX_PAYLOAD_LEN / MAX_UNKNOWN_LEN + 1];
        let mut out = b"kept".to_vec();
        let e = BrecCodec::new(Limits::default()).encode(&header(), &batch, &mut out).unwrap_err();
        let first_over = MAX_PAYLOAD_LEN / (RECORD_HEADER_LEN + MAX_UNKNOWN_LEN);
        assert!(
            matches!(e, EncodeError::Unrepresentable { format: Format::Brec, index, .. } if index == first_over),
            "{e}"
        );
        assert_eq!(out, b"kept");
    }

    #[test]
    fn a_flipped_payload_byte_fails_brecs_payload_crc() {
        let frame = encode(&mixed());
        let last = frame.len() - 1;
        let mut bad = frame.clone();
        bad[last] ^= 0x20;
        let e = decode_all(&bad).unwrap_err();
        assert!(e.what.contains("payload fails its CRC"), "{e}");
        assert_eq!(e.offset, PACKET_HEADER_LEN + BATCH_LEN + 3 * TRADE_LEN + 2 * LEVEL_LEN + QUOTE_LEN + 6);
        // Nothing was visited: the payload is checked before the first message.
        let mut visited = 0;
        assert!(BrecCodec::new(Limits::default()).decode(&bad, |_| visited += 1).is_err());
        assert_eq!(visited, 0);
    }

    #[test]
    fn a_flipped_block_byte_fails_the_blocks_crc() {
        let frame = encode(&[trade(1), trade(2)]);
        // A price byte of the second trade block.
        let at = PACKET_HEADER_LEN + BATCH_LEN + TRADE_LEN + 4 + 1 + 8 + 8 + 4;
        let mut bad = frame.clone();
        bad[at] ^= 1;
        let e = decode_all(&bad).unwrap_err();
        assert!(e.what.contains("trade report block fails its CRC"), "{e}");
        assert_eq!(e.offset, PACKET_HEADER_LEN + BATCH_LEN + TRADE_LEN);
        // And the batch block's and the packet header's.
        let mut bad = frame.clone();
        bad[PACKET_HEADER_LEN + 6] ^= 1;
        assert!(decode_all(&bad).unwrap_err().what.contains("batch block fails its CRC"));
        let mut bad = frame;
        bad[9] ^= 1;
        let e = decode_all(&bad).unwrap_err();
        assert!(e.what.contains("packet header fails its CRC"), "{e}");
    }

    #[test]
    fn decode_filtered_visits_exactly_the_filters_messages_and_skips_the_rest() {
        let messages = mixed();
        let frame = encode(&messages);
        let filter = SymbolFilter::new([sym("AAA")]);
        let mut visited = Vec::new();
        let mut skipped = Vec::new();
        let h = BrecCodec::new(Limits::default())
            .decode_filtered(&frame, &filter, |m| visited.push(format!("{m:?}")), |k| skipped.push(k))
            .unwrap();
        assert_eq!(h.message_count, 11);
        let want: Vec<&Message<'_>> = messages.iter().filter(|m| filter.matches_message(m)).collect();
        assert_eq!(visited, want.iter().map(|m| format!("{m:?}")).collect::<Vec<_>>());
        let skip_want: Vec<u8> = messages.iter().filter(|m| !filter.matches_message(m)).map(Message::kind).collect();
        assert_eq!(skipped, skip_want);
        assert_eq!(skipped, vec![b'S', b'H', b'8', b'z', b'B']);
        // An empty filter skips everything, in order.
        let mut skipped = Vec::new();
        BrecCodec::new(Limits::default())
            .decode_filtered(&frame, &SymbolFilter::default(), |m| panic!("visited {m:?}"), |k| skipped.push(k))
            .unwrap();
        assert_eq!(skipped, messages.iter().map(Message::kind).collect::<Vec<_>>());
    }

    #[test]
    fn frame_len_reads_brecs_packet_header() {
        let frame = encode(&mixed());
        let codec = BrecCodec::new(Limits::default());
        for cut in 0..frame.len() {
            assert_eq!(codec.frame_len(&frame[..cut]), Ok(None), "cut at {cut}");
        }
        let mut two = frame.clone();
        two.extend_from_slice(&frame);
        assert_eq!(codec.frame_len(&two), Ok(Some(frame.len())));
        assert!(codec.frame_len(b"\x00").is_err(), "garbage is an error from its first byte");
        let small = BrecCodec::new(Limits { max_frame: frame.len() - 1, ..Limits::default() });
        assert!(small.frame_len(&frame[..PACKET_HEADER_LEN]).is_err(), "over the limit from the header alone");
        // A packet size past the limit, with a valid header CRC: refused before any allocation.
        let mut huge = PacketHeader { size: u64::MAX, blocks_len: 0, payload: false, crc: 0 };
        huge.crc = u32::from_le_bytes(huge.crc());
        let mut head = Vec::new();
        huge.write_all(&mut head).unwrap();
        assert!(codec.frame_len(&head).unwrap_err().what.contains("exceeds"));
    }

    #[test]
    fn hostile_layouts_are_errors() {
        let t = trade(1);
        let s = status("A", 2);
        // Record index repeated, past the count, missing messages; malformed records.
        for (blocks, body, what) in [
            (&batch_block(2), [record(0, &s), record(0, &s)].concat(), "after index 0"),
            (&batch_block(1), [record(0, &s), record(1, &s)].concat(), "past the 1 messages"),
            (&batch_block(3), [record(0, &s), record(1, &s)].concat(), "no block left"),
            (&batch_block(1), vec![0, 0, 0, 0], "0 bytes"),
            (&batch_block(1), vec![0, 0, 5, 0, b'H', 0, 0, 0, 0], "its layout 22"),
            (&batch_block(1), vec![0, 0, 9, 0, b'z'], "runs past the payload"),
            (&batch_block(1), vec![0, 0], "record header cut short"),
        ] {
            let e = decode_all(&assemble(blocks, Some(&body))).unwrap_err();
            assert!(e.what.contains(what), "{what}: {e}");
        }
        // A second batch block, bytes after the last message, a payload flag brec does not write.
        let e = decode_all(&assemble(&[batch_block(1), batch_block(1)].concat(), None)).unwrap_err();
        assert!(e.what.contains("second batch block"), "{e}");
        let e = decode_all(&assemble(&[batch_block(0), vec![1, 2, 3, 4, 5]].concat(), None)).unwrap_err();
        assert!(e.what.contains("after the last message"), "{e}");
        let mut flag = assemble(&batch_block(0), None);
        flag[PAYLOAD_FLAG_AT] = 2;
        assert!(decode_all(&flag).unwrap_err().what.contains("payload flag"));
        // Blocks in a packet of another protocol's signature, and a frame with a byte too many.
        let e = decode_all(&assemble(&[batch_block(1), vec![9; TRADE_LEN]].concat(), None)).unwrap_err();
        assert!(e.what.contains("no block of this protocol"), "{e}");
        let mut long = encode(&[t]);
        long.push(0);
        assert!(decode_all(&long).unwrap_err().what.contains("the frame has"));
        // More than brec's 255 blocks.
        let mut blocks = batch_block(300);
        for _ in 0..299 {
            blocks.extend_from_slice(&encode(&[t])[PACKET_HEADER_LEN + BATCH_LEN..]);
        }
        assert!(decode_all(&assemble(&blocks, Some(&record(299, &s)))).unwrap_err().what.contains("255 blocks"));
    }

    #[test]
    fn unrepresentable_unknown_messages_are_refused() {
        for (kind, bytes) in [(b'z', &b""[..]), (b'z', b"ya"), (b'T', b"T")] {
            let mut out = Vec::new();
            let batch = [trade(1), Message::Unknown(UnknownMessage { kind, bytes })];
            let e = BrecCodec::new(Limits::default()).encode(&header(), &batch, &mut out).unwrap_err();
            assert!(matches!(e, EncodeError::Unrepresentable { index: 1, .. }), "{e}");
            assert!(out.is_empty());
        }
    }
}
