//! When each segment goes out: the capture's own timing scaled, a fixed message rate, or top
//! speed.
//!
//! Every target time is computed from one anchor (the first segment's wall-clock time and
//! capture time), never from the previous send, so sleep error does not accumulate into drift.
//! Waits follow `[pacing] idle` ([`mdrelay_proto::idle`]): the default `backoff` sleeps until
//! just before the target (by how late sleeps have been waking) and spins the rest, so the hot
//! thread takes little CPU between segments and still sends on time; `spin` and `yield` take a
//! core for the lowest jitter; `sleep` wakes when the kernel's timer does.

use crate::config::{Pacing, PacingMode};
use mdrelay_proto::clock::{FastWallClock, wall_clock_ns};
use mdrelay_proto::idle::Idler;
use std::time::{Duration, Instant};

/// Paces segments and stamps their publish time.
#[derive(Debug)]
pub struct Pacer {
    pacing: Pacing,
    anchor: Option<(Instant, i64)>,
    /// Wall clock (ns since the epoch) at the anchor instant, to turn schedules into timestamps.
    anchor_realtime: i64,
    messages: u64,
    /// `original`: the previous segment's capture time, to notice jumps in the capture's clock.
    last_capture: Option<i64>,
    /// Times the schedule started again at a jump in the capture's clock.
    pub reanchors: u64,
    /// How the waits wait.
    idler: Idler,
    /// Stamps at top speed, where a clock read per segment is a measurable share of the work.
    fast_clock: FastWallClock,
    /// The latest a paced segment went out after its time, since [`Pacer::take_lag`].
    worst_lag: Duration,
}

impl Pacer {
    /// A pacer for `pacing`.
    pub fn new(pacing: Pacing) -> Pacer {
        let idler = Idler::new(pacing.idle);
        Pacer {
            pacing,
            anchor: None,
            anchor_realtime: 0,
            messages: 0,
            last_capture: None,
            reanchors: 0,
            idler,
            fast_clock: FastWallClock::new(),
            worst_lag: Duration::ZERO,
        }
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
                // `as u64` saturates: the max_gap check keeps offsets far from the limits anyway.
                let offset = capture_time.saturating_sub(anchor_capture).max(0) as f64 / self.pacing.speed;
                anchor.checked_add(Duration::from_nanos(offset as u64))
            }
            PacingMode::Rate => anchor.checked_add(Duration::from_secs_f64(self.messages as f64 / self.pacing.rate)),
        }
    }

    /// Waits until the segment with `capture_time` and `messages` messages is due, and returns
    /// its publish time: the scheduled time when paced (so a publisher stall shows up as latency
    /// instead of being hidden: no coordinated omission), the current time at top speed.
    pub fn wait(&mut self, capture_time: i64, messages: u64) -> i64 {
        if self.pacing.mode == PacingMode::Original {
            if let Some(last) = self.last_capture {
                // A jump in the capture's clock (a far-future timestamp, a capture spanning days,
                // a clock stepped back) is not waited out: the schedule starts again here.
                let jump = capture_time.saturating_sub(last) as f64 / self.pacing.speed;
                if self.anchor.is_some() && jump.abs() > self.pacing.max_gap * 1e9 {
                    self.anchor = None;
                    self.reanchors += 1;
                    if self.reanchors <= 3 || self.reanchors.is_power_of_two() {
                        tracing::info!(
                            jump_s = jump / 1e9,
                            reanchors = self.reanchors,
                            "capture clock jumped beyond pacing.max_gap; pacing continues from this segment"
                        );
                    }
                }
            }
            self.last_capture = Some(capture_time);
        }
        if self.anchor.is_none() {
            self.anchor = Some((Instant::now(), capture_time));
            self.anchor_realtime = wall_clock_ns();
        }
        let publish_time = match self.target(capture_time) {
            None => self.fast_clock.now_ns(),
            Some(target) => {
                self.idler.wait_until(target);
                // Behind schedule (a slow source, a descheduled thread, a blocking subscriber):
                // the operator sees it as `mdrelay_pub_pacing_lag_seconds`.
                self.worst_lag = self.worst_lag.max(Instant::now().saturating_duration_since(target));
                let (anchor, _) = self.anchor.expect("set above");
                let since = i64::try_from((target - anchor).as_nanos()).unwrap_or(i64::MAX);
                self.anchor_realtime.saturating_add(since)
            }
        };
        // A heartbeat (no messages) weighs as one: otherwise the idle seconds of a capture (9,000
        // heartbeats before a synthetic day's open) would be scheduled at a single instant and
        // go out as one burst, whose tail then reads as latency.
        self.messages += messages.max(1);
        publish_time
    }

    /// The most a paced segment was late since the last call (zero at top speed).
    pub fn take_lag(&mut self) -> Duration {
        std::mem::take(&mut self.worst_lag)
    }

    /// Starts a new pass over the source: the next segment becomes the new anchor, so a loop
    /// does not wait out the gap between the capture's end and its start.
    pub fn rewind(&mut self) {
        if self.pacing.mode == PacingMode::Original {
            self.anchor = None;
            self.last_capture = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pacing(mode: PacingMode) -> Pacing {
        Pacing {
            mode,
            speed: 10.0,
            rate: 1000.0,
            loops: 1,
            max_messages: 0,
            duration: 0.0,
            max_gap: 1.0,
            idle: Default::default(),
        }
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

    #[test]
    fn a_jump_in_the_capture_clock_is_not_waited_out() {
        let mut p = Pacer::new(pacing(PacingMode::Original));
        let start = Instant::now();
        p.wait(0, 1);
        // A century ahead, then back: neither parks the publisher (max_gap is 1 s here).
        p.wait(100 * 365 * 86_400 * 1_000_000_000, 1);
        p.wait(1_000_000, 1);
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(p.reanchors, 2);
        // An ordinary step of the clock is still paced: 100 ms at speed 10 is 10 ms.
        let t0 = p.wait(2_000_000, 1);
        let t1 = p.wait(102_000_000, 1);
        assert_eq!(t1 - t0, 10_000_000);
        assert_eq!(p.reanchors, 2);
    }
}
