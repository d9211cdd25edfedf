//! OpenAI Responses (`/v1/responses`): `input` of items; a `*_call` item
//! (`function_call`, `custom_tool_call`, ...) is answered by its `*_output`
//! item with the same `call_id`. Remote compaction
//! (`/v1/responses/compact`) is a side request.

use super::{
    ids_of, recall_description, recall_parameters, str_of, CallPart, ContextLimit, DialectSpec,
    Provider, Route, StreamCut, ToolResult,
};
use crate::model::{Dialect, Usage};
use crate::spans::{span, Span};
use serde_json::{json, Value};

/// The OpenAI Responses dialect.
#[derive(Debug, Clone, Copy)]
pub struct OpenaiResponses;

/// The recall tool as a Responses `function` tool.
pub const RECALL_TOOL: &str = concat!(
    r#"{"type":"function","name":"oceancode_recall","description":"#,
    recall_description!(),
    r#","parameters":"#,
    recall_parameters!(),
    "}"
);

fn item_type(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

impl DialectSpec for OpenaiResponses {
    fn dialect(&self) -> Dialect {
        Dialect::OpenaiResponses
    }

    fn name(&self) -> &'static str {
        "openai_responses"
    }

    fn route(&self, path: &str) -> Option<Route> {
        match path.trim_end_matches('/') {
            "/v1/responses" => Some(Route::Main),
            // Remote compaction (Codex, V1): the client's own compaction,
            // forwarded untouched; what it returns comes back in the next
            // request (a branch).
            "/v1/responses/compact" => Some(Route::Side),
            _ => None,
        }
    }

    fn main_path(&self, _model: &str) -> String {
        "/v1/responses".to_string()
    }

    fn provider(&self) -> Provider {
        Provider::OpenAi
    }

    fn conv_key(&self) -> &'static str {
        "input"
    }

    fn calls(&self, v: &Value) -> Vec<String> {
        if item_type(v).ends_with("_call") {
            ids_of([v], "call_id")
        } else {
            Vec::new()
        }
    }

    fn results(&self, v: &Value) -> Vec<ToolResult> {
        if !item_type(v).ends_with("_output") {
            return Vec::new();
        }
        ids_of([v], "call_id")
            .into_iter()
            .map(|id| ToolResult {
                id,
                is_error: false,
            })
            .collect()
    }

    /// The `output` of a `function_call_output` / `custom_tool_call_output` item.
    fn tool_outputs(&self, raw: &str) -> Vec<Span> {
        let Some(top) = super::top(raw) else {
            return Vec::new();
        };
        let is_output = matches!(
            top.kind.as_deref(),
            Some("function_call_output" | "custom_tool_call_output")
        );
        if !is_output {
            return Vec::new();
        }
        top.output
            .and_then(|c| span(raw, 0, c))
            .into_iter()
            .collect()
    }

    /// The item itself when it is a `*_call` (its `call_id`; a
    /// `function_call`'s name and `arguments`).
    fn call_parts(&self, raw: &str) -> Vec<CallPart> {
        let Ok(v) = serde_json::from_str::<Value>(raw) else {
            return Vec::new();
        };
        let ty = item_type(&v);
        if !ty.ends_with("_call") {
            return Vec::new();
        }
        vec![CallPart {
            id: str_of(&v, "call_id"),
            name: if ty == "function_call" {
                str_of(&v, "name")
            } else {
                String::new()
            },
            input: v
                .get("arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}")
                .to_string(),
            raw: raw.to_string(),
        }]
    }

    /// One `function_call_output` item per call.
    fn results_messages(&self, calls: &[(&str, &str)], texts: &[String]) -> Vec<String> {
        calls
            .iter()
            .zip(texts)
            .map(|((id, _), t)| {
                json!({"type": "function_call_output", "call_id": id, "output": t}).to_string()
            })
            .collect()
    }

    /// The call items themselves.
    fn calls_messages(&self, raws: &[String]) -> Vec<String> {
        raws.to_vec()
    }

    fn stub_message(&self, text: &str, pinned: &[&str]) -> String {
        if pinned.is_empty() {
            return json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
                .to_string();
        }
        super::anthropic::user_parts(
            r#"{"type":"message","role":"user","content":["#,
            "input_text",
            text,
            pinned,
        )
    }

    fn stream_error_event(&self, _cut: StreamCut, message: &str) -> String {
        let data = json!({
            "type": "error", "code": "stream_interrupted", "message": message, "param": null,
        });
        format!("event: error\ndata: {data}\n\n")
    }

    fn context_limit(&self, v: &Value) -> Option<ContextLimit> {
        super::openai_chat::context_limit(v)
    }

    /// `input_tokens` (cached and written tokens a part of it) and
    /// `output_tokens` (reasoning a part of it).
    fn usage(&self, u: &Value) -> Option<(Usage, u64)> {
        super::openai_chat::usage_of(
            u,
            "input_tokens",
            "input_tokens_details",
            "output_tokens",
            "output_tokens_details",
        )
    }

    fn recall_tool(&self) -> &'static str {
        RECALL_TOOL
    }

    fn request_body(&self, model: &str, messages: &[String]) -> String {
        format!(
            r#"{{"model":{},"input":[{}]}}"#,
            json!(model),
            messages.join(",")
        )
    }

    fn assistant_message(&self, text: &str) -> String {
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
            .to_string()
    }

    fn tool_call_message(&self, id: &str, name: &str, args: &Value) -> String {
        json!({"type": "function_call", "call_id": id, "name": name, "arguments": args.to_string()})
            .to_string()
    }

    fn tool_result_message(&self, id: &str, _name: &str, output: &str, _is_error: bool) -> String {
        json!({"type": "function_call_output", "call_id": id, "output": output}).to_string()
    }
}
