//! The subscriber's integration tests in one test binary, a module per area: one link instead of
//! one per file, and tests of different areas can run side by side.
//!
//! Tests that start processes hold `serial()` (run alone) or `shared()` (side by side, never
//! beside a serial one), since the areas' tests now meet in one process.

mod common;

mod books;
mod cli;
mod exit_status;
mod files;
mod hostile;
mod hostile_tcp;
mod nats;
mod nats_behind;
mod readme;
mod record;
mod recovery;
mod tcp;
mod udp;
mod version;
