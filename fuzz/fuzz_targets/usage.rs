//! Fuzz target: see `oceancode_invariants::usage`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oceancode_invariants::usage::check(data));
