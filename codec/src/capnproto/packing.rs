//! Cap'n Proto's packing: writing it ([`pack`]), and reading it back ([`unpack_message`], which
//! also finds where a packed frame ends, and [`Unpacker`], which walks the tags without
//! unpacking). The byte moves use SSSE3 where the CPU has it, behind [`Ssse3Available`], a token
//! that only feature detection makes.

use super::framing::{TableReader, WORD, too_long, word_of};
use crate::format::Format;
use crate::frame::DecodeError;
use capnp::Word;
use std::borrow::Cow;

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
//
// `unsafe` here: the SSSE3 intrinsics and the functions compiled with SSSE3 enabled, sound only
// where the CPU has it, which [`Ssse3Available`] proves; and the output writes of `pack_with`.

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
static EXPAND: [[u8; 16]; 256] = shuffle_table(false);

/// Per tag, for each of its non-zero bytes in order, which byte of the word it is.
static COMPACT: [[u8; 16]; 256] = shuffle_table(true);

/// The shuffle indices of every tag: where the tag's `k`th non-zero byte is byte `b` of the
/// word, [`EXPAND`] has `k` at `b` and [`COMPACT`] has `b` at `k`.
const fn shuffle_table(compact: bool) -> [[u8; 16]; 256] {
    let mut table = [[ZERO_BYTE; 16]; 256];
    let mut tag = 0;
    while tag < 256 {
        let mut k = 0;
        let mut b = 0;
        while b < WORD {
            if tag & (1 << b) != 0 {
                if compact {
                    table[tag][k] = b as u8;
                } else {
                    table[tag][b] = k as u8;
                }
                k += 1;
            }
            b += 1;
        }
        tag += 1;
    }
    table
}

/// [`ByteMoves::expand`] for a word whose non-zero `bytes` end the input.
fn expand_short(tag: u8, bytes: &[u8]) -> u64 {
    let mut window = [0u8; WORD];
    for (w, &b) in window.iter_mut().zip(bytes) {
        *w = b;
    }
    Portable.expand(tag, u64::from_le_bytes(window))
}

/// Proof that the CPU this runs on has SSSE3 and POPCNT, what the `*_ssse3` functions are
/// compiled for: only [`Ssse3Available::detect`] makes one (the field is private to this
/// module), so holding one is what makes calling them, and the SSSE3 byte moves, sound. It is
/// zero-sized: passing it around costs nothing. The type exists on every architecture, so the
/// codec holds an `Option` of it everywhere; off x86-64 it is never made.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ssse3Available(());

impl Ssse3Available {
    /// The token, if the CPU has SSSE3 and POPCNT (asked of the CPU once, then cached by `std`);
    /// `None` on any other CPU or architecture.
    pub(super) fn detect() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("ssse3") && std::arch::is_x86_feature_detected!("popcnt") {
            return Some(Ssse3Available(()));
        }
        None
    }
}

/// The byte moves of packing: one implementation per instruction set, a zero-sized value.
trait ByteMoves: Copy {
    /// The word whose non-zero bytes, in order, start `window`, at the positions `tag` marks.
    fn expand(self, tag: u8, window: u64) -> u64;
    /// The non-zero bytes of `word` (whose tag is `tag`), in order, in the low bytes.
    fn compact(self, tag: u8, word: u64) -> u64;
    /// How many non-zero bytes `tag` stands for.
    fn nonzero(self, tag: u8) -> usize;
}

/// Table-driven byte moves, for any CPU.
#[derive(Clone, Copy)]
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
    fn expand(self, tag: u8, window: u64) -> u64 {
        Portable::shuffle(window, &EXPAND[usize::from(tag)])
    }

    #[inline(always)]
    fn compact(self, tag: u8, word: u64) -> u64 {
        Portable::shuffle(word, &COMPACT[usize::from(tag)])
    }

    #[inline(always)]
    fn nonzero(self, tag: u8) -> usize {
        usize::from(NONZERO[usize::from(tag)])
    }
}

/// Byte moves with one SSSE3 PSHUFB each, for the token's holder. Inlined into the `*_ssse3`
/// functions, compiled with SSSE3 enabled, they are one instruction each; called from anywhere
/// else (the tests), they are still sound, only not inlined.
#[cfg(target_arch = "x86_64")]
impl Ssse3Available {
    #[inline(always)]
    fn shuffle(self, bytes: u64, index: &[u8; 16]) -> u64 {
        use std::arch::x86_64::{__m128i, _mm_cvtsi64_si128, _mm_cvtsi128_si64, _mm_loadu_si128, _mm_shuffle_epi8};
        // SAFETY: `self` exists only where the CPU has SSSE3 (PSHUFB; the other three are SSE2,
        // part of every x86-64 CPU), and the load reads the 16 bytes of `index`.
        unsafe {
            let mask = _mm_loadu_si128(index.as_ptr().cast::<__m128i>());
            _mm_cvtsi128_si64(_mm_shuffle_epi8(_mm_cvtsi64_si128(bytes as i64), mask)) as u64
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl ByteMoves for Ssse3Available {
    #[inline(always)]
    fn expand(self, tag: u8, window: u64) -> u64 {
        self.shuffle(window, &EXPAND[usize::from(tag)])
    }

    #[inline(always)]
    fn compact(self, tag: u8, word: u64) -> u64 {
        self.shuffle(word, &COMPACT[usize::from(tag)])
    }

    #[inline(always)]
    fn nonzero(self, tag: u8) -> usize {
        tag.count_ones() as usize
    }
}

/// Appends the packed encoding of `frame` (whole words) to `out`, with SSSE3 when `ssse3` is
/// there.
pub(super) fn pack(frame: &[u8], out: &mut Vec<u8>, ssse3: Option<Ssse3Available>) {
    match ssse3 {
        // SAFETY: the token exists only where the CPU has SSSE3 and POPCNT, all that
        // `pack_ssse3` is compiled to need.
        #[cfg(target_arch = "x86_64")]
        Some(token) => unsafe { pack_ssse3(token, frame, out) },
        _ => pack_with(Portable, frame, out),
    }
}

/// [`pack_with`] compiled with SSSE3, so that the byte moves inline as one instruction each.
///
/// Safety: the CPU must have SSSE3, which the token proves; it is taken, rather than trusted,
/// so that no caller can get this wrong.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3")]
unsafe fn pack_ssse3(ssse3: Ssse3Available, frame: &[u8], out: &mut Vec<u8>) {
    pack_with(ssse3, frame, out);
}

#[inline(always)]
fn pack_with<B: ByteMoves>(moves: B, frame: &[u8], out: &mut Vec<u8>) {
    let n = frame.len() / WORD;
    let word = |i: usize| u64::from_le_bytes(frame[i * WORD..i * WORD + WORD].try_into().expect("a word"));
    // At most 10 bytes a word (tag, 8 bytes, count), plus 8 bytes of slack: a word's compacted
    // bytes are stored as a whole word before the cursor moves past the non-zero ones.
    let start = out.len();
    let room = n * 10 + WORD;
    out.reserve(room);
    let dst = &mut out.spare_capacity_mut()[..room];
    // Written with unaligned 8-byte stores into the spare capacity, then `set_len`: the safe ways
    // measured slower on Cap'n Proto packed serialize (DEEP10 trades and quotes, 108,827 frames;
    // A/B runs alternated, each run's total itself a median of 9). Zeroing the room first
    // (`resize`) and storing with `copy_from_slice`: medians 15.32 against 14.84 ms and 15.31
    // against 14.57 ms; over three sets of runs, a median paired ratio of +3.4%, +3.4% and +6.3%,
    // slower in 48 of 57 pairs. Packing into a zeroed stack buffer and appending what was used:
    // 11.17 against 10.86 ms, +2.2% paired, slower in 19 of 21. Storing each byte with
    // `MaybeUninit::write`, which leaves `set_len` the only `unsafe`: 10.72 against 10.37 ms and
    // 10.67 against 10.08 ms, +3.8% and +5.5% paired, slower in 33 of 42. The same binary
    // against itself: +0.0% paired, slower in 10 of 21.
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
                put(j + 1, moves.compact(tag, w));
                j += 1 + usize::from(NONZERO[usize::from(tag)]);
            }
        }
    }
    // SAFETY: every byte of dst[..j] was written above (some more than once; bytes written past
    // j are left out).
    unsafe { out.set_len(start + j) };
}

/// One step of reading packed bytes.
pub(super) enum Step<T> {
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
pub(super) struct Unpacker<'a> {
    src: &'a [u8],
    /// Where the next word's encoding starts.
    pub(super) pos: usize,
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
    pub(super) fn skip_words(&mut self, mut n: usize) -> Step<()> {
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
pub(super) struct PackedTable<'a> {
    /// Words of the table.
    pub(super) table_words: usize,
    /// The table's first word.
    first: u64,
    /// Words of the whole message, table included.
    pub(super) total_words: usize,
    /// Positioned after the table (possibly inside a run that began in it).
    pub(super) rest: Unpacker<'a>,
}

impl<'a> PackedTable<'a> {
    /// Reads the table from the start of `buf`, checking it against the frame limit; `None`
    /// while more bytes are needed.
    #[inline(always)]
    pub(super) fn read(buf: &'a [u8], max_frame: usize) -> Result<Option<PackedTable<'a>>, DecodeError> {
        // One segment, the usual case: a tag with the low four bits clear (segment count - 1 is
        // zero) and the size's non-zero bytes.
        if let Some(&tag) = buf.first()
            && tag & 0x0f == 0
            && tag != 0
        {
            let len = 1 + usize::from(NONZERO[usize::from(tag)]);
            if buf.len() < len {
                return Ok(None);
            }
            let first = match buf.get(1..1 + WORD) {
                Some(window) => Portable.expand(tag, u64::from_le_bytes(window.try_into().expect("8 bytes"))),
                None => expand_short(tag, &buf[1..len]),
            };
            let total_words = 1 + (first >> 32) as usize;
            if total_words > max_frame / WORD {
                return Err(too_long(Format::CapnpPacked, total_words * WORD, max_frame));
            }
            let rest = Unpacker { src: buf, pos: len, zeros: 0, raw: 0 };
            return Ok(Some(PackedTable { table_words: 1, first, total_words, rest }));
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
pub(super) fn unpack(
    frame: &[u8],
    buffer: &mut Vec<Word>,
    max_frame: usize,
    ssse3: Option<Ssse3Available>,
) -> Result<usize, DecodeError> {
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

/// The most words one byte of packed input can unpack to: a zero run is two bytes (the zero tag
/// and a count of up to 255 more zero words) for up to 256 words.
const MOST_WORDS_PER_BYTE: usize = 128;

/// Unpacks the packed message at the start of `src` into `buffer` (grown when too small, up to
/// the frame limit and to what `src` can unpack to): its length in packed bytes and in words, or
/// `None` if `src` ends first.
pub(super) fn unpack_message(
    src: &[u8],
    buffer: &mut Vec<Word>,
    max_frame: usize,
    ssse3: Option<Ssse3Available>,
) -> Result<Option<(usize, usize)>, DecodeError> {
    match ssse3 {
        // SAFETY: the token exists only where the CPU has SSSE3 and POPCNT, all that
        // `unpack_ssse3` is compiled to need.
        #[cfg(target_arch = "x86_64")]
        Some(token) => unsafe { unpack_ssse3(token, src, buffer, max_frame) },
        _ => unpack_with(Portable, src, buffer, max_frame),
    }
}

/// [`unpack_with`] compiled with SSSE3 and POPCNT, so that the byte moves and the counts of
/// non-zero bytes inline as one instruction each.
///
/// Safety: the CPU must have SSSE3 and POPCNT, which the token proves; it is taken, rather than
/// trusted, so that no caller can get this wrong.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3,popcnt")]
unsafe fn unpack_ssse3(
    ssse3: Ssse3Available,
    src: &[u8],
    buffer: &mut Vec<Word>,
    max_frame: usize,
) -> Result<Option<(usize, usize)>, DecodeError> {
    unpack_with(ssse3, src, buffer, max_frame)
}

#[inline(always)]
fn unpack_with<B: ByteMoves>(
    moves: B,
    src: &[u8],
    buffer: &mut Vec<Word>,
    max_frame: usize,
) -> Result<Option<(usize, usize)>, DecodeError> {
    let bad = |at: usize, what: &'static str| DecodeError::new(Format::CapnpPacked, at, what);
    let Some(table) = PackedTable::read(src, max_frame)? else { return Ok(None) };
    let total = table.total_words;
    // The table is untrusted: no more is allocated than `src` can unpack to. Two bytes (a zero
    // tag and its count) are at most 256 words, the most any packed bytes expand; a table that
    // declares more is a frame not yet whole, and the words are not made until it is.
    if total > src.len().saturating_mul(MOST_WORDS_PER_BYTE) {
        return Ok(None);
    }
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
    match unpack_fast(moves, src, src.len().saturating_sub(9), &mut pos, out, end, &mut o) {
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
        match unpack_fast(moves, &tail, stop, &mut at, out, end, &mut o) {
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
    moves: B,
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
                out[q..q + WORD].copy_from_slice(&moves.expand(tag, window).to_le_bytes());
                q += WORD;
                let n = moves.nonzero(tag);
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
pub(super) fn packed_offset(frame: &[u8], offset: usize) -> usize {
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
    use super::super::tests::rounds;
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    /// Miri cannot execute SSSE3 instructions: under it, every test must take the portable path.
    #[cfg(miri)]
    #[test]
    fn miri_runs_the_portable_byte_moves() {
        assert!(Ssse3Available::detect().is_none());
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
            assert_eq!(Portable.expand(tag, window), expanded, "tag {tag:#x}");
            assert_eq!(usize::from(NONZERO[usize::from(tag)]), k);
            // Compacting the expanded word gives back the window's first k bytes.
            let low = if k == WORD { u64::MAX } else { (1u64 << (8 * k)) - 1 };
            assert_eq!(Portable.compact(tag, expanded) & low, window & low, "tag {tag:#x}");
            if expanded.to_le_bytes().iter().all(|&b| b != 0) || tag == 0 {
                assert_eq!(tag_of(expanded), if tag == 0 { 0 } else { tag });
            }
            #[cfg(target_arch = "x86_64")]
            if let Some(ssse3) = Ssse3Available::detect() {
                assert_eq!(ssse3.expand(tag, window), expanded, "tag {tag:#x}");
                assert_eq!(ssse3.compact(tag, expanded) & low, window & low, "tag {tag:#x}");
            }
        }
        for _ in 0..rounds(500, 10_000) {
            let word: u64 = rng.random::<u64>() & rng.random::<u64>() & rng.random::<u64>();
            let tag = word.to_le_bytes().iter().enumerate().fold(0u8, |t, (b, &v)| t | (u8::from(v != 0) << b));
            assert_eq!(tag_of(word), tag, "{word:#x}");
            assert_eq!(at_most_one_zero_byte(word), tag.count_zeros() <= 1, "{word:#x}");
        }
    }

    #[test]
    fn a_table_claiming_more_than_the_bytes_can_unpack_to_allocates_nothing_for_it() {
        // The most compressible message there is: a table, then zero words, two bytes per 256.
        let words = 100_000;
        let mut frame = (((words - 1) as u64) << 32).to_le_bytes().to_vec();
        frame.resize(words * WORD, 0);
        let mut packed = Vec::new();
        pack(&frame, &mut packed, None);
        let mut buffer = Vec::new();
        assert_eq!(unpack_message(&packed, &mut buffer, 1 << 20, None).unwrap(), Some((packed.len(), words)));
        assert_eq!(Word::words_to_bytes(&buffer)[..frame.len()], frame[..]);
        // The same table with only part of its runs: more words than these bytes can give.
        let mut buffer = Vec::new();
        assert_eq!(unpack_message(&packed[..16], &mut buffer, 1 << 20, None).unwrap(), None);
        assert!(buffer.capacity() < 16 * MOST_WORDS_PER_BYTE, "{} words made for 16 bytes", buffer.capacity());
    }

    /// A message of `words` words (the table's included) whose bytes are zero or not at random,
    /// with runs of zero words and of words without zero bytes, so every kind of tag comes up.
    fn random_message(rng: &mut Pcg64, words: usize) -> Vec<u8> {
        let mut frame = (((words - 1) as u64) << 32).to_le_bytes().to_vec();
        while frame.len() < words * WORD {
            let word: u64 = match rng.random_range(0..4) {
                0 => 0,
                1 => rng.random::<u64>() | 0x0101_0101_0101_0101,
                _ => rng.random::<u64>() & rng.random::<u64>() & rng.random::<u64>(),
            };
            let longest = if rng.random_bool(0.1) { 300 } else { 3 };
            let run = rng.random_range(1..longest);
            for _ in 0..run.min(words - frame.len() / WORD) {
                frame.extend_from_slice(&word.to_le_bytes());
            }
        }
        frame
    }

    #[test]
    fn packing_round_trips_with_either_byte_moves() {
        let mut rng = Pcg64::seed_from_u64(5);
        let ssse3 = Ssse3Available::detect();
        let mut buffer = Vec::new();
        for _ in 0..rounds(8, 2_000) {
            let words = rng.random_range(1..rounds(100, 600));
            let frame = random_message(&mut rng, words);
            let (mut portable, mut fast) = (Vec::new(), Vec::new());
            pack(&frame, &mut portable, None);
            pack(&frame, &mut fast, ssse3);
            assert_eq!(portable, fast);
            for moves in [None, ssse3] {
                let got = unpack_message(&portable, &mut buffer, usize::MAX, moves).ok().flatten();
                assert_eq!(got, Some((portable.len(), frame.len() / WORD)));
                assert_eq!(&Word::words_to_bytes(&buffer)[..frame.len()], &frame[..]);
            }
        }
    }
}
