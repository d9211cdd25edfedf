//! The ledger store: the backend traits ([`LedgerWrite`], [`LedgerRead`],
//! [`LedgerStore`]) and their two engines, SQLite ([`Store`], in `lite/`)
//! and PostgreSQL ([`pg::PgStore`], in `pg/`), side by side.
//!
//! What the engines share lives here: the traits (`backend`) and the
//! records they carry (`records`), the admission queue (`queue`) and the
//! channel to the writer thread (`handle`), the one writer loop generic
//! over an engine's `Db` (`writer`), what applying an event decides
//! (`apply`) and changes beyond the database (`effects`), the files written
//! behind the commit (`files`, `page_io`) from the reads both engines
//! implement (`source`), and small helpers (`common`). Each engine holds
//! its schema, its SQL and how it runs it, its reads and its jobs.
//!
//! The files of this module are mapped in `docs/ARCHITECTURE.md`.

mod apply;
mod backend;
mod common;
mod effects;
mod error;
mod files;
mod handle;
mod health;
mod lite;
mod page_io;
pub mod pg;
mod queue;
mod records;
mod source;
mod writer;

pub use backend::{LedgerRead, LedgerStore, LedgerWrite, SettleFuture};
pub use error::StoreError;
pub use health::RESTORE_WAIT;
pub use lite::schema::SCHEMA_VERSION;
pub use lite::Store;
pub use records::{
    Behind, BehindReason, ContextEditRecord, CutRecord, Health, HealthStatus, LineRecord,
    LoadedSession, SentPointers, SessionSummary, StepRecord, StoreMetrics, LAG_WINDOW,
    RECENT_MODELS,
};

use queue::Shared;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Tuning of [`Store::open`].
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    /// Most events queued for the writer (at least 1); beyond it events
    /// are shed and their sessions fall behind.
    pub queue_capacity: usize,
    /// Most bytes of events queued (at least 1); beyond it likewise.
    pub queue_bytes: usize,
    /// Most commands taken into one transaction (at least 1).
    pub batch_max: usize,
    /// How long SQLite waits for a lock before an attempt fails as busy
    /// (the writer then retries with backoff).
    pub busy_timeout: Duration,
    /// PostgreSQL only: how long a proxy's hold on a session lasts without
    /// renewal (see [`pg`]).
    pub lease: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            queue_capacity: 65_536,
            queue_bytes: 64 << 20,
            batch_max: 512,
            busy_timeout: Duration::from_secs(5),
            lease: Duration::from_secs(10),
        }
    }
}

/// Open the ledger a config names: `database` = a `postgres://` URL opens
/// the PostgreSQL engine ([`pg::PgStore`], this proxy's files under
/// `data_dir`); None opens the SQLite one in `data_dir` ([`Store`]).
pub fn open_ledger(
    database: Option<&str>,
    data_dir: &Path,
    opts: StoreOptions,
) -> Result<Arc<dyn LedgerStore>, StoreError> {
    Ok(match database {
        Some(url) => Arc::new(pg::PgStore::open(url, data_dir, opts)?),
        None => Arc::new(Store::open(data_dir, opts)?),
    })
}

/// The counters and lag summary of an engine's shared writer state.
fn metrics_of(s: &Shared) -> StoreMetrics {
    let (queued, queued_bytes, writer_lag_ms) = s.queue_state();
    let mut lags: Vec<u64> = s.lags_us.lock().iter().copied().collect();
    lags.sort_unstable();
    let pct = |p: usize| {
        if lags.is_empty() {
            0
        } else {
            lags[(lags.len() - 1) * p / 100]
        }
    };
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    StoreMetrics {
        events: n(&s.events),
        batches: n(&s.batches),
        commits_failed: n(&s.commits_failed),
        commit_retries: n(&s.commit_retries),
        rejected: n(&s.rejected),
        shed: n(&s.shed),
        behind: s.behind_count() as u64,
        reopens: n(&s.reopens),
        transcript_errors: n(&s.transcript_errors),
        files_healed: n(&s.files_healed),
        pages_written: n(&s.pages_written),
        sessions_removed: n(&s.sessions_removed),
        queued,
        queued_bytes,
        writer_lag_ms,
        lag_p50_us: pct(50),
        lag_p99_us: pct(99),
        lag_max_us: lags.last().copied().unwrap_or(0),
    }
}
