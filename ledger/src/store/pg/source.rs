//! The PostgreSQL writer's reads for the files ([`Source`]): the SQLite
//! engine's queries in PostgreSQL's SQL, on the writer's own connection
//! and prepared once, waited for on the writer's thread. The files
//! rendered from them are byte for byte what the SQLite engine writes.

use super::super::error::StoreError;
use super::super::source::Source;
use super::sql::{big, read_row, session_meta, ROW_COLS, TURN_ROWS};
use super::writer::PgDb;
use crate::model::{Dialect, Row, SessionMeta};
use crate::page::Note;
use crate::transcript::{self, TurnSummary};
use std::collections::BTreeMap;
use std::sync::LazyLock;
use tokio_postgres::types::ToSql;

static VISIBLE_ROWS: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {ROW_COLS} FROM rows WHERE session = $1 AND NOT hidden ORDER BY seq")
});
static ROWS_BETWEEN: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {ROW_COLS} FROM rows WHERE session = $1 AND seq > $2 AND seq <= $3 ORDER BY seq"
    )
});

impl PgDb {
    /// Run one prepared query on the writer's connection and wait for it.
    fn rows(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let c = self.client()?;
        self.rt.block_on(async {
            let s = self.stmts.get(c, sql).await?;
            Ok(c.query(&s, params).await?)
        })
    }
}

impl Source for PgDb {
    fn session_meta(&self, session: &str) -> Result<Option<SessionMeta>, StoreError> {
        let c = self.client()?;
        self.rt.block_on(session_meta(c, session))
    }

    fn turn_rows(&self, session: &str, turn: u32) -> Result<Vec<Row>, StoreError> {
        Ok(self
            .rows(&TURN_ROWS, &[&session, &i64::from(turn)])?
            .iter()
            .map(|r| read_row(r).0)
            .collect())
    }

    fn visible_rows(&self, session: &str) -> Result<Vec<Row>, StoreError> {
        Ok(self
            .rows(&VISIBLE_ROWS, &[&session])?
            .iter()
            .map(|r| read_row(r).0)
            .collect())
    }

    fn turn_summaries(
        &self,
        session: &str,
        dialect: Dialect,
    ) -> Result<BTreeMap<u32, TurnSummary>, StoreError> {
        let mut out = BTreeMap::new();
        for r in self.rows(
            "SELECT turn, MIN(seq), MAX(seq), SUM(tokens)::bigint FROM rows
             WHERE session = $1 AND NOT hidden GROUP BY turn",
            &[&session],
        )? {
            let turn = r.get::<_, i64>(0).max(0) as u32;
            out.insert(
                turn,
                TurnSummary {
                    turn,
                    first_seq: r.get::<_, i64>(1).max(0) as u64,
                    last_seq: r.get::<_, i64>(2).max(0) as u64,
                    first_line: String::new(),
                    tokens: r.get::<_, i64>(3).max(0) as u64,
                },
            );
        }
        let mut prompts: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for r in self.rows(
            "SELECT turn, raw FROM rows WHERE session = $1 AND NOT hidden AND kind = 'prompt'
             ORDER BY turn, seq",
            &[&session],
        )? {
            prompts
                .entry(r.get::<_, i64>(0).max(0) as u32)
                .or_default()
                .push(r.get(1));
        }
        for (turn, raws) in prompts {
            if let Some(s) = out.get_mut(&turn) {
                s.first_line =
                    transcript::prompt_first_line(dialect, raws.iter().map(String::as_str));
            }
        }
        Ok(out)
    }

    fn page_notes(&self, session: &str) -> Result<Vec<Note>, StoreError> {
        Ok(self
            .rows(
                "SELECT section, turn, text FROM page_notes WHERE session = $1 ORDER BY id",
                &[&session],
            )?
            .iter()
            .map(|r| Note {
                section: r.get(0),
                turn: r.get::<_, i64>(1).max(0) as u32,
                text: r.get(2),
            })
            .collect())
    }

    fn first_prompt(&self, session: &str) -> Result<Option<(u32, String)>, StoreError> {
        Ok(self
            .rows(
                "SELECT turn, raw FROM rows WHERE session = $1 AND NOT hidden AND kind = 'prompt'
                 ORDER BY seq LIMIT 1",
                &[&session],
            )?
            .first()
            .map(|r| (r.get::<_, i64>(0).max(0) as u32, r.get(1))))
    }

    fn cuts_after(&self, session: &str, after: u64) -> Result<Vec<u64>, StoreError> {
        Ok(self
            .rows(
                "SELECT DISTINCT upto_seq FROM cuts WHERE session = $1 AND upto_seq > $2
                 ORDER BY upto_seq",
                &[&session, &big(after)],
            )?
            .iter()
            .map(|r| r.get::<_, i64>(0).max(0) as u64)
            .collect())
    }

    fn rows_between(
        &self,
        session: &str,
        after: u64,
        upto: u64,
    ) -> Result<Vec<(Row, bool)>, StoreError> {
        Ok(self
            .rows(&ROWS_BETWEEN, &[&session, &big(after), &big(upto)])?
            .iter()
            .map(read_row)
            .collect())
    }

    fn turn_after(&self, session: &str, seq: u64) -> Result<Option<u32>, StoreError> {
        Ok(self
            .rows(
                "SELECT turn FROM rows WHERE session = $1 AND seq > $2 ORDER BY seq LIMIT 1",
                &[&session, &big(seq)],
            )?
            .first()
            .map(|r| r.get::<_, i64>(0).max(0) as u32))
    }

    fn newest_turn(&self, session: &str) -> Result<Option<u32>, StoreError> {
        Ok(self
            .rows(
                "SELECT turn FROM rows WHERE session = $1 AND NOT hidden ORDER BY seq DESC LIMIT 1",
                &[&session],
            )?
            .first()
            .map(|r| r.get::<_, i64>(0).max(0) as u32))
    }
}
