//! Jobs of the PostgreSQL engine, run on its writer thread after
//! everything queued before them: rebuild, the retention sweep (whole day
//! partitions dropped when every session in them is idle; the rest deleted
//! session by session), vacuum, model-merged page notes, the page backlog.

use super::super::common::now_ms;
use super::super::error::StoreError;
use super::super::files::rewrite_session_files;
use super::super::page_io::{advance_page, new_page, write_page};
use super::super::source::Source;
use super::schema::{partition_days, partition_names, NOW_MS};
use super::sql::{read_row, session_meta, ROW_COLS};
use super::text::{write as write_text, TextJob};
use super::PgWriter;
use crate::page::Note;
use crate::rebuild::{Progress, RebuildReport};
use crate::retention::{SweepReport, VacuumReport};
use std::sync::atomic::Ordering;
use tokio_postgres::Client;
use tracing::info;

/// Tables holding a session's data besides `rows` and `row_text`.
const SESSION_TABLES: &[&str] = &[
    "branches",
    "steps",
    "cuts",
    "page_notes",
    "context_edits",
    "leases",
];

/// Rebuild one session's search text and every file of it in this data dir.
pub(super) fn rebuild(
    w: &mut PgWriter,
    session: &str,
    progress: Option<&Progress>,
) -> Result<RebuildReport, StoreError> {
    w.forget(session);
    let dir = w.dir.clone();
    let (rt, c) = w.db.parts()?;
    let total = rt.block_on(async {
        let meta = session_meta(&*c, session)
            .await?
            .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
        let mut tx = c.transaction().await?;
        let rows = tx
            .query(
                &format!("SELECT {ROW_COLS}, day FROM rows WHERE session = $1 ORDER BY seq"),
                &[&session],
            )
            .await?;
        let total = rows.len() as u64;
        tx.execute("DELETE FROM row_text WHERE session = $1", &[&session])
            .await?;
        // As the writer indexes rows: a text too large for a tsvector is
        // cut rather than failing the rebuild.
        let jobs: Vec<TextJob> = rows
            .iter()
            .map(|r| {
                let (row, _) = read_row(r);
                TextJob {
                    session: session.to_string(),
                    day: r.get(10),
                    seq: row.seq,
                    dialect: meta.dialect,
                    raw: row.raw,
                }
            })
            .collect();
        write_text(&mut tx, &jobs).await?;
        tx.commit().await?;
        Ok::<_, StoreError>(total)
    })?;
    let tick = |done: u64| {
        if let Some(p) = progress {
            p(done, total);
        }
    };
    tick(total / 2);
    let files = rewrite_session_files(&w.db, &dir, session)?;
    tick(total);
    Ok(RebuildReport {
        session: session.to_string(),
        rows: total,
        turns: files.turns,
        removed: files.removed,
        page: files.page,
    })
}

/// Remove every session idle for `days` days or more before `now_ms`
/// (`days == 0` keeps everything), with its directory in this data dir.
/// A day partition whose sessions are all idle goes whole (`DROP TABLE`:
/// no dead rows left behind to bloat the table); the other idle sessions
/// are deleted one by one. A session another proxy holds is kept.
pub(super) fn sweep(w: &mut PgWriter, days: u32, now_ms: i64) -> Result<SweepReport, StoreError> {
    let mut report = SweepReport::default();
    if days == 0 {
        return Ok(report);
    }
    let cutoff = now_ms.saturating_sub(i64::from(days) * 86_400_000);
    let dir = w.dir.clone();
    // Held by another live proxy (this one's own holds do not keep a
    // session idle that long: it left memory and was let go).
    let me = w.db.owner().replace('\'', "''");
    let (rt, c) = w.db.parts()?;
    let removed = rt.block_on(async {
        let mut removed: Vec<(String, i64)> = Vec::new();
        let held = format!(
            "EXISTS (SELECT 1 FROM leases l WHERE l.session = s.id AND l.owner <> '{me}'
                     AND l.expires_ms >= {NOW_MS})"
        );
        // Whole days first.
        for day in partition_days(&*c).await? {
            let live: bool = c
                .query_one(
                    &format!(
                        "SELECT EXISTS (SELECT 1 FROM sessions s WHERE s.day = $1
                                        AND (s.last_ms > $2 OR {held}))"
                    ),
                    &[&day, &cutoff],
                )
                .await?
                .get(0);
            // The partitions of the days around "now" stay: sessions are
            // being created in them.
            let today = now_ms.div_euclid(super::schema::DAY_MS);
            if live || day >= today - 1 {
                continue;
            }
            let tx = c.transaction().await?;
            let ids: Vec<String> = tx
                .query("SELECT id FROM sessions WHERE day = $1", &[&day])
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let [rows_t, text_t] = partition_names(day);
            let n: i64 = tx
                .query_one(&format!("SELECT COUNT(*) FROM {rows_t}"), &[])
                .await?
                .get(0);
            for table in SESSION_TABLES {
                tx.execute(
                    &format!("DELETE FROM {table} WHERE session = ANY($1)"),
                    &[&ids],
                )
                .await?;
            }
            tx.execute("DELETE FROM sessions WHERE id = ANY($1)", &[&ids])
                .await?;
            tx.batch_execute(&format!("DROP TABLE {rows_t}; DROP TABLE {text_t};"))
                .await?;
            tx.commit().await?;
            info!(
                day,
                sessions = ids.len(),
                rows = n,
                "retention: dropped an idle day partition"
            );
            report.rows += n.max(0) as u64;
            removed.extend(ids.into_iter().map(|id| (id, n)));
        }
        // Then idle sessions of days still in use.
        let ids: Vec<String> = c
            .query(
                &format!(
                    "SELECT s.id FROM sessions s WHERE s.last_ms <= $1 AND NOT {held}
                     ORDER BY s.last_ms"
                ),
                &[&cutoff],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for id in ids {
            let n = delete_session(c, &id).await?;
            info!(session = %id, rows = n, "retention: removed idle session");
            report.rows += n;
            removed.push((id, 0));
        }
        Ok::<_, StoreError>(removed)
    })?;
    for (id, _) in removed {
        let sdir = dir.session_dir(&id);
        match dir.remove_dir_all(&sdir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(super::super::error::io_err(&sdir)(e));
            }
            _ => {}
        }
        w.forget(&id);
        w.db.unhold(&id);
        report.removed.push(id);
    }
    w.shared
        .sessions_removed
        .fetch_add(report.removed.len() as u64, Ordering::Relaxed);
    Ok(report)
}

/// Delete one session everywhere, in one transaction; returns its rows.
async fn delete_session(c: &mut Client, id: &str) -> Result<u64, StoreError> {
    let tx = c.transaction().await?;
    let day: Option<i64> = tx
        .query_opt("SELECT day FROM sessions WHERE id = $1", &[&id])
        .await?
        .map(|r| r.get(0));
    let n = match day {
        Some(day) => {
            tx.execute(
                "DELETE FROM row_text WHERE session = $1 AND day = $2",
                &[&id, &day],
            )
            .await?;
            tx.execute(
                "DELETE FROM rows WHERE session = $1 AND day = $2",
                &[&id, &day],
            )
            .await?
        }
        None => 0,
    };
    for table in SESSION_TABLES {
        tx.execute(&format!("DELETE FROM {table} WHERE session = $1"), &[&id])
            .await?;
    }
    tx.execute("DELETE FROM sessions WHERE id = $1", &[&id])
        .await?;
    tx.commit().await?;
    Ok(n)
}

/// `VACUUM (ANALYZE)`: dead rows' space is made reusable and the planner's
/// statistics fresh, without the exclusive lock of `VACUUM FULL` (other
/// proxies keep writing). Reports the database's size.
pub(super) fn vacuum(w: &mut PgWriter) -> Result<VacuumReport, StoreError> {
    let (rt, c) = w.db.parts()?;
    rt.block_on(async {
        let size = "SELECT pg_database_size(current_database())";
        let before: i64 = c.query_one(size, &[]).await?.get(0);
        c.batch_execute(
            "VACUUM (ANALYZE) sessions, rows, row_text, branches, steps, cuts, page_notes, leases",
        )
        .await?;
        let after: i64 = c.query_one(size, &[]).await?.get(0);
        Ok(VacuumReport {
            bytes_before: before.max(0) as u64,
            bytes_after: after.max(0) as u64,
        })
    })
}

pub(super) fn add_page_notes(
    w: &mut PgWriter,
    session: &str,
    notes: Vec<Note>,
) -> Result<(), StoreError> {
    w.forget(session);
    let (rt, c) = w.db.parts()?;
    rt.block_on(async {
        let tx = c.transaction().await?;
        for n in &notes {
            tx.execute(
                "INSERT INTO page_notes (session, turn, section, text, created_ms)
                 VALUES ($1, $2, $3, $4, $5)",
                &[&session, &i64::from(n.turn), &n.section, &n.text, &now_ms()],
            )
            .await?;
        }
        tx.commit().await?;
        Ok::<_, StoreError>(())
    })?;
    let meta =
        w.db.session_meta(session)?
            .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
    let mut page = new_page(&w.db, session)?;
    advance_page(&w.db, session, meta.dialect, &mut page)?;
    write_page(&w.dir, session, &page, &mut None)?;
    Ok(())
}

pub(super) fn page_backlog(w: &mut PgWriter, session: &str) -> Result<(u32, u32), StoreError> {
    w.db.parts()?;
    let meta =
        w.db.session_meta(session)?
            .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
    let mut page = new_page(&w.db, session)?;
    advance_page(&w.db, session, meta.dialect, &mut page)?;
    let (rt, c) = w.db.parts()?;
    let noted: i64 = rt
        .block_on(c.query_one(
            "SELECT COALESCE(MAX(turn), 0)::bigint FROM page_notes
             WHERE session = $1 AND section = $2",
            &[&session, &crate::merge::MARKER_SECTION],
        ))?
        .get(0);
    Ok((noted.max(0) as u32 + 1, page.whole_through()))
}
