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
