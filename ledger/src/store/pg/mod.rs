//! The PostgreSQL engine: [`PgStore`], the same backend traits as the
//! SQLite [`super::Store`] over a database many proxies share.
//!
//! The same writer model: one thread per proxy (`oceancode-pg-writer`)
//! owns the write connection and takes what is queued in batches, one
//! transaction each, retried with backoff while the database refuses or
//! is down (requests keep flowing; health says degraded; sessions whose
//! events cannot be kept fall *behind* and heal from their client's next
//! full resend). The same admission queue (`store::queue::Shared`), the
//! same gap-free check, the same renderers: each proxy writes the
//! transcripts, `index.md` and `SESSION.md` of the sessions it serves into
//! its own data dir, and `ledger rebuild` writes them on any machine from
//! the database alone.
//!
//! Many proxies, one database: a session is served by one proxy at a time
//! (table `leases`). The writer takes a session's lease in the transaction
//! that first writes it, renews what it holds every third of
//! [`super::StoreOptions::lease`], and lets go at idle eviction
//! ([`LedgerWrite::release`]) and at shutdown. A proxy that reads a session
//! back (the restorer, a resync) takes its lease first, waiting for a dead
//! holder's lease to lapse; a session another live proxy holds is refused
//! by the writer and falls behind, so rows of two proxies never
//! interleave.
//!
//! Crates: `tokio-postgres` (the async client the ecosystem's other
//! PostgreSQL crates wrap; MSRV 1.85, fits the workspace's 1.88) and
//! `deadpool-postgres` for the readers' pool. The writer drives its own
//! connection on a current-thread runtime of its thread, so a batch's
//! transaction borrows nothing across threads; readers run on a small
//! runtime of the store's and are waited for from any thread (a tokio
//! worker included, like the SQLite engine's blocking reads).

mod apply;
mod jobs;
mod reads;
mod schema;
mod source;
mod sql;
mod text;
mod writer;

use super::backend::{LedgerRead, LedgerStore, LedgerWrite, SettleFuture};
use super::common::now_ms;
use super::error::{io_err, StoreError};
use super::handle::WriterHandle;
use super::health::{health_of, RESTORE_WAIT};
use super::queue::{Cmd, Shared};
use super::records::{
    Behind, BehindReason, CutRecord, Health, LineRecord, LoadedSession, SessionSummary, StepRecord,
    StoreMetrics,
};
use super::StoreOptions;
use crate::model::{Event, Row, SessionMeta};
use crate::page::Note;
use crate::paths::DataDir;
use crate::rebuild::{Progress, RebuildReport};
use crate::recall::RecallHit;
use crate::retention::{SweepReport, VacuumReport};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::future::Future;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::{Config, NoTls};
use tracing::warn;
use writer::PgDb;

/// The PostgreSQL engine's writer.
type PgWriter = super::writer::Writer<PgDb>;

/// Connections of the readers' pool.
const READERS: usize = 4;
/// How long connecting may take before it counts as a failure.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Which proxy holds which sessions (shared by the handle and its writer).
pub(crate) struct Leases {
    /// This proxy's name in `leases.owner` (host, pid, start time).
    pub(crate) owner: String,
    /// How long a lease lasts without renewal.
    pub(crate) ttl: Duration,
    /// Sessions whose lease this proxy holds.
    pub(crate) held: Mutex<HashSet<String>>,
}

/// Handle to a PostgreSQL ledger. Cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    dir: DataDir,
    /// The URL without its password (for messages).
    shown: String,
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    pool: deadpool_postgres::Pool,
    writer: WriterHandle<PgWriter>,
    shared: Arc<Shared>,
    leases: Arc<Leases>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The writer first, then the readers' runtime.
        if let Err(e) = self.writer.shutdown() {
            warn!("ledger writer shutdown on drop: {e}");
        }
        if let Some(rt) = self.rt.lock().take() {
            rt.shutdown_background();
        }
    }
}

/// `url` without its credentials (`postgres://user:***@host/db?password=***`):
/// the one redaction of the workspace, [`oceancode_config::redact_url`].
pub fn redact_url(url: &str) -> String {
    oceancode_config::redact_url(url)
}

fn owner_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".into());
    format!("{host}:{}:{}", std::process::id(), now_ms())
}

/// Run `fut` on `handle` and wait for it from this thread (any thread:
/// a tokio worker of another runtime blocks as on an SQLite read).
fn wait_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    let (tx, rx) = mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().map_err(|_| StoreError::Closed)?
}

impl PgStore {
    /// Open the PostgreSQL ledger at `url` (`postgres://user[:pw]@host[:port]/db`),
    /// with this proxy's files under `data_dir`: connects, migrates the
    /// schema (created on first use; a newer one is refused), makes sure of
    /// the day partitions and starts the writer thread.
    pub fn open(url: &str, data_dir: &Path, opts: StoreOptions) -> Result<PgStore, StoreError> {
        let shown = redact_url(url);
        let mut config: Config = url
            .parse()
            .map_err(|e| StoreError::PgSetup(format!("{shown}: {e}")))?;
        if config.get_application_name().is_none() {
            config.application_name("oceancode-proxy");
        }
        config.connect_timeout(CONNECT_TIMEOUT);
        config.keepalives_idle(Duration::from_secs(30));
        let dir = DataDir::new(data_dir);
        dir.ensure_root().map_err(io_err(data_dir))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("oceancode-pg")
            .enable_all()
            .build()
            .map_err(io_err(data_dir))?;
        let handle = rt.handle().clone();
        let pool_cfg = deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        };
        let mgr = deadpool_postgres::Manager::from_config(config.clone(), NoTls, pool_cfg);
        let pool = {
            let _guard = rt.enter();
            deadpool_postgres::Pool::builder(mgr)
                .max_size(READERS)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .build()
                .map_err(|e| StoreError::PgSetup(format!("{shown}: {e}")))?
        };
        // The writer's own runtime and connection, made on its thread (the
        // caller may be inside a runtime); the open waits for the
        // connection and the migration, so a database that cannot be
        // reached or migrated fails it.
        let shared = Arc::new(Shared::new(opts.queue_capacity, opts.queue_bytes));
        let leases = Arc::new(Leases {
            owner: owner_name(),
            ttl: opts.lease.max(Duration::from_millis(300)),
            held: Mutex::new(HashSet::new()),
        });
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(), StoreError>>(1);
        let (wdir, wshared, wleases, wshown) =
            (dir.clone(), shared.clone(), leases.clone(), shown.clone());
        let batch_max = opts.batch_max;
        let thread = std::thread::Builder::new()
            .name("oceancode-pg-writer".into())
            .spawn(move || {
                let wrt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(StoreError::PgSetup(e.to_string())));
                        return;
                    }
                };
                let connected = wrt.block_on(async {
                    let (mut client, conn) = config.connect(NoTls).await.map_err(|e| {
                        StoreError::PgSetup(format!("cannot connect to {wshown}: {e}"))
                    })?;
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    schema::migrate(&mut client).await?;
                    schema::ensure_partitions(&mut client, now_ms() / schema::DAY_MS).await?;
                    Ok::<_, StoreError>(client)
                });
                let client = match connected {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let mut db = PgDb::new(wrt, config, client, wleases);
                db.backfill_text();
                PgWriter::new(db, wdir, rx, wshared, batch_max).run();
            })
            .map_err(io_err(data_dir))?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                rt.shutdown_background();
                return Err(e);
            }
            Err(_) => {
                rt.shutdown_background();
                return Err(StoreError::Closed);
            }
        }
        Ok(PgStore {
            inner: Arc::new(Inner {
                dir,
                shown,
                rt: Mutex::new(Some(rt)),
                handle,
                pool,
                writer: WriterHandle::new(tx, thread, shared.clone()),
                shared,
                leases,
            }),
        })
    }

    /// The database URL, password left out.
    pub fn url(&self) -> &str {
        &self.inner.shown
    }

    /// This proxy's name in the `leases` table.
    pub fn owner(&self) -> &str {
        &self.inner.leases.owner
    }

    /// Sessions whose lease this proxy holds.
    pub fn held(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.leases.held.lock().iter().cloned().collect();
        v.sort();
        v
    }

    /// Run a query on a pooled reader connection and wait for it.
    fn read<T: Send + 'static, F>(
        &self,
        f: impl FnOnce(deadpool_postgres::Object) -> F + Send + 'static,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let pool = self.inner.pool.clone();
        wait_on(&self.inner.handle, async move {
            let c = pool
                .get()
                .await
                .map_err(|e| StoreError::PgSetup(e.to_string()))?;
            f(c).await
        })
    }

    /// Run `f` on the writer thread after everything queued before it.
    fn run_job<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut PgWriter) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.inner.writer.run_job(f)
    }

    /// Take the lease of `sessions` for this proxy, waiting up to `wait`
    /// for ones another proxy holds to lapse (its proxy died) or be let
    /// go. Returns the sessions still held elsewhere after the wait.
    pub fn take_leases(
        &self,
        sessions: &[String],
        wait: Duration,
    ) -> Result<Vec<String>, StoreError> {
        let deadline = Instant::now() + wait;
        let mut left: Vec<String> = sessions.to_vec();
        loop {
            let owner = self.inner.leases.owner.clone();
            let ttl = self.inner.leases.ttl.as_millis() as i64;
            let want = left.clone();
            let got: HashSet<String> = self.read(move |c| async move {
                let sql = format!(
                    "INSERT INTO leases (session, owner, expires_ms)
                     SELECT s, $2, {now} + $3 FROM unnest($1::text[]) AS s
                     ON CONFLICT (session) DO UPDATE SET owner = EXCLUDED.owner,
                        expires_ms = EXCLUDED.expires_ms
                     WHERE leases.owner = EXCLUDED.owner OR leases.expires_ms < {now}
                     RETURNING session",
                    now = schema::NOW_MS
                );
                let rows = c.query(&sql, &[&want, &owner, &ttl]).await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })?;
            {
                let mut held = self.inner.leases.held.lock();
                held.extend(got.iter().cloned());
            }
            left.retain(|s| !got.contains(s));
            if left.is_empty() || Instant::now() >= deadline {
                return Ok(left);
            }
            std::thread::sleep(Duration::from_millis(100).min(deadline - Instant::now()));
        }
    }
}

impl LedgerWrite for PgStore {
    fn submit(&self, ev: Event) -> Result<(), StoreError> {
        self.inner.writer.enqueue(ev, true)
    }
    fn settle(&self) -> SettleFuture<'_> {
        self.inner.writer.settle()
    }
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
        super::metrics_of(&self.inner.shared)
    }
    fn behind_count(&self) -> usize {
        self.inner.shared.behind_count()
    }
    fn behind(&self, session: &str) -> Option<Behind> {
        self.inner.shared.behind(session)
    }
    fn behind_sessions(&self) -> Vec<(String, Behind)> {
        self.inner.shared.behind_sessions()
    }
    fn resync(&self, session: &str) -> Result<Option<LoadedSession>, StoreError> {
        // Serve it only with its lease: wait for another holder's to lapse.
        self.take_leases(&[session.to_string()], self.inner.leases.ttl + RESTORE_WAIT)?;
        if self.inner.shared.clear_behind_if_idle(session) {
            let id = session.to_string();
            return self.read(move |c| async move { sql::load_session(&**c, &id).await });
        }
        let id = session.to_string();
        self.run_job(move |w| {
            w.shared.clear_behind(&id);
            w.forget(&id);
            let (rt, c) = w.db.parts()?;
            rt.block_on(sql::load_session(&*c, &id))
        })
    }
    fn restore_client(&self, key: &str) -> Result<Vec<LoadedSession>, StoreError> {
        let s = &self.inner.shared;
        // Asked before the read too: a session of the key committed between
        // the read and the second question would be missed.
        let key_queued = s.queued_for(key, &[]);
        let mut ids = self.sessions_for_client(key)?;
        if key_queued || s.queued_for(key, &ids) {
            match self.settle_within(RESTORE_WAIT) {
                Ok(_) | Err(StoreError::Closed) => {}
                Err(e) => return Err(e),
            }
            ids = self.sessions_for_client(key)?;
        }
        // Another proxy served them: wait for its lease to lapse (it died)
        // or be let go, then read what it committed.
        let elsewhere = self.take_leases(&ids, self.inner.leases.ttl + RESTORE_WAIT)?;
        let mut out = Vec::new();
        for id in ids {
            let id2 = id.clone();
            let loaded = self.read(move |c| async move { sql::load_session(&**c, &id2).await })?;
            if let Some(l) = loaded {
                if elsewhere.contains(&id) || !s.clear_behind_if_idle(&id) {
                    s.mark_behind(&id, 0, BehindReason::Gap);
                }
                out.push(l);
            }
        }
        Ok(out)
    }
    fn release(&self, session: &str) {
        let id = session.to_string();
        let _ = self
            .inner
            .writer
            .send(Cmd::Job(Box::new(move |w: &mut PgWriter| {
                w.files.forget(&id);
                w.db.release(&id);
            })));
    }
    fn shutdown(&self) -> Result<(), StoreError> {
        self.inner.writer.shutdown()
    }
}

impl LedgerRead for PgStore {
    fn data_dir(&self) -> &DataDir {
        &self.inner.dir
    }
    fn list_sessions(&self) -> Result<Vec<SessionSummary>, StoreError> {
        self.read(|c| reads::summaries(c, None))
    }
    fn session_summary(&self, id: &str) -> Result<Option<SessionSummary>, StoreError> {
        let id = id.to_string();
        Ok(self
            .read(move |c| reads::summaries(c, Some(id)))?
            .into_iter()
            .next())
    }
    fn sessions_for_client(&self, key: &str) -> Result<Vec<String>, StoreError> {
        let key = key.to_string();
        self.read(move |c| async move {
            let rows = c
                .query(
                    "SELECT id FROM sessions WHERE client_session = $1 ORDER BY created_ms, ord",
                    &[&key],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }
    fn latest_session(&self) -> Result<Option<String>, StoreError> {
        self.read(|c| async move {
            Ok(c.query_opt(
                "SELECT id FROM sessions ORDER BY last_ms DESC, ord DESC LIMIT 1",
                &[],
            )
            .await?
            .map(|r| r.get(0)))
        })
    }
    fn resolve_session(&self, spec: Option<&str>) -> Result<String, StoreError> {
        let Some(spec) = spec else {
            return self.latest_session()?.ok_or(StoreError::NoSessions);
        };
        Ok(crate::resolve::resolve(spec, &self.session_candidates()?)?)
    }
    fn session_candidates(&self) -> Result<Vec<crate::resolve::Candidate>, StoreError> {
        self.read(reads::candidates)
    }
    fn session_meta(&self, id: &str) -> Result<Option<SessionMeta>, StoreError> {
        let id = id.to_string();
        self.read(move |c| async move { sql::session_meta(&**c, &id).await })
    }
    fn session_rows(&self, id: &str, include_hidden: bool) -> Result<Vec<(Row, bool)>, StoreError> {
        let id = id.to_string();
        self.read(move |c| async move { sql::session_rows(&**c, &id, include_hidden).await })
    }
    fn steps(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let id = id.to_string();
        self.read(move |c| reads::steps(c, id))
    }
    fn cuts(&self, id: &str) -> Result<Vec<CutRecord>, StoreError> {
        let id = id.to_string();
        self.read(move |c| reads::cuts(c, id))
    }
    fn context_edits(
        &self,
        id: &str,
    ) -> Result<Vec<super::records::ContextEditRecord>, StoreError> {
        let id = id.to_string();
        self.read(move |c| reads::context_edits(c, id))
    }
    fn recorded_line(&self, id: &str) -> Result<Option<LineRecord>, StoreError> {
        let id = id.to_string();
        self.read(move |c| reads::recorded_line(c, id))
    }
    fn merge_uses(&self, id: &str) -> Result<Vec<crate::merge::MergeUse>, StoreError> {
        let id = id.to_string();
        self.read(move |c| reads::merge_uses(c, id))
    }
    fn load_session(&self, id: &str) -> Result<Option<LoadedSession>, StoreError> {
        match self.settle_blocking() {
            Ok(()) | Err(StoreError::Closed) => {}
            Err(e) => return Err(e),
        }
        let id = id.to_string();
        self.read(move |c| async move { sql::load_session(&**c, &id).await })
    }
    fn recall_log(
        &self,
        session: &str,
        pattern: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RecallHit>, StoreError> {
        let session = session.to_string();
        let pattern = pattern.map(str::to_string);
        self.read(move |c| reads::recall_log(c, session, pattern, before, limit))
    }
    fn recall_entry(&self, session: &str, seq: u64) -> Result<Option<(Row, bool)>, StoreError> {
        let session = session.to_string();
        self.read(move |c| reads::recall_entry(c, session, seq))
    }
    fn search_in(
        &self,
        words: &[String],
        limit: usize,
        scope: crate::recall::Scope<'_>,
    ) -> Result<Vec<RecallHit>, StoreError> {
        let terms = crate::recall::search_terms(words)?;
        let within = scope.session().map(str::to_string);
        self.read(move |c| reads::search(c, terms, limit, within))
    }
    fn row_lines(
        &self,
        session: &str,
        seq: u64,
    ) -> Result<Option<crate::transcript::RowLines>, StoreError> {
        let session = session.to_string();
        self.read(move |c| async move {
            let Some(meta) = sql::session_meta(&**c, &session).await? else {
                return Ok(None);
            };
            let seq_i = i64::try_from(seq).unwrap_or(i64::MAX);
            let Some(turn) = c
                .query_opt(
                    "SELECT turn FROM rows WHERE session = $1 AND seq = $2 AND NOT hidden",
                    &[&session, &seq_i],
                )
                .await?
                .map(|r| r.get::<_, i64>(0))
            else {
                return Ok(None);
            };
            let turn = u32::try_from(turn).unwrap_or(0);
            let rows = sql::turn_rows(&**c, &session, turn).await?;
            let (_, index) = crate::transcript::render_turn_indexed(meta.dialect, turn, &rows);
            Ok(index.find(seq))
        })
    }
}

impl LedgerStore for PgStore {
    fn rebuild(
        &self,
        session: &str,
        progress: Option<Progress>,
    ) -> Result<RebuildReport, StoreError> {
        let session = session.to_string();
        self.run_job(move |w| jobs::rebuild(w, &session, progress.as_ref()))
    }
    fn sweep_at(&self, days: u32, now_ms: i64) -> Result<SweepReport, StoreError> {
        self.run_job(move |w| jobs::sweep(w, days, now_ms))
    }
    fn vacuum(&self) -> Result<VacuumReport, StoreError> {
        self.run_job(jobs::vacuum)
    }
    fn add_page_notes(&self, session: &str, notes: Vec<Note>) -> Result<(), StoreError> {
        let session = session.to_string();
        self.run_job(move |w| jobs::add_page_notes(w, &session, notes))
    }
    fn page_backlog(&self, session: &str) -> Result<(u32, u32), StoreError> {
        let session = session.to_string();
        self.run_job(move |w| jobs::page_backlog(w, &session))
    }
}
