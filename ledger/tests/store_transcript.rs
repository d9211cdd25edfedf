//! Transcript rendering (pure) and the files the writer produces.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::{LedgerRead, LedgerWrite};
use oceancode_ledger::transcript::{self, render_index, render_turn, summarize_turn, TurnSummary};
use oceancode_testkit::ledger::*;
use oceancode_window::{Dialect, Event, Row, RowKind};
use std::collections::BTreeMap;

fn by_turn(rows: &[Row]) -> BTreeMap<u32, Vec<Row>> {
    let mut m: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
    for r in rows {
        m.entry(r.turn).or_default().push(r.clone());
    }
    m
}

/// All turns of a fixture rendered one after another (the golden file).
fn render_all(dialect: Dialect, rows: &[Row]) -> String {
    by_turn(rows)
        .iter()
        .map(|(t, rows)| render_turn(dialect, *t, rows))
        .collect::<Vec<_>>()
        .join("\n<!-- next file -->\n\n")
}

fn golden(name: &str, dialect: Dialect) {
    let rows = fixture_rows(name);
    let got = render_all(dialect, &rows);
    let path = fixtures_dir().join(format!("{name}.expected.md"));
    if std::env::var_os("OCEANCODE_BLESS").is_some() {
        std::fs::write(&path, &got).expect("bless");
    }
    let want = std::fs::read_to_string(&path).expect("golden file (run with OCEANCODE_BLESS=1)");
    assert_eq!(
        got,
        want,
        "{name}: rendering differs from {}",
        path.display()
    );
}

#[test]
fn store_transcript_golden_anthropic() {
    golden("anthropic", Dialect::Anthropic);
}

#[test]
fn store_transcript_golden_openai_chat() {
    golden("openai_chat", Dialect::OpenaiChat);
}

#[test]
fn store_transcript_golden_openai_responses() {
    golden("openai_responses", Dialect::OpenaiResponses);
}

/// Every row of every fixture turn is where the line index says: its
/// anchor on line `first`, its last line on `last`, the next anchor two
/// lines later; the sidecar lists the same lines.
#[test]
fn the_line_index_lands_on_every_row() {
    for (name, dialect) in [
        ("anthropic", Dialect::Anthropic),
        ("openai_chat", Dialect::OpenaiChat),
        ("openai_responses", Dialect::OpenaiResponses),
    ] {
        for (turn, rows) in by_turn(&fixture_rows(name)) {
            let (text, index) = transcript::render_turn_indexed(dialect, turn, &rows);
            assert_eq!(text, render_turn(dialect, turn, &rows));
            let lines: Vec<&str> = text.split('\n').collect();
            let placed: Vec<_> = index.rows().copied().collect();
            assert_eq!(placed.len(), rows.len());
            for (r, row) in placed.iter().zip(&rows) {
                assert_eq!(r.seq, row.seq);
                let anchor = lines[r.first as usize - 1];
                assert!(
                    anchor.starts_with(&format!("## seq {} · {}", row.seq, row.role)),
                    "{name} t{turn}: line {} is {anchor:?}",
                    r.first
                );
                assert_eq!(index.find(row.seq), Some(*r));
            }
            for w in placed.windows(2) {
                assert_eq!(w[0].last + 2, w[1].first, "{name}: consecutive");
            }
            let last = placed.last().unwrap();
            assert_eq!(
                last.last as usize,
                lines.len() - 1,
                "{name}: the file's last line"
            );
            let side = index.render();
            for r in &placed {
                assert!(side.contains(&format!("| {} | {}–{} |", r.seq, r.first, r.last)));
            }
        }
    }
}

#[test]
fn the_writer_keeps_a_line_index_per_turn_and_the_store_answers_seq_to_lines() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    store
        .submit(Event::Session(meta("lines", Dialect::Anthropic)))
        .expect("submit");
    let rows = fixture_rows("anthropic");
    for r in &rows {
        store
            .submit(rows_event("lines", vec![r.clone()]))
            .expect("submit");
    }
    store.settle_blocking().expect("settle");
    for (turn, rows) in by_turn(&rows) {
        let (text, index) = transcript::render_turn_indexed(Dialect::Anthropic, turn, &rows);
        let dir = store.data_dir();
        assert_eq!(
            std::fs::read_to_string(dir.turn_file("lines", turn)).unwrap(),
            text
        );
        assert_eq!(
            std::fs::read_to_string(dir.rows_file("lines", turn)).unwrap(),
            index.render()
        );
        for r in index.rows() {
            assert_eq!(store.row_lines("lines", r.seq).unwrap(), Some(*r));
        }
    }
    assert_eq!(store.row_lines("lines", 999).unwrap(), None);
}

#[test]
fn store_transcript_anthropic_shapes() {
    let rows = fixture_rows("anthropic");
    let t1 = render_turn(Dialect::Anthropic, 1, &by_turn(&rows)[&1]);
    assert!(t1.starts_with("# Turn 1\n\n## seq 1 · user\n\n<system-reminder>\n"));
    assert!(t1.contains("\n## seq 2 · system\n\n# Environment\n"));
    assert!(t1.contains(
        "**tool_use** `Bash` · `toolu_fake_81120493d29a4e4e915a`\n```json\n{\"command\":\"ls -la\",\"description\":\"List files\"}\n```\n"
    ));
    assert!(t1.contains("**tool_result** · `toolu_fake_81120493d29a4e4e915a`\n```\ntotal 16\n"));
    let t2 = render_turn(Dialect::Anthropic, 2, &by_turn(&rows)[&2]);
    assert!(t2.contains("## seq 6 · user\n\nnow count them\n"));
    assert!(t2.contains("> *thinking*\n>\n> Count the entries.\n>\n> Use wc.\n"));
    assert!(t2.contains("> *redacted thinking*\n"));
    // A backtick run inside the content makes the fence longer.
    assert!(t2.contains("````json\n{\"command\":\"ls | wc -l # ```fenced```\""));
    assert!(t2.contains("**tool_result** · `toolu_synth_1` · error\n````\nbash: ```: command not found\n````\n*[image: image/png · 64×48 · ~6 tokens]*\n"));
    assert!(t2.contains("```json\n{\"type\":\"citations_delta_unknown\",\"x\":1}\n```\n"));
    assert!(!t2.contains("iVBORw0KGgo"), "image data never rendered");
}

#[test]
fn store_transcript_openai_shapes() {
    let chat = fixture_rows("openai_chat");
    let t = render_all(Dialect::OpenaiChat, &chat);
    assert!(t.contains("## seq 1 · system\n\nbe brief\n"));
    assert!(
        t.contains("**tool_call** `read_file` · `call_1`\n```json\n{\"path\":\"a.txt\"}\n```\n")
    );
    assert!(t.contains(
        "## seq 4 · tool · result read_file\n\n**tool_result** · `call_1`\n```\nhello\n```\n"
    ));
    // Size and estimated tokens from the JPEG's header, never the data.
    assert!(
        t.contains("what is in this picture?\n\n*[image: image/jpeg · 1280×720 · ~1105 tokens]*\n")
    );
    assert!(!t.contains("base64,"));
    assert!(t.contains("*refusal:* I can't see images.\n"));

    let resp = fixture_rows("openai_responses");
    let t = render_all(Dialect::OpenaiResponses, &resp);
    assert!(t.contains("## seq 4 · function_call · call exec_command\n\n**function_call** `exec_command` · `call_dac6c38fb91549acb887`\n```json\n{\"cmd\": \"ls -la\"}\n```\n"));
    assert!(t.contains(
        "**function_call_output** · `call_dac6c38fb91549acb887`\n```\nChunk ID: 0950be\n"
    ));
    assert!(t.contains("## seq 6 · assistant\n\nDone. FINAL_ANSWER_MARKER\n"));
    assert!(t.contains("> *reasoning*\n>\n> **Planning the patch**\n>\n> Edit a.txt.\n"));
    assert!(t.contains("> *reasoning (encrypted)*\n"));
    assert!(t.contains("**custom_tool_call** `apply_patch` · `call_patch`\n```\n*** Begin Patch\n"));
    // An image inside a function_call_output's output list.
    assert!(t.contains("screenshot saved\n```\n*[image: image/webp · 800×600 · ~85 tokens]*\n"));
    assert!(t.contains("**custom_tool_call_output** · `call_patch`\n```\nSuccess."));
    assert!(t.contains("## seq 12 · web_search_call\n\n```json\n{\"type\":\"web_search_call\""));
    assert!(t.contains("# Turn 3\n\n## seq 13 · user\n\nhi\n"));
}

#[test]
fn store_transcript_unknown_and_invalid_raw() {
    let r = row(1, 1, RowKind::Other, "[1,2]");
    assert_eq!(
        render_turn(Dialect::Anthropic, 1, &[r]),
        "# Turn 1\n\n## seq 1 · unknown\n\n```json\n[1,2]\n```\n"
    );
    let mut r = row(2, 1, RowKind::Other, "{}");
    r.raw = "not json".into();
    r.role = "user".into();
    assert_eq!(
        render_turn(Dialect::OpenaiChat, 1, &[r]),
        "# Turn 1\n\n## seq 2 · user\n\n```\nnot json\n```\n"
    );
    let r = row(3, 1, RowKind::Prompt, r#"{"role":"user","content":[]}"#);
    assert!(render_turn(Dialect::Anthropic, 1, &[r]).ends_with("## seq 3 · user\n\n*(empty)*\n"));
}

#[test]
fn store_transcript_first_line_and_summary() {
    let rows = fixture_rows("anthropic");
    let turns = by_turn(&rows);
    let s1 = summarize_turn(Dialect::Anthropic, 1, &turns[&1]).expect("summary");
    // The <system-reminder> block is skipped.
    assert_eq!(s1.first_line, "list the files here");
    assert_eq!((s1.first_seq, s1.last_seq), (1, 5));
    assert_eq!(
        s1.tokens,
        turns[&1].iter().map(|r| u64::from(r.tokens)).sum::<u64>()
    );

    let resp = fixture_rows("openai_responses");
    let t = by_turn(&resp);
    let s = summarize_turn(Dialect::OpenaiResponses, 1, &t[&1]).expect("summary");
    assert_eq!(
        s.first_line, "list the files here",
        "environment_context skipped"
    );

    let long = "x".repeat(200);
    let r = text_row(1, 1, RowKind::Prompt, &format!("\n\n  {long}\nsecond"));
    let line = transcript::first_line(Dialect::Anthropic, &r.raw);
    assert_eq!(line.chars().count(), 80);
    assert!(line.ends_with('…'));
    assert_eq!(summarize_turn(Dialect::Anthropic, 1, &[]), None);
}

#[test]
fn store_transcript_index_content() {
    let mut m = meta("sess-1", Dialect::Anthropic);
    m.parent = Some("parent/x".into());
    m.created_ms = 1_796_087_486_123;
    let turns = vec![
        TurnSummary {
            turn: 1,
            first_seq: 1,
            last_seq: 5,
            first_line: "list the files | here".into(),
            tokens: 120,
        },
        TurnSummary {
            turn: 2,
            first_seq: 6,
            last_seq: 6,
            first_line: "now count them".into(),
            tokens: 30,
        },
    ];
    let idx = render_index(&m, &turns);
    let parent_dir = oceancode_ledger::paths::sanitize_session_id("parent/x");
    let want = format!(
        "# Session sess-1\n\n\
         - client: claude-code\n\
         - client session: cs-sess-1\n\
         - dialect: anthropic\n\
         - model: claude-opus-5-5\n\
         - parent: [parent/x](../../{parent_dir}/transcript/index.md)\n\
         - created: 2026-12-01T01:11:26Z\n\n\
         | Turn | Seq | Tokens | First line |\n\
         |---:|:---|---:|:---|\n\
         | [1](0001.md) | 1–5 | 120 | list the files \\| here |\n\
         | [2](0002.md) | 6 | 30 | now count them |\n\
         \n2 turns · 150 tokens\n"
    );
    assert_eq!(idx, want);
    let empty = render_index(&meta("s", Dialect::OpenaiChat), &[]);
    assert!(empty.ends_with("\n_No turns yet._\n"));
    assert_eq!(transcript::utc_iso(0), "1970-01-01T00:00:00Z");
    assert_eq!(transcript::utc_iso(951_782_400_000), "2000-02-29T00:00:00Z");
}

/// The writer's files are exactly the pure rendering of the stored rows.
#[test]
fn store_transcript_files_match_pure_rendering() {
    for (name, dialect) in [
        ("anthropic", Dialect::Anthropic),
        ("openai_chat", Dialect::OpenaiChat),
        ("openai_responses", Dialect::OpenaiResponses),
    ] {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = open(tmp.path());
        let id = format!("s-{name}");
        store
            .submit(Event::Session(meta(&id, dialect)))
            .expect("submit");
        let rows = fixture_rows(name);
        // One step per row, as the proxy would.
        for r in &rows {
            store
                .submit(rows_event(&id, vec![r.clone()]))
                .expect("submit");
        }
        store.settle_blocking().expect("settle");
        let layout = store.data_dir();
        let mut summaries = Vec::new();
        for (turn, trows) in by_turn(&rows) {
            let path = layout.turn_file(&id, turn);
            let disk = std::fs::read_to_string(&path).expect("turn file");
            assert_eq!(
                disk,
                render_turn(dialect, turn, &trows),
                "{}",
                path.display()
            );
            assert_eq!(mode(&path), 0o600);
            summaries.push(summarize_turn(dialect, turn, &trows).expect("summary"));
        }
        let idx = std::fs::read_to_string(layout.index_file(&id)).expect("index");
        assert_eq!(idx, render_index(&meta(&id, dialect), &summaries));
        assert_eq!(mode(&layout.transcript_dir(&id)), 0o700);
        assert_eq!(mode(&layout.session_dir(&id)), 0o700);
        // No temp file is left behind.
        let names: Vec<String> = std::fs::read_dir(layout.transcript_dir(&id))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
        // A fresh store (cold caches, summaries from SQL) renders the same index.
        store.shutdown().expect("shutdown");
        std::fs::remove_file(layout.index_file(&id)).expect("rm");
        let store = open(tmp.path());
        store
            .submit(Event::Session(meta(&id, dialect)))
            .expect("submit");
        store.settle_blocking().expect("settle");
        let idx2 = std::fs::read_to_string(layout.index_file(&id)).expect("index");
        assert_eq!(idx2, idx);
    }
}

/// A reader polling a turn file while the writer rewrites it never sees a
/// torn file.
#[test]
fn store_transcript_atomic_replace() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    store
        .submit(Event::Session(meta("atomic", Dialect::Anthropic)))
        .expect("submit");
    store
        .submit(rows_event(
            "atomic",
            vec![text_row(1, 1, RowKind::Prompt, "go")],
        ))
        .expect("submit");
    store.settle_blocking().expect("settle");
    let path = store.data_dir().turn_file("atomic", 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let path = path.clone();
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let text = std::fs::read_to_string(&path).expect("read never fails");
                assert!(text.starts_with("# Turn 1\n"), "torn: {text:?}");
                // Sections are complete and consecutive.
                let n = text.matches("\n## seq ").count();
                for k in 1..=n {
                    assert!(text.contains(&format!("\n## seq {k} · ")), "missing {k}");
                }
                assert!(
                    text.ends_with(&format!("step {n}\n")) || n == 1,
                    "torn tail: {text:?}"
                );
                reads += 1;
            }
            reads
        })
    };
    for seq in 2..=300u64 {
        let r = text_row(
            seq,
            1,
            RowKind::Assistant,
            &format!("{}step {seq}", "pad ".repeat(50)),
        );
        store.submit(rows_event("atomic", vec![r])).expect("submit");
        if seq % 10 == 0 {
            store.settle_blocking().expect("settle");
        }
    }
    store.settle_blocking().expect("settle");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().expect("reader ok");
    assert!(reads > 0);
    let text = std::fs::read_to_string(&path).expect("read");
    assert_eq!(text.matches("\n## seq ").count(), 300);
}

mod store_props {
    use super::*;
    use proptest::prelude::*;

    fn dialects() -> impl Strategy<Value = Dialect> {
        prop_oneof![
            Just(Dialect::Anthropic),
            Just(Dialect::OpenaiChat),
            Just(Dialect::OpenaiResponses)
        ]
    }

    proptest! {
        /// Content never escapes its fence, whatever backticks it holds.
        #[test]
        fn store_fence_holds_any_content(body in "[`a\\n ]{0,40}") {
            let f = transcript::fence("", &body);
            let ticks = f.chars().take_while(|c| *c == '`').count();
            prop_assert!(ticks >= 3);
            let inner = &f[ticks + 1..f.len() - ticks];
            prop_assert_eq!(inner.trim_end_matches('\n'), body.trim_end_matches('\n'));
            prop_assert!(!inner.contains(&"`".repeat(ticks)));
        }

        /// Rendering never panics and always keeps the heading of each row.
        #[test]
        fn store_render_any_row(
            dialect in dialects(),
            text in "\\PC{0,30}",
            ty in prop_oneof![
                Just("text"), Just("tool_use"), Just("tool_result"), Just("thinking"),
                Just("function_call"), Just("reasoning"), Just("input_text"), Just("zzz")
            ],
        ) {
            let t = serde_json::to_string(&text).expect("json string");
            let raws = [
                format!(r#"{{"role":"user","content":{t}}}"#),
                format!(r#"{{"role":"assistant","content":[{{"type":"{ty}","text":{t},"input":{t},"content":[{t}]}}]}}"#),
                format!(r#"{{"type":"{ty}","arguments":{t},"output":[{{"type":"{ty}"}}],"summary":{t}}}"#),
                format!(r#"{{"role":"tool","content":[{t}],"tool_calls":[{t},{{"function":{t}}}]}}"#),
                text.clone(),
            ];
            for (i, raw) in raws.iter().enumerate() {
                let mut r = row(i as u64 + 1, 1, RowKind::Other, "{}");
                r.raw = raw.as_str().into();
                let out = render_turn(dialect, 1, &[r]);
                let heading = format!("\n## seq {} · ", i + 1);
                prop_assert!(out.contains(&heading));
                prop_assert!(out.ends_with('\n'));
            }
        }
    }
}
