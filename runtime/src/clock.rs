//! The wall clock that publish and receive times are read from.

use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME): publish times are stamped with it on one
/// host and compared with it on another, so both ends must read the same clock. Saturates far
/// outside the years `i64` nanoseconds cover, and is negative before 1970.
pub fn wall_clock_ns() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |ns| -ns),
    }
}

/// How often [`FastWallClock`] takes the wall clock again: often enough that an NTP slew
/// (at most 500 ppm) moves it by no more than 50 µs between anchors, rarely enough that the
/// system call's cost disappears among millions of reads.
const REANCHOR_NS: u64 = 100_000_000;

/// The wall clock for per-frame stamps at top speed: the TSC read through `quanta` (a few ns,
/// against 20–30 ns for `clock_gettime` in a virtual machine), extended from an anchor taken
/// from [`wall_clock_ns`] every 100 ms, so it follows the system clock's adjustments. Stamps
/// never go backwards, even when an anchor moves the clock back by a little.
#[derive(Debug, Clone)]
pub struct FastWallClock {
    clock: quanta::Clock,
    /// The TSC reading at the anchor.
    anchor_raw: u64,
    /// The wall clock at the anchor, ns.
    anchor_wall: i64,
    /// The last stamp given.
    last: i64,
}

impl Default for FastWallClock {
    fn default() -> Self {
        FastWallClock::new()
    }
}

impl FastWallClock {
    /// A clock anchored now.
    pub fn new() -> FastWallClock {
        let clock = quanta::Clock::new();
        let anchor_raw = clock.raw();
        let anchor_wall = wall_clock_ns();
        FastWallClock { clock, anchor_raw, anchor_wall, last: anchor_wall }
    }

    /// Nanoseconds since the Unix epoch, as [`wall_clock_ns`] would say within microseconds.
    pub fn now_ns(&mut self) -> i64 {
        let raw = self.clock.raw();
        let since = self.clock.delta_as_nanos(self.anchor_raw, raw);
        let now = if since >= REANCHOR_NS {
            self.anchor_raw = raw;
            self.anchor_wall = wall_clock_ns();
            self.anchor_wall
        } else {
            self.anchor_wall.saturating_add(since as i64)
        };
        self.last = self.last.max(now);
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_clock_agrees_with_the_wall_clock_and_never_goes_back() {
        let mut fast = FastWallClock::new();
        let mut previous = fast.now_ns();
        let start = std::time::Instant::now();
        // Across several anchors.
        while start.elapsed() < std::time::Duration::from_millis(350) {
            let before = wall_clock_ns();
            let stamp = fast.now_ns();
            let after = wall_clock_ns();
            assert!(stamp >= previous, "went back: {stamp} after {previous}");
            // Within 1 ms of the system's clock read around it: the TSC is calibrated against it.
            assert!(stamp > before - 1_000_000 && stamp < after + 1_000_000, "{before} {stamp} {after}");
            previous = stamp;
        }
    }
}
