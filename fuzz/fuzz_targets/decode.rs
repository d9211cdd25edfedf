//! Fuzz target: see `oceancode_invariants::decode` (allocations counted, so
//! the tap's memory bound is checked).
#![no_main]

#[global_allocator]
static ALLOC: oceancode_invariants::alloc::Counting = oceancode_invariants::alloc::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| oceancode_invariants::decode::check(data));
