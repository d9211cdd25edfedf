//! The files the writer keeps in step with the database after each commit:
//! per-turn transcripts (atomic replace, each row rendered once while its
//! turn is the newest), `index.md`, and `SESSION.md` once a turn came wholly
//! past the tideline. The caches that make a step cheap live here too.
//!
//! Holes: a session whose file write failed (a read-only or full disk, its
//! directory in the way) has all its files written again from the database
//! once writes succeed — tried with backoff, and at every settle — with one
//! WARN line when file writes start failing and one INFO line when they
//! recover. When the store opens, the `index.md` and the turn files of the
//! active line that are missing (kill -9 between a commit and its files) are
//! created from the database (never replacing a file).

use super::apply::{Effect, Touch};
use super::error::{io_err, StoreError};
use super::page_io;
use super::queue::Fault;
use super::rebuild::rewrite_session_files;
use super::sql::{session_meta, turn_rows, turn_summaries};
use super::writer::{Writer, CACHE_BYTES, CACHE_SESSIONS, FILES_RETRY_MAX, FILES_RETRY_MIN};
use crate::model::{Row, SessionMeta};
use crate::page::Page;
use crate::paths;
use crate::transcript::{self, TurnSummary};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tracing::{debug, info, warn};

/// The newest turn of a session, kept so a step does not re-read the session.
struct TurnCache {
    turn: u32,
    rows: Vec<Row>,
    /// Rendered sections by seq, with the bytes they were rendered from,
    /// the row's tools and its anchor label: a long turn is re-written each
    /// step but each row is rendered once.
    sections: HashMap<u64, Section>,
}

pub(super) struct SessionCache {
    /// Approximate bytes held by `newest` (rows and rendered sections).
    newest_bytes: usize,
    meta: SessionMeta,
    summaries: Option<BTreeMap<u32, TurnSummary>>,
    newest: Option<TurnCache>,
    dir_ready: bool,
    last_used: u64,
    /// The folded `SESSION.md` (None = fold again from the database).
    page: Option<Page>,
    /// Hash of the last `SESSION.md` written.
    page_hash: Option<u64>,
    /// `index.md` is behind (written at the next flush of deferred writes).
    pub(super) index_dirty: bool,
}

impl Writer {
    /// A file write of `session` failed: its cache is dropped and all its
    /// files are written again once writes succeed.
    pub(super) fn files_failed(&mut self, session: &str, e: &StoreError) {
        self.shared
            .transcript_errors
            .fetch_add(1, Ordering::Relaxed);
        self.caches.remove(session);
        let newly = self.files_failing.insert(session.to_string());
        let mut f = self.shared.faults.lock();
        f.files_sessions = self.files_failing.len();
        match &mut f.files {
            Some(fault) => {
                fault.retries += 1;
                fault.error = e.to_string();
                if newly {
                    debug!(session, "ledger files failing too: {e}");
                }
            }
            None => {
                warn!(
                    session,
                    "ledger transcript writes failing ({e}); the files of the sessions concerned are written again once writes succeed"
                );
                f.files = Some(Fault {
                    since: Instant::now(),
                    error: e.to_string(),
                    retries: 0,
                });
                self.files_retry = (Instant::now() + FILES_RETRY_MIN, FILES_RETRY_MIN);
            }
        }
    }

    /// Write every file of the sessions whose file writes failed again.
    pub(super) fn retry_files(&mut self) {
        let failing = std::mem::take(&mut self.files_failing);
        let mut healed = 0u64;
        let mut error = None;
        for session in failing {
            match rewrite_session_files(&self.conn, &self.dir, &session) {
                Ok(_) | Err(StoreError::UnknownSession(_)) => healed += 1,
                Err(StoreError::Corrupt(why)) => warn!("ledger files not written: {why}"),
                Err(e) => {
                    error = Some(e.to_string());
                    self.files_failing.insert(session);
                }
            }
        }
        self.shared
            .files_healed
            .fetch_add(healed, Ordering::Relaxed);
        let mut f = self.shared.faults.lock();
        f.files_sessions = self.files_failing.len();
        match error {
            None => {
                if let Some(fault) = f.files.take() {
                    info!(
                        sessions = healed,
                        "ledger transcript writes recovered after {:.1}s; the files they missed are written",
                        fault.since.elapsed().as_secs_f64()
                    );
                }
            }
            Some(e) => {
                if let Some(fault) = f.files.as_mut() {
                    fault.retries += 1;
                    fault.error = e;
                }
                let wait = (self.files_retry.1 * 2).min(FILES_RETRY_MAX);
                self.files_retry = (Instant::now() + wait, wait);
            }
        }
    }

    /// At open: write the turn files of the active line and the `index.md`
    /// that are missing (kill -9 between a commit and its files, a
    /// read-only period), from the database. Only what is missing is
    /// created, never replaced, so a proxy writing the same files meanwhile
    /// (this open is a CLI command's) keeps its newer ones.
    pub(super) fn heal_holes(&mut self) {
        let holes = match self.find_holes() {
            Ok(h) => h,
            Err(e) => {
                warn!("ledger transcripts not checked for missing files: {e}");
                return;
            }
        };
        if holes.is_empty() {
            return;
        }
        let mut written = 0usize;
        let sessions = holes.len();
        for hole in holes {
            match self.fill_hole(&hole) {
                Ok(n) => {
                    written += n;
                    self.shared.files_healed.fetch_add(1, Ordering::Relaxed);
                }
                Err(StoreError::Corrupt(why)) => warn!("ledger files not written: {why}"),
                Err(e) => self.files_failed(&hole.session, &e),
            }
        }
        info!(
            sessions,
            files = written,
            "ledger transcripts: missing files written again from the database"
        );
    }

    /// Create one session's missing files; returns how many it wrote.
    fn fill_hole(&self, hole: &Hole) -> Result<usize, StoreError> {
        let meta = session_meta(&self.conn, &hole.session)?
            .ok_or_else(|| StoreError::UnknownSession(hole.session.clone()))?;
        let tdir = self.dir.transcript_dir(&hole.session);
        paths::create_private_dir_all(&tdir).map_err(io_err(&tdir))?;
        let mut written = 0;
        for &turn in &hole.turns {
            let rows = turn_rows(&self.conn, &hole.session, turn)?;
            let path = self.dir.turn_file(&hole.session, turn);
            let (text, index) = transcript::render_turn_indexed(meta.dialect, turn, &rows);
            written +=
                usize::from(paths::write_new(&path, text.as_bytes()).map_err(io_err(&path))?);
            let path = self.dir.rows_file(&hole.session, turn);
            paths::write_new(&path, index.render().as_bytes()).map_err(io_err(&path))?;
        }
        if hole.index {
            let turns: Vec<TurnSummary> = turn_summaries(&self.conn, &hole.session, meta.dialect)?
                .into_values()
                .collect();
            let path = self.dir.index_file(&hole.session);
            let text = transcript::render_index(&meta, &turns);
            written +=
                usize::from(paths::write_new(&path, text.as_bytes()).map_err(io_err(&path))?);
        }
        Ok(written)
    }

    /// Sessions with missing files: which turn files, and whether `index.md`.
    fn find_holes(&self) -> Result<Vec<Hole>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT r.session, r.turn FROM rows r JOIN sessions s ON s.id = r.session
             WHERE r.hidden = 0 GROUP BY r.session, r.turn ORDER BY r.session, r.turn",
        )?;
        let mut out: Vec<Hole> = Vec::new();
        let mut current: Option<Hole> = None;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let session: String = r.get(0)?;
            let turn = r.get::<_, i64>(1)? as u32;
            if current.as_ref().is_none_or(|h| h.session != session) {
                out.extend(current.take().filter(Hole::any));
                current = Some(Hole {
                    index: !self.dir.index_file(&session).exists(),
                    session,
                    turns: Vec::new(),
                });
            }
            if let Some(h) = current.as_mut() {
                if !self.dir.turn_file(&h.session, turn).exists() {
                    h.turns.push(turn);
                }
            }
        }
        out.extend(current.filter(Hole::any));
        Ok(out)
    }

    /// Drop the least recently used session caches until one more fits
    /// (at most [`CACHE_SESSIONS`], about [`CACHE_BYTES`]).
    pub(super) fn evict_caches(&mut self) {
        let mut bytes: usize = self.caches.values().map(SessionCache::bytes).sum();
        while self.caches.len() >= CACHE_SESSIONS
            || (bytes > CACHE_BYTES && !self.caches.is_empty())
        {
            let Some(old) = self
                .caches
                .iter()
                .min_by_key(|(_, c)| c.last_used)
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            if self.caches.get(&old).is_some_and(|c| c.index_dirty) {
                if let Err(e) = self.write_index(&old) {
                    warn!("ledger index of session {old}: {e}");
                }
            }
            if let Some(c) = self.caches.remove(&old) {
                bytes = bytes.saturating_sub(c.bytes());
            }
        }
    }

    /// Bring a session's transcript files up to date after a commit.
    pub(super) fn write_files(&mut self, session: &str, touch: Touch) -> Result<(), StoreError> {
        self.tick += 1;
        if !self.caches.contains_key(session) {
            let Some(meta) = session_meta(&self.conn, session)? else {
                return Ok(());
            };
            self.evict_caches();
            self.caches.insert(
                session.to_string(),
                SessionCache {
                    newest_bytes: 0,
                    meta,
                    summaries: None,
                    newest: None,
                    dir_ready: false,
                    last_used: 0,
                    page: None,
                    page_hash: None,
                    index_dirty: false,
                },
            );
        }
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        cache.last_used = self.tick;
        let meta_changed = touch.effects.iter().any(|e| matches!(e, Effect::Meta(_)));
        for effect in touch.effects {
            apply_effect(cache, effect);
        }
        // The page after the transcripts: a reader who follows the page to
        // a transcript finds it written.
        let result = self.write_transcripts(session, touch.turns, touch.index, meta_changed);
        if touch.page {
            return result.and(self.write_page(session));
        }
        result
    }

    /// Fold newly merged turns into the session's page and write it if it changed.
    pub(super) fn write_page(&mut self, session: &str) -> Result<(), StoreError> {
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        let dialect = cache.meta.dialect;
        let fresh = cache.page.is_none();
        let page = match &mut cache.page {
            Some(p) => p,
            None => cache.page.insert(page_io::new_page(&self.conn, session)?),
        };
        let changed = page_io::advance_page(&self.conn, session, dialect, page)?;
        if !(changed || fresh) {
            return Ok(());
        }
        if page_io::write_page(&self.dir, session, page, &mut cache.page_hash)? {
            self.shared.pages_written.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Rewrite the given turns' transcript files, and the index when the
    /// session's facts or its list of turns changed (a step that only grows
    /// the newest turn leaves the index to the next deferred flush).
    pub(super) fn write_transcripts(
        &mut self,
        session: &str,
        touched_turns: BTreeSet<u32>,
        index: bool,
        meta_changed: bool,
    ) -> Result<(), StoreError> {
        if touched_turns.is_empty() && !index {
            return Ok(());
        }
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        if !cache.dir_ready {
            let dir = self.dir.transcript_dir(session);
            paths::create_private_dir_all(&dir).map_err(io_err(&dir))?;
            cache.dir_ready = true;
        }
        let dialect = cache.meta.dialect;
        let mut turns_changed = meta_changed;
        if cache.summaries.is_none() {
            cache.summaries = Some(turn_summaries(&self.conn, session, dialect)?);
            turns_changed = true;
        }
        for turn in touched_turns {
            let (rows, mut sections) = match cache.newest.take() {
                Some(n) if n.turn == turn => (n.rows, n.sections),
                other => {
                    cache.newest = other;
                    (turn_rows(&self.conn, session, turn)?, HashMap::new())
                }
            };
            let path = self.dir.turn_file(session, turn);
            let summary = transcript::summarize_turn(dialect, turn, &rows);
            if let Some(s) = cache.summaries.as_mut() {
                let before = match &summary {
                    Some(sum) => s.insert(turn, sum.clone()),
                    None => s.remove(&turn),
                };
                turns_changed |= before.is_none() != summary.is_none();
            }
            let rows_path = self.dir.rows_file(session, turn);
            let written = if rows.is_empty() {
                paths::remove_if_exists(&path).and_then(|()| paths::remove_if_exists(&rows_path))
            } else {
                let mut text = transcript::render_turn_head(turn);
                let mut index = transcript::LineIndex::new(turn);
                for row in &rows {
                    let hit = sections.get(&row.seq).is_some_and(|c| c.raw == row.raw);
                    if !hit {
                        sections.insert(
                            row.seq,
                            Section {
                                raw: row.raw.clone(),
                                tools: transcript::row_tools(dialect, &row.raw),
                                label: String::new(),
                                text: String::new(),
                            },
                        );
                    }
                    let Some(section) = sections.get_mut(&row.seq) else {
                        continue;
                    };
                    let label = index.label(&section.tools);
                    if !hit || label != section.label {
                        section.text = transcript::render_row_labeled(dialect, row, &label);
                        section.label = label;
                    }
                    index.place(row.seq, &row.role, &section.text, &section.label);
                    text.push_str(&section.text);
                }
                paths::write_atomic(&path, text.as_bytes())
                    .and_then(|()| paths::write_atomic(&rows_path, index.render().as_bytes()))
            };
            if !matches!(&cache.newest, Some(n) if turn < n.turn) {
                cache.newest_bytes = rows.iter().map(|r| r.raw.len()).sum::<usize>()
                    + sections.values().map(|s| s.text.len()).sum::<usize>();
                cache.newest = Some(TurnCache {
                    turn,
                    rows,
                    sections,
                });
            }
            written.map_err(io_err(&path))?;
        }
        if !(index || turns_changed) {
            return Ok(());
        }
        if !turns_changed {
            cache.index_dirty = true;
            self.deferred_since.get_or_insert_with(Instant::now);
            return Ok(());
        }
        self.write_index(session)
    }

    /// Write a session's `index.md` from the cached turn summaries.
    pub(super) fn write_index(&mut self, session: &str) -> Result<(), StoreError> {
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        if cache.summaries.is_none() {
            cache.summaries = Some(turn_summaries(&self.conn, session, cache.meta.dialect)?);
        }
        let turns: Vec<TurnSummary> = cache
            .summaries
            .as_ref()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        let path = self.dir.index_file(session);
        paths::write_atomic(
            &path,
            transcript::render_index(&cache.meta, &turns).as_bytes(),
        )
        .map_err(io_err(&path))?;
        cache.index_dirty = false;
        Ok(())
    }
}

/// One row's rendered section of a turn file.
struct Section {
    raw: Arc<str>,
    tools: transcript::RowTools,
    label: String,
    text: String,
}

/// What a session misses on disk.
struct Hole {
    session: String,
    /// Turn files of the active line that are missing.
    turns: Vec<u32>,
    /// `index.md` is missing.
    index: bool,
}

impl Hole {
    fn any(&self) -> bool {
        self.index || !self.turns.is_empty()
    }
}

impl SessionCache {
    fn bytes(&self) -> usize {
        if self.newest.is_some() {
            self.newest_bytes
        } else {
            0
        }
    }
}

/// Update a session's cache for what a committed event changed.
fn apply_effect(cache: &mut SessionCache, effect: Effect) {
    match effect {
        Effect::Meta(meta) => cache.meta = meta,
        Effect::Append(rows) => {
            for row in rows {
                let Some(n) = cache.newest.as_mut() else {
                    continue;
                };
                if n.turn == row.turn {
                    if !matches!(n.rows.last(), Some(l) if l.seq >= row.seq) {
                        n.rows.push(row);
                    } else {
                        cache.newest = None;
                    }
                }
                // Other turns are read from the database when rendered.
            }
        }
        Effect::Confirm { seq, turn, raw } => {
            if matches!(&cache.page, Some(p) if seq <= p.merged_upto_seq()) {
                cache.page = None;
            }
            if let Some(n) = cache.newest.as_mut().filter(|n| n.turn == turn) {
                match n.rows.binary_search_by_key(&seq, |r| r.seq) {
                    Ok(i) => {
                        n.rows[i].raw = raw;
                        n.rows[i].from_response = false;
                    }
                    Err(_) => cache.newest = None,
                }
            }
        }
        Effect::Invalidate => {
            cache.newest = None;
            cache.summaries = None;
            cache.page = None;
        }
    }
}
