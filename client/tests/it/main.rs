//! The client library's integration tests in one test binary, a module per area: one link
//! instead of one per file.
//!
//! Tests that start processes hold `serial()` (run alone) or `shared()` (side by side, never
//! beside a serial one), since the areas' tests meet in one process. `alloc` installs the
//! counting allocator for the whole binary; it counts only the thread that asks it to.

mod alloc;
mod async_api;
mod common;
mod errors;
mod examples;
mod hostile;
mod loss;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "nats")]
mod nats_repair;
mod protocol_edges;
mod snapshot;
mod transports;
