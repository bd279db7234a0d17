//! Cap'n Proto, unpacked and packed: each frame is one `Batch` of `proto/schema/marketdata.capnp`
//! in Cap'n Proto's standard stream framing. The schema explains the layout; the Rust code is
//! generated from it by `proto/schema/gen-capnp.sh` and committed.
//!
//! Frame (unpacked): the segment table (u32 segment count - 1, a u32 size in words per segment,
//! padding to a word), then the segments. This codec writes one segment; it reads up to 511.
//! Packed, the same words go through Cap'n Proto's packing (a tag byte per word saying which of
//! its bytes are non-zero, then those bytes; runs of zero words and of incompressible words), byte
//! for byte what `capnp::serialize_packed` writes.
//!
//! No heap allocation once the buffers are warm, either way:
//! - `capnp::message::Builder` allocates the `Vec` of its arena's segment list for every message
//!   (its arena starts empty and has no reset), whatever `Allocator` it is given. So encoding
//!   builds through the generated builders on an arena of its own, `FlatArena`: one segment
//!   over a reused word buffer, sized beforehand from the messages so it cannot run out. The
//!   segment table goes in the buffer's first word, so the frame is contiguous there and reaches
//!   `out` in one copy (unpacked) or one packing pass (packed).
//! - Decoding reads through the generated readers and capnp's layout code: a one-segment frame
//!   through a minimal reader arena (`SegmentReader`), any other through
//!   `capnp::serialize::read_message_from_flat_slice_no_alloc`; zero-copy when the frame is 8-byte
//!   aligned. A packed frame is unpacked into a reused aligned buffer, once (see `Delimited`).
//!
//! Alignment: a misaligned unpacked frame is copied into the reused aligned buffer. Measured on
//! the trades-and-price-levels subset of DEEP10 (about 110,000 frames), decode and aggregate
//! took 5.05 ms for aligned frames and 5.5 ms for frames all misaligned and copied; with the
//! `capnp` crate's `unaligned` feature instead, 5.15 ms aligned and 5.2 ms misaligned. The feature
//! would tax the frames that are aligned (nearly all: the relay's headers are whole words, so
//! frames stay aligned in a receive buffer) and every other user of `capnp` in the workspace,
//! to save a copy for the rare misaligned frame; the copy stays.
//!
//! Frames are untrusted: the segment table is checked against [`Limits::max_frame`] before
//! anything is sized from it, the reader's traversal limit is the frame's size in words (so a
//! frame cannot make the reader visit more than it holds, e.g. with a list of empty structs), its
//! nesting limit a little over the schema's depth, and every capnp error is reported with what
//! was being read.

use super::{BatchHeader, DecodeError, EncodeError, Format, Limits, MAX_BATCH};
use crate::message::{
    AuctionInformation, Message, OfficialPrice, OperationalHaltStatus, PriceLevelUpdate, QuoteUpdate,
    RetailLiquidityIndicator, SecurityDirectory, SecurityEvent, ShortSalePriceTestStatus, Side, SystemEvent, Trade,
    TradingStatus, UnknownMessage,
};
use crate::price::{Price, Symbol};
use capnp::Word;
use capnp::message::ReaderOptions;
use capnp::private::arena::{BuilderArena, ReaderArena, SegmentId};
use capnp::private::layout::PointerBuilder;
use capnp::traits::HasStructSize;
use std::borrow::Cow;
use std::cell::Cell;
use std::cell::RefCell;
use std::marker::PhantomData;

#[rustfmt::skip]
#[allow(clippy::all, clippy::pedantic, clippy::nursery, clippy::undocumented_unsafe_blocks, dead_code, unused_imports, unused_parens,
    non_camel_case_types, non_snake_case, non_upper_case_globals, missing_docs)]
#[path = "../generated/capnp/marketdata_capnp.rs"]
mod marketdata_capnp;

use marketdata_capnp::{auction_information, batch, message as wire};

/// Bytes per Cap'n Proto word.
const WORD: usize = 8;

/// Most segments a frame may have; the `capnp` reader refuses 512 and more.
pub const MAX_SEGMENTS: usize = 511;

/// Longest unknown message the model carries (its length travels in a u16 in IEX-TP).
const MAX_UNKNOWN_LEN: usize = u16::MAX as usize;

/// Pointer depth the reader accepts: the schema needs 3 (batch, message list, auction or data).
const NESTING_LIMIT: i32 = 8;

/// Largest segment this encoder builds: a far larger one could not be addressed by a pointer's
/// 30-bit word offset.
const MAX_SEGMENT_WORDS: usize = (1 << 29) - 1;

/// Words of one `Batch` struct.
fn batch_words() -> usize {
    <batch::Builder<'_> as HasStructSize>::STRUCT_SIZE.total() as usize
}

/// Words of one `Message` list element.
fn message_words() -> usize {
    <wire::Builder<'_> as HasStructSize>::STRUCT_SIZE.total() as usize
}

/// Words of one `AuctionInformation` struct.
fn auction_words() -> usize {
    <auction_information::Builder<'_> as HasStructSize>::STRUCT_SIZE.total() as usize
}

/// Cap'n Proto codec, unpacked or packed, with its reused buffers.
pub struct CapnpCodec {
    limits: Limits,
    packed: bool,
    /// Encoding: the segment table word, then the one segment being built.
    build: Vec<Word>,
    /// Decoding: packed frames unpacked, misaligned frames copied.
    read: Vec<Word>,
    /// Whether packing can use SSSE3 byte shuffles (and POPCNT).
    ssse3: bool,
    /// Packed: the frame [`CapnpCodec::frame_len`] delimited last, unpacked, for `decode`.
    delimited: RefCell<Delimited>,
}

/// A packed frame and its unpacked words. Finding where a packed frame ends means walking every
/// tag, which is most of the work of unpacking it (the tags form a chain: where a word's encoding
/// ends depends on its tag), so `frame_len` unpacks as it walks and keeps the words; `decode`
/// takes them when it is handed the same bytes, and the frame is unpacked once. The bytes are
/// compared, not their address, so a buffer reused for another frame is never mistaken for it.
/// Measured on the DEEP10 subset, this took packed decoding from 14.7 ms to 10.8 ms. (`frame_len`
/// takes `&self`, hence the `RefCell`: a codec belongs to one stream on one thread, so it need
/// not be `Sync`, and a mutex's two atomic operations a frame measured 9.5 against 9.3 ms. When the
/// cell is already borrowed, `frame_len` only walks the tags, with [`Unpacker::skip_words`].)
#[derive(Default)]
struct Delimited {
    /// The packed frame (its first `packed_len` bytes).
    packed: Vec<u8>,
    packed_len: usize,
    /// The unpacked message (its first `len` words).
    words: Vec<Word>,
    len: usize,
    valid: bool,
}

/// Frames up to this long (nearly all) are remembered and compared in fixed-size steps, with no
/// call to `memcpy` or `memcmp`.
const SHORT_FRAME: usize = 64;

impl Delimited {
    /// Keeps `buf[..len]`, the packed frame just unpacked into `words`.
    fn remember(&mut self, buf: &[u8], len: usize, words: usize) {
        let copy = if len <= SHORT_FRAME && buf.len() >= SHORT_FRAME { SHORT_FRAME } else { len };
        if self.packed.len() < copy {
            self.packed.resize(copy, 0);
        }
        self.packed[..copy].copy_from_slice(&buf[..copy]);
        (self.packed_len, self.len, self.valid) = (len, words, true);
    }

    /// Whether `frame` is the frame remembered.
    fn holds(&self, frame: &[u8]) -> bool {
        self.valid && frame.len() == self.packed_len && same_bytes(frame, &self.packed[..self.packed_len])
    }
}

/// `a == b` for slices of the same length, a word at a time without an early exit, which the
/// compiler keeps inline where it turns `==` into a call to `memcmp`.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
    let (a_words, b_words) = (a.chunks_exact(WORD), b.chunks_exact(WORD));
    let rest = a_words.remainder().iter().zip(b_words.remainder()).fold(0, |diff, (x, y)| diff | (x ^ y));
    a.len() == b.len() && a_words.zip(b_words).fold(u64::from(rest), |diff, (x, y)| diff | (word(x) ^ word(y))) == 0
}

impl CapnpCodec {
    /// A codec with the given limits; `packed` selects [`Format::CapnpPacked`].
    pub fn new(limits: Limits, packed: bool) -> Self {
        CapnpCodec {
            limits,
            packed,
            build: Vec::new(),
            read: Vec::new(),
            ssse3: has_ssse3(),
            delimited: RefCell::default(),
        }
    }

    /// [`Format::Capnp`] or [`Format::CapnpPacked`].
    pub fn format(&self) -> Format {
        if self.packed { Format::CapnpPacked } else { Format::Capnp }
    }

    /// Appends one frame holding `header` and `messages` to `out`; on error `out` is unchanged.
    pub fn encode(
        &mut self,
        header: &BatchHeader,
        messages: &[Message<'_>],
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        if messages.len() > MAX_BATCH {
            return Err(EncodeError::TooManyMessages(messages.len()));
        }
        let capacity = self.segment_words(messages)?;
        if self.build.len() < 1 + capacity {
            self.build.resize(1 + capacity, word_of(0));
        }
        let (table, segment) = self.build.split_at_mut(1);
        let mut arena = FlatArena::new(&mut segment[..capacity]);
        build_batch(&mut arena, header, messages);
        let used = arena.used as usize;
        // One segment: the count minus one (0), then its size in words.
        table[0] = word_of((used as u64) << 32);
        let frame = Word::words_to_bytes(&self.build[..1 + used]);
        if self.packed {
            pack(frame, out, self.ssse3);
        } else {
            out.extend_from_slice(frame);
        }
        Ok(())
    }

    /// The segment's size in words for `messages`, exactly what building it allocates; checks
    /// what the schema cannot carry before anything is written.
    fn segment_words(&self, messages: &[Message<'_>]) -> Result<usize, EncodeError> {
        // Root pointer, batch struct, list tag word, the list elements.
        let mut words = 1 + batch_words() + 1 + messages.len() * message_words();
        for (index, message) in messages.iter().enumerate() {
            match message {
                Message::AuctionInformation(_) => words += auction_words(),
                Message::Unknown(u) => {
                    let what: Option<Cow<'static, str>> = if u.bytes.is_empty() {
                        Some("unknown message with no bytes (its first byte is its type)".into())
                    } else if u.bytes[0] != u.kind {
                        Some(format!("unknown message of type {} whose first byte is {}", u.kind, u.bytes[0]).into())
                    } else if u.bytes.len() > MAX_UNKNOWN_LEN {
                        Some(format!("unknown message of {} bytes; at most {MAX_UNKNOWN_LEN}", u.bytes.len()).into())
                    } else {
                        None
                    };
                    if let Some(what) = what {
                        return Err(EncodeError::Unrepresentable { format: self.format(), index, what });
                    }
                    words += u.bytes.len().div_ceil(WORD);
                }
                _ => {}
            }
        }
        if words > MAX_SEGMENT_WORDS {
            return Err(EncodeError::Unrepresentable {
                format: self.format(),
                index: messages.len().saturating_sub(1),
                what: format!("batch of {words} words; one Cap'n Proto segment holds at most {MAX_SEGMENT_WORDS}")
                    .into(),
            });
        }
        Ok(words)
    }

    /// Length of the first frame in `buf`, from its segment table; `None` while more bytes are
    /// needed. The table is checked against the frame limit before anything else. A packed frame
    /// ends where its tags say; it is unpacked as they are walked, for `decode` (see
    /// `Delimited`), or only walked when that buffer is already borrowed.
    pub fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        if self.packed { self.packed_frame_len(buf) } else { self.unpacked_frame_len(buf) }
    }

    fn unpacked_frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        // One segment, the usual case: its size is in the first word.
        if let Some(first) = buf.get(..WORD) {
            if first[..4] == [0; 4] {
                let size = u32::from_le_bytes(first[4..].try_into().expect("4 bytes")) as usize;
                let len = size.saturating_mul(WORD).saturating_add(WORD);
                if len > self.limits.max_frame {
                    return Err(too_long(Format::Capnp, len, self.limits.max_frame));
                }
                return Ok((buf.len() >= len).then_some(len));
            }
        }
        let mut table = TableReader::new(Format::Capnp, self.limits.max_frame);
        let mut at = 0;
        while !table.complete() {
            let Some(bytes) = buf.get(at..at + WORD) else { return Ok(None) };
            table.push(u64::from_le_bytes(bytes.try_into().expect("a word")), at)?;
            at += WORD;
        }
        let len = table.total_words() * WORD;
        Ok((buf.len() >= len).then_some(len))
    }

    fn packed_frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        let max_frame = self.limits.max_frame;
        if let Ok(mut delimited) = self.delimited.try_borrow_mut() {
            let delimited = &mut *delimited;
            delimited.valid = false;
            return match unpack_message(buf, &mut delimited.words, max_frame, self.ssse3)? {
                Some((len, _)) if len > max_frame => Err(too_long(Format::CapnpPacked, len, max_frame)),
                Some((len, words)) => {
                    delimited.remember(buf, len, words);
                    Ok(Some(len))
                }
                None if buf.len() > max_frame => Err(too_long(Format::CapnpPacked, buf.len(), max_frame)),
                None => Ok(None),
            };
        }
        let Some(table) = PackedTable::read(buf, max_frame)? else {
            return if buf.len() > max_frame {
                Err(too_long(Format::CapnpPacked, buf.len(), max_frame))
            } else {
                Ok(None)
            };
        };
        let mut unpacker = table.rest;
        let at = unpacker.pos;
        match unpacker.skip_words(table.total_words - table.table_words) {
            Step::Word(()) if unpacker.pos > max_frame => Err(too_long(Format::CapnpPacked, unpacker.pos, max_frame)),
            Step::Word(()) => Ok(Some(unpacker.pos)),
            Step::More if buf.len() > max_frame => Err(too_long(Format::CapnpPacked, buf.len(), max_frame)),
            Step::More => Ok(None),
            Step::Bad(what) => Err(DecodeError::new(Format::CapnpPacked, at.max(unpacker.pos), what)),
        }
    }

    /// Decodes one frame (exactly the bytes [`CapnpCodec::frame_len`] delimited), handing each
    /// message to `visit` in order. A message that does not decode (a union tag this schema does
    /// not have, a broken pointer) ends the frame with an error: the messages before it have been
    /// visited.
    pub fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], visit: F) -> Result<BatchHeader, DecodeError> {
        if frame.len() > self.limits.max_frame {
            return Err(too_long(self.format(), frame.len(), self.limits.max_frame));
        }
        if self.packed {
            let delimited = self.delimited.get_mut();
            let bytes = if delimited.holds(frame) {
                Word::words_to_bytes(&delimited.words[..delimited.len])
            } else {
                let words = unpack(frame, &mut self.read, self.limits.max_frame, self.ssse3)?;
                Word::words_to_bytes(&self.read[..words])
            };
            read_batch(bytes, visit)
                .map_err(|e| e.into_error(Format::CapnpPacked, |offset| packed_offset(frame, offset)))
        } else {
            let bytes = if frame.as_ptr() as usize % WORD == 0 {
                frame
            } else {
                let words = frame.len().div_ceil(WORD);
                if self.read.len() < words {
                    self.read.resize(words, word_of(0));
                }
                let copy = &mut Word::words_to_bytes_mut(&mut self.read)[..frame.len()];
                copy.copy_from_slice(frame);
                &*copy
            };
            read_batch(bytes, visit).map_err(|e| e.into_error(Format::Capnp, |offset| offset))
        }
    }
}

/// `value` as a little-endian word.
fn word_of(value: u64) -> Word {
    let [b0, b1, b2, b3, b4, b5, b6, b7] = value.to_le_bytes();
    capnp::word(b0, b1, b2, b3, b4, b5, b6, b7)
}

fn too_long(format: Format, len: usize, max_frame: usize) -> DecodeError {
    DecodeError::new(format, 0, format!("frame of {len} bytes exceeds the {max_frame}-byte limit"))
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// A builder arena of one segment over a caller's zeroed-on-demand word buffer: what
/// `capnp::message::Builder` does, minus its per-message `Vec` of segments. The buffer is sized
/// by [`CapnpCodec::segment_words`] beforehand, exactly, so allocation cannot fail.
struct FlatArena<'a> {
    base: *mut u8,
    capacity: u32,
    used: u32,
    _buffer: PhantomData<&'a mut [Word]>,
}

impl<'a> FlatArena<'a> {
    fn new(buffer: &'a mut [Word]) -> Self {
        let capacity = u32::try_from(buffer.len()).expect("segment_words caps the segment size");
        FlatArena { base: Word::words_to_bytes_mut(buffer).as_mut_ptr(), capacity, used: 0, _buffer: PhantomData }
    }
}

// SAFETY: the arena hands out word ranges of its one segment, each once, zeroed, and the segment
// stays borrowed (and so in place) for the arena's lifetime; that is what the layout code needs.
unsafe impl ReaderArena for FlatArena<'_> {
    fn get_segment(&self, id: u32) -> capnp::Result<(*const u8, u32)> {
        if id == 0 {
            Ok((self.base.cast_const(), self.used))
        } else {
            Err(capnp::Error::from_kind(capnp::ErrorKind::InvalidSegmentId(id)))
        }
    }

    // Like the builder arena of the `capnp` crate: what the builder wrote is trusted.
    unsafe fn check_offset(&self, _segment: u32, start: *const u8, offset_in_words: i32) -> capnp::Result<*const u8> {
        Ok(start.wrapping_offset(offset_in_words as isize * WORD as isize))
    }

    fn contains_interval(&self, _segment: u32, _start: *const u8, _size: usize) -> capnp::Result<()> {
        Ok(())
    }

    fn amplified_read(&self, _virtual_amount: u64) -> capnp::Result<()> {
        Ok(())
    }

    fn nesting_limit(&self) -> i32 {
        i32::MAX
    }

    fn size_in_words(&self) -> usize {
        self.used as usize
    }
}

// SAFETY: see the ReaderArena impl.
unsafe impl BuilderArena for FlatArena<'_> {
    fn allocate(&mut self, segment: u32, amount: u32) -> Option<u32> {
        if segment != 0 || amount > self.capacity - self.used {
            return None;
        }
        let start = self.used;
        // SAFETY: [start, start + amount) is within the buffer (checked above) and handed out
        // for the first time, so nothing refers to it yet. The builder expects zeroes.
        unsafe { std::ptr::write_bytes(self.base.add(start as usize * WORD), 0, amount as usize * WORD) };
        self.used += amount;
        Some(start)
    }

    fn allocate_anywhere(&mut self, amount: u32) -> (SegmentId, u32) {
        let start = self.allocate(0, amount).expect("the segment is sized for the batch before building");
        (0, start)
    }

    fn get_segment_mut(&mut self, id: u32) -> (*mut u8, u32) {
        debug_assert_eq!(id, 0, "a one-segment arena");
        (self.base, self.capacity)
    }

    fn as_reader(&self) -> &dyn ReaderArena {
        self
    }
}

/// Builds the whole batch in `arena`, root pointer first.
fn build_batch(arena: &mut FlatArena<'_>, header: &BatchHeader, messages: &[Message<'_>]) {
    arena.allocate(0, 1).expect("room for the root pointer");
    let root = arena.base;
    let pointer = PointerBuilder::get_root(arena, 0, root);
    fill_batch(capnp::any_pointer::Builder::new(pointer).init_as(), header, messages);
}

/// Writes `header` and `messages` into a freshly initialised `Batch`.
fn fill_batch(mut batch: batch::Builder<'_>, header: &BatchHeader, messages: &[Message<'_>]) {
    batch.set_first_sequence(header.first_sequence);
    batch.set_send_time(header.send_time);
    batch.set_publish_time(header.publish_time);
    batch.set_channel_id(header.channel_id);
    batch.set_session_id(header.session_id);
    batch.set_protocol_id(header.protocol_id);
    let mut list = batch.init_messages(messages.len() as u32);
    for (index, message) in messages.iter().enumerate() {
        build_message(list.reborrow().get(index as u32), message);
    }
}

fn build_message(mut m: wire::Builder<'_>, message: &Message<'_>) {
    // The fields outside the union first: `init_*` consumes the builder.
    fn head(m: &mut wire::Builder<'_>, timestamp: i64, symbol: &Symbol) {
        m.set_timestamp(timestamp);
        m.set_symbol(u64::from_le_bytes(symbol.0));
    }
    match message {
        Message::SystemEvent(s) => {
            m.set_timestamp(s.timestamp);
            m.init_system_event().set_event(s.event);
        }
        Message::SecurityDirectory(d) => {
            head(&mut m, d.timestamp, &d.symbol);
            let mut g = m.init_security_directory();
            g.set_flags(d.flags);
            g.set_round_lot_size(d.round_lot_size);
            g.set_adjusted_poc_price(d.adjusted_poc_price.0);
            g.set_luld_tier(d.luld_tier);
        }
        Message::TradingStatus(t) => {
            head(&mut m, t.timestamp, &t.symbol);
            let mut g = m.init_trading_status();
            g.set_status(t.status);
            g.set_reason(u32::from_le_bytes(t.reason));
        }
        Message::RetailLiquidityIndicator(r) => {
            head(&mut m, r.timestamp, &r.symbol);
            m.init_retail_liquidity_indicator().set_indicator(r.indicator);
        }
        Message::OperationalHaltStatus(o) => {
            head(&mut m, o.timestamp, &o.symbol);
            m.init_operational_halt_status().set_status(o.status);
        }
        Message::ShortSalePriceTestStatus(p) => {
            head(&mut m, p.timestamp, &p.symbol);
            let mut g = m.init_short_sale_price_test_status();
            g.set_in_effect(p.in_effect);
            g.set_detail(p.detail);
        }
        Message::SecurityEvent(e) => {
            head(&mut m, e.timestamp, &e.symbol);
            m.init_security_event().set_event(e.event);
        }
        Message::PriceLevelUpdate(u) => {
            head(&mut m, u.timestamp, &u.symbol);
            match u.side {
                Side::Buy => {
                    let mut g = m.init_price_level_buy();
                    g.set_event_flags(u.event_flags);
                    g.set_size(u.size);
                    g.set_price(u.price.0);
                }
                Side::Sell => {
                    let mut g = m.init_price_level_sell();
                    g.set_event_flags(u.event_flags);
                    g.set_size(u.size);
                    g.set_price(u.price.0);
                }
            }
        }
        Message::QuoteUpdate(q) => {
            head(&mut m, q.timestamp, &q.symbol);
            let mut g = m.init_quote_update();
            g.set_flags(q.flags);
            g.set_bid_size(q.bid_size);
            g.set_bid_price(q.bid_price.0);
            g.set_ask_price(q.ask_price.0);
            g.set_ask_size(q.ask_size);
        }
        Message::TradeReport(t) => {
            head(&mut m, t.timestamp, &t.symbol);
            let mut g = m.init_trade_report();
            g.set_sale_condition(t.sale_condition);
            g.set_size(t.size);
            g.set_price(t.price.0);
            g.set_trade_id(t.trade_id);
        }
        Message::TradeBreak(t) => {
            head(&mut m, t.timestamp, &t.symbol);
            let mut g = m.init_trade_break();
            g.set_sale_condition(t.sale_condition);
            g.set_size(t.size);
            g.set_price(t.price.0);
            g.set_trade_id(t.trade_id);
        }
        Message::OfficialPrice(x) => {
            head(&mut m, x.timestamp, &x.symbol);
            let mut g = m.init_official_price();
            g.set_price_type(x.price_type);
            g.set_price(x.price.0);
        }
        Message::AuctionInformation(a) => {
            head(&mut m, a.timestamp, &a.symbol);
            let mut s = m.init_auction_information();
            s.set_auction_type(a.auction_type);
            s.set_imbalance_side(a.imbalance_side);
            s.set_extension_number(a.extension_number);
            s.set_paired_shares(a.paired_shares);
            s.set_reference_price(a.reference_price.0);
            s.set_indicative_clearing_price(a.indicative_clearing_price.0);
            s.set_imbalance_shares(a.imbalance_shares);
            s.set_scheduled_auction_time(a.scheduled_auction_time);
            s.set_auction_book_clearing_price(a.auction_book_clearing_price.0);
            s.set_collar_reference_price(a.collar_reference_price.0);
            s.set_lower_auction_collar(a.lower_auction_collar.0);
            s.set_upper_auction_collar(a.upper_auction_collar.0);
        }
        Message::Unknown(u) => m.init_unknown(u.bytes.len() as u32).copy_from_slice(u.bytes),
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// A decoding failure, with the offset in the unpacked message (mapped to the frame's bytes by
/// the caller, which knows whether the frame was packed).
struct ReadError {
    offset: usize,
    what: String,
}

impl ReadError {
    fn into_error(self, format: Format, map: impl FnOnce(usize) -> usize) -> DecodeError {
        DecodeError::new(format, map(self.offset), self.what)
    }
}

/// Reads one unpacked message (segment table and segments, 8-byte aligned) and visits its
/// messages.
fn read_batch<F: FnMut(&Message<'_>)>(bytes: &[u8], visit: F) -> Result<BatchHeader, ReadError> {
    // Every object of a well-formed frame is read once, so reading never needs more words than the
    // frame has; the root pointer and slack for a tiny frame make up the constant.
    let traversal_limit = bytes.len() / WORD + 8;
    let root_error = |offset: usize, e: capnp::Error| ReadError { offset, what: format!("root Batch: {e}") };
    // One segment, the usual case: its size is the table's second half.
    if bytes.len() >= WORD && bytes[..4] == [0; 4] {
        let size = u32::from_le_bytes(bytes[4..WORD].try_into().expect("4 bytes")) as usize;
        if bytes.len() == size.saturating_mul(WORD).saturating_add(WORD) {
            let arena = SegmentReader::new(&bytes[WORD..], traversal_limit, NESTING_LIMIT);
            let batch: batch::Reader<'_> = capnp::private::layout::PointerReader::get_root_from_arena(&arena)
                .and_then(|root| capnp::any_pointer::Reader::new(root).get_as())
                .map_err(|e| root_error(WORD, e))?;
            return read_messages(batch, bytes, WORD, visit);
        }
    }
    let mut options = ReaderOptions::new();
    options.traversal_limit_in_words(Some(traversal_limit)).nesting_limit(NESTING_LIMIT);
    let mut rest = bytes;
    let message = capnp::serialize::read_message_from_flat_slice_no_alloc(&mut rest, options)
        .map_err(|e| ReadError { offset: 0, what: format!("segment table: {e}") })?;
    if !rest.is_empty() {
        return Err(ReadError {
            offset: bytes.len() - rest.len(),
            what: format!("{} bytes after the message the segment table describes", rest.len()),
        });
    }
    let segments = u32::from_le_bytes(bytes[..4].try_into().expect("the table was read")) as usize + 1;
    let table_len = (segments / 2 + 1) * WORD;
    let batch: batch::Reader<'_> = message.get_root().map_err(|e| root_error(table_len, e))?;
    read_messages(batch, bytes, table_len, visit)
}

/// Visits the messages of `batch`, read from `bytes` (whose segment table is `table_len` bytes).
fn read_messages<F: FnMut(&Message<'_>)>(
    batch: batch::Reader<'_>,
    bytes: &[u8],
    table_len: usize,
    mut visit: F,
) -> Result<BatchHeader, ReadError> {
    let list =
        batch.get_messages().map_err(|e| ReadError { offset: table_len, what: format!("Batch.messages: {e}") })?;
    let count = list.len();
    if count as usize > MAX_BATCH {
        return Err(ReadError {
            offset: table_len,
            what: format!("Batch.messages has {count} messages; at most {MAX_BATCH}"),
        });
    }
    let header = BatchHeader {
        protocol_id: batch.get_protocol_id(),
        channel_id: batch.get_channel_id(),
        session_id: batch.get_session_id(),
        first_sequence: batch.get_first_sequence(),
        message_count: count,
        send_time: batch.get_send_time(),
        publish_time: batch.get_publish_time(),
    };
    for index in 0..count {
        let m = list.get(index);
        match read_message(m) {
            Ok(message) => visit(&message),
            Err(what) => {
                let data = capnp::raw::get_struct_data_section(m);
                let offset = (data.as_ptr() as usize).wrapping_sub(bytes.as_ptr() as usize);
                return Err(ReadError { offset, what: format!("Batch.messages[{index}]: {what}") });
            }
        }
    }
    Ok(header)
}

/// The reader arena of a one-segment frame: what `capnp::serialize`'s flat-slice readers give
/// the layout code, minus their work on every pointer (they re-read the segment table, or index
/// a list of segments, each time the layout code asks for the segment; about 250 instructions a
/// frame). Checks every pointer's target against the segment and counts the words read against
/// the traversal limit, as the `capnp` crate's reader arena does.
struct SegmentReader<'a> {
    start: *const u8,
    words: u32,
    limit: Cell<usize>,
    nesting_limit: i32,
    _segment: PhantomData<&'a [u8]>,
}

impl<'a> SegmentReader<'a> {
    /// `segment` must be 8-byte aligned, and shorter than 2^32 words (frames are limited far
    /// below that).
    fn new(segment: &'a [u8], traversal_limit: usize, nesting_limit: i32) -> Self {
        debug_assert_eq!(segment.as_ptr() as usize % WORD, 0);
        SegmentReader {
            start: segment.as_ptr(),
            words: u32::try_from(segment.len() / WORD).unwrap_or(u32::MAX),
            limit: Cell::new(traversal_limit),
            nesting_limit,
            _segment: PhantomData,
        }
    }

    fn can_read(&self, words: usize) -> capnp::Result<()> {
        let left = self.limit.get();
        if words > left {
            return Err(capnp::Error::from_kind(capnp::ErrorKind::ReadLimitExceeded));
        }
        self.limit.set(left - words);
        Ok(())
    }
}

// SAFETY: `get_segment` describes exactly the borrowed segment, and `contains_interval` accepts
// only intervals inside it (the default `check_offset` keeps offsets inside it too).
unsafe impl ReaderArena for SegmentReader<'_> {
    fn get_segment(&self, id: u32) -> capnp::Result<(*const u8, u32)> {
        if id == 0 {
            Ok((self.start, self.words))
        } else {
            Err(capnp::Error::from_kind(capnp::ErrorKind::InvalidSegmentId(id)))
        }
    }

    // The trait's default asks `get_segment` first, through the same dynamic dispatch; this is
    // its check (the target stays within the segment, or just past its end) without that call.
    unsafe fn check_offset(&self, id: u32, start: *const u8, offset_in_words: i32) -> capnp::Result<*const u8> {
        if id != 0 {
            return Err(capnp::Error::from_kind(capnp::ErrorKind::InvalidSegmentId(id)));
        }
        let segment_bytes = self.words as usize * WORD;
        let from = (start as usize).wrapping_sub(self.start as usize);
        let offset = i64::from(offset_in_words) * WORD as i64;
        let inside = from <= segment_bytes
            && i64::try_from(from)
                .ok()
                .and_then(|from| from.checked_add(offset))
                .is_some_and(|to| usize::try_from(to).is_ok_and(|to| to <= segment_bytes));
        if !inside {
            return Err(capnp::Error::from_kind(capnp::ErrorKind::MessageContainsOutOfBoundsPointer));
        }
        Ok(start.wrapping_offset(offset as isize))
    }

    fn contains_interval(&self, id: u32, start: *const u8, size_in_words: usize) -> capnp::Result<()> {
        if id != 0 {
            return Err(capnp::Error::from_kind(capnp::ErrorKind::InvalidSegmentId(id)));
        }
        let segment_bytes = self.words as usize * WORD;
        let inside = size_in_words.checked_mul(WORD).is_some_and(|size| {
            let (start, segment) = (start as usize, self.start as usize);
            start >= segment && size <= segment_bytes && start - segment <= segment_bytes - size
        });
        if !inside {
            return Err(capnp::Error::from_kind(capnp::ErrorKind::MessageContainsOutOfBoundsPointer));
        }
        self.can_read(size_in_words)
    }

    fn amplified_read(&self, virtual_amount: u64) -> capnp::Result<()> {
        self.can_read(usize::try_from(virtual_amount).unwrap_or(usize::MAX))
    }

    fn nesting_limit(&self) -> i32 {
        self.nesting_limit
    }

    fn size_in_words(&self) -> usize {
        self.words as usize
    }
}

#[inline(always)]
fn read_message<'a>(m: wire::Reader<'a>) -> Result<Message<'a>, String> {
    match read_common(m) {
        Some(message) => Ok(message),
        None => read_generated(m),
    }
}

/// Reads any message through the generated accessors.
fn read_generated<'a>(m: wire::Reader<'a>) -> Result<Message<'a>, String> {
    use wire::Which;
    let timestamp = m.get_timestamp();
    let symbol = Symbol(m.get_symbol().to_le_bytes());
    let which = m.which().map_err(|e| format!("union tag {} is no message type of this schema", e.0))?;
    Ok(match which {
        Which::PriceLevelBuy(g) => Message::PriceLevelUpdate(PriceLevelUpdate {
            side: Side::Buy,
            event_flags: g.get_event_flags(),
            timestamp,
            symbol,
            size: g.get_size(),
            price: Price(g.get_price()),
        }),
        Which::PriceLevelSell(g) => Message::PriceLevelUpdate(PriceLevelUpdate {
            side: Side::Sell,
            event_flags: g.get_event_flags(),
            timestamp,
            symbol,
            size: g.get_size(),
            price: Price(g.get_price()),
        }),
        Which::TradeReport(g) => Message::TradeReport(Trade {
            sale_condition: g.get_sale_condition(),
            timestamp,
            symbol,
            size: g.get_size(),
            price: Price(g.get_price()),
            trade_id: g.get_trade_id(),
        }),
        Which::TradeBreak(g) => Message::TradeBreak(Trade {
            sale_condition: g.get_sale_condition(),
            timestamp,
            symbol,
            size: g.get_size(),
            price: Price(g.get_price()),
            trade_id: g.get_trade_id(),
        }),
        Which::QuoteUpdate(g) => Message::QuoteUpdate(QuoteUpdate {
            flags: g.get_flags(),
            timestamp,
            symbol,
            bid_size: g.get_bid_size(),
            bid_price: Price(g.get_bid_price()),
            ask_price: Price(g.get_ask_price()),
            ask_size: g.get_ask_size(),
        }),
        Which::SystemEvent(g) => Message::SystemEvent(SystemEvent { event: g.get_event(), timestamp }),
        Which::SecurityDirectory(g) => Message::SecurityDirectory(SecurityDirectory {
            flags: g.get_flags(),
            timestamp,
            symbol,
            round_lot_size: g.get_round_lot_size(),
            adjusted_poc_price: Price(g.get_adjusted_poc_price()),
            luld_tier: g.get_luld_tier(),
        }),
        Which::TradingStatus(g) => Message::TradingStatus(TradingStatus {
            status: g.get_status(),
            timestamp,
            symbol,
            reason: g.get_reason().to_le_bytes(),
        }),
        Which::RetailLiquidityIndicator(g) => Message::RetailLiquidityIndicator(RetailLiquidityIndicator {
            indicator: g.get_indicator(),
            timestamp,
            symbol,
        }),
        Which::OperationalHaltStatus(g) => {
            Message::OperationalHaltStatus(OperationalHaltStatus { status: g.get_status(), timestamp, symbol })
        }
        Which::ShortSalePriceTestStatus(g) => Message::ShortSalePriceTestStatus(ShortSalePriceTestStatus {
            in_effect: g.get_in_effect(),
            timestamp,
            symbol,
            detail: g.get_detail(),
        }),
        Which::SecurityEvent(g) => Message::SecurityEvent(SecurityEvent { event: g.get_event(), timestamp, symbol }),
        Which::OfficialPrice(g) => Message::OfficialPrice(OfficialPrice {
            price_type: g.get_price_type(),
            timestamp,
            symbol,
            price: Price(g.get_price()),
        }),
        Which::AuctionInformation(a) => {
            let a = a.map_err(|e| format!("auctionInformation: {e}"))?;
            Message::AuctionInformation(AuctionInformation {
                auction_type: a.get_auction_type(),
                timestamp,
                symbol,
                paired_shares: a.get_paired_shares(),
                reference_price: Price(a.get_reference_price()),
                indicative_clearing_price: Price(a.get_indicative_clearing_price()),
                imbalance_shares: a.get_imbalance_shares(),
                imbalance_side: a.get_imbalance_side(),
                extension_number: a.get_extension_number(),
                scheduled_auction_time: a.get_scheduled_auction_time(),
                auction_book_clearing_price: Price(a.get_auction_book_clearing_price()),
                collar_reference_price: Price(a.get_collar_reference_price()),
                lower_auction_collar: Price(a.get_lower_auction_collar()),
                upper_auction_collar: Price(a.get_upper_auction_collar()),
            })
        }
        Which::Unknown(bytes) => {
            let bytes = bytes.map_err(|e| format!("unknown: {e}"))?;
            let Some(&kind) = bytes.first() else {
                return Err("unknown has no bytes (its first byte is the message type)".into());
            };
            if bytes.len() > MAX_UNKNOWN_LEN {
                return Err(format!("unknown has {} bytes; at most {MAX_UNKNOWN_LEN}", bytes.len()));
            }
            Message::Unknown(UnknownMessage { kind, bytes })
        }
    })
}

/// Union tags of the types read by [`read_common`] (the schema's declaration order).
const TAG_PRICE_LEVEL_BUY: u16 = 7;
const TAG_PRICE_LEVEL_SELL: u16 = 8;
const TAG_TRADE_REPORT: u16 = 10;

/// Reads the message types that make nearly all of a DEEP feed straight from the list element's
/// data section, at the offsets `capnp compile -ocapnp` gives for the schema; `None` for any other
/// type, or a data section smaller than this schema's (an older writer), which go through the
/// generated `which()`. The generated path copies the struct reader into each group reader and is
/// not inlined; this one is a few loads.
#[inline(always)]
fn read_common<'a>(m: wire::Reader<'a>) -> Option<Message<'a>> {
    let data: &[u8; 40] = capnp::raw::get_struct_data_section(m).get(..40)?.try_into().ok()?;
    let u32_at = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"));
    let i64_at = |at: usize| i64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"));
    let timestamp = i64_at(0);
    let symbol = Symbol(data[8..16].try_into().ok()?);
    let tag = u16::from_le_bytes([data[18], data[19]]);
    Some(match tag {
        TAG_PRICE_LEVEL_BUY | TAG_PRICE_LEVEL_SELL => Message::PriceLevelUpdate(PriceLevelUpdate {
            side: if tag == TAG_PRICE_LEVEL_BUY { Side::Buy } else { Side::Sell },
            event_flags: data[16],
            timestamp,
            symbol,
            size: u32_at(20),
            price: Price(i64_at(24)),
        }),
        TAG_TRADE_REPORT => Message::TradeReport(Trade {
            sale_condition: data[16],
            timestamp,
            symbol,
            size: u32_at(20),
            price: Price(i64_at(24)),
            trade_id: i64_at(32),
        }),
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// Segment table

/// Reads a segment table word by word, checking it against the frame limit as soon as each size
/// is known, so a frame too long is refused from its first bytes.
struct TableReader {
    format: Format,
    max_frame: usize,
    max_words: usize,
    segments: usize,
    sizes_seen: usize,
    words_seen: usize,
    total_words: usize,
}

impl TableReader {
    fn new(format: Format, max_frame: usize) -> Self {
        TableReader {
            format,
            max_frame,
            max_words: max_frame / WORD,
            segments: 0,
            sizes_seen: 0,
            words_seen: 0,
            total_words: 0,
        }
    }

    /// Words of the table itself (valid once the first word is in).
    fn table_words(&self) -> usize {
        self.segments / 2 + 1
    }

    fn complete(&self) -> bool {
        self.words_seen > 0 && self.words_seen == self.table_words()
    }

    /// Words of the whole message, table included (valid once complete).
    fn total_words(&self) -> usize {
        self.total_words
    }

    /// Takes the next table word, which starts at byte `at` of the frame.
    fn push(&mut self, word: u64, at: usize) -> Result<(), DecodeError> {
        let halves = [word as u32, (word >> 32) as u32];
        let mut sizes: &[u32] = &halves;
        if self.words_seen == 0 {
            let segments = (halves[0] as usize).saturating_add(1);
            if segments > MAX_SEGMENTS {
                return Err(DecodeError::new(
                    self.format,
                    at,
                    format!("segment table: {segments} segments; at most {MAX_SEGMENTS}"),
                ));
            }
            self.segments = segments;
            self.total_words = self.table_words();
            sizes = &halves[1..];
        }
        self.words_seen += 1;
        for (i, &size) in sizes.iter().enumerate() {
            if self.sizes_seen == self.segments {
                break; // padding
            }
            self.total_words += size as usize;
            if self.total_words > self.max_words {
                let offset = at + (halves.len() - sizes.len() + i) * 4;
                return Err(DecodeError::new(
                    self.format,
                    offset,
                    format!(
                        "segment table: size of segment {} makes the message at least {} bytes, over the {}-byte limit",
                        self.sizes_seen,
                        self.total_words * WORD,
                        self.max_frame
                    ),
                ));
            }
            self.sizes_seen += 1;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Packing
//
// Each word becomes a tag byte whose bit i says byte i is non-zero, then the non-zero bytes. Tag
// 0x00 is followed by a count of further all-zero words (0-255); tag 0xff by the 8 bytes, a
// count of further words copied as they are (0-255), and those words. The writer below makes the
// same choices as the `capnp` crate's (a raw run goes on while words have at most one zero byte),
// so its output is byte for byte what `capnp::serialize_packed` writes for the same message.
//
// Reading is a chain through the tags (where a word's encoding ends depends on its tag), so the
// loops keep that chain short: a table for the number of non-zero bytes (the baseline x86-64
// target has no POPCNT instruction, and `count_ones` is a dozen instructions without it), a branch
// on the tag's kind (frames of one schema repeat a few patterns, which the branch predictor learns:
// measured faster than computing both cases), and the byte moves of expanding or compacting a word
// done with one SSSE3 byte shuffle where the CPU has it (checked once per codec), by a table
// otherwise.

/// For each byte of `word`, 0x80 if it is non-zero, else 0.
#[inline]
fn nonzero_bytes(word: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    (((word & LOW7) + LOW7) | word) & !LOW7
}

/// Whether `word` has at most one zero byte: such words extend a run of words copied as they are.
#[inline]
fn at_most_one_zero_byte(word: u64) -> bool {
    let zeros = !nonzero_bytes(word) & 0x8080_8080_8080_8080;
    zeros & zeros.wrapping_sub(1) == 0
}

/// The packing tag of `word`: bit i set when byte i is non-zero.
#[inline]
fn tag_of(word: u64) -> u8 {
    // Gathers the top bit of each byte into the top byte, byte i's bit landing at bit 56 + i.
    ((nonzero_bytes(word) >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
}

/// Non-zero bytes of the word each tag stands for (the tag's set bits).
static NONZERO: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut tag = 0;
    while tag < 256 {
        table[tag] = (tag as u8).count_ones() as u8;
        tag += 1;
    }
    table
};

/// A shuffle index that yields a zero byte, both to PSHUFB (high bit set) and to the portable
/// gather (low four bits 8, the zero byte past a word).
const ZERO_BYTE: u8 = 0x88;

/// Per tag, for each byte of the unpacked word, which of the tag's non-zero bytes goes there.
static EXPAND: [[u8; 16]; 256] = {
    let mut table = [[ZERO_BYTE; 16]; 256];
    let mut tag = 0;
    while tag < 256 {
        let mut k = 0;
        let mut b = 0;
        while b < WORD {
            if tag & (1 << b) != 0 {
                table[tag][b] = k;
                k += 1;
            }
            b += 1;
        }
        tag += 1;
    }
    table
};

/// Per tag, for each of its non-zero bytes in order, which byte of the word it is.
static COMPACT: [[u8; 16]; 256] = {
    let mut table = [[ZERO_BYTE; 16]; 256];
    let mut tag = 0;
    while tag < 256 {
        let mut k = 0;
        let mut b = 0;
        while b < WORD {
            if tag & (1 << b) != 0 {
                table[tag][k] = b as u8;
                k += 1;
            }
            b += 1;
        }
        tag += 1;
    }
    table
};

/// [`ByteMoves::expand`] for a word whose non-zero `bytes` end the input.
fn expand_short(tag: u8, bytes: &[u8]) -> u64 {
    let mut window = [0u8; WORD];
    for (w, &b) in window.iter_mut().zip(bytes) {
        *w = b;
    }
    Portable::expand(tag, u64::from_le_bytes(window))
}

/// Whether the CPU can shuffle bytes with SSSE3.
fn has_ssse3() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("ssse3") && std::arch::is_x86_feature_detected!("popcnt")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The byte moves of packing: one implementation per instruction set.
trait ByteMoves {
    /// The word whose non-zero bytes, in order, start `window`, at the positions `tag` marks.
    fn expand(tag: u8, window: u64) -> u64;
    /// The non-zero bytes of `word` (whose tag is `tag`), in order, in the low bytes.
    fn compact(tag: u8, word: u64) -> u64;
    /// How many non-zero bytes `tag` stands for.
    fn nonzero(tag: u8) -> usize;
}

/// Table-driven byte moves, for any CPU.
struct Portable;

impl Portable {
    #[inline(always)]
    fn shuffle(bytes: u64, index: &[u8; 16]) -> u64 {
        let mut from = [0u8; 16];
        from[..WORD].copy_from_slice(&bytes.to_le_bytes());
        u64::from_le_bytes(std::array::from_fn(|b| from[usize::from(index[b] & 15)]))
    }
}

impl ByteMoves for Portable {
    #[inline(always)]
    fn expand(tag: u8, window: u64) -> u64 {
        Portable::shuffle(window, &EXPAND[usize::from(tag)])
    }

    #[inline(always)]
    fn compact(tag: u8, word: u64) -> u64 {
        Portable::shuffle(word, &COMPACT[usize::from(tag)])
    }

    #[inline(always)]
    fn nonzero(tag: u8) -> usize {
        usize::from(NONZERO[usize::from(tag)])
    }
}

/// Byte moves with one SSSE3 PSHUFB each. Only for code compiled with SSSE3 enabled (the
/// `*_ssse3` functions below), into which these are inlined.
#[cfg(target_arch = "x86_64")]
struct Ssse3;

#[cfg(target_arch = "x86_64")]
impl Ssse3 {
    #[inline(always)]
    fn shuffle(bytes: u64, index: &[u8; 16]) -> u64 {
        use std::arch::x86_64::{__m128i, _mm_cvtsi64_si128, _mm_cvtsi128_si64, _mm_loadu_si128, _mm_shuffle_epi8};
        // SAFETY: only reached from functions compiled with SSSE3 enabled, which run only where
        // the CPU has it; the load reads the 16 bytes of `index`.
        unsafe {
            let mask = _mm_loadu_si128(index.as_ptr().cast::<__m128i>());
            _mm_cvtsi128_si64(_mm_shuffle_epi8(_mm_cvtsi64_si128(bytes as i64), mask)) as u64
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl ByteMoves for Ssse3 {
    #[inline(always)]
    fn expand(tag: u8, window: u64) -> u64 {
        Ssse3::shuffle(window, &EXPAND[usize::from(tag)])
    }

    #[inline(always)]
    fn compact(tag: u8, word: u64) -> u64 {
        Ssse3::shuffle(word, &COMPACT[usize::from(tag)])
    }

    #[inline(always)]
    fn nonzero(tag: u8) -> usize {
        tag.count_ones() as usize
    }
}

/// Appends the packed encoding of `frame` (whole words) to `out`.
fn pack(frame: &[u8], out: &mut Vec<u8>, ssse3: bool) {
    #[cfg(target_arch = "x86_64")]
    if ssse3 {
        // SAFETY: `ssse3` says the CPU has SSSE3.
        return unsafe { pack_ssse3(frame, out) };
    }
    let _ = ssse3;
    pack_with::<Portable>(frame, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3")]
unsafe fn pack_ssse3(frame: &[u8], out: &mut Vec<u8>) {
    pack_with::<Ssse3>(frame, out);
}

#[inline(always)]
fn pack_with<B: ByteMoves>(frame: &[u8], out: &mut Vec<u8>) {
    let n = frame.len() / WORD;
    let word = |i: usize| u64::from_le_bytes(frame[i * WORD..i * WORD + WORD].try_into().expect("a word"));
    // At most 10 bytes a word (tag, 8 bytes, count), plus 8 bytes of slack: a word's compacted
    // bytes are stored as a whole word before the cursor moves past the non-zero ones.
    let start = out.len();
    let room = n * 10 + WORD;
    out.reserve(room);
    let dst = &mut out.spare_capacity_mut()[..room];
    let mut put = |at: usize, value: u64| {
        let d = &mut dst[at..at + WORD];
        // SAFETY: `d` is 8 bytes of `out`'s spare capacity (the slice is bounds-checked); one
        // unaligned 8-byte write initialises them all, where 8 byte writes are 8 stores.
        unsafe { d.as_mut_ptr().cast::<u64>().write_unaligned(value.to_le()) };
    };
    let mut j = 0;
    let mut i = 0;
    while i < n {
        let w = word(i);
        i += 1;
        let tag = tag_of(w);
        match tag {
            0 => {
                let mut run = 0;
                while i + run < n && run < 255 && word(i + run) == 0 {
                    run += 1;
                }
                put(j, u64::from(run as u8) << 8);
                j += 2;
                i += run;
            }
            0xff => {
                put(j, 0xff);
                put(j + 1, w);
                let mut run = 0;
                while i + run < n && run < 255 && at_most_one_zero_byte(word(i + run)) {
                    run += 1;
                }
                put(j + 9, run as u64);
                j += 10;
                for k in 0..run {
                    put(j, word(i + k));
                    j += WORD;
                }
                i += run;
            }
            _ => {
                put(j, u64::from(tag));
                put(j + 1, B::compact(tag, w));
                j += 1 + usize::from(NONZERO[usize::from(tag)]);
            }
        }
    }
    // SAFETY: every byte of dst[..j] was written above (some more than once; bytes written past
    // j are left out).
    unsafe { out.set_len(start + j) };
}

/// One step of reading packed bytes.
enum Step<T> {
    /// The value.
    Word(T),
    /// The bytes end first.
    More,
    /// The bytes are no valid packing of a message.
    Bad(Cow<'static, str>),
}

/// What a run of words that overshoots the message is.
const RUN_PAST_END: &str = "a packed run goes on past the end of the message";

/// Reads packed bytes from the start of a frame, a word at a time (for the segment table).
struct Unpacker<'a> {
    src: &'a [u8],
    pos: usize,
    /// Zero words still due from a 0x00 run.
    zeros: usize,
    /// Words still to copy from a 0xff run.
    raw: usize,
}

impl<'a> Unpacker<'a> {
    fn new(src: &'a [u8]) -> Self {
        Unpacker { src, pos: 0, zeros: 0, raw: 0 }
    }

    /// The next word.
    fn next_word(&mut self) -> Step<u64> {
        if self.zeros > 0 {
            self.zeros -= 1;
            return Step::Word(0);
        }
        if self.raw > 0 {
            let Some(bytes) = self.src.get(self.pos..self.pos + WORD) else { return Step::More };
            self.raw -= 1;
            self.pos += WORD;
            return Step::Word(u64::from_le_bytes(bytes.try_into().expect("a word")));
        }
        let Some(&tag) = self.src.get(self.pos) else { return Step::More };
        match tag {
            0 => {
                let Some(&count) = self.src.get(self.pos + 1) else { return Step::More };
                self.zeros = usize::from(count);
                self.pos += 2;
                Step::Word(0)
            }
            0xff => {
                let Some(bytes) = self.src.get(self.pos + 1..self.pos + 10) else { return Step::More };
                self.raw = usize::from(bytes[8]);
                self.pos += 10;
                Step::Word(u64::from_le_bytes(bytes[..WORD].try_into().expect("a word")))
            }
            _ => {
                let n = usize::from(NONZERO[usize::from(tag)]);
                let Some(bytes) = self.src.get(self.pos + 1..self.pos + 1 + n) else { return Step::More };
                self.pos += 1 + n;
                Step::Word(expand_short(tag, bytes))
            }
        }
    }

    /// Walks past `n` words without unpacking them: tags say how many bytes each word takes and
    /// how long each run is. Done when the position is right after the `n`th word's encoding.
    fn skip_words(&mut self, mut n: usize) -> Step<()> {
        let zeros = self.zeros.min(n);
        self.zeros -= zeros;
        n -= zeros;
        let raw = self.raw.min(n);
        self.raw -= raw;
        self.pos += raw * WORD;
        n -= raw;
        if self.zeros > 0 || self.raw > 0 {
            return Step::Bad(RUN_PAST_END.into());
        }
        let len = self.src.len();
        if self.pos > len {
            return Step::More;
        }
        // Where every read of the fast loop stays within the bytes; the last few bytes are
        // walked the same way in a copy padded with zeros.
        if let Err(at) = skip_fast(self.src, len.saturating_sub(9), &mut self.pos, &mut n) {
            self.pos = at;
            return Step::Bad(RUN_PAST_END.into());
        }
        // A raw run's words may not all be there yet.
        if self.pos > len || (n > 0 && self.pos == len) {
            return Step::More;
        }
        if n == 0 {
            return Step::Word(());
        }
        let (tail, start) = padded_tail(self.src, self.pos);
        let stop = start + (len - self.pos);
        let mut at = start;
        if let Err(bad) = skip_fast(&tail, stop, &mut at, &mut n) {
            self.pos += bad - start;
            return Step::Bad(RUN_PAST_END.into());
        }
        // Past `stop`, the walk read padding, not bytes of the frame.
        if n > 0 || at > stop {
            return Step::More;
        }
        self.pos += at - start;
        Step::Word(())
    }
}

/// The bytes of `src` from `pos` on (fewer than 10), followed by zeros, so the fast loops can run
/// to the end; and where in the copy they start. The copy takes `src`'s last 16 bytes when it has
/// that many: a fixed-size copy, where copying just the rest is a call to `memcpy`.
#[inline(always)]
fn padded_tail(src: &[u8], pos: usize) -> ([u8; 48], usize) {
    let mut tail = [0u8; 48];
    if src.len() >= 16 {
        tail[..16].copy_from_slice(&src[src.len() - 16..]);
        (tail, 16 - (src.len() - pos))
    } else {
        for (t, &b) in tail.iter_mut().zip(&src[pos..]) {
            *t = b;
        }
        (tail, 0)
    }
}

/// Walks past words while any are due and the position is below `stop`; `src` must have 10
/// bytes from any position below `stop`. On a run going past the words due, the run's position.
#[inline(always)]
fn skip_fast(src: &[u8], stop: usize, pos: &mut usize, n: &mut usize) -> Result<(), usize> {
    let (mut p, mut left) = (*pos, *n);
    while left > 0 && p < stop {
        let tag = src[p];
        match tag {
            0 | 0xff => {
                let count = usize::from(if tag == 0 { src[p + 1] } else { src[p + 9] });
                if count >= left {
                    return Err(p);
                }
                left -= 1 + count;
                p += if tag == 0 { 2 } else { 10 + count * WORD };
            }
            _ => {
                left -= 1;
                p += 1 + usize::from(NONZERO[usize::from(tag)]);
            }
        }
    }
    (*pos, *n) = (p, left);
    Ok(())
}

/// The segment table at the start of a packed frame, and where its encoding ends.
struct PackedTable<'a> {
    /// Words of the table.
    table_words: usize,
    /// The table's first word.
    first: u64,
    /// Words of the whole message, table included.
    total_words: usize,
    /// Positioned after the table (possibly inside a run that began in it).
    rest: Unpacker<'a>,
}

impl<'a> PackedTable<'a> {
    /// Reads the table from the start of `buf`, checking it against the frame limit; `None`
    /// while more bytes are needed.
    #[inline(always)]
    fn read(buf: &'a [u8], max_frame: usize) -> Result<Option<PackedTable<'a>>, DecodeError> {
        // One segment, the usual case: a tag with the low four bits clear (segment count - 1 is
        // zero) and the size's non-zero bytes.
        if let Some(&tag) = buf.first() {
            if tag & 0x0f == 0 && tag != 0 {
                let len = 1 + usize::from(NONZERO[usize::from(tag)]);
                if buf.len() < len {
                    return Ok(None);
                }
                let first = match buf.get(1..1 + WORD) {
                    Some(window) => Portable::expand(tag, u64::from_le_bytes(window.try_into().expect("8 bytes"))),
                    None => expand_short(tag, &buf[1..len]),
                };
                let total_words = 1 + (first >> 32) as usize;
                if total_words > max_frame / WORD {
                    return Err(too_long(Format::CapnpPacked, total_words * WORD, max_frame));
                }
                let rest = Unpacker { src: buf, pos: len, zeros: 0, raw: 0 };
                return Ok(Some(PackedTable { table_words: 1, first, total_words, rest }));
            }
        }
        let mut table = TableReader::new(Format::CapnpPacked, max_frame);
        let mut rest = Unpacker::new(buf);
        let mut first = 0;
        while !table.complete() {
            let at = rest.pos;
            match rest.next_word() {
                Step::Word(word) => {
                    if at == 0 {
                        first = word;
                    }
                    table.push(word, at)?;
                }
                Step::More => return Ok(None),
                Step::Bad(what) => return Err(DecodeError::new(Format::CapnpPacked, at, what)),
            }
        }
        Ok(Some(PackedTable { table_words: table.table_words(), first, total_words: table.total_words(), rest }))
    }
}

/// Unpacks the packed message that `frame` holds into `buffer` (grown when too small, up to the
/// frame limit) and returns its length in words. The frame must end with the message.
fn unpack(frame: &[u8], buffer: &mut Vec<Word>, max_frame: usize, ssse3: bool) -> Result<usize, DecodeError> {
    match unpack_message(frame, buffer, max_frame, ssse3)? {
        Some((len, words)) if len == frame.len() => Ok(words),
        Some((len, _)) => Err(DecodeError::new(
            Format::CapnpPacked,
            len,
            format!("{} bytes after the end of the packed message", frame.len() - len),
        )),
        None => Err(DecodeError::new(Format::CapnpPacked, frame.len(), "the frame ends inside the packed message")),
    }
}

/// Unpacks the packed message at the start of `src` into `buffer` (grown when too small, up to
/// the frame limit): its length in packed bytes and in words, or `None` if `src` ends first.
fn unpack_message(
    src: &[u8],
    buffer: &mut Vec<Word>,
    max_frame: usize,
    ssse3: bool,
) -> Result<Option<(usize, usize)>, DecodeError> {
    #[cfg(target_arch = "x86_64")]
    if ssse3 {
        // SAFETY: `ssse3` says the CPU has SSSE3 and POPCNT.
        return unsafe { unpack_ssse3(src, buffer, max_frame) };
    }
    let _ = ssse3;
    unpack_with::<Portable>(src, buffer, max_frame)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3,popcnt")]
unsafe fn unpack_ssse3(
    src: &[u8],
    buffer: &mut Vec<Word>,
    max_frame: usize,
) -> Result<Option<(usize, usize)>, DecodeError> {
    unpack_with::<Ssse3>(src, buffer, max_frame)
}

#[inline(always)]
fn unpack_with<B: ByteMoves>(
    src: &[u8],
    buffer: &mut Vec<Word>,
    max_frame: usize,
) -> Result<Option<(usize, usize)>, DecodeError> {
    let bad = |at: usize, what: &'static str| DecodeError::new(Format::CapnpPacked, at, what);
    let Some(table) = PackedTable::read(src, max_frame)? else { return Ok(None) };
    let total = table.total_words;
    // 4 words of slack past the message, for the fixed-size writes of short runs.
    if buffer.len() < total + 4 {
        buffer.resize(total + 4, word_of(0));
    }
    let out = &mut Word::words_to_bytes_mut(buffer)[..(total + 4) * WORD];
    let end = total * WORD;
    out[..WORD].copy_from_slice(&table.first.to_le_bytes());
    if table.table_words > 1 {
        // The table's other words again, from the start.
        let mut head = Unpacker::new(src);
        for word in out[..table.table_words * WORD].chunks_exact_mut(WORD) {
            let Step::Word(value) = head.next_word() else { return Ok(None) };
            word.copy_from_slice(&value.to_le_bytes());
        }
    }
    let Unpacker { mut pos, zeros, raw, .. } = table.rest;
    let mut o = table.table_words * WORD;
    // The rest of a run begun in the table.
    if (zeros + raw) * WORD > end - o {
        return Err(bad(pos, RUN_PAST_END));
    }
    if zeros > 0 {
        out[o..o + zeros * WORD].fill(0);
        o += zeros * WORD;
    }
    if raw > 0 {
        let Some(bytes) = src.get(pos..pos + raw * WORD) else { return Ok(None) };
        out[o..o + raw * WORD].copy_from_slice(bytes);
        o += raw * WORD;
        pos += raw * WORD;
    }
    // Where every read of the fast loop stays within `src`; the last few bytes are unpacked the
    // same way from a copy padded with zeros.
    match unpack_fast::<B>(src, src.len().saturating_sub(9), &mut pos, out, end, &mut o) {
        Ok(()) => {}
        Err(Fault::Cut) => return Ok(None),
        Err(Fault::RunPastEnd(at)) => return Err(bad(at, RUN_PAST_END)),
    }
    if o < end {
        // Fewer than 10 bytes are left: the last 16 bytes of `src` (a fixed-size copy) or all of
        // a shorter `src`, then zeros.
        let (tail, start) = padded_tail(src, pos);
        let stop = start + (src.len() - pos);
        let mut at = start;
        match unpack_fast::<B>(&tail, stop, &mut at, out, end, &mut o) {
            Ok(()) => {}
            Err(Fault::Cut) => return Ok(None),
            Err(Fault::RunPastEnd(bad_at)) => return Err(bad(pos + bad_at - start, RUN_PAST_END)),
        }
        // Past `stop`, the words came from padding, not from `src`.
        if o < end || at > stop {
            return Ok(None);
        }
        pos += at - start;
    }
    Ok(Some((pos, total)))
}

/// Why [`unpack_fast`] stopped early.
enum Fault {
    /// A raw run's words are not all there.
    Cut,
    /// A run at this position goes on past the words due.
    RunPastEnd(usize),
}

/// Unpacks words into `out` from `*o` on while any are due (up to `end`) and the position in
/// `src` is below `stop`; `src` must have 10 bytes from any position below `stop`, and `out` 4
/// words past `end`.
#[inline(always)]
fn unpack_fast<B: ByteMoves>(
    src: &[u8],
    stop: usize,
    pos: &mut usize,
    out: &mut [u8],
    end: usize,
    o: &mut usize,
) -> Result<(), Fault> {
    let (mut p, mut q) = (*pos, *o);
    // Each word's tag is taken from the bytes already loaded where it can be (see the arms), so
    // the chain from one tag to the next has no load in it but after a raw run.
    let mut tag = src.get(p).copied().unwrap_or_default();
    while q < end && p < stop {
        let window = u64::from_le_bytes(src[p + 1..p + 1 + WORD].try_into().expect("8 bytes"));
        match tag {
            // Short runs are written as 4 words at once: a fixed-size write, where an exact one
            // is a call to `memset` or `memcpy`. The words past the run are written again by the
            // words that follow, or are the slack past `end`.
            0 => {
                let n = (1 + usize::from(src[p + 1])) * WORD;
                if n > end - q {
                    return Err(Fault::RunPastEnd(p));
                }
                if n <= 4 * WORD {
                    out[q..q + 4 * WORD].copy_from_slice(&[0; 4 * WORD]);
                } else {
                    out[q..q + n].fill(0);
                }
                q += n;
                p += 2;
                // After the tag and the count.
                tag = (window >> 8) as u8;
            }
            0xff => {
                let n = usize::from(src[p + 9]) * WORD;
                if WORD + n > end - q {
                    return Err(Fault::RunPastEnd(p));
                }
                out[q..q + WORD].copy_from_slice(&window.to_le_bytes());
                // Most runs are the one word (a timestamp, say): nothing more to copy, and near the
                // end of the bytes the fixed-size copy below would not fit and become a call.
                if n > 0 {
                    let Some(raw) = src.get(p + 10..p + 10 + n) else { return Err(Fault::Cut) };
                    match src.get(p + 10..p + 10 + 3 * WORD) {
                        Some(words) if n <= 3 * WORD => {
                            out[q + WORD..q + 4 * WORD].copy_from_slice(words);
                        }
                        _ => out[q + WORD..q + WORD + n].copy_from_slice(raw),
                    }
                }
                q += WORD + n;
                p += 10 + n;
                tag = src.get(p).copied().unwrap_or_default();
            }
            _ => {
                out[q..q + WORD].copy_from_slice(&B::expand(tag, window).to_le_bytes());
                q += WORD;
                let n = B::nonzero(tag);
                p += 1 + n;
                // A tag other than 0xff has at most 7 non-zero bytes: the next tag is in the window.
                tag = (window >> (8 * n)) as u8;
            }
        }
    }
    (*pos, *o) = (p, q);
    Ok(())
}

/// The byte of the packed `frame` where the encoding of the word holding unpacked byte `offset`
/// starts (the tag of its run, for a word inside a run of zeros). Only for error reports.
fn packed_offset(frame: &[u8], offset: usize) -> usize {
    let mut unpacker = Unpacker::new(frame);
    let mut last_tag = 0;
    for _ in 0..offset / WORD {
        if unpacker.zeros == 0 && unpacker.raw == 0 {
            last_tag = unpacker.pos;
        }
        if !matches!(unpacker.next_word(), Step::Word(_)) {
            return unpacker.pos;
        }
    }
    if unpacker.zeros > 0 { last_tag } else { unpacker.pos }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    fn symbol(s: &str) -> Symbol {
        Symbol::new(s).unwrap()
    }

    /// One message of every type, an unknown one included.
    fn every_type() -> Vec<Message<'static>> {
        let (timestamp, s) = (1_493_127_000_123_456_789, symbol("ZIEXT"));
        let trade =
            Trade { sale_condition: 0x40, timestamp, symbol: s, size: 100, price: Price(1_234_500), trade_id: 42 };
        vec![
            Message::SystemEvent(SystemEvent { event: b'R', timestamp }),
            Message::SecurityDirectory(SecurityDirectory {
                flags: 0x80,
                timestamp,
                symbol: s,
                round_lot_size: 100,
                adjusted_poc_price: Price(99_0500),
                luld_tier: 1,
            }),
            Message::TradingStatus(TradingStatus { status: b'H', timestamp, symbol: s, reason: *b"T1  " }),
            Message::RetailLiquidityIndicator(RetailLiquidityIndicator { indicator: b'A', timestamp, symbol: s }),
            Message::OperationalHaltStatus(OperationalHaltStatus { status: b'O', timestamp, symbol: s }),
            Message::ShortSalePriceTestStatus(ShortSalePriceTestStatus {
                in_effect: 1,
                timestamp,
                symbol: s,
                detail: b'A',
            }),
            Message::SecurityEvent(SecurityEvent { event: b'C', timestamp, symbol: s }),
            Message::PriceLevelUpdate(PriceLevelUpdate {
                side: Side::Buy,
                event_flags: 1,
                timestamp,
                symbol: s,
                size: 300,
                price: Price(99_0400),
            }),
            Message::PriceLevelUpdate(PriceLevelUpdate {
                side: Side::Sell,
                event_flags: 0,
                timestamp,
                symbol: s,
                size: 0,
                price: Price(99_0600),
            }),
            Message::QuoteUpdate(QuoteUpdate {
                flags: 0x40,
                timestamp,
                symbol: s,
                bid_size: 1,
                bid_price: Price(2),
                ask_price: Price(3),
                ask_size: 4,
            }),
            Message::TradeReport(trade),
            Message::TradeBreak(trade),
            Message::OfficialPrice(OfficialPrice { price_type: b'Q', timestamp, symbol: s, price: Price(-5) }),
            Message::AuctionInformation(AuctionInformation {
                auction_type: b'C',
                timestamp,
                symbol: s,
                paired_shares: 1,
                reference_price: Price(2),
                indicative_clearing_price: Price(3),
                imbalance_shares: 4,
                imbalance_side: b'B',
                extension_number: 5,
                scheduled_auction_time: 6,
                auction_book_clearing_price: Price(7),
                collar_reference_price: Price(8),
                lower_auction_collar: Price(9),
                upper_auction_collar: Price(10),
            }),
            Message::Unknown(UnknownMessage { kind: b'z', bytes: b"zunknown bytes" }),
        ]
    }

    fn header() -> BatchHeader {
        BatchHeader {
            protocol_id: 0x8004,
            channel_id: 1,
            session_id: 1_150_681_088,
            first_sequence: 7,
            message_count: 0,
            send_time: 1_493_127_000_123_456_000,
            publish_time: 1_493_127_000_123_999_000,
        }
    }

    fn encode(packed: bool, messages: &[Message<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        CapnpCodec::new(Limits::default(), packed).encode(&header(), messages, &mut out).unwrap();
        out
    }

    fn decode(codec: &mut CapnpCodec, frame: &[u8]) -> Result<(BatchHeader, Vec<String>), DecodeError> {
        let mut seen = Vec::new();
        let header = codec.decode(frame, |m| seen.push(format!("{m:?}")))?;
        Ok((header, seen))
    }

    fn debug(messages: &[Message<'_>]) -> Vec<String> {
        messages.iter().map(|m| format!("{m:?}")).collect()
    }

    /// A one-segment unpacked frame of `words` (the segment) behind its table.
    fn unpacked(words: &[u64]) -> Vec<u8> {
        let mut frame = Vec::new();
        frame.extend_from_slice(&0u32.to_le_bytes());
        frame.extend_from_slice(&(words.len() as u32).to_le_bytes());
        for w in words {
            frame.extend_from_slice(&w.to_le_bytes());
        }
        frame
    }

    fn packed(frame: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        pack(frame, &mut out, false);
        out
    }

    /// The same bytes at an address that is 8-byte aligned plus `offset`.
    fn at_offset(bytes: &[u8], offset: usize, backing: &mut Vec<Word>) -> std::ops::Range<usize> {
        backing.clear();
        backing.resize((bytes.len() + offset).div_ceil(WORD) + 1, word_of(0));
        let all = Word::words_to_bytes_mut(backing);
        all[offset..offset + bytes.len()].copy_from_slice(bytes);
        offset..offset + bytes.len()
    }

    #[test]
    fn every_type_round_trips_unpacked_and_packed() {
        let messages = every_type();
        for packed in [false, true] {
            let frame = encode(packed, &messages);
            let mut codec = CapnpCodec::new(Limits::default(), packed);
            assert_eq!(codec.frame_len(&frame).unwrap(), Some(frame.len()));
            let (decoded, seen) = decode(&mut codec, &frame).unwrap();
            assert_eq!(seen, debug(&messages));
            assert_eq!(decoded, BatchHeader { message_count: messages.len() as u32, ..header() });
        }
    }

    #[test]
    fn the_encoding_is_what_capnps_own_builder_and_packer_write() {
        let messages = every_type();
        let mut builder = capnp::message::Builder::new_default();
        fill_batch(builder.init_root(), &header(), &messages);
        assert_eq!(encode(false, &messages), capnp::serialize::write_message_to_words(&builder));
        let mut theirs = Vec::new();
        capnp::serialize_packed::write_message(&mut theirs, &builder).unwrap();
        assert_eq!(encode(true, &messages), theirs);
        // And capnp's own reader reads ours.
        let frame = encode(true, &messages);
        let reader = capnp::serialize_packed::read_message(&frame[..], ReaderOptions::new()).unwrap();
        let batch: batch::Reader<'_> = reader.get_root().unwrap();
        assert_eq!(batch.get_messages().unwrap().len() as usize, messages.len());
    }

    #[test]
    fn the_fast_reads_agree_with_the_generated_accessors() {
        let messages = every_type();
        let frame = encode(false, &messages);
        let arena = SegmentReader::new(&frame[WORD..], usize::MAX, NESTING_LIMIT);
        let root = capnp::private::layout::PointerReader::get_root_from_arena(&arena).unwrap();
        let batch: batch::Reader<'_> = capnp::any_pointer::Reader::new(root).get_as().unwrap();
        let mut fast = 0;
        for (m, want) in batch.get_messages().unwrap().iter().zip(&messages) {
            assert_eq!(read_generated(m).as_ref(), Ok(want));
            if let Some(got) = read_common(m) {
                assert_eq!(&got, want);
                fast += 1;
            }
        }
        assert_eq!(fast, 3, "trade reports and both sides of price level updates");
    }

    #[test]
    fn a_huge_segment_count_is_refused_by_the_framer_and_the_decoder() {
        for count_minus_one in [u32::MAX, u32::MAX - 1, MAX_SEGMENTS as u32, 1 << 20] {
            let mut frame = count_minus_one.to_le_bytes().to_vec();
            frame.extend_from_slice(&[1, 0, 0, 0]);
            frame.extend_from_slice(&[0; 64]);
            for packed in [false, true] {
                let bytes = if packed { self::packed(&frame) } else { frame.clone() };
                let mut codec = CapnpCodec::new(Limits::default(), packed);
                let err = codec.frame_len(&bytes).unwrap_err();
                assert!(err.what.contains("segments; at most 511"), "{err}");
                assert!(codec.decode(&bytes, |_| {}).is_err());
            }
        }
    }

    #[test]
    fn segment_sizes_over_the_limit_are_refused_before_anything_is_allocated() {
        let limits = Limits { max_frame: 1024, ..Limits::default() };
        // One segment of 200 words, and three whose third size crosses the limit.
        let one = unpacked(&[0; 4])[..WORD].to_vec();
        let mut one = one;
        one[4..8].copy_from_slice(&200u32.to_le_bytes());
        let mut three = Vec::new();
        for v in [2u32, 60, 60, 60] {
            three.extend_from_slice(&v.to_le_bytes());
        }
        for (frame, offset) in [(one, 0), (three, 12)] {
            for packed in [false, true] {
                let bytes = if packed { self::packed(&frame) } else { frame.clone() };
                let mut codec = CapnpCodec::new(limits, packed);
                // Only the table is there: the limit is checked on it, not on the bytes.
                let err = codec.frame_len(&bytes).unwrap_err();
                assert!(err.what.contains("1024-byte limit"), "{err}");
                if !packed {
                    assert_eq!(err.offset, offset, "{err}");
                }
                assert!(codec.decode(&bytes, |_| {}).is_err());
                assert_eq!(codec.read.capacity(), 0, "nothing was sized from the table");
            }
        }
        // A size near 2^32 words, with the default limit.
        let huge = unpacked(&[0])[..WORD].iter().copied().chain([0xff; 0]).collect::<Vec<_>>();
        let mut huge = huge;
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(CapnpCodec::new(Limits::default(), false).frame_len(&huge).is_err());
        assert!(CapnpCodec::new(Limits::default(), true).frame_len(&self::packed(&huge)).is_err());
    }

    #[test]
    fn the_traversal_limit_stops_a_list_of_empty_structs() {
        // Root pointer to a Batch (5 data words, 1 pointer) whose `messages` is an inline-composite
        // list of a million zero-sized structs: 9 words that would make the reader visit a
        // million elements.
        let root = (5u64 << 32) | (1 << 48);
        let list = 1 | (7u64 << 32);
        let tag = 1u64 << 20 << 2;
        let frame = unpacked(&[root, 0, 0, 0, 0, 0, list, tag]);
        for packed in [false, true] {
            let bytes = if packed { self::packed(&frame) } else { frame.clone() };
            let mut codec = CapnpCodec::new(Limits::default(), packed);
            assert_eq!(codec.frame_len(&bytes).unwrap(), Some(bytes.len()));
            let err = decode(&mut codec, &bytes).unwrap_err();
            assert!(err.what.starts_with("Batch.messages: "), "{err}");
            assert!(err.what.to_lowercase().contains("read limit"), "{err}");
        }
    }

    #[test]
    fn a_packed_stream_cut_anywhere_needs_more_bytes_and_is_no_frame() {
        let messages = every_type();
        let frame = encode(true, &messages);
        // Runs of both kinds are in there: zero words and raw words (the timestamps).
        let mut codec = CapnpCodec::new(Limits::default(), true);
        for cut in 0..frame.len() {
            assert_eq!(codec.frame_len(&frame[..cut]).unwrap(), None, "cut at {cut} of {}", frame.len());
            assert!(codec.decode(&frame[..cut], |_| {}).is_err(), "cut at {cut}");
        }
        // Followed by the start of the next frame, it is delimited exactly.
        let mut stream = frame.clone();
        stream.extend_from_slice(&frame[..5]);
        assert_eq!(codec.frame_len(&stream).unwrap(), Some(frame.len()));
        assert_eq!(decode(&mut codec, &frame).unwrap().1, debug(&messages));
    }

    #[test]
    fn misaligned_frames_decode_like_aligned_ones() {
        let messages = every_type();
        let frame = encode(false, &messages);
        let mut codec = CapnpCodec::new(Limits::default(), false);
        let want = decode(&mut codec, &frame).unwrap();
        let mut backing = Vec::new();
        for offset in 0..WORD {
            let range = at_offset(&frame, offset, &mut backing);
            let bytes = &Word::words_to_bytes(&backing)[range];
            assert_eq!(bytes.as_ptr() as usize % WORD, offset);
            assert_eq!(codec.frame_len(bytes).unwrap(), Some(frame.len()));
            assert_eq!(decode(&mut codec, bytes).unwrap(), want, "offset {offset}");
        }
    }

    #[test]
    fn an_unknown_union_tag_is_an_error_naming_the_message() {
        let messages = every_type();
        let frame = encode(false, &messages);
        let mut codec = CapnpCodec::new(Limits::default(), false);
        // The list elements start after the table, root pointer, Batch (6 words) and list tag.
        let element = WORD * (1 + 1 + 6 + 1) + 2 * message_words() * WORD;
        let mut bad = frame.clone();
        bad[element + 18..element + 20].copy_from_slice(&99u16.to_le_bytes());
        let err = codec.decode(&bad, |_| {}).unwrap_err();
        assert_eq!(err.offset, element, "{err}");
        assert!(err.what.contains("Batch.messages[2]: union tag 99"), "{err}");
        // Packed, the offset is where that element's first word is encoded.
        let packed = self::packed(&bad);
        let err = CapnpCodec::new(Limits::default(), true).decode(&packed, |_| {}).unwrap_err();
        assert!(err.what.contains("union tag 99"), "{err}");
        assert!(err.offset > 0 && err.offset < packed.len(), "{err}");
    }

    #[test]
    fn unknown_messages_the_schema_cannot_carry_are_refused() {
        let mut codec = CapnpCodec::new(Limits::default(), false);
        let long = vec![b'z'; MAX_UNKNOWN_LEN + 1];
        for (bytes, kind) in [(&b""[..], b'z'), (&b"yabc"[..], b'z'), (&long[..], b'z')] {
            let mut out = vec![1, 2, 3];
            let message = Message::Unknown(UnknownMessage { kind, bytes });
            assert!(codec.encode(&header(), &[message], &mut out).is_err());
            assert_eq!(out, [1, 2, 3], "nothing appended");
        }
    }

    #[test]
    fn decode_unpacks_a_frame_again_when_it_is_not_the_one_just_delimited() {
        let messages = every_type();
        // The same bytes but one, so the same length: another trade id.
        let other: Vec<Message<'_>> = messages
            .iter()
            .map(|m| match m {
                Message::TradeReport(t) => Message::TradeReport(Trade { trade_id: 43, ..*t }),
                other => *other,
            })
            .collect();
        let (a, b) = (encode(true, &messages), encode(true, &other));
        assert_eq!(a.len(), b.len());
        assert_ne!(a, b);
        let mut codec = CapnpCodec::new(Limits::default(), true);
        assert_eq!(codec.frame_len(&a).unwrap(), Some(a.len()));
        assert_eq!(decode(&mut codec, &b).unwrap().1, debug(&other));
        assert_eq!(decode(&mut codec, &a).unwrap().1, debug(&messages));
    }

    #[test]
    fn walking_the_tags_delimits_like_unpacking() {
        let mut rng = Pcg64::seed_from_u64(3);
        let all = every_type();
        let codec = CapnpCodec::new(Limits { max_frame: 4096, ..Limits::default() }, true);
        for round in 0..5_000 {
            let messages: Vec<Message<'_>> =
                (0..rng.random_range(0..6)).map(|_| all[rng.random_range(0..all.len())]).collect();
            let mut bytes = encode(true, &messages);
            bytes.extend_from_slice(&encode(true, &all)[..rng.random_range(0..20)]);
            if round % 2 == 0 {
                let at = rng.random_range(0..bytes.len());
                bytes[at] = rng.random();
            }
            bytes.truncate(rng.random_range(0..=bytes.len()));
            let unpacking = codec.frame_len(&bytes);
            let walking = {
                // Held elsewhere: frame_len only walks the tags.
                let _held = codec.delimited.borrow_mut();
                codec.frame_len(&bytes)
            };
            match (&unpacking, &walking) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{bytes:02x?}"),
                (Err(_), Err(_)) => {}
                _ => panic!("unpacking {unpacking:?}, walking {walking:?}: {bytes:02x?}"),
            }
        }
    }

    #[test]
    fn byte_moves_match_a_plain_loop_for_every_tag() {
        let mut rng = Pcg64::seed_from_u64(1);
        for tag in 0..=255u8 {
            let window: u64 = rng.random();
            let mut expanded = [0u8; WORD];
            let mut k = 0;
            for (b, out) in expanded.iter_mut().enumerate() {
                if tag & (1 << b) != 0 {
                    *out = window.to_le_bytes()[k];
                    k += 1;
                }
            }
            let expanded = u64::from_le_bytes(expanded);
            assert_eq!(Portable::expand(tag, window), expanded, "tag {tag:#x}");
            assert_eq!(usize::from(NONZERO[usize::from(tag)]), k);
            // Compacting the expanded word gives back the window's first k bytes.
            let low = if k == WORD { u64::MAX } else { (1u64 << (8 * k)) - 1 };
            assert_eq!(Portable::compact(tag, expanded) & low, window & low, "tag {tag:#x}");
            if expanded.to_le_bytes().iter().all(|&b| b != 0) || tag == 0 {
                assert_eq!(tag_of(expanded), if tag == 0 { 0 } else { tag });
            }
            #[cfg(target_arch = "x86_64")]
            if has_ssse3() {
                assert_eq!(Ssse3::expand(tag, window), expanded, "tag {tag:#x}");
                assert_eq!(Ssse3::compact(tag, expanded) & low, window & low, "tag {tag:#x}");
            }
        }
        for _ in 0..10_000 {
            let word: u64 = rng.random::<u64>() & rng.random::<u64>() & rng.random::<u64>();
            let tag = word.to_le_bytes().iter().enumerate().fold(0u8, |t, (b, &v)| t | (u8::from(v != 0) << b));
            assert_eq!(tag_of(word), tag, "{word:#x}");
            assert_eq!(at_most_one_zero_byte(word), tag.count_zeros() <= 1, "{word:#x}");
        }
    }

    #[test]
    fn corrupt_and_cut_frames_are_errors_never_panics() {
        let mut rng = Pcg64::seed_from_u64(7);
        let all = every_type();
        for round in 0..20_000 {
            let messages: Vec<Message<'_>> =
                (0..rng.random_range(0..6)).map(|_| all[rng.random_range(0..all.len())]).collect();
            for packed in [false, true] {
                let mut bytes = encode(packed, &messages);
                for _ in 0..rng.random_range(1..4) {
                    let at = rng.random_range(0..bytes.len());
                    bytes[at] =
                        if rng.random_bool(0.5) { rng.random() } else { bytes[at] ^ (1 << rng.random_range(0..8)) };
                }
                if round % 3 == 0 {
                    bytes.truncate(rng.random_range(0..=bytes.len()));
                }
                let mut codec = CapnpCodec::new(Limits { max_frame: 4096, ..Limits::default() }, packed);
                if let Ok(Some(len)) = codec.frame_len(&bytes) {
                    assert!(len <= bytes.len());
                    let _ = codec.decode(&bytes[..len], |_| {});
                }
                let _ = codec.decode(&bytes, |_| {});
            }
        }
    }
}
