//! What a step sends upstream, kept in its record (`StepDetail::sent`) so
//! the viewer's model view shows exactly what the model saw at any step:
//! the window's layout as runs of seqs (rows an edit rewrote, notes, the
//! stub, the recall tool's exchanges in their places), the cut and the edit
//! in force, and the stub message itself — on the first step that sent it
//! (it changes only at a cut), later steps naming that step. Pure.

use super::state::State;
use super::window::Window;
use crate::context::edits::Src;
use oceancode_window::{SentPiece, SentWindow};

/// The record of window `w` for a request of `n` messages (`stateful`: the
/// provider holds the conversation, the request carries only its new
/// messages), the stub message with it (see [`keep_stub_once`]).
pub(super) fn record(st: &State, w: &Window, n: usize, stateful: bool) -> SentWindow {
    let mut s = SentWindow {
        upto: w.upto,
        tail: st.active.last().copied().unwrap_or(0),
        stateful,
        ..SentWindow::default()
    };
    match &w.layout {
        Some(layout) => {
            let mut last_row = 0u64;
            for src in layout {
                match *src {
                    Src::Row(seq) if w.pruned_rows.contains(&seq) => {
                        last_row = seq;
                        s.pieces.push(SentPiece::Pruned(seq));
                    }
                    Src::Row(seq) => {
                        last_row = seq;
                        s.push_row(seq);
                    }
                    Src::Edited(seq) => {
                        last_row = seq;
                        s.pieces.push(SentPiece::Edited(seq));
                    }
                    Src::Note(id) => s.pieces.push(SentPiece::Note(id)),
                    Src::Fixed("recall") => match s.pieces.last_mut() {
                        Some(SentPiece::Recall(after, k)) if *after == last_row => *k += 1,
                        _ => s.pieces.push(SentPiece::Recall(last_row, 1)),
                    },
                    Src::Fixed(_) => s.pieces.push(SentPiece::Stub),
                    Src::Tail => match s.pieces.last_mut() {
                        Some(SentPiece::Tail(k)) => *k += 1,
                        _ => s.pieces.push(SentPiece::Tail(1)),
                    },
                }
            }
        }
        None => {
            // The request as it came: its messages are the active line's
            // first `n` (or, held by the provider, its last `n`).
            let len = st.active.len();
            let rows = if stateful {
                &st.active[len.saturating_sub(n)..]
            } else {
                &st.active[..n.min(len)]
            };
            for &seq in rows {
                s.push_row(seq);
            }
            if !stateful && n > len {
                s.pieces
                    .push(SentPiece::Tail(u32::try_from(n - len).unwrap_or(u32::MAX)));
            }
        }
    }
    let edited = w.layout.as_ref().is_some_and(|_| w.edit_error.is_none());
    if edited && !st.context.set.is_empty() {
        s.edit = st.context.taken;
    }
    s.stub = w.stub.clone();
    if !w.pruned_rows.is_empty() {
        let mut pointers: Vec<oceancode_window::RowPointers> = w
            .pruned_rows
            .iter()
            .filter_map(|seq| {
                let p = st.compress.rows.get(seq)?;
                Some((
                    *seq,
                    p.iter().map(|o| (o.part, o.pointer.clone())).collect(),
                ))
            })
            .collect();
        pointers.sort();
        s.pointers = Some(pointers);
    }
    s
}

/// Keep the stub message (and the compress pointers) on the first
/// recorded step that sent it: a step sending the one the session's last
/// recorded step kept names that step instead. Called as the step is recorded (a request rolled back before
/// its record keeps nothing).
pub(super) fn keep_stub_once(
    st: &mut State,
    step: u32,
    sent: Option<SentWindow>,
) -> Option<SentWindow> {
    let mut s = sent?;
    if let Some(p) = &s.pointers {
        let hash = crate::dialect::raw_hash(&serde_json::to_string(p).unwrap_or_default());
        match st.sent_pointers {
            Some((h, from)) if h == hash && from != step => {
                s.pointers = None;
                s.pointers_step = from;
            }
            _ => st.sent_pointers = Some((hash, step)),
        }
    }
    if let Some(stub) = &s.stub {
        let hash = crate::dialect::raw_hash(stub);
        match st.sent_stub {
            Some((h, from)) if h == hash && from != step => {
                s.stub = None;
                s.stub_step = from;
            }
            _ => st.sent_stub = Some((hash, step)),
        }
    }
    Some(s)
}
