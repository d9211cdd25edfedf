//! What the upstream saw of a recorded session at its latest cut, for the
//! viewer's *model view*: the same plan [`super::window::render`] makes
//! (the stub, the system rows kept from before the cut, the pinned ask, the
//! standing parts of the rows that left, every row from the window's start),
//! made from the ledger's rows alone. Pure: the caller reads the session.

use super::state::State;
use oceancode_ledger::paths::DataDir;
use oceancode_ledger::store::LoadedSession;
use oceancode_window::tideline;
use oceancode_window::RowKind;
use std::path::Path;

/// One message of the window, in the order it was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The stub (its text in [`ModelView::stub`]).
    Stub,
    /// A recorded row, by seq.
    Row(u64),
}

/// The window of a session's latest cut.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelView {
    /// The last row that left the window (what the stub names; 0 = nothing
    /// is cut and every row on the active line was sent).
    pub upto: u64,
    /// The stub's text (None when nothing is cut).
    pub stub: Option<String>,
    /// The messages sent, in order.
    pub sent: Vec<Sent>,
    /// Standing parts of rows that left, kept with the stub: `(seq, part)`.
    pub pinned_parts: Vec<(u64, u32)>,
    /// The window starts at a server-side compaction block.
    pub at_compaction: bool,
    /// Seqs on the active line (rows not hidden by a branch, answers the
    /// client echoed), in order.
    pub active: Vec<u64>,
}

/// The window of `l` at its recorded cut; stubs point into `data_dir`.
pub fn model_view(data_dir: &Path, l: LoadedSession) -> ModelView {
    let id = l.meta.id.clone();
    let cut_upto = l.cut_upto;
    let st = State::restore(l);
    let active = st.active.clone();
    let all_sent = || ModelView {
        sent: active.iter().map(|&s| Sent::Row(s)).collect(),
        active: active.clone(),
        ..ModelView::default()
    };
    if cut_upto == 0 || active.is_empty() {
        return all_sent();
    }
    let infos = st.row_infos();
    let mut plan = tideline::plan_window(&infos, cut_upto);
    if plan.start == 0 || plan.effective_upto_seq == 0 {
        return all_sent();
    }
    let at_compaction = st.row(active[plan.start]).compaction();
    if at_compaction {
        plan.pinned_prompt = None;
    }
    let pinned_seq = plan.pinned_prompt.map(|i| active[i]);
    let mut turns: Vec<&(u64, String)> = st
        .turn_lines
        .values()
        .filter(|(seq, _)| *seq <= plan.effective_upto_seq && pinned_seq != Some(*seq))
        .collect();
    turns.sort();
    let lines: Vec<(u32, &str)> = turns
        .iter()
        .map(|(seq, line)| (st.row(*seq).turn, line.as_str()))
        .collect();
    let dir = DataDir::new(data_dir).session_dir(&id);
    let stub = tideline::stub_text(plan.effective_upto_seq, &dir.display().to_string(), &lines);
    let pinned_parts = if at_compaction {
        Vec::new()
    } else {
        let standing = |i: usize| -> &[oceancode_window::Standing] { st.row(active[i]).standing() };
        tideline::plan_pins(&infos, &plan, standing)
            .into_iter()
            .map(|p| (active[p.row], p.part))
            .collect()
    };
    let kept: Vec<Sent> = (0..plan.start)
        .filter(|&i| Some(i) != plan.pinned_prompt)
        .filter(|&i| {
            let r = st.row(active[i]);
            matches!(r.kind, RowKind::System | RowKind::Other) && !at_compaction
        })
        .map(|i| Sent::Row(active[i]))
        .collect();
    let mut sent = Vec::with_capacity(active.len() - plan.start + kept.len() + 2);
    if st.dialect.spec().stub_first() {
        sent.push(Sent::Stub);
        sent.extend(kept);
    } else {
        sent.extend(kept);
        sent.push(Sent::Stub);
    }
    if let Some(s) = pinned_seq {
        sent.push(Sent::Row(s));
    }
    sent.extend(active[plan.start..].iter().map(|&s| Sent::Row(s)));
    ModelView {
        upto: plan.effective_upto_seq,
        stub: Some(stub),
        sent,
        pinned_parts,
        at_compaction,
        active,
    }
}
