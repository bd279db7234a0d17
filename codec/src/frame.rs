//! What the frames of every format share: the batch header, the limits a decoder checks a frame
//! against, the errors of encoding and decoding one, and which unknown messages a batch may hold.

use super::format::Format;
use std::borrow::Cow;

/// Largest number of messages in one batch (an IEX-TP segment counts them in a u16).
pub const MAX_BATCH: usize = u16::MAX as usize;

/// Default largest frame a decoder or framer accepts, in bytes.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// What every frame says about its batch besides the messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BatchHeader {
    /// IEX message protocol id of the source (0x8003 TOPS, 0x8004 DEEP...).
    pub protocol_id: u16,
    /// IEX channel id.
    pub channel_id: u32,
    /// IEX session id.
    pub session_id: u32,
    /// Sequence number of the first message (of the next one, for an empty batch).
    pub first_sequence: i64,
    /// Messages in the batch. Encoders write the length of the slice they are given; decoders
    /// fill this in from the frame.
    pub message_count: u32,
    /// IEX send time of the segment, ns since the Unix epoch.
    pub send_time: i64,
    /// The publisher's send timestamp, ns since the Unix epoch (CLOCK_REALTIME), for latency.
    pub publish_time: i64,
}

impl BatchHeader {
    /// The header of an IEX-TP segment, with `publish_time` to be set by the publisher.
    pub fn from_segment(header: &mdrelay_iex::iextp::SegmentHeader) -> BatchHeader {
        BatchHeader {
            protocol_id: header.protocol_id,
            channel_id: header.channel_id,
            session_id: header.session_id,
            first_sequence: header.first_sequence,
            message_count: u32::from(header.message_count),
            send_time: header.send_time,
            publish_time: 0,
        }
    }
}

/// Why a batch could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// More messages than [`MAX_BATCH`].
    #[error("{0} messages in one batch; at most {MAX_BATCH} fit")]
    TooManyMessages(usize),
    /// A message the format cannot carry (e.g. an unknown message longer than the format allows).
    #[error("{format} cannot carry message {index}: {what}")]
    Unrepresentable {
        /// The format.
        format: Format,
        /// Index of the message in the batch.
        index: usize,
        /// Why.
        what: Cow<'static, str>,
    },
}

/// Why a frame could not be delimited or decoded. The frame is lost; the stream goes on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{format} frame: {what} at byte {offset}")]
pub struct DecodeError {
    /// The format being decoded.
    pub format: Format,
    /// Byte offset within the frame where the problem was found.
    pub offset: usize,
    /// What was wrong, naming the field where there is one.
    pub what: Cow<'static, str>,
}

impl DecodeError {
    /// An error at `offset` in a frame of `format`.
    pub fn new(format: Format, offset: usize, what: impl Into<Cow<'static, str>>) -> DecodeError {
        DecodeError { format, offset, what: what.into() }
    }
}

/// What decoders accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame in bytes; longer ones are rejected before anything is allocated.
    pub max_frame: usize,
    /// FlatBuffers only: skip the checks that memory safety does not need (alignment, the
    /// library verifier when it was asked for). Bounds are always checked; see [`fbs`](super::fbs).
    pub trust_flatbuffers: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_frame: DEFAULT_MAX_FRAME, trust_flatbuffers: false }
    }
}

/// The message count of a batch of `messages`, as every frame's count field holds it; the batch
/// is refused when it has more than [`MAX_BATCH`].
#[inline(always)]
pub(crate) fn batch_count<T>(messages: &[T]) -> Result<u16, EncodeError> {
    u16::try_from(messages.len()).map_err(|_| EncodeError::TooManyMessages(messages.len()))
}

/// What makes an unknown message one the model could not have produced, if anything: the
/// formats that carry unknown messages as free-form bytes (Protobuf, JSON) refuse such ones.
pub(crate) fn unknown_problem(kind: u8, bytes: &[u8]) -> Result<(), &'static str> {
    if bytes.is_empty() {
        Err("unknown message with no bytes: they hold at least the type byte")
    } else if bytes.len() > u16::MAX as usize {
        Err("unknown message longer than 65535 bytes")
    } else if bytes[0] != kind {
        Err("unknown message whose bytes do not start with its type byte")
    } else if mdrelay_iex::message::layout_len(kind).is_some() {
        Err("unknown message whose type byte is a known type")
    } else {
        Ok(())
    }
}
