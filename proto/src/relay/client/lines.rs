//! A/B lines: the same stream received twice, on two sockets (two multicast groups or two
//! unicast ports, usually over two networks), merged into one (ported from the subscriber).
//!
//! Each line keeps a [`SequenceWindow`] of its own, so each line's own losses are counted; the
//! merged stream goes through the run's `SessionTracker` as a single line would. The first copy
//! of a frame, from whichever line, is taken as a single line's frame would be (a hole it fills
//! counts as reordering); the other line's copy of a frame already taken is *arbitrated*: not
//! decoded again, and not a duplicate. A frame a line delivers twice is a duplicate, as it is on
//! a single line.

use crate::relay::session::SessionTracker;
use crate::relay::window::{Observed, SequenceCounts, SequenceWindow};
use serde::Serialize;

/// One of the two lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Line {
    /// The first line (`listen` or `group`).
    A,
    /// The second line (`listen_b` or `group_b`).
    B,
}

impl Line {
    /// The line's index in arrays of two.
    pub fn index(self) -> usize {
        match self {
            Line::A => 0,
            Line::B => 1,
        }
    }

    /// The line's name in reports and logs.
    pub fn name(self) -> &'static str {
        match self {
            Line::A => "A",
            Line::B => "B",
        }
    }
}

/// What one line delivered.
#[derive(Debug, Default)]
struct LineState {
    address: String,
    window: SequenceWindow,
    /// Counts of the windows of earlier sessions.
    earlier: SequenceCounts,
    datagrams: u64,
    frames: u64,
}

/// Both lines, and what merging them took.
#[derive(Debug)]
pub struct Lines {
    lines: [LineState; 2],
    /// Copies of frames the other line had already delivered.
    arbitrated: u64,
    /// First copies that filled a hole in the merged stream (the merged window takes every
    /// line's frames as copies, which it does not count as reordered).
    reordered: u64,
    /// First copies too old for the merged window (not counted there, for the same reason).
    too_late: u64,
    /// The tracker's epoch the windows belong to.
    epoch: u64,
    /// The lowest frame either line delivered in this epoch: the first a line owed.
    low: Option<u64>,
}

impl Lines {
    /// Two lines receiving on these addresses.
    pub fn new(a: String, b: String) -> Lines {
        let line = |address| LineState { address, ..LineState::default() };
        Lines { lines: [line(a), line(b)], arbitrated: 0, reordered: 0, too_late: 0, epoch: 0, low: None }
    }

    /// Both lines owe every frame from `first` on (`--from-start`: from the session's first),
    /// so frames lost before the first one a line delivers count too.
    pub fn expect_from(&mut self, first: u64) {
        for line in &mut self.lines {
            line.window.expect_from(first);
        }
        if self.low.is_none() {
            self.low = Some(first);
        }
    }

    /// Follows the tracker's `epoch`: when sequence tracking starts over, so do the lines'.
    pub fn sync(&mut self, epoch: u64) {
        if epoch == self.epoch {
            return;
        }
        for line in &mut self.lines {
            line.earlier = line.earlier + line.window.counts();
            line.window = SequenceWindow::new();
        }
        self.epoch = epoch;
        self.low = None;
    }

    /// A datagram arrived on `line`.
    pub fn datagram(&mut self, line: Line) {
        self.lines[line.index()].datagrams += 1;
    }

    /// Frame `seq` arrived on `line`: what it is to the merged stream (take it when
    /// [`Observed::take`] says so), or `None` when the other line delivered it first (it is
    /// arbitrated: not taken).
    pub fn observe(&mut self, line: Line, seq: u64, tracker: &mut SessionTracker) -> Option<Observed> {
        self.low = Some(self.low.map_or(seq, |low| low.min(seq)));
        let own = &mut self.lines[line.index()];
        Some(match own.window.observe(seq) {
            // Seen before on this very line: a duplicate, counted as on a single line (or too
            // old for the window).
            Observed::Duplicate | Observed::TooLate => tracker.observe(seq),
            _ => {
                own.frames += 1;
                match tracker.observe_copy(seq) {
                    Observed::Duplicate => {
                        self.arbitrated += 1;
                        return None;
                    }
                    Observed::Reordered => {
                        self.reordered += 1;
                        Observed::Reordered
                    }
                    Observed::TooLate => {
                        self.too_late += 1;
                        Observed::TooLate
                    }
                    taken => taken,
                }
            }
        })
    }

    /// The publisher's END: both lines owed every frame below `next`. A line that delivered
    /// nothing owed every frame from the first the other delivered.
    pub fn end(&mut self, next: u64) {
        for line in &mut self.lines {
            if line.window.is_empty() {
                let Some(low) = self.low else { continue };
                line.window.expect_from(low);
            }
            line.window.end(next);
        }
    }

    /// Copies of frames the other line had already delivered.
    pub fn arbitrated(&self) -> u64 {
        self.arbitrated
    }

    /// Counts of the merged stream that its window does not keep: reordering and frames too
    /// old, of first copies.
    pub fn merged_extra(&self) -> SequenceCounts {
        SequenceCounts { reordered: self.reordered, too_late: self.too_late, ..SequenceCounts::default() }
    }

    /// The report's `lines`.
    pub fn report(&self) -> LinesReport {
        let line = |l: Line| {
            let line = &self.lines[l.index()];
            let counts = line.earlier + line.window.counts();
            LineReport {
                address: line.address.clone(),
                datagrams: line.datagrams,
                frames: line.frames,
                lost: counts.lost,
                duplicates: counts.duplicates,
            }
        };
        LinesReport { a: line(Line::A), b: line(Line::B) }
    }
}

/// Both lines in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinesReport {
    /// Line A (`listen` or `group`).
    pub a: LineReport,
    /// Line B (`listen_b` or `group_b`).
    pub b: LineReport,
}

/// One line in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LineReport {
    /// Where it was received.
    pub address: String,
    /// Datagrams received on it.
    pub datagrams: u64,
    /// Distinct frames it delivered.
    pub frames: u64,
    /// Frames it never delivered (whether or not the other line did).
    pub lost: u64,
    /// Frames it delivered more than once.
    pub duplicates: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_copy_is_taken_the_second_arbitrated_and_each_line_counts_its_own_loss() {
        let mut t = SessionTracker::new();
        let mut lines = Lines::new("a".into(), "b".into());
        let mut taken = Vec::new();
        // Line A loses 3 and 4, line B loses 4 and 5; B delivers 2 twice.
        let arrivals = [
            (Line::A, 1),
            (Line::B, 1),
            (Line::A, 2),
            (Line::B, 2),
            (Line::B, 2),
            (Line::B, 3),
            (Line::A, 5),
            (Line::A, 6),
            (Line::B, 6),
        ];
        for (line, seq) in arrivals {
            if lines.observe(line, seq, &mut t).is_some_and(Observed::take) {
                taken.push(seq);
            }
        }
        t.end(7);
        lines.end(7);
        assert_eq!(taken, vec![1, 2, 3, 5, 6]);
        assert_eq!(lines.arbitrated(), 3);
        let c = t.counts();
        assert_eq!((c.lost, c.duplicates, c.reordered), (1, 1, 0), "only 4 is lost; B's second 2 a duplicate");
        let r = lines.report();
        assert_eq!((r.a.frames, r.a.lost, r.a.duplicates), (4, 2, 0));
        assert_eq!((r.b.frames, r.b.lost, r.b.duplicates), (4, 2, 1));
    }

    #[test]
    fn a_first_copy_that_fills_a_hole_is_reordering() {
        let mut t = SessionTracker::new();
        let mut lines = Lines::new("a".into(), "b".into());
        for (line, seq) in [(Line::A, 1), (Line::A, 3), (Line::B, 2), (Line::A, 2), (Line::B, 3)] {
            lines.observe(line, seq, &mut t);
        }
        let c = t.counts() + lines.merged_extra();
        assert_eq!((c.lost, c.reordered, c.duplicates), (0, 1, 0));
        assert_eq!(lines.arbitrated(), 2);
        // A line that delivered nothing lost every frame.
        let mut dead = Lines::new("a".into(), "b".into());
        let mut t2 = SessionTracker::new();
        for seq in 3..=5 {
            dead.observe(Line::A, seq, &mut t2);
        }
        dead.end(7);
        assert_eq!((dead.report().a.lost, dead.report().b.lost), (1, 4));
        // From the start, frames 1 and 2 were owed as well.
        let mut from_start = Lines::new("a".into(), "b".into());
        let mut t3 = SessionTracker::new();
        from_start.expect_from(1);
        for seq in 3..=5 {
            from_start.observe(Line::A, seq, &mut t3);
        }
        from_start.end(7);
        assert_eq!((from_start.report().a.lost, from_start.report().b.lost), (3, 6));
        // A new session starts the lines' windows over, and keeps what they counted.
        lines.sync(1);
        lines.observe(Line::A, 1, &mut t);
        assert_eq!(lines.report().b.frames, 2);
    }
}
