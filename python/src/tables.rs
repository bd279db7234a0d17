//! Arrow columns built message by message, one table per message type, finished into record
//! batches whose buffers Python takes without a copy.

use crate::messages::side_text;
use arrow_array::builder::{BooleanBuilder, StringBuilder};
use arrow_array::types::{Int64Type, UInt8Type, UInt32Type};
use arrow_array::{ArrayRef, ArrowPrimitiveType, PrimitiveArray, RecordBatch, TimestampNanosecondArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use mdrelay_client::{Message, Symbol};
use std::sync::Arc;

/// A column being built.
trait Column: Default {
    /// Its Arrow type.
    fn data_type() -> DataType;
    /// The array of what was pushed; the column is empty again.
    fn finish(&mut self) -> ArrayRef;
}

/// Nanoseconds since the Unix epoch, as a UTC timestamp.
#[derive(Default)]
struct TimeCol(Vec<i64>);
impl TimeCol {
    fn push(&mut self, v: i64) {
        self.0.push(v);
    }
}
impl Column for TimeCol {
    fn data_type() -> DataType {
        DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
    }
    fn finish(&mut self) -> ArrayRef {
        Arc::new(TimestampNanosecondArray::from(std::mem::take(&mut self.0)).with_timezone("UTC"))
    }
}

/// A column of one Arrow primitive type.
struct PrimitiveCol<T: ArrowPrimitiveType>(Vec<T::Native>);
impl<T: ArrowPrimitiveType> Default for PrimitiveCol<T> {
    fn default() -> Self {
        PrimitiveCol(Vec::new())
    }
}
impl<T: ArrowPrimitiveType> PrimitiveCol<T> {
    fn push(&mut self, v: T::Native) {
        self.0.push(v);
    }
}
impl<T: ArrowPrimitiveType> Column for PrimitiveCol<T> {
    fn data_type() -> DataType {
        T::DATA_TYPE
    }
    fn finish(&mut self) -> ArrayRef {
        Arc::new(PrimitiveArray::<T>::from_iter_values(std::mem::take(&mut self.0)))
    }
}

/// Prices (1/10,000 dollars), trade ids.
type I64Col = PrimitiveCol<Int64Type>;
/// Sizes.
type U32Col = PrimitiveCol<UInt32Type>;
/// Flag bytes.
type U8Col = PrimitiveCol<UInt8Type>;

#[derive(Default)]
struct BoolCol(BooleanBuilder);
impl BoolCol {
    fn push(&mut self, v: bool) {
        self.0.append_value(v);
    }
}
impl Column for BoolCol {
    fn data_type() -> DataType {
        DataType::Boolean
    }
    fn finish(&mut self) -> ArrayRef {
        Arc::new(self.0.finish())
    }
}

/// Symbols, one-character codes, sides: text.
#[derive(Default)]
struct TextCol(StringBuilder);
impl TextCol {
    fn push(&mut self, v: Text<'_>) {
        match v {
            // Symbols are ASCII in practice; bytes from the network that are not UTF-8 are
            // replaced rather than trusted.
            Text::Bytes(b) => match std::str::from_utf8(b) {
                Ok(s) => self.0.append_value(s),
                Err(_) => self.0.append_value(String::from_utf8_lossy(b)),
            },
            Text::Code(byte) => {
                let mut buf = [0u8; 4];
                self.0.append_value(char::from(byte).encode_utf8(&mut buf));
            }
            Text::Str(s) => self.0.append_value(s),
        }
    }
}
impl Column for TextCol {
    fn data_type() -> DataType {
        DataType::Utf8
    }
    fn finish(&mut self) -> ArrayRef {
        Arc::new(self.0.finish())
    }
}

/// What a text column takes.
enum Text<'a> {
    Bytes(&'a [u8]),
    Code(u8),
    Str(&'static str),
}

fn sym(s: &Symbol) -> Text<'_> {
    Text::Bytes(s.trimmed())
}

/// Defines a table: its columns and how a message of its type fills a row.
macro_rules! table {
    ($name:ident, $label:literal, $mty:ty, |$m:ident| { $($col:ident : $cty:ty = $expr:expr),* $(,)? }) => {
        #[derive(Default)]
        struct $name {
            rows: usize,
            $($col: $cty),*
        }

        impl $name {
            const LABEL: &'static str = $label;

            fn push(&mut self, $m: &$mty) {
                $(self.$col.push($expr);)*
                self.rows += 1;
            }

            fn finish(&mut self) -> Option<RecordBatch> {
                if self.rows == 0 {
                    return None;
                }
                self.rows = 0;
                let schema = Schema::new(vec![$(Field::new(stringify!($col), <$cty>::data_type(), false)),*]);
                let columns: Vec<ArrayRef> = vec![$(self.$col.finish()),*];
                // Every column has one value per row, of the schema's type.
                RecordBatch::try_new(Arc::new(schema), columns).ok()
            }
        }
    };
}

use mdrelay_client::message as m;

table!(Trades, "trade", m::Trade, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    size: U32Col = x.size,
    price: I64Col = x.price.0,
    sale_condition: U8Col = x.sale_condition,
    trade_id: I64Col = x.trade_id,
});
table!(TradeBreaks, "trade_break", m::Trade, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    size: U32Col = x.size,
    price: I64Col = x.price.0,
    sale_condition: U8Col = x.sale_condition,
    trade_id: I64Col = x.trade_id,
});
table!(PriceLevels, "price_level_update", m::PriceLevelUpdate, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    side: TextCol = Text::Str(side_text(x.side)),
    size: U32Col = x.size,
    price: I64Col = x.price.0,
    event_flags: U8Col = x.event_flags,
});
table!(Quotes, "quote_update", m::QuoteUpdate, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    bid_size: U32Col = x.bid_size,
    bid_price: I64Col = x.bid_price.0,
    ask_price: I64Col = x.ask_price.0,
    ask_size: U32Col = x.ask_size,
    flags: U8Col = x.flags,
});
table!(SystemEvents, "system_event", m::SystemEvent, |x| {
    timestamp: TimeCol = x.timestamp,
    event: TextCol = Text::Code(x.event),
});
table!(Directory, "security_directory", m::SecurityDirectory, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    flags: U8Col = x.flags,
    round_lot_size: U32Col = x.round_lot_size,
    adjusted_poc_price: I64Col = x.adjusted_poc_price.0,
    luld_tier: U8Col = x.luld_tier,
});
table!(TradingStatuses, "trading_status", m::TradingStatus, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    status: TextCol = Text::Code(x.status),
    reason: TextCol = Text::Bytes(&x.reason),
});
table!(RetailLiquidity, "retail_liquidity_indicator", m::RetailLiquidityIndicator, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    indicator: TextCol = Text::Code(x.indicator),
});
table!(OperationalHalts, "operational_halt_status", m::OperationalHaltStatus, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    status: TextCol = Text::Code(x.status),
});
table!(ShortSaleTests, "short_sale_price_test_status", m::ShortSalePriceTestStatus, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    in_effect: BoolCol = x.in_effect != 0,
    detail: TextCol = Text::Code(x.detail),
});
table!(SecurityEvents, "security_event", m::SecurityEvent, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    event: TextCol = Text::Code(x.event),
});
table!(OfficialPrices, "official_price", m::OfficialPrice, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    price_type: TextCol = Text::Code(x.price_type),
    price: I64Col = x.price.0,
});
table!(Auctions, "auction_information", m::AuctionInformation, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    auction_type: TextCol = Text::Code(x.auction_type),
    paired_shares: U32Col = x.paired_shares,
    reference_price: I64Col = x.reference_price.0,
    indicative_clearing_price: I64Col = x.indicative_clearing_price.0,
    imbalance_shares: U32Col = x.imbalance_shares,
    imbalance_side: TextCol = Text::Code(x.imbalance_side),
    extension_number: U8Col = x.extension_number,
    scheduled_auction_time: U32Col = x.scheduled_auction_time,
    auction_book_clearing_price: I64Col = x.auction_book_clearing_price.0,
    collar_reference_price: I64Col = x.collar_reference_price.0,
    lower_auction_collar: I64Col = x.lower_auction_collar.0,
    upper_auction_collar: I64Col = x.upper_auction_collar.0,
});

/// One table per message type, filled until [`Tables::finish`].
#[derive(Default)]
pub struct Tables {
    rows: usize,
    /// Messages of types the model does not know: counted, not tabled.
    pub unknown: u64,
    trades: Trades,
    trade_breaks: TradeBreaks,
    price_levels: PriceLevels,
    quotes: Quotes,
    system_events: SystemEvents,
    directory: Directory,
    trading_statuses: TradingStatuses,
    retail_liquidity: RetailLiquidity,
    operational_halts: OperationalHalts,
    short_sale_tests: ShortSaleTests,
    security_events: SecurityEvents,
    official_prices: OfficialPrices,
    auctions: Auctions,
}

impl Tables {
    /// Rows waiting in every table.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Adds a message to its type's table.
    pub fn push(&mut self, message: &Message<'_>) {
        match message {
            Message::TradeReport(x) => self.trades.push(x),
            Message::TradeBreak(x) => self.trade_breaks.push(x),
            Message::PriceLevelUpdate(x) => self.price_levels.push(x),
            Message::QuoteUpdate(x) => self.quotes.push(x),
            Message::SystemEvent(x) => self.system_events.push(x),
            Message::SecurityDirectory(x) => self.directory.push(x),
            Message::TradingStatus(x) => self.trading_statuses.push(x),
            Message::RetailLiquidityIndicator(x) => self.retail_liquidity.push(x),
            Message::OperationalHaltStatus(x) => self.operational_halts.push(x),
            Message::ShortSalePriceTestStatus(x) => self.short_sale_tests.push(x),
            Message::SecurityEvent(x) => self.security_events.push(x),
            Message::OfficialPrice(x) => self.official_prices.push(x),
            Message::AuctionInformation(x) => self.auctions.push(x),
            Message::Unknown(_) => {
                self.unknown += 1;
                return;
            }
        }
        self.rows += 1;
    }

    /// The record batch of every table with rows, named by message type; the tables are empty
    /// again.
    pub fn finish(&mut self) -> Vec<(&'static str, RecordBatch)> {
        self.rows = 0;
        let mut out = Vec::new();
        macro_rules! take {
            ($($t:ident : $ty:ident),*) => {$(
                if let Some(batch) = self.$t.finish() {
                    out.push(($ty::LABEL, batch));
                }
            )*};
        }
        take!(
            trades: Trades,
            trade_breaks: TradeBreaks,
            price_levels: PriceLevels,
            quotes: Quotes,
            system_events: SystemEvents,
            directory: Directory,
            trading_statuses: TradingStatuses,
            retail_liquidity: RetailLiquidity,
            operational_halts: OperationalHalts,
            short_sale_tests: ShortSaleTests,
            security_events: SecurityEvents,
            official_prices: OfficialPrices,
            auctions: Auctions
        );
        out
    }
}

/// The message type names `Tables::finish` gives, in its order.
pub const LABELS: [&str; 13] = [
    Trades::LABEL,
    TradeBreaks::LABEL,
    PriceLevels::LABEL,
    Quotes::LABEL,
    SystemEvents::LABEL,
    Directory::LABEL,
    TradingStatuses::LABEL,
    RetailLiquidity::LABEL,
    OperationalHalts::LABEL,
    ShortSaleTests::LABEL,
    SecurityEvents::LABEL,
    OfficialPrices::LABEL,
    Auctions::LABEL,
];
