//! The message model: one Rust type for every IEX DEEP 1.0 / TOPS 1.6 message, independent of any
//! wire format. Every codec converts to and from [`Message`].
//!
//! Decoding ([`Message::parse`]) reads the documented layout with nom and ignores bytes that IEX
//! appended after it; the caller skips by the length prefix. Every field is a small `Copy` value,
//! so a decoded message needs no allocation; only [`Message::Unknown`] borrows its bytes from the
//! packet buffer.

use crate::price::{Price, Symbol};
use nom::IResult;
use nom::Parser;
use nom::bytes::complete::take;
use nom::number::complete::{le_i64, le_u8, le_u32};

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

    /// The length of the documented layout of `kind`, or `None` for a type the model does not know.
    pub const fn layout_len(kind: u8) -> Option<usize> {
        Some(match kind {
            SYSTEM_EVENT => 10,
            SECURITY_DIRECTORY => 31,
            TRADING_STATUS => 22,
            RETAIL_LIQUIDITY_INDICATOR | OPERATIONAL_HALT_STATUS | SECURITY_EVENT => 18,
            SHORT_SALE_PRICE_TEST_STATUS => 19,
            PRICE_LEVEL_BUY | PRICE_LEVEL_SELL => 30,
            QUOTE_UPDATE => 42,
            TRADE_REPORT | TRADE_BREAK => 38,
            OFFICIAL_PRICE => 26,
            AUCTION_INFORMATION => 80,
            _ => return None,
        })
    }
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

type Res<'a, T> = IResult<&'a [u8], T>;

#[inline]
fn symbol(input: &[u8]) -> Res<'_, Symbol> {
    let (rest, bytes) = take(8usize)(input)?;
    let mut out = [0u8; 8];
    out.copy_from_slice(bytes);
    Ok((rest, Symbol(out)))
}

#[inline]
fn price(input: &[u8]) -> Res<'_, Price> {
    le_i64.map(Price).parse(input)
}

/// The prefix common to every message but S: type, flag byte, timestamp, symbol.
#[inline]
fn prefix(input: &[u8]) -> Res<'_, (u8, i64, Symbol)> {
    let (rest, (_kind, flag, timestamp, symbol)) = (le_u8, le_u8, le_i64, symbol).parse(input)?;
    Ok((rest, (flag, timestamp, symbol)))
}

#[inline]
fn trade(input: &[u8]) -> Res<'_, Trade> {
    let (rest, ((sale_condition, timestamp, symbol), size, price, trade_id)) =
        (prefix, le_u32, price, le_i64).parse(input)?;
    Ok((rest, Trade { sale_condition, timestamp, symbol, size, price, trade_id }))
}

#[inline]
fn decode(kind: u8, input: &[u8]) -> Res<'_, Message<'_>> {
    match kind {
        kind::SYSTEM_EVENT => {
            let (rest, (_, event, timestamp)) = (le_u8, le_u8, le_i64).parse(input)?;
            Ok((rest, Message::SystemEvent(SystemEvent { event, timestamp })))
        }
        kind::SECURITY_DIRECTORY => {
            let (rest, ((flags, timestamp, symbol), round_lot_size, adjusted_poc_price, luld_tier)) =
                (prefix, le_u32, price, le_u8).parse(input)?;
            let m = SecurityDirectory { flags, timestamp, symbol, round_lot_size, adjusted_poc_price, luld_tier };
            Ok((rest, Message::SecurityDirectory(m)))
        }
        kind::TRADING_STATUS => {
            let (rest, ((status, timestamp, symbol), reason)) = (prefix, take(4usize)).parse(input)?;
            let mut r = [0u8; 4];
            r.copy_from_slice(reason);
            Ok((rest, Message::TradingStatus(TradingStatus { status, timestamp, symbol, reason: r })))
        }
        kind::RETAIL_LIQUIDITY_INDICATOR => {
            let (rest, (indicator, timestamp, symbol)) = prefix(input)?;
            let m = RetailLiquidityIndicator { indicator, timestamp, symbol };
            Ok((rest, Message::RetailLiquidityIndicator(m)))
        }
        kind::OPERATIONAL_HALT_STATUS => {
            let (rest, (status, timestamp, symbol)) = prefix(input)?;
            let m = OperationalHaltStatus { status, timestamp, symbol };
            Ok((rest, Message::OperationalHaltStatus(m)))
        }
        kind::SHORT_SALE_PRICE_TEST_STATUS => {
            let (rest, ((in_effect, timestamp, symbol), detail)) = (prefix, le_u8).parse(input)?;
            let m = ShortSalePriceTestStatus { in_effect, timestamp, symbol, detail };
            Ok((rest, Message::ShortSalePriceTestStatus(m)))
        }
        kind::SECURITY_EVENT => {
            let (rest, (event, timestamp, symbol)) = prefix(input)?;
            Ok((rest, Message::SecurityEvent(SecurityEvent { event, timestamp, symbol })))
        }
        kind::PRICE_LEVEL_BUY | kind::PRICE_LEVEL_SELL => {
            let (rest, ((event_flags, timestamp, symbol), size, price)) = (prefix, le_u32, price).parse(input)?;
            let side = if kind == kind::PRICE_LEVEL_BUY { Side::Buy } else { Side::Sell };
            let m = PriceLevelUpdate { side, event_flags, timestamp, symbol, size, price };
            Ok((rest, Message::PriceLevelUpdate(m)))
        }
        kind::QUOTE_UPDATE => {
            let (rest, ((flags, timestamp, symbol), bid_size, bid_price, ask_price, ask_size)) =
                (prefix, le_u32, price, price, le_u32).parse(input)?;
            let m = QuoteUpdate { flags, timestamp, symbol, bid_size, bid_price, ask_price, ask_size };
            Ok((rest, Message::QuoteUpdate(m)))
        }
        kind::TRADE_REPORT => trade.map(Message::TradeReport).parse(input),
        kind::TRADE_BREAK => trade.map(Message::TradeBreak).parse(input),
        kind::OFFICIAL_PRICE => {
            let (rest, ((price_type, timestamp, symbol), price)) = (prefix, price).parse(input)?;
            Ok((rest, Message::OfficialPrice(OfficialPrice { price_type, timestamp, symbol, price })))
        }
        kind::AUCTION_INFORMATION => {
            let (rest, ((auction_type, timestamp, symbol), paired_shares, reference_price, indicative_clearing_price)) =
                (prefix, le_u32, price, price).parse(input)?;
            let (rest, (imbalance_shares, imbalance_side, extension_number, scheduled_auction_time)) =
                (le_u32, le_u8, le_u8, le_u32).parse(rest)?;
            let (
                rest,
                (auction_book_clearing_price, collar_reference_price, lower_auction_collar, upper_auction_collar),
            ) = (price, price, price, price).parse(rest)?;
            let m = AuctionInformation {
                auction_type,
                timestamp,
                symbol,
                paired_shares,
                reference_price,
                indicative_clearing_price,
                imbalance_shares,
                imbalance_side,
                extension_number,
                scheduled_auction_time,
                auction_book_clearing_price,
                collar_reference_price,
                lower_auction_collar,
                upper_auction_collar,
            };
            Ok((rest, Message::AuctionInformation(m)))
        }
        _ => Ok((&input[input.len()..], Message::Unknown(UnknownMessage { kind, bytes: input }))),
    }
}

impl<'a> Message<'a> {
    /// Decodes one message (the bytes after its length prefix). Bytes past the documented layout
    /// are ignored: IEX may append fields to a message type.
    #[inline]
    pub fn parse(bytes: &'a [u8]) -> Result<Message<'a>, MessageError> {
        let Some(&kind) = bytes.first() else {
            return Err(MessageError::Empty);
        };
        match decode(kind, bytes) {
            Ok((_, message)) => Ok(message),
            Err(_) => {
                Err(MessageError::Truncated { kind, needed: kind::layout_len(kind).unwrap_or(0), len: bytes.len() })
            }
        }
    }

    /// The message's type byte.
    pub fn kind(&self) -> u8 {
        match self {
            Message::SystemEvent(_) => kind::SYSTEM_EVENT,
            Message::SecurityDirectory(_) => kind::SECURITY_DIRECTORY,
            Message::TradingStatus(_) => kind::TRADING_STATUS,
            Message::RetailLiquidityIndicator(_) => kind::RETAIL_LIQUIDITY_INDICATOR,
            Message::OperationalHaltStatus(_) => kind::OPERATIONAL_HALT_STATUS,
            Message::ShortSalePriceTestStatus(_) => kind::SHORT_SALE_PRICE_TEST_STATUS,
            Message::SecurityEvent(_) => kind::SECURITY_EVENT,
            Message::PriceLevelUpdate(m) => match m.side {
                Side::Buy => kind::PRICE_LEVEL_BUY,
                Side::Sell => kind::PRICE_LEVEL_SELL,
            },
            Message::QuoteUpdate(_) => kind::QUOTE_UPDATE,
            Message::TradeReport(_) => kind::TRADE_REPORT,
            Message::TradeBreak(_) => kind::TRADE_BREAK,
            Message::OfficialPrice(_) => kind::OFFICIAL_PRICE,
            Message::AuctionInformation(_) => kind::AUCTION_INFORMATION,
            Message::Unknown(m) => m.kind,
        }
    }

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
            other => kind::layout_len(other.kind()).unwrap_or(0),
        }
    }

    /// Appends the message in its documented IEX layout (without the length prefix).
    pub fn write_iex(&self, out: &mut Vec<u8>) {
        fn head(out: &mut Vec<u8>, kind: u8, flag: u8, timestamp: i64, symbol: &Symbol) {
            out.push(kind);
            out.push(flag);
            out.extend_from_slice(&timestamp.to_le_bytes());
            out.extend_from_slice(&symbol.0);
        }
        let k = self.kind();
        match self {
            Message::SystemEvent(m) => {
                out.push(k);
                out.push(m.event);
                out.extend_from_slice(&m.timestamp.to_le_bytes());
            }
            Message::SecurityDirectory(m) => {
                head(out, k, m.flags, m.timestamp, &m.symbol);
                out.extend_from_slice(&m.round_lot_size.to_le_bytes());
                out.extend_from_slice(&m.adjusted_poc_price.0.to_le_bytes());
                out.push(m.luld_tier);
            }
            Message::TradingStatus(m) => {
                head(out, k, m.status, m.timestamp, &m.symbol);
                out.extend_from_slice(&m.reason);
            }
            Message::RetailLiquidityIndicator(m) => head(out, k, m.indicator, m.timestamp, &m.symbol),
            Message::OperationalHaltStatus(m) => head(out, k, m.status, m.timestamp, &m.symbol),
            Message::ShortSalePriceTestStatus(m) => {
                head(out, k, m.in_effect, m.timestamp, &m.symbol);
                out.push(m.detail);
            }
            Message::SecurityEvent(m) => head(out, k, m.event, m.timestamp, &m.symbol),
            Message::PriceLevelUpdate(m) => {
                head(out, k, m.event_flags, m.timestamp, &m.symbol);
                out.extend_from_slice(&m.size.to_le_bytes());
                out.extend_from_slice(&m.price.0.to_le_bytes());
            }
            Message::QuoteUpdate(m) => {
                head(out, k, m.flags, m.timestamp, &m.symbol);
                out.extend_from_slice(&m.bid_size.to_le_bytes());
                out.extend_from_slice(&m.bid_price.0.to_le_bytes());
                out.extend_from_slice(&m.ask_price.0.to_le_bytes());
                out.extend_from_slice(&m.ask_size.to_le_bytes());
            }
            Message::TradeReport(m) | Message::TradeBreak(m) => {
                head(out, k, m.sale_condition, m.timestamp, &m.symbol);
                out.extend_from_slice(&m.size.to_le_bytes());
                out.extend_from_slice(&m.price.0.to_le_bytes());
                out.extend_from_slice(&m.trade_id.to_le_bytes());
            }
            Message::OfficialPrice(m) => {
                head(out, k, m.price_type, m.timestamp, &m.symbol);
                out.extend_from_slice(&m.price.0.to_le_bytes());
            }
            Message::AuctionInformation(m) => {
                head(out, k, m.auction_type, m.timestamp, &m.symbol);
                out.extend_from_slice(&m.paired_shares.to_le_bytes());
                out.extend_from_slice(&m.reference_price.0.to_le_bytes());
                out.extend_from_slice(&m.indicative_clearing_price.0.to_le_bytes());
                out.extend_from_slice(&m.imbalance_shares.to_le_bytes());
                out.push(m.imbalance_side);
                out.push(m.extension_number);
                out.extend_from_slice(&m.scheduled_auction_time.to_le_bytes());
                out.extend_from_slice(&m.auction_book_clearing_price.0.to_le_bytes());
                out.extend_from_slice(&m.collar_reference_price.0.to_le_bytes());
                out.extend_from_slice(&m.lower_auction_collar.0.to_le_bytes());
                out.extend_from_slice(&m.upper_auction_collar.0.to_le_bytes());
            }
            Message::Unknown(m) => out.extend_from_slice(m.bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_layout_round_trips_and_truncation_is_an_error() {
        for &k in &kind::ALL {
            let len = kind::layout_len(k).unwrap();
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
