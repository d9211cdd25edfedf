//! The store's behaviour on both backends (one parameterized suite): every
//! case runs on SQLite and, when a PostgreSQL server is set
//! (`OCEANCODE_TEST_DATABASE_URL`, see `oceancode_testkit::ledger`), on PostgreSQL, which
//! must read back and render exactly what SQLite does.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::pg::PgStore;
use oceancode_ledger::store::{
    BehindReason, LedgerStore, LedgerWrite, SentPointers, StoreError, StoreOptions,
};
use oceancode_testkit::eventually;
use oceancode_testkit::ledger::*;
use oceancode_window::{Event, InternalRecall, RowKind, SentWindow, StepDetail};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DAY: i64 = 86_400_000;

/// What a backend holds of a session, as every reader sees it.
#[derive(Debug, PartialEq)]
struct Seen {
    loaded: oceancode_ledger::store::LoadedSession,
    rows: Vec<(oceancode_window::Row, bool)>,
    steps: Vec<oceancode_ledger::store::StepRecord>,
    cuts: Vec<oceancode_ledger::store::CutRecord>,
    line: Option<oceancode_ledger::store::LineRecord>,
    summary: Option<oceancode_ledger::store::SessionSummary>,
    files: BTreeMap<String, Vec<u8>>,
}

fn seen(store: &Arc<dyn LedgerStore>, id: &str) -> Seen {
    Seen {
        loaded: store.load_session(id).expect("load").expect("session"),
        rows: store.session_rows(id, true).expect("rows"),
        steps: store.steps(id).expect("steps"),
        cuts: store.cuts(id).expect("cuts"),
        line: store.recorded_line(id).expect("line"),
        summary: store.session_summary(id).expect("summary"),
        files: snapshot(&store.data_dir().session_dir(id)),
    }
}

fn line_event(id: &str) -> Event {
    Event::Line {
        session: id.into(),
        line: 20_000,
        spec: "20k".into(),
        overridden: Some(r#"{"tokens":20000}"#.into()),
        ts_ms: T0 + 5,
    }
}

#[test]
fn backends_record_render_and_rebuild_the_same_session() {
    let mut oracle: Option<Seen> = None;
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let s = scripted(&store, "sess-same");
        store.submit(line_event(&s.id)).expect("line");
        store
            .submit(Event::ContextEdit {
                session: s.id.clone(),
                n: 1,
                set: r#"{"delete":[3]}"#.into(),
                seqs: vec![3],
                tokens_before: 900,
                tokens_after: 400,
                ts_ms: T0 + 6,
            })
            .expect("context edit");
        // A step whose recall-tool exchange the proxy kept after row 2.
        store
            .submit(Event::Step {
                session: s.id.clone(),
                step: 90,
                model: "m2".into(),
                status: 200,
                usage: Default::default(),
                window_rows: 2,
                ts_ms: T0 + 7,
                error: None,
                detail: Box::new(StepDetail {
                    recalls: vec![InternalRecall {
                        round: 1,
                        messages: vec!["call".into(), "result".into()],
                        after: Some(2),
                        ..Default::default()
                    }],
                    sent: Some(SentWindow {
                        upto: 2,
                        pointers: Some(vec![(3, vec![(1, "[pruned tool output: seq 3]".into())])]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .expect("step");
        // The next window sent the same pointers (named by step 90).
        store
            .submit(Event::Step {
                session: s.id.clone(),
                step: 91,
                model: "m".into(),
                status: 200,
                usage: Default::default(),
                window_rows: 2,
                ts_ms: T0 + 8,
                error: None,
                detail: Box::new(StepDetail {
                    sent: Some(SentWindow {
                        upto: 2,
                        pointers_step: 90,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .expect("step");
        store.settle_blocking().expect("settle");
        let edits = store.context_edits(&s.id).expect("edits");
        assert_eq!(
            (edits.len(), edits[0].seqs.clone()),
            (1, vec![3]),
            "{}",
            b.name()
        );
        let got = seen(&store, &s.id);
        assert!(got.files.contains_key("SESSION.md"), "{}", b.name());
        assert!(
            got.files.contains_key("transcript/index.md"),
            "{}",
            b.name()
        );
        assert!(!got.loaded.hidden.is_empty(), "{}", b.name());
        // Each model its steps sent with its latest step, newest first.
        let models = &got.loaded.models;
        assert!(models.contains(&("m".to_string(), T0 + 8)), "{models:?}");
        assert!(models.contains(&("m2".to_string(), T0 + 7)), "{models:?}");
        assert!(models.windows(2).all(|w| w[0].1 >= w[1].1), "{models:?}");
        assert_eq!(
            got.loaded.exchanges,
            vec![(2, vec!["call".to_string(), "result".to_string()])],
            "{}: the kept exchange is read back",
            b.name()
        );
        assert_eq!(
            got.loaded.pointers,
            Some(SentPointers {
                upto: 2,
                rows: vec![(3, vec![(1, "[pruned tool output: seq 3]".to_string())])],
            }),
            "{}: the compress pointers the last window sent are read back",
            b.name()
        );
        assert_eq!(
            got.loaded.line_override.as_deref(),
            Some(r#"{"tokens":20000}"#),
            "{}: the session's own line override is read back",
            b.name()
        );
        assert_eq!(store.list_sessions().expect("list").len(), 1);
        assert_eq!(store.resolve_session(None).expect("latest"), s.id);
        assert_eq!(
            store.resolve_session(Some("sess-sa")).expect("prefix"),
            s.id
        );
        assert_eq!(
            store.sessions_for_client("cc:sess-same").expect("key"),
            vec![s.id.clone()]
        );
        // `ledger rebuild` writes the same files from the database.
        let dir = store.data_dir().session_dir(&s.id);
        std::fs::remove_dir_all(&dir).expect("remove");
        let report = store.rebuild(&s.id, None).expect("rebuild");
        assert_eq!(report.rows, s.seq, "{}", b.name());
        assert!(report.page);
        assert_eq!(snapshot(&dir), got.files, "{}: rebuild differs", b.name());
        match &oracle {
            None => oracle = Some(got),
            Some(o) => {
                assert_eq!(o.loaded, got.loaded, "{} load_session", b.name());
                assert_eq!(o.rows, got.rows, "{} rows", b.name());
                assert_eq!(o.steps, got.steps, "{} steps", b.name());
                assert_eq!(o.cuts, got.cuts, "{} cuts", b.name());
                assert_eq!(o.line, got.line, "{} line", b.name());
                assert_eq!(o.summary, got.summary, "{} summary", b.name());
                for (k, v) in &o.files {
                    assert_eq!(
                        Some(String::from_utf8_lossy(v)),
                        got.files.get(k).map(|g| String::from_utf8_lossy(g)),
                        "{}: {k}",
                        b.name()
                    );
                }
                assert_eq!(o.files.len(), got.files.len());
            }
        }
        store.shutdown().expect("shutdown");
        // A restart reads the same back.
        let again = b.open(tmp.path());
        assert_eq!(
            again.load_session(&s.id).expect("load").expect("s"),
            oracle.as_ref().expect("oracle").loaded
        );
    }
}

#[test]
fn backends_refuse_a_gap_and_heal_by_resync() {
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let mut s = Sim::new(&store, "sess-gap", T0);
        s.prompt("first");
        s.say("one");
        s.settle();
        // Rows that skip seq 3 are refused; the session is behind.
        store
            .submit(Event::Rows {
                session: s.id.clone(),
                rows: vec![text_row(5, 2, RowKind::Prompt, "skipped ahead")],
            })
            .expect("submit");
        store.settle_blocking().expect("settle");
        let behind = store.behind(&s.id).expect("behind");
        assert_eq!(behind.reason, BehindReason::Gap, "{}", b.name());
        assert_eq!(store.behind_count(), 1);
        assert_eq!(
            store.health().status,
            oceancode_ledger::store::HealthStatus::Degraded
        );
        // Later events are dropped until the resync.
        s.prompt("dropped");
        s.settle();
        let back = store.resync(&s.id).expect("resync").expect("session");
        assert_eq!(back.rows.len(), 2, "{}", b.name());
        assert!(store.behind(&s.id).is_none());
        store
            .submit(Event::Rows {
                session: s.id.clone(),
                rows: vec![text_row(3, 2, RowKind::Prompt, "healed")],
            })
            .expect("submit");
        store.settle_blocking().expect("settle");
        let l = store.load_session(&s.id).expect("load").expect("s");
        assert_eq!(l.rows.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(
            store.health().status,
            oceancode_ledger::store::HealthStatus::Ok,
            "{}",
            b.name()
        );
        let m = store.metrics();
        assert_eq!(m.rejected, 1, "{}", b.name());
        assert!(m.batches > 0 && m.lag_max_us > 0);
    }
}

fn text_row(seq: u64, turn: u32, kind: RowKind, text: &str) -> oceancode_window::Row {
    let role = if kind == RowKind::Assistant {
        "assistant"
    } else {
        "user"
    };
    oceancode_window::Row {
        seq,
        role: role.into(),
        kind,
        raw: json!({ "role": role, "content": text }).to_string().into(),
        tokens: 3,
        turn,
        step: turn,
        branch: 0,
        from_response: false,
    }
}

#[test]
fn backends_search_every_word_and_recall_hidden_rows() {
    let mut oracle = None;
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let s = scripted(&store, "sess-recall");
        let mut a = Sim::new(&store, "sess-a", T0 + 1000);
        a.prompt("the flux capacitor needs calibration");
        a.say("Calibrating the flux capacitor now.");
        a.end_step(1, 1, 0, 0);
        a.settle();
        let mut c = Sim::new(&store, "sess-b", T0 + 60_000);
        c.prompt("is the Flux capacitor stable?");
        c.call("x1", "Bash", json!({"command": "grep capacitor notes.txt"}));
        c.result("x1", "capacitor: unstable", false);
        c.end_step(1, 1, 0, 0);
        c.settle();
        let keys = |words: &[&str], limit| -> Vec<(String, u64, bool)> {
            let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
            store
                .search(&words, limit)
                .expect("search")
                .into_iter()
                .map(|h| (h.session, h.seq, h.hidden))
                .collect()
        };
        let flux = keys(&["flux", "capacitor"], 20);
        assert_eq!(
            flux,
            vec![
                ("sess-b".to_string(), 1, false),
                ("sess-a".to_string(), 2, false),
                ("sess-a".to_string(), 1, false)
            ],
            "{}",
            b.name()
        );
        let hit = &store.search(&["flux".into()], 1).expect("search")[0];
        assert!(hit.body.contains("[Flux]"), "{}: {}", b.name(), hit.body);
        assert_eq!(keys(&["capacitor", "calibration"], 20).len(), 1);
        assert_eq!(keys(&["notes.txt"], 20), vec![("sess-b".into(), 2, false)]);
        assert_eq!(keys(&["capacitor"], 2).len(), 2);
        assert!(keys(&["\"OR"], 5).is_empty(), "{}", b.name());
        // Hidden rows are found and flagged.
        let changelog = keys(&["CHANGELOG.md"], 5);
        assert!(changelog.iter().all(|k| k.2), "{}: {changelog:?}", b.name());
        let log = store
            .recall_log(&s.id, Some("changelog.md"), None, 20)
            .expect("log");
        assert_eq!(log.len(), 1, "{}", b.name());
        assert!(log[0].hidden);
        let (row, hidden) = store.recall_entry(&s.id, 19).expect("entry").expect("row");
        assert!(hidden && row.raw.contains("CHANGELOG.md"));
        let all: Vec<u64> = store
            .recall_log(&s.id, None, Some(10), 3)
            .expect("log")
            .iter()
            .map(|h| h.seq)
            .collect();
        assert_eq!(all, vec![7, 8, 9]);
        let got = (flux, changelog, all);
        match &oracle {
            None => oracle = Some(got),
            Some(o) => assert_eq!(o, &got, "{}", b.name()),
        }
    }
}

#[test]
fn backends_sweep_idle_sessions_with_their_files() {
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let old = scripted(&store, "sess-old");
        // Created today: on PostgreSQL it lands in a day partition.
        let now = oceancode_now();
        let mut fresh = Sim::new(&store, "sess-fresh", now);
        fresh.prompt("recent work on the scheduler");
        fresh.end_step(1, 1, 0, 0);
        fresh.settle();
        let old_dir = store.data_dir().session_dir(&old.id);
        assert!(old_dir.join("SESSION.md").exists());
        assert!(store
            .sweep_at(0, now + 100 * DAY)
            .expect("sweep")
            .removed
            .is_empty());
        let report = store.sweep_at(2, now).expect("sweep");
        assert_eq!(report.removed, vec!["sess-old".to_string()], "{}", b.name());
        assert_eq!(report.rows, old.seq);
        assert!(!old_dir.exists());
        assert!(store
            .search(&["parser".into()], 10)
            .expect("search")
            .is_empty());
        assert_eq!(store.search(&["scheduler".into()], 10).expect("s").len(), 1);
        // Later the fresh one goes too (PostgreSQL: its whole day partition).
        let report = store.sweep_at(7, now + 30 * DAY).expect("sweep");
        assert_eq!(
            report.removed,
            vec!["sess-fresh".to_string()],
            "{}",
            b.name()
        );
        assert_eq!(report.rows, 1);
        assert!(store.list_sessions().expect("list").is_empty());
        assert!(store
            .search(&["scheduler".into()], 10)
            .expect("s")
            .is_empty());
        store.vacuum().expect("vacuum");
        assert_eq!(store.metrics().sessions_removed, 2);
    }
}

fn oceancode_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

#[test]
fn backends_keep_page_notes_and_backlog() {
    let mut oracle = None;
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let s = scripted(&store, "sess-notes");
        let before = store.page_backlog(&s.id).expect("backlog");
        store
            .add_page_notes(
                &s.id,
                vec![oceancode_ledger::page::Note {
                    section: "Decisions".into(),
                    turn: 1,
                    text: "keep the parser strict".into(),
                }],
            )
            .expect("notes");
        let page = std::fs::read_to_string(store.data_dir().session_md(&s.id)).expect("page");
        assert!(page.contains("keep the parser strict"), "{}", b.name());
        let got = (before, page);
        match &oracle {
            None => oracle = Some(got),
            Some(o) => assert_eq!(o, &got, "{}", b.name()),
        }
        assert!(matches!(
            store.rebuild("no-such-session", None),
            Err(StoreError::UnknownSession(_))
        ));
    }
}

/// An event the database itself refuses is refused alone: its session
/// falls behind as failed, and the events of the other sessions around it
/// (the same batch, when they share one) are all kept. The PostgreSQL
/// writer runs a batch without a savepoint per event first; this is its
/// fallback. (The refusal is a constraint the test adds; a NUL in a text
/// column, which PostgreSQL cannot store, is kept as U+FFFD instead.)
#[test]
fn postgres_an_event_the_database_refuses_is_refused_alone() {
    let Some(url) = fresh_db() else { return };
    let tmp = tempfile::tempdir().expect("tmp");
    let store: Arc<dyn LedgerStore> =
        Arc::new(PgStore::open(&url, tmp.path(), StoreOptions::default()).expect("open"));
    admin(
        &url,
        "ALTER TABLE sessions ADD CONSTRAINT test_refuse CHECK (model <> 'refuse-me')",
    );
    let sim = |id: String, model: &str| Sim {
        store: store.clone(),
        id,
        seq: 0,
        turn: 0,
        step: 1,
        ts: T0,
        model: model.into(),
    };
    for round in 0..3 {
        let mut a = Sim::new(&store, &format!("sess-a{round}"), T0);
        a.prompt("first ask of a");
        let mut bad = sim(format!("sess-bad{round}"), "refuse-me");
        bad.meta();
        bad.prompt("never kept");
        let mut nul = sim(format!("sess-nul{round}"), "claude\u{0}nul");
        nul.meta();
        nul.prompt("kept");
        a.say("answer of a");
        nul.say("kept too");
        store.settle_blocking().expect("settle");
        for s in [&a, &nul] {
            let l = store.load_session(&s.id).expect("load").expect("kept");
            assert_eq!(l.rows.len(), 2, "{}", s.id);
            assert!(store.behind(&s.id).is_none(), "{}", s.id);
        }
        let meta = store.session_meta(&nul.id).expect("meta").expect("nul");
        assert_eq!(meta.model, "claude\u{FFFD}nul");
        assert_eq!(
            store.behind(&bad.id).map(|b| b.reason),
            Some(BehindReason::Failed),
            "round {round}"
        );
        assert!(store.load_session(&bad.id).expect("load").is_none());
    }
    assert_eq!(store.metrics().rejected, 3);
}

/// The search text is written behind the rows (its own transaction at the
/// next flush); rows a crash left without it are indexed when a proxy opens
/// the database: those of the recent day partitions and those of a session
/// created days ago that is still in use (its rows live in its creation
/// day's partition).
#[test]
fn postgres_search_text_a_crash_left_out_is_indexed_at_open() {
    let Some(url) = fresh_db() else { return };
    let tmp = tempfile::tempdir().expect("tmp");
    let now = oceancode_now();
    let open = || -> Arc<dyn LedgerStore> {
        Arc::new(PgStore::open(&url, tmp.path(), StoreOptions::default()).expect("open"))
    };
    let hits = |store: &Arc<dyn LedgerStore>| -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = store
            .search(&["quasar".into()], 10)
            .expect("search")
            .into_iter()
            .map(|h| (h.session, h.seq))
            .collect();
        v.sort();
        v
    };
    let want: Vec<(String, u64)> = ["sess-long", "sess-today"]
        .iter()
        .flat_map(|s| [(s.to_string(), 1), (s.to_string(), 2)])
        .collect();
    let store = open();
    // A session of today (the partitions a proxy checks at open).
    store
        .submit(Event::Session(oceancode_window::SessionMeta {
            id: "sess-today".into(),
            client: "claude-code".into(),
            client_session: None,
            dialect: oceancode_window::Dialect::Anthropic,
            model: "claude-opus-5-5".into(),
            parent: None,
            parent_seq: None,
            created_ms: now,
            last_ms: now,
        }))
        .expect("submit");
    // And one created days ago (T0), in use now.
    assert!(now - T0 > 2 * DAY);
    for id in ["sess-today", "sess-long"] {
        let mut s = Sim::new(&store, id, now);
        s.prompt("the quasar lens is cracked");
        s.say("Replacing the quasar lens.");
        s.end_step(10, 5, 0, 0);
    }
    store.settle_blocking().expect("settle");
    assert_eq!(hits(&store), want, "indexed by the settle's flush");
    store.shutdown().expect("shutdown");
    drop(store);
    // As if the proxy died between the rows' commit and their text.
    admin(&url, "DELETE FROM row_text");
    // The heal runs on the writer before anything queued, so a settle (as
    // `recall` makes before it reads) waits for it.
    let store = open();
    store.settle_blocking().expect("settle");
    assert_eq!(hits(&store), want, "indexed again at open");
}

/// A row whose search text PostgreSQL cannot index whole (a `tsvector`
/// is at most 1 MB: a large tool output of distinct words) neither loses
/// the search text of the rows written with it nor its own.
#[test]
fn postgres_search_text_of_a_huge_row_does_not_sink_the_others() {
    let Some(url) = fresh_db() else { return };
    let tmp = tempfile::tempdir().expect("tmp");
    let store: Arc<dyn LedgerStore> =
        Arc::new(PgStore::open(&url, tmp.path(), StoreOptions::default()).expect("open"));
    let hits = |word: &str| -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = store
            .search(&[word.into()], 10)
            .expect("search")
            .iter()
            .map(|h| (h.session.clone(), h.seq))
            .collect();
        v.sort();
        v
    };
    // About 1.4 MB of distinct words: more than a tsvector holds.
    let mut huge = String::from("nebula log");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..90_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        huge.push_str(&format!(" w{x:x}"));
    }
    let mut other = Sim::new(&store, "sess-other", T0);
    other.prompt("where is the nebula chart");
    let mut s = Sim::new(&store, "sess-huge", T0);
    s.prompt("show me the nebula log");
    s.call("t1", "Bash", json!({"command": "cat the nebula file"}));
    s.result("t1", &huge, false);
    s.settle();
    assert_eq!(
        store.session_rows("sess-huge", false).expect("rows").len(),
        3
    );
    assert!(store.behind("sess-huge").is_none());
    assert_eq!(
        hits("nebula"),
        vec![
            ("sess-huge".to_string(), 1),
            ("sess-huge".to_string(), 2),
            ("sess-huge".to_string(), 3),
            ("sess-other".to_string(), 1),
        ]
    );
    // `ledger rebuild` indexes it the same way.
    store.rebuild("sess-huge", None).expect("rebuild");
    assert_eq!(hits("nebula").len(), 4);
}

/// The writer's connection lost while a session's `index.md` waits for
/// the deferred flush: the index is still written once the writer has
/// connected again.
#[test]
fn postgres_an_index_waiting_when_the_connection_drops_is_written() {
    let Some(url) = fresh_db() else { return };
    let tmp = tempfile::tempdir().expect("tmp");
    let store: Arc<dyn LedgerStore> =
        Arc::new(PgStore::open(&url, tmp.path(), StoreOptions::default()).expect("open"));
    let mut s = Sim::new(&store, "sess-idx", T0);
    s.prompt("first ask");
    s.settle();
    let index = store.data_dir().index_file("sess-idx");
    assert!(std::fs::read_to_string(&index)
        .expect("index")
        .contains("| 1 |"));
    // A row of the same turn: its index waits (up to a second).
    s.say("first answer");
    std::thread::sleep(Duration::from_millis(200));
    // The server drops the writer's connection; another session's event
    // is the next the writer commits (it connects again for it).
    admin(
        &url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    Sim::new(&store, "sess-next", T0);
    store.settle_blocking().expect("settle");
    // The deferred flush runs within a second of the row; poll for it.
    let text = eventually(
        Duration::from_secs(10),
        "the index names rows 1–2",
        || {
            let text = std::fs::read_to_string(&index).expect("index");
            if text.contains("| 1–2 |") {
                Ok(text)
            } else {
                Err(text)
            }
        },
    );
    assert!(text.contains("| 1–2 |"), "{text}");
}

/// A database at a newer schema version is refused with a clear error.
#[test]
fn postgres_refuses_a_newer_schema() {
    let Some(url) = fresh_db() else { return };
    let tmp = tempfile::tempdir().expect("tmp");
    PgStore::open(&url, tmp.path(), StoreOptions::default())
        .expect("open")
        .shutdown()
        .expect("shutdown");
    admin(&url, "UPDATE schema_version SET version = 99");
    match PgStore::open(&url, tmp.path(), StoreOptions::default()) {
        Err(e @ StoreError::SchemaTooNew { found: 99, .. }) => {
            assert!(e.to_string().contains("newer than supported"), "{e}")
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a newer schema was opened"),
    }
    // A server that cannot be reached fails the open, naming it without the password.
    let bad = "postgres://u:secret@127.0.0.1:1/x";
    match PgStore::open(bad, tmp.path(), StoreOptions::default()) {
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("127.0.0.1:1") && !msg.contains("secret"),
                "{msg}"
            );
        }
        Ok(_) => panic!("opened an unreachable database"),
    }
}

/// Two proxies, one database: the one holding a session's lease writes
/// it; the other's writes of it are refused (behind) until the holder lets
/// go, then it takes over and continues the same session gap-free; its
/// files are rendered from the database in its own data dir.
#[test]
fn postgres_one_proxy_at_a_time_per_session() {
    let Some(url) = fresh_db() else { return };
    let opts = StoreOptions {
        lease: Duration::from_millis(1500),
        ..StoreOptions::default()
    };
    let dir_a = tempfile::tempdir().expect("tmp");
    let dir_b = tempfile::tempdir().expect("tmp");
    let a = Arc::new(PgStore::open(&url, dir_a.path(), opts).expect("a"));
    let b = Arc::new(PgStore::open(&url, dir_b.path(), opts).expect("b"));
    assert_ne!(a.owner(), b.owner());
    let a_dyn: Arc<dyn LedgerStore> = a.clone();
    let b_dyn: Arc<dyn LedgerStore> = b.clone();
    let mut s = Sim::new(&a_dyn, "sess-shared", T0);
    s.prompt("first ask");
    s.say("first answer");
    s.settle();
    assert_eq!(a.held(), vec!["sess-shared".to_string()]);
    // B writing the session while A holds it is refused.
    b_dyn
        .submit(Event::Rows {
            session: "sess-shared".into(),
            rows: vec![text_row(3, 2, RowKind::Prompt, "from b")],
        })
        .expect("submit");
    b_dyn.settle_blocking().expect("settle");
    assert_eq!(
        b_dyn.behind("sess-shared").map(|x| x.reason),
        Some(BehindReason::Gap)
    );
    // A keeps renewing past the lease's length.
    std::thread::sleep(Duration::from_millis(2000));
    let left = b
        .take_leases(&["sess-shared".into()], Duration::ZERO)
        .expect("take");
    assert_eq!(left, vec!["sess-shared".to_string()], "A still holds it");
    // A lets go (idle eviction): B's restorer takes over at once.
    a_dyn.release("sess-shared");
    a_dyn.settle_blocking().expect("settle");
    let t = Instant::now();
    let restored = b_dyn.restore_client("cc:sess-shared").expect("restore");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(restored.len(), 1);
    assert_eq!(restored[0].rows.len(), 2);
    assert!(b_dyn.behind("sess-shared").is_none());
    let mut s2 = Sim::new(&b_dyn, "sess-shared", T0 + 10);
    s2.seq = 2;
    s2.turn = 1;
    s2.prompt("second ask, on proxy b");
    s2.say("second answer");
    s2.settle();
    assert_eq!(b.held(), vec!["sess-shared".to_string()]);
    assert!(a.held().is_empty());
    let l = a_dyn.load_session("sess-shared").expect("load").expect("s");
    assert_eq!(
        l.rows.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    // A's writes now fall behind; B's data dir has the session's files.
    a_dyn
        .submit(Event::Rows {
            session: "sess-shared".into(),
            rows: vec![text_row(5, 3, RowKind::Prompt, "stale a")],
        })
        .expect("submit");
    a_dyn.settle_blocking().expect("settle");
    assert!(a_dyn.behind("sess-shared").is_some());
    let t2 = std::fs::read_to_string(b_dyn.data_dir().turn_file("sess-shared", 2)).expect("t2");
    assert!(t2.contains("second ask, on proxy b"), "{t2}");
    // A proxy that stops lets go of its leases.
    b_dyn.shutdown().expect("shutdown");
    assert!(a
        .take_leases(&["sess-shared".into()], Duration::ZERO)
        .expect("take")
        .is_empty());
}

/// A session that another proxy wrote while this one's lease had lapsed
/// (this proxy stalled) and that this proxy then takes back: its files are
/// rendered with the other proxy's rows, not from what this proxy cached
/// of the session before it lost it.
#[test]
fn postgres_a_session_taken_back_renders_what_the_other_proxy_wrote() {
    let Some(url) = fresh_db() else { return };
    // Long leases: neither proxy renews (or notices a loss) during the test.
    let opts = StoreOptions {
        lease: Duration::from_secs(60),
        ..StoreOptions::default()
    };
    let dir_a = tempfile::tempdir().expect("tmp");
    let dir_b = tempfile::tempdir().expect("tmp");
    let a = Arc::new(PgStore::open(&url, dir_a.path(), opts).expect("a"));
    let b = Arc::new(PgStore::open(&url, dir_b.path(), opts).expect("b"));
    let a_dyn: Arc<dyn LedgerStore> = a.clone();
    let b_dyn: Arc<dyn LedgerStore> = b.clone();
    let id = "sess-moved";
    let mut s = Sim::new(&a_dyn, id, T0);
    s.prompt("first ask");
    s.say("first answer, from a");
    s.settle();
    // A stalls past its lease; B takes the session over and writes it.
    admin(&url, "UPDATE leases SET expires_ms = 0");
    assert!(b
        .take_leases(&[id.to_string()], Duration::ZERO)
        .expect("take")
        .is_empty());
    b_dyn
        .submit(Event::Rows {
            session: id.into(),
            rows: vec![text_row(3, 1, RowKind::Assistant, "second answer, from b")],
        })
        .expect("submit");
    b_dyn.settle_blocking().expect("settle");
    // A, back, writes from its own view of the session: refused, behind.
    a_dyn
        .submit(Event::Rows {
            session: id.into(),
            rows: vec![text_row(3, 1, RowKind::Assistant, "stale a")],
        })
        .expect("submit");
    a_dyn.settle_blocking().expect("settle");
    assert!(a_dyn.behind(id).is_some());
    // B lets go; A resyncs from the database and continues the session.
    b_dyn.release(id);
    b_dyn.settle_blocking().expect("settle");
    let loaded = a_dyn.resync(id).expect("resync").expect("session");
    assert_eq!(loaded.rows.len(), 3);
    a_dyn
        .submit(Event::Rows {
            session: id.into(),
            rows: vec![text_row(4, 1, RowKind::Assistant, "third answer, from a")],
        })
        .expect("submit");
    a_dyn.settle_blocking().expect("settle");
    assert!(a_dyn.behind(id).is_none());
    let t1 = std::fs::read_to_string(a_dyn.data_dir().turn_file(id, 1)).expect("turn 1");
    for text in [
        "first answer, from a",
        "second answer, from b",
        "third answer, from a",
    ] {
        assert!(t1.contains(text), "A's turn file misses {text:?}:\n{t1}");
    }
    assert!(!t1.contains("stale a"), "{t1}");
}

/// A holder that stops renewing (its proxy died) loses the session once
/// the lease lapses; the restorer waits for that, not longer.
#[test]
fn postgres_takeover_after_the_lease_lapses() {
    let Some(url) = fresh_db() else { return };
    let lease = Duration::from_millis(1500);
    let opts = StoreOptions {
        lease,
        ..StoreOptions::default()
    };
    let dir_b = tempfile::tempdir().expect("tmp");
    // The dead proxy: a lease row nobody renews.
    admin(
        &url,
        "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)",
    );
    let b = Arc::new(PgStore::open(&url, dir_b.path(), opts).expect("b"));
    let b_dyn: Arc<dyn LedgerStore> = b.clone();
    let mut s = Sim::new(&b_dyn, "sess-dead", T0);
    s.prompt("ask");
    s.settle();
    admin(
        &url,
        "UPDATE leases SET owner = 'dead-proxy',
            expires_ms = (extract(epoch from clock_timestamp()) * 1000)::bigint + 1500",
    );
    let t = Instant::now();
    let left = b
        .take_leases(&["sess-dead".into()], Duration::from_secs(5))
        .expect("take");
    let waited = t.elapsed();
    assert!(left.is_empty());
    assert!(
        waited >= Duration::from_millis(1000) && waited < Duration::from_millis(3000),
        "{waited:?}"
    );
}

/// A loopback relay to the test server that can be cut (the database
/// going away) and restored.
struct Relay {
    port: u16,
    up: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    fn start(target: std::net::SocketAddr) -> Relay {
        use std::sync::atomic::Ordering;
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (u, c) = (up.clone(), conns.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                if !u.load(Ordering::SeqCst) {
                    drop(s);
                    continue;
                }
                let Ok(t) = std::net::TcpStream::connect(target) else {
                    continue;
                };
                c.lock().unwrap().push(s.try_clone().unwrap());
                c.lock().unwrap().push(t.try_clone().unwrap());
                for (mut from, mut to) in [(s.try_clone().unwrap(), t.try_clone().unwrap()), (t, s)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { port, up, conns }
    }

    fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The database going away: submits never wait, health says degraded with
/// the reason, nothing queued is lost; when it comes back the writer
/// reconnects and commits what waited, and health is ok again.
#[test]
fn postgres_outage_degrades_and_heals() {
    let Some(url) = fresh_db() else { return };
    let hostport = url
        .split("://")
        .nth(1)
        .and_then(|r| r.split('@').nth(1))
        .and_then(|r| r.split('/').next())
        .expect("host:port");
    let target: std::net::SocketAddr = hostport.parse().expect("addr");
    let relay = Relay::start(target);
    let relayed = url.replacen(hostport, &format!("127.0.0.1:{}", relay.port), 1);
    let tmp = tempfile::tempdir().expect("tmp");
    let store: Arc<dyn LedgerStore> =
        Arc::new(PgStore::open(&relayed, tmp.path(), StoreOptions::default()).expect("open"));
    let mut s = Sim::new(&store, "sess-outage", T0);
    s.prompt("before the outage");
    s.settle();
    relay.cut();
    let t = Instant::now();
    s.say("during the outage");
    s.prompt("still during it");
    assert!(t.elapsed() < Duration::from_millis(200), "submit waited");
    let health = eventually(Duration::from_secs(10), "health degraded", || {
        let h = store.health();
        (h.status == oceancode_ledger::store::HealthStatus::Degraded).then_some(h)
    });
    assert!(
        health.reasons.iter().any(|r| r.contains("commits failing")),
        "{:?}",
        health.reasons
    );
    assert!(health.queued > 0);
    relay.restore();
    s.settle();
    let l = store.load_session("sess-outage").expect("load").expect("s");
    assert_eq!(l.rows.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(
        store.health().status,
        oceancode_ledger::store::HealthStatus::Ok
    );
    assert!(store.metrics().commit_retries > 0);
    assert_eq!(store.behind_count(), 0);
}

/// Issue 40 item 9 on PostgreSQL: the database away, a 4-event queue, 10
/// requests (rows and a step each): the rows that did not fit are shed
/// (the session heals from its resend) but every step is kept, with its
/// usage, and read back by the next proxy.
#[test]
fn postgres_shed_requests_keep_their_steps() {
    let Some(url) = fresh_db() else { return };
    let hostport = url
        .split("://")
        .nth(1)
        .and_then(|r| r.split('@').nth(1))
        .and_then(|r| r.split('/').next())
        .expect("host:port");
    let target: std::net::SocketAddr = hostport.parse().expect("addr");
    let relay = Relay::start(target);
    let relayed = url.replacen(hostport, &format!("127.0.0.1:{}", relay.port), 1);
    let tmp = tempfile::tempdir().expect("tmp");
    let opts = || StoreOptions {
        queue_capacity: 4,
        batch_max: 1,
        ..StoreOptions::default()
    };
    let store: Arc<dyn LedgerStore> =
        Arc::new(PgStore::open(&relayed, tmp.path(), opts()).expect("open"));
    let mut s = Sim::new(&store, "sess-shed", T0);
    s.settle();
    relay.cut();
    for n in 1..=10u64 {
        s.prompt(&format!("ask {n}"));
        s.say("done");
        s.end_step(1_000 + n, 10 * n, 0, 0);
    }
    assert!(store.metrics().shed > 0, "{:?}", store.metrics());
    relay.restore();
    s.settle();
    store.shutdown().expect("shutdown");
    drop(store);
    let store: Arc<dyn LedgerStore> =
        Arc::new(PgStore::open(&relayed, tmp.path(), opts()).expect("reopen"));
    let got: Vec<(u32, u64, u64)> = store
        .steps("sess-shed")
        .expect("steps")
        .iter()
        .map(|s| (s.step, s.usage.input, s.usage.output))
        .collect();
    let want: Vec<(u32, u64, u64)> = (1..=10u64).map(|n| (n as u32, 1_000 + n, 10 * n)).collect();
    assert_eq!(got, want);
}

/// Every file name under `dir` (recursively).
fn names_under(dir: &std::path::Path) -> Vec<String> {
    snapshot(dir).into_keys().collect()
}

/// Issue 40 item 4: a link inside the data dir is never written through.
/// A session's `transcript/` linked to a directory outside got its turn
/// files and `index.md` written there, and a session dir linked to a
/// project dir got `SESSION.md` (and `transcript/`); the export read a turn
/// file linked to `/dev/zero` until memory ran out (and one linked to a
/// file outside into the export). Now the writes are
/// refused (the health says which path), the rebuild too, and the export
/// renders the turn from the database.
#[test]
fn backends_never_write_or_read_through_a_link() {
    use std::os::unix::fs::symlink;
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let data = tmp.path().join("data");
        let outside = tmp.path().join("outside");
        let project = tmp.path().join("project");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::create_dir_all(&project).expect("project");
        let store = b.open(&data);
        let dir = store.data_dir().clone();
        std::fs::create_dir_all(dir.session_dir("sess-tl")).expect("session dir");
        symlink(&outside, dir.transcript_dir("sess-tl")).expect("link transcript/");
        symlink(&project, dir.session_dir("sess-sl")).expect("link the session dir");
        for id in ["sess-tl", "sess-sl"] {
            let mut s = Sim::new(&store, id, T0);
            s.prompt("the task");
            s.say("done");
            s.end_step(100, 10, 0, 0);
            s.settle();
            // The rows are kept: only the files are refused.
            assert_eq!(
                store.session_rows(id, false).expect("rows").len(),
                2,
                "{}",
                b.name()
            );
            assert!(store.rebuild(id, None).is_err(), "{} {id}", b.name());
        }
        assert_eq!(names_under(&outside), Vec::<String>::new(), "{}", b.name());
        assert_eq!(names_under(&project), Vec::<String>::new(), "{}", b.name());
        let h = store.health();
        let reasons = h.reasons.join("\n");
        assert!(reasons.contains("symlink"), "{}: {reasons}", b.name());

        // A turn file linked to /dev/zero: the export renders the turn
        // from the database instead of reading the link.
        let mut s = Sim::new(&store, "sess-zero", T0);
        s.prompt("the task");
        s.say("done");
        s.settle();
        let turn = dir.turn_file("sess-zero", 1);
        let mut plain = Vec::new();
        oceancode_ledger::export::markdown(&*store, "sess-zero", &|_| None, &mut plain, None)
            .expect("export");
        let secret = tmp.path().join("secret.md");
        std::fs::write(&secret, "OUTSIDE-SECRET\n").expect("secret");
        for target in [secret.as_path(), std::path::Path::new("/dev/zero")] {
            std::fs::remove_file(&turn).expect("rm");
            symlink(target, &turn).expect("link the turn file");
            let mut linked = Vec::new();
            oceancode_ledger::export::markdown(&*store, "sess-zero", &|_| None, &mut linked, None)
                .expect("export");
            assert_eq!(
                String::from_utf8_lossy(&linked),
                String::from_utf8_lossy(&plain),
                "{} {}",
                b.name(),
                target.display()
            );
        }
    }
}

/// Issue 40 item 4: the retention sweep removes a session's files with no
/// link followed: with `sessions/` a link to another directory, the sweep
/// removed that directory's `<id>/` (std's `remove_dir_all` follows the
/// links of the path's parents); now it refuses, naming the link, and a
/// session dir that is a link is removed itself, not its target.
#[test]
fn backends_sweep_removes_no_file_through_a_link() {
    use std::os::unix::fs::symlink;
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let data = tmp.path().join("data");
        let store = b.open(&data);
        let dir = store.data_dir().clone();
        // A session dir that is a link to a project: the link goes, the
        // project stays.
        let project = tmp.path().join("project");
        std::fs::create_dir_all(&project).expect("project");
        std::fs::write(project.join("main.rs"), "fn main() {}").expect("file");
        let mut s = Sim::new(&store, "sess-linked", T0);
        s.prompt("old work");
        s.settle();
        std::fs::remove_dir_all(dir.session_dir("sess-linked")).expect("rm");
        symlink(&project, dir.session_dir("sess-linked")).expect("link");
        let now = oceancode_now();
        let report = store.sweep_at(2, now).expect("sweep");
        assert_eq!(
            report.removed,
            vec!["sess-linked".to_string()],
            "{}",
            b.name()
        );
        assert!(project.join("main.rs").exists(), "{}", b.name());
        assert!(std::fs::symlink_metadata(dir.session_dir("sess-linked")).is_err());
        // `sessions/` itself a link: nothing is removed through it.
        let mut s = Sim::new(&store, "sess-old", T0);
        s.prompt("old work");
        s.settle();
        let moved = tmp.path().join("elsewhere");
        std::fs::rename(dir.sessions_dir(), &moved).expect("move");
        symlink(&moved, dir.sessions_dir()).expect("link sessions/");
        let e = store.sweep_at(2, now).expect_err("refused");
        assert!(e.to_string().contains("symlink"), "{}: {e}", b.name());
        assert!(moved.join("sess-old").exists(), "{}", b.name());
    }
}

/// A session linked to `parent` (a sub-agent's, as the proxy records it).
fn related(store: &Arc<dyn LedgerStore>, id: &str, parent: Option<&str>, ms: i64) -> Sim {
    related_keyed(store, id, parent, ms, &format!("cc:{id}"))
}

/// [`related`] under the client key `key`.
fn related_keyed(
    store: &Arc<dyn LedgerStore>,
    id: &str,
    parent: Option<&str>,
    ms: i64,
    key: &str,
) -> Sim {
    let s = Sim::new(store, id, ms);
    store
        .submit(Event::Session(oceancode_window::SessionMeta {
            id: id.into(),
            client: "claude-code".into(),
            client_session: Some(key.to_string()),
            dialect: oceancode_window::Dialect::Anthropic,
            model: s.model.clone(),
            parent: parent.map(str::to_string),
            parent_seq: None,
            created_ms: T0,
            last_ms: ms,
        }))
        .expect("session");
    s
}

/// The sessions (sorted) whose rows a search for `word` in `scope` finds.
fn sessions_found(
    store: &Arc<dyn LedgerStore>,
    word: &str,
    scope: oceancode_ledger::recall::Scope<'_>,
) -> Vec<String> {
    let mut v: Vec<String> = store
        .search_in(&[word.into()], 100, scope)
        .expect("search")
        .into_iter()
        .map(|h| h.session)
        .collect();
    v.sort();
    v
}

/// Issue 40.3: the recall tool's search reads the calling session, its
/// parent, its children and its siblings, nothing else; the scope `All`
/// (the CLI, the viewer) reads every session.
#[test]
fn backends_scope_a_related_search_to_the_sessions_family() {
    use oceancode_ledger::recall::Scope;
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let family = [
            ("p", None),
            ("c1", Some("p")),
            ("c2", Some("p")),
            ("g1", Some("c1")),
            ("x", None),
            ("xc", Some("x")),
        ];
        for (i, (id, parent)) in family.iter().enumerate() {
            let mut s = related(&store, id, *parent, T0 + i as i64 * 1000);
            s.prompt(&format!("the quokka secret of {id}"));
            s.end_step(1, 1, 0, 0);
            s.settle();
        }
        let found = |scope: Scope<'_>| sessions_found(&store, "quokka", scope);
        let n = b.name();
        assert_eq!(found(Scope::Related("c1")), ["c1", "c2", "g1", "p"], "{n}");
        assert_eq!(found(Scope::Related("p")), ["c1", "c2", "p"], "{n}");
        assert_eq!(found(Scope::Related("g1")), ["c1", "g1"], "{n}");
        assert_eq!(found(Scope::Related("x")), ["x", "xc"], "{n}");
        assert_eq!(
            found(Scope::Related("unknown")),
            Vec::<String>::new(),
            "{n}"
        );
        assert_eq!(found(Scope::All).len(), 6, "{n}");
        assert_eq!(store.search(&["quokka".into()], 100).expect("s").len(), 6);
    }
}

/// Issue 40.3, found by the attack on it: sessions told apart only by the
/// fingerprint of their opening (`fp:` keys, no session header) can be two
/// users with the same system prompt and first message, linked as
/// siblings. Their relatives are no family: a fingerprinted session's
/// related search reads itself only.
#[test]
fn backends_scope_a_fingerprinted_sessions_search_to_itself() {
    use oceancode_ledger::recall::Scope;
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let fam = [("fa", None), ("fb", Some("fa")), ("fc", Some("fa"))];
        for (i, (id, parent)) in fam.iter().enumerate() {
            let mut s = related_keyed(&store, id, *parent, T0 + i as i64 * 1000, "fp:00aa");
            s.prompt(&format!("the wombat secret of {id}"));
            s.end_step(1, 1, 0, 0);
            s.settle();
        }
        let found = |scope: Scope<'_>| sessions_found(&store, "wombat", scope);
        let n = b.name();
        assert_eq!(found(Scope::Related("fb")), ["fb"], "{n}");
        assert_eq!(found(Scope::Related("fa")), ["fa"], "{n}");
        assert_eq!(found(Scope::All).len(), 3, "{n}");
    }
}

/// Issue 33.3: a search past the bounds (too many distinct words, too
/// long) is refused as too broad before it runs, on both engines.
#[test]
fn backends_refuse_a_too_broad_search() {
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let mut s = Sim::new(&store, "sess-broad", T0);
        s.prompt("zq0 zq1 zq2 zq3 zq4 zq5 zq6 zq7 zq8");
        s.end_step(1, 1, 0, 0);
        s.settle();
        let many: Vec<String> = (0..9).map(|i| format!("zq{i}")).collect();
        match store.search(&many, 20) {
            Err(StoreError::TooBroad(e)) => {
                assert!(e
                    .to_string()
                    .starts_with("query too broad: 9 distinct words"))
            }
            other => panic!("{}: {other:?}", b.name()),
        }
        assert_eq!(store.search(&many[..8], 20).expect("8 words").len(), 1);
        let long = vec!["zq0".to_string(); 200];
        assert!(
            matches!(store.search(&long, 20), Err(StoreError::TooBroad(_))),
            "{}",
            b.name()
        );
    }
}

/// Issue 32.4: a note the agent wrote (`[[note]]`, in its session's latest
/// edit set) is found by a search like a row: listed first, after the row
/// it follows, within the search's scope; a note an edit removed is not.
#[test]
fn backends_search_finds_the_notes_in_force() {
    use oceancode_ledger::recall::Scope;
    let mut oracle = None;
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let n = b.name();
        let mut s = related(&store, "noted", None, T0 + 1000);
        s.prompt("fix the quasar build");
        s.say("The quasar build fails in net/.");
        s.end_step(1, 1, 0, 0);
        s.settle();
        let mut o = related(&store, "other", None, T0 + 2000);
        o.prompt("nothing about it");
        o.end_step(1, 1, 0, 0);
        o.settle();
        let note = |id: u32, after: u64, text: &str| json!({"id": id, "after": after, "text": text, "raw": "{}"});
        for (k, notes) in [
            (1, vec![note(1, 1, "An old drift note, removed since.")]),
            (2, vec![note(2, 2, "Quasar drift: only net/ fails.")]),
        ] {
            store
                .submit(Event::ContextEdit {
                    session: "noted".into(),
                    n: k,
                    set: json!({"deleted": [], "rewritten": {}, "notes": notes, "next_note": 2})
                        .to_string(),
                    seqs: vec![],
                    tokens_before: 100,
                    tokens_after: 110,
                    ts_ms: T0 + 3000 + i64::from(k),
                })
                .expect("edit");
        }
        store.settle_blocking().expect("settle");
        let find = |words: &[&str], scope: Scope<'_>| -> Vec<String> {
            let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
            store
                .search_in(&words, 10, scope)
                .expect("search")
                .iter()
                .map(|h| h.line(true))
                .collect()
        };
        let drift = find(&["drift"], Scope::All);
        assert_eq!(
            drift,
            ["noted · seq 2 · t01 · note 2 · Quasar [drift]: only net/ fails"],
            "{n}"
        );
        let quasar = find(&["QUASAR"], Scope::Related("noted"));
        assert_eq!(quasar.len(), 3, "{n}: {quasar:?}");
        assert!(
            quasar[0].contains("note 2"),
            "{n}: the note first: {quasar:?}"
        );
        assert_eq!(
            find(&["quasar", "drift"], Scope::Related("other")),
            Vec::<String>::new(),
            "{n}"
        );
        assert_eq!(find(&["quasar"], Scope::All).len(), 3, "{n}");
        let one: Vec<String> = store
            .search(&["quasar".into()], 1)
            .expect("search")
            .iter()
            .map(|h| h.role.clone())
            .collect();
        assert_eq!(one, ["note 2"], "{n}: the limit holds");
        match &oracle {
            None => oracle = Some((drift, quasar)),
            Some(o) => assert_eq!(o, &(drift, quasar), "{n}"),
        }
    }
}
