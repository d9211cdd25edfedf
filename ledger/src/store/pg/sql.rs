//! PostgreSQL queries shared by the writer, the readers and the jobs: a
//! session's facts, rows and whole state, turn summaries, the page fold,
//! and every file of a session written from the database (the SQLite
//! engine's `sql`, `page_io` and `rebuild`, in PostgreSQL's SQL; the
//! renderers are the same pure functions, so the files are byte for byte
//! what the SQLite engine writes).

use super::super::backend::{
    kept_exchanges, sent_pointers, LoadedSession, RECALLS_LIKE, SENT_LIKE,
};
use super::super::error::{io_err, StoreError};
use super::super::page_io::write_page;
use super::super::sql::stored_dialect;
use crate::model::{Dialect, Row, RowKind, SessionMeta, Usage};
use crate::page::{Note, Page};
use crate::paths::{self, DataDir};
use crate::transcript::{self, TurnSummary};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_postgres::GenericClient;

/// A `u64` as `BIGINT` (saturating).
pub(super) fn big(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The columns [`read_row`] decodes, in order.
pub(super) const ROW_COLS: &str =
    "seq, role, kind, raw, tokens, turn, step, branch, from_response, hidden";

/// Decode a row selected with [`ROW_COLS`]; also returns `hidden`.
pub(super) fn read_row(r: &tokio_postgres::Row) -> (Row, bool) {
    let kind: String = r.get(2);
    let raw: String = r.get(3);
    (
        Row {
            seq: r.get::<_, i64>(0).max(0) as u64,
            role: r.get(1),
            kind: RowKind::parse(&kind).unwrap_or(RowKind::Other),
            raw: Arc::from(raw),
            tokens: r.get::<_, i64>(4).max(0) as u32,
            turn: r.get::<_, i64>(5).max(0) as u32,
            step: r.get::<_, i64>(6).max(0) as u32,
            branch: r.get::<_, i64>(7).max(0) as u32,
            from_response: r.get(8),
        },
        r.get(9),
    )
}

/// A session's facts.
pub(super) async fn session_meta<C: GenericClient>(
    c: &C,
    id: &str,
) -> Result<Option<SessionMeta>, StoreError> {
    let Some(r) = c
        .query_opt(
            "SELECT client, client_session, dialect, model, parent, created_ms, last_ms,
                    parent_seq
             FROM sessions WHERE id = $1",
            &[&id],
        )
        .await?
    else {
        return Ok(None);
    };
    let dialect: String = r.get(2);
    Ok(Some(SessionMeta {
        id: id.to_string(),
        client: r.get(0),
        client_session: r.get(1),
        dialect: stored_dialect(id, &dialect)?,
        model: r.get(3),
        parent: r.get(4),
        parent_seq: r.get::<_, Option<i64>>(7).map(|s| s.max(0) as u64),
        created_ms: r.get(5),
        last_ms: r.get(6),
    }))
}

/// A session's rows in seq order (hidden ones only when asked).
pub(super) async fn session_rows<C: GenericClient>(
    c: &C,
    id: &str,
    include_hidden: bool,
) -> Result<Vec<(Row, bool)>, StoreError> {
    let filter = if include_hidden {
        ""
    } else {
        " AND NOT hidden"
    };
    let rows = c
        .query(
            &format!("SELECT {ROW_COLS} FROM rows WHERE session = $1{filter} ORDER BY seq"),
            &[&id],
        )
        .await?;
    Ok(rows.iter().map(read_row).collect())
}

/// A whole session as committed (None = no such session).
pub(super) async fn load_session<C: GenericClient>(
    c: &C,
    id: &str,
) -> Result<Option<LoadedSession>, StoreError> {
    let Some(meta) = session_meta(c, id).await? else {
        return Ok(None);
    };
    let mut rows = Vec::new();
    let mut hidden = Vec::new();
    for (row, is_hidden) in session_rows(c, id, true).await? {
        if is_hidden {
            hidden.push(row.seq);
        }
        rows.push(row);
    }
    let r = c
        .query_one(
            "SELECT s.cut_upto,
                COALESCE((SELECT branch FROM branches b WHERE b.session = s.id
                          ORDER BY b.ord DESC LIMIT 1), 0),
                COALESCE((SELECT MAX(step) FROM steps t WHERE t.session = s.id), 0),
                s.line_override
             FROM sessions s WHERE s.id = $1",
            &[&id],
        )
        .await?;
    let last_usage = c
        .query_opt(
            "SELECT input, output, cache_read, cache_write FROM steps
             WHERE session = $1 AND input + output + cache_read + cache_write > 0
             ORDER BY step DESC LIMIT 1",
            &[&id],
        )
        .await?
        .map(|u| Usage {
            input: u.get::<_, i64>(0).max(0) as u64,
            output: u.get::<_, i64>(1).max(0) as u64,
            cache_read: u.get::<_, i64>(2).max(0) as u64,
            cache_write: u.get::<_, i64>(3).max(0) as u64,
        });
    let context = c
        .query_opt(
            "SELECT n, set_json FROM context_edits WHERE session = $1 ORDER BY n DESC LIMIT 1",
            &[&id],
        )
        .await?
        .map(|r| (r.get::<_, i64>(0).max(0) as u32, r.get::<_, String>(1)));
    let details = c
        .query(
            "SELECT detail FROM steps WHERE session = $1 AND detail LIKE $2 ORDER BY step",
            &[&id, &RECALLS_LIKE],
        )
        .await?;
    let details: Vec<String> = details.iter().map(|r| r.get(0)).collect();
    let exchanges = kept_exchanges(details.iter().map(String::as_str));
    // The compress pointers the newest recorded window sent.
    let newest: Option<String> = c
        .query_opt(
            "SELECT detail FROM steps WHERE session = $1 AND detail LIKE $2
             ORDER BY step DESC LIMIT 1",
            &[&id, &SENT_LIKE],
        )
        .await?
        .map(|r| r.get(0));
    let named = match newest
        .as_deref()
        .and_then(|d| serde_json::from_str::<crate::model::StepDetail>(d).ok())
        .and_then(|d| d.sent)
    {
        Some(s) if s.pointers.is_none() && s.pointers_step > 0 => c
            .query_opt(
                "SELECT detail FROM steps WHERE session = $1 AND step = $2",
                &[&id, &i64::from(s.pointers_step)],
            )
            .await?
            .and_then(|r| r.get::<_, Option<String>>(0)),
        _ => None,
    };
    let pointers = sent_pointers(newest.as_deref(), |_| named);
    Ok(Some(LoadedSession {
        context,
        exchanges,
        pointers,
        line_override: r.get(3),
        meta,
        rows,
        hidden,
        branch: r.get::<_, i64>(1).max(0) as u32,
        cut_upto: r.get::<_, i64>(0).max(0) as u64,
        last_usage,
        steps: r.get::<_, i64>(2).max(0) as u32,
    }))
}

/// Visible rows of one turn, by seq.
pub(super) async fn turn_rows<C: GenericClient>(
    c: &C,
    session: &str,
    turn: u32,
) -> Result<Vec<Row>, StoreError> {
    let rows = c
        .query(
            &format!(
                "SELECT {ROW_COLS} FROM rows WHERE session = $1 AND turn = $2 AND NOT hidden
                 ORDER BY seq"
            ),
            &[&session, &i64::from(turn)],
        )
        .await?;
    Ok(rows.iter().map(|r| read_row(r).0).collect())
}

/// Turn summaries of the active line (as [`transcript::summarize_turn`]
/// computes them from every turn's rows).
pub(super) async fn turn_summaries<C: GenericClient>(
    c: &C,
    session: &str,
    dialect: Dialect,
) -> Result<BTreeMap<u32, TurnSummary>, StoreError> {
    let mut out = BTreeMap::new();
    for r in c
        .query(
            "SELECT turn, MIN(seq), MAX(seq), SUM(tokens)::bigint FROM rows
             WHERE session = $1 AND NOT hidden GROUP BY turn",
            &[&session],
        )
        .await?
    {
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
    for r in c
        .query(
            "SELECT turn, raw FROM rows WHERE session = $1 AND NOT hidden AND kind = 'prompt'
             ORDER BY turn, seq",
            &[&session],
        )
        .await?
    {
        prompts
            .entry(r.get::<_, i64>(0).max(0) as u32)
            .or_default()
            .push(r.get(1));
    }
    for (turn, raws) in prompts {
        if let Some(s) = out.get_mut(&turn) {
            s.first_line = transcript::prompt_first_line(dialect, raws.iter().map(String::as_str));
        }
    }
    Ok(out)
}

/// An empty page with the session's stored model-merged notes.
pub(super) async fn new_page<C: GenericClient>(c: &C, session: &str) -> Result<Page, StoreError> {
    let mut page = Page::new();
    let notes = c
        .query(
            "SELECT section, turn, text FROM page_notes WHERE session = $1 ORDER BY id",
            &[&session],
        )
        .await?
        .iter()
        .map(|r| Note {
            section: r.get(0),
            turn: r.get::<_, i64>(1).max(0) as u32,
            text: r.get(2),
        })
        .collect::<Vec<_>>();
    page.add_notes(notes);
    Ok(page)
}

/// Fold into `page` the goal and the rows of every recorded cut not yet
/// merged, block by block (the rule of the SQLite engine's
/// `page_io::advance_page`). Returns
/// whether anything changed.
pub(super) async fn advance_page<C: GenericClient>(
    c: &C,
    session: &str,
    dialect: Dialect,
    page: &mut Page,
) -> Result<bool, StoreError> {
    let mut changed = false;
    if !page.has_goal() {
        if let Some(r) = c
            .query_opt(
                "SELECT turn, raw FROM rows WHERE session = $1 AND NOT hidden AND kind = 'prompt'
                 ORDER BY seq LIMIT 1",
                &[&session],
            )
            .await?
        {
            let raw: String = r.get(1);
            page.set_goal(dialect, r.get::<_, i64>(0).max(0) as u32, &raw);
            changed = true;
        }
    }
    // Block by block: each recorded cut past what is merged folds the rows
    // it took, stamped with their turn.
    let cuts: Vec<i64> = c
        .query(
            "SELECT DISTINCT upto_seq FROM cuts WHERE session = $1 AND upto_seq > $2
             ORDER BY upto_seq",
            &[&session, &big(page.merged_upto_seq())],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let Some(&upto) = cuts.last() else {
        return Ok(changed);
    };
    for cut in cuts {
        let mut turns: BTreeMap<u32, Vec<(Row, bool)>> = BTreeMap::new();
        for r in c
            .query(
                &format!(
                    "SELECT {ROW_COLS} FROM rows WHERE session = $1 AND seq > $2 AND seq <= $3
                     ORDER BY seq"
                ),
                &[&session, &big(page.merged_upto_seq()), &cut],
            )
            .await?
        {
            let (row, hidden) = read_row(&r);
            turns.entry(row.turn).or_default().push((row, hidden));
        }
        for (turn, rows) in turns {
            page.merge_turn(dialect, turn, &rows);
            changed = true;
        }
        page.set_merged_upto(cut.max(0) as u64);
    }
    // Turns wholly past the tideline (what the model merge takes).
    let open: Option<i64> = c
        .query_opt(
            "SELECT turn FROM rows WHERE session = $1 AND seq > $2 ORDER BY seq LIMIT 1",
            &[&session, &upto],
        )
        .await?
        .map(|r| r.get(0));
    let newest: Option<i64> = c
        .query_opt(
            "SELECT turn FROM rows WHERE session = $1 AND NOT hidden ORDER BY seq DESC LIMIT 1",
            &[&session],
        )
        .await?
        .map(|r| r.get(0));
    let limit = open.unwrap_or(i64::MAX).min(newest.unwrap_or(0));
    page.set_whole_through(u32::try_from(limit.saturating_sub(1).max(0)).unwrap_or(u32::MAX));
    Ok(changed)
}

/// What [`write_session_files`] wrote.
pub(super) struct FilesWritten {
    pub(super) turns: u32,
    pub(super) removed: u32,
    pub(super) page: bool,
}

/// Write every file of a session from the database into this machine's
/// data dir: each turn file of the active line, `index.md` (turn files the
/// line no longer has removed) and `SESSION.md`.
pub(super) async fn write_session_files<C: GenericClient>(
    c: &C,
    dir: &DataDir,
    session: &str,
) -> Result<FilesWritten, StoreError> {
    let meta = session_meta(c, session)
        .await?
        .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
    let dialect = meta.dialect;
    let mut visible: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
    for (row, _) in session_rows(c, session, false).await? {
        visible.entry(row.turn).or_default().push(row);
    }
    let mut out = FilesWritten {
        turns: 0,
        removed: 0,
        page: false,
    };
    let tdir = dir.transcript_dir(session);
    paths::create_private_dir_all(&tdir).map_err(io_err(&tdir))?;
    let mut summaries = Vec::with_capacity(visible.len());
    for (turn, rows) in &visible {
        let path = dir.turn_file(session, *turn);
        let (text, index) = transcript::render_turn_indexed(dialect, *turn, rows);
        paths::write_atomic(&path, text.as_bytes()).map_err(io_err(&path))?;
        let path = dir.rows_file(session, *turn);
        paths::write_atomic(&path, index.render().as_bytes()).map_err(io_err(&path))?;
        if let Some(s) = transcript::summarize_turn(dialect, *turn, rows) {
            summaries.push(s);
        }
        out.turns += 1;
    }
    let entries = std::fs::read_dir(&tdir).map_err(io_err(&tdir))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some(stem) = name.strip_suffix(".md") else {
            continue;
        };
        let (stem, sidecar) = match stem.strip_suffix(".rows") {
            Some(s) => (s, true),
            None => (stem, false),
        };
        let Ok(turn) = stem.parse::<u32>() else {
            continue;
        };
        if stem.len() >= 4 && !visible.contains_key(&turn) {
            paths::remove_if_exists(&entry.path()).map_err(io_err(&entry.path()))?;
            out.removed += u32::from(!sidecar);
        }
    }
    let path = dir.index_file(session);
    paths::write_atomic(
        &path,
        transcript::render_index(&meta, &summaries).as_bytes(),
    )
    .map_err(io_err(&path))?;
    let mut page = new_page(c, session).await?;
    advance_page(c, session, dialect, &mut page).await?;
    out.page = write_page(dir, session, &page, &mut None)?;
    Ok(out)
}
