//! The transport-independent part of receiving frames ([`FrameReader`], ported from the
//! subscriber's pipeline and a relay's upstream): the payload of a record, datagram or
//! retransmission answer in; per frame out, to a [`FrameVisitor`].
//!
//! For each payload the reader opens its protected frames (all of them before any is read: a
//! payload that does not open is refused whole, its frames then show as missing), walks exactly
//! the frames its header declares (a frame that cannot be delimited loses the rest of the
//! payload, never the stream; bytes past the declared frames are not read, since a frame there
//! would take the number of a frame still to come), accounts for each frame, and decodes the
//! new ones with the codec of its format (one per format seen, so a format switch rebuilds
//! nothing), with the symbol filter applied before decode.
//!
//! Accounting is the subscriber's ([`ReaderMode::Window`]): the session tracker's window (a
//! duplicate or a frame too late is counted and not decoded, so nothing is aggregated twice),
//! the A/B lines ([`Lines`]: the other line's copy is arbitrated) and the recovery book
//! ([`RecoveryBook`]: gaps opened, filled by originals or retransmissions). Or a relay's
//! ([`ReaderMode::Ordered`]): frames must come in increasing order, a frame at or below one
//! handed on is a duplicate and skipped, one above leaves a gap that stays a gap downstream,
//! and with a CRC-32C each frame is checked as it is reached, a failure ending the payload as a
//! protocol violation (the connection is not to be believed any more).
//!
//! Decoding is a visit, as the codecs do it: the visitor gets each message borrowed from the
//! frame, then the frame's outcome, so nothing is allocated per message. What is refused or
//! skipped is counted here ([`FrameCounts`]) and told to the visitor ([`Anomaly`]) for logging.

use super::book::RecoveryBook;
use super::lines::{Line, Lines};
use super::unseal::{ProtectionCounts, Unsealer};
use crate::relay::protect::{LEN_PREFIX, ProtectError, WireKey};
use crate::relay::session::SessionTracker;
use crate::relay::window::Observed;
use crate::relay::wire::Echo;
use mdrelay_codec::{BatchHeader, Codec, DecodeError, Format, FormatCodec, Limits, SymbolFilter};
use mdrelay_iex::message::Message;
use std::collections::{BTreeSet, VecDeque};
use std::fmt;

/// Where a payload sits, for messages: a byte offset in the TCP stream, a datagram or the
/// recovery connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The payload starts at this byte of the TCP stream (counted from the greeting).
    Stream(u64),
    /// The payload starts at this byte of its datagram.
    Datagram(u64),
    /// The payload starts at this byte of the recovery connection (counted from the greeting).
    Recovery(u64),
}

impl Place {
    /// The byte `offset` bytes into the payload.
    pub fn at(self, offset: usize) -> PlaceAt {
        PlaceAt(self, offset as u64)
    }
}

/// A byte within a payload, displayed as where it is in the stream or datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaceAt(pub Place, pub u64);

impl fmt::Display for PlaceAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Place::Stream(base) => write!(f, "stream byte {}", base.saturating_add(self.1)),
            Place::Datagram(base) => write!(f, "datagram byte {}", base.saturating_add(self.1)),
            Place::Recovery(base) => write!(f, "recovery connection byte {}", base.saturating_add(self.1)),
        }
    }
}

/// Where a payload's frames come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The stream: TCP, or the one UDP line.
    Stream,
    /// One of two redundant UDP lines (A/B).
    Line(Line),
    /// The retransmission service, answering a request for missing frames.
    Recovered,
}

/// A payload of frames as a transport hands it over.
#[derive(Clone, Copy, Debug)]
pub struct Payload<'a> {
    /// Where the frames come from.
    pub origin: Origin,
    /// The frames' format, from the record or datagram header.
    pub format: Format,
    /// The frames, back to back (protected, when the stream protects them).
    pub bytes: &'a [u8],
    /// Sequence number of the first frame.
    pub first_sequence: u64,
    /// Frames the header says the payload holds.
    pub declared_frames: u64,
    /// The publisher session the frames belong to (their protection is opened with its key).
    pub session: u64,
    /// When the bytes were received: the wall clock, ns since the epoch.
    pub receive_time: i64,
    /// Now, on the driver's monotonic clock (the recovery book's time), ns.
    pub now: i64,
    /// Where the payload is, for messages.
    pub place: Place,
}

/// One frame, as the visitor sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// Its sequence number.
    pub sequence: u64,
    /// Its format.
    pub format: Format,
    /// Where it came from.
    pub origin: Origin,
    /// Its place among the payload's frames, from 0.
    pub index: u64,
    /// When its bytes were received: the wall clock, ns since the epoch.
    pub receive_time: i64,
    /// Where it starts.
    pub at: PlaceAt,
}

/// Something refused or out of the ordinary, told to the visitor so the program can log it.
#[derive(Debug, PartialEq, Eq)]
pub enum Anomaly<'a> {
    /// The payload's frames do not pass the protection check: all of them are refused.
    Unsealed {
        /// Where the payload starts.
        at: PlaceAt,
        /// Its first frame.
        first: u64,
        /// Frames it declares.
        frames: u64,
        /// Why.
        error: &'a ProtectError,
    },
    /// A frame that cannot be delimited: the rest of the payload is skipped.
    Undelimited {
        /// Where the frame starts.
        at: PlaceAt,
        /// Its format.
        format: Format,
        /// Its place in the payload.
        frame: u64,
        /// What was wrong.
        what: String,
    },
    /// Frames missing before `before`.
    Gap {
        /// How many.
        missing: u64,
        /// The frame after them.
        before: u64,
    },
    /// A frame received before: skipped.
    Duplicate {
        /// The frame.
        sequence: u64,
    },
    /// A frame older than the sequence window: skipped.
    TooLate {
        /// The frame.
        sequence: u64,
    },
    /// A frame that arrived after a later one, filling a hole.
    Reordered {
        /// The frame.
        sequence: u64,
    },
    /// A frame delimited that does not decode: skipped.
    DecodeFailed {
        /// Where it starts.
        at: PlaceAt,
        /// Its place in the payload.
        frame: u64,
        /// Its sequence number.
        sequence: u64,
        /// Why.
        error: &'a DecodeError,
    },
    /// Bytes after the frames the header declares: not read.
    Excess {
        /// Where they start.
        at: PlaceAt,
        /// Frames declared.
        declared: u64,
        /// Bytes left.
        bytes: usize,
    },
    /// Fewer frames than the header declares.
    FewerFrames {
        /// Where the payload starts.
        at: PlaceAt,
        /// Frames declared.
        declared: u64,
        /// Frames found.
        found: u64,
    },
}

/// What the reader hands each frame to. Every method has a default that does nothing.
pub trait FrameVisitor {
    /// Whether every message is wanted even with a symbol filter (a recording keeps them all).
    fn every_message(&self) -> bool {
        false
    }

    /// A frame is about to be decoded.
    fn begin(&mut self, _frame: &FrameInfo) {}

    /// One of its messages (of the filter's symbols, with a filter).
    fn message(&mut self, _frame: &FrameInfo, _message: &Message<'_>) {}

    /// A message of another symbol, skipped by the filter: its type byte.
    fn skipped(&mut self, _frame: &FrameInfo, _kind: u8) {}

    /// The frame was decoded (its batch header) or failed to; `bytes` are its plain bytes.
    fn end(&mut self, _frame: &FrameInfo, _bytes: &[u8], _decoded: Result<&BatchHeader, &DecodeError>) {}

    /// The stream's format changed (`from` is `None` for the first).
    fn format_changed(&mut self, _from: Option<Format>, _to: Format) {}

    /// Something refused or out of the ordinary.
    fn anomaly(&mut self, _anomaly: &Anomaly<'_>) {}
}

/// A visitor that takes nothing: frames are accounted and decoded, and only counted.
impl FrameVisitor for () {}

/// How the reader accounts for frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReaderMode {
    /// A subscriber's: a sequence window per session, A/B lines, the recovery book.
    #[default]
    Window,
    /// A relay's: increasing order, each frame's CRC-32C checked as it is reached.
    Ordered,
}

/// How a reader is set up.
#[derive(Clone, Debug, Default)]
pub struct ReaderConfig {
    /// How frames are accounted for.
    pub mode: ReaderMode,
    /// Frames carry a CRC-32C.
    pub crc: bool,
    /// Frames are encrypted under this key.
    pub key: Option<WireKey>,
    /// Decode only these symbols' messages (the others are counted by type).
    pub symbols: Option<SymbolFilter>,
    /// Round-trip mode: echo every Nth frame decoded from the stream.
    pub echo_every: Option<u64>,
}

/// What a [`ReaderMode::Ordered`] reader counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrderedCounts {
    /// Frames missing from the numbering (they stay missing downstream).
    pub gaps: u64,
    /// Frames at or below one already handed on, skipped.
    pub duplicates: u64,
}

/// What the reader counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameCounts {
    /// Frames decoded (retransmitted ones included).
    pub frames_decoded: u64,
    /// Of those, retransmitted frames.
    pub frames_recovered: u64,
    /// Frames delimited but not decodable (skipped).
    pub decode_errors: u64,
    /// Payloads whose frames could not all be delimited (the rest of the payload is lost).
    pub undelimited_payloads: u64,
    /// Payloads with bytes after the frames their header declares (not read).
    pub excess_payloads: u64,
    /// Frames that failed their CRC-32C in a relay's reader (each a protocol violation).
    pub frame_check_failures: u64,
    /// What frame protection refused.
    pub protection: ProtectionCounts,
    /// A relay's ordering counts.
    pub ordered: OrderedCounts,
}

/// A frame that failed its check in a [`ReaderMode::Ordered`] reader: the payload stops there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameCheckFailure {
    /// The frame.
    pub sequence: u64,
    /// Where its protected bytes start.
    pub at: PlaceAt,
    /// Why.
    pub error: ProtectError,
}

/// What became of a payload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PayloadOutcome {
    /// Frames decoded and handed to the visitor.
    pub decoded: u64,
    /// A relay's frame that failed its check, ending the payload.
    pub check_failed: Option<FrameCheckFailure>,
}

/// A change of the stream's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatChange {
    /// The format before, if any.
    pub from: Option<Format>,
    /// The new one.
    pub to: Format,
}

/// Frames in, per frame out: see the module's documentation.
pub struct FrameReader {
    /// Opens protected payloads; taken out while a datagram it opened is read (see
    /// [`FrameReader::take_unsealer`]).
    unsealer: Option<Unsealer>,
    core: Core,
}

/// Everything but the unsealer, so a payload it opened can be read while the rest is changed.
struct Core {
    mode: ReaderMode,
    /// One codec per format, created when the format is first seen; indexed by format id.
    codecs: [Option<Codec>; Format::ALL.len()],
    current: Option<Format>,
    formats_seen: BTreeSet<Format>,
    format_switches: u64,
    /// The symbol filter, and the type bytes of one frame's skipped messages.
    filter: Option<(SymbolFilter, Vec<u8>)>,
    tracker: SessionTracker,
    lines: Option<Lines>,
    book: Option<RecoveryBook>,
    /// The lowest frame taken in the run's first session (with that session's epoch).
    first_frame: Option<(u64, u64)>,
    /// A relay's next frame owed: the one after the last handed on.
    next: Option<u64>,
    /// Retransmitted payloads come from a store read in order (see
    /// [`FrameReader::set_store_in_order`]).
    store_in_order: bool,
    /// Frames of a session up to a number that a snapshot covers (see
    /// [`FrameReader::covered_by_snapshot`]).
    covered: Option<(u64, u64)>,
    echo_every: Option<u64>,
    echo_countdown: u64,
    echoes: VecDeque<Echo>,
    counts: FrameCounts,
}

impl fmt::Debug for FrameReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameReader")
            .field("mode", &self.core.mode)
            .field("current", &self.core.current)
            .field("counts", &self.core.counts)
            .finish_non_exhaustive()
    }
}

impl FrameReader {
    /// A reader set up by `config`.
    pub fn new(config: ReaderConfig) -> FrameReader {
        // A relay's reader checks CRC-32Cs only: relays refuse encrypted upstreams.
        let key = config.key.as_ref().filter(|_| config.mode == ReaderMode::Window);
        FrameReader {
            unsealer: Some(Unsealer::new(config.crc, key)),
            core: Core {
                mode: config.mode,
                codecs: Default::default(),
                current: None,
                formats_seen: BTreeSet::new(),
                format_switches: 0,
                filter: config.symbols.map(|s| (s, Vec::new())),
                tracker: SessionTracker::new(),
                lines: None,
                book: None,
                first_frame: None,
                next: None,
                store_in_order: false,
                covered: None,
                echo_every: config.echo_every.map(|n| n.max(1)),
                echo_countdown: config.echo_every.map_or(0, |n| n.max(1)),
                echoes: VecDeque::new(),
                counts: FrameCounts::default(),
            },
        }
    }

    /// Also merges two A/B lines.
    pub fn with_lines(mut self, lines: Lines) -> FrameReader {
        self.core.lines = Some(lines);
        self
    }

    /// Also keeps the book of missing frames for recovery.
    pub fn with_recovery(mut self, book: RecoveryBook) -> FrameReader {
        self.core.book = Some(book);
        self
    }

    /// What the reader counted.
    pub fn counts(&self) -> FrameCounts {
        FrameCounts { protection: self.unsealer.as_ref().map(|u| u.counts).unwrap_or_default(), ..self.core.counts }
    }

    /// The format now in use, if any was announced.
    pub fn current_format(&self) -> Option<Format> {
        self.core.current
    }

    /// Every format seen (retransmitted frames' included).
    pub fn formats_seen(&self) -> &BTreeSet<Format> {
        &self.core.formats_seen
    }

    /// Changes of the stream's format.
    pub fn format_switches(&self) -> u64 {
        self.core.format_switches
    }

    /// The publisher's session and the frames' accounting.
    pub fn tracker(&self) -> &SessionTracker {
        &self.core.tracker
    }

    /// The tracker, to be told of greetings, `FORMAT` records, `END`s and datagram headers.
    pub fn tracker_mut(&mut self) -> &mut SessionTracker {
        &mut self.core.tracker
    }

    /// The A/B lines, when there are two.
    pub fn lines(&self) -> Option<&Lines> {
        self.core.lines.as_ref()
    }

    /// The A/B lines, to count datagrams per line.
    pub fn lines_mut(&mut self) -> Option<&mut Lines> {
        self.core.lines.as_mut()
    }

    /// The recovery book, when recovery is on.
    pub fn book(&self) -> Option<&RecoveryBook> {
        self.core.book.as_ref()
    }

    /// The recovery book, to be told of answers.
    pub fn book_mut(&mut self) -> Option<&mut RecoveryBook> {
        self.core.book.as_mut()
    }

    /// Retransmitted payloads ([`Origin::Recovered`]) come from a store read in order from the
    /// first frame missing (a receiver catching up, see [`super::datagram`]) while `on`: a frame
    /// missing fills its gap as a retransmitted one does; one at or below the highest frame
    /// taken is a copy the order brings again, skipped without being counted; one past it is
    /// the stream's own next frame, taken and accounted as one (its gap anomalies included).
    pub fn set_store_in_order(&mut self, on: bool) {
        self.core.store_in_order = on;
    }

    /// A snapshot of `session`'s state as of frame `as_of` was taken: the stream is owed from
    /// the frame after it (a loss before the first frame received is a gap, recovered), and its
    /// frames up to `as_of` that still come (datagrams received while the snapshot was on its
    /// way) are skipped without being counted. Call before any frame is taken.
    pub fn covered_by_snapshot(&mut self, session: u64, as_of: u64) {
        let from = as_of.saturating_add(1);
        self.core.covered = Some((session, as_of));
        self.core.tracker.expect_from(from);
        if let Some(lines) = &mut self.core.lines {
            lines.expect_from(from);
        }
        if let Some(book) = &mut self.core.book {
            book.expect_from(from);
        }
    }

    /// The lowest frame taken in the run's first session, if any.
    pub fn first_frame(&self) -> Option<u64> {
        self.core.first_frame.map(|(_, seq)| seq)
    }

    /// A relay's next frame owed: the one after the last handed on.
    pub fn ordered_next(&self) -> Option<u64> {
        self.core.next
    }

    /// Messages a raw codec skipped (shorter than their type's layout).
    pub fn raw_skipped_messages(&self) -> u64 {
        match &self.core.codecs[usize::from(Format::Raw.id())] {
            Some(Codec::Raw(raw)) => raw.skipped_messages(),
            _ => 0,
        }
    }

    /// Echoes due (round-trip mode), oldest first, to be sent back.
    pub fn drain_echoes(&mut self) -> std::collections::vec_deque::Drain<'_, Echo> {
        self.core.echoes.drain(..)
    }

    /// The oldest echo due, if any.
    pub fn next_echo(&mut self) -> Option<Echo> {
        self.core.echoes.pop_front()
    }

    /// Whether echoes are waiting.
    pub fn has_echoes(&self) -> bool {
        !self.core.echoes.is_empty()
    }

    /// Notes the format the publisher uses from now on (greeting, `FORMAT` record, data header).
    pub fn note_format(&mut self, format: Format) -> Option<FormatChange> {
        self.core.note_format(format)
    }

    /// Frames still missing that recovery may yet fill (0 without recovery, or once the service
    /// refused).
    pub fn missing(&self) -> u64 {
        self.core.book.as_ref().filter(|b| !b.is_refused()).map_or(0, |b| b.missing())
    }

    /// The publisher's `END` (after the tracker took it): frames up to `next` were sent, so the
    /// lines and the recovery book know what is missing at the tail.
    pub fn stream_ended(&mut self, next: u64, now: i64) {
        self.core.sync_epoch();
        if let Some(lines) = &mut self.core.lines {
            lines.end(next);
        }
        if let Some(book) = &mut self.core.book {
            book.end(next, now);
        }
    }

    /// The run is over: a datagram still held was never confirmed, and the frames still missing
    /// will not come now (they count as lost, and as unrecoverable).
    pub fn finish(&mut self) {
        self.core.tracker.finish();
        self.core.sync_epoch();
        if let Some(book) = &mut self.core.book {
            book.give_up_all();
        }
    }

    /// The protection this reader expects.
    pub fn protection(&self) -> crate::relay::protect::Protection {
        self.unsealer.as_ref().map(Unsealer::protection).unwrap_or_default()
    }

    /// Takes the unsealer out, so a datagram it opened can be read by this reader: payloads are
    /// taken as plain while it is out. Give it back with [`FrameReader::put_unsealer`].
    pub fn take_unsealer(&mut self) -> Option<Unsealer> {
        self.unsealer.take()
    }

    /// Gives the unsealer back.
    pub fn put_unsealer(&mut self, unsealer: Unsealer) {
        self.unsealer = Some(unsealer);
    }

    /// Takes a payload: opens its protected frames, accounts for and decodes each declared frame,
    /// handing it to `visitor`.
    pub fn payload<V: FrameVisitor + ?Sized>(&mut self, p: Payload<'_>, visitor: &mut V) -> PayloadOutcome {
        match self.core.mode {
            ReaderMode::Window => {
                let Some(unsealer) = self.unsealer.as_mut() else { return self.core.window(p, visitor) };
                let plain = match unsealer.frames(p.session, p.first_sequence, p.format, p.declared_frames, p.bytes) {
                    Ok(plain) => plain,
                    Err(error) => {
                        visitor.anomaly(&Anomaly::Unsealed {
                            at: p.place.at(0),
                            first: p.first_sequence,
                            frames: p.declared_frames,
                            error: &error,
                        });
                        return PayloadOutcome::default();
                    }
                };
                self.core.window(Payload { bytes: plain, ..p }, visitor)
            }
            ReaderMode::Ordered => self.ordered(p, visitor),
        }
    }

    /// A relay's payload: frames in increasing order, each checked as it is reached.
    fn ordered<V: FrameVisitor + ?Sized>(&mut self, p: Payload<'_>, visitor: &mut V) -> PayloadOutcome {
        let FrameReader { unsealer, core } = self;
        if let Some(change) = core.note_format(p.format) {
            visitor.format_changed(change.from, change.to);
        }
        let crc = unsealer.as_ref().is_some_and(|u| u.protection().any());
        let codec =
            core.codecs[usize::from(p.format.id())].get_or_insert_with(|| Codec::new(p.format, Limits::default()));
        let mut outcome = PayloadOutcome::default();
        let mut offset = 0usize;
        for index in 0..p.declared_frames {
            let rest = p.bytes.get(offset..).unwrap_or_default();
            // Continuity keeps a DATA record's first number at most MAX_SEQUENCE: no overflow.
            let sequence = p.first_sequence.saturating_add(index);
            // Where the frame's own bytes are in the payload, and the bytes it takes there.
            let (start, len, taken) = if crc {
                // Checked before anything of the frame is read: a changed byte, or a length that
                // does not fit the record, costs the connection, not the frame.
                let Some(unsealer) = unsealer.as_mut() else { break };
                let opened = match unsealer.sealed_len(rest) {
                    Ok(Some(sealed)) => unsealer
                        .open_one(p.session, sequence, p.format, &rest[..sealed])
                        .map(|body| (sealed, body.len())),
                    Ok(None) => Err(ProtectError::Malformed {
                        offset: rest.len(),
                        what: "the record ends inside the protected frame".into(),
                    }),
                    Err(e) => Err(e),
                };
                match opened {
                    // CRC-32C only (a relay refuses encryption): the frame is the body behind
                    // the length prefix.
                    Ok((sealed, body)) => (offset + LEN_PREFIX, body, sealed),
                    Err(error) => {
                        core.counts.frame_check_failures += 1;
                        outcome.check_failed = Some(FrameCheckFailure { sequence, at: p.place.at(offset), error });
                        return outcome;
                    }
                }
            } else {
                match codec.frame_len(rest) {
                    Ok(Some(n)) if n > 0 && n <= rest.len() => (offset, n, n),
                    delimit => {
                        core.counts.undelimited_payloads += 1;
                        visitor.anomaly(&Anomaly::Undelimited {
                            at: p.place.at(offset),
                            format: p.format,
                            frame: index,
                            what: undelimited(delimit, rest.len()),
                        });
                        break;
                    }
                }
            };
            offset += taken;
            if let Some(expected) = core.next {
                if sequence < expected {
                    core.counts.ordered.duplicates += 1;
                    continue;
                }
                if sequence > expected {
                    core.counts.ordered.gaps += sequence - expected;
                    visitor.anomaly(&Anomaly::Gap { missing: sequence - expected, before: sequence });
                }
            }
            core.next = Some(sequence.saturating_add(1));
            let frame = &p.bytes[start..start + len];
            let info = FrameInfo {
                sequence,
                format: p.format,
                origin: p.origin,
                index,
                receive_time: p.receive_time,
                at: p.place.at(start),
            };
            visitor.begin(&info);
            let decoded = codec.decode(frame, |m| visitor.message(&info, m));
            match &decoded {
                Ok(_) => {
                    core.counts.frames_decoded += 1;
                    outcome.decoded += 1;
                }
                Err(error) => {
                    core.counts.decode_errors += 1;
                    visitor.anomaly(&Anomaly::DecodeFailed { at: info.at, frame: index, sequence, error });
                }
            }
            visitor.end(&info, frame, decoded.as_ref());
        }
        outcome
    }
}

/// What was wrong with a frame that could not be delimited.
fn undelimited(delimit: Result<Option<usize>, DecodeError>, left: usize) -> String {
    match delimit {
        Err(e) => e.to_string(),
        Ok(None) => format!("{left} bytes left, not a whole frame"),
        Ok(Some(n)) => format!("framing says {n} bytes with {left} left"),
    }
}

impl Core {
    fn note_format(&mut self, format: Format) -> Option<FormatChange> {
        self.formats_seen.insert(format);
        let from = self.current;
        self.current = Some(format);
        match from {
            Some(old) if old == format => None,
            Some(_) => {
                self.format_switches += 1;
                Some(FormatChange { from, to: format })
            }
            None => Some(FormatChange { from, to: format }),
        }
    }

    /// Brings the per-line and recovery accounting to the tracker's epoch: when sequence
    /// tracking started over, so do they.
    fn sync_epoch(&mut self) {
        let epoch = self.tracker.epoch();
        if let Some(lines) = &mut self.lines {
            lines.sync(epoch);
        }
        if let Some(book) = &mut self.book {
            book.sync(epoch);
        }
    }

    /// A subscriber's payload: exactly the declared frames, each through the window (and the
    /// lines, and the book), the new ones decoded. Retransmitted frames are in their original
    /// format, which is not a switch of the stream's, and are taken only while missing; they
    /// are not echoed.
    fn window<V: FrameVisitor + ?Sized>(&mut self, p: Payload<'_>, visitor: &mut V) -> PayloadOutcome {
        let recovered = p.origin == Origin::Recovered;
        if recovered {
            self.formats_seen.insert(p.format);
        } else if self.current != Some(p.format)
            && let Some(change) = self.note_format(p.format)
        {
            visitor.format_changed(change.from, change.to);
        }
        self.sync_epoch();
        let now = if self.book.is_some() { p.now } else { 0 };
        let Core {
            codecs,
            filter,
            tracker,
            lines,
            book,
            first_frame,
            echoes,
            echo_every,
            echo_countdown,
            counts,
            store_in_order,
            covered,
            ..
        } = self;
        let every_message = visitor.every_message();
        let codec = codecs[usize::from(p.format.id())].get_or_insert_with(|| Codec::new(p.format, Limits::default()));
        let mut outcome = PayloadOutcome::default();
        let mut offset = 0usize;
        let mut index = 0u64;
        let declared = p.declared_frames;
        while index < declared && offset < p.bytes.len() {
            let rest = &p.bytes[offset..];
            let sequence = p.first_sequence.saturating_add(index);
            let len = match codec.frame_len(rest) {
                Ok(Some(n)) if n > 0 && n <= rest.len() => n,
                delimit => {
                    counts.undelimited_payloads += 1;
                    visitor.anomaly(&Anomaly::Undelimited {
                        at: p.place.at(offset),
                        format: p.format,
                        frame: index,
                        what: undelimited(delimit, rest.len()),
                    });
                    return outcome;
                }
            };
            let frame = &rest[..len];
            offset += len;
            index += 1;
            if covered.is_some_and(|(session, as_of)| session == p.session && sequence <= as_of) {
                continue;
            }
            // A frame of a store read in order that is not missing: a copy, or the stream's own.
            let in_order = p.origin == Origin::Recovered
                && *store_in_order
                && book.as_ref().is_some_and(|book| !book.is_missing(sequence));
            let observed = match (p.origin, lines.as_mut(), book.as_mut()) {
                (Origin::Recovered, _, Some(_)) if in_order => {
                    if tracker.highest().is_some_and(|high| sequence <= high) {
                        continue;
                    }
                    tracker.observe(sequence)
                }
                (Origin::Recovered, _, Some(book)) => {
                    if book.recovered(sequence, now) {
                        // Missing until now, so new to the window: it fills its hole without
                        // counting as reordered.
                        let o = tracker.observe_copy(sequence);
                        if matches!(o, Observed::InOrder | Observed::Gap(_)) {
                            book.slide(tracker.highest());
                        }
                        o
                    } else {
                        continue;
                    }
                }
                // Without recovery there is nothing to fill.
                (Origin::Recovered, _, None) => continue,
                (Origin::Line(line), Some(lines), _) => match lines.observe(line, sequence, tracker) {
                    Some(o) => o,
                    // The other line's copy of a frame taken already: expected, not a duplicate.
                    None => continue,
                },
                _ => tracker.observe(sequence),
            };
            let recovered = recovered && !in_order;
            if !recovered
                && observed.take()
                && let Some(book) = book.as_mut()
            {
                book.original(sequence, tracker.highest(), now);
            }
            if observed.take() {
                let epoch = tracker.epoch();
                match first_frame {
                    None => *first_frame = Some((epoch, sequence)),
                    Some((e, low)) if *e == epoch && sequence < *low => *low = sequence,
                    _ => {}
                }
            }
            match observed {
                Observed::InOrder => {}
                Observed::Gap(_) if recovered => {}
                Observed::Gap(missing) => visitor.anomaly(&Anomaly::Gap { missing, before: sequence }),
                Observed::Duplicate => {
                    visitor.anomaly(&Anomaly::Duplicate { sequence });
                    continue;
                }
                Observed::TooLate => {
                    visitor.anomaly(&Anomaly::TooLate { sequence });
                    continue;
                }
                Observed::Reordered if recovered => {}
                Observed::Reordered => visitor.anomaly(&Anomaly::Reordered { sequence }),
            }
            let info = FrameInfo {
                sequence,
                format: p.format,
                origin: if in_order { Origin::Stream } else { p.origin },
                index: index - 1,
                receive_time: p.receive_time,
                at: p.place.at(offset - len),
            };
            visitor.begin(&info);
            let decoded = match filter.as_mut() {
                // Filter before decode: other symbols' messages are skipped on their type and
                // symbol, as far as the format allows, and only counted.
                Some((filter, skipped)) if !every_message => {
                    let decoded =
                        codec.decode_filtered(frame, filter, |m| visitor.message(&info, m), |k| skipped.push(k));
                    for kind in skipped.drain(..) {
                        visitor.skipped(&info, kind);
                    }
                    decoded
                }
                _ => codec.decode(frame, |m| visitor.message(&info, m)),
            };
            match &decoded {
                // Its publish time is as old as the gap: not echoed.
                Ok(_) if recovered => {
                    counts.frames_decoded += 1;
                    counts.frames_recovered += 1;
                    outcome.decoded += 1;
                }
                Ok(header) => {
                    counts.frames_decoded += 1;
                    outcome.decoded += 1;
                    if let Some(every) = *echo_every {
                        *echo_countdown -= 1;
                        if *echo_countdown == 0 {
                            *echo_countdown = every;
                            echoes.push_back(Echo { publish_time: header.publish_time, sequence });
                        }
                    }
                }
                Err(error) => {
                    counts.decode_errors += 1;
                    visitor.anomaly(&Anomaly::DecodeFailed { at: info.at, frame: index - 1, sequence, error });
                }
            }
            visitor.end(&info, frame, decoded.as_ref());
        }
        if offset < p.bytes.len() {
            counts.excess_payloads += 1;
            visitor.anomaly(&Anomaly::Excess { at: p.place.at(offset), declared, bytes: p.bytes.len() - offset });
        } else if index < declared {
            visitor.anomaly(&Anomaly::FewerFrames { at: p.place.at(0), declared, found: index });
        }
        outcome
    }
}

#[cfg(test)]
#[path = "frames_tests.rs"]
mod tests;
