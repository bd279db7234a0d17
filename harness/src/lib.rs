//! Process harness for mdrelay's tests and benchmarks.
//!
//! - [`alloc`]: a counting global allocator, for tests that assert what is (not) allocated.

#![deny(unsafe_code)]
#![warn(missing_docs)]

#[allow(unsafe_code)]
pub mod alloc;
