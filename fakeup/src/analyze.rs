//! Reading a request: dialect, segments for the prompt-cache simulation, token counts,
//! tool-result counts and structured-output detection.
//!
//! Segments are `[tools, system, message...]` (Anthropic), `[tools, message...]` (Chat),
//! `[instructions, tools, item...]` (Responses). A segment's identity is its canonical
//! JSON (see [`crate::ordered`]); for Anthropic/Chat messages and the Anthropic system a
//! string content ≡ one text block, as the real cache sees them.

use serde_json::{Map, Value};
use xxhash_rust::xxh3::xxh3_64;

use crate::ordered::{collect_text, write_canon, Ov};
use crate::tokens::{count_tokens, TokenMemo};
use crate::validate;

/// API family of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// Anthropic Messages API.
    Anthropic,
    /// OpenAI Chat Completions.
    Chat,
    /// OpenAI Responses.
    Responses,
    /// Google Gemini (`generateContent`).
    Gemini,
}

impl Dialect {
    /// Name used in `ToolLoop.by_dialect`.
    pub fn key(self) -> &'static str {
        match self {
            Dialect::Anthropic => "anthropic",
            Dialect::Chat => "chat",
            Dialect::Responses => "responses",
            Dialect::Gemini => "gemini",
        }
    }
}

/// Which endpoint a request hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/messages`
    Messages,
    /// `POST /v1/messages/count_tokens`
    CountTokens,
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/responses`
    Responses,
    /// `POST /v1/responses/compact` (remote compaction, V1)
    ResponsesCompact,
    /// `POST /v1beta/models/{model}:generateContent`
    GeminiGenerate,
    /// `POST /v1beta/models/{model}:streamGenerateContent`
    GeminiStream,
    /// `POST /v1beta/models/{model}:countTokens`
    GeminiCount,
    /// Anything else (404).
    Other,
}

impl Endpoint {
    pub(crate) fn route(method: &http::Method, path: &str) -> Endpoint {
        if method != http::Method::POST {
            return Endpoint::Other;
        }
        match path.trim_end_matches('/') {
            "/v1/messages" => Endpoint::Messages,
            "/v1/messages/count_tokens" => Endpoint::CountTokens,
            "/v1/chat/completions" => Endpoint::ChatCompletions,
            "/v1/responses" => Endpoint::Responses,
            "/v1/responses/compact" => Endpoint::ResponsesCompact,
            p => match crate::gemini::path_method(p).map(|(_, m)| m) {
                Some("generateContent") => Endpoint::GeminiGenerate,
                Some("streamGenerateContent") => Endpoint::GeminiStream,
                Some("countTokens") => Endpoint::GeminiCount,
                _ => Endpoint::Other,
            },
        }
    }

    /// The dialect of a model endpoint.
    pub fn dialect(self) -> Option<Dialect> {
        match self {
            Endpoint::Messages | Endpoint::CountTokens => Some(Dialect::Anthropic),
            Endpoint::ChatCompletions => Some(Dialect::Chat),
            Endpoint::Responses | Endpoint::ResponsesCompact => Some(Dialect::Responses),
            Endpoint::GeminiGenerate | Endpoint::GeminiStream | Endpoint::GeminiCount => {
                Some(Dialect::Gemini)
            }
            Endpoint::Other => None,
        }
    }
}

/// Why a request is refused with a 400.
#[derive(Debug)]
pub(crate) enum Reject {
    BadJson(String),
    Invalid {
        message: String,
        param: Option<String>,
    },
}

/// What the fake needs to know about a request.
#[derive(Debug, Default)]
pub(crate) struct Analysis {
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    pub seg_hashes: Vec<u64>,
    pub seg_tokens: Vec<u64>,
    pub total: u64,
    pub tool_results: usize,
    pub tool_results_this_turn: usize,
    /// The request declares `tools: []` (e.g. Claude Code's title request).
    pub tools_empty: bool,
    /// The request declares no tools at all (absent, null or `[]`).
    pub no_tools: bool,
    /// Responses: the last input item is `{"type":"compaction_trigger"}` (remote
    /// compaction, V2).
    pub compaction_trigger: bool,
    /// JSON schema of a structured-output request.
    pub schema: Option<Value>,
    /// `max_tokens` (Anthropic) / `max_output_tokens` / `max_completion_tokens`.
    pub max_tokens: Option<u64>,
    /// Anthropic `context_management.edits`.
    pub context: crate::context::Requested,
    /// Anthropic: messages before the latest `compaction` block (dropped,
    /// not counted), and their tokens.
    pub dropped_messages: usize,
    pub dropped_tokens: u64,
    /// Index in `seg_hashes` of the first kept message.
    pub first_message_seg: usize,
    /// Anthropic: what context edits could clear (kept messages only).
    pub clearable: crate::context::Clearable,
    /// Number of kept messages.
    pub messages: usize,
    /// Anthropic: the request asks for auto mode's safety check
    /// (`safeguards: [{"type": "dangerous_tool_use", …}]`, Claude Code
    /// 2.1.278+): the answer carries `safeguard_results`.
    pub safeguards: bool,
}

#[derive(Clone, Copy)]
enum Seg {
    /// JSON-ish content counted as its canonical JSON text (tool definitions).
    Json,
    /// Content counted by its string leaves.
    Plain,
    /// A message / system whose string content ≡ one text block.
    Message,
    System,
}

/// Per-segment token overhead (role markers etc.).
const SEG_OVERHEAD: u64 = 3;

pub(crate) fn analyze(
    dialect: Dialect,
    body: &[u8],
    validate_on: bool,
    memo: &TokenMemo,
) -> Result<Analysis, Reject> {
    let v: Value = serde_json::from_slice(body).map_err(|e| Reject::BadJson(e.to_string()))?;
    let Value::Object(obj) = &v else {
        return Err(Reject::BadJson("request body must be a JSON object".into()));
    };
    if validate_on {
        match dialect {
            Dialect::Anthropic => validate::anthropic(obj),
            Dialect::Chat => validate::chat(obj),
            Dialect::Responses => validate::responses(obj),
            Dialect::Gemini => crate::gemini::validate(obj),
        }
        .map_err(|(message, param)| Reject::Invalid { message, param })?;
    }
    let mut a = Analysis {
        model: obj
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        stream: obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: obj
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        ..Analysis::default()
    };
    // Segment identities come from an order-preserving parse of the same body.
    let parts: Parts = serde_json::from_slice(body).map_err(|e| Reject::BadJson(e.to_string()))?;
    let mut first_message_seg = None;
    let mut dropped = 0u64;
    let mut dropped_messages = 0usize;
    let mut push = |kind: Seg, v: &Ov| {
        let (h, t) = segment(kind, v, memo);
        a.seg_hashes.push(h);
        a.seg_tokens.push(t);
    };
    let tools_empty = matches!(obj.get("tools"), Some(Value::Array(t)) if t.is_empty());
    let tools_seg = parts
        .tools
        .as_ref()
        .filter(|t| !matches!(t, Ov::Null) && !tools_empty);
    fn items(v: &Option<Ov>) -> &[Ov] {
        match v {
            Some(Ov::Arr(items)) => items.as_slice(),
            _ => &[],
        }
    }
    match dialect {
        Dialect::Anthropic => {
            if let Some(t) = tools_seg {
                push(Seg::Json, t);
            }
            let system = parts.system.as_ref().filter(|s| !matches!(s, Ov::Null));
            if let Some(s) = system {
                push(Seg::System, s);
            }
            // What precedes the latest compaction block is dropped by the API.
            let msgs = items(&parts.messages);
            let drop = crate::context::drop_point(array(obj.get("messages")))
                .unwrap_or(0)
                .min(msgs.len());
            first_message_seg =
                Some(usize::from(tools_seg.is_some()) + usize::from(system.is_some()));
            for m in &msgs[drop..] {
                push(Seg::Message, m);
            }
            dropped = msgs[..drop]
                .iter()
                .map(|m| segment(Seg::Message, m, memo).1)
                .sum();
            dropped_messages = drop;
        }
        Dialect::Chat => {
            if let Some(t) = tools_seg {
                push(Seg::Json, t);
            }
            for m in items(&parts.messages) {
                push(Seg::Message, m);
            }
        }
        Dialect::Gemini => {
            if let Some(si) = parts
                .system_instruction
                .as_ref()
                .filter(|s| !matches!(s, Ov::Null))
            {
                push(Seg::Plain, si);
            }
            if let Some(t) = tools_seg {
                push(Seg::Json, t);
            }
            for c in items(&parts.contents) {
                push(Seg::Plain, c);
            }
        }
        Dialect::Responses => {
            if let Some(i) = parts
                .instructions
                .as_ref()
                .filter(|s| !matches!(s, Ov::Null))
            {
                push(Seg::Plain, i);
            }
            if let Some(t) = tools_seg {
                push(Seg::Json, t);
            }
            match &parts.input {
                Some(Ov::Arr(list)) => list.iter().for_each(|i| push(Seg::Plain, i)),
                Some(other @ Ov::Str(_)) => push(Seg::Plain, other),
                _ => {}
            }
        }
    }
    a.total = a.seg_tokens.iter().sum();
    a.dropped_tokens = dropped;
    a.dropped_messages = dropped_messages;
    a.messages =
        array(obj.get("messages").or_else(|| obj.get("contents"))).len() - dropped_messages;
    a.first_message_seg = first_message_seg.unwrap_or(0);
    a.max_tokens = ["max_tokens", "max_output_tokens", "max_completion_tokens"]
        .iter()
        .find_map(|k| obj.get(*k).and_then(Value::as_u64))
        .or_else(|| crate::gemini::max_tokens(obj));
    if dialect == Dialect::Anthropic {
        a.context = crate::context::requested(obj);
        if a.context.clear_tool_uses.is_some() || a.context.clear_thinking.is_some() {
            a.clearable =
                crate::context::clearable(array(obj.get("messages")), a.dropped_messages, memo);
        }
    }
    a.tools_empty = tools_empty;
    a.no_tools = tools_empty || matches!(obj.get("tools"), None | Some(Value::Null));
    a.compaction_trigger = dialect == Dialect::Responses
        && array(obj.get("input"))
            .last()
            .is_some_and(crate::compaction::is_trigger);
    let (all, turn) = tool_results(dialect, obj);
    a.tool_results = all;
    a.tool_results_this_turn = turn;
    a.schema = schema(dialect, obj);
    a.safeguards = dialect == Dialect::Anthropic
        && array(obj.get("safeguards"))
            .iter()
            .any(|g| g.get("type").and_then(Value::as_str) == Some(DANGEROUS_TOOL_USE));
    Ok(a)
}

/// The safeguard Claude Code's auto mode asks for.
pub(crate) const DANGEROUS_TOOL_USE: &str = "dangerous_tool_use";

pub(crate) fn array(v: Option<&Value>) -> &[Value] {
    match v {
        Some(Value::Array(a)) => a,
        _ => &[],
    }
}

/// The parts of a body that form segments, parsed order-preserving.
#[derive(serde::Deserialize)]
struct Parts {
    #[serde(default)]
    tools: Option<Ov>,
    #[serde(default)]
    system: Option<Ov>,
    #[serde(default)]
    messages: Option<Ov>,
    #[serde(default)]
    instructions: Option<Ov>,
    #[serde(default)]
    input: Option<Ov>,
    #[serde(default, rename = "systemInstruction")]
    system_instruction: Option<Ov>,
    #[serde(default)]
    contents: Option<Ov>,
}

fn segment(kind: Seg, v: &Ov, memo: &TokenMemo) -> (u64, u64) {
    let mut buf = Vec::with_capacity(256);
    buf.push(kind as u8);
    let normalized = match (kind, v) {
        (Seg::System, Ov::Str(s)) => Some(Ov::text_blocks(s)),
        (Seg::Message, m) => m.normalized_message(),
        _ => None,
    };
    write_canon(normalized.as_ref().unwrap_or(v), &mut buf, true);
    let h = xxh3_64(&buf);
    let tokens = memo.get_or(h, || match kind {
        Seg::Json => count_tokens(&String::from_utf8_lossy(&buf[1..])),
        _ => {
            let mut s = String::new();
            let media = collect_text(v, &mut s);
            count_tokens(&s) + media
        }
    });
    (h, tokens + SEG_OVERHEAD)
}

fn blocks(m: &Value) -> &[Value] {
    array(m.get("content"))
}

fn is_type(v: &Value, t: &str) -> bool {
    v.get("type").and_then(Value::as_str) == Some(t)
}

/// (tool results in the whole conversation, tool results after the last user prompt).
fn tool_results(dialect: Dialect, obj: &Map<String, Value>) -> (usize, usize) {
    let mut all = 0;
    let mut turn = 0;
    match dialect {
        Dialect::Gemini => return crate::gemini::tool_results(obj),
        Dialect::Anthropic => {
            for m in array(obj.get("messages")) {
                if m.get("role").and_then(Value::as_str) != Some("user") {
                    continue;
                }
                let n = blocks(m)
                    .iter()
                    .filter(|b| is_type(b, "tool_result"))
                    .count();
                if n == 0 {
                    turn = 0;
                } else {
                    turn += n;
                }
                all += n;
            }
        }
        Dialect::Chat => {
            for m in array(obj.get("messages")) {
                match m.get("role").and_then(Value::as_str) {
                    Some("tool") => {
                        all += 1;
                        turn += 1;
                    }
                    Some("user") => turn = 0,
                    _ => {}
                }
            }
        }
        Dialect::Responses => {
            for item in array(obj.get("input")) {
                let t = item.get("type").and_then(Value::as_str);
                if matches!(t, Some("function_call_output" | "custom_tool_call_output")) {
                    all += 1;
                    turn += 1;
                } else if item.get("role").and_then(Value::as_str) == Some("user")
                    && matches!(t, None | Some("message"))
                {
                    turn = 0;
                }
            }
        }
    }
    (all, turn)
}

/// The JSON schema of a structured-output request, if any.
fn schema(dialect: Dialect, obj: &Map<String, Value>) -> Option<Value> {
    let json_schema = |f: Option<&Value>| -> Option<Value> {
        let f = f?;
        (f.get("type").and_then(Value::as_str) == Some("json_schema")).then_some(())?;
        Some(
            f.get("schema")
                .or_else(|| f.get("json_schema").and_then(|j| j.get("schema")))
                .cloned()
                .unwrap_or(Value::Null),
        )
    };
    match dialect {
        Dialect::Anthropic => json_schema(obj.get("output_config").and_then(|o| o.get("format")))
            .or_else(|| json_schema(obj.get("output_format"))),
        Dialect::Chat => json_schema(obj.get("response_format")),
        Dialect::Responses => json_schema(obj.get("text").and_then(|t| t.get("format"))),
        Dialect::Gemini => crate::gemini::schema(obj),
    }
}

/// A minimal value satisfying `schema` (required properties, first enum value, ...).
pub(crate) fn schema_stub(schema: &Value, name: &str) -> Value {
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if schema.get("properties").is_some() => "object",
        _ => "string",
    };
    match ty {
        "object" => {
            let props = schema.get("properties").and_then(Value::as_object);
            let required: Vec<&str> = array(schema.get("required"))
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let mut out = Map::new();
            if let Some(props) = props {
                for (k, p) in props {
                    if required.is_empty() || required.contains(&k.as_str()) {
                        out.insert(k.clone(), schema_stub(p, k));
                    }
                }
            }
            Value::Object(out)
        }
        "array" => Value::Array(Vec::new()),
        "boolean" => Value::Bool(false),
        "integer" | "number" => Value::from(0),
        "null" => Value::Null,
        _ => Value::String(if name.is_empty() {
            "fake".to_string()
        } else {
            format!("Fake {name}")
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(d: Dialect, v: Value) -> Analysis {
        let memo = TokenMemo::new(100);
        analyze(d, &serde_json::to_vec(&v).unwrap(), true, &memo).unwrap()
    }

    #[test]
    fn string_content_and_cache_control_do_not_change_identity() {
        let a = run(
            Dialect::Anthropic,
            json!({"model":"m","system":"sys","messages":[{"role":"user","content":"hi"}]}),
        );
        let b = run(
            Dialect::Anthropic,
            json!({"model":"m","system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],
                   "messages":[{"content":[{"text":"hi","type":"text","cache_control":{"type":"ephemeral"}}],"role":"user"}]}),
        );
        assert_eq!(a.seg_hashes, b.seg_hashes);
        assert_eq!(a.seg_tokens, b.seg_tokens);
        assert_eq!(a.total, a.seg_tokens.iter().sum::<u64>());
    }

    #[test]
    fn tool_input_key_order_matters_but_escapes_do_not() {
        let memo = TokenMemo::new(100);
        let go = |body: &str| analyze(Dialect::Anthropic, body.as_bytes(), false, &memo).unwrap();
        let a = go(
            r#"{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"B","input":{"b":1,"a":"\u00e9"}}]}]}"#,
        );
        let b = go(
            r#"{"messages":[{"content":[{"input":{"b":1,"a":"é"},"name":"B","id":"t","type":"tool_use"}], "role":"assistant"}],"model":"m"}"#,
        );
        let c = go(
            r#"{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"B","input":{"a":"é","b":1}}]}]}"#,
        );
        assert_eq!(a.seg_hashes, b.seg_hashes);
        assert_ne!(a.seg_hashes, c.seg_hashes);
    }

    #[test]
    fn counts_tool_results_and_schema() {
        let a = run(
            Dialect::Anthropic,
            json!({"model":"m","messages":[
                {"role":"user","content":"go"},
                {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}],
                "output_config":{"format":{"type":"json_schema","schema":{"type":"object",
                  "properties":{"title":{"type":"string"}},"required":["title"]}}}}),
        );
        assert_eq!((a.tool_results, a.tool_results_this_turn), (1, 1));
        let stub = schema_stub(a.schema.as_ref().unwrap(), "");
        assert_eq!(stub, json!({"title": "Fake title"}));
    }
}
