//! The shared-data helpers live in the workspace's test harness; test files that import them
//! as `common::…` get them from here.

pub use mdrelay_harness::iex_data;
