//! Anthropic's server-side context management, as the API applies it.
//!
//! * Compaction (`context_management.edits[] = {"type": "compact_20260112"}`,
//!   beta `compact-2026-01-12`): when the input reaches the trigger (default
//!   150,000 tokens) the answer opens with a `compaction` block (the summary)
//!   and `usage.iterations[]` bills the summary step (a `compaction` entry,
//!   left out of the top-level usage) and the answer (a `message` entry, the
//!   top-level numbers). `pause_after_compaction` stops after the block
//!   (`stop_reason: "compaction"`). On every request, whatever precedes the
//!   latest `compaction` block is dropped before counting ([`drop_point`]).
//! * Context editing (`clear_tool_uses_20250919`, `clear_thinking_20251015`):
//!   tool results older than the last `keep` tool uses (default 3, once the
//!   input reaches the trigger, default 100,000) and the thinking of all but
//!   the last `keep` assistant turns (default 1) are cleared; the answer
//!   reports `context_management.applied_edits` and its input is counted
//!   without them.

use serde_json::{Map, Value};

use crate::analyze::array;
use crate::tokens::TokenMemo;

/// Default input-token trigger of `compact_20260112`.
pub(crate) const COMPACT_TRIGGER: u64 = 150_000;
/// Default input-token trigger of `clear_tool_uses_20250919`.
pub(crate) const CLEAR_TOOL_USES_TRIGGER: u64 = 100_000;

/// What a request's `context_management.edits` asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Requested {
    /// `compact_20260112`: (trigger, pause after compaction).
    pub compact: Option<(u64, bool)>,
    /// `clear_tool_uses_20250919`: (trigger, tool uses kept).
    pub clear_tool_uses: Option<(u64, usize)>,
    /// `clear_thinking_20251015`: assistant turns whose thinking is kept
    /// (None = `"all"`).
    pub clear_thinking: Option<Option<usize>>,
    /// The edits in the order the request lists them (report order).
    pub order: Vec<&'static str>,
}

fn trigger(e: &Value, default: u64) -> u64 {
    e.pointer("/trigger/value")
        .and_then(Value::as_u64)
        .unwrap_or(default)
}

/// Read `context_management.edits`.
pub(crate) fn requested(obj: &Map<String, Value>) -> Requested {
    let mut r = Requested::default();
    let edits = obj
        .get("context_management")
        .and_then(|c| c.get("edits"))
        .map(|e| array(Some(e)))
        .unwrap_or(&[]);
    for e in edits {
        match e.get("type").and_then(Value::as_str) {
            Some("compact_20260112") => {
                let pause = e
                    .get("pause_after_compaction")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                r.compact = Some((trigger(e, COMPACT_TRIGGER), pause));
            }
            Some("clear_tool_uses_20250919") => {
                let keep = e
                    .pointer("/keep/value")
                    .and_then(Value::as_u64)
                    .unwrap_or(3) as usize;
                r.clear_tool_uses = Some((trigger(e, CLEAR_TOOL_USES_TRIGGER), keep));
                r.order.push("clear_tool_uses_20250919");
            }
            Some("clear_thinking_20251015") => {
                let keep = match e.get("keep") {
                    Some(Value::String(s)) if s == "all" => None,
                    Some(k) => Some(k.get("value").and_then(Value::as_u64).unwrap_or(1) as usize),
                    None => Some(1),
                };
                r.clear_thinking = Some(keep);
                r.order.push("clear_thinking_20251015");
            }
            _ => {}
        }
    }
    r
}

/// The index of the message holding the latest `compaction` block with a
/// summary (a block whose `content` is null is a failed compaction: a no-op).
pub(crate) fn drop_point(messages: &[Value]) -> Option<usize> {
    messages.iter().rposition(|m| {
        array(m.get("content")).iter().any(|b| {
            b.get("type").and_then(Value::as_str) == Some("compaction")
                && b.get("content").is_some_and(Value::is_string)
        })
    })
}

/// Tokens of what an edit may clear, per message of the kept conversation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Clearable {
    /// (message index, tokens of the result's content) per tool result, in order.
    pub tool_results: Vec<(usize, u64)>,
    /// (message index, tokens of its thinking) per assistant message with thinking.
    pub thinking: Vec<(usize, u64)>,
}

fn strings(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(s);
            out.push(' ');
        }
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(m) => m.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// What the edits could clear in `messages` (from index `from` on).
pub(crate) fn clearable(messages: &[Value], from: usize, memo: &TokenMemo) -> Clearable {
    let mut c = Clearable::default();
    for (i, m) in messages.iter().enumerate().skip(from) {
        let blocks = array(m.get("content"));
        let mut thinking = String::new();
        for b in blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("tool_result") => {
                    let mut s = String::new();
                    if let Some(x) = b.get("content") {
                        strings(x, &mut s);
                    }
                    c.tool_results.push((i, memo.text(&s)));
                }
                Some("thinking") => {
                    if let Some(t) = b.get("thinking").and_then(Value::as_str) {
                        thinking.push_str(t);
                    }
                }
                Some("redacted_thinking") => thinking.push_str("redacted"),
                _ => {}
            }
        }
        if !thinking.is_empty() && m.get("role").and_then(Value::as_str) == Some("assistant") {
            c.thinking.push((i, memo.text(&thinking)));
        }
    }
    c
}

/// One applied edit, as the API reports it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Applied {
    pub kind: &'static str,
    pub cleared_input_tokens: u64,
    /// Tool uses or thinking turns cleared.
    pub cleared: u64,
    /// The first message it cleared something in.
    pub first_message: usize,
}

/// The edits that clear something in a request of `total` input tokens.
pub(crate) fn apply_edits(r: &Requested, c: &Clearable, total: u64) -> Vec<Applied> {
    let mut out = Vec::new();
    for kind in &r.order {
        let (items, keep): (&[(usize, u64)], usize) = match *kind {
            "clear_tool_uses_20250919" => match r.clear_tool_uses {
                Some((trigger, keep)) if total >= trigger => (&c.tool_results, keep),
                _ => continue,
            },
            "clear_thinking_20251015" => match r.clear_thinking {
                Some(Some(keep)) => (&c.thinking, keep),
                _ => continue,
            },
            _ => continue,
        };
        let n = items.len().saturating_sub(keep);
        if n == 0 {
            continue;
        }
        let cleared = &items[..n];
        out.push(Applied {
            kind,
            cleared_input_tokens: cleared.iter().map(|x| x.1).sum(),
            cleared: n as u64,
            first_message: cleared[0].0,
        });
    }
    out
}

/// The summary a compaction writes (deterministic).
pub(crate) fn summary(messages: usize, tokens: u64) -> String {
    format!(
        "FAKE_COMPACTION_SUMMARY: the {messages} messages so far ({tokens} input tokens) are summarized here; the task continues."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_requested_edits_with_their_defaults() {
        let v = json!({"context_management": {"edits": [
            {"type": "clear_thinking_20251015"},
            {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 30000}, "keep": {"type": "tool_uses", "value": 2}},
            {"type": "compact_20260112", "pause_after_compaction": true}
        ]}});
        let r = requested(v.as_object().unwrap());
        assert_eq!(r.compact, Some((COMPACT_TRIGGER, true)));
        assert_eq!(r.clear_tool_uses, Some((30_000, 2)));
        assert_eq!(r.clear_thinking, Some(Some(1)));
        assert_eq!(
            r.order,
            vec!["clear_thinking_20251015", "clear_tool_uses_20250919"]
        );
        assert_eq!(requested(&Map::new()), Requested::default());
    }

    #[test]
    fn the_latest_compaction_block_with_a_summary_is_the_drop_point() {
        let msgs = vec![
            json!({"role": "user", "content": "a"}),
            json!({"role": "assistant", "content": [{"type": "compaction", "content": "s1"}]}),
            json!({"role": "user", "content": "b"}),
            json!({"role": "assistant", "content": [{"type": "compaction", "content": null}, {"type": "text", "text": "x"}]}),
        ];
        assert_eq!(drop_point(&msgs), Some(1));
        assert_eq!(drop_point(&msgs[2..]), None);
    }

    #[test]
    fn tool_uses_past_the_kept_ones_are_cleared_once_triggered() {
        let memo = TokenMemo::new(100);
        let result = |id: &str| json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "some output text here"}]});
        let msgs = vec![
            json!({"role": "user", "content": "go"}),
            result("a"),
            result("b"),
            result("c"),
        ];
        let c = clearable(&msgs, 0, &memo);
        assert_eq!(c.tool_results.len(), 3);
        let r = Requested {
            clear_tool_uses: Some((100, 1)),
            order: vec!["clear_tool_uses_20250919"],
            ..Requested::default()
        };
        assert!(apply_edits(&r, &c, 99).is_empty(), "under the trigger");
        let got = apply_edits(&r, &c, 100);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].cleared, got[0].first_message), (2, 1));
        assert_eq!(got[0].cleared_input_tokens, 2 * c.tool_results[0].1);
    }
}
