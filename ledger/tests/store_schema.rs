//! Schema version 4 (the client-key index, a failed step's error kind, a
//! sibling's divergence point), 5 (the line a session ran with) and 6 (what
//! an answer reported besides its window's usage), the migrations from
//! versions 2 to 5, the restorer API, resolving a session by name, and the
//! one policy for a stored dialect this build does not know.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::{LedgerRead, LedgerWrite};
use oceancode_ledger::store::{Store, StoreError, SCHEMA_VERSION};
use oceancode_testkit::ledger::*;
use oceancode_window::{AppliedEdit, Dialect, Event, RowKind, StepDetail, Usage};

fn step(session: &str, step: u32, status: u16, error: Option<&str>) -> Event {
    Event::Step {
        session: session.into(),
        step,
        model: "claude-opus-5-5".into(),
        status,
        usage: Usage::default(),
        window_rows: 1,
        ts_ms: 1_796_000_000_100,
        error: error.map(str::to_string),
        detail: Default::default(),
    }
}

fn plan(c: &rusqlite::Connection, sql: &str) -> String {
    let mut stmt = c
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("plan");
    let rows = stmt
        .query_map([], |r| r.get::<_, String>(3))
        .expect("query")
        .collect::<Result<Vec<_>, _>>()
        .expect("rows");
    rows.join("; ")
}

#[test]
fn the_restorer_lookup_uses_an_index() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    store.settle_blocking().expect("settle");
    let c = rusqlite::Connection::open(store.db_path()).expect("open");
    let p = plan(&c, "SELECT id FROM sessions WHERE client_session = 'cc:x'");
    assert!(p.contains("USING INDEX sessions_client"), "{p}");
}

#[test]
fn a_failed_step_keeps_its_error_kind() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    store
        .submit(Event::Session(meta("f", Dialect::Anthropic)))
        .expect("session");
    store.submit(step("f", 1, 200, None)).expect("step");
    store
        .submit(step("f", 2, 504, Some("upstream_timeout")))
        .expect("step");
    store.settle_blocking().expect("settle");
    let steps = store.steps("f").expect("steps");
    let got: Vec<(u16, Option<&str>)> = steps
        .iter()
        .map(|s| (s.status, s.error.as_deref()))
        .collect();
    assert_eq!(got, vec![(200, None), (504, Some("upstream_timeout"))]);
}

/// A version-2 database (no index, no `steps.error`) is brought to the
/// current version with its data.
#[test]
fn version_2_is_migrated() {
    let tmp = tempfile::tempdir().expect("tmp");
    {
        let store = open(tmp.path());
        store
            .submit(Event::Session(meta("old", Dialect::Anthropic)))
            .expect("session");
        store.submit(step("old", 1, 200, None)).expect("step");
        store.shutdown().expect("shutdown");
    }
    {
        let c = rusqlite::Connection::open(tmp.path().join("oceancode.db")).expect("open");
        c.execute_batch(
            "DROP INDEX sessions_client;
             ALTER TABLE steps DROP COLUMN error;
             ALTER TABLE sessions DROP COLUMN parent_seq;
             ALTER TABLE sessions DROP COLUMN line;
             ALTER TABLE sessions DROP COLUMN line_spec;
             ALTER TABLE sessions DROP COLUMN line_ms;
             ALTER TABLE steps DROP COLUMN detail;
             DROP TABLE context_edits; ALTER TABLE sessions DROP COLUMN line_override;
             UPDATE schema_version SET version = 2;",
        )
        .expect("back to version 2");
    }
    let store = open(tmp.path());
    store
        .submit(step("old", 2, 502, Some("bad_gateway")))
        .expect("step");
    store.settle_blocking().expect("settle");
    let c = rusqlite::Connection::open(store.db_path()).expect("open");
    let v: i64 = c
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(v, SCHEMA_VERSION);
    assert_eq!(SCHEMA_VERSION, 8);
    let p = plan(&c, "SELECT id FROM sessions WHERE client_session = 'cc:x'");
    assert!(p.contains("USING INDEX sessions_client"), "{p}");
    let errors: Vec<Option<String>> = store
        .steps("old")
        .expect("steps")
        .into_iter()
        .map(|s| s.error)
        .collect();
    assert_eq!(errors, vec![None, Some("bad_gateway".to_string())]);
}

/// A version-3 database (no `sessions.parent_seq`) is brought to the current
/// version with its data, and a sibling's link reads back everywhere.
#[test]
fn version_3_is_migrated_and_a_siblings_link_reads_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut root = meta("root", Dialect::Anthropic);
    root.client_session = Some("fp:k".into());
    {
        let store = open(tmp.path());
        store.submit(Event::Session(root.clone())).expect("session");
        store.shutdown().expect("shutdown");
    }
    {
        let c = rusqlite::Connection::open(tmp.path().join("oceancode.db")).expect("open");
        c.execute_batch(
            "ALTER TABLE sessions DROP COLUMN parent_seq;
             ALTER TABLE sessions DROP COLUMN line;
             ALTER TABLE sessions DROP COLUMN line_spec;
             ALTER TABLE sessions DROP COLUMN line_ms;
             ALTER TABLE steps DROP COLUMN detail;
             DROP TABLE context_edits; ALTER TABLE sessions DROP COLUMN line_override;
             UPDATE schema_version SET version = 3;",
        )
        .expect("back to version 3");
    }
    let store = open(tmp.path());
    let mut sib = meta("sib", Dialect::Anthropic);
    sib.client_session = Some("fp:k".into());
    sib.created_ms += 5;
    sib.parent = Some("root".into());
    sib.parent_seq = Some(7);
    store.submit(Event::Session(sib.clone())).expect("sibling");
    store.settle_blocking().expect("settle");
    assert_eq!(store.session_meta("root").expect("meta"), Some(root));
    assert_eq!(store.session_meta("sib").expect("meta"), Some(sib.clone()));
    let list = store.list_sessions().expect("list");
    let line = list.iter().find(|s| s.id == "sib").expect("listed");
    assert_eq!(
        (line.parent.as_deref(), line.parent_seq),
        (Some("root"), Some(7))
    );
    let restored = store.restore_client("fp:k").expect("restore");
    assert_eq!(restored[1].meta, sib);
}

fn line(session: &str, line: u64, spec: &str, ts_ms: i64) -> Event {
    Event::Line {
        session: session.into(),
        line,
        spec: spec.into(),
        overridden: None,
        ts_ms,
    }
}

/// The line a session ran with is kept (the latest one), and survives the
/// session's meta being written again.
#[test]
fn the_line_a_session_ran_with_is_recorded() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    store
        .submit(Event::Session(meta("l", Dialect::Anthropic)))
        .expect("session");
    store.settle_blocking().expect("settle");
    assert_eq!(store.recorded_line("l").expect("read"), None);
    store.submit(line("l", 80_000, "40%", 10)).expect("line");
    store.submit(line("l", 20_000, "20k", 20)).expect("line");
    let mut again = meta("l", Dialect::Anthropic);
    again.last_ms += 100;
    store.submit(Event::Session(again)).expect("session");
    store.settle_blocking().expect("settle");
    let got = store.recorded_line("l").expect("read").expect("a line");
    assert_eq!(
        (got.line, got.spec.as_str(), got.ts_ms),
        (20_000, "20k", 20)
    );
    // A line for a session the ledger does not know is refused, not kept.
    store.submit(line("nobody", 1, "1", 1)).expect("queued");
    store.settle_blocking().expect("settle");
    assert_eq!(store.recorded_line("nobody").expect("read"), None);
}

/// A version-4 database gets the line columns, its sessions none recorded.
#[test]
fn version_4_is_migrated() {
    let tmp = tempfile::tempdir().expect("tmp");
    {
        let store = open(tmp.path());
        store
            .submit(Event::Session(meta("v4", Dialect::Anthropic)))
            .expect("session");
        store.shutdown().expect("shutdown");
    }
    {
        let c = rusqlite::Connection::open(tmp.path().join("oceancode.db")).expect("open");
        c.execute_batch(
            "ALTER TABLE sessions DROP COLUMN line;
             ALTER TABLE sessions DROP COLUMN line_spec;
             ALTER TABLE sessions DROP COLUMN line_ms;
             ALTER TABLE steps DROP COLUMN detail;
             DROP TABLE context_edits; ALTER TABLE sessions DROP COLUMN line_override;
             UPDATE schema_version SET version = 4;",
        )
        .expect("back to version 4");
    }
    let store = open(tmp.path());
    assert_eq!(store.recorded_line("v4").expect("read"), None);
    store.submit(line("v4", 30_000, "30%", 5)).expect("line");
    store.settle_blocking().expect("settle");
    assert_eq!(
        store.recorded_line("v4").expect("read").map(|l| l.line),
        Some(30_000)
    );
}

/// `resolve_session` takes the ledger id, the client's own name or id, or a
/// unique prefix; anything else is an error naming the closest sessions.
#[test]
fn sessions_resolve_by_id_client_name_or_prefix() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut root = meta("20260101-100000-s-aaaaaa", Dialect::Anthropic);
    root.client_session = Some("name:probe".into());
    let mut sub = meta("20260101-100001-s-bbbbbb", Dialect::Anthropic);
    sub.client_session = Some("name:probe".into());
    sub.parent = Some(root.id.clone());
    sub.created_ms += 1;
    let mut cc = meta("20260102-100000-cc-cccccc", Dialect::Anthropic);
    cc.client_session = Some("cc:3f1c9a2e-0000".into());
    for m in [root.clone(), sub.clone(), cc.clone()] {
        store.submit(Event::Session(m)).expect("session");
    }
    store.settle_blocking().expect("settle");
    let r = |s: &str| store.resolve_session(Some(s));
    assert_eq!(r("probe").expect("name"), root.id);
    assert_eq!(r(&sub.id).expect("id"), sub.id);
    assert_eq!(r("3f1c9a2e-0000").expect("cc id"), cc.id);
    assert_eq!(r("20260102").expect("prefix"), cc.id);
    let e = r("prob3").expect_err("unknown");
    assert!(matches!(e, StoreError::Resolve(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("no session \"prob3\""), "{msg}");
    assert!(msg.contains(&format!("{}  probe", root.id)), "{msg}");
    let msg = r("20260101").expect_err("ambiguous").to_string();
    assert!(msg.contains("ambiguous") && msg.contains(&sub.id), "{msg}");
}

/// A version-5 database (no `steps.detail`) is brought to version 6: its
/// steps read back with nothing beyond their usage, new steps keep theirs.
#[test]
fn version_5_is_migrated_and_a_steps_detail_round_trips() {
    let tmp = tempfile::tempdir().expect("tmp");
    {
        let store = open(tmp.path());
        store
            .submit(Event::Session(meta("v5", Dialect::Anthropic)))
            .expect("session");
        store.submit(step("v5", 1, 200, None)).expect("step");
        store.shutdown().expect("shutdown");
    }
    {
        let c = rusqlite::Connection::open(tmp.path().join("oceancode.db")).expect("open");
        c.execute_batch(
            "ALTER TABLE steps DROP COLUMN detail;
             DROP TABLE context_edits; ALTER TABLE sessions DROP COLUMN line_override;
             UPDATE schema_version SET version = 5;",
        )
        .expect("back to version 5");
    }
    let store = open(tmp.path());
    let detail = StepDetail {
        extra: Usage {
            input: 180_000,
            output: 3_500,
            ..Usage::default()
        },
        reasoning: 120,
        compactions: 1,
        edits: vec![AppliedEdit {
            kind: "clear_tool_uses_20250919".into(),
            cleared_input_tokens: 50_000,
            cleared_tool_uses: Some(8),
            cleared_thinking_turns: None,
        }],
        recalls: vec![oceancode_window::InternalRecall {
            round: 1,
            call_id: "toolu_1".into(),
            input: r#"{"seq":3}"#.into(),
            result_chars: 120,
            continued: true,
            messages: vec![r#"{"role":"user","content":"r"}"#.into()],
            after: Some(2),
        }],
        compress: None,
        // What the step sent (the viewer's model view) round-trips too.
        sent: Some(oceancode_window::SentWindow {
            pieces: vec![
                oceancode_window::SentPiece::Stub,
                oceancode_window::SentPiece::Rows(1, 1),
                oceancode_window::SentPiece::Rows(9, 9),
                oceancode_window::SentPiece::Pruned(10),
                oceancode_window::SentPiece::Rows(11, 12),
                oceancode_window::SentPiece::Edited(13),
                oceancode_window::SentPiece::Note(1),
                oceancode_window::SentPiece::Recall(13, 2),
            ],
            upto: 8,
            edit: 1,
            stub: Some(r#"{"role":"user","content":"[Earlier content…]"}"#.into()),
            stub_step: 0,
            tail: 13,
            stateful: false,
            pointers: Some(vec![(10, vec![(0, "[output → recall entry 10]".into())])]),
            pointers_step: 0,
        }),
        // The prompt cache note (a free cut, a miss and its cause) too.
        cache: Some(oceancode_window::cache::CacheNote {
            cold: Some(oceancode_window::cache::Cold::TtlExpired),
            free_cut: true,
            miss: Some(oceancode_window::cache::MissCause::Cut),
            miss_tokens: 42_000,
            changed: None,
            provider: Some("messages_changed".into()),
        }),
    };
    let mut second = step("v5", 2, 200, None);
    if let Event::Step { detail: d, .. } = &mut second {
        **d = detail.clone();
    }
    store.submit(second).expect("step");
    store.settle_blocking().expect("settle");
    let got: Vec<StepDetail> = store
        .steps("v5")
        .expect("steps")
        .into_iter()
        .map(|s| s.detail)
        .collect();
    assert_eq!(got, vec![StepDetail::default(), detail]);
    // A step with nothing beyond its usage stores no detail at all.
    let c = rusqlite::Connection::open(store.db_path()).expect("open");
    let stored: Vec<Option<String>> = c
        .prepare("SELECT detail FROM steps WHERE session = 'v5' ORDER BY step")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(stored[0].is_none(), "{stored:?}");
    assert!(stored[1]
        .as_deref()
        .is_some_and(|d| d.contains("\"compactions\":1")));
}

#[test]
fn restore_client_reads_a_keys_sessions_root_first() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut root = meta("root", Dialect::Anthropic);
    root.client_session = Some("cc:k".into());
    let mut sub = meta("sub", Dialect::Anthropic);
    sub.client_session = Some("cc:k".into());
    sub.created_ms += 5;
    sub.parent = Some("root".into());
    store.submit(Event::Session(sub)).expect("sub first");
    store.submit(Event::Session(root)).expect("root");
    store
        .submit(rows_event(
            "root",
            vec![text_row(1, 1, RowKind::Prompt, "ask")],
        ))
        .expect("rows");
    // No settle: restoring sees what is queued for the key.
    let got = store.restore_client("cc:k").expect("restore");
    let ids: Vec<&str> = got.iter().map(|s| s.meta.id.as_str()).collect();
    assert_eq!(ids, vec!["root", "sub"]);
    assert_eq!(got[0].rows.len(), 1);
    assert!(store.restore_client("cc:none").expect("none").is_empty());
}

/// A dialect this build does not know: the session is skipped where sessions
/// are listed, an error where it is asked for (the restorer's error is
/// visible, not an empty answer).
#[test]
fn an_unknown_stored_dialect_is_one_policy() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut odd = meta("odd", Dialect::Anthropic);
    odd.client_session = Some("cc:odd".into());
    store.submit(Event::Session(odd)).expect("odd");
    store
        .submit(Event::Session(meta("fine", Dialect::OpenaiChat)))
        .expect("fine");
    store.settle_blocking().expect("settle");
    let c = rusqlite::Connection::open(store.db_path()).expect("open");
    c.execute("UPDATE sessions SET dialect = 'palm2' WHERE id = 'odd'", [])
        .expect("edit");
    drop(c);
    let ids: Vec<String> = store
        .list_sessions()
        .expect("list")
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, vec!["fine"]);
    assert!(matches!(
        store.session_meta("odd"),
        Err(StoreError::Corrupt(_))
    ));
    assert!(matches!(
        store.restore_client("cc:odd"),
        Err(StoreError::Corrupt(_))
    ));
    // The writer's indexing of a new row of it is refused the same way, and
    // the store keeps serving the other sessions.
    store
        .submit(rows_event(
            "fine",
            vec![text_row(1, 1, RowKind::Prompt, "still fine")],
        ))
        .expect("rows");
    store.settle_blocking().expect("settle");
    assert_eq!(store.session_rows("fine", false).expect("rows").len(), 1);
    let _: &Store = &store;
}

/// A version-6 database (no `context_edits`) is brought to version 7: a
/// session reads back unedited, a context edit then round-trips (the edit
/// set in force is what `load_session` hands back).
#[test]
fn version_6_is_migrated_and_a_context_edit_reads_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    {
        let store = open(tmp.path());
        store
            .submit(Event::Session(meta("v6", Dialect::Anthropic)))
            .expect("session");
        store.shutdown().expect("shutdown");
    }
    {
        let c = rusqlite::Connection::open(tmp.path().join("oceancode.db")).expect("open");
        c.execute_batch("DROP TABLE context_edits; ALTER TABLE sessions DROP COLUMN line_override; UPDATE schema_version SET version = 6;")
            .expect("back to version 6");
    }
    let store = open(tmp.path());
    assert_eq!(
        store
            .load_session("v6")
            .expect("load")
            .expect("there")
            .context,
        None
    );
    for n in 1..=2u32 {
        store
            .submit(Event::ContextEdit {
                session: "v6".into(),
                n,
                set: format!("{{\"deleted\":[{n}]}}"),
                seqs: vec![u64::from(n)],
                tokens_before: 1000,
                tokens_after: 400,
                ts_ms: 5,
            })
            .expect("edit");
    }
    let l = store.load_session("v6").expect("load").expect("there");
    assert_eq!(l.context, Some((2, "{\"deleted\":[2]}".to_string())));
    let edits = store.context_edits("v6").expect("edits");
    assert_eq!(edits.len(), 2);
    assert_eq!(
        (edits[1].n, edits[1].seqs.clone(), edits[1].tokens_after),
        (2, vec![2], 400)
    );
}

/// A version-7 database (no `line_override`) is brought to version 8: a
/// session reads back with no override, and a `Line` event's override then
/// round-trips (set, then cleared).
#[test]
fn version_7_is_migrated_and_a_line_override_reads_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    {
        let store = open(tmp.path());
        store
            .submit(Event::Session(meta("v7", Dialect::Anthropic)))
            .expect("session");
        store.shutdown().expect("shutdown");
    }
    {
        let c = rusqlite::Connection::open(tmp.path().join("oceancode.db")).expect("open");
        c.execute_batch(
            "ALTER TABLE sessions DROP COLUMN line_override; UPDATE schema_version SET version = 7;",
        )
        .expect("back to version 7");
    }
    let store = open(tmp.path());
    let l = store.load_session("v7").expect("load").expect("there");
    assert_eq!(l.line_override, None);
    for (ts_ms, overridden) in [(5, Some(r#"{"percent":50.0}"#)), (6, None)] {
        store
            .submit(Event::Line {
                session: "v7".into(),
                line: 100_000,
                spec: "50%".into(),
                overridden: overridden.map(String::from),
                ts_ms,
            })
            .expect("line");
        let l = store.load_session("v7").expect("load").expect("there");
        assert_eq!(l.line_override.as_deref(), overridden, "at {ts_ms}");
    }
}
