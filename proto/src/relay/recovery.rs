//! Loss recovery without I/O: the subscriber's side ([`GapList`]: which frames are missing, since
//! when, which to ask the publisher for now, and what became of each), and the retransmission
//! service's connection places ([`ServiceSlots`]: who may hold one, and who makes way).
//!
//! A gap is asked for only after a delay (reordering on the way usually fills it first), then
//! again while it stays open, up to a number of attempts: first after the retry interval, or
//! twice the time answers have been taking when that is longer, and after twice as long with
//! each request that goes unanswered, up to [`RETRY_DOUBLINGS`] doublings. A service that is
//! slow to answer (loaded, or far) is so asked less often rather than more, and a `BUSY` answer
//! (over its rate limit) holds every request back for a retry interval without using up the
//! gap's attempts. A frame filled
//! by a retransmission counts as recovered, with the time since its gap was seen; one filled by
//! the original arriving late counts as filled by reordering; one the publisher answers "gone"
//! for, one older than the receiver's window, or one still open when attempts run out counts as
//! unrecoverable. Memory is bounded: at most [`MAX_GAPS`] ranges are tracked, and a gap seen when
//! that many are open is unrecoverable at once.

use super::wire::RetransmitRequest;
use std::collections::{BTreeMap, BTreeSet};

/// Missing ranges tracked at once.
pub const MAX_GAPS: usize = 16_384;

/// How many times the wait before a gap is asked again doubles (to eight times the retry
/// interval). Without it, every open gap is asked again at each retry interval however slow the
/// answers are, and the requests outgrow what the service answers within its rate limit: its
/// `BUSY` answers then delay every gap further, and the loss no longer recovers.
pub const RETRY_DOUBLINGS: u32 = 3;

/// What became of the frames found missing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryCounts {
    /// Gaps seen (runs of consecutive missing frames, each counted once when seen).
    pub gaps_detected: u64,
    /// Frames in those gaps.
    pub frames_missing: u64,
    /// Frames filled by a retransmission.
    pub frames_recovered: u64,
    /// Frames filled by the original arriving late, before or despite a request.
    pub frames_filled_late: u64,
    /// Frames given up on: gone from the publisher's ring, too old for the window, past the
    /// attempts, or still missing at the end.
    pub frames_unrecoverable: u64,
    /// Requests sent.
    pub requests: u64,
}

counters_add!(RecoveryCounts {
    gaps_detected,
    frames_missing,
    frames_recovered,
    frames_filled_late,
    frames_unrecoverable,
    requests
});

#[derive(Clone, Copy, Debug)]
struct Gap {
    /// One past the last missing frame.
    end: u64,
    /// When the gap was seen, ns.
    seen: i64,
    /// When it was last asked for, ns.
    asked: Option<i64>,
    attempts: u32,
}

/// When and how often to ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// Wait this long after a gap is seen before asking, ns.
    pub delay_ns: i64,
    /// Ask again after this long without an answer, ns; doubled with each further request for
    /// the same gap, up to [`RETRY_DOUBLINGS`] times.
    pub retry_ns: i64,
    /// Requests per gap before it is given up.
    pub attempts: u32,
    /// Frames per request at most.
    pub max_frames: u32,
}

/// The missing frames of one session.
#[derive(Clone, Debug, Default)]
pub struct GapList {
    gaps: BTreeMap<u64, Gap>,
    /// The frames the gaps hold, kept as they change: the receivers ask for it at every
    /// datagram, and summing thousands of gaps there made a subscriber under heavy loss fall
    /// behind its own socket.
    open: u64,
    counts: RecoveryCounts,
    /// Nothing is asked before this time, ns: the service said it was busy.
    hold_until: i64,
    /// How long answers take, ns, smoothed (an eighth of each new sample, as TCP smooths its
    /// round-trip time); 0 before the first. Sampled only from a gap's first request, whose
    /// answer cannot be mistaken for a later request's.
    answer_ns: i64,
}

impl RecoveryPolicy {
    /// How long to wait for an answer to a gap's request number `attempts` before asking again,
    /// when answers have been taking `answer_ns`.
    pub fn retry_after(&self, attempts: u32, answer_ns: i64) -> i64 {
        let doublings = attempts.saturating_sub(1).min(RETRY_DOUBLINGS);
        self.retry_ns.max(answer_ns.saturating_mul(2)).saturating_mul(1 << doublings)
    }
}

impl GapList {
    /// No gaps.
    pub fn new() -> GapList {
        GapList::default()
    }

    /// The counts so far.
    pub fn counts(&self) -> RecoveryCounts {
        self.counts
    }

    /// Frames missing now and not given up on.
    pub fn open_frames(&self) -> u64 {
        self.open
    }

    /// True when nothing is missing.
    pub fn is_empty(&self) -> bool {
        self.gaps.is_empty()
    }

    /// True when frame `seq` is missing and not given up on.
    pub fn is_missing(&self, seq: u64) -> bool {
        self.holding(seq).is_some()
    }

    /// The lowest frame missing, if any.
    pub fn first_missing(&self) -> Option<u64> {
        self.gaps.keys().next().copied()
    }

    /// Frames `first..end` were found missing at `now`.
    pub fn open(&mut self, first: u64, end: u64, now: i64) {
        if end <= first {
            return;
        }
        self.counts.gaps_detected += 1;
        self.counts.frames_missing += end - first;
        if self.gaps.len() >= MAX_GAPS {
            self.counts.frames_unrecoverable += end - first;
            return;
        }
        self.gaps.insert(first, Gap { end, seen: now, asked: None, attempts: 0 });
        self.open += end - first;
    }

    /// The gap holding `seq`, as its first frame.
    fn holding(&self, seq: u64) -> Option<u64> {
        let (&first, gap) = self.gaps.range(..=seq).next_back()?;
        (seq < gap.end).then_some(first)
    }

    /// Frame `seq` arrived: by retransmission (`recovered`) or late. Returns how long after its
    /// gap was seen, ns, when it was missing.
    pub fn fill(&mut self, seq: u64, recovered: bool, now: i64) -> Option<i64> {
        let first = self.holding(seq)?;
        let mut gap = self.gaps.remove(&first)?;
        if recovered
            && gap.attempts == 1
            && let Some(asked) = gap.asked
        {
            let sample = now.saturating_sub(asked).max(0);
            self.answer_ns = match self.answer_ns {
                0 => sample,
                smoothed => smoothed.saturating_add(sample.saturating_sub(smoothed) / 8),
            };
        }
        if recovered {
            // The service answers: attempts count from here, so a gap larger than a request's
            // range, served a part per request, never runs out of them while it progresses.
            gap.attempts = 0;
        }
        if first < seq {
            self.gaps.insert(first, Gap { end: seq, ..gap });
        }
        if seq + 1 < gap.end {
            self.gaps.insert(seq + 1, gap);
        }
        self.open -= 1;
        if recovered {
            self.counts.frames_recovered += 1;
        } else {
            self.counts.frames_filled_late += 1;
        }
        Some(now.saturating_sub(gap.seen))
    }

    /// Gives up on every missing frame in `first..end` (the publisher no longer has them).
    pub fn give_up(&mut self, first: u64, end: u64) -> u64 {
        let mut given_up = 0;
        let starts: Vec<u64> = match self.holding(first) {
            Some(head) => self.gaps.range(head..end).map(|(&s, _)| s).collect(),
            None => self.gaps.range(first..end).map(|(&s, _)| s).collect(),
        };
        for start in starts {
            let Some(gap) = self.gaps.remove(&start) else { continue };
            let cut_from = start.max(first);
            let cut_to = gap.end.min(end);
            given_up += cut_to.saturating_sub(cut_from);
            if start < cut_from {
                self.gaps.insert(start, Gap { end: cut_from, ..gap });
            }
            if cut_to < gap.end {
                self.gaps.insert(cut_to, gap);
            }
        }
        self.open -= given_up;
        self.counts.frames_unrecoverable += given_up;
        given_up
    }

    /// The service answered `BUSY` at `now` to the request for frames from `first` (0 when it
    /// made the connection leave for another client). That request does not count against its
    /// gap's attempts (the service said "not now", not "not here"), and nothing is asked for the
    /// next `policy.retry_ns`, so a service over its rate limit is not asked faster than it
    /// answers. A gap so held still ends: it grows too old for the window, or is given up at the
    /// end.
    pub fn busy(&mut self, first: u64, now: i64, policy: &RecoveryPolicy) {
        if first > 0
            && let Some(start) = self.holding(first)
            && let Some(gap) = self.gaps.get_mut(&start)
        {
            gap.attempts = gap.attempts.saturating_sub(1);
            gap.asked = Some(now);
        }
        self.hold_until = self.hold_until.max(now.saturating_add(policy.retry_ns));
    }

    /// Gives up on every frame below `low` (the receiver's window no longer reaches it).
    pub fn give_up_below(&mut self, low: u64) -> u64 {
        match self.gaps.first_key_value() {
            Some((&first, _)) if first < low => self.give_up(first, low),
            _ => 0,
        }
    }

    /// Gives up on everything still missing (the end of the run).
    pub fn give_up_all(&mut self) -> u64 {
        self.give_up(0, u64::MAX)
    }

    /// The requests due at `now`, at most `max_requests` of them; gaps past their attempts are
    /// given up.
    pub fn due(&mut self, now: i64, policy: &RecoveryPolicy, max_requests: usize) -> Vec<RetransmitRequest> {
        let mut requests = Vec::new();
        if now < self.hold_until {
            return requests;
        }
        let mut exhausted = Vec::new();
        for (&first, gap) in self.gaps.iter_mut() {
            if requests.len() >= max_requests {
                break;
            }
            let waited = match gap.asked {
                None => now.saturating_sub(gap.seen) >= policy.delay_ns,
                Some(asked) => now.saturating_sub(asked) >= policy.retry_after(gap.attempts, self.answer_ns),
            };
            if !waited {
                continue;
            }
            if gap.attempts >= policy.attempts {
                exhausted.push((first, gap.end));
                continue;
            }
            gap.asked = Some(now);
            gap.attempts += 1;
            let count = (gap.end - first).min(u64::from(policy.max_frames.max(1))) as u32;
            requests.push(RetransmitRequest { first, count });
        }
        for (first, end) in exhausted {
            self.give_up(first, end);
        }
        self.counts.requests += requests.len() as u64;
        requests
    }
}

/// The retransmission service's connection places, bounded by `limit`, with the time each
/// holder last asked for something. When every place is taken, a newcomer takes the place of the
/// holder that has asked for nothing the longest, provided that is at least `grace` and it is
/// not being answered: places go to clients that ask, and connections that ask nothing cannot
/// keep them. The grace lets a client that has just connected send its first request before it
/// can be made to leave. Times are ns on any clock that does not go back.
#[derive(Debug)]
pub struct ServiceSlots<T> {
    limit: usize,
    grace_ns: i64,
    next: u64,
    held: BTreeMap<u64, Slot<T>>,
    /// The places not being answered, by when they were last active: the first is the one
    /// idle the longest, found without a scan however many places there are.
    idle: BTreeSet<(i64, u64)>,
}

#[derive(Debug)]
struct Slot<T> {
    /// When the holder connected, or was last answered; `None` while it is being answered.
    idle_since: Option<i64>,
    holder: T,
}

/// What [`ServiceSlots::enter`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Entered<T> {
    /// Given `slot`; `evicted` is the holder that made way for it, if the service was full.
    Admitted {
        /// The newcomer's place, for [`ServiceSlots::asked`], [`ServiceSlots::answered`] and
        /// [`ServiceSlots::leave`].
        slot: u64,
        /// The holder whose place it took.
        evicted: Option<T>,
    },
    /// Every place is held by a client that asked within the grace (or is being answered):
    /// the newcomer is turned away, and gets its holder back.
    Full(T),
}

impl<T> ServiceSlots<T> {
    /// At most `limit` places; a holder idle for `grace_ns` may be made to leave.
    pub fn new(limit: usize, grace_ns: i64) -> ServiceSlots<T> {
        ServiceSlots { limit, grace_ns, next: 0, held: BTreeMap::new(), idle: BTreeSet::new() }
    }

    /// Places held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True when no place is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// A newcomer connected at `now`.
    pub fn enter(&mut self, now: i64, holder: T) -> Entered<T> {
        let evicted = if self.held.len() < self.limit {
            None
        } else {
            match self.idle.first() {
                Some(&(since, slot)) if now.saturating_sub(since) >= self.grace_ns => self.take(slot),
                _ => return Entered::Full(holder),
            }
        };
        let slot = self.next;
        self.next += 1;
        self.held.insert(slot, Slot { idle_since: Some(now), holder });
        self.idle.insert((now, slot));
        Entered::Admitted { slot, evicted }
    }

    /// The holder of `slot` asked for something at `now`; it is being answered, so not idle.
    pub fn asked(&mut self, slot: u64) {
        if let Some(s) = self.held.get_mut(&slot)
            && let Some(since) = s.idle_since.take()
        {
            self.idle.remove(&(since, slot));
        }
    }

    /// The holder of `slot` was answered at `now`; its idle time counts from here.
    pub fn answered(&mut self, slot: u64, now: i64) {
        if let Some(s) = self.held.get_mut(&slot) {
            if let Some(since) = s.idle_since.replace(now) {
                self.idle.remove(&(since, slot));
            }
            self.idle.insert((now, slot));
        }
    }

    /// The holder of `slot` left (a slot already given to another is left alone).
    pub fn leave(&mut self, slot: u64) {
        self.take(slot);
    }

    fn take(&mut self, slot: u64) -> Option<T> {
        let s = self.held.remove(&slot)?;
        if let Some(since) = s.idle_since {
            self.idle.remove(&(since, slot));
        }
        Some(s.holder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_service_makes_the_longest_idle_holder_leave_once_past_the_grace() {
        let mut slots = ServiceSlots::new(3, 100);
        let slot = |e: Entered<char>| match e {
            Entered::Admitted { slot, evicted } => (slot, evicted),
            Entered::Full(h) => panic!("{h} turned away"),
        };
        let (a, _) = slot(slots.enter(0, 'a'));
        let (b, _) = slot(slots.enter(10, 'b'));
        let (c, _) = slot(slots.enter(20, 'c'));
        // Full, and nobody idle for the grace yet: turned away.
        assert_eq!(slots.enter(90, 'd'), Entered::Full('d'));
        // `a` asks: `b` is idle the longest now.
        slots.asked(a);
        slots.answered(a, 96);
        let (d, made_way) = slot(slots.enter(115, 'd'));
        assert_eq!(made_way, Some('b'));
        // `c` is being answered, so not idle however long ago it asked; `a` is past the grace.
        slots.asked(c);
        let (e, made_way) = slot(slots.enter(200, 'e'));
        assert_eq!(made_way, Some('a'));
        assert_eq!(slots.len(), 3);
        // Leaving frees a place; leaving a place already taken by another changes nothing.
        slots.leave(b);
        assert_eq!(slots.len(), 3);
        slots.leave(c);
        let (f, made_way) = slot(slots.enter(201, 'f'));
        assert_eq!(made_way, None);
        // Every holder being answered: a newcomer is turned away, however long ago they asked.
        for s in [d, e, f] {
            slots.asked(s);
        }
        assert_eq!(slots.enter(10_000, 'g'), Entered::Full('g'));
        slots.answered(e, 10_050);
        assert_eq!(slots.enter(10_100, 'g'), Entered::Full('g'));
        assert_eq!(slot(slots.enter(10_150, 'g')).1, Some('e'));
    }

    const POLICY: RecoveryPolicy = RecoveryPolicy { delay_ns: 10, retry_ns: 100, attempts: 2, max_frames: 4 };

    #[test]
    fn asks_after_the_delay_and_again_after_the_retry() {
        let mut gaps = GapList::new();
        gaps.open(10, 20, 0);
        assert!(gaps.due(5, &POLICY, 10).is_empty());
        assert_eq!(gaps.due(10, &POLICY, 10), vec![RetransmitRequest { first: 10, count: 4 }]);
        assert!(gaps.due(50, &POLICY, 10).is_empty());
        // Recovered frames split the gap; the retry asks for what is still missing.
        for seq in 10..14 {
            assert_eq!(gaps.fill(seq, true, 60), Some(60));
        }
        assert_eq!(gaps.open_frames(), 6);
        assert_eq!(gaps.due(110, &POLICY, 10), vec![RetransmitRequest { first: 14, count: 4 }]);
        // Progress reset the attempts: two more without an answer (the second waited for twice
        // the retry), then it is given up.
        assert_eq!(gaps.due(210, &POLICY, 10), vec![RetransmitRequest { first: 14, count: 4 }]);
        assert!(gaps.due(310, &POLICY, 10).is_empty());
        assert_eq!(gaps.open_frames(), 6, "the second request is still waited for");
        assert!(gaps.due(410, &POLICY, 10).is_empty());
        assert_eq!(gaps.counts().frames_unrecoverable, 6);
        assert_eq!(gaps.counts().frames_recovered, 4);
        assert!(gaps.is_empty());
    }

    #[test]
    fn late_frames_gone_frames_and_old_frames() {
        let mut gaps = GapList::new();
        gaps.open(1, 4, 0);
        gaps.open(10, 20, 0);
        assert_eq!(gaps.fill(2, false, 5), Some(5));
        assert_eq!(gaps.fill(2, false, 5), None);
        assert_eq!(gaps.fill(7, true, 5), None);
        assert_eq!(gaps.give_up(12, 15), 3);
        assert_eq!(gaps.give_up_below(11), 3);
        // Left: 11 and 15..20.
        assert_eq!(gaps.open_frames(), 6);
        assert_eq!(gaps.give_up_all(), 6);
        let c = gaps.counts();
        assert_eq!((c.gaps_detected, c.frames_missing, c.frames_filled_late, c.frames_unrecoverable), (2, 13, 1, 12));
    }

    #[test]
    fn a_gap_served_a_part_at_a_time_never_runs_out_of_attempts() {
        let mut gaps = GapList::new();
        gaps.open(0, 40, 0);
        let mut now = 10;
        let mut served = 0;
        while !gaps.is_empty() {
            let asked = gaps.due(now, &POLICY, 10);
            for r in asked {
                for seq in r.first..r.first + u64::from(r.count) {
                    gaps.fill(seq, true, now);
                    served += 1;
                }
            }
            now += 100;
        }
        assert_eq!((served, gaps.counts().frames_unrecoverable), (40, 0));
    }

    #[test]
    fn requests_per_call_are_bounded() {
        let mut gaps = GapList::new();
        for i in 0..10 {
            gaps.open(i * 10, i * 10 + 2, 0);
        }
        assert_eq!(gaps.due(100, &POLICY, 3).len(), 3);
        assert_eq!(gaps.counts().requests, 3);
    }

    #[test]
    fn unanswered_requests_are_asked_again_after_a_doubling_wait() {
        let policy = RecoveryPolicy { delay_ns: 0, retry_ns: 100, attempts: 10, max_frames: 4 };
        let mut gaps = GapList::new();
        gaps.open(1, 2, 0);
        let mut asked_at = Vec::new();
        for now in 0..3_000 {
            if !gaps.due(now, &policy, 10).is_empty() {
                asked_at.push(now);
            }
        }
        // 100, 200, 400, then eight times the retry from there on.
        assert_eq!(asked_at, vec![0, 100, 300, 700, 1_500, 2_300]);
    }

    #[test]
    fn busy_holds_every_request_back_without_using_up_attempts() {
        let policy = RecoveryPolicy { delay_ns: 0, retry_ns: 100, attempts: 1, max_frames: 4 };
        let mut gaps = GapList::new();
        gaps.open(5, 6, 0);
        gaps.open(9, 10, 0);
        assert_eq!(gaps.due(0, &policy, 1), vec![RetransmitRequest { first: 5, count: 1 }]);
        gaps.busy(5, 10, &policy);
        // Held back: not even the gap not asked for yet.
        assert!(gaps.due(50, &policy, 10).is_empty());
        // The busy request was not an attempt: its gap is asked again, not given up.
        let asked = gaps.due(110, &policy, 10);
        assert_eq!(asked, vec![RetransmitRequest { first: 5, count: 1 }, RetransmitRequest { first: 9, count: 1 }]);
        assert_eq!(gaps.counts().frames_unrecoverable, 0);
        // Without an answer, the one attempt is used up.
        assert!(gaps.due(210, &policy, 10).is_empty());
        assert_eq!(gaps.counts().frames_unrecoverable, 2);
    }

    #[test]
    fn slow_answers_make_the_retry_wait_longer() {
        let policy = RecoveryPolicy { delay_ns: 0, retry_ns: 100, attempts: 10, max_frames: 4 };
        let mut gaps = GapList::new();
        gaps.open(1, 2, 0);
        gaps.open(5, 6, 0);
        assert_eq!(gaps.due(0, &policy, 1).len(), 1);
        // Frame 1 is answered 300 after its first request: requests now wait 600 for an answer.
        assert_eq!(gaps.fill(1, true, 300), Some(300));
        let asked: Vec<u64> = gaps.due(300, &policy, 10).iter().map(|r| r.first).collect();
        assert_eq!(asked, vec![5]);
        assert!(gaps.due(899, &policy, 10).is_empty());
        assert_eq!(gaps.due(900, &policy, 10), vec![RetransmitRequest { first: 5, count: 1 }]);
    }

    proptest::proptest! {
        /// The count of open frames kept as gaps open, fill and are given up is their sum.
        #[test]
        fn the_open_frames_kept_are_the_frames_the_gaps_hold(
            steps in proptest::collection::vec((0u8..4, 0u64..400, 1u64..40), 1..200)
        ) {
            let mut gaps = GapList::new();
            let policy = RecoveryPolicy { delay_ns: 0, retry_ns: 1, attempts: 3, max_frames: 16 };
            for (i, (op, at, len)) in steps.into_iter().enumerate() {
                let now = i as i64;
                match op {
                    // Gaps open past what is open, as a receiver finds them.
                    0 => {
                        let from = gaps.gaps.last_key_value().map_or(at, |(_, g)| g.end + at % 7);
                        gaps.open(from, from + len, now);
                    }
                    1 => {
                        gaps.fill(at, at % 2 == 0, now);
                    }
                    2 => {
                        gaps.give_up(at, at + len);
                    }
                    _ => {
                        gaps.due(now, &policy, 8);
                    }
                }
                let sum: u64 = gaps.gaps.iter().map(|(first, gap)| gap.end - first).sum();
                proptest::prop_assert_eq!(gaps.open_frames(), sum);
            }
        }
    }
}
