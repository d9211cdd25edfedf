//! OpenAI Chat Completions (`/v1/chat/completions`): `messages` of `{role,
//! content}`, an assistant's `tool_calls` (`id`) answered by `tool`
//! messages (`tool_call_id`). The OpenAI error envelope and usage object
//! (shared with Responses) live here.

use super::{
    ids_of, openai_usage_with_writes, recall_description, recall_parameters, str_of, u64_of,
    values, CallPart, ContextLimit, DialectSpec, Provider, Route, StreamCut, ToolResult,
};
use crate::model::{Dialect, Usage};
use crate::spans::{span, Span};
use serde_json::{json, Value};

/// The OpenAI Chat Completions dialect.
#[derive(Debug, Clone, Copy)]
pub struct OpenaiChat;

/// The recall tool as a Chat `function` tool.
pub const RECALL_TOOL: &str = concat!(
    r#"{"type":"function","function":{"name":"oceancode_recall","description":"#,
    recall_description!(),
    r#","parameters":"#,
    recall_parameters!(),
    "}}"
);

/// OpenAI's error body: `{"error":{"message","type","param":null,"code"}}`,
/// its `type` `server_error` for a 5xx status, else `invalid_request_error`.
pub fn error_body(status: u16, code: &str, message: &str) -> Value {
    json!({
        "error": {
            "message": message,
            "type": if (500..600).contains(&status) { "server_error" } else { "invalid_request_error" },
            "param": null,
            "code": code,
        }
    })
}

/// OpenAI's `context_length_exceeded` error (Chat and Responses), the
/// ceiling from "maximum context length is N".
pub fn context_limit(v: &Value) -> Option<ContextLimit> {
    let e = v.get("error")?;
    if e.get("code").and_then(Value::as_str) != Some("context_length_exceeded") {
        return None;
    }
    let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
    let ceiling = msg
        .split("maximum context length is ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok());
    Some(ContextLimit {
        ceiling,
        counts_max_tokens: false,
    })
}

/// OpenAI's usage object (Chat `usage`, Responses `response.usage`):
/// `total`/`details`/`output`/`output_details` are the names of its fields
/// in that API (`cached_tokens`, `cache_write_tokens` and
/// `reasoning_tokens` inside the details). Reasoning tokens are a part of
/// the output: they are reported, never added.
pub fn usage_of(
    u: &Value,
    total: &str,
    details: &str,
    output: &str,
    output_details: &str,
) -> Option<(Usage, u64)> {
    let input = u64_of(u, total)?;
    let detail = |k: &str| {
        u.get(details)
            .and_then(|d| d.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let reasoning = u
        .get(output_details)
        .and_then(|d| d.get("reasoning_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let out = u64_of(u, output).unwrap_or(0);
    Some((
        openai_usage_with_writes(
            input,
            detail("cached_tokens"),
            detail("cache_write_tokens"),
            out,
        ),
        reasoning.min(out),
    ))
}

impl DialectSpec for OpenaiChat {
    fn dialect(&self) -> Dialect {
        Dialect::OpenaiChat
    }

    fn name(&self) -> &'static str {
        "openai_chat"
    }

    fn route(&self, path: &str) -> Option<Route> {
        (path.trim_end_matches('/') == "/v1/chat/completions").then_some(Route::Main)
    }

    fn main_path(&self, _model: &str) -> String {
        "/v1/chat/completions".to_string()
    }

    fn provider(&self) -> Provider {
        Provider::OpenAi
    }

    fn calls(&self, v: &Value) -> Vec<String> {
        match v.get("tool_calls") {
            Some(Value::Array(calls)) => ids_of(calls, "id"),
            _ => Vec::new(),
        }
    }

    fn results(&self, v: &Value) -> Vec<ToolResult> {
        v.get("tool_call_id")
            .and_then(Value::as_str)
            .map(|id| ToolResult {
                id: id.to_string(),
                is_error: false,
            })
            .into_iter()
            .collect()
    }

    /// The `content` of a `tool` message.
    fn tool_outputs(&self, raw: &str) -> Vec<Span> {
        let Some(top) = super::top(raw) else {
            return Vec::new();
        };
        if top.role.as_deref() != Some("tool") {
            return Vec::new();
        }
        top.content
            .and_then(|c| span(raw, 0, c))
            .into_iter()
            .collect()
    }

    /// The `tool_calls` entries (`function.name`, `function.arguments`).
    fn call_parts(&self, raw: &str) -> Vec<CallPart> {
        let Ok(v) = serde_json::from_str::<Value>(raw) else {
            return Vec::new();
        };
        v.get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| CallPart {
                id: str_of(c, "id"),
                name: c
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                input: c
                    .pointer("/function/arguments")
                    .and_then(Value::as_str)
                    .unwrap_or("{}")
                    .to_string(),
                raw: c.to_string(),
            })
            .collect()
    }

    /// One `tool` message per call.
    fn results_messages(&self, calls: &[(&str, &str)], texts: &[String]) -> Vec<String> {
        calls
            .iter()
            .zip(texts)
            .map(|((id, _), t)| {
                json!({"role": "tool", "tool_call_id": id, "content": t}).to_string()
            })
            .collect()
    }

    fn calls_messages(&self, raws: &[String]) -> Vec<String> {
        vec![json!({"role": "assistant", "content": null, "tool_calls": values(raws)}).to_string()]
    }

    fn stub_message(&self, text: &str, pinned: &[&str]) -> String {
        if pinned.is_empty() {
            return json!({"role": "user", "content": text}).to_string();
        }
        super::anthropic::user_parts(r#"{"role":"user","content":["#, "text", text, pinned)
    }

    fn stream_error_event(&self, _cut: StreamCut, message: &str) -> String {
        let data = json!({
            "error": {"message": message, "type": "server_error", "param": null, "code": "stream_interrupted"},
        });
        format!("data: {data}\n\n")
    }

    fn context_limit(&self, v: &Value) -> Option<ContextLimit> {
        context_limit(v)
    }

    /// `prompt_tokens` (cached and written tokens a part of it) and
    /// `completion_tokens` (reasoning a part of it).
    fn usage(&self, u: &Value) -> Option<(Usage, u64)> {
        usage_of(
            u,
            "prompt_tokens",
            "prompt_tokens_details",
            "completion_tokens",
            "completion_tokens_details",
        )
    }

    fn recall_tool(&self) -> &'static str {
        RECALL_TOOL
    }

    fn request_body(&self, model: &str, messages: &[String]) -> String {
        format!(
            r#"{{"model":{},"messages":[{}]}}"#,
            json!(model),
            messages.join(",")
        )
    }

    fn assistant_message(&self, text: &str) -> String {
        json!({"role": "assistant", "content": text}).to_string()
    }

    fn tool_call_message(&self, id: &str, name: &str, args: &Value) -> String {
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}
        ]})
        .to_string()
    }

    fn tool_result_message(&self, id: &str, _name: &str, output: &str, _is_error: bool) -> String {
        json!({"role": "tool", "tool_call_id": id, "content": output}).to_string()
    }
}
