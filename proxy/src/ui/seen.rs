//! What the model saw on one step, message by message: the step's record of
//! what it sent (`StepDetail::sent`, see [`oceancode_window::SentWindow`])
//! resolved against the ledger — rows as recorded, the stub message as sent
//! (its text, the state block, the standing parts kept with it), rows as the
//! edit set in force rewrote them, its notes, the recall tool's exchanges.
//! Pure: the caller read the rows, steps and edits.

use crate::context::edits::EditSet;
use oceancode_ledger::store::{ContextEditRecord, StepRecord};
use oceancode_window::{Dialect, Row, SentPiece};

/// Where a message of the window comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A recorded row, as the ledger holds it.
    Row(u64),
    /// A row as the edit set in force rewrote it.
    Edited(u64),
    /// A row with tool outputs sent as pointers (`ledger.compress`).
    Pruned(u64),
    /// A note of the edit set in force.
    Note(u32),
    /// The stub message (the proxy's own).
    Stub,
    /// The recall tool's exchange after a row (the proxy's own).
    Recall(u64),
    /// A message past the recorded line.
    Tail,
}

/// One message sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Where it comes from.
    pub source: Source,
    /// Its JSON as sent (None: the ledger does not hold it).
    pub raw: Option<String>,
}

/// The edit set in force on a step, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EditInForce {
    /// Its number (the n-th edit of the session).
    pub n: u32,
    /// Rows it leaves out (of the whole session; those in this window's
    /// range are simply not in it).
    pub deleted: Vec<u64>,
    /// Rows it rewrites.
    pub rewritten: usize,
    /// Its notes.
    pub notes: usize,
}

/// What the model saw on a step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The step.
    pub step: u32,
    /// The messages, in the order sent.
    pub messages: Vec<Message>,
    /// The last row that left the window (0 = none).
    pub upto: u64,
    /// The edit set in force, if any.
    pub edit: Option<EditInForce>,
    /// Only the request's own messages were sent (the provider holds the
    /// conversation).
    pub stateful: bool,
}

impl Seen {
    /// The seqs of the rows sent (as recorded or rewritten).
    pub fn row_seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.messages.iter().filter_map(|m| match m.source {
            Source::Row(s) | Source::Edited(s) | Source::Pruned(s) => Some(s),
            _ => None,
        })
    }

    /// The messages as one JSON array (a message the ledger lacks is `null`).
    pub fn messages_json(&self) -> String {
        let mut out = String::from("[");
        for (i, m) in self.messages.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(m.raw.as_deref().unwrap_or("null"));
        }
        out.push(']');
        out
    }
}

/// What step `at` of `steps` sent (None: the step is not recorded, or was
/// recorded before the proxy kept what each step sent). `row` finds a
/// recorded row by seq; `edits` are the session's taken edits.
pub fn seen<'r>(
    dialect: Dialect,
    steps: &[StepRecord],
    at: u32,
    row: impl Fn(u64) -> Option<&'r Row>,
    edits: &[ContextEditRecord],
) -> Option<Seen> {
    let rec = steps.iter().rfind(|s| s.step == at)?;
    let sent = rec.detail.sent.as_ref()?;
    let set: Option<EditSet> = (sent.edit > 0)
        .then(|| edits.iter().find(|e| e.n == sent.edit))
        .flatten()
        .and_then(|e| serde_json::from_str(&e.set).ok());
    let stub = match (&sent.stub, sent.stub_step) {
        (Some(s), _) => Some(s.clone()),
        (None, 0) => None,
        (None, from) => steps
            .iter()
            .rfind(|s| s.step == from)
            .and_then(|s| s.detail.sent.as_ref()?.stub.clone()),
    };
    let pointers = match (&sent.pointers, sent.pointers_step) {
        (Some(p), _) => Some(p.clone()),
        (None, 0) => None,
        (None, from) => steps
            .iter()
            .rfind(|s| s.step == from)
            .and_then(|s| s.detail.sent.as_ref()?.pointers.clone()),
    };
    let mut messages = Vec::with_capacity(sent.messages());
    for p in &sent.pieces {
        match *p {
            SentPiece::Rows(a, b) => {
                for seq in a..=b {
                    messages.push(Message {
                        source: Source::Row(seq),
                        raw: row(seq).map(|r| r.raw.to_string()),
                    });
                }
            }
            SentPiece::Stub => messages.push(Message {
                source: Source::Stub,
                raw: stub.clone(),
            }),
            SentPiece::Pruned(seq) => messages.push(Message {
                source: Source::Pruned(seq),
                raw: pointers
                    .as_ref()
                    .and_then(|p| p.iter().find(|(s, _)| *s == seq))
                    .zip(row(seq))
                    .and_then(|((_, parts), r)| {
                        let parts: Vec<(u32, &str)> =
                            parts.iter().map(|(i, t)| (*i, t.as_str())).collect();
                        oceancode_window::compress::rewrite(dialect, &r.raw, &parts)
                    }),
            }),
            SentPiece::Edited(seq) => messages.push(Message {
                source: Source::Edited(seq),
                raw: set.as_ref().and_then(|s| s.rewritten.get(&seq).cloned()),
            }),
            SentPiece::Note(id) => messages.push(Message {
                source: Source::Note(id),
                raw: set
                    .as_ref()
                    .and_then(|s| s.notes.iter().find(|n| n.id == id))
                    .map(|n| n.raw.clone()),
            }),
            SentPiece::Recall(after, k) => {
                let kept = recall_exchange(steps, at, after, k as usize);
                for i in 0..k as usize {
                    messages.push(Message {
                        source: Source::Recall(after),
                        raw: kept.as_ref().and_then(|m| m.get(i).cloned()),
                    });
                }
            }
            SentPiece::Tail(k) => {
                for _ in 0..k {
                    messages.push(Message {
                        source: Source::Tail,
                        raw: None,
                    });
                }
            }
        }
    }
    let edit = set.map(|s| EditInForce {
        n: sent.edit,
        deleted: s.deleted.iter().copied().collect(),
        rewritten: s.rewritten.len(),
        notes: s.notes.len(),
    });
    Some(Seen {
        step: at,
        messages,
        upto: sent.upto,
        edit,
        stateful: sent.stateful,
    })
}

/// The recall exchange of `k` messages after row `after` that step `at`
/// re-sent: kept by the latest earlier step whose request ended at that row.
fn recall_exchange(steps: &[StepRecord], at: u32, after: u64, k: usize) -> Option<Vec<String>> {
    steps.iter().rev().filter(|s| s.step < at).find_map(|s| {
        let sent = s.detail.sent.as_ref()?;
        if sent.tail != after || s.detail.recalls.is_empty() {
            return None;
        }
        let msgs: Vec<String> = s
            .detail
            .recalls
            .iter()
            .flat_map(|r| r.messages.iter().cloned())
            .collect();
        (msgs.len() == k).then_some(msgs)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: failures panic
    use super::*;
    use oceancode_window::{SentWindow, StepDetail, Usage};

    fn step(n: u32, sent: SentWindow) -> StepRecord {
        StepRecord {
            step: n,
            model: "m".into(),
            status: 200,
            usage: Usage::default(),
            window_rows: 0,
            ts_ms: 0,
            error: None,
            detail: StepDetail {
                sent: Some(sent),
                ..StepDetail::default()
            },
        }
    }

    fn row(seq: u64) -> Row {
        Row {
            seq,
            role: "user".into(),
            kind: oceancode_window::RowKind::Prompt,
            raw: format!("{{\"role\":\"user\",\"content\":\"row {seq}\"}}").into(),
            tokens: 1,
            turn: 1,
            step: 1,
            branch: 0,
            from_response: false,
        }
    }

    #[test]
    fn rows_the_stub_edits_and_notes_resolve_in_order() {
        let rows: Vec<Row> = (1..=9).map(row).collect();
        let set = serde_json::json!({
            "deleted": [6],
            "rewritten": {"7": "{\"role\":\"user\",\"content\":\"seven, shorter\"}"},
            "notes": [{"id": 1, "after": 5, "text": "n", "raw": "{\"role\":\"assistant\",\"content\":\"note\"}"}],
            "next_note": 2
        });
        let edits = vec![ContextEditRecord {
            n: 1,
            ts_ms: 0,
            seqs: vec![6, 7],
            tokens_before: 0,
            tokens_after: 0,
            set: set.to_string(),
        }];
        let first = SentWindow {
            pieces: vec![SentPiece::Stub, SentPiece::Rows(4, 5)],
            upto: 3,
            stub: Some("{\"role\":\"user\",\"content\":\"stub\"}".into()),
            ..SentWindow::default()
        };
        let second = SentWindow {
            pieces: vec![
                SentPiece::Stub,
                SentPiece::Rows(4, 5),
                SentPiece::Note(1),
                SentPiece::Edited(7),
                SentPiece::Rows(8, 9),
            ],
            upto: 3,
            edit: 1,
            stub_step: 1,
            ..SentWindow::default()
        };
        let steps = vec![step(1, first), step(2, second)];
        let s = seen(
            Dialect::Anthropic,
            &steps,
            2,
            |q| rows.iter().find(|r| r.seq == q),
            &edits,
        )
        .unwrap();
        assert_eq!(
            s.messages_json(),
            "[{\"role\":\"user\",\"content\":\"stub\"},{\"role\":\"user\",\"content\":\"row 4\"},{\"role\":\"user\",\"content\":\"row 5\"},{\"role\":\"assistant\",\"content\":\"note\"},{\"role\":\"user\",\"content\":\"seven, shorter\"},{\"role\":\"user\",\"content\":\"row 8\"},{\"role\":\"user\",\"content\":\"row 9\"}]"
        );
        assert_eq!(s.row_seqs().collect::<Vec<_>>(), [4, 5, 7, 8, 9]);
        let e = s.edit.unwrap();
        assert_eq!((e.n, e.deleted, e.rewritten, e.notes), (1, vec![6], 1, 1));
        // A step recorded without its window has nothing to show.
        let mut old = step(3, SentWindow::default());
        old.detail.sent = None;
        assert!(seen(Dialect::Anthropic, &[old], 3, |_| None, &[]).is_none());
    }

    #[test]
    fn runs_join_consecutive_seqs_only() {
        let mut w = SentWindow::default();
        for s in [1, 2, 3, 7, 8, 10] {
            w.push_row(s);
        }
        assert_eq!(
            w.pieces,
            [
                SentPiece::Rows(1, 3),
                SentPiece::Rows(7, 8),
                SentPiece::Rows(10, 10)
            ]
        );
        assert_eq!(w.messages(), 6);
    }
}
