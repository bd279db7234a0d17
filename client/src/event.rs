//! What a subscriber hands its caller: [`Event`]s, the [`Frame`]s among them with their typed
//! messages, and owned copies of both ([`OwnedEvent`], [`OwnedFrame`]).

use mdrelay_codec::{BatchHeader, DecodeError, Format};
use mdrelay_iex::aggregate::SymbolAggregate;
use mdrelay_iex::book::Books;
use mdrelay_iex::message::{Message, UnknownMessage};
use mdrelay_iex::price::Symbol;
use mdrelay_proto::relay::Totals;
use mdrelay_proto::relay::client::{Line, Start};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Something that happened to the stream, in order. `F` is the frame: [`Frame`] borrowed from
/// the subscriber ([`AsyncSubscriber::next_event`](crate::AsyncSubscriber::next_event)), or
/// [`OwnedFrame`] ([`OwnedEvent`], from the [`Stream`](futures_core::Stream) adapter).
///
/// New kinds of events may be added: match with a `_` arm.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event<F> {
    /// A frame taken: its messages, once, whichever copy arrived first.
    Frame(F),
    /// TCP: a connection to the publisher was made.
    Connected {
        /// The publisher.
        peer: SocketAddr,
        /// Attempts it took since the last connection.
        attempt: u64,
        /// A connection was made before this one (this is a reconnection).
        reconnect: bool,
    },
    /// TCP: the publisher's greeting passed every check and the subscription was sent.
    Subscribed {
        /// The publisher.
        peer: SocketAddr,
        /// The publisher's session (another one than before is a restart).
        session: u64,
        /// The protocol version the two sides speak.
        protocol_version: u16,
        /// The publisher's format at the greeting.
        format: Format,
        /// Where the subscription asked the stream to start.
        start: Start,
    },
    /// TCP: the first record after a resume said where the stream starts: at `asked` (nothing
    /// lost while away) or later (the frames in between had left the publisher's ring, and
    /// show as a [`Event::Gap`]).
    Resumed {
        /// The frame asked for: the one after the highest received.
        asked: u64,
        /// The first frame the publisher offered.
        offered: u64,
    },
    /// TCP: the connection ended (or could not be made); another attempt follows.
    Reconnecting {
        /// Why, naming the publisher.
        reason: String,
        /// The wait before the next attempt.
        retry_in: Duration,
        /// Attempts since the last connection that was made.
        attempt: u64,
    },
    /// TCP: the publisher is at its connection limit; another attempt follows.
    Busy {
        /// The reason it gave.
        reason: String,
        /// The wait before the next attempt.
        retry_in: Duration,
    },
    /// TCP: the snapshot asked for ([`Builder::snapshot`](crate::Builder::snapshot)): the state
    /// as of frame [`Snapshot::as_of`]. The stream's frames follow from the one after it.
    Snapshot(Snapshot),
    /// TCP: the snapshot asked for did not come, or could not be read: the stream goes on
    /// without it, from where the publisher's stream is.
    SnapshotMissing {
        /// Why, for logs.
        reason: String,
    },
    /// UDP: the first datagram set the stream's session.
    SessionStarted {
        /// The session.
        session: u64,
        /// Who sent the datagram.
        peer: SocketAddr,
    },
    /// The publisher restarted (another session): sequence numbers start over.
    Restarted {
        /// The session before.
        old: u64,
        /// The new one.
        new: u64,
    },
    /// The stream's format changed (`from` is `None` for the first format).
    FormatChanged {
        /// The format before.
        from: Option<Format>,
        /// The format of the frames from now on.
        to: Format,
    },
    /// Frames found missing: `count` frames from `first` never arrived (yet). With recovery they
    /// are asked for; a frame that arrives later is a [`Frame`] with
    /// [`recovered`](Frame::recovered) or [`reordered`](Frame::reordered) set.
    Gap {
        /// The first frame missing.
        first: u64,
        /// How many.
        count: u64,
    },
    /// Missing frames were given up: they will not be taken (gone from the publisher's ring, out
    /// of attempts, too old for the sequence window, or still missing at the end).
    GivenUp {
        /// How many frames.
        frames: u64,
    },
    /// Loss recovery (UDP): what the retransmission service did.
    Recovery(RecoveryEvent),
    /// Something received and not taken (counted in [`Counters`](crate::Counters)).
    Skipped(Skipped),
    /// The end of the stream: nothing follows.
    End(End),
}

/// The events without a frame; [`Event::map_frame`] turns them into either kind.
pub(crate) type Notice = Event<Infallible>;

/// An event that owns its data: what the [`Stream`](futures_core::Stream) adapter yields.
pub type OwnedEvent = Event<OwnedFrame>;

impl<F> Event<F> {
    /// The same event with its frame (if it is one) turned into another type.
    pub fn map_frame<G>(self, f: impl FnOnce(F) -> G) -> Event<G> {
        match self {
            Event::Frame(frame) => Event::Frame(f(frame)),
            Event::Connected { peer, attempt, reconnect } => Event::Connected { peer, attempt, reconnect },
            Event::Subscribed { peer, session, protocol_version, format, start } => {
                Event::Subscribed { peer, session, protocol_version, format, start }
            }
            Event::Resumed { asked, offered } => Event::Resumed { asked, offered },
            Event::Reconnecting { reason, retry_in, attempt } => Event::Reconnecting { reason, retry_in, attempt },
            Event::Busy { reason, retry_in } => Event::Busy { reason, retry_in },
            Event::Snapshot(snapshot) => Event::Snapshot(snapshot),
            Event::SnapshotMissing { reason } => Event::SnapshotMissing { reason },
            Event::SessionStarted { session, peer } => Event::SessionStarted { session, peer },
            Event::Restarted { old, new } => Event::Restarted { old, new },
            Event::FormatChanged { from, to } => Event::FormatChanged { from, to },
            Event::Gap { first, count } => Event::Gap { first, count },
            Event::GivenUp { frames } => Event::GivenUp { frames },
            Event::Recovery(r) => Event::Recovery(r),
            Event::Skipped(s) => Event::Skipped(s),
            Event::End(end) => Event::End(end),
        }
    }
}

impl Event<Frame<'_>> {
    /// A copy that owns its data (the frame's messages copied out of the subscriber's buffers).
    pub fn to_owned_event(&self) -> OwnedEvent {
        self.clone().map_frame(|f| f.to_owned_frame())
    }
}

/// The state of the stream as of one frame, from the publisher: every symbol's book and status
/// ([`Books`]), the day's aggregates up to that frame, and the stream's counts. Cheap to clone
/// (shared).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot(Arc<mdrelay_proto::relay::snapshot::Snapshot>);

impl Snapshot {
    pub(crate) fn new(inner: Arc<mdrelay_proto::relay::snapshot::Snapshot>) -> Snapshot {
        Snapshot(inner)
    }

    /// The last frame the state includes: the stream goes on from the next one.
    pub fn as_of(&self) -> u64 {
        self.0.state.as_of
    }

    /// Every symbol's book and status as of the frame; `messages_applied` counts the stream's
    /// messages up to it.
    pub fn books(&self) -> &Books {
        &self.0.state.books
    }

    /// The day's aggregates of one symbol up to the frame, if it had any.
    pub fn aggregate(&self, symbol: &Symbol) -> Option<SymbolAggregate> {
        self.0.state.aggregates.get(symbol)
    }

    /// Every symbol's day aggregates up to the frame.
    pub fn aggregates(&self) -> impl ExactSizeIterator<Item = (Symbol, SymbolAggregate)> + '_ {
        self.0.state.aggregates.iter()
    }

    /// The stream's counts up to the frame: frames, messages, messages by type.
    pub fn totals(&self) -> &Totals {
        &self.0.totals
    }

    /// Frames the snapshot itself took on the wire.
    pub fn frames(&self) -> u32 {
        self.0.frames
    }

    /// Messages the snapshot itself took on the wire.
    pub fn messages(&self) -> u64 {
        self.0.messages
    }
}

/// What the retransmission service did (UDP and multicast with recovery).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryEvent {
    /// A connection to the service was set up.
    Connected {
        /// The service.
        peer: SocketAddr,
        /// The session it serves.
        session: u64,
        /// It serves another session than the stream's: the stream's gaps cannot be filled.
        other_session: bool,
    },
    /// The service no longer holds these frames: they are given up.
    Gone {
        /// The first.
        first: u64,
        /// How many.
        count: u64,
    },
    /// The service was busy (over its rate limit, or full): the frames are asked again later.
    Busy {
        /// The request's first frame (0: the connection was made to leave for another client).
        first: u64,
    },
    /// The connection to the service ended; another is made for the next request.
    Lost {
        /// Why, naming the service.
        reason: String,
        /// The wait before the next connection.
        retry_in: Duration,
    },
    /// The service closed the connection after a quiet spell: nothing was lost, and another is
    /// made for the next request.
    Closed {
        /// What the service did, naming it.
        reason: String,
    },
    /// The service refused this subscriber (or cannot serve it): recovery is off, and what is
    /// missing is given up.
    Refused {
        /// Why.
        reason: String,
    },
    /// NATS with a stream: a frame or end of stream more than a window (65,536 frames) ahead of
    /// the frames taken came (the subscriber fell behind, or it is forged): the JetStream stream
    /// is read in order from `from` while the live subject waits.
    CatchingUp {
        /// The first frame read from the stream: the one after the highest taken.
        from: u64,
        /// The frame that came that far ahead (an end of stream's: the one before its number).
        ahead: u64,
    },
    /// NATS: the read of the stream in order is over, `frames` frames taken from it; the live
    /// subject follows.
    CaughtUp {
        /// Frames taken from the stream.
        frames: u64,
    },
    /// NATS: an end of stream far ahead of every frame the stream brought (its publisher
    /// dropped the frames before it, or it is forged): held, and taken once nothing new has
    /// come for [`Builder::give_up_after`](crate::Builder::give_up_after); a new frame of its
    /// session after it refutes it.
    EndAhead {
        /// The number it gives the next frame.
        next_sequence: u64,
    },
}

/// What was received and not taken, and why. Each is counted in
/// [`Counters`](crate::Counters); these events say when and where, for logs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Skipped {
    /// A frame received before: not taken again.
    Duplicate {
        /// The frame.
        sequence: u64,
    },
    /// A frame older than the sequence window (65,536 frames): it cannot be told from a
    /// duplicate, so it is not taken.
    TooLate {
        /// The frame.
        sequence: u64,
    },
    /// A frame that could not be delimited: the rest of its record or datagram is lost.
    Undelimited {
        /// Where it starts (`stream byte N`, `datagram byte N`, ...).
        at: String,
        /// The format.
        format: Format,
        /// What was wrong.
        what: String,
    },
    /// Bytes after the frames a record or datagram declares: not read.
    Excess {
        /// Where they start.
        at: String,
        /// How many.
        bytes: usize,
    },
    /// Fewer frames than a record or datagram declares.
    FewerFrames {
        /// Where the payload starts.
        at: String,
        /// Frames declared.
        declared: u64,
        /// Frames found.
        found: u64,
    },
    /// Frames refused by the protection check (CRC-32C or authentication): all of the record's
    /// or datagram's frames are dropped.
    Protection {
        /// Where, or who sent it.
        at: String,
        /// The first frame.
        first: u64,
        /// Why.
        why: String,
    },
    /// A datagram that is not a relay datagram, or whose header cannot be read.
    Invalid {
        /// Who sent it.
        peer: SocketAddr,
        /// Its length.
        len: usize,
        /// What was wrong.
        what: String,
    },
    /// A datagram out of line with the stream (another session, a number far away), held until
    /// the next one confirms it (then it is taken) or not (then it is dropped and counted).
    Held {
        /// Who sent it.
        peer: SocketAddr,
        /// Its session.
        session: u64,
        /// Its first frame.
        sequence: u64,
    },
    /// An end of stream that does not fit the stream, or whose totals cannot be read: ignored.
    End {
        /// Who sent it.
        peer: SocketAddr,
        /// What was wrong.
        what: String,
    },
    /// A record that has no place on the connection (skipped by its length).
    OutOfPlace {
        /// Its tag byte.
        tag: u8,
        /// Where it starts.
        at: u64,
    },
    /// A record that does not fit the stream: the connection is dropped and made again.
    Violation {
        /// Where it starts.
        at: u64,
        /// How it does not fit.
        what: String,
    },
}

/// The end of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct End {
    /// The publisher's totals for the whole stream, from its end-of-stream record (`None` when
    /// they could not be read).
    pub totals: Option<Totals>,
    /// The number the next frame would have had.
    pub next_sequence: u64,
    /// Every frame and message the publisher sent arrived: the frames, messages and messages by
    /// type taken equal its totals, nothing was lost, and the publisher's own stream was whole
    /// (a relay that lost its upstream says it was not). False for a subscriber that joined
    /// late, unless it joined with a [`Snapshot`], whose counts then stand for the frames up to
    /// it.
    pub complete: bool,
}

/// One message of a frame as stored until it is handed out: the model's messages own their
/// fields; an unknown type's bytes are in the subscriber's byte buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stored {
    Known(Message<'static>),
    Unknown { kind: u8, at: u32, len: u32 },
}

/// The model's message with its borrow given up, when it has one of its own fields only.
pub(crate) fn known(m: &Message<'_>) -> Option<Message<'static>> {
    Some(match *m {
        Message::SystemEvent(x) => Message::SystemEvent(x),
        Message::SecurityDirectory(x) => Message::SecurityDirectory(x),
        Message::TradingStatus(x) => Message::TradingStatus(x),
        Message::RetailLiquidityIndicator(x) => Message::RetailLiquidityIndicator(x),
        Message::OperationalHaltStatus(x) => Message::OperationalHaltStatus(x),
        Message::ShortSalePriceTestStatus(x) => Message::ShortSalePriceTestStatus(x),
        Message::SecurityEvent(x) => Message::SecurityEvent(x),
        Message::PriceLevelUpdate(x) => Message::PriceLevelUpdate(x),
        Message::QuoteUpdate(x) => Message::QuoteUpdate(x),
        Message::TradeReport(x) => Message::TradeReport(x),
        Message::TradeBreak(x) => Message::TradeBreak(x),
        Message::OfficialPrice(x) => Message::OfficialPrice(x),
        Message::AuctionInformation(x) => Message::AuctionInformation(x),
        Message::Unknown(_) => return None,
    })
}

/// A frame as the subscriber keeps it until it is handed out.
#[derive(Clone, Debug)]
pub(crate) struct FrameSlot {
    pub sequence: u64,
    pub format: Format,
    pub line: Option<Line>,
    pub peer: Option<SocketAddr>,
    pub recovered: bool,
    pub reordered: bool,
    pub receive_time: i64,
    pub decoded: Result<BatchHeader, DecodeError>,
    pub messages: (u32, u32),
    pub skipped: (u32, u32),
    pub bytes: Option<(u32, u32)>,
}

/// A frame taken from the stream, borrowed from the subscriber until its next event: its
/// place in the stream, its times, and its messages as the typed IEX model.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    pub(crate) slot: &'a FrameSlot,
    pub(crate) messages: &'a [Stored],
    pub(crate) skipped: &'a [u8],
    pub(crate) arena: &'a [u8],
}

impl PartialEq for Frame<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.sequence() == other.sequence()
            && self.slot.decoded == other.slot.decoded
            && self.messages().eq(other.messages())
            && self.skipped == other.skipped
    }
}

impl<'a> Frame<'a> {
    /// The frame's sequence number in the publisher's session.
    pub fn sequence(&self) -> u64 {
        self.slot.sequence
    }

    /// The wire format it came in.
    pub fn format(&self) -> Format {
        self.slot.format
    }

    /// When the publisher sent it: ns since the Unix epoch, on the publisher's clock (0 when
    /// the frame did not decode). For a recovered frame, this is when it was first sent.
    pub fn publish_time(&self) -> i64 {
        self.slot.decoded.as_ref().map_or(0, |h| h.publish_time)
    }

    /// When its bytes were received: ns since the Unix epoch, on this host's clock. One-way
    /// latency is this minus [`Frame::publish_time`] (with both clocks in sync).
    pub fn receive_time(&self) -> i64 {
        self.slot.receive_time
    }

    /// The batch header (the IEX segment's protocol, channel, session, first message
    /// sequence, send time, and the publish time); `None` when the frame did not decode.
    pub fn header(&self) -> Option<&'a BatchHeader> {
        self.slot.decoded.as_ref().ok()
    }

    /// Why the frame did not decode (counted in
    /// [`Counters::decode_errors`](crate::Counters::decode_errors)): its messages are those read
    /// before the error, if any.
    pub fn decode_error(&self) -> Option<&'a DecodeError> {
        self.slot.decoded.as_ref().err()
    }

    /// A retransmission from the publisher's recovery service, filling a gap.
    pub fn recovered(&self) -> bool {
        self.slot.recovered
    }

    /// It arrived after a later frame, filling a gap.
    pub fn reordered(&self) -> bool {
        self.slot.reordered
    }

    /// With two lines (A/B), the line whose copy was taken.
    pub fn line(&self) -> Option<Line> {
        self.slot.line
    }

    /// Who sent it: the publisher (TCP), the sender of its datagram (UDP), or the
    /// retransmission service (a recovered frame).
    pub fn peer(&self) -> Option<SocketAddr> {
        self.slot.peer
    }

    /// Its messages, borrowed (of the filter's symbols only, with
    /// [`Builder::symbols`](crate::Builder::symbols)).
    pub fn messages(&self) -> Messages<'a> {
        Messages { stored: self.messages.iter(), arena: self.arena }
    }

    /// The type bytes of the messages the symbol filter skipped, in order.
    pub fn skipped(&self) -> &'a [u8] {
        self.skipped
    }

    /// Its bytes as the format encodes them (opened, when protected), with
    /// [`Builder::frame_bytes`](crate::Builder::frame_bytes); `None` otherwise.
    pub fn bytes(&self) -> Option<&'a [u8]> {
        self.slot.bytes.map(|(at, len)| &self.arena[at as usize..(at + len) as usize])
    }

    /// A copy that owns its data.
    pub fn to_owned_frame(&self) -> OwnedFrame {
        OwnedFrame {
            sequence: self.sequence(),
            format: self.format(),
            receive_time: self.receive_time(),
            decoded: self.slot.decoded.clone(),
            recovered: self.recovered(),
            reordered: self.reordered(),
            line: self.line(),
            peer: self.peer(),
            messages: self.messages().map(|m| OwnedMessage::from_message(&m)).collect(),
            skipped: self.skipped.to_vec(),
            bytes: self.bytes().map(<[u8]>::to_vec),
        }
    }
}

/// The messages of a [`Frame`], in order.
#[derive(Clone, Debug)]
pub struct Messages<'a> {
    stored: std::slice::Iter<'a, Stored>,
    arena: &'a [u8],
}

impl<'a> Iterator for Messages<'a> {
    type Item = Message<'a>;

    fn next(&mut self) -> Option<Message<'a>> {
        let stored = self.stored.next()?;
        Some(match *stored {
            Stored::Known(m) => m,
            Stored::Unknown { kind, at, len } => {
                Message::Unknown(UnknownMessage { kind, bytes: &self.arena[at as usize..(at + len) as usize] })
            }
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.stored.size_hint()
    }
}

impl ExactSizeIterator for Messages<'_> {}

/// A message that owns its data: the model's messages by value; a message of a type the model
/// does not know, with its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnedMessage {
    /// A message of a type the model knows.
    Known(Message<'static>),
    /// Another type: its type byte and its bytes (type byte included).
    Unknown {
        /// The type byte.
        kind: u8,
        /// The whole message.
        bytes: Vec<u8>,
    },
}

impl OwnedMessage {
    /// A copy of `m`.
    pub fn from_message(m: &Message<'_>) -> OwnedMessage {
        match (known(m), m) {
            (Some(k), _) => OwnedMessage::Known(k),
            (None, Message::Unknown(u)) => OwnedMessage::Unknown { kind: u.kind, bytes: u.bytes.to_vec() },
            // Every type but Unknown is known.
            (None, other) => OwnedMessage::Unknown { kind: other.kind(), bytes: Vec::new() },
        }
    }

    /// The message, borrowed.
    pub fn as_message(&self) -> Message<'_> {
        match self {
            OwnedMessage::Known(m) => *m,
            OwnedMessage::Unknown { kind, bytes } => Message::Unknown(UnknownMessage { kind: *kind, bytes }),
        }
    }
}

/// A frame that owns its data (see [`Frame`]).
#[derive(Clone, Debug, PartialEq)]
pub struct OwnedFrame {
    sequence: u64,
    format: Format,
    receive_time: i64,
    decoded: Result<BatchHeader, DecodeError>,
    recovered: bool,
    reordered: bool,
    line: Option<Line>,
    peer: Option<SocketAddr>,
    messages: Vec<OwnedMessage>,
    skipped: Vec<u8>,
    bytes: Option<Vec<u8>>,
}

impl OwnedFrame {
    /// See [`Frame::sequence`].
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// See [`Frame::format`].
    pub fn format(&self) -> Format {
        self.format
    }

    /// See [`Frame::publish_time`].
    pub fn publish_time(&self) -> i64 {
        self.decoded.as_ref().map_or(0, |h| h.publish_time)
    }

    /// See [`Frame::receive_time`].
    pub fn receive_time(&self) -> i64 {
        self.receive_time
    }

    /// See [`Frame::header`].
    pub fn header(&self) -> Option<&BatchHeader> {
        self.decoded.as_ref().ok()
    }

    /// See [`Frame::decode_error`].
    pub fn decode_error(&self) -> Option<&DecodeError> {
        self.decoded.as_ref().err()
    }

    /// See [`Frame::recovered`].
    pub fn recovered(&self) -> bool {
        self.recovered
    }

    /// See [`Frame::reordered`].
    pub fn reordered(&self) -> bool {
        self.reordered
    }

    /// See [`Frame::line`].
    pub fn line(&self) -> Option<Line> {
        self.line
    }

    /// See [`Frame::peer`].
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Its messages.
    pub fn messages(&self) -> &[OwnedMessage] {
        &self.messages
    }

    /// See [`Frame::skipped`].
    pub fn skipped(&self) -> &[u8] {
        &self.skipped
    }

    /// See [`Frame::bytes`].
    pub fn bytes(&self) -> Option<&[u8]> {
        self.bytes.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdrelay_iex::message::kind;

    #[test]
    fn every_known_type_gives_up_its_borrow_and_unknown_ones_keep_their_bytes() {
        // One message of each type the model knows, in its documented layout.
        for &k in &kind::ALL {
            let mut bytes = vec![0u8; mdrelay_iex::message::layout_len(k).unwrap()];
            bytes[0] = k;
            if bytes.len() >= 18 {
                bytes[10..18].copy_from_slice(b"AA      ");
            }
            let m = Message::parse(&bytes).unwrap();
            assert_eq!(known(&m), Some(m), "{}", k as char);
            assert_eq!(OwnedMessage::from_message(&m).as_message(), m);
        }
        let unknown = [b'z', 1, 2, 3];
        let m = Message::parse(&unknown).unwrap();
        assert_eq!(known(&m), None);
        let owned = OwnedMessage::from_message(&m);
        assert_eq!(owned, OwnedMessage::Unknown { kind: b'z', bytes: unknown.to_vec() });
        assert_eq!(owned.as_message(), m);
    }
}
