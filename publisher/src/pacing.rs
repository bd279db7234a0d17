//! When each segment goes out: the capture's own timing scaled, a fixed message rate, or top
//! speed.
//!
//! Every target time is computed from one anchor (the first segment's wall-clock time and
//! capture time), never from the previous send, so sleep error does not accumulate into drift.
//! Waits follow `[pacing] idle` ([`mdrelay_runtime::idle`]): the default `backoff` sleeps until
//! just before the target (by how late sleeps have been waking) and spins the rest, so the hot
//! thread takes little CPU between segments and still sends on time; `spin` and `yield` take a
//! core for the lowest jitter; `sleep` wakes when the kernel's timer does.
//!
//! Waits come in duty cycles (`[pacing] duty_cycle`): a wake-up sends every segment due within
//! the duty window, instead of one sleep per segment, since a wake-up costs more CPU than
//! sending a segment (tens of microseconds on a virtual machine's timer). Under `backoff` the
//! window is at least the learned lateness, as a wait shorter than that cannot be slept and
//! would be spun. A segment sent early is stamped when it went out, so latency stays honest,
//! and how early is reported (`mdrelay_pub_pacing_lead_seconds`): never more than the window.
//! A duty cycle of 0 sends each segment at its time.

use crate::config::{Pacing, PacingMode};
use mdrelay_proto::backoff::duration_ns;
use mdrelay_proto::relay::server::{PaceMode, PaceSchedule};
use mdrelay_runtime::clock::{FastWallClock, wall_clock_ns};
use mdrelay_runtime::idle::Idler;
use mdrelay_runtime::idle::Profile;
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
    /// The earliest a paced segment went out before its time, since [`Pacer::take_lead`].
    worst_lead: Duration,
    /// `[pacing] duty_cycle`.
    duty_cycle: Duration,
}

/// The schedule's mode for the configured pacing.
pub fn pace_mode(pacing: &Pacing) -> PaceMode {
    match pacing.mode {
        PacingMode::TopSpeed => PaceMode::TopSpeed,
        PacingMode::Original => PaceMode::Original { speed: pacing.speed, max_gap_s: pacing.max_gap.as_secs_f64() },
        PacingMode::Rate => PaceMode::Rate { per_second: pacing.rate },
    }
}

impl Pacer {
    /// A pacer for `pacing`, whose idle strategy and duty cycle left out are `profile`'s.
    pub fn new(pacing: Pacing, profile: Profile) -> Pacer {
        Pacer {
            schedule: PaceSchedule::new(pace_mode(&pacing)),
            epoch: Instant::now(),
            idler: Idler::new(pacing.idle(profile)),
            fast_clock: FastWallClock::new(),
            worst_lag: Duration::ZERO,
            worst_lead: Duration::ZERO,
            duty_cycle: pacing.duty_cycle(profile),
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

    /// How early a segment may go out: it is sent in the current duty cycle if due within this.
    pub fn window(&self) -> Duration {
        self.idler.duty_window(self.duty_cycle)
    }

    /// The time the next segment is due, if it is beyond the current duty cycle (so pending
    /// output can be flushed before waiting); `None` at top speed or when it goes out now.
    pub fn due(&self, capture_time: i64) -> Option<Instant> {
        let window = duration_ns(self.window());
        self.schedule.due(capture_time, || self.now().saturating_add(window)).map(|target| self.instant(target))
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
                let _ = self.idler.wait_until_within(target, self.window());
                let now = Instant::now();
                match target.checked_duration_since(now) {
                    // In this duty cycle, ahead of its time: stamped when it goes out.
                    Some(lead) => {
                        self.worst_lead = self.worst_lead.max(lead);
                        publish_time.saturating_sub(duration_ns(lead))
                    }
                    // Behind schedule (a slow source, a descheduled thread, a blocking
                    // subscriber): the operator sees it as `mdrelay_pub_pacing_lag_seconds`.
                    None => {
                        self.worst_lag = self.worst_lag.max(now.saturating_duration_since(target));
                        publish_time
                    }
                }
            }
            _ => self.fast_clock.now_ns(),
        }
    }

    /// The most a paced segment was late since the last call (zero at top speed).
    pub fn take_lag(&mut self) -> Duration {
        std::mem::take(&mut self.worst_lag)
    }

    /// The most a paced segment went out early since the last call (zero at top speed); at
    /// most [`Pacer::window`] at the time.
    pub fn take_lead(&mut self) -> Duration {
        std::mem::take(&mut self.worst_lead)
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
            max_gap: Duration::from_secs(1),
            idle: Some(Default::default()),
            duty_cycle: Some(0.0),
            ..Pacing::default()
        }
    }

    #[test]
    fn the_configured_mode_reaches_the_schedule() {
        assert_eq!(pace_mode(&pacing(PacingMode::TopSpeed)), PaceMode::TopSpeed);
        assert_eq!(pace_mode(&pacing(PacingMode::Original)), PaceMode::Original { speed: 10.0, max_gap_s: 1.0 });
        assert_eq!(pace_mode(&pacing(PacingMode::Rate)), PaceMode::Rate { per_second: 1000.0 });
    }

    #[test]
    fn a_duty_cycle_sends_what_is_due_within_it_early_stamped_when_it_went_out() {
        // 200 segments at 100,000/s: 2 ms of schedule, 10 µs apart, in duty cycles of 500 µs.
        let mut p = Pacer::new(
            Pacing { rate: 100_000.0, duty_cycle: Some(0.000_5), ..pacing(PacingMode::Rate) },
            Profile::default(),
        );
        let window = p.window();
        assert!(window >= Duration::from_micros(500), "{window:?}");
        let start = Instant::now();
        let first = p.wait(0, 1);
        let mut previous = first;
        let mut sent_at = vec![];
        for i in 1..200 {
            let scheduled = first + i * 10_000;
            let stamp = p.wait(0, 1);
            let elapsed = duration_ns(start.elapsed());
            sent_at.push(elapsed);
            // Never stamped later than it went out, nor before its time less the window.
            assert!(stamp <= scheduled, "segment {i}: stamped {stamp} after its schedule {scheduled}");
            assert!(stamp >= scheduled - duration_ns(window), "segment {i}: {} ns early", scheduled - stamp);
            assert!(stamp >= previous, "stamps go forward");
            previous = stamp;
            // Nor sent before its time less the window, by the monotonic clock.
            assert!(elapsed >= i * 10_000 - duration_ns(window), "segment {i} sent at {elapsed} ns");
        }
        let lead = p.take_lead();
        assert!(lead > Duration::ZERO && lead <= window, "lead {lead:?}, window {window:?}");
        // Sent in bursts: many segments go out within a microsecond of the one before.
        let bursts = sent_at.windows(2).filter(|w| w[1] - w[0] > 5_000).count();
        assert!(bursts < 100, "{bursts} gaps over 5 µs among 200 segments 10 µs apart: not batched");
    }

    #[test]
    fn without_a_duty_cycle_each_segment_goes_at_its_time() {
        use mdrelay_runtime::idle::IdleStrategy;
        for idle in [IdleStrategy::Spin, IdleStrategy::Backoff] {
            let mut p = Pacer::new(
                Pacing { rate: 100_000.0, idle: Some(idle), ..pacing(PacingMode::Rate) },
                Profile::default(),
            );
            assert_eq!(p.window(), Duration::ZERO);
            let start = Instant::now();
            let first = p.wait(0, 1);
            for i in 1..50 {
                assert_eq!(p.wait(0, 1), first + i * 10_000, "{idle}: a paced segment is stamped with its schedule");
                assert!(duration_ns(start.elapsed()) >= i * 10_000, "{idle}: segment {i} went early");
            }
            assert_eq!(p.take_lead(), Duration::ZERO);
        }
    }

    #[test]
    fn top_speed_stamps_the_current_time_and_is_never_due() {
        let mut p = Pacer::new(pacing(PacingMode::TopSpeed), Profile::default());
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
