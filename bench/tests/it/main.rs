//! The bench's integration tests in one test binary, a module per area: one link instead of
//! one per file, and tests of different areas can run side by side.

mod client;
mod loopback;
mod outputs;
mod scale;
mod version;
