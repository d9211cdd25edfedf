//! Anthropic Messages (`/v1/messages`): `messages` of `{role, content}`,
//! `tool_use` blocks in assistant messages answered by `tool_result` blocks
//! (`tool_use_id`, `is_error`) in the next user message; server tools
//! (`server_tool_use`, `*_tool_result`) answer within the assistant message.

use super::{
    ids_of, recall_description, recall_parameters, str_of, u64_of, values, CallPart, ContextLimit,
    DialectSpec, Provider, Route, StreamCut, ToolResult,
};
use crate::model::{Dialect, Usage};
use crate::spans::{span, Block, Span};
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// The Anthropic Messages dialect.
#[derive(Debug, Clone, Copy)]
pub struct Anthropic;

/// The recall tool as an Anthropic tool.
pub const RECALL_TOOL: &str = concat!(
    r#"{"name":"oceancode_recall","description":"#,
    recall_description!(),
    r#","input_schema":"#,
    recall_parameters!(),
    "}"
);

fn blocks(v: &Value) -> &[Value] {
    match v.get("content") {
        Some(Value::Array(b)) => b,
        _ => &[],
    }
}

fn of_type<'a>(v: &'a Value, ty: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    blocks(v)
        .iter()
        .filter(move |b| b.get("type").and_then(Value::as_str) == Some(ty))
}

/// Anthropic's error body: `{"type":"error","error":{"type","message"}}`.
pub fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// The fields of a usage object (or of one of its `iterations`).
pub fn usage_fields(u: &Value) -> Usage {
    Usage {
        input: u64_of(u, "input_tokens").unwrap_or(0),
        output: u64_of(u, "output_tokens").unwrap_or(0),
        cache_read: u64_of(u, "cache_read_input_tokens").unwrap_or(0),
        cache_write: u64_of(u, "cache_creation_input_tokens").unwrap_or(0),
    }
}

/// The last number in `s`.
fn last_number(s: &str) -> Option<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .rfind(|p| !p.is_empty())
        .and_then(|p| p.parse().ok())
}

impl DialectSpec for Anthropic {
    fn dialect(&self) -> Dialect {
        Dialect::Anthropic
    }

    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn route(&self, path: &str) -> Option<Route> {
        match path.trim_end_matches('/') {
            "/v1/messages" => Some(Route::Main),
            "/v1/messages/count_tokens" => Some(Route::CountTokens),
            _ => None,
        }
    }

    fn main_path(&self, _model: &str) -> String {
        "/v1/messages".to_string()
    }

    fn provider(&self) -> Provider {
        Provider::Anthropic
    }

    fn stub_first(&self) -> bool {
        true
    }

    fn user_first(&self) -> bool {
        true
    }

    fn calls(&self, v: &Value) -> Vec<String> {
        ids_of(
            of_type(v, "tool_use").chain(of_type(v, "server_tool_use")),
            "id",
        )
    }

    fn results(&self, v: &Value) -> Vec<ToolResult> {
        blocks(v)
            .iter()
            .filter(|b| {
                b.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t.ends_with("tool_result"))
            })
            .filter_map(|b| {
                Some(ToolResult {
                    id: b.get("tool_use_id")?.as_str()?.to_string(),
                    is_error: b.get("is_error").and_then(Value::as_bool) == Some(true),
                })
            })
            .collect()
    }

    /// The content of each `tool_result` block of a user message.
    fn tool_outputs(&self, raw: &str) -> Vec<Span> {
        let Some(top) = super::top(raw) else {
            return Vec::new();
        };
        if top.role.as_deref() != Some("user") {
            return Vec::new();
        }
        let Some(content) = top.content else {
            return Vec::new();
        };
        let Ok(blocks) = serde_json::from_str::<Vec<&RawValue>>(content.get()) else {
            return Vec::new();
        };
        blocks
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let block = serde_json::from_str::<Block<'_>>(b.get()).ok()?;
                if block.kind.as_deref() != Some("tool_result") {
                    return None;
                }
                span(raw, u32::try_from(i).ok()?, block.content?)
            })
            .collect()
    }

    /// The `tool_use` blocks (server tools are not the model's calls to answer).
    fn call_parts(&self, raw: &str) -> Vec<CallPart> {
        let Ok(v) = serde_json::from_str::<Value>(raw) else {
            return Vec::new();
        };
        of_type(&v, "tool_use")
            .map(|b| CallPart {
                id: str_of(b, "id"),
                name: str_of(b, "name"),
                input: b.get("input").map_or("{}".into(), Value::to_string),
                raw: b.to_string(),
            })
            .collect()
    }

    /// One user message of `tool_result` blocks.
    fn results_messages(&self, calls: &[(&str, &str)], texts: &[String]) -> Vec<String> {
        let blocks: Vec<Value> = calls
            .iter()
            .zip(texts)
            .map(|((id, _), t)| json!({"type": "tool_result", "tool_use_id": id, "content": t}))
            .collect();
        vec![json!({"role": "user", "content": blocks}).to_string()]
    }

    fn calls_messages(&self, raws: &[String]) -> Vec<String> {
        vec![json!({"role": "assistant", "content": values(raws)}).to_string()]
    }

    fn stub_message(&self, text: &str, pinned: &[&str]) -> String {
        if pinned.is_empty() {
            return json!({"role": "user", "content": [{"type": "text", "text": text}]})
                .to_string();
        }
        user_parts(r#"{"role":"user","content":["#, "text", text, pinned)
    }

    fn stream_error_event(&self, cut: StreamCut, message: &str) -> String {
        let data = json!({
            "type": "error",
            "error": {
                "type": match cut { StreamCut::Idle => "overloaded_error", StreamCut::Broken => "api_error" },
                "message": message,
            },
        });
        format!("event: error\ndata: {data}\n\n")
    }

    /// `prompt is too long: N tokens > M maximum`, and `input length and
    /// `max_tokens` exceed context limit: N + T > M, …` (the limit counts the
    /// request's `max_tokens` too).
    fn context_limit(&self, v: &Value) -> Option<ContextLimit> {
        let msg = v.pointer("/error/message")?.as_str()?;
        if let Some(rest) = msg.strip_prefix("prompt is too long") {
            // "prompt is too long: N tokens > M maximum"
            let ceiling = rest
                .split('>')
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.parse().ok());
            return Some(ContextLimit {
                ceiling,
                counts_max_tokens: false,
            });
        }
        // "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000,
        // decrease input length or `max_tokens` and try again"
        let rest = msg.strip_prefix("input length and `max_tokens` exceed context limit")?;
        let sum = rest.split(',').next().unwrap_or(rest);
        Some(ContextLimit {
            ceiling: sum.split('>').nth(1).and_then(last_number),
            counts_max_tokens: true,
        })
    }

    fn usage(&self, u: &Value) -> Option<(Usage, u64)> {
        u.as_object()?;
        let thinking = u
            .pointer("/output_tokens_details/thinking_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Some((usage_fields(u), thinking))
    }

    fn recall_tool(&self) -> &'static str {
        RECALL_TOOL
    }

    fn request_body(&self, model: &str, messages: &[String]) -> String {
        format!(
            r#"{{"model":{},"max_tokens":1024,"messages":[{}]}}"#,
            json!(model),
            messages.join(",")
        )
    }

    fn assistant_message(&self, text: &str) -> String {
        json!({"role": "assistant", "content": [{"type": "text", "text": text}]}).to_string()
    }

    fn tool_call_message(&self, id: &str, name: &str, args: &Value) -> String {
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": name, "input": args}]})
            .to_string()
    }

    fn tool_result_message(&self, id: &str, _name: &str, output: &str, is_error: bool) -> String {
        let mut block = json!({"type": "tool_result", "tool_use_id": id, "content": output});
        if is_error {
            block["is_error"] = json!(true);
        }
        json!({"role": "user", "content": [block]}).to_string()
    }
}

/// A user message of `head`, a `ty` text part with `text`, then `pinned`
/// raw parts, `]}`.
pub(crate) fn user_parts(head: &str, ty: &str, text: &str, pinned: &[&str]) -> String {
    let part = json!({"type": ty, "text": text}).to_string();
    let len = head.len() + part.len() + pinned.iter().map(|p| p.len() + 1).sum::<usize>() + 2;
    let mut out = String::with_capacity(len);
    out.push_str(head);
    out.push_str(&part);
    for p in pinned {
        out.push(',');
        out.push_str(p);
    }
    out.push_str("]}");
    out
}
