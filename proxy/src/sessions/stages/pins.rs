//! The standing parts' stage: the project instructions (CLAUDE.md,
//! AGENTS.md, ...) of the rows that left are sent with the stub, right
//! after its text, and are not counted as left out.

use super::{Draft, SessionMetrics, State, Window, WindowStage};
use crate::dialect::{self, ParsedBody};
use oceancode_window::tideline;

/// The standing parts kept with the stub.
pub(super) struct Pins;

impl WindowStage for Pins {
    fn name(&self) -> &'static str {
        "standing parts"
    }

    fn rewrite<'a>(&self, d: &mut Draft<'a>) {
        // Standing parts before a compaction block would be dropped with the stub.
        let Some(cut) = d.cut.as_ref().filter(|c| !c.at_compaction) else {
            return;
        };
        let pinned = pinned_parts(d.st, &cut.infos, &cut.plan, d.parsed);
        let pinned_bytes: usize = pinned.iter().map(|p| p.len()).sum();
        let pinned_tokens = (pinned_bytes as f64 / d.st.bytes_per_token).ceil() as u64;
        d.pinned = pinned;
        d.window.pinned_tokens = pinned_tokens;
        d.window.kept_out = d.window.kept_out.saturating_sub(pinned_tokens);
    }

    fn record(&self, st: &mut State, w: &mut Window, cut: bool) {
        if cut && w.pinned_tokens > 0 {
            tracing::debug!(session = %st.meta.id, upto = w.upto, pinned_tokens = w.pinned_tokens, "the cut window keeps the standing instructions of the rows that left");
        }
    }

    fn meter(&self, st: &mut State, w: &Window, _m: &SessionMetrics) {
        st.meter.pinned_tokens = w.pinned_tokens;
    }
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
    let standing = |i: usize| -> &[oceancode_window::Standing] { st.row(st.active[i]).standing() };
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
