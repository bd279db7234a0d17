//! mdrelay-proto's integration tests in one test binary, a module per area: one link instead of
//! one per file. Every test here is in memory (captures, codecs, the relay machines on byte
//! slices), so the areas run side by side freely.

use mdrelay_harness::alloc::CountingAllocator;

// Counts allocations on threads that measure (`count_allocations`); the others are not counted,
// so tests that assert "no allocation" run beside any other.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

mod alloc_free;
mod client_captures;
mod client_machines_fuzz;
mod corrupt_inputs;
mod filtered_decode;
mod formats;
mod json_codec;
mod protocol_doc;
mod recovery_props;
mod shared_captures;
mod strategies;
mod synthetic;
