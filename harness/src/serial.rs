//! Which process-heavy tests of a test binary run at once.
//!
//! A package's integration tests are one binary (a module per area), so tests of different
//! areas meet in one process. A test that drives streams hard runs alone ([`serial`]): two
//! cores carry its publishers and subscribers, and paced UDP streams must not starve each other.
//! Any other test that starts processes takes [`shared`]: such tests run side by side, as they
//! did when each area was a binary of its own, but never beside a serial one.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static LOCK: RwLock<()> = RwLock::new(());

/// Held for a test's duration: no other test holding [`serial`] or [`shared`] runs meanwhile. A
/// test that panicked does not poison it.
pub fn serial() -> RwLockWriteGuard<'static, ()> {
    LOCK.write().unwrap_or_else(|e| e.into_inner())
}

/// Held for a test's duration: other tests holding it may run meanwhile, a [`serial`] one may
/// not.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    LOCK.read().unwrap_or_else(|e| e.into_inner())
}
