//! Arrow columns built message by message, one table per message class (`messages`), finished
//! into record batches whose buffers Python takes without a copy. A table's columns are its
//! class's attributes, from the model's table (`mdrelay_iex::for_each_message_type!`), each of
//! the Arrow type of its presentation (`messages::field`). Prices are kept as IEX sends them
//! (integers in 1/10,000 dollars) and given the Arrow type the caller chose ([`Prices`]) when a
//! batch is finished.

use crate::messages::{self, Presentation, field, for_each_python_class, model_fields, python_field, side_text};
use arrow_array::builder::{BooleanBuilder, StringBuilder};
use arrow_array::types::{Int64Type, UInt8Type, UInt32Type};
use arrow_array::{
    ArrayRef, ArrowPrimitiveType, Decimal128Array, Float64Array, Int64Array, PrimitiveArray, RecordBatch,
    TimestampNanosecondArray,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use mdrelay_client::message::{self, Side};
use mdrelay_client::{Message, Price, Symbol};
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
impl<T: ArrowPrimitiveType> Column for PrimitiveCol<T> {
    fn data_type(_: Prices) -> DataType {
        T::DATA_TYPE
    }
    fn finish(&mut self, _: Prices) -> ArrayRef {
        Arc::new(PrimitiveArray::<T>::from_iter_values(std::mem::take(&mut self.0)))
    }
}

/// The integers of the model, each with its Arrow type.
trait ArrowInteger: Copy {
    /// The Arrow type of its columns.
    type Arrow: ArrowPrimitiveType<Native = Self>;
}
impl ArrowInteger for u8 {
    type Arrow = UInt8Type;
}
impl ArrowInteger for u32 {
    type Arrow = UInt32Type;
}
impl ArrowInteger for i64 {
    type Arrow = Int64Type;
}

/// Prices, pushed in 1/10,000 dollars and finished as the caller chose.
#[derive(Default)]
struct PriceCol(Vec<i64>);
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

/// The Arrow column of each presentation of a model field.
trait ArrowField: Presentation {
    /// The column its values go to.
    type Column: Column;
    /// Adds a value to the column.
    fn push(column: &mut Self::Column, value: Self::Model);
}

impl ArrowField for field::Timestamp {
    type Column = TimeCol;
    fn push(column: &mut TimeCol, value: i64) {
        column.0.push(value);
    }
}

impl<T: ArrowInteger + messages::ReprField> ArrowField for field::Integer<T> {
    type Column = PrimitiveCol<T::Arrow>;
    fn push(column: &mut Self::Column, value: T) {
        column.0.push(value);
    }
}

impl ArrowField for field::Price {
    type Column = PriceCol;
    fn push(column: &mut PriceCol, value: Price) {
        column.0.push(value.0);
    }
}

impl ArrowField for field::Code {
    type Column = TextCol;
    fn push(column: &mut TextCol, value: u8) {
        column.push(Text::Code(value));
    }
}

impl ArrowField for field::Flag {
    type Column = BoolCol;
    fn push(column: &mut BoolCol, value: u8) {
        column.0.append_value(value != 0);
    }
}

impl ArrowField for field::Ticker {
    type Column = TextCol;
    fn push(column: &mut TextCol, value: Symbol) {
        column.push(Text::Bytes(value.trimmed()));
    }
}

impl<const N: usize> ArrowField for field::Text<N> {
    type Column = TextCol;
    fn push(column: &mut TextCol, value: [u8; N]) {
        column.push(Text::Bytes(&value));
    }
}

impl ArrowField for field::SideName {
    type Column = TextCol;
    fn push(column: &mut TextCol, value: Side) {
        column.push(Text::Str(side_text(value)));
    }
}

/// The schema field of a column.
fn column_field<P: ArrowField>(name: &str, prices: Prices) -> Field {
    Field::new(name, P::Column::data_type(prices), P::Column::nullable(prices))
}

/// A message class's Arrow table: its columns, and how a message of the class fills a row.
trait ArrowTable {
    /// The model's struct of the class's messages.
    type Model;
    /// The columns being built, in the class's order.
    type Columns;
    /// Empty columns.
    fn columns() -> Self::Columns;
    /// Adds a message's row.
    fn push(columns: &mut Self::Columns, message: &Self::Model);
    /// The schema's fields, in the table's order.
    fn fields(prices: Prices) -> Vec<Field>;
    /// The arrays of what was pushed, in the table's order; the columns are empty again.
    fn finish(columns: &mut Self::Columns, prices: Prices) -> Vec<ArrayRef>;
}

/// The table's order of a class's columns: the class's, with each `(moved, after)` column put
/// right after the other.
fn arrange<T>(mut columns: Vec<(&'static str, T)>, moves: &[(&str, &str)]) -> Vec<T> {
    for &(moved, after) in moves {
        if let Some(from) = columns.iter().position(|(name, _)| *name == moved) {
            let column = columns.remove(from);
            let to = columns.iter().position(|(name, _)| *name == after).map_or(columns.len(), |at| at + 1);
            columns.insert(to, column);
        }
    }
    columns.into_iter().map(|(_, column)| column).collect()
}

/// The table of a message class, from its entry in `for_each_python_class!` and its fields from
/// `model_fields!`: one column per attribute, of its presentation's Arrow type.
macro_rules! arrow_table {
    (($class:ident { $($moved:ident after $after:ident),* }) $model:ident { $($field:ident: $type:tt,)* }) => {
        impl ArrowTable for messages::$class {
            type Model = message::$model;
            type Columns = ($(<python_field!(marker $field: $type) as ArrowField>::Column,)*);

            fn columns() -> Self::Columns {
                ($(<<python_field!(marker $field: $type) as ArrowField>::Column as Default>::default(),)*)
            }

            fn push(columns: &mut Self::Columns, message: &Self::Model) {
                let ($($field,)*) = columns;
                $(<python_field!(marker $field: $type) as ArrowField>::push($field, message.$field);)*
            }

            fn fields(prices: Prices) -> Vec<Field> {
                let fields = vec![$(
                    (stringify!($field), column_field::<python_field!(marker $field: $type)>(stringify!($field), prices)),
                )*];
                arrange(fields, &[$((stringify!($moved), stringify!($after))),*])
            }

            fn finish(columns: &mut Self::Columns, prices: Prices) -> Vec<ArrayRef> {
                let ($($field,)*) = columns;
                let arrays = vec![$((stringify!($field), $field.finish(prices)),)*];
                arrange(arrays, &[$((stringify!($moved), stringify!($after))),*])
            }
        }

        // The columns moved are the class's (the names would not compile otherwise).
        $(const _: fn(&message::$model) = |m| {
            let _ = (m.$moved, m.$after);
        };)*
    };
}

/// A table being filled.
struct Table<C: ArrowTable> {
    rows: usize,
    columns: C::Columns,
}

impl<C: ArrowTable> Default for Table<C> {
    fn default() -> Self {
        Table { rows: 0, columns: C::columns() }
    }
}

impl<C: ArrowTable> Table<C> {
    fn push(&mut self, message: &C::Model) {
        C::push(&mut self.columns, message);
        self.rows += 1;
    }

    /// The schema of its batches.
    fn schema(prices: Prices) -> Schema {
        Schema::new(C::fields(prices))
    }

    fn finish(&mut self, prices: Prices) -> Option<RecordBatch> {
        if self.rows == 0 {
            return None;
        }
        self.rows = 0;
        let columns = C::finish(&mut self.columns, prices);
        // Every column has one value per row, of the schema's type.
        RecordBatch::try_new(Arc::new(Self::schema(prices)), columns).ok()
    }
}

/// The tables of every message class, named as `for_each_python_class!` names them.
macro_rules! arrow_tables {
    ($($(#[$doc:meta])* $variant:ident => $class:ident, table $table:ident { $($moves:tt)* },)*) => {
        $(model_fields!($variant => arrow_table!($class { $($moves)* }));)*

        /// One table per message class, filled until [`Tables::finish`].
        #[derive(Default)]
        pub struct Tables {
            rows: usize,
            /// Messages of types the model does not know: counted, not tabled.
            pub unknown: u64,
            $($table: Table<messages::$class>,)*
        }

        impl Tables {
            /// Rows waiting in every table.
            pub fn rows(&self) -> usize {
                self.rows
            }

            /// The schema of a message type's batches (None for a name not in [`LABELS`]).
            pub fn schema(label: &str, prices: Prices) -> Option<Schema> {
                $(if label == stringify!($table) {
                    return Some(Table::<messages::$class>::schema(prices));
                })*
                None
            }

            /// Adds a message to its class's table.
            pub fn push(&mut self, message: &Message<'_>) {
                match message {
                    $(Message::$variant(m) => self.$table.push(m),)*
                    Message::Unknown(_) => {
                        self.unknown += 1;
                        return;
                    }
                }
                self.rows += 1;
            }

            /// The record batch of every table with rows, named by message type, with prices of
            /// the type `prices` chooses; the tables are empty again.
            pub fn finish(&mut self, prices: Prices) -> Vec<(&'static str, RecordBatch)> {
                self.rows = 0;
                let mut out = Vec::new();
                $(if let Some(batch) = self.$table.finish(prices) {
                    out.push((stringify!($table), batch));
                })*
                out
            }
        }

        /// The message type names [`Tables::finish`] gives, in its order.
        pub const LABELS: &[&str] = &[$(stringify!($table)),*];
    };
}
for_each_python_class!(arrow_tables);

/// Every symbol's price levels as one record batch: `symbol`, `side` ("buy", "sell"), `price`
/// (int64, as IEX sends it) and `size` (uint32), by symbol, bids best first, then asks best first.
pub fn books_batch(books: &mdrelay_client::Books) -> Result<arrow_array::RecordBatch, arrow_schema::ArrowError> {
    use arrow_array::builder::{Int64Builder, StringBuilder, UInt32Builder};
    use std::sync::Arc;
    let (mut symbol, mut side) = (StringBuilder::new(), StringBuilder::new());
    let (mut price, mut size) = (Int64Builder::new(), UInt32Builder::new());
    for (name, book) in books.sorted() {
        let name = name.to_text();
        for (label, levels) in [("buy", book.bids().collect::<Vec<_>>()), ("sell", book.asks().collect())] {
            for level in levels {
                symbol.append_value(&name);
                side.append_value(label);
                price.append_value(level.price.0);
                size.append_value(level.size);
            }
        }
    }
    let schema = arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("symbol", arrow_schema::DataType::Utf8, false),
        arrow_schema::Field::new("side", arrow_schema::DataType::Utf8, false),
        arrow_schema::Field::new("price", arrow_schema::DataType::Int64, false),
        arrow_schema::Field::new("size", arrow_schema::DataType::UInt32, false),
    ]);
    arrow_array::RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(symbol.finish()), Arc::new(side.finish()), Arc::new(price.finish()), Arc::new(size.finish())],
    )
}
