//! The book of a UDP subscriber's missing frames and what became of them, across publisher
//! sessions ([`RecoveryBook`], ported from the subscriber): it opens a gap for every frame found
//! missing, asks for gaps when they are due, and takes retransmissions, late originals, GONE and
//! BUSY answers.
//!
//! Accounting is exact: a frame found missing is opened exactly once (ahead of the highest
//! frame, at the tail an END names, or below the lowest), and ends up recovered, filled late by
//! its original, or unrecoverable. A frame given up and then taken after all (its original came
//! late) moves from unrecoverable to filled late. So once everything still missing is given up,
//! the frames the stream counts as lost are exactly the unrecoverable ones.

use crate::latency::{LatencySummary, latency_histogram};
use crate::relay::recovery::{GapList, RecoveryCounts, RecoveryPolicy};
use crate::relay::window::WINDOW;
use crate::relay::wire::RetransmitRequest;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::Duration;

/// Frames asked for in one request at most: the most a publisher serves per request
/// (`retransmit.max_range` is at most 65,535); it serves fewer when its own limit is lower, and
/// the rest is asked again at the retry.
pub const MAX_REQUEST_FRAMES: u32 = 65_535;
/// Requests sent per timer tick at most, so a burst of gaps cannot hold up the receive loop.
pub const MAX_REQUESTS_PER_TICK: usize = 256;
/// When to ask, from the settings.
pub fn policy(delay: Duration, retry: Duration, attempts: u32) -> RecoveryPolicy {
    RecoveryPolicy {
        delay_ns: i64::try_from(delay.as_nanos()).unwrap_or(i64::MAX),
        retry_ns: i64::try_from(retry.as_nanos()).unwrap_or(i64::MAX),
        attempts,
        max_frames: MAX_REQUEST_FRAMES,
    }
}

/// The missing frames of the stream and what became of them, across sessions.
#[derive(Debug)]
pub struct RecoveryBook {
    gaps: GapList,
    policy: RecoveryPolicy,
    /// Counts of the gap lists of earlier sessions (or numberings).
    earlier: RecoveryCounts,
    /// The tracker's epoch the gap list belongs to.
    epoch: u64,
    /// Lowest frame taken in this epoch.
    low: Option<u64>,
    /// Every frame below this (and from `low` on) was taken or found missing.
    opened_to: u64,
    /// Frames given up and then taken after all: counted unrecoverable by the gap list, they
    /// are reported as filled late.
    arrived_after_give_up: u64,
    /// Frames given up, by cause (those out of attempts are the rest).
    given_up: GivenUp,
    /// Retransmitted frames not missing (any more): already there, given up, or of a request
    /// answered twice.
    redundant: u64,
    busy_answers: u64,
    busy_at_connect: u64,
    gone_frames: u64,
    requests_deferred: u64,
    connections: u64,
    latency: Histogram<u64>,
    /// The service cannot serve this subscriber: nothing more is asked.
    refused: bool,
}

impl RecoveryBook {
    /// A book that asks by `policy`.
    pub fn new(policy: RecoveryPolicy) -> RecoveryBook {
        RecoveryBook {
            gaps: GapList::new(),
            policy,
            earlier: RecoveryCounts::default(),
            epoch: 0,
            low: None,
            opened_to: 0,
            arrived_after_give_up: 0,
            given_up: GivenUp::default(),
            redundant: 0,
            busy_answers: 0,
            busy_at_connect: 0,
            gone_frames: 0,
            requests_deferred: 0,
            connections: 0,
            latency: latency_histogram(),
            refused: false,
        }
    }

    /// Every frame from `first` on is owed (`--from-start`: from the session's first), so the
    /// frames before the first one taken are missing too. Only before anything is taken.
    pub fn expect_from(&mut self, first: u64) {
        if self.low.is_none() {
            self.low = Some(first);
            self.opened_to = first;
        }
    }

    /// Follows the tracker's `epoch`: when sequence tracking started over (a publisher restart,
    /// a corrected numbering), the old numbers mean nothing any more and their gaps are given up.
    pub fn sync(&mut self, epoch: u64) {
        if epoch == self.epoch {
            return;
        }
        self.given_up.other_session += self.gaps.give_up_all();
        self.earlier = self.earlier + self.gaps.counts();
        self.gaps = GapList::new();
        self.epoch = epoch;
        self.low = None;
        self.opened_to = 0;
    }

    /// A frame of the stream was taken (not a retransmission): opens the frames it shows
    /// missing, or closes the gap it fills. `highest` is the stream's highest frame now.
    pub fn original(&mut self, seq: u64, highest: Option<u64>, now: i64) {
        match self.low {
            None => {
                self.low = Some(seq);
                self.opened_to = seq.saturating_add(1);
            }
            Some(low) if seq < low => {
                // Below every frame so far: the frames in between were missing all along.
                self.gaps.open(seq + 1, low, now);
                self.low = Some(seq);
            }
            Some(_) if seq < self.opened_to => {
                if self.gaps.fill(seq, false, now).is_none() {
                    // Not open: it was given up (gone, out of attempts, too many gaps) and
                    // came after all.
                    self.arrived_after_give_up += 1;
                }
            }
            Some(_) => {
                self.gaps.open(self.opened_to, seq, now);
                self.opened_to = seq.saturating_add(1);
            }
        }
        self.slide(highest);
        self.refused_gives_up();
    }

    /// Once the service refused, a gap is given up as soon as it is found.
    fn refused_gives_up(&mut self) {
        if self.refused && !self.gaps.is_empty() {
            self.given_up.refused += self.gaps.give_up_all();
        }
    }

    /// A retransmitted frame arrived: true when it was missing (take it), false when it is not
    /// (do not).
    pub fn recovered(&mut self, seq: u64, now: i64) -> bool {
        match self.gaps.fill(seq, true, now) {
            Some(ns) => {
                self.latency.saturating_record(u64::try_from(ns).unwrap_or(0));
                true
            }
            None => {
                self.redundant += 1;
                false
            }
        }
    }

    /// Gives up the frames the stream's window no longer reaches (they could not be taken).
    pub fn slide(&mut self, highest: Option<u64>) {
        if let Some(high) = highest
            && high >= WINDOW
        {
            // Frames at or below `high - WINDOW` are too late for the window.
            self.given_up.too_old += self.gaps.give_up_below(high - (WINDOW - 1));
        }
    }

    /// The publisher's END: frames up to `next` were sent, so those not seen are missing.
    pub fn end(&mut self, next: u64, now: i64) {
        if self.low.is_some() && next > self.opened_to {
            self.gaps.open(self.opened_to, next, now);
            self.opened_to = next;
        }
        self.refused_gives_up();
    }

    /// The requests due now (none once the service refused).
    pub fn due(&mut self, now: i64, max: usize) -> Vec<RetransmitRequest> {
        if self.refused {
            self.refused_gives_up();
            return Vec::new();
        }
        self.gaps.due(now, &self.policy, max)
    }

    /// Retransmitted frames of another session than the stream's arrived: not taken.
    pub fn not_taken(&mut self, frames: u64) {
        self.redundant += frames;
    }

    /// A request could not be queued: it is asked again at its retry.
    pub fn deferred(&mut self) {
        self.requests_deferred += 1;
    }

    /// The service no longer holds `count` frames from `first`.
    pub fn gone(&mut self, first: u64, count: u64) {
        self.gone_frames = self.gone_frames.saturating_add(count);
        self.given_up.gone += self.gaps.give_up(first, first.saturating_add(count));
    }

    /// The service serves another session than the stream's: it cannot have these `count`
    /// frames from `first`.
    pub fn other_session(&mut self, first: u64, count: u64) {
        self.given_up.other_session += self.gaps.give_up(first, first.saturating_add(count));
    }

    /// The service was over its rate limit for the request from `first`, or made this
    /// connection leave for another client (`first` 0), at `now`: nothing is asked for a retry
    /// interval, and the frames are asked again after it without using up an attempt.
    pub fn busy(&mut self, first: u64, now: i64) {
        self.busy_answers += 1;
        self.gaps.busy(first, now, &self.policy);
    }

    /// The service answered a connection with BUSY (it was full); the frames are asked again at
    /// their retry, over a connection made with backoff.
    pub fn busy_at_connect(&mut self) {
        self.busy_answers += 1;
        self.busy_at_connect += 1;
    }

    /// A connection to the service was set up.
    pub fn connected(&mut self) {
        self.connections += 1;
    }

    /// The service will not serve this subscriber: everything missing is given up, and so is
    /// every gap found from now on.
    pub fn refuse(&mut self) {
        self.refused = true;
        self.refused_gives_up();
    }

    /// True once the service refused.
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    /// Whether frame `seq` is missing now (not given up on).
    pub fn is_missing(&self, seq: u64) -> bool {
        self.gaps.is_missing(seq)
    }

    /// The lowest frame missing now, if any.
    pub fn first_missing(&self) -> Option<u64> {
        self.gaps.first_missing()
    }

    /// Frames missing now and not given up on.
    pub fn missing(&self) -> u64 {
        self.gaps.open_frames()
    }

    /// True when nothing is missing.
    pub fn is_empty(&self) -> bool {
        self.gaps.is_empty()
    }

    /// Gives up everything still missing (the end of the run); returns how many frames.
    pub fn give_up_all(&mut self) -> u64 {
        let frames = self.gaps.give_up_all();
        self.given_up.at_end += frames;
        frames
    }

    /// The counts over every session, with frames given up and taken after all counted as
    /// filled late.
    pub fn counts(&self) -> RecoveryCounts {
        let mut c = self.earlier + self.gaps.counts();
        c.frames_unrecoverable -= self.arrived_after_give_up.min(c.frames_unrecoverable);
        c.frames_filled_late += self.arrived_after_give_up;
        c
    }

    /// The report's `recovery` object.
    pub fn report(&self, server: &str) -> RecoveryReport {
        let c = self.counts();
        let all = (self.earlier + self.gaps.counts()).frames_unrecoverable;
        let g = self.given_up;
        let named = g.gone + g.too_old + g.other_session + g.refused + g.at_end;
        let causes = UnrecoverableCauses {
            gone: g.gone,
            too_old: g.too_old,
            out_of_attempts: all.saturating_sub(named),
            other_session: g.other_session,
            refused: g.refused,
            at_end: g.at_end,
        };
        RecoveryReport {
            enabled: true,
            server: Some(server.to_string()),
            gaps_detected: c.gaps_detected,
            frames_missing: c.frames_missing,
            frames_recovered: c.frames_recovered,
            frames_filled_late: c.frames_filled_late,
            frames_unrecoverable: c.frames_unrecoverable,
            unrecoverable_causes: causes,
            frames_still_missing: self.missing(),
            requests: c.requests,
            requests_deferred: self.requests_deferred,
            busy_answers: self.busy_answers,
            busy_at_connect: self.busy_at_connect,
            gone_frames: self.gone_frames,
            frames_redundant: self.redundant,
            connections: self.connections,
            refused: self.refused,
            latency_ns: LatencySummary::of(&self.latency),
        }
    }
}

/// Loss recovery in the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RecoveryReport {
    /// Whether recovery was configured.
    pub enabled: bool,
    /// The retransmission service.
    pub server: Option<String>,
    /// Gaps found (runs of consecutive missing frames).
    pub gaps_detected: u64,
    /// Frames in those gaps.
    pub frames_missing: u64,
    /// Frames filled by a retransmission.
    pub frames_recovered: u64,
    /// Frames filled by their original arriving late.
    pub frames_filled_late: u64,
    /// Frames given up: gone from the publisher's ring, out of attempts, too old for the
    /// window, or still missing at the end. Equals the stream's `gaps` at the end of a run.
    pub frames_unrecoverable: u64,
    /// Why frames were given up (one given up and then taken after all, its original late,
    /// is counted here all the same).
    pub unrecoverable_causes: UnrecoverableCauses,
    /// Frames missing when the report was made and not given up (0 in a final report).
    pub frames_still_missing: u64,
    /// Requests sent.
    pub requests: u64,
    /// Requests that did not fit the queue to the service (asked again at their retry).
    pub requests_deferred: u64,
    /// BUSY answers from the service: requests over its rate limit, connections it was too full
    /// to take (`busy_at_connect`), and connections it made leave for another client.
    pub busy_answers: u64,
    /// Connections the service answered BUSY at once, being full (retried with backoff).
    pub busy_at_connect: u64,
    /// Frames the service answered GONE for.
    pub gone_frames: u64,
    /// Retransmitted frames that were not missing (any more): not taken.
    pub frames_redundant: u64,
    /// Connections to the service set up.
    pub connections: u64,
    /// The service refused this subscriber (or cannot serve it): recovery stopped.
    pub refused: bool,
    /// Time from a gap being seen to its frame's retransmission arriving.
    pub latency_ns: LatencySummary,
}

/// Frames given up, by cause, as the book counts them.
#[derive(Clone, Copy, Debug, Default)]
struct GivenUp {
    gone: u64,
    too_old: u64,
    other_session: u64,
    refused: u64,
    at_end: u64,
}

/// Why frames were given up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UnrecoverableCauses {
    /// The service answered GONE: its ring no longer held them.
    pub gone: u64,
    /// The sequence window moved past them: a retransmission could no longer be taken.
    pub too_old: u64,
    /// Asked for as many times as `recovery_attempts` allows without an answer, or found
    /// missing while too many gaps were open already.
    pub out_of_attempts: u64,
    /// Their session ended (a publisher restart) before they came, or the service serves
    /// another session.
    pub other_session: u64,
    /// The service refused this subscriber, or cannot serve it.
    pub refused: u64,
    /// Still missing when the run ended (after the linger, or at a stop).
    pub at_end: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::session::{Admission, SessionTracker};
    use crate::relay::window::Observed;

    const POLICY: RecoveryPolicy = RecoveryPolicy { delay_ns: 0, retry_ns: 10, attempts: 3, max_frames: 8 };

    /// A tiny deterministic generator (xorshift), so the test needs no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A stream frame through the tracker and the book, as the pipeline takes it.
    fn original(t: &mut SessionTracker, b: &mut RecoveryBook, seq: u64, now: i64) -> bool {
        b.sync(t.epoch());
        let o = t.observe(seq);
        if o.take() {
            b.original(seq, t.highest(), now);
        }
        o.take()
    }

    /// A retransmitted frame, as the pipeline takes it.
    fn retransmitted(t: &mut SessionTracker, b: &mut RecoveryBook, seq: u64, now: i64) -> bool {
        b.sync(t.epoch());
        if !b.recovered(seq, now) {
            return false;
        }
        let o = t.observe_copy(seq);
        assert!(o.take(), "a missing frame is always new to the window: {seq} {o:?}");
        if matches!(o, Observed::InOrder | Observed::Gap(_)) {
            b.slide(t.highest());
        }
        true
    }

    #[test]
    fn lost_equals_unrecoverable_whatever_happens() {
        // Every outcome must occur over the seeds, or the test proves little.
        let mut outcomes = RecoveryCounts::default();
        let mut arrived_after_give_up = 0;
        for seed in 1..300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut t = SessionTracker::new();
            let mut b = RecoveryBook::new(POLICY);
            let session = 7;
            let frames = 200 + rng.below(300);
            let mut late: Vec<u64> = Vec::new();
            let mut taken = std::collections::BTreeSet::new();
            let mut now = 0;
            let start = 1 + rng.below(3) * 100;
            for seq in start..start + frames {
                now += 1;
                assert_eq!(t.datagram(session, seq, 1), Admission::Take);
                // The first frame is always taken, so the stream's first frame is `start`.
                match if seq == start { 9 } else { rng.below(10) } {
                    // Lost for good, unless asked for.
                    0 => {}
                    // Late: arrives a little later.
                    1 => late.push(seq),
                    _ => {
                        if original(&mut t, &mut b, seq, now) {
                            taken.insert(seq);
                        }
                    }
                }
                if !late.is_empty() && rng.below(4) == 0 {
                    let s = late.remove(rng.below(late.len() as u64) as usize);
                    if original(&mut t, &mut b, s, now) {
                        assert!(taken.insert(s), "{s} taken twice");
                    }
                }
                // Some duplicates.
                if rng.below(20) == 0 && original(&mut t, &mut b, seq, now) {
                    assert!(taken.insert(seq), "{seq} taken twice");
                }
                // Ask, and answer some requests: served, gone, or not at all.
                for request in b.due(now, 16) {
                    for s in request.first..request.first + u64::from(request.count) {
                        let answer = rng.below(6);
                        if answer == 0 {
                            b.gone(s, 1);
                        } else if answer <= 2 && retransmitted(&mut t, &mut b, s, now) {
                            assert!(taken.insert(s), "{s} taken twice");
                        }
                    }
                }
                // A retransmission of something never asked for, or asked twice.
                if rng.below(30) == 0 {
                    let s = start + rng.below(frames);
                    if retransmitted(&mut t, &mut b, s, now) {
                        assert!(taken.insert(s), "{s} taken twice");
                    }
                }
            }
            // The end: frames missing at the tail too, then late ones arriving while lingering.
            let next = start + frames + rng.below(5);
            assert_eq!(t.end_datagram(session, next), Admission::Take);
            b.end(next, now);
            for s in late {
                if original(&mut t, &mut b, s, now) {
                    assert!(taken.insert(s), "{s} taken twice");
                }
            }
            b.give_up_all();
            let c = b.counts();
            assert_eq!(t.counts().lost, c.frames_unrecoverable, "seed {seed}: {c:?}");
            assert_eq!(
                c.frames_missing,
                c.frames_recovered + c.frames_filled_late + c.frames_unrecoverable,
                "seed {seed}: {c:?}"
            );
            assert_eq!(t.counts().lost, next - start - taken.len() as u64, "seed {seed}");
            outcomes = outcomes + c;
            arrived_after_give_up += b.arrived_after_give_up;
        }
        assert!(outcomes.frames_recovered > 0 && outcomes.frames_filled_late > 0, "{outcomes:?}");
        assert!(outcomes.frames_unrecoverable > 0 && arrived_after_give_up > 0, "{outcomes:?}");
    }

    #[test]
    fn frames_below_the_first_seen_and_a_new_session_are_accounted() {
        let mut t = SessionTracker::new();
        let mut b = RecoveryBook::new(POLICY);
        t.datagram(1, 10, 1);
        assert!(original(&mut t, &mut b, 10, 0));
        assert!(original(&mut t, &mut b, 11, 0));
        // Frame 7 arrives late: 8 and 9 were missing all along.
        assert!(original(&mut t, &mut b, 7, 0));
        assert_eq!((b.missing(), t.counts().lost), (2, 2));
        assert!(retransmitted(&mut t, &mut b, 8, 5));
        assert!(!retransmitted(&mut t, &mut b, 8, 5), "a second copy is not taken");
        // A restarted publisher (confirmed by its second datagram): frame 9 is given up.
        assert_eq!(t.datagram(2, 1, 1), Admission::Hold);
        assert_eq!(t.datagram(2, 2, 1), Admission::TakeHeldThenThis);
        assert!(original(&mut t, &mut b, 1, 6));
        assert!(original(&mut t, &mut b, 2, 6));
        assert!(!retransmitted(&mut t, &mut b, 9, 7), "a frame of the old session");
        b.give_up_all();
        let c = b.counts();
        assert_eq!((c.frames_recovered, c.frames_unrecoverable, c.frames_missing), (1, 1, 2));
        assert_eq!(b.report("h:1").unrecoverable_causes.other_session, 1);
        assert_eq!(t.counts().lost, 1);
        assert_eq!(b.report("h:1").frames_redundant, 2);
    }

    #[test]
    fn from_the_start_the_frames_before_the_first_taken_are_missing() {
        let mut t = SessionTracker::new();
        let mut b = RecoveryBook::new(POLICY);
        t.expect_from(1);
        b.expect_from(1);
        t.datagram(1, 3, 1);
        assert!(original(&mut t, &mut b, 3, 0));
        assert_eq!((b.missing(), t.counts().lost), (2, 2));
        assert!(retransmitted(&mut t, &mut b, 1, 1));
        b.give_up_all();
        assert_eq!((t.counts().lost, b.counts().frames_unrecoverable, b.counts().frames_recovered), (1, 1, 1));
    }

    #[test]
    fn sequence_numbers_at_the_top_of_the_range_do_not_overflow() {
        let mut t = SessionTracker::new();
        let mut b = RecoveryBook::new(POLICY);
        t.datagram(1, u64::MAX - 3, 1);
        assert!(original(&mut t, &mut b, u64::MAX - 3, 0));
        assert!(original(&mut t, &mut b, u64::MAX, 0));
        b.end(u64::MAX, 0);
        assert_eq!(b.missing(), 2);
        assert!(retransmitted(&mut t, &mut b, u64::MAX - 1, 1));
        b.give_up_all();
        assert_eq!(t.counts().lost, b.counts().frames_unrecoverable);
    }

    #[test]
    fn a_jump_beyond_the_window_gives_up_what_the_window_cannot_hold() {
        let mut t = SessionTracker::new();
        let mut b = RecoveryBook::new(POLICY);
        t.datagram(1, 1, 1);
        assert!(original(&mut t, &mut b, 1, 0));
        let far = 1 + WINDOW + 100;
        assert!(original(&mut t, &mut b, far, 0));
        assert_eq!(b.missing(), WINDOW - 1);
        assert_eq!(b.counts().frames_unrecoverable, 100);
        assert_eq!(b.report("h:1").unrecoverable_causes.too_old, 100);
        b.give_up_all();
        assert_eq!(t.counts().lost, b.counts().frames_unrecoverable);
    }
}
