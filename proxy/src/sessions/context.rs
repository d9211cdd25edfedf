//! The hook of the context edits into a session's requests: before the
//! window is rendered, an edit of the exported `context.txt` is read (a
//! stat when nothing changed) and taken or refused; after it, the file is
//! refreshed behind the request. `context` (the command and the admin API)
//! exports, edits without the file, and evicts.

use super::state::State;
use super::window::{self, facts, Window};
use super::{now_ms, Session, SessionManager};
use crate::context::edits::{self, Change, Ctx, EditSet, Refusal, Src, Taken};
use crate::context::live::{Slot, SlotState, Stamp};
use crate::context::{file, io, receipt};
use crate::dialect::ParsedBody;
use bytes::Bytes;
use oceancode_window::Event;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// An edit taken on trial: the set it replaced, what it did.
pub(super) struct Pending {
    old: EditSet,
    taken: Taken,
    /// The export it was read against.
    nonce: String,
}

/// An RFC 3339 UTC time for receipts.
fn when() -> String {
    let ms = now_ms();
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Apply `changes` to the session's edit set against this request's rows.
fn take(
    st: &State,
    parsed: &ParsedBody<'_>,
    changes: &[Change],
) -> Result<(EditSet, Taken), Refusal> {
    let at: HashMap<u64, usize> = st.active.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    let raw =
        |seq: u64| -> Option<&str> { at.get(&seq).and_then(|&i| parsed.messages.get(i).copied()) };
    let ctx = Ctx {
        dialect: st.dialect,
        line: &st.active,
        facts: facts(st),
        raw: &raw,
    };
    edits::take(&st.context.set, changes, &ctx)
}

/// An edited `context.txt` read before the session is locked (and off the
/// runtime's worker): the file and what reading it gave.
pub(crate) struct Peek {
    slot: Arc<Slot>,
    read: Result<(Vec<u8>, Stamp), String>,
}

/// Before the session is locked for a request: when the session's exported
/// file changed since the proxy last wrote or read it, read it (the rule of
/// [`io::read_file`]: a regular file only, never through a symlink, never
/// blocking on a FIFO, bounded) with no session held and off the
/// runtime's worker ([`crate::cpu::run`]). None = nothing to read.
pub(crate) fn peek(session: &Session) -> Option<Peek> {
    let slot = session.state.lock().context.slot.clone()?;
    let now = Stamp::of(&slot.path)?;
    // The writer replacing it right now: read at the next request.
    if Some(now) == slot.state.try_lock()?.stamp {
        return None;
    }
    let read = crate::cpu::run(|| io::read(&slot.path));
    Some(Peek { slot, read })
}

/// Before the window: take the edit [`peek`] read, if the file changed
/// since the proxy wrote it. A refused edit leaves its receipt; a taken one
/// is put in force on trial (see [`settle`]). A change [`peek`] did not see
/// is read at the next request.
pub(super) fn read_edit(
    st: &mut State,
    parsed: &ParsedBody<'_>,
    peek: Option<Peek>,
) -> Option<Pending> {
    let slot = st.context.slot.clone()?;
    let now = Stamp::of(&slot.path);
    // The writer replacing it right now: read it at the next request.
    let mut s = slot.state.try_lock()?;
    if now == s.stamp {
        return None;
    }
    let Some(now) = now else {
        drop(s);
        tracing::info!(session = %st.meta.id, "context.txt was removed: it is no longer kept fresh");
        st.context.slot = None;
        return None;
    };
    let peek = peek.filter(|p| Arc::ptr_eq(&p.slot, &slot))?;
    let bytes = match peek.read {
        Ok((bytes, stamp)) => {
            s.stamp = Some(stamp);
            Ok(bytes)
        }
        Err(reason) => {
            s.stamp = Some(now);
            Err(Refusal { line: 0, reason })
        }
    };
    let export = s.export.clone();
    drop(s);
    let nonce = export.nonce.clone();
    let result = bytes
        .and_then(|bytes| {
            file::parse(&bytes).map_err(|u| Refusal {
                line: u.line,
                reason: u.reason,
            })
        })
        .and_then(|f| edits::diff(&export, &f, &st.context.set))
        .and_then(|changes| take(st, parsed, &changes));
    st.context.mint();
    match result {
        Err(r) => {
            tracing::info!(session = %st.meta.id, line = r.line, reason = %r.reason, "context edit refused");
            st.context.receipt = Some(receipt::refused(&nonce, &when(), r.line, &r.reason));
            None
        }
        Ok((set, taken)) => {
            let old = std::mem::replace(&mut st.context.set, set);
            Some(Pending { old, taken, nonce })
        }
    }
}

/// Estimated tokens of a raw message.
fn est(st: &State, raw: &str) -> u64 {
    (raw.len() as f64 / st.bytes_per_token).ceil() as u64
}

/// The window's estimated tokens after `taken` (before: the gauge).
fn tokens_after(st: &State, old: &EditSet, taken: &Taken, before: u64) -> u64 {
    let cut = st.recorded_cut;
    let in_window = |s: &u64| *s > cut && (*s as usize) <= st.rows.len();
    let mut removed = 0u64;
    let mut added = 0u64;
    for s in taken.deleted.iter().filter(|s| in_window(s)) {
        removed += match old.rewritten.get(s) {
            Some(r) => est(st, r),
            None => u64::from(st.row(*s).tokens),
        };
    }
    for s in taken.rewritten.iter().filter(|s| in_window(s)) {
        removed += match old.rewritten.get(s) {
            Some(r) => est(st, r),
            None => u64::from(st.row(*s).tokens),
        };
        added += st.context.set.rewritten.get(s).map_or(0, |r| est(st, r));
    }
    for s in taken.restored.iter().filter(|s| in_window(s)) {
        added += u64::from(st.row(*s).tokens);
        removed += old.rewritten.get(s).map_or(0, |r| est(st, r));
    }
    for n in &st.context.set.notes {
        if taken.notes_added.contains(&n.id) || taken.notes_changed.contains(&n.id) {
            added += est(st, &n.raw);
        }
    }
    for n in &old.notes {
        if taken.notes_removed.contains(&n.id) || taken.notes_changed.contains(&n.id) {
            removed += est(st, &n.raw);
        }
    }
    (before + added).saturating_sub(removed)
}

/// After the window: keep the edit on trial, or give it up when the
/// request it made was invalid (the window is rendered again without it).
/// A kept edit is a ledger event and a receipt.
pub(super) fn settle(
    settings: &super::Settings,
    st: &mut State,
    parsed: &ParsedBody<'_>,
    pending: Option<Pending>,
    window: Window,
    events: &mut Vec<Event>,
) -> Window {
    let Some(p) = pending else {
        if let Some(e) = &window.edit_error {
            // Never silent: the receipt says what was sent.
            tracing::warn!(session = %st.meta.id, error = %e, "the context edits in force were not applied: the request would be invalid");
            let text = receipt::unapplied(&st.context.nonce, &when(), e);
            st.context.last_receipt = Some(text.clone());
            st.context.receipt = Some(text);
        }
        return window;
    };
    let nonce = p.nonce.clone();
    if let Some(e) = window.edit_error {
        st.context.set = p.old;
        st.context.receipt = Some(receipt::refused(
            &nonce,
            &when(),
            0,
            &format!("the edit leaves the request invalid: {e}"),
        ));
        return window::render(settings, st, parsed);
    }
    let before = st.meter.gauge;
    let after = tokens_after(st, &p.old, &p.taken, before);
    let at = edits::note_anchors(window.layout.iter().flatten().copied());
    st.context.receipt = Some(receipt::taken(
        &nonce,
        &when(),
        &p.taken,
        (before, after),
        &at,
        true,
    ));
    if !p.taken.is_empty() {
        record(st, &p.taken, before, after, events);
    }
    window
}

/// The ledger event of a taken edit.
fn record(st: &mut State, taken: &Taken, before: u64, after: u64, events: &mut Vec<Event>) {
    st.context.taken += 1;
    tracing::info!(session = %st.meta.id, edit = st.context.taken, seqs = ?taken.seqs(), before, after, "context edit taken");
    events.push(Event::ContextEdit {
        session: st.meta.id.clone(),
        n: st.context.taken,
        set: serde_json::to_string(&st.context.set).unwrap_or_default(),
        seqs: taken.seqs(),
        tokens_before: before,
        tokens_after: after,
        ts_ms: now_ms(),
    });
}

/// A session read back from the ledger (a restart, idle eviction): its
/// exported file is kept fresh again from its saved record, and its nonces
/// go on from the highest one written.
pub(super) fn resume(data_dir: &std::path::Path, st: &mut State) {
    let slot = slot_of(data_dir, &st.meta.id);
    let there = |p: &std::path::Path| std::fs::symlink_metadata(p).is_ok();
    if !there(&slot.path) && !there(&io::saved_path(&slot.path)) {
        return;
    }
    let (state, floor) = io::resume(&st.meta.id, &slot.path);
    st.context.floor(floor);
    if let Some(state) = state {
        st.context.nonce = state.export.nonce.clone();
        *slot.state.lock() = state;
        tracing::debug!(session = %st.meta.id, nonce = %st.context.nonce, "context.txt is kept fresh again");
        st.context.slot = Some(slot);
    }
}

/// Keep what the window was made of, for an export.
pub(super) fn remember(st: &mut State, window: &mut Window) {
    st.context.layout = window.layout.take();
    st.context.stub = window.stub.take();
}

/// Behind the request: refresh an exported file from the body sent.
pub(super) fn refresh(session: &Session, out: &Bytes) {
    let mut st = session.state.lock();
    let Some(slot) = st.context.slot.clone() else {
        return;
    };
    let layout = match &st.context.layout {
        Some(l) => l.clone(),
        None => st.active.iter().map(|&s| Src::Row(s)).collect(),
    };
    let receipt = st.context.receipt.take();
    if let Some(r) = &receipt {
        st.context.last_receipt = Some(r.clone());
    }
    io::submit(io::Job {
        slot,
        dialect: st.dialect,
        nonce: st.context.nonce.clone(),
        body: out.clone(),
        layout,
        notes: st.context.set.notes.clone(),
        receipt,
    });
}

/// What `context` (the command, the admin API) answers.
#[derive(Debug, serde::Serialize)]
pub struct ContextAnswer {
    /// Ledger session id.
    pub session: String,
    /// `sessions/<id>/context.txt`.
    pub path: PathBuf,
    /// `sessions/<id>/context.receipt.txt`.
    pub receipt_path: PathBuf,
    /// The export's nonce.
    pub nonce: String,
    /// Messages in the export.
    pub messages: usize,
    /// The receipt of an edit made without the file.
    pub receipt: Option<String>,
}

fn slot_of(dir: &std::path::Path, id: &str) -> Arc<Slot> {
    let sdir = oceancode_ledger::paths::DataDir::new(dir).session_dir(id);
    Arc::new(Slot {
        session: id.to_string(),
        path: sdir.join("context.txt"),
        receipt: sdir.join("context.receipt.txt"),
        state: parking_lot::Mutex::new(SlotState::default()),
    })
}

impl SessionManager {
    /// `context`: write the session's last window to its `context.txt`
    /// (`rows`: the ledger's raw rows by seq, settled) and keep it fresh
    /// from then on. A fresh export: a new nonce, whatever the file held.
    pub fn export_context(
        &self,
        session: &Session,
        rows: &HashMap<u64, Arc<str>>,
    ) -> Result<ContextAnswer, String> {
        let mut st = session.state.lock();
        let slot = match &st.context.slot {
            Some(s) => s.clone(),
            None => slot_of(&self.settings.data_dir, &st.meta.id),
        };
        let layout = match &st.context.layout {
            Some(l) => l.clone(),
            None => st.active.iter().map(|&s| Src::Row(s)).collect(),
        };
        let notes = &st.context.set.notes;
        // Tool results as the upstream saw them (`context.seq_tags`).
        let tagged: HashMap<u64, String> = if st.context.seq_tags {
            layout
                .iter()
                .filter_map(|src| match src {
                    Src::Row(s) if !st.row(*s).closes().is_empty() => rows
                        .get(s)
                        .and_then(|r| crate::context::seq_tag::tag(st.dialect, r, *s))
                        .map(|t| (*s, t)),
                    _ => None,
                })
                .collect()
        } else {
            HashMap::new()
        };
        let mut pieces: Vec<(Src, &str)> = Vec::with_capacity(layout.len());
        for src in &layout {
            let raw = match src {
                Src::Row(s) => tagged
                    .get(s)
                    .map(String::as_str)
                    .or_else(|| rows.get(s).map(|r| &**r)),
                Src::Edited(s) => st.context.set.rewritten.get(s).map(String::as_str),
                Src::Note(id) => notes.iter().find(|n| n.id == *id).map(|n| n.raw.as_str()),
                Src::Fixed(_) => st.context.stub.as_deref(),
                Src::Tail => None,
            };
            match raw {
                Some(r) => pieces.push((*src, r)),
                None if matches!(src, Src::Row(_)) => {
                    return Err(format!(
                        "the ledger does not hold every row of session {} yet (it is behind); try again after its next request",
                        st.meta.id
                    ))
                }
                None => {}
            }
        }
        let nonce = crate::context::live::nonce(st.context.exports + 1);
        let (text, record) = io::render(st.dialect, &st.meta.id, &nonce, &pieces, notes);
        let messages = record
            .blocks
            .iter()
            .filter(|b| matches!(b, edits::Exported::Row { .. }))
            .count();
        slot.state.lock().stamp = None;
        io::replace(&slot, &text, record)
            .map_err(|e| format!("cannot write {}: {e}", slot.path.display()))?;
        st.context.exports += 1;
        st.context.nonce.clone_from(&nonce);
        st.context.slot = Some(slot.clone());
        Ok(ContextAnswer {
            session: st.meta.id.clone(),
            path: slot.path.clone(),
            receipt_path: slot.receipt.clone(),
            nonce,
            messages,
            receipt: None,
        })
    }

    /// `context --drop/--keep/--note`: the same edit without the file,
    /// taken (or refused) now against the session's line; it applies from
    /// the next request. The receipt is written and returned.
    pub fn edit_context(
        &self,
        session: &Session,
        drop: &[String],
        keep: &[u64],
        note: Option<&str>,
        rows: &HashMap<u64, Arc<str>>,
    ) -> Result<String, String> {
        let mut st = session.state.lock();
        let ids = |id: &str| -> Option<u64> {
            // The row that makes the call of that id.
            let h = crate::dialect::raw_hash(id);
            st.active
                .iter()
                .copied()
                .find(|&s| st.row(s).opens().contains(&h))
        };
        let spans = edits::drop_spans(drop, keep, &st.active, &ids, facts(&st))?;
        let mut changes: Vec<Change> = spans
            .into_iter()
            .map(|seq| Change::Delete { seq, line: 0 })
            .collect();
        if let Some(text) = note.filter(|t| !t.trim().is_empty()) {
            changes.push(Change::NoteNew {
                after: st.active.last().copied().unwrap_or(0),
                text: text.trim().to_string(),
            });
        }
        Ok(self.take_now(&mut st, &changes, rows))
    }

    /// The changes an edited file would make (delete, rewrite, restore,
    /// notes), taken or refused now like [`SessionManager::edit_context`]:
    /// what tests and the window fuzz target edit with, without a file.
    /// Returns the receipt.
    pub fn edit_changes(
        &self,
        session: &Session,
        changes: &[Change],
        rows: &HashMap<u64, Arc<str>>,
    ) -> String {
        let mut st = session.state.lock();
        self.take_now(&mut st, changes, rows)
    }

    /// The seqs of a session's active line and the notes in force (tests,
    /// fuzzing).
    pub fn context_line(&self, session: &Session) -> (Vec<u64>, Vec<u32>) {
        let st = session.state.lock();
        (
            st.active.clone(),
            st.context.set.notes.iter().map(|n| n.id).collect(),
        )
    }

    /// Take `changes` now against the session's line and its last window;
    /// the receipt (also written to the file next to context.txt).
    fn take_now(
        &self,
        st: &mut State,
        changes: &[Change],
        rows: &HashMap<u64, Arc<str>>,
    ) -> String {
        let raw = |seq: u64| -> Option<&str> { rows.get(&seq).map(|r| &**r) };
        let ctx = Ctx {
            dialect: st.dialect,
            line: &st.active,
            facts: facts(st),
            raw: &raw,
        };
        let nonce = st.context.nonce.clone();
        let result = edits::take(&st.context.set, changes, &ctx).and_then(|(set, taken)| {
            // The last window with the new set must stay valid.
            let layout: Vec<(Src, &str)> = match &st.context.layout {
                Some(l) => l.iter().map(|s| (*s, "")).collect(),
                None => st.active.iter().map(|&s| (Src::Row(s), "")).collect(),
            };
            // Rows the old set left out are back in the window to check.
            let base: Vec<(Src, &str)> = layout
                .into_iter()
                .map(|(s, r)| match s {
                    Src::Edited(q) => (Src::Row(q), r),
                    other => (other, r),
                })
                .filter(|(s, _)| !matches!(s, Src::Note(_)))
                .collect();
            let applied = edits::apply(&set, &base, facts(st));
            edits::check(st.dialect, &applied, facts(st)).map_err(|e| Refusal {
                line: 0,
                reason: format!("the edit leaves the request invalid: {e}"),
            })?;
            let at = edits::note_anchors(applied.iter().map(|p| p.0));
            Ok((set, taken, at))
        });
        let text = match result {
            Err(r) => receipt::refused(&nonce, &when(), r.line, &r.reason),
            Ok((set, taken, at)) => {
                let old = std::mem::replace(&mut st.context.set, set);
                let before = st.meter.gauge;
                let after = tokens_after(st, &old, &taken, before);
                let mut events = Vec::new();
                if !taken.is_empty() {
                    record(st, &taken, before, after, &mut events);
                }
                st.emit(&self.sink, events);
                // Nothing was sent with it yet: the next request is.
                receipt::taken(&nonce, &when(), &taken, (before, after), &at, false)
            }
        };
        st.context.last_receipt = Some(text.clone());
        let slot = match &st.context.slot {
            Some(s) => s.clone(),
            None => slot_of(&self.settings.data_dir, &st.meta.id),
        };
        if let Err(e) = io::write_receipt(&slot, &text) {
            // The edit stands (or was refused) either way; `context
            // --receipt` still answers from memory.
            tracing::warn!(session = %st.meta.id, error = %e, "cannot write {}", slot.receipt.display());
        }
        text
    }

    /// The last receipt of a session (in memory, else its file).
    pub fn context_receipt(&self, session: &Session) -> Option<String> {
        let slot = {
            let st = session.state.lock();
            if let Some(r) = &st.context.last_receipt {
                return Some(r.clone());
            }
            slot_of(&self.settings.data_dir, &st.meta.id)
        };
        // The agent can write the session dir: the rule of `io::read_file`.
        let (bytes, _) = io::read_file(&slot.receipt, io::MAX_RECEIPT_BYTES).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// How far `evict` cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evict {
    /// Down to this percent of the session's line.
    Percent(u8),
    /// Every turn up to this one.
    Through(u32),
}

impl Evict {
    /// `50%`, `through 3` (none: 50%). A bare number is refused with both
    /// readings: it could mean a share or a turn.
    pub fn parse(words: &[String]) -> Result<Evict, String> {
        let usage = "evict takes PERCENT (e.g. 50%: down to that share of the session's line) or `through TURN`";
        match words {
            [] => Ok(Evict::Percent(50)),
            [w] => {
                let Some(p) = w.strip_suffix('%') else {
                    return Err(match w.parse::<u32>() {
                        Ok(n) => format!(
                            "{w:?}: write `{n}%` (down to {n}% of the session's line) or `through {n}` (every turn up to turn {n})"
                        ),
                        Err(_) => format!("{w:?}: {usage}"),
                    });
                };
                let p: u8 = p.trim().parse().map_err(|_| format!("{w:?}: {usage}"))?;
                if p == 0 || p >= 100 {
                    return Err(format!("{w:?}: the percent is between 1 and 99"));
                }
                Ok(Evict::Percent(p))
            }
            [t, n] if t == "through" => n
                .parse()
                .map(Evict::Through)
                .map_err(|_| format!("{n:?} is not a turn number: {usage}")),
            _ => Err(usage.into()),
        }
    }
}

/// What `evict` did.
#[derive(Debug, serde::Serialize)]
pub struct Evicted {
    /// Ledger session id.
    pub session: String,
    /// Every row up to this seq leaves the window at the next request.
    pub upto: u64,
    /// Estimated tokens that leave.
    pub tokens: u64,
}

impl SessionManager {
    /// `evict`: cut now (from the next request, which records the cut like
    /// any other) down to a percent of the session's line or through a
    /// turn. It cuts inside a turn too, at a row a window may start at (a
    /// tool call stays with its result), as `tideline now` does: the newest
    /// ask and the newest step always stay. When nothing can leave, the
    /// error says what would act.
    pub fn evict(&self, session: &Session, how: Evict) -> Result<Evicted, String> {
        let mut st = session.state.lock();
        // It builds on what a request in flight holds (see `hold`).
        st.release_hold(&self.sink);
        let cut = st.tideline.cut_upto();
        // Every row but the newest step (the last row) may leave; the
        // newest ask is kept by the window plan (pinned after the stub).
        let newest_ask = st
            .active
            .iter()
            .rev()
            .copied()
            .find(|&s| st.row(s).kind == oceancode_window::RowKind::Prompt);
        let last = st.active.last().copied().unwrap_or(0);
        let candidates: Vec<u64> = st
            .active
            .iter()
            .copied()
            .filter(|&s| s > cut && s != last)
            .collect();
        // The rows a cut up to `upto` takes out of the window: up to where
        // the window can start, but the ask it keeps after the stub.
        let leaving = |upto: u64| -> Vec<u64> {
            if upto <= cut {
                return Vec::new();
            }
            let infos = st.row_infos();
            let plan = oceancode_window::tideline::plan_window(&infos, upto);
            let pinned = plan.pinned_prompt.and_then(|i| infos.get(i)).map(|r| r.seq);
            candidates
                .iter()
                .copied()
                .filter(|&s| s <= plan.effective_upto_seq && Some(s) != pinned)
                .collect()
        };
        let all = candidates.last().copied().unwrap_or(0);
        if leaving(all).is_empty() {
            return Err(format!(
                "nothing to evict yet: the window holds only the newest ask and its latest step{}; rows the next requests add can leave (`tideline now` cuts then)",
                if cut > 0 { format!(" after the cut at seq {cut}") } else { String::new() }
            ));
        }
        let newest_turn = st.row(last).turn;
        let upto = match how {
            Evict::Through(turn) => candidates
                .iter()
                .copied()
                .filter(|&s| st.row(s).turn <= turn)
                .max()
                .unwrap_or(0),
            Evict::Percent(p) => {
                let line = match st.meter.line {
                    0 => st
                        .meter
                        .context
                        .ok_or("the session's line is not known yet: give `through TURN`")?,
                    l => l,
                };
                let target = line * u64::from(p) / 100;
                let mut gauge = st.meter.gauge;
                let mut upto = 0;
                for &s in &candidates {
                    if gauge <= target {
                        break;
                    }
                    if Some(s) != newest_ask {
                        gauge = gauge.saturating_sub(u64::from(st.row(s).tokens));
                    }
                    upto = s;
                }
                if upto == 0 {
                    let tokens = oceancode_ledger::status::tokens;
                    return Err(format!(
                        "nothing to evict: the window ({}) is already under {p}% of the line ({} of {}); a lower share or `evict through {newest_turn}` cuts",
                        tokens(st.meter.gauge),
                        tokens(target),
                        tokens(line)
                    ));
                }
                upto
            }
        };
        let rows = leaving(upto);
        if rows.is_empty() {
            return Err(match how {
                Evict::Through(turn) => format!(
                    "nothing to evict through turn {turn}: its rows have left the window already (up to seq {cut}); `evict through {newest_turn}` cuts inside the newest turn"
                ),
                Evict::Percent(p) => format!(
                    "nothing to evict down to {p}%: no row up to there can start a window (a tool call stays with its result); `evict through {newest_turn}` cuts what can leave"
                ),
            });
        }
        let tokens = rows.iter().map(|&s| u64::from(st.row(s).tokens)).sum();
        st.tideline.drop_through(upto);
        let plan = oceancode_window::tideline::plan_window(&st.row_infos(), st.tideline.cut_upto());
        Ok(Evicted {
            session: st.meta.id.clone(),
            upto: plan.effective_upto_seq.max(upto),
            tokens,
        })
    }
}
