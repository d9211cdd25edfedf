//! Anthropic Messages: classification of `messages[]`, and the response
//! collector (usage from `message_start`/`message_delta`, the assistant
//! message reassembled from content-block events).

use super::{context_only, ids_of, info, u64_of, Collected, Keep, MessageInfo, ResponseCollector};
use oceancode_ledger::{RowKind, Usage};
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
    out.opens = ids_of(of_type("tool_use").chain(of_type("server_tool_use")), "id");
    // Server tool results answer within the assistant message itself.
    out.closes = blocks
        .iter()
        .filter(|b| {
            b.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with("tool_result"))
        })
        .filter_map(|b| b.get("tool_use_id").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    out
}

/// Reassembles a Messages response.
#[derive(Default)]
pub struct Collector {
    usage: Usage,
    saw_usage: bool,
    model: Option<String>,
    message: Option<Map<String, Value>>,
    blocks: Vec<Option<Value>>,
    partial_json: Vec<String>,
    stop_reason: Option<String>,
    error: Option<String>,
    json_rows: Vec<String>,
    terminal: bool,
    keep: Keep,
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
        self.saw_usage = true;
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
                    self.model = msg.get("model").and_then(Value::as_str).map(str::to_string);
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
        self.model = v.get("model").and_then(Value::as_str).map(str::to_string);
        self.stop_reason = v
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(content) = v.get("content") {
            let msg = serde_json::json!({"role": "assistant", "content": content});
            self.json_rows.push(msg.to_string());
        }
    }

    fn truncated(&mut self) {
        self.keep.cut();
    }

    fn finish(self: Box<Self>) -> Collected {
        let mut rows = self.json_rows;
        let cut = self.keep.is_cut();
        if self.message.is_some() || (cut && rows.is_empty()) {
            let mut content: Vec<Value> = self.blocks.into_iter().flatten().collect();
            if cut {
                content.push(serde_json::json!({"type": "text", "text": self.keep.marker()}));
            }
            if !content.is_empty() {
                rows.push(serde_json::json!({"role": "assistant", "content": content}).to_string());
            }
        }
        Collected {
            usage: self.saw_usage.then_some(self.usage),
            model: self.model,
            rows,
            stop_reason: self.stop_reason,
            error: self.error,
            terminal: self.terminal,
            truncated: cut,
        }
    }
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
