//! `ledger rebuild`: a session's transcripts, `index.md`, `SESSION.md` and
//! search index made again from the database alone (mechanical, no model
//! call). It runs the same pure renderers as the live writer, so what it
//! writes is byte for byte what the writer wrote. Also the database side of
//! the page (folding merged turns) that the writer shares.

use crate::model::{Dialect, Row};
use crate::page::{Note, Page};
use crate::paths::{self, DataDir};
use crate::store::{io_err, read_row, session_meta, to_i64, StoreError, TextBatch, ROW_COLS};
use crate::transcript;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Progress callback: `(done, total)` rows.
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// What a rebuild wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Session id.
    pub session: String,
    /// Rows read (hidden ones included).
    pub rows: u64,
    /// Turn files written.
    pub turns: u32,
    /// Stale turn files removed.
    pub removed: u32,
    /// Whether `SESSION.md` was written.
    pub page: bool,
}

/// An empty page with the session's stored model-merged notes.
pub(crate) fn new_page(c: &Connection, session: &str) -> Result<Page, StoreError> {
    let mut page = Page::new();
    let mut stmt = c.prepare_cached(
        "SELECT section, turn, text FROM page_notes WHERE session = ?1 ORDER BY id",
    )?;
    let notes = stmt
        .query_map([session], |r| {
            Ok(Note {
                section: r.get(0)?,
                turn: r.get::<_, i64>(1)? as u32,
                text: r.get(2)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    page.add_notes(notes);
    Ok(page)
}

/// Fold into `page` the goal (first ask on the active line) and every turn
/// now wholly past the tideline: a turn merges once all of its rows (hidden
/// ones too) are at or below the highest cut, and a newer turn exists on
/// the active line. Returns whether anything changed.
pub(crate) fn advance_page(
    c: &Connection,
    session: &str,
    dialect: Dialect,
    page: &mut Page,
) -> Result<bool, StoreError> {
    let mut changed = false;
    if !page.has_goal() {
        let first: Option<(i64, String)> = c
            .prepare_cached(
                "SELECT turn, raw FROM rows WHERE session = ?1 AND hidden = 0 AND kind = 'prompt'
                 ORDER BY seq LIMIT 1",
            )?
            .query_row([session], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((turn, raw)) = first {
            page.set_goal(dialect, turn as u32, &raw);
            changed = true;
        }
    }
    let upto: i64 = c
        .prepare_cached("SELECT COALESCE(MAX(upto_seq), 0) FROM cuts WHERE session = ?1")?
        .query_row([session], |r| r.get(0))?;
    let upto = upto.max(0) as u64;
    if upto <= page.merged_upto_seq() {
        return Ok(changed);
    }
    let open: Option<i64> = c
        .prepare_cached(
            "SELECT turn FROM rows WHERE session = ?1 AND seq > ?2 ORDER BY seq LIMIT 1",
        )?
        .query_row(params![session, to_i64(upto)], |r| r.get(0))
        .optional()?;
    let newest: Option<i64> = c
        .prepare_cached(
            "SELECT turn FROM rows WHERE session = ?1 AND hidden = 0 ORDER BY seq DESC LIMIT 1",
        )?
        .query_row([session], |r| r.get(0))
        .optional()?;
    let limit = open.unwrap_or(i64::MAX).min(newest.unwrap_or(0));
    if limit <= i64::from(page.merged_through()) + 1 {
        return Ok(changed);
    }
    let mut stmt = c.prepare_cached(&format!(
        "SELECT {ROW_COLS} FROM rows WHERE session = ?1 AND seq > ?2 AND turn > ?3 AND turn < ?4
         ORDER BY seq"
    ))?;
    let mut turns: BTreeMap<u32, Vec<(Row, bool)>> = BTreeMap::new();
    for r in stmt.query_map(
        params![
            session,
            to_i64(page.merged_upto_seq()),
            page.merged_through(),
            limit
        ],
        read_row,
    )? {
        let (row, hidden) = r?;
        turns.entry(row.turn).or_default().push((row, hidden));
    }
    for (turn, rows) in turns {
        page.merge_turn(dialect, turn, &rows);
        changed = true;
    }
    Ok(changed)
}

/// Write `SESSION.md` when the page has content and its bytes differ from
/// the last write (`last_hash`). Returns whether it wrote.
pub(crate) fn write_page(
    dir: &DataDir,
    session: &str,
    page: &Page,
    last_hash: &mut Option<u64>,
) -> Result<bool, StoreError> {
    if !page.has_content() {
        return Ok(false);
    }
    let text = page.render(session);
    let hash = xxhash_rust::xxh3::xxh3_64(text.as_bytes());
    if *last_hash == Some(hash) {
        return Ok(false);
    }
    let sdir = dir.session_dir(session);
    paths::create_private_dir_all(&sdir).map_err(io_err(&sdir))?;
    let path = dir.session_md(session);
    paths::write_atomic(&path, text.as_bytes()).map_err(io_err(&path))?;
    *last_hash = Some(hash);
    Ok(true)
}

/// Rebuild one session: search index, every turn file, `index.md` (stale
/// turn files removed) and `SESSION.md`. Runs on the writer thread.
pub(crate) fn rebuild_session(
    conn: &mut Connection,
    dir: &DataDir,
    session: &str,
    progress: Option<&Progress>,
) -> Result<RebuildReport, StoreError> {
    let meta = session_meta(conn, session)?
        .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
    let dialect = meta.dialect;
    let total: i64 = conn.query_row(
        "SELECT COUNT(*) FROM rows WHERE session = ?1",
        [session],
        |r| r.get(0),
    )?;
    let total = total.max(0) as u64;
    let tick = |done: u64| {
        if let Some(p) = progress {
            p(done, total);
        }
    };
    let mut report = RebuildReport {
        session: session.to_string(),
        ..RebuildReport::default()
    };
    // Every row once: the search index for all, transcripts for the active line.
    let mut visible: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
    {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute("DELETE FROM row_text WHERE session = ?1", [session])?;
        {
            let mut stmt = tx.prepare(&format!(
                "SELECT {ROW_COLS} FROM rows WHERE session = ?1 ORDER BY seq"
            ))?;
            let mut rows = stmt.query([session])?;
            let mut text = TextBatch::default();
            while let Some(r) = rows.next()? {
                let (row, hidden) = read_row(r)?;
                text.push(&tx, session, row.seq, dialect, &row.raw)?;
                report.rows += 1;
                if report.rows & 0xff == 0 {
                    tick(report.rows / 2);
                }
                if !hidden {
                    visible.entry(row.turn).or_default().push(row);
                }
            }
            text.flush(&tx)?;
        }
        tx.commit()?;
    }
    let tdir = dir.transcript_dir(session);
    paths::create_private_dir_all(&tdir).map_err(io_err(&tdir))?;
    let mut summaries = Vec::with_capacity(visible.len());
    let mut written = report.rows / 2;
    for (turn, rows) in &visible {
        let path = dir.turn_file(session, *turn);
        paths::write_atomic(
            &path,
            transcript::render_turn(dialect, *turn, rows).as_bytes(),
        )
        .map_err(io_err(&path))?;
        if let Some(s) = transcript::summarize_turn(dialect, *turn, rows) {
            summaries.push(s);
        }
        report.turns += 1;
        written += rows.len() as u64 / 2;
        tick(written);
    }
    // Turn files the active line no longer has.
    let entries = std::fs::read_dir(&tdir).map_err(io_err(&tdir))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some(stem) = name.strip_suffix(".md") else {
            continue;
        };
        let Ok(turn) = stem.parse::<u32>() else {
            continue;
        };
        if stem.len() >= 4 && !visible.contains_key(&turn) {
            paths::remove_if_exists(&entry.path()).map_err(io_err(&entry.path()))?;
            report.removed += 1;
        }
    }
    let path = dir.index_file(session);
    paths::write_atomic(
        &path,
        transcript::render_index(&meta, &summaries).as_bytes(),
    )
    .map_err(io_err(&path))?;
    let mut page = new_page(conn, session)?;
    advance_page(conn, session, dialect, &mut page)?;
    report.page = write_page(dir, session, &page, &mut None)?;
    tick(total);
    Ok(report)
}
