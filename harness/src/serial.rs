//! One process-heavy test at a time within a test binary.

use std::sync::{Mutex, MutexGuard};

/// Held for a test's duration: tests that start publishers and subscribers share two cores, and
/// paced UDP streams must not starve each other. A test that panicked does not poison it.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
