//! SESSION.md written by the writer, and `ledger rebuild` reproducing the
//! live files byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::{LedgerRead, LedgerStore, LedgerWrite};
use oceancode_testkit::ledger::*;
use serde_json::json;

#[test]
fn page_live_and_rebuild_are_byte_identical() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let s = scripted(&store, "sess-page");
    let dir = store.session_dir(&s.id);
    let live = snapshot(&dir);
    assert!(live.contains_key("SESSION.md"), "{:?}", live.keys());
    assert!(live.contains_key("transcript/index.md"));
    assert!(live.contains_key("transcript/0001.md"));
    assert!(live.contains_key("transcript/0005.md"));

    std::fs::remove_dir_all(&dir).expect("remove");
    let report = store.rebuild(&s.id, None).expect("rebuild");
    assert!(report.page);
    assert_eq!(report.rows, s.seq);
    assert_eq!(
        snapshot(&dir),
        live,
        "rebuilt files differ from the live ones"
    );

    // A stale turn file is removed; a second rebuild changes nothing.
    std::fs::write(dir.join("transcript/0042.md"), "stale").expect("write");
    let report = store.rebuild(&s.id, None).expect("rebuild again");
    assert_eq!(report.removed, 1);
    assert_eq!(snapshot(&dir), live);

    // And after a restart of the store (fresh writer caches).
    store.shutdown().expect("shutdown");
    let store = open(tmp.path());
    std::fs::remove_dir_all(&dir).expect("remove");
    store.rebuild(&s.id, None).expect("rebuild after reopen");
    assert_eq!(snapshot(&dir), live);
}

#[test]
fn page_carries_engine_facts() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let s = scripted(&store, "sess-facts");
    let page = std::fs::read_to_string(store.data_dir().session_md(&s.id)).expect("page");
    println!("{page}");
    assert!(page.starts_with("# SESSION sess-facts\n"));
    assert!(page.contains("Merged: t01–t04 (every row up to seq 23 is past the tideline)."));
    // Goal from the first ask, the reminder skipped.
    assert!(page.contains("## Goal\n\n- t01 Fix the failing parser test in src/parser.rs\n"));
    // Files, with the rewound Write struck through.
    assert!(page.contains("- t02 `src/parser.rs` (read, edit)\n"));
    assert!(page.contains("- ~~t03 `CHANGELOG.md` (write)~~ rewound\n"));
    // Commands and exit codes.
    assert!(page.contains("- t01 `cargo test -p parser` → exit 101\n"));
    assert!(page.contains("- t02 `cargo test -p parser` → ok\n"));
    // Tasks: changed statuses strike the old line.
    assert!(page.contains("- ~~t01 [~] find the failing test~~\n"));
    assert!(page.contains("- ~~t01 [ ] fix the parser~~\n"));
    assert!(page.contains("- t02 [x] find the failing test\n"));
    assert!(page.contains("- t02 [x] fix the parser\n"));
    // The error, fixed by the later run of the same command.
    assert!(page.contains(
        "- ~~t01 `Bash` `cargo test -p parser`: error: test parser::tests::nested failed~~ fixed t02\n"
    ));
    // The log: a line per block past the tideline (t04 only in part: its
    // command's result is not past the tideline yet).
    assert!(page.contains(
        "- t01 seq 1–7 · Fix the failing parser test in src/parser.rs · 2 tool calls, 1 error\n"
    ));
    assert!(page.contains("- t03 seq 18–21 · now write a changelog entry · 0 tool calls\n"));
    assert!(page.contains("- t04 seq 22–23 · also run clippy · 1 tool call\n"));
    assert!(page.contains("- t04 `cargo clippy` → …\n"));
}

/// The page is edited, never rewritten: every line of an earlier version is
/// still there later, unchanged or struck through (or a pending exit filled).
#[test]
fn page_is_edited_not_rewritten() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut s = Sim::new(&store, "sess-edit", T0);
    let path = store.data_dir().session_md(&s.id);
    let mut versions = Vec::new();
    for t in 1..=8u32 {
        s.prompt(&format!("task number {t}"));
        let id = format!("c{t}");
        s.call(
            &id,
            "Bash",
            json!({"command": format!("make step{}", t % 3)}),
        );
        s.result(&id, &format!("Exit code {}", t % 2), t % 2 == 1);
        s.call(
            &format!("todo{t}"),
            "TodoWrite",
            json!({"todos": [
            {"content": "ship", "status": if t < 6 { "in_progress" } else { "completed" }},
            {"content": format!("step {t}"), "status": "pending"}]}),
        );
        s.result(&format!("todo{t}"), "ok", false);
        s.end_step(10, 10, 100, 10);
        if t >= 3 {
            s.cut(s.seq);
        }
        s.settle();
        if let Ok(p) = std::fs::read_to_string(&path) {
            versions.push(p);
        }
    }
    assert!(versions.len() >= 6);
    for pair in versions.windows(2) {
        let (old, new) = (&pair[0], &pair[1]);
        for line in old.lines().filter(|l| l.starts_with("- ")) {
            let body = &line[2..];
            let kept = new.lines().any(|l| {
                l == line
                    || l == format!("- ~~{body}~~")
                    || l == format!("- ~~{body}~~ rewound")
                    || l.starts_with(&format!("- ~~{body}~~ fixed "))
                    || (body.ends_with("→ …") && l.starts_with(&line[..line.len() - "…".len()]))
            });
            assert!(
                kept,
                "line {line:?} was rewritten\n--- old\n{old}\n--- new\n{new}"
            );
        }
    }
    let last = versions.last().expect("a page");
    assert!(last.contains("- t06 [x] ship\n"), "{last}");
    assert!(last.contains("- ~~t01 [~] ship~~\n"), "{last}");
}

/// The store migrates a version-1 database: the search index is filled
/// from the rows already there.
#[test]
fn page_schema_v1_migrates_to_v2() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let s = scripted(&store, "sess-old");
    store.shutdown().expect("shutdown");
    {
        let c = rusqlite::Connection::open(tmp.path().join("oceancode.db")).expect("db");
        c.execute_batch(
            "DROP TRIGGER row_text_ai; DROP TRIGGER row_text_ad; DROP TRIGGER row_text_au;
             DROP TABLE row_fts; DROP TABLE row_text; DROP TABLE page_notes;
             DROP INDEX sessions_client; ALTER TABLE steps DROP COLUMN error;
             ALTER TABLE sessions DROP COLUMN parent_seq;
             ALTER TABLE sessions DROP COLUMN line; ALTER TABLE sessions DROP COLUMN line_spec;
             ALTER TABLE sessions DROP COLUMN line_ms;
             ALTER TABLE steps DROP COLUMN detail;
             DROP TABLE context_edits; ALTER TABLE sessions DROP COLUMN line_override;
             UPDATE schema_version SET version = 1;",
        )
        .expect("downgrade");
    }
    let store = open(tmp.path());
    let c = rusqlite::Connection::open(tmp.path().join("oceancode.db")).expect("db");
    let v: i64 = c
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(v, oceancode_ledger::store::SCHEMA_VERSION);
    let n: i64 = c
        .query_row("SELECT COUNT(*) FROM row_text", [], |r| r.get(0))
        .expect("count");
    assert_eq!(n as u64, s.seq);
    let hits = store
        .search(&["nested".into(), "parses".into()], 10)
        .expect("search");
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].seq, 17);
}

/// A headless run (one prompt, then only tool steps) has a populated page
/// after its first cut: the facts of each block past the tideline merge
/// with their turn, a log line per block, and `ledger rebuild` reproduces
/// the page and the transcripts (and their line index) byte for byte.
#[test]
fn a_headless_turn_has_its_facts_on_the_page_after_the_first_cut() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut s = Sim::new(&store, "sess-headless", T0);
    s.prompt("Port the parser to the new API");
    let path = store.data_dir().session_md(&s.id);
    let mut first_cut_page = None;
    for k in 0..30u32 {
        let id = format!("c{k}");
        match k % 3 {
            0 => s.call(&id, "Read", json!({"file_path": format!("src/m{k}.rs")})),
            1 => s.call(&id, "Bash", json!({"command": format!("cargo test t{k}")})),
            _ => s.call(
                &id,
                "Edit",
                json!({"file_path": format!("src/m{k}.rs"), "old_string": "a", "new_string": "b"}),
            ),
        };
        let failed = k % 3 == 1 && k % 2 == 1;
        s.result(&id, if failed { "Exit code 1\nboom" } else { "ok" }, failed);
        s.end_step(10, 10, 100, 10);
        if k % 10 == 9 {
            s.cut(s.seq - 2);
            s.settle();
            if first_cut_page.is_none() {
                first_cut_page =
                    Some(std::fs::read_to_string(&path).expect("a page after the first cut"));
            }
        }
    }
    let first = first_cut_page.expect("cut");
    println!("{first}");
    assert!(first.contains("Merged: t01 (every row up to seq 19 is past the tideline)."));
    assert!(first.contains("- t01 `src/m0.rs` (read)\n"), "{first}");
    assert!(
        first.contains("- t01 `cargo test t1` → exit 1\n"),
        "{first}"
    );
    assert!(first.contains("- t01 seq 1–19 · Port the parser to the new API · 9 tool calls"));
    let last = std::fs::read_to_string(&path).expect("page");
    // Block by block: a log line each, the second one without the prompt.
    assert!(last.contains("- t01 seq 20–39 · 10 tool calls"), "{last}");
    assert!(last.contains("- t01 `src/m27.rs` (read)\n"), "{last}");
    for line in first
        .lines()
        .filter(|l| l.starts_with("- ") && !l.ends_with('…'))
    {
        assert!(last.contains(line), "edited, never rewritten: {line}");
    }
    // A rebuild gives the same bytes (the same blocks, from the cuts table).
    let live = snapshot(&store.session_dir(&s.id));
    assert!(
        live.contains_key("transcript/0001.rows.md"),
        "{:?}",
        live.keys()
    );
    assert_rebuilds_to(&store, &s.id, &live);
}

/// Remove the session's files, rebuild them from the ledger, and check
/// they are `live` byte for byte.
fn assert_rebuilds_to(
    store: &oceancode_ledger::store::Store,
    id: &str,
    live: &std::collections::BTreeMap<String, Vec<u8>>,
) {
    let dir = store.session_dir(id);
    std::fs::remove_dir_all(&dir).expect("remove");
    store.rebuild(id, None).expect("rebuild");
    assert_eq!(
        &snapshot(&dir),
        live,
        "rebuilt files differ from the live ones"
    );
}

/// An agent's tool loop is one long turn: each settled step writes its
/// rows, and the client's echo of the previous answer, into the turn file
/// and its sidecar; a file changed behind the writer's back is replaced
/// whole at the next step; and the files stay what `ledger rebuild`
/// writes, byte for byte. (That a reader never sees a torn file is
/// `store_transcript_atomic_replace`.)
#[test]
fn a_long_turn_equals_a_rebuild_after_every_step() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut s = Sim::new(&store, "sess-long", T0);
    s.prompt("Make the test suite pass");
    s.settle();
    let dir = store.session_dir(&s.id);
    let (text, side) = (
        dir.join("transcript/0001.md"),
        dir.join("transcript/0001.rows.md"),
    );
    for k in 0..30u32 {
        let id = format!("c{k}");
        let call = s.call(&id, "Bash", json!({"command": format!("cargo test t{k}")}));
        s.end_step(10, 10, 100, 10);
        s.settle();
        // The next request echoes the answer with the client's bytes.
        let echo = json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Running the tests, step {k}.")},
            {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": format!("cargo test t{k}")}}
        ]});
        s.store
            .submit(oceancode_window::Event::Confirm {
                session: s.id.clone(),
                seq: call,
                raw: echo.to_string().into(),
            })
            .expect("confirm");
        s.result(&id, &format!("test t{k} ... ok\n").repeat(40), false);
        s.settle();
        let turn = std::fs::read_to_string(&text).expect("turn file");
        assert!(
            turn.starts_with("# Turn 1\n") && turn.contains(&format!("test t{k} ... ok")),
            "step {k}: {turn}"
        );
        assert!(std::fs::metadata(&side).expect("sidecar").len() > 0);
        if k == 19 {
            // An editor saves the turn file in place behind the writer.
            std::fs::write(&text, b"# Turn 1\nedited\n").expect("edit");
        }
        if k == 24 {
            // Another saves a copy of the same length, renamed into place.
            let mut copy = std::fs::read(&text).expect("read");
            copy[0] = b'%';
            let tmp = dir.join("transcript/.edit");
            std::fs::write(&tmp, &copy).expect("copy");
            std::fs::rename(&tmp, &text).expect("rename");
        }
    }
    let live = snapshot(&dir);
    let turn = String::from_utf8_lossy(&live["transcript/0001.md"]).into_owned();
    assert!(turn.starts_with("# Turn 1\n") && turn.contains("Running the tests, step 29."));
    assert!(!turn.contains("edited"));
    assert!(!turn.contains("Running Bash."), "every echo kept: {turn}");
    assert_rebuilds_to(&store, &s.id, &live);
}
