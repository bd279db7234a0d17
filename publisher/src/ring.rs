//! The frame ring as the publisher's threads share it: the hot path fills it, the subscribers'
//! tasks replay from it to a subscriber that resumes, and the retransmission service answers
//! from it.
//!
//! A module of its own, below all three: the engine reports to the metrics, which read the
//! service's counts, so were the ring the engine's, the service and the subscribers' tasks would
//! take it from a module that depends on them.

use mdrelay_proto::relay::FrameRing;
use std::sync::{Arc, Mutex};

/// The retransmission ring, shared by the hot path (which fills it) and the connection tasks
/// (which read it). Each side holds the lock for one frame's copy or one record's copy: never
/// across a wait.
pub type SharedRing = Arc<Mutex<FrameRing>>;

/// Locks the ring; a task that panicked while holding it left it consistent (every update is
/// a single push or mark), so the poison is ignored.
pub fn lock(ring: &SharedRing) -> std::sync::MutexGuard<'_, FrameRing> {
    ring.lock().unwrap_or_else(|e| e.into_inner())
}
