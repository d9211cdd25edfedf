//! The PostgreSQL engine's writer thread: the SQLite writer's loop on
//! another database. It takes what is queued (up to `batch_max`), applies
//! it in ONE transaction (each event under its own savepoint, so a refused
//! event does not sink its batch), commits — retrying with backoff while
//! the database refuses or is unreachable, reconnecting as needed — then
//! writes the touched sessions' files into this proxy's data dir. Jobs run
//! here too, in queue order.
//!
//! Leases: before a batch writes a session it takes or renews the
//! session's lease in the same transaction (a row of `leases`, locked by
//! the upsert until commit); a session another live proxy holds is
//! refused and falls behind, so two proxies never interleave rows of one
//! session. Held leases are renewed every third of their length and
//! released at idle eviction and at shutdown.

use super::super::backend::{BehindReason, LAG_WINDOW};
use super::super::error::{io_err, StoreError};
use super::super::queue::{Cmd, Fault, Shared};
use super::super::sql::{now_ms, stored_dialect};
use super::schema::{self, DAY_MS, NOW_MS};
use super::sql::{advance_page, big, new_page, session_meta, turn_rows, turn_summaries};
use super::Leases;
use crate::model::{Dialect, Event};
use crate::page::Page;
use crate::parts;
use crate::paths::{self, DataDir};
use crate::transcript;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio_postgres::{Client, Config, NoTls, Transaction};
use tracing::{debug, error, info, warn};

/// First and longest wait between attempts of a failing batch.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long a failing batch is still retried once shutdown was asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How often an idle writer checks its connection (and the partitions).
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often the partitions ahead are made sure of.
const PARTITIONS_EVERY: Duration = Duration::from_secs(3600);
/// First and longest wait before failed file writes are tried again.
const FILES_RETRY_MIN: Duration = Duration::from_secs(1);
const FILES_RETRY_MAX: Duration = Duration::from_secs(30);
/// Sessions whose facts the writer keeps (beyond it, the map starts over).
const KNOWN_SESSIONS: usize = 100_000;
/// Sessions whose folded `SESSION.md` the writer keeps.
const PAGES: usize = 1024;

/// Whether a PostgreSQL error is the environment's (the connection, the
/// server's resources or shutdown, a lock or serialization conflict) and
/// worth retrying, rather than the event's.
pub(super) fn transient(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        // No SQLSTATE: the connection (closed, I/O, timeout).
        return true;
    };
    let code = db.code().code();
    code.starts_with("08") // connection exception
        || code.starts_with("53") // insufficient resources
        || code.starts_with("57") // operator intervention (shutdown, cancel)
        || code.starts_with("58") // system error (I/O)
        || code == "40001" // serialization failure
        || code == "40P01" // deadlock
        || code == "55P03" // lock not available
        || code == "55006" // object in use
}

fn transient_store(e: &StoreError) -> bool {
    match e {
        StoreError::Postgres(e) => transient(e),
        StoreError::PgSetup(_) => true,
        _ => false,
    }
}

/// What the writer knows of a session it has written.
#[derive(Clone, Copy, Default)]
struct Known {
    dialect: Option<Dialect>,
    /// The session's partition day.
    day: Option<i64>,
    /// The seq the next `Rows` event must start at.
    next_seq: Option<u64>,
}

/// What a batch changed of one session: the files to write.
#[derive(Default)]
struct Touch {
    turns: BTreeSet<u32>,
    /// Rows, cuts, branches or confirms: `SESSION.md` may change.
    page: bool,
    /// Hidden rows: the page is folded again.
    invalidate: bool,
}

/// One queued event as the writer holds it.
type Queued = (Event, u64, Instant);

struct Applied {
    touched: BTreeMap<String, Touch>,
    refused: u64,
    behind: Vec<(String, u64, BehindReason, String)>,
    skipped: u64,
}

enum Outcome {
    Applied(Vec<u32>, bool),
    Refused(String),
}

/// The writer thread's state.
pub(crate) struct PgWriter {
    rt: Runtime,
    config: Config,
    client: Option<Client>,
    pub(super) dir: DataDir,
    rx: Receiver<Cmd<PgWriter>>,
    pub(super) shared: Arc<Shared>,
    leases: Arc<Leases>,
    batch_max: usize,
    known: HashMap<String, Known>,
    pages: HashMap<String, (Page, Option<u64>)>,
    files_failing: BTreeSet<String>,
    files_retry: (Instant, Duration),
    checked: Instant,
    partitions_checked: Option<Instant>,
    renewed: Instant,
    stop_seen: Option<Instant>,
    gave_up: bool,
}

impl PgWriter {
    #[allow(clippy::too_many_arguments)] // the writer's parts, each its own
    pub(super) fn new(
        rt: Runtime,
        config: Config,
        client: Client,
        dir: DataDir,
        rx: Receiver<Cmd<PgWriter>>,
        shared: Arc<Shared>,
        leases: Arc<Leases>,
        batch_max: usize,
    ) -> PgWriter {
        PgWriter {
            rt,
            config,
            client: Some(client),
            dir,
            rx,
            shared,
            leases,
            batch_max: batch_max.max(1),
            known: HashMap::new(),
            pages: HashMap::new(),
            files_failing: BTreeSet::new(),
            files_retry: (Instant::now(), FILES_RETRY_MIN),
            checked: Instant::now(),
            partitions_checked: None,
            renewed: Instant::now(),
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
                        self.process(std::mem::take(&mut events));
                        job(&mut self);
                        self.known.clear();
                    }
                    Cmd::Shutdown => stop = true,
                }
            }
            self.process(events);
            if !replies.is_empty() && !self.files_failing.is_empty() {
                self.retry_files();
            }
            for r in replies {
                r.send();
            }
            if stop {
                break;
            }
            if self.renewed.elapsed() >= self.leases.ttl / 3 {
                self.renew();
            }
        }
        self.release_all();
        debug!("ledger writer (postgres) stopped");
    }

    fn next_wake(&self) -> Duration {
        let mut at = self.checked + CHECK_EVERY;
        at = at.min(self.renewed + self.leases.ttl / 3);
        if !self.files_failing.is_empty() {
            at = at.min(self.files_retry.0);
        }
        at.saturating_duration_since(Instant::now())
    }

    /// Nothing queued: check the connection, renew the leases, retry files.
    fn idle(&mut self) {
        if self.checked.elapsed() >= CHECK_EVERY {
            self.checked = Instant::now();
            match self.ensure_client() {
                Ok(()) => self.commit_recovered(),
                Err(e) => self.commit_failed(&e, 0),
            }
        }
        if self.renewed.elapsed() >= self.leases.ttl / 3 {
            self.renew();
        }
        if !self.files_failing.is_empty() && Instant::now() >= self.files_retry.0 {
            self.retry_files();
        }
    }

    /// The connection, (re)opened when closed; the day partitions made
    /// sure of at first and then hourly.
    fn ensure_client(&mut self) -> Result<(), StoreError> {
        if self.client.as_ref().is_some_and(|c| !c.is_closed()) {
            let due = self
                .partitions_checked
                .is_none_or(|t| t.elapsed() >= PARTITIONS_EVERY);
            if due {
                self.partitions_checked = Some(Instant::now());
                let today = now_ms() / DAY_MS;
                if let Some(c) = self.client.as_mut() {
                    let r = self.rt.block_on(schema::ensure_partitions(c, today));
                    if let Err(e) = r {
                        warn!("ledger partitions not made sure of: {e}");
                    }
                }
            }
            return Ok(());
        }
        if self.client.take().is_some() {
            warn!("ledger database connection lost; reconnecting");
        }
        let config = self.config.clone();
        let client = self.rt.block_on(async move {
            let (client, conn) = config.connect(NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    debug!("ledger database connection closed: {e}");
                }
            });
            Ok::<_, StoreError>(client)
        })?;
        self.client = Some(client);
        // What was cached may have changed meanwhile (another proxy).
        self.known.clear();
        self.pages.clear();
        Ok(())
    }

    /// The writer's runtime and connection (reopened if closed), to block
    /// on a query.
    pub(super) fn parts(&mut self) -> Result<(&Runtime, &mut Client), StoreError> {
        self.ensure_client()?;
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| StoreError::PgSetup("no connection".into()))?;
        Ok((&self.rt, client))
    }

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

    /// Renew every lease this proxy holds; the ones another proxy took
    /// meanwhile (this one stalled past their length) are let go.
    fn renew(&mut self) {
        self.renewed = Instant::now();
        let held: Vec<String> = self.leases.held.lock().iter().cloned().collect();
        if held.is_empty() {
            return;
        }
        let owner = self.leases.owner.clone();
        let ttl = self.leases.ttl.as_millis() as i64;
        let Some(client) = self.client.as_ref().filter(|c| !c.is_closed()) else {
            return;
        };
        let sql = format!(
            "UPDATE leases SET expires_ms = {NOW_MS} + $3
             WHERE owner = $1 AND session = ANY($2) RETURNING session"
        );
        let r = self.rt.block_on(client.query(&sql, &[&owner, &held, &ttl]));
        match r {
            Ok(rows) => {
                let kept: HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
                let mut h = self.leases.held.lock();
                for s in held.iter().filter(|s| !kept.contains(*s)) {
                    debug!(session = %s, "ledger lease lost to another proxy");
                    h.remove(s);
                }
            }
            Err(e) => debug!("ledger leases not renewed: {e}"),
        }
    }

    /// Let go of one session's lease (idle eviction).
    pub(super) fn release(&mut self, session: &str) {
        if !self.leases.held.lock().remove(session) {
            return;
        }
        self.known.remove(session);
        self.pages.remove(session);
        let owner = self.leases.owner.clone();
        let Some(client) = self.client.as_ref().filter(|c| !c.is_closed()) else {
            return;
        };
        let r = self.rt.block_on(client.execute(
            "DELETE FROM leases WHERE session = $1 AND owner = $2",
            &[&session, &owner],
        ));
        if let Err(e) = r {
            debug!(session, "ledger lease not released: {e}");
        }
    }

    /// Let go of every lease (shutdown): other proxies take over at once.
    fn release_all(&mut self) {
        let held: Vec<String> = self.leases.held.lock().drain().collect();
        if held.is_empty() {
            return;
        }
        let owner = self.leases.owner.clone();
        let Some(client) = self.client.as_ref().filter(|c| !c.is_closed()) else {
            return;
        };
        let r = self.rt.block_on(client.execute(
            "DELETE FROM leases WHERE owner = $1 AND session = ANY($2)",
            &[&owner, &held],
        ));
        if let Err(e) = r {
            debug!("ledger leases not released at shutdown: {e}");
        }
    }

    /// This proxy's name in `leases.owner`.
    pub(super) fn owner(&self) -> String {
        self.leases.owner.clone()
    }

    /// Drop a session from the held set (it was removed).
    pub(super) fn unhold(&mut self, session: &str) {
        self.leases.held.lock().remove(session);
    }

    /// Forget what the writer cached of a session (a job changed it).
    pub(super) fn forget(&mut self, session: &str) {
        self.known.remove(session);
        self.pages.remove(session);
    }

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
        let s = self.shared.clone();
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
                warn!(
                    session = %session,
                    "ledger session behind ({why}): its later events are dropped until the proxy resyncs it from the client's next full resend"
                );
            }
        }
        s.forget(events.iter().map(|(_, id, _)| *id));
        for (session, touch) in applied.touched {
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

    fn commit_batch(&mut self, events: &[Queued]) -> Option<Applied> {
        let mut backoff = BACKOFF_MIN;
        loop {
            match self.apply_batch(events) {
                Ok(applied) => {
                    self.commit_recovered();
                    return Some(applied);
                }
                Err(e) => {
                    self.known.clear();
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

    fn apply_batch(&mut self, events: &[Queued]) -> Result<Applied, StoreError> {
        if self.known.len() > KNOWN_SESSIONS {
            self.known.clear();
        }
        self.ensure_client()?;
        let leases = self.leases.clone();
        let rt = &self.rt;
        let known = &mut self.known;
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| StoreError::PgSetup("no connection".into()))?;
        rt.block_on(apply_events(client, events, known, &leases))
    }

    fn files_failed(&mut self, session: &str, e: &StoreError) {
        self.shared
            .transcript_errors
            .fetch_add(1, Ordering::Relaxed);
        self.pages.remove(session);
        self.files_failing.insert(session.to_string());
        let mut f = self.shared.faults.lock();
        f.files_sessions = self.files_failing.len();
        match &mut f.files {
            Some(fault) => {
                fault.retries += 1;
                fault.error = e.to_string();
            }
            None => {
                warn!(
                    session,
                    "ledger transcript writes failing ({e}); the files of the sessions concerned are written again once writes succeed"
                );
                f.files = Some(Fault {
                    since: Instant::now(),
                    error: e.to_string(),
                    retries: 0,
                });
                self.files_retry = (Instant::now() + FILES_RETRY_MIN, FILES_RETRY_MIN);
            }
        }
    }

    fn retry_files(&mut self) {
        let failing = std::mem::take(&mut self.files_failing);
        let mut healed = 0u64;
        let mut error = None;
        for session in failing {
            let dir = self.dir.clone();
            let r = self.parts().and_then(|(rt, c)| {
                rt.block_on(super::sql::write_session_files(&*c, &dir, &session))
            });
            match r {
                Ok(_) | Err(StoreError::UnknownSession(_)) => healed += 1,
                Err(StoreError::Corrupt(why)) => warn!("ledger files not written: {why}"),
                Err(e) => {
                    error = Some(e.to_string());
                    self.files_failing.insert(session);
                }
            }
        }
        self.shared
            .files_healed
            .fetch_add(healed, Ordering::Relaxed);
        let mut f = self.shared.faults.lock();
        f.files_sessions = self.files_failing.len();
        match error {
            None => {
                if let Some(fault) = f.files.take() {
                    info!(
                        sessions = healed,
                        "ledger transcript writes recovered after {:.1}s; the files they missed are written",
                        fault.since.elapsed().as_secs_f64()
                    );
                }
            }
            Some(e) => {
                if let Some(fault) = f.files.as_mut() {
                    fault.retries += 1;
                    fault.error = e;
                }
                let wait = (self.files_retry.1 * 2).min(FILES_RETRY_MAX);
                self.files_retry = (Instant::now() + wait, wait);
            }
        }
    }

    /// Bring a session's files in this data dir up to date after a commit:
    /// the touched turns, `index.md`, and `SESSION.md` when it may change.
    fn write_files(&mut self, session: &str, touch: Touch) -> Result<(), StoreError> {
        if touch.invalidate {
            self.pages.remove(session);
        }
        if self.pages.len() >= PAGES && !self.pages.contains_key(session) {
            self.pages.clear();
        }
        let dir = self.dir.clone();
        let mut page = self.pages.remove(session);
        self.ensure_client()?;
        let rt = &self.rt;
        let client: &Client = self
            .client
            .as_ref()
            .ok_or_else(|| StoreError::PgSetup("no connection".into()))?;
        let result = rt.block_on(async {
            let Some(meta) = session_meta(client, session).await? else {
                return Ok(());
            };
            let dialect = meta.dialect;
            let tdir = dir.transcript_dir(session);
            paths::create_private_dir_all(&tdir).map_err(io_err(&tdir))?;
            for turn in &touch.turns {
                let rows = turn_rows(client, session, *turn).await?;
                let path = dir.turn_file(session, *turn);
                let rows_path = dir.rows_file(session, *turn);
                if rows.is_empty() {
                    paths::remove_if_exists(&path).map_err(io_err(&path))?;
                    paths::remove_if_exists(&rows_path).map_err(io_err(&rows_path))?;
                } else {
                    let (text, index) = transcript::render_turn_indexed(dialect, *turn, &rows);
                    paths::write_atomic(&path, text.as_bytes()).map_err(io_err(&path))?;
                    paths::write_atomic(&rows_path, index.render().as_bytes())
                        .map_err(io_err(&rows_path))?;
                }
            }
            let turns: Vec<_> = turn_summaries(client, session, dialect)
                .await?
                .into_values()
                .collect();
            let path = dir.index_file(session);
            paths::write_atomic(&path, transcript::render_index(&meta, &turns).as_bytes())
                .map_err(io_err(&path))?;
            if touch.page {
                let (p, hash) = match &mut page {
                    Some(p) => p,
                    None => page.insert((new_page(client, session).await?, None)),
                };
                let fresh = hash.is_none();
                let changed = advance_page(client, session, dialect, p).await?;
                if (changed || fresh) && super::super::page_io::write_page(&dir, session, p, hash)?
                {
                    return Ok(());
                }
            }
            Ok(())
        });
        if let Some(p) = page {
            self.pages.insert(session.to_string(), p);
        }
        result
    }
}

/// The lease upsert: take the sessions that are free, expired or already
/// ours (locking their rows until commit); returns the ones we hold.
async fn take_leases(
    tx: &Transaction<'_>,
    sessions: &[String],
    leases: &Leases,
) -> Result<HashSet<String>, tokio_postgres::Error> {
    let sql = format!(
        "INSERT INTO leases (session, owner, expires_ms)
         SELECT s, $2, {NOW_MS} + $3 FROM unnest($1::text[]) AS s
         ON CONFLICT (session) DO UPDATE SET owner = EXCLUDED.owner, expires_ms = EXCLUDED.expires_ms
         WHERE leases.owner = EXCLUDED.owner OR leases.expires_ms < {NOW_MS}
         RETURNING session"
    );
    let ttl = leases.ttl.as_millis() as i64;
    let rows = tx.query(&sql, &[&sessions, &leases.owner, &ttl]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

async fn apply_events(
    client: &mut Client,
    events: &[Queued],
    known: &mut HashMap<String, Known>,
    leases: &Leases,
) -> Result<Applied, StoreError> {
    let tx = client.transaction().await?;
    let mut sessions: Vec<String> = events
        .iter()
        .map(|(ev, _, _)| ev.session().to_string())
        .collect();
    sessions.sort();
    sessions.dedup();
    let ours = take_leases(&tx, &sessions, leases).await?;
    {
        let mut held = leases.held.lock();
        for s in &ours {
            if held.insert(s.clone()) {
                // Newly ours: what another proxy wrote meanwhile counts.
                known.remove(s);
            }
        }
    }
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
        let outcome = if !ours.contains(session) {
            Ok(Outcome::Refused(
                "another proxy holds the session's lease".into(),
            ))
        } else {
            tx.batch_execute("SAVEPOINT ev").await?;
            let r = apply_event(&tx, ev, known).await;
            match &r {
                Ok(Outcome::Applied(..)) => tx.batch_execute("RELEASE SAVEPOINT ev").await?,
                _ => tx.batch_execute("ROLLBACK TO SAVEPOINT ev").await?,
            }
            r
        };
        let (reason, why) = match outcome {
            Ok(Outcome::Applied(turns, invalidate)) => {
                learn(known, ev);
                let t = out.touched.entry(session.to_string()).or_default();
                t.turns.extend(turns);
                t.invalidate |= invalidate;
                t.page |= !matches!(
                    ev,
                    Event::Session(_) | Event::Step { .. } | Event::Line { .. }
                );
                continue;
            }
            Ok(Outcome::Refused(why)) => (BehindReason::Gap, why),
            Err(StoreError::Postgres(e)) if transient(&e) => return Err(e.into()),
            Err(e) if transient_store(&e) => return Err(e),
            Err(e) => (BehindReason::Failed, e.to_string()),
        };
        out.refused += 1;
        fallen.insert(session.to_string());
        known.remove(session);
        out.behind.push((session.to_string(), *id, reason, why));
    }
    tx.commit().await?;
    Ok(out)
}

fn learn(known: &mut HashMap<String, Known>, ev: &Event) {
    match ev {
        Event::Session(m) => {
            let k = known.entry(m.id.clone()).or_default();
            k.dialect = Some(m.dialect);
        }
        Event::Rows { session, rows } => {
            if let Some(last) = rows.last() {
                known.entry(session.clone()).or_default().next_seq = Some(last.seq + 1);
            }
        }
        _ => {}
    }
}

/// The session's partition day and dialect (None = no such session).
async fn session_facts(
    tx: &Transaction<'_>,
    session: &str,
    known: &mut HashMap<String, Known>,
) -> Result<Option<(i64, Dialect)>, StoreError> {
    if let Some(Known {
        day: Some(day),
        dialect: Some(d),
        ..
    }) = known.get(session)
    {
        return Ok(Some((*day, *d)));
    }
    let Some(r) = tx
        .query_opt(
            "SELECT day, dialect FROM sessions WHERE id = $1",
            &[&session],
        )
        .await?
    else {
        return Ok(None);
    };
    let day: i64 = r.get(0);
    let dialect = stored_dialect(session, &r.get::<_, String>(1))?;
    let k = known.entry(session.to_string()).or_default();
    k.day = Some(day);
    k.dialect = Some(dialect);
    Ok(Some((day, dialect)))
}

/// Text for the search index (PostgreSQL text holds no NUL).
fn index_text(dialect: Dialect, raw: &str) -> String {
    let mut t = parts::plain_text(dialect, raw);
    if t.contains('\0') {
        t = t.replace('\0', " ");
    }
    t
}

async fn hide(
    tx: &Transaction<'_>,
    session: &str,
    day: i64,
    seqs: &[u64],
) -> Result<Outcome, StoreError> {
    let seqs: Vec<i64> = seqs.iter().map(|s| big(*s)).collect();
    let rows = tx
        .query(
            "UPDATE rows SET hidden = true WHERE session = $1 AND day = $2 AND seq = ANY($3)
             RETURNING turn",
            &[&session, &day, &seqs],
        )
        .await?;
    let turns: BTreeSet<u32> = rows
        .iter()
        .map(|r| r.get::<_, i64>(0).max(0) as u32)
        .collect();
    Ok(Outcome::Applied(turns.into_iter().collect(), true))
}

async fn apply_event(
    tx: &Transaction<'_>,
    ev: &Event,
    known: &mut HashMap<String, Known>,
) -> Result<Outcome, StoreError> {
    if let Event::Session(m) = ev {
        let json = serde_json::to_string(m).unwrap_or_default();
        let day = m.created_ms.div_euclid(DAY_MS);
        let parent_seq = m.parent_seq.map(big);
        let r = tx
            .query_one(
                "INSERT INTO sessions (id, day, client, client_session, dialect, model, parent,
                                       created_ms, last_ms, meta_json, parent_seq)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 ON CONFLICT (id) DO UPDATE SET
                    client = EXCLUDED.client, client_session = EXCLUDED.client_session,
                    dialect = EXCLUDED.dialect, model = EXCLUDED.model, parent = EXCLUDED.parent,
                    last_ms = GREATEST(sessions.last_ms, EXCLUDED.last_ms),
                    meta_json = EXCLUDED.meta_json, parent_seq = EXCLUDED.parent_seq
                 RETURNING day",
                &[
                    &m.id,
                    &day,
                    &m.client,
                    &m.client_session,
                    &m.dialect.as_str(),
                    &m.model,
                    &m.parent,
                    &m.created_ms,
                    &m.last_ms,
                    &json,
                    &parent_seq,
                ],
            )
            .await?;
        let k = known.entry(m.id.clone()).or_default();
        k.day = Some(r.get(0));
        k.dialect = Some(m.dialect);
        return Ok(Outcome::Applied(Vec::new(), false));
    }
    let session = ev.session();
    let Some((day, dialect)) = session_facts(tx, session, known).await? else {
        return Ok(Outcome::Refused("unknown session".into()));
    };
    match ev {
        Event::Session(_) => Ok(Outcome::Applied(Vec::new(), false)),
        Event::Rows { rows, .. } => {
            let Some(first) = rows.first() else {
                return Ok(Outcome::Applied(Vec::new(), false));
            };
            let expected = match known.get(session).and_then(|k| k.next_seq) {
                Some(n) => n,
                None => {
                    let max: i64 = tx
                        .query_one(
                            "SELECT COALESCE(MAX(seq), 0)::bigint FROM rows
                             WHERE session = $1 AND day = $2",
                            &[&session, &day],
                        )
                        .await?
                        .get(0);
                    max.max(0) as u64 + 1
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
            let seqs: Vec<i64> = rows.iter().map(|r| big(r.seq)).collect();
            let branches: Vec<i64> = rows.iter().map(|r| i64::from(r.branch)).collect();
            let roles: Vec<&str> = rows.iter().map(|r| r.role.as_str()).collect();
            let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
            let turns_: Vec<i64> = rows.iter().map(|r| i64::from(r.turn)).collect();
            let steps: Vec<i64> = rows.iter().map(|r| i64::from(r.step)).collect();
            let tokens: Vec<i64> = rows.iter().map(|r| i64::from(r.tokens)).collect();
            let raws: Vec<&str> = rows.iter().map(|r| &*r.raw).collect();
            let from: Vec<bool> = rows.iter().map(|r| r.from_response).collect();
            tx.execute(
                "INSERT INTO rows (session, day, seq, branch, role, kind, turn, step, tokens, raw,
                                   from_response)
                 SELECT $1, $2, * FROM unnest($3::bigint[], $4::bigint[], $5::text[], $6::text[],
                                              $7::bigint[], $8::bigint[], $9::bigint[],
                                              $10::text[], $11::bool[])",
                &[
                    &session, &day, &seqs, &branches, &roles, &kinds, &turns_, &steps, &tokens,
                    &raws, &from,
                ],
            )
            .await?;
            let texts: Vec<String> = rows.iter().map(|r| index_text(dialect, &r.raw)).collect();
            tx.execute(
                "INSERT INTO row_text (session, day, seq, text)
                 SELECT $1, $2, * FROM unnest($3::bigint[], $4::text[])
                 ON CONFLICT (session, seq, day) DO UPDATE SET text = EXCLUDED.text",
                &[&session, &day, &seqs, &texts],
            )
            .await?;
            let mut turns = Vec::new();
            for r in rows {
                if turns.last() != Some(&r.turn) {
                    turns.push(r.turn);
                }
            }
            Ok(Outcome::Applied(turns, false))
        }
        Event::Confirm { seq, raw, .. } => {
            let Some(r) = tx
                .query_opt(
                    "UPDATE rows SET raw = $4, from_response = false
                     WHERE session = $1 AND day = $2 AND seq = $3 RETURNING turn, hidden",
                    &[&session, &day, &big(*seq), &&**raw],
                )
                .await?
            else {
                return Ok(Outcome::Refused(format!("confirm of unknown seq {seq}")));
            };
            let text = index_text(dialect, raw);
            tx.execute(
                "INSERT INTO row_text (session, day, seq, text) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (session, seq, day) DO UPDATE SET text = EXCLUDED.text",
                &[&session, &day, &big(*seq), &text],
            )
            .await?;
            let turn = r.get::<_, i64>(0).max(0) as u32;
            let hidden: bool = r.get(1);
            Ok(Outcome::Applied(
                if hidden { Vec::new() } else { vec![turn] },
                true,
            ))
        }
        Event::Branch {
            at_seq,
            branch,
            hidden,
            ..
        } => {
            tx.execute(
                "INSERT INTO branches (session, branch, at_seq, hidden, created_ms)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (session, branch) DO UPDATE SET at_seq = EXCLUDED.at_seq,
                    hidden = EXCLUDED.hidden, created_ms = EXCLUDED.created_ms",
                &[
                    &session,
                    &i64::from(*branch),
                    &big(*at_seq),
                    &(hidden.len() as i64),
                    &now_ms(),
                ],
            )
            .await?;
            // The replaced row keeps its place in the order: give it the
            // newest one, as SQLite's INSERT OR REPLACE does.
            tx.execute(
                "UPDATE branches SET ord = DEFAULT WHERE session = $1 AND branch = $2",
                &[&session, &i64::from(*branch)],
            )
            .await?;
            hide(tx, session, day, hidden).await
        }
        Event::Hide { seqs, .. } => hide(tx, session, day, seqs).await,
        Event::Step {
            step,
            model,
            status,
            usage,
            window_rows,
            ts_ms,
            error,
            detail,
            ..
        } => {
            let detail = if detail.is_empty() {
                None
            } else {
                serde_json::to_string(detail).ok()
            };
            tx.execute(
                "INSERT INTO steps (session, step, model, status, input, output, cache_read,
                    cache_write, window_rows, ts_ms, error, detail)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                 ON CONFLICT (session, step) DO UPDATE SET model = EXCLUDED.model,
                    status = EXCLUDED.status, input = EXCLUDED.input, output = EXCLUDED.output,
                    cache_read = EXCLUDED.cache_read, cache_write = EXCLUDED.cache_write,
                    window_rows = EXCLUDED.window_rows, ts_ms = EXCLUDED.ts_ms,
                    error = EXCLUDED.error, detail = EXCLUDED.detail",
                &[
                    &session,
                    &i64::from(*step),
                    model,
                    &i64::from(*status),
                    &big(usage.input),
                    &big(usage.output),
                    &big(usage.cache_read),
                    &big(usage.cache_write),
                    &i64::from(*window_rows),
                    ts_ms,
                    error,
                    &detail,
                ],
            )
            .await?;
            tx.execute(
                "UPDATE sessions SET last_ms = GREATEST(last_ms, $2) WHERE id = $1",
                &[&session, ts_ms],
            )
            .await?;
            Ok(Outcome::Applied(Vec::new(), false))
        }
        Event::Cut {
            upto_seq,
            gauge,
            line,
            ts_ms,
            ..
        } => {
            tx.execute(
                "INSERT INTO cuts (session, upto_seq, gauge, line, ts_ms)
                 VALUES ($1, $2, $3, $4, $5)",
                &[&session, &big(*upto_seq), &big(*gauge), &big(*line), ts_ms],
            )
            .await?;
            tx.execute(
                "UPDATE sessions SET cut_upto = $2 WHERE id = $1",
                &[&session, &big(*upto_seq)],
            )
            .await?;
            Ok(Outcome::Applied(Vec::new(), false))
        }
        Event::ContextEdit {
            n,
            set,
            seqs,
            tokens_before,
            tokens_after,
            ts_ms,
            ..
        } => {
            tx.execute(
                "INSERT INTO context_edits
                    (session, n, ts_ms, set_json, seqs_json, tokens_before, tokens_after)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (session, n) DO UPDATE SET ts_ms = EXCLUDED.ts_ms,
                    set_json = EXCLUDED.set_json, seqs_json = EXCLUDED.seqs_json,
                    tokens_before = EXCLUDED.tokens_before, tokens_after = EXCLUDED.tokens_after",
                &[
                    &session,
                    &i64::from(*n),
                    ts_ms,
                    set,
                    &serde_json::to_string(seqs).unwrap_or_default(),
                    &big(*tokens_before),
                    &big(*tokens_after),
                ],
            )
            .await?;
            Ok(Outcome::Applied(Vec::new(), false))
        }
        Event::Line {
            line,
            spec,
            overridden,
            ts_ms,
            ..
        } => {
            tx.execute(
                "UPDATE sessions SET line = $2, line_spec = $3, line_ms = $4, line_override = $5
                 WHERE id = $1",
                &[&session, &big(*line), spec, ts_ms, overridden],
            )
            .await?;
            Ok(Outcome::Applied(Vec::new(), false))
        }
    }
}
