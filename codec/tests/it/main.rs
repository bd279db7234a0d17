//! mdrelay-codec's integration tests in one test binary, a module per area: every format's round
//! trip, filtered decoding, JSON's own rules, and no allocation per frame once warm.

use mdrelay_harness::alloc::CountingAllocator;

// Counts allocations on threads that measure (`count_allocations`); the others are not counted,
// so tests that assert "no allocation" run beside any other.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

mod alloc_free;
mod filtered_decode;
mod formats;
mod json_codec;
mod strategies;
