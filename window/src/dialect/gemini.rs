//! Google Gemini (`/v1beta/models/{model}:generateContent`,
//! `:streamGenerateContent`; `:countTokens` is a side request): `contents`
//! of `{role: user|model, parts}`; a `functionCall` part answered by a
//! `functionResponse` part (by `id`, else by name).

use super::{
    openai_usage, recall_description, recall_parameters, values, CallPart, ContextLimit,
    DialectSpec, Provider, Route, StreamCut, ToolResult,
};
use crate::model::{Dialect, Usage};
use crate::spans::{span, Span};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// The Gemini dialect.
#[derive(Debug, Clone, Copy)]
pub struct Gemini;

/// The conversation's key.
pub const CONV_KEY: &str = "contents";

/// The recall tool as a Gemini `Tool` (one function declaration).
pub const RECALL_TOOL: &str = concat!(
    r#"{"functionDeclarations":[{"name":"oceancode_recall","description":"#,
    recall_description!(),
    r#","parameters":"#,
    recall_parameters!(),
    "}]}"
);

/// What a Gemini path asks for: `(model, method)` of
/// `/v1beta/models/{model}:{method}` (also `/v1/…`, `/v1alpha/…`).
pub fn path_method(path: &str) -> Option<(&str, &str)> {
    let rest = ["/v1beta/models/", "/v1/models/", "/v1alpha/models/"]
        .iter()
        .find_map(|p| path.strip_prefix(p))?;
    let (model, method) = rest.rsplit_once(':')?;
    (!model.is_empty() && !model.contains('/')).then_some((model, method))
}

fn parts(v: &Value) -> &[Value] {
    match v.get("parts") {
        Some(Value::Array(p)) => p,
        _ => &[],
    }
}

/// Id of a `functionCall` / `functionResponse`: its `id`, else its name.
pub fn call_id(c: &Value) -> Option<String> {
    c.get("id")
        .and_then(Value::as_str)
        .or_else(|| c.get("name").and_then(Value::as_str))
        .map(str::to_string)
}

/// The `functionCall` parts of a `model` content: `(id, name, args, part)`.
pub fn calls_of(v: &Value) -> Vec<(String, String, String, String)> {
    parts(v)
        .iter()
        .filter_map(|p| {
            let c = p.get("functionCall")?;
            Some((
                call_id(c).unwrap_or_default(),
                c.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                c.get("args")
                    .map_or_else(|| "{}".to_string(), Value::to_string),
                p.to_string(),
            ))
        })
        .collect()
}

/// One `user` content answering `calls` (`(id, name)`) with `texts`.
pub fn results_content(calls: &[(&str, &str)], texts: &[String]) -> String {
    let parts: Vec<Value> = calls
        .iter()
        .zip(texts)
        .map(|((id, name), t)| {
            let mut r = json!({"name": name, "response": {"output": t}});
            if !id.is_empty() && id != name {
                r["id"] = Value::from(*id);
            }
            json!({ "functionResponse": r })
        })
        .collect();
    json!({"role": "user", "parts": parts}).to_string()
}

/// A `model` content of the given raw parts.
pub fn model_content(raw_parts: &[String]) -> String {
    json!({"role": "model", "parts": values(raw_parts)}).to_string()
}

/// Gemini's error body: `{"error": {"code", "message", "status"}}`.
pub fn error_body(status: u16, message: &str) -> Value {
    let name = match status {
        400 | 413 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        402 | 403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        408 | 504 => "DEADLINE_EXCEEDED",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        _ => "INTERNAL",
    };
    json!({"error": {"code": status, "message": message, "status": name}})
}

impl DialectSpec for Gemini {
    fn dialect(&self) -> Dialect {
        Dialect::Gemini
    }

    fn name(&self) -> &'static str {
        "gemini"
    }

    fn route(&self, path: &str) -> Option<Route> {
        match path_method(path.trim_end_matches('/'))?.1 {
            "generateContent" | "streamGenerateContent" => Some(Route::Main),
            "countTokens" => Some(Route::Side),
            _ => None,
        }
    }

    fn main_path(&self, model: &str) -> String {
        format!("/v1beta/models/{model}:generateContent")
    }

    fn provider(&self) -> Provider {
        Provider::Gemini
    }

    fn conv_key(&self) -> &'static str {
        CONV_KEY
    }

    fn user_first(&self) -> bool {
        true
    }

    fn calls(&self, v: &Value) -> Vec<String> {
        parts(v)
            .iter()
            .filter_map(|p| p.get("functionCall"))
            .filter_map(call_id)
            .collect()
    }

    fn results(&self, v: &Value) -> Vec<ToolResult> {
        parts(v)
            .iter()
            .filter_map(|p| p.get("functionResponse"))
            .filter_map(|r| {
                Some(ToolResult {
                    id: call_id(r)?,
                    is_error: r.pointer("/response/error").is_some(),
                })
            })
            .collect()
    }

    /// The `response.output` of each `functionResponse` part of a `user`
    /// content (Gemini CLI's shape; `response` itself must stay an object).
    fn tool_outputs(&self, raw: &str) -> Vec<Span> {
        #[derive(Deserialize)]
        struct Part<'a> {
            #[serde(rename = "functionResponse", borrow, default)]
            function_response: Option<&'a RawValue>,
        }
        #[derive(Deserialize)]
        struct Fr<'a> {
            #[serde(borrow, default)]
            response: Option<&'a RawValue>,
        }
        #[derive(Deserialize)]
        struct Resp<'a> {
            #[serde(borrow, default)]
            output: Option<&'a RawValue>,
        }
        let Some(top) = super::top(raw) else {
            return Vec::new();
        };
        if top.role.as_deref() != Some("user") {
            return Vec::new();
        }
        let Some(parts) = top
            .parts
            .and_then(|p| serde_json::from_str::<Vec<&RawValue>>(p.get()).ok())
        else {
            return Vec::new();
        };
        parts
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let fr = serde_json::from_str::<Part<'_>>(p.get())
                    .ok()?
                    .function_response?;
                let resp = serde_json::from_str::<Fr<'_>>(fr.get()).ok()?.response?;
                let out = serde_json::from_str::<Resp<'_>>(resp.get()).ok()?.output?;
                span(raw, u32::try_from(i).ok()?, out)
            })
            .collect()
    }

    /// The `functionCall` parts (the raw part is the whole part).
    fn call_parts(&self, raw: &str) -> Vec<CallPart> {
        let Ok(v) = serde_json::from_str::<Value>(raw) else {
            return Vec::new();
        };
        calls_of(&v)
            .into_iter()
            .map(|(id, name, input, raw)| CallPart {
                id,
                name,
                input,
                raw,
            })
            .collect()
    }

    /// One `user` content of `functionResponse` parts.
    fn results_messages(&self, calls: &[(&str, &str)], texts: &[String]) -> Vec<String> {
        vec![results_content(calls, texts)]
    }

    /// One `model` content of the parts.
    fn calls_messages(&self, raws: &[String]) -> Vec<String> {
        vec![model_content(raws)]
    }

    fn stub_message(&self, text: &str, pinned: &[&str]) -> String {
        let mut out = String::from(r#"{"role":"user","parts":["#);
        out.push_str(&json!({ "text": text }).to_string());
        for p in pinned {
            out.push(',');
            out.push_str(p);
        }
        out.push_str("]}");
        out
    }

    fn stream_error_event(&self, _cut: StreamCut, message: &str) -> String {
        let data = json!({
            "error": {"code": 500, "message": message, "status": "INTERNAL"},
        });
        format!("data: {data}\n\n")
    }

    /// A 400 `INVALID_ARGUMENT` "The input token count (N) exceeds the
    /// maximum number of tokens allowed (M)."; the ceiling is M.
    fn context_limit(&self, v: &Value) -> Option<ContextLimit> {
        let msg = v.pointer("/error/message")?.as_str()?;
        let rest = msg
            .split("exceeds the maximum number of tokens allowed")
            .nth(1)?;
        Some(ContextLimit {
            ceiling: rest
                .trim_start_matches([' ', '('])
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok()),
            counts_max_tokens: false,
        })
    }

    fn usage_key(&self) -> &'static str {
        "usageMetadata"
    }

    /// `promptTokenCount` is the whole prompt (plus
    /// `toolUsePromptTokenCount`), `cachedContentTokenCount` the part of it
    /// read from the cache; the output is `candidatesTokenCount` plus
    /// `thoughtsTokenCount` (billed as output), the thinking tokens reported.
    fn usage(&self, u: &Value) -> Option<(Usage, u64)> {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        u.get("promptTokenCount")?;
        let prompt = n("promptTokenCount") + n("toolUsePromptTokenCount");
        let thoughts = n("thoughtsTokenCount");
        let usage = openai_usage(
            prompt,
            n("cachedContentTokenCount"),
            n("candidatesTokenCount") + thoughts,
        );
        Some((usage, thoughts))
    }

    fn recall_tool(&self) -> &'static str {
        RECALL_TOOL
    }

    /// The model is in the path ([`DialectSpec::main_path`]), not the body.
    fn request_body(&self, _model: &str, messages: &[String]) -> String {
        format!(r#"{{"contents":[{}]}}"#, messages.join(","))
    }

    fn assistant_message(&self, text: &str) -> String {
        json!({"role": "model", "parts": [{"text": text}]}).to_string()
    }

    fn tool_call_message(&self, id: &str, name: &str, args: &Value) -> String {
        json!({"role": "model", "parts": [{"functionCall": {"id": id, "name": name, "args": args}}]})
            .to_string()
    }

    fn tool_result_message(&self, id: &str, name: &str, output: &str, is_error: bool) -> String {
        let response = if is_error {
            json!({ "error": output })
        } else {
            json!({ "output": output })
        };
        json!({"role": "user", "parts": [{"functionResponse": {"id": id, "name": name, "response": response}}]})
            .to_string()
    }
}
