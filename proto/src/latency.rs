//! Latency histograms and their percentiles, as both programs report them.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Largest latency the histograms hold, in ns (an hour); larger values are clamped to it.
pub const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// A latency histogram in ns from 1 ns to an hour with 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("static histogram bounds are valid")
}

/// Percentiles of a latency histogram in ns; `null` (in JSON) when nothing was recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50: Option<u64>,
    /// 90th percentile.
    pub p90: Option<u64>,
    /// 99th percentile.
    pub p99: Option<u64>,
    /// 99.9th percentile.
    pub p999: Option<u64>,
    /// 99.99th percentile.
    pub p9999: Option<u64>,
    /// Largest.
    pub max: Option<u64>,
}

impl LatencySummary {
    /// The summary of `h`.
    pub fn of(h: &Histogram<u64>) -> LatencySummary {
        let q = |q: f64| (!h.is_empty()).then(|| h.value_at_quantile(q));
        LatencySummary {
            count: h.len(),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
            p9999: q(0.9999),
            max: (!h.is_empty()).then(|| h.max()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_histogram_has_no_percentiles_and_huge_values_are_clamped() {
        let mut h = latency_histogram();
        assert_eq!(LatencySummary::of(&h), LatencySummary::default());
        h.saturating_record(u64::MAX);
        h.saturating_record(1_000);
        let s = LatencySummary::of(&h);
        assert_eq!(s.count, 2);
        assert!(s.p50.unwrap() >= 999 && s.p50.unwrap() <= 1_001);
        assert!(s.max.unwrap() >= MAX_LATENCY_NS && s.max.unwrap() < MAX_LATENCY_NS + MAX_LATENCY_NS / 500);
    }
}
