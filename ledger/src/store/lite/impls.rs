//! The backend traits for the SQLite engine: each method is the inherent
//! one of [`Store`] (kept so callers need no trait import).

use super::Store;
use crate::model::{Event, Row, SessionMeta};
use crate::page::Note;
use crate::paths::DataDir;
use crate::rebuild::{Progress, RebuildReport};
use crate::recall::RecallHit;
use crate::retention::{SweepReport, VacuumReport};
use crate::store::backend::{
    Behind, CutRecord, Health, LedgerRead, LedgerStore, LedgerWrite, LineRecord, LoadedSession,
    SessionSummary, SettleFuture, StepRecord, StoreMetrics,
};
use crate::store::error::StoreError;

impl LedgerWrite for Store {
    fn submit(&self, ev: Event) -> Result<(), StoreError> {
        Store::submit(self, ev)
    }
    fn settle(&self) -> SettleFuture<'_> {
        Box::pin(Store::settle(self))
    }
    fn settle_blocking(&self) -> Result<(), StoreError> {
        Store::settle_blocking(self)
    }
    fn settle_within(&self, wait: std::time::Duration) -> Result<bool, StoreError> {
        Store::settle_within(self, wait)
    }
    fn health(&self) -> Health {
        Store::health(self)
    }
    fn metrics(&self) -> StoreMetrics {
        Store::metrics(self)
    }
    fn behind_count(&self) -> usize {
        Store::behind_count(self)
    }
    fn behind(&self, session: &str) -> Option<Behind> {
        Store::behind(self, session)
    }
    fn behind_sessions(&self) -> Vec<(String, Behind)> {
        Store::behind_sessions(self)
    }
    fn resync(&self, session: &str) -> Result<Option<LoadedSession>, StoreError> {
        Store::resync(self, session)
    }
    fn restore_client(&self, key: &str) -> Result<Vec<LoadedSession>, StoreError> {
        Store::restore_client(self, key)
    }
    fn shutdown(&self) -> Result<(), StoreError> {
        Store::shutdown(self)
    }
}

impl LedgerRead for Store {
    fn data_dir(&self) -> &DataDir {
        Store::data_dir(self)
    }
    fn list_sessions(&self) -> Result<Vec<SessionSummary>, StoreError> {
        Store::list_sessions(self)
    }
    fn session_summary(&self, id: &str) -> Result<Option<SessionSummary>, StoreError> {
        Store::session_summary(self, id)
    }
    fn sessions_for_client(&self, key: &str) -> Result<Vec<String>, StoreError> {
        Store::sessions_for_client(self, key)
    }
    fn latest_session(&self) -> Result<Option<String>, StoreError> {
        Store::latest_session(self)
    }
    fn resolve_session(&self, spec: Option<&str>) -> Result<String, StoreError> {
        Store::resolve_session(self, spec)
    }
    fn session_candidates(&self) -> Result<Vec<crate::resolve::Candidate>, StoreError> {
        Store::session_candidates(self)
    }
    fn session_meta(&self, id: &str) -> Result<Option<SessionMeta>, StoreError> {
        Store::session_meta(self, id)
    }
    fn session_rows(&self, id: &str, include_hidden: bool) -> Result<Vec<(Row, bool)>, StoreError> {
        Store::session_rows(self, id, include_hidden)
    }
    fn steps(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        Store::steps(self, id)
    }
    fn cuts(&self, id: &str) -> Result<Vec<CutRecord>, StoreError> {
        Store::cuts(self, id)
    }
    fn context_edits(
        &self,
        id: &str,
    ) -> Result<Vec<crate::store::backend::ContextEditRecord>, StoreError> {
        Store::context_edits(self, id)
    }
    fn recorded_line(&self, id: &str) -> Result<Option<LineRecord>, StoreError> {
        Store::recorded_line(self, id)
    }
    fn merge_uses(&self, id: &str) -> Result<Vec<crate::merge::MergeUse>, StoreError> {
        Store::merge_uses(self, id)
    }
    fn load_session(&self, id: &str) -> Result<Option<LoadedSession>, StoreError> {
        Store::load_session(self, id)
    }
    fn recall_log(
        &self,
        session: &str,
        pattern: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RecallHit>, StoreError> {
        Store::recall_log(self, session, pattern, before, limit)
    }
    fn recall_entry(&self, session: &str, seq: u64) -> Result<Option<(Row, bool)>, StoreError> {
        Store::recall_entry(self, session, seq)
    }
    fn search_in(
        &self,
        words: &[String],
        limit: usize,
        scope: crate::recall::Scope<'_>,
    ) -> Result<Vec<RecallHit>, StoreError> {
        Store::search_in(self, words, limit, scope)
    }
    fn row_lines(
        &self,
        session: &str,
        seq: u64,
    ) -> Result<Option<crate::transcript::RowLines>, StoreError> {
        Store::row_lines(self, session, seq)
    }
}

impl LedgerStore for Store {
    fn rebuild(
        &self,
        session: &str,
        progress: Option<Progress>,
    ) -> Result<RebuildReport, StoreError> {
        Store::rebuild(self, session, progress)
    }
    fn sweep_at(&self, days: u32, now_ms: i64) -> Result<SweepReport, StoreError> {
        Store::sweep_at(self, days, now_ms)
    }
    fn vacuum(&self) -> Result<VacuumReport, StoreError> {
        Store::vacuum(self)
    }
    fn add_page_notes(&self, session: &str, notes: Vec<Note>) -> Result<(), StoreError> {
        Store::add_page_notes(self, session, notes)
    }
    fn page_backlog(&self, session: &str) -> Result<(u32, u32), StoreError> {
        Store::page_backlog(self, session)
    }
}
