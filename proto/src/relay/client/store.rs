//! Finding missing frames in a store of datagrams numbered by its own positions
//! ([`StoreSearch`]): a message bus that keeps every datagram a publisher sent (JetStream's
//! stream, whose sequence counts messages, not frames) is asked "the first datagram at or after
//! position `p`", one position at a time, and this machine says which position to ask next.
//!
//! A relay datagram carries several frames, so a relay sequence number does not give the
//! store's position. Within one publisher session positions grow with sequence numbers, and the
//! datagrams of earlier sessions come before, so "this datagram reaches frame `first`" is false
//! and then true along the store: the datagram carrying `first` is found by bisection over the
//! positions the store holds (about log2 of them, 20 reads for a million), started from the
//! closest positions already seen (anchors: every datagram read is remembered, up to
//! [`MAX_ANCHORS`]). The range is then read forward from there until its last frame is passed.
//!
//! What it decides, the driver reports:
//! - frames below the first datagram of the session the store still holds are gone (the store
//!   dropped them by its limits, or they were never stored): [`StoreStep::Gone`];
//! - frames missing between two stored datagrams of the session were most likely stored later:
//!   a publisher whose acknowledgement failed (its server lost mid-write) publishes again, after
//!   datagrams that followed were stored. The search reads them from [`BACKTRACK`] positions
//!   before the hole (a store out of order can lead the bisection past them) on past the range,
//!   handing over only the datagrams that fill a hole, until they are all found, the session's
//!   `END` is passed (nothing of it is published after its `END`), or [`WINDOW`] positions are
//!   (a datagram further on would come after more frames than a receiver's window holds): then
//!   they are gone. The store ending first means they may not be stored yet;
//! - frames past the last datagram stored are not stored yet: [`StoreStep::NotStored`], asked
//!   again later by the recovery book's retry;
//! - a range is read once: what a search read is remembered ([`StoreSearch::delivered`]), so
//!   asking again for frames already handed over reads nothing.

use crate::relay::window::WINDOW;
use std::collections::BTreeMap;

/// Positions remembered from earlier reads, at most (the oldest are forgotten first).
pub const MAX_ANCHORS: usize = 4096;
/// Holes sought at once in one range, at most; more are merged into the last.
const MAX_HOLES: usize = 64;
/// How far before a hole its frames are sought, in positions. Where the store's order is not
/// the publisher's (datagrams published again), the bisection can step past the datagram it
/// looks for: a datagram stored again after it says "before the range" at a later position. A
/// retried datagram lies at most one acknowledgement timeout of publishing after where it
/// belonged, a few thousand positions at market rates.
pub const BACKTRACK: u64 = 4096;

/// A datagram read from the store: where, and its header's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Its position in the store.
    pub position: u64,
    /// Its publisher session.
    pub session: u64,
    /// Its first frame (an `END`: the next frame's number).
    pub sequence: u64,
    /// Frames it carries (0 for an `END`).
    pub frames: u64,
}

impl Stored {
    /// One past its last frame.
    fn end(&self) -> u64 {
        self.sequence.saturating_add(self.frames)
    }
}

/// What the driver does next for the range being searched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreStep {
    /// Read the first datagram at or after `position` and report it with
    /// [`StoreSearch::looked`] (none: the store holds nothing from there).
    Look(u64),
    /// Read datagrams forward from `position` (the datagrams from there are the range's), and
    /// report each with [`StoreSearch::read`] until it says stop.
    Read(u64),
    /// Frames `first..first + count` are not in the store (any more): give them up, then go on
    /// with [`StoreSearch::after_gone`].
    Gone {
        /// The first.
        first: u64,
        /// How many.
        count: u64,
    },
    /// The range's frames are past the last datagram stored: ask again later.
    NotStored,
    /// The range is done.
    Done,
}

/// The range being searched.
#[derive(Clone, Debug)]
struct Job {
    session: u64,
    first: u64,
    end: u64,
    /// Every datagram before this position ends at or below `first` (or is of an earlier
    /// session).
    low: u64,
    /// The datagram at or after this position reaches `first` (`last + 1`: none is known to).
    high: u64,
    /// One past the store's last position.
    limit: u64,
    /// The store's first position.
    floor: u64,
    /// Reading forward (after the search).
    reading: bool,
    /// One past the last frame read of the range, once one was.
    reached: Option<u64>,
    /// A datagram of the session was seen before the next one read: a hole from here on is
    /// in the middle of what the store holds, not in front of it.
    after_session_datagram: bool,
    /// Frames `(first, end)` missing between stored datagrams, in order: sought past the range.
    holes: Vec<(u64, u64)>,
    /// Where the first hole was found.
    hole_at: Option<u64>,
    /// Seeking the holes (the range itself was read): where the first was found.
    seeking_from: Option<u64>,
    /// The holes are given up: reported one [`StoreStep::Gone`] at a time.
    giving_up: bool,
}

impl Job {
    /// Records frames `first..end` as missing between stored datagrams.
    fn add_hole(&mut self, first: u64, end: u64) {
        let full = self.holes.len() >= MAX_HOLES;
        match self.holes.last_mut() {
            Some(last) if full => last.1 = last.1.max(end),
            _ => self.holes.push((first, end)),
        }
    }

    /// Takes the frames of `d` out of the holes; whether it filled any.
    fn fill(&mut self, d: &Stored) -> bool {
        let (from, to) = (d.sequence, d.end());
        let mut filled = false;
        let mut kept = Vec::with_capacity(self.holes.len() + 1);
        for &(a, b) in &self.holes {
            if to <= a || b <= from {
                kept.push((a, b));
                continue;
            }
            filled = true;
            if a < from {
                kept.push((a, from));
            }
            if to < b {
                kept.push((to, b));
            }
        }
        self.holes = kept;
        filled
    }
}

/// The search over a store's positions: see the module's documentation.
#[derive(Debug, Default)]
pub struct StoreSearch {
    /// The stream session's datagrams seen, by position.
    anchors: BTreeMap<u64, Stored>,
    session: Option<u64>,
    job: Option<Job>,
    /// Frames already read from the store and handed over, in the session: `(first, end)`.
    delivered: Option<(u64, u64, u64)>,
    reads: u64,
}

impl StoreSearch {
    /// A search that has read nothing.
    pub fn new() -> StoreSearch {
        StoreSearch::default()
    }

    /// Datagrams read from the store so far (searches and ranges).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The part of `first..end` of `session` not yet handed over by an earlier range (a range
    /// asked again is not read again): `None` when it all was.
    pub fn delivered(&self, session: u64, first: u64, end: u64) -> Option<(u64, u64)> {
        match self.delivered {
            Some((s, from, to)) if s == session && from <= first && first < to => (to < end).then_some((to, end)),
            Some((s, from, to)) if s == session && first < from && from < end && end <= to => Some((first, from)),
            _ => Some((first, end)),
        }
    }

    /// Starts on frames `first..end` of `session`, in a store holding positions
    /// `first_position..=last_position` (none when it is empty).
    pub fn begin(&mut self, session: u64, first: u64, end: u64, positions: Option<(u64, u64)>) -> StoreStep {
        if self.session != Some(session) {
            self.session = Some(session);
            self.anchors.clear();
            self.delivered = None;
        }
        let Some((first_position, last_position)) = positions.filter(|(a, b)| a <= b) else {
            self.job = None;
            return StoreStep::NotStored;
        };
        let limit = last_position.saturating_add(1);
        // The closest positions already seen on either side.
        let low = self
            .anchors
            .values()
            .rev()
            .find(|a| a.end() <= first)
            .map_or(first_position, |a| a.position.saturating_add(1))
            .max(first_position);
        let high = self.anchors.values().find(|a| a.end() > first).map_or(limit, |a| a.position).min(limit);
        // Anchors are the session's: one still stored below the range is a datagram of it
        // before the range.
        let after_session_datagram = self.anchors.range(first_position..).any(|(_, a)| a.end() <= first);
        self.job = Some(Job {
            session,
            first,
            end,
            low,
            high,
            limit,
            floor: first_position,
            reading: false,
            reached: None,
            after_session_datagram,
            holes: Vec::new(),
            hole_at: None,
            seeking_from: None,
            giving_up: false,
        });
        self.next()
    }

    /// The step after the last one reported.
    fn next(&mut self) -> StoreStep {
        let Some(job) = &mut self.job else { return StoreStep::Done };
        if job.giving_up {
            if job.holes.is_empty() {
                self.job = None;
                return StoreStep::Done;
            }
            let (first, end) = job.holes.remove(0);
            return StoreStep::Gone { first, count: end - first };
        }
        if job.reading {
            return StoreStep::Read(job.low);
        }
        if job.low < job.high {
            return StoreStep::Look(job.low + (job.high - job.low) / 2);
        }
        if job.high >= job.limit {
            // Nothing stored reaches the range.
            self.job = None;
            return StoreStep::NotStored;
        }
        job.reading = true;
        StoreStep::Read(job.low)
    }

    /// What [`StoreStep::Look`] at `position` found: the first datagram at or after it, if any.
    pub fn looked(&mut self, position: u64, found: Option<Stored>) -> StoreStep {
        if let Some(d) = found {
            self.reads += 1;
            self.remember(d);
        }
        let Some(job) = &mut self.job else { return StoreStep::Done };
        match found {
            // Nothing from there on (or nothing before the known upper bound): the range starts
            // below `position` if anywhere.
            None => job.high = job.high.min(position),
            Some(d) if d.position >= job.high => job.high = job.high.min(position),
            Some(d) if d.session == job.session && d.end() > job.first => job.high = position,
            Some(d) => {
                job.after_session_datagram |= d.session == job.session;
                job.low = d.position.saturating_add(1)
            }
        }
        self.next()
    }

    /// Whether a datagram read forward is to be handed over: while the range is read, every
    /// one; while its holes are sought, those that fill one.
    pub fn wanted(&self, d: &Stored) -> bool {
        match &self.job {
            Some(job) if job.seeking_from.is_some() => {
                d.session == job.session && job.holes.iter().any(|&(a, b)| d.sequence < b && a < d.end())
            }
            _ => true,
        }
    }

    /// A datagram read forward ([`StoreStep::Read`]), or none when the store ended: whether to
    /// read on, or what to do.
    pub fn read(&mut self, found: Option<Stored>) -> StoreStep {
        if let Some(d) = found {
            self.reads += 1;
            self.remember(d);
        }
        let Some(job) = &mut self.job else { return StoreStep::Done };
        let Some(d) = found else {
            // The store ends within the range (or before its holes were found): the rest is not
            // stored yet.
            self.job = None;
            return StoreStep::NotStored;
        };
        job.low = d.position.saturating_add(1);
        if let Some(from) = job.seeking_from {
            let ended = d.session == job.session && d.frames == 0;
            if d.session == job.session {
                job.fill(&d);
            }
            if job.holes.is_empty() {
                self.job = None;
                return StoreStep::Done;
            }
            // Nothing of the session comes after its END, nor within a receiver's window this
            // far on.
            if ended || d.position.saturating_sub(from) >= WINDOW {
                job.giving_up = true;
                return self.next();
            }
            return StoreStep::Read(job.low);
        }
        if d.session != job.session {
            // An earlier session's, before the range: read on.
            return StoreStep::Read(job.low);
        }
        let expected = job.reached.unwrap_or(job.first);
        // Frames between the last datagram read and this one are not where they belong. In
        // front of everything the store holds of the session, they are gone (removed by its
        // limits, or never stored); between its datagrams, they were likely stored later.
        let hole = (d.sequence > expected && expected < job.end).then(|| (expected, d.sequence.min(job.end)));
        let mut gone = None;
        if let Some((a, b)) = hole {
            if job.after_session_datagram {
                job.hole_at.get_or_insert(d.position);
                job.add_hole(a, b);
            } else {
                gone = Some(StoreStep::Gone { first: a, count: b - a });
            }
        }
        job.after_session_datagram = true;
        let reached = expected.max(d.end());
        job.reached = Some(reached);
        let first = job.first;
        // Handed over up to the first hole: frames sought later may still be asked again.
        let handed = job.holes.first().map_or(reached, |h| h.0);
        self.delivered = match self.delivered {
            Some((s, a, b)) if s == job.session && a <= first && first <= b => Some((s, a, b.max(handed))),
            _ => Some((job.session, first, handed)),
        };
        // Past the range, or the session's END (nothing follows it).
        let done = d.end() >= job.end || d.frames == 0;
        if done {
            match job.hole_at {
                Some(at) if !job.holes.is_empty() => {
                    // Sought from a little before the first hole (the bisection may have stepped
                    // past its datagram) to a window past it, or the session's END.
                    job.seeking_from = Some(at);
                    job.low = at.saturating_sub(BACKTRACK).max(job.floor);
                }
                _ => self.job = None,
            }
        }
        match gone {
            Some(step) => step,
            None => self.next(),
        }
    }

    /// The step after a [`StoreStep::Gone`].
    pub fn after_gone(&mut self) -> StoreStep {
        match &self.job {
            Some(job) if job.giving_up || job.seeking_from.is_some() => self.next(),
            Some(job) => StoreStep::Read(job.low),
            None => StoreStep::Done,
        }
    }

    fn remember(&mut self, d: Stored) {
        if Some(d.session) != self.session {
            return;
        }
        self.anchors.insert(d.position, d);
        while self.anchors.len() > MAX_ANCHORS {
            self.anchors.pop_first();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store: positions from `from`, each datagram `frames` frames of session 7 from frame
    /// `start`, with an earlier session's datagrams first.
    fn store(from: u64, earlier: u64, start: u64, datagrams: u64, frames: u64) -> Vec<Stored> {
        let mut out = Vec::new();
        let mut position = from;
        for i in 0..earlier {
            out.push(Stored { position, session: 3, sequence: 1 + i * 10, frames: 10 });
            position += 1;
        }
        for i in 0..datagrams {
            out.push(Stored { position, session: 7, sequence: start + i * frames, frames });
            position += 1;
        }
        out
    }

    /// Runs a search over `store` for `first..end`; the frames read, the frames gone, the
    /// last step, and the look-ups made.
    fn run(search: &mut StoreSearch, store: &[Stored], first: u64, end: u64) -> (Vec<u64>, u64, StoreStep, u64) {
        let positions = store.first().map(|a| (a.position, store.last().unwrap().position));
        let at_or_after = |p: u64| store.iter().find(|d| d.position >= p).copied();
        let mut step = search.begin(7, first, end, positions);
        let (mut read, mut gone, mut looks) = (Vec::new(), 0, 0);
        loop {
            step = match step {
                StoreStep::Look(p) => {
                    looks += 1;
                    assert!(looks < 64, "the search does not end");
                    search.looked(p, at_or_after(p))
                }
                StoreStep::Read(p) => {
                    let d = at_or_after(p);
                    if let Some(d) = d.filter(|d| d.session == 7 && search.wanted(d)) {
                        read.extend(d.sequence..d.end());
                    }
                    search.read(d)
                }
                StoreStep::Gone { count, .. } => {
                    gone += count;
                    search.after_gone()
                }
                done => return (read, gone, done, looks),
            }
        }
    }

    #[test]
    fn finds_the_datagram_carrying_a_frame_by_bisection_and_reads_the_range() {
        let s = store(100, 50, 1, 10_000, 12);
        let mut search = StoreSearch::new();
        let (read, gone, last, looks) = run(&mut search, &s, 50_001, 50_100);
        assert_eq!((gone, last), (0, StoreStep::Done));
        assert!(read.first() <= Some(&50_001) && read.last() >= Some(&50_099), "{:?}", (read.first(), read.last()));
        assert!(looks <= 15, "{looks} look-ups for 10,050 positions");
        // The same range again reads nothing: it was handed over.
        assert_eq!(search.delivered(7, 50_001, 50_100), None);
        assert_eq!(search.delivered(7, 50_050, 50_200), Some((50_101, 50_200)));
        // A later range starts from what was seen: fewer look-ups.
        let (_, _, _, again) = run(&mut search, &s, 60_001, 60_010);
        assert!(again <= looks, "{again} look-ups with anchors against {looks} without");
    }

    #[test]
    fn frames_older_than_the_store_are_gone_and_frames_past_it_are_not_stored() {
        // The store kept session 7 from frame 1,001 on.
        let s = store(5_000, 0, 1_001, 100, 10);
        let mut search = StoreSearch::new();
        let (read, gone, last, _) = run(&mut search, &s, 900, 1_050);
        assert_eq!((gone, last), (101, StoreStep::Done));
        assert_eq!(read.first(), Some(&1_001));
        let (read, gone, last, _) = run(&mut StoreSearch::new(), &s, 500, 800);
        // One datagram read, the session's first stored, to learn that.
        assert_eq!((read.len(), gone, last), (10, 300, StoreStep::Done));
        assert_eq!(run(&mut StoreSearch::new(), &s, 2_001, 2_010).2, StoreStep::NotStored);
        assert_eq!(StoreSearch::new().begin(7, 1, 5, None), StoreStep::NotStored);
        // The range runs past the last datagram: what is stored is read, the rest not yet.
        let (read, _, last, _) = run(&mut StoreSearch::new(), &s, 1_991, 2_050);
        assert_eq!((read.last(), last), (Some(&2_000), StoreStep::NotStored));
    }

    /// Session 7's `END` after the last datagram of `store`.
    fn with_end(mut store: Vec<Stored>) -> Vec<Stored> {
        let last = *store.last().unwrap();
        store.push(Stored { position: last.position + 1, session: 7, sequence: last.end(), frames: 0 });
        store
    }

    #[test]
    fn holes_in_the_positions_and_other_subjects_are_stepped_over() {
        // Every third position missing (deleted, or another subject's).
        let s: Vec<Stored> = store(1, 0, 1, 3_000, 4).into_iter().filter(|d| d.position % 3 != 0).collect();
        let deleted = (4_001..4_021u64).filter(|seq| ((seq - 1) / 4 + 1) % 3 == 0).count() as u64;
        // Frames missing between stored datagrams may be stored later: sought to the store's
        // end, they are not stored yet.
        let (read, gone, last, _) = run(&mut StoreSearch::new(), &s, 4_001, 4_021);
        assert_eq!((gone, last), (0, StoreStep::NotStored));
        assert!((4_001..4_021u64).all(|seq| read.contains(&seq) || ((seq - 1) / 4 + 1) % 3 == 0), "{read:?}");
        // Past the session's END nothing more of it comes: they are gone, and only they; every
        // other frame of the range is read, and nothing else is handed over while seeking.
        let (read, gone, last, _) = run(&mut StoreSearch::new(), &with_end(s), 4_001, 4_021);
        assert_eq!((gone, last), (deleted, StoreStep::Done));
        let kept: Vec<u64> = (4_001..4_025u64).filter(|seq| ((seq - 1) / 4 + 1) % 3 != 0).collect();
        assert_eq!(read, kept, "the datagrams reaching into the range, and nothing after");
    }

    #[test]
    fn a_datagram_stored_late_by_a_publishers_retry_is_found_past_the_range() {
        // Session 7, 10 frames a datagram; the datagram of frames 2,001..2,010 failed to store
        // and was published again 300 datagrams later.
        let mut s = store(1, 0, 1, 1_000, 10);
        let late = s.remove(200);
        for d in &mut s[200..500] {
            d.position -= 1;
        }
        s.insert(499, Stored { position: 500, ..late });
        for (i, d) in s.iter_mut().enumerate() {
            d.position = i as u64 + 1;
        }
        let mut search = StoreSearch::new();
        let (read, gone, last, _) = run(&mut search, &s, 1_995, 2_030);
        assert_eq!((gone, last), (0, StoreStep::Done));
        assert!((1_995..2_030).all(|seq| read.contains(&seq)), "every frame of the range: {read:?}");
        // While seeking, only the late datagram was handed over: the range's, and that one.
        assert_eq!(read.len(), 10 + 10 + 10 + 10);
        // What follows the hole stays to be asked: only the frames before it count as handed.
        assert_eq!(search.delivered(7, 1_995, 2_030), Some((2_001, 2_030)));
        // Datagrams published again after the range's carrier mislead the bisection past it:
        // it is found from before the hole.
        let mut s = store(1, 0, 1, 1_000, 10);
        let retried: Vec<Stored> = s.drain(100..200).collect();
        s.splice(450..450, retried);
        for (i, d) in s.iter_mut().enumerate() {
            d.position = i as u64 + 1;
        }
        assert_eq!((s[449].sequence, s[500].sequence), (5_491, 1_501), "the carrier, then a retried datagram");
        let (read, gone, last, _) = run(&mut StoreSearch::new(), &s, 5_491, 5_501);
        assert_eq!((gone, last), (0, StoreStep::Done));
        assert!((5_491..5_501).all(|seq| read.contains(&seq)), "{read:?}");
        // Published again more than a window's positions later, it is given up as gone.
        let mut far = store(1, 0, 1, 70_000, 1);
        let late = far.remove(100);
        far.push(Stored { position: 0, ..late });
        for (i, d) in far.iter_mut().enumerate() {
            d.position = i as u64 + 1;
        }
        let (_, gone, last, _) = run(&mut StoreSearch::new(), &far, 95, 110);
        assert_eq!((gone, last), (1, StoreStep::Done));
    }
}
