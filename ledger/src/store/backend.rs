//! What a ledger backend implements (the records it hands back are in
//! `records`).
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
use super::records::{
    Behind, CutRecord, Health, LineRecord, LoadedSession, SessionSummary, StepRecord, StoreMetrics,
};
use crate::model::{Event, Row, SessionMeta};
use crate::page::Note;
use crate::paths::DataDir;
use crate::rebuild::{Progress, RebuildReport};
use crate::recall::RecallHit;
use crate::retention::{SweepReport, VacuumReport};
use std::future::Future;
use std::pin::Pin;

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
    fn context_edits(
        &self,
        _id: &str,
    ) -> Result<Vec<super::records::ContextEditRecord>, StoreError> {
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
