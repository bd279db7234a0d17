//! FlatBuffers codec (placeholder until the generated codec lands).

use super::{BatchHeader, DecodeError, EncodeError, Format, Limits};
use crate::message::Message;

/// FlatBuffers codec.
pub struct FlatBuffersCodec {
    #[allow(dead_code)]
    limits: Limits,
}

impl FlatBuffersCodec {
    /// A codec with the given limits.
    pub fn new(limits: Limits) -> Self {
        FlatBuffersCodec { limits }
    }
    /// Appends one frame.
    pub fn encode(
        &mut self,
        _header: &BatchHeader,
        _messages: &[Message<'_>],
        _out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        Err(EncodeError::Unrepresentable { format: Format::FlatBuffers, index: 0, what: "not implemented".into() })
    }
    /// Length of the first frame.
    pub fn frame_len(&self, _buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        Err(DecodeError::new(Format::FlatBuffers, 0, "not implemented"))
    }
    /// Decodes one frame.
    pub fn decode<F: FnMut(&Message<'_>)>(&mut self, _frame: &[u8], _visit: F) -> Result<BatchHeader, DecodeError> {
        Err(DecodeError::new(Format::FlatBuffers, 0, "not implemented"))
    }
}
