//! A counting global allocator, to measure what a check allocates at its
//! peak (the decode target's memory bound). A binary opts in with
//! `#[global_allocator] static A: Counting = Counting;`; without it
//! [`measure`] reports `None`. Counters are per thread, so parallel tests
//! do not see each other.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    static ON: Cell<bool> = const { Cell::new(false) };
}

/// The system allocator, counting the live bytes of each thread.
pub struct Counting;

fn grow(n: usize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get().saturating_add(n);
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
    let _ = ON.try_with(|o| o.set(true));
}

fn shrink(n: usize) {
    let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(n)));
}

// SAFETY: every call is forwarded to `System` with the same arguments; the
// counters are const-initialised thread-locals without destructors, so
// touching them never allocates or re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        shrink(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            shrink(layout.size());
            grow(new_size);
        }
        p
    }
}

/// Run `f` and return its result with the most bytes it had allocated at
/// once on this thread (above what was live when it started), or `None`
/// when the binary does not count allocations.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Option<usize>) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let r = f();
    let peak = PEAK.with(Cell::get);
    let counting = ON.with(Cell::get);
    (r, counting.then(|| peak.saturating_sub(start)))
}
