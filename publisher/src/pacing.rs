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
use mdrelay_proto::backoff::duration_ns;
use mdrelay_proto::clock::{FastWallClock, wall_clock_ns};
use mdrelay_proto::idle::Idler;
use mdrelay_proto::relay::server::{PaceMode, PaceSchedule};
use std::time::{Duration, Instant};

/// Paces segments and stamps their publish time: the schedule
/// ([`mdrelay_proto::relay::server::PaceSchedule`]) says when, this waits.
#[derive(Debug)]
pub struct Pacer {
    schedule: PaceSchedule,
    /// The schedule's monotonic clock counts ns from here.
    epoch: Instant,
    /// How the waits wait.
    idler: Idler,
    /// Stamps at top speed, where a clock read per segment is a measurable share of the work.
    fast_clock: FastWallClock,
    /// The latest a paced segment went out after its time, since [`Pacer::take_lag`].
    worst_lag: Duration,
}

/// The schedule's mode for the configured pacing.
pub fn pace_mode(pacing: &Pacing) -> PaceMode {
    match pacing.mode {
        PacingMode::TopSpeed => PaceMode::TopSpeed,
        PacingMode::Original => PaceMode::Original { speed: pacing.speed, max_gap_s: pacing.max_gap },
        PacingMode::Rate => PaceMode::Rate { per_second: pacing.rate },
    }
}

impl Pacer {
    /// A pacer for `pacing`.
    pub fn new(pacing: Pacing) -> Pacer {
        Pacer {
            schedule: PaceSchedule::new(pace_mode(&pacing)),
            epoch: Instant::now(),
            idler: Idler::new(pacing.idle),
            fast_clock: FastWallClock::new(),
            worst_lag: Duration::ZERO,
        }
    }

    /// Times the schedule started again at a jump in the capture's clock.
    pub fn reanchors(&self) -> u64 {
        self.schedule.reanchors()
    }

    fn now(&self) -> i64 {
        duration_ns(self.epoch.elapsed())
    }

    fn instant(&self, ns: i64) -> Instant {
        self.epoch + Duration::from_nanos(ns.max(0).unsigned_abs())
    }

    /// The time the next segment is due, if it is in the future (so pending output can be
    /// flushed before waiting); `None` at top speed or when already late.
    pub fn due(&self, capture_time: i64) -> Option<Instant> {
        self.schedule.due(capture_time, self.now()).map(|target| self.instant(target))
    }

    /// Waits until the segment with `capture_time` and `messages` messages is due, and returns
    /// its publish time: the scheduled time when paced, the current time at top speed.
    pub fn wait(&mut self, capture_time: i64, messages: u64) -> i64 {
        let epoch = self.epoch;
        let paced = self.schedule.next(capture_time, messages, || (duration_ns(epoch.elapsed()), wall_clock_ns()));
        if let Some(jump_s) = paced.reanchored {
            let reanchors = self.schedule.reanchors();
            if reanchors <= 3 || reanchors.is_power_of_two() {
                tracing::info!(
                    jump_s,
                    reanchors,
                    "capture clock jumped beyond pacing.max_gap; pacing continues from this segment"
                );
            }
        }
        match (paced.target, paced.publish_time) {
            (Some(target), Some(publish_time)) => {
                let target = self.instant(target);
                self.idler.wait_until(target);
                // Behind schedule (a slow source, a descheduled thread, a blocking subscriber):
                // the operator sees it as `mdrelay_pub_pacing_lag_seconds`.
                self.worst_lag = self.worst_lag.max(Instant::now().saturating_duration_since(target));
                publish_time
            }
            _ => self.fast_clock.now_ns(),
        }
    }

    /// The most a paced segment was late since the last call (zero at top speed).
    pub fn take_lag(&mut self) -> Duration {
        std::mem::take(&mut self.worst_lag)
    }

    /// Starts a new pass over the source: the next segment becomes the new anchor, so a loop
    /// does not wait out the gap between the capture's end and its start.
    pub fn rewind(&mut self) {
        self.schedule.rewind();
    }
}

#[cfg(test)]
mod tests {
    //! The schedule itself is tested on a fake clock in `mdrelay_proto::relay::server`; here,
    //! that the configuration reaches it, and that top speed never waits.

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
    fn the_configured_mode_reaches_the_schedule() {
        assert_eq!(pace_mode(&pacing(PacingMode::TopSpeed)), PaceMode::TopSpeed);
        assert_eq!(pace_mode(&pacing(PacingMode::Original)), PaceMode::Original { speed: 10.0, max_gap_s: 1.0 });
        assert_eq!(pace_mode(&pacing(PacingMode::Rate)), PaceMode::Rate { per_second: 1000.0 });
    }

    #[test]
    fn top_speed_stamps_the_current_time_and_is_never_due() {
        let mut p = Pacer::new(pacing(PacingMode::TopSpeed));
        let before = wall_clock_ns();
        let t0 = p.wait(0, 1);
        // A day of capture time later: still not due, stamped now.
        assert_eq!(p.due(86_400 * 1_000_000_000), None);
        let t1 = p.wait(86_400 * 1_000_000_000, 1);
        let after = wall_clock_ns();
        // The fast clock may be a little coarse; a day's wait would be far outside this.
        let slack = 1_000_000_000;
        assert!(t0 >= before - slack && t1 <= after + slack && t1 >= t0, "{before} {t0} {t1} {after}");
        assert_eq!(p.take_lag(), Duration::ZERO);
    }
}
