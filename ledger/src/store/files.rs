//! The files the writer keeps in step with the database after each commit,
//! the same on both engines ([`Files`], reading through
//! [`super::source::Source`]): per-turn transcripts and their line index
//! (each row rendered once while its turn is the newest; a step appends
//! its rows to the newest turn's files, anything else replaces them
//! atomically),
//! `index.md`, and `SESSION.md` once a turn came wholly past the tideline.
//! The caches that make a step cheap live here too: a step that appends to
//! the newest turn reads nothing back from the database.
//!
//! Holes: a session whose file write failed (a read-only or full disk, its
//! directory in the way) has all its files written again from the database
//! once writes succeed — tried with backoff, and at every settle — with one
//! WARN line when file writes start failing and one INFO line when they
//! recover. [`write_session_files`] is also what `ledger rebuild` writes,
//! so a rebuild gives the live writer's bytes.

use super::effects::{Effect, Touch};
use super::error::{io_err, StoreError};
use super::page_io;
use super::queue::{Fault, Shared};
use super::source::Source;
use crate::model::{ByteString, Row, SessionMeta};
use crate::page::Page;
use crate::paths::DataDir;
use crate::transcript::{self, TurnSummary};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Sessions whose newest turn / turn index the writer keeps in memory.
const CACHE_SESSIONS: usize = 1024;
/// Bytes of cached newest-turn rows and rendered sections across sessions
/// beyond which the least recently used session's cache is dropped.
const CACHE_BYTES: usize = 256 << 20;
/// First and longest wait before failed file writes are tried again.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The newest turn of a session, kept so a step does not re-read the session.
struct TurnCache {
    turn: u32,
    rows: Vec<Row>,
    /// Rendered sections by seq, with the bytes they were rendered from,
    /// the row's tools and its anchor label: each row is rendered once.
    sections: HashMap<u64, Section>,
    /// The line index of the rows placed at the last write (None: none).
    index: Option<transcript::LineIndex>,
    /// Leading rows whose section and place in `index` still hold (a
    /// confirmed row and every row after it are placed again).
    valid: usize,
}

/// One row's rendered section of a turn file.
struct Section {
    raw: ByteString,
    tools: transcript::RowTools,
    label: String,
    text: String,
    /// Lines of `text`.
    lines: u32,
}

struct SessionCache {
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
    index_dirty: bool,
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

/// The writer's files: what it caches of each session to write them, and
/// the sessions whose file writes failed.
pub(super) struct Files {
    dir: DataDir,
    shared: Arc<Shared>,
    caches: HashMap<String, SessionCache>,
    tick: u64,
    /// Some session's `index.md` waits for the next deferred flush.
    index_waiting: bool,
    /// Sessions whose `index.md` waited when their caches were dropped
    /// (the connection made again): written from the database at the
    /// next deferred flush.
    reindex: BTreeSet<String>,
    /// Sessions whose file writes failed: all their files are written again
    /// once writes succeed.
    failing: BTreeSet<String>,
    /// When failed file writes are tried next, and the wait after that.
    retry_at: (Instant, Duration),
}

impl Files {
    pub(super) fn new(dir: DataDir, shared: Arc<Shared>) -> Files {
        Files {
            dir,
            shared,
            caches: HashMap::new(),
            tick: 0,
            index_waiting: false,
            reindex: BTreeSet::new(),
            failing: BTreeSet::new(),
            retry_at: (Instant::now(), RETRY_MIN),
        }
    }

    /// Forget what is cached of a session (a job changed it).
    pub(super) fn forget(&mut self, session: &str) {
        self.caches.remove(session);
    }

    /// Forget every cache (the database was reopened); the `index.md`
    /// that waited are written from the database at the next flush.
    pub(super) fn clear_caches(&mut self) {
        for (session, cache) in self.caches.drain() {
            if cache.index_dirty {
                self.reindex.insert(session);
            }
        }
        self.index_waiting = !self.reindex.is_empty();
    }

    /// Drop the pending repairs: the database they would be written from
    /// is gone (a fresh one in its place).
    pub(super) fn clear_failing(&mut self) {
        self.reindex.clear();
        self.index_waiting = false;
        self.failing.clear();
        let mut f = self.shared.faults.lock();
        f.files = None;
        f.files_sessions = 0;
    }

    /// Whether some `index.md` waits for the next deferred flush.
    pub(super) fn index_waiting(&self) -> bool {
        self.index_waiting
    }

    /// When failed file writes are due again (None = none failing).
    pub(super) fn next_retry(&self) -> Option<Instant> {
        (!self.failing.is_empty()).then_some(self.retry_at.0)
    }

    /// Whether failed file writes should be tried now (`force`: a settle,
    /// a job or shutdown asks).
    pub(super) fn retry_due(&self, force: bool) -> bool {
        !self.failing.is_empty() && (force || Instant::now() >= self.retry_at.0)
    }

    /// A file write of `session` failed: its cache is dropped and all its
    /// files are written again once writes succeed.
    pub(super) fn failed(&mut self, session: &str, e: &StoreError) {
        self.shared
            .transcript_errors
            .fetch_add(1, Ordering::Relaxed);
        self.caches.remove(session);
        let newly = self.failing.insert(session.to_string());
        let mut f = self.shared.faults.lock();
        f.files_sessions = self.failing.len();
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
                self.retry_at = (Instant::now() + RETRY_MIN, RETRY_MIN);
            }
        }
    }

    /// Write every file of the sessions whose file writes failed again.
    pub(super) fn retry(&mut self, src: &dyn Source) {
        let failing = std::mem::take(&mut self.failing);
        let mut healed = 0u64;
        let mut error = None;
        for session in failing {
            match rewrite_session_files(src, &self.dir, &session) {
                Ok(_) | Err(StoreError::UnknownSession(_)) => healed += 1,
                Err(StoreError::Corrupt(why)) => warn!("ledger files not written: {why}"),
                Err(e) => {
                    error = Some(e.to_string());
                    self.failing.insert(session);
                }
            }
        }
        self.shared
            .files_healed
            .fetch_add(healed, Ordering::Relaxed);
        let mut f = self.shared.faults.lock();
        f.files_sessions = self.failing.len();
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
                let wait = (self.retry_at.1 * 2).min(RETRY_MAX);
                self.retry_at = (Instant::now() + wait, wait);
            }
        }
    }

    /// Write the `index.md` of every session whose index waits.
    pub(super) fn flush_indexes(&mut self, src: &dyn Source) {
        if !std::mem::take(&mut self.index_waiting) {
            return;
        }
        let dirty: Vec<String> = self
            .caches
            .iter()
            .filter(|(_, c)| c.index_dirty)
            .map(|(k, _)| k.clone())
            .collect();
        for session in dirty {
            if let Err(e) = self.write_index(src, &session) {
                self.failed(&session, &e);
            }
        }
        for session in std::mem::take(&mut self.reindex) {
            let touch = Touch {
                index: true,
                ..Touch::default()
            };
            if let Err(e) = self.write(src, &session, touch) {
                self.failed(&session, &e);
            }
        }
    }

    /// Drop the least recently used session caches until one more fits
    /// (at most [`CACHE_SESSIONS`], about [`CACHE_BYTES`]).
    fn evict(&mut self, src: &dyn Source) {
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
                if let Err(e) = self.write_index(src, &old) {
                    warn!("ledger index of session {old}: {e}");
                }
            }
            if let Some(c) = self.caches.remove(&old) {
                bytes = bytes.saturating_sub(c.bytes());
            }
        }
    }

    /// Bring a session's files up to date after a commit: the touched
    /// turns, `index.md` when the session's facts or its turns changed,
    /// `SESSION.md` when it may change.
    pub(super) fn write(
        &mut self,
        src: &dyn Source,
        session: &str,
        touch: Touch,
    ) -> Result<(), StoreError> {
        self.tick += 1;
        if !self.caches.contains_key(session) {
            let Some(meta) = src.session_meta(session)? else {
                return Ok(());
            };
            self.evict(src);
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
        // `index.md` shows the session's facts but not its last activity.
        let meta_changed = touch.effects.iter().any(|e| match e {
            Effect::Meta(m) => {
                SessionMeta {
                    last_ms: cache.meta.last_ms,
                    ..m.clone()
                } != cache.meta
            }
            _ => false,
        });
        for effect in touch.effects {
            apply_effect(cache, effect);
        }
        // The page after the transcripts: a reader who follows the page to
        // a transcript finds it written.
        let result = self.write_transcripts(src, session, touch.turns, touch.index, meta_changed);
        if touch.page {
            return result.and(self.write_page(src, session));
        }
        result
    }

    /// Fold newly merged turns into the session's page and write it if it changed.
    fn write_page(&mut self, src: &dyn Source, session: &str) -> Result<(), StoreError> {
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        let dialect = cache.meta.dialect;
        let fresh = cache.page.is_none();
        let page = match &mut cache.page {
            Some(p) => p,
            None => cache.page.insert(page_io::new_page(src, session)?),
        };
        let changed = page_io::advance_page(src, session, dialect, page)?;
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
    fn write_transcripts(
        &mut self,
        src: &dyn Source,
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
            self.dir.create_dir(&dir).map_err(io_err(&dir))?;
            cache.dir_ready = true;
        }
        let dialect = cache.meta.dialect;
        let mut turns_changed = meta_changed;
        if cache.summaries.is_none() {
            cache.summaries = Some(src.turn_summaries(session, dialect)?);
            turns_changed = true;
        }
        for turn in touched_turns {
            let (rows, mut sections, index, valid) = match cache.newest.take() {
                Some(n) if n.turn == turn => (n.rows, n.sections, n.index, n.valid),
                other => {
                    cache.newest = other;
                    let rows = src.turn_rows(session, turn)?;
                    (rows, HashMap::new(), None, 0)
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
            // The rows placed before and unchanged since stay placed; the
            // rest are placed (and rendered, when their bytes or label
            // changed) now.
            let mut index = index.unwrap_or_else(|| transcript::LineIndex::new(turn));
            let valid = valid.min(index.placed()).min(rows.len());
            index.truncate(valid);
            for row in rows.get(valid..).unwrap_or_default() {
                let fresh = || Section {
                    raw: owned(&row.raw),
                    tools: transcript::row_tools(dialect, &row.raw),
                    label: String::new(),
                    text: String::new(),
                    lines: 0,
                };
                let (section, hit) = match sections.entry(row.seq) {
                    Entry::Occupied(e) if e.get().raw == row.raw => (e.into_mut(), true),
                    Entry::Occupied(mut e) => {
                        e.insert(fresh());
                        (e.into_mut(), false)
                    }
                    Entry::Vacant(e) => (e.insert(fresh()), false),
                };
                let label = index.label(&section.tools);
                if !hit || label != section.label {
                    section.text = transcript::render_row_labeled(dialect, row, &label);
                    section.lines = transcript::line_count(&section.text);
                    section.label = label;
                }
                index.place_lines(row.seq, &row.role, section.lines, &section.label);
            }
            let written = if rows.is_empty() {
                let d = &self.dir;
                d.remove_file(&path)
                    .and_then(|()| d.remove_file(&rows_path))
            } else {
                let files = TurnFiles {
                    text: &path,
                    index: &rows_path,
                };
                write_turn(&self.dir, files, turn, &rows, &sections, &index)
            };
            if !matches!(&cache.newest, Some(n) if turn < n.turn) {
                cache.newest_bytes = rows.iter().map(|r| r.raw.len()).sum::<usize>()
                    + sections.values().map(|s| s.text.len()).sum::<usize>();
                let valid = rows.len();
                cache.newest = Some(TurnCache {
                    turn,
                    rows,
                    sections,
                    index: Some(index),
                    valid,
                });
            }
            written.map_err(io_err(&path))?;
        }
        if !(index || turns_changed) {
            return Ok(());
        }
        if !turns_changed {
            cache.index_dirty = true;
            self.index_waiting = true;
            return Ok(());
        }
        self.write_index(src, session)
    }

    /// Write a session's `index.md` from the cached turn summaries.
    fn write_index(&mut self, src: &dyn Source, session: &str) -> Result<(), StoreError> {
        let Some(cache) = self.caches.get_mut(session) else {
            return Ok(());
        };
        if cache.summaries.is_none() {
            cache.summaries = Some(src.turn_summaries(session, cache.meta.dialect)?);
        }
        let turns: Vec<TurnSummary> = cache
            .summaries
            .as_ref()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        let path = self.dir.index_file(session);
        self.dir
            .write_atomic(
                &path,
                transcript::render_index(&cache.meta, &turns).as_bytes(),
            )
            .map_err(io_err(&path))?;
        cache.index_dirty = false;
        Ok(())
    }
}

/// A turn file and its sidecar.
#[derive(Clone, Copy)]
struct TurnFiles<'a> {
    text: &'a std::path::Path,
    index: &'a std::path::Path,
}

/// Write a turn's file and its sidecar from its rendered sections, each
/// replaced whole and atomically (a temp file renamed over it), so a reader
/// never sees a torn file (SPEC: the transcript). The rows' sections and
/// places are cached; what a step costs here is the copy of the turn's
/// bytes into the page cache.
fn write_turn(
    dir: &DataDir,
    files: TurnFiles<'_>,
    turn: u32,
    rows: &[Row],
    sections: &HashMap<u64, Section>,
    index: &transcript::LineIndex,
) -> std::io::Result<()> {
    let (mut text, mut side) = (transcript::render_turn_head(turn), index.render_head());
    for (i, row) in rows.iter().enumerate() {
        if let Some(s) = sections.get(&row.seq) {
            text.push_str(&s.text);
        }
        index.render_row(i, &mut side);
    }
    dir.write_atomic(files.text, text.as_bytes())?;
    dir.write_atomic(files.index, side.as_bytes())
}

/// A row's bytes as a copy of their own: a committed row may share a
/// request body's bytes ([`Row::raw`]), which a cache kept for the
/// session's life would otherwise keep whole.
fn owned(raw: &str) -> ByteString {
    ByteString::from(raw)
}

/// Update a session's cache for what a committed event changed.
fn apply_effect(cache: &mut SessionCache, effect: Effect) {
    match effect {
        Effect::Meta(meta) => cache.meta = meta,
        Effect::Append { rows, skipped } => {
            if matches!(&cache.newest, Some(n) if skipped.contains(&n.turn)) {
                cache.newest = None;
            }
            for row in rows {
                let Some(n) = cache.newest.as_mut() else {
                    continue;
                };
                if n.turn == row.turn {
                    if !matches!(n.rows.last(), Some(l) if l.seq >= row.seq) {
                        n.rows.push(Row {
                            raw: owned(&row.raw),
                            ..row
                        });
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
                        n.rows[i].raw = ByteString::from(&*raw);
                        n.rows[i].from_response = false;
                        n.valid = n.valid.min(i);
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

/// What [`write_session_files`] wrote.
pub(crate) struct FilesWritten {
    pub(crate) turns: u32,
    pub(crate) removed: u32,
    pub(crate) page: bool,
}

/// Write every file of a session from its active line (`visible`, by
/// turn): each turn file and its line index, `index.md` (turn files the
/// line no longer has removed) and `SESSION.md`. `done(rows)` is told after
/// each turn.
pub(crate) fn write_session_files(
    src: &dyn Source,
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
    dir.create_dir(&tdir).map_err(io_err(&tdir))?;
    let mut summaries = Vec::with_capacity(visible.len());
    for (turn, rows) in visible {
        let path = dir.turn_file(session, *turn);
        let (text, index) = transcript::render_turn_indexed(dialect, *turn, rows);
        dir.write_atomic(&path, text.as_bytes())
            .map_err(io_err(&path))?;
        let path = dir.rows_file(session, *turn);
        dir.write_atomic(&path, index.render().as_bytes())
            .map_err(io_err(&path))?;
        if let Some(s) = transcript::summarize_turn(dialect, *turn, rows) {
            summaries.push(s);
        }
        out.turns += 1;
        done(rows.len() as u64);
    }
    // Turn files the active line no longer has.
    for name in dir.list_dir(&tdir).map_err(io_err(&tdir))? {
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
            let path = tdir.join(&name);
            dir.remove_file(&path).map_err(io_err(&path))?;
            out.removed += u32::from(!sidecar);
        }
    }
    let path = dir.index_file(session);
    dir.write_atomic(&path, transcript::render_index(meta, &summaries).as_bytes())
        .map_err(io_err(&path))?;
    let mut page = page_io::new_page(src, session)?;
    page_io::advance_page(src, session, dialect, &mut page)?;
    out.page = page_io::write_page(dir, session, &page, &mut None)?;
    Ok(out)
}

/// Write every file of a session again from the database (the search index
/// is left alone): the writer's heal of a session whose file writes failed,
/// whose files are missing, or another machine's `ledger rebuild`.
pub(crate) fn rewrite_session_files(
    src: &dyn Source,
    dir: &DataDir,
    session: &str,
) -> Result<FilesWritten, StoreError> {
    let meta = src
        .session_meta(session)?
        .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
    let mut visible: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
    for row in src.visible_rows(session)? {
        visible.entry(row.turn).or_default().push(row);
    }
    write_session_files(src, dir, &meta, &visible, &mut |_| {})
}

/// Create the files of a session that are missing (`turns` of its active
/// line, `index`: its `index.md`), never replacing one; returns how many it
/// wrote. The heal at open of a kill -9 between a commit and its files.
pub(super) fn fill_missing(
    src: &dyn Source,
    dir: &DataDir,
    session: &str,
    turns: &[u32],
    index: bool,
) -> Result<usize, StoreError> {
    let meta = src
        .session_meta(session)?
        .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
    let tdir = dir.transcript_dir(session);
    dir.create_dir(&tdir).map_err(io_err(&tdir))?;
    let mut written = 0;
    for &turn in turns {
        let rows = src.turn_rows(session, turn)?;
        let path = dir.turn_file(session, turn);
        let (text, index) = transcript::render_turn_indexed(meta.dialect, turn, &rows);
        written += usize::from(
            dir.write_new(&path, text.as_bytes())
                .map_err(io_err(&path))?,
        );
        let path = dir.rows_file(session, turn);
        dir.write_new(&path, index.render().as_bytes())
            .map_err(io_err(&path))?;
    }
    if index {
        let turns: Vec<TurnSummary> = src
            .turn_summaries(session, meta.dialect)?
            .into_values()
            .collect();
        let path = dir.index_file(session);
        let text = transcript::render_index(&meta, &turns);
        written += usize::from(
            dir.write_new(&path, text.as_bytes())
                .map_err(io_err(&path))?,
        );
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::super::effects::Outcome;
    use super::*;
    use crate::model::RowKind;

    fn row(seq: u64, turn: u32) -> Row {
        Row {
            seq,
            role: "user".into(),
            kind: RowKind::ToolResult,
            raw: "{}".into(),
            tokens: 1,
            turn,
            step: 1,
            branch: 0,
            from_response: false,
        }
    }

    fn cached(turn: u32, seqs: &[u64]) -> SessionCache {
        SessionCache {
            newest_bytes: 0,
            meta: crate::test_support::meta("s", "unknown"),
            summaries: None,
            newest: Some(TurnCache {
                turn,
                rows: seqs.iter().map(|&s| row(s, turn)).collect(),
                sections: HashMap::new(),
                index: None,
                valid: 0,
            }),
            dir_ready: false,
            last_used: 0,
            page: None,
            page_hash: None,
            index_dirty: false,
        }
    }

    fn newest_seqs(cache: &SessionCache) -> Option<(u32, Vec<u64>)> {
        cache
            .newest
            .as_ref()
            .map(|n| (n.turn, n.rows.iter().map(|r| r.seq).collect()))
    }

    #[test]
    fn rows_written_copies_only_the_first_and_last_turns_rows_for_the_caches() {
        let effect = |rows: &[Row]| {
            let Outcome::Applied(change) = super::super::apply::rows_written(rows) else {
                panic!("not applied");
            };
            let Some(Effect::Append {
                rows: kept,
                skipped,
            }) = change.effect
            else {
                panic!("not an append");
            };
            let seqs: Vec<u64> = kept.iter().map(|r| r.seq).collect();
            (change.turns, seqs, skipped)
        };
        let rows: Vec<Row> = [(1, 3), (2, 3), (3, 4), (4, 4), (5, 5), (6, 6), (7, 6)]
            .iter()
            .map(|&(seq, turn)| row(seq, turn))
            .collect();
        assert_eq!(
            effect(&rows),
            (vec![3, 4, 5, 6], vec![1, 2, 6, 7], vec![4, 5])
        );
        // One turn: every row.
        assert_eq!(
            effect(&[row(8, 2), row(9, 2)]),
            (vec![2], vec![8, 9], vec![])
        );
    }

    #[test]
    fn an_append_grows_the_cached_turn_with_its_rows() {
        let mut cache = cached(4, &[1, 2]);
        let rows = vec![row(3, 4), row(4, 5)];
        apply_effect(
            &mut cache,
            Effect::Append {
                rows,
                skipped: Vec::new(),
            },
        );
        assert_eq!(newest_seqs(&cache), Some((4, vec![1, 2, 3])));
    }

    #[test]
    fn an_append_that_skipped_the_cached_turn_drops_the_cache() {
        // The event's rows of turn 4 were not copied: the turn is read back.
        let mut cache = cached(4, &[1, 2]);
        apply_effect(
            &mut cache,
            Effect::Append {
                rows: vec![row(5, 6)],
                skipped: vec![4, 5],
            },
        );
        assert_eq!(newest_seqs(&cache), None);
    }
}
