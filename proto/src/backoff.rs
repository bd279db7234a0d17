//! Capped exponential backoff with optional jitter, without a clock: the caller asks for the
//! next wait and adds it to its own `now` (ns on any monotonic base).
//!
//! One type for every reconnect loop (a subscriber's stream, a relay's upstream, the recovery
//! client): each wait doubles up to a cap, and [`Backoff::reset`] starts over after a success.
//! Jitter is off unless asked for, so the waits are the plain doubling sequence; with jitter, a
//! wait is shortened by a random part of itself (never lengthened, so the cap still holds), drawn
//! from a generator seeded by the caller, so a test gets the same waits on every run and
//! clients that lost their publisher at the same moment do not all come back at once.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg32;
use std::time::Duration;

/// Nanoseconds of a duration, saturating: durations in settings can be far longer than an `i64`
/// of nanoseconds holds (292 years).
pub fn duration_ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Waits that double from an initial one up to a cap.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial_ns: i64,
    max_ns: i64,
    /// The wait the next [`Backoff::next_wait`] gives, before jitter.
    current_ns: i64,
    /// Part of a wait that jitter may take away, in millionths (0: no jitter).
    jitter_ppm: u32,
    rng: Pcg32,
}

impl Backoff {
    /// Waits from `initial` (capped at `max`) doubling up to `max`, ns; without jitter.
    pub fn new(initial_ns: i64, max_ns: i64) -> Backoff {
        let max_ns = max_ns.max(0);
        let initial_ns = initial_ns.clamp(0, max_ns);
        Backoff { initial_ns, max_ns, current_ns: initial_ns, jitter_ppm: 0, rng: Pcg32::seed_from_u64(0) }
    }

    /// The same waits, each shortened by a random part of up to `fraction` (0 to 1) of itself,
    /// drawn from a generator seeded with `seed`.
    pub fn with_jitter(self, fraction: f64, seed: u64) -> Backoff {
        // Clamped first, so the cast cannot leave the range.
        let jitter_ppm = (fraction.clamp(0.0, 1.0) * 1e6) as u32;
        Backoff { jitter_ppm, rng: Pcg32::seed_from_u64(seed), ..self }
    }

    /// The wait to make now, ns; the one after it is twice as long, up to the cap.
    pub fn next_wait(&mut self) -> i64 {
        let base = self.current_ns;
        self.current_ns = base.saturating_mul(2).min(self.max_ns);
        if self.jitter_ppm == 0 || base == 0 {
            return base;
        }
        // At most `base`: i128 keeps the product exact for any i64.
        let spread = (i128::from(base) * i128::from(self.jitter_ppm) / 1_000_000) as i64;
        base - self.rng.random_range(0..=spread)
    }

    /// The wait [`Backoff::next_wait`] would give before jitter, ns.
    pub fn peek(&self) -> i64 {
        self.current_ns
    }

    /// Starts over from the initial wait (after a success).
    pub fn reset(&mut self) {
        self.current_ns = self.initial_ns;
    }

    /// The initial wait, ns.
    pub fn initial(&self) -> i64 {
        self.initial_ns
    }

    /// The cap, ns.
    pub fn max(&self) -> i64 {
        self.max_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    #[test]
    fn waits_double_up_to_the_cap_and_start_over_on_reset() {
        let mut b = Backoff::new(100 * MS, 1_000 * MS);
        let waits: Vec<i64> = (0..6).map(|_| b.next_wait() / MS).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000]);
        b.reset();
        assert_eq!(b.next_wait(), 100 * MS);
        // An initial wait above the cap is the cap (a reconnect_max below 100 ms).
        let mut low = Backoff::new(100 * MS, 30 * MS);
        assert_eq!((low.next_wait(), low.next_wait()), (30 * MS, 30 * MS));
        // Nothing overflows at the top of the range.
        let mut huge = Backoff::new(i64::MAX / 2 + 1, i64::MAX);
        assert_eq!((huge.next_wait(), huge.next_wait(), huge.next_wait()), (i64::MAX / 2 + 1, i64::MAX, i64::MAX));
        assert_eq!(duration_ns(Duration::MAX), i64::MAX);
    }

    #[test]
    fn jitter_only_shortens_and_a_seed_gives_the_same_waits() {
        let waits = |seed| {
            let mut b = Backoff::new(100 * MS, 1_000 * MS).with_jitter(0.5, seed);
            (0..50).map(|_| b.next_wait()).collect::<Vec<i64>>()
        };
        let a = waits(7);
        assert_eq!(a, waits(7), "the same seed, the same waits");
        assert_ne!(a, waits(8), "another seed, other waits");
        let mut plain = Backoff::new(100 * MS, 1_000 * MS);
        for (i, w) in a.iter().enumerate() {
            let base = plain.next_wait();
            assert!(*w <= base && *w >= base / 2, "wait {i}: {w} against {base}");
        }
        assert!(a.iter().zip(waits(9)).any(|(x, y)| *x != y) && a.iter().any(|w| w % MS != 0), "jitter moves waits");
    }
}
