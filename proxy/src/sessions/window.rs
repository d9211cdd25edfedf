//! Rendering the window sent upstream for a session's current cut: the stub
//! (or none) with the standing parts of the rows that left (project
//! instructions: CLAUDE.md, AGENTS.md, ...) right after its text, the system
//! rows kept from before the cut, the pinned ask, and every retained message
//! byte for byte. Pure: no I/O, no locks.
//!
//! A window that starts at an Anthropic server-side compaction block (the
//! provider drops whatever precedes it) keeps nothing from before it but the
//! stub, which accounts for the rows the provider drops instead of
//! re-sending them (the provider drops the stub too, as it would have
//! dropped those rows).

use super::state::State;
use crate::context::edits::{self, Src};
use crate::dialect::{self, ParsedBody};
use oceancode_window::media::Cost;
use oceancode_window::tideline;
use oceancode_window::RowKind;
use std::path::Path;

/// A rendered window.
pub(super) struct Window {
    /// The rewritten body (None = send the request as it came).
    pub(super) body: Option<Vec<u8>>,
    /// Messages in the window.
    pub(super) rows: usize,
    /// Estimated tokens the window leaves out.
    pub(super) kept_out: u64,
    /// Images and documents of the rows it leaves out.
    pub(super) media_out: Cost,
    /// The last row that left the window (what its stub names; 0 = none).
    pub(super) upto: u64,
    /// Rows this request's cut took out of the window (set by the caller
    /// that records the cut).
    pub(super) cut_rows: u64,
    /// Estimated tokens of the standing parts kept with the stub.
    pub(super) pinned_tokens: u64,
    /// Where each message sent comes from (None = the request as it came).
    pub(super) layout: Option<Vec<Src>>,
    /// The stub message sent, if any.
    pub(super) stub: Option<String>,
    /// The session's edit set would have made the request invalid: it was
    /// sent unedited, and this says why.
    pub(super) edit_error: Option<String>,
    /// Estimated tokens of the state block after the stub.
    pub(super) state_tokens: u64,
    /// The state block's budget it was rendered with (None = off).
    pub(super) state_budget: Option<u32>,
    /// The saved estimate of the tool outputs sent as pointers.
    pub(super) saved: u64,
    /// What the step records of them (set by the caller that owns the state).
    pub(super) compress: Option<oceancode_window::Pruned>,
    /// Rows whose tool outputs it sends as pointers (`ledger.compress`).
    pub(super) pruned_rows: Vec<u64>,
    /// What it sends, for the step's record (set by the request path).
    pub(super) sent: Option<Box<oceancode_window::SentWindow>>,
}

impl Window {
    /// The request as it came, with `rows` messages.
    pub(super) fn unchanged(rows: usize) -> Window {
        Window {
            body: None,
            rows,
            kept_out: 0,
            media_out: Cost::default(),
            upto: 0,
            cut_rows: 0,
            pinned_tokens: 0,
            layout: None,
            stub: None,
            edit_error: None,
            state_tokens: 0,
            state_budget: None,
            saved: 0,
            compress: None,
            sent: None,
            pruned_rows: Vec::new(),
        }
    }
}

/// The validity facts of a row, for the edit set's closure and check.
pub(super) fn facts<'s>(st: &'s State) -> impl Fn(u64) -> edits::Facts<'s> + Copy + 's {
    move |seq| {
        let r = st.row(seq);
        edits::Facts {
            kind: r.kind,
            opens: &r.calls.opens,
            closes: &r.calls.closes,
            binds_next: r.calls.binds_next,
        }
    }
}

/// The request's messages as pieces of a window (`Tail` past the active line).
fn as_sent<'a>(st: &State, parsed: &ParsedBody<'a>) -> Vec<(Src, &'a str)> {
    parsed
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| (st.active.get(i).map_or(Src::Tail, |&s| Src::Row(s)), *m))
        .collect()
}

/// The window's pieces with the session's edit set applied (and checked:
/// a set that would make the request invalid is not applied), rendered.
fn finish(
    st: &State,
    parsed: &ParsedBody<'_>,
    pieces: Vec<(Src, &str)>,
    stub: Option<String>,
    mut w: Window,
) -> Window {
    let set = &st.context.set;
    let pieces = if set.is_empty() {
        pieces
    } else {
        let applied = edits::apply(set, &pieces, facts(st));
        match edits::check(st.dialect, &applied, facts(st)) {
            Ok(()) => applied,
            Err(e) => {
                w.edit_error = Some(e);
                pieces
            }
        }
    };
    // The recall tool's internal exchanges, right after their rows.
    let pieces = with_hidden(st, pieces);
    let tagged = seq_tags(st, &pieces);
    let parts: Vec<&str> = pieces
        .iter()
        .zip(&tagged)
        .map(|((src, raw), t)| match (src, &stub, t) {
            (_, _, Some(t)) => &**t,
            (Src::Fixed("stub"), Some(s), _) => s.as_str(),
            _ => raw,
        })
        .collect();
    w.rows = parts.len();
    w.body = Some(parsed.render_with(&parts));
    w.layout = Some(pieces.iter().map(|p| p.0).collect());
    w.stub = stub;
    w
}

/// `context.seq_tags`: each tool result row of `pieces` as the upstream
/// sees it, ending with its seq (None = sent as it is). A row is tagged
/// once and kept while its bytes stay the same; rows that left go.
fn seq_tags(st: &State, pieces: &[(Src, &str)]) -> Vec<Option<std::sync::Arc<str>>> {
    if !st.context.seq_tags {
        return vec![None; pieces.len()];
    }
    let mut cache = st.context.tagged.lock();
    let mut used = 0usize;
    let out: Vec<_> = pieces
        .iter()
        .map(|(src, raw)| {
            let Src::Row(seq) = *src else { return None };
            if st.row(seq).calls.closes.is_empty() {
                return None;
            }
            used += 1;
            let h = xxhash_rust::xxh3::xxh3_64(raw.as_bytes());
            if let Some((hash, t)) = cache.get(&seq) {
                if *hash == h {
                    return Some(t.clone());
                }
            }
            let t: std::sync::Arc<str> = crate::context::seq_tag::tag(st.dialect, raw, seq)?.into();
            cache.insert(seq, (h, t.clone()));
            Some(t)
        })
        .collect();
    if cache.len() > used + 64 {
        let keep: std::collections::HashSet<u64> =
            pieces.iter().filter_map(|(s, _)| s.seq()).collect();
        cache.retain(|s, _| keep.contains(s));
    }
    out
}

/// `pieces` with the recall tool's internal exchanges put after their rows
/// (as `Src::Fixed("recall")`: the proxy's own, not editable).
fn with_hidden<'a>(st: &'a State, pieces: Vec<(Src, &'a str)>) -> Vec<(Src, &'a str)> {
    if !puts_back(st) {
        return pieces;
    }
    let mut out = Vec::with_capacity(pieces.len() + 4);
    for (src, raw) in pieces {
        let seq = match src {
            Src::Row(s) | Src::Edited(s) => Some(s),
            _ => None,
        };
        out.push((src, raw));
        if let Some(m) = seq.and_then(|s| st.hidden.after(s)) {
            out.extend(m.iter().map(|m| (Src::Fixed("recall"), m.as_str())));
        }
    }
    out
}

/// Whether the session's requests get its internal exchanges back: it has
/// some, and the tool is on (a session restored by a proxy with the tool
/// off is sent as the client has it: no call of a tool the request lacks).
fn puts_back(st: &State) -> bool {
    st.recall_tool && !st.hidden.is_empty()
}

/// Render the window of `parsed` (the request's messages, mapped onto the
/// session's active line) for the session's current cut; stubs point into
/// `data_dir`'s session directory.
pub(super) fn render(
    data_dir: &Path,
    st: &State,
    parsed: &ParsedBody<'_>,
    state_tokens: Option<u32>,
) -> Window {
    let state_budget = state_tokens;
    let n = parsed.messages.len();
    let cut_upto = st.tideline.cut_upto();
    // Messages past the active line (a count_tokens request's new tail)
    // are retained as they are.
    // Nothing to rewrite: no edit set, no recall exchange to put back.
    let unedited = st.context.set.is_empty() && !puts_back(st) && !st.context.seq_tags;
    if cut_upto == 0 || st.active.len() > n {
        return uncut(st, parsed, unedited);
    }
    let infos = st.row_infos();
    let mut plan = tideline::plan_window(&infos, cut_upto);
    if plan.start == 0 || plan.effective_upto_seq == 0 {
        return uncut(st, parsed, unedited);
    }
    // Starting at a compaction block: what precedes it the provider drops
    // (a pinned ask, kept system rows or standing parts would be dropped too).
    let at_compaction = st.row(st.active[plan.start]).compaction;
    if at_compaction {
        plan.pinned_prompt = None;
    }
    let dir = oceancode_ledger::paths::DataDir::new(data_dir).session_dir(&st.meta.id);
    let mut lines = Vec::new();
    let mut turns: Vec<&(u64, String)> = st
        .turn_lines
        .values()
        .filter(|(seq, _)| {
            *seq <= plan.effective_upto_seq
                && plan.pinned_prompt.map(|i| st.active[i]) != Some(*seq)
        })
        .collect();
    turns.sort();
    for (seq, line) in turns {
        lines.push((st.row(*seq).turn, line.as_str()));
    }
    let dir = dir.display().to_string();
    let mut stub = tideline::stub_text(plan.effective_upto_seq, &dir, &lines);
    if st.recall_tool {
        stub.push('\n');
        stub.push_str(crate::recall_tool::STUB_NOTE);
    }
    // The state block follows the stub's text in the same part: every
    // dialect takes it, and the stub's first line keeps its wording.
    let block = state_tokens.and_then(|max| super::thread::block(st, &plan, &dir, max));
    let state_tokens = block.as_ref().map_or(0, |b| {
        stub.push_str("\n\n");
        stub.push_str(b);
        (b.len() as f64 / st.bytes_per_token).ceil() as u64
    });
    // Standing parts before a compaction block would be dropped with the stub.
    let pinned = if at_compaction {
        Default::default()
    } else {
        pinned_parts(st, &infos, &plan, parsed)
    };
    let pinned_bytes: usize = pinned.iter().map(|p| p.len()).sum();
    let pinned_tokens = (pinned_bytes as f64 / st.bytes_per_token).ceil() as u64;
    let stub_msg = dialect::stub_message_with(st.dialect, &stub, &pinned);
    let mut parts: Vec<(Src, &str)> = Vec::with_capacity(n - plan.start + 4);
    let mut kept_out = 0u64;
    let mut media_out = Cost::default();
    let kept: Vec<(Src, &str)> = (0..plan.start)
        .filter(|&i| Some(i) != plan.pinned_prompt)
        .filter_map(|i| {
            let r = st.row(st.active[i]);
            if matches!(r.kind, RowKind::System | RowKind::Other) && !at_compaction {
                Some((Src::Row(st.active[i]), parsed.messages[i]))
            } else {
                kept_out += u64::from(r.tokens);
                media_out = media_out.plus(r.media);
                None
            }
        })
        .collect();
    // The stub's piece: its bytes are put in by `finish`.
    let stub_piece = (Src::Fixed("stub"), "");
    if st.dialect.spec().stub_first() {
        parts.push(stub_piece);
        parts.extend(kept);
    } else {
        parts.extend(kept);
        parts.push(stub_piece);
    }
    if let Some(i) = plan.pinned_prompt {
        parts.push((Src::Row(st.active[i]), parsed.messages[i]));
    }
    // ledger.compress: the pruned outputs of the retained rows as pointers.
    let (pruned, pruned_media) = super::compress::rewritten(st, parsed, plan.start);
    parts.extend((plan.start..n).map(|i| {
        (
            st.active.get(i).map_or(Src::Tail, |&s| Src::Row(s)),
            pruned.get(&i).map_or(parsed.messages[i], String::as_str),
        )
    }));
    let saved = if pruned.is_empty() {
        0
    } else {
        st.compress.saved
    };
    let w = Window {
        kept_out: kept_out.saturating_sub(pinned_tokens),
        media_out: media_out.plus(pruned_media),
        upto: plan.effective_upto_seq,
        cut_rows: 0,
        pinned_tokens,
        state_tokens,
        state_budget,
        saved,
        pruned_rows: pruned
            .keys()
            .filter_map(|&i| st.active.get(i).copied())
            .collect(),
        ..Window::unchanged(n)
    };
    finish(st, parsed, parts, Some(stub_msg), w)
}

/// A window nothing was cut from: the request as it came, but for the
/// pruned outputs sent as pointers (masking comes before any cut) and the
/// session's edits.
fn uncut(st: &State, parsed: &ParsedBody<'_>, unedited: bool) -> Window {
    let n = parsed.messages.len();
    let (pruned, media) = if st.active.len() > n {
        Default::default()
    } else {
        super::compress::rewritten(st, parsed, 0)
    };
    if pruned.is_empty() {
        if unedited {
            return Window::unchanged(n);
        }
        return finish(st, parsed, as_sent(st, parsed), None, Window::unchanged(n));
    }
    let pieces = as_sent(st, parsed)
        .into_iter()
        .enumerate()
        .map(|(i, (src, raw))| (src, pruned.get(&i).map_or(raw, String::as_str)))
        .collect();
    let w = Window {
        media_out: media,
        saved: st.compress.saved,
        pruned_rows: pruned
            .keys()
            .filter_map(|&i| st.active.get(i).copied())
            .collect(),
        ..Window::unchanged(n)
    };
    finish(st, parsed, pieces, None, w)
}

/// The raw standing parts [`tideline::plan_pins`] keeps, from this request's
/// bytes of their messages. A part whose text no longer is what the row
/// recorded (another message under the same index) is left out.
fn pinned_parts<'a>(
    st: &State,
    infos: &[tideline::RowInfo],
    plan: &tideline::WindowPlan,
    parsed: &ParsedBody<'a>,
) -> Vec<&'a str> {
    let standing = |i: usize| -> &[oceancode_window::Standing] { &st.row(st.active[i]).standing };
    let pins = tideline::plan_pins(infos, plan, standing);
    let mut out = Vec::with_capacity(pins.len());
    let mut parts_of: Option<(usize, Vec<&'a str>)> = None;
    for pin in pins {
        if parts_of.as_ref().map(|(row, _)| *row) != Some(pin.row) {
            let parts = parsed
                .messages
                .get(pin.row)
                .and_then(|m| dialect::content_parts(m))
                .unwrap_or_default();
            parts_of = Some((pin.row, parts));
        }
        let Some(raw) = parts_of
            .as_ref()
            .and_then(|(_, parts)| parts.get(pin.part as usize).copied())
        else {
            continue;
        };
        let want = standing(pin.row).iter().find(|s| s.part == pin.part);
        let text = serde_json::from_str::<serde_json::Value>(raw)
            .ok()
            .and_then(|v| {
                v.get("text")
                    .and_then(|t| t.as_str())
                    .map(dialect::standing::text_hash)
            });
        if want.is_some_and(|s| Some(s.hash) == text) {
            out.push(raw);
        }
    }
    out
}
