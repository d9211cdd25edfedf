//! Retention on the SQLite engine: the idle-session sweep and `VACUUM`.
//! A swept session loses its database rows and its `sessions/<id>/`
//! directory together. Both run on the writer thread, so they see every
//! write queued before them.

use crate::paths::DataDir;
use crate::retention::{SweepReport, VacuumReport};
use crate::store::error::{io_err, StoreError};
use rusqlite::{Connection, TransactionBehavior};
use std::path::Path;

/// Tables holding a session's data (column `session`).
const SESSION_TABLES: &[&str] = &[
    "rows",
    "context_edits",
    "row_text",
    "branches",
    "steps",
    "cuts",
    "page_notes",
];

/// Remove every session whose last activity is `days` days or more before
/// `now_ms` (`days == 0` keeps everything).
pub(crate) fn sweep(
    conn: &mut Connection,
    dir: &DataDir,
    days: u32,
    now_ms: i64,
) -> Result<SweepReport, StoreError> {
    let mut report = SweepReport::default();
    if days == 0 {
        return Ok(report);
    }
    let cutoff = now_ms.saturating_sub(i64::from(days) * 86_400_000);
    let ids: Vec<String> = {
        let mut stmt =
            conn.prepare("SELECT id FROM sessions WHERE last_ms <= ?1 ORDER BY last_ms")?;
        let ids = stmt
            .query_map([cutoff], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        ids
    };
    for id in ids {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let rows: i64 =
            tx.query_row("SELECT COUNT(*) FROM rows WHERE session = ?1", [&id], |r| {
                r.get(0)
            })?;
        for table in SESSION_TABLES {
            tx.execute(&format!("DELETE FROM {table} WHERE session = ?1"), [&id])?;
        }
        tx.execute("DELETE FROM sessions WHERE id = ?1", [&id])?;
        tx.commit()?;
        let sdir = dir.session_dir(&id);
        match dir.remove_dir_all(&sdir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err(&sdir)(e));
            }
            _ => {}
        }
        tracing::info!(session = %id, rows, "retention: removed idle session");
        report.rows += rows.max(0) as u64;
        report.removed.push(id);
    }
    Ok(report)
}

fn db_bytes(db: &Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    [db, Path::new(&wal)]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// Optimize the search index, `VACUUM`, truncate the WAL.
pub(crate) fn vacuum(conn: &mut Connection, dir: &DataDir) -> Result<VacuumReport, StoreError> {
    let db = dir.db_path();
    let bytes_before = db_bytes(&db);
    conn.execute("INSERT INTO row_fts(row_fts) VALUES ('optimize')", [])?;
    conn.execute_batch("VACUUM")?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(VacuumReport {
        bytes_before,
        bytes_after: db_bytes(&db),
    })
}
