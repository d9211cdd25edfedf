//! The records a ledger backend hands back ([`super::LedgerRead`],
//! [`super::LedgerWrite`]): session lists and whole sessions, steps, cuts,
//! lines, context edits, the writer's metrics and health, behind marks;
//! and the decoding both engines share of what a session's step details
//! carry (the sent pointers, the recall tool's kept exchanges).

use crate::model::{Dialect, Row, SessionMeta, StepDetail, Usage};
use serde::Serialize;

#[cfg(doc)]
use super::backend::{LedgerRead, LedgerWrite};

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
    /// as the proxy wrote it in [`crate::model::Event::Line`]); None = none.
    pub line_override: Option<String>,
    /// The models its steps sent, each with its latest step's time (unix
    /// ms), newest first, at most [`RECENT_MODELS`]: prompt caches are per
    /// model, so a proxy that resumes the session knows which are warm.
    pub models: Vec<(String, i64)>,
}

/// Models [`LoadedSession::models`] holds at most: the session's last
/// model and the others a resumed session remembers.
pub const RECENT_MODELS: usize = 5;

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
