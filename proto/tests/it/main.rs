//! mdrelay-proto's integration tests in one test binary, a module per area: the relay machines
//! fed the shared captures and random schedules on byte slices, recovery's properties, and the
//! protocol document's examples checked against the code.

// The crate's code does no I/O (its clippy.toml); its tests read the shared captures and the
// protocol document they check the code against.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use mdrelay_harness::alloc::CountingAllocator;

// Counts allocations on threads that measure (`count_allocations`); the others are not counted,
// so tests that assert "no allocation" run beside any other.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

mod client_captures;
mod client_machines_fuzz;
mod protocol_doc;
mod recovery_props;
