//! `ledger rebuild` on the SQLite engine: a session's search index, every
//! turn file, `index.md` (stale turn files removed) and `SESSION.md`, made
//! again from the database alone with the live writer's renderers, so what
//! it writes is byte for byte what the writer wrote.

use super::error::{io_err, StoreError};
use super::page_io::{advance_page, new_page, write_page};
use super::sql::{read_row, session_meta, TextBatch, ROW_COLS};
use crate::model::{Row, SessionMeta};
use crate::paths::{self, DataDir};
use crate::rebuild::{Progress, RebuildReport};
use crate::transcript;
use rusqlite::{Connection, TransactionBehavior};
use std::collections::BTreeMap;

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
    let mut written = report.rows / 2;
    let files = write_session_files(conn, dir, &meta, &visible, &mut |rows| {
        written += rows / 2;
        tick(written);
    })?;
    report.turns = files.turns;
    report.removed = files.removed;
    report.page = files.page;
    tick(total);
    Ok(report)
}

/// What [`write_session_files`] wrote.
pub(crate) struct FilesWritten {
    pub(crate) turns: u32,
    pub(crate) removed: u32,
    pub(crate) page: bool,
}

/// Write every file of a session from its active line (`visible`, by
/// turn): each turn file, `index.md` (turn files the line no longer has
/// removed) and `SESSION.md`. `done(rows)` is told after each turn.
pub(crate) fn write_session_files(
    conn: &Connection,
    dir: &DataDir,
    meta: &SessionMeta,
    visible: &BTreeMap<u32, Vec<Row>>,
    done: &mut dyn FnMut(u64),
) -> Result<FilesWritten, StoreError> {
    let session = meta.id.as_str();
    let dialect = meta.dialect;
    let mut out = FilesWritten {
        turns: 0,
        removed: 0,
        page: false,
    };
    let tdir = dir.transcript_dir(session);
    paths::create_private_dir_all(&tdir).map_err(io_err(&tdir))?;
    let mut summaries = Vec::with_capacity(visible.len());
    for (turn, rows) in visible {
        let path = dir.turn_file(session, *turn);
        let (text, index) = transcript::render_turn_indexed(dialect, *turn, rows);
        paths::write_atomic(&path, text.as_bytes()).map_err(io_err(&path))?;
        let path = dir.rows_file(session, *turn);
        paths::write_atomic(&path, index.render().as_bytes()).map_err(io_err(&path))?;
        if let Some(s) = transcript::summarize_turn(dialect, *turn, rows) {
            summaries.push(s);
        }
        out.turns += 1;
        done(rows.len() as u64);
    }
    // Turn files the active line no longer has.
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
    paths::write_atomic(&path, transcript::render_index(meta, &summaries).as_bytes())
        .map_err(io_err(&path))?;
    let mut page = new_page(conn, session)?;
    advance_page(conn, session, dialect, &mut page)?;
    out.page = write_page(dir, session, &page, &mut None)?;
    Ok(out)
}

/// Write every file of a session again from the database (the search index
/// is left alone): the writer's heal of a session whose file writes failed,
/// or whose files are missing.
pub(crate) fn rewrite_session_files(
    conn: &Connection,
    dir: &DataDir,
    session: &str,
) -> Result<FilesWritten, StoreError> {
    let meta = session_meta(conn, session)?
        .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
    let mut visible: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ROW_COLS} FROM rows WHERE session = ?1 AND hidden = 0 ORDER BY seq"
    ))?;
    for r in stmt.query_map([session], read_row)? {
        let (row, _) = r?;
        visible.entry(row.turn).or_default().push(row);
    }
    write_session_files(conn, dir, &meta, &visible, &mut |_| {})
}
