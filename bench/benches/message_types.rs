//! Criterion benchmarks per message type and format: encode one batch of 16 messages of one type,
//! and frame + decode + aggregate it.

use criterion::{Criterion, criterion_group, criterion_main};
use mdrelay_codec::FormatCodec;
use mdrelay_codec::{BatchHeader, Codec, Format, Limits};
use mdrelay_iex::message::*;
use mdrelay_iex::{Aggregator, Price, Symbol};
use std::hint::black_box;
use std::time::Duration;

/// One message of each type, with the field values of a plausible trading day.
fn samples() -> Vec<(&'static str, Message<'static>)> {
    let symbol = Symbol::new("ZIEXT").unwrap();
    let timestamp = 1_717_421_400_000_000_000;
    // A trade and its break share the layout, so one trade serves both samples.
    let trade = Trade { sale_condition: 0, timestamp, symbol, size: 100, price: Price(99_0500), trade_id: 42 };
    vec![
        ("system_event", Message::SystemEvent(SystemEvent { event: b'R', timestamp })),
        (
            "security_directory",
            Message::SecurityDirectory(SecurityDirectory {
                flags: 0x80,
                timestamp,
                symbol,
                round_lot_size: 100,
                adjusted_poc_price: Price(99_0500),
                luld_tier: 1,
            }),
        ),
        ("trading_status", Message::TradingStatus(TradingStatus { status: b'T', timestamp, symbol, reason: *b"    " })),
        (
            "retail_liquidity",
            Message::RetailLiquidityIndicator(RetailLiquidityIndicator { indicator: b'A', timestamp, symbol }),
        ),
        ("operational_halt", Message::OperationalHaltStatus(OperationalHaltStatus { status: b'N', timestamp, symbol })),
        (
            "short_sale_test",
            Message::ShortSalePriceTestStatus(ShortSalePriceTestStatus {
                in_effect: 1,
                timestamp,
                symbol,
                detail: b'A',
            }),
        ),
        ("security_event", Message::SecurityEvent(SecurityEvent { event: b'O', timestamp, symbol })),
        (
            "price_level_buy",
            Message::PriceLevelUpdate(PriceLevelUpdate {
                side: Side::Buy,
                event_flags: 1,
                timestamp,
                symbol,
                size: 300,
                price: Price(99_0400),
            }),
        ),
        (
            "price_level_sell",
            Message::PriceLevelUpdate(PriceLevelUpdate {
                side: Side::Sell,
                event_flags: 1,
                timestamp,
                symbol,
                size: 200,
                price: Price(99_0600),
            }),
        ),
        (
            "quote_update",
            Message::QuoteUpdate(QuoteUpdate {
                flags: 0,
                timestamp,
                symbol,
                bid_size: 300,
                bid_price: Price(99_0400),
                ask_price: Price(99_0600),
                ask_size: 200,
            }),
        ),
        ("trade_report", Message::TradeReport(trade)),
        ("trade_break", Message::TradeBreak(trade)),
        (
            "official_price",
            Message::OfficialPrice(OfficialPrice { price_type: b'Q', timestamp, symbol, price: Price(99_0500) }),
        ),
        (
            "auction_information",
            Message::AuctionInformation(AuctionInformation {
                auction_type: b'C',
                timestamp,
                symbol,
                paired_shares: 10_000,
                reference_price: Price(99_0500),
                indicative_clearing_price: Price(99_0500),
                imbalance_shares: 500,
                imbalance_side: b'B',
                extension_number: 0,
                scheduled_auction_time: 1_717_444_800,
                auction_book_clearing_price: Price(99_0500),
                collar_reference_price: Price(99_0500),
                lower_auction_collar: Price(89_1500),
                upper_auction_collar: Price(108_9500),
            }),
        ),
    ]
}

fn codecs(c: &mut Criterion) {
    let header = BatchHeader {
        protocol_id: 0x8004,
        session_id: 1,
        first_sequence: 1,
        send_time: 1,
        publish_time: 2,
        ..Default::default()
    };
    for (name, message) in samples() {
        let batch = vec![message; 16];
        let mut group = c.benchmark_group(name);
        for format in Format::ALL {
            let mut codec = Codec::new(format, Limits::default());
            let mut out = Vec::with_capacity(1 << 16);
            group.bench_function(format!("{format}/encode"), |b| {
                b.iter(|| {
                    out.clear();
                    codec.encode(black_box(&header), black_box(&batch), &mut out).unwrap();
                })
            });
            out.clear();
            codec.encode(&header, &batch, &mut out).unwrap();
            let mut aggregator = Aggregator::new();
            group.bench_function(format!("{format}/decode"), |b| {
                b.iter(|| {
                    let len = codec.frame_len(black_box(&out)).unwrap().unwrap();
                    codec.decode(&out[..len], |m| aggregator.apply(m)).unwrap();
                })
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_millis(600)).sample_size(20);
    targets = codecs
}
criterion_main!(benches);
