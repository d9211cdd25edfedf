//! Fuzz target: see `oceancode_invariants::recall`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oceancode_invariants::recall::check(data));
