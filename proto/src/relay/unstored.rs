//! How far a publisher into a store (JetStream) has run ahead of what the store holds
//! ([`Unstored`]), without I/O.
//!
//! A subscriber that misses a datagram live repairs it from the store, but only while the
//! frame is inside its window ([`WINDOW`] frames behind the newest it has seen). A datagram
//! whose acknowledgement failed (the stream's leader died with it) is stored only once
//! published again, which can take a leader election, seconds. If the live stream runs on
//! meanwhile, a subscriber's window passes the frame before any store has it, and the frame is
//! lost for good. So the publisher takes a new datagram only while the frames it has published
//! since the oldest one not yet stored stay within [`MAX_UNSTORED_FRAMES`]: a stall of the
//! store holds the live stream back (the hot path then follows `nats.slow_server`) instead of
//! outrunning every subscriber's repair.
//!
//! Positions count frames in the order datagrams were first published, across sessions, so a
//! format switch (a new session, sequence numbers from 0) changes nothing.

use crate::relay::window::WINDOW;
use std::collections::BTreeMap;

/// Frames that may be published past the oldest datagram not yet stored: half a subscriber's
/// window, leaving the other half for the repair to be asked and read once it is stored.
pub const MAX_UNSTORED_FRAMES: u64 = WINDOW / 2;

/// Datagrams published and not yet stored, by where their frames start.
#[derive(Debug, Default)]
pub struct Unstored {
    /// Frames published so far (first publications).
    published: u64,
    /// Datagrams not yet stored, by the position of their first frame (an `END` carries none,
    /// so it shares its position with the next datagram: counted).
    pending: BTreeMap<u64, u32>,
}

impl Unstored {
    /// Nothing published.
    pub fn new() -> Unstored {
        Unstored::default()
    }

    /// Whether another datagram may be published now.
    pub fn may_publish(&self) -> bool {
        self.ahead() < MAX_UNSTORED_FRAMES
    }

    /// Frames published since the first frame of the oldest datagram not stored (0: all
    /// stored).
    pub fn ahead(&self) -> u64 {
        self.pending.first_key_value().map_or(0, |(&oldest, _)| self.published - oldest)
    }

    /// Notes a datagram of `frames` frames published for the first time; returns its position,
    /// to hand to [`Unstored::stored`] once the store acknowledges it (however many times it is
    /// published again meanwhile).
    pub fn published(&mut self, frames: u64) -> u64 {
        let at = self.published;
        *self.pending.entry(at).or_insert(0) += 1;
        self.published = self.published.saturating_add(frames);
        at
    }

    /// Notes the datagram published at `at` as stored.
    pub fn stored(&mut self, at: u64) {
        if let Some(count) = self.pending.get_mut(&at) {
            *count -= 1;
            if *count == 0 {
                self.pending.remove(&at);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unstored_datagram_holds_publishing_back_once_half_a_window_has_passed_it() {
        let mut u = Unstored::new();
        let stuck = u.published(100);
        // Everything after it is stored at once: only the stuck one counts, from its start.
        let mut published = 100;
        while u.may_publish() {
            let at = u.published(100);
            u.stored(at);
            published += 100;
        }
        // The last one taken started within the bound.
        assert!(published >= MAX_UNSTORED_FRAMES && published - 100 < MAX_UNSTORED_FRAMES, "{published}");
        assert_eq!(u.ahead(), published);
        u.stored(stuck);
        assert_eq!(u.ahead(), 0);
        assert!(u.may_publish());
    }

    #[test]
    fn the_oldest_unstored_datagram_sets_the_distance_and_an_end_shares_a_position() {
        let mut u = Unstored::new();
        let a = u.published(10);
        let b = u.published(20);
        let end = u.published(0);
        let c = u.published(5);
        assert_eq!((a, b, end, c), (0, 10, 30, 30));
        assert_eq!(u.ahead(), 35);
        u.stored(a);
        assert_eq!(u.ahead(), 25);
        u.stored(c);
        assert_eq!(u.ahead(), 25, "b is still out");
        u.stored(b);
        assert_eq!(u.ahead(), 5, "the END still waits at 30");
        u.stored(end);
        assert_eq!(u.ahead(), 0);
        // A position stored twice (or never published) changes nothing.
        u.stored(end);
        assert_eq!(u.ahead(), 0);
    }
}
