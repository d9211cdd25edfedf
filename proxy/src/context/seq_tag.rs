//! `context.seq_tags` (pure): a tool result as the upstream sees it ends
//! with its ledger seq, `[seq 57]`, as in the seed's context file. The tag
//! is spliced into the client's bytes (nothing else of the message
//! changes: no re-serialization, the keys keep their order), it depends on
//! the row's bytes and seq alone, so the same row is the same bytes on
//! every request and across cuts (the prompt cache holds), and the ledger
//! keeps the client's bytes without it.
//!
//! Where the tag goes: a string result ends with `\n[seq N]`; a result
//! made of parts has it at the end of its last text part, or as a text part
//! of its own after an image; an empty result is the tag alone.
//! Anthropic `tool_result` blocks (each of a message's), OpenAI Chat `tool`
//! messages, Responses `function_call_output` and `custom_tool_call_output`
//! items, Gemini `functionResponse` parts (in their `response.output`).

use oceancode_window::Dialect;
use serde_json::value::RawValue;
use std::collections::HashMap;

/// The tag's text.
pub fn text(seq: u64) -> String {
    format!("[seq {seq}]")
}

/// Where a raw value starts in `base` (it is a slice of it).
fn offset(base: &str, part: &str) -> usize {
    part.as_ptr() as usize - base.as_ptr() as usize
}

type Obj<'a> = HashMap<String, &'a RawValue>;

fn obj(raw: &str) -> Option<Obj<'_>> {
    serde_json::from_str(raw).ok()
}

fn str_of(o: &Obj<'_>, k: &str) -> Option<String> {
    o.get(k).and_then(|r| serde_json::from_str(r.get()).ok())
}

/// The insertions that tag one result value (`content` / `output`) of the
/// object `o` (raw `owner`), the tag's text part being of `part_type`.
fn tag_value(
    base: &str,
    owner: &str,
    o: &Obj<'_>,
    key: &str,
    part_type: &str,
    tag: &str,
    out: &mut Vec<(usize, usize, String)>,
) {
    let quoted = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let Some(v) = o.get(key).map(|r| r.get()) else {
        // No result value at all: the tag is the result.
        if let Some(close) = owner.rfind('}') {
            let empty = owner[1..close].trim().is_empty();
            let sep = if empty { "" } else { "," };
            out.push((
                offset(base, owner) + close,
                0,
                format!("{sep}{}:{}", quoted(key), quoted(tag)),
            ));
        }
        return;
    };
    let at = offset(base, v);
    match v.as_bytes().first() {
        Some(b'"') => {
            let empty = v == "\"\"";
            let add = if empty {
                tag.to_string()
            } else {
                format!("\n{tag}")
            };
            let q = quoted(&add);
            out.push((at + v.len() - 1, 0, q[1..q.len() - 1].to_string()));
        }
        Some(b'[') => {
            let parts: Vec<&RawValue> = serde_json::from_str(v).unwrap_or_default();
            let last_text = parts.last().and_then(|p| {
                let po = obj(p.get())?;
                let t = po.get("text")?;
                t.get()
                    .starts_with('"')
                    .then(|| (t.get(), str_of(&po, "text")))
            });
            match last_text {
                Some((t, Some(s))) => {
                    let add = if s.is_empty() {
                        tag.to_string()
                    } else {
                        format!("\n{tag}")
                    };
                    let q = quoted(&add);
                    out.push((
                        offset(base, t) + t.len() - 1,
                        0,
                        q[1..q.len() - 1].to_string(),
                    ));
                }
                _ => {
                    let sep = if parts.is_empty() { "" } else { "," };
                    out.push((
                        at + v.len() - 1,
                        0,
                        format!(
                            "{sep}{{\"type\":{},\"text\":{}}}",
                            quoted(part_type),
                            quoted(tag)
                        ),
                    ));
                }
            }
        }
        Some(b'n') => {
            // null: the tag replaces it.
            out.push((at, v.len(), quoted(tag)));
        }
        _ => {}
    }
}

/// `raw` (a message of the dialect) with every tool result in it tagged
/// with `seq`; None when it holds no tool result (or is not JSON).
pub fn tag(d: Dialect, raw: &str, seq: u64) -> Option<String> {
    let tag = text(seq);
    let o = obj(raw)?;
    // (where, bytes replaced, what is put there)
    let mut ins: Vec<(usize, usize, String)> = Vec::new();
    match d {
        Dialect::Anthropic => {
            let content = o.get("content")?.get();
            if !content.starts_with('[') {
                return None;
            }
            let blocks: Vec<&RawValue> = serde_json::from_str(content).ok()?;
            for b in blocks {
                let Some(bo) = obj(b.get()) else { continue };
                if str_of(&bo, "type").as_deref() == Some("tool_result") {
                    tag_value(raw, b.get(), &bo, "content", "text", &tag, &mut ins);
                }
            }
        }
        Dialect::OpenaiChat => {
            if str_of(&o, "role").as_deref() == Some("tool") {
                tag_value(raw, raw, &o, "content", "text", &tag, &mut ins);
            }
        }
        Dialect::OpenaiResponses => {
            if matches!(
                str_of(&o, "type").as_deref(),
                Some("function_call_output" | "custom_tool_call_output")
            ) {
                tag_value(raw, raw, &o, "output", "input_text", &tag, &mut ins);
            }
        }
        Dialect::Gemini => {
            // `{"role":"user","parts":[{"functionResponse":{…,"response":{"output":…}}}]}`:
            // the tag goes into the response's `output` (its `error` when
            // that is all it has).
            let parts = o.get("parts")?.get();
            if !parts.starts_with('[') {
                return None;
            }
            let parts: Vec<&RawValue> = serde_json::from_str(parts).ok()?;
            for p in parts {
                let Some(fr) = obj(p.get()).and_then(|po| po.get("functionResponse").copied())
                else {
                    continue;
                };
                let Some(resp) = obj(fr.get()).and_then(|fo| fo.get("response").copied()) else {
                    continue;
                };
                let Some(ro) = obj(resp.get()) else { continue };
                let key = if ro.contains_key("error") && !ro.contains_key("output") {
                    "error"
                } else {
                    "output"
                };
                tag_value(raw, resp.get(), &ro, key, "text", &tag, &mut ins);
            }
        }
    }
    if ins.is_empty() {
        return None;
    }
    ins.sort_by_key(|(at, _, _)| *at);
    let mut out = String::with_capacity(raw.len() + ins.len() * 16);
    let mut from = 0;
    for (at, replaced, s) in ins {
        out.push_str(&raw[from..at]);
        out.push_str(&s);
        from = at + replaced;
    }
    out.push_str(&raw[from..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn v(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn anthropic_results_end_with_their_seq_and_nothing_else_changes() {
        let raw = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a\nb"},{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"x"},{"type":"image","source":{}}],"is_error":true},{"tool_use_id":"t3","type":"tool_result"},{"type":"tool_result","tool_use_id":"t4","content":[{"type":"text","text":"y"}]},{"type":"text","text":"<system-reminder>r</system-reminder>"}]}"#;
        let t = tag(Dialect::Anthropic, raw, 57).unwrap();
        let got = v(&t);
        let c = &got["content"];
        assert_eq!(c[0]["content"], "a\nb\n[seq 57]");
        assert_eq!(c[1]["content"][2], json!({"type":"text","text":"[seq 57]"}));
        assert_eq!(c[1]["is_error"], true);
        assert_eq!(c[2]["content"], "[seq 57]");
        assert_eq!(c[3]["content"][0]["text"], "y\n[seq 57]");
        assert_eq!(c[4]["text"], "<system-reminder>r</system-reminder>");
        // The client's bytes around the tags are kept as they were.
        assert!(t.starts_with(r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a\nb\n[seq 57]"}"#), "{t}");
        assert_eq!(
            tag(Dialect::Anthropic, raw, 57).as_deref(),
            Some(t.as_str())
        );
        assert_eq!(
            tag(Dialect::Anthropic, r#"{"role":"user","content":"hi"}"#, 1),
            None
        );
        assert_eq!(
            tag(
                Dialect::Anthropic,
                r#"{"role":"assistant","content":[{"type":"text","text":"hi"}]}"#,
                1
            ),
            None
        );
    }

    #[test]
    fn openai_results_end_with_their_seq() {
        let t = tag(
            Dialect::OpenaiChat,
            r#"{"role":"tool","tool_call_id":"c1","content":"done \"ok\""}"#,
            9,
        )
        .unwrap();
        assert_eq!(v(&t)["content"], "done \"ok\"\n[seq 9]");
        let t = tag(
            Dialect::OpenaiChat,
            r#"{"role":"tool","tool_call_id":"c1","content":null}"#,
            9,
        )
        .unwrap();
        assert_eq!(v(&t)["content"], "[seq 9]");
        assert_eq!(
            tag(Dialect::OpenaiChat, r#"{"role":"user","content":"x"}"#, 9),
            None
        );
        let t = tag(
            Dialect::OpenaiResponses,
            r#"{"type":"function_call_output","call_id":"c","output":""}"#,
            4,
        )
        .unwrap();
        assert_eq!(v(&t)["output"], "[seq 4]");
        let t = tag(Dialect::OpenaiResponses, r#"{"type":"custom_tool_call_output","call_id":"c","output":[{"type":"input_image","image_url":"x"}]}"#, 4).unwrap();
        assert_eq!(
            v(&t)["output"][1],
            json!({"type":"input_text","text":"[seq 4]"})
        );
        assert_eq!(
            tag(
                Dialect::OpenaiResponses,
                r#"{"type":"message","role":"user","content":[]}"#,
                4
            ),
            None
        );
    }

    #[test]
    fn gemini_results_end_with_their_seq() {
        let raw = r#"{"role":"user","parts":[{"functionResponse":{"id":"c1","name":"shell","response":{"output":"ok"}}},{"functionResponse":{"name":"read","response":{"error":"no such file"}}},{"functionResponse":{"name":"ls","response":{}}},{"text":"and then"}]}"#;
        let t = tag(Dialect::Gemini, raw, 12).unwrap();
        let got = v(&t);
        let p = &got["parts"];
        assert_eq!(
            p[0]["functionResponse"]["response"]["output"],
            "ok\n[seq 12]"
        );
        assert_eq!(p[0]["functionResponse"]["id"], "c1");
        assert_eq!(
            p[1]["functionResponse"]["response"]["error"],
            "no such file\n[seq 12]"
        );
        assert_eq!(p[2]["functionResponse"]["response"]["output"], "[seq 12]");
        assert_eq!(p[3]["text"], "and then");
        assert_eq!(
            tag(
                Dialect::Gemini,
                r#"{"role":"user","parts":[{"text":"hi"}]}"#,
                1
            ),
            None
        );
        assert_eq!(
            tag(
                Dialect::Gemini,
                r#"{"role":"model","parts":[{"functionCall":{"name":"ls","args":{}}}]}"#,
                1
            ),
            None
        );
    }
}
