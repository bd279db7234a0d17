//! The frame reader's visitor: what one call into a machine produced (frames with their
//! messages, and events), kept in buffers reused from call to call until the caller has taken
//! every item, one at a time. Nothing is allocated per message once the buffers have grown to
//! the largest payload seen.

use crate::event::{Event, Frame, FrameSlot, Notice, Skipped, Stored, known};
use mdrelay_codec::{BatchHeader, DecodeError, Format};
use mdrelay_iex::counts::TypeCounts;
use mdrelay_iex::message::Message;
use mdrelay_proto::relay::client::{Anomaly, FrameInfo, FrameVisitor, Origin};
use std::net::SocketAddr;

/// One thing to hand out.
#[derive(Debug)]
pub(crate) enum Item {
    Frame(FrameSlot),
    Notice(Notice),
}

/// What the subscriber itself counts of what it handed out.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Frames handed out (decoded or not).
    pub frames: u64,
    /// Messages read, the filter's skipped ones included.
    pub messages: u64,
    /// Of those, skipped by the filter.
    pub skipped: u64,
    /// Messages by type byte.
    pub by_type: TypeCounts,
}

/// The items of the last call into a machine, and the buffers they borrow from.
#[derive(Debug)]
pub(crate) struct Collector {
    items: Vec<Item>,
    /// The next item to hand out.
    cursor: usize,
    /// The item at `cursor - 1` was handed out and may still be borrowed until the next call.
    messages: Vec<Stored>,
    skipped: Vec<u8>,
    /// Unknown messages' bytes, and frames' bytes when kept.
    arena: Vec<u8>,
    keep_bytes: bool,
    /// The frame being decoded, as an index in `items`.
    open: Option<usize>,
    /// A frame announced as filling a gap (reordered), until it is decoded.
    reordered: Option<u64>,
    /// Who sent the frames of the stream now: the publisher (TCP), or the sender of the
    /// datagram being taken (UDP); set by the driver.
    pub stream_peer: Option<SocketAddr>,
    /// The retransmission service answering now; set by the driver.
    pub recovery_peer: Option<SocketAddr>,
    pub tally: Tally,
}

fn len32(n: usize) -> u32 {
    // Buffers hold one call's frames: far below 4 GiB (a record is at most 64 MiB).
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Collector {
    /// An empty collector; `keep_bytes`: frames keep a copy of their bytes.
    pub fn new(keep_bytes: bool) -> Collector {
        Collector {
            items: Vec::new(),
            cursor: 0,
            messages: Vec::new(),
            skipped: Vec::new(),
            arena: Vec::new(),
            keep_bytes,
            open: None,
            reordered: None,
            stream_peer: None,
            recovery_peer: None,
            tally: Tally::default(),
        }
    }

    /// Whether an item is waiting to be handed out.
    pub fn has_items(&self) -> bool {
        self.cursor < self.items.len()
    }

    /// Items not yet handed out.
    pub fn waiting(&self) -> usize {
        self.items.len() - self.cursor
    }

    /// Forgets what was handed out, once everything was: the buffers are reused.
    pub fn recycle(&mut self) {
        if !self.has_items() && !self.items.is_empty() {
            self.items.clear();
            self.messages.clear();
            self.skipped.clear();
            self.arena.clear();
            self.cursor = 0;
        }
    }

    /// Adds an event.
    pub fn notice(&mut self, notice: Notice) {
        self.items.push(Item::Notice(notice));
    }

    /// Hands out the next item; see [`Collector::has_items`].
    pub fn take(&mut self) -> Option<Event<Frame<'_>>> {
        let item = self.items.get(self.cursor)?;
        self.cursor += 1;
        Some(match item {
            Item::Notice(notice) => notice.clone().map_frame(|never| match never {}),
            Item::Frame(slot) => Event::Frame(Frame {
                slot,
                messages: &self.messages[slot.messages.0 as usize..slot.messages.1 as usize],
                skipped: &self.skipped[slot.skipped.0 as usize..slot.skipped.1 as usize],
                arena: &self.arena,
            }),
        })
    }

    fn frame(&mut self) -> Option<&mut FrameSlot> {
        match self.items.get_mut(self.open?) {
            Some(Item::Frame(slot)) => Some(slot),
            _ => None,
        }
    }
}

impl FrameVisitor for Collector {
    fn begin(&mut self, info: &FrameInfo) {
        let (line, recovered) = match info.origin {
            Origin::Stream => (None, false),
            Origin::Line(line) => (Some(line), false),
            Origin::Recovered => (None, true),
        };
        let peer = if recovered { self.recovery_peer } else { self.stream_peer };
        let reordered = self.reordered.take() == Some(info.sequence);
        let messages = len32(self.messages.len());
        let skipped = len32(self.skipped.len());
        self.open = Some(self.items.len());
        self.items.push(Item::Frame(FrameSlot {
            sequence: info.sequence,
            format: info.format,
            line,
            peer,
            recovered,
            reordered,
            receive_time: info.receive_time,
            decoded: Ok(BatchHeader::default()),
            messages: (messages, messages),
            skipped: (skipped, skipped),
            bytes: None,
        }));
    }

    fn message(&mut self, _: &FrameInfo, message: &Message<'_>) {
        let stored = match (known(message), message) {
            (Some(m), _) => Stored::Known(m),
            (None, Message::Unknown(u)) => {
                let at = len32(self.arena.len());
                self.arena.extend_from_slice(u.bytes);
                Stored::Unknown { kind: u.kind, at, len: len32(u.bytes.len()) }
            }
            // Every type but Unknown is known.
            (None, other) => Stored::Unknown { kind: other.kind(), at: 0, len: 0 },
        };
        self.messages.push(stored);
        self.tally.messages += 1;
        self.tally.by_type.add(message.kind());
    }

    fn skipped(&mut self, _: &FrameInfo, kind: u8) {
        self.skipped.push(kind);
        self.tally.messages += 1;
        self.tally.skipped += 1;
        self.tally.by_type.add(kind);
    }

    fn end(&mut self, _: &FrameInfo, bytes: &[u8], decoded: Result<&BatchHeader, &DecodeError>) {
        let kept = self.keep_bytes.then(|| {
            let at = len32(self.arena.len());
            self.arena.extend_from_slice(bytes);
            (at, len32(bytes.len()))
        });
        let (messages, skipped) = (len32(self.messages.len()), len32(self.skipped.len()));
        self.tally.frames += 1;
        if let Some(slot) = self.frame() {
            slot.messages.1 = messages;
            slot.skipped.1 = skipped;
            slot.bytes = kept;
            slot.decoded = decoded.cloned().map_err(Clone::clone);
        }
        self.open = None;
    }

    fn format_changed(&mut self, from: Option<Format>, to: Format) {
        self.notice(Event::FormatChanged { from, to });
    }

    fn anomaly(&mut self, anomaly: &Anomaly<'_>) {
        let notice = match anomaly {
            Anomaly::Gap { missing, before } => Event::Gap { first: before.saturating_sub(*missing), count: *missing },
            Anomaly::Reordered { sequence } => {
                self.reordered = Some(*sequence);
                return;
            }
            // A frame that does not decode is handed out with its error (and counted).
            Anomaly::DecodeFailed { .. } => return,
            Anomaly::Duplicate { sequence } => Event::Skipped(Skipped::Duplicate { sequence: *sequence }),
            Anomaly::TooLate { sequence } => Event::Skipped(Skipped::TooLate { sequence: *sequence }),
            Anomaly::Unsealed { at, first, error, .. } => {
                Event::Skipped(Skipped::Protection { at: at.to_string(), first: *first, why: error.to_string() })
            }
            Anomaly::Undelimited { at, format, what, .. } => {
                Event::Skipped(Skipped::Undelimited { at: at.to_string(), format: *format, what: what.clone() })
            }
            Anomaly::Excess { at, bytes, .. } => Event::Skipped(Skipped::Excess { at: at.to_string(), bytes: *bytes }),
            Anomaly::FewerFrames { at, declared, found } => {
                Event::Skipped(Skipped::FewerFrames { at: at.to_string(), declared: *declared, found: *found })
            }
        };
        self.notice(notice);
    }
}
