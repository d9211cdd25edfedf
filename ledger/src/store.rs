//! The single-writer SQLite store.
//!
//! One thread (`oceancode-writer`) owns the write connection. The request
//! path hands it [`Event`]s through a bounded channel and never waits on the
//! disk: the writer takes whatever is queued (up to `batch_max`), applies it
//! in ONE transaction (each event under its own savepoint, so a refused event
//! does not sink its batch), commits, then rewrites the transcript files of
//! the turns it touched (atomic replace), then `SESSION.md` when a turn came
//! wholly past the tideline ([`crate::page`]). [`Store::settle`] is a barrier
//! that resolves once everything queued before it is committed and its files
//! are written. Rows are also indexed for search (`row_text` + FTS5
//! `row_fts`, schema version 2). Rebuild, the retention sweep, vacuum and
//! model-merged page notes run as jobs on the same thread, in queue order.
//!
//! What is on disk is always a gap-free, in-order prefix of each session: an
//! `Event::Rows` whose first `seq` is not exactly `max(seq) + 1` is refused
//! (logged and counted). A crash loses only what was still queued.
//!
//! Events carry no HTTP headers, so no secret can reach the database.
//!
//! Readers use separate read-only connections and see committed state.
//! [`Store::load_session`] settles first (it is the reload path and must see
//! every queued write); [`Store::list_sessions`] and
//! [`Store::latest_session`] do not (they may lag by the writer lag) — call
//! [`Store::settle`] before them when that matters (export, recall,
//! retention).

use crate::model::{Dialect, Event, Row, RowKind, SessionMeta, Usage};
use crate::page::{Note, Page};
use crate::parts;
use crate::paths::{self, DataDir};
use crate::transcript::{self, TurnSummary};
use crate::{rebuild, retention};
use parking_lot::{Mutex, RwLock};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;
use tracing::{debug, error, warn};

/// Current schema version (table `schema_version`).
pub const SCHEMA_VERSION: i64 = 2;
/// How many recent commit lags the lag summary keeps.
pub const LAG_WINDOW: usize = 1024;
/// Sessions whose newest turn / turn index the writer keeps in memory.
const CACHE_SESSIONS: usize = 1024;
/// Bytes of cached newest-turn rows and rendered sections across sessions
/// beyond which the least recently used session's cache is dropped.
const CACHE_BYTES: usize = 256 << 20;
/// Longest a deferred write (a session's `index.md`, the full-text index of
/// new rows) waits behind the events; `settle`, jobs and shutdown flush it
/// at once.
const DEFER_MAX: Duration = Duration::from_millis(1000);
/// Rows waiting for the full-text index that force a flush.
const FTS_BATCH: usize = 1024;
/// Sessions whose facts the writer keeps (beyond it, the map starts over).
const KNOWN_SESSIONS: usize = 100_000;
/// Idle read connections kept for reuse.
const READER_POOL: usize = 4;
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Schema migrations; entry `i` brings the database to version `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE sessions (
    id             TEXT PRIMARY KEY,
    client         TEXT NOT NULL,
    client_session TEXT,
    dialect        TEXT NOT NULL,
    model          TEXT NOT NULL,
    parent         TEXT,
    created_ms     INTEGER NOT NULL,
    last_ms        INTEGER NOT NULL,
    cut_upto       INTEGER NOT NULL DEFAULT 0,
    meta_json      TEXT NOT NULL
);
CREATE INDEX sessions_last ON sessions(last_ms);
CREATE TABLE rows (
    session       TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    branch        INTEGER NOT NULL,
    role          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    turn          INTEGER NOT NULL,
    step          INTEGER NOT NULL,
    tokens        INTEGER NOT NULL,
    raw           TEXT NOT NULL,
    from_response INTEGER NOT NULL DEFAULT 0,
    hidden        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session, seq)
);
CREATE INDEX rows_turn ON rows(session, hidden, turn, seq);
CREATE TABLE branches (
    session    TEXT NOT NULL,
    branch     INTEGER NOT NULL,
    at_seq     INTEGER NOT NULL,
    hidden     INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (session, branch)
);
CREATE TABLE steps (
    session     TEXT NOT NULL,
    step        INTEGER NOT NULL,
    model       TEXT NOT NULL,
    status      INTEGER NOT NULL,
    input       INTEGER NOT NULL,
    output      INTEGER NOT NULL,
    cache_read  INTEGER NOT NULL,
    cache_write INTEGER NOT NULL,
    window_rows INTEGER NOT NULL,
    ts_ms       INTEGER NOT NULL,
    PRIMARY KEY (session, step)
);
CREATE TABLE cuts (
    session  TEXT NOT NULL,
    upto_seq INTEGER NOT NULL,
    gauge    INTEGER NOT NULL,
    line     INTEGER NOT NULL,
    ts_ms    INTEGER NOT NULL
);
CREATE INDEX cuts_session ON cuts(session, ts_ms);
"#,
    r#"
CREATE TABLE row_text (
    id      INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    text    TEXT NOT NULL,
    UNIQUE (session, seq)
);
CREATE VIRTUAL TABLE row_fts USING fts5(text, content='row_text', content_rowid='id');
CREATE TRIGGER row_text_ai AFTER INSERT ON row_text BEGIN
    INSERT INTO row_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER row_text_ad AFTER DELETE ON row_text BEGIN
    INSERT INTO row_fts(row_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER row_text_au AFTER UPDATE ON row_text BEGIN
    INSERT INTO row_fts(row_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO row_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TABLE page_notes (
    id         INTEGER PRIMARY KEY,
    session    TEXT NOT NULL,
    turn       INTEGER NOT NULL,
    section    TEXT NOT NULL,
    text       TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE INDEX page_notes_session ON page_notes(session, id);
"#,
];

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A file or directory operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The database was written by a newer build.
    #[error("database schema version {found} is newer than supported ({supported})")]
    SchemaTooNew {
        /// Version found on disk.
        found: i64,
        /// Newest version this build knows.
        supported: i64,
    },
    /// SQLite refused WAL mode.
    #[error("could not enable WAL journal mode (got {0:?})")]
    NotWal(String),
    /// A stored value could not be decoded.
    #[error("corrupt ledger data: {0}")]
    Corrupt(String),
    /// The writer is shut down (or died).
    #[error("the ledger writer is shut down")]
    Closed,
    /// `try_submit` found the queue full; the event is handed back.
    #[error("the ledger writer queue is full")]
    QueueFull(Box<Event>),
    /// No session has this id (or id prefix).
    #[error("no session {0:?} in the ledger")]
    UnknownSession(String),
    /// A session prefix matched more than one session.
    #[error("session prefix {0:?} matches {1} sessions; give more of the id")]
    AmbiguousSession(String, usize),
    /// The ledger has no session yet.
    #[error("the ledger has no session yet")]
    NoSessions,
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Tuning of [`Store::open`].
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    /// Capacity of the bounded command queue (at least 1).
    pub queue_capacity: usize,
    /// Most commands taken into one transaction (at least 1).
    pub batch_max: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            queue_capacity: 4096,
            batch_max: 512,
        }
    }
}

/// One line of [`Store::list_sessions`].
#[derive(Clone, Debug, PartialEq)]
pub struct SessionSummary {
    /// Ledger session id.
    pub id: String,
    /// Client family.
    pub client: String,
    /// Model of the latest request.
    pub model: String,
    /// API dialect.
    pub dialect: Dialect,
    /// Distinct turns on the active line.
    pub turns: u32,
    /// Rows on the active line.
    pub rows: u64,
    /// Unix milliseconds of the latest activity.
    pub last_ms: i64,
    /// Parent session (sub-agents).
    pub parent: Option<String>,
}

/// A session read back from the database (reload after restart/eviction).
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedSession {
    /// The session's facts.
    pub meta: SessionMeta,
    /// Every row (hidden ones included), ordered by `seq`.
    pub rows: Vec<Row>,
    /// Seqs of the rows hidden by branches, ascending.
    pub hidden: Vec<u64>,
    /// Latest branch recorded (0 = none).
    pub branch: u32,
    /// Last seq past the tideline (latest cut; 0 = none).
    pub cut_upto: u64,
    /// Usage of the latest step that reported any (None if none did).
    pub last_usage: Option<Usage>,
    /// Highest step number recorded (0 = none).
    pub steps: u32,
}

/// One recorded step (request/response).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    /// Step number.
    pub step: u32,
    /// Model that answered.
    pub model: String,
    /// HTTP status returned to the client.
    pub status: u16,
    /// Real usage.
    pub usage: Usage,
    /// Rows in the window sent.
    pub window_rows: u32,
    /// Unix milliseconds.
    pub ts_ms: i64,
}

/// One recorded tideline cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CutRecord {
    /// Every row up to this seq left the window.
    pub upto_seq: u64,
    /// Gauge before the cut.
    pub gauge: u64,
    /// The line in force.
    pub line: u64,
    /// Unix milliseconds.
    pub ts_ms: i64,
}

/// A snapshot of the writer's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreMetrics {
    /// Events taken by the writer in committed batches (refused ones included).
    pub events: u64,
    /// Committed transactions.
    pub batches: u64,
    /// Batches whose transaction failed (after one retry); their events are lost.
    pub commits_failed: u64,
    /// Events refused (seq gap, unknown session or row, SQL error).
    pub rejected: u64,
    /// Times `submit`/`settle` found the queue full and waited for space.
    pub queue_full_waits: u64,
    /// Transcript/index writes that failed.
    pub transcript_errors: u64,
    /// `SESSION.md` writes.
    pub pages_written: u64,
    /// Sessions removed by the retention sweep.
    pub sessions_removed: u64,
    /// Events queued (or waiting for queue space) and not yet committed.
    pub queued: u64,
    /// Age of the oldest queued-but-uncommitted event, ms (0 when idle).
    pub writer_lag_ms: u64,
    /// Median enqueue-to-commit lag over the last [`LAG_WINDOW`] events, µs.
    pub lag_p50_us: u64,
    /// 99th percentile of the same, µs.
    pub lag_p99_us: u64,
    /// Maximum of the same, µs.
    pub lag_max_us: u64,
}

#[derive(Default)]
struct Shared {
    next_id: AtomicU64,
    /// Enqueue time of every queued-but-uncommitted event, by id.
    pending: Mutex<BTreeMap<u64, Instant>>,
    lags_us: Mutex<VecDeque<u64>>,
    events: AtomicU64,
    batches: AtomicU64,
    commits_failed: AtomicU64,
    rejected: AtomicU64,
    queue_full_waits: AtomicU64,
    transcript_errors: AtomicU64,
    pages_written: AtomicU64,
    sessions_removed: AtomicU64,
}

impl Shared {
    fn forget(&self, ids: impl Iterator<Item = u64>) {
        let mut p = self.pending.lock();
        for id in ids {
            p.remove(&id);
        }
    }
}

enum Reply {
    Async(oneshot::Sender<()>),
    Blocking(SyncSender<()>),
}

impl Reply {
    fn send(self) {
        match self {
            Reply::Async(tx) => {
                let _ = tx.send(());
            }
            Reply::Blocking(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

/// Work run on the writer thread, in queue order with the events.
type Job = Box<dyn FnOnce(&mut Writer) + Send>;

enum Cmd {
    Event { ev: Event, id: u64, at: Instant },
    Settle(Reply),
    Job(Job),
    Shutdown,
}

/// Handle to the ledger database. Cheap to clone; the writer stops when
/// [`Store::shutdown`] is called or the last clone is dropped.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: DataDir,
    db: PathBuf,
    tx: RwLock<Option<SyncSender<Cmd>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    shared: Arc<Shared>,
    readers: Mutex<Vec<Connection>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            warn!("ledger writer shutdown on drop: {e}");
        }
    }
}

impl Inner {
    fn shutdown(&self) -> Result<(), StoreError> {
        // Taking the sender waits for submitters blocked on a full queue
        // (the writer keeps draining), so Shutdown is the last command.
        if let Some(tx) = self.tx.write().take() {
            let _ = tx.send(Cmd::Shutdown);
        }
        let mut thread = self.thread.lock();
        if let Some(handle) = thread.take() {
            handle.join().map_err(|_| StoreError::Closed)?;
        }
        Ok(())
    }
}

impl Store {
    /// Open (or create) the ledger under `data_dir`: creates the layout
    /// (`0700` dirs, `0600` db), enables WAL (`synchronous=NORMAL`), migrates
    /// the schema and starts the writer thread.
    pub fn open(data_dir: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        let dir = DataDir::new(data_dir);
        dir.ensure_root().map_err(io_err(data_dir))?;
        let db = dir.db_path();
        paths::prepare_db_file(&db).map_err(io_err(&db))?;
        let mut conn = Connection::open_with_flags(
            &db,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::NotWal(mode));
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        migrate(&mut conn)?;
        // SQLite gives -wal/-shm the db's mode; make sure anyway.
        paths::prepare_db_file(&db).map_err(io_err(&db))?;

        let (tx, rx) = mpsc::sync_channel(opts.queue_capacity.max(1));
        let shared = Arc::new(Shared::default());
        let writer = Writer {
            conn,
            dir: dir.clone(),
            rx,
            shared: shared.clone(),
            batch_max: opts.batch_max.max(1),
            caches: HashMap::new(),
            tick: 0,
            fts_pending: Vec::new(),
            deferred_since: None,
            known: HashMap::new(),
        };
        let handle = std::thread::Builder::new()
            .name("oceancode-writer".into())
            .spawn(move || writer.run())
            .map_err(io_err(&db))?;
        Ok(Store {
            inner: Arc::new(Inner {
                dir,
                db,
                tx: RwLock::new(Some(tx)),
                thread: Mutex::new(Some(handle)),
                shared,
                readers: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Queue an event for the writer. Never waits on the disk; if the queue
    /// is full it blocks the caller only until there is room (counted in
    /// [`StoreMetrics::queue_full_waits`]).
    pub fn submit(&self, ev: Event) -> Result<(), StoreError> {
        self.enqueue(ev, true)
    }

    /// Like [`Store::submit`] but never blocks: a full queue returns
    /// [`StoreError::QueueFull`] with the event.
    pub fn try_submit(&self, ev: Event) -> Result<(), StoreError> {
        self.enqueue(ev, false)
    }

    fn enqueue(&self, ev: Event, wait: bool) -> Result<(), StoreError> {
        let shared = &self.inner.shared;
        let guard = self.inner.tx.read();
        let tx = guard.as_ref().ok_or(StoreError::Closed)?;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let at = Instant::now();
        shared.pending.lock().insert(id, at);
        let result = match tx.try_send(Cmd::Event { ev, id, at }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(cmd)) if wait => {
                shared.queue_full_waits.fetch_add(1, Ordering::Relaxed);
                tx.send(cmd).map_err(|_| StoreError::Closed)
            }
            Err(TrySendError::Full(Cmd::Event { ev, .. })) => {
                Err(StoreError::QueueFull(Box::new(ev)))
            }
            Err(_) => Err(StoreError::Closed),
        };
        if result.is_err() {
            shared.forget(std::iter::once(id));
        }
        result
    }

    fn send_cmd(&self, cmd: Cmd) -> Result<(), StoreError> {
        let guard = self.inner.tx.read();
        let tx = guard.as_ref().ok_or(StoreError::Closed)?;
        match tx.try_send(cmd) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(cmd)) => {
                self.inner
                    .shared
                    .queue_full_waits
                    .fetch_add(1, Ordering::Relaxed);
                tx.send(cmd).map_err(|_| StoreError::Closed)
            }
            Err(TrySendError::Disconnected(_)) => Err(StoreError::Closed),
        }
    }

    /// Barrier: resolves once everything queued before it is committed and
    /// its transcript files are written. (Enqueuing it may wait for queue
    /// space like `submit`.)
    pub async fn settle(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.send_cmd(Cmd::Settle(Reply::Async(tx)))?;
        rx.await.map_err(|_| StoreError::Closed)
    }

    /// Blocking form of [`Store::settle`] (safe on any thread, blocks it).
    pub fn settle_blocking(&self) -> Result<(), StoreError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send_cmd(Cmd::Settle(Reply::Blocking(tx)))?;
        rx.recv().map_err(|_| StoreError::Closed)
    }

    /// Drain the queue, commit, write transcripts and join the writer.
    /// Idempotent; later submits return [`StoreError::Closed`].
    pub fn shutdown(&self) -> Result<(), StoreError> {
        self.inner.shutdown()
    }

    /// Age in ms of the oldest queued-but-uncommitted event (0 when idle).
    pub fn writer_lag_ms(&self) -> u64 {
        let pending = self.inner.shared.pending.lock();
        pending
            .values()
            .next()
            .map_or(0, |t| t.elapsed().as_millis() as u64)
    }

    /// A snapshot of the writer's counters and lag summary.
    pub fn metrics(&self) -> StoreMetrics {
        let s = &self.inner.shared;
        let (queued, writer_lag_ms) = {
            let p = s.pending.lock();
            let lag = p
                .values()
                .next()
                .map_or(0, |t| t.elapsed().as_millis() as u64);
            (p.len() as u64, lag)
        };
        let mut lags: Vec<u64> = s.lags_us.lock().iter().copied().collect();
        lags.sort_unstable();
        let pct = |p: usize| {
            if lags.is_empty() {
                0
            } else {
                lags[(lags.len() - 1) * p / 100]
            }
        };
        StoreMetrics {
            events: s.events.load(Ordering::Relaxed),
            batches: s.batches.load(Ordering::Relaxed),
            commits_failed: s.commits_failed.load(Ordering::Relaxed),
            rejected: s.rejected.load(Ordering::Relaxed),
            queue_full_waits: s.queue_full_waits.load(Ordering::Relaxed),
            transcript_errors: s.transcript_errors.load(Ordering::Relaxed),
            pages_written: s.pages_written.load(Ordering::Relaxed),
            sessions_removed: s.sessions_removed.load(Ordering::Relaxed),
            queued,
            writer_lag_ms,
            lag_p50_us: pct(50),
            lag_p99_us: pct(99),
            lag_max_us: lags.last().copied().unwrap_or(0),
        }
    }

    /// The data-dir layout.
    pub fn data_dir(&self) -> &DataDir {
        &self.inner.dir
    }

    /// `<data>/oceancode.db`.
    pub fn db_path(&self) -> &Path {
        &self.inner.db
    }

    /// `<data>/sessions/<sanitized id>`.
    pub fn session_dir(&self, id: &str) -> PathBuf {
        self.inner.dir.session_dir(id)
    }

    /// Run `f` on the writer thread after everything queued before it, and
    /// wait for its result (blocking; from async code use a blocking thread).
    fn run_job<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Writer) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send_cmd(Cmd::Job(Box::new(move |w: &mut Writer| {
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(w)))
                .unwrap_or_else(|_| Err(StoreError::Corrupt("ledger job panicked".into())));
            let _ = tx.send(result);
        })))?;
        rx.recv().map_err(|_| StoreError::Closed)?
    }

    /// Rebuild a session's transcripts, `index.md`, `SESSION.md` and search
    /// index from the database (settles first: it runs on the writer thread
    /// after everything queued before it). No model call.
    pub fn rebuild(
        &self,
        session: &str,
        progress: Option<rebuild::Progress>,
    ) -> Result<rebuild::RebuildReport, StoreError> {
        let session = session.to_string();
        self.run_job(move |w| {
            w.caches.remove(&session);
            rebuild::rebuild_session(&mut w.conn, &w.dir, &session, progress.as_ref())
        })
    }

    /// Remove every session idle for `days` days or more (`0` = keep all):
    /// its rows, steps, cuts, branches, notes, search text and directory,
    /// together. Runs on the writer thread after everything queued before it.
    pub fn sweep(&self, days: u32) -> Result<retention::SweepReport, StoreError> {
        self.sweep_at(days, now_ms())
    }

    /// [`Store::sweep`] with an explicit "now" (Unix ms), for tests.
    pub fn sweep_at(&self, days: u32, now_ms: i64) -> Result<retention::SweepReport, StoreError> {
        self.run_job(move |w| {
            let report = retention::sweep(&mut w.conn, &w.dir, days, now_ms)?;
            for id in &report.removed {
                w.caches.remove(id);
            }
            w.shared
                .sessions_removed
                .fetch_add(report.removed.len() as u64, Ordering::Relaxed);
            Ok(report)
        })
    }

    /// Compact the database (`VACUUM`, search index optimized, WAL truncated).
    pub fn vacuum(&self) -> Result<retention::VacuumReport, StoreError> {
        self.run_job(|w| retention::vacuum(&mut w.conn, &w.dir))
    }

    /// Store model-merged lines for a session's `SESSION.md` and rewrite the page.
    pub fn add_page_notes(&self, session: &str, notes: Vec<Note>) -> Result<(), StoreError> {
        let session = session.to_string();
        self.run_job(move |w| {
            {
                let tx = w.conn.transaction()?;
                {
                    let mut stmt = tx.prepare(
                        "INSERT INTO page_notes (session, turn, section, text, created_ms)
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                    )?;
                    for n in &notes {
                        stmt.execute(params![session, n.turn, n.section, n.text, now_ms()])?;
                    }
                }
                tx.commit()?;
            }
            w.caches.remove(&session);
            let Some(meta) = session_meta(&w.conn, &session)? else {
                return Err(StoreError::UnknownSession(session));
            };
            let mut page = rebuild::new_page(&w.conn, &session)?;
            rebuild::advance_page(&w.conn, &session, meta.dialect, &mut page)?;
            rebuild::write_page(&w.dir, &session, &page, &mut None)?;
            Ok(())
        })
    }

    /// The model-merge backlog of a session: `(from, to)` turns wholly past
    /// the tideline that no model merge has covered yet (`from > to` = none).
    pub fn page_backlog(&self, session: &str) -> Result<(u32, u32), StoreError> {
        let session = session.to_string();
        self.run_job(move |w| {
            let meta = session_meta(&w.conn, &session)?
                .ok_or_else(|| StoreError::UnknownSession(session.clone()))?;
            let mut page = rebuild::new_page(&w.conn, &session)?;
            rebuild::advance_page(&w.conn, &session, meta.dialect, &mut page)?;
            let noted: i64 = w.conn.query_row(
                "SELECT COALESCE(MAX(turn), 0) FROM page_notes WHERE session = ?1 AND section = ?2",
                params![session, crate::merge::MARKER_SECTION],
                |r| r.get(0),
            )?;
            Ok((noted.max(0) as u32 + 1, page.merged_through()))
        })
    }

    pub(crate) fn with_reader<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pooled = self.inner.readers.lock().pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.inner.db,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                c.busy_timeout(BUSY_TIMEOUT)?;
                c
            }
        };
        let result = f(&conn);
        if result.is_ok() {
            let mut pool = self.inner.readers.lock();
            if pool.len() < READER_POOL {
                pool.push(conn);
            }
        }
        result
    }

    /// Every session, most recent activity first. Reads committed state
    /// (does not settle).
    pub fn list_sessions(&self) -> Result<Vec<SessionSummary>, StoreError> {
        self.summaries(None)
    }

    /// One line of [`Store::list_sessions`] (committed state).
    pub fn session_summary(&self, id: &str) -> Result<Option<SessionSummary>, StoreError> {
        Ok(self.summaries(Some(id))?.into_iter().next())
    }

    fn summaries(&self, only: Option<&str>) -> Result<Vec<SessionSummary>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT s.id, s.client, s.model, s.dialect, s.last_ms, s.parent,
                   (SELECT COUNT(DISTINCT r.turn) FROM rows r WHERE r.session = s.id AND r.hidden = 0),
                   (SELECT COUNT(*) FROM rows r WHERE r.session = s.id AND r.hidden = 0)
                 FROM sessions s WHERE ?1 IS NULL OR s.id = ?1
                 ORDER BY s.last_ms DESC, s.rowid DESC",
            )?;
            let rows = stmt.query_map([only], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, Option<String>>(5)?,
                    r.get::<_, i64>(6)?,
                    r.get::<_, i64>(7)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (id, client, model, dialect, last_ms, parent, turns, nrows) = row?;
                let Some(dialect) = Dialect::parse(&dialect) else {
                    warn!("session {id}: unknown dialect {dialect:?}, skipped");
                    continue;
                };
                out.push(SessionSummary {
                    id,
                    client,
                    model,
                    dialect,
                    turns: turns as u32,
                    rows: nrows as u64,
                    last_ms,
                    parent,
                });
            }
            Ok(out)
        })
    }

    /// Ids of the sessions recorded for a client key (`cc:…`, `codex:…`,
    /// `name:…`, `fp:…`), oldest first (the root session first). Reads
    /// committed state (does not settle).
    pub fn sessions_for_client(&self, key: &str) -> Result<Vec<String>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT id FROM sessions WHERE client_session = ?1 ORDER BY created_ms, rowid",
            )?;
            let ids = stmt
                .query_map([key], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(ids)
        })
    }

    /// The most recently active session, if any. Reads committed state
    /// (does not settle).
    pub fn latest_session(&self) -> Result<Option<String>, StoreError> {
        self.with_reader(|c| {
            Ok(c.query_row(
                "SELECT id FROM sessions ORDER BY last_ms DESC, rowid DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()?)
        })
    }

    /// The session `spec` names: `None` = the most recent; an exact id; else
    /// a unique id prefix. Reads committed state (does not settle).
    pub fn resolve_session(&self, spec: Option<&str>) -> Result<String, StoreError> {
        let Some(spec) = spec else {
            return self.latest_session()?.ok_or(StoreError::NoSessions);
        };
        self.with_reader(|c| {
            if session_exists(c, spec)? {
                return Ok(spec.to_string());
            }
            let mut stmt = c.prepare(
                "SELECT id FROM sessions WHERE substr(id, 1, length(?1)) = ?1 ORDER BY last_ms DESC",
            )?;
            let ids = stmt
                .query_map([spec], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            match ids.len() {
                0 => Err(StoreError::UnknownSession(spec.to_string())),
                1 => Ok(ids.into_iter().next().unwrap_or_default()),
                n => Err(StoreError::AmbiguousSession(spec.to_string(), n)),
            }
        })
    }

    /// A session's facts (committed state).
    pub fn session_meta(&self, id: &str) -> Result<Option<SessionMeta>, StoreError> {
        self.with_reader(|c| session_meta(c, id))
    }

    /// A session's rows in seq order with their `hidden` flag; hidden rows
    /// only when `include_hidden`. Committed state (call `settle` first).
    pub fn session_rows(
        &self,
        id: &str,
        include_hidden: bool,
    ) -> Result<Vec<(Row, bool)>, StoreError> {
        self.with_reader(|c| {
            let filter = if include_hidden {
                ""
            } else {
                " AND hidden = 0"
            };
            let mut stmt = c.prepare(&format!(
                "SELECT {ROW_COLS} FROM rows WHERE session = ?1{filter} ORDER BY seq"
            ))?;
            let rows = stmt
                .query_map([id], read_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// A session's steps in order.
    pub fn steps(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT step, model, status, input, output, cache_read, cache_write, window_rows, ts_ms
                 FROM steps WHERE session = ?1 ORDER BY step",
            )?;
            let steps = stmt
                .query_map([id], |r| {
                    Ok(StepRecord {
                        step: r.get::<_, i64>(0)? as u32,
                        model: r.get(1)?,
                        status: r.get::<_, i64>(2)? as u16,
                        usage: Usage {
                            input: r.get::<_, i64>(3)?.max(0) as u64,
                            output: r.get::<_, i64>(4)?.max(0) as u64,
                            cache_read: r.get::<_, i64>(5)?.max(0) as u64,
                            cache_write: r.get::<_, i64>(6)?.max(0) as u64,
                        },
                        window_rows: r.get::<_, i64>(7)? as u32,
                        ts_ms: r.get(8)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(steps)
        })
    }

    /// A session's tideline cuts in order.
    pub fn cuts(&self, id: &str) -> Result<Vec<CutRecord>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT upto_seq, gauge, line, ts_ms FROM cuts WHERE session = ?1
                 ORDER BY ts_ms, rowid",
            )?;
            let cuts = stmt
                .query_map([id], |r| {
                    Ok(CutRecord {
                        upto_seq: r.get::<_, i64>(0)?.max(0) as u64,
                        gauge: r.get::<_, i64>(1)?.max(0) as u64,
                        line: r.get::<_, i64>(2)?.max(0) as u64,
                        ts_ms: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(cuts)
        })
    }

    /// Read a whole session back (after a restart, or when an idle session
    /// left memory). SETTLES FIRST (blocking), so it sees every write queued
    /// before the call; from async code run it on a blocking thread.
    pub fn load_session(&self, id: &str) -> Result<Option<LoadedSession>, StoreError> {
        match self.settle_blocking() {
            Ok(()) | Err(StoreError::Closed) => {}
            Err(e) => return Err(e),
        }
        self.with_reader(|c| load_session(c, id))
    }
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let found: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        [],
        |r| r.get(0),
    )?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate() {
        if found < i as i64 + 1 {
            tx.execute_batch(sql)?;
        }
    }
    if (1..2).contains(&found) {
        // Version 2 added the search index: fill it from the existing rows.
        backfill_row_text(&tx)?;
    } else if found >= 2 {
        // The writer indexes new rows a moment after committing them (see
        // `Writer::flush_deferred`): rows a crash left unindexed are indexed now.
        let (rows, texts): (i64, i64) = tx.query_row(
            "SELECT (SELECT COUNT(*) FROM rows), (SELECT COUNT(*) FROM row_text)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        if rows != texts {
            backfill_row_text(&tx)?;
        }
    }
    if found < SCHEMA_VERSION {
        tx.execute("DELETE FROM schema_version", [])?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [SCHEMA_VERSION],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Fill `row_text` (and so `row_fts`) for every row that has none.
fn backfill_row_text(c: &Connection) -> Result<(), StoreError> {
    let mut stmt = c.prepare(
        "SELECT r.session, r.seq, r.raw, s.dialect FROM rows r JOIN sessions s ON s.id = r.session
         WHERE NOT EXISTS (SELECT 1 FROM row_text t WHERE t.session = r.session AND t.seq = r.seq)",
    )?;
    let mut batch = TextBatch::default();
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let session: String = r.get(0)?;
        let seq: i64 = r.get(1)?;
        let raw: String = r.get(2)?;
        let dialect: String = r.get(3)?;
        let dialect = Dialect::parse(&dialect).unwrap_or(Dialect::Anthropic);
        batch.push(c, &session, seq as u64, dialect, &raw)?;
    }
    batch.flush(c)?;
    Ok(())
}

/// Rows' plain text for the search index, written in bulk.
///
/// FTS5 writes its pending in-memory segment out at every statement
/// savepoint, and an upsert through `row_text`'s triggers takes one per
/// statement: a statement per row wrote (and then merged) a segment per row,
/// most of the writer's time on a cold 2,000-row session. Here one statement
/// carries up to [`TextBatch::CHUNK`] bytes of rows as a JSON array.
#[derive(Default)]
pub(crate) struct TextBatch {
    json: String,
    rows: usize,
}

impl TextBatch {
    /// Bytes of JSON per statement.
    const CHUNK: usize = 4 << 20;

    /// Queue one row's text (replacing what was indexed for it).
    pub(crate) fn push(
        &mut self,
        c: &Connection,
        session: &str,
        seq: u64,
        dialect: Dialect,
        raw: &str,
    ) -> rusqlite::Result<()> {
        self.json.push(if self.rows == 0 { '[' } else { ',' });
        let item = serde_json::json!([session, seq, parts::plain_text(dialect, raw)]);
        self.json.push_str(&item.to_string());
        self.rows += 1;
        if self.json.len() >= Self::CHUNK {
            self.flush(c)?;
        }
        Ok(())
    }

    /// Write what is queued.
    pub(crate) fn flush(&mut self, c: &Connection) -> rusqlite::Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        self.json.push(']');
        c.prepare_cached(
            "INSERT INTO row_text (session, seq, text)
             SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2 FROM json_each(?1) AS j WHERE 1
             ON CONFLICT(session, seq) DO UPDATE SET text = excluded.text",
        )?
        .execute([&self.json])?;
        self.json.clear();
        self.rows = 0;
        Ok(())
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn session_meta(c: &Connection, id: &str) -> Result<Option<SessionMeta>, StoreError> {
    let row = c
        .query_row(
            "SELECT client, client_session, dialect, model, parent, created_ms, last_ms
             FROM sessions WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, i64>(6)?,
                ))
            },
        )
        .optional()?;
    let Some((client, client_session, dialect, model, parent, created_ms, last_ms)) = row else {
        return Ok(None);
    };
    let dialect = Dialect::parse(&dialect)
        .ok_or_else(|| StoreError::Corrupt(format!("session {id}: dialect {dialect:?}")))?;
    Ok(Some(SessionMeta {
        id: id.to_string(),
        client,
        client_session,
        dialect,
        model,
        parent,
        created_ms,
        last_ms,
    }))
}

pub(crate) const ROW_COLS: &str =
    "seq, role, kind, raw, tokens, turn, step, branch, from_response, hidden";

/// Decode a row selected with [`ROW_COLS`]; also returns `hidden`.
pub(crate) fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(Row, bool)> {
    let kind: String = r.get(2)?;
    let raw: String = r.get(3)?;
    Ok((
        Row {
            seq: r.get::<_, i64>(0)? as u64,
            role: r.get(1)?,
            kind: RowKind::parse(&kind).unwrap_or(RowKind::Other),
            raw: Arc::from(raw),
            tokens: r.get::<_, i64>(4)? as u32,
            turn: r.get::<_, i64>(5)? as u32,
            step: r.get::<_, i64>(6)? as u32,
            branch: r.get::<_, i64>(7)? as u32,
            from_response: r.get(8)?,
        },
        r.get(9)?,
    ))
}

fn load_session(c: &Connection, id: &str) -> Result<Option<LoadedSession>, StoreError> {
    let Some(meta) = session_meta(c, id)? else {
        return Ok(None);
    };
    let mut rows = Vec::new();
    let mut hidden = Vec::new();
    {
        let mut stmt = c.prepare(&format!(
            "SELECT {ROW_COLS} FROM rows WHERE session = ?1 ORDER BY seq"
        ))?;
        for r in stmt.query_map([id], read_row)? {
            let (row, is_hidden) = r?;
            if is_hidden {
                hidden.push(row.seq);
            }
            rows.push(row);
        }
    }
    let cut_upto: i64 = c.query_row("SELECT cut_upto FROM sessions WHERE id = ?1", [id], |r| {
        r.get(0)
    })?;
    let branch: i64 = c.query_row(
        "SELECT COALESCE((SELECT branch FROM branches WHERE session = ?1
                          ORDER BY rowid DESC LIMIT 1), 0)",
        [id],
        |r| r.get(0),
    )?;
    let steps: i64 = c.query_row(
        "SELECT COALESCE(MAX(step), 0) FROM steps WHERE session = ?1",
        [id],
        |r| r.get(0),
    )?;
    let last_usage = c
        .query_row(
            "SELECT input, output, cache_read, cache_write FROM steps
             WHERE session = ?1 AND input + output + cache_read + cache_write > 0
             ORDER BY step DESC LIMIT 1",
            [id],
            |r| {
                Ok(Usage {
                    input: r.get::<_, i64>(0)? as u64,
                    output: r.get::<_, i64>(1)? as u64,
                    cache_read: r.get::<_, i64>(2)? as u64,
                    cache_write: r.get::<_, i64>(3)? as u64,
                })
            },
        )
        .optional()?;
    Ok(Some(LoadedSession {
        meta,
        rows,
        hidden,
        branch: branch as u32,
        cut_upto: cut_upto as u64,
        last_usage,
        steps: steps as u32,
    }))
}

/// Visible rows of one turn, by seq.
fn turn_rows(c: &Connection, session: &str, turn: u32) -> Result<Vec<Row>, StoreError> {
    let mut stmt = c.prepare_cached(&format!(
        "SELECT {ROW_COLS} FROM rows WHERE session = ?1 AND turn = ?2 AND hidden = 0 ORDER BY seq"
    ))?;
    let rows = stmt
        .query_map(params![session, turn], read_row)?
        .map(|r| r.map(|(row, _)| row))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// Turn summaries of the active line, as [`transcript::summarize_turn`]
/// would compute them from every turn's rows.
fn turn_summaries(
    c: &Connection,
    session: &str,
    dialect: Dialect,
) -> Result<BTreeMap<u32, TurnSummary>, StoreError> {
    let mut out = BTreeMap::new();
    let mut stmt = c.prepare_cached(
        "SELECT turn, MIN(seq), MAX(seq), SUM(tokens) FROM rows
         WHERE session = ?1 AND hidden = 0 GROUP BY turn",
    )?;
    for r in stmt.query_map([session], |r| {
        Ok((
            r.get::<_, i64>(0)? as u32,
            r.get::<_, i64>(1)? as u64,
            r.get::<_, i64>(2)? as u64,
            r.get::<_, i64>(3)? as u64,
        ))
    })? {
        let (turn, first_seq, last_seq, tokens) = r?;
        out.insert(
            turn,
            TurnSummary {
                turn,
                first_seq,
                last_seq,
                first_line: String::new(),
                tokens,
            },
        );
    }
    let mut stmt = c.prepare_cached(
        "SELECT turn, raw FROM rows WHERE session = ?1 AND hidden = 0 AND kind = 'prompt'
         ORDER BY turn, seq",
    )?;
    let mut prompts: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for r in stmt.query_map([session], |r| {
        Ok((r.get::<_, i64>(0)? as u32, r.get::<_, String>(1)?))
    })? {
        let (turn, raw) = r?;
        prompts.entry(turn).or_default().push(raw);
    }
    for (turn, raws) in prompts {
        if let Some(s) = out.get_mut(&turn) {
            s.first_line = transcript::prompt_first_line(dialect, raws.iter().map(String::as_str));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// The writer thread

/// What a committed event changes in the writer's caches.
enum Effect {
    Meta(SessionMeta),
    Append(Vec<Row>),
    Confirm { seq: u64, turn: u32, raw: Arc<str> },
    Invalidate,
}

#[derive(Default)]
struct Touch {
    effects: Vec<Effect>,
    turns: BTreeSet<u32>,
    index: bool,
    /// Rows, cuts, branches or confirms: `SESSION.md` may change.
    page: bool,
}

enum Outcome {
    Applied(Option<Effect>, Vec<u32>, bool),
    Refused(String),
}

/// The newest turn of a session, kept so a step does not re-read the session.
struct TurnCache {
    turn: u32,
    rows: Vec<Row>,
    /// Rendered sections by seq, with the bytes they were rendered from: a
    /// long turn is re-written each step but each row is rendered once.
    sections: HashMap<u64, (Arc<str>, String)>,
}

struct SessionCache {
    /// Approximate bytes held by `newest` (rows and rendered sections).
    newest_bytes: usize,
    meta: SessionMeta,
    summaries: Option<BTreeMap<u32, TurnSummary>>,
    newest: Option<TurnCache>,
    dir_ready: bool,
    last_used: u64,
    /// The folded `SESSION.md` (None = fold again from the database).
    page: Option<Page>,
    /// Hash of the last `SESSION.md` written.
    page_hash: Option<u64>,
    /// `index.md` is behind (written at the next flush of deferred writes).
    index_dirty: bool,
}

struct Writer {
    conn: Connection,
    dir: DataDir,
    rx: Receiver<Cmd>,
    shared: Arc<Shared>,
    batch_max: usize,
    caches: HashMap<String, SessionCache>,
    tick: u64,
    /// Committed rows not yet in the full-text index.
    fts_pending: Vec<FtsJob>,
    /// Since when something deferred waits (`index.md`, `fts_pending`).
    deferred_since: Option<Instant>,
    /// What the writer knows of sessions it has seen, so a step does not
    /// query for it.
    known: HashMap<String, Known>,
}

/// Facts of a session the writer has committed events for.
#[derive(Clone, Copy, Default)]
struct Known {
    dialect: Option<Dialect>,
    /// The seq the next `Rows` event must start at (None = ask the database).
    next_seq: Option<u64>,
}

impl Writer {
    fn run(mut self) {
        loop {
            let first = match self.deferred_since {
                None => match self.rx.recv() {
                    Ok(cmd) => cmd,
                    Err(_) => break,
                },
                Some(since) => {
                    let wait = (since + DEFER_MAX).saturating_duration_since(Instant::now());
                    match self.rx.recv_timeout(wait) {
                        Ok(cmd) => cmd,
                        Err(RecvTimeoutError::Timeout) => {
                            self.flush_deferred();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            let mut batch = vec![first];
            while batch.len() < self.batch_max {
                match self.rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(_) => break,
                }
            }
            let mut events = Vec::new();
            let mut replies = Vec::new();
            let mut stop = false;
            for cmd in batch {
                match cmd {
                    Cmd::Event { ev, id, at } => events.push((ev, id, at)),
                    Cmd::Settle(r) => replies.push(r),
                    Cmd::Job(job) => {
                        // Everything queued before the job is committed and
                        // written first; what the job changes is read afresh.
                        self.process(&events);
                        events.clear();
                        self.flush_deferred();
                        job(&mut self);
                        self.known.clear();
                    }
                    Cmd::Shutdown => stop = true,
                }
            }
            self.process(&events);
            let due = self
                .deferred_since
                .is_some_and(|since| since.elapsed() >= DEFER_MAX);
            if stop || due || !replies.is_empty() || self.fts_pending.len() >= FTS_BATCH {
                self.flush_deferred();
            }
            for r in replies {
                r.send();
            }
            if stop {
                break;
            }
        }
        self.flush_deferred();
        debug!("ledger writer stopped");
    }

    /// Write what waits: the `index.md` of sessions whose turns did not
    /// change since it was last written, and the full-text index of new rows.
    fn flush_deferred(&mut self) {
        self.deferred_since = None;
        let dirty: Vec<String> = self
            .caches
            .iter()
            .filter(|(_, c)| c.index_dirty)
            .map(|(k, _)| k.clone())
            .collect();
        for session in dirty {
            if let Err(e) = self.write_index(&session) {
                warn!("ledger index of session {session}: {e}");
                self.shared
                    .transcript_errors
                    .fetch_add(1, Ordering::Relaxed);
                self.caches.remove(&session);
            }
        }
        if self.fts_pending.is_empty() {
            return;
        }
        let jobs = std::mem::take(&mut self.fts_pending);
        if let Err(e) = self.index_text(&jobs) {
            // The rows are committed; the next open indexes what is missing.
            warn!("ledger search index of {} rows: {e}", jobs.len());
        }
    }

    /// Index rows for full-text search, in one transaction.
    fn index_text(&mut self, jobs: &[FtsJob]) -> Result<(), rusqlite::Error> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut batch = TextBatch::default();
        for job in jobs {
            let known = self.known.entry(job.session.clone()).or_default();
            let dialect = match known.dialect {
                Some(d) => d,
                None => *known.dialect.insert(session_dialect(&tx, &job.session)?),
            };
            batch.push(&tx, &job.session, job.seq, dialect, &job.raw)?;
        }
        batch.flush(&tx)?;
        tx.commit()
    }

    fn process(&mut self, events: &[(Event, u64, Instant)]) {
        if events.is_empty() {
            return;
        }
        let mut result = self.apply_batch(events);
        if let Err(e) = &result {
            warn!(
                "ledger batch of {} events failed ({e}); retrying once",
                events.len()
            );
            result = self.apply_batch(events);
        }
        let committed = Instant::now();
        let ids = events.iter().map(|(_, id, _)| *id);
        match result {
            Ok((touched, refused)) => {
                let s = &self.shared;
                s.batches.fetch_add(1, Ordering::Relaxed);
                s.events.fetch_add(events.len() as u64, Ordering::Relaxed);
                s.rejected.fetch_add(refused, Ordering::Relaxed);
                {
                    let mut lags = s.lags_us.lock();
                    for (_, _, at) in events {
                        if lags.len() == LAG_WINDOW {
                            lags.pop_front();
                        }
                        lags.push_back(committed.duration_since(*at).as_micros() as u64);
                    }
                }
                s.forget(ids);
                for (session, touch) in touched {
                    // Rendering reads arbitrary client JSON: never let a
                    // bug there take the writer (and the database) down.
                    let written = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        self.write_files(&session, touch)
                    }))
                    .unwrap_or_else(|_| {
                        Err(StoreError::Corrupt("transcript renderer panicked".into()))
                    });
                    if let Err(e) = written {
                        warn!("ledger transcript of session {session}: {e}");
                        self.shared
                            .transcript_errors
                            .fetch_add(1, Ordering::Relaxed);
                        self.caches.remove(&session);
                    }
                }
            }
            Err(e) => {
                error!("ledger batch of {} events lost: {e}", events.len());
                self.shared.commits_failed.fetch_add(1, Ordering::Relaxed);
                self.shared.forget(ids);
            }
        }
    }

    /// Apply a batch in one transaction; returns what each session needs
    /// re-rendered and how many events were refused.
    #[allow(clippy::type_complexity)]
    fn apply_batch(
        &mut self,
        events: &[(Event, u64, Instant)],
    ) -> Result<(BTreeMap<String, Touch>, u64), rusqlite::Error> {
        let fts_mark = self.fts_pending.len();
        let result = self.apply_events(events);
        if result.is_err() {
            // Rolled back: forget what this attempt queued or learned.
            self.fts_pending.truncate(fts_mark);
            self.known.clear();
        } else if self.fts_pending.len() > fts_mark {
            self.deferred_since.get_or_insert_with(Instant::now);
        }
        result
    }

    #[allow(clippy::type_complexity)]
    fn apply_events(
        &mut self,
        events: &[(Event, u64, Instant)],
    ) -> Result<(BTreeMap<String, Touch>, u64), rusqlite::Error> {
        if self.known.len() > KNOWN_SESSIONS {
            self.known.clear();
        }
        let mut tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut touched: BTreeMap<String, Touch> = BTreeMap::new();
        let mut refused = 0;
        for (ev, _, _) in events {
            let sp = tx.savepoint()?;
            let mark = self.fts_pending.len();
            match apply_event(&sp, ev, &mut self.fts_pending, &self.known) {
                Ok(Outcome::Applied(effect, turns, index)) => {
                    sp.commit()?;
                    learn(&mut self.known, ev);
                    let t = touched.entry(ev.session().to_string()).or_default();
                    t.effects.extend(effect);
                    t.turns.extend(turns);
                    t.index |= index;
                    t.page |= !matches!(ev, Event::Session(_) | Event::Step { .. });
                }
                Ok(Outcome::Refused(why)) => {
                    self.fts_pending.truncate(mark);
                    warn!("ledger event refused (session {}): {why}", ev.session());
                    refused += 1;
                }
                Err(e) => {
                    self.fts_pending.truncate(mark);
                    warn!("ledger event failed (session {}): {e}", ev.session());
                    refused += 1;
                }
            }
        }
        tx.commit()?;
        Ok((touched, refused))
    }

    /// Drop the least recently used session caches until one more fits
    /// (at most [`CACHE_SESSIONS`], about [`CACHE_BYTES`]).
    fn evict_caches(&mut self) {
        let mut bytes: usize = self.caches.values().map(SessionCache::bytes).sum();
        while self.caches.len() >= CACHE_SESSIONS
            || (bytes > CACHE_BYTES && !self.caches.is_empty())
        {
            let Some(old) = self
                .caches
                .iter()
                .min_by_key(|(_, c)| c.last_used)
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            if self.caches.get(&old).is_some_and(|c| c.index_dirty) {
                if let Err(e) = self.write_index(&old) {
                    warn!("ledger index of session {old}: {e}");
                }
            }
            if let Some(c) = self.caches.remove(&old) {
                bytes = bytes.saturating_sub(c.bytes());
            }
        }
    }

    /// Bring a session's transcript files up to date after a commit.
    fn write_files(&mut self, session: &str, touch: Touch) -> Result<(), StoreError> {
        self.tick += 1;
        if !self.caches.contains_key(session) {
            let Some(meta) = session_meta(&self.conn, session)? else {
                return Ok(());
            };
            self.evict_caches();
            self.caches.insert(
                session.to_string(),
                SessionCache {
                    newest_bytes: 0,
                    meta,
                    summaries: None,
                    newest: None,
                    dir_ready: false,
                    last_used: 0,
                    page: None,
                    page_hash: None,
                    index_dirty: false,
                },
            );
        }
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        cache.last_used = self.tick;
        let meta_changed = touch.effects.iter().any(|e| matches!(e, Effect::Meta(_)));
        for effect in touch.effects {
            apply_effect(cache, effect);
        }
        // The page after the transcripts: a reader who follows the page to
        // a transcript finds it written.
        let result = self.write_transcripts(session, touch.turns, touch.index, meta_changed);
        if touch.page {
            return result.and(self.write_page(session));
        }
        result
    }

    /// Fold newly merged turns into the session's page and write it if it changed.
    fn write_page(&mut self, session: &str) -> Result<(), StoreError> {
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        let dialect = cache.meta.dialect;
        let fresh = cache.page.is_none();
        let page = match &mut cache.page {
            Some(p) => p,
            None => cache.page.insert(rebuild::new_page(&self.conn, session)?),
        };
        let changed = rebuild::advance_page(&self.conn, session, dialect, page)?;
        if !(changed || fresh) {
            return Ok(());
        }
        if rebuild::write_page(&self.dir, session, page, &mut cache.page_hash)? {
            self.shared.pages_written.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Rewrite the given turns' transcript files, and the index when the
    /// session's facts or its list of turns changed (a step that only grows
    /// the newest turn leaves the index to the next deferred flush).
    fn write_transcripts(
        &mut self,
        session: &str,
        touched_turns: BTreeSet<u32>,
        index: bool,
        meta_changed: bool,
    ) -> Result<(), StoreError> {
        if touched_turns.is_empty() && !index {
            return Ok(());
        }
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        if !cache.dir_ready {
            let dir = self.dir.transcript_dir(session);
            paths::create_private_dir_all(&dir).map_err(io_err(&dir))?;
            cache.dir_ready = true;
        }
        let dialect = cache.meta.dialect;
        let mut turns_changed = meta_changed;
        if cache.summaries.is_none() {
            cache.summaries = Some(turn_summaries(&self.conn, session, dialect)?);
            turns_changed = true;
        }
        for turn in touched_turns {
            let (rows, mut sections) = match cache.newest.take() {
                Some(n) if n.turn == turn => (n.rows, n.sections),
                other => {
                    cache.newest = other;
                    (turn_rows(&self.conn, session, turn)?, HashMap::new())
                }
            };
            let path = self.dir.turn_file(session, turn);
            let summary = transcript::summarize_turn(dialect, turn, &rows);
            if let Some(s) = cache.summaries.as_mut() {
                let before = match &summary {
                    Some(sum) => s.insert(turn, sum.clone()),
                    None => s.remove(&turn),
                };
                turns_changed |= before.is_none() != summary.is_none();
            }
            let written = if rows.is_empty() {
                paths::remove_if_exists(&path)
            } else {
                let mut text = transcript::render_turn_head(turn);
                for row in &rows {
                    match sections.get(&row.seq) {
                        Some((raw, s)) if *raw == row.raw => text.push_str(s),
                        _ => {
                            let s = transcript::render_row(dialect, row);
                            text.push_str(&s);
                            sections.insert(row.seq, (row.raw.clone(), s));
                        }
                    }
                }
                paths::write_atomic(&path, text.as_bytes())
            };
            if !matches!(&cache.newest, Some(n) if turn < n.turn) {
                cache.newest_bytes = rows.iter().map(|r| r.raw.len()).sum::<usize>()
                    + sections.values().map(|(_, s)| s.len()).sum::<usize>();
                cache.newest = Some(TurnCache {
                    turn,
                    rows,
                    sections,
                });
            }
            written.map_err(io_err(&path))?;
        }
        if !(index || turns_changed) {
            return Ok(());
        }
        if !turns_changed {
            cache.index_dirty = true;
            self.deferred_since.get_or_insert_with(Instant::now);
            return Ok(());
        }
        self.write_index(session)
    }

    /// Write a session's `index.md` from the cached turn summaries.
    fn write_index(&mut self, session: &str) -> Result<(), StoreError> {
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        if cache.summaries.is_none() {
            cache.summaries = Some(turn_summaries(&self.conn, session, cache.meta.dialect)?);
        }
        let turns: Vec<TurnSummary> = cache
            .summaries
            .as_ref()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        let path = self.dir.index_file(session);
        paths::write_atomic(
            &path,
            transcript::render_index(&cache.meta, &turns).as_bytes(),
        )
        .map_err(io_err(&path))?;
        cache.index_dirty = false;
        Ok(())
    }
}

impl SessionCache {
    fn bytes(&self) -> usize {
        if self.newest.is_some() {
            self.newest_bytes
        } else {
            0
        }
    }
}

fn apply_effect(cache: &mut SessionCache, effect: Effect) {
    match effect {
        Effect::Meta(meta) => cache.meta = meta,
        Effect::Append(rows) => {
            for row in rows {
                let Some(n) = cache.newest.as_mut() else {
                    continue;
                };
                if n.turn == row.turn {
                    if !matches!(n.rows.last(), Some(l) if l.seq >= row.seq) {
                        n.rows.push(row);
                    } else {
                        cache.newest = None;
                    }
                }
                // Other turns are read from the database when rendered.
            }
        }
        Effect::Confirm { seq, turn, raw } => {
            if matches!(&cache.page, Some(p) if seq <= p.merged_upto_seq()) {
                cache.page = None;
            }
            if let Some(n) = cache.newest.as_mut().filter(|n| n.turn == turn) {
                match n.rows.binary_search_by_key(&seq, |r| r.seq) {
                    Ok(i) => {
                        n.rows[i].raw = raw;
                        n.rows[i].from_response = false;
                    }
                    Err(_) => cache.newest = None,
                }
            }
        }
        Effect::Invalidate => {
            cache.newest = None;
            cache.summaries = None;
            cache.page = None;
        }
    }
}

fn session_dialect(c: &Connection, id: &str) -> rusqlite::Result<Dialect> {
    let d: String = c
        .prepare_cached("SELECT dialect FROM sessions WHERE id = ?1")?
        .query_row([id], |r| r.get(0))?;
    Ok(Dialect::parse(&d).unwrap_or(Dialect::Anthropic))
}

fn session_exists(c: &Connection, id: &str) -> rusqlite::Result<bool> {
    c.prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")?
        .exists([id])
}

/// Full-text indexing deferred to the end of a batch: FTS5 flushes its
/// pending segment at every savepoint, so indexing inside the per-event
/// savepoints made every event a flush (and merges). Indexed once per batch,
/// in the same transaction, it flushes once.
struct FtsJob {
    session: String,
    seq: u64,
    raw: Arc<str>,
}

/// What a committed event teaches the writer about its session.
fn learn(known: &mut HashMap<String, Known>, ev: &Event) {
    match ev {
        Event::Session(m) => {
            known.entry(m.id.clone()).or_default().dialect = Some(m.dialect);
        }
        Event::Rows { session, rows } => {
            if let Some(last) = rows.last() {
                known.entry(session.clone()).or_default().next_seq = Some(last.seq + 1);
            }
        }
        _ => {}
    }
}

fn apply_event(
    c: &Connection,
    ev: &Event,
    fts: &mut Vec<FtsJob>,
    known: &HashMap<String, Known>,
) -> rusqlite::Result<Outcome> {
    let k = known.get(ev.session());
    if !matches!(ev, Event::Session(_)) && k.is_none() && !session_exists(c, ev.session())? {
        return Ok(Outcome::Refused("unknown session".into()));
    }
    match ev {
        Event::Session(m) => {
            let json = serde_json::to_string(m).unwrap_or_default();
            c.prepare_cached(
                "INSERT INTO sessions (id, client, client_session, dialect, model, parent,
                                       created_ms, last_ms, meta_json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT(id) DO UPDATE SET
                    client = excluded.client, client_session = excluded.client_session,
                    dialect = excluded.dialect, model = excluded.model, parent = excluded.parent,
                    last_ms = MAX(last_ms, excluded.last_ms), meta_json = excluded.meta_json",
            )?
            .execute(params![
                m.id,
                m.client,
                m.client_session,
                m.dialect.as_str(),
                m.model,
                m.parent,
                m.created_ms,
                m.last_ms,
                json
            ])?;
            // Read back: created_ms is kept from the first upsert.
            let meta = SessionMeta {
                created_ms: c.query_row(
                    "SELECT created_ms FROM sessions WHERE id = ?1",
                    [&m.id],
                    |r| r.get(0),
                )?,
                ..m.clone()
            };
            Ok(Outcome::Applied(Some(Effect::Meta(meta)), Vec::new(), true))
        }
        Event::Rows { session, rows } => {
            let Some(first) = rows.first() else {
                return Ok(Outcome::Applied(None, Vec::new(), false));
            };
            let expected = match k.and_then(|k| k.next_seq) {
                Some(n) => n,
                None => {
                    let max: i64 = c
                        .prepare_cached(
                            "SELECT COALESCE(MAX(seq), 0) FROM rows WHERE session = ?1",
                        )?
                        .query_row([session], |r| r.get(0))?;
                    max as u64 + 1
                }
            };
            if first.seq != expected {
                return Ok(Outcome::Refused(format!(
                    "rows start at seq {} but the ledger expects {expected}",
                    first.seq
                )));
            }
            if let Some(w) = rows.windows(2).find(|w| w[1].seq != w[0].seq + 1) {
                return Ok(Outcome::Refused(format!(
                    "rows jump from seq {} to {}",
                    w[0].seq, w[1].seq
                )));
            }
            let mut stmt = c.prepare_cached(
                "INSERT INTO rows (session, seq, branch, role, kind, turn, step, tokens, raw,
                                   from_response)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?;
            let mut turns = Vec::new();
            for r in rows {
                stmt.execute(params![
                    session,
                    to_i64(r.seq),
                    r.branch,
                    r.role,
                    r.kind.as_str(),
                    r.turn,
                    r.step,
                    r.tokens,
                    &*r.raw,
                    r.from_response
                ])?;
                fts.push(FtsJob {
                    session: session.clone(),
                    seq: r.seq,
                    raw: r.raw.clone(),
                });
                if turns.last() != Some(&r.turn) {
                    turns.push(r.turn);
                }
            }
            Ok(Outcome::Applied(
                Some(Effect::Append(rows.clone())),
                turns,
                true,
            ))
        }
        Event::Confirm { session, seq, raw } => {
            let hit: Option<(i64, bool)> = c
                .prepare_cached(
                    "UPDATE rows SET raw = ?3, from_response = 0 WHERE session = ?1 AND seq = ?2
                     RETURNING turn, hidden",
                )?
                .query_row(params![session, to_i64(*seq), &**raw], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let Some((turn, hidden)) = hit else {
                return Ok(Outcome::Refused(format!("confirm of unknown seq {seq}")));
            };
            fts.push(FtsJob {
                session: session.clone(),
                seq: *seq,
                raw: raw.clone(),
            });
            let turn = turn as u32;
            let turns = if hidden { Vec::new() } else { vec![turn] };
            Ok(Outcome::Applied(
                Some(Effect::Confirm {
                    seq: *seq,
                    turn,
                    raw: raw.clone(),
                }),
                turns,
                false,
            ))
        }
        Event::Branch {
            session,
            at_seq,
            branch,
            hidden,
        } => {
            c.prepare_cached(
                "INSERT OR REPLACE INTO branches (session, branch, at_seq, hidden, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                session,
                branch,
                to_i64(*at_seq),
                hidden.len() as i64,
                now_ms()
            ])?;
            let mut stmt = c.prepare_cached(
                "UPDATE rows SET hidden = 1 WHERE session = ?1 AND seq = ?2 RETURNING turn",
            )?;
            let mut turns = BTreeSet::new();
            for seq in hidden {
                if let Some(t) = stmt
                    .query_row(params![session, to_i64(*seq)], |r| r.get::<_, i64>(0))
                    .optional()?
                {
                    turns.insert(t as u32);
                }
            }
            Ok(Outcome::Applied(
                Some(Effect::Invalidate),
                turns.into_iter().collect(),
                true,
            ))
        }
        Event::Step {
            session,
            step,
            model,
            status,
            usage,
            window_rows,
            ts_ms,
        } => {
            c.prepare_cached(
                "INSERT OR REPLACE INTO steps (session, step, model, status, input, output,
                    cache_read, cache_write, window_rows, ts_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
                session,
                step,
                model,
                status,
                to_i64(usage.input),
                to_i64(usage.output),
                to_i64(usage.cache_read),
                to_i64(usage.cache_write),
                window_rows,
                ts_ms
            ])?;
            c.prepare_cached("UPDATE sessions SET last_ms = MAX(last_ms, ?2) WHERE id = ?1")?
                .execute(params![session, ts_ms])?;
            Ok(Outcome::Applied(None, Vec::new(), false))
        }
        Event::Cut {
            session,
            upto_seq,
            gauge,
            line,
            ts_ms,
        } => {
            c.prepare_cached(
                "INSERT INTO cuts (session, upto_seq, gauge, line, ts_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                session,
                to_i64(*upto_seq),
                to_i64(*gauge),
                to_i64(*line),
                ts_ms
            ])?;
            c.prepare_cached("UPDATE sessions SET cut_upto = ?2 WHERE id = ?1")?
                .execute(params![session, to_i64(*upto_seq)])?;
            Ok(Outcome::Applied(None, Vec::new(), false))
        }
    }
}
