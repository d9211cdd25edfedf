//! Ledger faults: a database locked past the busy timeout, a full write
//! queue, the data dir deleted while serving, transcript holes. Nothing
//! already submitted is lost while the process lives; what had to be shed
//! leaves its session *behind*, and a resync plus the client's full resend
//! heals it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::{BehindReason, HealthStatus, Store, StoreOptions};
use oceancode_ledger::store::{LedgerRead, LedgerWrite};
use oceancode_testkit::eventually;
use oceancode_testkit::ledger::*;
use oceancode_window::{Dialect, Event, Row, RowKind, Usage};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// The store's busy timeout in these tests.
const BUSY: Duration = Duration::from_millis(200);
/// How long the tests hold the database: several busy timeouts (before the
/// fix, a batch was retried once and then lost).
const HOLD: Duration = Duration::from_millis(1_500);

fn fault_store(dir: &Path, queue_capacity: usize, batch_max: usize) -> Store {
    Store::open(
        dir,
        StoreOptions {
            queue_capacity,
            batch_max,
            busy_timeout: BUSY,
            ..StoreOptions::default()
        },
    )
    .expect("open")
}

fn r(seq: u64) -> Row {
    let turn = (seq as u32).div_ceil(2);
    let kind = if seq % 2 == 1 {
        RowKind::Prompt
    } else {
        RowKind::Assistant
    };
    text_row(seq, turn, kind, &format!("row {seq}"))
}

fn seqs(store: &Store, id: &str) -> Vec<u64> {
    store
        .session_rows(id, true)
        .expect("rows")
        .into_iter()
        .map(|(row, _)| row.seq)
        .collect()
}

/// Holds the write lock of the database until dropped or released.
struct Lock(rusqlite::Connection);

impl Lock {
    fn take(db: &Path) -> Lock {
        let c = rusqlite::Connection::open(db).expect("open");
        c.execute_batch("BEGIN EXCLUSIVE").expect("lock");
        Lock(c)
    }
    fn release(self) {
        self.0.execute_batch("COMMIT").expect("unlock");
    }
}

/// Issue 12 item 1: a batch that fails (the database locked for longer
/// than the busy timeout) is retried, not lost: every row submitted during
/// the fault is in the ledger afterwards, and a session created during it
/// too.
#[test]
fn a_locked_database_loses_no_row() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = fault_store(tmp.path(), 4096, 512);
    for id in ["a", "b"] {
        store
            .submit(Event::Session(meta(id, Dialect::Anthropic)))
            .expect("session");
        store
            .submit(rows_event(id, vec![r(1), r(2)]))
            .expect("rows");
    }
    store.settle_blocking().expect("settle");
    let lock = Lock::take(store.db_path());
    // Sessions keep writing through the fault, before and after the busy
    // timeout ran out.
    for seq in 3..=6 {
        for id in ["a", "b"] {
            store.submit(rows_event(id, vec![r(seq)])).expect("rows");
        }
    }
    std::thread::sleep(HOLD);
    store
        .submit(Event::Session(meta("c", Dialect::Anthropic)))
        .expect("new session during the fault");
    store
        .submit(rows_event("c", vec![r(1), r(2), r(3)]))
        .expect("rows");
    for seq in 7..=8 {
        for id in ["a", "b"] {
            store.submit(rows_event(id, vec![r(seq)])).expect("rows");
        }
    }
    // Health tells, with the reason and the lag, once the writer holds
    // all 14 events it cannot commit.
    let h = eventually(Duration::from_secs(5), "14 events queued", || {
        let h = store.health();
        if h.status == HealthStatus::Degraded && h.queued == 14 {
            Ok(h)
        } else {
            Err(h)
        }
    });
    assert_eq!(h.status, HealthStatus::Degraded, "{h:?}");
    assert!(
        h.reasons.iter().any(|r| r.contains("commits failing")),
        "{h:?}"
    );
    assert!(h.lag_ms >= HOLD.as_millis() as u64, "{h:?}");
    assert_eq!(h.queued, 14, "{h:?}");
    lock.release();
    store.settle_blocking().expect("settle");
    assert_eq!(seqs(&store, "a"), (1..=8).collect::<Vec<_>>());
    assert_eq!(seqs(&store, "b"), (1..=8).collect::<Vec<_>>());
    assert_eq!(seqs(&store, "c"), vec![1, 2, 3]);
    let m = store.metrics();
    assert_eq!((m.commits_failed, m.rejected, m.behind), (0, 0, 0), "{m:?}");
    assert!(m.commit_retries >= 2, "{m:?}");
    let h = store.health();
    assert_eq!((h.status, h.lag_ms), (HealthStatus::Ok, 0), "{h:?}");
}

/// Issue 12 item 2: with a tiny queue and the database locked, `submit`
/// returns at once (it never waits for queue space).
#[test]
fn submit_never_waits_for_a_full_queue() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = fault_store(tmp.path(), 4, 1);
    store
        .submit(Event::Session(meta("q", Dialect::Anthropic)))
        .expect("session");
    store.settle_blocking().expect("settle");
    let lock = Lock::take(store.db_path());
    let (done_tx, done_rx) = mpsc::channel();
    let submitter = {
        let store = store.clone();
        std::thread::spawn(move || {
            for seq in 1..=40 {
                store.submit(rows_event("q", vec![r(seq)])).expect("submit");
            }
            let _ = done_tx.send(());
        })
    };
    let returned = done_rx.recv_timeout(Duration::from_millis(2_000));
    let during = store.health();
    lock.release();
    submitter.join().expect("submitter");
    assert!(
        returned.is_ok(),
        "40 submits did not return while the writer was stalled"
    );
    // What did not fit was shed; the session is behind, and health says so.
    assert_eq!(during.status, HealthStatus::Degraded);
    assert!(during.queued <= 4, "{during:?}");
    store.settle_blocking().expect("settle");
    let m = store.metrics();
    assert!(m.shed >= 36, "{m:?}");
    let b = store.behind("q").expect("behind");
    assert_eq!(b.reason, BehindReason::Shed);
    assert!(b.ready);
    assert!(store
        .health()
        .reasons
        .iter()
        .any(|r| r.contains("1 sessions behind")));
    // The resync hands back the committed prefix; the client's next full
    // resend carries the rest.
    let prefix = store.resync("q").expect("resync").expect("q");
    let next = prefix.rows.len() as u64 + 1;
    assert!(next <= 5, "at most the queue's 4 events were kept: {next}");
    store
        .submit(rows_event("q", (next..=40).map(r).collect()))
        .expect("resend");
    store.settle_blocking().expect("settle");
    assert_eq!(seqs(&store, "q"), (1..=40).collect::<Vec<_>>());
    assert_eq!(store.health().status, HealthStatus::Ok);
}

/// One finished request's step, with usage that names it.
fn step_event(id: &str, step: u32) -> Event {
    Event::Step {
        session: id.to_string(),
        step,
        model: "claude-opus-5-5".into(),
        status: 200,
        usage: Usage {
            input: 1_000 + u64::from(step),
            output: 10 * u64::from(step),
            cache_read: 0,
            cache_write: 0,
        },
        window_rows: 2 * step,
        ts_ms: 1_796_000_000_000 + i64::from(step),
        error: None,
        detail: Box::default(),
    }
}

/// Issue 40 item 9: the steps of requests whose events were shed (a full
/// queue while the database is locked) are kept, with their usage: rows
/// heal from the client's resend, steps exist nowhere else. Before, 10
/// requests through a 4-event queue kept 2 of 10 steps.
#[test]
fn shed_requests_keep_their_steps() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = fault_store(tmp.path(), 4, 1);
    store
        .submit(Event::Session(meta("s", Dialect::Anthropic)))
        .expect("session");
    store.settle_blocking().expect("settle");
    let lock = Lock::take(store.db_path());
    for step in 1..=10u32 {
        let seq = u64::from(2 * step - 1);
        store
            .submit(rows_event("s", vec![r(seq), r(seq + 1)]))
            .expect("rows");
        store.submit(step_event("s", step)).expect("step");
    }
    let during = store.metrics();
    lock.release();
    store.settle_blocking().expect("settle");
    // The rows did not all fit: the session is behind and heals from the
    // client's resend, as before.
    assert!(during.shed > 0, "{during:?}");
    let b = store.behind("s").expect("behind");
    assert_eq!(b.reason, BehindReason::Shed);
    store.shutdown().expect("shutdown");
    drop(store);
    let store = fault_store(tmp.path(), 4, 1);
    let steps = store.steps("s").expect("steps");
    let got: Vec<(u32, u64, u64)> = steps
        .iter()
        .map(|s| (s.step, s.usage.input, s.usage.output))
        .collect();
    let want: Vec<(u32, u64, u64)> = (1..=10u32)
        .map(|n| (n, 1_000 + u64::from(n), 10 * u64::from(n)))
        .collect();
    assert_eq!(got, want);
}

/// Issue 12 item 3: the data dir deleted while serving is noticed; the
/// ledger is opened afresh in its place instead of committing into the
/// unlinked file.
#[test]
fn a_deleted_data_dir_is_reopened() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let store = fault_store(&data, 4096, 512);
    store
        .submit(Event::Session(meta("d", Dialect::Anthropic)))
        .expect("session");
    store
        .submit(rows_event("d", vec![r(1), r(2)]))
        .expect("rows");
    store.settle_blocking().expect("settle");
    std::fs::remove_dir_all(&data).expect("delete the data dir");
    store
        .submit(rows_event("d", vec![r(3), r(4)]))
        .expect("rows");
    store.settle_blocking().expect("settle");
    assert!(
        store.db_path().exists(),
        "the ledger kept committing into a deleted file"
    );
    assert_eq!(store.metrics().reopens, 1);
    // The session is unknown to the fresh ledger: behind. Its resync finds
    // nothing, and the proxy records it again from the client's resend.
    assert_eq!(store.behind("d").map(|b| b.reason), Some(BehindReason::Gap));
    assert_eq!(store.resync("d").expect("resync"), None);
    store
        .submit(Event::Session(meta("d", Dialect::Anthropic)))
        .expect("session");
    store
        .submit(rows_event("d", (1..=4).map(r).collect()))
        .expect("resend");
    store.settle_blocking().expect("settle");
    assert_eq!(seqs(&store, "d"), vec![1, 2, 3, 4]);
    assert!(store.data_dir().turn_file("d", 2).exists());
    assert_eq!(store.health().status, HealthStatus::Ok);
    // An idle writer notices too (its check runs once a second).
    std::fs::remove_dir_all(&data).expect("delete again");
    eventually(
        Duration::from_secs(5),
        "the deleted data dir noticed",
        || store.db_path().exists(),
    );
    assert_eq!(store.metrics().reopens, 2);
}

/// Issue 12 item 4: a turn file missing while `index.md` links it (kill -9
/// between commit and file write, a read-only period) is written again when
/// the store opens.
#[test]
fn transcript_holes_heal_at_open() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (turn2, before) = {
        let store = fault_store(tmp.path(), 4096, 512);
        store
            .submit(Event::Session(meta("h", Dialect::Anthropic)))
            .expect("session");
        store
            .submit(rows_event("h", (1..=6).map(r).collect()))
            .expect("rows");
        store.shutdown().expect("shutdown");
        let f = store.data_dir().turn_file("h", 2);
        let before = std::fs::read(&f).expect("turn 2");
        std::fs::remove_file(&f).expect("make a hole");
        (f, before)
    };
    let store = fault_store(tmp.path(), 4096, 512);
    store.settle_blocking().expect("settle");
    assert_eq!(std::fs::read(&turn2).ok(), Some(before));
}

/// Issue 12 item 4: turn files that could not be written during a fault are
/// written once the fault clears, without another event of the session.
#[test]
fn transcript_holes_heal_after_a_fault() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = fault_store(tmp.path(), 4096, 512);
    store
        .submit(Event::Session(meta("t", Dialect::Anthropic)))
        .expect("session");
    store
        .submit(rows_event("t", vec![r(1), r(2)]))
        .expect("rows");
    store.settle_blocking().expect("settle");
    // The transcript dir becomes a file: every turn write fails.
    let tdir = store.data_dir().transcript_dir("t");
    std::fs::remove_dir_all(&tdir).expect("rm");
    std::fs::write(&tdir, b"in the way").expect("block");
    store
        .submit(rows_event("t", vec![r(3), r(4)]))
        .expect("rows");
    store.settle_blocking().expect("settle");
    assert!(!store.data_dir().turn_file("t", 2).exists());
    assert!(store.metrics().transcript_errors > 0);
    // The fault clears.
    std::fs::remove_file(&tdir).expect("unblock");
    store.settle_blocking().expect("settle");
    for turn in 1..=2 {
        let f = store.data_dir().turn_file("t", turn);
        assert!(f.exists(), "turn {turn} still missing");
    }
    let index = std::fs::read_to_string(store.data_dir().index_file("t")).expect("index");
    assert!(index.contains("0002.md"), "{index}");
}
