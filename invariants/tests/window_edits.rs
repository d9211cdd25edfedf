//! Property test of the window target with context edits: random scripts
//! (a fixed-seed generator, so a failure replays) of every dialect, with
//! deletes, rewrites, restores and notes taken between requests; every
//! request sent with edits in force must hold the window invariants
//! (`oceancode_invariants::window::check_window_with`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_invariants::window::{run, script, Op, Ran, Script};

/// xorshift64*: reproducible bytes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn byte(&mut self) -> u8 {
        (self.next() >> 24) as u8
    }
}

/// A random op, mostly answers with tool calls and edits between them.
fn op(rng: &mut Rng) -> Op {
    let b = rng.byte();
    let (x, y, z) = (rng.byte(), rng.byte(), rng.byte());
    match rng.next() % 100 {
        0..=13 => Op::Prompt {
            size: x % 8,
            blocks: y & 1 == 1,
            context: z % 5 == 0,
        },
        14..=53 => Op::Answer {
            reasoning: b & 1 == 1,
            text: b & 2 == 2,
            calls: 1 + x % 3 + u8::from(y % 6 == 0) * 3,
            order: y,
            size: z % 40,
        },
        54..=79 => Op::Edit {
            what: x,
            at: y % 12,
            more: z,
        },
        80..=85 => Op::Cut,
        86..=87 => Op::Rewind(x),
        88..=91 => Op::Usage(u16::from(x) * 40),
        92..=95 => Op::Count,
        _ => Op::TooLong((y & 1 == 1).then_some(z)),
    }
}

#[test]
fn every_request_sent_with_edits_in_force_is_a_valid_window() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut total = Ran::default();
    let mut scripts_edited = 0;
    for i in 0..400 {
        let s = random_script(&mut rng);
        let r = std::panic::catch_unwind(|| run(&s))
            .unwrap_or_else(|_| panic!("script {i} fails: {s:?}"));
        total.requests += r.requests;
        total.edits_taken += r.edits_taken;
        total.edits_refused += r.edits_refused;
        total.edited_requests += r.edited_requests;
        scripts_edited += usize::from(r.edited_requests > 0);
    }
    eprintln!("{total:?}, {scripts_edited} scripts sent requests with edits in force");
    // The test exercises edits, not just the tideline.
    assert!(total.edits_taken >= 100, "{total:?}");
    assert!(total.edits_refused >= 20, "{total:?}");
    assert!(total.edited_requests >= 200, "{total:?}");
    assert!(scripts_edited >= 40, "{scripts_edited}");
}

/// A structured script of this test, `n` ops long.
fn random_script(rng: &mut Rng) -> Script {
    let n = 10 + (rng.next() % 38) as usize;
    let mut ops = vec![Op::Prompt {
        size: 2,
        blocks: false,
        context: false,
    }];
    ops.extend((0..n).map(|_| op(rng)));
    Script::new(
        rng.byte(),
        rng.byte() % 8,
        rng.byte(),
        rng.byte() & 1 == 1,
        ops,
    )
}

#[test]
fn a_script_written_as_bytes_reads_back_as_the_fuzz_target_reads_it() {
    let mut rng = Rng(7);
    for _ in 0..50 {
        let s = random_script(&mut rng);
        let back = script(&s.to_bytes()).expect("it decodes");
        assert_eq!(format!("{back:?}"), format!("{s:?}"));
    }
}

/// `cargo test -p oceancode-invariants --test window_edits -- --ignored`:
/// write scripts with edits in force into the window target's corpus.
#[test]
#[ignore]
fn write_edit_scripts_into_the_window_corpus() {
    let mut rng = Rng(0x5EED);
    let dir = oceancode_invariants::corpus_dir("window");
    let mut n = 0;
    while n < 6 {
        let s = random_script(&mut rng);
        let r = run(&s);
        if r.edited_requests >= 4 && r.edits_taken >= 3 && r.edits_refused >= 1 {
            n += 1;
            std::fs::write(dir.join(format!("edits-{n}")), s.to_bytes()).unwrap();
        }
    }
}
