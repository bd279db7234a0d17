//! Frame sequence accounting for one publisher session over a bounded window: frames lost,
//! duplicated, reordered and too late.
//!
//! A bitmap remembers which of the last [`WINDOW`] sequence numbers (up to the highest seen)
//! arrived, so memory is fixed whatever the stream does. Loss is the count of numbers never
//! received between the first frame the stream owed this receiver and the last one it sent:
//! - the first is the anchor a TCP publisher names (the first frame it offers this subscriber),
//!   or else the lowest number seen, so frames dropped before the first one received count, and
//!   two datagrams that arrive swapped are reordering, not a late join;
//! - the last is the highest seen or, once the publisher's END says so, the frame before the
//!   END's sequence number, so frames dropped at the tail count too.
//!
//! A frame that arrives late fills its hole (and counts as reordered) instead of being counted
//! lost and then found. A frame older than the window cannot be told from a duplicate: it is
//! counted as too late and not taken, so a duplicate can never be aggregated twice; if it was a
//! real late frame, its number stays counted as lost.

/// Sequence numbers remembered up to the highest seen: 8 KiB of bitmap, and the time loss
/// recovery has to fill a hole (0.65 s at 100,000 frames/s) before the frame is too late.
pub const WINDOW: u64 = 65_536;

const WORDS: usize = (WINDOW / 64) as usize;

/// Counts over the frames observed so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SequenceCounts {
    /// Frames never received that the publisher sent this receiver (see the module's doc).
    pub lost: u64,
    /// Frames received more than once (within the window).
    pub duplicates: u64,
    /// Frames that arrived after a later frame, filling a hole.
    pub reordered: u64,
    /// Frames older than the window: not taken (a duplicate or a frame too late to tell).
    pub too_late: u64,
}

counters_add!(SequenceCounts { lost, duplicates, reordered, too_late });

/// What one observation was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// The first frame, or the one after the highest.
    InOrder,
    /// Ahead of the next expected: this many frames are (for now) missing before it.
    Gap(u64),
    /// Seen before: do not take it again.
    Duplicate,
    /// Older than the highest and not seen before: fills a hole.
    Reordered,
    /// Too old for the window to tell it from a duplicate: not taken.
    TooLate,
}

impl Observed {
    /// Whether the frame is new and should be taken (decoded and aggregated).
    pub fn take(self) -> bool {
        matches!(self, Observed::InOrder | Observed::Gap(_) | Observed::Reordered)
    }
}

/// Where a sequence number falls relative to the window, before it is observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// Nothing seen yet, or within reach of the window: observe it.
    Plausible,
    /// Further ahead of the highest, or further behind it, than any reordering or burst of loss
    /// the window is meant for: a corrupt header, a forged datagram, or a genuine jump that the
    /// next datagram will confirm.
    Implausible,
}

/// The window for one publisher session.
#[derive(Clone, Debug)]
pub struct SequenceWindow {
    /// Bit `s % WINDOW` set: sequence `s` arrived, for `s` in `(highest - WINDOW, highest]`.
    bits: Box<[u64; WORDS]>,
    /// The first frame owed, when the publisher named it.
    anchor: Option<u64>,
    /// Lowest and highest sequence seen.
    range: Option<(u64, u64)>,
    /// The END's next sequence number, once received.
    end: Option<u64>,
    /// Distinct sequence numbers received, at or above the anchor.
    distinct: u64,
    duplicates: u64,
    reordered: u64,
    too_late: u64,
}

impl Default for SequenceWindow {
    fn default() -> Self {
        SequenceWindow::new()
    }
}

impl SequenceWindow {
    /// An empty window.
    pub fn new() -> SequenceWindow {
        SequenceWindow {
            bits: Box::new([0; WORDS]),
            anchor: None,
            range: None,
            end: None,
            distinct: 0,
            duplicates: 0,
            reordered: 0,
            too_late: 0,
        }
    }

    fn bit(seq: u64) -> (usize, u64) {
        let i = seq % WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    fn test_and_set(&mut self, seq: u64) -> bool {
        let (w, m) = SequenceWindow::bit(seq);
        let was = self.bits[w] & m != 0;
        self.bits[w] |= m;
        was
    }

    fn clear(&mut self, seq: u64) {
        let (w, m) = SequenceWindow::bit(seq);
        self.bits[w] &= !m;
    }

    /// The publisher names `first` as the first frame it offers this receiver (a TCP
    /// subscriber's first record). Taken only before any frame is seen: afterwards the frames
    /// seen say more.
    pub fn expect_from(&mut self, first: u64) {
        if self.range.is_none() {
            self.anchor = Some(first);
        }
    }

    /// True before any frame is seen.
    pub fn is_empty(&self) -> bool {
        self.range.is_none()
    }

    /// The highest sequence seen.
    pub fn highest(&self) -> Option<u64> {
        self.range.map(|(_, high)| high)
    }

    /// The first frame this receiver is owed: the anchor, or the lowest seen.
    pub fn first(&self) -> Option<u64> {
        self.anchor.or(self.range.map(|(low, _)| low))
    }

    /// Where `seq` falls: a jump of more than a window ahead of the highest, or of more than two
    /// windows behind it, is implausible until confirmed.
    pub fn position(&self, seq: u64) -> Position {
        let Some((_, high)) = self.range else {
            return match self.anchor {
                Some(anchor) if seq.abs_diff(anchor) > WINDOW => Position::Implausible,
                _ => Position::Plausible,
            };
        };
        if seq > high.saturating_add(WINDOW) || seq.saturating_add(2 * WINDOW) < high {
            Position::Implausible
        } else {
            Position::Plausible
        }
    }

    /// Records the arrival of frame `seq`.
    pub fn observe(&mut self, seq: u64) -> Observed {
        if self.anchor.is_some_and(|anchor| seq < anchor) {
            // Before the first frame the publisher offered: it cannot be a frame owed to us.
            self.too_late += 1;
            return Observed::TooLate;
        }
        let Some((low, high)) = self.range else {
            self.range = Some((seq, seq));
            self.test_and_set(seq);
            self.distinct = 1;
            return match self.anchor {
                Some(anchor) if seq > anchor => Observed::Gap(seq - anchor),
                _ => Observed::InOrder,
            };
        };
        if seq > high {
            // Forget the slots the window slides over: they now stand for the new numbers.
            let ahead = seq - high;
            if ahead >= WINDOW {
                self.bits.fill(0);
            } else {
                for s in high + 1..seq {
                    self.clear(s);
                }
            }
            self.test_and_set(seq);
            self.distinct += 1;
            self.range = Some((low, seq));
            return if ahead == 1 { Observed::InOrder } else { Observed::Gap(ahead - 1) };
        }
        if high - seq >= WINDOW {
            self.too_late += 1;
            return Observed::TooLate;
        }
        if self.test_and_set(seq) {
            self.duplicates += 1;
            return Observed::Duplicate;
        }
        self.distinct += 1;
        self.reordered += 1;
        self.range = Some((low.min(seq), high));
        Observed::Reordered
    }

    /// Records a frame that may be a redundant copy: a retransmission, or the other line's copy
    /// of an A/B pair. A frame already held is reported as a duplicate without being counted as
    /// one (the copy was expected), a hole it fills is not counted as reordering, and one older
    /// than the window is reported too late without being counted (the caller accounts for it).
    pub fn observe_copy(&mut self, seq: u64) -> Observed {
        let Some((low, high)) = self.range else { return self.observe(seq) };
        if seq > high {
            return self.observe(seq);
        }
        if self.anchor.is_some_and(|anchor| seq < anchor) || high - seq >= WINDOW {
            return Observed::TooLate;
        }
        if self.test_and_set(seq) {
            return Observed::Duplicate;
        }
        self.distinct += 1;
        self.range = Some((low.min(seq), high));
        Observed::Reordered
    }

    /// The publisher's END: `next` is the number its next frame would have had, so every frame
    /// owed to this receiver is below it.
    pub fn end(&mut self, next: u64) {
        self.end = Some(next);
    }

    /// The counts so far.
    pub fn counts(&self) -> SequenceCounts {
        let lost = match (self.first(), self.range) {
            (Some(first), Some((_, high))) => {
                let last = self.end.map_or(high, |next| high.max(next.saturating_sub(1)));
                (last.saturating_sub(first).saturating_add(1)).saturating_sub(self.distinct)
            }
            // Owed frames from the anchor to the END, none of which arrived.
            (Some(first), None) => self.end.map_or(0, |next| next.saturating_sub(first)),
            _ => 0,
        };
        SequenceCounts { lost, duplicates: self.duplicates, reordered: self.reordered, too_late: self.too_late }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seqs: &[u64]) -> SequenceCounts {
        let mut w = SequenceWindow::new();
        for &s in seqs {
            w.observe(s);
        }
        w.counts()
    }

    #[test]
    fn counts_gaps_duplicates_and_reordering() {
        assert_eq!(run(&[1, 2, 3]), SequenceCounts::default());
        assert_eq!(run(&[1, 2, 4, 5]).lost, 1);
        assert_eq!(run(&[1, 2, 2, 3]), SequenceCounts { duplicates: 1, ..Default::default() });
        assert_eq!(run(&[1, 3, 2, 4]), SequenceCounts { reordered: 1, ..Default::default() });
        // A late joiner counts from what it saw.
        assert_eq!(run(&[500, 501, 503]).lost, 1);
        // The first two swapped: reordering, nothing lost, and the first frame is the lowest.
        assert_eq!(run(&[2, 1, 3]), SequenceCounts { reordered: 1, ..Default::default() });
        let mut w = SequenceWindow::new();
        assert_eq!(w.observe(7), Observed::InOrder);
        assert_eq!(w.observe(10), Observed::Gap(2));
        assert_eq!(w.observe(10), Observed::Duplicate);
        assert_eq!(w.observe(8), Observed::Reordered);
        assert_eq!(w.counts().lost, 1);
        assert_eq!(w.first(), Some(7));
    }

    #[test]
    fn loss_at_the_head_and_the_tail_is_counted() {
        // The publisher offered frames from 100 on; the first two were dropped for this receiver.
        let mut w = SequenceWindow::new();
        w.expect_from(100);
        assert_eq!(w.observe(102), Observed::Gap(2));
        w.observe(103);
        // Its END says the stream went on to 110: 104..=109 never came.
        w.end(110);
        assert_eq!(w.counts().lost, 2 + 6);
        // Nothing at all arrived of 100..110.
        let mut w = SequenceWindow::new();
        w.expect_from(100);
        w.end(110);
        assert_eq!(w.counts().lost, 10);
        // An END that says less than was seen takes nothing away.
        let mut w = SequenceWindow::new();
        for s in 1..=5 {
            w.observe(s);
        }
        w.end(3);
        assert_eq!(w.counts().lost, 0);
    }

    #[test]
    fn frames_older_than_the_window_are_not_taken() {
        let mut w = SequenceWindow::new();
        for s in 1..=10 * WINDOW {
            assert!(w.observe(s).take());
        }
        assert_eq!(w.counts(), SequenceCounts::default());
        // Slots reused by the slide do not read as duplicates.
        assert_eq!(w.observe(10 * WINDOW + 1), Observed::InOrder);
        // A duplicate older than the window is not taken again.
        assert_eq!(w.observe(1), Observed::TooLate);
        assert!(!Observed::TooLate.take());
        assert_eq!(w.counts().too_late, 1);
        assert_eq!(w.counts().lost, 0);
        // Frames before the anchor are not owed, and not taken.
        let mut w = SequenceWindow::new();
        w.expect_from(50);
        assert_eq!(w.observe(49), Observed::TooLate);
    }

    #[test]
    fn copies_are_neither_duplicates_nor_reordering() {
        let mut w = SequenceWindow::new();
        w.observe(1);
        w.observe(4);
        assert_eq!(w.observe_copy(4), Observed::Duplicate);
        assert_eq!(w.observe_copy(2), Observed::Reordered);
        assert_eq!(w.observe_copy(5), Observed::InOrder);
        assert_eq!(w.counts(), SequenceCounts { lost: 1, ..Default::default() });
        w.observe(5 + WINDOW);
        assert_eq!(w.observe_copy(3), Observed::TooLate);
        assert_eq!(w.counts().too_late, 0);
    }

    #[test]
    fn jumps_beyond_the_window_are_implausible_and_arithmetic_saturates() {
        let mut w = SequenceWindow::new();
        assert_eq!(w.position(u64::MAX), Position::Plausible);
        w.observe(10);
        assert_eq!(w.position(10 + WINDOW), Position::Plausible);
        assert_eq!(w.position(11 + WINDOW), Position::Implausible);
        assert_eq!(w.position(u64::MAX), Position::Implausible);
        w.observe(3 * WINDOW);
        assert_eq!(w.position(WINDOW), Position::Plausible);
        assert_eq!(w.position(WINDOW - 1), Position::Implausible);
        // A confirmed jump to the very top of the range does not overflow.
        let mut w = SequenceWindow::new();
        w.observe(1);
        assert_eq!(w.observe(u64::MAX - 1), Observed::Gap(u64::MAX - 3));
        assert_eq!(w.observe(u64::MAX - 1), Observed::Duplicate);
        assert_eq!(w.observe(u64::MAX - 2), Observed::Reordered);
        w.end(u64::MAX);
        assert_eq!(w.counts().lost, u64::MAX - 4);
    }
}
