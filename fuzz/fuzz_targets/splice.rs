//! Fuzz target: see `oceancode_invariants::splice`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oceancode_invariants::splice::check(data));
