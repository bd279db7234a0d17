//! Proptest strategies for messages and batches, shared by the codec tests (`formats.rs`,
//! `json_codec.rs`), which include this file as a module.

use mdrelay_proto::codec::BatchHeader;
use mdrelay_proto::message::*;
use mdrelay_proto::{Price, Symbol};
use proptest::prelude::*;

/// A message to generate: a known one, or an unknown type with its bytes.
#[derive(Clone, Debug)]
pub enum Spec {
    /// A message of a known type.
    Known(Message<'static>),
    /// An unknown type: its type byte, then its bytes.
    Unknown(Vec<u8>),
}

pub fn symbol() -> impl Strategy<Value = Symbol> {
    "[A-Z][A-Z.+-]{0,7}".prop_map(|s| Symbol::new(&s).unwrap())
}

pub fn price() -> impl Strategy<Value = Price> {
    any::<i64>().prop_map(Price)
}

pub fn known() -> impl Strategy<Value = Message<'static>> {
    let ts = any::<i64>();
    prop_oneof![
        (any::<u8>(), ts).prop_map(|(event, timestamp)| Message::SystemEvent(SystemEvent { event, timestamp })),
        (any::<u8>(), ts, symbol(), any::<u32>(), price(), any::<u8>()).prop_map(
            |(flags, timestamp, symbol, round_lot_size, adjusted_poc_price, luld_tier)| {
                Message::SecurityDirectory(SecurityDirectory {
                    flags,
                    timestamp,
                    symbol,
                    round_lot_size,
                    adjusted_poc_price,
                    luld_tier,
                })
            }
        ),
        (any::<u8>(), ts, symbol(), any::<[u8; 4]>()).prop_map(|(status, timestamp, symbol, reason)| {
            Message::TradingStatus(TradingStatus { status, timestamp, symbol, reason })
        }),
        (any::<u8>(), ts, symbol()).prop_map(|(indicator, timestamp, symbol)| {
            Message::RetailLiquidityIndicator(RetailLiquidityIndicator { indicator, timestamp, symbol })
        }),
        (any::<u8>(), ts, symbol()).prop_map(|(status, timestamp, symbol)| Message::OperationalHaltStatus(
            OperationalHaltStatus { status, timestamp, symbol }
        )),
        (any::<u8>(), ts, symbol(), any::<u8>()).prop_map(|(in_effect, timestamp, symbol, detail)| {
            Message::ShortSalePriceTestStatus(ShortSalePriceTestStatus { in_effect, timestamp, symbol, detail })
        }),
        (any::<u8>(), ts, symbol()).prop_map(|(event, timestamp, symbol)| Message::SecurityEvent(SecurityEvent {
            event,
            timestamp,
            symbol
        })),
        (any::<bool>(), any::<u8>(), ts, symbol(), any::<u32>(), price()).prop_map(
            |(buy, event_flags, timestamp, symbol, size, price)| {
                let side = if buy { Side::Buy } else { Side::Sell };
                Message::PriceLevelUpdate(PriceLevelUpdate { side, event_flags, timestamp, symbol, size, price })
            }
        ),
        (any::<u8>(), ts, symbol(), any::<u32>(), price(), price(), any::<u32>()).prop_map(
            |(flags, timestamp, symbol, bid_size, bid_price, ask_price, ask_size)| {
                Message::QuoteUpdate(QuoteUpdate { flags, timestamp, symbol, bid_size, bid_price, ask_price, ask_size })
            }
        ),
        (any::<bool>(), any::<u8>(), ts, symbol(), any::<u32>(), price(), any::<i64>()).prop_map(
            |(brk, sale_condition, timestamp, symbol, size, price, trade_id)| {
                let t = Trade { sale_condition, timestamp, symbol, size, price, trade_id };
                if brk { Message::TradeBreak(t) } else { Message::TradeReport(t) }
            }
        ),
        (any::<u8>(), ts, symbol(), price()).prop_map(|(price_type, timestamp, symbol, price)| Message::OfficialPrice(
            OfficialPrice { price_type, timestamp, symbol, price }
        )),
        (
            (any::<u8>(), ts, symbol(), any::<u32>(), price(), price()),
            (any::<u32>(), any::<u8>(), any::<u8>(), any::<u32>()),
            (price(), price(), price(), price())
        )
            .prop_map(
                |(
                    (auction_type, timestamp, symbol, paired_shares, reference_price, indicative_clearing_price),
                    (imbalance_shares, imbalance_side, extension_number, scheduled_auction_time),
                    (auction_book_clearing_price, collar_reference_price, lower_auction_collar, upper_auction_collar),
                )| {
                    Message::AuctionInformation(AuctionInformation {
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
                    })
                }
            ),
    ]
}

pub fn spec() -> impl Strategy<Value = Spec> {
    let unknown = (
        any::<u8>().prop_filter("not a known type", |k| kind::layout_len(*k).is_none()),
        proptest::collection::vec(any::<u8>(), 0..120),
    )
        .prop_map(|(k, mut rest)| {
            rest.insert(0, k);
            Spec::Unknown(rest)
        });
    prop_oneof![9 => known().prop_map(Spec::Known), 1 => unknown]
}

pub fn header() -> impl Strategy<Value = BatchHeader> {
    (any::<u16>(), any::<u32>(), any::<u32>(), any::<i64>(), any::<i64>(), any::<i64>()).prop_map(
        |(protocol_id, channel_id, session_id, first_sequence, send_time, publish_time)| BatchHeader {
            protocol_id,
            channel_id,
            session_id,
            first_sequence,
            message_count: 0,
            send_time,
            publish_time,
        },
    )
}

pub fn messages(specs: &[Spec]) -> Vec<Message<'_>> {
    specs
        .iter()
        .map(|s| match s {
            Spec::Known(m) => *m,
            Spec::Unknown(bytes) => Message::Unknown(UnknownMessage { kind: bytes[0], bytes }),
        })
        .collect()
}
