//! Fuzz target: see `oceancode_invariants::window`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oceancode_invariants::window::check(data));
