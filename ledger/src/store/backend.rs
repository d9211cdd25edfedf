//! What a ledger backend implements, and the records it hands back.
//!
//! [`LedgerWrite`] is the request path's side: submit events (never waits on
//! the disk), the settle barrier, health, and the *behind* protocol by which
//! a session whose events could not all be kept heals from its client's next
//! full resend. [`LedgerRead`] is what the CLI, the admin API, the exports,
//! recall and the restorer read. [`LedgerStore`] adds the maintenance jobs.
//! The SQLite engine ([`super::Store`]) implements all three; the proxy and
//! the CLI can hold an `Arc<dyn LedgerStore>`.
//!
//! The behind protocol is described on [`LedgerWrite`].

use super::error::StoreError;
use crate::model::{Dialect, Event, Row, SessionMeta, StepDetail, Usage};
use crate::page::Note;
use crate::paths::DataDir;
use crate::rebuild::{Progress, RebuildReport};
use crate::recall::RecallHit;
use crate::retention::{SweepReport, VacuumReport};
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;

/// How many recent commit lags the lag summary keeps.
pub const LAG_WINDOW: usize = 1024;

/// One line of [`LedgerRead::list_sessions`].
#[derive(Clone, Debug, PartialEq)]
pub struct SessionSummary {
    /// Ledger session id.
    pub id: String,
    /// Client family.
    pub client: String,
    /// The name the user gave the session (`/s/<name>/`,
    /// `x-oceancode-session`), if any.
    pub name: Option<String>,
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
    /// Parent session (a sub-agent's, or the one a sibling diverged from).
    pub parent: Option<String>,
    /// A sibling's divergence point: the parent's last shared row.
    pub parent_seq: Option<u64>,
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
    /// The context edit set in force (its JSON) and the number of edits
    /// taken (None = never edited).
    pub context: Option<(u32, String)>,
    /// The in-band recall tool's internal exchanges the steps kept, in step
    /// order: the seq of the row each follows and its messages
    /// ([`StepDetail::kept_exchange`]).
    pub exchanges: Vec<(u64, Vec<String>)>,
    /// The `ledger.compress` pointers the newest recorded window sent, and
    /// the cut they were chosen at (None = no window after a cut was
    /// recorded with its `sent` record): a restarted proxy sends the very
    /// same bytes until the next cut.
    pub pointers: Option<SentPointers>,
    /// The session's own tideline override as last recorded (LineSpec JSON,
    /// as the proxy wrote it in [`Event::Line`]); None = none.
    pub line_override: Option<String>,
}

/// [`LoadedSession::pointers`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SentPointers {
    /// The last row that left the window when they were sent.
    pub upto: u64,
    /// The pruned outputs by row (empty: the window sent none).
    pub rows: Vec<crate::model::RowPointers>,
}

/// A `LIKE` pattern that step details with a `sent` record match.
pub(crate) const SENT_LIKE: &str = "%\"sent\"%";

/// Where [`LoadedSession::pointers`] are, read from the newest step
/// detail with a `sent` record: in it, or in the detail of the step it
/// names (a window that sent the same pointers as an earlier one names
/// that step instead of repeating them).
pub(crate) enum PointersAt {
    /// No window after a cut recorded its pointers.
    None,
    Here(SentPointers),
    /// In the detail of `step`; `upto` is the cut they were chosen at.
    Step {
        step: u32,
        upto: u64,
    },
}

/// [`PointersAt`] of the newest step detail with a `sent` record.
pub(crate) fn pointers_at(newest: Option<&str>) -> PointersAt {
    let Some(sent) = newest
        .and_then(|d| serde_json::from_str::<StepDetail>(d).ok())
        .and_then(|d| d.sent)
        .filter(|s| s.upto > 0)
    else {
        return PointersAt::None;
    };
    match (sent.pointers, sent.pointers_step) {
        (Some(rows), _) => PointersAt::Here(SentPointers {
            upto: sent.upto,
            rows,
        }),
        (None, 0) => PointersAt::Here(SentPointers {
            upto: sent.upto,
            rows: Vec::new(),
        }),
        (None, step) => PointersAt::Step {
            step,
            upto: sent.upto,
        },
    }
}

/// The pointers a [`PointersAt::Step`] names, from that step's detail.
pub(crate) fn pointers_of_step(upto: u64, detail: Option<&str>) -> Option<SentPointers> {
    let rows = serde_json::from_str::<StepDetail>(detail?)
        .ok()?
        .sent?
        .pointers?;
    Some(SentPointers { upto, rows })
}

/// [`LoadedSession::exchanges`] from a session's step details (JSON, in
/// step order); details that do not read are skipped. Every engine's
/// `load_session` reads them with the SQL filter [`RECALLS_LIKE`].
pub(crate) fn kept_exchanges<'a>(
    details: impl IntoIterator<Item = &'a str>,
) -> Vec<(u64, Vec<String>)> {
    details
        .into_iter()
        .filter_map(|d| serde_json::from_str::<StepDetail>(d).ok())
        .filter_map(|d| d.kept_exchange())
        .collect()
}

/// A `LIKE` pattern that step details with recalls match (a cheap filter
/// before [`kept_exchanges`] parses them).
pub(crate) const RECALLS_LIKE: &str = "%\"recalls\"%";

/// One taken context edit (`Event::ContextEdit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextEditRecord {
    /// 1-based number of the edit.
    pub n: u32,
    /// Unix milliseconds.
    pub ts_ms: i64,
    /// The seqs it deleted, rewrote or restored.
    pub seqs: Vec<u64>,
    /// Estimated tokens of the window before it.
    pub tokens_before: u64,
    /// Estimated tokens of the window after it.
    pub tokens_after: u64,
    /// The edit set in force after it (JSON).
    pub set: String,
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
    /// Why the step failed (None = it completed).
    pub error: Option<String>,
    /// What the answer reported besides its window's usage (billed beyond
    /// it, reasoning, server-side compactions, context edits).
    pub detail: StepDetail,
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

/// The line a session last ran with (recorded from its requests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineRecord {
    /// The line in tokens.
    pub line: u64,
    /// How it was set (`40%`, `20k`, `ceiling`).
    pub spec: String,
    /// Unix milliseconds it came in force.
    pub ts_ms: i64,
}

/// A snapshot of the writer's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreMetrics {
    /// Events taken by the writer in committed batches (refused ones included).
    pub events: u64,
    /// Committed transactions.
    pub batches: u64,
    /// Batches given up (only at shutdown, after a grace period of retries);
    /// their events are lost.
    pub commits_failed: u64,
    /// Failed commit attempts (each retried with backoff).
    pub commit_retries: u64,
    /// Events refused (seq gap, unknown session or row, SQL error): each
    /// leaves its session behind.
    pub rejected: u64,
    /// Events dropped because they did not fit the write queue or their
    /// session was behind.
    pub shed: u64,
    /// Sessions behind now.
    pub behind: u64,
    /// Times the database was opened afresh (its file deleted or replaced).
    pub reopens: u64,
    /// Transcript/index/page writes that failed.
    pub transcript_errors: u64,
    /// Sessions whose files were written again after a failure or a hole.
    pub files_healed: u64,
    /// `SESSION.md` writes.
    pub pages_written: u64,
    /// Sessions removed by the retention sweep.
    pub sessions_removed: u64,
    /// Events queued and not yet committed.
    pub queued: u64,
    /// Their approximate bytes.
    pub queued_bytes: u64,
    /// Age of the oldest queued-but-uncommitted event, ms (0 when idle).
    pub writer_lag_ms: u64,
    /// Median enqueue-to-commit lag over the last [`LAG_WINDOW`] events, µs.
    pub lag_p50_us: u64,
    /// 99th percentile of the same, µs.
    pub lag_p99_us: u64,
    /// Maximum of the same, µs.
    pub lag_max_us: u64,
}

/// Whether the ledger keeps up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// Everything submitted is being committed.
    Ok,
    /// Commits fail (and are retried), sessions are behind, or files lag.
    Degraded,
}

/// The ledger's health, as `/_oceancode/health` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Health {
    /// `ok` or `degraded`.
    pub status: HealthStatus,
    /// Why it is degraded, one line each (empty when ok).
    pub reasons: Vec<String>,
    /// Age of the oldest queued-but-uncommitted event, ms (0 when idle).
    pub lag_ms: u64,
    /// Events queued and not yet committed.
    pub queued: u64,
    /// Their approximate bytes.
    pub queued_bytes: u64,
    /// Sessions behind (see the module docs).
    pub behind: u64,
}

/// Why a session is behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BehindReason {
    /// Its events did not fit the write queue's budget.
    Shed,
    /// An event did not continue what is committed (rows missing before it,
    /// an unknown session or row — e.g. the database was replaced).
    Gap,
    /// An event failed for good (not a transient error).
    Failed,
}

/// A session behind: its later events are dropped until it is resynced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Behind {
    /// Unix ms when it fell behind.
    pub since_ms: i64,
    /// Why.
    pub reason: BehindReason,
    /// Events of it dropped since.
    pub dropped: u64,
    /// Nothing of the session is still queued and commits are not failing:
    /// [`LedgerWrite::resync`] reads committed state and does not wait on
    /// the writer.
    pub ready: bool,
}

/// The future of [`LedgerWrite::settle`].
pub type SettleFuture<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// The write side: what the request path uses.
///
/// ## Behind
///
/// What a backend holds of a session is always a gap-free, in-order prefix of
/// what the proxy recorded. When it cannot keep that promise for the rest of
/// the session's events (its write queue is over budget, a `Rows` event does
/// not continue the session, the database was replaced), it marks the
/// session *behind* and drops the session's later events until the proxy
/// asks for [`LedgerWrite::resync`]: that clears the mark and returns what is
/// committed, which the proxy takes as the session's state (as after a
/// restart). The client's next full resend then records everything past the
/// committed prefix. A proxy polls [`LedgerWrite::behind_count`] (one atomic
/// load) per request and looks a session up with [`LedgerWrite::behind`] only
/// when it is not zero; it resyncs once [`Behind::ready`] says the call will
/// not wait on a stalled writer.
pub trait LedgerWrite: Send + Sync {
    /// Queue an event. Never blocks and never waits on the disk; an event the
    /// backend cannot keep marks its session behind (see the module docs).
    fn submit(&self, ev: Event) -> Result<(), StoreError>;
    /// Barrier: resolves once everything submitted before it is committed
    /// and its files are written.
    fn settle(&self) -> SettleFuture<'_>;
    /// Blocking form of [`LedgerWrite::settle`].
    fn settle_blocking(&self) -> Result<(), StoreError>;
    /// [`LedgerWrite::settle_blocking`] for at most `wait`: whether it settled.
    fn settle_within(&self, wait: std::time::Duration) -> Result<bool, StoreError>;
    /// Whether the ledger keeps up, and if not why.
    fn health(&self) -> Health;
    /// Counters and the lag summary.
    fn metrics(&self) -> StoreMetrics;
    /// Sessions behind (one atomic load: the request path polls it).
    fn behind_count(&self) -> usize;
    /// Whether `session` is behind.
    fn behind(&self, session: &str) -> Option<Behind>;
    /// Every session behind.
    fn behind_sessions(&self) -> Vec<(String, Behind)>;
    /// Clear `session`'s behind mark and return what is committed of it
    /// (None = nothing, not even its facts); the caller takes it as the
    /// session's state. Blocks until the session's queued events are
    /// processed (none when [`Behind::ready`]).
    fn resync(&self, session: &str) -> Result<Option<LoadedSession>, StoreError>;
    /// The recorded sessions of a client key (root first), each as
    /// committed, for the proxy's restorer. Waits on the writer only when
    /// one of them has events still queued; errors are the caller's to log.
    fn restore_client(&self, key: &str) -> Result<Vec<LoadedSession>, StoreError>;
    /// The proxy let `session` go (idle eviction): a backend shared by
    /// several proxies releases its hold so another may serve it at once.
    fn release(&self, _session: &str) {}
    /// Drain, commit and stop. Idempotent; later submits fail with
    /// [`StoreError::Closed`].
    fn shutdown(&self) -> Result<(), StoreError>;
}

/// The read side: the CLI, the admin API, exports, recall and the restorer.
/// Reads see committed state; settle first when queued writes matter.
pub trait LedgerRead: Send + Sync {
    /// The data-dir layout (transcripts, `SESSION.md`).
    fn data_dir(&self) -> &DataDir;
    /// Every session, most recent activity first.
    fn list_sessions(&self) -> Result<Vec<SessionSummary>, StoreError>;
    /// One line of [`LedgerRead::list_sessions`].
    fn session_summary(&self, id: &str) -> Result<Option<SessionSummary>, StoreError>;
    /// Ids of the sessions of a client key, oldest first.
    fn sessions_for_client(&self, key: &str) -> Result<Vec<String>, StoreError>;
    /// The most recently active session.
    fn latest_session(&self) -> Result<Option<String>, StoreError>;
    /// `None` = the most recent; an exact id; else a unique id prefix.
    fn resolve_session(&self, spec: Option<&str>) -> Result<String, StoreError>;
    /// Every session as a name may mean it ([`crate::resolve::Candidate`]).
    fn session_candidates(&self) -> Result<Vec<crate::resolve::Candidate>, StoreError>;
    /// A session's facts.
    fn session_meta(&self, id: &str) -> Result<Option<SessionMeta>, StoreError>;
    /// A session's rows in seq order with their `hidden` flag.
    fn session_rows(&self, id: &str, include_hidden: bool) -> Result<Vec<(Row, bool)>, StoreError>;
    /// A session's steps in order.
    fn steps(&self, id: &str) -> Result<Vec<StepRecord>, StoreError>;
    /// A session's tideline cuts in order.
    fn cuts(&self, id: &str) -> Result<Vec<CutRecord>, StoreError>;
    /// A session's taken context edits in order (none by default: an
    /// engine without them records no edit).
    fn context_edits(&self, _id: &str) -> Result<Vec<ContextEditRecord>, StoreError> {
        Ok(Vec::new())
    }
    /// What each model merge of a session's `SESSION.md` used, in order
    /// (the markers of `page_notes` that carry it; none by default).
    fn merge_uses(&self, _id: &str) -> Result<Vec<crate::merge::MergeUse>, StoreError> {
        Ok(Vec::new())
    }
    /// The line a session last ran with, if one was recorded.
    fn recorded_line(&self, id: &str) -> Result<Option<LineRecord>, StoreError>;
    /// A whole session (settles first).
    fn load_session(&self, id: &str) -> Result<Option<LoadedSession>, StoreError>;
    /// One session's rows, oldest first (see [`crate::recall`]).
    fn recall_log(
        &self,
        session: &str,
        pattern: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RecallHit>, StoreError>;
    /// One row, whole, with its `hidden` flag.
    fn recall_entry(&self, session: &str, seq: u64) -> Result<Option<(Row, bool)>, StoreError>;
    /// Rows of every session containing every word.
    fn search(&self, words: &[String], limit: usize) -> Result<Vec<RecallHit>, StoreError> {
        self.search_in(words, limit, crate::recall::Scope::All)
    }
    /// Rows of the sessions `scope` names containing every word, bounded
    /// (see [`crate::recall`]; past a bound [`StoreError::TooBroad`]).
    fn search_in(
        &self,
        words: &[String],
        limit: usize,
        scope: crate::recall::Scope<'_>,
    ) -> Result<Vec<RecallHit>, StoreError>;
    /// Where a row is in its turn file (seq → `transcript/NNNN.md` and the
    /// lines of its section); None when unknown or hidden.
    fn row_lines(
        &self,
        session: &str,
        seq: u64,
    ) -> Result<Option<crate::transcript::RowLines>, StoreError>;
}

/// A whole ledger backend: both sides and the maintenance jobs (run in
/// queue order with the writes). `Any` lets a test or bench reach an
/// engine's own handle (`(&*store as &dyn Any).downcast_ref::<Store>()`)
/// without the traits naming any engine.
pub trait LedgerStore: LedgerWrite + LedgerRead + std::any::Any {
    /// Rebuild a session's files and search index from the database.
    fn rebuild(
        &self,
        session: &str,
        progress: Option<Progress>,
    ) -> Result<RebuildReport, StoreError>;
    /// Remove every session idle for `days` days or more (`0` = keep all).
    fn sweep(&self, days: u32) -> Result<SweepReport, StoreError> {
        self.sweep_at(days, super::common::now_ms())
    }
    /// [`LedgerStore::sweep`] with an explicit "now" (Unix ms), for tests.
    fn sweep_at(&self, days: u32, now_ms: i64) -> Result<SweepReport, StoreError>;
    /// Compact the database.
    fn vacuum(&self) -> Result<VacuumReport, StoreError>;
    /// Store model-merged lines for a session's `SESSION.md` and rewrite it.
    fn add_page_notes(&self, session: &str, notes: Vec<Note>) -> Result<(), StoreError>;
    /// The model-merge backlog of a session: `(from, to)` turns.
    fn page_backlog(&self, session: &str) -> Result<(u32, u32), StoreError>;
}
