//! Snapshots for late joiners: the state the stream implies as of one frame (every symbol's
//! book and status, the day aggregates, and the stream's counts), written as records of frames
//! in the stream's own format, and read back.
//!
//! A snapshot is carried as IEX messages, so each of the eight formats carries it as it carries
//! the stream, and it is sealed like any frame under `[protection]`. Per symbol, in symbol order:
//! its day aggregate (a message of type [`AGGREGATE_TYPE`], laid out in docs/protocol.md), its
//! last trading status, operational halt and short-sale test messages, a price level update per
//! level (the last of them with the book's consistency as its event flag), its last trade report
//! and its last TOPS quote. Applied in order to empty books they give the same books; the
//! aggregate messages give the same aggregates.
//!
//! On a TCP connection a snapshot is one or more `SNAPSHOT` records of frames (the header's
//! sequence is the frame the state is as of), then a `SNAPSHOT` record with no frames whose
//! payload is the stream's [`Totals`] as of that frame, which ends it. The stream follows from
//! the frame after it, as a resume would.

use super::protect::{MAX_SNAPSHOT_FRAMES, ProtectError, Protector};
use super::wire::{RecordHeader, RecordTag, RelayError, Totals};
use mdrelay_codec::{BatchHeader, Codec, DecodeError, EncodeError, Format, FormatCodec};
use mdrelay_iex::aggregate::{Aggregator, SymbolAggregate};
use mdrelay_iex::book::Books;
use mdrelay_iex::counts::TypeCounts;
use mdrelay_iex::message::{Message, PriceLevelUpdate, Side, UnknownMessage};
use mdrelay_iex::price::{Price, Symbol};
use std::fmt;

/// The type byte of a snapshot's day-aggregate message: not an IEX type (IEX's are ASCII).
pub const AGGREGATE_TYPE: u8 = 0xf0;

/// Bytes of a day-aggregate message.
pub const AGGREGATE_LEN: usize = 90;

/// Messages per snapshot frame, at most.
pub const FRAME_MESSAGES: usize = 1024;

/// Payload bytes after which a `SNAPSHOT` record is closed and another started.
pub const RECORD_BYTES: usize = 1 << 20;

/// What a stream implies as of one frame: books, day aggregates and counts.
#[derive(Clone, Debug, Default)]
pub struct MarketState {
    /// Every symbol's book and status.
    pub books: Books,
    /// Every symbol's day aggregates.
    pub aggregates: Aggregator,
    /// Frames of the stream up to `as_of`.
    pub frames: u64,
    /// Messages in them.
    pub messages: u64,
    /// Those messages by type byte.
    pub types: TypeCounts,
    /// The last frame applied (0: none yet).
    pub as_of: u64,
}

impl MarketState {
    /// Nothing applied yet.
    pub fn new() -> MarketState {
        MarketState::default()
    }

    /// Applies frame `sequence` and its messages.
    pub fn apply_frame(&mut self, sequence: u64, messages: &[Message<'_>]) {
        self.frames += 1;
        self.messages += messages.len() as u64;
        for message in messages {
            self.types.add(message.kind());
            self.books.apply(message);
            self.aggregates.apply(message);
        }
        self.as_of = sequence;
    }

    /// The stream's counts up to `as_of`, as an `END` carries them.
    pub fn totals(&self) -> Totals {
        Totals { frames: self.frames, messages: self.messages, by_type: self.types.by_byte(), truncated: false }
    }
}

/// The day-aggregate message of `symbol`: byte 0 [`AGGREGATE_TYPE`], byte 1 which prices are
/// set (bit 0 trades, 1 bids, 2 asks), bytes 2..10 zero (where IEX messages have a timestamp),
/// 10..18 the symbol, then u64 volume, trades and breaks, and i64 trade high and low, bid high
/// and low, ask high and low (0 where not set), all little-endian.
pub fn aggregate_message(symbol: Symbol, a: &SymbolAggregate) -> [u8; AGGREGATE_LEN] {
    let mut b = [0u8; AGGREGATE_LEN];
    b[0] = AGGREGATE_TYPE;
    let set = |pair: (Option<Price>, Option<Price>)| pair.0.is_some() && pair.1.is_some();
    b[1] = u8::from(set((a.trade_high, a.trade_low)))
        | u8::from(set((a.bid_high, a.bid_low))) << 1
        | u8::from(set((a.ask_high, a.ask_low))) << 2;
    b[10..18].copy_from_slice(&symbol.0);
    b[18..26].copy_from_slice(&a.trade_volume.to_le_bytes());
    b[26..34].copy_from_slice(&a.trades.to_le_bytes());
    b[34..42].copy_from_slice(&a.broken_trades.to_le_bytes());
    let prices = [a.trade_high, a.trade_low, a.bid_high, a.bid_low, a.ask_high, a.ask_low];
    for (i, price) in prices.iter().enumerate() {
        let at = 42 + 8 * i;
        b[at..at + 8].copy_from_slice(&price.map_or(0, |p| p.0).to_le_bytes());
    }
    b
}

/// Reads a day-aggregate message; `None` when it is not one (another type, or too short).
pub fn parse_aggregate(bytes: &[u8]) -> Option<(Symbol, SymbolAggregate)> {
    let b: &[u8; AGGREGATE_LEN] = bytes.first_chunk()?;
    if b[0] != AGGREGATE_TYPE {
        return None;
    }
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    let price = |at: usize, bit: u8| (b[1] & 1 << bit != 0).then(|| Price(u64_at(at) as i64));
    let symbol = Symbol(b[10..18].try_into().unwrap_or_default());
    Some((
        symbol,
        SymbolAggregate {
            trade_volume: u64_at(18),
            trades: u64_at(26),
            broken_trades: u64_at(34),
            trade_high: price(42, 0),
            trade_low: price(50, 0),
            bid_high: price(58, 1),
            bid_low: price(66, 1),
            ask_high: price(74, 2),
            ask_low: price(82, 2),
        },
    ))
}

/// Every symbol's snapshot messages, in symbol order; aggregate messages borrow from `arena`.
fn snapshot_messages<'a>(state: &'a MarketState, arena: &'a mut Vec<[u8; AGGREGATE_LEN]>) -> Vec<Message<'a>> {
    let mut symbols: Vec<Symbol> = state.books.iter().map(|(s, _)| s).collect();
    symbols.extend(state.aggregates.iter().map(|(s, _)| s));
    symbols.sort_unstable();
    symbols.dedup();
    arena.clear();
    arena.extend(symbols.iter().filter_map(|s| state.aggregates.get(s).map(|a| aggregate_message(*s, &a))));
    let mut aggregates = arena.iter();
    let mut out = Vec::new();
    for symbol in symbols {
        if state.aggregates.get(&symbol).is_some()
            && let Some(bytes) = aggregates.next()
        {
            out.push(Message::Unknown(UnknownMessage { kind: AGGREGATE_TYPE, bytes }));
        }
        let Some(book) = state.books.get(&symbol) else { continue };
        out.extend(book.trading_status.map(Message::TradingStatus));
        out.extend(book.operational_halt.map(Message::OperationalHaltStatus));
        out.extend(book.short_sale_test.map(Message::ShortSalePriceTestStatus));
        let level = |side, price, size, event_flags| {
            Message::PriceLevelUpdate(PriceLevelUpdate { side, event_flags, timestamp: 0, symbol, size, price })
        };
        let start = out.len();
        out.extend(book.bids().map(|l| level(Side::Buy, l.price, l.size, 0)));
        out.extend(book.asks().map(|l| level(Side::Sell, l.price, l.size, 0)));
        if let Some(consistent) = book.consistent {
            let flag = u8::from(consistent);
            match out[start..].last_mut() {
                Some(Message::PriceLevelUpdate(last)) => last.event_flags = flag,
                // No level left: an update that removes none says how the book stands.
                _ => out.push(level(Side::Buy, Price(0), 0, flag)),
            }
        }
        out.extend(book.last_trade.map(Message::TradeReport));
        out.extend(book.quote.map(Message::QuoteUpdate));
    }
    out
}

/// The NATS subject a publisher of `subject` answers snapshot requests on. Under a prefix of
/// its own, so a JetStream stream that stores the stream's subjects (`md.>`, say) does not
/// store the requests too.
pub fn nats_snapshot_subject(subject: &str) -> String {
    format!("_MDRELAY.SNAPSHOT.{subject}")
}

/// How large a written snapshot came out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotSize {
    /// Symbols in it.
    pub symbols: usize,
    /// Messages.
    pub messages: usize,
    /// Frames.
    pub frames: u32,
    /// Record bytes, headers included.
    pub bytes: usize,
}

/// Writes `state` as `SNAPSHOT` records in `codec`'s format, each frame sealed by `protector`
/// for `session`, appending each record to `records`; stamps its frames `publish_time`.
pub fn write_snapshot(
    state: &MarketState,
    codec: &mut Codec,
    protector: &mut Protector,
    session: u64,
    publish_time: i64,
    records: &mut Vec<Vec<u8>>,
) -> Result<SnapshotSize, EncodeError> {
    write_snapshot_within(state, codec, protector, session, publish_time, RECORD_BYTES, records)
}

/// [`write_snapshot`] with payloads of at most `record_bytes` each (a transport's message
/// limit: NATS's `max_payload`); a frame larger than that alone cannot be sent, and is an
/// error.
pub fn write_snapshot_within(
    state: &MarketState,
    codec: &mut Codec,
    protector: &mut Protector,
    session: u64,
    publish_time: i64,
    record_bytes: usize,
    records: &mut Vec<Vec<u8>>,
) -> Result<SnapshotSize, EncodeError> {
    let mut arena = Vec::new();
    let messages = snapshot_messages(state, &mut arena);
    let format = codec.format();
    let (mut frame, mut payload, mut sealed) = (Vec::new(), Vec::new(), Vec::new());
    let mut size = SnapshotSize {
        symbols: state.books.len().max(state.aggregates.iter().len()),
        messages: messages.len(),
        ..SnapshotSize::default()
    };
    let mut in_record = 0u16;
    let mut close = |payload: &mut Vec<u8>, frames: u16, size: &mut SnapshotSize| {
        let header = RecordHeader {
            tag: RecordTag::Snapshot,
            format,
            frame_count: frames,
            length: payload.len() as u32,
            sequence: state.as_of,
        };
        let mut record = Vec::with_capacity(RecordHeader::LEN + payload.len());
        record.extend_from_slice(&header.to_bytes());
        record.append(payload);
        size.bytes += record.len();
        records.push(record);
    };
    for chunk in messages.chunks(FRAME_MESSAGES) {
        if size.frames >= MAX_SNAPSHOT_FRAMES {
            return Err(EncodeError::Unrepresentable {
                format,
                index: size.messages,
                what: "the snapshot needs more frames than a snapshot may have".into(),
            });
        }
        let header = BatchHeader { publish_time, ..BatchHeader::default() };
        frame.clear();
        codec.encode(&header, chunk, &mut frame)?;
        sealed.clear();
        protector.seal_snapshot(session, state.as_of, size.frames, &frame, &mut sealed);
        if sealed.len() > record_bytes {
            return Err(EncodeError::Unrepresentable {
                format,
                index: size.messages,
                what: format!("a snapshot frame of {} bytes, over the record limit of {record_bytes}", sealed.len())
                    .into(),
            });
        }
        if in_record > 0 && (payload.len() + sealed.len() > record_bytes || in_record == u16::MAX) {
            close(&mut payload, in_record, &mut size);
            in_record = 0;
        }
        payload.extend_from_slice(&sealed);
        size.frames += 1;
        in_record += 1;
    }
    if in_record > 0 {
        close(&mut payload, in_record, &mut size);
    }
    state.totals().write(&mut payload);
    close(&mut payload, 0, &mut size);
    Ok(size)
}

/// Why a snapshot could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// A record of another snapshot (as of another frame) or format among its records.
    Mixed {
        /// What the record said.
        what: String,
    },
    /// A frame that cannot be delimited, where.
    Undelimited {
        /// Offset in the record's payload.
        at: usize,
        /// Why.
        what: String,
    },
    /// A frame that fails its protection check.
    Unsealed {
        /// Its index in the snapshot.
        frame: u32,
        /// Why.
        error: ProtectError,
    },
    /// A frame that does not decode.
    Undecodable {
        /// Its index in the snapshot.
        frame: u32,
        /// Why.
        error: DecodeError,
    },
    /// The closing record's totals cannot be read.
    Totals(RelayError),
    /// More frames than a snapshot may have, or than the record declares.
    Frames {
        /// What was wrong.
        what: String,
    },
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Mixed { what } => write!(f, "a snapshot record out of place: {what}"),
            SnapshotError::Undelimited { at, what } => {
                write!(f, "a snapshot frame at payload byte {at} cannot be delimited: {what}")
            }
            SnapshotError::Unsealed { frame, error } => write!(f, "snapshot frame {frame} fails its check: {error}"),
            SnapshotError::Undecodable { frame, error } => write!(f, "snapshot frame {frame} does not decode: {error}"),
            SnapshotError::Totals(error) => write!(f, "the snapshot's closing totals cannot be read: {error}"),
            SnapshotError::Frames { what } => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

/// A snapshot read whole: the state as of its frame.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The state, with its books' count of messages applied set to the stream's.
    pub state: MarketState,
    /// The stream's counts as of the snapshot's frame, from its closing record.
    pub totals: Totals,
    /// Frames the snapshot itself took.
    pub frames: u32,
    /// Messages it took.
    pub messages: u64,
}

/// Two snapshots are the same snapshot when they stand for the same point of the stream (as of
/// the same frame, with the same counts) and took the same frames and messages; the state is
/// what those imply, and is not compared.
impl PartialEq for Snapshot {
    fn eq(&self, other: &Snapshot) -> bool {
        (self.state.as_of, &self.totals, self.frames, self.messages)
            == (other.state.as_of, &other.totals, other.frames, other.messages)
    }
}

impl Eq for Snapshot {}

/// Reads a snapshot's records in order into the state they carry.
pub struct SnapshotReader {
    state: MarketState,
    /// The snapshot's frame and format, from its first record.
    of: Option<(u64, Format)>,
    frames: u32,
    messages: u64,
    codec: Option<Codec>,
    scratch: Vec<u8>,
}

impl fmt::Debug for SnapshotReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotReader").field("of", &self.of).field("frames", &self.frames).finish_non_exhaustive()
    }
}

impl Default for SnapshotReader {
    fn default() -> Self {
        SnapshotReader::new()
    }
}

impl SnapshotReader {
    /// Nothing read yet.
    pub fn new() -> SnapshotReader {
        SnapshotReader { state: MarketState::new(), of: None, frames: 0, messages: 0, codec: None, scratch: Vec::new() }
    }

    /// Whether a snapshot has begun (a record of it was read).
    pub fn started(&self) -> bool {
        self.of.is_some()
    }

    /// Takes one `SNAPSHOT` record: its frames, or (with none) the closing totals, which give
    /// the whole snapshot. `limits` bound the decoding as the stream's do.
    pub fn record(
        &mut self,
        header: &RecordHeader,
        payload: &[u8],
        protector: &mut Protector,
        session: u64,
        limits: mdrelay_codec::Limits,
    ) -> Result<Option<Snapshot>, SnapshotError> {
        let (as_of, format) = *self.of.get_or_insert((header.sequence, header.format));
        if (as_of, format) != (header.sequence, header.format) {
            return Err(SnapshotError::Mixed {
                what: format!(
                    "a record as of frame {} in {} among records as of frame {as_of} in {format}",
                    header.sequence, header.format
                ),
            });
        }
        if header.frame_count == 0 {
            let totals = Totals::parse(payload).map_err(SnapshotError::Totals)?;
            let mut state = std::mem::take(&mut self.state);
            state.as_of = as_of;
            state.frames = totals.frames;
            state.messages = totals.messages;
            state.types = TypeCounts::new();
            for (&kind, &n) in &totals.by_type {
                state.types.add_many(kind, n);
            }
            state.books.set_messages_applied(totals.messages);
            let snapshot = Snapshot { state, totals, frames: self.frames, messages: self.messages };
            *self = SnapshotReader::new();
            return Ok(Some(snapshot));
        }
        let codec = self.codec.get_or_insert_with(|| Codec::new(format, limits));
        let mut at = 0usize;
        for _ in 0..header.frame_count {
            if self.frames >= MAX_SNAPSHOT_FRAMES {
                return Err(SnapshotError::Frames { what: format!("more than {MAX_SNAPSHOT_FRAMES} snapshot frames") });
            }
            let rest = &payload[at..];
            let len = if protector.protection().any() {
                protector.sealed_len(rest).map_err(|e| SnapshotError::Undelimited { at, what: e.to_string() })?
            } else {
                codec.frame_len(rest).map_err(|e| SnapshotError::Undelimited { at, what: e.to_string() })?
            };
            let Some(len) = len.filter(|&len| len > 0) else {
                return Err(SnapshotError::Undelimited { at, what: "the record ends inside the frame".into() });
            };
            let index = self.frames;
            let frame = protector
                .open_snapshot(session, as_of, index, &rest[..len], &mut self.scratch)
                .map_err(|error| SnapshotError::Unsealed { frame: index, error })?;
            let (state, messages) = (&mut self.state, &mut self.messages);
            codec
                .decode(frame, |m| {
                    *messages += 1;
                    match m {
                        Message::Unknown(u) if u.kind == AGGREGATE_TYPE => {
                            if let Some((symbol, figures)) = parse_aggregate(u.bytes) {
                                state.aggregates.add(symbol, &figures);
                            }
                        }
                        m => state.books.apply(m),
                    }
                })
                .map_err(|error| SnapshotError::Undecodable { frame: index, error })?;
            self.frames += 1;
            at += len;
        }
        if at != payload.len() {
            return Err(SnapshotError::Frames {
                what: format!(
                    "{} bytes after the {} frames the record declares",
                    payload.len() - at,
                    header.frame_count
                ),
            });
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::protect::{Protection, WireKey};
    use mdrelay_codec::Limits;
    use mdrelay_iex::book::BookJson;
    use mdrelay_iex::synth::{SynthConfig, SyntheticDay};

    /// A state from a synthetic day's first `segments` segments.
    fn state_of(segments: usize) -> MarketState {
        state_of_day(40, segments)
    }

    /// The state of a synthetic day of `symbols` symbols after `segments` segments.
    fn state_of_day(symbols: usize, segments: usize) -> MarketState {
        let mut state = MarketState::new();
        let config = SynthConfig { messages: 50_000, symbols, seed: 7, ..SynthConfig::default() };
        let mut day = SyntheticDay::new(config).unwrap();
        for sequence in 1..=segments as u64 {
            let Some(segment) = day.next_segment() else { break };
            let bytes = segment.bytes.to_vec();
            let segment = mdrelay_iex::iextp::Segment::parse(&bytes).unwrap();
            let list: Vec<_> = segment.blocks().map(|b| Message::parse(b.unwrap()).unwrap()).collect();
            state.apply_frame(sequence, &list);
        }
        state
    }

    fn books_json(books: &Books) -> Vec<(Symbol, serde_json::Value)> {
        books.sorted().into_iter().map(|(s, b)| (s, serde_json::to_value(BookJson(b)).unwrap())).collect()
    }

    /// Writes and reads `state` in every format, unprotected, with a CRC and encrypted.
    #[test]
    fn a_snapshot_read_back_is_the_state_it_was_written_from_in_every_format_and_protection() {
        let state = state_of(600);
        assert!(state.books.len() > 30 && state.as_of == 600);
        let key = WireKey::new([9; 32]);
        for format in Format::ALL {
            for (crc, key) in [(false, None), (true, None), (true, Some(&key))] {
                let mut protector = Protector::new(crc, key, 16 << 20);
                let mut codec = Codec::new(format, Limits::default());
                let mut records = Vec::new();
                let size = write_snapshot(&state, &mut codec, &mut protector, 0x5eed, 1, &mut records).unwrap();
                let context = format!("{format} {:?}", Protection { crc, encrypted: key.is_some() });
                let mut reader = SnapshotReader::new();
                let mut read = None;
                for record in &records {
                    let header = RecordHeader::parse(record, usize::MAX).unwrap();
                    let payload = &record[RecordHeader::LEN..];
                    assert!(read.is_none(), "{context}: records after the closing one");
                    read = reader.record(&header, payload, &mut protector, 0x5eed, Limits::default()).unwrap();
                }
                let snapshot = read.unwrap_or_else(|| panic!("{context}: no closing record"));
                assert_eq!(snapshot.frames, size.frames, "{context}");
                assert_eq!(snapshot.messages, size.messages as u64, "{context}");
                assert_eq!(snapshot.totals, state.totals(), "{context}");
                assert_eq!(snapshot.state.as_of, 600, "{context}");
                assert_eq!(books_json(&snapshot.state.books), books_json(&state.books), "{context}");
                assert_eq!(snapshot.state.books.messages_applied(), state.messages, "{context}");
                let (mut ours, mut theirs): (Vec<_>, Vec<_>) =
                    (snapshot.state.aggregates.iter().collect(), state.aggregates.iter().collect());
                ours.sort_unstable_by_key(|(s, _)| *s);
                theirs.sort_unstable_by_key(|(s, _)| *s);
                assert_eq!(ours, theirs, "{context}");
            }
        }
    }

    #[test]
    fn records_cut_to_a_transports_limit_hold_the_same_snapshot_and_a_frame_over_it_is_an_error() {
        // 2,000 symbols: a snapshot of several frames.
        let state = state_of_day(2_000, 6_000);
        let mut protector = Protector::new(true, None, 16 << 20);
        let mut codec = Codec::new(Format::Json, Limits::default());
        let mut whole = Vec::new();
        write_snapshot(&state, &mut codec, &mut protector, 7, 1, &mut whole).unwrap();
        // The smallest power of two that holds the largest frame: several frames to a record
        // no more.
        let mut write = |limit: usize, records: &mut Vec<Vec<u8>>| {
            write_snapshot_within(&state, &mut codec, &mut protector, 7, 1, limit, records)
        };
        let limit = (6..24).map(|b| 1usize << b).find(|&l| write(l, &mut Vec::new()).is_ok()).unwrap();
        let mut cut = Vec::new();
        write(limit, &mut cut).unwrap();
        let error = write(limit / 2, &mut Vec::new()).unwrap_err();
        assert!(error.to_string().contains(&format!("over the record limit of {}", limit / 2)), "{error}");
        assert!(cut.len() > whole.len(), "{} records against {} (limit {limit})", cut.len(), whole.len());
        assert!(cut.iter().all(|r| r.len() <= RecordHeader::LEN + limit), "every record within the limit");
        let mut reader = SnapshotReader::new();
        let read = cut.iter().find_map(|record| {
            let header = RecordHeader::parse(record, usize::MAX).unwrap();
            reader.record(&header, &record[RecordHeader::LEN..], &mut protector, 7, Limits::default()).unwrap()
        });
        assert_eq!(read.expect("the closing record").totals, state.totals());
    }

    #[test]
    fn a_frame_changed_on_the_way_or_sealed_for_another_snapshot_is_refused() {
        let state = state_of(100);
        let key = WireKey::new([3; 32]);
        let mut protector = Protector::new(true, Some(&key), 16 << 20);
        let mut codec = Codec::new(Format::Sbe, Limits::default());
        let mut records = Vec::new();
        write_snapshot(&state, &mut codec, &mut protector, 1, 1, &mut records).unwrap();
        let mut changed = records[0].clone();
        let last = changed.len() - 30;
        changed[last] ^= 1;
        let header = RecordHeader::parse(&changed, usize::MAX).unwrap();
        let error = SnapshotReader::new()
            .record(&header, &changed[RecordHeader::LEN..], &mut protector, 1, Limits::default())
            .unwrap_err();
        assert!(matches!(error, SnapshotError::Unsealed { .. }), "{error}");
        // The same bytes presented as a snapshot as of another frame: another nonce.
        let mut moved = records[0].clone();
        moved[8..16].copy_from_slice(&(state.as_of + 1).to_le_bytes());
        let header = RecordHeader::parse(&moved, usize::MAX).unwrap();
        let error = SnapshotReader::new()
            .record(&header, &moved[RecordHeader::LEN..], &mut protector, 1, Limits::default())
            .unwrap_err();
        assert!(matches!(error, SnapshotError::Unsealed { .. }), "{error}");
    }

    #[test]
    fn garbage_and_truncated_records_are_errors_not_panics() {
        let state = state_of(50);
        let mut protector = Protector::none();
        let mut codec = Codec::new(Format::FlatBuffers, Limits::default());
        let mut records = Vec::new();
        write_snapshot(&state, &mut codec, &mut protector, 1, 1, &mut records).unwrap();
        let record = &records[0];
        let header = RecordHeader::parse(record, usize::MAX).unwrap();
        for cut in [RecordHeader::LEN, RecordHeader::LEN + 3, record.len() / 2, record.len() - 1] {
            let result = SnapshotReader::new().record(
                &header,
                &record[RecordHeader::LEN..cut],
                &mut protector,
                1,
                Limits::default(),
            );
            assert!(result.is_err(), "cut at {cut}");
        }
        let mut noise = record.clone();
        for (i, b) in noise.iter_mut().enumerate().skip(RecordHeader::LEN) {
            *b = (i * 37) as u8;
        }
        let result =
            SnapshotReader::new().record(&header, &noise[RecordHeader::LEN..], &mut protector, 1, Limits::default());
        assert!(result.is_err());
    }
}
