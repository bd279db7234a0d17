//! When each segment goes out: the capture's own timing scaled, a fixed message rate, or top
//! speed.
//!
//! Every target time is computed from one anchor (the first segment's wall-clock time and
//! capture time), never from the previous send, so sleep error does not accumulate into drift.
//! Waits sleep until shortly before the target and spin the rest, yielding the CPU on each turn:
//! a sleep overshoots by tens of microseconds (timer slack), more than the gaps between market
//! data packets, while a bare spin would take a core from the subscribers and the network stack
//! on the same host.

use crate::config::{Pacing, PacingMode};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Spin instead of sleeping for the last stretch of a wait (a little above the default 50 µs
/// timer slack).
const SPIN: Duration = Duration::from_micros(120);

/// Paces segments and stamps their publish time.
#[derive(Debug)]
pub struct Pacer {
    pacing: Pacing,
    anchor: Option<(Instant, i64)>,
    /// Wall clock (ns since the epoch) at the anchor instant, to turn schedules into timestamps.
    anchor_realtime: i64,
    messages: u64,
}

/// Nanoseconds since the Unix epoch, CLOCK_REALTIME.
pub fn realtime_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

fn wait_until(target: Instant) {
    loop {
        let now = Instant::now();
        if now >= target {
            return;
        }
        let left = target - now;
        if left > SPIN * 2 {
            std::thread::sleep(left - SPIN);
        } else {
            std::thread::yield_now();
        }
    }
}

impl Pacer {
    /// A pacer for `pacing`.
    pub fn new(pacing: Pacing) -> Pacer {
        Pacer { pacing, anchor: None, anchor_realtime: 0, messages: 0 }
    }

    /// The time the next segment is due, if it is in the future (so pending output can be
    /// flushed before waiting); `None` at top speed or when already late.
    pub fn due(&self, capture_time: i64) -> Option<Instant> {
        let target = self.target(capture_time)?;
        (target > Instant::now()).then_some(target)
    }

    fn target(&self, capture_time: i64) -> Option<Instant> {
        let (anchor, anchor_capture) = self.anchor?;
        match self.pacing.mode {
            PacingMode::TopSpeed => None,
            PacingMode::Original => {
                let offset = (capture_time - anchor_capture).max(0) as f64 / self.pacing.speed;
                Some(anchor + Duration::from_nanos(offset as u64))
            }
            PacingMode::Rate => Some(anchor + Duration::from_secs_f64(self.messages as f64 / self.pacing.rate)),
        }
    }

    /// Waits until the segment with `capture_time` and `messages` messages is due, and returns
    /// its publish time: the scheduled time when paced (so a publisher stall shows up as latency
    /// instead of being hidden: no coordinated omission), the current time at top speed.
    pub fn wait(&mut self, capture_time: i64, messages: u64) -> i64 {
        if self.anchor.is_none() {
            self.anchor = Some((Instant::now(), capture_time));
            self.anchor_realtime = realtime_ns();
        }
        let publish_time = match self.target(capture_time) {
            None => realtime_ns(),
            Some(target) => {
                wait_until(target);
                let (anchor, _) = self.anchor.expect("set above");
                self.anchor_realtime + (target - anchor).as_nanos() as i64
            }
        };
        // A heartbeat (no messages) weighs as one: otherwise the idle seconds of a capture (9,000
        // heartbeats before a synthetic day's open) would be scheduled at a single instant and
        // go out as one burst, whose tail then reads as latency.
        self.messages += messages.max(1);
        publish_time
    }

    /// Starts a new pass over the source: the next segment becomes the new anchor, so a loop
    /// does not wait out the gap between the capture's end and its start.
    pub fn rewind(&mut self) {
        if self.pacing.mode == PacingMode::Original {
            self.anchor = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pacing(mode: PacingMode) -> Pacing {
        Pacing { mode, speed: 10.0, rate: 1000.0, loops: 1, max_messages: 0, duration: 0.0 }
    }

    #[test]
    fn original_timing_is_scaled_and_anchored() {
        let mut p = Pacer::new(pacing(PacingMode::Original));
        let start = Instant::now();
        let t0 = p.wait(1_000_000_000, 1);
        // 200 ms of capture time at speed 10 is 20 ms.
        let t1 = p.wait(1_200_000_000, 1);
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!(t1 - t0, 20_000_000, "publish times follow the schedule exactly");
    }

    #[test]
    fn fixed_rate_schedules_by_messages_sent() {
        let mut p = Pacer::new(pacing(PacingMode::Rate));
        let t0 = p.wait(0, 5);
        let t1 = p.wait(0, 0);
        let t2 = p.wait(0, 5);
        // 5 messages at 1000/s is 5 ms; the heartbeat between counts as one message.
        assert_eq!(t1 - t0, 5_000_000);
        assert_eq!(t2 - t1, 1_000_000);
    }
}
