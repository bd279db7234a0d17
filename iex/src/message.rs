//! The message model: one Rust type for every IEX DEEP 1.0 / TOPS 1.6 message, independent of any
//! wire format. Every codec converts to and from [`Message`].
//!
//! Decoding ([`Message::parse`]) reads the documented layout with nom and ignores bytes that IEX
//! appended after it; the caller skips by the length prefix. Every field is a small `Copy` value,
//! so a decoded message needs no allocation; only [`Message::Unknown`] borrows its bytes from the
//! packet buffer.

use crate::price::{Price, Symbol};

/// A field of the IEX layout: fixed width, little-endian, every bit pattern a value. The codecs
/// whose layout is the IEX one (the model's own, SBE's blocks) read and write through it.
pub trait IexField: Copy {
    /// Bytes on the wire.
    const LEN: usize;
    /// Reads the field at the start of `bytes` and advances past it; a cursor too short (which
    /// the callers rule out by reading from arrays of the layout's length) reads as zeroes.
    fn read(bytes: &mut &[u8]) -> Self;
    /// Writes the field at the start of `out` and advances past it (nothing when too short).
    fn write(self, out: &mut &mut [u8]);
}

/// Takes the next `N` bytes of a read cursor.
#[inline(always)]
fn take_array<const N: usize>(bytes: &mut &[u8]) -> [u8; N] {
    match bytes.split_first_chunk::<N>() {
        Some((head, rest)) => {
            *bytes = rest;
            *head
        }
        None => [0; N],
    }
}

/// Puts `value` at the start of a write cursor.
#[inline(always)]
fn put_array<const N: usize>(value: [u8; N], out: &mut &mut [u8]) {
    if let Some((head, rest)) = std::mem::take(out).split_first_chunk_mut::<N>() {
        *head = value;
        *out = rest;
    }
}

macro_rules! iex_integer_fields {
    ($($int:ty),*) => {$(
        impl IexField for $int {
            const LEN: usize = size_of::<$int>();
            #[inline(always)]
            fn read(bytes: &mut &[u8]) -> Self {
                <$int>::from_le_bytes(take_array(bytes))
            }
            #[inline(always)]
            fn write(self, out: &mut &mut [u8]) {
                put_array(self.to_le_bytes(), out)
            }
        }
    )*};
}
iex_integer_fields!(u8, u32, i64);

impl IexField for [u8; 4] {
    const LEN: usize = 4;
    #[inline(always)]
    fn read(bytes: &mut &[u8]) -> Self {
        take_array(bytes)
    }
    #[inline(always)]
    fn write(self, out: &mut &mut [u8]) {
        put_array(self, out)
    }
}

impl IexField for Symbol {
    const LEN: usize = 8;
    #[inline(always)]
    fn read(bytes: &mut &[u8]) -> Self {
        Symbol(take_array(bytes))
    }
    #[inline(always)]
    fn write(self, out: &mut &mut [u8]) {
        put_array(self.0, out)
    }
}

impl IexField for Price {
    const LEN: usize = 8;
    #[inline(always)]
    fn read(bytes: &mut &[u8]) -> Self {
        Price(i64::read(bytes))
    }
    #[inline(always)]
    fn write(self, out: &mut &mut [u8]) {
        self.0.write(out)
    }
}

/// The one description of the known message types that every codec's per-type code is generated
/// from: hands `$callback` one entry per IEX type byte,
///
/// `WireName "text_name" = TYPE_BYTE => Variant(Struct { fixed: value } { field: type, ... })`
///
/// - `WireName`: the type's name where a format gives each type byte its own (SBE templates,
///   Protobuf cases, Cap'n Proto union members, brec blocks, error messages);
/// - `"text_name"`: its name in JSON, where both sides of a price level update are one type;
/// - `TYPE_BYTE`: its constant in [`kind`];
/// - `Variant(Struct { fixed: value })`: the [`Message`] variant and the struct it holds, with the
///   fields the type byte itself decides (a price level update's side), usable as a pattern and
///   in a struct expression;
/// - the fields, in the order of the IEX layout after the type byte, with their model types
///   (each an [`IexField`]).
///
/// A struct expression built from an entry names every field, so an entry that disagrees with its
/// struct does not compile. Its users: the model here, SBE, Protobuf, JSON, Cap'n Proto,
/// FlatBuffers and brec (each through its schema's names for the same fields), and the Python
/// package (its message classes, their Arrow columns and their type stub); a type added here
/// needs its schemas (`codec/schema/`) to carry it, and each codec then fails to compile until
/// they do.
///
/// The entries name `Symbol`, `Price` and `Side` unqualified: the callback's crate brings them
/// into scope (`use mdrelay_iex::message::Side; use mdrelay_iex::{Price, Symbol};`).
#[macro_export]
macro_rules! for_each_message_type {
    ($callback:ident) => {
        $callback! {
            SystemEvent "system_event" = SYSTEM_EVENT => SystemEvent(SystemEvent {} {
                event: u8, timestamp: i64
            }),
            SecurityDirectory "security_directory" = SECURITY_DIRECTORY => SecurityDirectory(SecurityDirectory {} {
                flags: u8, timestamp: i64, symbol: Symbol, round_lot_size: u32, adjusted_poc_price: Price, luld_tier: u8
            }),
            TradingStatus "trading_status" = TRADING_STATUS => TradingStatus(TradingStatus {} {
                status: u8, timestamp: i64, symbol: Symbol, reason: [u8; 4]
            }),
            RetailLiquidityIndicator "retail_liquidity_indicator" = RETAIL_LIQUIDITY_INDICATOR
                => RetailLiquidityIndicator(RetailLiquidityIndicator {} {
                indicator: u8, timestamp: i64, symbol: Symbol
            }),
            OperationalHaltStatus "operational_halt_status" = OPERATIONAL_HALT_STATUS
                => OperationalHaltStatus(OperationalHaltStatus {} {
                status: u8, timestamp: i64, symbol: Symbol
            }),
            ShortSalePriceTestStatus "short_sale_price_test_status" = SHORT_SALE_PRICE_TEST_STATUS
                => ShortSalePriceTestStatus(ShortSalePriceTestStatus {} {
                in_effect: u8, timestamp: i64, symbol: Symbol, detail: u8
            }),
            SecurityEvent "security_event" = SECURITY_EVENT => SecurityEvent(SecurityEvent {} {
                event: u8, timestamp: i64, symbol: Symbol
            }),
            PriceLevelBuy "price_level_update" = PRICE_LEVEL_BUY
                => PriceLevelUpdate(PriceLevelUpdate { side: Side::Buy } {
                event_flags: u8, timestamp: i64, symbol: Symbol, size: u32, price: Price
            }),
            PriceLevelSell "price_level_update" = PRICE_LEVEL_SELL
                => PriceLevelUpdate(PriceLevelUpdate { side: Side::Sell } {
                event_flags: u8, timestamp: i64, symbol: Symbol, size: u32, price: Price
            }),
            QuoteUpdate "quote_update" = QUOTE_UPDATE => QuoteUpdate(QuoteUpdate {} {
                flags: u8, timestamp: i64, symbol: Symbol, bid_size: u32, bid_price: Price, ask_price: Price,
                ask_size: u32
            }),
            TradeReport "trade_report" = TRADE_REPORT => TradeReport(Trade {} {
                sale_condition: u8, timestamp: i64, symbol: Symbol, size: u32, price: Price, trade_id: i64
            }),
            TradeBreak "trade_break" = TRADE_BREAK => TradeBreak(Trade {} {
                sale_condition: u8, timestamp: i64, symbol: Symbol, size: u32, price: Price, trade_id: i64
            }),
            OfficialPrice "official_price" = OFFICIAL_PRICE => OfficialPrice(OfficialPrice {} {
                price_type: u8, timestamp: i64, symbol: Symbol, price: Price
            }),
            AuctionInformation "auction_information" = AUCTION_INFORMATION => AuctionInformation(AuctionInformation {} {
                auction_type: u8, timestamp: i64, symbol: Symbol, paired_shares: u32, reference_price: Price,
                indicative_clearing_price: Price, imbalance_shares: u32, imbalance_side: u8, extension_number: u8,
                scheduled_auction_time: u32, auction_book_clearing_price: Price, collar_reference_price: Price,
                lower_auction_collar: Price, upper_auction_collar: Price
            }),
        }
    };
}

/// The type byte of each message, as on the wire.
pub mod kind {
    /// S: system event.
    pub const SYSTEM_EVENT: u8 = b'S';
    /// D: security directory.
    pub const SECURITY_DIRECTORY: u8 = b'D';
    /// H: trading status.
    pub const TRADING_STATUS: u8 = b'H';
    /// I: retail liquidity indicator (DEEP 1.08).
    pub const RETAIL_LIQUIDITY_INDICATOR: u8 = b'I';
    /// O: operational halt status.
    pub const OPERATIONAL_HALT_STATUS: u8 = b'O';
    /// P: short-sale price test status.
    pub const SHORT_SALE_PRICE_TEST_STATUS: u8 = b'P';
    /// E: security event (DEEP).
    pub const SECURITY_EVENT: u8 = b'E';
    /// 8: price level update on the buy side (DEEP).
    pub const PRICE_LEVEL_BUY: u8 = b'8';
    /// 5: price level update on the sell side (DEEP).
    pub const PRICE_LEVEL_SELL: u8 = b'5';
    /// Q: quote update (TOPS).
    pub const QUOTE_UPDATE: u8 = b'Q';
    /// T: trade report.
    pub const TRADE_REPORT: u8 = b'T';
    /// B: trade break.
    pub const TRADE_BREAK: u8 = b'B';
    /// X: official price.
    pub const OFFICIAL_PRICE: u8 = b'X';
    /// A: auction information.
    pub const AUCTION_INFORMATION: u8 = b'A';

    /// Every type byte the model decodes, in a fixed order.
    pub const ALL: [u8; 14] = [
        SYSTEM_EVENT,
        SECURITY_DIRECTORY,
        TRADING_STATUS,
        RETAIL_LIQUIDITY_INDICATOR,
        OPERATIONAL_HALT_STATUS,
        SHORT_SALE_PRICE_TEST_STATUS,
        SECURITY_EVENT,
        PRICE_LEVEL_BUY,
        PRICE_LEVEL_SELL,
        QUOTE_UPDATE,
        TRADE_REPORT,
        TRADE_BREAK,
        OFFICIAL_PRICE,
        AUCTION_INFORMATION,
    ];
}

/// S: a system-wide event (start of messages, regular hours, end of day...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemEvent {
    /// O, S, R, M, E or C.
    pub event: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
}

/// D: reference data for one security.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecurityDirectory {
    /// 0x80 test security, 0x40 when-issued, 0x20 ETP.
    pub flags: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
    /// Shares in a round lot.
    pub round_lot_size: u32,
    /// The adjusted previous official closing price.
    pub adjusted_poc_price: Price,
    /// Limit Up-Limit Down tier (0, 1 or 2).
    pub luld_tier: u8,
}

/// H: trading status of one security.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TradingStatus {
    /// H halted, O order acceptance period, P paused, T trading.
    pub status: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
    /// Four ASCII bytes giving the reason.
    pub reason: [u8; 4],
}

/// I: retail liquidity indicator (DEEP 1.08).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetailLiquidityIndicator {
    /// ' ' none, A buy interest, B sell interest, C both.
    pub indicator: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
}

/// O: operational halt status of one security.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperationalHaltStatus {
    /// O halted, N not halted.
    pub status: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
}

/// P: short-sale price test (Reg SHO) status of one security.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortSalePriceTestStatus {
    /// 1 when the test is in effect, 0 when not.
    pub in_effect: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
    /// ' ', A activated, C continued, D deactivated, N not available.
    pub detail: u8,
}

/// E: security event (DEEP): opening or closing process complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecurityEvent {
    /// O opening process complete, C closing process complete.
    pub event: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
}

/// Which side of the book a price level update is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// Type byte 8.
    Buy,
    /// Type byte 5.
    Sell,
}

/// 8 / 5: the aggregated size at one price level changed (DEEP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriceLevelUpdate {
    /// Buy (8) or sell (5).
    pub side: Side,
    /// 1 event processing complete, 0 order book in transition.
    pub event_flags: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
    /// Shares at the level; 0 means the level was removed.
    pub size: u32,
    /// The level's price.
    pub price: Price,
}

/// Q: top-of-book quote (TOPS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuoteUpdate {
    /// 0x80 symbol not active, 0x40 pre/post-market session.
    pub flags: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
    /// Shares at the best bid.
    pub bid_size: u32,
    /// Best bid price.
    pub bid_price: Price,
    /// Best ask price.
    pub ask_price: Price,
    /// Shares at the best ask.
    pub ask_size: u32,
}

/// T / B: a trade, or the break of an earlier one (same layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trade {
    /// 0x80 ISO, 0x40 extended hours, 0x20 odd lot, 0x10 trade-through exempt, 0x08 single-price cross.
    pub sale_condition: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
    /// Shares traded.
    pub size: u32,
    /// Trade price.
    pub price: Price,
    /// IEX's trade id (a break names the trade it breaks).
    pub trade_id: i64,
}

/// X: official opening or closing price.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OfficialPrice {
    /// Q opening, M closing.
    pub price_type: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
    /// The official price.
    pub price: Price,
}

/// A: auction information.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuctionInformation {
    /// O opening, C closing, I IPO, H halt, V volatility.
    pub auction_type: u8,
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// The security.
    pub symbol: Symbol,
    /// Shares paired at the reference price.
    pub paired_shares: u32,
    /// The reference price.
    pub reference_price: Price,
    /// The indicative clearing price.
    pub indicative_clearing_price: Price,
    /// Shares not paired.
    pub imbalance_shares: u32,
    /// B buy, S sell, N none.
    pub imbalance_side: u8,
    /// How many times the auction was extended.
    pub extension_number: u8,
    /// Scheduled auction time, seconds since the Unix epoch.
    pub scheduled_auction_time: u32,
    /// Clearing price of the auction book alone.
    pub auction_book_clearing_price: Price,
    /// Reference price for the collars.
    pub collar_reference_price: Price,
    /// Lower auction collar.
    pub lower_auction_collar: Price,
    /// Upper auction collar.
    pub upper_auction_collar: Price,
}

/// A message whose type byte the model does not know, kept as its bytes so it can be counted,
/// logged and relayed as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownMessage<'a> {
    /// The type byte.
    pub kind: u8,
    /// The whole message, type byte included.
    pub bytes: &'a [u8],
}

/// One decoded IEX message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// S.
    SystemEvent(SystemEvent),
    /// D.
    SecurityDirectory(SecurityDirectory),
    /// H.
    TradingStatus(TradingStatus),
    /// I.
    RetailLiquidityIndicator(RetailLiquidityIndicator),
    /// O.
    OperationalHaltStatus(OperationalHaltStatus),
    /// P.
    ShortSalePriceTestStatus(ShortSalePriceTestStatus),
    /// E.
    SecurityEvent(SecurityEvent),
    /// 8 or 5.
    PriceLevelUpdate(PriceLevelUpdate),
    /// Q.
    QuoteUpdate(QuoteUpdate),
    /// T.
    TradeReport(Trade),
    /// B.
    TradeBreak(Trade),
    /// X.
    OfficialPrice(OfficialPrice),
    /// A.
    AuctionInformation(AuctionInformation),
    /// Any other type byte.
    Unknown(UnknownMessage<'a>),
}

/// Why a message could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// A length prefix of 0.
    #[error("empty message (length 0)")]
    Empty,
    /// Shorter than the documented layout of its type.
    #[error("message type {:?} needs {needed} bytes, has {len}", *kind as char)]
    Truncated {
        /// The type byte.
        kind: u8,
        /// The layout's length.
        needed: usize,
        /// The bytes present.
        len: usize,
    },
}

/// The model's own code from the table: the layout lengths, decoding, the type byte and the IEX
/// encoding.
macro_rules! iex_layout {
    ($($wire:ident $name:literal = $kind:ident => $variant:ident($ty:ident { $($fixed:ident: $fixed_value:path),* } {
        $($field:ident: $field_type:tt),* $(,)?
    })),* $(,)?) => {
        /// The length of the documented layout of the message type `type_byte` (a [`kind`]), or
        /// `None` for a type the model does not know.
        pub const fn layout_len(type_byte: u8) -> Option<usize> {
            match type_byte {
                $(kind::$kind => Some(1 $(+ <$field_type as IexField>::LEN)*),)*
                _ => None,
            }
        }

        impl<'a> Message<'a> {
            /// Decodes one message (the bytes after its length prefix). Bytes past the documented
            /// layout are ignored: IEX may append fields to a message type.
            #[inline]
            pub fn parse(bytes: &'a [u8]) -> Result<Message<'a>, MessageError> {
                let Some(&type_byte) = bytes.first() else {
                    return Err(MessageError::Empty);
                };
                match type_byte {
                    $(kind::$kind => {
                        const LEN: usize = 1 $(+ <$field_type as IexField>::LEN)*;
                        let Some(layout) = bytes.first_chunk::<LEN>() else {
                            return Err(MessageError::Truncated { kind: type_byte, needed: LEN, len: bytes.len() });
                        };
                        let mut fields: &[u8] = layout.get(1..).unwrap_or_default();
                        Ok(Message::$variant($ty {
                            $($fixed: $fixed_value,)*
                            $($field: IexField::read(&mut fields),)*
                        }))
                    })*
                    _ => Ok(Message::Unknown(UnknownMessage { kind: type_byte, bytes })),
                }
            }

            /// The message's type byte.
            pub fn kind(&self) -> u8 {
                match self {
                    $(Message::$variant($ty { $($fixed: $fixed_value,)* .. }) => kind::$kind,)*
                    Message::Unknown(m) => m.kind,
                }
            }

            /// The message as one that borrows nothing; `None` for an unknown type, whose bytes it
            /// borrows.
            pub fn to_static(&self) -> Option<Message<'static>> {
                Some(match *self {
                    $(Message::$variant(m @ $ty { $($fixed: $fixed_value,)* .. }) => Message::$variant(m),)*
                    Message::Unknown(_) => return None,
                })
            }

            /// Appends the message in its documented IEX layout (without the length prefix).
            pub fn write_iex(&self, out: &mut Vec<u8>) {
                match self {
                    $(Message::$variant(m @ $ty { $($fixed: $fixed_value,)* .. }) => {
                        let mut layout = [0u8; 1 $(+ <$field_type as IexField>::LEN)*];
                        let mut cursor: &mut [u8] = &mut layout;
                        kind::$kind.write(&mut cursor);
                        $(m.$field.write(&mut cursor);)*
                        out.extend_from_slice(&layout);
                    })*
                    Message::Unknown(m) => out.extend_from_slice(m.bytes),
                }
            }
        }
    };
}
for_each_message_type!(iex_layout);

impl Message<'_> {
    /// The symbol the message is about; `None` for system events and unknown types.
    pub fn symbol(&self) -> Option<Symbol> {
        Some(match self {
            Message::SystemEvent(_) | Message::Unknown(_) => return None,
            Message::SecurityDirectory(m) => m.symbol,
            Message::TradingStatus(m) => m.symbol,
            Message::RetailLiquidityIndicator(m) => m.symbol,
            Message::OperationalHaltStatus(m) => m.symbol,
            Message::ShortSalePriceTestStatus(m) => m.symbol,
            Message::SecurityEvent(m) => m.symbol,
            Message::PriceLevelUpdate(m) => m.symbol,
            Message::QuoteUpdate(m) => m.symbol,
            Message::TradeReport(m) | Message::TradeBreak(m) => m.symbol,
            Message::OfficialPrice(m) => m.symbol,
            Message::AuctionInformation(m) => m.symbol,
        })
    }

    /// Length of the IEX encoding [`Message::write_iex`] produces.
    pub fn iex_len(&self) -> usize {
        match self {
            Message::Unknown(m) => m.bytes.len(),
            other => layout_len(other.kind()).unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_layout_round_trips_and_truncation_is_an_error() {
        for &k in &kind::ALL {
            let len = layout_len(k).unwrap();
            let mut bytes: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37)).collect();
            bytes[0] = k;
            let message = Message::parse(&bytes).unwrap();
            assert_eq!(message.kind(), k);
            assert_eq!(message.iex_len(), len);
            let mut out = Vec::new();
            message.write_iex(&mut out);
            assert_eq!(out, bytes, "type {}", k as char);
            // Appended fields are ignored.
            let mut longer = bytes.clone();
            longer.extend_from_slice(b"appended");
            assert_eq!(Message::parse(&longer).unwrap(), message);
            for cut in 1..len {
                assert_eq!(
                    Message::parse(&bytes[..cut]),
                    Err(MessageError::Truncated { kind: k, needed: len, len: cut })
                );
            }
        }
        assert_eq!(Message::parse(&[]), Err(MessageError::Empty));
        let unknown = Message::parse(b"zabc").unwrap();
        assert_eq!(unknown, Message::Unknown(UnknownMessage { kind: b'z', bytes: b"zabc" }));
    }
}
