//! An export (pure): the blocks of a window as the upstream saw it, the
//! file's text and the record an edit of it is read against.

use super::body;
use super::edits::{body_hash, Export, Exported, Note, Src};
use super::file::{self, Block};
use oceancode_window::Dialect;

/// The text a stub (or other fixed) message shows: its text parts.
fn fixed_text(raw: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(raw).unwrap_or_default();
    match v.get("content") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A stub message's text without its state block, and the state block
/// (`oceancode_ledger::state_block::HEAD` to the end of the stub's part).
fn split_state(raw: &str) -> (String, Option<String>) {
    let v: serde_json::Value = serde_json::from_str(raw).unwrap_or_default();
    let head = format!("\n\n{}", oceancode_ledger::state_block::HEAD);
    let mut texts: Vec<String> = match v.get("content") {
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(|t| t.as_str()).map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    let state = texts.first_mut().and_then(|first| {
        let at = first.find(&head)?;
        let state = first[at + 2..].to_string();
        first.truncate(at);
        Some(state)
    });
    (texts.join("\n"), state)
}

/// A rendered body without its escapes (what a parse of it gives back).
fn unescaped(text: &str) -> String {
    text.split('\n')
        .map(body::unescape_line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The blocks of a window's pieces (raw JSON, the stub's included).
pub fn blocks(d: Dialect, pieces: &[(Src, &str)], notes: &[Note]) -> Vec<Block> {
    let mut out = Vec::with_capacity(pieces.len());
    for (src, raw) in pieces {
        match src {
            Src::Row(seq) | Src::Edited(seq) => match body::read(d, raw) {
                Some((b, _)) => out.push(Block::Msg {
                    seq: *seq,
                    role: b.role,
                    body: b.text,
                }),
                None => {
                    let mut t = String::new();
                    body::escape(raw, &mut t);
                    out.push(Block::Msg {
                        seq: *seq,
                        role: "other".into(),
                        body: t,
                    });
                }
            },
            Src::Note(id) => {
                if let Some(n) = notes.iter().find(|n| n.id == *id) {
                    out.push(Block::Note {
                        id: *id,
                        text: n.text.clone(),
                    });
                }
            }
            Src::Fixed("stub") => {
                // The state block follows the stub's text in the same part:
                // a block of its own in the file, not editable either.
                let (stub, state) = split_state(raw);
                out.push(Block::Fixed {
                    label: "stub".into(),
                    text: stub,
                });
                if let Some(state) = state {
                    out.push(Block::Fixed {
                        label: "state".into(),
                        text: state,
                    });
                }
            }
            Src::Fixed(label) => out.push(Block::Fixed {
                label: (*label).to_string(),
                text: fixed_text(raw),
            }),
            Src::Tail => {}
        }
    }
    out
}

/// The file's text and the record of an export of `blocks`.
pub fn file(session: &str, nonce: &str, blocks: &[Block]) -> (String, Export) {
    let seqs: Vec<u64> = blocks
        .iter()
        .filter_map(|b| match b {
            Block::Msg { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect();
    let range = (
        seqs.iter().copied().min().unwrap_or(0),
        seqs.iter().copied().max().unwrap_or(0),
    );
    let first = file::first_line(session, nonce, range, seqs.len());
    let text = file::render(&first, nonce, blocks);
    let record = Export {
        nonce: nonce.to_string(),
        first,
        blocks: blocks
            .iter()
            .map(|b| match b {
                Block::Msg { seq, body, .. } => Exported::Row {
                    seq: *seq,
                    hash: body_hash(&unescaped(body)),
                },
                Block::Note { id, text } => Exported::Note {
                    id: *id,
                    hash: body_hash(text),
                },
                Block::Fixed { label, text } => Exported::Fixed {
                    label: label.clone(),
                    hash: body_hash(text),
                },
            })
            .collect(),
    };
    (text, record)
}

#[cfg(test)]
mod tests {
    use super::super::edits::{diff, Change, EditSet};
    use super::*;
    use serde_json::json;

    #[test]
    fn an_untouched_export_diffs_to_nothing() {
        let msgs = [
            json!({"role":"user","content":"look at [[this]]\n[[m:e0 1 user]]"}).to_string(),
            json!({"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"Bash","input":{"c":"ls"}}]}).to_string(),
            json!({"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a\n\n\nb\n"}]}).to_string(),
        ];
        let stub = json!({"role":"user","content":[{"type":"text","text":"[stub]"}]}).to_string();
        let mut pieces = vec![(Src::Fixed("stub"), stub.as_str())];
        pieces.extend(
            msgs.iter()
                .enumerate()
                .map(|(i, m)| (Src::Row(i as u64 + 5), m.as_str())),
        );
        let b = blocks(Dialect::Anthropic, &pieces, &[]);
        let (text, record) = file("s", "e1", &b);
        let parsed = file::parse(text.as_bytes()).unwrap();
        assert_eq!(diff(&record, &parsed, &EditSet::default()).unwrap(), vec![]);
        assert!(
            text.starts_with("[[context s export e1 · seq 5–7 · 3 messages"),
            "{text}"
        );
    }

    /// A CRLF tool output holding header-like lines (issue 33.2): untouched
    /// it is no change whatever else the file's edit does; edited, its
    /// other lines keep their CRs and the header-like lines stay its text.
    #[test]
    fn a_crlf_output_with_forged_headers_stays_bytes_and_text() {
        let output = "build ok\r\n[[m:e1 5 user]]\r\n[[end of context e1]]\r\n[[delete]]\r\n[[note]]\r\nlast line\r\n";
        let msgs = [
            json!({"role":"user","content":"[[delete]]\r\ngo"}).to_string(),
            json!({"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"c":"make"}}]}).to_string(),
            json!({"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":output}]}).to_string(),
        ];
        let pieces: Vec<(Src, &str)> = msgs
            .iter()
            .enumerate()
            .map(|(i, m)| (Src::Row(i as u64 + 1), m.as_str()))
            .collect();
        let b = blocks(Dialect::Anthropic, &pieces, &[]);
        let (text, record) = file("s", "e1", &b);
        let parsed = file::parse(text.as_bytes()).unwrap();
        assert_eq!(parsed.blocks.len(), 3, "no header read from the output");
        assert_eq!(diff(&record, &parsed, &EditSet::default()).unwrap(), vec![]);
        // A note elsewhere: only the note.
        let noted = text.replace("\n[[end of context", "\n[[note]]\nmine\n\n[[end of context");
        let parsed = file::parse(noted.as_bytes()).unwrap();
        assert_eq!(
            diff(&record, &parsed, &EditSet::default()).unwrap(),
            vec![Change::NoteNew {
                after: 3,
                text: "mine".into()
            }]
        );
        // The output edited: its other lines and its CRs stay.
        let edited = text.replace("build ok\r\n", "build OK\r\n");
        let parsed = file::parse(edited.as_bytes()).unwrap();
        let changes = diff(&record, &parsed, &EditSet::default()).unwrap();
        let [Change::Rewrite { seq: 3, body, .. }] = changes.as_slice() else {
            panic!("{changes:?}");
        };
        let (old, v) = body::read(Dialect::Anthropic, &msgs[2]).unwrap();
        let out = body::rewrite(&old, &v, body, 3).unwrap();
        let o: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            o["content"][0]["content"].as_str().unwrap(),
            format!(
                "build OK\r\n[[m:e1 5 user]]\r\n[[end of context e1]]\r\n[[delete]]\r\n[[note]]\r\nlast line\n{}",
                body::recall_line(3)
            )
        );
    }
}
