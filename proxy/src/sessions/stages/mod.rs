//! Context strategies as ordered window stages. Each strategy (the
//! tideline's cut, the recall note, the state block, the pinned standing
//! parts, compress, the context edits, the recall exchanges, seq tags) is
//! one [`WindowStage`] in its own module; [`ORDER`] declares the order they
//! run in, and `window::render` builds a [`Draft`], loops over it, and
//! renders the body.
//!
//! To add a context strategy: a module here with a unit struct that
//! implements the hooks it needs (every hook has a no-op default), its place
//! in [`ORDER`], and its setting in `Settings::new` if it has one (the hooks
//! are given the settings: [`Draft::settings`], [`AtCut::settings`]).
//!
//! Hooks, in the request's order:
//! - `at_cut`: before the window, with the session writable (compress
//!   chooses its pruned set again when the window's start moved);
//! - `rewrite`: the draft's pieces, stub text and accounting (pure);
//! - `record`: what the step records of the window;
//! - `meter`: what the live meter and the metrics show of it.

mod compress;
mod edits;
mod pins;
mod recall;
mod seq_tags;
mod state_block;
mod tideline;

use super::state::State;
use super::window::Window;
use super::{Locator, SessionMetrics, Settings};
use crate::context::edits::Src;
use crate::dialect::ParsedBody;
use oceancode_window::tideline::{RowInfo, WindowPlan};
use std::sync::Arc;

/// One context strategy's part in making the window; every hook defaults
/// to doing nothing.
pub(super) trait WindowStage: Sync {
    /// The stage's name (logs, tests).
    fn name(&self) -> &'static str;

    /// Before the window is rendered, at every windowed request and at a
    /// too-long retry's cut: choose what this stage keeps between cuts.
    fn at_cut(&self, _st: &mut State, _cx: &AtCut<'_>) {}

    /// Change the draft: its pieces, its stub text, its accounting.
    fn rewrite<'a>(&self, _d: &mut Draft<'a>) {}

    /// What the step records of the window (`cut`: this request recorded
    /// a cut).
    fn record(&self, _st: &mut State, _w: &mut Window, _cut: bool) {}

    /// What the meter and the metrics show of the window.
    fn meter(&self, _st: &mut State, _w: &Window, _m: &SessionMetrics) {}
}

/// The stages in the order they run: the tideline makes the cut window,
/// the stub's text grows in the order it reads (recall note, state block),
/// the standing parts go with the stub, compress rewrites the retained
/// rows, then the edit set, the recall exchanges after their rows, and the
/// seq tags over the final pieces (last: they are indexed by piece).
pub(super) const ORDER: &[&dyn WindowStage] = &[
    &tideline::Tideline,
    &recall::Note,
    &state_block::StateBlock,
    &pins::Pins,
    &compress::Compress,
    &edits::Edits,
    &recall::Exchanges,
    &seq_tags::SeqTags,
];

/// What `at_cut` is given besides the session.
pub(super) struct AtCut<'a> {
    /// The request's messages.
    pub(super) parsed: &'a ParsedBody<'a>,
    /// The line in force.
    pub(super) line: u64,
    /// The manager's settings.
    pub(super) settings: &'a Settings,
    /// Where rows are in their transcript, when known.
    pub(super) locator: Option<&'a Locator>,
    /// The manager's counters.
    pub(super) metrics: &'a SessionMetrics,
}

/// The cut a window is drafted for.
pub(super) struct Cut {
    /// The rows' tideline facts.
    pub(super) infos: Vec<RowInfo>,
    /// The tideline's plan of the window.
    pub(super) plan: WindowPlan,
    /// The window starts at a compaction block (the provider drops what
    /// precedes it).
    pub(super) at_compaction: bool,
    /// The session's directory (what the stub points into).
    pub(super) dir: String,
}

/// A window being made: the pieces sent (each tagged with its source), the
/// stub's text, and the window's accounting.
pub(super) struct Draft<'a> {
    /// The session.
    pub(super) st: &'a State,
    /// The request's messages.
    pub(super) parsed: &'a ParsedBody<'a>,
    /// The manager's settings (stubs point into the data dir's session
    /// directory; each stage reads its own).
    pub(super) settings: &'a Settings,
    /// The cut (None = nothing cut: the request's messages as they came).
    pub(super) cut: Option<Cut>,
    /// The stub's text (Some when cut); its message is made by `finish`.
    pub(super) stub: Option<String>,
    /// The standing parts sent with the stub.
    pub(super) pinned: Vec<&'a str>,
    /// The pieces of the window (the stub's bytes are put in by `finish`);
    /// made from the request's messages when a stage first asks for them
    /// ([`Draft::pieces`]): a request no stage changes costs no copy.
    pieces: Option<Vec<(Src, &'a str)>>,
    /// Index in `pieces` of the first retained message (the message at
    /// the plan's start, or 0).
    pub(super) retained: usize,
    /// Index in the request's messages of the first retained one.
    pub(super) start: usize,
    /// Each piece as the upstream sees it instead (seq tags; empty = none).
    pub(super) tags: Vec<Option<Arc<str>>>,
    /// A stage changed the request (false = it is sent as it came).
    pub(super) changed: bool,
    /// The window's accounting.
    pub(super) window: Window,
    /// Owns the text stages make for the pieces.
    arena: &'a bumpalo::Bump,
}

impl<'a> Draft<'a> {
    /// The request's messages as they came (`Tail` past the active line).
    pub(super) fn new(
        st: &'a State,
        parsed: &'a ParsedBody<'a>,
        settings: &'a Settings,
        arena: &'a bumpalo::Bump,
    ) -> Self {
        Draft {
            st,
            parsed,
            settings,
            cut: None,
            stub: None,
            pinned: Vec::new(),
            pieces: None,
            retained: 0,
            start: 0,
            tags: Vec::new(),
            changed: false,
            window: Window::unchanged(parsed.messages.len()),
            arena,
        }
    }

    /// The pieces of the window: the request's messages as they came
    /// (`Tail` past the active line) until a stage changes them.
    pub(super) fn pieces(&mut self) -> &mut Vec<(Src, &'a str)> {
        let (st, parsed) = (self.st, self.parsed);
        self.pieces.get_or_insert_with(|| {
            parsed
                .messages
                .iter()
                .enumerate()
                .map(|(i, m)| (st.active.get(i).map_or(Src::Tail, |&s| Src::Row(s)), *m))
                .collect()
        })
    }

    /// `text` kept as long as the draft's pieces.
    pub(super) fn keep(&self, text: &str) -> &'a str {
        self.arena.alloc_str(text)
    }
}

/// Run `stages`' `at_cut` in order.
pub(super) fn at_cut(stages: &[&dyn WindowStage], st: &mut State, cx: &AtCut<'_>) {
    for s in stages {
        s.at_cut(st, cx);
    }
}

/// Run `stages`' `record` and `meter` in order.
pub(super) fn record_and_meter(
    stages: &[&dyn WindowStage],
    st: &mut State,
    w: &mut Window,
    cut: bool,
    m: &SessionMetrics,
) {
    for s in stages {
        s.record(st, w, cut);
    }
    for s in stages {
        s.meter(st, w, m);
    }
}

#[cfg(test)]
mod tests;
