//! The edit set and what it does to a window (pure): which rows are
//! deleted, rewritten or restored and which notes the agent wrote; the
//! changes an edited file makes against its export; the closure that keeps
//! every request valid (a deleted tool call takes its results, a deleted
//! result its call and that call's other results, a reasoning item goes with
//! what it binds to); where a note goes; and the check of the result.

use super::body;
use super::file::{self, FileBlock, Header, ParsedFile};
use oceancode_window::{Dialect, RowKind};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// A note of the agent's (or the user's): text read as the agent's own
/// words, kept until deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    /// Its id (`[[note ID]]`).
    pub id: u32,
    /// The seq of the block it follows in the file (0 = before all).
    pub after: u64,
    /// The text.
    pub text: String,
    /// The assistant message carrying it, in the session's dialect.
    pub raw: String,
}

/// What the session's taken edits do to every later request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EditSet {
    /// Rows left out.
    pub deleted: BTreeSet<u64>,
    /// Rows sent as this JSON instead.
    pub rewritten: BTreeMap<u64, String>,
    /// Notes, in the order written.
    pub notes: Vec<Note>,
    /// The next note's id.
    pub next_note: u32,
}

impl EditSet {
    /// Nothing edited.
    pub fn is_empty(&self) -> bool {
        self.deleted.is_empty() && self.rewritten.is_empty() && self.notes.is_empty()
    }

    /// Every seq it touches.
    pub fn seqs(&self) -> BTreeSet<u64> {
        self.deleted
            .iter()
            .chain(self.rewritten.keys())
            .copied()
            .collect()
    }

    /// Edits of rows that left the window leave with them (`upto`: the last
    /// row that left; notes stay).
    pub fn forget_through(&mut self, upto: u64) {
        self.deleted.retain(|s| *s > upto);
        self.rewritten.retain(|s, _| *s > upto);
    }
}

/// Where a piece of a rendered window comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Src {
    /// A row of the active line, as the client sent it.
    Row(u64),
    /// A row sent as the edit set rewrote it.
    Edited(u64),
    /// A note.
    Note(u32),
    /// What the proxy adds, not editable (`stub`, `state`).
    Fixed(&'static str),
    /// A message past the recorded line (a count request's new tail).
    Tail,
}

impl Src {
    /// The row's seq, for a row.
    pub fn seq(self) -> Option<u64> {
        match self {
            Src::Row(s) | Src::Edited(s) => Some(s),
            _ => None,
        }
    }
}

/// What validity needs of a row.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// Its kind.
    pub kind: RowKind,
    /// Tool calls it makes (hashed ids).
    pub opens: &'a [u64],
    /// Tool calls it answers (hashed ids).
    pub closes: &'a [u64],
    /// It must stay with the item after it (a Responses reasoning item).
    pub binds_next: bool,
}

const NO_FACTS: Facts<'static> = Facts {
    kind: RowKind::Other,
    opens: &[],
    closes: &[],
    binds_next: false,
};

/// The assistant message carrying a note's text (the dialect's
/// [`oceancode_window::dialect::DialectSpec::assistant_message`]).
pub fn note_raw(d: Dialect, text: &str) -> String {
    oceancode_window::dialect::spec(d).assistant_message(text)
}

/// The window with the edit set applied: deleted rows left out, rewritten
/// ones replaced, each note where it stands in the file: right after the
/// block it follows, or, where an assistant message may not go there (a
/// tool call still open, an item bound to the next, the window's end), at
/// the first place after it where one may (else the last before it).
/// Pieces before the first edited one are the same slices, byte for byte.
pub fn apply<'a, 'f>(
    set: &'a EditSet,
    pieces: &[(Src, &'a str)],
    facts: impl Fn(u64) -> Facts<'f>,
) -> Vec<(Src, &'a str)> {
    if set.is_empty() {
        return pieces.to_vec();
    }
    let mut kept: Vec<(Src, &'a str)> = Vec::with_capacity(pieces.len() + set.notes.len());
    for &(src, raw) in pieces {
        match src {
            Src::Row(seq) if set.deleted.contains(&seq) => {}
            Src::Row(seq) => match set.rewritten.get(&seq) {
                Some(r) => kept.push((Src::Edited(seq), r.as_str())),
                None => kept.push((src, raw)),
            },
            _ => kept.push((src, raw)),
        }
    }
    if set.notes.is_empty() {
        return kept;
    }
    let mut at: BTreeMap<usize, Vec<&'a Note>> = BTreeMap::new();
    let places = note_places(&kept, &facts);
    for n in &set.notes {
        if let Some(k) = note_place(&kept, &places, n.after) {
            at.entry(k).or_default().push(n);
        }
    }
    let mut out = Vec::with_capacity(kept.len() + set.notes.len());
    for (k, piece) in kept.into_iter().enumerate() {
        if let Some(notes) = at.get(&k) {
            out.extend(notes.iter().map(|n| (Src::Note(n.id), n.raw.as_str())));
        }
        out.push(piece);
    }
    out
}

/// Where an assistant message may be put before piece `k` of `pieces`
/// (`k` in `1..len`: never first, never last, where it would be a prefill):
/// something other than system rows comes before it (the API wants the
/// user's first), every tool call made before it has its result, and the
/// piece before it binds to nothing.
fn note_places<'f>(pieces: &[(Src, &str)], facts: &impl Fn(u64) -> Facts<'f>) -> Vec<bool> {
    let mut ok = vec![false; pieces.len()];
    let mut open: HashSet<u64> = HashSet::new();
    let mut said = false;
    let mut binds = false;
    for (k, (src, _)) in pieces.iter().enumerate() {
        ok[k] = k > 0 && said && open.is_empty() && !binds;
        let f = src.seq().map_or(NO_FACTS, facts);
        for c in f.closes {
            open.remove(c);
        }
        open.extend(f.opens.iter().copied());
        binds = f.binds_next;
        said |= match src {
            Src::Fixed(_) => true,
            Src::Tail => false,
            _ => f.kind != RowKind::System,
        };
    }
    ok
}

/// The place of a note written after the block of seq `after` (0 = before
/// every block): the index it goes before.
fn note_place(pieces: &[(Src, &str)], places: &[bool], after: u64) -> Option<usize> {
    // Right after the last block at or before its anchor (the anchor itself
    // may have left: deleted, or cut).
    let from = pieces
        .iter()
        .rposition(|(s, _)| s.seq().is_some_and(|q| q <= after))
        .map_or(0, |i| i + 1);
    (from..places.len())
        .find(|&k| places[k])
        .or_else(|| (0..from.min(places.len())).rev().find(|&k| places[k]))
}

/// Where each note of a window [`apply`] made stands: the seq of the
/// message before it (0 = none).
pub fn note_anchors(srcs: impl IntoIterator<Item = Src>) -> Vec<(u32, u64)> {
    let mut last = 0;
    let mut out = Vec::new();
    for src in srcs {
        match src {
            Src::Note(id) => out.push((id, last)),
            s => {
                if let Some(q) = s.seq() {
                    last = q;
                }
            }
        }
    }
    out
}

/// Check a window the edit set produced: every result answers a call made
/// before it, no ask comes while a call is open, an item bound to the next
/// one has it, and (Anthropic, Gemini) the first message that is not a
/// system one is the user's.
pub fn check<'f>(
    d: Dialect,
    pieces: &[(Src, &str)],
    facts: impl Fn(u64) -> Facts<'f>,
) -> Result<(), String> {
    let mut open: HashSet<u64> = HashSet::new();
    let mut first = true;
    let mut prev_binds: Option<Src> = None;
    for (src, _) in pieces {
        let f = src.seq().map_or(NO_FACTS, &facts);
        if let Some(b) = prev_binds.take() {
            if !matches!(src, Src::Row(_) | Src::Edited(_)) {
                return Err(format!(
                    "seq {} must stay with the item after it",
                    b.seq().unwrap_or(0)
                ));
            }
        }
        let is_system = src.seq().is_some() && f.kind == RowKind::System;
        let user_first = oceancode_window::dialect::spec(d).user_first();
        if user_first && first && !is_system && !matches!(src, Src::Tail) {
            let assistant = matches!(src, Src::Note(_)) || f.kind == RowKind::Assistant;
            if assistant {
                return Err(
                    "the first message would be the assistant's (the API wants the user's first)"
                        .into(),
                );
            }
            first = false;
        }
        for c in f.closes {
            if !open.remove(c) {
                return Err(format!(
                    "seq {} answers a tool call the window no longer holds",
                    src.seq().unwrap_or(0)
                ));
            }
        }
        if !open.is_empty() && f.closes.is_empty() && f.opens.is_empty() && !f.binds_next {
            return Err(match src.seq() {
                Some(s) => format!("a tool call before seq {s} would be left without its result"),
                None => "a tool call would be left without its result".to_string(),
            });
        }
        open.extend(f.opens.iter().copied());
        if f.binds_next {
            prev_binds = Some(*src);
        }
    }
    Ok(())
}

/// Close a set of rows to delete (or restore) over what ties rows
/// together on the line: a call and its results (parallel calls: every
/// result of the message), a reasoning item and the item after it.
pub fn close_over<'f>(rows: &mut BTreeSet<u64>, line: &[u64], facts: impl Fn(u64) -> Facts<'f>) {
    let mut by_call: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut pos: HashMap<u64, usize> = HashMap::with_capacity(line.len());
    for (i, &seq) in line.iter().enumerate() {
        pos.insert(seq, i);
        let f = facts(seq);
        for c in f.opens.iter().chain(f.closes) {
            by_call.entry(*c).or_default().push(seq);
        }
    }
    let mut work: Vec<u64> = rows.iter().copied().collect();
    while let Some(seq) = work.pop() {
        let Some(&i) = pos.get(&seq) else { continue };
        let f = facts(seq);
        let mut tied: Vec<u64> = f
            .opens
            .iter()
            .chain(f.closes)
            .filter_map(|c| by_call.get(c))
            .flatten()
            .copied()
            .collect();
        if i > 0 && facts(line[i - 1]).binds_next {
            tied.push(line[i - 1]);
        }
        if f.binds_next {
            if let Some(&next) = line.get(i + 1) {
                tied.push(next);
            }
        }
        for t in tied {
            if rows.insert(t) {
                work.push(t);
            }
        }
    }
}

/// Rows no edit may delete: the newest ask, and the running round (the
/// last assistant row and what follows it).
pub fn protected<'f>(
    line: &[u64],
    facts: impl Fn(u64) -> Facts<'f>,
) -> BTreeMap<u64, &'static str> {
    let mut out = BTreeMap::new();
    if let Some(&ask) = line
        .iter()
        .rev()
        .find(|&&s| facts(s).kind == RowKind::Prompt)
    {
        out.insert(ask, "the newest ask");
    }
    if let Some(i) = line
        .iter()
        .rposition(|&s| facts(s).kind == RowKind::Assistant)
    {
        for &s in &line[i..] {
            out.entry(s).or_insert("in the running round");
        }
    }
    out
}

/// A block of the export as the proxy wrote it (what an edit is read against).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "b", rename_all = "snake_case")]
pub enum Exported {
    /// A message: its seq and the hash of its body.
    Row {
        /// Ledger seq.
        seq: u64,
        /// xxh3 of [`file::norm`] of the body.
        hash: u64,
    },
    /// A note and the hash of its text.
    Note {
        /// Its id.
        id: u32,
        /// xxh3 of its text.
        hash: u64,
    },
    /// A block the proxy owns.
    Fixed {
        /// `stub`, `state`.
        label: String,
        /// xxh3 of its text.
        hash: u64,
    },
}

/// An export: its nonce, first line and blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Export {
    /// The nonce every header names.
    pub nonce: String,
    /// The first line.
    pub first: String,
    /// Its blocks in order.
    pub blocks: Vec<Exported>,
}

/// Hash of a body as an edit compares it.
pub fn body_hash(body: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(file::norm(body).as_bytes())
}

/// One change an edited file makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A block removed.
    Delete { seq: u64, line: usize },
    /// A removed (or rewritten) block's header written back.
    Restore { seq: u64, line: usize },
    /// A body changed (as the file has it: escaped, see [`body::rewrite`]).
    Rewrite { seq: u64, line: usize, body: String },
    /// A `[[note]]` written.
    NoteNew { after: u64, text: String },
    /// A note's text changed.
    NoteText { id: u32, text: String },
    /// A note removed.
    NoteGone { id: u32 },
}

/// Why an edit is refused: the receipt's reason and line (0 = the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 1-based line of the file (0 = none in particular).
    pub line: usize,
    /// Why.
    pub reason: String,
}

fn refuse<T>(line: usize, reason: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        line,
        reason: reason.into(),
    })
}

/// A block whose body starts with this line is deleted: the edit a file
/// tool makes in one small replacement (a 40k-token block need not be
/// quoted whole to be removed).
pub const DELETE: &str = "[[delete]]";

/// The nonce a first line names (`[[context S export NONCE · …`).
pub fn nonce_of(first: &str) -> Option<&str> {
    let rest = first.strip_prefix("[[context ")?;
    let after = rest.split(" export ").nth(1)?;
    after.split(' ').next()
}

/// The seq range a first line names, and the line with its range and
/// count taken out (what stays the same while an export is refreshed).
fn range_of(first: &str) -> Option<((u64, u64), String)> {
    let (head, rest) = first.split_once(" · seq ")?;
    let (range, rest) = rest.split_once(" · ")?;
    let (a, b) = range.split_once('–')?;
    let (count, tail) = rest.split_once(" · ")?;
    count.strip_suffix(" messages")?.parse::<usize>().ok()?;
    Some(((a.parse().ok()?, b.parse().ok()?), format!("{head}|{tail}")))
}

/// The changes `f` makes against `export`, or why it is refused. `set`
/// says which rows are edited (a removed row's header written back
/// restores it; an edited block emptied restores its original).
///
/// A refresh after a request keeps the export's nonce: it only adds the
/// request's new messages at the end and drops what the tideline cut. A
/// file written by an earlier refresh of the same export is read against
/// the rows its first line covers: rows after them are kept, rows cut
/// since are no longer in the window (their edits leave with them).
pub fn diff(export: &Export, f: &ParsedFile, set: &EditSet) -> Result<Vec<Change>, Refusal> {
    let mut upto = u64::MAX;
    if f.first_line != export.first {
        match nonce_of(&f.first_line) {
            Some(n) if n != export.nonce => {
                return refuse(
                    1,
                    format!(
                        "the edit was made against export {n}, an older one than the latest ({}): the file was written again since (another edit was read, or `context` ran); edit the file as it is now",
                        export.nonce
                    ),
                )
            }
            _ => {}
        }
        match (range_of(&f.first_line), range_of(&export.first)) {
            (Some(((_, b), rest)), Some((_, want))) if rest == want => upto = b,
            _ => {
                return refuse(
                    1,
                    "the first line changed: it names the export and must be kept as written",
                )
            }
        }
    }
    // Every header names the export: the last line too.
    if f.end.0 != export.nonce {
        return refuse(
            f.end.1,
            format!(
                "the last line names export {:?}, the latest is {}: it must be kept as written",
                f.end.0, export.nonce
            ),
        );
    }
    let first_exported = export
        .blocks
        .iter()
        .find_map(|b| match b {
            Exported::Row { seq, .. } => Some(*seq),
            _ => None,
        })
        .unwrap_or(0);
    let mut index: HashMap<u64, (usize, u64)> = HashMap::new();
    let mut notes: HashMap<u32, u64> = HashMap::new();
    let mut fixed: Vec<(&str, u64, bool)> = Vec::new();
    for (i, b) in export.blocks.iter().enumerate() {
        match b {
            Exported::Row { seq, hash } => {
                index.insert(*seq, (i, *hash));
            }
            Exported::Note { id, hash } => {
                notes.insert(*id, *hash);
            }
            Exported::Fixed { label, hash } => fixed.push((label, *hash, false)),
        }
    }
    let mut changes = Vec::new();
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut seen_notes: HashSet<u32> = HashSet::new();
    let mut last_pos: Option<(usize, u64)> = None;
    let mut last_seq = 0u64;
    for FileBlock {
        line,
        header,
        body,
        raw,
    } in &f.blocks
    {
        let line = *line;
        match header {
            Header::Msg { nonce, seq, .. } => {
                if *nonce != export.nonce {
                    return refuse(
                        line,
                        format!(
                            "the block names export {nonce}, the latest is {}: blocks may not come from an older export",
                            export.nonce
                        ),
                    );
                }
                if let Some(first) = seen.insert(*seq, line) {
                    return refuse(
                        line,
                        format!("seq {seq} appears twice (first on line {first})"),
                    );
                }
                last_seq = *seq;
                match index.get(seq) {
                    Some(&(pos, hash)) => {
                        if let Some((p, s)) = last_pos {
                            if pos < p {
                                return refuse(
                                    line,
                                    format!("seq {seq} moved before seq {s}: blocks keep their order"),
                                );
                            }
                        }
                        last_pos = Some((pos, *seq));
                        // As written: a message's own `[[delete]]` line is escaped.
                        if raw.lines().next().map(str::trim_end) == Some(DELETE) {
                            changes.push(Change::Delete { seq: *seq, line });
                        } else if body_hash(body) != hash {
                            if body.trim().is_empty() && set.rewritten.contains_key(seq) {
                                changes.push(Change::Restore { seq: *seq, line });
                            } else if body.trim().is_empty() {
                                return refuse(
                                    line,
                                    format!("seq {seq} was emptied: delete its block (header and body) instead"),
                                );
                            } else {
                                // As written: only an unescaped `[[` line
                                // is a marker of the message.
                                changes.push(Change::Rewrite {
                                    seq: *seq,
                                    line,
                                    body: raw.clone(),
                                });
                            }
                        }
                    }
                    None if set.deleted.contains(seq) => {
                        changes.push(Change::Restore { seq: *seq, line })
                    }
                    // Cut since the file was written: it left the window.
                    None if *seq < first_exported => {}
                    None => {
                        return refuse(
                            line,
                            format!("seq {seq} is not in this export and was not deleted: there is nothing to restore"),
                        )
                    }
                }
            }
            Header::Note(None) => {
                if !body.trim().is_empty() {
                    changes.push(Change::NoteNew {
                        after: last_seq,
                        text: body.trim().to_string(),
                    });
                }
            }
            Header::Note(Some(id)) => {
                if !seen_notes.insert(*id) {
                    return refuse(line, format!("note {id} appears twice"));
                }
                match notes.get(id) {
                    None => {
                        return refuse(
                            line,
                            format!("note {id} is not in this export (a new note is written under a bare [[note]] line)"),
                        )
                    }
                    Some(_) if body.trim().is_empty() => changes.push(Change::NoteGone { id: *id }),
                    Some(&h) if body_hash(body) != h => changes.push(Change::NoteText {
                        id: *id,
                        text: body.trim().to_string(),
                    }),
                    Some(_) => {}
                }
            }
            Header::Fixed(label) => {
                // The proxy writes it (a refresh after a cut changes it):
                // checked against the latest export only.
                if upto != u64::MAX {
                    continue;
                }
                match fixed
                    .iter_mut()
                    .find(|(l, _, seen)| *l == label.as_str() && !*seen)
                {
                    Some((_, h, seen)) => {
                        *seen = true;
                        if body_hash(body) != *h {
                            return refuse(
                                line,
                                format!("the {label} block is not editable (the proxy writes it)"),
                            );
                        }
                    }
                    None => {
                        return refuse(line, format!("a {label} block that is not in this export"))
                    }
                }
            }
        }
    }
    if let Some((label, _, _)) = fixed.iter().find(|(_, _, seen)| !seen && upto == u64::MAX) {
        return refuse(
            0,
            format!("the {label} block was removed: it is not editable (the proxy writes it)"),
        );
    }
    for b in &export.blocks {
        match b {
            Exported::Row { seq, .. } if !seen.contains_key(seq) && *seq <= upto => {
                changes.push(Change::Delete { seq: *seq, line: 0 })
            }
            Exported::Note { id, .. } if !seen_notes.contains(id) => {
                changes.push(Change::NoteGone { id: *id })
            }
            _ => {}
        }
    }
    Ok(changes)
}

/// What an edit is applied against: the session's line and rows.
pub struct Ctx<'a, F> {
    /// The dialect.
    pub dialect: Dialect,
    /// The active line's seqs.
    pub line: &'a [u64],
    /// Validity facts of a row.
    pub facts: F,
    /// The raw JSON of a row as the client sends it.
    pub raw: &'a dyn Fn(u64) -> Option<&'a str>,
}

/// What a taken edit did, for the receipt and the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taken {
    /// Rows deleted (those tied to them included).
    pub deleted: Vec<u64>,
    /// Rows restored.
    pub restored: Vec<u64>,
    /// Rows rewritten.
    pub rewritten: Vec<u64>,
    /// Notes added, changed and removed.
    pub notes_added: Vec<u32>,
    /// Notes whose text changed.
    pub notes_changed: Vec<u32>,
    /// Notes removed.
    pub notes_removed: Vec<u32>,
}

impl Taken {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        *self == Taken::default()
    }

    /// Every seq the edit touched.
    pub fn seqs(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .deleted
            .iter()
            .chain(&self.restored)
            .chain(&self.rewritten)
            .copied()
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The edit set after `changes`, closed over tool pairs and checked against
/// the rows no edit may delete; or why it is refused.
pub fn take<'f, F: Fn(u64) -> Facts<'f> + Copy>(
    set: &EditSet,
    changes: &[Change],
    ctx: &Ctx<'_, F>,
) -> Result<(EditSet, Taken), Refusal> {
    let mut next = set.clone();
    let mut taken = Taken::default();
    let mut delete: BTreeSet<u64> = BTreeSet::new();
    let mut restore: BTreeSet<u64> = BTreeSet::new();
    let mut lines: HashMap<u64, usize> = HashMap::new();
    for c in changes {
        match c {
            Change::Delete { seq, line } => {
                delete.insert(*seq);
                lines.insert(*seq, *line);
            }
            Change::Restore { seq, line } => {
                restore.insert(*seq);
                lines.insert(*seq, *line);
            }
            Change::Rewrite { seq, line, body } => {
                let base = next
                    .rewritten
                    .get(seq)
                    .map(String::as_str)
                    .or_else(|| (ctx.raw)(*seq));
                let Some(base) = base else {
                    return refuse(
                        *line,
                        format!("seq {seq} is no longer on the session's line"),
                    );
                };
                let Some((b, v)) = body::read(ctx.dialect, base) else {
                    return refuse(
                        *line,
                        format!("seq {seq} is not a JSON message and cannot be rewritten"),
                    );
                };
                let raw = body::rewrite(&b, &v, body, *seq).map_err(|u| Refusal {
                    line: line + 1 + u.line,
                    reason: format!("seq {seq}: {}", u.reason),
                })?;
                let original =
                    (ctx.raw)(*seq).and_then(|r| serde_json::from_str::<serde_json::Value>(r).ok());
                let same = original.is_some_and(|o| {
                    serde_json::from_str::<serde_json::Value>(&raw).ok() == Some(o)
                });
                if same {
                    next.rewritten.remove(seq);
                    taken.restored.push(*seq);
                } else {
                    next.rewritten.insert(*seq, raw);
                    taken.rewritten.push(*seq);
                }
            }
            Change::NoteNew { after, text } => {
                next.next_note += 1;
                let id = next.next_note;
                next.notes.push(Note {
                    id,
                    after: *after,
                    text: text.clone(),
                    raw: note_raw(ctx.dialect, text),
                });
                taken.notes_added.push(id);
            }
            Change::NoteText { id, text } => {
                if let Some(n) = next.notes.iter_mut().find(|n| n.id == *id) {
                    n.text.clone_from(text);
                    n.raw = note_raw(ctx.dialect, text);
                    taken.notes_changed.push(*id);
                }
            }
            Change::NoteGone { id } => {
                next.notes.retain(|n| n.id != *id);
                taken.notes_removed.push(*id);
            }
        }
    }
    if !delete.is_empty() {
        let asked = delete.clone();
        close_over(&mut delete, ctx.line, ctx.facts);
        let guard = protected(ctx.line, ctx.facts);
        for s in &delete {
            if let Some(why) = guard.get(s) {
                let line = lines.get(s).copied().unwrap_or(0);
                return if asked.contains(s) {
                    refuse(line, format!("seq {s} is {why}: it cannot be deleted"))
                } else {
                    refuse(
                        line,
                        format!("deleting takes seq {s} with it (its tool call or result), and seq {s} is {why}"),
                    )
                };
            }
        }
        for s in &delete {
            next.rewritten.remove(s);
            if next.deleted.insert(*s) {
                taken.deleted.push(*s);
            }
        }
    }
    if !restore.is_empty() {
        // What was deleted with it comes back with it.
        let mut back = restore.clone();
        close_over(&mut back, ctx.line, ctx.facts);
        for s in back {
            let was = next.deleted.remove(&s) | next.rewritten.remove(&s).is_some();
            if was {
                taken.restored.push(s);
            }
        }
    }
    taken.restored.sort_unstable();
    taken.restored.dedup();
    Ok((next, taken))
}

/// Spans of `context --drop`: `t` (every tool call and result outside the
/// running round), seqs, `A-B` ranges, tool-call ids; `keep` holds seqs back.
pub fn drop_spans<'f>(
    spans: &[String],
    keep: &[u64],
    line: &[u64],
    ids: &dyn Fn(&str) -> Option<u64>,
    facts: impl Fn(u64) -> Facts<'f> + Copy,
) -> Result<BTreeSet<u64>, String> {
    let on_line: BTreeSet<u64> = line.iter().copied().collect();
    let guard = protected(line, facts);
    let mut out = BTreeSet::new();
    for span in spans.iter().flat_map(|s| s.split(',')).map(str::trim) {
        if span.is_empty() {
            continue;
        }
        if span == "t" {
            for &s in line {
                let f = facts(s);
                if !guard.contains_key(&s) && (!f.opens.is_empty() || !f.closes.is_empty()) {
                    out.insert(s);
                }
            }
        } else if let Some((a, b)) = span
            .split_once('-')
            .filter(|(a, _)| a.parse::<u64>().is_ok())
        {
            let (a, b) = (a.parse::<u64>(), b.parse::<u64>());
            let (Ok(a), Ok(b)) = (a, b) else {
                return Err(format!("{span:?} is not a range A-B of seqs"));
            };
            out.extend(on_line.range(a..=b).filter(|s| !guard.contains_key(s)));
        } else if let Ok(s) = span.parse::<u64>() {
            if !on_line.contains(&s) {
                return Err(format!("seq {s} is not on the session's line"));
            }
            out.insert(s);
        } else {
            match ids(span) {
                Some(s) => {
                    out.insert(s);
                }
                None => {
                    return Err(format!(
                        "{span:?} is no seq, range or tool-call id of this session"
                    ))
                }
            }
        }
    }
    // What is kept keeps what it is tied to.
    close_over(&mut out, line, facts);
    let mut held: BTreeSet<u64> = keep.iter().copied().collect();
    close_over(&mut held, line, facts);
    out.retain(|s| !held.contains(s));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line: 1 system, 2 ask, 3 call (a, b), 4 result a+b, 5 answer,
    /// 6 ask, 7 call c, 8 result c, 9 answer.
    struct Line {
        facts: Vec<(RowKind, Vec<u64>, Vec<u64>)>,
    }

    impl Line {
        fn new() -> Line {
            use RowKind::*;
            Line {
                facts: vec![
                    (System, vec![], vec![]),
                    (Prompt, vec![], vec![]),
                    (Assistant, vec![10, 11], vec![]),
                    (ToolResult, vec![], vec![10, 11]),
                    (Assistant, vec![], vec![]),
                    (Prompt, vec![], vec![]),
                    (Assistant, vec![12], vec![]),
                    (ToolResult, vec![], vec![12]),
                    (Assistant, vec![], vec![]),
                ],
            }
        }
        fn facts<'s>(&'s self) -> impl Fn(u64) -> Facts<'s> + Copy + 's {
            move |s| {
                let (kind, o, c) = &self.facts[(s - 1) as usize];
                Facts {
                    kind: *kind,
                    opens: o,
                    closes: c,
                    binds_next: false,
                }
            }
        }
        fn seqs(&self) -> Vec<u64> {
            (1..=self.facts.len() as u64).collect()
        }
    }

    fn pieces(raws: &[String]) -> Vec<(Src, &str)> {
        raws.iter()
            .enumerate()
            .map(|(i, r)| (Src::Row(i as u64 + 1), r.as_str()))
            .collect()
    }

    #[test]
    fn a_deleted_result_takes_its_call_and_the_calls_other_results() {
        let l = Line::new();
        let mut d = BTreeSet::from([4]);
        close_over(&mut d, &l.seqs(), l.facts());
        assert_eq!(d, BTreeSet::from([3, 4]));
        let mut d = BTreeSet::from([7]);
        close_over(&mut d, &l.seqs(), l.facts());
        assert_eq!(d, BTreeSet::from([7, 8]));
    }

    #[test]
    fn the_prefix_before_the_first_edit_is_the_same_slices() {
        let l = Line::new();
        let raws: Vec<String> = (1..=9).map(|i| format!("{{\"m\":{i}}}")).collect();
        let p = pieces(&raws);
        let set = EditSet {
            deleted: BTreeSet::from([7, 8]),
            ..EditSet::default()
        };
        let out = apply(&set, &p, l.facts());
        assert_eq!(out.len(), 7);
        for i in 0..6 {
            assert!(
                std::ptr::eq(out[i].1, p[i].1),
                "piece {i} is the same bytes"
            );
        }
        check(Dialect::Anthropic, &out, l.facts()).unwrap();
    }

    /// Issue 32.4: a note stands where it is written: right after the
    /// block above it; past an open call, after its result; never first
    /// (the API wants the user's first) nor last (a prefill).
    #[test]
    fn notes_go_where_they_are_written() {
        let l = Line::new();
        let raws: Vec<String> = (1..=9).map(|i| format!("{{\"m\":{i}}}")).collect();
        let p = pieces(&raws);
        let mut set = EditSet::default();
        set.notes.push(Note {
            id: 1,
            after: 8,
            text: "n".into(),
            raw: note_raw(Dialect::Anthropic, "n"),
        });
        let place = |set: &EditSet| {
            let out = apply(set, &p, l.facts());
            check(Dialect::Anthropic, &out, l.facts()).unwrap();
            note_anchors(out.iter().map(|x| x.0))
        };
        // After the result 8, before the answer 9.
        assert_eq!(place(&set), vec![(1, 8)]);
        // After the ask 6 (written under it), before its answer.
        set.notes[0].after = 6;
        assert_eq!(place(&set), vec![(1, 6)]);
        // After the call 3: its results come first.
        set.notes[0].after = 3;
        assert_eq!(place(&set), vec![(1, 4)]);
        // After the last block: the window's end is no place (a prefill):
        // the last place before it.
        set.notes[0].after = 9;
        assert_eq!(place(&set), vec![(1, 8)]);
        // Before every block: after the first ask (the user's first).
        set.notes[0].after = 0;
        assert_eq!(place(&set), vec![(1, 2)]);
        // Its block deleted: after the block before it.
        set.notes[0].after = 5;
        set.deleted = BTreeSet::from([5]);
        assert_eq!(place(&set), vec![(1, 4)]);
    }

    #[test]
    fn a_half_deleted_pair_is_invalid() {
        let l = Line::new();
        let raws: Vec<String> = (1..=9).map(|i| format!("{{\"m\":{i}}}")).collect();
        let p = pieces(&raws);
        let set = EditSet {
            deleted: BTreeSet::from([8]),
            ..EditSet::default()
        };
        let out = apply(&set, &p, l.facts());
        assert!(check(Dialect::Anthropic, &out, l.facts()).is_err());
        let set = EditSet {
            deleted: BTreeSet::from([2]),
            ..EditSet::default()
        };
        let out = apply(&set, &p, l.facts());
        let e = check(Dialect::Anthropic, &out, l.facts()).unwrap_err();
        assert!(e.contains("first message"), "{e}");
        check(Dialect::OpenaiChat, &out, l.facts()).unwrap();
    }

    #[test]
    fn protected_rows_refuse_their_delete() {
        let l = Line::new();
        let line = l.seqs();
        let raw = |_: u64| -> Option<&str> { None };
        let ctx = Ctx {
            dialect: Dialect::Anthropic,
            line: &line,
            facts: l.facts(),
            raw: &raw,
        };
        let e = take(
            &EditSet::default(),
            &[Change::Delete { seq: 6, line: 0 }],
            &ctx,
        )
        .unwrap_err();
        assert!(e.reason.contains("newest ask"), "{e:?}");
        let e = take(
            &EditSet::default(),
            &[Change::Delete { seq: 9, line: 0 }],
            &ctx,
        )
        .unwrap_err();
        assert!(e.reason.contains("running round"), "{e:?}");
        let (set, t) = take(
            &EditSet::default(),
            &[Change::Delete { seq: 4, line: 0 }],
            &ctx,
        )
        .unwrap();
        assert_eq!(t.deleted, vec![3, 4]);
        let (set, t) = take(&set, &[Change::Restore { seq: 3, line: 0 }], &ctx).unwrap();
        assert_eq!(t.restored, vec![3, 4]);
        assert!(set.is_empty());
    }

    #[test]
    fn drop_spans_read_t_ranges_and_ids() {
        let l = Line::new();
        let line = l.seqs();
        let ids = |s: &str| (s == "toolu_a").then_some(3);
        let t = drop_spans(&["t".into()], &[], &line, &ids, l.facts()).unwrap();
        assert_eq!(
            t,
            BTreeSet::from([3, 4, 7, 8]),
            "the running round is not dropped: 9 is the last answer"
        );
        let r = drop_spans(&["2-5".into()], &[2], &line, &ids, l.facts()).unwrap();
        assert_eq!(r, BTreeSet::from([3, 4, 5]));
        let r = drop_spans(&["t".into()], &[4], &line, &ids, l.facts()).unwrap();
        assert_eq!(r, BTreeSet::from([7, 8]), "seq 4 kept keeps its call");
        let i = drop_spans(&["toolu_a".into()], &[], &line, &ids, l.facts()).unwrap();
        assert_eq!(i, BTreeSet::from([3, 4]));
        assert!(drop_spans(&["nope".into()], &[], &line, &ids, l.facts()).is_err());
    }

    #[test]
    fn diff_reads_deletes_rewrites_notes_and_refusals() {
        let export = Export {
            nonce: "n1".into(),
            first: file::first_line("s", "n1", (1, 3), 3),
            blocks: vec![
                Exported::Fixed {
                    label: "stub".into(),
                    hash: body_hash("stub text"),
                },
                Exported::Row {
                    seq: 1,
                    hash: body_hash("one"),
                },
                Exported::Row {
                    seq: 2,
                    hash: body_hash("two"),
                },
                Exported::Row {
                    seq: 3,
                    hash: body_hash("three"),
                },
            ],
        };
        let blocks = |rows: &[(u64, &str)], note: Option<&str>| {
            let mut b = vec![file::Block::Fixed {
                label: "stub".into(),
                text: "stub text".into(),
            }];
            for (s, t) in rows {
                b.push(file::Block::Msg {
                    seq: *s,
                    role: "user".into(),
                    body: t.to_string(),
                });
            }
            let mut text = file::render(&export.first, "n1", &b);
            if let Some(n) = note {
                text = text.replace(
                    "[[end of context",
                    &format!("[[note]]\n{n}\n\n[[end of context"),
                );
            }
            file::parse(text.as_bytes()).unwrap()
        };
        let f = blocks(
            &[(1, "[[delete]]\nwhatever"), (2, "two"), (3, "three")],
            None,
        );
        assert_eq!(
            diff(&export, &f, &EditSet::default()).unwrap(),
            vec![Change::Delete { seq: 1, line: 5 }]
        );
        let f = blocks(&[(1, "one"), (3, "THREE")], Some("remember"));
        let c = diff(&export, &f, &EditSet::default()).unwrap();
        assert!(c.contains(&Change::Delete { seq: 2, line: 0 }), "{c:?}");
        assert!(c
            .iter()
            .any(|x| matches!(x, Change::Rewrite { seq: 3, body, .. } if body == "THREE")));
        assert!(c.contains(&Change::NoteNew {
            after: 3,
            text: "remember".into()
        }));
        // Duplicate seqs.
        let f = blocks(&[(1, "one"), (1, "one")], None);
        assert!(diff(&export, &f, &EditSet::default())
            .unwrap_err()
            .reason
            .contains("twice"));
        // Moved blocks.
        let f = blocks(&[(2, "two"), (1, "one")], None);
        assert!(diff(&export, &f, &EditSet::default())
            .unwrap_err()
            .reason
            .contains("order"));
        // A header of another export.
        let mut f = blocks(&[(1, "one")], None);
        f.blocks[1].header = Header::Msg {
            nonce: "n0".into(),
            seq: 1,
            role: "user".into(),
        };
        assert!(diff(&export, &f, &EditSet::default())
            .unwrap_err()
            .reason
            .contains("older export"));
        // The first line changed, or names an older export.
        let mut f = blocks(&[(1, "one")], None);
        f.first_line.push('x');
        assert!(diff(&export, &f, &EditSet::default())
            .unwrap_err()
            .reason
            .contains("first line"));
        f.first_line = file::first_line("s", "n0", (1, 3), 3);
        assert!(diff(&export, &f, &EditSet::default())
            .unwrap_err()
            .reason
            .contains("older one"));
        // An earlier refresh of the same export (it covered seq 1–2): seq 3
        // came after it and is kept; seq 2 it lacks is deleted.
        let mut f = blocks(&[(1, "one")], None);
        f.first_line = file::first_line("s", "n1", (1, 2), 2);
        assert_eq!(
            diff(&export, &f, &EditSet::default()).unwrap(),
            vec![Change::Delete { seq: 2, line: 0 }]
        );
        // The stub is not editable.
        let mut f = blocks(&[(1, "one")], None);
        f.blocks[0].body = "mine".into();
        assert!(diff(&export, &f, &EditSet::default())
            .unwrap_err()
            .reason
            .contains("not editable"));
        // A deleted row's header written back restores it.
        let set = EditSet {
            deleted: BTreeSet::from([9]),
            ..EditSet::default()
        };
        let f = blocks(&[(1, "one"), (2, "two"), (3, "three"), (9, "")], None);
        assert_eq!(
            diff(&export, &f, &set).unwrap(),
            vec![Change::Restore { seq: 9, line: 14 }]
        );
        assert!(diff(&export, &f, &EditSet::default())
            .unwrap_err()
            .reason
            .contains("nothing to restore"));
    }

    /// Any deletion set, closed over the line's ties, with notes anywhere,
    /// leaves a valid window (a property over random lines: parallel calls,
    /// reasoning items bound to their call, asks between rounds).
    #[test]
    fn any_closed_deletion_with_notes_stays_valid() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n.max(1)
        };
        for case in 0..400 {
            // Build a line: ask, then rounds of (reasoning?) call(s) + result(s).
            let mut rows: Vec<(RowKind, Vec<u64>, Vec<u64>, bool)> =
                vec![(RowKind::Prompt, vec![], vec![], false)];
            let mut id = 100u64;
            for _ in 0..(3 + rnd(12)) {
                match rnd(4) {
                    0 => rows.push((RowKind::Prompt, vec![], vec![], false)),
                    1 => {
                        // Responses: reasoning bound to a call, one output per call.
                        rows.push((RowKind::Assistant, vec![], vec![], true));
                        let calls: Vec<u64> = (0..1 + rnd(3)).map(|k| id + k).collect();
                        id += 10;
                        for c in &calls {
                            rows.push((RowKind::Assistant, vec![*c], vec![], false));
                        }
                        for c in &calls {
                            rows.push((RowKind::ToolResult, vec![], vec![*c], false));
                        }
                    }
                    _ => {
                        let calls: Vec<u64> = (0..1 + rnd(3)).map(|k| id + k).collect();
                        id += 10;
                        rows.push((RowKind::Assistant, calls.clone(), vec![], false));
                        rows.push((RowKind::ToolResult, vec![], calls, false));
                    }
                }
            }
            rows.push((RowKind::Assistant, vec![], vec![], false));
            let facts = |s: u64| {
                let (kind, o, c, b) = &rows[(s - 1) as usize];
                Facts {
                    kind: *kind,
                    opens: o,
                    closes: c,
                    binds_next: *b,
                }
            };
            let line: Vec<u64> = (1..=rows.len() as u64).collect();
            let raws: Vec<String> = line.iter().map(|s| format!("{{\"m\":{s}}}")).collect();
            let p = pieces(&raws);
            check(Dialect::OpenaiResponses, &p, facts)
                .unwrap_or_else(|e| panic!("case {case}: the line itself: {e}"));
            let mut set = EditSet::default();
            for &s in &line {
                if rnd(3) == 0 {
                    set.deleted.insert(s);
                }
            }
            close_over(&mut set.deleted, &line, facts);
            for id in 0..rnd(4) as u32 {
                set.notes.push(Note {
                    id,
                    after: rnd(line.len() as u64 + 1),
                    text: "n".into(),
                    raw: "{}".into(),
                });
            }
            let out = apply(&set, &p, facts);
            for d in [Dialect::OpenaiChat, Dialect::OpenaiResponses] {
                check(d, &out, facts).unwrap_or_else(|e| {
                    panic!("case {case} {d:?}: {e}; deleted {:?}", set.deleted)
                });
            }
            // Everything before the first edited piece is the same slices.
            let first = p
                .iter()
                .position(|(s, _)| s.seq().is_some_and(|q| set.deleted.contains(&q)));
            let first_note = out.iter().position(|(s, _)| matches!(s, Src::Note(_)));
            let upto = first
                .unwrap_or(p.len())
                .min(first_note.unwrap_or(usize::MAX));
            for i in 0..upto {
                assert!(std::ptr::eq(out[i].1, p[i].1), "case {case}: piece {i}");
            }
        }
    }
}
