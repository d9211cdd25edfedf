//! Every checked-in fuzz corpus file (`fuzz/corpus/<target>/`) through the
//! same check its fuzz target runs, so `cargo test` replays what the fuzzers
//! found (and the crashes they found, once fixed) on stable.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_invariants::{alloc::Counting, corpus_dir, TARGETS};
use std::panic::{catch_unwind, AssertUnwindSafe};

#[global_allocator]
static ALLOC: Counting = Counting;

fn replay(target: &str) {
    let check = TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .map(|(_, c)| *c)
        .expect("a known target");
    let dir = corpus_dir(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 10,
        "{target}: only {} corpus files",
        files.len()
    );
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).expect("a corpus file");
        if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
            failed.push(f.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: {} of {} files fail: {failed:?}",
        failed.len(),
        files.len()
    );
}

#[test]
fn sse_corpus() {
    replay("sse");
}

#[test]
fn splice_corpus() {
    replay("splice");
}

#[test]
fn window_corpus() {
    replay("window");
}

#[test]
fn decode_corpus() {
    replay("decode");
}

#[test]
fn usage_corpus() {
    replay("usage");
}

/// The memory bound is measured: a 16 MB allocation inside `measure` shows.
#[test]
fn allocations_are_counted() {
    let (_, peak) = oceancode_invariants::alloc::measure(|| vec![1u8; 16 << 20].len());
    assert!(peak.is_some_and(|p| p >= 16 << 20), "{peak:?}");
}
