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
    replay_with(target, check);
}

/// Every corpus file of `target` through `check`.
fn replay_with(target: &str, check: fn(&[u8])) {
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

/// The window corpus again with the in-band recall tool on in every
/// script: the tools byte-identical, the kept exchanges whole and valid,
/// across cuts, rewinds and too-long retries.
#[test]
fn window_corpus_with_the_recall_tool() {
    replay_with("window", oceancode_invariants::window::check_recall);
}

/// Window scripts from a fixed pseudo-random stream, the recall tool on:
/// more inputs than the corpus holds, the same every run.
#[test]
fn random_window_scripts_with_the_recall_tool() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..1000 {
        let len = 64 + (next() % 448) as usize;
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if catch_unwind(AssertUnwindSafe(|| {
            oceancode_invariants::window::check_recall(&data)
        }))
        .is_err()
        {
            panic!("script {i} fails: {data:?}");
        }
    }
}

#[test]
fn decode_corpus() {
    replay("decode");
}

#[test]
fn usage_corpus() {
    replay("usage");
}

#[test]
fn recall_corpus() {
    replay("recall");
}

/// The memory bound is measured: a 16 MB allocation inside `measure` shows.
#[test]
fn allocations_are_counted() {
    let (_, peak) = oceancode_invariants::alloc::measure(|| vec![1u8; 16 << 20].len());
    assert!(peak.is_some_and(|p| p >= 16 << 20), "{peak:?}");
}

/// The window corpus again with `ledger.compress` on for every script (its
/// third byte, the block, ≥ 128 turns it on): every window stays valid, the
/// kept rows are the request's own but for pointers, and between cuts a
/// window only appends to the one before.
#[test]
fn window_corpus_with_compress() {
    let check = oceancode_invariants::window::check;
    let dir = corpus_dir("window");
    let mut failed = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in &files {
        let mut data = std::fs::read(f).unwrap();
        if data.len() > 2 {
            data[2] |= 0x80;
        }
        if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
            failed.push(f.display().to_string());
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 96, ..Default::default() })]
    /// Tool loops in every dialect whose window grows a few hundred
    /// tokens a step (a 20k line, blocks of 10–40% of it), with parallel
    /// calls, results in any order, reasoning, `tideline now` and too-long
    /// retries, compress on: every window valid, kept rows the request's own
    /// but for pointers, and between cuts only appended.
    #[test]
    fn tool_loops_with_compress(
        dialect in proptest::sample::select(vec![0u8, 1, 2, 0x40]),
        block in 0u8..30,
        zone in 0u8..16,
        steps in proptest::collection::vec((1u8..4, 0u8..255, 1u8..40, 0u8..20), 8..40),
    ) {
        use oceancode_invariants::window::{run, Op, Script};
        let mut ops = vec![Op::Prompt { size: 4, blocks: false, context: false }];
        let mut tokens = 0u32;
        for (k, (calls, order, size, extra)) in steps.into_iter().enumerate() {
            tokens += 600 + u32::from(size) * 20;
            ops.push(Op::Usage(u16::try_from(tokens / 4).unwrap_or(u16::MAX)));
            ops.push(Op::Answer { reasoning: k % 3 == 0, text: k % 2 == 0, calls, order, size });
            match extra {
                0 => ops.push(Op::Cut),
                1 => ops.push(Op::TooLong(None)),
                2 => ops.push(Op::Count),
                _ => {}
            }
        }
        // A block byte ≥ 128 turns compress on (160 + b: a block of 10 + b% of
        // the line); the line byte's low bits set the zone.
        run(&Script::new(dialect, zone, 160 + block, dialect != 0, ops));
    }
}

#[test]
fn the_tool_loops_reach_pruned_windows() {
    use oceancode_invariants::window::{pointers_seen, run, Op, Script};
    let before = pointers_seen();
    let mut ops = vec![Op::Prompt {
        size: 4,
        blocks: false,
        context: false,
    }];
    for k in 0..40u16 {
        if k % 10 == 9 {
            ops.push(Op::Cut);
        }
        ops.push(Op::Usage(200 * (k + 1)));
        ops.push(Op::Answer {
            reasoning: false,
            text: true,
            calls: 2,
            order: 1,
            size: 20,
        });
    }
    for d in [0, 1, 2, 0x40] {
        run(&Script::new(d, 0, 160 + 20, false, ops.clone()));
    }
    assert!(
        pointers_seen() > before,
        "compress pruned in the checked windows"
    );
}
