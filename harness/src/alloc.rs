//! A global allocator that counts the allocations made on threads that ask it to, for tests
//! that assert "no allocation" or "no allocation sized by untrusted input".
//!
//! A test binary installs it with
//! `#[global_allocator] static GLOBAL: CountingAllocator = CountingAllocator;` and measures a
//! closure with [`count_allocations`]. Only the calling thread is counted: the test harness runs
//! threads of its own.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting allocations (and reallocations) on measuring threads.
pub struct CountingAllocator;

thread_local! {
    /// Allocations made on this thread while `measuring` is set.
    static COUNT: Cell<u64> = const { Cell::new(0) };
    /// The largest single request made on this thread while measuring, in bytes.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static MEASURING: Cell<bool> = const { Cell::new(false) };
}

fn note(size: usize) {
    // `try_with`: thread-local storage may already be gone while a thread exits.
    let _ = MEASURING.try_with(|m| {
        if m.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// allocator keeps `System`'s guarantees; the bookkeeping touches only thread-local cells and
// never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded as received; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What [`count_allocations`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allocations {
    /// Allocations and reallocations made.
    pub count: u64,
    /// The largest single request, in bytes.
    pub largest: usize,
}

/// Runs `f` and returns its result with the allocations it made on this thread. Counts only when
/// [`CountingAllocator`] is the global allocator of the running binary.
pub fn count_allocations<R>(f: impl FnOnce() -> R) -> (R, Allocations) {
    COUNT.with(|c| c.set(0));
    LARGEST.with(|l| l.set(0));
    MEASURING.with(|m| m.set(true));
    let result = f();
    MEASURING.with(|m| m.set(false));
    (result, Allocations { count: COUNT.with(Cell::get), largest: LARGEST.with(Cell::get) })
}
