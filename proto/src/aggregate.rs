//! Per-symbol aggregation of traded volume and high/low prices, by the rules every subscriber and
//! `inspect` must reproduce:
//!
//! - `trade_volume` / `trades`: sum of size and count of trade reports (T);
//! - `trade_high` / `trade_low`: max / min trade report price;
//! - `bid_high` / `bid_low`: max / min over buy-side price level updates (8), every one including
//!   size 0, and over quote updates (Q) whose bid size is > 0;
//! - `ask_high` / `ask_low`: the same for the sell side (5, and Q with ask size > 0);
//! - `broken_trades`: count of trade breaks (B).
//!
//! A field never set is `None` (JSON null).

use crate::message::{Message, Side};
use crate::price::{Price, Symbol};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// The figures for one symbol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SymbolAggregate {
    /// Shares over trade reports.
    pub trade_volume: u64,
    /// Trade reports.
    pub trades: u64,
    /// Trade breaks.
    pub broken_trades: u64,
    /// Highest trade price.
    pub trade_high: Option<Price>,
    /// Lowest trade price.
    pub trade_low: Option<Price>,
    /// Highest bid price.
    pub bid_high: Option<Price>,
    /// Lowest bid price.
    pub bid_low: Option<Price>,
    /// Highest ask price.
    pub ask_high: Option<Price>,
    /// Lowest ask price.
    pub ask_low: Option<Price>,
}

#[inline]
fn widen(high: &mut Option<Price>, low: &mut Option<Price>, price: Price) {
    *high = Some(high.map_or(price, |h| h.max(price)));
    *low = Some(low.map_or(price, |l| l.min(price)));
}

impl SymbolAggregate {
    /// True when the symbol had a trade or a quote: the symbols reports list.
    pub fn is_active(&self) -> bool {
        self.trades > 0 || self.bid_high.is_some() || self.ask_high.is_some()
    }

    /// Folds `other` (figures for the same symbol over a different part of the stream) into self.
    pub fn merge(&mut self, other: &SymbolAggregate) {
        self.trade_volume += other.trade_volume;
        self.trades += other.trades;
        self.broken_trades += other.broken_trades;
        for (high, low, other_high, other_low) in [
            (&mut self.trade_high, &mut self.trade_low, other.trade_high, other.trade_low),
            (&mut self.bid_high, &mut self.bid_low, other.bid_high, other.bid_low),
            (&mut self.ask_high, &mut self.ask_low, other.ask_high, other.ask_low),
        ] {
            if let (Some(h), Some(l)) = (other_high, other_low) {
                widen(high, low, h);
                widen(high, low, l);
            }
        }
    }
}

/// Aggregates for every symbol seen.
#[derive(Clone, Debug, Default)]
pub struct Aggregator {
    symbols: FxHashMap<Symbol, SymbolAggregate>,
}

impl Aggregator {
    /// An empty aggregator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one message; messages that carry no trade or quote are ignored.
    #[inline]
    pub fn apply(&mut self, message: &Message<'_>) {
        match message {
            Message::TradeReport(t) => {
                let e = self.symbols.entry(t.symbol).or_default();
                e.trade_volume += u64::from(t.size);
                e.trades += 1;
                widen(&mut e.trade_high, &mut e.trade_low, t.price);
            }
            Message::TradeBreak(t) => self.symbols.entry(t.symbol).or_default().broken_trades += 1,
            Message::PriceLevelUpdate(u) => {
                let e = self.symbols.entry(u.symbol).or_default();
                match u.side {
                    Side::Buy => widen(&mut e.bid_high, &mut e.bid_low, u.price),
                    Side::Sell => widen(&mut e.ask_high, &mut e.ask_low, u.price),
                }
            }
            Message::QuoteUpdate(q) => {
                let e = self.symbols.entry(q.symbol).or_default();
                if q.bid_size > 0 {
                    widen(&mut e.bid_high, &mut e.bid_low, q.bid_price);
                }
                if q.ask_size > 0 {
                    widen(&mut e.ask_high, &mut e.ask_low, q.ask_price);
                }
            }
            _ => {}
        }
    }

    /// The figures for one symbol, if it was seen.
    pub fn get(&self, symbol: &Symbol) -> Option<&SymbolAggregate> {
        self.symbols.get(symbol)
    }

    /// Traded volume over every symbol.
    pub fn total_trade_volume(&self) -> u64 {
        self.symbols.values().map(|a| a.trade_volume).sum()
    }

    /// The symbols with a trade or a quote, sorted by symbol.
    pub fn active(&self) -> Vec<(Symbol, SymbolAggregate)> {
        let mut out: Vec<_> = self.symbols.iter().filter(|(_, a)| a.is_active()).map(|(s, a)| (*s, *a)).collect();
        out.sort_unstable_by_key(|(s, _)| *s);
        out
    }

    /// Folds another aggregator into this one.
    pub fn merge(&mut self, other: &Aggregator) {
        for (symbol, aggregate) in &other.symbols {
            self.symbols.entry(*symbol).or_default().merge(aggregate);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{PriceLevelUpdate, QuoteUpdate, Trade};

    fn sym(s: &str) -> Symbol {
        Symbol::new(s).unwrap()
    }

    #[test]
    fn follows_the_rules() {
        let mut agg = Aggregator::new();
        let trade = |size, price| Trade {
            sale_condition: 0,
            timestamp: 0,
            symbol: sym("AA"),
            size,
            price: Price(price),
            trade_id: 1,
        };
        agg.apply(&Message::TradeReport(trade(100, 50)));
        agg.apply(&Message::TradeReport(trade(20, 70)));
        agg.apply(&Message::TradeBreak(trade(20, 999)));
        let level = |side, size, price| {
            Message::PriceLevelUpdate(PriceLevelUpdate {
                side,
                event_flags: 1,
                timestamp: 0,
                symbol: sym("AA"),
                size,
                price: Price(price),
            })
        };
        agg.apply(&level(Side::Buy, 0, 10));
        agg.apply(&level(Side::Buy, 100, 30));
        agg.apply(&level(Side::Sell, 100, 90));
        let quote = |bid_size, ask_size| {
            Message::QuoteUpdate(QuoteUpdate {
                flags: 0,
                timestamp: 0,
                symbol: sym("Q"),
                bid_size,
                bid_price: Price(5),
                ask_price: Price(6),
                ask_size,
            })
        };
        agg.apply(&quote(0, 100));
        let a = agg.get(&sym("AA")).unwrap();
        assert_eq!((a.trade_volume, a.trades, a.broken_trades), (120, 2, 1));
        assert_eq!((a.trade_high, a.trade_low), (Some(Price(70)), Some(Price(50))));
        assert_eq!((a.bid_high, a.bid_low), (Some(Price(30)), Some(Price(10))));
        assert_eq!((a.ask_high, a.ask_low), (Some(Price(90)), Some(Price(90))));
        let q = agg.get(&sym("Q")).unwrap();
        assert_eq!((q.bid_high, q.ask_low), (None, Some(Price(6))));
        assert_eq!(agg.total_trade_volume(), 120);
        assert_eq!(agg.active().len(), 2);

        let mut merged = Aggregator::new();
        merged.merge(&agg);
        merged.merge(&agg);
        assert_eq!(merged.get(&sym("AA")).unwrap().trade_volume, 240);
        assert_eq!(merged.get(&sym("AA")).unwrap().trade_high, Some(Price(70)));
    }
}
