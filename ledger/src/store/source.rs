//! What the files of the ledger are rendered from: the reads the writer's
//! transcripts, `index.md`, `SESSION.md` and `ledger rebuild` make of the
//! database, as one trait both engines implement ([`Source`]: SQLite's
//! [`rusqlite::Connection`] here, the PostgreSQL writer's connection in
//! `pg`). Everything built on it (the writer's file caches, the page fold,
//! rewriting a session's files) is written once and renders the same bytes
//! on either engine.

use super::error::StoreError;
use super::sql::{read_row, session_meta, to_i64, turn_rows, turn_summaries, ROW_COLS};
use crate::model::{Dialect, Row, SessionMeta};
use crate::page::Note;
use crate::transcript::TurnSummary;
use rusqlite::{params, Connection, OptionalExtension};
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

impl Source for Connection {
    fn session_meta(&self, session: &str) -> Result<Option<SessionMeta>, StoreError> {
        session_meta(self, session)
    }

    fn turn_rows(&self, session: &str, turn: u32) -> Result<Vec<Row>, StoreError> {
        turn_rows(self, session, turn)
    }

    fn visible_rows(&self, session: &str) -> Result<Vec<Row>, StoreError> {
        let mut stmt = self.prepare_cached(&format!(
            "SELECT {ROW_COLS} FROM rows WHERE session = ?1 AND hidden = 0 ORDER BY seq"
        ))?;
        let rows = stmt
            .query_map([session], read_row)?
            .map(|r| r.map(|(row, _)| row))
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn turn_summaries(
        &self,
        session: &str,
        dialect: Dialect,
    ) -> Result<BTreeMap<u32, TurnSummary>, StoreError> {
        turn_summaries(self, session, dialect)
    }

    fn page_notes(&self, session: &str) -> Result<Vec<Note>, StoreError> {
        let mut stmt = self.prepare_cached(
            "SELECT section, turn, text FROM page_notes WHERE session = ?1 ORDER BY id",
        )?;
        let notes = stmt
            .query_map([session], |r| {
                Ok(Note {
                    section: r.get(0)?,
                    turn: r.get::<_, i64>(1)?.max(0) as u32,
                    text: r.get(2)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(notes)
    }

    fn first_prompt(&self, session: &str) -> Result<Option<(u32, String)>, StoreError> {
        Ok(self
            .prepare_cached(
                "SELECT turn, raw FROM rows WHERE session = ?1 AND hidden = 0 AND kind = 'prompt'
                 ORDER BY seq LIMIT 1",
            )?
            .query_row([session], |r| {
                Ok((r.get::<_, i64>(0)?.max(0) as u32, r.get(1)?))
            })
            .optional()?)
    }

    fn cuts_after(&self, session: &str, after: u64) -> Result<Vec<u64>, StoreError> {
        let cuts = self
            .prepare_cached(
                "SELECT DISTINCT upto_seq FROM cuts WHERE session = ?1 AND upto_seq > ?2
                 ORDER BY upto_seq",
            )?
            .query_map(params![session, to_i64(after)], |r| {
                Ok(r.get::<_, i64>(0)?.max(0) as u64)
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(cuts)
    }

    fn rows_between(
        &self,
        session: &str,
        after: u64,
        upto: u64,
    ) -> Result<Vec<(Row, bool)>, StoreError> {
        let rows = self
            .prepare_cached(&format!(
                "SELECT {ROW_COLS} FROM rows WHERE session = ?1 AND seq > ?2 AND seq <= ?3
                 ORDER BY seq"
            ))?
            .query_map(params![session, to_i64(after), to_i64(upto)], read_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn turn_after(&self, session: &str, seq: u64) -> Result<Option<u32>, StoreError> {
        Ok(self
            .prepare_cached(
                "SELECT turn FROM rows WHERE session = ?1 AND seq > ?2 ORDER BY seq LIMIT 1",
            )?
            .query_row(params![session, to_i64(seq)], |r| {
                Ok(r.get::<_, i64>(0)?.max(0) as u32)
            })
            .optional()?)
    }

    fn newest_turn(&self, session: &str) -> Result<Option<u32>, StoreError> {
        Ok(self
            .prepare_cached(
                "SELECT turn FROM rows WHERE session = ?1 AND hidden = 0 ORDER BY seq DESC LIMIT 1",
            )?
            .query_row([session], |r| Ok(r.get::<_, i64>(0)?.max(0) as u32))
            .optional()?)
    }
}
