//! The writer thread: takes what is queued (up to `batch_max`), applies it in
//! one transaction (each event under its own savepoint, so a refused event
//! does not sink its batch), commits, then brings the touched sessions' files
//! up to date ([`super::files`]). Jobs (rebuild, sweep, vacuum, page notes)
//! run here too, in queue order.

use super::apply::{apply_event, learn, FtsJob, Known, Outcome, Touch};
use super::backend::LAG_WINDOW;
use super::error::StoreError;
use super::files::SessionCache;
use super::queue::{Cmd, Shared};
use super::sql::{session_dialect, TextBatch};
use crate::model::Event;
use crate::paths::DataDir;
use rusqlite::{Connection, TransactionBehavior};
use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, warn};

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

/// The writer thread's state.
pub(crate) struct Writer {
    pub(super) conn: Connection,
    pub(super) dir: DataDir,
    pub(super) rx: Receiver<Cmd>,
    pub(super) shared: Arc<Shared>,
    pub(super) batch_max: usize,
    pub(super) caches: HashMap<String, SessionCache>,
    pub(super) tick: u64,
    /// Committed rows not yet in the full-text index.
    pub(super) fts_pending: Vec<FtsJob>,
    /// Since when something deferred waits (`index.md`, `fts_pending`).
    pub(super) deferred_since: Option<Instant>,
    /// What the writer knows of sessions it has seen, so a step does not
    /// query for it.
    pub(super) known: HashMap<String, Known>,
}

impl Writer {
    pub(super) fn run(mut self) {
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
    pub(super) fn flush_deferred(&mut self) {
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
    fn index_text(&mut self, jobs: &[FtsJob]) -> Result<(), StoreError> {
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
        tx.commit()?;
        Ok(())
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
}
