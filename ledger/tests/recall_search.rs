//! Recall: a session's log (LIKE, before, limit), one entry, and FTS5
//! search across sessions; rows hidden by a rewind are read too.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::{LedgerRead, LedgerStore, LedgerWrite};
use oceancode_testkit::ledger::*;
use serde_json::json;

#[test]
fn recall_log_match_before_limit() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let s = scripted(&store, "sess-recall");
    // Oldest first; the newest `limit` rows.
    let all = store.recall_log(&s.id, None, None, 1000).expect("log");
    assert_eq!(all.len() as u64, s.seq);
    assert_eq!(all[0].seq, 1);
    let last3 = store.recall_log(&s.id, None, None, 3).expect("log");
    assert_eq!(
        last3.iter().map(|h| h.seq).collect::<Vec<_>>(),
        vec![s.seq - 2, s.seq - 1, s.seq]
    );
    // Page back with --before.
    let page = store
        .recall_log(&s.id, None, Some(last3[0].seq), 2)
        .expect("log");
    assert_eq!(
        page.iter().map(|h| h.seq).collect::<Vec<_>>(),
        vec![s.seq - 4, s.seq - 3]
    );
    // LIKE over the text, hidden rows included and flagged.
    let hits = store
        .recall_log(&s.id, Some("CHANGELOG.md"), None, 20)
        .expect("log");
    assert_eq!(hits.len(), 1);
    assert!(hits[0].hidden);
    assert!(hits[0]
        .line(false)
        .starts_with("seq 19 · t03 · assistant · hidden · "));
    let hits = store
        .recall_log(&s.id, Some("cargo test%parser"), Some(10), 20)
        .expect("log");
    assert_eq!(hits.iter().map(|h| h.seq).collect::<Vec<_>>(), vec![5]);
    // Bodies are clipped to 200 characters.
    let mut long = Sim::new(&store, "sess-long", T0);
    long.prompt(&"word ".repeat(200));
    long.settle();
    let h = store.recall_log("sess-long", None, None, 1).expect("log");
    assert_eq!(h[0].body.chars().count(), 200);
    assert!(h[0].body.ends_with('…'));
}

#[test]
fn recall_entry_reads_hidden_rows_whole() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let s = scripted(&store, "sess-entry");
    let (row, hidden) = store.recall_entry(&s.id, 19).expect("entry").expect("row");
    assert!(hidden);
    assert!(row.raw.contains("\"file_path\":\"CHANGELOG.md\""));
    assert!(store.recall_entry(&s.id, 999).expect("entry").is_none());
}

#[test]
fn recall_search_every_word_newest_session_first() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut a = Sim::new(&store, "sess-a", T0);
    a.prompt("the flux capacitor needs calibration");
    a.say("Calibrating the flux capacitor now.");
    a.end_step(1, 1, 0, 0);
    a.settle();
    let mut b = Sim::new(&store, "sess-b", T0 + 60_000);
    b.prompt("is the flux capacitor stable?");
    b.call("x1", "Bash", json!({"command": "grep capacitor notes.txt"}));
    b.result("x1", "capacitor: unstable", false);
    b.end_step(1, 1, 0, 0);
    b.settle();
    let hits = store
        .search(&["flux".into(), "capacitor".into()], 20)
        .expect("search");
    assert_eq!(
        hits.iter()
            .map(|h| (h.session.as_str(), h.seq))
            .collect::<Vec<_>>(),
        vec![("sess-b", 1), ("sess-a", 2), ("sess-a", 1)]
    );
    assert!(
        hits[0].body.contains("[flux] [capacitor]"),
        "{}",
        hits[0].body
    );
    // Every word must appear.
    let hits = store
        .search(&["capacitor".into(), "calibration".into()], 20)
        .expect("search");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].session, "sess-a");
    // Tool inputs and results are searchable; limit applies.
    let hits = store.search(&["notes.txt".into()], 20).expect("search");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].seq, 2);
    assert_eq!(
        store
            .search(&["capacitor".into()], 2)
            .expect("search")
            .len(),
        2
    );
    // Quotes and operators are words, not syntax.
    assert!(store
        .search(&["\"OR".into()], 5)
        .expect("search")
        .is_empty());
}

#[test]
fn recall_search_follows_confirm_and_rebuild() {
    use oceancode_window::Event;
    use std::sync::Arc;
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let mut s = Sim::new(&store, "sess-c", T0);
    s.prompt("hello");
    let seq = s.say("draft wording");
    store
        .submit(Event::Confirm {
            session: s.id.clone(),
            seq,
            raw: Arc::from(
                r#"{"role":"assistant","content":[{"type":"text","text":"final wording"}]}"#,
            ),
        })
        .expect("confirm");
    s.settle();
    assert!(store
        .search(&["draft".into()], 5)
        .expect("search")
        .is_empty());
    assert_eq!(store.search(&["final".into()], 5).expect("search").len(), 1);
    store.rebuild(&s.id, None).expect("rebuild");
    assert_eq!(store.search(&["final".into()], 5).expect("search").len(), 1);
}

#[test]
fn rows_left_unindexed_by_a_crash_are_indexed_at_the_next_open() {
    let tmp = tempfile::tempdir().expect("tmp");
    let id = {
        let store = open(tmp.path());
        let mut s = Sim::new(&store, "sess-heal", T0);
        s.prompt("the zeppelin manifest is missing");
        s.say("Looking for the zeppelin manifest.");
        s.end_step(1, 1, 0, 0);
        s.settle();
        assert_eq!(
            store.search(&["zeppelin".into()], 5).expect("search").len(),
            2
        );
        store.shutdown().expect("shutdown");
        s.id.clone()
    };
    // What a crash between the rows' commit and the deferred indexing leaves.
    let db = tmp.path().join("oceancode.db");
    let conn = rusqlite::Connection::open(&db).expect("db");
    conn.execute("DELETE FROM row_text WHERE session = ?1 AND seq = 2", [&id])
        .expect("delete");
    drop(conn);
    let store = open(tmp.path());
    let hits = store.search(&["zeppelin".into()], 5).expect("search");
    assert_eq!(hits.iter().map(|h| h.seq).collect::<Vec<_>>(), vec![2, 1]);
}
