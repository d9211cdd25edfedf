//! SQLite's [`Source`]: the reads the files of the ledger are rendered
//! from, on a [`rusqlite::Connection`].

use super::sql::{read_row, session_meta, turn_rows, turn_summaries, ROW_COLS};
use crate::model::{Dialect, Row, SessionMeta};
use crate::page::Note;
use crate::store::common::to_i64;
use crate::store::error::StoreError;
use crate::store::source::Source;
use crate::transcript::TurnSummary;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeMap;

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
