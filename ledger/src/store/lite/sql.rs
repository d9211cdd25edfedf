//! SQLite's SQL helpers, shared by its writer, readers, rebuild and
//! retention: row decoding, a session's facts and rows, turn summaries and
//! the bulk search-index writer.

use crate::model::{Dialect, Row, RowKind, SessionMeta, Usage};
use crate::parts;
use crate::store::common::stored_dialect;
use crate::store::error::StoreError;
use crate::store::records::{
    pointers_at, pointers_of_step, LoadedSession, PointersAt, SentPointers, RECALLS_LIKE,
    RECENT_MODELS, SENT_LIKE,
};
use crate::transcript::{self, TurnSummary};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeMap;

/// A session's dialect (see [`stored_dialect`]).
pub(crate) fn session_dialect(c: &Connection, id: &str) -> Result<Dialect, StoreError> {
    let d: String = c
        .prepare_cached("SELECT dialect FROM sessions WHERE id = ?1")?
        .query_row([id], |r| r.get(0))?;
    stored_dialect(id, &d)
}

/// Whether session `id` exists.
pub(crate) fn session_exists(c: &Connection, id: &str) -> rusqlite::Result<bool> {
    c.prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")?
        .exists([id])
}

/// A session's facts.
pub(crate) fn session_meta(c: &Connection, id: &str) -> Result<Option<SessionMeta>, StoreError> {
    let row = c
        .query_row(
            "SELECT client, client_session, dialect, model, parent, created_ms, last_ms,
                    parent_seq
             FROM sessions WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, i64>(6)?,
                    r.get::<_, Option<i64>>(7)?,
                ))
            },
        )
        .optional()?;
    let Some((client, client_session, dialect, model, parent, created_ms, last_ms, parent_seq)) =
        row
    else {
        return Ok(None);
    };
    Ok(Some(SessionMeta {
        id: id.to_string(),
        client,
        client_session,
        dialect: stored_dialect(id, &dialect)?,
        model,
        parent,
        parent_seq: parent_seq.map(|s| s as u64),
        created_ms,
        last_ms,
    }))
}

/// The columns [`read_row`] decodes, in order.
pub(crate) const ROW_COLS: &str =
    "seq, role, kind, raw, tokens, turn, step, branch, from_response, hidden";

/// Decode a row selected with [`ROW_COLS`]; also returns `hidden`.
pub(crate) fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(Row, bool)> {
    let kind: String = r.get(2)?;
    let raw: String = r.get(3)?;
    Ok((
        Row {
            seq: r.get::<_, i64>(0)? as u64,
            role: r.get(1)?,
            kind: RowKind::parse(&kind).unwrap_or(RowKind::Other),
            raw: raw.into(),
            tokens: r.get::<_, i64>(4)? as u32,
            turn: r.get::<_, i64>(5)? as u32,
            step: r.get::<_, i64>(6)? as u32,
            branch: r.get::<_, i64>(7)? as u32,
            from_response: r.get(8)?,
        },
        r.get(9)?,
    ))
}

/// A whole session as committed (None = no such session).
pub(crate) fn load_session(c: &Connection, id: &str) -> Result<Option<LoadedSession>, StoreError> {
    let Some(meta) = session_meta(c, id)? else {
        return Ok(None);
    };
    let mut rows = Vec::new();
    let mut hidden = Vec::new();
    {
        let mut stmt = c.prepare(&format!(
            "SELECT {ROW_COLS} FROM rows WHERE session = ?1 ORDER BY seq"
        ))?;
        for r in stmt.query_map([id], read_row)? {
            let (row, is_hidden) = r?;
            if is_hidden {
                hidden.push(row.seq);
            }
            rows.push(row);
        }
    }
    let (cut_upto, line_override): (i64, Option<String>) = c.query_row(
        "SELECT cut_upto, line_override FROM sessions WHERE id = ?1",
        [id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let branch: i64 = c.query_row(
        "SELECT COALESCE((SELECT branch FROM branches WHERE session = ?1
                          ORDER BY rowid DESC LIMIT 1), 0)",
        [id],
        |r| r.get(0),
    )?;
    let steps: i64 = c.query_row(
        "SELECT COALESCE(MAX(step), 0) FROM steps WHERE session = ?1",
        [id],
        |r| r.get(0),
    )?;
    let last_usage = c
        .query_row(
            "SELECT input, output, cache_read, cache_write FROM steps
             WHERE session = ?1 AND input + output + cache_read + cache_write > 0
             ORDER BY step DESC LIMIT 1",
            [id],
            |r| {
                Ok(Usage {
                    input: r.get::<_, i64>(0)? as u64,
                    output: r.get::<_, i64>(1)? as u64,
                    cache_read: r.get::<_, i64>(2)? as u64,
                    cache_write: r.get::<_, i64>(3)? as u64,
                })
            },
        )
        .optional()?;
    let context = c
        .query_row(
            "SELECT n, set_json FROM context_edits WHERE session = ?1 ORDER BY n DESC LIMIT 1",
            [id],
            |r| Ok((r.get::<_, i64>(0)?.max(0) as u32, r.get::<_, String>(1)?)),
        )
        .optional()?;
    let exchanges = kept_exchanges(c, id)?;
    let pointers = sent_pointers(c, id)?;
    let models = c
        .prepare(
            "SELECT model, MAX(ts_ms) AS last_ts FROM steps WHERE session = ?1 AND model <> ''
             GROUP BY model ORDER BY last_ts DESC LIMIT ?2",
        )?
        .query_map(params![id, RECENT_MODELS as i64], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(LoadedSession {
        meta,
        rows,
        hidden,
        branch: branch as u32,
        cut_upto: cut_upto as u64,
        last_usage,
        steps: steps as u32,
        context,
        exchanges,
        pointers,
        line_override,
        models,
    }))
}

/// The compress pointers the session's newest recorded window sent
/// ([`LoadedSession::pointers`]).
fn sent_pointers(c: &Connection, id: &str) -> Result<Option<SentPointers>, StoreError> {
    let newest: Option<String> = c
        .query_row(
            "SELECT detail FROM steps WHERE session = ?1 AND detail LIKE ?2
             ORDER BY step DESC LIMIT 1",
            params![id, SENT_LIKE],
            |r| r.get(0),
        )
        .optional()?;
    Ok(match pointers_at(newest.as_deref()) {
        PointersAt::None => None,
        PointersAt::Here(p) => Some(p),
        PointersAt::Step { step, upto } => {
            let detail: Option<String> = c
                .query_row(
                    "SELECT detail FROM steps WHERE session = ?1 AND step = ?2",
                    params![id, step],
                    |r| r.get(0),
                )
                .optional()?
                .flatten();
            pointers_of_step(upto, detail.as_deref())
        }
    })
}

/// The recall tool's internal exchanges a session's steps kept, in step
/// order (only steps whose detail names recalls are read).
fn kept_exchanges(c: &Connection, id: &str) -> Result<Vec<(u64, Vec<String>)>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT detail FROM steps WHERE session = ?1 AND detail LIKE ?2 ORDER BY step",
    )?;
    let details = stmt
        .query_map(params![id, RECALLS_LIKE], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(crate::store::records::kept_exchanges(
        details.iter().map(String::as_str),
    ))
}

/// Visible rows of one turn, by seq.
pub(crate) fn turn_rows(c: &Connection, session: &str, turn: u32) -> Result<Vec<Row>, StoreError> {
    let mut stmt = c.prepare_cached(&format!(
        "SELECT {ROW_COLS} FROM rows WHERE session = ?1 AND turn = ?2 AND hidden = 0 ORDER BY seq"
    ))?;
    let rows = stmt
        .query_map(params![session, turn], read_row)?
        .map(|r| r.map(|(row, _)| row))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// Turn summaries of the active line, as [`transcript::summarize_turn`]
/// would compute them from every turn's rows.
pub(crate) fn turn_summaries(
    c: &Connection,
    session: &str,
    dialect: Dialect,
) -> Result<BTreeMap<u32, TurnSummary>, StoreError> {
    let mut out = BTreeMap::new();
    let mut stmt = c.prepare_cached(
        "SELECT turn, MIN(seq), MAX(seq), SUM(tokens) FROM rows
         WHERE session = ?1 AND hidden = 0 GROUP BY turn",
    )?;
    for r in stmt.query_map([session], |r| {
        Ok((
            r.get::<_, i64>(0)? as u32,
            r.get::<_, i64>(1)? as u64,
            r.get::<_, i64>(2)? as u64,
            r.get::<_, i64>(3)? as u64,
        ))
    })? {
        let (turn, first_seq, last_seq, tokens) = r?;
        out.insert(
            turn,
            TurnSummary {
                turn,
                first_seq,
                last_seq,
                first_line: String::new(),
                tokens,
            },
        );
    }
    let mut stmt = c.prepare_cached(
        "SELECT turn, raw FROM rows WHERE session = ?1 AND hidden = 0 AND kind = 'prompt'
         ORDER BY turn, seq",
    )?;
    let mut prompts: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for r in stmt.query_map([session], |r| {
        Ok((r.get::<_, i64>(0)? as u32, r.get::<_, String>(1)?))
    })? {
        let (turn, raw) = r?;
        prompts.entry(turn).or_default().push(raw);
    }
    for (turn, raws) in prompts {
        if let Some(s) = out.get_mut(&turn) {
            s.first_line = transcript::prompt_first_line(dialect, raws.iter().map(String::as_str));
        }
    }
    Ok(out)
}

/// Rows' plain text for the search index, written in bulk.
///
/// FTS5 writes its pending in-memory segment out at every statement
/// savepoint, and an upsert through `row_text`'s triggers takes one per
/// statement: a statement per row wrote (and then merged) a segment per row,
/// most of the writer's time on a cold 2,000-row session. Here one statement
/// carries up to [`TextBatch::CHUNK`] bytes of rows as a JSON array.
#[derive(Default)]
pub(crate) struct TextBatch {
    json: String,
    rows: usize,
}

impl TextBatch {
    /// Bytes of JSON per statement.
    const CHUNK: usize = 4 << 20;

    /// Queue one row's text (replacing what was indexed for it).
    pub(crate) fn push(
        &mut self,
        c: &Connection,
        session: &str,
        seq: u64,
        dialect: Dialect,
        raw: &str,
    ) -> rusqlite::Result<()> {
        self.json.push(if self.rows == 0 { '[' } else { ',' });
        let item = serde_json::json!([session, seq, parts::plain_text(dialect, raw)]);
        self.json.push_str(&item.to_string());
        self.rows += 1;
        if self.json.len() >= Self::CHUNK {
            self.flush(c)?;
        }
        Ok(())
    }

    /// Write what is queued.
    pub(crate) fn flush(&mut self, c: &Connection) -> rusqlite::Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        self.json.push(']');
        c.prepare_cached(
            "INSERT INTO row_text (session, seq, text)
             SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2 FROM json_each(?1) AS j WHERE 1
             ON CONFLICT(session, seq) DO UPDATE SET text = excluded.text",
        )?
        .execute([&self.json])?;
        self.json.clear();
        self.rows = 0;
        Ok(())
    }
}
