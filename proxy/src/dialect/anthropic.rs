//! Anthropic Messages: classification of `messages[]`, and the response
//! collector (usage from `message_start`/`message_delta`, the assistant
//! message reassembled from content-block events).
//!
//! Usage shapes: the top-level usage, and with server-side compaction or a
//! server-tool loop `usage.iterations[]`. The window is the last `message`
//! iteration (the context the answer was sampled from); a `compaction`
//! iteration is billed on top of the top-level numbers, which leave it out.
//! `context_management.applied_edits` (context editing) and `compaction`
//! blocks are read into [`StepDetail`].

use super::{
    applied_edits, context_only, info, u64_of, Collected, Keep, MessageInfo, ResponseCollector,
};
use oceancode_window::dialect::anthropic::{usage_fields, Anthropic};
use oceancode_window::dialect::DialectSpec;
use oceancode_window::{AppliedEdit, RowKind, StepDetail, Usage};
use serde_json::{Map, Value};

/// Classify one Anthropic message.
pub fn classify(v: &Value) -> MessageInfo {
    let role = v
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let blocks: &[Value] = match v.get("content") {
        Some(Value::Array(b)) => b,
        _ => &[],
    };
    let of_type = |t: &'static str| {
        blocks
            .iter()
            .filter(move |b| b.get("type").and_then(Value::as_str) == Some(t))
    };
    let has_result = of_type("tool_result").next().is_some();
    let kind = match role.as_str() {
        "user" if has_result => RowKind::ToolResult,
        "user" if context_only(v) => RowKind::System,
        "user" => RowKind::Prompt,
        "assistant" => RowKind::Assistant,
        "system" => RowKind::System,
        _ => RowKind::Other,
    };
    // The user's own words rather than a leading `<system-reminder>`.
    let text = match v.get("content") {
        Some(Value::String(s)) => Some(s.as_str()),
        _ => {
            let texts: Vec<&str> = of_type("text")
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            texts
                .iter()
                .copied()
                .find(|t| !t.trim_start().starts_with('<'))
                .or(texts.first().copied())
        }
    };
    let mut out = info(role, kind, text);
    if kind == RowKind::ToolResult {
        if let Some(t) = of_type("text")
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .find(|t| {
                oceancode_ledger::facts::is_typed_text(t) && !super::standing::is_context_block(t)
            })
        {
            out.asks = true;
            out.first_line = super::first_line(t, 80);
        }
    }
    out.compaction = kind == RowKind::Assistant
        && of_type("compaction").any(|b| b.get("content").is_some_and(Value::is_string));
    out.opens = Anthropic.calls(v);
    // Server tool results answer within the assistant message itself.
    out.closes = Anthropic.results(v).into_iter().map(|r| r.id).collect();
    out
}

/// Reassembles a Messages response.
#[derive(Default)]
pub struct Collector {
    usage: Usage,
    saw_usage: bool,
    model: Option<String>,
    response_id: Option<String>,
    message: Option<Map<String, Value>>,
    blocks: Vec<Option<Value>>,
    partial_json: Vec<String>,
    stop_reason: Option<String>,
    error: Option<String>,
    json_rows: Vec<String>,
    terminal: bool,
    keep: Keep,
    /// The latest `usage.iterations[]`: (last `message` iteration, sum of
    /// the `compaction` iterations).
    iterations: Option<(Option<Usage>, Usage)>,
    /// `output_tokens_details.thinking_tokens`.
    thinking: u64,
    edits: Vec<AppliedEdit>,
    compactions: u32,
    /// The provider's cache-miss diagnosis, when the answer carries one.
    cache_miss: Option<String>,
}

/// `usage.iterations[]`: the last `message` iteration, and the `compaction`
/// iterations summed (their tokens are not in the top-level usage).
fn iterations_of(items: &[Value]) -> (Option<Usage>, Usage) {
    let mut last = None;
    let mut compaction = Usage::default();
    for it in items {
        match it.get("type").and_then(Value::as_str) {
            Some("message") => last = Some(usage_fields(it)),
            Some("compaction") => compaction = compaction.plus(usage_fields(it)),
            _ => {}
        }
    }
    (last, compaction)
}

impl Collector {
    /// A collector keeping what `keep` allows of the answer.
    pub fn keeping(keep: Keep) -> Self {
        Collector {
            keep,
            ..Self::default()
        }
    }

    fn take_usage(&mut self, u: &Value) {
        if let Some(x) = u64_of(u, "input_tokens") {
            self.usage.input = x;
        }
        if let Some(x) = u64_of(u, "output_tokens") {
            self.usage.output = x;
        }
        if let Some(x) = u64_of(u, "cache_read_input_tokens") {
            self.usage.cache_read = x;
        }
        if let Some(x) = u64_of(u, "cache_creation_input_tokens") {
            self.usage.cache_write = x;
        }
        // Cumulative like the rest: a later event's list replaces the earlier one.
        if let Some(items) = u.get("iterations").and_then(Value::as_array) {
            self.iterations = Some(iterations_of(items));
        }
        if let Some(t) = u
            .pointer("/output_tokens_details/thinking_tokens")
            .and_then(Value::as_u64)
        {
            self.thinking = t;
        }
        self.saw_usage = true;
    }

    /// The window's usage and what was billed beyond it.
    fn window_and_extra(&self) -> (Usage, Usage) {
        let top = self.usage;
        match self.iterations {
            Some((last, compaction)) => {
                let window = last.unwrap_or(top);
                (window, top.plus(compaction).minus(window))
            }
            None => (top, Usage::default()),
        }
    }

    fn block_mut(&mut self, idx: usize) -> Option<&mut Map<String, Value>> {
        self.blocks.get_mut(idx)?.as_mut()?.as_object_mut()
    }
}

fn append_str(m: &mut Map<String, Value>, key: &str, piece: &str) {
    match m.get_mut(key) {
        Some(Value::String(s)) => s.push_str(piece),
        _ => {
            m.insert(key.to_string(), Value::String(piece.to_string()));
        }
    }
}

impl ResponseCollector for Collector {
    fn on_event(&mut self, _event: &str, data: &str) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match v.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(msg) = v.get("message") {
                    if let Some(u) = msg.get("usage") {
                        self.take_usage(u);
                    }
                    self.cache_miss = oceancode_window::cache::provider_reason(msg);
                    self.model = msg.get("model").and_then(Value::as_str).map(str::to_string);
                    self.response_id = msg.get("id").and_then(Value::as_str).map(str::to_string);
                    if let Some(m) = msg.as_object().filter(|_| self.keep.take(data.len())) {
                        self.message = Some(m.clone());
                    }
                }
            }
            Some("content_block_start") => {
                let idx = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                if idx > 10_000 {
                    return;
                }
                if self.blocks.len() <= idx {
                    self.blocks.resize(idx + 1, None);
                    self.partial_json.resize(idx + 1, String::new());
                }
                if self.keep.take(data.len()) {
                    self.blocks[idx] = v.get("content_block").cloned();
                }
            }
            Some("content_block_delta") => {
                let idx = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                let Some(d) = v.get("delta") else { return };
                let dtype = d.get("type").and_then(Value::as_str).unwrap_or("");
                if dtype == "input_json_delta" {
                    if let (Some(p), Some(s)) = (
                        d.get("partial_json").and_then(Value::as_str),
                        self.partial_json.get_mut(idx),
                    ) {
                        if self.keep.take(p.len()) {
                            s.push_str(p);
                        }
                    }
                    return;
                }
                if !self.keep.take(data.len()) {
                    return;
                }
                let Some(b) = self.block_mut(idx) else { return };
                match dtype {
                    "text_delta" => {
                        if let Some(t) = d.get("text").and_then(Value::as_str) {
                            append_str(b, "text", t);
                        }
                    }
                    "thinking_delta" => {
                        if let Some(t) = d.get("thinking").and_then(Value::as_str) {
                            append_str(b, "thinking", t);
                        }
                    }
                    "signature_delta" => {
                        if let Some(t) = d.get("signature").and_then(Value::as_str) {
                            append_str(b, "signature", t);
                        }
                    }
                    "compaction_delta" => {
                        // One delta carries the whole summary (the SDKs set, not append).
                        for key in ["content", "encrypted_content"] {
                            if let Some(x) = d.get(key) {
                                b.insert(key.into(), x.clone());
                            }
                        }
                    }
                    "citations_delta" => {
                        if let Some(c) = d.get("citation") {
                            match b.get_mut("citations") {
                                Some(Value::Array(a)) => a.push(c.clone()),
                                _ => {
                                    b.insert("citations".into(), Value::Array(vec![c.clone()]));
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
            Some("content_block_stop") => {
                let idx = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                let pj = self.partial_json.get(idx).cloned().unwrap_or_default();
                if let Some(b) = self.block_mut(idx) {
                    if b.contains_key("input") {
                        let input = if pj.trim().is_empty() {
                            b.get("input").cloned().unwrap_or(Value::Object(Map::new()))
                        } else {
                            serde_json::from_str(&pj).unwrap_or(Value::String(pj))
                        };
                        b.insert("input".into(), input);
                    }
                }
            }
            Some("message_delta") => {
                if let Some(u) = v.get("usage") {
                    self.take_usage(u);
                }
                if let Some(e) = applied_edits(&v) {
                    self.edits = e;
                }
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(r.to_string());
                }
            }
            Some("message_stop") => self.terminal = true,
            Some("error") => {
                self.error = Some(
                    v.pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or(data)
                        .to_string(),
                );
            }
            _ => {}
        }
    }

    fn on_json(&mut self, body: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return;
        };
        self.terminal = true;
        if v.get("type").and_then(Value::as_str) == Some("error") {
            self.error = v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string);
            return;
        }
        if let Some(u) = v.get("usage") {
            self.take_usage(u);
        }
        if let Some(e) = applied_edits(&v) {
            self.edits = e;
        }
        self.cache_miss = oceancode_window::cache::provider_reason(&v);
        self.model = v.get("model").and_then(Value::as_str).map(str::to_string);
        self.response_id = v.get("id").and_then(Value::as_str).map(str::to_string);
        self.stop_reason = v
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(content) = v.get("content") {
            self.compactions = compactions(content.as_array().map_or(&[], Vec::as_slice));
            let msg = serde_json::json!({"role": "assistant", "content": content});
            self.json_rows.push(msg.to_string());
        }
    }

    fn truncated(&mut self) {
        self.keep.cut();
    }

    fn finish(self: Box<Self>) -> Collected {
        let (window, extra) = self.window_and_extra();
        let mut compactions = self.compactions;
        let mut rows = self.json_rows;
        let cut = self.keep.is_cut();
        if self.message.is_some() || (cut && rows.is_empty()) {
            let mut content: Vec<Value> = self.blocks.into_iter().flatten().collect();
            compactions += self::compactions(&content);
            if cut {
                content.push(serde_json::json!({"type": "text", "text": self.keep.marker()}));
            }
            if !content.is_empty() {
                rows.push(serde_json::json!({"role": "assistant", "content": content}).to_string());
            }
        }
        Collected {
            usage: self.saw_usage.then_some(window),
            model: self.model,
            response_id: self.response_id,
            rows,
            stop_reason: self.stop_reason,
            error: self.error,
            terminal: self.terminal,
            truncated: cut,
            detail: StepDetail {
                extra,
                reasoning: self.thinking.min(self.usage.output),
                compactions,
                edits: self.edits,
                cache: self.cache_miss.map(|p| oceancode_window::cache::CacheNote {
                    provider: Some(p),
                    ..Default::default()
                }),
                ..StepDetail::default()
            },
        }
    }
}

/// The `compaction` blocks of a message's content.
fn compactions(content: &[Value]) -> u32 {
    content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("compaction"))
        .count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn classifies_prompts_tool_results_and_system_rows() {
        let p = classify(
            &json!({"role":"user","content":[{"type":"text","text":"<system-reminder>x</system-reminder>"},{"type":"text","text":"list the files here"}]}),
        );
        assert_eq!(p.kind, RowKind::Prompt);
        assert_eq!(p.first_line.as_deref(), Some("list the files here"));
        let t = classify(
            &json!({"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"}]}),
        );
        assert_eq!(t.kind, RowKind::ToolResult);
        assert!(!t.starts_ok);
        assert_eq!(
            classify(&json!({"role":"system","content":"env"})).kind,
            RowKind::System
        );
        assert_eq!(
            classify(&json!({"role":"assistant","content":"hi"})).kind,
            RowKind::Assistant
        );
        // A compaction block with a summary makes the API drop what precedes
        // it; one without (a failed compaction) is a no-op.
        let c = |content: Value| {
            classify(&json!({"role":"assistant","content":[{"type":"compaction","content":content},{"type":"text","text":"go on"}]}))
                .compaction
        };
        assert!(c(json!("Summary: ...")));
        assert!(!c(Value::Null));
        assert!(!classify(&json!({"role":"assistant","content":"hi"})).compaction);
    }

    #[test]
    fn reassembles_text_thinking_and_tool_use() {
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        let evs = [
            r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"claude-x","content":[],"usage":{"input_tokens":7,"cache_creation_input_tokens":100,"cache_read_input_tokens":50,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"I'll "}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"look."}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"command\""}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":": \"ls\"}"}}"#,
            r#"{"type":"content_block_stop","index":2}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":17}}"#,
            r#"{"type":"message_stop"}"#,
        ];
        for e in evs {
            c.on_event("", e);
        }
        let out = c.finish();
        assert_eq!(
            out.usage,
            Some(Usage {
                input: 7,
                output: 17,
                cache_read: 50,
                cache_write: 100
            })
        );
        assert_eq!(out.stop_reason.as_deref(), Some("tool_use"));
        let row: Value = serde_json::from_str(&out.rows[0]).unwrap();
        assert_eq!(
            row,
            json!({"role":"assistant","content":[
                {"type":"thinking","thinking":"hmm","signature":"sig"},
                {"type":"text","text":"I'll look."},
                {"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}
            ]})
        );
    }

    #[test]
    fn compaction_iterations_are_billed_beyond_the_window() {
        // The shape of the compaction docs: the top-level usage is the
        // message iteration; the compaction iteration is not in it.
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_json(br#"{"id":"m","type":"message","role":"assistant","model":"claude-opus-4-6",
            "content":[{"type":"compaction","content":"Summary of the conversation: fixed the parser."},{"type":"text","text":"Next I'll run the tests."}],
            "stop_reason":"end_turn",
            "usage":{"input_tokens":23000,"output_tokens":1000,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,
              "iterations":[{"type":"compaction","input_tokens":180000,"output_tokens":3500,"cache_read_input_tokens":0,"cache_creation_input_tokens":0},
                            {"type":"message","input_tokens":23000,"output_tokens":1000,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}]}}"#);
        let out = c.finish();
        let window = out.usage.unwrap();
        assert_eq!((window.input, window.output), (23_000, 1_000));
        assert_eq!(
            out.detail.extra,
            Usage {
                input: 180_000,
                output: 3_500,
                ..Usage::default()
            }
        );
        assert_eq!(out.detail.compactions, 1);
        // The compaction block is recorded as it came.
        let row: Value = serde_json::from_str(&out.rows[0]).unwrap();
        assert_eq!(
            row["content"][0],
            json!({"type":"compaction","content":"Summary of the conversation: fixed the parser."})
        );
    }

    #[test]
    fn a_server_tool_loop_windows_the_last_message_iteration() {
        // Two sampling iterations: the top level sums them; the window is
        // the last one's context, the first one is billed beyond it.
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_json(br#"{"type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],
            "usage":{"input_tokens":2100,"output_tokens":300,"cache_read_input_tokens":9000,"cache_creation_input_tokens":0,
              "iterations":[{"type":"message","input_tokens":1000,"output_tokens":100,"cache_read_input_tokens":4000,"cache_creation_input_tokens":0},
                            {"type":"message","input_tokens":1100,"output_tokens":200,"cache_read_input_tokens":5000,"cache_creation_input_tokens":0}]}}"#);
        let out = c.finish();
        let w = out.usage.unwrap();
        assert_eq!((w.input, w.cache_read, w.output), (1_100, 5_000, 200));
        assert_eq!(
            out.detail.extra,
            Usage {
                input: 1_000,
                output: 100,
                cache_read: 4_000,
                cache_write: 0
            }
        );
        assert_eq!(w.plus(out.detail.extra).window_total(), 2_100 + 300 + 9_000);
    }

    #[test]
    fn a_streamed_compaction_block_and_the_applied_edits_are_read() {
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        let evs = [
            r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"claude-opus-4-6","content":[],"usage":{"input_tokens":0,"output_tokens":0}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"compaction","content":null}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"compaction_delta","content":"Summary: the user asked for X; done."}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Go on."}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},
                "context_management":{"applied_edits":[{"type":"clear_tool_uses_20250919","cleared_tool_uses":8,"cleared_input_tokens":50000},{"type":"clear_thinking_20251015","cleared_thinking_turns":3,"cleared_input_tokens":15000}]},
                "usage":{"input_tokens":12000,"output_tokens":400,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"output_tokens_details":{"thinking_tokens":120},
                  "iterations":[{"type":"compaction","input_tokens":160000,"output_tokens":2000,"cache_read_input_tokens":100000,"cache_creation_input_tokens":0},{"type":"message","input_tokens":12000,"output_tokens":400,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}]}}"#,
            r#"{"type":"message_stop"}"#,
        ];
        for e in evs {
            c.on_event("", e);
        }
        let out = c.finish();
        assert_eq!(out.usage.unwrap().window_total(), 12_400);
        assert_eq!(out.detail.extra.window_total(), 262_000);
        assert_eq!(out.detail.compactions, 1);
        assert_eq!(out.detail.reasoning, 120);
        assert_eq!(
            out.detail.edits,
            vec![
                AppliedEdit {
                    kind: "clear_tool_uses_20250919".into(),
                    cleared_input_tokens: 50_000,
                    cleared_tool_uses: Some(8),
                    cleared_thinking_turns: None,
                },
                AppliedEdit {
                    kind: "clear_thinking_20251015".into(),
                    cleared_input_tokens: 15_000,
                    cleared_tool_uses: None,
                    cleared_thinking_turns: Some(3),
                },
            ]
        );
        let row: Value = serde_json::from_str(&out.rows[0]).unwrap();
        assert_eq!(
            row["content"][0],
            json!({"type":"compaction","content":"Summary: the user asked for X; done."})
        );
        assert_eq!(row["content"][1]["text"], "Go on.");
    }

    #[test]
    fn json_body_usage_and_error() {
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_json(br#"{"id":"m","type":"message","role":"assistant","model":"x","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":2}}"#);
        let out = c.finish();
        assert_eq!(out.usage.unwrap().input, 3);
        assert_eq!(out.rows.len(), 1);
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_json(br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 5 tokens > 4 maximum"}}"#);
        let out = c.finish();
        assert!(out.error.unwrap().starts_with("prompt is too long"));
        assert!(out.rows.is_empty());
    }
}
