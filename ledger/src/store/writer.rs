//! The writer thread, one per store and the same on both engines: it takes
//! what is queued (up to `batch_max`), has its engine ([`Db`]) apply it in
//! one transaction (each event on its own, so a refused event does not sink
//! its batch), commits, then brings the touched sessions' files up to date
//! ([`super::files`]). Jobs (rebuild, sweep, vacuum, page notes) run here
//! too, in queue order.
//!
//! Lag: a `Rows` event longer than [`SLICE_ROWS`] (a cold open of a long
//! history) is committed in slices of that many rows, one slice per
//! transaction, with the other sessions' events queued meanwhile committed
//! between its slices; the events of its own session wait behind it, so
//! every session's rows stay a gap-free, in-order prefix. The files of what
//! committed (transcripts, `index.md`, `SESSION.md`) and the search index
//! are written once nothing waits to be committed (between two sessions'
//! files the writer looks for new events), or at once when they have waited
//! [`DEFER_MAX`], at a settle, a job and shutdown: a commit never waits for
//! the files of earlier commits.
//!
//! Faults: a batch whose transaction fails for a reason of the environment
//! (SQLite locked past the busy timeout, a full disk, an I/O error; the
//! PostgreSQL connection lost or the server refusing) is retried with
//! bounded backoff and never dropped while the process lives (at shutdown
//! it gets a grace period); one WARN line when commits start failing, one
//! INFO line when they recover. The database is checked before every batch
//! and once a second when idle ([`Db::ensure`]): SQLite's file deleted or
//! replaced is opened afresh in its place, a lost PostgreSQL connection is
//! made again. An event refused because it does not continue what is
//! committed marks its session behind (see [`super::backend`]).
//!
//! The engines differ only in [`Db`]: SQLite's is `lite::db::Lite`,
//! PostgreSQL's `pg::writer::PgDb`.

use super::effects::{Applied, Touch};
use super::error::StoreError;
use super::files::Files;
use super::queue::{lossless, Cmd, Fault, Job, Reply, Shared};
use super::records::LAG_WINDOW;
use super::source::Source;
use crate::model::Event;
use crate::paths::DataDir;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// Longest a deferred write (a session's `index.md`, SQLite's full-text
/// index of new rows) waits behind the events; `settle`, jobs and shutdown
/// flush it at once.
pub(super) const DEFER_MAX: Duration = Duration::from_millis(1000);
/// Items of an engine's deferred work that force a flush.
const DEFER_BATCH: usize = 1024;
/// Most rows of one `Rows` event committed in one transaction; a longer
/// one is committed in slices of this many, other sessions' events between.
pub(super) const SLICE_ROWS: usize = 256;
/// Items of the engine's deferred work done between two transactions while
/// events wait (when it is due).
const DEFER_SLICE: usize = 256;
/// How often an idle writer checks its database.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// First and longest wait between attempts of a failing batch.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long a failing batch is still retried once shutdown was asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// One queued event as the writer holds it: the event, its queue id, when
/// it was queued.
pub(super) type Queued = (Event, u64, Instant);

/// What the writer does next with what it took from the channel.
enum Next<W> {
    /// Commit these events in one transaction; `done[i]` = event `i`
    /// completes its queued event (false for a slice before the last of a
    /// sliced `Rows` event).
    Commit(Vec<Queued>, Vec<bool>),
    /// A settle, everything before it done.
    Settle(Reply),
    /// A job, everything before it done.
    Job(Job<W>),
    /// Stop, everything before it done.
    Shutdown,
}

/// How [`Db::ensure`] found the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reopen {
    /// As it was.
    No,
    /// Connected again to the same data (PostgreSQL): what the writer
    /// cached may be stale (another proxy may have written meanwhile).
    Reconnected,
    /// A fresh, empty database in place of one that vanished (SQLite's
    /// file deleted or replaced): every cache and every pending file
    /// repair is void.
    Fresh,
}

/// The engine's half of the writer: its database.
pub(super) trait Db: Send + 'static {
    /// Make sure the database can be written (SQLite: the file at its path
    /// is the one open; PostgreSQL: the connection is alive).
    fn ensure(&mut self) -> Result<Reopen, StoreError>;
    /// One attempt at a batch in one transaction; on an error nothing of
    /// it is kept, and the engine forgets what the attempt taught it.
    fn apply(&mut self, events: &[Queued]) -> Result<Applied, StoreError>;
    /// The reads the files are rendered from.
    fn source(&self) -> &dyn Source;
    /// Items of work the engine deferred behind the events (SQLite's
    /// full-text index of new rows).
    fn deferred(&self) -> usize {
        0
    }
    /// Do the deferred work; whether some of it still waits (a transient
    /// failure: tried again at the next flush).
    fn flush_deferred(&mut self) -> bool {
        false
    }
    /// Do at most `max` items of the deferred work, oldest first (events
    /// wait); whether some of it still waits.
    fn flush_deferred_part(&mut self, max: usize) -> bool {
        let _ = max;
        self.flush_deferred()
    }
    /// Work due between batches and when idle (PostgreSQL renews its
    /// session leases), and when it is due next.
    fn housekeeping(&mut self) {}
    fn next_housekeeping(&self) -> Option<Instant> {
        None
    }
    /// Sessions whose files the writer cached may be stale since they were
    /// last asked for (PostgreSQL: another proxy may have written them
    /// while this one's lease had lapsed): their caches are dropped.
    fn take_stale(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// Forget what the engine knows of a session (a job changed it), or
    /// of every session.
    fn forget(&mut self, session: &str);
    fn forget_all(&mut self);
    /// Sessions falling behind now are expected (the database was opened
    /// afresh): logged at debug, not a WARN each.
    fn quiet_behind(&self) -> bool {
        false
    }
    /// The writer stops: let go of what the engine holds (leases).
    fn stop(&mut self) {}
}

/// The writer thread's state.
pub(crate) struct Writer<D: Db> {
    pub(super) db: D,
    pub(super) files: Files,
    pub(super) dir: DataDir,
    pub(super) shared: Arc<Shared>,
    rx: Receiver<Cmd<Writer<D>>>,
    batch_max: usize,
    /// Commands taken from the channel and not done yet: the rest of a
    /// sliced `Rows` event, the events of its session behind it, what
    /// follows a barrier.
    queue: VecDeque<Cmd<Writer<D>>>,
    /// What committed batches changed whose files are not written yet, and
    /// since when the oldest of it waits.
    touched: BTreeMap<String, Touch>,
    touched_since: Option<Instant>,
    /// Since when something deferred waits (`index.md`, the engine's).
    deferred_since: Option<Instant>,
    /// When the idle check last ran.
    checked: Instant,
    /// When a failing batch first saw shutdown asked for.
    stop_seen: Option<Instant>,
    /// A batch was given up at shutdown (later ones are not an ERROR each).
    gave_up: bool,
}

impl<D: Db> Writer<D> {
    pub(super) fn new(
        db: D,
        dir: DataDir,
        rx: Receiver<Cmd<Writer<D>>>,
        shared: Arc<Shared>,
        batch_max: usize,
    ) -> Writer<D> {
        Writer {
            files: Files::new(dir.clone(), shared.clone()),
            db,
            dir,
            shared,
            rx,
            batch_max: batch_max.max(1),
            queue: VecDeque::new(),
            touched: BTreeMap::new(),
            touched_since: None,
            deferred_since: None,
            checked: Instant::now(),
            stop_seen: None,
            gave_up: false,
        }
    }

    pub(super) fn run(mut self) {
        let mut stop = false;
        loop {
            if !stop {
                self.pull();
            }
            if self.queue.is_empty() {
                if stop {
                    break;
                }
                // Nothing waits to be committed: the files of what did.
                if self.write_files(false) {
                    continue;
                }
                let due = self
                    .deferred_since
                    .is_some_and(|since| since.elapsed() >= DEFER_MAX);
                if due || self.db.deferred() >= DEFER_BATCH {
                    self.flush_deferred_idle();
                    if !self.queue.is_empty() {
                        continue;
                    }
                }
                match self.rx.recv_timeout(self.next_wake()) {
                    Ok(cmd) => self.queue.push_back(cmd),
                    Err(RecvTimeoutError::Timeout) => self.idle(),
                    Err(RecvTimeoutError::Disconnected) => break,
                }
                continue;
            }
            match self.next() {
                Next::Commit(events, done) => {
                    self.process(events, &done);
                    self.busy_work();
                }
                Next::Settle(r) => {
                    self.write_files(true);
                    self.flush_deferred(true);
                    r.send();
                }
                Next::Job(job) => {
                    // Everything queued before the job is committed and
                    // written first; what the job changes is read afresh.
                    self.write_files(true);
                    self.flush_deferred(true);
                    job(&mut self);
                    self.db.forget_all();
                }
                Next::Shutdown => stop = true,
            }
            self.housekeeping();
        }
        self.write_files(true);
        self.flush_deferred(true);
        self.db.stop();
        debug!("ledger writer stopped");
    }

    /// Take what the channel holds into the queue (up to `batch_max` queued).
    fn pull(&mut self) {
        while self.queue.len() < self.batch_max {
            match self.rx.try_recv() {
                Ok(cmd) => self.queue.push_back(cmd),
                Err(_) => break,
            }
        }
    }

    /// Whether a command waits in the channel (it is taken into the queue).
    fn more_waiting(&mut self) -> bool {
        match self.rx.try_recv() {
            Ok(cmd) => {
                self.queue.push_back(cmd);
                true
            }
            Err(_) => false,
        }
    }

    /// What to do next: the barrier or job at the front of the queue, or
    /// the next transaction's events: every event before the first barrier
    /// (up to `batch_max`) whose session has no unfinished longer `Rows`
    /// event before it, and one slice of [`SLICE_ROWS`] rows of the first
    /// longer one. Events of sessions behind are dropped here.
    fn next(&mut self) -> Next<Writer<D>> {
        match self.queue.pop_front() {
            None => return Next::Commit(Vec::new(), Vec::new()),
            Some(Cmd::Settle(r)) => return Next::Settle(r),
            Some(Cmd::Job(job)) => return Next::Job(job),
            Some(Cmd::Shutdown) => return Next::Shutdown,
            Some(ev @ Cmd::Event { .. }) => self.queue.push_front(ev),
        }
        let mut events: Vec<Queued> = Vec::new();
        let mut done = Vec::new();
        let mut dropped = Vec::new();
        let mut blocked: HashSet<String> = HashSet::new();
        let mut sliced = false;
        let mut barrier = false;
        let mut rest = VecDeque::with_capacity(self.queue.len());
        while let Some(cmd) = self.queue.pop_front() {
            let Cmd::Event { mut ev, id, at } = cmd else {
                barrier = true;
                rest.push_back(cmd);
                continue;
            };
            if barrier || events.len() >= self.batch_max || blocked.contains(ev.session()) {
                rest.push_back(Cmd::Event { ev, id, at });
                continue;
            }
            // Steps and session facts are kept while their session is behind.
            if !lossless(&ev) && self.shared.drops(ev.session(), id) {
                dropped.push(id);
                continue;
            }
            if let Event::Rows { session, rows } = &mut ev {
                if rows.len() > SLICE_ROWS {
                    blocked.insert(session.clone());
                    if !std::mem::replace(&mut sliced, true) {
                        let tail = rows.split_off(SLICE_ROWS);
                        let head = std::mem::replace(rows, tail);
                        let slice = Event::Rows {
                            session: session.clone(),
                            rows: head,
                        };
                        events.push((slice, id, at));
                        done.push(false);
                    }
                    rest.push_back(Cmd::Event { ev, id, at });
                    continue;
                }
            }
            events.push((ev, id, at));
            done.push(true);
        }
        self.queue = rest;
        if !dropped.is_empty() {
            self.shared
                .shed
                .fetch_add(dropped.len() as u64, Ordering::Relaxed);
            self.shared.forget(dropped.into_iter());
        }
        Next::Commit(events, done)
    }

    /// Between two transactions while events wait: the files and the
    /// engine's deferred work only once they have waited [`DEFER_MAX`]
    /// (the engine's in parts of [`DEFER_SLICE`] items, one per
    /// transaction).
    fn busy_work(&mut self) {
        if self
            .touched_since
            .is_some_and(|since| since.elapsed() >= DEFER_MAX)
        {
            self.write_files(true);
        }
        let due = self
            .deferred_since
            .is_some_and(|since| since.elapsed() >= DEFER_MAX);
        if !due {
            return;
        }
        if self.db.deferred() > DEFER_SLICE {
            // The rest stays due: another part after the next transaction.
            if self.db.flush_deferred_part(DEFER_SLICE) {
                self.deferred_since = Some(Instant::now());
            }
        } else {
            self.flush_deferred(false);
        }
    }

    /// Nothing waits to be committed: the engine's deferred work in parts
    /// of [`DEFER_SLICE`] items until a command waits, then the rest of
    /// what [`Writer::flush_deferred`] does once it is all done.
    fn flush_deferred_idle(&mut self) {
        while self.db.deferred() > DEFER_SLICE {
            if self.db.flush_deferred_part(DEFER_SLICE) {
                self.deferred_since = Some(Instant::now());
                return;
            }
            if self.more_waiting() {
                self.deferred_since.get_or_insert_with(Instant::now);
                return;
            }
        }
        self.flush_deferred(false);
    }

    /// Write the files of the sessions committed batches touched. Unless
    /// `all` (or what waits is older than [`DEFER_MAX`]), it stops as soon
    /// as a command waits in the channel; returns whether it stopped so.
    fn write_files(&mut self, all: bool) -> bool {
        let all = all
            || self
                .touched_since
                .is_some_and(|since| since.elapsed() >= DEFER_MAX);
        let mut stopped = false;
        while let Some((session, touch)) = self.touched.pop_first() {
            // Rendering reads arbitrary client JSON: never let a bug there
            // take the writer (and the database) down.
            let src = self.db.source();
            let files = &mut self.files;
            let written =
                std::panic::catch_unwind(AssertUnwindSafe(|| files.write(src, &session, touch)))
                    .unwrap_or_else(|_| {
                        Err(StoreError::Corrupt("transcript renderer panicked".into()))
                    });
            if let Err(e) = written {
                self.files.failed(&session, &e);
            }
            if !all && !self.touched.is_empty() && self.more_waiting() {
                stopped = true;
                break;
            }
        }
        if self.touched.is_empty() {
            self.touched_since = None;
        }
        if self.files.index_waiting() {
            self.deferred_since.get_or_insert_with(Instant::now);
        }
        stopped
    }

    /// Forget what the writer cached of a session (a job changed it).
    pub(super) fn forget(&mut self, session: &str) {
        self.files.forget(session);
        self.db.forget(session);
    }

    /// The engine's housekeeping, then the caches it found stale dropped.
    fn housekeeping(&mut self) {
        self.db.housekeeping();
        self.drop_stale();
    }

    /// Drop the file caches of the sessions the engine found stale.
    fn drop_stale(&mut self) {
        for session in self.db.take_stale() {
            self.files.forget(&session);
        }
    }

    /// How long an idle writer waits for the next command.
    fn next_wake(&self) -> Duration {
        let mut at = self.checked + CHECK_EVERY;
        if let Some(since) = self.deferred_since {
            at = at.min(since + DEFER_MAX);
        }
        if let Some(retry) = self.files.next_retry() {
            at = at.min(retry);
        }
        if let Some(h) = self.db.next_housekeeping() {
            at = at.min(h);
        }
        at.saturating_duration_since(Instant::now())
    }

    /// Nothing queued: check the database, do the engine's housekeeping,
    /// flush what is due, try failed file writes again.
    fn idle(&mut self) {
        if self.checked.elapsed() >= CHECK_EVERY {
            self.checked = Instant::now();
            match self.ensure() {
                Ok(()) => self.commit_recovered(),
                Err(e) => self.commit_failed(&e, 0),
            }
        }
        self.housekeeping();
        let due = self
            .deferred_since
            .is_some_and(|since| since.elapsed() >= DEFER_MAX);
        if due || self.files.retry_due(false) {
            self.flush_deferred(false);
        }
    }

    /// [`Db::ensure`], dropping what a reopen made stale.
    fn ensure(&mut self) -> Result<(), StoreError> {
        match self.db.ensure()? {
            Reopen::No => {}
            Reopen::Reconnected => {
                self.files.clear_caches();
                self.db.forget_all();
                if self.files.index_waiting() {
                    self.deferred_since.get_or_insert_with(Instant::now);
                }
            }
            Reopen::Fresh => {
                self.files.clear_caches();
                self.files.clear_failing();
                self.db.forget_all();
                self.shared.generation.fetch_add(1, Ordering::Release);
            }
        }
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
    /// change since it was last written, the engine's deferred work, and
    /// (when due, or `force`d by a settle, a job or shutdown) every file of
    /// the sessions whose file writes failed.
    pub(super) fn flush_deferred(&mut self, force: bool) {
        self.deferred_since = None;
        self.files.flush_indexes(self.db.source());
        if self.files.retry_due(force) {
            self.files.retry(self.db.source());
        }
        if self.db.deferred() > 0 && self.db.flush_deferred() {
            self.deferred_since = Some(Instant::now());
        }
    }

    /// Commit a batch in one transaction, retried until it commits; what it
    /// changed of each session waits for [`Writer::write_files`]. `done[i]`:
    /// event `i` completes its queued event (counted, its lag taken).
    fn process(&mut self, events: Vec<Queued>, done: &[bool]) {
        if events.is_empty() {
            return;
        }
        let finished = || {
            events
                .iter()
                .zip(done)
                .filter(|(_, d)| **d)
                .map(|((_, id, _), _)| *id)
        };
        let applied = self.commit_batch(&events);
        // Even a batch given up may have seen a lease move.
        self.drop_stale();
        let Some(applied) = applied else {
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
        if self.db.deferred() > 0 {
            self.deferred_since.get_or_insert_with(Instant::now);
        }
        let committed = Instant::now();
        let s = &self.shared;
        s.batches.fetch_add(1, Ordering::Relaxed);
        s.events
            .fetch_add(finished().count() as u64, Ordering::Relaxed);
        s.rejected.fetch_add(applied.refused, Ordering::Relaxed);
        s.shed.fetch_add(applied.skipped, Ordering::Relaxed);
        {
            let mut lags = s.lags_us.lock();
            for ((_, _, at), _) in events.iter().zip(done).filter(|(_, d)| **d) {
                if lags.len() == LAG_WINDOW {
                    lags.pop_front();
                }
                lags.push_back(committed.duration_since(*at).as_micros() as u64);
            }
        }
        for fell in &applied.behind {
            let (session, why) = (&fell.session, &fell.why);
            if s.mark_behind(session, fell.id, fell.reason) {
                if self.db.quiet_behind() {
                    debug!(session = %session, "ledger session behind after the reopen: {why}");
                } else {
                    warn!(
                        session = %session,
                        "ledger session behind ({why}): its later events are dropped until the proxy resyncs it from the client's next full resend"
                    );
                }
            }
        }
        s.forget(finished());
        if !applied.touched.is_empty() {
            self.touched_since.get_or_insert(committed);
        }
        for (session, touch) in applied.touched {
            match self.touched.get_mut(&session) {
                Some(t) => t.merge(touch),
                None => {
                    self.touched.insert(session, touch);
                }
            }
        }
    }

    /// Apply `events` in one transaction until it commits, with backoff
    /// between attempts. None = shutdown was asked for and the grace period
    /// ran out.
    fn commit_batch(&mut self, events: &[Queued]) -> Option<Applied> {
        let mut backoff = BACKOFF_MIN;
        loop {
            let attempt = self.ensure().and_then(|()| self.db.apply(events));
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
}
