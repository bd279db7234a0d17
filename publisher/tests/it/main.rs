//! The publisher's integration tests in one test binary, a module per area: one link instead of
//! one per file, and tests of different areas can run side by side.
//!
//! Tests that start processes hold `serial()` (run alone) or `shared()` (side by side, never
//! beside a serial one), since the areas' tests now meet in one process.

mod chain;
mod cli;
mod common;
mod config;
mod hostile;
mod idle;
mod live_feed;
mod logs;
mod lossy_hosts;
mod metrics;
mod metrics_hostile;
mod nats;
mod nats_chain;
mod nats_cluster;
mod nats_edge_behind;
mod nats_hostile;
mod nats_hosts;
mod nats_protection;
mod progress;
mod protection;
mod relay;
mod reload;
mod resume_load;
mod retransmit;
mod two_hosts;
mod version;
