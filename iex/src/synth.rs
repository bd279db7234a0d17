//! A synthetic IEX DEEP 1.0 trading day, deterministic for a seed.
//!
//! The day follows IEX's schedule (times in US Eastern, summer time): start of messages 07:00,
//! security directory, trading status, operational halt and short-sale test status for every
//! symbol; start of system hours 08:00; opening auction information 09:29; start of regular
//! hours 09:30 with official opening prices and opening-process events; then the bulk of the
//! messages: price level updates and trade reports (and a few trade breaks) from per-symbol random
//! walks with lot-sized quantities, spread over the session with exponential gaps and skewed
//! symbol popularity; end of regular hours 16:00 with official closing prices; end of system
//! hours 17:00 and end of messages. Segments carry consecutive sequence numbers, stream offsets
//! and send times, and a heartbeat goes out for every idle second, as IEX does.
//!
//! The generator holds no more than one segment and the per-symbol state, whatever the size.

use crate::iextp::{self, SegmentBuilder, SegmentHeader};
use crate::message::{
    AuctionInformation, Message, OfficialPrice, OperationalHaltStatus, PriceLevelUpdate, SecurityDirectory,
    SecurityEvent, ShortSalePriceTestStatus, Side, SystemEvent, Trade, TradingStatus,
};
use crate::price::{Price, Symbol};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::collections::HashSet;

const SECOND: i64 = 1_000_000_000;
/// 2024-06-03 00:00 UTC, a Monday; Eastern summer time is UTC-4.
const DEFAULT_DAY: i64 = 1_717_372_800 * SECOND;
const EASTERN_OFFSET: i64 = 4 * 3600 * SECOND;
/// Largest payload per segment, so a frame stays inside a 1500-byte MTU.
const MAX_PAYLOAD: usize = 1400;

fn eastern(day: i64, hour: i64, minute: i64) -> i64 {
    day + EASTERN_OFFSET + (hour * 3600 + minute * 60) * SECOND
}

/// What to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynthConfig {
    /// Messages in the day, exactly (heartbeats are not messages).
    pub messages: u64,
    /// Distinct symbols.
    pub symbols: usize,
    /// Seed: the same seed gives the same bytes.
    pub seed: u64,
    /// Midnight UTC of the trading day, ns since the epoch.
    pub day: i64,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig { messages: 1_000_000, symbols: 50, seed: 1, day: DEFAULT_DAY }
    }
}

impl SynthConfig {
    /// Messages the schedule needs besides the trading ones: 6 system events and 9 per symbol.
    pub fn overhead(&self) -> u64 {
        6 + 9 * self.symbols as u64
    }
}

/// A configuration the generator cannot honour.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SynthError {
    /// Fewer messages than the schedule needs.
    #[error(
        "{messages} messages is too few for {symbols} symbols: the day's schedule alone takes {needed}; ask for more messages or fewer symbols"
    )]
    TooFewMessages {
        /// Asked for.
        messages: u64,
        /// Symbols asked for.
        symbols: usize,
        /// The minimum.
        needed: u64,
    },
    /// No symbols, or more than 1-4 letter tickers can name.
    #[error("--symbols must be between 1 and 100000, got {0}")]
    Symbols(usize),
}

/// One generated segment.
#[derive(Clone, Copy, Debug)]
pub struct SyntheticSegment<'a> {
    /// The segment's send time (ns since the epoch); a capture stamps it a little later.
    pub send_time: i64,
    /// The IEX-TP segment bytes (the UDP payload).
    pub bytes: &'a [u8],
}

#[derive(Clone, Debug)]
struct Book {
    symbol: Symbol,
    /// Mid price in cents.
    mid: i64,
    /// Half spread in cents (>= 1).
    half_spread: i64,
    last_trade: Option<Trade>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Prelude,
    Trading,
    Close,
    EndOfDay,
    Done,
}

/// Streams the segments of a synthetic day.
pub struct SyntheticDay {
    config: SynthConfig,
    rng: Pcg64Mcg,
    books: Vec<Book>,
    phase: Phase,
    /// Messages of the current burst not yet put into a segment.
    burst: Vec<Message<'static>>,
    burst_time: i64,
    /// Next symbol for the per-symbol parts of the schedule.
    cursor: usize,
    remaining_trading: u64,
    session_end: i64,
    mean_gap_ns: f64,
    now: i64,
    last_send: i64,
    next_sequence: i64,
    stream_offset: i64,
    next_trade_id: i64,
    session_id: u32,
    builder: SegmentBuilder,
}

fn tickers(rng: &mut Pcg64Mcg, count: usize) -> Vec<Symbol> {
    let mut seen = HashSet::with_capacity(count);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let len = match count {
            0..=20 => rng.random_range(1..=4),
            21..=400 => rng.random_range(2..=4),
            _ => rng.random_range(3..=4),
        };
        let text: String = (0..len).map(|_| char::from(b'A' + rng.random_range(0..26u8))).collect();
        if seen.insert(text.clone()) {
            out.push(Symbol::new(&text).expect("1-4 ASCII letters fit a symbol"));
        }
    }
    out.sort();
    out
}

impl SyntheticDay {
    /// A generator for `config`.
    pub fn new(config: SynthConfig) -> Result<Self, SynthError> {
        if config.symbols == 0 || config.symbols > 100_000 {
            return Err(SynthError::Symbols(config.symbols));
        }
        if config.messages < config.overhead() {
            return Err(SynthError::TooFewMessages {
                messages: config.messages,
                symbols: config.symbols,
                needed: config.overhead(),
            });
        }
        let mut rng = Pcg64Mcg::seed_from_u64(config.seed);
        let books = tickers(&mut rng, config.symbols)
            .into_iter()
            .map(|symbol| {
                // Log-uniform between $5 and $500, so low-priced names are as common as in reality.
                let dollars = (5f64.ln() + rng.random::<f64>() * (100f64).ln()).exp();
                let mid = (dollars * 100.0).round() as i64;
                Book { symbol, mid, half_spread: rng.random_range(1..=3), last_trade: None }
            })
            .collect();
        let remaining_trading = config.messages - config.overhead();
        let session_start = eastern(config.day, 9, 30);
        let session_end = eastern(config.day, 16, 0);
        // Bursts average about 1.9 messages.
        let bursts = (remaining_trading as f64 / 1.9).max(1.0);
        let session_id = 0x4d44_0000 | (config.seed as u32 & 0xffff);
        Ok(SyntheticDay {
            config,
            rng,
            books,
            phase: Phase::Prelude,
            burst: Vec::with_capacity(64),
            burst_time: 0,
            cursor: 0,
            remaining_trading,
            session_end,
            mean_gap_ns: (session_end - session_start - SECOND) as f64 / bursts,
            now: eastern(config.day, 7, 0),
            last_send: eastern(config.day, 7, 0),
            next_sequence: 1,
            stream_offset: 0,
            next_trade_id: 1,
            session_id,
            builder: SegmentBuilder::new(),
        })
    }

    /// The symbols of the day, sorted.
    pub fn symbols(&self) -> Vec<Symbol> {
        self.books.iter().map(|b| b.symbol).collect()
    }

    fn system(&mut self, event: u8, time: i64) {
        self.burst.push(Message::SystemEvent(SystemEvent { event, timestamp: time }));
    }

    /// Pushes book `index`'s official price of `price_type` (its mid) and the security event
    /// `event` that follows it, both at the burst's time.
    fn official_price(&mut self, index: usize, price_type: u8, event: u8) {
        let b = &self.books[index];
        let (timestamp, symbol) = (self.burst_time, b.symbol);
        self.burst.push(Message::OfficialPrice(OfficialPrice {
            price_type,
            timestamp,
            symbol,
            price: Price::from_cents(b.mid),
        }));
        self.burst.push(Message::SecurityEvent(SecurityEvent { event, timestamp, symbol }));
    }

    /// Refills `burst` with the next messages of the schedule; false when the day is over.
    fn next_burst(&mut self) -> bool {
        let day = self.config.day;
        match self.phase {
            Phase::Prelude => {
                if self.cursor == 0 {
                    self.burst_time = eastern(day, 7, 0);
                    self.system(b'O', self.burst_time);
                    self.cursor = 1;
                    return true;
                }
                let i = self.cursor - 1;
                if i < self.books.len() {
                    // Reference data and statuses, one symbol per burst, a millisecond apart.
                    self.burst_time = eastern(day, 7, 0) + (i as i64 + 1) * 1_000_000;
                    let t = self.burst_time;
                    let b = &self.books[i];
                    let symbol = b.symbol;
                    self.burst.push(Message::SecurityDirectory(SecurityDirectory {
                        flags: 0,
                        timestamp: t,
                        symbol,
                        round_lot_size: 100,
                        adjusted_poc_price: Price::from_cents(b.mid),
                        luld_tier: 1,
                    }));
                    self.burst.push(Message::TradingStatus(TradingStatus {
                        status: b'T',
                        timestamp: t,
                        symbol,
                        reason: *b"    ",
                    }));
                    self.burst.push(Message::OperationalHaltStatus(OperationalHaltStatus {
                        status: b'N',
                        timestamp: t,
                        symbol,
                    }));
                    self.burst.push(Message::ShortSalePriceTestStatus(ShortSalePriceTestStatus {
                        in_effect: 0,
                        timestamp: t,
                        symbol,
                        detail: b' ',
                    }));
                    self.cursor += 1;
                    return true;
                }
                let i = i - self.books.len();
                if i == 0 {
                    self.burst_time = eastern(day, 8, 0);
                    self.system(b'S', self.burst_time);
                } else if i <= self.books.len() {
                    self.burst_time = eastern(day, 9, 29) + i as i64 * 1_000_000;
                    let b = &self.books[i - 1];
                    let reference = Price::from_cents(b.mid);
                    let collar = Price::from_cents(b.mid / 10);
                    self.burst.push(Message::AuctionInformation(AuctionInformation {
                        auction_type: b'O',
                        timestamp: self.burst_time,
                        symbol: b.symbol,
                        paired_shares: 100 * self.rng.random_range(1..=50),
                        reference_price: reference,
                        indicative_clearing_price: reference,
                        imbalance_shares: 100 * self.rng.random_range(0..=10),
                        imbalance_side: [b'B', b'S', b'N'][self.rng.random_range(0..3)],
                        extension_number: 0,
                        scheduled_auction_time: (eastern(day, 9, 30) / SECOND) as u32,
                        auction_book_clearing_price: reference,
                        collar_reference_price: reference,
                        lower_auction_collar: Price(reference.0 - collar.0),
                        upper_auction_collar: Price(reference.0 + collar.0),
                    }));
                } else if i == self.books.len() + 1 {
                    self.burst_time = eastern(day, 9, 30);
                    self.system(b'R', self.burst_time);
                } else {
                    // Opening prints: official opening price and opening process complete.
                    let j = i - self.books.len() - 2;
                    self.burst_time = eastern(day, 9, 30) + (j as i64 + 1) * 1_000_000;
                    // Opening price ('Q') and opening process complete ('O').
                    self.official_price(j, b'Q', b'O');
                    if j + 1 == self.books.len() {
                        self.phase = Phase::Trading;
                        self.now = self.burst_time;
                        self.cursor = 0;
                        return true;
                    }
                }
                self.cursor += 1;
                true
            }
            Phase::Trading => {
                if self.remaining_trading == 0 {
                    self.phase = Phase::Close;
                    return self.next_burst();
                }
                self.trading_burst();
                true
            }
            Phase::Close => {
                if self.cursor == 0 {
                    self.burst_time = self.session_end.max(self.now + 1);
                    self.now = self.burst_time;
                    self.system(b'M', self.burst_time);
                } else {
                    self.burst_time = self.now + self.cursor as i64 * 1_000_000;
                    // Closing price ('M') and closing process complete ('C').
                    self.official_price(self.cursor - 1, b'M', b'C');
                    if self.cursor == self.books.len() {
                        self.phase = Phase::EndOfDay;
                        self.cursor = 0;
                        return true;
                    }
                }
                self.cursor += 1;
                true
            }
            Phase::EndOfDay => {
                self.burst_time = eastern(day, 17, 0).max(self.now + SECOND) + self.cursor as i64 * SECOND;
                self.system(if self.cursor == 0 { b'E' } else { b'C' }, self.burst_time);
                self.cursor += 1;
                if self.cursor == 2 {
                    self.phase = Phase::Done;
                }
                true
            }
            Phase::Done => false,
        }
    }

    /// One market event on one symbol: a few price level updates, or trades with the book change
    /// they cause, or (rarely) the break of an earlier trade.
    fn trading_burst(&mut self) {
        let gap = -self.mean_gap_ns * (1.0 - self.rng.random::<f64>()).ln();
        self.now += (gap as i64).max(1);
        self.burst_time = self.now;
        let t = self.now;
        let n = self.books.len();
        // Popularity skew: low indices trade far more often, as a few names dominate real volume.
        let u: f64 = self.rng.random();
        let index = ((u * u * u) * n as f64) as usize % n;
        let budget = self.remaining_trading.min(6) as usize;
        let roll: u32 = self.rng.random_range(0..10_000);
        let rng = &mut self.rng;
        let book = &mut self.books[index];
        let symbol = book.symbol;
        // The random walk: the mid moves a tick now and then, never below a dollar.
        if rng.random_range(0..4) == 0 {
            book.mid = (book.mid + if rng.random() { 1 } else { -1 }).max(100);
        }
        if roll < 8 && book.last_trade.is_some() {
            let mut broken = book.last_trade.take().expect("checked above");
            broken.timestamp = t;
            self.burst.push(Message::TradeBreak(broken));
        } else if roll < 4000 {
            let trades = rng.random_range(1..=3usize).min(budget.saturating_sub(1).max(1));
            let buy = rng.random::<bool>();
            let price = if buy { book.mid + book.half_spread } else { book.mid - book.half_spread };
            for _ in 0..trades {
                let odd = rng.random_range(0..5) == 0;
                let size = if odd { rng.random_range(1..100) } else { 100 * rng.random_range(1..=10) };
                let trade = Trade {
                    sale_condition: if odd { 0x20 } else { 0 },
                    timestamp: t,
                    symbol,
                    size,
                    price: Price::from_cents(price),
                    trade_id: self.next_trade_id,
                };
                self.next_trade_id += 1;
                book.last_trade = Some(trade);
                self.burst.push(Message::TradeReport(trade));
            }
            if self.burst.len() < budget {
                let side = if buy { Side::Sell } else { Side::Buy };
                let size = 100 * rng.random_range(0..=20);
                let update = PriceLevelUpdate {
                    side,
                    event_flags: 1,
                    timestamp: t,
                    symbol,
                    size,
                    price: Price::from_cents(price),
                };
                self.burst.push(Message::PriceLevelUpdate(update));
            }
        } else {
            let updates = rng.random_range(1..=4usize).min(budget);
            for k in 0..updates {
                let side = if rng.random() { Side::Buy } else { Side::Sell };
                let depth = rng.random_range(0..5);
                let cents = match side {
                    Side::Buy => book.mid - book.half_spread - depth,
                    Side::Sell => book.mid + book.half_spread + depth,
                };
                let size = if rng.random_range(0..10) == 0 { 0 } else { 100 * rng.random_range(1..=30) };
                let event_flags = u8::from(k + 1 == updates);
                let update = PriceLevelUpdate {
                    side,
                    event_flags,
                    timestamp: t,
                    symbol,
                    size,
                    price: Price::from_cents(cents.max(1)),
                };
                self.burst.push(Message::PriceLevelUpdate(update));
            }
        }
        self.remaining_trading -= self.burst.len() as u64;
    }

    fn header(&self, send_time: i64) -> SegmentHeader {
        SegmentHeader {
            version: 1,
            protocol_id: iextp::protocol::DEEP,
            channel_id: 1,
            session_id: self.session_id,
            payload_length: 0,
            message_count: 0,
            stream_offset: self.stream_offset,
            first_sequence: self.next_sequence,
            send_time,
        }
    }

    /// The next segment (a heartbeat or messages), or `None` when the day is over.
    pub fn next_segment(&mut self) -> Option<SyntheticSegment<'_>> {
        if self.burst.is_empty() && !self.next_burst() {
            return None;
        }
        // Send a little after the event; a heartbeat for every idle second before it.
        let send_time = self.burst_time + 5_000;
        if send_time - self.last_send > SECOND {
            self.last_send += SECOND;
            let header = self.header(self.last_send);
            self.builder.start();
            let bytes = self.builder.finish(header);
            return Some(SyntheticSegment { send_time: self.last_send, bytes });
        }
        self.builder.start();
        let mut taken = 0;
        for message in &self.burst {
            if taken > 0 && self.builder.len() - iextp::HEADER_LEN + 2 + message.iex_len() > MAX_PAYLOAD {
                break;
            }
            self.builder.push(message);
            taken += 1;
        }
        self.burst.drain(..taken);
        let header = self.header(send_time);
        self.next_sequence += taken as i64;
        self.stream_offset += (self.builder.len() - iextp::HEADER_LEN) as i64;
        self.last_send = send_time;
        let bytes = self.builder.finish(header);
        Some(SyntheticSegment { send_time, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iextp::Segment;
    use crate::inspect::Inspector;

    fn run(config: SynthConfig) -> (Vec<Vec<u8>>, crate::inspect::InspectReport) {
        let mut day = SyntheticDay::new(config).unwrap();
        let mut segments = Vec::new();
        let mut inspector = Inspector::new("synthetic");
        while let Some(s) = day.next_segment() {
            let seg = Segment::parse(s.bytes).unwrap();
            assert_eq!(seg.header.send_time, s.send_time);
            inspector.segment(&seg, 0);
            segments.push(s.bytes.to_vec());
        }
        (segments, inspector.finish())
    }

    #[test]
    fn exact_message_count_consecutive_sequences_and_determinism() {
        let config = SynthConfig { messages: 5_000, symbols: 7, seed: 42, ..Default::default() };
        let (a, report) = run(config);
        assert_eq!(report.messages, 5_000);
        assert_eq!(report.unknown_messages + report.malformed_messages + report.length_overruns, 0);
        assert_eq!(report.sequence, crate::sequence::SequenceCounts::default());
        assert_eq!(report.message_types["S"], 6);
        assert_eq!(report.message_types["D"], 7);
        assert!(report.heartbeats > 3600, "idle seconds before the open and after the close get heartbeats");
        assert_eq!(report.symbols_with_trades_or_quotes, 7);
        let (b, _) = run(config);
        assert_eq!(a, b, "the same seed gives the same bytes");
        let (c, _) = run(SynthConfig { seed: 43, ..config });
        assert_ne!(a, c);
        // Stream offsets advance by each payload's length.
        let mut offset = 0;
        for bytes in &a {
            let seg = Segment::parse(bytes).unwrap();
            assert_eq!(seg.header.stream_offset, offset);
            offset += i64::from(seg.header.payload_length);
        }
    }

    #[test]
    fn refuses_impossible_configurations() {
        let config = SynthConfig { messages: 10, symbols: 7, ..Default::default() };
        assert!(matches!(SyntheticDay::new(config), Err(SynthError::TooFewMessages { needed: 69, .. })));
        assert!(SyntheticDay::new(SynthConfig { symbols: 0, ..Default::default() }).is_err());
        // The minimum works and has no trading messages.
        let (_, report) = run(SynthConfig { messages: 69, symbols: 7, ..Default::default() });
        assert_eq!(report.messages, 69);
    }
}
