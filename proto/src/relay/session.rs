//! Which publisher session a subscriber's stream is in, and the sequence accounting across
//! sessions: publisher restarts, and (over UDP) datagrams whose session or sequence number no
//! other datagram backs up.
//!
//! Over TCP the greeting names the session, and a new one is a restart. Over UDP anything can
//! arrive: a datagram whose session differs from the stream's, or whose sequence number lies far
//! outside the window, is either the first of a real change (a restarted publisher, a long
//! outage) or a forged or corrupt one. It is not believed on its own: the subscriber holds it
//! until the next datagram, which either confirms it (same session, a sequence number that
//! follows from it: the held one is taken first, then the new one) or refutes it (the held one
//! is counted as unconfirmed and dropped). One bad datagram therefore costs its own frames,
//! never the accounting of the whole session.

use super::window::{Observed, Position, SequenceCounts, SequenceWindow, WINDOW};

/// What to do with a datagram, decided from its header before its frames are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Take it now. A datagram held before, if any, was refuted: drop it.
    Take,
    /// This datagram confirms the one held: take the held one first, then this one.
    TakeHeldThenThis,
    /// Keep a copy of this datagram until the next one confirms or refutes it. A datagram held
    /// before, if any, was refuted: replace it.
    Hold,
    /// Do not take it (an END that no data backs up).
    Ignore,
}

/// What a greeting meant for the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Greeted {
    /// The first session of this run.
    First,
    /// The session of the frames before: a reconnection to the same publisher run.
    Same,
    /// Another session: the publisher restarted; sequence accounting starts over.
    Restarted {
        /// The session before.
        old: u64,
    },
}

/// A datagram held until the next one says whether to believe it.
#[derive(Clone, Copy, Debug)]
struct Held {
    session: u64,
    first: u64,
    /// The sequence number after its frames.
    next: u64,
}

impl Held {
    /// Whether a datagram of `session` starting at `first` follows from this one.
    fn confirmed_by(&self, session: u64, first: u64) -> bool {
        session == self.session
            && first.saturating_add(WINDOW) >= self.first
            && first <= self.next.saturating_add(WINDOW)
    }
}

/// The publisher session a stream is in, and its frame accounting.
#[derive(Clone, Debug, Default)]
pub struct SessionTracker {
    current: Option<u64>,
    window: SequenceWindow,
    /// Counts of windows closed by restarts and re-anchoring.
    earlier: SequenceCounts,
    /// The first frame owed in the run's first session, once that session has ended.
    first_session_first: Option<u64>,
    restarts: u64,
    held: Option<Held>,
    unconfirmed: u64,
    /// Bumped whenever the window starts over (a restart, a re-anchored numbering).
    epoch: u64,
}

impl SessionTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> SessionTracker {
        SessionTracker::default()
    }

    /// The session of the stream, once one is known.
    pub fn session(&self) -> Option<u64> {
        self.current
    }

    fn restart(&mut self, session: u64) {
        if self.restarts == 0 {
            self.first_session_first = self.window.first();
        }
        self.earlier = self.earlier + self.window.counts();
        self.window = SequenceWindow::new();
        self.epoch += 1;
        self.current = Some(session);
        self.restarts += 1;
    }

    /// A TCP greeting from `session`, whose first frame for this subscriber is `next_sequence`.
    pub fn greeted(&mut self, session: u64, next_sequence: u64) -> Greeted {
        let greeted = match self.current {
            None => {
                self.current = Some(session);
                Greeted::First
            }
            Some(old) if old == session => Greeted::Same,
            Some(old) => {
                self.restart(session);
                Greeted::Restarted { old }
            }
        };
        self.window.expect_from(next_sequence);
        greeted
    }

    /// The publisher names the first frame it offers (its first record on a connection).
    pub fn expect_from(&mut self, first: u64) {
        self.window.expect_from(first);
    }

    fn refute_held(&mut self) {
        if self.held.take().is_some() {
            self.unconfirmed += 1;
        }
    }

    /// Decides on a UDP data datagram of `session` carrying `frames` frames from `first`.
    pub fn datagram(&mut self, session: u64, first: u64, frames: u64) -> Admission {
        let Some(current) = self.current else {
            self.current = Some(session);
            return Admission::Take;
        };
        if session == current && self.window.position(first) == Position::Plausible {
            self.refute_held();
            return Admission::Take;
        }
        match self.held {
            Some(held) if held.confirmed_by(session, first) => {
                self.held = None;
                self.confirm(held);
                Admission::TakeHeldThenThis
            }
            _ => {
                self.refute_held();
                self.held = Some(Held { session, first, next: first.saturating_add(frames) });
                Admission::Hold
            }
        }
    }

    /// Makes the held datagram's session and numbering the stream's.
    fn confirm(&mut self, held: Held) {
        if Some(held.session) != self.current {
            self.restart(held.session);
        } else if self.window.highest().is_some_and(|high| held.first < high) {
            // The numbers seen so far were the odd ones out (a corrupt or forged first
            // datagram): start the window again from the confirmed numbering.
            self.earlier = self.earlier + self.window.counts();
            self.window = SequenceWindow::new();
            self.epoch += 1;
        }
        // A confirmed jump ahead stays in the window: the frames in between are lost.
    }

    /// Decides on a UDP END of `session` saying the next frame would have been `next`: taken
    /// only when it belongs to the stream's session (or confirms the held datagram's) and its
    /// number fits what was seen, so a forged END can neither end the stream early nor invent
    /// loss.
    pub fn end_datagram(&mut self, session: u64, next: u64) -> Admission {
        let last = next.saturating_sub(1);
        if self.current == Some(session) && self.window.position(last) == Position::Plausible {
            self.refute_held();
            self.window.end(next);
            return Admission::Take;
        }
        match self.held {
            Some(held) if held.confirmed_by(session, last) => {
                self.held = None;
                self.confirm(held);
                self.window.end(next);
                Admission::TakeHeldThenThis
            }
            _ => Admission::Ignore,
        }
    }

    /// A TCP END: the next frame would have been `next`.
    pub fn end(&mut self, next: u64) {
        self.window.end(next);
    }

    /// A UDP END of the stream's session believed on other evidence than its number (one far
    /// ahead, see [`SessionTracker::far_ahead`], that nothing of its session followed): the next
    /// frame would have been `next`, and a datagram still held is refuted.
    pub fn end_confirmed(&mut self, next: u64) {
        self.refute_held();
        self.window.end(next);
    }

    /// Whether frame `seq` of `session` lies more than a window ahead of the highest frame of
    /// the stream's session seen: further than reordering or a burst of loss explains. The
    /// receiver fell that far behind, or the datagram is corrupt or forged; either way its
    /// number alone is not believed (a receiver that can read what it missed from a store
    /// reads it in order instead).
    pub fn far_ahead(&self, session: u64, seq: u64) -> bool {
        self.current == Some(session) && self.window.highest().is_some_and(|high| seq > high.saturating_add(WINDOW))
    }

    /// A datagram held elsewhere (an END far ahead, waiting for the stream to confirm it) was
    /// refuted: counted with the unconfirmed ones.
    pub fn refuted(&mut self) {
        self.unconfirmed += 1;
    }

    /// Records the arrival of frame `seq` of the current session.
    pub fn observe(&mut self, seq: u64) -> Observed {
        self.window.observe(seq)
    }

    /// Records a frame that may be a redundant copy (see [`SequenceWindow::observe_copy`]).
    pub fn observe_copy(&mut self, seq: u64) -> Observed {
        self.window.observe_copy(seq)
    }

    /// The highest frame seen in the current session.
    pub fn highest(&self) -> Option<u64> {
        self.window.highest()
    }

    /// Changes whenever sequence tracking starts over (a publisher restart, a corrected
    /// numbering): state kept per frame number elsewhere must start over with it.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The stream is over: a datagram still held was never confirmed.
    pub fn finish(&mut self) {
        self.refute_held();
    }

    /// Counts over every session.
    pub fn counts(&self) -> SequenceCounts {
        self.earlier + self.window.counts()
    }

    /// Publisher restarts seen.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// Datagrams held and never confirmed (dropped).
    pub fn unconfirmed(&self) -> u64 {
        self.unconfirmed
    }

    /// Whether a datagram is held.
    pub fn holding(&self) -> bool {
        self.held.is_some()
    }

    /// The first frame owed in the run's first session when it was above 1: the subscriber
    /// joined a stream already under way, and cannot have all of it.
    pub fn late_join(&self) -> Option<u64> {
        let first = if self.restarts == 0 { self.window.first() } else { self.first_session_first };
        first.filter(|&f| f > 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds datagrams of one frame each as a subscriber would, taking held ones on confirmation.
    fn feed(t: &mut SessionTracker, datagrams: &[(u64, u64)]) -> Vec<u64> {
        let mut taken = Vec::new();
        let mut held: Option<(u64, u64)> = None;
        for &(session, seq) in datagrams {
            match t.datagram(session, seq, 1) {
                Admission::Take => {
                    held = None;
                    if t.observe(seq).take() {
                        taken.push(seq);
                    }
                }
                Admission::TakeHeldThenThis => {
                    let (_, h) = held.take().unwrap();
                    for s in [h, seq] {
                        if t.observe(s).take() {
                            taken.push(s);
                        }
                    }
                }
                Admission::Hold => held = Some((session, seq)),
                Admission::Ignore => {}
            }
        }
        taken
    }

    #[test]
    fn one_wild_sequence_number_costs_its_own_frame_only() {
        let mut t = SessionTracker::new();
        let taken = feed(&mut t, &[(1, 1), (1, 2), (1, 3 + 1_000_000_000_000), (1, 4), (1, 5)]);
        assert_eq!(taken, vec![1, 2, 4, 5]);
        assert_eq!(t.counts().lost, 1, "frame 3 never arrived under its number");
        assert_eq!(t.unconfirmed(), 1);
        assert_eq!(t.restarts(), 0);
    }

    #[test]
    fn one_flipped_session_bit_is_not_a_restart() {
        let mut t = SessionTracker::new();
        let taken = feed(&mut t, &[(7, 1), (7, 2), (7 ^ 1 << 40, 3), (7, 4)]);
        assert_eq!(taken, vec![1, 2, 4]);
        assert_eq!((t.restarts(), t.unconfirmed(), t.counts().lost), (0, 1, 1));
    }

    #[test]
    fn a_real_restart_and_a_real_jump_are_confirmed_and_lose_nothing_received() {
        let mut t = SessionTracker::new();
        let taken = feed(&mut t, &[(7, 1), (7, 2), (9, 1), (9, 2), (9, 3)]);
        assert_eq!(taken, vec![1, 2, 1, 2, 3]);
        assert_eq!((t.restarts(), t.unconfirmed(), t.counts().lost), (1, 0, 0));
        let mut t = SessionTracker::new();
        let taken = feed(&mut t, &[(7, 1), (7, 2), (7, 100_000), (7, 100_001)]);
        assert_eq!(taken, vec![1, 2, 100_000, 100_001]);
        assert_eq!(t.counts().lost, 100_000 - 3, "a confirmed outage is loss");
    }

    #[test]
    fn a_wild_first_datagram_is_outvoted_by_the_stream() {
        let mut t = SessionTracker::new();
        let taken = feed(&mut t, &[(7, 1 << 50), (7, 1), (7, 2), (7, 3)]);
        assert_eq!(taken, vec![1 << 50, 1, 2, 3]);
        assert_eq!(t.counts().lost, 0);
        assert_eq!(t.late_join(), None);
    }

    #[test]
    fn an_end_is_taken_only_from_the_streams_session_and_within_reach() {
        let mut t = SessionTracker::new();
        feed(&mut t, &[(7, 1), (7, 2)]);
        assert_eq!(t.end_datagram(8, 3), Admission::Ignore, "another session's END");
        assert_eq!(t.end_datagram(7, 1 << 40), Admission::Ignore, "an END far beyond the stream");
        assert_eq!(t.end_datagram(7, 6), Admission::Take);
        assert_eq!(t.counts().lost, 3, "frames 3 to 5 were sent and never arrived");
        let mut fresh = SessionTracker::new();
        assert_eq!(fresh.end_datagram(7, 3), Admission::Ignore, "an END before any data");
    }

    #[test]
    fn far_ahead_is_more_than_a_window_past_the_highest_of_the_streams_session() {
        let mut t = SessionTracker::new();
        assert!(!t.far_ahead(7, 1 << 40), "nothing seen: nothing is far");
        feed(&mut t, &[(7, 1), (7, 2)]);
        assert!(!t.far_ahead(7, 2 + WINDOW));
        assert!(t.far_ahead(7, 3 + WINDOW));
        assert!(!t.far_ahead(8, 3 + WINDOW), "another session is not the stream's to be ahead of");
        assert!(!t.far_ahead(7, 1), "behind is not ahead");
        // An END taken on other evidence than its number counts the frames before it lost.
        t.end_confirmed(3 + WINDOW);
        assert_eq!(t.counts().lost, WINDOW);
        t.refuted();
        assert_eq!(t.unconfirmed(), 1);
    }

    #[test]
    fn greetings_name_sessions_and_the_first_frame_offered() {
        let mut t = SessionTracker::new();
        assert_eq!(t.greeted(5, 10), Greeted::First);
        t.observe(12);
        assert_eq!(t.late_join(), Some(10));
        assert_eq!(t.counts().lost, 2);
        assert_eq!(t.greeted(5, 20), Greeted::Same);
        t.observe(20);
        assert_eq!(t.counts().lost, 2 + 7, "frames missed while away are lost");
        assert_eq!(t.greeted(6, 1), Greeted::Restarted { old: 5 });
        t.observe(1);
        assert_eq!(t.late_join(), Some(10), "late join is about the first session");
        assert_eq!(t.restarts(), 1);
    }
}
