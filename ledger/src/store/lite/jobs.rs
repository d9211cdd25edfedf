//! Jobs: work run on the writer thread after everything queued before it
//! (rebuild, the retention sweep, vacuum, model-merged page notes, the page
//! backlog), each waited for by its caller.

use super::sql::session_meta;
use super::{rebuild, retention, LiteWriter, Store};
use crate::page::Note;
use crate::rebuild::{Progress, RebuildReport};
use crate::retention::{SweepReport, VacuumReport};
use crate::store::backend::LedgerStore;
use crate::store::common::now_ms;
use crate::store::error::StoreError;
use crate::store::page_io::{advance_page, new_page, write_page};
use rusqlite::params;
use std::sync::atomic::Ordering;

impl Store {
    /// Run `f` on the writer thread after everything queued before it, and
    /// wait for its result (blocking; from async code use a blocking thread).
    pub(super) fn run_job<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut LiteWriter) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.inner.writer.run_job(f)
    }
}

impl LedgerStore for Store {
    /// Rebuild a session's transcripts, `index.md`, `SESSION.md` and search
    /// index from the database (settles first: it runs on the writer thread
    /// after everything queued before it). No model call.
    fn rebuild(
        &self,
        session: &str,
        progress: Option<Progress>,
    ) -> Result<RebuildReport, StoreError> {
        let session = session.to_string();
        self.run_job(move |w| {
            w.files.forget(&session);
            rebuild::rebuild_session(&mut w.db.conn, &w.dir, &session, progress.as_ref())
        })
    }

    /// Remove every session idle for `days` days or more (`0` = keep all) as
    /// of `now_ms` (Unix ms): its rows, steps, cuts, branches, notes, search
    /// text and directory, together. Runs on the writer thread after
    /// everything queued before it.
    fn sweep_at(&self, days: u32, now_ms: i64) -> Result<SweepReport, StoreError> {
        self.run_job(move |w| {
            let report = retention::sweep(&mut w.db.conn, &w.dir, days, now_ms)?;
            for id in &report.removed {
                w.forget(id);
            }
            w.shared
                .sessions_removed
                .fetch_add(report.removed.len() as u64, Ordering::Relaxed);
            Ok(report)
        })
    }

    /// Compact the database (`VACUUM`, search index optimized, WAL truncated).
    fn vacuum(&self) -> Result<VacuumReport, StoreError> {
        self.run_job(|w| retention::vacuum(&mut w.db.conn, &w.dir))
    }

    /// Store model-merged lines for a session's `SESSION.md` and rewrite the page.
    fn add_page_notes(&self, session: &str, notes: Vec<Note>) -> Result<(), StoreError> {
        let session = session.to_string();
        self.run_job(move |w| {
            {
                let tx = w.db.conn.transaction()?;
                {
                    let mut stmt = tx.prepare(
                        "INSERT INTO page_notes (session, turn, section, text, created_ms)
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                    )?;
                    for n in &notes {
                        stmt.execute(params![session, n.turn, n.section, n.text, now_ms()])?;
                    }
                }
                tx.commit()?;
            }
            w.files.forget(&session);
            let Some(meta) = session_meta(&w.db.conn, &session)? else {
                return Err(StoreError::UnknownSession(session));
            };
            let mut page = new_page(&w.db.conn, &session)?;
            advance_page(&w.db.conn, &session, meta.dialect, &mut page)?;
            write_page(&w.dir, &session, &page, &mut None)?;
            Ok(())
        })
    }

    /// The model-merge backlog of a session: `(from, to)` turns wholly past
    /// the tideline that no model merge has covered yet (`from > to` = none).
    fn page_backlog(&self, session: &str) -> Result<(u32, u32), StoreError> {
        let session = session.to_string();
        self.run_job(move |w| {
            let meta = session_meta(&w.db.conn, &session)?
                .ok_or_else(|| StoreError::UnknownSession(session.clone()))?;
            let mut page = new_page(&w.db.conn, &session)?;
            advance_page(&w.db.conn, &session, meta.dialect, &mut page)?;
            let noted: i64 = w.db.conn.query_row(
                "SELECT COALESCE(MAX(turn), 0) FROM page_notes WHERE session = ?1 AND section = ?2",
                params![session, crate::merge::MARKER_SECTION],
                |r| r.get(0),
            )?;
            Ok((noted.max(0) as u32 + 1, page.whole_through()))
        })
    }
}
