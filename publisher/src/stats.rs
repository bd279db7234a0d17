//! What the publisher reports: totals sent, round trips measured from subscribers' echoes.

use crate::pacing::realtime_ns;
use hdrhistogram::Histogram;
use std::sync::Mutex;

/// Round-trip times from echoed publish timestamps, in ns.
pub struct RoundTrips {
    histogram: Mutex<Histogram<u64>>,
}

impl Default for RoundTrips {
    fn default() -> Self {
        RoundTrips { histogram: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")) }
    }
}

/// Percentiles of a latency histogram, ns.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, PartialEq, Eq)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
    /// Largest.
    pub max: u64,
}

impl LatencySummary {
    /// The summary of `h`.
    pub fn of(h: &Histogram<u64>) -> LatencySummary {
        LatencySummary {
            count: h.len(),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            p9999: h.value_at_quantile(0.9999),
            max: h.max(),
        }
    }
}

impl RoundTrips {
    /// Records the round trip of a frame published at `publish_time`.
    pub fn record(&self, publish_time: i64) {
        let rtt = (realtime_ns() - publish_time).max(1) as u64;
        self.histogram.lock().expect("histogram lock").saturating_record(rtt);
    }

    /// The percentiles so far.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary::of(&self.histogram.lock().expect("histogram lock"))
    }
}
