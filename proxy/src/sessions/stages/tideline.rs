//! The tideline's stage: the window of the session's cut. The rows up to
//! the plan's start leave (the system rows kept from before it, the pinned
//! ask right after the stub), the stub's first text names them, and the
//! retained rows follow as they came.

use super::{Cut, Draft, SessionMetrics, State, Window, WindowStage};
use crate::context::edits::Src;
use oceancode_window::media::Cost;
use oceancode_window::tideline;
use oceancode_window::RowKind;

/// The tideline's cut.
pub(super) struct Tideline;

impl WindowStage for Tideline {
    fn name(&self) -> &'static str {
        "tideline"
    }

    fn rewrite<'a>(&self, d: &mut Draft<'a>) {
        let (st, parsed) = (d.st, d.parsed);
        let n = parsed.messages.len();
        let cut_upto = st.tideline.cut_upto();
        // Messages past the active line (a count_tokens request's new tail)
        // are retained as they are.
        if cut_upto == 0 || st.active.len() > n {
            return;
        }
        let infos = st.row_infos();
        let mut plan = tideline::plan_window(&infos, cut_upto);
        if plan.start == 0 || plan.effective_upto_seq == 0 {
            return;
        }
        // Starting at a compaction block: what precedes it the provider drops
        // (a pinned ask, kept system rows or standing parts would be dropped too).
        let at_compaction = st.row(st.active[plan.start]).compaction();
        if at_compaction {
            plan.pinned_prompt = None;
        }
        let dir =
            oceancode_ledger::paths::DataDir::new(&d.settings.data_dir).session_dir(&st.meta.id);
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
        d.stub = Some(tideline::stub_text(plan.effective_upto_seq, &dir, &lines));
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
                    media_out = media_out.plus(r.media());
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
        d.retained = parts.len();
        parts.extend(d.pieces().drain(plan.start..));
        *d.pieces() = parts;
        d.start = plan.start;
        d.changed = true;
        d.window.kept_out = kept_out;
        d.window.media_out = media_out;
        d.window.upto = plan.effective_upto_seq;
        d.cut = Some(Cut {
            infos,
            plan,
            at_compaction,
            dir,
        });
    }

    fn meter(&self, st: &mut State, w: &Window, _m: &SessionMetrics) {
        st.meter.window_rows = w.rows;
        st.meter.last_cut_rows = w.cut_rows;
    }
}
