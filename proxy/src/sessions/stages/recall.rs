//! The recall tool's stages: the note the stub ends with when the tool is
//! on, and the tool's internal exchanges put back right after their rows.

use super::{Draft, WindowStage};
use crate::context::edits::Src;
use crate::sessions::state::State;

/// The stub's note on the recall tool.
pub(super) struct Note;

impl WindowStage for Note {
    fn name(&self) -> &'static str {
        "recall note"
    }

    fn rewrite<'a>(&self, d: &mut Draft<'a>) {
        if let (true, Some(stub)) = (d.st.recall_tool, d.stub.as_mut()) {
            stub.push('\n');
            stub.push_str(crate::recall_tool::STUB_NOTE);
        }
    }
}

/// The recall tool's internal exchanges, after their rows.
pub(super) struct Exchanges;

impl WindowStage for Exchanges {
    fn name(&self) -> &'static str {
        "recall exchanges"
    }

    /// The pieces with the exchanges put after their rows (as
    /// `Src::Fixed("recall")`: the proxy's own, not editable).
    fn rewrite<'a>(&self, d: &mut Draft<'a>) {
        let st = d.st;
        if !puts_back(st) {
            return;
        }
        d.changed = true;
        let pieces = std::mem::take(d.pieces());
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
        *d.pieces() = out;
    }
}

/// Whether the session's requests get its internal exchanges back: it has
/// some, and the tool is on (a session restored by a proxy with the tool
/// off is sent as the client has it: no call of a tool the request lacks).
fn puts_back(st: &State) -> bool {
    st.recall_tool && !st.hidden.is_empty()
}
