//! Recall: read the verbatim record back, hidden branches included.
//!
//! - [`Store::recall_log`]: one session's rows, oldest first, bodies clipped
//!   to [`BODY_MAX`] characters; `pattern` is SQL `LIKE` over the row's text
//!   (`%` and `_` are wildcards); `before` keeps seqs below it; `limit` keeps
//!   the newest matches (so `--before <first seq shown>` pages back).
//! - [`Store::recall_entry`]: one row, whole.
//! - [`Store::search`]: every session, newest first; every word must appear
//!   (SQLite FTS5 over the rows' text).
//!
//! Callers settle the store first.

use crate::model::{Row, RowKind};
use crate::store::{read_row, to_i64, Store, StoreError, ROW_COLS};
use rusqlite::{params, OptionalExtension};

/// Longest body shown by [`Store::recall_log`] (characters).
pub const BODY_MAX: usize = 200;

/// One line of a recall.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallHit {
    /// Session id.
    pub session: String,
    /// Row seq.
    pub seq: u64,
    /// Turn.
    pub turn: u32,
    /// Role as sent.
    pub role: String,
    /// Row kind.
    pub kind: RowKind,
    /// Hidden by a branch (a rewind or client compaction).
    pub hidden: bool,
    /// Body: the row's text clipped to [`BODY_MAX`] (log) or a snippet with
    /// the matches in `[brackets]` (search).
    pub body: String,
}

impl RecallHit {
    /// `seq 42 · t03 · assistant · body` (`· hidden` after the role for hidden rows),
    /// prefixed by the session id when `with_session`.
    pub fn line(&self, with_session: bool) -> String {
        let mut s = String::new();
        if with_session {
            s.push_str(&self.session);
            s.push_str(" · ");
        }
        s.push_str(&format!(
            "seq {} · t{:02} · {}",
            self.seq, self.turn, self.role
        ));
        if self.hidden {
            s.push_str(" · hidden");
        }
        s.push_str(" · ");
        s.push_str(&self.body);
        s
    }
}

/// Whitespace collapsed, clipped to `max` characters (`…` marks a cut).
pub fn clip_body(text: &str, max: usize) -> String {
    crate::page::clip(&crate::page::squash(text), max)
}

/// An FTS5 query where every word must appear (each word a quoted string).
pub fn fts_query(words: &[String]) -> Option<String> {
    let terms: Vec<String> = words
        .iter()
        .flat_map(|w| w.split_whitespace())
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect();
    (!terms.is_empty()).then(|| terms.join(" AND "))
}

impl Store {
    /// One session's rows (hidden ones too), oldest first: the newest
    /// `limit` rows with `seq < before` whose text is `LIKE %pattern%`.
    pub fn recall_log(
        &self,
        session: &str,
        pattern: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RecallHit>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT r.seq, r.turn, r.role, r.kind, r.hidden, COALESCE(t.text, r.raw)
                 FROM rows r LEFT JOIN row_text t ON t.session = r.session AND t.seq = r.seq
                 WHERE r.session = ?1 AND r.seq < ?2
                   AND (?3 IS NULL OR COALESCE(t.text, r.raw) LIKE '%' || ?3 || '%')
                 ORDER BY r.seq DESC LIMIT ?4",
            )?;
            let mut hits = stmt
                .query_map(
                    params![
                        session,
                        before.map_or(i64::MAX, to_i64),
                        pattern,
                        i64::try_from(limit).unwrap_or(i64::MAX)
                    ],
                    |r| {
                        Ok(RecallHit {
                            session: session.to_string(),
                            seq: r.get::<_, i64>(0)? as u64,
                            turn: r.get::<_, i64>(1)? as u32,
                            role: r.get(2)?,
                            kind: RowKind::parse(&r.get::<_, String>(3)?).unwrap_or(RowKind::Other),
                            hidden: r.get(4)?,
                            body: clip_body(&r.get::<_, String>(5)?, BODY_MAX),
                        })
                    },
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            hits.reverse();
            Ok(hits)
        })
    }

    /// The row at `seq`, whole, with its `hidden` flag.
    pub fn recall_entry(&self, session: &str, seq: u64) -> Result<Option<(Row, bool)>, StoreError> {
        self.with_reader(|c| {
            Ok(c.query_row(
                &format!("SELECT {ROW_COLS} FROM rows WHERE session = ?1 AND seq = ?2"),
                params![session, to_i64(seq)],
                read_row,
            )
            .optional()?)
        })
    }

    /// Rows of every session containing every word, newest session first
    /// (then newest row first), at most `limit`.
    pub fn search(&self, words: &[String], limit: usize) -> Result<Vec<RecallHit>, StoreError> {
        let Some(query) = fts_query(words) else {
            return Ok(Vec::new());
        };
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT t.session, t.seq, r.turn, r.role, r.kind, r.hidden,
                        snippet(row_fts, 0, '[', ']', '…', 16)
                 FROM row_fts
                 JOIN row_text t ON t.id = row_fts.rowid
                 JOIN rows r ON r.session = t.session AND r.seq = t.seq
                 JOIN sessions s ON s.id = t.session
                 WHERE row_fts MATCH ?1
                 ORDER BY s.last_ms DESC, s.rowid DESC, t.seq DESC
                 LIMIT ?2",
            )?;
            let hits = stmt
                .query_map(
                    params![query, i64::try_from(limit).unwrap_or(i64::MAX)],
                    |r| {
                        Ok(RecallHit {
                            session: r.get(0)?,
                            seq: r.get::<_, i64>(1)? as u64,
                            turn: r.get::<_, i64>(2)? as u32,
                            role: r.get(3)?,
                            kind: RowKind::parse(&r.get::<_, String>(4)?).unwrap_or(RowKind::Other),
                            hidden: r.get(5)?,
                            body: clip_body(&r.get::<_, String>(6)?, BODY_MAX),
                        })
                    },
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(hits)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fts_terms_are_quoted() {
        assert_eq!(
            fts_query(&["foo bar".into(), "a\"b".into()]).as_deref(),
            Some("\"foo\" AND \"bar\" AND \"a\"\"b\"")
        );
        assert_eq!(fts_query(&[]), None);
    }

    #[test]
    fn bodies_are_clipped() {
        assert_eq!(clip_body("a\n  b", 10), "a b");
        assert_eq!(clip_body("abcdef", 4), "abc…");
    }
}
