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
use crate::symbol_table::SymbolTable;
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

impl SymbolAggregate {
    /// True when the symbol had a trade or a quote: the symbols reports list.
    pub fn is_active(&self) -> bool {
        self.trades > 0 || self.bid_high.is_some() || self.ask_high.is_some()
    }
}

/// Writes symbols and their aggregates as an aligned text table, prices in dollars; nothing for
/// an empty list.
pub fn write_symbol_table(f: &mut impl std::fmt::Write, symbols: &[(Symbol, SymbolAggregate)]) -> std::fmt::Result {
    if symbols.is_empty() {
        return Ok(());
    }
    let row = |f: &mut dyn std::fmt::Write, cells: [&str; 10]| {
        writeln!(
            f,
            "  {:<8} {:>12} {:>8} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6], cells[7], cells[8], cells[9]
        )
    };
    writeln!(f)?;
    row(
        f,
        [
            "symbol",
            "volume",
            "trades",
            "breaks",
            "trade high",
            "trade low",
            "bid high",
            "bid low",
            "ask high",
            "ask low",
        ],
    )?;
    let p = |p: Option<Price>| p.map_or_else(|| "-".to_string(), |p| p.to_string());
    for (symbol, a) in symbols {
        let cells = [
            // The symbol is the peer's: a control byte in it is shown escaped.
            crate::peer_text::escape(&symbol.to_text()).into_owned(),
            a.trade_volume.to_string(),
            a.trades.to_string(),
            a.broken_trades.to_string(),
            p(a.trade_high),
            p(a.trade_low),
            p(a.bid_high),
            p(a.bid_low),
            p(a.ask_high),
            p(a.ask_low),
        ];
        row(f, cells.each_ref().map(String::as_str))?;
    }
    Ok(())
}

/// Running figures for one symbol, in the shape that is cheapest to update: highs and lows start
/// at the extremes so updating them is a branch-free max/min, and a bit per side records whether
/// it was ever set (a price may legitimately equal an extreme).
#[derive(Clone, Copy, Debug)]
struct Running {
    trade_volume: u64,
    trades: u64,
    broken_trades: u64,
    high: [i64; 3],
    low: [i64; 3],
    seen: u8,
}

const TRADE: usize = 0;
const BID: usize = 1;
const ASK: usize = 2;

impl Running {
    const EMPTY: Running =
        Running { trade_volume: 0, trades: 0, broken_trades: 0, high: [i64::MIN; 3], low: [i64::MAX; 3], seen: 0 };

    #[inline(always)]
    fn widen(&mut self, side: usize, price: Price) {
        self.high[side] = self.high[side].max(price.0);
        self.low[side] = self.low[side].min(price.0);
        self.seen |= 1 << side;
    }

    fn get(&self, side: usize) -> (Option<Price>, Option<Price>) {
        if self.seen & (1 << side) == 0 {
            (None, None)
        } else {
            (Some(Price(self.high[side])), Some(Price(self.low[side])))
        }
    }

    fn to_aggregate(self) -> SymbolAggregate {
        let (trade_high, trade_low) = self.get(TRADE);
        let (bid_high, bid_low) = self.get(BID);
        let (ask_high, ask_low) = self.get(ASK);
        SymbolAggregate {
            trade_volume: self.trade_volume,
            trades: self.trades,
            broken_trades: self.broken_trades,
            trade_high,
            trade_low,
            bid_high,
            bid_low,
            ask_high,
            ask_low,
        }
    }
}

/// Aggregates for every symbol seen.
#[derive(Clone, Debug, Default)]
pub struct Aggregator {
    symbols: SymbolTable<Running>,
}

impl Aggregator {
    /// An empty aggregator.
    pub fn new() -> Self {
        Self::default()
    }

    #[inline(always)]
    fn running(&mut self, symbol: Symbol) -> &mut Running {
        self.symbols.entry(symbol, || Running::EMPTY)
    }

    /// Applies one message; messages that carry no trade or quote are ignored.
    #[inline(always)]
    pub fn apply(&mut self, message: &Message<'_>) {
        match message {
            Message::TradeReport(t) => {
                let e = self.running(t.symbol);
                e.trade_volume += u64::from(t.size);
                e.trades += 1;
                e.widen(TRADE, t.price);
            }
            Message::TradeBreak(t) => self.running(t.symbol).broken_trades += 1,
            Message::PriceLevelUpdate(u) => {
                let side = match u.side {
                    Side::Buy => BID,
                    Side::Sell => ASK,
                };
                self.running(u.symbol).widen(side, u.price);
            }
            Message::QuoteUpdate(q) => {
                let e = self.running(q.symbol);
                if q.bid_size > 0 {
                    e.widen(BID, q.bid_price);
                }
                if q.ask_size > 0 {
                    e.widen(ASK, q.ask_price);
                }
            }
            _ => {}
        }
    }

    /// The figures for one symbol, if it was seen.
    pub fn get(&self, symbol: &Symbol) -> Option<SymbolAggregate> {
        self.symbols.get(symbol).map(|r| r.to_aggregate())
    }

    /// Traded volume over every symbol.
    pub fn total_trade_volume(&self) -> u64 {
        self.symbols.iter().map(|(_, r)| r.trade_volume).sum()
    }

    /// The symbols with a trade or a quote, sorted by symbol.
    pub fn active(&self) -> Vec<(Symbol, SymbolAggregate)> {
        let mut out: Vec<_> =
            self.symbols.iter().map(|(s, r)| (*s, r.to_aggregate())).filter(|(_, a)| a.is_active()).collect();
        out.sort_unstable_by_key(|(s, _)| *s);
        out
    }

    /// Every symbol seen with its figures, in the order first seen (symbols with only a trade
    /// break included, which [`Aggregator::active`] leaves out).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Symbol, SymbolAggregate)> + '_ {
        self.symbols.iter().map(|(s, r)| (*s, r.to_aggregate()))
    }

    /// Folds one symbol's figures into this aggregator (a snapshot's, before the stream after
    /// it): volumes and counts add up, highs and lows widen.
    pub fn add(&mut self, symbol: Symbol, figures: &SymbolAggregate) {
        let ours = self.running(symbol);
        ours.trade_volume = ours.trade_volume.saturating_add(figures.trade_volume);
        ours.trades = ours.trades.saturating_add(figures.trades);
        ours.broken_trades = ours.broken_trades.saturating_add(figures.broken_trades);
        for (side, high, low) in [
            (TRADE, figures.trade_high, figures.trade_low),
            (BID, figures.bid_high, figures.bid_low),
            (ASK, figures.ask_high, figures.ask_low),
        ] {
            for price in [high, low].into_iter().flatten() {
                ours.widen(side, price);
            }
        }
    }

    /// Folds another aggregator into this one.
    pub fn merge(&mut self, other: &Aggregator) {
        for (symbol, theirs) in other.symbols.iter() {
            let ours = self.running(*symbol);
            ours.trade_volume += theirs.trade_volume;
            ours.trades += theirs.trades;
            ours.broken_trades += theirs.broken_trades;
            for side in [TRADE, BID, ASK] {
                if theirs.seen & (1 << side) != 0 {
                    ours.widen(side, Price(theirs.high[side]));
                    ours.widen(side, Price(theirs.low[side]));
                }
            }
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

    #[test]
    fn many_symbols_sharing_cache_lines_keep_their_own_figures() {
        // Far more symbols than cache lines, interleaved, so lines are evicted and refilled.
        let symbols: Vec<Symbol> = (0..2000).map(|i| sym(&format!("S{i}"))).collect();
        let mut agg = Aggregator::new();
        for round in 0..3u32 {
            for (i, &symbol) in symbols.iter().enumerate() {
                let trade = Trade {
                    sale_condition: 0,
                    timestamp: 0,
                    symbol,
                    size: i as u32 + round,
                    price: Price(i as i64),
                    trade_id: 0,
                };
                agg.apply(&Message::TradeReport(trade));
            }
        }
        for (i, symbol) in symbols.iter().enumerate() {
            let a = agg.get(symbol).unwrap();
            assert_eq!((a.trades, a.trade_volume), (3, 3 * i as u64 + 3), "{symbol}");
            assert_eq!(a.trade_high, Some(Price(i as i64)));
        }
        assert_eq!(agg.active().len(), 2000);
    }
}
