//! Rendering the window sent upstream for a session's current cut: the stub
//! (or none), the system rows kept from before the cut, the pinned ask, and
//! every retained message byte for byte. Pure: no I/O, no locks.

use super::state::State;
use crate::dialect::{self, ParsedBody};
use oceancode_ledger::media::Cost;
use oceancode_ledger::tideline;
use oceancode_ledger::{Dialect, RowKind};
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
        }
    }
}

/// Render the window of `parsed` (the request's messages, mapped onto the
/// session's active line) for the session's current cut; stubs point into
/// `data_dir`'s session directory.
pub(super) fn render(data_dir: &Path, st: &State, parsed: &ParsedBody<'_>) -> Window {
    let n = parsed.messages.len();
    let cut_upto = st.tideline.cut_upto();
    // Messages past the active line (a count_tokens request's new tail)
    // are retained as they are.
    if cut_upto == 0 || st.active.len() > n {
        return Window::unchanged(n);
    }
    let infos = st.row_infos();
    let plan = tideline::plan_window(&infos, cut_upto);
    if plan.start == 0 || plan.effective_upto_seq == 0 {
        return Window::unchanged(n);
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
    let stub = tideline::stub_text(plan.effective_upto_seq, &dir.display().to_string(), &lines);
    let stub_msg = dialect::stub_message(st.dialect, &stub);
    let mut parts: Vec<&str> = Vec::with_capacity(n - plan.start + 4);
    let mut kept_out = 0u64;
    let mut media_out = Cost::default();
    let kept: Vec<&str> = (0..plan.start)
        .filter(|&i| Some(i) != plan.pinned_prompt)
        .filter_map(|i| {
            let r = st.row(st.active[i]);
            if matches!(r.kind, RowKind::System | RowKind::Other) {
                Some(parsed.messages[i])
            } else {
                kept_out += u64::from(r.tokens);
                media_out = media_out.plus(r.media);
                None
            }
        })
        .collect();
    if st.dialect == Dialect::Anthropic {
        parts.push(&stub_msg);
        parts.extend(kept);
    } else {
        parts.extend(kept);
        parts.push(&stub_msg);
    }
    if let Some(i) = plan.pinned_prompt {
        parts.push(parsed.messages[i]);
    }
    parts.extend(parsed.messages[plan.start..].iter().copied());
    let rows = parts.len();
    Window {
        body: Some(parsed.render_with(&parts)),
        rows,
        kept_out,
        media_out,
        upto: plan.effective_upto_seq,
    }
}
