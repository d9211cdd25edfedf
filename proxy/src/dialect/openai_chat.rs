//! OpenAI Chat Completions: classification of `messages[]`, and the response
//! collector (final usage chunk with `stream_options.include_usage`, the
//! assistant message reassembled from deltas).

use super::{content_text, context_only, info, Collected, Keep, MessageInfo, ResponseCollector};
use oceancode_window::dialect::{openai_chat::OpenaiChat, DialectSpec};
use oceancode_window::{RowKind, StepDetail, Usage};
use serde_json::{json, Map, Value};

/// Classify one Chat message.
pub fn classify(v: &Value) -> MessageInfo {
    let role = v
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = match role.as_str() {
        "user" if context_only(v) => RowKind::System,
        "user" => RowKind::Prompt,
        "assistant" => RowKind::Assistant,
        "tool" | "function" => RowKind::ToolResult,
        "system" | "developer" => RowKind::System,
        _ => RowKind::Other,
    };
    let mut out = info(role, kind, content_text(v));
    out.opens = OpenaiChat.calls(v);
    out.closes = OpenaiChat.results(v).into_iter().map(|r| r.id).collect();
    out
}

/// Reassembles a Chat Completions response (choice 0).
#[derive(Default)]
pub struct Collector {
    usage: Option<(Usage, u64)>,
    model: Option<String>,
    response_id: Option<String>,
    role_seen: bool,
    content: Option<String>,
    refusal: Option<String>,
    tool_calls: Vec<Map<String, Value>>,
    finish: Option<String>,
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
}

/// `usage`: `prompt_tokens` (cached and written tokens a part of it) and
/// `completion_tokens` (reasoning a part of it).
fn usage_of(u: &Value) -> Option<(Usage, u64)> {
    OpenaiChat.usage(u)
}

impl ResponseCollector for Collector {
    fn on_event(&mut self, _event: &str, data: &str) {
        if data.trim() == "[DONE]" {
            self.terminal = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if let Some(e) = v.get("error") {
            self.error = Some(
                e.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or(data)
                    .to_string(),
            );
            return;
        }
        if let Some(m) = v.get("model").and_then(Value::as_str) {
            self.model = Some(m.to_string());
        }
        if self.response_id.is_none() {
            self.response_id = v.get("id").and_then(Value::as_str).map(str::to_string);
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage = usage_of(u).or(self.usage);
        }
        let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|c| {
            c.iter()
                .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        }) else {
            return;
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
        }
        let Some(d) = choice.get("delta") else { return };
        if d.get("role").is_some() {
            self.role_seen = true;
        }
        if !self.keep.take(data.len()) {
            return;
        }
        if let Some(t) = d.get("content").and_then(Value::as_str) {
            self.content.get_or_insert_with(String::new).push_str(t);
        }
        if let Some(t) = d.get("refusal").and_then(Value::as_str) {
            self.refusal.get_or_insert_with(String::new).push_str(t);
        }
        if let Some(calls) = d.get("tool_calls").and_then(Value::as_array) {
            for c in calls {
                let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                if idx > 1000 {
                    continue;
                }
                while self.tool_calls.len() <= idx {
                    let mut m = Map::new();
                    m.insert("type".into(), json!("function"));
                    m.insert("function".into(), json!({"name": "", "arguments": ""}));
                    self.tool_calls.push(m);
                }
                let slot = &mut self.tool_calls[idx];
                if let Some(id) = c.get("id").and_then(Value::as_str) {
                    slot.insert("id".into(), json!(id));
                }
                if let Some(t) = c.get("type").and_then(Value::as_str) {
                    slot.insert("type".into(), json!(t));
                }
                if let (Some(f), Some(Value::Object(sf))) =
                    (c.get("function"), slot.get_mut("function"))
                {
                    for key in ["name", "arguments"] {
                        if let Some(piece) = f.get(key).and_then(Value::as_str) {
                            if let Some(Value::String(s)) = sf.get_mut(key) {
                                s.push_str(piece);
                            }
                        }
                    }
                }
            }
        }
    }

    fn on_json(&mut self, body: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return;
        };
        self.terminal = true;
        if let Some(e) = v.get("error") {
            self.error = e.get("message").and_then(Value::as_str).map(str::to_string);
            return;
        }
        self.model = v.get("model").and_then(Value::as_str).map(str::to_string);
        self.response_id = v.get("id").and_then(Value::as_str).map(str::to_string);
        self.usage = v.get("usage").and_then(usage_of);
        if let Some(choice) = v
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        {
            self.finish = choice
                .get("finish_reason")
                .and_then(Value::as_str)
                .map(str::to_string);
            // A message that is not an object is not the assistant's row.
            if let Some(m) = choice.get("message").filter(|m| m.is_object()) {
                self.json_rows.push(m.to_string());
            }
        }
    }

    fn truncated(&mut self) {
        self.keep.cut();
    }

    fn finish(mut self: Box<Self>) -> Collected {
        let mut rows = std::mem::take(&mut self.json_rows);
        let cut = self.keep.is_cut();
        if cut {
            let marker = self.keep.marker();
            match &mut self.content {
                Some(c) => {
                    c.push('\n');
                    c.push_str(&marker);
                }
                None => self.content = Some(marker),
            }
        }
        if self.role_seen || self.content.is_some() || !self.tool_calls.is_empty() {
            let mut m = Map::new();
            m.insert("role".into(), json!("assistant"));
            m.insert(
                "content".into(),
                self.content.map(Value::String).unwrap_or(Value::Null),
            );
            if let Some(r) = self.refusal {
                m.insert("refusal".into(), Value::String(r));
            }
            if !self.tool_calls.is_empty() {
                m.insert(
                    "tool_calls".into(),
                    Value::Array(self.tool_calls.into_iter().map(Value::Object).collect()),
                );
            }
            rows.push(Value::Object(m).to_string());
        }
        Collected {
            usage: self.usage.map(|(u, _)| u),
            model: self.model,
            response_id: self.response_id,
            rows,
            stop_reason: self.finish,
            error: self.error,
            terminal: self.terminal,
            truncated: cut,
            detail: StepDetail {
                reasoning: self.usage.map_or(0, |(_, r)| r),
                ..StepDetail::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the usage fuzz target: `"message":"tool_calls"` was recorded
    /// as the assistant's row.
    #[test]
    fn a_message_that_is_not_an_object_is_not_a_row() {
        for m in [r#""tool_calls""#, "5", "null", "[1]"] {
            let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
            let body = format!(
                r#"{{"choices":[{{"message":{m},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":3,"completion_tokens":1}}}}"#
            );
            c.on_json(body.as_bytes());
            let got = c.finish();
            assert!(got.rows.is_empty(), "{m}: {:?}", got.rows);
            assert_eq!(got.usage.map(|u| u.input), Some(3));
        }
    }

    #[test]
    fn reassembles_deltas_and_reads_the_final_usage_chunk() {
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        for d in [
            r#"{"id":"c","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}"#,
            r#"{"id":"c","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
            r#"{"id":"c","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"content":"lo","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"sh","arguments":"{\"a\""}}]},"finish_reason":null}]}"#,
            r#"{"id":"c","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":"tool_calls"}]}"#,
            r#"{"id":"c","object":"chat.completion.chunk","model":"gpt-x","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":64}}}"#,
            "[DONE]",
        ] {
            c.on_event("", d);
        }
        let out = c.finish();
        assert_eq!(
            out.usage,
            Some(Usage {
                input: 36,
                output: 9,
                cache_read: 64,
                cache_write: 0
            })
        );
        assert_eq!(out.stop_reason.as_deref(), Some("tool_calls"));
        let row: Value = serde_json::from_str(&out.rows[0]).unwrap();
        assert_eq!(row["content"], "Hello");
        assert_eq!(row["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
        assert_eq!(row["tool_calls"][0]["id"], "call_1");
    }

    #[test]
    fn cached_and_written_tokens_are_a_part_of_the_prompt_and_reasoning_of_the_output() {
        // Chat: `prompt_tokens` holds the cached tokens (unlike Anthropic's
        // `input_tokens`): the window is prompt + completion, never more.
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_json(br#"{"id":"c","object":"chat.completion","model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":1000,"completion_tokens":300,"total_tokens":1300,
              "prompt_tokens_details":{"cached_tokens":640,"cache_write_tokens":200,"audio_tokens":0},
              "completion_tokens_details":{"reasoning_tokens":256,"audio_tokens":0}}}"#);
        let out = c.finish();
        let u = out.usage.unwrap();
        assert_eq!(
            u,
            Usage {
                input: 160,
                output: 300,
                cache_read: 640,
                cache_write: 200
            }
        );
        assert_eq!(u.window_total(), 1300, "prompt + completion");
        assert_eq!(out.detail.reasoning, 256, "a part of the 300 output tokens");
        // Null details, and cached tokens over the prompt (never negative).
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_event("", r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":null,"completion_tokens_details":null}}"#);
        assert_eq!(c.finish().usage.unwrap().input, 10);
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_event("", r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":50}}}"#);
        let u = c.finish().usage.unwrap();
        assert_eq!((u.input, u.cache_read, u.window_total()), (0, 10, 12));
    }

    #[test]
    fn tool_messages_cannot_start_a_window() {
        let t = classify(&json!({"role":"tool","tool_call_id":"x","content":"ok"}));
        assert_eq!(t.kind, RowKind::ToolResult);
        assert!(!t.starts_ok);
        let p = classify(&json!({"role":"user","content":"fix the bug\nplease"}));
        assert_eq!(p.first_line.as_deref(), Some("fix the bug"));
    }
}
