//! `ledger.compress`: at a cut, old tool output in the retained window
//! becomes one pointer line to the verbatim record. Pure: no I/O.
//!
//! * [`outputs`] finds the tool outputs of one raw message (Anthropic
//!   `tool_result` blocks, a Chat `tool` message, a Responses
//!   `function_call_output` / `custom_tool_call_output` item) as byte spans
//!   of their content.
//! * [`choose`] picks, from the retained window's outputs at a cut, the ones
//!   older than the protected zone (the newest `protect` tokens of tool
//!   output) and at least `min_tokens` large. The caller leaves the running
//!   round (the results after the newest assistant message) out of the list.
//! * [`pointer_text`] is the line an output becomes; [`rewrite`] splices it
//!   into the message as the output's content. The block stays (its id,
//!   `is_error`, every other member, byte for byte); images and documents
//!   inside the content go with it (the pointer stands for them).
//! * [`saved_tokens`] is what a pruned output no longer costs: removed text
//!   bytes ÷ 4 plus its images' and documents' own tokens. The gauge adds it,
//!   so the tideline still measures the uncompressed window and cuts where
//!   it would without compress.
//!
//! The pruned set is computed at a cut only (the retained window is
//! rewritten then anyway) and is a pure function of the rows that exist at
//! that cut, so between cuts the outgoing bytes only append.

use crate::model::Dialect;
pub use crate::spans::{Span, SAVED_BYTES_PER_TOKEN};

/// `ledger.compress.protect` default: a share of the line (percent).
pub const DEFAULT_PROTECT_PERCENT: f64 = 25.0;
/// `ledger.compress.min_tokens` default.
pub const DEFAULT_MIN_TOKENS: u64 = 500;

/// What [`choose`] needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// The newest this many tokens of tool output are never pruned.
    pub protect: u64,
    /// An output smaller than this is never pruned.
    pub min_tokens: u64,
}

/// One tool output of the retained window, in line order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The row's seq.
    pub seq: u64,
    /// Index of the output in the row ([`Span::part`]).
    pub part: u32,
    /// Its estimated tokens ([`Span::tokens`]).
    pub tokens: u64,
}

/// The outputs to prune, as `(seq, part)`, oldest first: walking from the
/// newest output back, outputs stay while fewer than `protect` tokens of
/// output are newer than them; older ones of at least `min_tokens` go.
pub fn choose(candidates: &[Candidate], p: Params) -> Vec<(u64, u32)> {
    let mut newer = 0u64;
    let mut out = Vec::new();
    for c in candidates.iter().rev() {
        if newer < p.protect {
            newer = newer.saturating_add(c.tokens);
            continue;
        }
        if c.tokens >= p.min_tokens.max(1) {
            out.push((c.seq, c.part));
        }
    }
    out.reverse();
    out
}

/// The tool outputs of one raw message of `dialect`, in order (its
/// [`crate::dialect::DialectSpec::tool_outputs`]). A message that does not
/// parse has none.
pub fn outputs(dialect: Dialect, raw: &str) -> Vec<Span> {
    crate::dialect::spec(dialect).tool_outputs(raw)
}

/// Where a pruned output can be read verbatim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// Lines `first..=last` (1-based) of a transcript file already written
    /// (`transcript/0007.md`, relative to the session directory).
    Lines {
        /// The file, relative to the session directory.
        file: String,
        /// First line of the output.
        first: u64,
        /// Last line of the output.
        last: u64,
    },
    /// The turn's transcript file, when the line index is not known.
    File(String),
}

/// The pointer an output becomes:
/// `[pruned tool output: seq N · T tokens · transcript/0007.md lines A–B · oceancode-proxy recall entry N]`.
pub fn pointer_text(seq: u64, tokens: u64, at: &Location) -> String {
    let place = match at {
        Location::Lines { file, first, last } => format!("{file} lines {first}–{last}"),
        Location::File(file) => file.clone(),
    };
    format!(
        "[pruned tool output: seq {seq} · {tokens} tokens · {place} · oceancode-proxy recall entry {seq}]"
    )
}

/// True when `text` is a pointer [`pointer_text`] made.
pub fn is_pointer(text: &str) -> bool {
    text.starts_with("[pruned tool output: seq ") && text.ends_with(']')
}

/// What a pruned output no longer costs: its removed text bytes ÷ 4
/// (rounded up) plus its images' and documents' tokens.
pub fn saved_tokens(span: &Span, pointer: &str) -> u64 {
    let removed = ((span.end - span.start) as u64)
        .saturating_sub(span.media.bytes)
        .saturating_sub(json_string(pointer).len() as u64);
    removed.div_ceil(SAVED_BYTES_PER_TOKEN) + span.media.tokens
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// `raw` with the content of each output in `prune` (`part`, pointer text)
/// replaced by its pointer as a JSON string; everything else byte for byte.
/// Parts not among `raw`'s outputs are ignored; None when nothing changed.
pub fn rewrite(dialect: Dialect, raw: &str, prune: &[(u32, &str)]) -> Option<String> {
    let spans = outputs(dialect, raw);
    let mut out = String::with_capacity(raw.len());
    let mut at = 0usize;
    for s in &spans {
        let Some((_, text)) = prune.iter().find(|(p, _)| *p == s.part) else {
            continue;
        };
        out.push_str(&raw[at..s.start]);
        out.push_str(&json_string(text));
        at = s.end;
    }
    if at == 0 {
        return None;
    }
    out.push_str(&raw[at..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn c(seq: u64, tokens: u64) -> Candidate {
        Candidate {
            seq,
            part: 0,
            tokens,
        }
    }

    #[test]
    fn choose_keeps_the_protected_zone_and_small_outputs() {
        let p = Params {
            protect: 1_000,
            min_tokens: 500,
        };
        let cs = [c(1, 600), c(2, 100), c(3, 2_000), c(4, 700), c(5, 400)];
        // Newest first: 5 (400) and 4 (700) fill the zone (1,100 ≥ 1,000);
        // 3 goes, 2 is too small, 1 goes.
        assert_eq!(choose(&cs, p), [(1, 0), (3, 0)]);
        assert!(choose(
            &cs,
            Params {
                protect: 10_000,
                ..p
            }
        )
        .is_empty());
        assert_eq!(
            choose(&cs, Params { protect: 0, ..p }),
            [(1, 0), (3, 0), (4, 0)]
        );
        assert!(choose(&[], p).is_empty());
    }

    #[test]
    fn anthropic_outputs_and_rewrite_keep_the_block() {
        let raw = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":"long output"},{"type":"text","text":"note"},{"tool_use_id":"t2","type":"tool_result","content":[{"type":"text","text":"x"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}"#;
        let spans = outputs(Dialect::Anthropic, raw);
        assert_eq!(spans.len(), 2);
        assert_eq!((spans[0].part, spans[1].part), (0, 2));
        assert_eq!(&raw[spans[0].start..spans[0].end], r#""long output""#);
        assert!(raw[spans[1].start..spans[1].end].starts_with(r#"[{"type":"text""#));
        let p = pointer_text(
            7,
            1234,
            &Location::Lines {
                file: "transcript/0002.md".into(),
                first: 10,
                last: 40,
            },
        );
        assert_eq!(p, "[pruned tool output: seq 7 · 1234 tokens · transcript/0002.md lines 10–40 · oceancode-proxy recall entry 7]");
        assert!(is_pointer(&p));
        let out = rewrite(Dialect::Anthropic, raw, &[(0, &p), (2, &p)]).expect("changed");
        let v: Value = serde_json::from_str(&out).expect("json");
        let blocks = v["content"].as_array().expect("array");
        assert_eq!(blocks[0]["tool_use_id"], "t1");
        assert_eq!(blocks[0]["is_error"], true);
        assert_eq!(blocks[0]["content"], json!(p));
        assert_eq!(blocks[1], json!({"type":"text","text":"note"}));
        assert_eq!(blocks[2]["tool_use_id"], "t2");
        assert_eq!(blocks[2]["content"], json!(p), "the image went with it");
        assert!(!out.contains("image/png"));
        // Only the named part; an unknown part changes nothing.
        let one = rewrite(Dialect::Anthropic, raw, &[(2, "P")]).expect("changed");
        assert!(one.contains(r#""content":"long output""#));
        assert_eq!(rewrite(Dialect::Anthropic, raw, &[(1, "P")]), None);
        // Not a user message, or not a tool result: nothing.
        assert!(outputs(
            Dialect::Anthropic,
            r#"{"role":"assistant","content":[{"type":"tool_result","content":"x"}]}"#
        )
        .is_empty());
        assert!(outputs(Dialect::Anthropic, r#"{"role":"user","content":"hi"}"#).is_empty());
        assert!(outputs(Dialect::Anthropic, "not json").is_empty());
    }

    #[test]
    fn openai_outputs() {
        let chat = r#"{"role":"tool","tool_call_id":"c1","content":"out put"}"#;
        let s = outputs(Dialect::OpenaiChat, chat);
        assert_eq!(s.len(), 1);
        let out = rewrite(Dialect::OpenaiChat, chat, &[(0, "P")]).expect("changed");
        assert_eq!(out, r#"{"role":"tool","tool_call_id":"c1","content":"P"}"#);
        assert!(outputs(Dialect::OpenaiChat, r#"{"role":"user","content":"x"}"#).is_empty());
        for kind in ["function_call_output", "custom_tool_call_output"] {
            let item = format!(
                r#"{{"type":"{kind}","call_id":"c1","output":[{{"type":"input_text","text":"abc"}}]}}"#
            );
            let out = rewrite(Dialect::OpenaiResponses, &item, &[(0, "P")]).expect("changed");
            assert_eq!(
                out,
                format!(r#"{{"type":"{kind}","call_id":"c1","output":"P"}}"#)
            );
        }
        assert!(outputs(
            Dialect::OpenaiResponses,
            r#"{"type":"function_call","call_id":"c1","arguments":"{}"}"#
        )
        .is_empty());
    }

    #[test]
    fn saved_tokens_counts_removed_bytes_and_media() {
        let body = "x".repeat(4_000);
        let raw = format!(r#"{{"role":"tool","tool_call_id":"c","content":"{body}"}}"#);
        let s = outputs(Dialect::OpenaiChat, &raw)[0];
        assert_eq!(s.tokens(), 4_002u64.div_ceil(4));
        let p = "[pruned tool output: seq 1]";
        assert_eq!(saved_tokens(&s, p), (4_002 - 29u64).div_ceil(4));
        // A pointer longer than what it replaces saves nothing.
        assert_eq!(
            saved_tokens(
                &Span {
                    end: s.start + 2,
                    ..s
                },
                p
            ),
            0
        );
    }
}
