//! One budget for warnings about bad input, shared by everything in a process that reads files or
//! networks: the network decides how much bad input arrives, so at most a few warnings of each
//! kind are logged per minute, and the rest are counted. A kind that goes quiet says so once per
//! minute with the number it held back, and reports carry the total.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Warnings of one kind logged per window before the rest are only counted.
pub const PER_WINDOW: u32 = 10;
/// The budget's window.
pub const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Kind {
    name: &'static str,
    window_start: Instant,
    logged: u32,
    suppressed: u64,
}

#[derive(Debug)]
struct Budget {
    kinds: Vec<Kind>,
    suppressed_total: u64,
}

/// A time-windowed warning budget per kind of warning.
#[derive(Debug)]
pub struct WarnBudget {
    per_window: u32,
    window: Duration,
    state: Mutex<Budget>,
}

/// The process's budget.
pub static WARNINGS: WarnBudget = WarnBudget::new(PER_WINDOW, WINDOW);

/// Whether a warning of `kind` may be logged now, from the process's budget.
pub fn allow(kind: &'static str) -> bool {
    WARNINGS.allow(kind)
}

/// Warnings the process's budget held back so far.
pub fn suppressed() -> u64 {
    WARNINGS.suppressed()
}

impl WarnBudget {
    /// A budget of `per_window` warnings of each kind per `window`.
    pub const fn new(per_window: u32, window: Duration) -> WarnBudget {
        WarnBudget { per_window, window, state: Mutex::new(Budget { kinds: Vec::new(), suppressed_total: 0 }) }
    }

    /// Whether a warning of `kind` may be logged now.
    pub fn allow(&self, kind: &'static str) -> bool {
        self.allow_at(kind, Instant::now())
    }

    /// Whether a warning of `kind` may be logged at `now`.
    pub fn allow_at(&self, kind: &'static str, now: Instant) -> bool {
        // A panic elsewhere while holding the lock leaves plain counters: still usable.
        let mut budget = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Budget { kinds, suppressed_total } = &mut *budget;
        let index = match kinds.iter().position(|k| k.name == kind) {
            Some(i) => i,
            None => {
                kinds.push(Kind { name: kind, window_start: now, logged: 0, suppressed: 0 });
                kinds.len() - 1
            }
        };
        let k = &mut kinds[index];
        if now.saturating_duration_since(k.window_start) >= self.window {
            if k.suppressed > 0 {
                tracing::warn!(
                    kind,
                    suppressed = k.suppressed,
                    window_s = self.window.as_secs(),
                    "warnings of this kind were counted, not logged"
                );
            }
            k.window_start = now;
            k.logged = 0;
            k.suppressed = 0;
        }
        if k.logged < self.per_window {
            k.logged += 1;
            return true;
        }
        if k.suppressed == 0 {
            tracing::warn!(
                kind,
                limit = self.per_window,
                window_s = self.window.as_secs(),
                "further warnings of this kind are counted, not logged, for the rest of this window"
            );
        }
        k.suppressed += 1;
        *suppressed_total += 1;
        false
    }

    /// Warnings held back so far.
    pub fn suppressed(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).suppressed_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_gets_its_budget_per_window() {
        let budget = WarnBudget::new(3, Duration::from_secs(60));
        let t0 = Instant::now();
        let allowed = (0..100).filter(|_| budget.allow_at("flood", t0)).count();
        assert_eq!(allowed, 3);
        assert!(budget.allow_at("other", t0), "kinds are counted apart");
        assert_eq!(budget.suppressed(), 97);
        assert!(!budget.allow_at("flood", t0 + Duration::from_secs(59)));
        assert!(budget.allow_at("flood", t0 + Duration::from_secs(60)), "a new window");
        assert_eq!(budget.suppressed(), 98);
    }
}
