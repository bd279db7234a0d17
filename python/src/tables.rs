//! Arrow columns built message by message, one table per message type, finished into record
//! batches whose buffers Python takes without a copy. Prices are kept as IEX sends them
//! (integers in 1/10,000 dollars) and given the Arrow type the caller chose ([`Prices`]) when a
//! batch is finished.

use crate::messages::side_text;
use arrow_array::builder::{BooleanBuilder, StringBuilder};
use arrow_array::types::{Int64Type, UInt8Type, UInt32Type};
use arrow_array::{
    ArrayRef, ArrowPrimitiveType, Decimal128Array, Float64Array, Int64Array, PrimitiveArray, RecordBatch,
    TimestampNanosecondArray,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use mdrelay_client::{Message, Symbol};
use std::sync::Arc;

/// The Arrow type of price columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prices {
    /// `decimal128(18, 4)`: dollars, exactly (the same integers, scale 4).
    Decimal,
    /// `float64`: dollars, the nearest double.
    Float,
    /// `int64`: 1/10,000 dollars, as IEX sends them.
    Integer,
}

impl Prices {
    /// The choices, as `prices=` takes them.
    pub const NAMES: [&str; 3] = ["decimal", "float", "integer"];

    /// The choice a `prices=` name stands for.
    pub fn from_name(name: &str) -> Option<Prices> {
        match name {
            "decimal" => Some(Prices::Decimal),
            "float" => Some(Prices::Float),
            "integer" => Some(Prices::Integer),
            _ => None,
        }
    }

    /// Its `prices=` name.
    pub fn name(self) -> &'static str {
        match self {
            Prices::Decimal => "decimal",
            Prices::Float => "float",
            Prices::Integer => "integer",
        }
    }
}

/// Digits of the decimal price type: 18, so that every value fits 64 bits as well.
const DECIMAL_PRECISION: u8 = 18;
/// Decimal places of the decimal price type: IEX prices are in 1/10,000 dollars.
const DECIMAL_SCALE: i8 = 4;
/// The largest magnitude 18 digits hold.
const DECIMAL_MAX: i64 = 999_999_999_999_999_999;

/// A column being built.
trait Column: Default {
    /// Its Arrow type.
    fn data_type(prices: Prices) -> DataType;
    /// Whether it may hold nulls.
    fn nullable(_prices: Prices) -> bool {
        false
    }
    /// The array of what was pushed; the column is empty again.
    fn finish(&mut self, prices: Prices) -> ArrayRef;
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
    fn data_type(_: Prices) -> DataType {
        DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
    }
    fn finish(&mut self, _: Prices) -> ArrayRef {
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
    fn data_type(_: Prices) -> DataType {
        T::DATA_TYPE
    }
    fn finish(&mut self, _: Prices) -> ArrayRef {
        Arc::new(PrimitiveArray::<T>::from_iter_values(std::mem::take(&mut self.0)))
    }
}

/// Trade ids.
type I64Col = PrimitiveCol<Int64Type>;
/// Sizes.
type U32Col = PrimitiveCol<UInt32Type>;
/// Flag bytes.
type U8Col = PrimitiveCol<UInt8Type>;

/// Prices, pushed in 1/10,000 dollars and finished as the caller chose.
#[derive(Default)]
struct PriceCol(Vec<i64>);
impl PriceCol {
    fn push(&mut self, v: i64) {
        self.0.push(v);
    }
}
impl Column for PriceCol {
    fn data_type(prices: Prices) -> DataType {
        match prices {
            Prices::Decimal => DataType::Decimal128(DECIMAL_PRECISION, DECIMAL_SCALE),
            Prices::Float => DataType::Float64,
            Prices::Integer => DataType::Int64,
        }
    }
    fn nullable(prices: Prices) -> bool {
        // A price of more than 18 digits (none in IEX's feed, but the bytes are untrusted) is
        // null in a decimal column rather than a value outside its type.
        prices == Prices::Decimal
    }
    fn finish(&mut self, prices: Prices) -> ArrayRef {
        let values = std::mem::take(&mut self.0);
        match prices {
            Prices::Decimal => {
                let array: Decimal128Array = values
                    .into_iter()
                    .map(|v| (v.unsigned_abs() <= DECIMAL_MAX.unsigned_abs()).then_some(i128::from(v)))
                    .collect();
                Arc::new(array.with_data_type(Self::data_type(prices)))
            }
            // One correctly rounded division of an exact value: the double nearest the price
            // for every price below 2^53 / 10,000 dollars.
            Prices::Float => Arc::new(Float64Array::from_iter_values(values.into_iter().map(|v| v as f64 / 10_000.0))),
            Prices::Integer => Arc::new(Int64Array::from(values)),
        }
    }
}

#[derive(Default)]
struct BoolCol(BooleanBuilder);
impl BoolCol {
    fn push(&mut self, v: bool) {
        self.0.append_value(v);
    }
}
impl Column for BoolCol {
    fn data_type(_: Prices) -> DataType {
        DataType::Boolean
    }
    fn finish(&mut self, _: Prices) -> ArrayRef {
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
    fn data_type(_: Prices) -> DataType {
        DataType::Utf8
    }
    fn finish(&mut self, _: Prices) -> ArrayRef {
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

            /// The schema of its batches.
            fn schema(prices: Prices) -> Schema {
                Schema::new(vec![$(Field::new(stringify!($col), <$cty>::data_type(prices), <$cty>::nullable(prices))),*])
            }

            fn finish(&mut self, prices: Prices) -> Option<RecordBatch> {
                if self.rows == 0 {
                    return None;
                }
                self.rows = 0;
                let columns: Vec<ArrayRef> = vec![$(self.$col.finish(prices)),*];
                // Every column has one value per row, of the schema's type.
                RecordBatch::try_new(Arc::new(Self::schema(prices)), columns).ok()
            }
        }
    };
}

use mdrelay_client::message as m;

table!(Trades, "trade", m::Trade, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    size: U32Col = x.size,
    price: PriceCol = x.price.0,
    sale_condition: U8Col = x.sale_condition,
    trade_id: I64Col = x.trade_id,
});
table!(TradeBreaks, "trade_break", m::Trade, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    size: U32Col = x.size,
    price: PriceCol = x.price.0,
    sale_condition: U8Col = x.sale_condition,
    trade_id: I64Col = x.trade_id,
});
table!(PriceLevels, "price_level_update", m::PriceLevelUpdate, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    side: TextCol = Text::Str(side_text(x.side)),
    size: U32Col = x.size,
    price: PriceCol = x.price.0,
    event_flags: U8Col = x.event_flags,
});
table!(Quotes, "quote_update", m::QuoteUpdate, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    bid_size: U32Col = x.bid_size,
    bid_price: PriceCol = x.bid_price.0,
    ask_price: PriceCol = x.ask_price.0,
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
    adjusted_poc_price: PriceCol = x.adjusted_poc_price.0,
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
    price: PriceCol = x.price.0,
});
table!(Auctions, "auction_information", m::AuctionInformation, |x| {
    timestamp: TimeCol = x.timestamp,
    symbol: TextCol = sym(&x.symbol),
    auction_type: TextCol = Text::Code(x.auction_type),
    paired_shares: U32Col = x.paired_shares,
    reference_price: PriceCol = x.reference_price.0,
    indicative_clearing_price: PriceCol = x.indicative_clearing_price.0,
    imbalance_shares: U32Col = x.imbalance_shares,
    imbalance_side: TextCol = Text::Code(x.imbalance_side),
    extension_number: U8Col = x.extension_number,
    scheduled_auction_time: U32Col = x.scheduled_auction_time,
    auction_book_clearing_price: PriceCol = x.auction_book_clearing_price.0,
    collar_reference_price: PriceCol = x.collar_reference_price.0,
    lower_auction_collar: PriceCol = x.lower_auction_collar.0,
    upper_auction_collar: PriceCol = x.upper_auction_collar.0,
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

    /// The schema of a message type's batches (None for a name not in [`LABELS`]).
    pub fn schema(label: &str, prices: Prices) -> Option<Schema> {
        macro_rules! find {
            ($($ty:ident),*) => {$(
                if label == $ty::LABEL {
                    return Some($ty::schema(prices));
                }
            )*};
        }
        find!(
            Trades,
            TradeBreaks,
            PriceLevels,
            Quotes,
            SystemEvents,
            Directory,
            TradingStatuses,
            RetailLiquidity,
            OperationalHalts,
            ShortSaleTests,
            SecurityEvents,
            OfficialPrices,
            Auctions
        );
        None
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

    /// The record batch of every table with rows, named by message type, with prices of the
    /// type `prices` chooses; the tables are empty again.
    pub fn finish(&mut self, prices: Prices) -> Vec<(&'static str, RecordBatch)> {
        self.rows = 0;
        let mut out = Vec::new();
        macro_rules! take {
            ($($t:ident : $ty:ident),*) => {$(
                if let Some(batch) = self.$t.finish(prices) {
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
