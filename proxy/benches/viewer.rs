//! The session viewer on a 10,000-row session (5,000 tool steps, a cut
//! every 50, each step's record of what it sent as the proxy writes it):
//! what serving its page costs the server (reading the session through
//! `LedgerRead`, resolving the model view of the latest step and of an
//! early one, rendering the HTML), and how large the pages are.
//!
//! `cargo bench -p oceancode-proxy --bench viewer` (not part of `cargo test`);
//! the page weights are printed once before the timings (`VIEWER_DUMP=DIR`
//! writes the pages there).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: failures panic

use criterion::{criterion_group, criterion_main, Criterion};
use oceancode_ledger::store::LedgerWrite;
use oceancode_ledger::store::{Store, StoreOptions};
use oceancode_proxy::ui::{self, pages};
use oceancode_window::{
    Dialect, Event, Row, RowKind, SentPiece, SentWindow, SessionMeta, StepDetail, Usage,
};
use std::time::{Duration, Instant};

const ID: &str = "bench-viewer-10k";
const STEPS: u64 = 5_000;

fn meta() -> SessionMeta {
    SessionMeta {
        id: ID.into(),
        client: "claude-code".into(),
        client_session: Some("bench".into()),
        dialect: Dialect::Anthropic,
        model: "claude-sonnet-4-5".into(),
        parent: None,
        parent_seq: None,
        created_ms: 1_790_000_000_000,
        last_ms: 1_790_000_000_000 + STEPS as i64 * 1000,
    }
}

fn row(seq: u64, kind: RowKind, role: &str, raw: String, step: u32) -> Row {
    Row {
        seq,
        role: role.into(),
        kind,
        tokens: (raw.len() / 4) as u32,
        raw: raw.into(),
        turn: 1,
        step,
        branch: 0,
        from_response: false,
    }
}

/// A store holding one session: a prompt, then 5,000 answers with a tool
/// call and their results (~1.5 KB each), a cut every 50 steps.
fn store(dir: &std::path::Path) -> Store {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    store.submit(Event::Session(meta())).unwrap();
    let prompt = serde_json::json!({"role":"user","content":"Fix the failing tests <script>alert(1)</script>"});
    store
        .submit(Event::Rows {
            session: ID.into(),
            rows: vec![row(1, RowKind::Prompt, "user", prompt.to_string(), 1)],
        })
        .unwrap();
    let result: String = (0..20)
        .map(|i| format!("test module_{i} ... ok (checked the tideline fixture)\n"))
        .collect();
    let mut seq = 2;
    // What each step sent, as the proxy records it: the stub (its text on
    // the step that cut), then every row from the window's start.
    let mut upto = 0u64;
    let mut stub_step = 0u32;
    for s in 1..STEPS {
        let step = s as u32;
        let a = serde_json::json!({"role":"assistant","content":[
            {"type":"text","text":format!("Step {s}: running the tests again.")},
            {"type":"tool_use","id":format!("toolu_{s}"),"name":"Bash","input":{"command":"cargo test"}}]});
        let r = serde_json::json!({"role":"user","content":[
            {"type":"tool_result","tool_use_id":format!("toolu_{s}"),"content":result}]});
        let rows = vec![
            row(seq, RowKind::Assistant, "assistant", a.to_string(), step),
            row(
                seq + 1,
                RowKind::ToolResult,
                "user",
                r.to_string(),
                step + 1,
            ),
        ];
        seq += 2;
        store
            .submit(Event::Rows {
                session: ID.into(),
                rows,
            })
            .unwrap();
        let ts = 1_790_000_000_000 + s as i64 * 1000;
        let mut sent = SentWindow {
            tail: seq - 1,
            ..SentWindow::default()
        };
        if s % 50 == 0 {
            upto = seq - 40;
            stub_step = step;
            let state: String = (0..40)
                .map(|i| format!("\n- src/module_{i}.rs (edit t01·{})", seq - 60 + i))
                .collect();
            let text = format!(
                "[Earlier content of this session is past the tideline: every row up to seq {upto} left this window.]\n\n{}{state}",
                oceancode_ledger::state_block::HEAD
            );
            sent.stub = Some(
                serde_json::json!({"role":"user","content":[{"type":"text","text":text}]})
                    .to_string(),
            );
        } else if upto > 0 {
            sent.stub_step = stub_step;
        }
        if upto > 0 {
            sent.upto = upto;
            sent.pieces.push(SentPiece::Stub);
            sent.pieces.push(SentPiece::Rows(1, 1));
            sent.pieces.push(SentPiece::Rows(upto + 1, seq - 1));
        } else {
            sent.pieces.push(SentPiece::Rows(1, seq - 1));
        }
        if s % 50 == 0 {
            store
                .submit(Event::Cut {
                    session: ID.into(),
                    upto_seq: seq - 40,
                    gauge: 81_000,
                    line: 80_000,
                    ts_ms: ts - 1,
                })
                .unwrap();
        }
        store
            .submit(Event::Step {
                session: ID.into(),
                step,
                model: "claude-sonnet-4-5".into(),
                status: 200,
                usage: Usage {
                    input: 3,
                    output: 120,
                    cache_read: 40_000 + (s % 50) * 800,
                    cache_write: 700,
                },
                window_rows: 80,
                ts_ms: ts,
                error: None,
                detail: Box::new(StepDetail {
                    sent: Some(sent),
                    ..StepDetail::default()
                }),
            })
            .unwrap();
    }
    store.settle_blocking().unwrap();
    store
}

fn serve(store: &Store, view: pages::View) -> String {
    let d = ui::session_data(store, ID, false).unwrap().unwrap();
    let q = pages::PageQuery {
        view,
        page: None,
        seq: None,
        step: None,
    };
    pages::session_page(&d, q, &ui::price)
}

fn serve_step(store: &Store, step: u32) -> String {
    let d = ui::session_data(store, ID, false).unwrap().unwrap();
    let q = pages::PageQuery {
        view: pages::View::Model,
        page: None,
        seq: None,
        step: Some(step),
    };
    pages::session_page(&d, q, &ui::price)
}

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let store = store(tmp.path());
    let d = ui::session_data(&store, ID, false).unwrap().unwrap();
    assert_eq!(d.rows.len() as u64, STEPS * 2 - 1);
    for (name, view) in [
        ("full view", pages::View::Full),
        ("model view", pages::View::Model),
    ] {
        let t = Instant::now();
        let page = serve(&store, view);
        if let Ok(dir) = std::env::var("VIEWER_DUMP") {
            let name = name.replace(' ', "-");
            std::fs::write(format!("{dir}/{name}.html"), &page).unwrap();
        }
        println!(
            "viewer: {name} of a {}-row session ({} steps, {} cuts): {} bytes, served in {:?} (one run)",
            d.rows.len(),
            d.steps.len(),
            d.cuts.len(),
            page.len(),
            t.elapsed()
        );
    }
    let page = serve_step(&store, 100);
    assert!(page.contains("step 100 of"), "the chosen step's window");
    println!("viewer: model view of step 100: {} bytes", page.len());
    let mut g = c.benchmark_group("viewer");
    g.sample_size(20).measurement_time(Duration::from_secs(8));
    g.bench_function("session_page_10k_rows_full_view", |b| {
        b.iter(|| serve(&store, pages::View::Full))
    });
    g.bench_function("session_page_10k_rows_model_view", |b| {
        b.iter(|| serve(&store, pages::View::Model))
    });
    g.bench_function("session_page_10k_rows_model_view_of_step_100", |b| {
        b.iter(|| serve_step(&store, 100))
    });
    g.bench_function("read_10k_rows", |b| {
        b.iter(|| ui::session_data(&store, ID, false).unwrap().unwrap())
    });
    let data = ui::session_data(&store, ID, false).unwrap().unwrap();
    g.bench_function("render_10k_rows_full_view", |b| {
        b.iter(|| {
            pages::session_page(
                &data,
                pages::PageQuery {
                    view: pages::View::Full,
                    page: None,
                    seq: None,
                    step: None,
                },
                &ui::price,
            )
        })
    });
    g.finish();
    let _ = store.shutdown();
}

criterion_group!(benches, bench);
criterion_main!(benches);
