//! What the files of the ledger are rendered from: the reads the writer's
//! transcripts, `index.md`, `SESSION.md` and `ledger rebuild` make of the
//! database, as one trait both engines implement ([`Source`]: SQLite's
//! [`rusqlite::Connection`] in `lite`, the PostgreSQL writer's connection
//! in `pg`). Everything built on it (the writer's file caches, the page fold,
//! rewriting a session's files) is written once and renders the same bytes
//! on either engine.

use super::error::StoreError;
use crate::model::{Dialect, Row, SessionMeta};
use crate::page::Note;
use crate::transcript::TurnSummary;
use std::collections::BTreeMap;

/// The database reads the ledger's files are rendered from. Every method
/// reads committed state of one session.
pub(crate) trait Source {
    /// The session's facts (None = no such session).
    fn session_meta(&self, session: &str) -> Result<Option<SessionMeta>, StoreError>;
    /// The visible rows of one turn, by seq.
    fn turn_rows(&self, session: &str, turn: u32) -> Result<Vec<Row>, StoreError>;
    /// Every visible row (the active line), by seq.
    fn visible_rows(&self, session: &str) -> Result<Vec<Row>, StoreError>;
    /// Turn summaries of the active line, as
    /// [`crate::transcript::summarize_turn`] computes them from each turn's rows.
    fn turn_summaries(
        &self,
        session: &str,
        dialect: Dialect,
    ) -> Result<BTreeMap<u32, TurnSummary>, StoreError>;
    /// The model-merged lines stored for `SESSION.md`, in the order written.
    fn page_notes(&self, session: &str) -> Result<Vec<Note>, StoreError>;
    /// The first prompt on the active line: its turn and raw JSON.
    fn first_prompt(&self, session: &str) -> Result<Option<(u32, String)>, StoreError>;
    /// The distinct `upto_seq` of the recorded cuts past `after`, ascending.
    fn cuts_after(&self, session: &str, after: u64) -> Result<Vec<u64>, StoreError>;
    /// The rows (hidden ones too, flagged) with `after < seq <= upto`, by seq.
    fn rows_between(
        &self,
        session: &str,
        after: u64,
        upto: u64,
    ) -> Result<Vec<(Row, bool)>, StoreError>;
    /// The turn of the first row (hidden or not) after `seq`.
    fn turn_after(&self, session: &str, seq: u64) -> Result<Option<u32>, StoreError>;
    /// The turn of the newest visible row.
    fn newest_turn(&self, session: &str) -> Result<Option<u32>, StoreError>;
}
