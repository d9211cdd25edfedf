//! Google Gemini (Generative Language API): `POST /v1beta/models/{model}:generateContent`,
//! `:streamGenerateContent` (`?alt=sse`: one `data:` chunk per event, no `[DONE]`),
//! `:countTokens`. What the fake needs of it in one place: the routes, the conversation's
//! rules (the API's own wording), tool results per turn, the structured-output schema,
//! the answer as chunks or one JSON body, and the error envelope
//! (`{"error": {"code", "message", "status"}}`, too long included).

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::analyze::array;
use crate::json::{obj, J};
use crate::plan::{split_text, Plan, Stop};
use crate::render::{sse, Ctx};
use crate::usage::Usage;
use crate::validate::Invalid;

/// What a Gemini path asks: `(model, method)`.
pub(crate) fn path_method(path: &str) -> Option<(&str, &str)> {
    let rest = ["/v1beta/models/", "/v1/models/", "/v1alpha/models/"]
        .iter()
        .find_map(|p| path.strip_prefix(p))?;
    let (model, method) = rest.rsplit_once(':')?;
    (!model.is_empty() && !model.contains('/')).then_some((model, method))
}

fn parts(c: &Value) -> &[Value] {
    array(c.get("parts"))
}

fn calls(c: &Value) -> Vec<&Value> {
    parts(c)
        .iter()
        .filter_map(|p| p.get("functionCall"))
        .collect()
}

fn answers(c: &Value) -> Vec<&Value> {
    parts(c)
        .iter()
        .filter_map(|p| p.get("functionResponse"))
        .collect()
}

fn s<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

/// The API's rules as the fake checks them: `contents` a non-empty list of
/// `user` / `model` contents with non-empty `parts`, the first from the user; a
/// function response turn right after its function call turn, one response per
/// call (by `id` where the call has one, else by name).
pub(crate) fn validate(obj: &Map<String, Value>) -> Result<(), Invalid> {
    let err = |m: String| Err((m, None));
    let contents = match obj.get("contents") {
        Some(Value::Array(a)) => a,
        _ => return err("* GenerateContentRequest.contents: contents is not specified".into()),
    };
    if contents.is_empty() {
        return err("* GenerateContentRequest.contents: contents is not specified".into());
    }
    for (i, c) in contents.iter().enumerate() {
        match s(c, "role") {
            None | Some("user" | "model") => {}
            Some(r) => {
                return err(format!(
                    "Please use a valid role: user, model. (contents[{i}].role: '{r}')"
                ))
            }
        }
        if parts(c).is_empty() {
            return err(format!(
                "* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            ));
        }
    }
    if s(&contents[0], "role") == Some("model") {
        return err("Please ensure that multiturn requests alternate between user and model, and that the first turn is a user turn.".into());
    }
    for (i, c) in contents.iter().enumerate() {
        let got = answers(c);
        if got.is_empty() {
            continue;
        }
        let prev = if i > 0 {
            calls(&contents[i - 1])
        } else {
            Vec::new()
        };
        if prev.is_empty() || s(&contents[i - 1], "role") != Some("model") {
            return err(format!(
                "Please ensure that function response turn comes immediately after a function call turn. (contents[{i}])"
            ));
        }
        if prev.len() != got.len() {
            return err(format!(
                "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn. (contents[{i}]: {} calls, {} responses)",
                prev.len(),
                got.len()
            ));
        }
        for r in &got {
            let matched = prev.iter().any(|c| match (s(c, "id"), s(r, "id")) {
                (Some(a), Some(b)) => a == b,
                _ => s(c, "name") == s(r, "name"),
            });
            if !matched {
                return err(format!(
                    "Please ensure that the function response turn answers the calls of the function call turn: contents[{i}] answers {} ({}) that contents[{}] does not call.",
                    s(r, "name").unwrap_or(""),
                    s(r, "id").unwrap_or("no id"),
                    i - 1
                ));
            }
        }
    }
    for (i, c) in contents.iter().enumerate() {
        let made = calls(c);
        if made.is_empty() {
            continue;
        }
        let answered = contents.get(i + 1).map(answers).unwrap_or_default();
        // The last content may be the model's own call (the client answers next).
        if i + 1 < contents.len() && answered.len() != made.len() {
            return err(format!(
                "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn. (contents[{}])",
                i + 1
            ));
        }
    }
    Ok(())
}

/// (function responses in the conversation, those after the last user prompt).
pub(crate) fn tool_results(obj: &Map<String, Value>) -> (usize, usize) {
    let (mut all, mut turn) = (0, 0);
    for c in array(obj.get("contents")) {
        if s(c, "role") == Some("model") {
            continue;
        }
        let n = answers(c).len();
        if n == 0 {
            turn = 0;
        } else {
            turn += n;
        }
        all += n;
    }
    (all, turn)
}

/// `generationConfig.responseJsonSchema` / `responseSchema` (types upper-case in the
/// latter, as the API spells them), lower-cased for the schema stub.
pub(crate) fn schema(obj: &Map<String, Value>) -> Option<Value> {
    let g = obj.get("generationConfig")?;
    let sc = g
        .get("responseJsonSchema")
        .or_else(|| g.get("responseSchema"))?;
    Some(lower_types(sc))
}

fn lower_types(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| {
                    let x = match (k.as_str(), x) {
                        ("type", Value::String(t)) => Value::String(t.to_ascii_lowercase()),
                        _ => lower_types(x),
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(lower_types).collect()),
        other => other.clone(),
    }
}

/// `generationConfig.maxOutputTokens`.
pub(crate) fn max_tokens(obj: &Map<String, Value>) -> Option<u64> {
    obj.get("generationConfig")?
        .get("maxOutputTokens")?
        .as_u64()
}

fn finish(stop: &Stop) -> &'static str {
    match stop {
        Stop::MaxTokens => "MAX_TOKENS",
        _ => "STOP",
    }
}

/// `usageMetadata`: the prompt total, its cached part, the answer and the thinking.
pub(crate) fn usage(u: &Usage) -> J {
    let mut fields = vec![("promptTokenCount", J::from(u.input_tokens))];
    if u.cache_read_input_tokens > 0 {
        fields.push((
            "cachedContentTokenCount",
            J::from(u.cache_read_input_tokens),
        ));
    }
    let answer = u.output_tokens.saturating_sub(u.reasoning_tokens);
    fields.push(("candidatesTokenCount", J::from(answer)));
    if u.reasoning_tokens > 0 {
        fields.push(("thoughtsTokenCount", J::from(u.reasoning_tokens)));
    }
    fields.push(("totalTokenCount", J::from(u.input_tokens + u.output_tokens)));
    J::O(fields)
}

fn call_part(p: &Plan, k: usize) -> J {
    let c = &p.calls[k];
    let args: Value = match &c.input {
        Value::Object(_) => c.input.clone(),
        other => serde_json::json!({ "input": other }),
    };
    let mut fields = vec![(
        "functionCall",
        obj! {
            "id": format!("call_{}", c.n),
            "name": &c.name,
            "args": J::from(args),
        },
    )];
    if k == 0 {
        let sig = if p.signature.is_empty() {
            "EqFakeSigForFunctionCall"
        } else {
            p.signature.as_str()
        };
        fields.push(("thoughtSignature", J::from(sig)));
    }
    J::O(fields)
}

fn chunk(ctx: &Ctx, id: &str, parts: Vec<J>, last: Option<&Plan>) -> J {
    let mut cand = vec![("content", obj! { "parts": J::A(parts), "role": "model" })];
    if let Some(p) = last {
        cand.push(("finishReason", J::from(finish(&p.stop))));
    }
    cand.push(("index", J::from(0u64)));
    let mut fields = vec![("candidates", J::A(vec![J::O(cand)]))];
    if let Some(p) = last {
        fields.push(("usageMetadata", usage(&p.usage)));
    }
    fields.push(("modelVersion", J::from(ctx.model)));
    fields.push(("responseId", J::from(id)));
    J::O(fields)
}

/// The answer as SSE chunks: thinking, text pieces, the calls, then the finish
/// reason and `usageMetadata` on the last chunk.
pub(crate) fn stream(p: &Plan, ctx: &Ctx) -> Vec<Bytes> {
    let id = ctx.ids.hex(22);
    let mut pieces: Vec<J> = Vec::new();
    if let Some(t) = &p.thinking {
        pieces.push(obj! { "text": t.as_str(), "thought": true });
    }
    if let Some(t) = &p.text {
        for piece in split_text(t, p.delta_bytes) {
            pieces.push(obj! { "text": piece });
        }
    }
    for k in 0..p.calls.len() {
        pieces.push(call_part(p, k));
    }
    let n = pieces.len();
    let mut out: Vec<Bytes> = pieces
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            sse(
                None,
                &chunk(ctx, &id, vec![part], (i + 1 == n).then_some(p)),
            )
        })
        .collect();
    if out.is_empty() {
        out.push(sse(None, &chunk(ctx, &id, Vec::new(), Some(p))));
    }
    out
}

/// The answer as one `GenerateContentResponse`.
pub(crate) fn json(p: &Plan, ctx: &Ctx) -> Vec<u8> {
    let mut parts = Vec::new();
    if let Some(t) = &p.thinking {
        parts.push(obj! { "text": t.as_str(), "thought": true });
    }
    if let Some(t) = &p.text {
        parts.push(obj! { "text": t.as_str() });
    }
    for k in 0..p.calls.len() {
        parts.push(call_part(p, k));
    }
    chunk(ctx, &ctx.ids.hex(22), parts, Some(p)).to_vec()
}

fn status_name(code: u16) -> &'static str {
    match code {
        400 | 413 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        _ => "INTERNAL",
    }
}

/// `{"error": {"code": 400, "message": M, "status": "INVALID_ARGUMENT"}}`.
pub(crate) fn error(code: u16, message: &str) -> Vec<u8> {
    obj! {
        "error": obj! { "code": code as u64, "message": message, "status": status_name(code) },
    }
    .to_vec()
}

/// The API's too-long error (a 400).
pub(crate) fn too_long(n: u64, max: u64) -> Vec<u8> {
    error(
        400,
        &format!(
            "The input token count ({n}) exceeds the maximum number of tokens allowed ({max})."
        ),
    )
}

/// An error chunk inside a 200 stream.
pub(crate) fn stream_error(code: &str, message: &str) -> Bytes {
    sse(
        None,
        &obj! { "error": obj! { "code": 500u64, "message": format!("{code}: {message}"), "status": "INTERNAL" } },
    )
}

/// `countTokens`'s answer.
pub(crate) fn count(total: u64) -> Vec<u8> {
    obj! { "totalTokens": total }.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Result<(), Invalid> {
        validate(v.as_object().unwrap())
    }

    #[test]
    fn pairs_calls_and_responses() {
        let call =
            json!({"role":"model","parts":[{"functionCall":{"id":"a","name":"ls","args":{}}}]});
        let ans = json!({"role":"user","parts":[{"functionResponse":{"id":"a","name":"ls","response":{"output":"x"}}}]});
        let ask = json!({"role":"user","parts":[{"text":"go"}]});
        assert!(check(json!({"contents":[ask, call, ans]})).is_ok());
        let e = check(json!({"contents":[ask, ans]})).unwrap_err();
        assert!(
            e.0.contains("immediately after a function call turn"),
            "{e:?}"
        );
        let other = json!({"role":"user","parts":[{"functionResponse":{"id":"b","name":"ls","response":{}}}]});
        assert!(check(json!({"contents":[ask, call, other]})).is_err());
        assert!(check(json!({"contents":[ask, call, ask]})).is_err());
        assert!(check(json!({"contents":[call]})).is_err());
        assert!(check(json!({"contents":[{"role":"user","parts":[]}]})).is_err());
        assert!(check(json!({"contents":[ask, call]})).is_ok());
    }

    #[test]
    fn routes() {
        assert_eq!(
            path_method("/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
            Some(("gemini-2.5-pro", "streamGenerateContent"))
        );
        assert_eq!(path_method("/v1/messages"), None);
    }
}
