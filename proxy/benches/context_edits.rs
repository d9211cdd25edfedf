//! Applying an edit set to a 2,000-message request (and checking the
//! result), as every request of an edited session does: the goal is
//! ≤ 0.2 ms (docs/benchmarks.md).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: failures panic

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use oceancode_proxy::context::edits::{apply, check, note_raw, EditSet, Facts, Note, Src};
use oceancode_window::{Dialect, RowKind};

const N: u64 = 2_000;

/// A tool loop: an ask, then (call, result) pairs, an ask every 100 rows.
fn line() -> Vec<(RowKind, Vec<u64>, Vec<u64>)> {
    (1..=N)
        .map(|s| {
            if s % 100 == 1 {
                (RowKind::Prompt, vec![], vec![])
            } else if s % 100 == 0 {
                (RowKind::Assistant, vec![], vec![])
            } else if s % 2 == 0 {
                (RowKind::Assistant, vec![s], vec![])
            } else {
                (RowKind::ToolResult, vec![], vec![s - 1])
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rows = line();
    let raws: Vec<String> = (1..=N)
        .map(|s| format!("{{\"role\":\"user\",\"content\":\"message {s}\"}}"))
        .collect();
    let pieces: Vec<(Src, &str)> = raws
        .iter()
        .enumerate()
        .map(|(i, r)| (Src::Row(i as u64 + 1), r.as_str()))
        .collect();
    let facts = |s: u64| {
        let (kind, o, c) = &rows[(s - 1) as usize];
        Facts {
            kind: *kind,
            opens: o,
            closes: c,
            binds_next: false,
        }
    };
    // 400 rows deleted (200 call/result pairs), 50 rewritten, 5 notes.
    let mut set = EditSet::default();
    for s in (10..N - 200).step_by(10) {
        if s % 100 > 2 {
            set.deleted.insert(s);
            set.deleted.insert(s + 1);
        }
    }
    for s in (N - 200..N).filter(|s| s % 2 == 1 && s % 100 != 1).take(50) {
        set.rewritten.insert(
            s,
            format!("{{\"role\":\"user\",\"content\":\"short {s}\"}}"),
        );
    }
    for id in 1..=5u32 {
        set.notes.push(Note {
            id,
            after: u64::from(id) * 300,
            text: "a note".into(),
            raw: note_raw(Dialect::Anthropic, "a note"),
        });
    }
    let out = apply(&set, &pieces, facts);
    check(Dialect::Anthropic, &out, facts).expect("the bench's edit set is valid");
    c.bench_function("context_apply_and_check_2000_messages", |b| {
        b.iter(|| {
            let out = apply(black_box(&set), black_box(&pieces), facts);
            check(Dialect::Anthropic, &out, facts).unwrap();
            black_box(out.len())
        })
    });
    c.bench_function("context_apply_only_2000_messages", |b| {
        b.iter(|| black_box(apply(black_box(&set), black_box(&pieces), facts).len()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
