//! Round trips measured from subscribers' echoes, checked against the frames actually sent.

use hdrhistogram::Histogram;
use mdrelay_proto::latency::{LatencySummary, latency_histogram};
use mdrelay_proto::relay::echo::SentLog;
use mdrelay_runtime::clock::wall_clock_ns;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

/// Frames whose publish times are kept for checking echoes: at a million frames a second, a
/// quarter of a second's worth, far more than any round trip worth measuring takes.
pub const SENT_LOG_FRAMES: usize = 1 << 18;

/// Round-trip times from echoed publish timestamps, in ns.
pub struct RoundTrips {
    histogram: Mutex<Histogram<u64>>,
}

impl Default for RoundTrips {
    fn default() -> Self {
        RoundTrips { histogram: Mutex::new(latency_histogram()) }
    }
}

impl RoundTrips {
    /// Records the round trip of a frame published at `publish_time` (already checked to be a
    /// frame this publisher sent, so the difference is a real round trip; it saturates anyway).
    pub fn record(&self, publish_time: i64) {
        let rtt = wall_clock_ns().saturating_sub(publish_time).max(1);
        let rtt = u64::try_from(rtt).unwrap_or(1);
        self.histogram.lock().unwrap_or_else(|e| e.into_inner()).saturating_record(rtt);
    }

    /// The percentiles so far.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary::of(&self.histogram.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What the TCP tasks and the UDP echo reader share for echoes.
pub struct Echoes {
    /// Publish times of recent frames, written by the hot path.
    pub sent: SentLog,
    /// Round trips of echoes that passed their check.
    pub round_trips: RoundTrips,
    /// Echoes that failed their check.
    pub rejected: AtomicU64,
}

impl Default for Echoes {
    fn default() -> Self {
        Echoes { sent: SentLog::new(SENT_LOG_FRAMES), round_trips: RoundTrips::default(), rejected: AtomicU64::new(0) }
    }
}
