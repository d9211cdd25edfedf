//! Google Gemini (`POST /v1beta/models/{model}:generateContent`,
//! `:streamGenerateContent?alt=sse`, `:countTokens`): the routes, the
//! classification of `contents[]`, the stub as a `user` content, the
//! response collector (`candidates[0].content.parts` gathered over the SSE
//! chunks, `usageMetadata`), the error envelope, and the recall tool's shapes.
//! (A `?key=` in the query never reaches a log line: the proxy logs paths,
//! and URLs only through `oceancode_config::redact_url`.)
//!
//! Gemini has no tool-call ids of its own; Gemini CLI gives every
//! `functionCall` an `id` and echoes it on its `functionResponse`. A part
//! without an id pairs by its function name (the API pairs by order).

use super::{first_line, info, Collected, Keep, MessageInfo, ResponseCollector};
use oceancode_window::{RowKind, StepDetail, Usage};
use serde_json::{json, Map, Value};

pub use oceancode_window::dialect::gemini::{
    call_id, calls_of, model_content, path_method, results_content, Gemini, CONV_KEY, RECALL_TOOL,
};
use oceancode_window::dialect::DialectSpec;

/// The model a Gemini path names (`gemini-2.5-pro`), if it is a Gemini route.
pub fn model_of_path(path: &str) -> Option<&str> {
    path_method(path).map(|(m, _)| m)
}

/// Gemini CLI's utility calls (its model router, next-speaker check, loop
/// detection): no tools, a JSON answer asked for with
/// `generationConfig.responseJsonSchema` / `responseSchema`. Forwarded
/// untouched, never recorded.
pub fn is_side_request(body: &super::ParsedBody<'_>) -> bool {
    let no_tools = body
        .get_as::<Vec<serde::de::IgnoredAny>>("tools")
        .is_none_or(|t| t.is_empty());
    no_tools
        && body.get_as::<Value>("generationConfig").is_some_and(|g| {
            g.get("responseJsonSchema").is_some() || g.get("responseSchema").is_some()
        })
}

fn parts(v: &Value) -> &[Value] {
    match v.get("parts") {
        Some(Value::Array(p)) => p,
        _ => &[],
    }
}

/// Classify one Gemini content (`{"role": "user"|"model", "parts": [...]}`).
pub fn classify(v: &Value) -> MessageInfo {
    let role = v
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("user")
        .to_string();
    let ps = parts(v);
    let calls = Gemini.calls(v);
    let answers: Vec<String> = Gemini.results(v).into_iter().map(|r| r.id).collect();
    let texts: Vec<&str> = ps
        .iter()
        .filter(|p| p.get("thought").and_then(Value::as_bool) != Some(true))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    let context_only = !texts.is_empty()
        && texts.len() == ps.len()
        && texts.iter().all(|t| super::standing::is_context_block(t));
    let kind = match role.as_str() {
        "model" => RowKind::Assistant,
        "user" if !answers.is_empty() => RowKind::ToolResult,
        "user" if context_only => RowKind::System,
        "user" => RowKind::Prompt,
        _ => RowKind::Other,
    };
    let text = texts
        .iter()
        .find(|t| !super::standing::is_context_block(t))
        .or(texts.first())
        .copied();
    let mut out = info(role, kind, text);
    out.opens = calls;
    out.closes = answers;
    // A tool-result content that also carries words the user typed.
    out.asks =
        kind == RowKind::ToolResult && texts.iter().any(|t| !super::standing::is_context_block(t));
    if out.asks {
        out.first_line = text.and_then(|t| first_line(t, 80));
    }
    out
}

/// `usageMetadata` as [`Usage`] and the thinking tokens (see
/// [`DialectSpec::usage`]).
pub fn usage_of(u: &Value) -> Option<(Usage, u64)> {
    Gemini.usage(u)
}

/// Reassembles a Gemini answer: candidate 0's parts over the chunks (text
/// pieces of the same kind joined), its finish reason, the last
/// `usageMetadata`.
#[derive(Default)]
pub struct Collector {
    usage: Option<(Usage, u64)>,
    model: Option<String>,
    /// `responseId` (the same on every chunk of one answer).
    response_id: Option<String>,
    parts: Vec<Map<String, Value>>,
    seen: bool,
    finish: Option<String>,
    error: Option<String>,
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

    fn chunk(&mut self, v: &Value, size: usize) {
        if let Some(e) = v.get("error") {
            self.error = Some(
                e.get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| e.to_string(), str::to_string),
            );
            return;
        }
        if let Some(id) = v.get("responseId").and_then(Value::as_str) {
            self.response_id = Some(id.to_string());
        }
        if let Some(m) = v.get("modelVersion").and_then(Value::as_str) {
            self.model = Some(m.to_string());
        }
        if let Some(u) = v.get("usageMetadata") {
            self.usage = usage_of(u).or(self.usage);
        }
        let Some(c) = v.get("candidates").and_then(Value::as_array).and_then(|c| {
            c.iter()
                .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        }) else {
            return;
        };
        if let Some(f) = c.get("finishReason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
            self.terminal = true;
        }
        let Some(content) = c.get("content") else {
            return;
        };
        self.seen = true;
        if !self.keep.take(size) {
            return;
        }
        for p in parts(content) {
            let Some(p) = p.as_object() else { continue };
            self.push(p);
        }
    }

    fn push(&mut self, p: &Map<String, Value>) {
        let thought = |m: &Map<String, Value>| m.get("thought").and_then(Value::as_bool);
        if let (Some(t), Some(last)) =
            (p.get("text").and_then(Value::as_str), self.parts.last_mut())
        {
            let same = last.contains_key("text")
                && thought(last) == thought(p)
                && !p.contains_key("thoughtSignature");
            if same {
                if let Some(Value::String(s)) = last.get_mut("text") {
                    s.push_str(t);
                    return;
                }
            }
        }
        self.parts.push(p.clone());
    }
}

impl ResponseCollector for Collector {
    fn on_event(&mut self, _event: &str, data: &str) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        self.chunk(&v, data.len());
    }

    fn on_json(&mut self, body: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return;
        };
        // A non-streamed answer; `streamGenerateContent` without `alt=sse`
        // answers a JSON array of the chunks.
        match &v {
            Value::Array(chunks) => {
                for c in chunks {
                    self.chunk(c, 0);
                }
            }
            _ => self.chunk(&v, body.len()),
        }
        self.terminal = true;
    }

    fn truncated(&mut self) {
        self.keep.cut();
    }

    fn finish(mut self: Box<Self>) -> Collected {
        let cut = self.keep.is_cut();
        if cut {
            let marker = self.keep.marker();
            self.parts.push(
                json!({ "text": marker })
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        let mut rows = Vec::new();
        if self.seen || !self.parts.is_empty() {
            let parts: Vec<Value> = self.parts.into_iter().map(Value::Object).collect();
            rows.push(json!({ "role": "model", "parts": parts }).to_string());
        }
        let detail = StepDetail {
            reasoning: self.usage.map_or(0, |(_, t)| t),
            ..StepDetail::default()
        };
        Collected {
            usage: self.usage.map(|(u, _)| u),
            model: self.model,
            response_id: self.response_id,
            rows,
            stop_reason: self.finish,
            error: self.error,
            terminal: self.terminal,
            truncated: cut,
            detail,
        }
    }
}

/// The assistant's note as a `model` content.
pub fn note_raw(text: &str) -> String {
    Gemini.assistant_message(text)
}

/// A chunk (or a whole answer) without its `functionCall` parts named
/// `name`: None when nothing is left of it, `Some(changed)` otherwise.
pub fn strip_calls(v: &mut Value, name: &str) -> Option<bool> {
    let mut changed = false;
    let mut empty = true;
    for c in v
        .get_mut("candidates")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(ps) = c
            .pointer_mut("/content/parts")
            .and_then(Value::as_array_mut)
        {
            let before = ps.len();
            ps.retain(|p| p.pointer("/functionCall/name").and_then(Value::as_str) != Some(name));
            changed |= ps.len() != before;
            empty &= ps.is_empty();
        }
        empty &= c.get("finishReason").is_none();
    }
    empty &= v.get("usageMetadata").is_none();
    if changed && empty {
        None
    } else {
        Some(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            path_method("/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
            Some(("gemini-2.5-pro", "streamGenerateContent"))
        );
        assert_eq!(path_method("/v1beta/models"), None);
        assert_eq!(path_method("/v1/messages"), None);
    }

    #[test]
    fn classifies_calls_and_answers() {
        let call =
            json!({"role":"model","parts":[{"functionCall":{"id":"c1","name":"ls","args":{}}}]});
        let i = classify(&call);
        assert_eq!(
            (i.kind, i.opens.clone()),
            (RowKind::Assistant, vec!["c1".to_string()])
        );
        let ans = json!({"role":"user","parts":[{"functionResponse":{"id":"c1","name":"ls","response":{"output":"x"}}}]});
        let i = classify(&ans);
        assert_eq!(
            (i.kind, i.closes.clone(), i.starts_ok),
            (RowKind::ToolResult, vec!["c1".to_string()], false)
        );
        let no_id =
            json!({"role":"user","parts":[{"functionResponse":{"name":"ls","response":{}}}]});
        assert_eq!(classify(&no_id).closes, vec!["ls".to_string()]);
        let first = json!({"role":"user","parts":[
            {"text":"<session_context>\nThis is the Gemini CLI. We are setting up the context for our chat.\n</session_context>"},
            {"text":"run the tests"}]});
        let i = classify(&first);
        assert_eq!(i.kind, RowKind::Prompt);
        assert_eq!(i.first_line.as_deref(), Some("run the tests"));
    }

    #[test]
    fn collects_a_stream() {
        let mut c: Box<dyn ResponseCollector> = Box::new(Collector::keeping(Keep::default()));
        c.on_event("", r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]},"index":0}],"modelVersion":"gemini-2.5-pro"}"#);
        c.on_event("", r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"lo"},{"functionCall":{"id":"c1","name":"ls","args":{}}}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":100,"cachedContentTokenCount":60,"candidatesTokenCount":5,"thoughtsTokenCount":7}}"#);
        let got = c.finish();
        assert_eq!(
            got.rows,
            vec![r#"{"parts":[{"text":"Hello"},{"functionCall":{"args":{},"id":"c1","name":"ls"}}],"role":"model"}"#.to_string()]
        );
        let u = got.usage.expect("usage");
        assert_eq!((u.input, u.cache_read, u.output), (40, 60, 12));
        assert!(got.terminal);
        assert_eq!(got.detail.reasoning, 7);
    }
}
