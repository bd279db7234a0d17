//! Frames back in sequence order, for a relay whose upstream can deliver them out of order: a
//! frame that fills a gap (repaired from a store after later frames arrived) must still go out
//! before them, since a relay's TCP subscribers take numbers that only go up.
//!
//! [`InOrder`] decides, frame by frame, on sequence numbers and a clock: a frame that follows
//! the last one handed on goes now; a frame beyond a gap waits, at most `wait` after it
//! arrived (or while at most `max_held` wait), for the gap to fill; past that, the frames
//! waiting go on without the missing ones, which stay a gap downstream. A frame at or below the
//! last one handed on comes too late for its place and is dropped (counted). It holds what the
//! caller gives it for a waiting frame (`T`) and no bytes of its own.

use std::collections::{BTreeMap, BTreeSet};

/// What [`InOrder::offer`] decided for a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// It is next: hand it on now.
    Now,
    /// It is beyond a gap: give it to [`InOrder::hold`], and take it back from
    /// [`InOrder::pop`] when its turn comes.
    Hold,
    /// It is at or below the last frame handed on (or held already): drop it.
    Late,
}

/// What the gate counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InOrderCounts {
    /// Frames that waited for a gap before them to fill.
    pub held: u64,
    /// Frames given up: missing when the frames after them could wait no longer.
    pub skipped: u64,
    /// Frames that came after their place had passed (a repair too late), or twice: dropped.
    pub late: u64,
}

/// One waiting frame: what the caller keeps for it, and when it arrived (ns).
#[derive(Debug)]
struct Held<T> {
    item: T,
    arrived: i64,
}

/// The gate: see the module's documentation.
#[derive(Debug)]
pub struct InOrder<T> {
    /// The frame owed next; `None` before the first frame (which sets it).
    next: Option<u64>,
    held: BTreeMap<u64, Held<T>>,
    /// When each held frame arrived, and its number: the first is the oldest, which says how
    /// long the gap at the head has been known (every frame held is beyond it).
    arrivals: BTreeSet<(i64, u64)>,
    /// ns a frame beyond a gap may wait (0: none waits; a gap is passed at once).
    wait: i64,
    max_held: usize,
    /// Waiting is over until nothing is held ([`InOrder::release`]).
    releasing: bool,
    counts: InOrderCounts,
}

impl<T> InOrder<T> {
    /// A gate where a frame beyond a gap waits at most `wait` ns, and at most `max_held` frames
    /// wait at once (at least 1).
    pub fn new(wait: i64, max_held: usize) -> InOrder<T> {
        InOrder {
            next: None,
            held: BTreeMap::new(),
            arrivals: BTreeSet::new(),
            wait: wait.max(0),
            max_held: max_held.max(1),
            releasing: false,
            counts: InOrderCounts::default(),
        }
    }

    /// What to do with frame `sequence`; [`Offered::Now`] counts it as handed on.
    pub fn offer(&mut self, sequence: u64) -> Offered {
        let next = *self.next.get_or_insert(sequence);
        if sequence < next || self.held.contains_key(&sequence) {
            self.counts.late += 1;
            return Offered::Late;
        }
        if sequence == next {
            self.next = Some(sequence.saturating_add(1));
            return Offered::Now;
        }
        if self.wait == 0 && self.held.is_empty() {
            // Nothing waits for a gap: it is passed at once.
            self.counts.skipped += sequence - next;
            self.next = Some(sequence.saturating_add(1));
            return Offered::Now;
        }
        Offered::Hold
    }

    /// Keeps `item` for frame `sequence`, which [`InOrder::offer`] said must wait, arrived at
    /// `now` (ns).
    pub fn hold(&mut self, sequence: u64, item: T, now: i64) {
        self.counts.held += 1;
        if let Some(replaced) = self.held.insert(sequence, Held { item, arrived: now }) {
            self.arrivals.remove(&(replaced.arrived, sequence));
        }
        self.arrivals.insert((now, sequence));
    }

    /// The next waiting frame whose turn has come at `now`: the one owed next, or the first
    /// beyond a gap that can wait no longer (the gap is then given up): a gap is waited for at
    /// most `wait` after the first frame beyond it arrived.
    pub fn pop(&mut self, now: i64) -> Option<(u64, T)> {
        let (&sequence, _) = self.held.first_key_value()?;
        let next = self.next.unwrap_or(sequence);
        let overdue = self.deadline().is_some_and(|deadline| now >= deadline);
        if sequence != next && !overdue && !self.releasing && self.held.len() <= self.max_held {
            return None;
        }
        let (_, held) = self.held.pop_first()?;
        self.arrivals.remove(&(held.arrived, sequence));
        self.counts.skipped += sequence.saturating_sub(next);
        self.next = Some(sequence.saturating_add(1));
        if self.held.is_empty() {
            self.releasing = false;
        }
        Some((sequence, held.item))
    }

    /// Waiting is over (the stream ended, or the gaps will not be filled): [`InOrder::pop`]
    /// hands on every frame held, in order, without the missing ones.
    pub fn release(&mut self) {
        self.releasing = !self.held.is_empty();
    }

    /// When the gap at the head can be waited for no longer (ns), if a frame is held.
    pub fn deadline(&self) -> Option<i64> {
        self.arrivals.first().map(|(arrived, _)| arrived.saturating_add(self.wait))
    }

    /// Frames waiting now.
    pub fn waiting(&self) -> usize {
        self.held.len()
    }

    /// The frame owed next, once the first frame came.
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// What was counted.
    pub fn counts(&self) -> InOrderCounts {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    /// Offers `sequence` at `now`, holding it when told to; what the gate hands on at `now`
    /// (the frame itself first when it is next, then what it released).
    fn feed(gate: &mut InOrder<u64>, sequence: u64, now: i64) -> Vec<u64> {
        let mut out = Vec::new();
        match gate.offer(sequence) {
            Offered::Now => out.push(sequence),
            Offered::Hold => gate.hold(sequence, sequence, now),
            Offered::Late => {}
        }
        while let Some((s, item)) = gate.pop(now) {
            assert_eq!(s, item);
            out.push(s);
        }
        out
    }

    #[test]
    fn frames_in_order_pass_at_once_and_the_first_sets_the_start() {
        let mut gate = InOrder::new(100 * MS, 1000);
        assert_eq!(feed(&mut gate, 40, 0), [40]);
        assert_eq!(feed(&mut gate, 41, 0), [41]);
        assert_eq!(gate.next(), Some(42));
        assert_eq!(gate.counts(), InOrderCounts::default());
    }

    #[test]
    fn a_gap_filled_in_time_comes_out_in_order() {
        let mut gate = InOrder::new(100 * MS, 1000);
        assert_eq!(feed(&mut gate, 1, 0), [1]);
        assert_eq!(feed(&mut gate, 4, MS), Vec::<u64>::new());
        assert_eq!(feed(&mut gate, 5, MS), Vec::<u64>::new());
        assert_eq!(gate.deadline(), Some(101 * MS));
        assert_eq!(feed(&mut gate, 3, 2 * MS), Vec::<u64>::new(), "2 is still missing");
        assert_eq!(feed(&mut gate, 2, 3 * MS), [2, 3, 4, 5]);
        assert_eq!(gate.counts(), InOrderCounts { held: 3, skipped: 0, late: 0 });
        assert_eq!(gate.deadline(), None);
    }

    #[test]
    fn a_gap_not_filled_in_time_is_given_up_and_a_late_repair_is_dropped() {
        let mut gate = InOrder::new(100 * MS, 1000);
        feed(&mut gate, 1, 0);
        feed(&mut gate, 3, 10 * MS);
        feed(&mut gate, 6, 50 * MS);
        assert_eq!(gate.pop(109 * MS), None, "3 waits until 110 ms");
        assert_eq!(gate.pop(110 * MS), Some((3, 3)));
        assert_eq!(gate.pop(110 * MS), None, "6 arrived at 50 ms: 4 and 5 are waited for until 150 ms");
        assert_eq!(feed(&mut gate, 2, 120 * MS), Vec::<u64>::new(), "2's place has passed");
        assert_eq!(feed(&mut gate, 5, 130 * MS), Vec::<u64>::new());
        assert_eq!(gate.deadline(), Some(150 * MS), "the gap at 4 is known since 6 came, not since 5 did");
        assert_eq!(gate.pop(149 * MS), None);
        assert_eq!(gate.pop(150 * MS), Some((5, 5)));
        assert_eq!(gate.pop(150 * MS), Some((6, 6)), "no gap before 6 any more");
        assert_eq!(gate.counts(), InOrderCounts { held: 3, skipped: 2, late: 1 });
    }

    #[test]
    fn release_hands_on_everything_held_at_once() {
        let mut gate = InOrder::new(60_000 * MS, 1000);
        feed(&mut gate, 10, 0);
        feed(&mut gate, 12, 0);
        feed(&mut gate, 15, 0);
        assert_eq!(gate.pop(1), None);
        gate.release();
        assert_eq!(gate.pop(1), Some((12, 12)));
        assert_eq!(gate.pop(1), Some((15, 15)));
        assert_eq!(gate.pop(1), None);
        // Released once: the next gap waits again.
        assert_eq!(feed(&mut gate, 17, 2), Vec::<u64>::new());
        assert_eq!(gate.counts().skipped, 1 + 2);
    }

    #[test]
    fn more_than_max_held_waiting_lets_the_first_go() {
        let mut gate = InOrder::new(60_000 * MS, 2);
        feed(&mut gate, 1, 0);
        assert!(feed(&mut gate, 3, 0).is_empty());
        assert!(feed(&mut gate, 4, 0).is_empty());
        assert_eq!(feed(&mut gate, 5, 0), [3, 4, 5], "three waiting is one too many: 2 is given up");
        assert_eq!(gate.counts().skipped, 1);
    }

    #[test]
    fn without_a_wait_a_gap_is_passed_at_once_and_duplicates_are_late() {
        let mut gate = InOrder::new(0, 1000);
        assert_eq!(feed(&mut gate, 1, 0), [1]);
        assert_eq!(feed(&mut gate, 5, 0), [5]);
        assert_eq!(feed(&mut gate, 5, 0), Vec::<u64>::new());
        assert_eq!(feed(&mut gate, 3, 0), Vec::<u64>::new());
        assert_eq!(gate.counts(), InOrderCounts { held: 0, skipped: 3, late: 2 });
    }
}
