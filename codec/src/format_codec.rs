//! The trait each wire format implements ([`FormatCodec`]), apart from the codecs and from the
//! run-time choice among them (`Codec`), so that each codec depends on it and nothing else of
//! the crate's root.

use crate::filter::SymbolFilter;
use crate::format::Format;
#[cfg(doc)]
use crate::frame::MAX_BATCH;
use crate::frame::{BatchHeader, DecodeError, EncodeError, batch_count};
use mdrelay_iex::message::Message;

/// One wire format's codec: what each of the eight formats implements, and all that the rest of
/// mdrelay asks of one. The checks every format makes before encoding (the batch fits a frame's
/// count) and the rule that a failed encode leaves `out` as it was are here, once.
pub trait FormatCodec {
    /// The format this codec reads and writes.
    fn format(&self) -> Format;

    /// Appends one complete frame for `header` and `messages` (`count` of them, at most
    /// [`MAX_BATCH`]) to `out`; [`FormatCodec::encode`] calls it and undoes a partial frame.
    fn encode_batch(
        &mut self,
        header: &BatchHeader,
        messages: &[Message<'_>],
        count: u16,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError>;

    /// The length of the first complete frame at the start of `buf`, `None` if more bytes are
    /// needed to know or to hold it; an error for a frame that is malformed or longer than the
    /// limit, found before anything is allocated.
    fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError>;

    /// Decodes one complete frame (exactly the bytes [`FormatCodec::frame_len`] delimited),
    /// handing each message to `visit` in order, and returns the batch header.
    fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], visit: F) -> Result<BatchHeader, DecodeError>;

    /// Decodes one frame like [`FormatCodec::decode`], but hands `visit` only the messages whose
    /// symbol `filter` holds; every other message is passed to `skip` as its IEX type byte. This
    /// default decodes every message and filters after; a format whose layout lets it read the
    /// type and symbol first skips the rest of the others' bytes (SBE, FlatBuffers, Cap'n Proto,
    /// raw, brec). Messages without a symbol are skipped.
    fn decode_filtered<F: FnMut(&Message<'_>), S: FnMut(u8)>(
        &mut self,
        frame: &[u8],
        filter: &SymbolFilter,
        mut visit: F,
        mut skip: S,
    ) -> Result<BatchHeader, DecodeError> {
        self.decode(frame, |m| if filter.matches_message(m) { visit(m) } else { skip(m.kind()) })
    }

    /// Appends one complete frame for `header` and `messages` to `out`; on an error, `out` is as
    /// it was.
    #[inline]
    fn encode(&mut self, header: &BatchHeader, messages: &[Message<'_>], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let count = batch_count(messages)?;
        let start = out.len();
        self.encode_batch(header, messages, count, out).inspect_err(|_| out.truncate(start))
    }
}
