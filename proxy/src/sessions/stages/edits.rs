//! The context edits' stage: the session's edit set applied to the pieces
//! (deleted rows, rewritten rows, notes), and checked: a set that would
//! make the request invalid is not applied, and the window says why.

use super::{Draft, WindowStage};
use crate::context::edits;
use crate::sessions::window::facts;

/// The session's edit set.
pub(super) struct Edits;

impl WindowStage for Edits {
    fn name(&self) -> &'static str {
        "context edits"
    }

    fn rewrite<'a>(&self, d: &mut Draft<'a>) {
        let st = d.st;
        let set = &st.context.set;
        if set.is_empty() {
            return;
        }
        d.changed = true;
        let applied = edits::apply(set, d.pieces(), facts(st));
        match edits::check(st.dialect, &applied, facts(st)) {
            Ok(()) => *d.pieces() = applied,
            Err(e) => d.window.edit_error = Some(e),
        }
    }
}
