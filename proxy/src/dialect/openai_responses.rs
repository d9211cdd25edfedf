//! OpenAI Responses: classification of `input[]` items, and the response
//! collector (`response.completed` usage, output items from
//! `response.output_item.done`).

use super::{content_text, context_only, info, Collected, Keep, MessageInfo, ResponseCollector};
use oceancode_window::dialect::{openai_responses::OpenaiResponses, DialectSpec};
use oceancode_window::{RowKind, StepDetail, Usage};
use serde_json::Value;

/// Classify one Responses input item.
pub fn classify(v: &Value) -> MessageInfo {
    let ty = v.get("type").and_then(Value::as_str);
    let role_field = v.get("role").and_then(Value::as_str);
    let (role, kind) = match (ty, role_field) {
        (Some("message") | None, Some(r)) => (
            r.to_string(),
            match r {
                "user" if context_only(v) => RowKind::System,
                "user" => RowKind::Prompt,
                "assistant" => RowKind::Assistant,
                "system" | "developer" => RowKind::System,
                _ => RowKind::Other,
            },
        ),
        (Some(t), _) => (
            t.to_string(),
            if t.ends_with("_output") {
                RowKind::ToolResult
            } else if t.ends_with("_call") || t == "reasoning" {
                RowKind::Assistant
            } else {
                RowKind::Other
            },
        ),
        (None, None) => (String::new(), RowKind::Other),
    };
    let mut out = info(role, kind, content_text(v));
    let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
    out.opens = OpenaiResponses.calls(v);
    out.closes = OpenaiResponses
        .results(v)
        .into_iter()
        .map(|r| r.id)
        .collect();
    out.binds_next = ty == "reasoning";
    out
}

/// Collects a Responses response.
#[derive(Default)]
pub struct Collector {
    usage: Option<(Usage, u64)>,
    model: Option<String>,
    response_id: Option<String>,
    items: Vec<String>,
    status: Option<String>,
    error: Option<String>,
    terminal: bool,
    keep: Keep,
    /// The provider's cache-miss diagnosis, when the answer carries one.
    cache_miss: Option<String>,
}

/// `usage`: `input_tokens` (cached and written tokens a part of it) and
/// `output_tokens` (reasoning a part of it).
fn usage_of(u: &Value) -> Option<(Usage, u64)> {
    OpenaiResponses.usage(u)
}

impl Collector {
    /// A collector keeping what `keep` allows of the answer.
    pub fn keeping(keep: Keep) -> Self {
        Collector {
            keep,
            ..Self::default()
        }
    }

    fn take_response(&mut self, r: &Value, with_items: bool) {
        if let Some(u) = r.get("usage").filter(|u| !u.is_null()) {
            self.usage = usage_of(u).or(self.usage);
        }
        if let Some(m) = r.get("model").and_then(Value::as_str) {
            self.model = Some(m.to_string());
        }
        if let Some(id) = r.get("id").and_then(Value::as_str) {
            self.response_id = Some(id.to_string());
        }
        if let Some(c) = oceancode_window::cache::provider_reason(r) {
            self.cache_miss = Some(c);
        }
        if let Some(s) = r.get("status").and_then(Value::as_str) {
            self.status = Some(s.to_string());
        }
        if let Some(e) = r.get("error").filter(|e| !e.is_null()) {
            self.error = Some(
                e.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("error")
                    .to_string(),
            );
        }
        if with_items && self.items.is_empty() {
            if let Some(out) = r.get("output").and_then(Value::as_array) {
                // Only objects are items (anything else is not a row to record).
                for item in out.iter().filter(|i| i.is_object()) {
                    let item = item.to_string();
                    if !self.keep.take(item.len()) {
                        break;
                    }
                    self.items.push(item);
                }
            }
        }
    }
}

impl ResponseCollector for Collector {
    fn on_event(&mut self, _event: &str, data: &str) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match v.get("type").and_then(Value::as_str) {
            Some("response.output_item.done") => {
                if let Some(item) = v
                    .get("item")
                    .filter(|i| i.is_object())
                    .filter(|_| self.keep.take(data.len()))
                {
                    self.items.push(item.to_string());
                }
            }
            Some("response.created" | "response.in_progress") => {
                if let Some(r) = v.get("response") {
                    self.take_response(r, false);
                }
            }
            Some("response.completed" | "response.incomplete" | "response.failed") => {
                self.terminal = true;
                if let Some(r) = v.get("response") {
                    self.take_response(r, true);
                }
            }
            Some("error") => {
                self.error = Some(
                    v.get("message")
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
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            self.error = e.get("message").and_then(Value::as_str).map(str::to_string);
            if v.get("output").is_none() {
                return;
            }
        }
        self.take_response(&v, true);
    }

    fn truncated(&mut self) {
        self.keep.cut();
    }

    fn finish(self: Box<Self>) -> Collected {
        let mut rows = self.items;
        let cut = self.keep.is_cut();
        if cut {
            rows.push(
                serde_json::json!({
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": self.keep.marker()}],
                })
                .to_string(),
            );
        }
        Collected {
            usage: self.usage.map(|(u, _)| u),
            model: self.model,
            response_id: self.response_id,
            rows,
            stop_reason: self.status,
            error: self.error,
            terminal: self.terminal,
            truncated: cut,
            detail: StepDetail {
                reasoning: self.usage.map_or(0, |(_, r)| r),
                cache: self.cache_miss.map(|p| oceancode_window::cache::CacheNote {
                    provider: Some(p),
                    ..Default::default()
                }),
                ..StepDetail::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Found alongside the Chat case by the usage fuzz target: an output
    /// item that is not an object was recorded as a row.
    #[test]
    fn an_item_that_is_not_an_object_is_not_a_row() {
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_json(br#"{"status":"completed","output":["x",{"type":"message","role":"assistant","content":[]},7]}"#);
        assert_eq!(c.finish().rows.len(), 1);
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_event("", r#"{"type":"response.output_item.done","item":"x"}"#);
        c.on_event(
            "",
            r#"{"type":"response.output_item.done","item":{"type":"reasoning","summary":[]}}"#,
        );
        assert_eq!(c.finish().rows.len(), 1);
    }

    #[test]
    fn classifies_items() {
        assert_eq!(
            classify(&json!({"type":"message","role":"developer","content":"x"})).kind,
            RowKind::System
        );
        assert_eq!(
            classify(&json!({"type":"function_call","name":"sh","arguments":"{}","call_id":"c"}))
                .kind,
            RowKind::Assistant
        );
        let o = classify(&json!({"type":"function_call_output","call_id":"c","output":"ok"}));
        assert_eq!(o.kind, RowKind::ToolResult);
        assert!(!o.starts_ok);
        assert_eq!(
            classify(&json!({"role":"user","content":"hi"})).kind,
            RowKind::Prompt
        );
        assert_eq!(
            classify(&json!({"type":"reasoning","summary":[]})).kind,
            RowKind::Assistant
        );
    }

    #[test]
    fn collects_items_and_usage() {
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_event("response.created", r#"{"type":"response.created","response":{"id":"r","model":"gpt-x","status":"in_progress","usage":null,"output":[]}}"#);
        c.on_event("response.output_item.done", r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","call_id":"c1","name":"sh","arguments":"{}"}}"#);
        c.on_event("response.completed", r#"{"type":"response.completed","response":{"id":"r","model":"gpt-x","status":"completed","output":[{"type":"function_call"}],"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":40},"output_tokens":5,"total_tokens":55}}}"#);
        let out = c.finish();
        assert_eq!(
            out.usage,
            Some(Usage {
                input: 10,
                output: 5,
                cache_read: 40,
                cache_write: 0
            })
        );
        assert_eq!(out.rows.len(), 1);
        assert!(out.rows[0].contains("c1"));
    }

    #[test]
    fn cached_tokens_are_a_part_of_the_input_and_reasoning_of_the_output() {
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_event("response.completed", r#"{"type":"response.completed","response":{"id":"r","status":"completed","output":[],
            "usage":{"input_tokens":5000,"input_tokens_details":{"cached_tokens":4096,"cache_write_tokens":0},
              "output_tokens":700,"output_tokens_details":{"reasoning_tokens":512},"total_tokens":5700}}}"#);
        let out = c.finish();
        let u = out.usage.unwrap();
        assert_eq!((u.input, u.cache_read, u.output), (904, 4096, 700));
        assert_eq!(
            u.window_total(),
            5700,
            "input + output, the cache counted once"
        );
        assert_eq!(out.detail.reasoning, 512);
    }

    #[test]
    fn a_failed_response_keeps_its_error() {
        let mut c: Box<dyn ResponseCollector> = Box::<Collector>::default();
        c.on_event("response.failed", r#"{"type":"response.failed","sequence_number":2,"response":{"id":"r","object":"response","status":"failed","error":{"code":"context_length_exceeded","message":"Your input exceeds the context window of this model. Please adjust your input and try again."},"usage":null}}"#);
        let out = c.finish();
        assert!(out.terminal);
        assert!(out.usage.is_none());
        assert!(out
            .error
            .unwrap()
            .starts_with("Your input exceeds the context window"));
    }
}
