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

use super::stages;
use super::state::State;
use super::Settings;
use crate::context::edits::{self, Src};
use crate::dialect::{self, ParsedBody};
use oceancode_window::media::Cost;

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
            opens: r.opens(),
            closes: r.closes(),
            binds_next: r.binds_next(),
        }
    }
}

/// Render the window of `parsed` (the request's messages, mapped onto the
/// session's active line) for the session's current cut; stubs point into
/// the data dir's session directory.
pub(super) fn render(settings: &Settings, st: &State, parsed: &ParsedBody<'_>) -> Window {
    render_with(stages::ORDER, settings, st, parsed)
}

/// [`render`] with `stages` in their order: a draft of the request as it
/// came, each stage's rewrite, then the body.
pub(super) fn render_with(
    stages: &[&dyn stages::WindowStage],
    settings: &Settings,
    st: &State,
    parsed: &ParsedBody<'_>,
) -> Window {
    let arena = bumpalo::Bump::new();
    let mut d = stages::Draft::new(st, parsed, settings, &arena);
    for s in stages {
        s.rewrite(&mut d);
        tracing::trace!(stage = s.name(), changed = d.changed, "window stage");
    }
    finish(d)
}

/// The drafted window rendered: the stub's message (its text and the
/// standing parts) in the stub's piece, each piece's tag or bytes.
fn finish(mut d: stages::Draft<'_>) -> Window {
    if !d.changed {
        return d.window;
    }
    let pieces = std::mem::take(d.pieces());
    let mut w = d.window;
    let stub = d
        .stub
        .map(|s| dialect::stub_message_with(d.st.dialect, &s, &d.pinned));
    let parts: Vec<&str> = pieces
        .iter()
        .enumerate()
        .map(|(i, (src, raw))| match (src, &stub, d.tags.get(i)) {
            (_, _, Some(Some(t))) => &**t,
            (Src::Fixed("stub"), Some(s), _) => s.as_str(),
            _ => raw,
        })
        .collect();
    w.rows = parts.len();
    w.body = Some(d.parsed.render_with(&parts));
    w.layout = Some(pieces.iter().map(|p| p.0).collect());
    w.stub = stub;
    w
}
