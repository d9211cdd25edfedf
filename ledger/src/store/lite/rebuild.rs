//! `ledger rebuild` on the SQLite engine: a session's search index, every
//! turn file, `index.md` (stale turn files removed) and `SESSION.md`, made
//! again from the database alone with the live writer's renderers, so what
//! it writes is byte for byte what the writer wrote.

use super::sql::{read_row, session_meta, TextBatch, ROW_COLS};
use crate::model::Row;
use crate::paths::DataDir;
use crate::rebuild::{Progress, RebuildReport};
use crate::store::error::StoreError;
use crate::store::files::write_session_files;
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
