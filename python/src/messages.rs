//! The typed Python classes: one per message class of the IEX model and one per stream event,
//! each frozen, with `__repr__`, `__eq__` and a keyword-only constructor.
//!
//! The message classes come from the model's table, `mdrelay_iex::for_each_message_type!`:
//! [`for_each_python_class!`] names a class for each [`Message`] variant, [`python_field!`] says
//! how each field is given to Python, and the table gives the rest (the attributes, their types
//! and order, the conversion). A field added to the table becomes an attribute of its class, a
//! column of its Arrow table (`tables`) and a line of the type stub (`generate_stub.py` reads
//! the same macros) with no other change.

use mdrelay_client::Message;
use mdrelay_client::message::{self, Side};
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

impl<A: ReprField, B: ReprField> ReprField for (A, B) {
    fn repr(&self) -> String {
        format!("({}, {})", self.0.repr(), self.1.repr())
    }
}

impl<T: ReprField> ReprField for Vec<T> {
    fn repr(&self) -> String {
        format!("[{}]", self.iter().map(ReprField::repr).collect::<Vec<_>>().join(", "))
    }
}

impl<T: ReprField> ReprField for Option<T> {
    fn repr(&self) -> String {
        self.as_ref().map_or_else(|| "None".to_string(), ReprField::repr)
    }
}

/// A record's `repr`: its constructor call, from `name=repr` pairs.
fn record_repr(class: &str, fields: &[(&str, &dyn ReprField)]) -> String {
    let fields: Vec<String> = fields.iter().map(|(name, value)| format!("{name}={}", value.repr())).collect();
    format!("{class}({})", fields.join(", "))
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
                record_repr(stringify!($name), &[$((stringify!($field), &self.$field)),*])
            }
        }
    };
}

/// How a field of the model is given to Python: the attribute's type and its value. The
/// presentations are the types of [`field`]; `tables` gives each its Arrow column.
pub trait Presentation {
    /// The field's type in the model.
    type Model: Copy;
    /// The attribute's type, as Python reads it.
    type Attribute: ReprField;
    /// The attribute's value.
    fn attribute(value: Self::Model) -> Self::Attribute;
}

/// The presentations of the model's fields ([`python_field!`] gives each field its own).
pub mod field {
    use super::{Presentation, code, side_text, symbol_text};
    use mdrelay_client::message::Side;
    use mdrelay_client::{Price as IexPrice, Symbol};
    use std::marker::PhantomData;

    /// The time of the message: ns since the Unix epoch, an `int`.
    pub struct Timestamp;
    /// A number as IEX sends it (a size, an id, a byte of flags), an `int`.
    pub struct Integer<T>(PhantomData<T>);
    /// A price, an `int` in 1/10,000 dollars, as IEX sends it.
    pub struct Price;
    /// A one-byte code (O, S, R...), a one-character `str`.
    pub struct Code;
    /// A byte that says yes (not 0) or no (0), a `bool`.
    pub struct Flag;
    /// A symbol without its padding, a `str`.
    pub struct Ticker;
    /// Bytes of text (a reason code), a `str`.
    pub struct Text<const N: usize>;
    /// The side a price level update's type byte says, "buy" or "sell".
    pub struct SideName;

    impl Presentation for Timestamp {
        type Model = i64;
        type Attribute = i64;
        fn attribute(value: i64) -> i64 {
            value
        }
    }

    impl<T: Copy + super::ReprField> Presentation for Integer<T> {
        type Model = T;
        type Attribute = T;
        fn attribute(value: T) -> T {
            value
        }
    }

    impl Presentation for Price {
        type Model = IexPrice;
        type Attribute = i64;
        fn attribute(value: IexPrice) -> i64 {
            value.0
        }
    }

    impl Presentation for Code {
        type Model = u8;
        type Attribute = String;
        fn attribute(value: u8) -> String {
            code(value)
        }
    }

    impl Presentation for Flag {
        type Model = u8;
        type Attribute = bool;
        fn attribute(value: u8) -> bool {
            value != 0
        }
    }

    impl Presentation for Ticker {
        type Model = Symbol;
        type Attribute = String;
        fn attribute(value: Symbol) -> String {
            symbol_text(value.trimmed())
        }
    }

    impl<const N: usize> Presentation for Text<N> {
        type Model = [u8; N];
        type Attribute = String;
        fn attribute(value: [u8; N]) -> String {
            symbol_text(&value)
        }
    }

    impl Presentation for SideName {
        type Model = Side;
        type Attribute = String;
        fn attribute(value: Side) -> String {
            side_text(value).to_string()
        }
    }
}

/// The presentation of each field of the model's table, from its name and its type there:
/// `python_field!(marker name: type)` is the [`field`] type, `python_field!(doc name: type)` the
/// attribute's doc. The type decides, but for a byte, which is a number unless named here as a
/// one-character code or a flag. The fields a type byte decides (typed `fixed`: the table gives
/// their values, not their type) are named here too. A field of a type not here does not
/// compile until it is added (and to `generate_stub.py`'s `PRESENTATIONS`).
macro_rules! python_field {
    ($what:ident timestamp: i64) => { $crate::messages::presentation!($what Timestamp) };
    ($what:ident side: fixed) => { $crate::messages::presentation!($what SideName) };
    ($what:ident in_effect: u8) => { $crate::messages::presentation!($what Flag) };
    ($what:ident event: u8) => { $crate::messages::presentation!($what Code) };
    ($what:ident status: u8) => { $crate::messages::presentation!($what Code) };
    ($what:ident indicator: u8) => { $crate::messages::presentation!($what Code) };
    ($what:ident detail: u8) => { $crate::messages::presentation!($what Code) };
    ($what:ident price_type: u8) => { $crate::messages::presentation!($what Code) };
    ($what:ident auction_type: u8) => { $crate::messages::presentation!($what Code) };
    ($what:ident imbalance_side: u8) => { $crate::messages::presentation!($what Code) };
    ($what:ident $name:ident: u8) => { $crate::messages::presentation!($what Integer<u8>) };
    ($what:ident $name:ident: u32) => { $crate::messages::presentation!($what Integer<u32>) };
    ($what:ident $name:ident: i64) => { $crate::messages::presentation!($what Integer<i64>) };
    ($what:ident $name:ident: Price) => { $crate::messages::presentation!($what Price) };
    ($what:ident $name:ident: Symbol) => { $crate::messages::presentation!($what Ticker) };
    ($what:ident $name:ident: [u8; $len:tt]) => { $crate::messages::presentation!($what Text<$len>) };
}
pub(crate) use python_field;

/// A presentation's [`field`] type (`marker`), or the doc of its attributes (`doc`).
macro_rules! presentation {
    (marker $name:ident $(<$param:tt>)?) => { $crate::messages::field::$name $(<$param>)? };
    (doc Timestamp) => { "ns since the Unix epoch." };
    (doc Integer<$param:tt>) => { "An integer, as IEX sends it." };
    (doc Price) => { "In 1/10,000 dollars." };
    (doc Code) => { "IEX's one-byte code, as a one-character string." };
    (doc Flag) => { "True when IEX's byte is not 0." };
    (doc Ticker) => { "The ticker." };
    (doc Text<$len:tt>) => { "IEX's bytes, as text." };
    (doc SideName) => { "\"buy\" (type 8) or \"sell\" (type 5)." };
}
pub(crate) use presentation;

/// Python's order of a class's attributes: `timestamp` and `symbol` first, then the fields the
/// type byte decides, then the others in the order of the IEX layout (which puts the type's own
/// byte before the timestamp). Takes `then! (args) Struct [] [] [fixed fields] [] fields`, each
/// field `name: type,`, and hands `then!` the args, the struct and the fields in that order.
macro_rules! python_order {
    ($then:ident! $args:tt $model:ident $time:tt $symbol:tt $fixed:tt $rest:tt timestamp: $type:tt, $($more:tt)*) => {
        $crate::messages::python_order! { $then! $args $model [timestamp: $type,] $symbol $fixed $rest $($more)* }
    };
    ($then:ident! $args:tt $model:ident $time:tt $symbol:tt $fixed:tt $rest:tt symbol: $type:tt, $($more:tt)*) => {
        $crate::messages::python_order! { $then! $args $model $time [symbol: $type,] $fixed $rest $($more)* }
    };
    ($then:ident! $args:tt $model:ident $time:tt $symbol:tt $fixed:tt [$($rest:tt)*] $field:ident: $type:tt, $($more:tt)*) => {
        $crate::messages::python_order! { $then! $args $model $time $symbol $fixed [$($rest)* $field: $type,] $($more)* }
    };
    ($then:ident! $args:tt $model:ident [$($time:tt)*] [$($symbol:tt)*] [$($fixed:tt)*] [$($rest:tt)*]) => {
        $then! { $args $model { $($time)* $($symbol)* $($fixed)* $($rest)* } }
    };
}
pub(crate) use python_order;

/// Makes `model_fields!`, the model's table by [`Message`] variant: `model_fields!(Variant =>
/// then!(args))` is `then! { (args) Struct { field: type, ... } }`, with the variant's struct
/// and its fields in Python's order ([`python_order!`]), those the type byte decides typed
/// `fixed`. Of a variant's two entries (the two sides of a price level, which have the same
/// fields), the first is taken.
macro_rules! index_model_by_variant {
    ($($wire:ident $name:literal = $kind:ident => $variant:ident($model:ident { $($fixed:ident: $fixed_value:path),* } {
        $($field:ident: $field_type:tt),* $(,)?
    })),* $(,)?) => {
        macro_rules! model_fields {
            $(($variant => $then:ident! $args:tt) => {
                $crate::messages::python_order! {
                    $then! $args $model [] [] [$($fixed: fixed,)*] [] $($field: $field_type,)*
                }
            };)*
        }
        // Beside its definition, for `tables` to import it by path.
        pub(crate) use model_fields;
    };
}
mdrelay_iex::for_each_message_type!(index_model_by_variant);

/// The Python side of the model: a class for each [`Message`] variant, in the order of
/// `MESSAGE_TYPES`. Each entry is the class's doc, `Variant => ClassName`, and its Arrow table:
/// the table's name and the columns it places elsewhere than the class does (`moved after
/// column`; the trade, price level and quote tables have always had their flag byte after the
/// values). Hands `$callback` the entries; the classes' attributes and the tables' columns come
/// from the model's table ([`model_fields!`]), and `generate_stub.py` reads this list for the
/// type stub.
macro_rules! for_each_python_class {
    ($callback:ident) => {
        $callback! {
            /// T: a trade report.
            TradeReport => Trade, table trade { sale_condition after price },
            /// B: a trade break (a trade reported earlier is void).
            TradeBreak => TradeBreak, table trade_break { sale_condition after price },
            /// 8 / 5: a price level update on the buy or sell side of the book.
            PriceLevelUpdate => PriceLevelUpdate, table price_level_update { event_flags after price },
            /// Q: a top-of-book quote update.
            QuoteUpdate => QuoteUpdate, table quote_update { flags after ask_size },
            /// S: a system event (start and end of messages, system hours, regular hours).
            SystemEvent => SystemEvent, table system_event {},
            /// D: a security directory entry.
            SecurityDirectory => SecurityDirectory, table security_directory {},
            /// H: a trading status change.
            TradingStatus => TradingStatus, table trading_status {},
            /// I: a retail liquidity indicator.
            RetailLiquidityIndicator => RetailLiquidityIndicator, table retail_liquidity_indicator {},
            /// O: an operational halt status.
            OperationalHaltStatus => OperationalHaltStatus, table operational_halt_status {},
            /// P: a short-sale price test status.
            ShortSalePriceTestStatus => ShortSalePriceTestStatus, table short_sale_price_test_status {},
            /// E: a security event (opening or closing process complete).
            SecurityEvent => SecurityEvent, table security_event {},
            /// X: an official opening or closing price.
            OfficialPrice => OfficialPrice, table official_price {},
            /// A: auction information.
            AuctionInformation => AuctionInformation, table auction_information {},
        }
    };
}
pub(crate) use for_each_python_class;

/// Defines a message class from its entry in [`for_each_python_class!`] and its fields from
/// [`model_fields!`]: frozen, its attributes readable, compared by value, written by `repr` as
/// its constructor call, and made from a message of the model.
macro_rules! message_class {
    (($(#[$doc:meta])* $class:ident) $model:ident { $($field:ident: $type:tt,)* }) => {
        $(#[$doc])*
        #[pyclass(module = "mdrelay", frozen, eq, get_all, skip_from_py_object)]
        #[derive(Debug, PartialEq)]
        pub struct $class {
            $(
                #[doc = python_field!(doc $field: $type)]
                pub $field: <python_field!(marker $field: $type) as Presentation>::Attribute,
            )*
        }

        #[pymethods]
        impl $class {
            #[new]
            #[pyo3(signature = (*, $($field),*))]
            // One keyword argument per field, as the class's attributes are.
            #[allow(clippy::too_many_arguments)]
            fn new($($field: <python_field!(marker $field: $type) as Presentation>::Attribute),*) -> Self {
                Self { $($field),* }
            }

            fn __repr__(&self) -> String {
                record_repr(stringify!($class), &[$((stringify!($field), &self.$field)),*])
            }
        }

        impl $class {
            /// The class's object of a message of the model.
            fn from_model(message: &message::$model) -> Self {
                Self { $($field: <python_field!(marker $field: $type) as Presentation>::attribute(message.$field)),* }
            }
        }
    };
}

/// The message classes, the Python object of a message, and their registration.
macro_rules! message_classes {
    ($($(#[$doc:meta])* $variant:ident => $class:ident, table $table:ident { $($moves:tt)* },)*) => {
        $(model_fields!($variant => message_class!($(#[$doc])* $class));)*

        /// The Python object of one message.
        pub fn message_object(py: Python<'_>, message: &Message<'_>) -> PyResult<Py<PyAny>> {
            Ok(match message {
                $(Message::$variant(m) => $class::from_model(m).into_pyobject(py)?.into_any().unbind(),)*
                Message::Unknown(u) => {
                    UnknownMessage { kind: u.kind, length: u.bytes.len() as u64 }.into_pyobject(py)?.into_any().unbind()
                }
            })
        }

        /// Adds the message classes to the module.
        fn register_message_classes(module: &Bound<'_, PyModule>) -> PyResult<()> {
            $(module.add_class::<$class>()?;)*
            Ok(())
        }
    };
}
for_each_python_class!(message_classes);

py_record!(
    /// A message of a type this package does not model: its type byte and length.
    UnknownMessage {
        /// The type byte.
        kind: u8,
        /// Its length in bytes.
        length: u64,
    }
);

/// The stream's events as Python classes, each a record ([`py_record!`]): `register` adds
/// them, and `generate_stub.py` writes their stub entries and the `StreamEvent` union from this
/// list.
macro_rules! stream_events {
    ($($(#[$doc:meta])* $name:ident $fields:tt)*) => {
        $(py_record!($(#[$doc])* $name $fields);)*

        /// Adds the event classes to the module.
        fn register_stream_events(module: &Bound<'_, PyModule>) -> PyResult<()> {
            $(module.add_class::<$name>()?;)*
            Ok(())
        }
    };
}

stream_events! {
    /// Frames found missing: `count` frames from `first` have not arrived (yet).
    Gap {
        /// The first frame missing.
        first: u64,
        /// How many.
        count: u64,
    }
    /// Missing frames were given up: they will not come.
    GivenUp {
        /// How many frames.
        frames: u64,
    }
    /// The messages that follow are a frame retransmitted by the recovery service, filling a gap.
    Recovered {
        /// The frame's sequence number.
        sequence: u64,
        /// Its messages (they follow this event).
        messages: u64,
    }
    /// The stream's wire format changed (`from_format` is None for the first one).
    FormatChanged {
        /// The format before.
        from_format: Option<String>,
        /// The format from now on.
        to_format: String,
    }
    /// The publisher restarted: a new session, sequence numbers start over.
    Restarted {
        /// The session before.
        old_session: u64,
        /// The new one.
        new_session: u64,
    }
    /// TCP: a connection to the publisher was made.
    Connected {
        /// The publisher's address.
        peer: String,
        /// A connection was made before this one.
        reconnect: bool,
    }
    /// Something else that happened to the stream (a reconnection, a retransmission service's
    /// answer, a datagram refused); `kind` names it, `detail` says the rest.
    Notice {
        /// What kind of event.
        kind: String,
        /// Its details as text.
        detail: String,
    }
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
    /// The snapshot asked for (`snapshot=True`) came: the books (`Subscriber.book`,
    /// `Subscriber.books`) and the day's counts are as of frame `as_of`, and the messages that
    /// follow are the stream's from the frame after it.
    Snapshot {
        /// The last frame the snapshot includes.
        as_of: u64,
        /// Symbols it gave state for.
        symbols: u64,
        /// Messages of the stream up to `as_of`.
        messages: u64,
    }
}

py_record!(
    /// One symbol's book and status, as the messages received so far leave them (a snapshot's
    /// included): price levels as `(price, size)` pairs, best first, prices in 1/10,000
    /// dollars.
    Book {
        /// The symbol.
        symbol: String,
        /// Buy levels, highest price first.
        bids: Vec<(i64, u64)>,
        /// Sell levels, lowest price first.
        asks: Vec<(i64, u64)>,
        /// Whether the last price level update completed an event (None before any).
        consistent: Option<bool>,
        /// The last trading status (H halted, O order acceptance, P paused, T trading).
        trading_status: Option<String>,
        /// The last operational halt status (O halted, N not).
        operational_halt: Option<String>,
        /// Whether the short-sale price test is in effect.
        short_sale_test: Option<bool>,
        /// The last trade report, `(price, size)`.
        last_trade: Option<(i64, u64)>,
    }
);

impl Book {
    /// The Python record of one symbol's state.
    pub fn of(symbol: mdrelay_client::Symbol, book: &mdrelay_client::SymbolBook) -> Book {
        let pairs = |levels: &mut dyn Iterator<Item = mdrelay_client::Level>| {
            levels.map(|l| (l.price.0, u64::from(l.size))).collect::<Vec<_>>()
        };
        Book {
            symbol: symbol.to_text(),
            bids: pairs(&mut book.bids()),
            asks: pairs(&mut book.asks()),
            consistent: book.consistent,
            trading_status: book.trading_status.map(|m| code(m.status)),
            operational_halt: book.operational_halt.map(|m| code(m.status)),
            short_sale_test: book.short_sale_test.map(|m| m.in_effect != 0),
            last_trade: book.last_trade.map(|t| (t.price.0, u64::from(t.size))),
        }
    }
}

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

/// "buy" or "sell".
pub fn side_text(side: Side) -> &'static str {
    match side {
        Side::Buy => "buy",
        Side::Sell => "sell",
    }
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    register_message_classes(m)?;
    register_stream_events(m)?;
    m.add_class::<UnknownMessage>()?;
    m.add_class::<Book>()?;
    Ok(())
}
