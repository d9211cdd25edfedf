//! The SQLite engine of the ledger store, [`Store`]: it implements the
//! backend traits ([`crate::store::LedgerWrite`], [`crate::store::LedgerRead`],
//! [`crate::store::LedgerStore`]) with the shared writer of `store/writer.rs` over
//! its `Db`, `db::Lite`.
//!
//! One thread (`oceancode-writer`) owns the write connection. The request
//! path hands it [`Event`]s and never waits: admission bounds the queue in
//! events and bytes ([`StoreOptions`]), and what does not fit is shed, its
//! session marked *behind* (see [`crate::store::LedgerWrite`]). The
//! writer takes whatever is queued (up to `batch_max`), applies it in ONE
//! transaction (each event under its own savepoint, so a refused event does
//! not sink its batch), commits — retrying with backoff while the database
//! refuses — then rewrites the transcript files of the turns it touched
//! (atomic replace), then `SESSION.md` when a turn came wholly past the
//! tideline ([`crate::page`]). [`LedgerWrite::settle`] is a barrier that resolves
//! once everything queued before it is committed and its files are written.
//! Rows are also indexed for search (`row_text` + FTS5 `row_fts`). Rebuild,
//! the retention sweep, vacuum and model-merged page notes run as jobs on the
//! same thread, in queue order.
//!
//! What is on disk is always a gap-free, in-order prefix of each session: an
//! `Event::Rows` whose first `seq` is not exactly `max(seq) + 1` is refused
//! and leaves its session behind. A crash loses only what was still queued.
//!
//! Events carry no HTTP headers, so no secret can reach the database.
//!
//! Readers use separate read-only connections and see committed state.
//! [`LedgerRead::load_session`] settles first (it is the reload path and must see
//! every queued write); [`LedgerRead::list_sessions`] and
//! [`LedgerRead::latest_session`] do not (they may lag by the writer lag) — call
//! [`LedgerWrite::settle`] before them when that matters (export, recall,
//! retention).
//!
//! The files of this module are mapped in `docs/ARCHITECTURE.md`.

mod apply;
mod db;
mod jobs;
mod reads;
mod rebuild;
mod retention;
pub(super) mod schema;
mod source;
mod sql;

use super::backend::{LedgerRead, LedgerWrite, SettleFuture};
use super::error::{io_err, StoreError};
use super::handle::WriterHandle;
use super::health::{health_of, RESTORE_WAIT};
use super::queue::Shared;
use super::records::{Behind, BehindReason, Health, LoadedSession, StoreMetrics};
use super::writer::Writer;
use super::{metrics_of, StoreOptions};
use crate::model::Event;
use crate::paths::DataDir;
use db::Lite;
use parking_lot::Mutex;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// The SQLite engine's writer.
type LiteWriter = Writer<Lite>;

/// Idle read connections kept for reuse.
const READER_POOL: usize = 4;

/// Handle to the ledger database. Cheap to clone; the writer stops when
/// [`LedgerWrite::shutdown`] is called or the last clone is dropped.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: DataDir,
    db: PathBuf,
    busy: Duration,
    writer: WriterHandle<LiteWriter>,
    shared: Arc<Shared>,
    /// Idle read connections, with the database generation they read.
    readers: Mutex<Vec<(u64, Connection)>>,
}

impl Store {
    /// Open (or create) the ledger under `data_dir`: creates the layout
    /// (`0700` dirs, `0600` db), enables WAL (`synchronous=NORMAL`), migrates
    /// the schema, writes again the transcript files a crash left missing
    /// and starts the writer thread.
    pub fn open(data_dir: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        let dir = DataDir::new(data_dir);
        dir.ensure_root().map_err(io_err(data_dir))?;
        let db = dir.db_path();
        let conn = schema::open_writer(&db, opts.busy_timeout)?;
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::new(opts.queue_capacity, opts.queue_bytes));
        let lite = Lite::new(conn, dir.clone(), opts.busy_timeout, shared.clone());
        let mut writer = Writer::new(lite, dir.clone(), rx, shared.clone(), opts.batch_max);
        writer.db.heal_holes(&mut writer.files);
        let handle = std::thread::Builder::new()
            .name("oceancode-writer".into())
            .spawn(move || writer.run())
            .map_err(io_err(&db))?;
        Ok(Store {
            inner: Arc::new(Inner {
                dir,
                db,
                busy: opts.busy_timeout,
                writer: WriterHandle::new(tx, handle, shared.clone()),
                shared,
                readers: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Like [`LedgerWrite::submit`], but an event that does not fit is handed
    /// back ([`StoreError::QueueFull`]) and its session stays as it was.
    pub fn try_submit(&self, ev: Event) -> Result<(), StoreError> {
        self.inner.writer.enqueue(ev, false)
    }

    /// Age in ms of the oldest queued-but-uncommitted event (0 when idle).
    pub fn writer_lag_ms(&self) -> u64 {
        self.inner.shared.queue_state().2
    }

    /// `<data>/oceancode.db`.
    pub fn db_path(&self) -> &Path {
        &self.inner.db
    }

    /// `<data>/sessions/<sanitized id>`.
    pub fn session_dir(&self, id: &str) -> PathBuf {
        self.inner.dir.session_dir(id)
    }
}

impl LedgerWrite for Store {
    /// Queue an event for the writer. Never blocks and never waits on the
    /// disk: an event that does not fit the queue (`queue_capacity` events,
    /// `queue_bytes` bytes) is shed, and so is every later event of its
    /// session until [`LedgerWrite::resync`]: the session is *behind*
    /// (counted in [`StoreMetrics::shed`]; see [`LedgerWrite`] for the
    /// protocol).
    fn submit(&self, ev: Event) -> Result<(), StoreError> {
        self.inner.writer.enqueue(ev, true)
    }

    /// Barrier: resolves once everything queued before it is committed and
    /// its transcript files are written (while commits fail, it waits for
    /// them to succeed).
    fn settle(&self) -> SettleFuture<'_> {
        self.inner.writer.settle()
    }

    /// Blocking form of [`LedgerWrite::settle`] (safe on any thread, blocks it).
    fn settle_blocking(&self) -> Result<(), StoreError> {
        self.inner.writer.settle_blocking()
    }

    fn settle_within(&self, wait: Duration) -> Result<bool, StoreError> {
        self.inner.writer.settle_within(wait)
    }

    fn health(&self) -> Health {
        health_of(&self.inner.shared)
    }

    fn metrics(&self) -> StoreMetrics {
        metrics_of(&self.inner.shared)
    }

    fn behind_count(&self) -> usize {
        self.inner.shared.behind_count()
    }

    fn behind(&self, session: &str) -> Option<Behind> {
        self.inner.shared.behind(session)
    }

    /// Every session behind, oldest first.
    fn behind_sessions(&self) -> Vec<(String, Behind)> {
        self.inner.shared.behind_sessions()
    }

    /// Clear `session`'s behind mark and return what is committed of it
    /// (None = nothing). With nothing of the session queued
    /// ([`Behind::ready`]) it reads at once; otherwise it runs on the
    /// writer after the session's queued events (which are dropped), so it
    /// waits for them.
    fn resync(&self, session: &str) -> Result<Option<LoadedSession>, StoreError> {
        if self.inner.shared.clear_behind_if_idle(session) {
            return self.with_reader(|c| sql::load_session(c, session));
        }
        let id = session.to_string();
        self.run_job(move |w| {
            w.shared.clear_behind(&id);
            w.forget(&id);
            sql::load_session(&w.db.conn, &id)
        })
    }

    /// The recorded sessions of a client key, root first, as committed, each
    /// one's behind mark cleared when nothing of it is queued (the caller
    /// takes them as the sessions' state). It waits for the writer only when
    /// something of the key is still queued, and then at most
    /// [`RESTORE_WAIT`]: a session of it that still has events queued after
    /// that falls behind and heals by resync.
    fn restore_client(&self, key: &str) -> Result<Vec<LoadedSession>, StoreError> {
        let s = &self.inner.shared;
        // Asked before the read too: a session of the key committed between
        // the read and the second question would be missed.
        let key_queued = s.queued_for(key, &[]);
        let ids = self.sessions_for_client(key)?;
        let ids = if key_queued || s.queued_for(key, &ids) {
            match self.settle_within(RESTORE_WAIT) {
                Ok(_) | Err(StoreError::Closed) => {}
                Err(e) => return Err(e),
            }
            self.sessions_for_client(key)?
        } else {
            ids
        };
        let mut out = Vec::new();
        for id in ids {
            if let Some(l) = self.with_reader(|c| sql::load_session(c, &id))? {
                if !s.clear_behind_if_idle(&id) {
                    s.mark_behind(&id, 0, BehindReason::Gap);
                }
                out.push(l);
            }
        }
        Ok(out)
    }

    /// Drain the queue, commit, write transcripts and join the writer (a
    /// batch that cannot commit is retried for a few seconds more, then
    /// given up with an ERROR line). Idempotent; later submits return
    /// [`StoreError::Closed`].
    fn shutdown(&self) -> Result<(), StoreError> {
        self.inner.writer.shutdown()
    }
}
