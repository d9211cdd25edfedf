//! The writer thread: takes what is queued (up to `batch_max`), applies it in
//! one transaction (each event under its own savepoint, so a refused event
//! does not sink its batch), commits, then brings the touched sessions' files
//! up to date ([`super::files`]). Jobs (rebuild, sweep, vacuum, page notes)
//! run here too, in queue order.
//!
//! Faults: a batch whose transaction fails (the database locked past the
//! busy timeout, the disk full, an I/O error) is retried with bounded
//! backoff and never dropped while the process lives (at shutdown it gets a
//! grace period); one WARN line when commits start failing, one INFO line
//! when they recover. The database file is checked before every batch and
//! once a second when idle: deleted or replaced, it is opened afresh in its
//! place (one ERROR line) and the sessions fall behind and heal. An event
//! refused because it does not continue what is committed marks its session
//! behind (see [`super::backend`]).

use super::apply::{apply_event, learn, FtsJob, Known, Outcome, Touch};
use super::backend::{BehindReason, LAG_WINDOW};
use super::error::{io_err, StoreError};
use super::files::SessionCache;
use super::queue::{Cmd, Fault, Shared};
use super::schema;
use super::sql::{session_dialect, TextBatch};
use crate::model::Event;
use crate::paths::DataDir;
use rusqlite::{Connection, ErrorCode, TransactionBehavior};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// Sessions whose newest turn / turn index the writer keeps in memory.
pub(super) const CACHE_SESSIONS: usize = 1024;
/// Bytes of cached newest-turn rows and rendered sections across sessions
/// beyond which the least recently used session's cache is dropped.
pub(super) const CACHE_BYTES: usize = 256 << 20;
/// Longest a deferred write (a session's `index.md`, the full-text index of
/// new rows) waits behind the events; `settle`, jobs and shutdown flush it
/// at once.
pub(super) const DEFER_MAX: Duration = Duration::from_millis(1000);
/// Rows waiting for the full-text index that force a flush.
const FTS_BATCH: usize = 1024;
/// Sessions whose facts the writer keeps (beyond it, the map starts over).
const KNOWN_SESSIONS: usize = 100_000;
/// How often an idle writer checks that its database file is still there.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// First and longest wait between attempts of a failing batch.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// First and longest wait before failed file writes are tried again.
pub(super) const FILES_RETRY_MIN: Duration = Duration::from_secs(1);
pub(super) const FILES_RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a failing batch is still retried once shutdown was asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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

/// One queued event as the writer holds it.
type Queued = (Event, u64, Instant);

/// What one successful attempt at a batch did.
struct Applied {
    touched: BTreeMap<String, Touch>,
    refused: u64,
    /// Sessions that fall behind with this batch: (session, event id,
    /// reason, why).
    behind: Vec<(String, u64, BehindReason, String)>,
    /// Events skipped because their session fell behind earlier in the batch.
    skipped: u64,
}

/// The writer thread's state.
pub(crate) struct Writer {
    pub(super) conn: Connection,
    pub(super) dir: DataDir,
    db: PathBuf,
    /// What `db` was when it was opened (None = unknown).
    db_id: Option<FileId>,
    busy: Duration,
    rx: Receiver<Cmd>,
    pub(super) shared: Arc<Shared>,
    batch_max: usize,
    pub(super) caches: HashMap<String, SessionCache>,
    pub(super) tick: u64,
    /// Committed rows not yet in the full-text index.
    pub(super) fts_pending: Vec<FtsJob>,
    /// Since when something deferred waits (`index.md`, `fts_pending`).
    pub(super) deferred_since: Option<Instant>,
    /// What the writer knows of sessions it has seen, so a step does not
    /// query for it.
    pub(super) known: HashMap<String, Known>,
    /// Sessions whose file writes failed: all their files are written again
    /// once writes succeed.
    pub(super) files_failing: BTreeSet<String>,
    /// When failed file writes are tried next, and the wait after that.
    pub(super) files_retry: (Instant, Duration),
    /// The database was opened afresh: sessions falling behind now are
    /// expected (not a WARN each).
    reopened: bool,
    /// When the idle check last ran.
    checked: Instant,
    /// When a failing batch first saw shutdown asked for.
    stop_seen: Option<Instant>,
    /// A batch was given up at shutdown (later ones are not an ERROR each).
    gave_up: bool,
}

impl Writer {
    pub(super) fn new(
        conn: Connection,
        dir: DataDir,
        busy: Duration,
        rx: Receiver<Cmd>,
        shared: Arc<Shared>,
        batch_max: usize,
    ) -> Writer {
        let db = dir.db_path();
        Writer {
            db_id: file_id(&db),
            db,
            conn,
            dir,
            busy,
            rx,
            shared,
            batch_max: batch_max.max(1),
            caches: HashMap::new(),
            tick: 0,
            fts_pending: Vec::new(),
            deferred_since: None,
            known: HashMap::new(),
            files_failing: BTreeSet::new(),
            files_retry: (Instant::now(), FILES_RETRY_MIN),
            reopened: false,
            checked: Instant::now(),
            stop_seen: None,
            gave_up: false,
        }
    }

    pub(super) fn run(mut self) {
        loop {
            let first = match self.rx.recv_timeout(self.next_wake()) {
                Ok(cmd) => cmd,
                Err(RecvTimeoutError::Timeout) => {
                    self.idle();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
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
                        self.process(std::mem::take(&mut events));
                        self.flush_deferred(true);
                        job(&mut self);
                        self.known.clear();
                    }
                    Cmd::Shutdown => stop = true,
                }
            }
            self.process(events);
            let due = self
                .deferred_since
                .is_some_and(|since| since.elapsed() >= DEFER_MAX);
            if stop || due || !replies.is_empty() || self.fts_pending.len() >= FTS_BATCH {
                self.flush_deferred(stop || !replies.is_empty());
            }
            for r in replies {
                r.send();
            }
            if stop {
                break;
            }
        }
        self.flush_deferred(true);
        debug!("ledger writer stopped");
    }

    /// How long an idle writer waits for the next command.
    fn next_wake(&self) -> Duration {
        let now = Instant::now();
        let mut at = self.checked + CHECK_EVERY;
        if let Some(since) = self.deferred_since {
            at = at.min(since + DEFER_MAX);
        }
        if !self.files_failing.is_empty() {
            at = at.min(self.files_retry.0);
        }
        at.saturating_duration_since(now)
    }

    /// Nothing queued: check the database file, flush what is due, try
    /// failed file writes again.
    fn idle(&mut self) {
        if self.checked.elapsed() >= CHECK_EVERY {
            self.checked = Instant::now();
            if let Err(e) = self.ensure_db() {
                self.commit_failed(&e, 0);
            } else {
                self.commit_recovered();
            }
        }
        let due = self
            .deferred_since
            .is_some_and(|since| since.elapsed() >= DEFER_MAX);
        if due || (!self.files_failing.is_empty() && Instant::now() >= self.files_retry.0) {
            self.flush_deferred(false);
        }
    }

    /// Make sure the connection writes to the file at the database path: if
    /// the file was deleted or replaced (the data dir removed while serving),
    /// open a fresh ledger there. Everything the writer cached is dropped;
    /// sessions fall behind at their next event and heal from their resends.
    fn ensure_db(&mut self) -> Result<(), StoreError> {
        let now = file_id(&self.db);
        if now.is_some() && now == self.db_id {
            return Ok(());
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
        self.caches.clear();
        self.known.clear();
        self.fts_pending.clear();
        self.files_failing.clear();
        self.reopened = true;
        self.shared.generation.fetch_add(1, Ordering::Release);
        let mut f = self.shared.faults.lock();
        f.files = None;
        f.files_sessions = 0;
        Ok(())
    }

    /// A commit attempt failed: the first failure of a fault is a WARN line.
    fn commit_failed(&mut self, e: &StoreError, events: usize) {
        let mut f = self.shared.faults.lock();
        match &mut f.commit {
            Some(fault) => {
                fault.retries += 1;
                fault.error = e.to_string();
            }
            None => {
                warn!(
                    events,
                    "ledger commits failing ({e}); retrying with backoff: queued events are kept and no request waits"
                );
                f.commit = Some(Fault {
                    since: Instant::now(),
                    error: e.to_string(),
                    retries: 0,
                });
            }
        }
    }

    /// Commits succeed (again).
    fn commit_recovered(&mut self) {
        let fault = self.shared.faults.lock().commit.take();
        if let Some(f) = fault {
            info!(
                retries = f.retries,
                "ledger commits recovered after {:.1}s",
                f.since.elapsed().as_secs_f64()
            );
        }
    }

    /// Write what waits: the `index.md` of sessions whose turns did not
    /// change since it was last written, the full-text index of new rows,
    /// and (when due, or `force`d by a settle, a job or shutdown) every file
    /// of the sessions whose file writes failed.
    pub(super) fn flush_deferred(&mut self, force: bool) {
        self.deferred_since = None;
        let dirty: Vec<String> = self
            .caches
            .iter()
            .filter(|(_, c)| c.index_dirty)
            .map(|(k, _)| k.clone())
            .collect();
        for session in dirty {
            if let Err(e) = self.write_index(&session) {
                self.files_failed(&session, &e);
            }
        }
        if !self.files_failing.is_empty() && (force || Instant::now() >= self.files_retry.0) {
            self.retry_files();
        }
        if self.fts_pending.is_empty() {
            return;
        }
        let jobs = std::mem::take(&mut self.fts_pending);
        match self.index_text(&jobs) {
            Ok(()) => {}
            Err(StoreError::Sqlite(e)) if transient(&e) => {
                // Tried again with the next flush.
                debug!("ledger search index of {} rows deferred: {e}", jobs.len());
                self.fts_pending = jobs;
                self.deferred_since = Some(Instant::now());
            }
            Err(e) => {
                // The rows are committed; the next open indexes what is missing.
                warn!("ledger search index of {} rows: {e}", jobs.len());
            }
        }
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
            if unknown.contains(job.session.as_str()) {
                continue;
            }
            let known = self.known.entry(job.session.clone()).or_default();
            let dialect = match known.dialect {
                Some(d) => d,
                None => match session_dialect(&tx, &job.session) {
                    Ok(d) => *known.dialect.insert(d),
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

    /// Commit a batch: events of sessions behind are dropped, the rest is
    /// applied in one transaction, retried until it commits.
    fn process(&mut self, events: Vec<Queued>) {
        if events.is_empty() {
            return;
        }
        let (events, dropped): (Vec<Queued>, Vec<Queued>) = events
            .into_iter()
            .partition(|(ev, id, _)| !self.shared.drops(ev.session(), *id));
        if !dropped.is_empty() {
            self.shared
                .shed
                .fetch_add(dropped.len() as u64, Ordering::Relaxed);
            self.shared.forget(dropped.iter().map(|(_, id, _)| *id));
        }
        if events.is_empty() {
            return;
        }
        let Some(applied) = self.commit_batch(&events) else {
            if !std::mem::replace(&mut self.gave_up, true) {
                error!(
                    events = events.len(),
                    queued = self.shared.queue_state().0,
                    "ledger writer stopping with writes it could not commit: they are lost"
                );
            }
            self.shared.commits_failed.fetch_add(1, Ordering::Relaxed);
            self.shared.forget(events.iter().map(|(_, id, _)| *id));
            return;
        };
        let committed = Instant::now();
        let s = &self.shared;
        s.batches.fetch_add(1, Ordering::Relaxed);
        s.events.fetch_add(events.len() as u64, Ordering::Relaxed);
        s.rejected.fetch_add(applied.refused, Ordering::Relaxed);
        s.shed.fetch_add(applied.skipped, Ordering::Relaxed);
        {
            let mut lags = s.lags_us.lock();
            for (_, _, at) in &events {
                if lags.len() == LAG_WINDOW {
                    lags.pop_front();
                }
                lags.push_back(committed.duration_since(*at).as_micros() as u64);
            }
        }
        for (session, id, reason, why) in &applied.behind {
            if s.mark_behind(session, *id, *reason) {
                if self.reopened {
                    debug!(session = %session, "ledger session behind after the reopen: {why}");
                } else {
                    warn!(
                        session = %session,
                        "ledger session behind ({why}): its later events are dropped until the proxy resyncs it from the client's next full resend"
                    );
                }
            }
        }
        s.forget(events.iter().map(|(_, id, _)| *id));
        for (session, touch) in applied.touched {
            // Rendering reads arbitrary client JSON: never let a bug there
            // take the writer (and the database) down.
            let written =
                std::panic::catch_unwind(AssertUnwindSafe(|| self.write_files(&session, touch)))
                    .unwrap_or_else(|_| {
                        Err(StoreError::Corrupt("transcript renderer panicked".into()))
                    });
            if let Err(e) = written {
                self.files_failed(&session, &e);
            }
        }
    }

    /// Apply `events` in one transaction until it commits, with backoff
    /// between attempts. None = shutdown was asked for and the grace period
    /// ran out.
    fn commit_batch(&mut self, events: &[Queued]) -> Option<Applied> {
        let mut backoff = BACKOFF_MIN;
        loop {
            let attempt = self.ensure_db().and_then(|()| self.apply_batch(events));
            match attempt {
                Ok(applied) => {
                    self.commit_recovered();
                    return Some(applied);
                }
                Err(e) => {
                    self.shared.commit_retries.fetch_add(1, Ordering::Relaxed);
                    self.commit_failed(&e, events.len());
                    if self.shared.stopping.load(Ordering::Acquire) {
                        let seen = *self.stop_seen.get_or_insert_with(Instant::now);
                        if seen.elapsed() >= SHUTDOWN_GRACE {
                            return None;
                        }
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// One attempt at a batch in one transaction; rolled back entirely on an
    /// error of the environment.
    fn apply_batch(&mut self, events: &[Queued]) -> Result<Applied, StoreError> {
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

    fn apply_events(&mut self, events: &[Queued]) -> Result<Applied, StoreError> {
        if self.known.len() > KNOWN_SESSIONS {
            self.known.clear();
        }
        let mut tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut out = Applied {
            touched: BTreeMap::new(),
            refused: 0,
            behind: Vec::new(),
            skipped: 0,
        };
        let mut fallen: HashSet<String> = HashSet::new();
        for (ev, id, _) in events {
            let session = ev.session();
            if fallen.contains(session) {
                out.skipped += 1;
                continue;
            }
            let sp = tx.savepoint()?;
            let mark = self.fts_pending.len();
            let (reason, why) = match apply_event(&sp, ev, &mut self.fts_pending, &self.known) {
                Ok(Outcome::Applied(effect, turns, index)) => {
                    sp.commit()?;
                    learn(&mut self.known, ev);
                    let t = out.touched.entry(session.to_string()).or_default();
                    t.effects.extend(effect);
                    t.turns.extend(turns);
                    t.index |= index;
                    t.page |= !matches!(
                        ev,
                        Event::Session(_)
                            | Event::Step { .. }
                            | Event::Line { .. }
                            | Event::ContextEdit { .. }
                    );
                    continue;
                }
                Ok(Outcome::Refused(why)) => (BehindReason::Gap, why),
                Err(e) if transient(&e) => return Err(e.into()),
                Err(e) => (BehindReason::Failed, e.to_string()),
            };
            self.fts_pending.truncate(mark);
            out.refused += 1;
            fallen.insert(session.to_string());
            out.behind.push((session.to_string(), *id, reason, why));
        }
        tx.commit()?;
        Ok(out)
    }
}
