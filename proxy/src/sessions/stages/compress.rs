//! Compress's stage (`ledger.compress`): at a cut the pruned set is chosen
//! again (`sessions::compress::refresh`), and the retained rows' pruned
//! outputs are sent as pointers until the next one.

use super::{AtCut, Draft, SessionMetrics, State, Window, WindowStage};
use std::sync::atomic::Ordering;

/// Old tool outputs as pointers.
pub(super) struct Compress;

impl WindowStage for Compress {
    fn name(&self) -> &'static str {
        "compress"
    }

    /// Choose the pruned set again when the window's start moved (a cut);
    /// between cuts it stays.
    fn at_cut(&self, st: &mut State, cx: &AtCut<'_>) {
        let c = &cx.settings.compress;
        let cp = c.enabled.then(|| oceancode_window::compress::Params {
            protect: c.protect_tokens(cx.line),
            min_tokens: c.min_tokens,
        });
        let added = crate::sessions::compress::refresh(st, cx.parsed, cp, cx.locator);
        if added > 0 {
            cx.metrics
                .compress_outputs
                .fetch_add(u64::from(added), Ordering::Relaxed);
            tracing::debug!(session = %st.meta.id, added, outputs = st.compress.outputs, saved = st.compress.saved, "compress: old tool output sent as pointers from this cut on");
        }
    }

    /// The pruned outputs of the retained rows as pointers (masking comes
    /// before any cut).
    fn rewrite<'a>(&self, d: &mut Draft<'a>) {
        let st = d.st;
        if st.active.len() > d.parsed.messages.len() {
            return;
        }
        let (pruned, media) = crate::sessions::compress::rewritten(st, d.parsed, d.start);
        if pruned.is_empty() {
            return;
        }
        for (&i, m) in &pruned {
            let text = d.keep(m);
            let at = d.retained + (i - d.start);
            d.pieces()[at].1 = text;
        }
        d.changed = true;
        d.window.media_out = d.window.media_out.plus(media);
        d.window.saved = st.compress.saved;
        d.window.pruned_rows = pruned
            .keys()
            .filter_map(|&i| st.active.get(i).copied())
            .collect();
    }

    /// The step records the pruned set when the window sent pointers.
    fn record(&self, st: &mut State, w: &mut Window, _cut: bool) {
        w.compress = if w.saved > 0 {
            st.compress.detail()
        } else {
            None
        };
    }

    fn meter(&self, st: &mut State, w: &Window, m: &SessionMetrics) {
        m.compress_saved_tokens
            .fetch_add(w.saved, Ordering::Relaxed);
        let sent = w.saved > 0;
        st.meter.pruned_outputs = if sent { st.compress.outputs } else { 0 };
        st.meter.pruned_tokens = if sent { st.compress.tokens } else { 0 };
        st.meter.saved_tokens = w.saved;
    }
}
