//! A dialect-independent reading of one row: its text, thinking, tool calls
//! and tool results. Pure; used by `SESSION.md` facts, the ATIF export and
//! the search index. (Transcripts keep their own renderer in `transcript`.)

use crate::media;
use crate::model::Dialect;
use serde_json::{Map, Value};

/// One part of a message.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Plain text.
    Text(String),
    /// Thinking / reasoning text (empty when encrypted or redacted).
    Thinking(String),
    /// A tool call. `input` is the arguments object (a JSON string that does
    /// not parse to an object is kept as `Value::String`).
    ToolCall {
        /// Call id (`tool_use.id`, `tool_calls[].id`, `call_id`).
        id: Option<String>,
        /// Tool name.
        name: String,
        /// Arguments.
        input: Value,
    },
    /// A tool result.
    ToolResult {
        /// The call it answers.
        id: Option<String>,
        /// Anthropic `is_error`.
        is_error: bool,
        /// Its text (parts joined by newlines; media as placeholders).
        text: String,
    },
    /// An image, document, file or audio part: a placeholder such as
    /// `[image: image/png · 1920×1080 · ~1568 tokens]`.
    Media(String),
    /// Anything not understood, as compact JSON.
    Other(String),
}

/// The parts of a raw message. A row that is not JSON yields one `Other`.
pub fn parts(dialect: Dialect, raw: &str) -> Vec<Part> {
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(raw) else {
        return vec![Part::Other(raw.to_string())];
    };
    let mut out = Vec::new();
    match dialect {
        Dialect::Anthropic => anthropic(&o, &mut out),
        Dialect::OpenaiChat => chat(&o, &mut out),
        Dialect::OpenaiResponses => responses(&o, &mut out),
        Dialect::Gemini => gemini(&o, &mut out),
    }
    out
}

/// A Gemini content: `parts[]` of `text` (`thought: true` for thinking),
/// `functionCall`, `functionResponse`, `inlineData` / `fileData`.
fn gemini(o: &Map<String, Value>, out: &mut Vec<Part>) {
    let Some(parts) = o.get("parts").and_then(Value::as_array) else {
        return;
    };
    for p in parts {
        let Some(p) = p.as_object() else {
            out.push(Part::Other(p.to_string()));
            continue;
        };
        if let Some(t) = str_of(p, "text") {
            if p.get("thought").and_then(Value::as_bool) == Some(true) {
                out.push(Part::Thinking(t.to_string()));
            } else {
                push_text(out, t);
            }
        } else if let Some(c) = p.get("functionCall").and_then(Value::as_object) {
            out.push(Part::ToolCall {
                id: string_of(c, "id"),
                name: string_of(c, "name").unwrap_or_default(),
                input: c
                    .get("args")
                    .cloned()
                    .unwrap_or_else(|| Value::Object(Map::new())),
            });
        } else if let Some(r) = p.get("functionResponse").and_then(Value::as_object) {
            let resp = r.get("response");
            let text = match resp
                .and_then(|v| v.get("output"))
                .or(resp.and_then(|v| v.get("error")))
            {
                Some(Value::String(s)) => s.clone(),
                _ => resp.map(Value::to_string).unwrap_or_default(),
            };
            out.push(Part::ToolResult {
                id: string_of(r, "id"),
                is_error: resp.and_then(|v| v.get("error")).is_some(),
                text,
            });
        } else if let Some(d) = p.get("inlineData").and_then(Value::as_object) {
            let kind = str_of(d, "mimeType").unwrap_or("file");
            out.push(Part::Media(format!("[inline data: {kind}]")));
        } else if let Some(d) = p.get("fileData").and_then(Value::as_object) {
            let kind = str_of(d, "mimeType").unwrap_or("file");
            out.push(Part::Media(format!("[file: {kind}]")));
        } else {
            out.push(Part::Other(Value::Object(p.clone()).to_string()));
        }
    }
}

/// Every text of a row joined by newlines (text, thinking, tool names and
/// arguments, results): what the search index holds.
pub fn plain_text(dialect: Dialect, raw: &str) -> String {
    let mut out = String::new();
    for p in parts(dialect, raw) {
        let s = match p {
            Part::Text(t) | Part::Thinking(t) | Part::Media(t) | Part::Other(t) => t,
            Part::ToolCall { name, input, .. } => match input {
                Value::String(s) => format!("{name} {s}"),
                v => format!("{name} {v}"),
            },
            Part::ToolResult { text, .. } => text,
        };
        if s.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&s);
    }
    out
}

fn str_of<'a>(o: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    o.get(key).and_then(Value::as_str)
}

fn string_of(o: &Map<String, Value>, key: &str) -> Option<String> {
    str_of(o, key).map(str::to_string)
}

/// `[image: image/png · 1920×1080 · ~1568 tokens]`: what the part is, its
/// size or pages and its estimated tokens ([`media`]), never its data.
fn media(what: &str, o: &Map<String, Value>) -> String {
    let m = media::block_of(o);
    let src = o.get("source").and_then(Value::as_object);
    let detail = str_of(o, "title")
        .or_else(|| str_of(o, "filename"))
        .or_else(|| src.and_then(|s| str_of(s, "media_type")))
        .or_else(|| m.as_ref().and_then(|m| m.media_type.as_deref()))
        .or_else(|| src.and_then(|s| str_of(s, "type")));
    match media::label(detail, m.as_ref()) {
        Some(l) => format!("[{what}: {l}]"),
        None => format!("[{what}]"),
    }
}

fn push_text(out: &mut Vec<Part>, s: &str) {
    if !s.is_empty() {
        out.push(Part::Text(s.to_string()));
    }
}

/// `arguments` as an object when it is a JSON string of one.
fn arguments(v: Option<&Value>) -> Value {
    match v {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(o @ Value::Object(_)) => o,
            _ => Value::String(s.clone()),
        },
        Some(v) => v.clone(),
        None => Value::Object(Map::new()),
    }
}

/// A tool result / output body as text.
fn result_text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => {
            let mut texts = Vec::new();
            for item in items {
                match item.as_object() {
                    Some(p) => {
                        let ty = str_of(p, "type").unwrap_or_default();
                        match ty {
                            "text" | "input_text" | "output_text" => {
                                texts.push(str_of(p, "text").unwrap_or_default().to_string())
                            }
                            "image" | "input_image" | "image_url" => texts.push(media("image", p)),
                            "document" | "input_file" | "file" => texts.push(media("file", p)),
                            _ => texts.push(item.to_string()),
                        }
                    }
                    None => texts.push(item.to_string()),
                }
            }
            texts.join("\n")
        }
        Some(v) => v.to_string(),
    }
}

fn anthropic(o: &Map<String, Value>, out: &mut Vec<Part>) {
    match o.get("content") {
        Some(Value::String(s)) => push_text(out, s),
        Some(Value::Array(blocks)) => {
            for b in blocks {
                let Some(b) = b.as_object() else {
                    out.push(Part::Other(b.to_string()));
                    continue;
                };
                let ty = str_of(b, "type").unwrap_or_default();
                match ty {
                    "text" => push_text(out, str_of(b, "text").unwrap_or_default()),
                    "thinking" => out.push(Part::Thinking(
                        str_of(b, "thinking").unwrap_or_default().to_string(),
                    )),
                    "redacted_thinking" => out.push(Part::Thinking(String::new())),
                    "tool_use" | "server_tool_use" | "mcp_tool_use" => out.push(Part::ToolCall {
                        id: string_of(b, "id"),
                        name: string_of(b, "name").unwrap_or_default(),
                        input: b
                            .get("input")
                            .cloned()
                            .unwrap_or_else(|| Value::Object(Map::new())),
                    }),
                    t if t == "tool_result" || t.ends_with("_tool_result") => {
                        out.push(Part::ToolResult {
                            id: string_of(b, "tool_use_id"),
                            is_error: b.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                            text: result_text(b.get("content")),
                        })
                    }
                    "image" => out.push(Part::Media(media("image", b))),
                    "document" => out.push(Part::Media(media("document", b))),
                    _ => out.push(Part::Other(Value::Object(b.clone()).to_string())),
                }
            }
        }
        None | Some(Value::Null) => {}
        Some(v) => out.push(Part::Other(v.to_string())),
    }
}

/// A chat / Responses message `content` (string or parts).
fn content_parts(v: Option<&Value>, out: &mut Vec<Part>) {
    match v {
        Some(Value::String(s)) => push_text(out, s),
        Some(Value::Array(items)) => {
            for item in items {
                let Some(p) = item.as_object() else {
                    out.push(Part::Other(item.to_string()));
                    continue;
                };
                match str_of(p, "type").unwrap_or_default() {
                    "text" | "input_text" | "output_text" => {
                        push_text(out, str_of(p, "text").unwrap_or_default())
                    }
                    "refusal" => push_text(out, str_of(p, "refusal").unwrap_or_default()),
                    "image_url" | "input_image" | "image" => {
                        out.push(Part::Media(media("image", p)))
                    }
                    "input_file" | "file" => out.push(Part::Media(media("file", p))),
                    "input_audio" => out.push(Part::Media("[audio]".into())),
                    _ => out.push(Part::Other(item.to_string())),
                }
            }
        }
        None | Some(Value::Null) => {}
        Some(v) => out.push(Part::Other(v.to_string())),
    }
}

fn chat(o: &Map<String, Value>, out: &mut Vec<Part>) {
    let role = str_of(o, "role").unwrap_or_default();
    if let Some(r) = str_of(o, "reasoning_content") {
        out.push(Part::Thinking(r.to_string()));
    }
    if role == "tool" || role == "function" {
        out.push(Part::ToolResult {
            id: string_of(o, "tool_call_id"),
            is_error: false,
            text: result_text(o.get("content")),
        });
        return;
    }
    content_parts(o.get("content"), out);
    if let Some(r) = str_of(o, "refusal") {
        push_text(out, r);
    }
    if let Some(calls) = o.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            let Some(c) = call.as_object() else {
                out.push(Part::Other(call.to_string()));
                continue;
            };
            let id = string_of(c, "id");
            if let Some(f) = c.get("function").and_then(Value::as_object) {
                out.push(Part::ToolCall {
                    id,
                    name: string_of(f, "name").unwrap_or_default(),
                    input: arguments(f.get("arguments")),
                });
            } else if let Some(f) = c.get("custom").and_then(Value::as_object) {
                out.push(Part::ToolCall {
                    id,
                    name: string_of(f, "name").unwrap_or_default(),
                    input: f.get("input").cloned().unwrap_or(Value::Null),
                });
            } else {
                out.push(Part::Other(call.to_string()));
            }
        }
    }
    if let Some(f) = o.get("function_call").and_then(Value::as_object) {
        out.push(Part::ToolCall {
            id: None,
            name: string_of(f, "name").unwrap_or_default(),
            input: arguments(f.get("arguments")),
        });
    }
}

fn responses(o: &Map<String, Value>, out: &mut Vec<Part>) {
    let ty = str_of(o, "type");
    match ty {
        Some("message") => content_parts(o.get("content"), out),
        None if o.contains_key("role") => content_parts(o.get("content"), out),
        Some("function_call") => out.push(Part::ToolCall {
            id: string_of(o, "call_id"),
            name: string_of(o, "name").unwrap_or_default(),
            input: arguments(o.get("arguments")),
        }),
        Some("custom_tool_call") => out.push(Part::ToolCall {
            id: string_of(o, "call_id"),
            name: string_of(o, "name").unwrap_or_default(),
            input: o.get("input").cloned().unwrap_or(Value::Null),
        }),
        Some("local_shell_call") => out.push(Part::ToolCall {
            id: string_of(o, "call_id"),
            name: "local_shell".into(),
            input: o.get("action").cloned().unwrap_or(Value::Null),
        }),
        Some(t) if t.ends_with("_call_output") => out.push(Part::ToolResult {
            id: string_of(o, "call_id"),
            is_error: false,
            text: result_text(o.get("output")),
        }),
        Some("reasoning") => {
            let mut texts = Vec::new();
            for key in ["summary", "content"] {
                for part in o.get(key).and_then(Value::as_array).into_iter().flatten() {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        texts.push(t.to_string());
                    }
                }
            }
            out.push(Part::Thinking(texts.join("\n\n")));
        }
        _ => out.push(Part::Other(Value::Object(o.clone()).to_string())),
    }
}

/// What precedes an exit code in a command's output.
const EXIT_MARKS: [&str; 7] = [
    "exited with code ",
    "Exit code: ",
    "Exit code ",
    "exit code: ",
    "exit code ",
    "\"exit_code\":",
    "\"exit_code\": ",
];

/// Where "xit" stands in each of [`EXIT_MARKS`].
const XIT_AT: [usize; EXIT_MARKS.len()] = [1, 1, 1, 1, 1, 2, 2];

/// The exit code a command's output reports (`Exit code 1`, `Process exited
/// with code 0`, `"exit_code": 2`), if any: of each mark's first occurrence
/// that is followed by a number, the earliest.
pub fn exit_code(text: &str) -> Option<i64> {
    // Every mark holds "xit" (at `XIT_AT` in it): one SIMD scan for that
    // finds each mark's occurrences in order, where a `find` per mark read
    // the whole output seven times (a cold request reads every result).
    let bytes = text.as_bytes();
    // A mark whose first occurrence held no number is not looked at again.
    let mut seen = [false; EXIT_MARKS.len()];
    for at in memchr::memmem::find_iter(bytes, b"xit") {
        for (k, mark) in EXIT_MARKS.iter().enumerate() {
            let Some(start) = at.checked_sub(XIT_AT[k]) else {
                continue;
            };
            if seen[k] || !bytes[start..].starts_with(mark.as_bytes()) {
                continue;
            }
            seen[k] = true;
            // `start + mark.len()` follows an ASCII byte: a char boundary.
            if let Some(code) = leading_int(&text[start + mark.len()..]) {
                return Some(code);
            }
        }
        if seen.iter().all(|&s| s) {
            break;
        }
    }
    None
}

/// The integer a text starts with, after whitespace (`-` allowed first).
fn leading_int(text: &str) -> Option<i64> {
    let rest = text.trim_start();
    let end = rest
        .char_indices()
        .find(|&(j, c)| !(c.is_ascii_digit() || (j == 0 && c == '-')))
        .map_or(rest.len(), |(j, _)| j);
    rest[..end].parse::<i64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code("Exit code 1\nboom"), Some(1));
        assert_eq!(
            exit_code("Chunk ID: x\nProcess exited with code 0\nOutput:"),
            Some(0)
        );
        assert_eq!(exit_code("{\"exit_code\": 2}"), Some(2));
        assert_eq!(exit_code("all good"), None);
        for (mark, at) in EXIT_MARKS.iter().zip(XIT_AT) {
            assert!(mark[at..].starts_with("xit"), "{mark:?}");
        }
        // The earliest mark with a number wins; a mark whose first
        // occurrence has none is not looked at again.
        assert_eq!(exit_code("exit code 3, Exit code: 4"), Some(3));
        assert_eq!(
            exit_code("exit code: n/a\nexit code: 5\nExit code 6"),
            Some(6)
        );
        assert_eq!(exit_code("ÿxit exited with code -2"), Some(-2));
    }

    /// The exit code as it was read before the one-scan search: a `find`
    /// per mark, the earliest that parses.
    fn exit_code_by_find(text: &str) -> Option<i64> {
        let mut best: Option<(usize, i64)> = None;
        for mark in EXIT_MARKS {
            if let Some(i) = text.find(mark) {
                if let Some(code) = leading_int(&text[i + mark.len()..]) {
                    if !matches!(best, Some((b, _)) if b <= i) {
                        best = Some((i, code));
                    }
                }
            }
        }
        best.map(|(_, c)| c)
    }

    proptest::proptest! {
        #[test]
        fn exit_code_reads_as_a_find_per_mark_did(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "exited with code ", "Exit code: ", "Exit code ", "exit code: ", "exit code ",
                "\"exit_code\":", "\"exit_code\": ", "xit", "e", "\"", " ", "12", "-", "-7",
                "x", "n/a", "\n", "é", "exit", "Exit", "code", ":",
            ]), 0..24)
        ) {
            let text = pieces.concat();
            proptest::prop_assert_eq!(exit_code(&text), exit_code_by_find(&text), "{:?}", text);
        }
    }

    #[test]
    fn anthropic_parts() {
        let raw = r#"{"role":"assistant","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}}]}"#;
        let p = parts(Dialect::Anthropic, raw);
        assert_eq!(p.len(), 3);
        assert!(matches!(&p[2], Part::ToolCall { name, .. } if name == "Bash"));
        let t = plain_text(Dialect::Anthropic, raw);
        assert!(t.contains("hm") && t.contains("Bash {\"command\":\"ls\"}"));
    }

    #[test]
    fn media_parts_are_placeholders_with_size_and_tokens() {
        // A 2×3 PNG header (IHDR only): enough for the size.
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAADCAIAAAA=";
        let raw = format!(
            r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t","content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{png}"}}}}]}}]}}"#
        );
        match &parts(Dialect::Anthropic, &raw)[0] {
            Part::ToolResult { text, .. } => {
                assert_eq!(text, "[image: image/png · 2×3 · ~1 token]")
            }
            other => panic!("{other:?}"),
        }
        assert!(!plain_text(Dialect::Anthropic, &raw).contains(png));
        let chat = format!(
            r#"{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{png}","detail":"low"}}}}]}}"#
        );
        assert_eq!(
            parts(Dialect::OpenaiChat, &chat),
            vec![Part::Media("[image: image/png · 2×3 · ~85 tokens]".into())]
        );
    }

    #[test]
    fn responses_arguments_parse() {
        let raw = r#"{"type":"function_call","name":"exec_command","arguments":"{\"cmd\":\"ls\"}","call_id":"c1"}"#;
        match &parts(Dialect::OpenaiResponses, raw)[0] {
            Part::ToolCall { input, id, .. } => {
                assert_eq!(input["cmd"], "ls");
                assert_eq!(id.as_deref(), Some("c1"));
            }
            other => panic!("{other:?}"),
        }
    }
}
