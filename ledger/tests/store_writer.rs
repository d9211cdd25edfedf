//! The single writer: ordering, gap-free prefix, settle, batching, shutdown,
//! reload, branches, metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::{
    BehindReason, HealthStatus, LoadedSession, SentPointers, Store, StoreError, StoreOptions,
};
use oceancode_ledger::store::{LedgerRead, LedgerWrite};
use oceancode_testkit::eventually;
use oceancode_testkit::ledger::*;
use oceancode_window::{Dialect, Event, InternalRecall, RowKind, SentWindow, StepDetail, Usage};
use std::time::Duration;

fn session(store: &Store, id: &str) {
    store
        .submit(Event::Session(meta(id, Dialect::Anthropic)))
        .expect("submit session");
}

#[test]
fn store_wal_mode_and_schema() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let c = rusqlite::Connection::open(store.db_path()).expect("open");
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("pragma");
    assert_eq!(mode, "wal");
    let v: i64 = c
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(v, oceancode_ledger::store::SCHEMA_VERSION);
    drop(c);
    // Reopening an existing database keeps the version (one row).
    store.shutdown().expect("shutdown");
    let store = open(tmp.path());
    let c = rusqlite::Connection::open(store.db_path()).expect("open");
    let n: i64 = c
        .query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0))
        .expect("count");
    assert_eq!(n, 1);
    // A newer schema is refused.
    c.execute("UPDATE schema_version SET version = 99", [])
        .expect("bump");
    drop(c);
    store.shutdown().expect("shutdown");
    match Store::open(tmp.path(), StoreOptions::default()) {
        Err(StoreError::SchemaTooNew { found: 99, .. }) => {}
        other => panic!("expected SchemaTooNew, got {:?}", other.map(|_| ())),
    }
}

/// Only a gap-free prefix reaches the database: an event that does not
/// continue what is committed is refused and leaves its session behind (its
/// later events dropped) until it is resynced.
#[test]
fn store_gap_free_prefix() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    let refused = |store: &Store, ev: Event| {
        store.submit(ev).expect("submit");
        store.settle_blocking().expect("settle");
        let b = store.behind("g").expect("refused: behind");
        assert_eq!(b.reason, BehindReason::Gap);
        assert!(b.ready);
        store.resync("g").expect("resync")
    };
    // Rows before the session exists are refused.
    let early = rows_event("g", vec![text_row(1, 1, RowKind::Prompt, "early")]);
    assert_eq!(refused(&store, early), None);
    session(&store, "g");
    let r = |seq| text_row(seq, 1, RowKind::Assistant, &format!("row {seq}"));
    store
        .submit(rows_event("g", vec![r(1), r(2), r(3)]))
        .expect("submit");
    // A gap: refused, and what follows it is dropped until the resync.
    store.submit(rows_event("g", vec![r(5)])).expect("gap");
    store.settle_blocking().expect("settle");
    store.submit(rows_event("g", vec![r(4)])).expect("dropped");
    let after_gap = store.resync("g").expect("resync").expect("g");
    assert_eq!(after_gap.rows.len(), 3);
    let dup = refused(&store, rows_event("g", vec![r(3)])).expect("g");
    assert_eq!(dup.rows.len(), 3);
    let hole = refused(&store, rows_event("g", vec![r(4), r(6)])).expect("g");
    assert_eq!(hole.rows.len(), 3);
    store.submit(rows_event("g", vec![r(4)])).expect("next"); // ok
    let confirm = Event::Confirm {
        session: "g".into(),
        seq: 42,
        raw: "{}".into(),
    };
    refused(&store, confirm).expect("confirm of an unknown row");
    let loaded = store.load_session("g").expect("load").expect("exists");
    let seqs: Vec<u64> = loaded.rows.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    assert_eq!(&*loaded.rows[3].raw, &*r(4).raw);
    let m = store.metrics();
    assert_eq!((m.rejected, m.shed, m.behind), (5, 1, 0), "{m:?}");
    assert_eq!(m.commits_failed, 0);
}

#[test]
fn store_settle_sees_everything_before_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::open(
        tmp.path(),
        StoreOptions {
            queue_capacity: 64,
            batch_max: 8,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    session(&store, "s");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for round in 0..20u64 {
        let base = round * 10;
        let rows = (1..=10)
            .map(|i| text_row(base + i, round as u32 + 1, RowKind::Assistant, "x"))
            .collect();
        store.submit(rows_event("s", rows)).expect("submit");
        // Async settle from inside a runtime, then read without settling.
        rt.block_on(store.settle()).expect("settle");
        let list = store.list_sessions().expect("list");
        assert_eq!(list[0].rows, base + 10);
        assert_eq!(list[0].turns, round as u32 + 1);
        // Its transcript is written too.
        let f = store.data_dir().turn_file("s", round as u32 + 1);
        let text = std::fs::read_to_string(&f).expect("turn file written before settle resolves");
        assert!(text.contains(&format!("## seq {} · ", base + 10)));
    }
}

/// 10k events from 4 threads: every session keeps its order, nothing lost,
/// and the writer batches.
#[test]
fn store_burst_batches_in_order() {
    const THREADS: u64 = 4;
    const PER: u64 = 2500;
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::open(
        tmp.path(),
        StoreOptions {
            queue_capacity: 16_384,
            batch_max: 128,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    for t in 0..THREADS {
        session(&store, &format!("burst-{t}"));
    }
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let id = format!("burst-{t}");
                for seq in 1..=PER {
                    let turn = ((seq - 1) / 25 + 1) as u32;
                    let kind = if (seq - 1) % 25 == 0 {
                        RowKind::Prompt
                    } else {
                        RowKind::Assistant
                    };
                    let r = text_row(seq, turn, kind, &format!("t{t} n{seq}"));
                    store.submit(rows_event(&id, vec![r])).expect("submit");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    store.settle_blocking().expect("settle");
    let m = store.metrics();
    eprintln!("burst metrics: {m:?}");
    assert_eq!(m.events, THREADS * PER + THREADS, "{m:?}");
    assert_eq!(m.rejected, 0, "{m:?}");
    assert_eq!(m.queued, 0);
    assert_eq!(m.writer_lag_ms, 0);
    assert!(m.batches < m.events / 4, "expected batching: {m:?}");
    assert!(m.lag_p99_us >= m.lag_p50_us && m.lag_max_us >= m.lag_p99_us);
    assert!(m.lag_max_us > 0);
    for t in 0..THREADS {
        let id = format!("burst-{t}");
        let s = store.load_session(&id).expect("load").expect("exists");
        assert_eq!(s.rows.len() as u64, PER);
        for (i, r) in s.rows.iter().enumerate() {
            let seq = i as u64 + 1;
            assert_eq!(r.seq, seq);
            assert!(r.raw.contains(&format!("\"t{t} n{seq}\"")), "{}", r.raw);
        }
        let idx = std::fs::read_to_string(store.data_dir().index_file(&id)).expect("index");
        assert!(idx.contains("| [100](0100.md) | 2476–2500 | "), "{idx}");
        assert!(idx.contains("\n100 turns · "));
        let last = std::fs::read_to_string(store.data_dir().turn_file(&id, 100)).expect("turn");
        assert_eq!(last.matches("\n## seq ").count(), 25);
    }
}

/// A cold open of a long history does not hold up other sessions (issue
/// 38): its rows are committed in slices, and a row of another session
/// queued behind it commits between two of them; each session's rows stay
/// a gap-free, in-order prefix and the long `Rows` counts as one event.
#[test]
fn store_long_rows_commit_in_slices_between_other_sessions() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    session(&store, "long");
    session(&store, "short");
    store.settle_blocking().expect("settle");
    let before = store.metrics();
    // Hold the write lock so both events are queued before anything commits.
    let blocker = rusqlite::Connection::open(store.db_path()).expect("open");
    blocker.execute_batch("BEGIN IMMEDIATE").expect("lock");
    let kind = |seq: u64| {
        if (seq - 1).is_multiple_of(40) {
            RowKind::Prompt
        } else {
            RowKind::Assistant
        }
    };
    let rows = (1..=2001)
        .map(|seq| text_row(seq, ((seq - 1) / 40 + 1) as u32, kind(seq), "open"))
        .collect();
    store.submit(rows_event("long", rows)).expect("submit");
    store
        .submit(rows_event(
            "short",
            vec![text_row(1, 1, RowKind::Prompt, "step")],
        ))
        .expect("submit");
    blocker.execute_batch("COMMIT").expect("unlock");
    store.settle_blocking().expect("settle");
    let c = rusqlite::Connection::open(store.db_path()).expect("open");
    let short: i64 = c
        .query_row("SELECT rowid FROM rows WHERE session = 'short'", [], |r| {
            r.get(0)
        })
        .expect("short row");
    let long: Vec<(i64, u64)> = c
        .prepare("SELECT rowid, seq FROM rows WHERE session = 'long' ORDER BY rowid")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(long.len(), 2001);
    assert!(
        long.iter()
            .enumerate()
            .all(|(i, (_, seq))| *seq == i as u64 + 1),
        "committed in order"
    );
    let last = long.last().expect("rows").0;
    assert!(
        short < last,
        "the other session's row ({short}) waited for all 2001 rows (last {last})"
    );
    let m = store.metrics();
    assert_eq!(m.events - before.events, 2, "{m:?}");
    assert_eq!((m.queued, m.rejected, m.behind), (0, 0, 0), "{m:?}");
    assert!(
        m.batches - before.batches >= 8,
        "one slice a transaction: {m:?}"
    );
    let s = store.load_session("long").expect("load").expect("long");
    assert_eq!(s.rows.len(), 2001);
    let newest = std::fs::read_to_string(store.data_dir().turn_file("long", 51)).expect("turn");
    assert!(newest.contains("## seq 2001 · "), "{newest}");
}

/// The files of what committed are written once nothing waits to be
/// committed, without a settle to ask for them (issue 38 moved them after
/// the commits): a session's newest turn file appears by itself.
#[test]
fn store_files_written_without_a_settle() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    session(&store, "s");
    let rows = (1..=3)
        .map(|seq| text_row(seq, 1, RowKind::Assistant, "idle"))
        .collect();
    store.submit(rows_event("s", rows)).expect("submit");
    let f = store.data_dir().turn_file("s", 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        if text.contains("## seq 3 · ") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "turn file not written without a settle: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn store_shutdown_drains_and_is_idempotent() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    session(&store, "d");
    for seq in 1..=1000 {
        store
            .submit(rows_event(
                "d",
                vec![text_row(seq, 1, RowKind::Assistant, "y")],
            ))
            .expect("submit");
    }
    let clone = store.clone();
    store.shutdown().expect("shutdown");
    clone.shutdown().expect("second shutdown is a no-op");
    assert!(matches!(
        clone.submit(Event::Session(meta("late", Dialect::Anthropic))),
        Err(StoreError::Closed)
    ));
    assert!(matches!(clone.settle_blocking(), Err(StoreError::Closed)));
    drop((store, clone));
    let store = open(tmp.path());
    let s = store.load_session("d").expect("load").expect("exists");
    assert_eq!(s.rows.len(), 1000);
    assert_eq!(s.rows.last().map(|r| r.seq), Some(1000));
    // Dropping the last clone also drains.
    session(&store, "e");
    store
        .submit(rows_event("e", vec![text_row(1, 1, RowKind::Prompt, "z")]))
        .expect("submit");
    drop(store);
    let store = open(tmp.path());
    assert_eq!(
        store
            .load_session("e")
            .expect("load")
            .expect("e")
            .rows
            .len(),
        1
    );
}

#[test]
fn store_branch_hides_rows_but_keeps_them() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    session(&store, "b");
    let rows = vec![
        text_row(1, 1, RowKind::Prompt, "first ask"),
        text_row(2, 1, RowKind::Assistant, "answer one"),
        text_row(3, 2, RowKind::Prompt, "second ask"),
        text_row(4, 2, RowKind::Assistant, "answer two"),
        text_row(5, 3, RowKind::Prompt, "third ask"),
        text_row(6, 3, RowKind::Assistant, "answer three"),
    ];
    store.submit(rows_event("b", rows)).expect("submit");
    store.settle_blocking().expect("settle");
    let layout = store.data_dir().clone();
    assert!(layout.turn_file("b", 3).exists());
    // The client rewound to after seq 3 and asked differently.
    store
        .submit(Event::Branch {
            session: "b".into(),
            at_seq: 3,
            branch: 1,
            hidden: vec![4, 5, 6],
        })
        .expect("branch");
    let mut r7 = text_row(7, 2, RowKind::Assistant, "better answer two");
    r7.branch = 1;
    store.submit(rows_event("b", vec![r7])).expect("rows");
    store.settle_blocking().expect("settle");

    let s = store.load_session("b").expect("load").expect("b");
    assert_eq!(s.rows.len(), 7, "hidden rows are kept");
    assert_eq!(s.hidden, vec![4, 5, 6]);
    assert_eq!(s.branch, 1);
    assert_eq!(s.rows[6].branch, 1);
    let t2 = std::fs::read_to_string(layout.turn_file("b", 2)).expect("turn 2");
    assert!(t2.contains("second ask") && t2.contains("better answer two"));
    assert!(!t2.contains("answer two\n") || t2.contains("better answer two\n"));
    assert!(!t2.contains("## seq 4 "));
    assert!(
        !layout.turn_file("b", 3).exists(),
        "a turn wholly on the old line is removed"
    );
    let idx = std::fs::read_to_string(layout.index_file("b")).expect("index");
    assert!(idx.contains("| [2](0002.md) | 3–7 | "), "{idx}");
    assert!(!idx.contains("0003.md"));
    let list = store.list_sessions().expect("list");
    assert_eq!((list[0].rows, list[0].turns), (4, 2));
}

/// Rows a sibling took leave the session without a branch: hidden, kept,
/// out of the transcript.
#[test]
fn store_hide_hides_rows_without_a_branch() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    session(&store, "h");
    let mut theirs = text_row(3, 1, RowKind::Assistant, "another agent's answer");
    theirs.from_response = true;
    let rows = vec![
        text_row(1, 1, RowKind::Prompt, "first ask"),
        text_row(2, 1, RowKind::Assistant, "my answer"),
        theirs,
        text_row(4, 2, RowKind::Prompt, "second ask"),
    ];
    store.submit(rows_event("h", rows)).expect("submit");
    store.settle_blocking().expect("settle");
    let layout = store.data_dir().clone();
    let t1 = std::fs::read_to_string(layout.turn_file("h", 1)).expect("turn 1");
    assert!(t1.contains("another agent's answer"));
    store
        .submit(Event::Hide {
            session: "h".into(),
            seqs: vec![3],
        })
        .expect("hide");
    store.settle_blocking().expect("settle");
    let s = store.load_session("h").expect("load").expect("h");
    assert_eq!(s.rows.len(), 4, "kept");
    assert_eq!(s.hidden, vec![3]);
    assert_eq!(s.branch, 0, "no branch");
    let t1 = std::fs::read_to_string(layout.turn_file("h", 1)).expect("turn 1");
    assert!(!t1.contains("another agent's answer"), "{t1}");
    assert!(t1.contains("my answer"));
    let list = store.list_sessions().expect("list");
    assert_eq!((list[0].rows, list[0].turns), (3, 2));
}

/// What was written is what a reload after restart reads back.
#[test]
fn store_reopen_loads_same_session() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rows = fixture_rows("anthropic");
    let mut m = meta("reload", Dialect::Anthropic);
    m.parent = Some("root".into());
    let usage = Usage {
        input: 10,
        output: 20,
        cache_read: 300,
        cache_write: 4,
    };
    {
        let store = open(tmp.path());
        store
            .submit(Event::Session(meta("root", Dialect::Anthropic)))
            .expect("s");
        store.submit(Event::Session(m.clone())).expect("s");
        let mut with_resp = rows.clone();
        with_resp[2].from_response = true;
        store
            .submit(rows_event("reload", with_resp[..5].to_vec()))
            .expect("rows");
        store
            .submit(Event::Step {
                session: "reload".into(),
                step: 1,
                model: "claude-opus-5-5".into(),
                status: 200,
                usage,
                window_rows: 5,
                ts_ms: m.last_ms + 10,
                error: None,
                // A recall the proxy answered and kept after row 3.
                detail: Box::new(StepDetail {
                    recalls: vec![InternalRecall {
                        round: 1,
                        call_id: "toolu_r".into(),
                        input: "{}".into(),
                        result_chars: 2,
                        continued: false,
                        messages: vec!["call".into(), "result".into()],
                        after: Some(3),
                    }],
                    // Its window sent row 2's output as a compress pointer.
                    sent: Some(SentWindow {
                        upto: 5,
                        pointers: Some(vec![(2, vec![(0, "[pruned tool output: seq 2]".into())])]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .expect("step");
        store
            .submit(Event::Confirm {
                session: "reload".into(),
                seq: 3,
                raw: std::sync::Arc::from(&*rows[2].raw),
            })
            .expect("confirm");
        store
            .submit(rows_event("reload", rows[5..].to_vec()))
            .expect("rows");
        store
            .submit(Event::Step {
                session: "reload".into(),
                step: 2,
                model: "claude-opus-5-5".into(),
                status: 500,
                usage: Usage::default(),
                window_rows: 9,
                ts_ms: m.last_ms + 20,
                error: None,
                // One whose continuation failed: not kept, not restored.
                detail: Box::new(StepDetail {
                    recalls: vec![InternalRecall {
                        round: 1,
                        messages: vec!["lost".into()],
                        ..Default::default()
                    }],
                    // The same pointers, named by the step that kept them.
                    sent: Some(SentWindow {
                        upto: 5,
                        pointers_step: 1,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .expect("step");
        store
            .submit(Event::Cut {
                session: "reload".into(),
                upto_seq: 5,
                gauge: 1000,
                line: 800,
                ts_ms: m.last_ms + 30,
            })
            .expect("cut");
        store.shutdown().expect("shutdown");
    }
    let store = open(tmp.path());
    let got = store.load_session("reload").expect("load").expect("exists");
    let mut want_meta = m.clone();
    want_meta.last_ms = m.last_ms + 20;
    let want = LoadedSession {
        meta: want_meta,
        rows: rows.clone(),
        hidden: vec![],
        branch: 0,
        cut_upto: 5,
        last_usage: Some(usage),
        steps: 2,
        context: None,
        exchanges: vec![(3, vec!["call".into(), "result".into()])],
        pointers: Some(SentPointers {
            upto: 5,
            rows: vec![(2, vec![(0, "[pruned tool output: seq 2]".into())])],
        }),
        line_override: None,
        // Both steps sent the same model; the latest one's time.
        models: vec![("claude-opus-5-5".into(), m.last_ms + 20)],
    };
    assert_eq!(got, want);
    assert_eq!(
        store.latest_session().expect("latest").as_deref(),
        Some("reload")
    );
    let list = store.list_sessions().expect("list");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0].id, "reload");
    assert_eq!(list[0].parent.as_deref(), Some("root"));
    assert_eq!((list[0].turns, list[0].rows), (2, 9));
    assert_eq!(list[1].id, "root");
    assert_eq!(store.load_session("nope").expect("load"), None);
}

/// Hold the database's write lock from outside so the writer stalls, then
/// watch the lag and the queue: a full queue never makes `submit` wait; the
/// event is shed and its session falls behind until it is resynced.
#[test]
fn store_lag_metric_and_full_queue() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::open(
        tmp.path(),
        StoreOptions {
            queue_capacity: 4,
            batch_max: 64,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    assert_eq!(store.writer_lag_ms(), 0);
    let blocker = rusqlite::Connection::open(store.db_path()).expect("open");
    blocker.execute_batch("BEGIN IMMEDIATE").expect("lock");
    session(&store, "lag");
    std::thread::sleep(Duration::from_millis(150)); // the writer takes it and waits
                                                    // Fill the queue (4, or 3 if the writer has not taken the first event yet).
    let row = |seq| text_row(seq, 1, RowKind::Assistant, "l");
    let mut seq = 1;
    let ev = loop {
        match store.try_submit(rows_event("lag", vec![row(seq)])) {
            Ok(()) => seq += 1,
            Err(StoreError::QueueFull(ev)) => break *ev,
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(seq <= 5, "queue never filled");
    };
    assert!(seq >= 4, "queue full too early: {seq}");
    // `try_submit` hands the event back and leaves the session as it was.
    assert_eq!(store.behind("lag"), None);
    // `submit` sheds it at once: the session is behind from it on.
    store.submit(ev).expect("shed, not an error");
    store
        .submit(rows_event("lag", vec![row(seq + 1)]))
        .expect("dropped with its session");
    let behind = store.behind("lag").expect("behind");
    assert_eq!(behind.reason, BehindReason::Shed);
    assert!(!behind.ready, "its earlier events are still queued");
    // The lag grows while the lock is held (past the 250 ms the end checks).
    eventually(Duration::from_secs(5), "a writer lag of 250 ms", || {
        store.writer_lag_ms() >= 250
    });
    assert!(
        store.writer_lag_ms() >= 200,
        "lag {}",
        store.writer_lag_ms()
    );
    let m = store.metrics();
    assert_eq!((m.shed, m.behind, m.queued), (2, 1, seq), "{m:?}");
    assert_eq!(store.health().status, HealthStatus::Degraded);
    blocker.execute_batch("COMMIT").expect("unlock");
    store.settle_blocking().expect("settle");
    assert_eq!(store.writer_lag_ms(), 0);
    let m = store.metrics();
    assert_eq!((m.queued, m.rejected, m.commits_failed), (0, 0, 0), "{m:?}");
    assert!(m.lag_max_us >= 250_000, "{m:?}");
    assert!(store.behind("lag").expect("still behind").ready);
    // The resync hands back what is committed; the client's resend then
    // brings the rest.
    let s = store.resync("lag").expect("resync").expect("lag");
    assert_eq!(s.rows.len() as u64, seq - 1);
    assert_eq!(store.behind("lag"), None);
    store
        .submit(rows_event("lag", vec![row(seq), row(seq + 1)]))
        .expect("resend");
    let s = store.load_session("lag").expect("load").expect("lag");
    assert_eq!(s.rows.len() as u64, seq + 1);
    assert_eq!(store.health().status, HealthStatus::Ok);
}

#[test]
fn store_handle_is_send_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    send_sync(&store);
    let fut = store.settle();
    send(&fut);
    drop(fut);
}

#[test]
fn store_confirm_and_session_upsert() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open(tmp.path());
    session(&store, "c");
    let mut reassembled = text_row(2, 1, RowKind::Assistant, "reassembled by the proxy");
    reassembled.from_response = true;
    store
        .submit(rows_event(
            "c",
            vec![text_row(1, 1, RowKind::Prompt, "ask"), reassembled],
        ))
        .expect("rows");
    store.settle_blocking().expect("settle");
    let f = store.data_dir().turn_file("c", 1);
    assert!(std::fs::read_to_string(&f)
        .expect("turn")
        .contains("reassembled by the proxy"));
    let echoed = text_row(2, 1, RowKind::Assistant, "as the client echoed it");
    store
        .submit(Event::Confirm {
            session: "c".into(),
            seq: 2,
            raw: std::sync::Arc::from(&*echoed.raw),
        })
        .expect("confirm");
    let mut later = meta("c", Dialect::Anthropic);
    later.model = "claude-fable-5-1".into();
    later.created_ms += 99_999;
    later.last_ms += 99_999;
    store.submit(Event::Session(later.clone())).expect("upsert");
    store.settle_blocking().expect("settle");
    let text = std::fs::read_to_string(&f).expect("turn");
    assert!(text.contains("as the client echoed it") && !text.contains("reassembled"));
    let s = store.load_session("c").expect("load").expect("c");
    assert_eq!(&*s.rows[1].raw, &*echoed.raw);
    assert!(!s.rows[1].from_response);
    assert_eq!(s.meta.model, "claude-fable-5-1");
    assert_eq!(s.meta.created_ms, meta("c", Dialect::Anthropic).created_ms);
    assert_eq!(s.meta.last_ms, later.last_ms);
    let idx = std::fs::read_to_string(store.data_dir().index_file("c")).expect("index");
    assert!(idx.contains("- model: claude-fable-5-1\n"));
}
