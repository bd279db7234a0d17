//! Protobuf: the codec is being written; the format is not in `Format::ALL` until it is, so no
//! configuration can choose it.

use super::{BatchHeader, DecodeError, EncodeError, Format, Limits};
use crate::message::Message;

/// Protobuf codec.
#[derive(Debug)]
pub struct ProtobufCodec {
    limits: Limits,
}

impl ProtobufCodec {
    /// A codec with the given decoding limits.
    pub fn new(limits: Limits) -> Self {
        ProtobufCodec { limits }
    }

    /// Refuses every batch: not written yet.
    pub fn encode(
        &mut self,
        _header: &BatchHeader,
        _messages: &[Message<'_>],
        _out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        Err(EncodeError::Unrepresentable { format: Format::Protobuf, index: 0, what: "not written yet".into() })
    }

    /// Refuses every frame: not written yet.
    pub fn frame_len(&self, _buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        Err(DecodeError::new(Format::Protobuf, 0, format!("not written yet ({} limit)", self.limits.max_frame)))
    }

    /// Refuses every frame: not written yet.
    pub fn decode<F: FnMut(&Message<'_>)>(&mut self, _frame: &[u8], _visit: F) -> Result<BatchHeader, DecodeError> {
        Err(DecodeError::new(Format::Protobuf, 0, "not written yet"))
    }
}
