//! The trait each wire format implements ([`FormatCodec`]), apart from the codecs and from the
//! run-time choice among them (`Codec`), so that each codec depends on it and nothing else of
//! the crate's root.

use crate::filter::SymbolFilter;
use crate::format::Format;
#[cfg(doc)]
use crate::frame::MAX_BATCH;
use crate::frame::{BatchHeader, DecodeError, EncodeError, batch_count};
use mdrelay_iex::message::Message;

/// A batch checked for encoding: its header, and its messages, which a frame's count holds.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The batch's header.
    pub header: &'a BatchHeader,
    /// The messages, in order.
    pub messages: &'a [Message<'a>],
    /// How many messages there are, at most [`MAX_BATCH`].
    pub count: u16,
}

/// Where a filtered decode hands what it reads: each message of a symbol it wants, and the IEX
/// type byte of every other message.
pub trait FilteredSink {
    /// Whether the messages of the symbol with these (space-padded) bytes are wanted.
    fn wants(&self, symbol: [u8; 8]) -> bool;

    /// Takes a message of a wanted symbol.
    fn visit(&mut self, message: &Message<'_>);

    /// Takes the IEX type byte of a message not wanted.
    fn skip(&mut self, kind: u8);

    /// Hands `message` to [`FilteredSink::visit`] if it has a wanted symbol, else its type byte
    /// to [`FilteredSink::skip`].
    #[inline]
    fn offer(&mut self, message: &Message<'_>) {
        if message.symbol().is_some_and(|s| self.wants(s.0)) { self.visit(message) } else { self.skip(message.kind()) }
    }
}

/// A [`FilteredSink`] made of a symbol filter and two closures, as
/// [`FormatCodec::decode_filtered`] takes them.
pub struct Filtered<'f, V, S> {
    /// The symbols whose messages are visited.
    pub symbols: &'f SymbolFilter,
    /// Takes each message of those symbols, in order.
    pub visit: V,
    /// Takes the IEX type byte of every other message.
    pub skip: S,
}

impl<V: FnMut(&Message<'_>), S: FnMut(u8)> FilteredSink for Filtered<'_, V, S> {
    #[inline]
    fn wants(&self, symbol: [u8; 8]) -> bool {
        self.symbols.matches(symbol)
    }

    #[inline]
    fn visit(&mut self, message: &Message<'_>) {
        (self.visit)(message)
    }

    #[inline]
    fn skip(&mut self, kind: u8) {
        (self.skip)(kind)
    }
}

/// One wire format's codec: what each of the eight formats implements, and all that the rest of
/// mdrelay asks of one. The checks every format makes before encoding (the batch fits a frame's
/// count) and the rule that a failed encode leaves `out` as it was are here, once.
pub trait FormatCodec {
    /// The format this codec reads and writes.
    fn format(&self) -> Format;

    /// Appends one complete frame for `batch` to `out`; [`FormatCodec::encode`] checks the batch
    /// and calls it, and undoes a partial frame.
    fn encode_batch(&mut self, batch: Batch<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError>;

    /// The length of the first complete frame at the start of `buf`, `None` if more bytes are
    /// needed to know or to hold it; an error for a frame that is malformed or longer than the
    /// limit, found before anything is allocated.
    fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, DecodeError>;

    /// Decodes one complete frame (exactly the bytes [`FormatCodec::frame_len`] delimited),
    /// handing each message to `visit` in order, and returns the batch header.
    fn decode<F: FnMut(&Message<'_>)>(&mut self, frame: &[u8], visit: F) -> Result<BatchHeader, DecodeError>;

    /// Decodes one frame like [`FormatCodec::decode`], but hands `sink` only the messages of the
    /// symbols it wants; every other message is passed to it as its IEX type byte. This default
    /// decodes every message and filters after; a format whose layout lets it read the type and
    /// symbol first skips the rest of the others' bytes (SBE, FlatBuffers, Cap'n Proto, raw,
    /// brec). Messages without a symbol are skipped.
    fn decode_to(&mut self, frame: &[u8], sink: &mut impl FilteredSink) -> Result<BatchHeader, DecodeError> {
        self.decode(frame, |m| sink.offer(m))
    }

    /// Decodes one frame like [`FormatCodec::decode`], but hands `visit` only the messages whose
    /// symbol `filter` holds; every other message is passed to `skip` as its IEX type byte (see
    /// [`FormatCodec::decode_to`]).
    #[inline]
    fn decode_filtered<F: FnMut(&Message<'_>), S: FnMut(u8)>(
        &mut self,
        frame: &[u8],
        filter: &SymbolFilter,
        visit: F,
        skip: S,
    ) -> Result<BatchHeader, DecodeError> {
        self.decode_to(frame, &mut Filtered { symbols: filter, visit, skip })
    }

    /// Appends one complete frame for `header` and `messages` to `out`; on an error, `out` is as
    /// it was.
    #[inline]
    fn encode(&mut self, header: &BatchHeader, messages: &[Message<'_>], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let batch = Batch { header, messages, count: batch_count(messages)? };
        let start = out.len();
        self.encode_batch(batch, out).inspect_err(|_| out.truncate(start))
    }
}
