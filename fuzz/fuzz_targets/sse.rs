//! Fuzz target: see `oceancode_invariants::sse`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oceancode_invariants::sse::check(data));
