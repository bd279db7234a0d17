//! Cap'n Proto's standard stream framing, as both the codec and the packing read it: the word,
//! and the segment table that heads every frame, checked against the frame limit as it is read.

use crate::format::Format;
use crate::frame::DecodeError;
use capnp::Word;

/// Bytes per Cap'n Proto word.
pub(super) const WORD: usize = 8;

/// Most segments a frame may have; the `capnp` reader refuses 512 and more.
pub const MAX_SEGMENTS: usize = 511;

/// `value` as a little-endian word.
pub(super) fn word_of(value: u64) -> Word {
    let [b0, b1, b2, b3, b4, b5, b6, b7] = value.to_le_bytes();
    capnp::word(b0, b1, b2, b3, b4, b5, b6, b7)
}

/// The error for a frame of `len` bytes, over the `max_frame`-byte limit.
pub(super) fn too_long(format: Format, len: usize, max_frame: usize) -> DecodeError {
    DecodeError::new(format, 0, format!("frame of {len} bytes exceeds the {max_frame}-byte limit"))
}

/// Reads a segment table word by word, checking it against the frame limit as soon as each size
/// is known, so a frame too long is refused from its first bytes.
pub(super) struct TableReader {
    format: Format,
    max_frame: usize,
    max_words: usize,
    segments: usize,
    sizes_seen: usize,
    words_seen: usize,
    total_words: usize,
}

impl TableReader {
    /// A reader for a frame of `format`, refused beyond `max_frame` bytes.
    pub(super) fn new(format: Format, max_frame: usize) -> Self {
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
    pub(super) fn table_words(&self) -> usize {
        self.segments / 2 + 1
    }

    /// Whether every word of the table is in.
    pub(super) fn complete(&self) -> bool {
        self.words_seen > 0 && self.words_seen == self.table_words()
    }

    /// Words of the whole message, table included (valid once complete).
    pub(super) fn total_words(&self) -> usize {
        self.total_words
    }

    /// Takes the next table word, which starts at byte `at` of the frame.
    pub(super) fn push(&mut self, word: u64, at: usize) -> Result<(), DecodeError> {
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
