//! The ledger store: the backend traits ([`LedgerWrite`], [`LedgerRead`],
//! [`LedgerStore`]) and their SQLite engine, [`Store`].
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
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the [`Store`] handle: open, submit, settle, shutdown, metrics |
//! | `backend.rs` | the backend traits and the records they return |
//! | `error.rs` | [`StoreError`] (leaf) |
//! | `sql.rs` | SQL helpers shared by every part (leaf): rows, facts, summaries, the search-text batch, the dialect policy |
//! | `schema.rs` | migrations, opening connections, the search-index backfill |
//! | `queue.rs` | commands and the state shared with the writer |
//! | `writer.rs` | the writer loop: batches, transactions, deferred writes |
//! | `apply.rs` | the SQL of each event, the gap-free check |
//! | `files.rs` | transcripts, `index.md`, `SESSION.md` after a commit; the writer's caches |
//! | `page_io.rs` | the database side of `SESSION.md` |
//! | `jobs.rs` | rebuild, sweep, vacuum, page notes on the writer thread |
//! | `rebuild.rs`, `retention.rs` | the engine side of `ledger rebuild` and retention |
//! | `reads.rs` | read-only connections: lists, lookups, rows, recall, search |
//! | `impls.rs` | the backend traits for [`Store`] |

mod apply;
mod backend;
mod error;
mod files;
mod impls;
mod jobs;
mod page_io;
mod queue;
mod reads;
mod rebuild;
mod retention;
mod schema;
mod sql;
mod writer;

pub use backend::{
    Behind, BehindReason, CutRecord, Health, HealthStatus, LedgerRead, LedgerStore, LedgerWrite,
    LoadedSession, SessionSummary, SettleFuture, StepRecord, StoreMetrics, LAG_WINDOW,
};
pub(crate) use error::io_err;
pub use error::StoreError;
pub use schema::SCHEMA_VERSION;

use crate::model::Event;
use crate::paths::DataDir;
use parking_lot::{Mutex, RwLock};
use queue::{Cmd, Reply, Shared};
use rusqlite::Connection;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tracing::warn;
use writer::Writer;

/// Idle read connections kept for reuse.
const READER_POOL: usize = 4;
/// How long SQLite waits for a lock before an operation fails as busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

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
        let conn = schema::open_writer(&db, BUSY_TIMEOUT)?;

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

    /// Whether the writer keeps up (see [`LedgerWrite::health`]).
    pub fn health(&self) -> Health {
        let m = self.metrics();
        let mut reasons = Vec::new();
        if m.commits_failed > 0 {
            reasons.push(format!("{} ledger batches lost", m.commits_failed));
        }
        Health {
            status: if reasons.is_empty() {
                HealthStatus::Ok
            } else {
                HealthStatus::Degraded
            },
            reasons,
            lag_ms: m.writer_lag_ms,
            queued: m.queued,
            queued_bytes: 0,
            behind: 0,
        }
    }

    /// Sessions behind (see [`LedgerWrite::behind_count`]).
    pub fn behind_count(&self) -> usize {
        0
    }

    /// Whether `session` is behind.
    pub fn behind(&self, _session: &str) -> Option<Behind> {
        None
    }

    /// Every session behind.
    pub fn behind_sessions(&self) -> Vec<(String, Behind)> {
        Vec::new()
    }

    /// Clear `session`'s behind mark and return what is committed of it
    /// (see [`LedgerWrite::resync`]).
    pub fn resync(&self, session: &str) -> Result<Option<LoadedSession>, StoreError> {
        self.load_session(session)
    }

    /// The recorded sessions of a client key, root first, as committed
    /// (see [`LedgerWrite::restore_client`]).
    pub fn restore_client(&self, key: &str) -> Result<Vec<LoadedSession>, StoreError> {
        match self.settle_blocking() {
            Ok(()) | Err(StoreError::Closed) => {}
            Err(e) => return Err(e),
        }
        let mut out = Vec::new();
        for id in self.sessions_for_client(key)? {
            if let Some(s) = self.with_reader(|c| sql::load_session(c, &id))? {
                out.push(s);
            }
        }
        Ok(out)
    }
}
