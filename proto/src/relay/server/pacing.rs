//! When each segment goes out, given the time: the capture's own timing scaled, a fixed message
//! rate, or top speed.
//!
//! Every target time is computed from one anchor (the time and the capture time of the first
//! segment), never from the previous send, so waiting error does not accumulate into drift. A
//! paced segment's publish time is its scheduled time, not when it went out, so a publisher
//! stall shows up as latency instead of being hidden (no coordinated omission). The driver
//! waits; this only says until when.

/// How segments are paced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PaceMode {
    /// As fast as they come.
    TopSpeed,
    /// The capture's timing divided by `speed`; a jump in the capture's clock of more than
    /// `max_gap_s` (after scaling) starts the schedule again instead of being waited out.
    Original {
        /// Speed-up of the capture's timing.
        speed: f64,
        /// Seconds of a jump in the capture's clock that are not waited out.
        max_gap_s: f64,
    },
    /// A fixed number of messages per second (a heartbeat weighs as one message).
    Rate {
        /// Messages per second.
        per_second: f64,
    },
}

/// One segment's place in the schedule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paced {
    /// When it is due, ns on the driver's monotonic clock; `None`: at once (top speed, or a
    /// target beyond the clock's range), stamped with the current time by the driver.
    pub target: Option<i64>,
    /// Its publish time (ns since the epoch) when it has a target: the scheduled time.
    pub publish_time: Option<i64>,
    /// The capture's clock jumped by this many seconds (scaled) before it: the schedule starts
    /// again from it.
    pub reanchored: Option<f64>,
}

/// The pacing schedule of one publisher run.
#[derive(Clone, Debug)]
pub struct PaceSchedule {
    mode: PaceMode,
    /// (monotonic ns, capture ns) of the anchor segment.
    anchor: Option<(i64, i64)>,
    /// Wall clock (ns since the epoch) at the anchor, to turn targets into timestamps.
    anchor_wall: i64,
    /// Messages scheduled so far (heartbeats count one).
    messages: u64,
    /// `Original`: the previous segment's capture time, to notice jumps in the capture's clock.
    last_capture: Option<i64>,
    reanchors: u64,
}

impl PaceSchedule {
    /// A schedule in `mode`, anchored at its first segment.
    pub fn new(mode: PaceMode) -> PaceSchedule {
        PaceSchedule { mode, anchor: None, anchor_wall: 0, messages: 0, last_capture: None, reanchors: 0 }
    }

    /// Times the schedule started again at a jump in the capture's clock.
    pub fn reanchors(&self) -> u64 {
        self.reanchors
    }

    /// When the segment with `capture_time` is due if that is after `now` (so the driver can
    /// flush pending output before it waits); `None` at top speed, when late, or before the
    /// schedule is anchored. `now` is called only when there is a target: at top speed a clock
    /// read per segment was about 6 % of the hot thread's samples.
    pub fn due(&self, capture_time: i64, now: impl FnOnce() -> i64) -> Option<i64> {
        self.target(capture_time).filter(|&target| target > now())
    }

    fn target(&self, capture_time: i64) -> Option<i64> {
        let (anchor, anchor_capture) = self.anchor?;
        let offset = match self.mode {
            PaceMode::TopSpeed => return None,
            // Casts from f64 saturate: the max_gap check keeps offsets far from the limits.
            PaceMode::Original { speed, .. } => {
                (capture_time.saturating_sub(anchor_capture).max(0) as f64 / speed) as i64
            }
            PaceMode::Rate { per_second } => (self.messages as f64 * 1e9 / per_second).round() as i64,
        };
        anchor.checked_add(offset)
    }

    /// Schedules the segment with `capture_time` and `messages` messages. `now` gives the
    /// (monotonic, wall-clock) time; it is called only when the schedule anchors on this
    /// segment, since a clock read per segment is a measurable share of the work at top speed.
    pub fn next(&mut self, capture_time: i64, messages: u64, now: impl FnOnce() -> (i64, i64)) -> Paced {
        let mut reanchored = None;
        if let PaceMode::Original { speed, max_gap_s } = self.mode {
            if let Some(last) = self.last_capture {
                // A jump in the capture's clock (a far-future timestamp, a capture spanning
                // days, a clock stepped back) is not waited out.
                let jump = capture_time.saturating_sub(last) as f64 / speed;
                if self.anchor.is_some() && jump.abs() > max_gap_s * 1e9 {
                    self.anchor = None;
                    self.reanchors += 1;
                    reanchored = Some(jump / 1e9);
                }
            }
            self.last_capture = Some(capture_time);
        }
        if self.anchor.is_none() {
            let (mono, wall) = now();
            self.anchor = Some((mono, capture_time));
            self.anchor_wall = wall;
        }
        let target = self.target(capture_time);
        let publish_time = target.map(|target| {
            let (anchor, _) = self.anchor.unwrap_or_default();
            self.anchor_wall.saturating_add(target - anchor)
        });
        // A heartbeat weighs as one message: otherwise the idle seconds of a capture would be
        // scheduled at a single instant and go out as one burst, whose tail reads as latency.
        self.messages = self.messages.saturating_add(messages.max(1));
        Paced { target, publish_time, reanchored }
    }

    /// Starts a new pass over the source: the next segment becomes the new anchor, so a loop
    /// does not wait out the gap between the capture's end and its start.
    pub fn rewind(&mut self) {
        if matches!(self.mode, PaceMode::Original { .. }) {
            self.anchor = None;
            self.last_capture = None;
        }
    }
}
