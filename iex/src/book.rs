//! The state the messages imply, per symbol: the DEEP book (price levels by side), the TOPS top
//! of book, trading status, operational halt, short-sale test and last trade. Fed messages in
//! stream order, with no clock and no I/O, so a subscriber, a relay and a snapshot keep it alike.
//!
//! The rules are those of the independent reference (`iexbook.py`):
//! - a price level update (`8` buy, `5` sell) sets its level to its size, and removes it at size
//!   0; the book is consistent when the symbol's last update had event flag 1, in transition
//!   when it had 0;
//! - the last `H`, `O`, `P`, `T` and `Q` of a symbol are its trading status, operational halt,
//!   short-sale test, last trade and top of book (a trade break changes no state);
//! - a feed restart clears nothing: state follows messages in the order they come.
//!
//! Memory: a symbol with any state costs about 350 bytes (its entry, its slot in the symbol map
//! and the last message of each kind), and a price level 16 bytes. Levels live in one vector per
//! side, kept in price order with the best price last, so the busy end of a book moves the
//! fewest entries; a removed level leaves its capacity, so once a symbol's book has been as deep
//! as it gets, updates allocate nothing.

use crate::message::{
    Message, OperationalHaltStatus, PriceLevelUpdate, QuoteUpdate, ShortSalePriceTestStatus, Side, Trade, TradingStatus,
};
use crate::price::{Price, Symbol};
use crate::symbol_table::SymbolTable;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

/// One price level: the shares shown at a price.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Level {
    /// The level's price.
    pub price: Price,
    /// Shares at the price (never 0: a level at 0 is removed).
    pub size: u32,
}

/// The state of one symbol. Fields are the last message of each kind; the book's levels are
/// read through [`SymbolBook::bids`] and [`SymbolBook::asks`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SymbolBook {
    /// Buy levels, in ascending price order: the best bid last.
    bids: Vec<Level>,
    /// Sell levels, in descending price order: the best ask last.
    asks: Vec<Level>,
    /// Whether the last price level update ended an event (flag 1) or left the book in
    /// transition (0); `None` before the first update.
    pub consistent: Option<bool>,
    /// The last trading status (`H`).
    pub trading_status: Option<TradingStatus>,
    /// The last operational halt status (`O`).
    pub operational_halt: Option<OperationalHaltStatus>,
    /// The last short-sale price test status (`P`).
    pub short_sale_test: Option<ShortSalePriceTestStatus>,
    /// The last trade report (`T`).
    pub last_trade: Option<Trade>,
    /// The last TOPS quote update (`Q`): the top of book as TOPS gives it.
    pub quote: Option<QuoteUpdate>,
}

impl SymbolBook {
    /// Buy levels, best (highest) price first.
    pub fn bids(&self) -> impl ExactSizeIterator<Item = Level> + DoubleEndedIterator + '_ {
        self.bids.iter().rev().copied()
    }

    /// Sell levels, best (lowest) price first.
    pub fn asks(&self) -> impl ExactSizeIterator<Item = Level> + DoubleEndedIterator + '_ {
        self.asks.iter().rev().copied()
    }

    /// The best bid of the DEEP book.
    pub fn best_bid(&self) -> Option<Level> {
        self.bids.last().copied()
    }

    /// The best ask of the DEEP book.
    pub fn best_ask(&self) -> Option<Level> {
        self.asks.last().copied()
    }

    /// Sets a level from a price level update, keeping each side in order.
    fn set_level(&mut self, update: &PriceLevelUpdate) {
        let (levels, toward_best) = match update.side {
            // Ascending: a higher bid is closer to the end.
            Side::Buy => (&mut self.bids, false),
            // Descending: a lower ask is closer to the end.
            Side::Sell => (&mut self.asks, true),
        };
        let at = levels.binary_search_by(|l| {
            let order = l.price.cmp(&update.price);
            if toward_best { order.reverse() } else { order }
        });
        match (at, update.size) {
            (Ok(i), 0) => {
                levels.remove(i);
            }
            (Ok(i), size) => levels[i].size = size,
            (Err(_), 0) => {}
            (Err(i), size) => levels.insert(i, Level { price: update.price, size }),
        }
        self.consistent = Some(update.event_flags == 1);
    }
}

/// The state of every symbol that has any, fed messages in stream order.
#[derive(Clone, Debug, Default)]
pub struct Books {
    symbols: SymbolTable<SymbolBook>,
    applied: u64,
}

impl Books {
    /// No state yet.
    pub fn new() -> Books {
        Books::default()
    }

    /// Applies one message (of any type: each is counted in [`Books::messages_applied`]).
    #[inline]
    pub fn apply(&mut self, message: &Message<'_>) {
        self.applied += 1;
        match message {
            Message::PriceLevelUpdate(u) => self.entry(u.symbol).set_level(u),
            Message::TradingStatus(m) => self.entry(m.symbol).trading_status = Some(*m),
            Message::OperationalHaltStatus(m) => self.entry(m.symbol).operational_halt = Some(*m),
            Message::ShortSalePriceTestStatus(m) => self.entry(m.symbol).short_sale_test = Some(*m),
            Message::TradeReport(m) => self.entry(m.symbol).last_trade = Some(*m),
            Message::QuoteUpdate(m) => self.entry(m.symbol).quote = Some(*m),
            _ => {}
        }
    }

    #[inline(always)]
    fn entry(&mut self, symbol: Symbol) -> &mut SymbolBook {
        self.symbols.entry(symbol, SymbolBook::default)
    }

    /// The state of one symbol, if it has any.
    pub fn get(&self, symbol: &Symbol) -> Option<&SymbolBook> {
        self.symbols.get(symbol)
    }

    /// Every symbol with state, in the order they were first seen.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Symbol, &SymbolBook)> {
        self.symbols.iter().map(|(symbol, book)| (*symbol, book))
    }

    /// Every symbol with state, sorted by symbol.
    pub fn sorted(&self) -> Vec<(Symbol, &SymbolBook)> {
        let mut all: Vec<_> = self.iter().collect();
        all.sort_unstable_by_key(|(symbol, _)| *symbol);
        all
    }

    /// How many symbols have state.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// Whether no symbol has state.
    pub fn is_empty(&self) -> bool {
        self.symbols.len() == 0
    }

    /// Messages applied so far.
    pub fn messages_applied(&self) -> u64 {
        self.applied
    }

    /// Keeps only the symbols `keep` says to (a symbol filter applied to books from elsewhere).
    pub fn retain(&mut self, mut keep: impl FnMut(&Symbol) -> bool) {
        let mut kept = Books { applied: self.applied, ..Books::default() };
        for (symbol, book) in self.iter().filter(|(symbol, _)| keep(symbol)) {
            *kept.entry(symbol) = book.clone();
        }
        *self = kept;
    }

    /// Sets the count of messages applied: books rebuilt from a snapshot stand for the whole
    /// stream up to it, not for the messages that carried them.
    pub fn set_messages_applied(&mut self, messages: u64) {
        self.applied = messages;
    }

    /// The books as the reference reader `iexbook.py` prints them: `file`, `messages_applied`,
    /// and `symbols` sorted, each in [`BookJson`]'s schema.
    pub fn to_reference_json<'a>(&'a self, file: &'a str) -> ReferenceDocument<'a> {
        ReferenceDocument { file, books: self }
    }
}

/// Applies every message, in order: `books.extend(frame.messages())`.
impl<'m> Extend<Message<'m>> for Books {
    fn extend<I: IntoIterator<Item = Message<'m>>>(&mut self, messages: I) {
        for message in messages {
            self.apply(&message);
        }
    }
}

/// [`Books`] in the reference reader's JSON schema (see [`Books::to_reference_json`]).
pub struct ReferenceDocument<'a> {
    file: &'a str,
    books: &'a Books,
}

impl Serialize for ReferenceDocument<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("file", self.file)?;
        map.serialize_entry("messages_applied", &self.books.applied)?;
        map.serialize_entry("symbols", &SortedSymbols(self.books))?;
        map.end()
    }
}

struct SortedSymbols<'a>(&'a Books);

impl Serialize for SortedSymbols<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let sorted = self.0.sorted();
        let mut map = s.serialize_map(Some(sorted.len()))?;
        for (symbol, book) in sorted {
            map.serialize_entry(&symbol.to_text(), &BookJson(book))?;
        }
        map.end()
    }
}

/// One symbol's state in the reference reader's schema: `bids` and `asks` as `[price, size]`
/// pairs in price order (best first, prices as on the wire), then, each only when set,
/// `book_consistent`, `trading_status` and `operational_halt` (the status letter),
/// `short_sale_test` (0 or 1) and `last_trade` (`[price, size]`). The TOPS quote is not in it.
pub struct BookJson<'a>(pub &'a SymbolBook);

/// One side's levels as kept (best last), written best first.
struct Levels<'a>(&'a [Level]);

impl Serialize for Levels<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for level in self.0.iter().rev() {
            seq.serialize_element(&(level.price.0, level.size))?;
        }
        seq.end()
    }
}

impl Serialize for BookJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let b = self.0;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("bids", &Levels(&b.bids))?;
        map.serialize_entry("asks", &Levels(&b.asks))?;
        if let Some(consistent) = b.consistent {
            map.serialize_entry("book_consistent", &consistent)?;
        }
        let letter = |byte: u8| char::from(byte).to_string();
        if let Some(m) = &b.trading_status {
            map.serialize_entry("trading_status", &letter(m.status))?;
        }
        if let Some(m) = &b.operational_halt {
            map.serialize_entry("operational_halt", &letter(m.status))?;
        }
        if let Some(m) = &b.short_sale_test {
            map.serialize_entry("short_sale_test", &m.in_effect)?;
        }
        if let Some(t) = &b.last_trade {
            map.serialize_entry("last_trade", &(t.price.0, t.size))?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(side: Side, price: i64, size: u32, event_flags: u8) -> Message<'static> {
        Message::PriceLevelUpdate(PriceLevelUpdate {
            side,
            event_flags,
            timestamp: 0,
            symbol: Symbol::new("ZXIET").unwrap(),
            size,
            price: Price(price),
        })
    }

    #[test]
    fn levels_are_set_replaced_and_removed_in_price_order_on_each_side() {
        let mut books = Books::new();
        for (side, price, size) in [
            (Side::Buy, 100, 5),
            (Side::Buy, 300, 7),
            (Side::Buy, 200, 6),
            (Side::Sell, 500, 1),
            (Side::Sell, 400, 2),
            (Side::Sell, 600, 3),
            (Side::Buy, 200, 9),
            (Side::Sell, 500, 0),
            (Side::Sell, 999, 0),
        ] {
            books.apply(&level(side, price, size, 0));
        }
        books.apply(&level(Side::Buy, 100, 0, 1));
        let book = books.get(&Symbol::new("ZXIET").unwrap()).unwrap();
        let pairs = |levels: Vec<Level>| levels.iter().map(|l| (l.price.0, l.size)).collect::<Vec<_>>();
        assert_eq!(pairs(book.bids().collect()), [(300, 7), (200, 9)]);
        assert_eq!(pairs(book.asks().collect()), [(400, 2), (600, 3)]);
        assert_eq!(book.best_bid(), Some(Level { price: Price(300), size: 7 }));
        assert_eq!(book.best_ask(), Some(Level { price: Price(400), size: 2 }));
        assert_eq!(book.consistent, Some(true));
        assert_eq!(books.messages_applied(), 10);
        assert_eq!(books.len(), 1);
    }
}
