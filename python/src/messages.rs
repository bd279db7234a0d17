//! The typed Python classes: one per IEX message type and one per stream event, each frozen,
//! with `__repr__`, `__eq__` and a keyword-only constructor.

use mdrelay_client::Message;
use mdrelay_client::message::Side;
use pyo3::prelude::*;

/// A field as Python's `repr` writes it.
pub trait ReprField {
    /// The field's repr.
    fn repr(&self) -> String;
}

macro_rules! repr_display {
    ($($t:ty),*) => {$(
        impl ReprField for $t {
            fn repr(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
repr_display!(i64, u64, u32, u8);

impl ReprField for bool {
    fn repr(&self) -> String {
        if *self { "True" } else { "False" }.to_string()
    }
}

impl ReprField for String {
    fn repr(&self) -> String {
        let mut out = String::with_capacity(self.len() + 2);
        out.push('\'');
        for c in self.chars() {
            match c {
                '\'' => out.push_str("\\'"),
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('\'');
        out
    }
}

impl<T: ReprField> ReprField for Option<T> {
    fn repr(&self) -> String {
        self.as_ref().map_or_else(|| "None".to_string(), ReprField::repr)
    }
}

/// Defines a frozen Python class with the fields given, readable as attributes, compared by
/// value, and written by `repr` as its constructor call.
macro_rules! py_record {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[pyclass(module = "mdrelay", frozen, eq, get_all, skip_from_py_object)]
        #[derive(Debug, PartialEq)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: $ty),*
        }

        #[pymethods]
        impl $name {
            #[new]
            #[pyo3(signature = (*, $($field),*))]
            // One keyword argument per field, as the class's attributes are.
            #[allow(clippy::too_many_arguments)]
            fn new($($field: $ty),*) -> Self {
                Self { $($field),* }
            }

            fn __repr__(&self) -> String {
                let fields: Vec<String> =
                    vec![$(format!(concat!(stringify!($field), "={}"), ReprField::repr(&self.$field))),*];
                format!(concat!(stringify!($name), "({})"), fields.join(", "))
            }
        }
    };
}

py_record!(
    /// S: a system event (start and end of messages, system hours, regular hours).
    SystemEvent {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// O, S, R, M, E or C.
        event: String,
    }
);
py_record!(
    /// D: a security directory entry.
    SecurityDirectory {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// 0x80 test security, 0x40 when-issued, 0x20 ETP.
        flags: u8,
        /// Shares in a round lot.
        round_lot_size: u32,
        /// Adjusted previous official close, in 1/10,000 dollars.
        adjusted_poc_price: i64,
        /// LULD tier.
        luld_tier: u8,
    }
);
py_record!(
    /// H: a trading status change.
    TradingStatus {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// H halted, O order acceptance period, P paused, T trading.
        status: String,
        /// Four-character reason code.
        reason: String,
    }
);
py_record!(
    /// I: a retail liquidity indicator.
    RetailLiquidityIndicator {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// ' ' none, A buy interest, B sell interest, C both.
        indicator: String,
    }
);
py_record!(
    /// O: an operational halt status.
    OperationalHaltStatus {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// O halted, N not halted.
        status: String,
    }
);
py_record!(
    /// P: a short-sale price test status.
    ShortSalePriceTestStatus {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// The test is in effect.
        in_effect: bool,
        /// ' ', A activated, C continued, D deactivated, N not available.
        detail: String,
    }
);
py_record!(
    /// E: a security event (opening or closing process complete).
    SecurityEvent {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// O opening process complete, C closing process complete.
        event: String,
    }
);
py_record!(
    /// 8 / 5: a price level update on the buy or sell side of the book.
    PriceLevelUpdate {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// "buy" (type 8) or "sell" (type 5).
        side: String,
        /// 1: event processing complete; 0: the book is in transition.
        event_flags: u8,
        /// Shares at the level (0: the level was removed).
        size: u32,
        /// In 1/10,000 dollars.
        price: i64,
    }
);
py_record!(
    /// Q: a top-of-book quote update.
    QuoteUpdate {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// 0x80 symbol not active, 0x40 pre/post-market session.
        flags: u8,
        /// Shares bid.
        bid_size: u32,
        /// In 1/10,000 dollars.
        bid_price: i64,
        /// In 1/10,000 dollars.
        ask_price: i64,
        /// Shares offered.
        ask_size: u32,
    }
);
py_record!(
    /// T: a trade report.
    Trade {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// Sale condition flags: 0x80 ISO, 0x40 extended hours, 0x20 odd lot, 0x10 trade-through
        /// exempt, 0x08 single-price cross.
        sale_condition: u8,
        /// Shares traded.
        size: u32,
        /// In 1/10,000 dollars.
        price: i64,
        /// IEX's trade id.
        trade_id: i64,
    }
);
py_record!(
    /// B: a trade break (a trade reported earlier is void).
    TradeBreak {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// Sale condition flags of the trade broken.
        sale_condition: u8,
        /// Shares of the trade broken.
        size: u32,
        /// In 1/10,000 dollars.
        price: i64,
        /// The id of the trade broken.
        trade_id: i64,
    }
);
py_record!(
    /// X: an official opening or closing price.
    OfficialPrice {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// Q opening, M closing.
        price_type: String,
        /// In 1/10,000 dollars.
        price: i64,
    }
);
py_record!(
    /// A: auction information.
    AuctionInformation {
        /// ns since the Unix epoch.
        timestamp: i64,
        /// The ticker.
        symbol: String,
        /// O opening, C closing, I IPO, H halt, V volatility.
        auction_type: String,
        /// Shares paired.
        paired_shares: u32,
        /// In 1/10,000 dollars.
        reference_price: i64,
        /// In 1/10,000 dollars.
        indicative_clearing_price: i64,
        /// Shares of imbalance.
        imbalance_shares: u32,
        /// B, S or N.
        imbalance_side: String,
        /// Extension number.
        extension_number: u8,
        /// Seconds since the Unix epoch.
        scheduled_auction_time: u32,
        /// In 1/10,000 dollars.
        auction_book_clearing_price: i64,
        /// In 1/10,000 dollars.
        collar_reference_price: i64,
        /// In 1/10,000 dollars.
        lower_auction_collar: i64,
        /// In 1/10,000 dollars.
        upper_auction_collar: i64,
    }
);
py_record!(
    /// A message of a type this package does not model: its type byte and length.
    UnknownMessage {
        /// The type byte.
        kind: u8,
        /// Its length in bytes.
        length: u64,
    }
);

py_record!(
    /// Frames found missing: `count` frames from `first` have not arrived (yet).
    Gap {
        /// The first frame missing.
        first: u64,
        /// How many.
        count: u64,
    }
);
py_record!(
    /// Missing frames were given up: they will not come.
    GivenUp {
        /// How many frames.
        frames: u64,
    }
);
py_record!(
    /// The messages that follow are a frame retransmitted by the recovery service, filling a gap.
    Recovered {
        /// The frame's sequence number.
        sequence: u64,
        /// Its messages (they follow this event).
        messages: u64,
    }
);
py_record!(
    /// The stream's wire format changed (`from_format` is None for the first one).
    FormatChanged {
        /// The format before.
        from_format: Option<String>,
        /// The format from now on.
        to_format: String,
    }
);
py_record!(
    /// The publisher restarted: a new session, sequence numbers start over.
    Restarted {
        /// The session before.
        old_session: u64,
        /// The new one.
        new_session: u64,
    }
);
py_record!(
    /// TCP: a connection to the publisher was made.
    Connected {
        /// The publisher's address.
        peer: String,
        /// A connection was made before this one.
        reconnect: bool,
    }
);
py_record!(
    /// Something else that happened to the stream (a reconnection, a retransmission service's
    /// answer, a datagram refused); `kind` names it, `detail` says the rest.
    Notice {
        /// What kind of event.
        kind: String,
        /// Its details as text.
        detail: String,
    }
);
py_record!(
    /// The end of the stream: nothing follows.
    End {
        /// Every frame and message the publisher sent arrived.
        complete: bool,
        /// The number the next frame would have had.
        next_sequence: u64,
        /// Frames the publisher says it sent (None when its totals could not be read).
        publisher_frames: Option<u64>,
        /// Messages the publisher says it sent.
        publisher_messages: Option<u64>,
    }
);

/// A symbol's text: ASCII in practice; bytes from the network that are not UTF-8 are replaced,
/// never trusted.
pub fn symbol_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A one-byte code as a one-character string (a byte above 0x7f as the Latin-1 character, so no
/// byte is lost).
pub fn code(byte: u8) -> String {
    char::from(byte).to_string()
}

/// The Python object of one message.
pub fn message_object(py: Python<'_>, m: &Message<'_>) -> PyResult<Py<PyAny>> {
    let sym = |s: &mdrelay_client::Symbol| symbol_text(s.trimmed());
    Ok(match *m {
        Message::SystemEvent(x) => {
            SystemEvent { timestamp: x.timestamp, event: code(x.event) }.into_pyobject(py)?.into_any().unbind()
        }
        Message::SecurityDirectory(x) => SecurityDirectory {
            timestamp: x.timestamp,
            symbol: sym(&x.symbol),
            flags: x.flags,
            round_lot_size: x.round_lot_size,
            adjusted_poc_price: x.adjusted_poc_price.0,
            luld_tier: x.luld_tier,
        }
        .into_pyobject(py)?
        .into_any()
        .unbind(),
        Message::TradingStatus(x) => TradingStatus {
            timestamp: x.timestamp,
            symbol: sym(&x.symbol),
            status: code(x.status),
            reason: symbol_text(&x.reason),
        }
        .into_pyobject(py)?
        .into_any()
        .unbind(),
        Message::RetailLiquidityIndicator(x) => {
            RetailLiquidityIndicator { timestamp: x.timestamp, symbol: sym(&x.symbol), indicator: code(x.indicator) }
                .into_pyobject(py)?
                .into_any()
                .unbind()
        }
        Message::OperationalHaltStatus(x) => {
            OperationalHaltStatus { timestamp: x.timestamp, symbol: sym(&x.symbol), status: code(x.status) }
                .into_pyobject(py)?
                .into_any()
                .unbind()
        }
        Message::ShortSalePriceTestStatus(x) => ShortSalePriceTestStatus {
            timestamp: x.timestamp,
            symbol: sym(&x.symbol),
            in_effect: x.in_effect != 0,
            detail: code(x.detail),
        }
        .into_pyobject(py)?
        .into_any()
        .unbind(),
        Message::SecurityEvent(x) => {
            SecurityEvent { timestamp: x.timestamp, symbol: sym(&x.symbol), event: code(x.event) }
                .into_pyobject(py)?
                .into_any()
                .unbind()
        }
        Message::PriceLevelUpdate(x) => PriceLevelUpdate {
            timestamp: x.timestamp,
            symbol: sym(&x.symbol),
            side: side_text(x.side).to_string(),
            event_flags: x.event_flags,
            size: x.size,
            price: x.price.0,
        }
        .into_pyobject(py)?
        .into_any()
        .unbind(),
        Message::QuoteUpdate(x) => QuoteUpdate {
            timestamp: x.timestamp,
            symbol: sym(&x.symbol),
            flags: x.flags,
            bid_size: x.bid_size,
            bid_price: x.bid_price.0,
            ask_price: x.ask_price.0,
            ask_size: x.ask_size,
        }
        .into_pyobject(py)?
        .into_any()
        .unbind(),
        Message::TradeReport(x) => Trade {
            timestamp: x.timestamp,
            symbol: sym(&x.symbol),
            sale_condition: x.sale_condition,
            size: x.size,
            price: x.price.0,
            trade_id: x.trade_id,
        }
        .into_pyobject(py)?
        .into_any()
        .unbind(),
        Message::TradeBreak(x) => TradeBreak {
            timestamp: x.timestamp,
            symbol: sym(&x.symbol),
            sale_condition: x.sale_condition,
            size: x.size,
            price: x.price.0,
            trade_id: x.trade_id,
        }
        .into_pyobject(py)?
        .into_any()
        .unbind(),
        Message::OfficialPrice(x) => OfficialPrice {
            timestamp: x.timestamp,
            symbol: sym(&x.symbol),
            price_type: code(x.price_type),
            price: x.price.0,
        }
        .into_pyobject(py)?
        .into_any()
        .unbind(),
        Message::AuctionInformation(x) => AuctionInformation {
            timestamp: x.timestamp,
            symbol: sym(&x.symbol),
            auction_type: code(x.auction_type),
            paired_shares: x.paired_shares,
            reference_price: x.reference_price.0,
            indicative_clearing_price: x.indicative_clearing_price.0,
            imbalance_shares: x.imbalance_shares,
            imbalance_side: code(x.imbalance_side),
            extension_number: x.extension_number,
            scheduled_auction_time: x.scheduled_auction_time,
            auction_book_clearing_price: x.auction_book_clearing_price.0,
            collar_reference_price: x.collar_reference_price.0,
            lower_auction_collar: x.lower_auction_collar.0,
            upper_auction_collar: x.upper_auction_collar.0,
        }
        .into_pyobject(py)?
        .into_any()
        .unbind(),
        Message::Unknown(u) => {
            UnknownMessage { kind: u.kind, length: u.bytes.len() as u64 }.into_pyobject(py)?.into_any().unbind()
        }
    })
}

/// "buy" or "sell".
pub fn side_text(side: Side) -> &'static str {
    match side {
        Side::Buy => "buy",
        Side::Sell => "sell",
    }
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SystemEvent>()?;
    m.add_class::<SecurityDirectory>()?;
    m.add_class::<TradingStatus>()?;
    m.add_class::<RetailLiquidityIndicator>()?;
    m.add_class::<OperationalHaltStatus>()?;
    m.add_class::<ShortSalePriceTestStatus>()?;
    m.add_class::<SecurityEvent>()?;
    m.add_class::<PriceLevelUpdate>()?;
    m.add_class::<QuoteUpdate>()?;
    m.add_class::<Trade>()?;
    m.add_class::<TradeBreak>()?;
    m.add_class::<OfficialPrice>()?;
    m.add_class::<AuctionInformation>()?;
    m.add_class::<UnknownMessage>()?;
    m.add_class::<Gap>()?;
    m.add_class::<GivenUp>()?;
    m.add_class::<Recovered>()?;
    m.add_class::<FormatChanged>()?;
    m.add_class::<Restarted>()?;
    m.add_class::<Connected>()?;
    m.add_class::<Notice>()?;
    m.add_class::<End>()?;
    Ok(())
}
