//! Applying one event inside the writer's transaction: the SQLite SQL of
//! each [`Event`], run synchronously under the event's savepoint. What the
//! event means (the checks, its outcome) is decided in `store/apply.rs`.

use super::sql::session_exists;
use crate::model::{ByteString, Event, SessionMeta};
use crate::store::apply::{
    check_rows, confirmed, hidden, known_next_seq, next_after, rows_written, session_written,
    unknown_session,
};
use crate::store::common::{now_ms, to_i64};
use crate::store::effects::{Known, Outcome};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::sync::Arc;

/// Full-text indexing deferred to the end of a batch: FTS5 flushes its
/// pending segment at every savepoint, so indexing inside the per-event
/// savepoints made every event a flush (and merges). Indexed once per batch,
/// in the same transaction, it flushes once. The session id is shared by
/// every row of an event (a cold open queues thousands).
pub(super) struct FtsJob {
    pub(super) session: Arc<str>,
    pub(super) seq: u64,
    pub(super) raw: ByteString,
}

/// Mark rows hidden (a branch, or rows a sibling took): the turns they are
/// in are rewritten and the cached ones dropped.
fn hide(c: &Connection, session: &str, seqs: &[u64]) -> rusqlite::Result<Outcome> {
    let mut stmt = c.prepare_cached(
        "UPDATE rows SET hidden = 1 WHERE session = ?1 AND seq = ?2 RETURNING turn",
    )?;
    let mut turns = Vec::new();
    for seq in seqs {
        if let Some(t) = stmt
            .query_row(params![session, to_i64(*seq)], |r| r.get::<_, i64>(0))
            .optional()?
        {
            turns.push(t);
        }
    }
    Ok(hidden(turns))
}

/// Apply one event (inside the batch's savepoint for it).
pub(super) fn apply_event(
    c: &Connection,
    ev: &Event,
    fts: &mut Vec<FtsJob>,
    known: &HashMap<String, Known>,
) -> rusqlite::Result<Outcome> {
    if !matches!(ev, Event::Session(_))
        && !known.contains_key(ev.session())
        && !session_exists(c, ev.session())?
    {
        return Ok(unknown_session());
    }
    match ev {
        Event::Session(m) => {
            let json = serde_json::to_string(m).unwrap_or_default();
            c.prepare_cached(
                "INSERT INTO sessions (id, client, client_session, dialect, model, parent,
                                       created_ms, last_ms, meta_json, parent_seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT(id) DO UPDATE SET
                    client = excluded.client, client_session = excluded.client_session,
                    dialect = excluded.dialect, model = excluded.model, parent = excluded.parent,
                    last_ms = MAX(last_ms, excluded.last_ms), meta_json = excluded.meta_json,
                    parent_seq = excluded.parent_seq",
            )?
            .execute(params![
                m.id,
                m.client,
                m.client_session,
                m.dialect.as_str(),
                m.model,
                m.parent,
                m.created_ms,
                m.last_ms,
                json,
                m.parent_seq.map(to_i64)
            ])?;
            // Read back: created_ms is kept from the first upsert.
            let meta = SessionMeta {
                created_ms: c.query_row(
                    "SELECT created_ms FROM sessions WHERE id = ?1",
                    [&m.id],
                    |r| r.get(0),
                )?,
                ..m.clone()
            };
            Ok(session_written(meta))
        }
        Event::Rows { session, rows } => {
            if rows.is_empty() {
                return Ok(Outcome::quiet());
            }
            let expected = match known_next_seq(known, session) {
                Some(n) => n,
                None => next_after(
                    c.prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM rows WHERE session = ?1")?
                        .query_row([session], |r| r.get(0))?,
                ),
            };
            if let Some(refused) = check_rows(rows, expected) {
                return Ok(refused);
            }
            let mut stmt = c.prepare_cached(
                "INSERT INTO rows (session, seq, branch, role, kind, turn, step, tokens, raw,
                                   from_response)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?;
            let sid: Arc<str> = Arc::from(session.as_str());
            fts.reserve(rows.len());
            for r in rows {
                stmt.execute(params![
                    session,
                    to_i64(r.seq),
                    r.branch,
                    r.role,
                    r.kind.as_str(),
                    r.turn,
                    r.step,
                    r.tokens,
                    &*r.raw,
                    r.from_response
                ])?;
                fts.push(FtsJob {
                    session: sid.clone(),
                    seq: r.seq,
                    raw: r.raw.clone(),
                });
            }
            Ok(rows_written(rows))
        }
        Event::Confirm { session, seq, raw } => {
            let hit: Option<(i64, bool)> = c
                .prepare_cached(
                    "UPDATE rows SET raw = ?3, from_response = 0 WHERE session = ?1 AND seq = ?2
                     RETURNING turn, hidden",
                )?
                .query_row(params![session, to_i64(*seq), &**raw], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            if hit.is_some() {
                fts.push(FtsJob {
                    session: Arc::from(session.as_str()),
                    seq: *seq,
                    raw: ByteString::from(&**raw),
                });
            }
            Ok(confirmed(*seq, raw, hit))
        }
        Event::Branch {
            session,
            at_seq,
            branch,
            hidden,
        } => {
            c.prepare_cached(
                "INSERT OR REPLACE INTO branches (session, branch, at_seq, hidden, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                session,
                branch,
                to_i64(*at_seq),
                hidden.len() as i64,
                now_ms()
            ])?;
            hide(c, session, hidden)
        }
        Event::Hide { session, seqs } => hide(c, session, seqs),
        Event::Step {
            session,
            step,
            model,
            status,
            usage,
            window_rows,
            ts_ms,
            error,
            detail,
        } => {
            let detail = detail.stored();
            c.prepare_cached(
                "INSERT OR REPLACE INTO steps (session, step, model, status, input, output,
                    cache_read, cache_write, window_rows, ts_ms, error, detail)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )?
            .execute(params![
                session,
                step,
                model,
                status,
                to_i64(usage.input),
                to_i64(usage.output),
                to_i64(usage.cache_read),
                to_i64(usage.cache_write),
                window_rows,
                ts_ms,
                error,
                detail
            ])?;
            c.prepare_cached("UPDATE sessions SET last_ms = MAX(last_ms, ?2) WHERE id = ?1")?
                .execute(params![session, ts_ms])?;
            Ok(Outcome::quiet())
        }
        Event::Cut {
            session,
            upto_seq,
            gauge,
            line,
            ts_ms,
        } => {
            c.prepare_cached(
                "INSERT INTO cuts (session, upto_seq, gauge, line, ts_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                session,
                to_i64(*upto_seq),
                to_i64(*gauge),
                to_i64(*line),
                ts_ms
            ])?;
            c.prepare_cached("UPDATE sessions SET cut_upto = ?2 WHERE id = ?1")?
                .execute(params![session, to_i64(*upto_seq)])?;
            Ok(Outcome::quiet())
        }
        Event::Line {
            session,
            line,
            spec,
            overridden,
            ts_ms,
        } => {
            c.prepare_cached(
                "UPDATE sessions SET line = ?2, line_spec = ?3, line_ms = ?4, line_override = ?5
                 WHERE id = ?1",
            )?
            .execute(params![session, to_i64(*line), spec, ts_ms, overridden])?;
            Ok(Outcome::quiet())
        }
        Event::ContextEdit {
            session,
            n,
            set,
            seqs,
            tokens_before,
            tokens_after,
            ts_ms,
        } => {
            c.prepare_cached(
                "INSERT OR REPLACE INTO context_edits
                    (session, n, ts_ms, set_json, seqs_json, tokens_before, tokens_after)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                session,
                n,
                ts_ms,
                set,
                serde_json::to_string(seqs).unwrap_or_default(),
                to_i64(*tokens_before),
                to_i64(*tokens_after)
            ])?;
            Ok(Outcome::quiet())
        }
    }
}
