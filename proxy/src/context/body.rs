//! One message as a block body of `context.txt` and back (pure): text as
//! is, a tool call as `[[tool_use NAME ID]]` + its JSON input, a tool result
//! as `[[tool_result ID]]` (`error` when it is one) + its text, anything
//! else (thinking, images, documents, reasoning items) as a one-line
//! placeholder kept as it is. A rewritten body goes back into the message's
//! own JSON: the text and JSON slots take the new text, every other part
//! keeps its bytes' meaning.

use oceancode_window::Dialect;
use serde_json::Value;

/// Where a slot's text lives in the message's JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(&'static str),
    Index(usize),
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotKind {
    /// A JSON string shown as is.
    Text,
    /// A JSON object shown pretty-printed (Anthropic `tool_use.input`).
    JsonObject,
    /// A JSON string holding JSON (`arguments`), shown pretty-printed.
    JsonString,
}

/// One marker of a body and the slot that follows it (None: nothing may
/// follow: a placeholder).
#[derive(Debug, Clone)]
struct Part {
    /// The marker line; `None` for the text a body opens with.
    marker: Option<String>,
    slot: Option<(SlotKind, Vec<Step>)>,
    /// The slot is (a part of) a tool result's content.
    in_result: bool,
}

/// A message read for the file.
#[derive(Debug, Clone)]
pub struct Body {
    parts: Vec<Part>,
    /// The rendered body (markers, slots' text, escaped).
    pub text: String,
    /// The role its header names.
    pub role: String,
    /// The message answers tool calls (a tool result message).
    pub is_result: bool,
}

/// The line an edited tool result ends with.
pub fn recall_line(seq: u64) -> String {
    format!("[rewritten; the original is seq {seq}: oceancode-proxy recall entry {seq}]")
}

/// A body line that would read as a header or marker gets one more `\`.
pub fn escape(text: &str, out: &mut String) {
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if line.trim_start_matches('\\').starts_with("[[") {
            out.push('\\');
        }
        out.push_str(line);
    }
}

/// The inverse of [`escape`] for one line.
pub fn unescape_line(line: &str) -> &str {
    if line.starts_with('\\') && line.trim_start_matches('\\').starts_with("[[") {
        &line[1..]
    } else {
        line
    }
}

/// Is this line a marker or header (not escaped)?
pub fn is_marker(line: &str) -> bool {
    line.starts_with("[[")
}

fn get<'a>(v: &'a Value, path: &[Step]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, s| match s {
        Step::Key(k) => v.get(*k),
        Step::Index(i) => v.get(*i),
    })
}

fn get_mut<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, s| match s {
        Step::Key(k) => v.get_mut(*k),
        Step::Index(i) => v.get_mut(*i),
    })
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// One word for a marker (ids and names never hold spaces in practice; a
/// space would break the marker, so it is replaced).
fn word(x: &str) -> String {
    let w: String = x
        .chars()
        .map(|c| {
            if c.is_whitespace() || c == ']' {
                '_'
            } else {
                c
            }
        })
        .collect();
    if w.is_empty() {
        "-".into()
    } else {
        w
    }
}

struct Reader {
    parts: Vec<Part>,
    is_result: bool,
}

impl Reader {
    fn marker(&mut self, m: String, slot: Option<(SlotKind, Vec<Step>)>, in_result: bool) {
        self.parts.push(Part {
            marker: Some(m),
            slot,
            in_result,
        });
    }

    /// A text slot: the body's opening text when it is the first part,
    /// else after `[[text]]`.
    fn text(&mut self, path: Vec<Step>, in_result: bool) {
        let marker = (!self.parts.is_empty()).then(|| "[[text]]".to_string());
        self.parts.push(Part {
            marker,
            slot: Some((SlotKind::Text, path)),
            in_result,
        });
    }

    fn placeholder(&mut self, what: &str, in_result: bool) {
        self.marker(format!("[[{} · kept as is]]", word(what)), None, in_result);
    }

    /// A Gemini content's `parts`: text slots, `functionCall` args (a JSON
    /// object), a `functionResponse`'s `response.output` text; thoughts and
    /// media kept as they are.
    fn gemini(&mut self, v: &Value) {
        let Some(Value::Array(parts)) = v.get("parts") else {
            return;
        };
        for (i, p) in parts.iter().enumerate() {
            let at = |k: &'static str| vec![Step::Key("parts"), Step::Index(i), Step::Key(k)];
            if p.get("thought").and_then(Value::as_bool) == Some(true) {
                self.placeholder("thought", false);
            } else if p.get("text").is_some_and(Value::is_string) {
                self.text(at("text"), false);
            } else if let Some(c) = p.get("functionCall") {
                let mut path = at("functionCall");
                path.push(Step::Key("args"));
                let slot = c.get("args").is_some_and(Value::is_object);
                self.marker(
                    format!("[[tool_use {} {}]]", word(s(c, "name")), word(s(c, "id"))),
                    slot.then_some((SlotKind::JsonObject, path)),
                    false,
                );
            } else if let Some(r) = p.get("functionResponse") {
                self.is_result = true;
                let id = if s(r, "id").is_empty() {
                    s(r, "name")
                } else {
                    s(r, "id")
                };
                let mut path = at("functionResponse");
                path.extend([Step::Key("response"), Step::Key("output")]);
                let slot = r.pointer("/response/output").is_some_and(Value::is_string);
                self.marker(
                    format!("[[tool_result {}]]", word(id)),
                    slot.then_some((SlotKind::Text, path)),
                    true,
                );
            } else {
                self.placeholder("part", false);
            }
        }
    }

    /// A content array or string at `base` (a message's or a tool result's).
    fn content(&mut self, v: &Value, base: Vec<Step>, in_result: bool) {
        match get(v, &base) {
            Some(Value::String(_)) => self.text(base, in_result),
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let mut p = base.clone();
                    p.push(Step::Index(i));
                    self.block(item, p, in_result);
                }
            }
            Some(Value::Null) | None => {}
            Some(_) => self.placeholder("content", in_result),
        }
    }

    fn block(&mut self, b: &Value, path: Vec<Step>, in_result: bool) {
        let ty = s(b, "type");
        match ty {
            "text" | "input_text" | "output_text"
                if b.get("text").is_some_and(Value::is_string) =>
            {
                let mut p = path;
                p.push(Step::Key("text"));
                self.text(p, in_result);
            }
            "tool_use" if !in_result => {
                let mut p = path;
                p.push(Step::Key("input"));
                self.marker(
                    format!("[[tool_use {} {}]]", word(s(b, "name")), word(s(b, "id"))),
                    Some((SlotKind::JsonObject, p)),
                    false,
                );
            }
            "tool_result" if !in_result => {
                self.is_result = true;
                let err = if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    " error"
                } else {
                    ""
                };
                let mut p = path.clone();
                p.push(Step::Key("content"));
                match b.get("content") {
                    Some(Value::String(_)) => self.marker(
                        format!("[[tool_result {}{err}]]", word(s(b, "tool_use_id"))),
                        Some((SlotKind::Text, p)),
                        true,
                    ),
                    _ => {
                        self.marker(
                            format!("[[tool_result {}{err}]]", word(s(b, "tool_use_id"))),
                            None,
                            true,
                        );
                        let mut q = path;
                        q.push(Step::Key("content"));
                        self.content_after_marker(b, q);
                    }
                }
            }
            "" => self.placeholder("part", in_result),
            other => self.placeholder(other, in_result),
        }
    }

    /// A tool result's array content: its first text directly after the
    /// result's marker would be ambiguous with a slot, so every text of it
    /// gets `[[text]]`.
    fn content_after_marker(&mut self, b: &Value, path: Vec<Step>) {
        if let Some(Value::Array(items)) = b.get("content") {
            for (i, item) in items.iter().enumerate() {
                let mut p = path.clone();
                p.push(Step::Index(i));
                self.block(item, p, true);
            }
        }
    }
}

/// Read a message for the file; None when it is not a JSON object.
pub fn read(d: Dialect, raw: &str) -> Option<(Body, Value)> {
    let v: Value = serde_json::from_str(raw).ok()?;
    v.as_object()?;
    let mut r = Reader {
        parts: Vec::new(),
        is_result: false,
    };
    let role = s(&v, "role").to_string();
    let role = match d {
        Dialect::Anthropic => {
            r.content(&v, vec![Step::Key("content")], false);
            role
        }
        Dialect::OpenaiChat => {
            if role == "tool" {
                r.is_result = true;
                let m = format!("[[tool_result {}]]", word(s(&v, "tool_call_id")));
                match v.get("content") {
                    Some(Value::String(_)) => {
                        r.marker(m, Some((SlotKind::Text, vec![Step::Key("content")])), true)
                    }
                    _ => {
                        r.marker(m, None, true);
                        if let Some(Value::Array(items)) = v.get("content") {
                            for (i, item) in items.iter().enumerate() {
                                r.block(item, vec![Step::Key("content"), Step::Index(i)], true);
                            }
                        }
                    }
                }
            } else {
                r.content(&v, vec![Step::Key("content")], false);
                if let Some(Value::Array(calls)) = v.get("tool_calls") {
                    for (i, c) in calls.iter().enumerate() {
                        let f = c.get("function").unwrap_or(&Value::Null);
                        r.marker(
                            format!("[[tool_use {} {}]]", word(s(f, "name")), word(s(c, "id"))),
                            Some((
                                SlotKind::JsonString,
                                vec![
                                    Step::Key("tool_calls"),
                                    Step::Index(i),
                                    Step::Key("function"),
                                    Step::Key("arguments"),
                                ],
                            )),
                            false,
                        );
                    }
                }
            }
            role
        }
        Dialect::Gemini => {
            r.gemini(&v);
            if role == "model" {
                "assistant".into()
            } else if r.is_result {
                "tool".into()
            } else {
                "user".into()
            }
        }
        Dialect::OpenaiResponses => match s(&v, "type") {
            "function_call" => {
                r.marker(
                    format!(
                        "[[tool_use {} {}]]",
                        word(s(&v, "name")),
                        word(s(&v, "call_id"))
                    ),
                    Some((SlotKind::JsonString, vec![Step::Key("arguments")])),
                    false,
                );
                "assistant".into()
            }
            "custom_tool_call" => {
                r.marker(
                    format!(
                        "[[tool_use {} {}]]",
                        word(s(&v, "name")),
                        word(s(&v, "call_id"))
                    ),
                    Some((SlotKind::Text, vec![Step::Key("input")])),
                    false,
                );
                "assistant".into()
            }
            "function_call_output" | "custom_tool_call_output" => {
                r.is_result = true;
                let m = format!("[[tool_result {}]]", word(s(&v, "call_id")));
                match v.get("output") {
                    Some(Value::String(_)) => {
                        r.marker(m, Some((SlotKind::Text, vec![Step::Key("output")])), true)
                    }
                    _ => {
                        r.marker(m, None, true);
                        if let Some(Value::Array(items)) = v.get("output") {
                            for (i, item) in items.iter().enumerate() {
                                r.block(item, vec![Step::Key("output"), Step::Index(i)], true);
                            }
                        }
                    }
                }
                "tool".into()
            }
            "reasoning" => {
                r.placeholder("reasoning", false);
                "assistant".into()
            }
            "message" | "" => {
                r.content(&v, vec![Step::Key("content")], false);
                if role.is_empty() {
                    "user".into()
                } else {
                    role
                }
            }
            other => {
                r.placeholder(other, false);
                if role.is_empty() {
                    other.to_string()
                } else {
                    role
                }
            }
        },
    };
    let mut text = String::new();
    for (i, p) in r.parts.iter().enumerate() {
        if let Some(m) = &p.marker {
            if i > 0 || !text.is_empty() {
                text.push('\n');
            }
            text.push_str(m);
        }
        if let Some((kind, path)) = &p.slot {
            let shown = slot_text(&v, *kind, path);
            if p.marker.is_some() {
                text.push('\n');
            }
            escape(&shown, &mut text);
        }
    }
    Some((
        Body {
            parts: r.parts,
            text,
            role: if role.is_empty() { "user".into() } else { role },
            is_result: r.is_result,
        },
        v,
    ))
}

fn slot_text(v: &Value, kind: SlotKind, path: &[Step]) -> String {
    let at = get(v, path);
    match kind {
        SlotKind::Text => at.and_then(Value::as_str).unwrap_or("").to_string(),
        SlotKind::JsonObject => at
            .and_then(|x| serde_json::to_string_pretty(x).ok())
            .unwrap_or_else(|| "{}".into()),
        SlotKind::JsonString => {
            let raw = at.and_then(Value::as_str).unwrap_or("");
            serde_json::from_str::<Value>(raw)
                .ok()
                .and_then(|x| serde_json::to_string_pretty(&x).ok())
                .unwrap_or_else(|| raw.to_string())
        }
    }
}

/// A marker line of an edited body (its line and text) and the lines under it.
type Chunk = (Option<(usize, String)>, Vec<String>);

/// Why a rewritten body cannot become a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// Line of the body (0-based, relative to the body's first line).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

/// The message `v` (read as `body`) with its slots taken from `new_text`
/// (an edited body as the file has it: a line starting with `[[` is a
/// marker, an escaped one is text and loses one `\`): the markers must
/// be the original's, in order; a tool call's input must stay JSON; an
/// edited tool result ends with [`recall_line`]. Returns the new raw JSON.
pub fn rewrite(body: &Body, v: &Value, new_text: &str, seq: u64) -> Result<String, Unfit> {
    // Split the new text at marker lines.
    let mut chunks: Vec<Chunk> = vec![(None, Vec::new())];
    for (i, line) in new_text.split('\n').enumerate() {
        if is_marker(line) {
            chunks.push((Some((i, line.trim_end().to_string())), Vec::new()));
        } else if let Some(last) = chunks.last_mut() {
            last.1.push(unescape_line(line).to_string());
        }
    }
    let lead = chunks.remove(0);
    let opens_with_text = body.parts.first().is_some_and(|p| p.marker.is_none());
    let mut slots: Vec<(usize, String)> = Vec::new();
    let lead_text = lead.1.join("\n");
    if opens_with_text {
        slots.push((0, lead_text));
    } else if !lead_text.trim().is_empty() {
        return Err(Unfit {
            line: 0,
            reason: "text before the first marker, where this message has no text part".into(),
        });
    }
    let markers: Vec<&Part> = body.parts.iter().filter(|p| p.marker.is_some()).collect();
    if markers.len() != chunks.len() {
        return Err(Unfit {
            line: chunks.first().and_then(|c| c.0.as_ref()).map_or(0, |m| m.0),
            reason: format!(
                "the block has {} marker lines where its message has {}: only the text and JSON under them may change",
                chunks.len(),
                markers.len()
            ),
        });
    }
    for (want, (got, lines)) in markers.iter().zip(chunks) {
        let (line, m) = got.unwrap_or_default();
        if want.marker.as_deref() != Some(m.as_str()) {
            return Err(Unfit {
                line,
                reason: format!(
                    "marker {m:?} where the message has {:?}: markers may not change",
                    want.marker.as_deref().unwrap_or("")
                ),
            });
        }
        let t = lines.join("\n");
        if want.slot.is_none() && !t.trim().is_empty() {
            return Err(Unfit {
                line,
                reason: format!("text under {m}, which is kept as is"),
            });
        }
        slots.push((line, t));
    }
    let mut v = v.clone();
    let mut texts = slots.into_iter();
    let mut changed_result_slot: Option<Vec<Step>> = None;
    let mut last_result_slot: Option<Vec<Step>> = None;
    for p in &body.parts {
        let Some((line, t)) = (match (&p.marker, &p.slot) {
            (None, _) => texts.next(),
            (Some(_), _) => texts.next(),
        }) else {
            break;
        };
        let Some((kind, path)) = &p.slot else {
            continue;
        };
        let old = slot_text(&v, *kind, path);
        let t = strip_recall(&t, seq);
        if p.in_result && *kind == SlotKind::Text {
            last_result_slot = Some(path.clone());
        }
        if t.trim_end() == old.trim_end() {
            continue;
        }
        let new = match kind {
            SlotKind::Text => Value::String(t.trim_end().to_string()),
            SlotKind::JsonObject => match serde_json::from_str::<Value>(&t) {
                Ok(x @ Value::Object(_)) => x,
                Ok(_) => {
                    return Err(Unfit {
                        line,
                        reason: "a tool call's input must stay a JSON object".into(),
                    })
                }
                Err(e) => {
                    return Err(Unfit {
                        line: line + e.line(),
                        reason: format!("a tool call's input is no longer JSON: {e}"),
                    })
                }
            },
            SlotKind::JsonString => match serde_json::from_str::<Value>(&t) {
                Ok(x) => Value::String(x.to_string()),
                Err(e) => {
                    return Err(Unfit {
                        line: line + e.line(),
                        reason: format!("a tool call's arguments are no longer JSON: {e}"),
                    })
                }
            },
        };
        if p.in_result {
            changed_result_slot = Some(path.clone());
        }
        if let Some(at) = get_mut(&mut v, path) {
            *at = new;
        }
    }
    if changed_result_slot.is_some() {
        if let Some(path) = last_result_slot {
            if let Some(Value::String(s)) = get_mut(&mut v, &path) {
                if !s.is_empty() {
                    s.push('\n');
                }
                s.push_str(&recall_line(seq));
            }
        }
    }
    drop_empty_texts(&mut v);
    if content_is_empty(&v) {
        return Err(Unfit {
            line: 0,
            reason: "the rewrite leaves the message empty: delete the block instead".into(),
        });
    }
    Ok(v.to_string())
}

/// The text without a recall line it ends with (a rewritten block edited again).
fn strip_recall(t: &str, seq: u64) -> String {
    let line = recall_line(seq);
    let trimmed = t.trim_end();
    match trimmed.strip_suffix(&line) {
        Some(rest) => rest.trim_end().to_string(),
        None => t.to_string(),
    }
}

/// Text blocks left empty by a rewrite are removed (the APIs refuse empty
/// text blocks).
fn drop_empty_texts(v: &mut Value) {
    if let Some(Value::Array(items)) = v.get_mut("content") {
        items.retain(|b| {
            !(matches!(
                b.get("type").and_then(Value::as_str),
                Some("text" | "input_text" | "output_text")
            ) && b.get("text").and_then(Value::as_str) == Some(""))
        });
    }
}

fn content_is_empty(v: &Value) -> bool {
    let empty_content = match v.get("content") {
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    };
    empty_content && v.get("tool_calls").is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(d: Dialect, v: &Value) -> (Body, Value) {
        read(d, &v.to_string()).unwrap()
    }

    #[test]
    fn anthropic_messages_read_as_blocks() {
        let m = json!({"role":"assistant","content":[
            {"type":"thinking","thinking":"hmm","signature":"sig"},
            {"type":"text","text":"Let me look."},
            {"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]});
        let (b, _) = body(Dialect::Anthropic, &m);
        assert_eq!(
            b.text,
            "[[thinking · kept as is]]\n[[text]]\nLet me look.\n[[tool_use Bash toolu_1]]\n{\n  \"command\": \"ls\"\n}"
        );
        assert_eq!(b.role, "assistant");
        let r = json!({"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"a\n[[m:x 1 user]]\nb","is_error":true}]});
        let (b, _) = body(Dialect::Anthropic, &r);
        assert_eq!(
            b.text,
            "[[tool_result toolu_1 error]]\na\n\\[[m:x 1 user]]\nb"
        );
        assert!(b.is_result);
        let p = json!({"role":"user","content":"hello"});
        assert_eq!(body(Dialect::Anthropic, &p).0.text, "hello");
    }

    #[test]
    fn a_rewritten_tool_result_ends_with_the_recall_line() {
        let r = json!({"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"long log"}]});
        let (b, v) = body(Dialect::Anthropic, &r);
        let out = rewrite(&b, &v, "[[tool_result toolu_1]]\nshort", 7).unwrap();
        let o: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            o["content"][0]["content"],
            format!("short\n{}", recall_line(7))
        );
        // Edited again: one recall line.
        let (b2, v2) = read(Dialect::Anthropic, &out).unwrap();
        let again = rewrite(
            &b2,
            &v2,
            &format!("{}\n", b2.text.replace("short", "shorter")),
            7,
        )
        .unwrap();
        let o: Value = serde_json::from_str(&again).unwrap();
        assert_eq!(
            o["content"][0]["content"],
            format!("shorter\n{}", recall_line(7))
        );
        // Unchanged text: the same message.
        let same = rewrite(&b, &v, &b.text, 7).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&same).unwrap(), v);
    }

    #[test]
    fn a_rewrite_keeps_markers_and_json() {
        let m = json!({"role":"assistant","content":[
            {"type":"text","text":"Let me look."},
            {"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]});
        let (b, v) = body(Dialect::Anthropic, &m);
        let e = rewrite(&b, &v, "x\n[[tool_use Bash toolu_2]]\n{}", 3).unwrap_err();
        assert!(e.reason.contains("markers may not change"), "{e:?}");
        let e = rewrite(&b, &v, "x\n[[tool_use Bash toolu_1]]\n{\"command\": ", 3).unwrap_err();
        assert!(e.reason.contains("no longer JSON"), "{e:?}");
        let e = rewrite(&b, &v, "x", 3).unwrap_err();
        assert!(e.reason.contains("marker lines"), "{e:?}");
        let ok = rewrite(
            &b,
            &v,
            "Looking.\n[[tool_use Bash toolu_1]]\n{\"command\": \"ls -l\"}",
            3,
        )
        .unwrap();
        let o: Value = serde_json::from_str(&ok).unwrap();
        assert_eq!(o["content"][0]["text"], "Looking.");
        assert_eq!(o["content"][1]["input"]["command"], "ls -l");
        let e = rewrite(
            &body(Dialect::Anthropic, &json!({"role":"user","content":"hi"})).0,
            &json!({"role":"user","content":"hi"}),
            "",
            1,
        )
        .unwrap_err();
        assert!(e.reason.contains("empty"), "{e:?}");
    }

    #[test]
    fn openai_shapes_read_and_rewrite() {
        let call = json!({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"sh","arguments":"{\"cmd\":\"ls\"}"}}]});
        let (b, v) = body(Dialect::OpenaiChat, &call);
        assert_eq!(b.text, "[[tool_use sh c1]]\n{\n  \"cmd\": \"ls\"\n}");
        let out = rewrite(&b, &v, "[[tool_use sh c1]]\n{\"cmd\":\"pwd\"}", 2).unwrap();
        let o: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            o["tool_calls"][0]["function"]["arguments"],
            "{\"cmd\":\"pwd\"}"
        );
        let tool = json!({"role":"tool","tool_call_id":"c1","content":"out"});
        let (b, _) = body(Dialect::OpenaiChat, &tool);
        assert_eq!(
            (b.text.as_str(), b.role.as_str()),
            ("[[tool_result c1]]\nout", "tool")
        );
        let fc = json!({"type":"function_call","call_id":"c2","name":"sh","arguments":"{}"});
        assert_eq!(body(Dialect::OpenaiResponses, &fc).0.role, "assistant");
        let fo = json!({"type":"function_call_output","call_id":"c2","output":"big"});
        let (b, v) = body(Dialect::OpenaiResponses, &fo);
        let out = rewrite(&b, &v, "[[tool_result c2]]\nsmall", 9).unwrap();
        assert!(out.contains("recall entry 9"), "{out}");
        let rs = json!({"type":"reasoning","summary":[]});
        assert_eq!(
            body(Dialect::OpenaiResponses, &rs).0.text,
            "[[reasoning · kept as is]]"
        );
    }
}
