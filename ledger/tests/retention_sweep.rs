//! Retention: idle sessions lose their rows and directory together;
//! `vacuum` compacts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::{LedgerRead, LedgerStore, LedgerWrite};
use oceancode_testkit::ledger::*;

const DAY: i64 = 86_400_000;

#[test]
fn retention_sweep_removes_rows_and_dir_together() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let old = scripted(&store, "sess-old");
    let mut fresh = Sim::new(&store, "sess-fresh", T0 + 7 * DAY);
    fresh.prompt("recent work on the scheduler");
    fresh.end_step(1, 1, 0, 0);
    fresh.settle();
    let old_dir = store.session_dir(&old.id);
    assert!(old_dir.join("SESSION.md").exists());

    // days = 0 keeps everything.
    assert!(store
        .sweep_at(0, T0 + 100 * DAY)
        .expect("sweep")
        .removed
        .is_empty());
    // Not idle long enough yet.
    assert!(store
        .sweep_at(7, T0 + 6 * DAY)
        .expect("sweep")
        .removed
        .is_empty());

    let report = store.sweep_at(7, T0 + 8 * DAY).expect("sweep");
    assert_eq!(report.removed, vec!["sess-old".to_string()]);
    assert_eq!(report.rows, old.seq);
    assert!(!old_dir.exists(), "directory removed with the rows");
    assert!(store.session_dir(&fresh.id).exists());
    let c = rusqlite::Connection::open(store.db_path()).expect("db");
    for table in [
        "rows",
        "row_text",
        "steps",
        "cuts",
        "branches",
        "page_notes",
    ] {
        let n: i64 = c
            .query_row(
                &format!("SELECT COUNT(*) FROM {table} WHERE session = 'sess-old'"),
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(n, 0, "{table}");
    }
    assert!(store
        .search(&["parser".into()], 10)
        .expect("search")
        .is_empty());
    assert_eq!(
        store
            .search(&["scheduler".into()], 10)
            .expect("search")
            .len(),
        1
    );
    assert_eq!(store.metrics().sessions_removed, 1);
    assert_eq!(
        store
            .list_sessions()
            .expect("list")
            .iter()
            .map(|s| s.id.as_str())
            .collect::<Vec<_>>(),
        vec!["sess-fresh"]
    );

    // The removed session can start again from seq 1 (a returning client).
    let mut again = Sim::new(&store, "sess-old", T0 + 9 * DAY);
    again.prompt("back again");
    again.settle();
    assert_eq!(
        store
            .recall_log("sess-old", None, None, 10)
            .expect("log")
            .len(),
        1
    );

    let v = store.vacuum().expect("vacuum");
    assert!(v.bytes_after > 0);
    assert!(v.bytes_after <= v.bytes_before, "{v:?}");
}
