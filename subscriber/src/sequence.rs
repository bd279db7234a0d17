//! Frame sequence tracking over a bounded window: frames lost, duplicated and reordered.
//!
//! A bitmap remembers which of the last [`WINDOW`] sequence numbers (below the highest seen)
//! arrived, so memory is fixed whatever the stream does. Loss is counted as the holes between
//! the lowest and highest sequence seen: a frame that arrives late fills its hole (and counts as
//! reordered) instead of being counted lost and then found. A frame older than the window
//! cannot be told apart from a duplicate; it is taken as a late arrival and counted in
//! `beyond_window` so the report shows the guess was made.

/// Sequence numbers remembered below the highest seen.
pub const WINDOW: u64 = 4096;

const WORDS: usize = (WINDOW / 64) as usize;

/// Counts over the frames observed so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SequenceCounts {
    /// Frames never received between the lowest and highest sequence seen.
    pub lost: u64,
    /// Frames received more than once (within the window).
    pub duplicates: u64,
    /// Frames that arrived after a later frame, filling a hole.
    pub reordered: u64,
    /// Frames older than the window, taken as late arrivals.
    pub beyond_window: u64,
}

/// The window for one publisher session.
#[derive(Clone, Debug)]
pub struct SequenceWindow {
    /// Bit `s % WINDOW` set: sequence `s` arrived, for `s` in `(highest - WINDOW, highest]`.
    bits: Box<[u64; WORDS]>,
    /// Lowest and highest sequence seen.
    range: Option<(u64, u64)>,
    /// Distinct sequence numbers received.
    distinct: u64,
    duplicates: u64,
    reordered: u64,
    beyond_window: u64,
}

impl Default for SequenceWindow {
    fn default() -> Self {
        SequenceWindow::new()
    }
}

/// What one observation was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// The first frame, or the one after the highest.
    InOrder,
    /// Ahead of the next expected: this many frames are (for now) missing before it.
    Gap(u64),
    /// Seen before.
    Duplicate,
    /// Older than the highest and not seen before: fills a hole.
    Reordered,
    /// Too old for the window to tell.
    BeyondWindow,
}

impl SequenceWindow {
    /// An empty window.
    pub fn new() -> SequenceWindow {
        SequenceWindow {
            bits: Box::new([0; WORDS]),
            range: None,
            distinct: 0,
            duplicates: 0,
            reordered: 0,
            beyond_window: 0,
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

    /// Records the arrival of frame `seq`.
    pub fn observe(&mut self, seq: u64) -> Observed {
        let Some((low, high)) = self.range else {
            self.range = Some((seq, seq));
            self.test_and_set(seq);
            self.distinct = 1;
            return Observed::InOrder;
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
            self.beyond_window += 1;
            self.distinct += 1;
            self.range = Some((low.min(seq), high));
            return Observed::BeyondWindow;
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

    /// The counts so far.
    pub fn counts(&self) -> SequenceCounts {
        let span = self.range.map_or(0, |(low, high)| (high - low).saturating_add(1));
        SequenceCounts {
            lost: span.saturating_sub(self.distinct),
            duplicates: self.duplicates,
            reordered: self.reordered,
            beyond_window: self.beyond_window,
        }
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
        // A frame older than the first seen, but inside the window, is reordering, not loss.
        assert_eq!(run(&[10, 9, 11]), SequenceCounts { reordered: 1, ..Default::default() });
        let mut w = SequenceWindow::new();
        assert_eq!(w.observe(7), Observed::InOrder);
        assert_eq!(w.observe(10), Observed::Gap(2));
        assert_eq!(w.observe(10), Observed::Duplicate);
        assert_eq!(w.observe(8), Observed::Reordered);
        assert_eq!(w.counts().lost, 1);
    }

    #[test]
    fn the_window_is_bounded_and_slides() {
        let mut w = SequenceWindow::new();
        for s in 1..=10 * WINDOW {
            w.observe(s);
        }
        assert_eq!(w.counts(), SequenceCounts::default());
        // Slots reused by the slide do not read as duplicates.
        assert_eq!(w.observe(10 * WINDOW + 1), Observed::InOrder);
        assert_eq!(w.observe(1), Observed::BeyondWindow);
        // A huge jump clears the window without looping over it.
        assert_eq!(w.observe(u64::MAX - 1), Observed::Gap(u64::MAX - 2 - (10 * WINDOW + 1)));
        assert_eq!(w.observe(u64::MAX - 1), Observed::Duplicate);
        assert_eq!(w.observe(u64::MAX - 2), Observed::Reordered);
    }
}
