//! The SQLite engine's half of the writer ([`Lite`], a [`Db`]): one
//! write connection to `oceancode.db`, each event of a batch under its own
//! savepoint ([`super::apply`]), the full-text index of new rows deferred
//! and written once per flush, and the file at the database path checked
//! before every batch: deleted or replaced, it is opened afresh in its place
//! (one ERROR line) and the sessions fall behind and heal from their
//! resends. At open, the files a kill -9 left missing are written again.

use super::apply::{apply_event, FtsJob};
use super::schema;
use super::sql::{session_dialect, TextBatch};
use crate::paths::DataDir;
use crate::store::apply::take;
use crate::store::effects::{Applied, Known, Outcome};
use crate::store::error::{io_err, StoreError};
use crate::store::files::{fill_missing, Files};
use crate::store::queue::Shared;
use crate::store::source::Source;
use crate::store::writer::{Db, Queued, Reopen};
use rusqlite::{Connection, ErrorCode, TransactionBehavior};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, error, info, warn};

/// Sessions whose facts the writer keeps (beyond it, the map starts over).
const KNOWN_SESSIONS: usize = 100_000;

/// The identity of a file (device, inode).
type FileId = (u64, u64);

fn file_id(path: &std::path::Path) -> Option<FileId> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether an SQLite error is the environment's (locks, space, I/O, a
/// read-only or vanished file) and worth retrying, rather than the event's.
pub(super) fn transient(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::DiskFull
                | ErrorCode::SystemIoFailure
                | ErrorCode::ReadOnly
                | ErrorCode::CannotOpen
                | ErrorCode::OutOfMemory
                | ErrorCode::FileLockingProtocolFailed
        )
    )
}

/// The SQLite writer's database.
pub(crate) struct Lite {
    pub(super) conn: Connection,
    dir: DataDir,
    db: PathBuf,
    /// What `db` was when it was opened (None = unknown).
    db_id: Option<FileId>,
    busy: Duration,
    shared: Arc<Shared>,
    /// Committed rows not yet in the full-text index.
    fts_pending: Vec<FtsJob>,
    /// What the writer knows of sessions it has seen, so a step does not
    /// query for it.
    known: HashMap<String, Known>,
    /// The database was opened afresh: sessions falling behind now are
    /// expected (not a WARN each).
    reopened: bool,
}

impl Lite {
    pub(super) fn new(conn: Connection, dir: DataDir, busy: Duration, shared: Arc<Shared>) -> Lite {
        let db = dir.db_path();
        Lite {
            db_id: file_id(&db),
            db,
            conn,
            dir,
            busy,
            shared,
            fts_pending: Vec::new(),
            known: HashMap::new(),
            reopened: false,
        }
    }

    /// At open: write the turn files of the active line and the `index.md`
    /// that are missing (kill -9 between a commit and its files, a
    /// read-only period), from the database. Only what is missing is
    /// created, never replaced, so a proxy writing the same files meanwhile
    /// (this open is a CLI command's) keeps its newer ones.
    pub(super) fn heal_holes(&self, files: &mut Files) {
        let holes = match self.find_holes() {
            Ok(h) => h,
            Err(e) => {
                warn!("ledger transcripts not checked for missing files: {e}");
                return;
            }
        };
        if holes.is_empty() {
            return;
        }
        let mut written = 0usize;
        let sessions = holes.len();
        for hole in holes {
            match fill_missing(
                &self.conn,
                &self.dir,
                &hole.session,
                &hole.turns,
                hole.index,
            ) {
                Ok(n) => {
                    written += n;
                    self.shared.files_healed.fetch_add(1, Ordering::Relaxed);
                }
                Err(StoreError::Corrupt(why)) => warn!("ledger files not written: {why}"),
                Err(e) => files.failed(&hole.session, &e),
            }
        }
        info!(
            sessions,
            files = written,
            "ledger transcripts: missing files written again from the database"
        );
    }

    /// Sessions with missing files: which turn files, and whether `index.md`.
    fn find_holes(&self) -> Result<Vec<Hole>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT r.session, r.turn FROM rows r JOIN sessions s ON s.id = r.session
             WHERE r.hidden = 0 GROUP BY r.session, r.turn ORDER BY r.session, r.turn",
        )?;
        let mut out: Vec<Hole> = Vec::new();
        let mut current: Option<Hole> = None;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let session: String = r.get(0)?;
            let turn = r.get::<_, i64>(1)? as u32;
            if current.as_ref().is_none_or(|h| h.session != session) {
                out.extend(current.take().filter(Hole::any));
                current = Some(Hole {
                    index: !self.dir.index_file(&session).exists(),
                    session,
                    turns: Vec::new(),
                });
            }
            if let Some(h) = current.as_mut() {
                if !self.dir.turn_file(&h.session, turn).exists() {
                    h.turns.push(turn);
                }
            }
        }
        out.extend(current.filter(Hole::any));
        Ok(out)
    }

    /// Index rows for full-text search, in one transaction (rows of a
    /// session whose dialect this build does not know are skipped).
    fn index_text(&mut self, jobs: &[FtsJob]) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut batch = TextBatch::default();
        let mut unknown: HashSet<&str> = HashSet::new();
        for job in jobs {
            if unknown.contains(&*job.session) {
                continue;
            }
            let dialect = match self.known.get(&*job.session).and_then(|k| k.dialect) {
                Some(d) => d,
                None => match session_dialect(&tx, &job.session) {
                    Ok(d) => {
                        let known = self.known.entry(job.session.to_string()).or_default();
                        *known.dialect.insert(d)
                    }
                    Err(StoreError::Corrupt(why)) => {
                        warn!("search index: {why}; its rows are not indexed");
                        unknown.insert(&job.session);
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            batch.push(&tx, &job.session, job.seq, dialect, &job.raw)?;
        }
        batch.flush(&tx)?;
        tx.commit()?;
        Ok(())
    }

    fn apply_events(&mut self, events: &[Queued]) -> Result<Applied, StoreError> {
        if self.known.len() > KNOWN_SESSIONS {
            self.known.clear();
        }
        let mut tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut out = Applied::default();
        for (ev, id, _) in events {
            if out.skips(ev) {
                continue;
            }
            let sp = tx.savepoint()?;
            let mark = self.fts_pending.len();
            let outcome = match apply_event(&sp, ev, &mut self.fts_pending, &self.known) {
                Ok(outcome) => Ok(outcome),
                Err(e) if transient(&e) => return Err(e.into()),
                Err(e) => Err(e.to_string()),
            };
            if matches!(outcome, Ok(Outcome::Applied(_))) {
                sp.commit()?;
            } else {
                // Dropped, the savepoint rolls the event back.
                drop(sp);
            }
            if !take(&mut out, &mut self.known, ev, *id, outcome) {
                self.fts_pending.truncate(mark);
            }
        }
        tx.commit()?;
        Ok(out)
    }
}

impl Db for Lite {
    /// Make sure the connection writes to the file at the database path: if
    /// the file was deleted or replaced (the data dir removed while serving),
    /// open a fresh ledger there. Sessions fall behind at their next event
    /// and heal from their resends.
    fn ensure(&mut self) -> Result<Reopen, StoreError> {
        let now = file_id(&self.db);
        if now.is_some() && now == self.db_id {
            return Ok(Reopen::No);
        }
        if self.db_id.is_some() {
            error!(
                db = %self.db.display(),
                "the ledger database was deleted or replaced while serving; opening a fresh ledger in its place (live sessions record again from their clients' next full resend)"
            );
            self.db_id = None;
            self.shared.reopens.fetch_add(1, Ordering::Relaxed);
        }
        self.dir.ensure_root().map_err(io_err(self.dir.root()))?;
        let conn = schema::open_writer(&self.db, self.busy)?;
        self.conn = conn;
        self.db_id = file_id(&self.db);
        self.fts_pending.clear();
        self.reopened = true;
        Ok(Reopen::Fresh)
    }

    /// One attempt at a batch in one transaction; rolled back entirely on an
    /// error of the environment.
    fn apply(&mut self, events: &[Queued]) -> Result<Applied, StoreError> {
        let fts_mark = self.fts_pending.len();
        let result = self.apply_events(events);
        if result.is_err() {
            // Rolled back: forget what this attempt queued or learned.
            self.fts_pending.truncate(fts_mark);
            self.known.clear();
        }
        result
    }

    fn source(&self) -> &dyn Source {
        &self.conn
    }

    fn deferred(&self) -> usize {
        self.fts_pending.len()
    }

    fn flush_deferred(&mut self) -> bool {
        let jobs = std::mem::take(&mut self.fts_pending);
        match self.index_text(&jobs) {
            Ok(()) => false,
            Err(StoreError::Sqlite(e)) if transient(&e) => {
                // Tried again with the next flush.
                debug!("ledger search index of {} rows deferred: {e}", jobs.len());
                self.fts_pending = jobs;
                true
            }
            Err(e) => {
                // The rows are committed; the next open indexes what is missing.
                warn!("ledger search index of {} rows: {e}", jobs.len());
                false
            }
        }
    }

    fn flush_deferred_part(&mut self, max: usize) -> bool {
        let n = max.min(self.fts_pending.len());
        let jobs: Vec<FtsJob> = self.fts_pending.drain(..n).collect();
        match self.index_text(&jobs) {
            Ok(()) => false,
            Err(StoreError::Sqlite(e)) if transient(&e) => {
                debug!("ledger search index of {} rows deferred: {e}", jobs.len());
                self.fts_pending.splice(0..0, jobs);
                true
            }
            Err(e) => {
                warn!("ledger search index of {} rows: {e}", jobs.len());
                false
            }
        }
    }

    fn forget(&mut self, session: &str) {
        self.known.remove(session);
    }

    fn forget_all(&mut self) {
        self.known.clear();
    }

    fn quiet_behind(&self) -> bool {
        self.reopened
    }
}

/// What a session misses on disk.
struct Hole {
    session: String,
    /// Turn files of the active line that are missing.
    turns: Vec<u32>,
    /// `index.md` is missing.
    index: bool,
}

impl Hole {
    fn any(&self) -> bool {
        self.index || !self.turns.is_empty()
    }
}
