//! The read side of the SQLite engine: read-only connections (a small pool)
//! that see committed state — session lists and lookups, rows, steps, cuts,
//! whole sessions, and recall (log, entry, full-text search).

use super::schema::open_reader;
use super::sql::{self, read_row, ROW_COLS};
use super::{Store, READER_POOL};
use crate::model::{Row, RowKind, SessionMeta, Usage};
use crate::paths::DataDir;
use crate::recall::{
    clip_body, fts_query, note_hits, search_terms, snippet, RecallHit, Scope, TooBroad, BODY_MAX,
    SEARCH_MAX_NOTE_SETS, SEARCH_MAX_SCAN, SEARCH_TIME, SNIPPET_SCAN,
};
use crate::store::backend::{LedgerRead, LedgerWrite};
use crate::store::common::{stored_dialect, to_i64};
use crate::store::error::StoreError;
use crate::store::records::{CutRecord, LineRecord, LoadedSession, SessionSummary, StepRecord};
use rusqlite::{params, Connection, OptionalExtension};
use std::sync::atomic::Ordering;
use tracing::warn;

impl Store {
    /// Run `f` on a pooled read-only connection (of the database file the
    /// writer writes: pooled connections of a replaced file are dropped).
    pub(crate) fn with_reader<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let generation = self.inner.shared.generation.load(Ordering::Acquire);
        let pooled = {
            let mut pool = self.inner.readers.lock();
            pool.retain(|(g, _)| *g == generation);
            pool.pop()
        };
        let conn = match pooled {
            Some((_, c)) => c,
            None => open_reader(&self.inner.db, self.inner.busy)?,
        };
        let result = f(&conn);
        if result.is_ok() {
            let mut pool = self.inner.readers.lock();
            if pool.len() < READER_POOL {
                pool.push((generation, conn));
            }
        }
        result
    }

    fn summaries(&self, only: Option<&str>) -> Result<Vec<SessionSummary>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT s.id, s.client, s.model, s.dialect, s.last_ms, s.parent,
                   (SELECT COUNT(DISTINCT r.turn) FROM rows r WHERE r.session = s.id AND r.hidden = 0),
                   (SELECT COUNT(*) FROM rows r WHERE r.session = s.id AND r.hidden = 0),
                   s.parent_seq, s.client_session
                 FROM sessions s WHERE ?1 IS NULL OR s.id = ?1
                 ORDER BY s.last_ms DESC, s.rowid DESC",
            )?;
            let rows = stmt.query_map([only], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, Option<String>>(5)?,
                    r.get::<_, i64>(6)?,
                    r.get::<_, i64>(7)?,
                    r.get::<_, Option<i64>>(8)?,
                    r.get::<_, Option<String>>(9)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (id, client, model, dialect, last_ms, parent, turns, nrows, parent_seq, key) =
                    row?;
                let dialect = match stored_dialect(&id, &dialect) {
                    Ok(d) => d,
                    Err(e) => {
                        warn!("{e}; not listed");
                        continue;
                    }
                };
                out.push(SessionSummary {
                    id,
                    client,
                    name: key
                        .as_deref()
                        .and_then(crate::resolve::given_name)
                        .map(str::to_string),
                    model,
                    dialect,
                    turns: turns as u32,
                    rows: nrows as u64,
                    last_ms,
                    parent,
                    parent_seq: parent_seq.map(|s| s as u64),
                });
            }
            Ok(out)
        })
    }
}

impl LedgerRead for Store {
    /// The data-dir layout.
    fn data_dir(&self) -> &DataDir {
        &self.inner.dir
    }

    /// Every session, most recent activity first. Reads committed state
    /// (does not settle).
    fn list_sessions(&self) -> Result<Vec<SessionSummary>, StoreError> {
        self.summaries(None)
    }

    /// One line of [`LedgerRead::list_sessions`] (committed state).
    fn session_summary(&self, id: &str) -> Result<Option<SessionSummary>, StoreError> {
        Ok(self.summaries(Some(id))?.into_iter().next())
    }

    /// Ids of the sessions recorded for a client key (`cc:…`, `codex:…`,
    /// `name:…`, `fp:…`), oldest first (the root session first). Reads
    /// committed state (does not settle).
    fn sessions_for_client(&self, key: &str) -> Result<Vec<String>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT id FROM sessions WHERE client_session = ?1 ORDER BY created_ms, rowid",
            )?;
            let ids = stmt
                .query_map([key], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(ids)
        })
    }

    /// The most recently active session, if any. Reads committed state
    /// (does not settle).
    fn latest_session(&self) -> Result<Option<String>, StoreError> {
        self.with_reader(|c| {
            Ok(c.query_row(
                "SELECT id FROM sessions ORDER BY last_ms DESC, rowid DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()?)
        })
    }

    /// The session `spec` names: `None` = the most recent; else as
    /// [`crate::resolve::resolve`] reads it (the ledger id, the client's
    /// session name or id, or a unique prefix of one). An unknown or
    /// ambiguous name is an error listing the closest sessions. Reads
    /// committed state (does not settle).
    fn resolve_session(&self, spec: Option<&str>) -> Result<String, StoreError> {
        let Some(spec) = spec else {
            return self.latest_session()?.ok_or(StoreError::NoSessions);
        };
        Ok(crate::resolve::resolve(spec, &self.session_candidates()?)?)
    }

    /// Every session as a name may mean it ([`crate::resolve::Candidate`]).
    fn session_candidates(&self) -> Result<Vec<crate::resolve::Candidate>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT id, client, client_session, parent, created_ms, last_ms FROM sessions",
            )?;
            let cands = stmt
                .query_map([], |r| {
                    Ok(crate::resolve::Candidate {
                        id: r.get(0)?,
                        client: r.get(1)?,
                        client_session: r.get(2)?,
                        parent: r.get(3)?,
                        created_ms: r.get(4)?,
                        last_ms: r.get(5)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(cands)
        })
    }

    /// A session's facts (committed state).
    fn session_meta(&self, id: &str) -> Result<Option<SessionMeta>, StoreError> {
        self.with_reader(|c| sql::session_meta(c, id))
    }

    /// A session's rows in seq order with their `hidden` flag; hidden rows
    /// only when `include_hidden`. Committed state (call `settle` first).
    fn session_rows(&self, id: &str, include_hidden: bool) -> Result<Vec<(Row, bool)>, StoreError> {
        self.with_reader(|c| {
            let filter = if include_hidden {
                ""
            } else {
                " AND hidden = 0"
            };
            let mut stmt = c.prepare(&format!(
                "SELECT {ROW_COLS} FROM rows WHERE session = ?1{filter} ORDER BY seq"
            ))?;
            let rows = stmt
                .query_map([id], read_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// A session's steps in order.
    fn steps(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT step, model, status, input, output, cache_read, cache_write, window_rows, ts_ms,
                        error, detail
                 FROM steps WHERE session = ?1 ORDER BY step",
            )?;
            let steps = stmt
                .query_map([id], |r| {
                    Ok(StepRecord {
                        step: r.get::<_, i64>(0)? as u32,
                        model: r.get(1)?,
                        status: r.get::<_, i64>(2)? as u16,
                        usage: Usage {
                            input: r.get::<_, i64>(3)?.max(0) as u64,
                            output: r.get::<_, i64>(4)?.max(0) as u64,
                            cache_read: r.get::<_, i64>(5)?.max(0) as u64,
                            cache_write: r.get::<_, i64>(6)?.max(0) as u64,
                        },
                        window_rows: r.get::<_, i64>(7)? as u32,
                        ts_ms: r.get(8)?,
                        error: r.get(9)?,
                        detail: r
                            .get::<_, Option<String>>(10)?
                            .and_then(|d| serde_json::from_str(&d).ok())
                            .unwrap_or_default(),
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(steps)
        })
    }

    /// A session's taken context edits in order.
    fn context_edits(
        &self,
        id: &str,
    ) -> Result<Vec<crate::store::records::ContextEditRecord>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT n, ts_ms, seqs_json, tokens_before, tokens_after, set_json
                 FROM context_edits WHERE session = ?1 ORDER BY n",
            )?;
            let edits = stmt
                .query_map([id], |r| {
                    Ok(crate::store::records::ContextEditRecord {
                        n: r.get::<_, i64>(0)?.max(0) as u32,
                        ts_ms: r.get(1)?,
                        seqs: serde_json::from_str(&r.get::<_, String>(2)?).unwrap_or_default(),
                        tokens_before: r.get::<_, i64>(3)?.max(0) as u64,
                        tokens_after: r.get::<_, i64>(4)?.max(0) as u64,
                        set: r.get(5)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(edits)
        })
    }

    /// A session's tideline cuts in order.
    fn cuts(&self, id: &str) -> Result<Vec<CutRecord>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT upto_seq, gauge, line, ts_ms FROM cuts WHERE session = ?1
                 ORDER BY ts_ms, rowid",
            )?;
            let cuts = stmt
                .query_map([id], |r| {
                    Ok(CutRecord {
                        upto_seq: r.get::<_, i64>(0)?.max(0) as u64,
                        gauge: r.get::<_, i64>(1)?.max(0) as u64,
                        line: r.get::<_, i64>(2)?.max(0) as u64,
                        ts_ms: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(cuts)
        })
    }

    /// What each model merge of a session's `SESSION.md` used, in order
    /// (its markers in `page_notes`; a marker without usage is skipped).
    fn merge_uses(&self, id: &str) -> Result<Vec<crate::merge::MergeUse>, StoreError> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT text FROM page_notes WHERE session = ?1 AND section = ?2 ORDER BY rowid",
            )?;
            let texts = stmt
                .query_map(rusqlite::params![id, crate::merge::MARKER_SECTION], |r| {
                    r.get::<_, String>(0)
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(texts
                .iter()
                .filter_map(|t| crate::merge::marker_use(t))
                .collect())
        })
    }

    /// The line a session last ran with, if one was recorded (sessions of
    /// schema 4 on).
    fn recorded_line(&self, id: &str) -> Result<Option<LineRecord>, StoreError> {
        self.with_reader(|c| {
            let row = c
                .query_row(
                    "SELECT line, line_spec, line_ms FROM sessions
                     WHERE id = ?1 AND line IS NOT NULL",
                    [id],
                    |r| {
                        Ok(LineRecord {
                            line: r.get::<_, i64>(0)?.max(0) as u64,
                            spec: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                            ts_ms: r.get::<_, Option<i64>>(2)?.unwrap_or(0),
                        })
                    },
                )
                .optional()?;
            Ok(row)
        })
    }

    /// Read a whole session back (after a restart, or when an idle session
    /// left memory). SETTLES FIRST (blocking), so it sees every write queued
    /// before the call; from async code run it on a blocking thread.
    fn load_session(&self, id: &str) -> Result<Option<LoadedSession>, StoreError> {
        match self.settle_blocking() {
            Ok(()) | Err(StoreError::Closed) => {}
            Err(e) => return Err(e),
        }
        self.with_reader(|c| sql::load_session(c, id))
    }

    /// One session's rows (hidden ones too), oldest first: the newest
    /// `limit` rows with `seq < before` whose text is `LIKE %pattern%`.
    fn recall_log(
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
    fn recall_entry(&self, session: &str, seq: u64) -> Result<Option<(Row, bool)>, StoreError> {
        self.with_reader(|c| {
            Ok(c.query_row(
                &format!("SELECT {ROW_COLS} FROM rows WHERE session = ?1 AND seq = ?2"),
                params![session, to_i64(seq)],
                read_row,
            )
            .optional()?)
        })
    }

    /// Where the row `seq` is in its turn file (`transcript/NNNN.md`, the
    /// lines of its section; what `NNNN.rows.md` lists), as the writer
    /// renders it from what is committed. None when the row is unknown or
    /// hidden (transcripts show the active line).
    fn row_lines(
        &self,
        session: &str,
        seq: u64,
    ) -> Result<Option<crate::transcript::RowLines>, StoreError> {
        self.with_reader(|c| {
            let Some(meta) = sql::session_meta(c, session)? else {
                return Ok(None);
            };
            let turn: Option<i64> = c
                .query_row(
                    "SELECT turn FROM rows WHERE session = ?1 AND seq = ?2 AND hidden = 0",
                    params![session, to_i64(seq)],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(turn) = turn else { return Ok(None) };
            let rows = sql::turn_rows(c, session, turn as u32)?;
            let (_, index) =
                crate::transcript::render_turn_indexed(meta.dialect, turn as u32, &rows);
            Ok(index.find(seq))
        })
    }

    /// Rows containing every word, in the sessions `scope` names, newest
    /// session first (then newest row first), at most `limit`. Bounded:
    /// the words by [`search_terms`], the rows looked at by
    /// [`SEARCH_MAX_SCAN`] (the newest matches), the time by
    /// [`SEARCH_TIME`] (the statement is interrupted); the snippets are
    /// made outside SQLite ([`snippet`], linear), for the hits shown only.
    fn search_in(
        &self,
        words: &[String],
        limit: usize,
        scope: Scope<'_>,
    ) -> Result<Vec<RecallHit>, StoreError> {
        let terms = search_terms(words)?;
        let Some(query) = fts_query(&terms) else {
            return Ok(Vec::new());
        };
        self.with_reader(|c| {
            let _watch = Watchdog::start(c, SEARCH_TIME);
            let found = || -> rusqlite::Result<Vec<RecallHit>> {
                let mut hits = search_notes(c, &terms, scope)?;
                hits.truncate(limit);
                let rows = limit - hits.len();
                hits.extend(search_rows(c, &query, &terms, rows, scope)?);
                Ok(hits)
            };
            found().map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, _)
                    if f.code == rusqlite::ErrorCode::OperationInterrupted =>
                {
                    StoreError::TooBroad(TooBroad::timed_out())
                }
                e => StoreError::Sqlite(e),
            })
        })
    }
}

/// `WITH me AS (…), fam(id) AS (…)`: the sessions a search scoped to the
/// session bound at `$p` reads (it, its parent, its children and its
/// siblings; a fingerprint-keyed session, itself alone). One text for the
/// row and the note search.
macro_rules! family_cte {
    ($p:literal) => {
        concat!(
            "WITH me AS (
           SELECT id, parent FROM sessions
           WHERE id = ",
            $p,
            " AND coalesce(client_session, '') NOT LIKE 'fp:%'),
         fam(id) AS (
           SELECT ",
            $p,
            "
           UNION SELECT parent FROM me WHERE parent IS NOT NULL
           UNION SELECT s.id FROM sessions s JOIN me ON s.parent = me.id
           UNION SELECT s.id FROM sessions s JOIN me
                 ON me.parent IS NOT NULL AND s.parent = me.parent)"
        )
    };
}

/// The search's statement: the newest [`SEARCH_MAX_SCAN`] matches of the
/// scope, the `limit` newest of those by session, their text's head (the
/// snippet is made here, see [`snippet`]).
fn search_rows(
    c: &Connection,
    query: &str,
    terms: &[String],
    limit: usize,
    scope: Scope<'_>,
) -> rusqlite::Result<Vec<RecallHit>> {
    let mut stmt = c.prepare(concat!(
        family_cte!("?4"),
        ",
         m AS (
           SELECT row_fts.rowid AS id FROM row_fts
           JOIN row_text t ON t.id = row_fts.rowid
           WHERE row_fts MATCH ?1
             AND (?4 IS NULL OR t.session IN (SELECT id FROM fam))
           ORDER BY row_fts.rowid DESC LIMIT ?3),
         hits AS (
           SELECT t.id, t.session, t.seq, s.last_ms, s.rowid AS ord
           FROM m JOIN row_text t ON t.id = m.id
           JOIN sessions s ON s.id = t.session
           ORDER BY s.last_ms DESC, s.rowid DESC, t.seq DESC
           LIMIT ?2)
         SELECT h.session, h.seq, r.turn, r.role, r.kind, r.hidden, substr(t.text, 1, ?5)
         FROM hits h
         JOIN row_text t ON t.id = h.id
         JOIN rows r ON r.session = h.session AND r.seq = h.seq
         ORDER BY h.last_ms DESC, h.ord DESC, h.seq DESC"
    ))?;
    let hits = stmt
        .query_map(
            params![
                query,
                i64::try_from(limit).unwrap_or(i64::MAX),
                i64::try_from(SEARCH_MAX_SCAN).unwrap_or(i64::MAX),
                scope.session(),
                i64::try_from(SNIPPET_SCAN).unwrap_or(i64::MAX),
            ],
            |r| {
                Ok(RecallHit {
                    session: r.get(0)?,
                    seq: r.get::<_, i64>(1)? as u64,
                    turn: r.get::<_, i64>(2)? as u32,
                    role: r.get(3)?,
                    kind: RowKind::parse(&r.get::<_, String>(4)?).unwrap_or(RowKind::Other),
                    hidden: r.get(5)?,
                    body: clip_body(&snippet(&r.get::<_, String>(6)?, terms), BODY_MAX),
                })
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(hits)
}

/// The notes in force (each session's latest edit set) holding every term,
/// in the sessions `scope` names, newest session first (at most
/// [`SEARCH_MAX_NOTE_SETS`] sessions with notes are read).
fn search_notes(
    c: &Connection,
    terms: &[String],
    scope: Scope<'_>,
) -> rusqlite::Result<Vec<RecallHit>> {
    let mut stmt = c.prepare(concat!(
        family_cte!("?1"),
        "
         SELECT e.session, e.set_json FROM context_edits e
         JOIN sessions s ON s.id = e.session
         WHERE e.n = (SELECT max(x.n) FROM context_edits x WHERE x.session = e.session)
           AND instr(e.set_json, '\"notes\":[{') > 0
           AND (?1 IS NULL OR e.session IN (SELECT id FROM fam))
         ORDER BY s.last_ms DESC, s.rowid DESC
         LIMIT ?2"
    ))?;
    let sets = stmt
        .query_map(
            params![
                scope.session(),
                i64::try_from(SEARCH_MAX_NOTE_SETS).unwrap_or(i64::MAX)
            ],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut turn = c.prepare("SELECT turn FROM rows WHERE session = ?1 AND seq = ?2")?;
    let mut out = Vec::new();
    for (session, set) in sets {
        let mut failed = None;
        let mut turn_of = |seq: u64| -> u32 {
            match turn
                .query_row(params![session, to_i64(seq)], |r| r.get::<_, i64>(0))
                .optional()
            {
                Ok(t) => t.unwrap_or(0).max(0) as u32,
                Err(e) => {
                    failed.get_or_insert(e);
                    0
                }
            }
        };
        out.extend(note_hits(&session, &set, terms, &mut turn_of));
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(out)
}

/// Interrupts the connection's running statement once `within` has
/// passed, unless dropped first (the statement finished); dropping it waits
/// for its thread, so no interrupt lands after.
struct Watchdog {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(c: &Connection, within: std::time::Duration) -> Watchdog {
        let handle = c.get_interrupt_handle();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("oceancode-search-watch".into())
            .spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(within) {
                    handle.interrupt();
                }
            });
        let thread = match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                warn!(error = %e, "search: no watchdog thread; the search runs unbounded in time");
                None
            }
        };
        Watchdog {
            done: Some(done),
            thread,
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // The sender gone wakes the thread at once.
        self.done.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A statement that would run for ever is interrupted at the
    /// watchdog's time; one that ends first is left alone.
    #[test]
    fn the_watchdog_interrupts_a_statement_past_its_time() {
        let c = Connection::open_in_memory().expect("db");
        let endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n)
                       SELECT count(*) FROM n";
        let t = Instant::now();
        let got = {
            let _w = Watchdog::start(&c, Duration::from_millis(200));
            c.query_row(endless, [], |r| r.get::<_, i64>(0))
        };
        assert!(
            matches!(&got, Err(rusqlite::Error::SqliteFailure(f, _))
                if f.code == rusqlite::ErrorCode::OperationInterrupted),
            "{got:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let t = Instant::now();
        {
            let _w = Watchdog::start(&c, Duration::from_secs(30));
            let one: i64 = c.query_row("SELECT 1", [], |r| r.get(0)).expect("select");
            assert_eq!(one, 1);
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the drop did not wait"
        );
        let one: i64 = c.query_row("SELECT 1", [], |r| r.get(0)).expect("after");
        assert_eq!(one, 1);
    }
}
