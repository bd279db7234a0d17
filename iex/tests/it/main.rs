//! mdrelay-iex's integration tests in one test binary, a module per area: the shared captures
//! read against the independent reader's outputs, corrupt and truncated captures, synthetic days.

use mdrelay_harness::alloc::CountingAllocator;

// Counts allocations on threads that measure (`count_allocations`); the others are not counted,
// so tests that assert "no allocation" run beside any other.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

mod books;
mod corrupt_inputs;
mod shared_captures;
mod synthetic;
